"""A DLedger member that is not the leader forwards the writes its clients still send it.

After a failover or a leadership transfer the group serves writes again within about a second,
but an official client keeps its cached route (brokerId 0 = this member's address) until its
next name-server poll, up to 30 s later, and would get SERVICE_NOT_AVAILABLE meanwhile.  So
an io worker of a member that is not a ready leader forwards SEND_MESSAGE(_V2),
SEND_BATCH_MESSAGE, CONSUMER_SEND_MSG_BACK and END_TRANSACTION to the current leader's broker
address (learned from the leader's DLedger heartbeats, brokerAddr; the DLedger role writes it
in its status file as leaderBrokerAddr) and answers with the leader's answer: the same message
stored once, under the leader's msgId and queue offset.

Rules:
  * A forwarded request carries FORWARD_REMARK_PREFIX in its remark (a request's remark means
    nothing to RocketMQ, and the ACL signature covers the fields and the body, not the remark);
    such a request is never forwarded again, so two members that each think the other leads
    cannot bounce a send between them: the second answers it itself (SERVICE_NOT_AVAILABLE).
  * No leader known, or the leader is this member (elected, not ready yet): answered here as
    before (SERVICE_NOT_AVAILABLE), the client retries.
  * The leader does not answer within FORWARD_TIMEOUT_S (+0.5 s with the connect), or the connection
    fails: SERVICE_NOT_AVAILABLE naming the leader and why.  The message may have been stored
    (as for any send whose answer was lost); the client's retry may store it twice.  After a
    failed connect, forwards fail at once for FORWARD_DOWN_S; at most FORWARDS_IN_FLIGHT_MAX
    wait per io worker (beyond: SERVICE_NOT_AVAILABLE), so a leader that cannot be reached
    never stalls a client's connection.
Named limits: a forwarded message's BORNHOST is this member's address (the leader sees the
forwarding connection), not the producer's; so is the address an ACL whiteRemoteAddress rule
checks on the leader.
"""
from __future__ import annotations

import asyncio
import logging
import time

from mq import loop as mq_loop
from mq.dledger.role import read_status
from mq.remoting import (RemotingClient, RemotingConnectError, RemotingError, RequestCode as R,
                        ResponseCode as RC, make_response)
from mq.store import control as C
from mq.wire.remoting import RemotingCommand

log = logging.getLogger(__name__)

FORWARDED_CODES = (R.SEND_MESSAGE, R.SEND_MESSAGE_V2, R.SEND_BATCH_MESSAGE, R.CONSUMER_SEND_MSG_BACK,
                   R.END_TRANSACTION, R.SEND_REPLY_MESSAGE, R.SEND_REPLY_MESSAGE_V2)
FORWARD_REMARK_PREFIX = "dledger-forwarded-by:"
FORWARD_TIMEOUT_S = 3.0         # connect + answer: an official client's own send timeout (3 s)
FORWARD_DOWN_S = 1.0            # after a failed connect to the leader, forwards fail at once this long
FORWARDS_IN_FLIGHT_MAX = 1024   # per io worker; beyond it a write is answered SERVICE_NOT_AVAILABLE
LEADER_REFRESH_S = 0.1          # the status file is read at most this often per worker
FAIL_LOG_INTERVAL_S = 10.0      # failed forwards are logged at most this often (with a count)


