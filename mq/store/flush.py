"""The flush role: makes the CommitLog durable.

SYNC_FLUSH (group commit): the loop sleeps on SEQ_WRITE and, whenever
write_pos is ahead of flushed_pos, msyncs everything written so far in one
call; every send whose end offset is now <= flushed_pos is released at once
(SEQ_FLUSH wakes them in any process).  While one msync runs, new appends
pile up and share the next one: that is the group.  The loop runs in C
(mq_commitlog_flush_for) for up to SYNC_WAIT_MS at a time; Python records
what it flushed in between.

ASYNC_FLUSH: every flushIntervalCommitLog ms, flush once at least
flushCommitLogLeastPages pages are dirty, and flush whatever is dirty every
flushCommitLogThoroughInterval ms.

After a flush the checkpoint's physicMsgTimestamp is the store time of the
last flushed record.  A failed msync sticks (the C core marks the store
fatal); this loop then stops flushing and says why, once.

Perf tracing (the broker's perfTraceEnable): with a `trace` writer, every
flush that moved the flushed position writes one "flush" record (mq.trace):
ts_us (flush started), group_bytes (flushed position delta), flush_us (the
msync call), and group_msgs: the control block's message counter (POS_MSGS)
at this flush's start minus at the previous traced flush's start (or
`msgs_base`, the counter when the role was started).  The counter is bumped
just before an append publishes its bytes, so a message racing a flush's
start can be counted in the neighbouring group; the sum over all flushes is
exact.

Metrics and statsAll (mq.broker.metrics, mq.broker.statsdata): with a `stats` writer (mq.store.stats),
every flush that moved the flushed position adds to three histogram rows -- the msync time, the
group's bytes and its messages (POS_MSGS delta, as above) -- published at once: a flush costs
far more than the ~2 us this adds."""
from __future__ import annotations

import logging
import threading
import time
from time import perf_counter_ns, time_ns

from . import control as C
from .checkpoint import Checkpoint
from .commitlog import CommitLog
from .config import StoreConfig
from .native import StoreError, ffi
from .stats import hist_add

SYNC_WAIT_MS = 100       # SYNC_FLUSH: the C loop's turn between Python's looks (stop, deleted files, records)
SYNC_RECS = 256          # ... which also ends once this many flushes are kept for the records

log = logging.getLogger("mq.store.flush")


