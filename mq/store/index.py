"""The message index: RocketMQ's IndexFile (layout in mq.wire.index), so a message
can be found by its keys or its UNIQ_KEY (QUERY_MESSAGE, mqadmin queryMsgByKey).

    <storePathRootDir>/index/<yyyyMMddHHmmssSSS>   one file per maxIndexNum entries

Writer: the dispatch role (IndexWriter), right after the ConsumeQueue entries of a
scan batch and before dispatched_pos moves past it; the per-record work (property
lookup, Java hash, chain insert) is one C call per batch (mq_index_build).  Only the
newest file is written; a full file is followed by a new one that starts where it
ended.

Resuming: entries are never removed, so the writer skips records at or before the
newest file's ENDPHYOFFSET (the last record it indexed).  After a crash the store's
recovery lowers that bound to where re-dispatch starts (IndexWriter.redo_from), so a
record whose entries a torn write may have lost is indexed again; a record then has
its entries twice, and queries drop duplicate offsets.  Files are never deleted at
recovery (RocketMQ deletes the files newer than the checkpoint's index time and
with them the entries of every record before the recovery point).

Space: a file is sparse only where nothing is written yet; the slot table is
allocated when the file is made and the entries in ALLOC_ENTRIES steps ahead of the
writer (fallocate), so a full disk shows up as ENOSPC here, never as a SIGBUS in a
mapped write.  While the disk refuses, records are dispatched without index entries
(logged): a named limit.

Damage: a file whose size or header cannot be right is set aside (renamed <name>.damaged,
logged) when the writer opens it, and skipped by readers; queries then miss the messages it
indexed (a named limit: they are not indexed again), and the writer starts a new file.

Readers (io workers, mqdump) map the files read-only (IndexReader); the C writer
stores an entry before its slot and the slot before INDEXCOUNT, so a reader never
follows a slot into an unwritten entry."""
from __future__ import annotations

import logging
import mmap
import os
import threading
import time

from mq.wire import index as W

from mq.files import fsync_path
from .native import ffi, lib, check

log = logging.getLogger("mq.store.index")

INDEX_DIR = W.INDEX_DIR_NAME
ALLOC_ENTRIES = 65536          # entries allocated ahead of the writer (1.25 MiB)
QUERY_MAX_NUM = 64             # maxMsgsNumBatch: most offsets one query returns
FILE_SIZE_MAX = 2 ** 31 - 1    # Java maps an index file with an int size
DAMAGED_SUFFIX = ".damaged"    # a damaged file set aside (its name no longer lists as an index file)


def file_name(ms: int) -> str:
    """yyyyMMddHHmmssSSS in local time, as RocketMQ names index files."""
    return time.strftime("%Y%m%d%H%M%S", time.localtime(ms / 1000)) + "%03d" % (ms % 1000)


def list_index_files(d: str) -> list[str]:
    """Index file names in creation order (names sort by time)."""
    try:
        return sorted(n for n in os.listdir(d) if W.is_index_file_name(n))
    except FileNotFoundError:
        return []


def header_damage(h: "W.IndexHeaderValues", slot_num: int, index_num: int) -> str | None:
    """Why an index file's header cannot be right, or None."""
    if not 1 <= h.index_count <= index_num:
        return f"INDEXCOUNT {h.index_count} outside [1, {index_num}]"
    if not 0 <= h.hash_slot_count <= slot_num:
        return f"HASHSLOTCOUNT {h.hash_slot_count} outside [0, {slot_num}]"
    if h.begin_phy_offset < 0 or h.end_phy_offset < h.begin_phy_offset:
        return f"phy offsets {h.begin_phy_offset}..{h.end_phy_offset} out of order"
    if h.begin_timestamp_ms < 0 or h.end_timestamp_ms < h.begin_timestamp_ms:
        return f"timestamps {h.begin_timestamp_ms}..{h.end_timestamp_ms} out of order"
    return None


def check_sizes(slot_num: int, index_num: int) -> int:
    size = W.index_file_size(slot_num, index_num)
    if slot_num < 1 or index_num <= lib.MQ_INDEX_KEYS_MAX or size > FILE_SIZE_MAX:
        raise ValueError(f"maxHashSlotNum={slot_num}, maxIndexNum={index_num}: an index file needs "
                         f"maxIndexNum > {lib.MQ_INDEX_KEYS_MAX} and at most {FILE_SIZE_MAX} bytes")
    return size


