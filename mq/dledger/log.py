"""The Raft core's log (mq.dledger.core's interface) over the CommitLog in DLedger mode.

The entries are the CommitLog's own: the leader's io workers append them (one C call per
batch, index and term assigned under the control block's lock), the Raft role reads their
positions from the index files and streams their bytes; a follower appends the leader's bytes
with mq_dledger_append_raw, which validates every entry before anything is published.

Batches:
  OutBatch   what a leader's Append carries: entries first..last as one byte range of one data
             file (pos, nbytes), with the end-of-file filler when the next entry starts in the
             next file (the follower must write it too, so its positions stay the leader's).
  InBatch    what a follower received: the same bytes in memory, with the first entry's index
             and position; term_of(i) parses entry headers only when the core compares terms.

A fence: a follower's append and truncate first make sure io workers cannot append any more
(DL_APPEND_TERM 0) -- the step that makes a leader a follower and the step that then cuts its
log can be the same one.

An install (a follower behind the leader's first entry, mq.dledger.core): the batch also
carries every queue's offset at the leader's first position (queue_offsets).  The follower
saves them in the rebase file (durable), then mq_dledger_install resets its log to the
leader's in one step; the dispatcher finishes the rest (MessageStore.finish_install: files
below go, ConsumeQueues restart at those offsets), or recovery after a crash does."""
from __future__ import annotations

import logging
import os
import struct

from mq.store import CorruptRecord, OutOfRange, control as C
from mq.store.dledgerfiles import REBASE, clear_rebase, save_rebase
from mq.wire import dledger as W
from mq.wire.errors import WireError
from mq.wire.filenames import offset_file_path
from mq.wire import dledger_rpc as RPC

from .core import LogDamaged

log = logging.getLogger("mq.dledger")

ENTRY_HEADER = struct.Struct(">iiqqqiiii")      # magic, size, index, term, pos, channel, chainCrc, bodyCrc, bodySize
BLANK_MAGIC = -1


class DamagedEntry(CorruptRecord, LogDamaged):
    """An entry of ours that fails its checks: a CorruptRecord to the store's callers, the
    core's LogDamaged (a leader cannot serve it: mq.dledger.core)."""

    def __init__(self, index: int, why: str):
        LogDamaged.__init__(self, index, why)


class OutBatch:
    __slots__ = ("first_index", "last_index", "pos", "nbytes", "_log")

    def __init__(self, log: "DLedgerLog", first_index: int, last_index: int, pos: int, nbytes: int):
        self._log = log
        self.first_index = first_index
        self.last_index = last_index
        self.pos = pos
        self.nbytes = nbytes

    def term_of(self, index: int) -> int:
        return self._log.term_at(index)


class InBatch:
    """Entries first_index..last_index received in `buf` (bytes as in the leader's files from first_pos)."""
    __slots__ = ("first_index", "last_index", "first_pos", "buf", "_offsets", "queue_offsets")

    def __init__(self, buf, first_index: int, count: int, first_pos: int, queue_offsets: list | None = None):
        assert count > 0
        self.buf = buf
        self.first_index = first_index
        self.last_index = first_index + count - 1
        self.first_pos = first_pos
        self.queue_offsets = queue_offsets     # an install's [(topic, queueId, offset at first_pos)]
        self._offsets: list[tuple[int, int]] | None = None     # (offset in buf, term) per entry

    def _walk(self) -> list[tuple[int, int]]:
        if self._offsets is None:
            out, at, buf = [], 0, self.buf
            while at + 8 <= len(buf) and len(out) < self.last_index - self.first_index + 1:
                magic, size = struct.unpack_from(">ii", buf, at)
                if magic == BLANK_MAGIC:
                    at += size if size > 0 else len(buf)
                    continue
                if size < ENTRY_HEADER.size or at + size > len(buf):
                    break                       # damaged: append_raw will refuse the batch
                out.append((at, struct.unpack_from(">q", buf, at + 16)[0]))
                at += size
            self._offsets = out
        return self._offsets

    def term_of(self, index: int) -> int:
        offs = self._walk()
        i = index - self.first_index
        return offs[i][1] if 0 <= i < len(offs) else -1

    def tail(self, from_index: int):
        """(bytes from entry from_index on, its position)."""
        if from_index == self.first_index:
            return self.buf, self.first_pos
        offs = self._walk()
        i = from_index - self.first_index
        at = offs[i][0]
        return self.buf[at:], self.first_pos + at


