"""ConsumeQueue: per (topic, queueId) index of the CommitLog.

Entry n sits at logical byte n*20:  commitLogOffset 8 | size 4 | tagsCode 8
(mq.wire.consumequeue declares it).  Files of `file_size` bytes (300000
entries by default) live under consumequeue/<topic>/<queueId>/ and are named
by the 20-digit logical byte offset of their first entry.

Only the dispatch role writes entries; any process reads them.  The number of
entries present (max offset) and the first one still kept (min offset) live
in the topic-queue slot of the control block, so readers in other processes
never read an entry before it is complete: dispatch writes the entry, then
advances CQ_MAX.

Space: a file is created at its full size but sparse, and its blocks are allocated
(fallocate) CQ_ALLOC_ENTRIES at a time ahead of the writer, so a full disk is ENOSPC
when a step is allocated -- dispatch pauses and retries -- never a SIGBUS in a mapped
write."""
from __future__ import annotations

import json
import logging
import mmap
import os

from mq.files import fsync_path
from mq.wire.consumequeue import CQ_ENTRY, CQ_ENTRY_SIZE
from mq.wire.filenames import list_offset_files, offset_file_name, offset_file_path

from . import control as C
from .native import ffi, lib

log = logging.getLogger("mq.store.consumequeue")

ENTRY, ENTRY_SIZE = CQ_ENTRY, CQ_ENTRY_SIZE     # the layout is mq.wire.consumequeue's
CHECK_TAIL_ENTRIES = 1024       # entries recovery checks at the end of each queue (damage())
CQ_ALLOC_ENTRIES = 4096         # entries whose blocks are allocated ahead of the writer (80 KiB a step)
_ZERO_CHUNK = bytes(1 << 20)          # compared against, a MiB at a time (memcmp speed)
EMPTY_ENTRY = b"\0" * ENTRY_SIZE
FILLER = (0, lib.MQ_CQ_FILLER_SIZE, 0)    # a hole's entry (RocketMQ's fillPreBlank); dispatch.c writes it too


