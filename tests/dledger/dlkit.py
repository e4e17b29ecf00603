"""Helpers of the DLedger tests: one remoting call and its timing.  The group of real
mqbroker processes itself is mq.cluster.DLedgerGroup (mqchaos uses it too)."""
from __future__ import annotations

import time

from mq.cluster import DLEDGER_INDEX_FILE_SIZE, DLedgerGroup, call, wait_dispatched  # noqa: F401 - the tests use them from here

INDEX_FILE_SIZE = DLEDGER_INDEX_FILE_SIZE


def elapsed_since(t0: float) -> float:
    return time.monotonic() - t0