class LeaderForward:
    """One per io worker of a DLedger member: wrap() puts it in front of the handlers of
    FORWARDED_CODES."""

    def __init__(self, store_root: str, ctl, own_addr: str):
        self.store_root = store_root
        self.ctl = ctl
        self.own_addr = own_addr
        self._client: RemotingClient | None = None
        self._leader: str | None = None
        self._read_at = 0.0
        self._down: tuple[str, float] = ("", 0.0)   # (addr, monotonic s): a connect failed; fail at once until
        self._in_flight = 0
        self._logged_at = -FAIL_LOG_INTERVAL_S
        self._unlogged = 0
        self.forwarded = 0            # requests forwarded (runtime info: dLegerForwarded)
        self.failed = 0               # ... of which the leader did not answer (dLegerForwardFailed)

    def leader_addr(self) -> str | None:
        """The leader's broker address if another member leads, else None (refreshed from the
        DLedger role's status file at most every LEADER_REFRESH_S)."""
        now = time.monotonic()
        if now - self._read_at >= LEADER_REFRESH_S:
            self._read_at = now
            st = read_status(self.store_root) or {}
            addr = st.get("leaderBrokerAddr")
            self._leader = addr if addr and addr != self.own_addr and st.get("role") != "LEADER" else None
        return self._leader

    def wrap(self, handler):
        ctl = self.ctl

        def run(conn, cmd):
            if ctl.get(C.POS_DL_APPEND_TERM) == 0 and not (cmd.remark or "").startswith(FORWARD_REMARK_PREFIX):
                addr = self.leader_addr()
                if addr is not None:
                    return self.forward(addr, cmd)
            return handler(conn, cmd)
        run.__name__ = getattr(handler, "__name__", "handler")
        return run

    async def forward(self, addr: str, cmd: RemotingCommand):
        """cmd sent on to the leader at addr; its answer, re-addressed to cmd (None for a oneway).
        The whole forward, connect included, is bounded by FORWARD_TIMEOUT_S."""
        if self._client is None:
            self._client = RemotingClient(connect_timeout_s=FORWARD_TIMEOUT_S)
        now = time.monotonic()
        down = self._down[0] == addr and now < self._down[1]
        if down or self._in_flight >= FORWARDS_IN_FLIGHT_MAX:
            why = ("a connect to it failed just now" if down
                   else f"{FORWARDS_IN_FLIGHT_MAX} forwards are waiting for it already")
            return self._failed(addr, cmd, why)
        out = RemotingCommand(code=cmd.code, language=cmd.language, version=cmd.version,
                              remark=FORWARD_REMARK_PREFIX + self.own_addr, ext_fields=dict(cmd.ext_fields or {}),
                              body=cmd.body, serialize_type=cmd.serialize_type)
        self.forwarded += 1
        self._in_flight += 1
        try:
            if cmd.is_oneway:
                await mq_loop.wait_for(self._client.invoke_oneway(addr, out), FORWARD_TIMEOUT_S)
                return None
            # (the answer's own timer fires first; the outer bound is for a connect or a full buffer)
            r = await mq_loop.wait_for(self._client.invoke(addr, out, FORWARD_TIMEOUT_S), FORWARD_TIMEOUT_S + 0.5)
        except RemotingConnectError as e:
            self._down = (addr, time.monotonic() + FORWARD_DOWN_S)
            return self._failed(addr, cmd, str(e))
        except (RemotingError, OSError, asyncio.TimeoutError) as e:
            return self._failed(addr, cmd, str(e) or "no answer within %.0f s" % FORWARD_TIMEOUT_S)
        finally:
            self._in_flight -= 1
        return make_response(cmd, r.code, r.remark, r.ext_fields, r.body)

    def _failed(self, addr: str, cmd: RemotingCommand, why: str):
        self.failed += 1
        self._unlogged += 1
        now = time.monotonic()
        if now - self._logged_at >= FAIL_LOG_INTERVAL_S:
            log.warning("%d write(s) forwarded to the DLedger leader at %s failed (the last: %s)", self._unlogged,
                        addr, why)
            self._logged_at, self._unlogged = now, 0
        if cmd.is_oneway:
            return None
        return make_response(cmd, RC.SERVICE_NOT_AVAILABLE, f"this DLedger member is not the leader, and the "
                                                            f"leader at {addr} did not take the request: {why}")

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    def runtime_info(self) -> dict[str, str]:
        return {"dLegerForwarded": str(self.forwarded), "dLegerForwardFailed": str(self.failed)}
