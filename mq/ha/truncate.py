"""Cutting a running slave store back to the master's end (divergence), and
re-basing an empty slave at the master's first transferred offset.

Both run while other processes of the same store are alive (io workers
reading, the flush and dispatch roles), so neither ever unlinks a file that
may hold data again later: another process's mapping of an unlinked file
would keep the old inode, and reads through it would return the diverged
bytes after the log grows back over that range.  Files past the cut are
zeroed in place instead (all-zero CommitLog files past the end are what
recovery expects and removes at the next start; all-zero ConsumeQueue entries
are "empty").

truncate_to(store, offset) -- precondition: nobody appends to the store
while it runs (on a slave the HA slave thread calling it is the only writer)
and nobody dispatches concurrently.  The second part is established here:
with no appender, a dispatch role that has caught up with write_pos stays
idle, so truncate_to first waits (up to dispatch_timeout_s) until
POS_DISPATCHED >= POS_WRITE and refuses (DispatchBusy) otherwise.  Order:
  1. POS_WRITE = cut           readers and the dispatcher stop at cut
  2. each ConsumeQueue: CQ_MAX = first entry pointing at or past cut; the
     entries from there on zeroed on disk
  3. CommitLog bytes from cut to the end of the log zeroed (msync'd)
  4. POS_DISPATCHED, POS_FLUSHED, POS_CONFIRM lowered to cut
A reader that took a view of the cut range before step 1 may still see the
bytes change under it: the same exposure as any read racing retention.

rebase_empty(cl, ctl, offset) -- a slave with nothing published (write_pos
0) about to receive from `offset` (the start of the master's last file):
files below offset are removed (they hold nothing: write_pos is 0), and every
position moves to offset, so recovery and readers see a log that starts
there, like a master whose older files retention deleted."""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

from mq.store import control as C
from mq.store.commitlog import CommitLog, list_files
from mq.store.consumequeue import ENTRY_SIZE
from mq.store.native import StoreError, lib
from mq.wire.filenames import list_offset_files, offset_file_name, offset_file_path

log = logging.getLogger("mq.ha.truncate")

ZERO_CHUNK = 64 * 1024
SCAN_BATCH = 4096


class DispatchBusy(StoreError):
    """The dispatch role did not catch up in time: truncating now would race it."""


@dataclass
class TruncateReport:
    old_end: int = 0                 # write_pos before
    new_end: int = 0                 # write_pos after
    requested: int = 0               # the offset asked for (the master's end)
    cq_entries_dropped: int = 0
    queues_cut: list[str] = field(default_factory=list)

    @property
    def dropped_bytes(self) -> int:
        return self.old_end - self.new_end


def record_boundary_at_or_below(cl: CommitLog, offset: int) -> int:
    """The highest record start (or end) <= offset in the slave's own log,
    walking from the start of offset's file (a file start is always a boundary).
    Equal to offset when the two logs agree up to there."""
    fs = cl.file_size
    pos = offset - offset % fs
    sc = cl.scanner(SCAN_BATCH)
    while pos < offset:
        n, nxt, stop = sc.scan(pos, offset, check_crc=False, resolve_slots=0)
        if nxt > offset:
            # stepped over an end-of-file filler that reaches past offset: the last record's end
            last = sc.recs[n - 1] if n else None
            return last.phy_offset + last.size if last is not None else pos
        if stop != lib.MQ_SCAN_FULL or nxt == pos:
            return nxt
        pos = nxt
    return pos