class DLedgerLog:
    """mq.dledger.core's log interface.  durable: 'sync' counts only flushed entries as the
    leader's own match (flushDiskType=SYNC_FLUSH), 'async' counts what is written."""

    def __init__(self, cl, sync_durable: bool, push_bytes_max: int = RPC.PUSH_BYTES_MAX,
                 dledger_dir: str | None = None, index_dir: str | None = None, index_file_size: int = 0):
        self.cl = cl
        self.dledger_dir = dledger_dir         # where an install's rebase file goes (None: no installs)
        self.index_dir = index_dir             # where the unit of the entry before the first may be read
        self.index_file_size = index_file_size
        self.ctl = cl.ctl
        self.sync_durable = sync_durable
        self.push_bytes_max = push_bytes_max
        self.file_size = cl.file_size
        self.appended = 0              # follower appends since start (entries), for stats
        self.installs = 0              # installs since start

    # ---- reading ------------------------------------------------------------------------------------
    def last_index(self) -> int:
        return self.ctl.get(C.POS_DL_NEXT_INDEX) - 1

    def last_term(self) -> int:
        return self.ctl.get(C.POS_DL_END_TERM)

    def first_index(self) -> int:
        return self.ctl.get(C.POS_DL_BEGIN_INDEX)

    def term_at(self, index: int):
        first = self.first_index()
        if index < first:
            if index == -1:
                return 0 if first == 0 else None
            return self._term_before_first(index) if index == first - 1 else None
        if index > self.last_index():
            return None
        return self._entry(index)[2]

    def _entry(self, index: int) -> tuple[int, int, int]:
        """(pos, size, term) of entry `index` (CommitLog.dledger_entry); DamagedEntry when its unit
        and the entries cannot say."""
        try:
            return self.cl.dledger_entry(index)
        except CorruptRecord as e:
            raise DamagedEntry(index, f"its index unit and entries disagree ({e})") from None

    def _term_before_first(self, index: int) -> int | None:
        """The term of the entry just before the first one held, from its index unit if retention
        left that (it deletes whole index files only; an install zeroes the units before its
        first entry): a follower whose log ends there is then caught up without an install."""
        if self.index_dir is None or not self.index_file_size:
            return None
        at = index * W.INDEX_UNIT_SIZE
        try:
            with open(offset_file_path(self.index_dir, at - at % self.index_file_size), "rb") as f:
                f.seek(at % self.index_file_size)
                unit = W.parse_index_unit(f.read(W.INDEX_UNIT_SIZE))
        except (OSError, WireError):
            return None
        return unit.term if unit is not None and unit.index == index and unit.term > 0 else None

    def durable_index(self) -> int:
        if self.sync_durable:
            return self.ctl.get(C.POS_DL_FLUSHED_INDEX) - 1
        return self.last_index()

    def entries(self, first: int, last: int, checked: bool = False) -> OutBatch:
        """Entries first.. as one byte range: at most push_bytes_max bytes (at least one entry),
        within first's data file.  checked: every entry's bytes are checked with their CRCs and
        the batch ends before the first damaged one (DamagedEntry when that is `first`); a probe
        of the core's (~1 ms a MiB), never the pushes C streams."""
        fs = self.file_size
        pos, size, _ = self._entry(first)
        file_end = pos - pos % fs + fs
        limit = min(pos + self.push_bytes_max, file_end)

        def end_of(i: int) -> int:
            p, s, _ = self._entry(i)
            return p + s if p // fs == pos // fs else file_end + 1     # another file: too far

        hi = last
        if end_of(hi) > limit:
            lo = first                      # end_of(lo) fits (one entry always goes)
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if end_of(mid) <= limit:
                    lo = mid
                else:
                    hi = mid - 1
        if checked:
            bad = self.cl.dledger_first_damaged(first, hi)
            if bad == first:
                raise DamagedEntry(first, "its bytes fail their checks")
            if bad <= hi:
                return OutBatch(self, first, bad - 1, pos, end_of(bad - 1) - pos)
        end = end_of(hi)
        if hi < self.last_index():
            nxt = self._entry(hi + 1)[0]
            if nxt >= file_end:            # the next entry opens the next file: send the filler too
                end = file_end
        return OutBatch(self, first, hi, pos, end - pos)

    # ---- writing (followers) ------------------------------------------------------------------------
    def _fence(self) -> None:
        if self.ctl.get(C.POS_DL_APPEND_TERM):
            self.cl.dledger_set_append_term(0)

    def append(self, batch: InBatch, from_index: int) -> None:
        self._fence()
        buf, pos = batch.tail(from_index)
        try:
            n = self.cl.dledger_append_raw(buf, from_index, pos, max_term=self._max_term)
        except OutOfRange:
            ours = self.ctl.get(C.POS_WRITE)
            if from_index != self.ctl.get(C.POS_DL_NEXT_INDEX):
                raise
            # refused like damaged entries (the connection drops, the leader retries): this log
            # cannot follow the leader's until an operator lines the stores up
            raise CorruptRecord(f"the leader stores entry {from_index} at position {pos}, this member's log ends at "
                                f"{ours}: the two logs do not line up (switched to DLedger from another old "
                                "CommitLog than the leader's? every member must switch with the same one: "
                                "mq.store.legacy)") from None
        assert n == batch.last_index - from_index + 1, (n, batch.last_index, from_index)
        self.appended += n

    def truncate_from(self, index: int) -> None:
        self._fence()
        self.cl.dledger_truncate(index)

    def install_pending(self) -> bool:
        """Is an earlier install still being finished (its rebase file there)?  A new one waits."""
        return self.dledger_dir is not None and os.path.exists(os.path.join(self.dledger_dir, REBASE))

    def install(self, batch: InBatch) -> None:
        """The leader's log from its first entry on replaces ours (see the module docstring).
        The rebase file goes again if the store refuses the install (nothing was applied)."""
        assert self.dledger_dir is not None and batch.queue_offsets is not None
        log.warning("DLedger: our log (entries %d..%d) is behind the leader's first entry %d: installing the "
                    "leader's log from it (position %d, %d queues)", self.first_index(), self.last_index(),
                    batch.first_index, batch.first_pos, len(batch.queue_offsets))
        self._fence()
        save_rebase(self.dledger_dir, batch.first_index, batch.first_pos, batch.queue_offsets)
        try:
            n = self.cl.dledger_install(batch.buf, batch.first_index, batch.first_pos, max_term=self._max_term)
        except BaseException:
            clear_rebase(self.dledger_dir)
            raise
        assert n == batch.last_index - batch.first_index + 1, (n, batch.first_index, batch.last_index)
        self.appended += n
        self.installs += 1

    def append_noop(self, term: int) -> int:
        return self.cl.dledger_append_noop(term)

    # the highest term a follower accepts in received entries: the current term of the node
    # (set by the role before each step)
    _max_term = 0

    def set_term_bound(self, term: int) -> None:
        self._max_term = term