class ConsumeQueue:
    def __init__(self, cq_root: str, topic: str, queue_id: int, file_size: int,
                 ctl: C.ControlBlock, writable: bool = False):
        assert file_size % ENTRY_SIZE == 0
        self.topic = topic
        self.queue_id = queue_id
        self.dir = os.path.join(cq_root, topic, str(queue_id))
        self.file_size = file_size
        self.ctl = ctl
        self.writable = writable
        self.slot = ctl.queue_slot(topic, queue_id, create=writable)
        self._maps: dict[int, mmap.mmap] = {}
        self._ptrs: dict[int, object] = {}     # cffi views of writable maps handed to C dispatch
        self._synced_max: int | None = None    # entries below are durable (sync(); None: not known yet)
        self._allocated: dict[int, int] = {}   # file start -> entries whose blocks are allocated
        if writable:
            os.makedirs(self.dir, exist_ok=True)

    # ---- files ---------------------------------------------------------------
    def file_starts(self) -> list[int]:
        return list_offset_files(self.dir)

    def _map(self, start: int, create: bool) -> mmap.mmap | None:
        mm = self._maps.get(start)
        if mm is not None:
            return mm
        path = offset_file_path(self.dir, start)
        try:
            fd = os.open(path, os.O_RDWR | (os.O_CREAT if create else 0), 0o644)
        except FileNotFoundError:
            return None
        try:
            if os.fstat(fd).st_size != self.file_size:
                if not create:
                    return None
                os.ftruncate(fd, self.file_size)
            mm = mmap.mmap(fd, self.file_size, access=mmap.ACCESS_WRITE if self.writable else mmap.ACCESS_READ)
        finally:
            os.close(fd)
        self._maps[start] = mm
        return mm

    def _locate(self, queue_offset: int) -> tuple[int, int]:
        byte = queue_offset * ENTRY_SIZE
        start = byte - byte % self.file_size
        return start, byte - start

    # ---- offsets ---------------------------------------------------------------
    @property
    def max_offset(self) -> int:
        if self.slot is None:
            self.slot = self.ctl.queue_slot(self.topic, self.queue_id)
            if self.slot is None:
                return 0
        return self.ctl.queue_get(self.slot, C.Q_CQ_MAX)

    @property
    def min_offset(self) -> int:
        if self.slot is None:
            return 0
        return self.ctl.queue_get(self.slot, C.Q_CQ_MIN)

    # ---- write (dispatch role) ----------------------------------------------------
    def put(self, queue_offset: int, phy_offset: int, size: int, tags_code: int) -> None:
        """Writes entry `queue_offset`; idempotent (re-dispatch writes the same bytes)."""
        assert self.writable and queue_offset >= 0 and size > 0
        start, off = self._locate(queue_offset)
        mm = self._maps.get(start) or self._map(start, create=True)
        self._allocate(start, off // ENTRY_SIZE + 1)
        ENTRY.pack_into(mm, off, phy_offset, size, tags_code)

    def writable_ptr(self, queue_offset: int):
        """(pointer to the mapped file holding queue_offset, its first queue offset, entries
        the writer may use in it) for C dispatch; the file is created if needed, and its blocks
        allocated up to past queue_offset (C comes back here when it reaches their end).
        OSError (ENOSPC) when the disk refuses: nothing was written."""
        assert self.writable
        start, off = self._locate(queue_offset)
        ptr = self._ptrs.get(start)
        if ptr is None:
            mm = self._maps.get(start)
            if mm is None:
                first_file = off > 0 and not self.file_starts()
                mm = self._map(start, create=True)
                if first_file:
                    self._fill_pre_blank(mm, start, off)
            ptr = self._ptrs[start] = ffi.from_buffer(mm)
        return ptr, start // ENTRY_SIZE, self._allocate(start, off // ENTRY_SIZE + 1)

    def fill(self, lo: int, hi: int) -> None:
        """FILLER entries at [lo, hi), files created as needed: the holes of a gap dispatch
        found in the queue (records damage took), so that entries from min to max are records
        or fillers and recovery sees no hole.  OSError (ENOSPC) when the disk refuses."""
        assert self.writable and 0 <= lo <= hi
        q = lo
        while q < hi:
            start, off = self._locate(q)
            mm = self._map(start, create=True)
            n = min(hi - q, (self.file_size - off) // ENTRY_SIZE)
            self._allocate(start, off // ENTRY_SIZE + n)
            mm[off:off + n * ENTRY_SIZE] = ENTRY.pack(*FILLER) * n
            q += n

    def _fill_pre_blank(self, mm: mmap.mmap, start: int, off: int) -> None:
        """A queue's first file created at an entry past its start (a rebuild from a CommitLog
        whose first files retention deleted, or an install): FILLER entries before it, as
        RocketMQ's fillPreBlank, so that recovery sees where the queue starts (an all-zero entry
        would end it there)."""
        self._allocate(start, off // ENTRY_SIZE + 1)
        mm[:off] = ENTRY.pack(*FILLER) * (off // ENTRY_SIZE)

    def _allocate(self, start: int, entries: int) -> int:
        """Blocks of file `start` allocated for its first `entries` entries at least, in steps
        of CQ_ALLOC_ENTRIES (a file is mapped whole but allocated as it fills, so a full disk
        is ENOSPC here, never a SIGBUS in a mapped write); returns the entries allocated."""
        have = self._allocated.get(start, 0)
        if entries <= have:
            return have
        want = min(self.file_size // ENTRY_SIZE, -(-entries // CQ_ALLOC_ENTRIES) * CQ_ALLOC_ENTRIES)
        fd = os.open(offset_file_path(self.dir, start), os.O_RDWR)
        try:
            os.posix_fallocate(fd, have * ENTRY_SIZE, (want - have) * ENTRY_SIZE)
        finally:
            os.close(fd)
        self._allocated[start] = want
        return want

    def _forget(self, start: int) -> None:
        self._ptrs.pop(start, None)
        self._allocated.pop(start, None)
        mm = self._maps.pop(start, None)
        if mm is not None:
            mm.close()

    def sync(self) -> None:
        """Makes every entry below CQ_MAX durable: fdatasync, by path, of each file written since
        the last sync (entries are written before CQ_MAX moves past them).  Touches nothing the
        writer uses, so it may run on a thread of its own beside dispatch (one thread at a time);
        the first sync of a handle covers every file from CQ_MIN."""
        hi = self.max_offset
        lo = self.min_offset if self._synced_max is None else self._synced_max
        if hi > lo:
            first, _ = self._locate(lo)
            last, _ = self._locate(hi - 1)
            for start in range(first, last + 1, self.file_size):
                fsync_path(offset_file_path(self.dir, start))
        self._synced_max = hi               # also when a truncation moved CQ_MAX back

    # ---- read --------------------------------------------------------------------
    def get(self, queue_offset: int, max_count: int) -> list[tuple[int, int, int]]:
        """Up to max_count entries from queue_offset, within [min, max) and one file."""
        return list(ENTRY.iter_unpack(self.get_bytes(queue_offset, max_count)))

    def get_bytes(self, queue_offset: int, max_count: int) -> bytes:
        """get()'s entries as their 20-byte records, unparsed (for CommitLog.gather)."""
        hi = self.max_offset
        if queue_offset < self.min_offset or queue_offset >= hi:
            return b""
        return self.get_raw_bytes(queue_offset, min(max_count, hi - queue_offset))

    def get_raw_bytes(self, queue_offset: int, max_count: int) -> bytes:
        """Up to max_count entries from queue_offset as they are in its file, whatever the
        queue's bounds say (recovery reads them before it sets them), within one file."""
        start, off = self._locate(queue_offset)
        mm = self._map(start, create=False)
        if mm is None:
            return b""
        n = min(max_count, (self.file_size - off) // ENTRY_SIZE)
        return mm[off:off + n * ENTRY_SIZE]

    def entry(self, queue_offset: int) -> tuple[int, int, int] | None:
        got = self.get(queue_offset, 1)
        return got[0] if got else None

    # ---- recovery and retention -----------------------------------------------------
    def recover_bounds(self) -> tuple[int, int]:
        """(min, max) from the files: max is the first empty entry after the
        start of the last file holding data; min is the first file's start."""
        starts = self.file_starts()
        if not starts:
            return 0, 0
        lo = starts[0] // ENTRY_SIZE
        for start in reversed(starts):
            mm = self._map(start, create=False)
            if mm is None:
                continue
            end = _first_empty(mm)
            if end > 0 or start == starts[0]:
                return lo, (start + end) // ENTRY_SIZE
        return lo, lo

    def damage(self, lo: int, hi: int, min_phy: int, record_at) -> str | None:
        """Why this queue's files cannot be trusted, or None when they can (recovery rebuilds a
        queue that has a reason from the CommitLog).  lo, hi: recover_bounds().  Checked:
          * every file has the queue's file size and is named on a file boundary, and none is
            missing between the first and the last;
          * nothing but zeros follows the last entry in the last file (a hole in the middle,
            a zeroed range, makes recover_bounds() stop short);
          * the last CHECK_TAIL_ENTRIES entries are whole (size > 0) and in CommitLog order,
            fillers aside (holes: records damage took, a rebuild's gaps);
          * the last entry names a record of this queue at this queue offset:
            record_at(phy, size) -> (topic, queue_id, queue_offset) or None (no record there);
            not checked when retention already deleted that CommitLog file."""
        starts = self.file_starts()
        for start in starts:
            size = os.path.getsize(offset_file_path(self.dir, start))
            if start % self.file_size or size != self.file_size:
                return f"file {offset_file_name(start)} has {size} bytes (files are {self.file_size}, named on their boundaries)"
        if starts and (starts[-1] - starts[0]) // self.file_size + 1 != len(starts):
            return f"files are missing between {offset_file_name(starts[0])} and {offset_file_name(starts[-1])}"
        if starts:
            last_file = starts[-1]
            mm = self._map(last_file, create=False)
            after = max(0, hi * ENTRY_SIZE - last_file)
            if mm is not None and not _zeros_from(mm, after):
                return f"entries follow a hole at queue offset {hi}"
        if hi <= lo:
            return None
        prev = -1
        for q in range(max(lo, hi - CHECK_TAIL_ENTRIES), hi):
            e = self.get_raw(q)
            if e == FILLER:
                continue
            if e is None or e[1] <= 0 or e[0] < prev:
                return f"entry {q} is {e}: not a whole entry in CommitLog order"
            prev = e[0]
        phy, size, _ = self.get_raw(hi - 1)
        if phy >= min_phy:
            found = record_at(phy, size)
            if found != (self.topic, self.queue_id, hi - 1):
                return f"the last entry ({hi - 1}) points at {phy}, which holds {found}"
        return None

    def remove_files(self) -> None:
        """Deletes every file of the queue (it is rebuilt from the CommitLog)."""
        assert self.writable
        for start in self.file_starts():
            self._forget(start)
            os.unlink(offset_file_path(self.dir, start))
        self._synced_max = None

    def truncate_from(self, queue_offset: int) -> None:
        """Zeroes entries from queue_offset on (recovery: they point past the CommitLog end)."""
        assert self.writable
        for start in self.file_starts():
            if start + self.file_size <= queue_offset * ENTRY_SIZE:
                continue
            mm = self._map(start, create=False)
            if mm is None:
                continue
            first = max(0, queue_offset * ENTRY_SIZE - start)
            if first == 0 and start > 0:
                self._forget(start)
                os.unlink(offset_file_path(self.dir, start))
                continue
            mm[first:] = bytes(self.file_size - first)
            fsync_path(offset_file_path(self.dir, start))

    def last_phy_end(self, max_offset: int) -> int:
        """phy_offset + size of the last entry below max_offset (0 if none, or a FILLER)."""
        if max_offset <= 0:
            return 0
        e = self.get_raw(max_offset - 1)
        return e[0] + e[1] if e and e != FILLER else 0

    def rebase(self, queue_offset: int) -> None:
        """The queue restarts at `queue_offset`, holding nothing yet (a DLedger install: the
        entries below are history the group deleted; dispatch writes the ones from there on at
        their records' queue offsets).  Files wholly below its file are deleted; its file is
        kept or created, with FILLER entries before it (RocketMQ's fillPreBlank: recovery and
        the manifest then see where the queue starts) and zeros from it on; later files are
        zeroed.  Writes go to the files in place, through the page cache, so every process's
        map of a file sees them (a deleted and recreated file would leave readers on the old
        inode).  CQ_MIN = CQ_MAX = NEXT_OFFSET = queue_offset.  OSError (ENOSPC) when the disk
        refuses the filler's blocks, before anything changed."""
        assert self.writable and queue_offset >= 0
        start, at = self._locate(queue_offset)
        self._map(start, create=True)
        self._allocate(start, at // ENTRY_SIZE + 1)
        for s in self.file_starts():
            path = offset_file_path(self.dir, s)
            if s < start:
                self._forget(s)
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass                       # retention got there first
                continue
            mm = self._map(s, create=False)
            if mm is None:
                continue
            first = at if s == start else 0
            if s == start and at:
                mm[:at] = ENTRY.pack(*FILLER) * (at // ENTRY_SIZE)
            _zero_pages(mm, first)
            fsync_path(path)
        self._synced_max = None
        for field_ in (C.Q_CQ_MIN, C.Q_CQ_MAX, C.Q_NEXT_OFFSET):
            self.ctl.queue_set(self.slot, field_, queue_offset)

    def get_raw(self, queue_offset: int) -> tuple[int, int, int] | None:
        start, off = self._locate(queue_offset)
        mm = self._map(start, create=False)
        if mm is None:
            return None
        return ENTRY.unpack_from(mm, off)

    def tail_at_or_past(self, lo: int, hi: int, end: int) -> int:
        """The first queue offset of the run of entries ending the queue (before hi) that all
        point at or past `end`: what a cut log took (hi when none).  The binary search assumes
        CommitLog order, which a damaged entry breaks: one pointing past `end` before one that
        does not is damaged, not cut (the read path finds its record), so only the true tail is
        returned -- read a file at a time from the end."""
        k = self.first_entry_at_or_after(lo, hi, end)
        q = hi
        while q > k:
            start, off = self._locate(q - 1)
            first = max(k, start // ENTRY_SIZE)
            mm = self._map(start, create=False)
            if mm is None:
                return q
            phys = [e[0] for e in ENTRY.iter_unpack(mm[first * ENTRY_SIZE - start:off + ENTRY_SIZE])]
            for phy in reversed(phys):
                if phy < end:
                    return q
                q -= 1
        return q

    def first_entry_at_or_after(self, queue_offset: int, max_offset: int, min_phy: int) -> int:
        """First queue offset >= queue_offset whose entry points at >= min_phy."""
        lo, hi = queue_offset, max_offset
        while lo < hi:
            mid = (lo + hi) // 2
            e = self.get_raw(mid)
            if e is None or e[0] < min_phy:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def delete_files_below(self, min_phy: int) -> int:
        """Deletes files whose every entry points below min_phy (never the last
        file); returns how many went."""
        starts = self.file_starts()
        removed = 0
        for start in starts[:-1]:
            mm = self._map(start, create=False)
            if mm is None:
                continue
            last = ENTRY.unpack_from(mm, self.file_size - ENTRY_SIZE)
            if last[1] == 0 or last[0] + last[1] > min_phy:
                break
            self._forget(start)
            try:
                os.unlink(offset_file_path(self.dir, start))
            except FileNotFoundError:
                continue                       # a DLedger install's rebase got there first
            removed += 1
        return removed

    def close(self) -> None:
        self._ptrs.clear()
        for mm in self._maps.values():
            try:
                mm.close()
            except BufferError:
                pass
        self._maps.clear()


def _zeros_from(mm: mmap.mmap, at: int) -> bool:
    """Is every byte of mm from `at` on zero?  Compared a MiB at a time: a regex scan of a
    6 MB queue file took 30 ms, this takes under 1 ms, and recovery checks every queue."""
    size, chunk = len(mm), len(_ZERO_CHUNK)
    while at < size:
        n = min(chunk, size - at)
        if mm[at:at + n] != (_ZERO_CHUNK if n == chunk else _ZERO_CHUNK[:n]):
            return False
        at += n
    return True


def _zero_pages(mm: mmap.mmap, at: int) -> None:
    """Zeroes mm from `at` on, writing only the pages that hold a non-zero byte (a page that is
    a hole of the sparse file stays one: no block is allocated for zeros)."""
    size, page = len(mm), mmap.PAGESIZE
    while at < size:
        end = min(size, at - at % page + page)
        if mm[at:end] != _ZERO_CHUNK[:end - at]:
            mm[at:end] = _ZERO_CHUNK[:end - at]
        at = end


def _first_empty(mm: mmap.mmap) -> int:
    """Byte offset of the first all-zero entry in a file (or its size).
    A real entry is never all zero (size > 0), and within entries a run of 20
    zero bytes can only start inside an empty entry or in the zero tail just
    before one, so find() then an aligned check is exact."""
    pos = 0
    size = len(mm)
    while True:
        i = mm.find(EMPTY_ENTRY, pos)
        if i < 0:
            return size
        aligned = -(-i // ENTRY_SIZE) * ENTRY_SIZE
        if aligned >= size:
            return size
        if mm[aligned:aligned + ENTRY_SIZE] == EMPTY_ENTRY:
            return aligned
        pos = i + 1


MANIFEST_FILE = "consumequeues.json"      # under the store's config/ directory


def write_manifest(config_dir: str, bounds: dict[tuple[str, int], tuple[int, int]]) -> None:
    """Records every queue with its min and max offset (at the end of recovery, at a clean stop,
    and after retention deleted ConsumeQueue files), so the next start can tell a queue whose files
    were deleted or cut -- at either end -- from one that is empty or that retention shortened:
    {"topic": {"queueId": [min offset, max offset]}}."""
    from mq.files import write_atomic
    table: dict[str, dict[str, list[int]]] = {}
    for (topic, qid), (min_offset, max_offset) in sorted(bounds.items()):
        table.setdefault(topic, {})[str(qid)] = [min_offset, max_offset]
    try:
        write_atomic(os.path.join(config_dir, MANIFEST_FILE), json.dumps(table, indent=1))
    except OSError as e:                  # a hint for the next start, not data: a full disk is no reason to fail
        log.error("ConsumeQueue manifest not written: %s", e)


def read_manifest(config_dir: str) -> dict[tuple[str, int], tuple[int | None, int]] | None:
    """write_manifest's table as {(topic, queueId): (min, max)}, or None when there is none (or it
    does not parse: it is a hint).  A manifest of an earlier version holds the max alone: min None."""
    path = os.path.join(config_dir, MANIFEST_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            table = json.load(f)
        return {(topic, int(qid)): (None, int(b)) if isinstance(b, int) else (int(b[0]), int(b[1]))
                for topic, queues in table.items() for qid, b in queues.items()}
    except FileNotFoundError:
        return None
    except (OSError, ValueError, AttributeError, TypeError, IndexError, KeyError) as e:
        log.warning("ConsumeQueue manifest %s unreadable (%s): ignored", path, e)
        return None


class ConsumeQueueSet:
    """The ConsumeQueues of one store, opened lazily by (topic, queueId) or slot."""

    def __init__(self, cq_root: str, file_size: int, ctl: C.ControlBlock, writable: bool = False):
        self.root = cq_root
        self.file_size = file_size
        self.ctl = ctl
        self.writable = writable
        self._by_key: dict[tuple[str, int], ConsumeQueue] = {}
        self._by_slot: dict[int, ConsumeQueue] = {}

    def get(self, topic: str, queue_id: int) -> ConsumeQueue:
        """The queue's handle.  On a read-only set a queue that does not exist yet
        is not remembered (answering GET_MAX_OFFSET for arbitrary names must not
        grow this table); it is opened again until it exists."""
        cq = self._by_key.get((topic, queue_id))
        if cq is None:
            cq = ConsumeQueue(self.root, topic, queue_id, self.file_size, self.ctl, self.writable)
            if cq.slot is None and not self.writable:
                return cq
            self._by_key[(topic, queue_id)] = cq
            if cq.slot is not None:
                self._by_slot[cq.slot] = cq
        return cq

    def by_slot(self, slot: int) -> ConsumeQueue:
        cq = self._by_slot.get(slot)
        if cq is None:
            topic, qid = self.ctl.queue_info(slot)
            cq = self.get(topic, qid)
            self._by_slot[slot] = cq
        return cq

    def on_disk(self) -> list[tuple[str, int]]:
        """(topic, queueId) of every queue directory present."""
        out = []
        try:
            topics = os.listdir(self.root)
        except FileNotFoundError:
            return out
        for t in sorted(topics):
            tdir = os.path.join(self.root, t)
            if not os.path.isdir(tdir):
                continue
            for q in sorted(os.listdir(tdir)):
                if q.isdigit():
                    out.append((t, int(q)))
        return out

    def opened(self) -> list[ConsumeQueue]:
        return list(self._by_key.values())

    def sync(self) -> None:
        """ConsumeQueue.sync() of every queue opened (safe beside the dispatch thread)."""
        for cq in self.opened():
            cq.sync()

    def close(self) -> None:
        for cq in self._by_key.values():
            cq.close()
        self._by_key.clear()
        self._by_slot.clear()