def truncate_to(store, offset: int, dispatch_timeout_s: float = 10.0) -> TruncateReport:
    """Cuts the store's log to `offset` (lowered to a record boundary of this log
    if it is not one) and its ConsumeQueues to match.  Returns what was dropped.
    Raises DispatchBusy (nothing changed), StoreError for an impossible cut
    (below the oldest retained offset; nothing changed) or I/O errors."""
    cl, ctl = store.cl, store.ctl
    fs = cl.file_size
    old_end = cl.write_pos
    rep = TruncateReport(old_end=old_end, new_end=old_end, requested=offset)
    if offset >= old_end:
        return rep
    if offset < ctl.get(C.POS_MIN):
        raise StoreError(f"cannot truncate to {offset}: below the oldest retained offset {ctl.get(C.POS_MIN)} "
                         "(the slave holds no data the master still has; rebuild it from a copy)")
    if ctl.get(C.POS_DISPATCHED) < old_end and not store.dispatch_waiter.wait(old_end, dispatch_timeout_s):
        raise DispatchBusy(f"dispatch is at {ctl.get(C.POS_DISPATCHED)}, behind the end {old_end}, "
                           f"after {dispatch_timeout_s}s; not truncating under it")
    cut = record_boundary_at_or_below(cl, offset)
    if cut != offset:
        log.error("offset %d is inside a record of this log: the logs differ before the master's end; "
                  "cutting at the record boundary %d instead", offset, cut)
    assert cut <= offset < old_end
    rep.new_end = cut

    ctl.set(C.POS_WRITE, cut)
    for topic, qid in store.cqs.on_disk():
        n = _cut_queue(store, topic, qid, cut)
        if n:
            rep.cq_entries_dropped += n
            rep.queues_cut.append(f"{topic}:{qid}")
    cl.zero_tail(cut)
    for start in list_files(cl.directory):
        if start > cut - cut % fs:
            cl.zero_tail(start)
    for pos in (C.POS_DISPATCHED, C.POS_FLUSHED, C.POS_CONFIRM):
        if ctl.get(pos) > cut:
            ctl.set(pos, cut)
    ctl.wake(C.SEQ_DISPATCH)
    assert cl.write_pos == cut
    log.warning("truncated the CommitLog from %d to %d (%d bytes dropped), %d ConsumeQueue entries in %d queues",
                old_end, cut, rep.dropped_bytes, rep.cq_entries_dropped, len(rep.queues_cut))
    return rep


def _cut_queue(store, topic: str, qid: int, cut: int) -> int:
    """Drops the queue's entries pointing at or past `cut`; returns how many."""
    cq = store.cqs.get(topic, qid)
    if cq.slot is None:
        return 0
    ctl = store.ctl
    lo, hi = cq.min_offset, cq.max_offset
    first = cq.first_entry_at_or_after(lo, hi, cut)
    if first < hi:
        ctl.queue_set(cq.slot, C.Q_CQ_MAX, first)
        ctl.queue_set(cq.slot, C.Q_NEXT_OFFSET, first)
        if ctl.queue_get(cq.slot, C.Q_CQ_MIN) > first:
            ctl.queue_set(cq.slot, C.Q_CQ_MIN, first)
    # zero on disk from `first` even when CQ_MAX was already below it: a crash may have left entries there
    _zero_cq_files(cq.dir, store.config.cq_file_size, first * ENTRY_SIZE)
    return max(0, hi - first)


def _zero_cq_files(directory: str, file_size: int, from_byte: int) -> None:
    """Zeroes every ConsumeQueue file byte at logical position >= from_byte, in
    place (pwrite through the page cache that every process's mapping shares)."""
    try:
        names = [offset_file_name(s) for s in list_offset_files(directory)]
    except FileNotFoundError:
        return
    for name in names:
        start = int(name)
        if start + file_size <= from_byte:
            continue
        path = os.path.join(directory, name)
        fd = os.open(path, os.O_RDWR)
        try:
            if os.fstat(fd).st_size != file_size:
                log.warning("ConsumeQueue file %s has an unexpected size; left alone", path)
                continue
            pos, dirty = max(0, from_byte - start), False
            while pos < file_size:
                n = min(ZERO_CHUNK, file_size - pos)
                if any(os.pread(fd, n, pos)):
                    os.pwrite(fd, bytes(n), pos)
                    dirty = True
                pos += n
            if dirty:
                os.fsync(fd)
        finally:
            os.close(fd)


def rebase_empty(cl: CommitLog, ctl: C.ControlBlock, offset: int) -> list[str]:
    """Moves an empty slave's log start to `offset` (file-aligned); returns the
    names of the files removed below it."""
    fs = cl.file_size
    if cl.write_pos != 0:
        raise StoreError(f"rebase of a non-empty log (write_pos {cl.write_pos})")
    if offset % fs:
        raise StoreError(f"rebase to {offset}, which is not a CommitLog file start")
    # dispatch first, write last: a dispatcher reading the two in between scans an
    # empty range or finds no file (a clean end); it never sees [0, offset) as data
    for pos in (C.POS_DISPATCHED, C.POS_FLUSHED, C.POS_MIN, C.POS_CONFIRM, C.POS_WRITE):
        ctl.set(pos, offset)
    removed = []
    for start in list_files(cl.directory):
        if start < offset:
            try:
                os.unlink(offset_file_path(cl.directory, start))
                removed.append(offset_file_name(start))
            except FileNotFoundError:
                pass
    cl.release(below=offset)
    log.info("empty slave: the log now starts at %d (removed %s)", offset, removed or "nothing")
    return removed


__all__ = ["truncate_to", "rebase_empty", "record_boundary_at_or_below", "TruncateReport", "DispatchBusy"]
