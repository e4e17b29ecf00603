"""Client exceptions.  Network trouble surfaces as mq.remoting's RemotingError family
(RemotingConnectError, RemotingTimeout); a broker or name server that answers with a
failure code surfaces as MQBrokerError carrying that code and remark."""
from __future__ import annotations

from mq.remoting import RemotingConnectError, RemotingError, RemotingTimeout
from mq.wire.codes import RESPONSE_NAMES


class MQClientError(Exception):
    """A client-side failure: bad argument, no route, every retry exhausted.  `code` is the
    last broker response code when one was involved, else None."""

    def __init__(self, message: str, code: int | None = None):
        super().__init__(message)
        self.code = code


class MQBrokerError(MQClientError):
    """A server answered `code` (not SUCCESS) with `remark`."""

    def __init__(self, code: int, remark: str | None, addr: str | None = None):
        name = RESPONSE_NAMES.get(code, str(code))
        where = f" from {addr}" if addr else ""
        super().__init__(f"{name} ({code}){where}: {remark or ''}".rstrip(": "), code)
        self.remark = remark or ""
        self.addr = addr


__all__ = ["MQClientError", "MQBrokerError", "RemotingError", "RemotingConnectError", "RemotingTimeout"]
