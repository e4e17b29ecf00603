"""What the gateway's services that talk to their broker and run a loop of their own share:
one call to the broker with its failure as a Status (BrokerCalls), and a loop task started
and stopped with the service (Background)."""
from __future__ import annotations

import asyncio

from mq.remoting import RemotingClient, RemotingError
from mq.wire.grpc5 import Code

from .convert import Refused

CALL_TIMEOUT_S = 5.0


class BrokerCalls:
    remoting: RemotingClient
    broker_addr: str

    async def _call(self, code: int, ext: dict | None, body: bytes = b""):
        """One request to the broker; its answer, or Refused(PROXY_TIMEOUT) when it gave none."""
        try:
            return await self.remoting.invoke(self.broker_addr, self.remoting.request(code, ext, body),
                                              CALL_TIMEOUT_S)
        except RemotingError as e:
            raise Refused(Code.PROXY_TIMEOUT, f"the broker did not answer: {e}") from None


class Background:
    """A service whose _loop() runs as a task from start() until close()."""
    _task: asyncio.Task | None = None

    async def _loop(self) -> None:
        raise NotImplementedError

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