class FlushService:
    def __init__(self, cl: CommitLog, config: StoreConfig, checkpoint: Checkpoint | None = None, *,
                 trace=None, broker: str = "", msgs_base: int | None = None, stats=None):
        """trace: an mq.trace.TraceWriter for flush records (None: no tracing); broker: their
        `broker` field; msgs_base: POS_MSGS when the flush role was started (None: now);
        stats: an mq.store.stats.StatsWriter for the flush histograms (None: none)."""
        self.cl = cl
        self.ctl = cl.ctl
        self.config = config
        self.checkpoint = checkpoint
        self.sync = config.flushDiskType == "SYNC_FLUSH"
        self._flushes = 0                          # recorded; see `flushes`
        self._c_kept = None                        # SYNC_FLUSH: the C loop's count of flushes not yet recorded
        self._kept_lock = threading.Lock()
        self.trace = trace
        self.broker = broker
        self._msgs_at = self.ctl.get(C.POS_MSGS) if msgs_base is None else msgs_base
        self.stats = stats
        if stats is not None:
            self._stat_rows = tuple(stats.row("flush", n) for n in ("latency", "bytes", "messages"))
            self._stat_msgs_at = self.ctl.get(C.POS_MSGS)

    @property
    def flushes(self) -> int:
        """Flushes that moved FLUSHED so far, counted live: those recorded and those the C loop
        keeps for its next record (another thread may read this while the loop runs)."""
        with self._kept_lock:
            return self._flushes + (self._c_kept[0] if self._c_kept is not None else 0)

    def flush_once(self, least_pages: int = 0) -> bool:
        before = self.ctl.get(C.POS_FLUSHED)
        ts_us, msgs, t0_ns = time_ns() // 1000, self.ctl.get(C.POS_MSGS), perf_counter_ns()
        try:
            after = self.cl.flush(least_pages)
        except StoreError as e:
            log.error("commitlog flush failed: %s", e)
            return False
        if after > before:
            self._note(ts_us, msgs, after - before, perf_counter_ns() - t0_ns)
            if self.checkpoint is not None:
                self.checkpoint.physic_ts_ms = self.ctl.get(C.POS_FLUSHED_STORE_TS)
        return True

    def _note(self, ts_us: int, msgs: int, group_bytes: int, flush_ns: int) -> None:
        """One flush that moved FLUSHED (started at ts_us with POS_MSGS at msgs): its trace
        record, its histograms and the count."""
        if self.trace is not None:
            self._trace_flush(ts_us, msgs, group_bytes, flush_ns)
        if self.stats is not None:
            self._count_flush(group_bytes, flush_ns, msgs)
        self._flushes += 1

    def _count_flush(self, group_bytes: int, flush_ns: int, now_msgs: int) -> None:
        """The flush into the metrics histograms (latency bucketed by microseconds); now_msgs:
        POS_MSGS when it started (its group: the messages since the last flush's start)."""
        latency, size, msgs = self._stat_rows
        group_msgs = max(0, now_msgs - self._stat_msgs_at)
        self._stat_msgs_at = now_msgs
        hist_add(latency, flush_ns, flush_ns // 1000)
        hist_add(size, group_bytes, group_bytes)
        hist_add(msgs, group_msgs, group_msgs)
        self.stats.publish()

    def _trace_flush(self, ts_us: int, msgs: int, group_bytes: int, flush_ns: int) -> None:
        """One flush record; a write error is logged and ends tracing (never flushing)."""
        assert msgs >= self._msgs_at, (msgs, self._msgs_at)
        try:
            self.trace.write({"kind": "flush", "broker": self.broker, "ts_us": ts_us,
                              "group_msgs": msgs - self._msgs_at, "group_bytes": group_bytes,
                              "flush_us": flush_ns / 1000})
        except OSError as e:
            log.error("perf trace: writing %s failed (%s); no more flush records", self.trace.path, e)
            self.trace = None
        self._msgs_at = msgs

    def run(self, stop: threading.Event) -> None:
        if self.sync:
            self._run_sync(stop)
        else:
            self._run_async(stop)
        self.flush_once(0)   # a clean stop leaves nothing unflushed

    def _run_sync(self, stop: threading.Event) -> None:
        """Group commit: C flushes whatever is appended as soon as it is (mq_commitlog_flush_for:
        no Python between a wake and its msync; under the native SYNC_FLUSH gate the store roles
        went 6.8-9.2 -> 6.0-7.7 us a message); Python looks at `stop`, releases deleted files
        and records the flushes every SYNC_WAIT_MS or SYNC_RECS of them."""
        recs = ffi.new("mq_flush_rec[]", SYNC_RECS)
        n = self._c_kept = ffi.new("uint32_t *")
        while not stop.is_set():
            if self.ctl.fatal():
                stop.wait(1.0)
                continue
            self.cl.release_below_min()
            try:
                self.cl.flush_for(SYNC_WAIT_MS, recs, SYNC_RECS, n)
            except StoreError as e:
                log.error("commitlog flush failed: %s", e)
            with self._kept_lock:                  # (C is not running: this thread called it)
                count, n[0] = n[0], 0
                self._record(recs, count)

    def _record(self, recs, count: int) -> None:
        """_note for each of `count` flushes of flush_for, then the checkpoint's store time."""
        for i in range(count):
            r = recs[i]
            self._note(r.ts_us, r.msgs, r.bytes, r.flush_ns)
        if count and self.checkpoint is not None:
            self.checkpoint.physic_ts_ms = self.ctl.get(C.POS_FLUSHED_STORE_TS)

    def _run_async(self, stop: threading.Event) -> None:
        interval_s = self.config.flushIntervalCommitLog / 1000
        thorough_s = self.config.flushCommitLogThoroughInterval / 1000
        last_thorough = time.monotonic()
        while not stop.wait(interval_s):
            if self.ctl.fatal():
                continue
            now = time.monotonic()
            least = self.config.flushCommitLogLeastPages
            if now - last_thorough >= thorough_s:
                least = 0
                last_thorough = now
            self.cl.release_below_min()
            self.flush_once(least)
