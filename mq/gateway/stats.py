"""The gateway's counters, for the broker's /metrics (mq.broker.metrics) and kept in the
broker's stats block (mq.store.stats) like the io workers' and the flush role's, in a region of
its own: rows ("grpc", "<rpc>\\x01<Code name>") hold a latency histogram of the RPC's calls by the
Code answered (a server stream: its first status), rows ("grpc_msgs", what) count messages
sent, received, acked, revived.  Published every PUBLISH_INTERVAL_S.  Without a stats block
(a gateway run on its own) nothing is counted."""
from __future__ import annotations

import asyncio
import logging

from mq.store.stats import HIST_BUCKETS, HIST_SUM, PUBLISH_INTERVAL_S, StatsBlock, region_of

log = logging.getLogger("mq.gateway")

KIND_RPC, KIND_MSGS = "grpc", "grpc_msgs"
SEP = "\x01"


class GatewayStats:
    def __init__(self, store_root: str):
        self._block = StatsBlock.attach_if_present(store_root) if store_root else None
        self._writer = self._block.writer(region_of("grpc", regions=self._block.regions)) if self._block else None
        self._rows: dict[tuple[str, str], list[int]] = {}
        self._task: asyncio.Task | None = None
        from mq.wire.grpc5 import Code       # here, not at import: the broker's metrics import this module's
        self._code_names = {c.value: c.name for c in Code}    # names, and protobuf stays out of the supervisor

    def _row(self, kind: str, name: str) -> list[int] | None:
        row = self._rows.get((kind, name))
        if row is None and self._writer is not None:
            row = self._rows[(kind, name)] = self._writer.row(kind, name)
        return row

    def call(self, rpc: str, code: int, latency_ns: int) -> None:
        """One call of `rpc` answered with Status code `code` (a number) after latency_ns."""
        name = self._code_names.get(code) or str(code)
        row = self._row(KIND_RPC, f"{rpc}{SEP}{name}")
        if row is not None:
            k = (latency_ns // 1000).bit_length()
            row[k if k < HIST_BUCKETS else HIST_BUCKETS - 1] += 1
            row[HIST_SUM] += latency_ns

    def messages(self, what: str, n: int = 1) -> None:
        row = self._row(KIND_MSGS, what)
        if row is not None:
            row[0] += n

    def start(self) -> None:
        if self._writer is not None:
            self._task = asyncio.get_running_loop().create_task(self._publish_loop())

    async def _publish_loop(self) -> None:
        while True:
            await asyncio.sleep(PUBLISH_INTERVAL_S)
            self._writer.publish()

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        if self._writer is not None:
            self._writer.publish()
        if self._block is not None:
            self._block.close()
