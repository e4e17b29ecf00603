"""What io workers know about the HA role: the slaves connected to this master,
read from <store root>/ha-status.json, which the HA role process rewrites
(atomically) on every connect and disconnect and every second:
  {"slaves": [{"addr", "ackOffset", "sentOffset", "since"}], "updated": ms}
The file is re-read at most every STATUS_REFRESH_S per worker; it serves the runtime info and
metrics (per-slave detail).  A send's isSlaveOK (slave_ok) reads the control block instead."""
from __future__ import annotations

import os
import time

from mq.files import read_config
from mq.store import control as C

STATUS_FILE = "ha-status.json"
STATUS_REFRESH_S = 0.2
STATUS_STALE_S = 5.0       # an HA role that stopped writing it has no slaves we can trust


class HAStatus:
    def __init__(self, store_root: str):
        self.path = os.path.join(store_root, STATUS_FILE)
        self._at = 0.0
        self._slaves: list[dict] = []

    def slaves(self) -> list[dict]:
        now = time.monotonic()
        if now - self._at >= STATUS_REFRESH_S:
            self._at = now
            data = read_config(self.path) or {}
            fresh = time.time() * 1000 - int(data.get("updated", 0)) < STATUS_STALE_S * 1000
            self._slaves = list(data.get("slaves", [])) if fresh else []
        return self._slaves



def slave_ok(ctl, end_offset: int, fallbehind_max: int) -> bool:
    """RocketMQ's isSlaveOK: a slave is connected now and the highest offset a slave acknowledged
    is less than fallbehind_max behind end_offset.  Read live from the control block (the HA role
    keeps POS_HA_SLAVES on every connect and disconnect), not from the status file: a file read
    at most every STATUS_REFRESH_S would answer SLAVE_NOT_AVAILABLE for a slave already there."""
    return ctl.get(C.POS_HA_SLAVES) > 0 and end_offset - ctl.get(C.POS_ACKED) < fallbehind_max
