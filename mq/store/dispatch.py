"""The dispatch role: builds ConsumeQueue entries from the CommitLog.

It walks [dispatched_pos, write_pos) with the C scanner, writes each
record's entry at the record's own QUEUEOFFSET (so re-dispatching after a
crash rewrites the same bytes: idempotent), then advances each queue's CQ_MAX
and dispatched_pos and wakes SEQ_DISPATCH (long-polling pulls wait on it).
Prepared and rolled-back transaction messages get no entry.  For
SCHEDULE_TOPIC_XXXX the tags code is the delivery time (store time + delay
of the level, queue L-1 = level L), as in RocketMQ."""
from __future__ import annotations

import logging
import threading
import time

from . import control as C
from .checkpoint import Checkpoint
from .commitlog import CommitLog, SCAN_CLEAN_STOPS, SCAN_STOP_NAMES
from .consumequeue import ConsumeQueueSet

log = logging.getLogger("mq.store.dispatch")

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
SCAN_BATCH_RECORDS = 4096


class Dispatcher:
    def __init__(self, cl: CommitLog, cqs: ConsumeQueueSet, delay_levels_ms: list[int],
                 checkpoint: Checkpoint | None = None, cq_flush_interval_ms: int = 1000,
                 cq_thorough_interval_ms: int = 60000):
        self.cl = cl
        self.ctl = cl.ctl
        self.cqs = cqs
        self.delay_levels_ms = delay_levels_ms
        self.checkpoint = checkpoint
        self.cq_flush_interval_ms = cq_flush_interval_ms
        self.cq_thorough_interval_ms = cq_thorough_interval_ms
        self.scanner = cl.scanner(SCAN_BATCH_RECORDS)
        self.last_store_ts_ms = 0
        self._schedule_slots: dict[int, int] = {}
        self.records_dispatched = 0

    def _delay_of_slot(self, slot: int, queue_id: int) -> int | None:
        """Delay (ms) when the slot is a SCHEDULE_TOPIC_XXXX queue, else None."""
        d = self._schedule_slots.get(slot)
        if d is None:
            topic, _ = self.ctl.queue_info(slot)
            if topic == SCHEDULE_TOPIC and 0 <= queue_id < len(self.delay_levels_ms):
                d = self.delay_levels_ms[queue_id]
            else:
                d = -1
            self._schedule_slots[slot] = d
        return d if d >= 0 else None

    def dispatch_once(self, limit: int | None = None) -> int:
        """Dispatches what is published (up to `limit`); returns records dispatched."""
        start = self.ctl.get(C.POS_DISPATCHED)
        end = self.ctl.get(C.POS_WRITE) if limit is None else limit
        total = 0
        recs = self.scanner.recs
        while start < end:
            n, nxt, stop = self.scanner.scan(start, end, check_crc=False, resolve_slots=2)
            maxes: dict[int, int] = {}
            for i in range(n):
                r = recs[i]
                tx = r.sys_flag & 0xC
                if tx == 0x4 or tx == 0xC:
                    continue
                slot = r.slot
                cq = self.cqs.by_slot(slot)
                tags = r.tags_code
                delay = self._delay_of_slot(slot, r.queue_id)
                if delay is not None:
                    tags = r.store_ts_ms + delay
                qoff = r.queue_offset
                cq.put(qoff, r.phy_offset, r.size, tags)
                if maxes.get(slot, -1) < qoff + 1:
                    maxes[slot] = qoff + 1
            if n:
                self.last_store_ts_ms = recs[n - 1].store_ts_ms
            for slot, m in maxes.items():
                self.ctl.queue_advance(slot, C.Q_CQ_MAX, m)
            self.ctl.advance(C.POS_DISPATCHED, nxt)
            total += n
            if stop not in SCAN_CLEAN_STOPS:
                # below write_pos every byte is valid (C invariant): this is a bug or disk damage
                msg = f"dispatch stopped at {nxt}: {SCAN_STOP_NAMES.get(stop, stop)}"
                log.error(msg)
                raise RuntimeError(msg)
            if nxt == start:
                break
            start = nxt
        if total:
            self.records_dispatched += total
            self.ctl.wake(C.SEQ_DISPATCH)
        return total

    def flush_queues(self) -> None:
        """Flushes ConsumeQueues, then records how far they are durable in the checkpoint."""
        ts = self.last_store_ts_ms
        self.cqs.flush()
        if self.checkpoint is not None and ts:
            self.checkpoint.logics_ts_ms = ts
            self.checkpoint.flush()

    def run(self, stop: threading.Event) -> None:
        """The role's loop: dispatch whenever records are published."""
        last_flush = time.monotonic()
        while not stop.is_set():
            seen = self.ctl.seq(C.SEQ_WRITE)
            self.dispatch_once()
            now = time.monotonic()
            if (now - last_flush) * 1000 >= self.cq_flush_interval_ms:
                self.flush_queues()
                last_flush = now
            if self.ctl.get(C.POS_DISPATCHED) >= self.ctl.get(C.POS_WRITE):
                self.ctl.wait(C.SEQ_WRITE, seen, 100)
        self.dispatch_once()
        self.flush_queues()
