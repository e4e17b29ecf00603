"""Helpers of the DLedger tests: one remoting call and its timing.  The group of real
mqbroker processes itself is mq.cluster.DLedgerGroup (mqchaos uses it too)."""
from __future__ import annotations

import asyncio
import time

from mq.cluster import DLEDGER_INDEX_FILE_SIZE, DLedgerGroup  # noqa: F401 - the tests use it from here too
from mq.remoting import RemotingClient

INDEX_FILE_SIZE = DLEDGER_INDEX_FILE_SIZE


def call(addr: str, code: int, ext: dict | None = None, body: bytes = b"", timeout_s: float = 5.0):
    """One remoting request, answered (or raises)."""
    async def go():
        c = RemotingClient()
        try:
            return await c.invoke(addr, c.request(code, ext, body), timeout_s)
        finally:
            await c.close()
    return asyncio.run(go())


def elapsed_since(t0: float) -> float:
    return time.monotonic() - t0
