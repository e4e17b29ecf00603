"""The dispatch role: builds ConsumeQueue entries from the CommitLog.

It walks [dispatched_pos, write_pos) with the C scanner, writes each
record's entry at the record's own QUEUEOFFSET (so re-dispatching after a
crash rewrites the same bytes: idempotent), then advances each queue's CQ_MAX
and dispatched_pos and wakes SEQ_DISPATCH (long-polling pulls wait on it).
Prepared and rolled-back transaction messages get no entry.  For
SCHEDULE_TOPIC_XXXX the tags code is the delivery time (store time + delay
of the level, queue L-1 = level L), as in RocketMQ.

DLedger mode (committed_only): the walk stops at COMMITTED instead of
write_pos and wakes on SEQ_COMMIT, so a ConsumeQueue -- and so a pull --
never holds an entry the group has not committed; the C scanner steps over
each entry's 48-byte header and reports the record inside (its physical
offset is the entry's pos + 48).  Finding DISPATCHED below MIN there means an
install (a follower behind the leader's first entry took the leader's log from
it): `rebase` (MessageStore.finish_install) restarts the ConsumeQueues at the
leader's offsets, every cached CQ map is dropped, and dispatch goes on from MIN.

The message index (mq.store.index) is built in the same walk, batch by batch,
before dispatched_pos moves past the batch; a walk that starts below where the
index got to (a restart after a crash, an HA truncation) indexes those records
again."""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from . import control as C
from .checkpoint import Checkpoint
from .commitlog import CommitLog, SCAN_CLEAN_STOPS, SCAN_STOP_NAMES
from .consumequeue import ConsumeQueueSet, ENTRY_SIZE as CQ_ENTRY_SIZE
from .native import ffi, lib, check

log = logging.getLogger("mq.store.dispatch")

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
SCAN_BATCH_RECORDS = 16384
SPACE_RETRY_S = 0.5            # how often a dispatch paused for disk space tries again
DISPATCH_WAIT_MS = 100         # one C walk's length: how often the role looks at its stop flag


@dataclass(frozen=True)
class Refusal:
    """A record recovery proved misnamed (MessageStore._misfiled), as it read then: dispatch
    leaves it out of every queue while the record at its offset is still that one.  A DLedger
    member dispatches only what its group committed, so the dispatch role applies the refusals
    past that point later; meanwhile its group may truncate that uncommitted tail and write
    other entries there, whose records the identity tells apart (the same size, queue fields
    and store time to the millisecond would be taken for the refused record: named)."""
    why: str
    ident: tuple[int, int, int, int]           # TOTALSIZE, QUEUEID, QUEUEOFFSET, STORETIMESTAMP


def ident_of(rec) -> tuple[int, int, int, int]:
    """Refusal.ident of a scanned record (mq_scan_rec)."""
    return rec.size, rec.queue_id, rec.queue_offset, rec.store_ts_ms