class _Mapped:
    """One index file mapped (read-write for the writer, read-only for readers)."""

    def __init__(self, path: str, slot_num: int, index_num: int, writable: bool):
        self.path = path
        self.name = os.path.basename(path)
        size = W.index_file_size(slot_num, index_num)
        fd = os.open(path, os.O_RDWR if writable else os.O_RDONLY)
        try:
            if os.fstat(fd).st_size != size:
                raise ValueError(f"{path}: {os.fstat(fd).st_size} bytes, expected {size} "
                                 f"(maxHashSlotNum={slot_num}, maxIndexNum={index_num})")
            self.mm = mmap.mmap(fd, size, prot=mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0))
            self.fd = os.dup(fd) if writable else -1
        finally:
            os.close(fd)
        self.map = ffi.new("mq_index_map *")
        self._buf = ffi.from_buffer(self.mm) if writable else ffi.from_buffer("char[]", self.mm)
        self.map.base = ffi.cast("uint8_t *", self._buf)
        self.map.slot_num = slot_num
        self.map.index_num = index_num
        self.map.room_num = 0

    def header(self) -> W.IndexHeaderValues:
        return W.parse_index_header(self.mm)

    def close(self) -> None:
        self._buf = None
        self.map.base = ffi.NULL
        try:
            self.mm.close()
        except BufferError:
            pass
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class IndexWriter:
    """The dispatch role's side: appends entries to the newest file."""

    def __init__(self, store_root: str, slot_num: int, index_num: int, checkpoint=None):
        self.dir = os.path.join(store_root, INDEX_DIR)
        self.slot_num, self.index_num = slot_num, index_num
        self.file_size = check_sizes(slot_num, index_num)
        self.checkpoint = checkpoint
        self.cur: _Mapped | None = None
        self._unsynced: list[str] = []           # full files closed since the last flush()
        self._unsynced_lock = threading.Lock()   # _new_file() on the dispatch thread vs. flush()
        self.indexed_ts_ms = 0                   # every record stored up to this time is indexed
        self.opened = False
        self.from_phy = 0                        # records below this are indexed already
        self._redo = 2 ** 63                     # redo_from() before the files were opened
        self.paused_until = 0.0                  # monotonic s: the disk refused space
        self._done = ffi.new("uint32_t *")
        os.makedirs(self.dir, exist_ok=True)

    def _open(self) -> None:
        """Maps the newest file.  Lazy, and again after close(): another process (the
        dispatch role) may have written and started files meanwhile."""
        names = list_index_files(self.dir)
        self.from_phy = 0
        while names and self.cur is None:
            path = os.path.join(self.dir, names.pop())
            try:
                cur = _Mapped(path, self.slot_num, self.index_num, writable=True)
            except ValueError as e:
                cur, why = None, str(e)
            else:
                why = header_damage(cur.header(), self.slot_num, self.index_num)
            if why is None:
                self.cur = cur
                break
            if cur is not None:
                cur.close()
            os.rename(path, path + DAMAGED_SUFFIX)
            log.warning("repaired: index file %s is damaged (%s): set aside as %s%s; queries by key miss the "
                        "messages it indexed (the messages themselves are intact)", os.path.basename(path), why,
                        os.path.basename(path), DAMAGED_SUFFIX)
        if self.cur is not None:
            self._finish_torn_put()
            h = self.cur.header()
            self.cur.map.room_num = min(self.index_num, max(h.index_count, 1))
            self.from_phy = h.end_phy_offset + 1 if (h.index_count > 1 or h.end_phy_offset > 0) else 0
        self.from_phy = min(self.from_phy, self._redo)
        self._redo = 2 ** 63
        self.opened = True

    def _finish_torn_put(self) -> None:
        """A writer killed inside a put leaves its entry (whole or in part) just past INDEXCOUNT,
        and perhaps a slot already pointing at it; the next put would write over that entry and
        could leave the slot's chain pointing into the new one.  Counting it instead keeps every
        chain whole: an entry cut short is never reached (its slot is stored after it), and a
        whole one is a valid duplicate of what re-dispatch indexes again."""
        h = self.cur.header()
        if not 1 <= h.index_count < self.index_num:
            return
        at = W.INDEX_HEADER_SIZE + W.INDEX_SLOT_SIZE * self.slot_num + W.INDEX_ENTRY_SIZE * h.index_count
        if any(self.cur.mm[at:at + W.INDEX_ENTRY_SIZE]):
            self.cur.mm[W.INDEX_COUNT_OFFSET:W.INDEX_COUNT_OFFSET + 4] = (h.index_count + 1).to_bytes(4, "big")
            log.warning("index file %s: a put cut short by a crash was counted (entry %d)",
                        self.cur.name, h.index_count)

    def redo_from(self, phy: int) -> None:
        """Records from `phy` on are indexed again (after a crash: see the module docstring)."""
        if self.opened:
            self.from_phy = min(self.from_phy, phy)
        else:
            self._redo = min(self._redo, phy)

    def _new_file(self) -> None:
        prev = self.cur.header() if self.cur is not None else None
        names = list_index_files(self.dir)
        name = file_name(int(time.time() * 1000))
        if names and name <= names[-1]:           # same ms, or a clock step back: must not reorder files
            name = "%017d" % (int(names[-1]) + 1)
        path = os.path.join(self.dir, name)
        fd = os.open(path + ".tmp", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.ftruncate(fd, self.file_size)
            os.posix_fallocate(fd, 0, W.INDEX_HEADER_SIZE + W.INDEX_SLOT_SIZE * self.slot_num)
        except OSError:
            os.close(fd)
            os.unlink(path + ".tmp")
            raise
        os.close(fd)
        os.rename(path + ".tmp", path)
        m = _Mapped(path, self.slot_num, self.index_num, writable=True)
        lib.mq_index_init(m.map, prev.end_phy_offset if prev else 0, prev.end_timestamp_ms if prev else 0)
        m.map.room_num = 1
        if self.cur is not None:
            # unmapped at once: its dirty pages stay in the page cache for flush() to sync by path
            with self._unsynced_lock:
                self._unsynced.append(self.cur.path)
            self.cur.close()
        self.cur = m
        log.info("index file %s started (%d slots, %d entries)", name, self.slot_num, self.index_num)

    def _make_room(self) -> None:
        """More entries allocated in the current file, or a new file when it is full."""
        if self.cur is None or self.cur.map.room_num >= self.index_num:
            self._new_file()
            return
        m = self.cur.map
        room = min(self.index_num, m.room_num + ALLOC_ENTRIES)
        entries_at = W.INDEX_HEADER_SIZE + W.INDEX_SLOT_SIZE * self.slot_num
        at = entries_at + W.INDEX_ENTRY_SIZE * m.room_num
        os.posix_fallocate(self.cur.fd, at, entries_at + W.INDEX_ENTRY_SIZE * room - at)
        m.room_num = room

    def build(self, cl, recs, n: int) -> None:
        """Indexes the scanned records recs[0:n] (those at or past from_phy)."""
        if n == 0 or time.monotonic() < self.paused_until:
            return
        paused = False
        if not self.opened:
            self._open()
        at = 0
        while at < n:
            if self.cur is None:
                rc = lib.MQ_E_FULL
                self._done[0] = 0
            else:
                rc = lib.mq_index_build(cl.handle, self.cur.map, recs + at, n - at, self.from_phy, self._done)
            at += self._done[0]
            if rc == lib.MQ_E_FULL:
                try:
                    self._make_room()
                except OSError as e:
                    self.paused_until = time.monotonic() + 5.0
                    log.error("message index paused for 5 s: no room for entries (%s); records stored "
                              "meanwhile get no index entries", e)
                    paused = True
                    break
            else:
                check(rc, "index build")
        self.from_phy = max(self.from_phy, recs[n - 1].phy_offset + 1)
        if not paused:
            self.indexed_ts_ms = recs[n - 1].store_ts_ms

    def flush(self) -> None:
        """fdatasync of the files written since the last flush, by path (mq.store.durable), then the
        checkpoint's index time.  Safe on a thread beside build() (the dispatch role's flusher)."""
        ts = self.indexed_ts_ms
        with self._unsynced_lock:
            paths, self._unsynced = self._unsynced, []
        cur = self.cur
        if cur is not None:
            paths.append(cur.path)
        for path in paths:
            fsync_path(path)
        if self.checkpoint is not None and ts > 0:
            self.checkpoint.index_ts_ms = ts

    def close(self) -> None:
        """Flushes and unmaps; the next build() maps the newest file again."""
        self.flush()
        if self.cur is not None:
            self.cur.close()
            self.cur = None
        self.opened = False


class IndexReader:
    """Queries over every index file (io workers, tools).  Files are mapped on first use
    and dropped when retention deletes them."""

    def __init__(self, store_root: str, slot_num: int, index_num: int):
        self.dir = os.path.join(store_root, INDEX_DIR)
        self.slot_num, self.index_num = slot_num, index_num
        self._files: dict[str, _Mapped] = {}
        self._reported: set[str] = set()         # damaged files already logged
        self._out = ffi.new("int64_t[]", QUERY_MAX_NUM * 4)
        self._n = ffi.new("uint32_t *")

    def files(self) -> list[_Mapped]:
        names = list_index_files(self.dir)
        for gone in set(self._files) - set(names):
            self._files.pop(gone).close()
        out = []
        for name in names:
            f = self._files.get(name)
            if f is None:
                try:
                    f = _Mapped(os.path.join(self.dir, name), self.slot_num, self.index_num, writable=False)
                except (FileNotFoundError, ValueError) as e:
                    log.warning("index file %s skipped: %s", name, e)
                    continue
                self._files[name] = f
            out.append(f)
        return out

    def last_update(self) -> tuple[int, int]:
        """(indexLastUpdateTimestamp, indexLastUpdatePhyoffset): the newest file's end."""
        files = self.files()
        if not files:
            return 0, 0
        h = files[-1].header()
        return h.end_timestamp_ms, h.end_phy_offset

    def query(self, topic: str, key: str, max_num: int, begin_ms: int, end_ms: int) -> list[int]:
        """Physical offsets of records indexed under topic#key stored in [begin_ms, end_ms],
        newest first, without duplicates, at most max_num (and QUERY_MAX_NUM * 4 candidates:
        the caller verifies each and keeps up to its own limit).  An entry's time is its
        store time rounded down to the second, so the lower bound is widened by one second
        here and the caller checks the record's own time."""
        full = f"{topic}#{key}".encode()
        cap = min(max(1, max_num), QUERY_MAX_NUM * 4)
        self._n[0] = 0
        lo = begin_ms - 1000
        for f in reversed(self.files()):
            h = f.header()
            if h.index_count <= 1:
                continue
            # RocketMQ's IndexFile.isTimeMatched
            if not ((lo < h.begin_timestamp_ms and end_ms > h.end_timestamp_ms)
                    or h.begin_timestamp_ms <= lo <= h.end_timestamp_ms
                    or h.begin_timestamp_ms <= end_ms <= h.end_timestamp_ms):
                if h.end_timestamp_ms < lo:
                    break
                continue
            rc = lib.mq_index_query(f.map, full, len(full), lo, end_ms, self._out, cap, self._n)
            if rc == lib.MQ_E_CORRUPT:            # a damaged file: the others still answer
                if f.name not in self._reported:
                    self._reported.add(f.name)
                    log.warning("index file %s is damaged: skipped by queries", f.name)
                continue
            check(rc, "index query")
            if self._n[0] >= cap or h.begin_timestamp_ms < lo:
                break
        seen, out = set(), []
        for i in range(self._n[0]):
            phy = self._out[i]
            if phy not in seen:
                seen.add(phy)
                out.append(phy)
        return out

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()


def delete_files_below(store_root: str, min_phy: int, slot_num: int, index_num: int) -> list[str]:
    """Retention: index files (never the newest) whose last entry is below min_phy."""
    d = os.path.join(store_root, INDEX_DIR)
    names = list_index_files(d)
    deleted = []
    for name in names[:-1]:
        path = os.path.join(d, name)
        try:
            with open(path, "rb") as fh:
                h = W.parse_index_header(fh.read(W.INDEX_HEADER_SIZE))
        except (OSError, ValueError) as e:
            log.warning("index file %s unreadable (%s): left alone", name, e)
            break
        if h.end_phy_offset >= min_phy:
            break
        try:
            os.unlink(path)
            deleted.append(name)
        except FileNotFoundError:
            pass
    return deleted