class Dispatcher:
    def __init__(self, cl: CommitLog, cqs: ConsumeQueueSet, delay_levels_ms: list[int],
                 checkpoint: Checkpoint | None = None, cq_flush_interval_ms: int = 1000,
                 cq_thorough_interval_ms: int = 60000, committed_only: bool = False, index=None,
                 rebase=None):
        self.cl = cl
        # what is visible to consumers ends at END_POS; SEQ_END moves when it does
        self.end_pos = C.POS_COMMITTED if committed_only else C.POS_WRITE
        self.end_seq = C.SEQ_COMMIT if committed_only else C.SEQ_WRITE
        self.ctl = cl.ctl
        self.cqs = cqs
        self.delay_levels_ms = delay_levels_ms
        self.checkpoint = checkpoint
        self.cq_flush_interval_ms = cq_flush_interval_ms
        self.cq_thorough_interval_ms = cq_thorough_interval_ms
        self.index = index                      # IndexWriter, or None (messageIndexEnable=false)
        self.rebase = rebase                    # DLedger: finishes an install (see the module docstring)
        self.scanner = cl.scanner(SCAN_BATCH_RECORDS)
        self.last_store_ts_ms = 0
        self.records_dispatched = 0
        self.records_refused = 0                # records left out of every queue (_refuse)
        # CommitLog positions of records recovery proved misnamed (MessageStore._misfiled), which
        # dispatch leaves out of every queue; empty in the steady state but on a DLedger member, until
        # its group commits the entries past the commit recovery restored (MessageStore.refusals_pending)
        self.refuse_at: dict[int, Refusal] = {}
        self.maps = ffi.new("mq_cq_map[]", lib.MQ_QUEUE_SLOTS)
        self._done = ffi.new("uint32_t *")
        self._need_slot = ffi.new("uint32_t *")
        self._need_qoff = ffi.new("int64_t *")
        self._refused_since: float | None = None     # monotonic s: the disk refused CQ space
        # the steady state's C walk (mq_dispatch_for): its batch is the scanner's array
        self._run = ffi.new("mq_dispatch_run *", {"recs": self.scanner.recs, "cap": self.scanner.capacity,
                                                  "end_pos": self.end_pos, "end_seq": self.end_seq,
                                                  "rebase": rebase is not None})

    def _map_for(self, slot: int, queue_offset: int, phy_offset: int) -> bool:
        """Points maps[slot] at the CQ file holding queue_offset (creating it), for the record
        at phy_offset.  A record past the queue's next entry is checked first, by
        mq_dispatch_batch's rule (the gap's records must fit in the CommitLog between the queue's
        last record and this one), before any file is made for it; when that entry lies in an
        earlier file, the gap up to this file is filled with fillers and CQ_MAX moved past them
        (C fills a gap inside one file); an empty queue starts at this file.  False (nothing
        done): the record's QUEUEOFFSET is damaged."""
        cq = self.cqs.by_slot(slot)
        cur = self.ctl.queue_get(slot, C.Q_CQ_MAX)
        if queue_offset > cur:
            last_end = cq.last_phy_end(cur)
            if phy_offset < last_end or (queue_offset - cur) * lib.MQ_RECORD_SIZE_MIN > phy_offset - last_end:
                return False
            file_first = queue_offset - queue_offset % (cq.file_size // CQ_ENTRY_SIZE)
            if 0 < cur < file_first:
                cq.fill(cur, file_first)
                self.ctl.queue_set(slot, C.Q_CQ_MAX, file_first)
            elif cur == 0 < file_first:
                # an empty queue whose first record comes past its first file: its earlier records
                # are gone (a DLedger member's rebuild after its log's head was given up, dispatched
                # once the group commits): it starts at that file, as a queue retention cut does
                for field_ in (C.Q_CQ_MIN, C.Q_CQ_MAX):
                    self.ctl.queue_set(slot, field_, file_first)
        ptr, first, entries = cq.writable_ptr(queue_offset)
        m = self.maps[slot]
        m.base = ptr
        m.first_qoff = first
        m.entries = entries
        m.delay_ms = -1
        if cq.topic == SCHEDULE_TOPIC and 0 <= cq.queue_id < len(self.delay_levels_ms):
            m.delay_ms = self.delay_levels_ms[cq.queue_id]
        return True

    def _refuse(self, rec, slot: int) -> None:
        """One line for a record mq_dispatch_batch would not file: its QUEUEOFFSET would take
        another record's entry or leave a gap the CommitLog before it cannot hold, so its queue
        fields (which no checksum covers) are damaged.  It stays in the CommitLog, in no queue."""
        cq = self.cqs.by_slot(slot)
        self.records_refused += 1
        log.error("dispatch: the record at %d names %s:%d queue offset %d, which that queue (next entry %d) "
                  "cannot take (damaged queue fields): left out of every ConsumeQueue", rec.phy_offset,
                  cq.topic, cq.queue_id, rec.queue_offset, self.ctl.queue_get(slot, C.Q_CQ_MAX))

    def _next_refused(self, recs, at: int, n: int) -> int:
        """The index of the first record of recs[at:n] that refuse_at names (n when none)."""
        refuse_at = self.refuse_at
        for i in range(at, n):
            r = refuse_at.get(recs[i].phy_offset)
            if r is not None and r.ident == ident_of(recs[i]):
                return i
        return n

    def _refuse_known(self, rec) -> None:
        """One line for a record recovery proved misnamed (refuse_at): it stays in the CommitLog, in no queue."""
        self.records_refused += 1
        topic = bytes(self.cl.view_raw(rec.phy_offset + rec.topic_offset, rec.topic_len)).decode()
        log.error("dispatch: the record at %d names %s:%d queue offset %d, but %s (damaged queue fields): left out "
                  "of every ConsumeQueue", rec.phy_offset, topic, rec.queue_id, rec.queue_offset,
                  self.refuse_at[rec.phy_offset].why)

    def dispatch_once(self, limit: int | None = None, resync: bool = False) -> int:
        """Dispatches what is published (up to `limit`); returns records dispatched.
        resync (recovery's walks over files it did not validate): a walk
        that meets damage before the end goes on at the next whole record (CommitLog.resync),
        saying so in one line, instead of raising.
        The per-record work (entry encoding, CQ_MAX) is one C call per scan batch;
        Python only maps a CQ file (or allocates more of it) when C reaches its end.
        When the disk refuses that space, dispatch stops before the record that needs it
        and the next call tries again (logged once per episode): it never dies of a full
        disk, and what it dispatched stays readable."""
        start = self.ctl.get(C.POS_DISPATCHED)
        # below where this start's recovery validated (a DLedger member whose commit it restored low,
        # then raised by its group) the bytes are as the disk kept them: damage there is skipped too
        resync = resync or start < self.ctl.get(C.POS_VALIDATED)
        if self.rebase is not None and start < self.ctl.get(C.POS_MIN):
            try:
                start = self._rebase()
            except OSError as e:              # no space for a queue's filler: retried as any CQ space
                self._space_refused(e)
                return 0
        end = self.ctl.get(self.end_pos) if limit is None else limit
        total = 0
        recs = self.scanner.recs
        if self.index is not None and start < end:
            self.index.redo_from(start)
        while start < end:
            n, nxt, stop = self.scanner.scan(start, end, check_crc=False, resolve_slots=2)
            at = 0
            while at < n:
                upto = self._next_refused(recs, at, n) if self.refuse_at else n
                if upto == at:
                    self._refuse_known(recs[at])
                    at += 1
                    continue
                rc = lib.mq_dispatch_batch(self.ctl.ptr, recs + at, upto - at, self.maps,
                                           self._done, self._need_slot, self._need_qoff)
                at += self._done[0]
                if rc == lib.MQ_E_RANGE:
                    try:
                        if not self._map_for(self._need_slot[0], self._need_qoff[0], recs[at].phy_offset):
                            self._refuse(recs[at], self._need_slot[0])
                            at += 1
                    except OSError as e:
                        self._space_refused(e)
                        break
                elif rc == lib.MQ_E_CORRUPT:
                    self._refuse(recs[at], self._need_slot[0])
                    at += 1
                else:
                    check(rc, "dispatch")
            if at < n:                         # stopped for space: resume at recs[at]
                nxt = recs[at].dl_pos if self.end_pos == C.POS_COMMITTED else recs[at].phy_offset
                n = at
            elif self._refused_since is not None:
                log.warning("dispatch resumed: the disk gives ConsumeQueue space again (paused %.1f s)",
                            time.monotonic() - self._refused_since)
                self._refused_since = None
            if n:
                self.last_store_ts_ms = recs[n - 1].store_ts_ms
                if self.index is not None:
                    self.index.build(self.cl, recs, n)
            self.ctl.advance(C.POS_DISPATCHED, nxt)
            total += n
            if self._refused_since is not None:
                break
            if resync and nxt < end and (stop not in SCAN_CLEAN_STOPS or stop == lib.MQ_SCAN_END):
                # recovery walks files it did not validate: damage there (a bad record, a hole of
                # zeros, a missing file) costs the records it covers, not the ones after it
                resume = self.cl.resync(nxt + 1, end)
                log.error("dispatch: the CommitLog is damaged at %d (%s): %d bytes skipped to %s, their records "
                          "are in no ConsumeQueue", nxt, SCAN_STOP_NAMES.get(stop, stop), resume - nxt,
                          f"the next whole record at {resume}" if resume < end else f"the end {end}")
                self.ctl.advance(C.POS_DISPATCHED, resume)
                start = resume
                continue
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

    def dispatch_for(self, wait_ms: int) -> bool:
        """The steady state in C for up to wait_ms (mq_dispatch_for, GIL released): dispatch
        and index whenever records are published, sleep otherwise.  Whatever C leaves to Python
        (a CQ file to map, an index file without room, an install, a bad scan stop) is done by
        dispatch_once() from DISPATCHED before this returns.  False when C cannot run at all
        (the disk refused CQ space, or the index has no open file): call dispatch_once()."""
        ix = self.index
        if self._refused_since is not None or (ix is not None and (not ix.opened or ix.cur is None)):
            return False
        d = self._run
        d.maps = self.maps                      # (an install replaces the array)
        indexing = ix is not None and time.monotonic() >= ix.paused_until
        d.index = ix.cur.map if indexing else ffi.NULL
        if ix is not None:
            d.index_from = ix.from_phy
        d.last_store_ts_ms = self.last_store_ts_ms
        d.records = 0
        rc = lib.mq_dispatch_for(self.cl.handle, d, wait_ms)
        if ix is not None:
            ix.from_phy = d.index_from
            if indexing and d.records:
                ix.indexed_ts_ms = d.last_store_ts_ms
        self.last_store_ts_ms = d.last_store_ts_ms
        self.records_dispatched += d.records
        check(rc, "dispatch")
        if d.why == lib.MQ_DISPATCH_CALLER:
            self.dispatch_once()
        return True

    def _rebase(self) -> int:
        """DISPATCHED below MIN: only an install moves MIN past what is dispatched (retention
        deletes dispatched files only).  The store finishes it (files below go, queues restart);
        the maps C writes through are dropped, since files were deleted and rewritten."""
        min_pos = self.ctl.get(C.POS_MIN)
        self.maps = ffi.new("mq_cq_map[]", lib.MQ_QUEUE_SLOTS)
        self.rebase(min_pos)
        self.ctl.advance(C.POS_DISPATCHED, min_pos)
        if self._refused_since is not None:
            log.warning("dispatch resumed: the install's ConsumeQueues are rebased (paused %.1f s)",
                        time.monotonic() - self._refused_since)
            self._refused_since = None
        return min_pos

    def _space_refused(self, e: OSError) -> None:
        if self._refused_since is None:
            self._refused_since = time.monotonic()
            log.error("dispatch paused: no disk space for ConsumeQueue entries (%s); what is dispatched stays "
                      "readable, and dispatch retries until space is freed", e)

    def flush_queues(self) -> None:
        """Makes what dispatch wrote durable (index files, ConsumeQueues), then records in the
        checkpoint how far.  Safe on a thread beside dispatch_once(), which is where run() calls
        it: it reads only what dispatch publishes (last_store_ts_ms, each queue's CQ_MAX) and
        syncs files by path with the GIL released (mq.store.durable).  So a slow disk delays
        durability, never visibility: on a disk busy with other writes one flush can take
        seconds, and consumers would see nothing new meanwhile (RocketMQ keeps the two apart
        too: FlushConsumeQueueService beside ReputMessageService)."""
        ts = self.last_store_ts_ms       # read first: every entry of a record stored up to ts is written
        if self.index is not None:
            self.index.flush()
        self.cqs.sync()
        if self.checkpoint is not None and ts:
            self.checkpoint.logics_ts_ms = ts
            self.checkpoint.flush()

    def _flush_loop(self, done: threading.Event) -> None:
        while not done.wait(self.cq_flush_interval_ms / 1000):
            try:
                self.flush_queues()
            except OSError as e:
                # the ConsumeQueues and the index can be rebuilt from the CommitLog: a failed
                # sync costs durability of derived data only, so it is reported and retried
                log.error("ConsumeQueue/index flush failed (retried in %d ms): %s", self.cq_flush_interval_ms, e)
            except BaseException as e:        # a bug: the dispatch loop raises it (the role restarts)
                self._flush_failure = e
                return

    def run(self, stop: threading.Event) -> None:
        """The role's loop: dispatch whenever records are published; flush_queues() every
        cq_flush_interval_ms on a thread of its own."""
        self._flush_failure: BaseException | None = None
        done = threading.Event()
        flusher = threading.Thread(target=self._flush_loop, args=(done,), name="dispatch-flush", daemon=True)
        flusher.start()
        try:
            while not stop.is_set():
                if self._flush_failure is not None:
                    raise self._flush_failure
                self.cl.release_below_min()       # (files retention deleted: their blocks go)
                if self.refuse_at:
                    # refusals still ahead (a DLedger member's, past the commit recovery restored):
                    # the walk in C does not know them, so dispatch_once walks until they are passed
                    dispatched = self.ctl.get(C.POS_DISPATCHED)
                    self.refuse_at = {phy: r for phy, r in self.refuse_at.items() if phy >= dispatched}
                if not self.refuse_at and self.dispatch_for(DISPATCH_WAIT_MS):
                    continue
                seen = self.ctl.seq(self.end_seq)
                self.dispatch_once()
                if self._refused_since is not None:
                    stop.wait(SPACE_RETRY_S)          # the disk refused space: retry, without spinning
                elif self.ctl.get(C.POS_DISPATCHED) >= self.ctl.get(self.end_pos):
                    self.ctl.wait(self.end_seq, seen, 100)
        finally:
            done.set()
            flusher.join()
        self.dispatch_once()
        self.flush_queues()
        if self.index is not None:
            self.index.close()


def index_writer(cfg, checkpoint=None):
    """The dispatch walk's IndexWriter for a store config, or None when messageIndexEnable is off."""
    if not cfg.messageIndexEnable:
        return None
    from .index import IndexWriter
    return IndexWriter(cfg.storePathRootDir, cfg.maxHashSlotNum, cfg.maxIndexNum, checkpoint)
