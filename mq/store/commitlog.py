"""CommitLog: the append-only log of every message, in RocketMQ's v1 layout.

Files of `file_size` bytes named by their 20-digit start offset under one
directory; the byte layout and the append/scan/flush work live in C
(csrc/commitlog.c).  This module is the per-process handle: it turns Python
values into one C call per batch, hands out zero-copy views of the mapped
files, and runs the background preparer that creates and pre-touches the current
file and, from half-way through it, the next, before an append needs them (a cold
first-touch fault costs ~5x).

Invariant kept by C and relied on here: every byte in [min_pos, write_pos) is
a complete valid record or an end-of-file filler; views are only given out
inside that range (view_raw for recovery and tools is the exception)."""
from __future__ import annotations

import functools
import ipaddress
import logging
import os
import socket
import struct
import threading
from dataclasses import dataclass

from mq.wire.consumequeue import CQ_ENTRY_SIZE
from mq.wire.filenames import list_offset_files

from . import control as C
from .native import ffi, lib, check, CorruptRecord, OutOfRange, StoreError, StoreFatal

log = logging.getLogger("mq.store.commitlog")
_DL_HEAD = struct.Struct(">iiqq")            # magic, size, index, term (mq.wire.dledger declares the entry)

BATCH_MSGS_MAX = lib.MQ_BATCH_MSGS_MAX
GROUP_MSGS_MAX = 1024       # single sends in one group append (one io-worker loop iteration's)
INT32_MIN, INT32_MAX = -2 ** 31, 2 ** 31 - 1
INT64_MIN, INT64_MAX = -2 ** 63, 2 ** 63 - 1
DL_HEADER_SIZE = lib.MQ_DL_HEADER_SIZE
DL_INDEX_FILE_SIZE = 32 * 5 * 1024 * 1024           # DLedger's mappedFileSizeForEntryIndex
PREPARE_CHECK_S = 0.05
# the next file is prepared once the write position is this far into the current one.  A page
# pre-touched is a dirty page of zeros, which the kernel writes to the disk unless an append
# overwrites it first: preparing the next file at once wrote a whole file of zeros at every
# start (1 GiB by default; 16 MiB for each broker a test starts) for appends that may never come.
# Half a file of appends is left to prepare it in (1 GiB: ~0.3 s of touching; checks every 50 ms).
PREPARE_NEXT_AT = 0.5
SCAN_STOP_NAMES = {
    lib.MQ_SCAN_LIMIT: "limit", lib.MQ_SCAN_FULL: "full", lib.MQ_SCAN_END: "end",
    lib.MQ_SCAN_BAD_MAGIC: "bad magic", lib.MQ_SCAN_BAD_SIZE: "bad size",
    lib.MQ_SCAN_BAD_CRC: "bad crc", lib.MQ_SCAN_TORN: "torn", lib.MQ_SCAN_BAD_OFFSET: "bad offset",
    lib.MQ_SCAN_BAD_INDEX: "bad index", lib.MQ_SCAN_BAD_FIELD: "bad field", lib.MQ_SCAN_BAD_TERM: "bad term",
}
SCAN_CLEAN_STOPS = (lib.MQ_SCAN_LIMIT, lib.MQ_SCAN_FULL, lib.MQ_SCAN_END)


list_files = list_offset_files          # the CommitLog's files (mq.wire.filenames)


@functools.lru_cache(maxsize=4096)
def host_bytes(host: str) -> bytes:
    """Packed IPv4 (4 bytes) or IPv6 (16) address; cached: it is on every append."""
    try:
        return socket.inet_pton(socket.AF_INET, host)
    except OSError:
        return ipaddress.ip_address(host).packed


@dataclass(frozen=True)
class Message:
    """One message to append (the broker fills the born fields from the request)."""
    body: bytes
    properties: bytes = b""          # encoded name\x01value\x02...
    flag: int = 0


class AppendResult:
    """What one append call produced: per message its physical offset, size,
    queue offset, store timestamp and offset msgId.  Holds the C output array
    and decodes lazily, so a batch costs no per-message Python work unless a
    caller asks for per-message values."""

    __slots__ = ("_out", "count")

    def __init__(self, out, count: int):
        self._out = out
        self.count = count

    def phy_offset(self, i: int = 0) -> int:
        return self._out[i].phy_offset

    def queue_offset(self, i: int = 0) -> int:
        return self._out[i].queue_offset

    def size(self, i: int = 0) -> int:
        return self._out[i].size

    def store_ts_ms(self, i: int = 0) -> int:
        return self._out[i].store_ts_ms

    def msg_id(self, i: int = 0) -> str:
        return ffi.string(self._out[i].msg_id).decode()

    def msg_ids(self) -> list[str]:
        return [ffi.string(self._out[i].msg_id).decode() for i in range(self.count)]

    def dl_index(self, i: int = 0) -> int:
        """DLedger mode: the entry's index (0 otherwise)."""
        return self._out[i].dl_index

    def dl_term(self, i: int = 0) -> int:
        """DLedger mode: the entry's term (0 otherwise)."""
        return self._out[i].dl_term

    @property
    def end_offset(self) -> int:
        last = self._out[self.count - 1]
        return last.phy_offset + last.size

    def __len__(self) -> int:
        return self.count


class CommitLog:
    """A process's handle on a store's CommitLog (mapped files + control block)."""

    def __init__(self, directory: str, ctl: C.ControlBlock, file_size: int,
                 store_host: str = "127.0.0.1", store_port: int = 10911,
                 max_message_size: int = 4 * 1024 * 1024, *, dledger: bool = False,
                 index_dir: str | None = None, index_file_size: int = DL_INDEX_FILE_SIZE,
                 touch_page_folios: bool = False):
        """dledger: the files are DLedger data files (entries around records) with index files
        in index_dir (see csrc/dledger.h).  touch_page_folios: pre-touch new files with readahead
        off, one page a folio, so that an msync writes only the pages it covers (SYNC_FLUSH;
        csrc/commitlog.h, mq_commitlog_prepare_file)."""
        os.makedirs(directory, exist_ok=True)
        self.dledger = dledger
        self.directory = directory
        self.ctl = ctl
        self.file_size = file_size
        self._released_below = 0         # release_below_min: files below this were unmapped
        self.max_message_size = max_message_size
        self.store_host = store_host
        self.store_port = store_port
        opts = ffi.new("mq_commitlog_opts *")
        opts.file_size = file_size
        packed = host_bytes(store_host)
        if len(packed) != 4:
            raise ValueError("the store host (brokerIP1) must be an IPv4 address")
        ffi.memmove(opts.store_host, packed, 4)
        opts.store_port = store_port
        opts.touch_page_folios = int(touch_page_folios)
        keep = None
        if dledger:
            assert index_dir, "DLedger mode needs index_dir"
            os.makedirs(index_dir, exist_ok=True)
            keep = ffi.new("char[]", index_dir.encode())
            opts.dledger = 1
            opts.index_dir = keep
            opts.index_file_size = index_file_size
        hp = ffi.new("mq_commitlog **")
        check(lib.mq_commitlog_open(directory.encode(), ctl.ptr, ctl.size, opts, hp), "mq_commitlog_open")
        self._h = hp[0]
        self._local = threading.local()
        self._preparer: threading.Thread | None = None
        self._stop = threading.Event()
        self._prepared: set[int] = set()
        self._units_reported = 0            # DLedger index units rewritten and already logged

    # ---- append ------------------------------------------------------------
    def _out(self):
        out = getattr(self._local, "out", None)
        if out is None:
            out = self._local.out = ffi.new("mq_append_out[]", BATCH_MSGS_MAX)
        return out

    def _req(self, topic: bytes, queue_id: int, sys_flag: int, born_ts_ms: int,
             born_host: str, born_port: int, reconsume_times: int,
             prepared_tx_offset: int, extra_props: bytes, keep: list):
        req = ffi.new("mq_append_req *")
        t = ffi.from_buffer(topic)
        keep.append(t)
        req.topic = t
        req.topic_len = len(topic)
        req.queue_id = queue_id
        req.sys_flag = sys_flag
        req.reconsume_times = reconsume_times
        req.born_ts_ms = born_ts_ms
        req.prepared_tx_offset = prepared_tx_offset
        hb = host_bytes(born_host)
        ffi.memmove(req.born_host, hb, len(hb))
        req.born_host_len = len(hb)
        req.born_port = born_port
        if extra_props:
            e = ffi.from_buffer(extra_props)
            keep.append(e)
            req.extra_props = e
            req.extra_props_len = len(extra_props)
        req.max_message_size = self.max_message_size
        return req

    def append(self, topic: str, queue_id: int, body: bytes, properties: bytes = b"", *,
               flag: int = 0, sys_flag: int = 0, born_ts_ms: int = 0,
               born_host: str = "127.0.0.1", born_port: int = 0, reconsume_times: int = 0,
               prepared_tx_offset: int = 0) -> AppendResult:
        """Appends one message.  Raises MessageIllegal, TopicIllegal,
        PropertiesTooLong, MessageTooBig (nothing written), StoreFatal, NoSpace."""
        keep: list = []
        req = self._req(topic.encode(), queue_id, sys_flag, born_ts_ms, born_host, born_port,
                        reconsume_times, prepared_tx_offset, b"", keep)
        out = ffi.new("mq_append_out[1]")
        self._check_append(lib.mq_commitlog_append_one(self._h, req, flag, body, len(body), properties,
                                                       len(properties), out), topic, queue_id)
        return AppendResult(out, 1)

    def _check_append(self, rc: int, topic: str, queue_id: int) -> None:
        if rc == lib.MQ_E_FATAL:
            raise StoreFatal(f"the store refuses writes after an earlier failure: {self.ctl.fatal()}")
        if rc == lib.MQ_E_NOSPACE or rc == lib.MQ_E_IO:
            check(rc, f"append to {topic}:{queue_id}: {os.strerror(self.errno())}")
        why = {
            lib.MQ_E_MSG_ILLEGAL: f"body empty or over maxMessageSize ({self.max_message_size} bytes), "
                                  "or a malformed batch",
            lib.MQ_E_TOPIC_ILLEGAL: "topic empty, over 127 bytes or outside [%|a-zA-Z0-9_-]",
            lib.MQ_E_PROPS_TOO_LONG: "properties over 32767 bytes",
            lib.MQ_E_TOO_BIG: f"record larger than a CommitLog file ({self.file_size} bytes)",
        }.get(rc, "")
        check(rc, f"append to {topic}:{queue_id} refused: {why}" if why else f"append to {topic}:{queue_id}")

    def append_error(self, rc: int, topic: str, queue_id: int) -> StoreError | None:
        """The StoreError an append's rc stands for (what append would have raised), None for MQ_OK."""
        try:
            self._check_append(rc, topic, queue_id)
        except StoreError as e:
            return e
        return None

    def append_batch(self, topic: str, queue_id: int, batch_body: bytes, *, sys_flag: int = 0,
                     born_ts_ms: int = 0, born_host: str = "127.0.0.1", born_port: int = 0,
                     extra_props: bytes = b"") -> AppendResult:
        """Appends a SEND_BATCH_MESSAGE body (mq.wire.batch) to one queue in one
        C call: consecutive queue offsets, all published together or none."""
        keep: list = []
        req = self._req(topic.encode(), queue_id, sys_flag, born_ts_ms, born_host, born_port,
                        0, 0, extra_props, keep)
        out = self._out()
        n = ffi.new("uint32_t *")
        self._check_append(lib.mq_commitlog_append_batch(self._h, req, batch_body, len(batch_body), out,
                                                         BATCH_MSGS_MAX, n), topic, queue_id)
        # the thread-local array is reused by the next call: hand out a copy
        res = ffi.new("mq_append_out[]", n[0])
        ffi.memmove(res, out, ffi.sizeof("mq_append_out") * n[0])
        return AppendResult(res, n[0])

    def group(self) -> "GroupAppend":
        """A reusable builder of one-C-call group appends on this handle (see GroupAppend)."""
        return GroupAppend(self)

    # ---- read ----------------------------------------------------------------
    def view(self, offset: int, size: int) -> memoryview:
        """Zero-copy view of [offset, offset+size) inside the written range and one file
        (OutOfRange otherwise, also for a negative or oversized number a request carried)."""
        if not (0 <= offset <= INT64_MAX and 0 <= size <= INT32_MAX):
            raise OutOfRange(f"no bytes at {offset}+{size}")
        p = ffi.new("const uint8_t **")
        rc = lib.mq_commitlog_view(self._h, offset, size, p)
        if rc < 0:                          # (the error text only on an error: read_record)
            check(rc, f"view {offset}+{size}")
        return memoryview(ffi.buffer(p[0], size))

    def view_raw(self, offset: int, size: int) -> memoryview:
        """Like view, but for any mapped bytes of an existing file (recovery, HA)."""
        if not (0 <= offset <= INT64_MAX and 0 <= size <= INT32_MAX):
            raise OutOfRange(f"no bytes at {offset}+{size}")
        p = ffi.new("const uint8_t **")
        rc = lib.mq_commitlog_view_raw(self._h, offset, size, p)
        if rc < 0:
            check(rc, f"view_raw {offset}+{size}")
        return memoryview(ffi.buffer(p[0], size))

    def read_record(self, offset: int, size: int | None = None, queue_id: int = -1,
                    queue_offset: int = -1, topic: bytes | None = None) -> memoryview:
        """The whole record at `offset` (a view), checked whole by C (mq_commitlog_read_record:
        lengths, BODYCRC, PHYSICALOFFSET, and what its ConsumeQueue entry says when given: its
        size, queue id, queue offset and topic (UTF-8)), or OutOfRange when no record starts there /
        CorruptRecord when the one there is damaged: the read path never serves a damaged
        record."""
        if size is None:
            head = self.view(offset, 8)
            size = int.from_bytes(head[:4], "big")
            if int.from_bytes(head[4:8], "big") != lib.MQ_MESSAGE_MAGIC or size < 91:
                raise OutOfRange(f"no record starts at {offset}")
        elif not (0 <= offset <= INT64_MAX and 0 <= size <= INT32_MAX):
            raise OutOfRange(f"no bytes at {offset}+{size}")
        p = ffi.new("const uint8_t **")
        # (every record the read path serves comes through here: the error text is made only on
        # an error, and the common call without a topic passes constants)
        if topic is None:
            rc = lib.mq_commitlog_read_record(self._h, offset, size, queue_id, queue_offset, ffi.NULL, 0, p)
        else:
            rc = lib.mq_commitlog_read_record(self._h, offset, size, queue_id, queue_offset, topic, len(topic), p)
        if rc < 0:
            check(rc, f"record at {offset} ({size} bytes)")
        return memoryview(ffi.buffer(p[0], size))

    def gather(self, entries: bytes, min_phy: int, codes, queue_id: int, first_queue_offset: int, topic: bytes,
               have: int, count_max: int, bytes_max: int, out: bytearray) -> tuple[int, int, int, int, int]:
        """A pull's records from ConsumeQueue `entries` (ConsumeQueue.get_bytes), copied into `out`
        in one C call (mq_commitlog_gather: the entries skipped, filtered by the sorted int64
        array `codes` (None: every tag), checked and stopped as the read path does; `have`:
        records an earlier call copied for the same pull).  Returns
        (entries examined, records, bytes in out, last phy examined or -1, stop rc: 0, or the
        error of the entry after the examined ones, which the caller handles)."""
        res = ffi.new("mq_gather_out *")
        check(lib.mq_commitlog_gather(self._h, ffi.from_buffer("uint8_t[]", entries), len(entries) // CQ_ENTRY_SIZE, min_phy,
                                      ffi.NULL if codes is None else codes, 0 if codes is None else len(codes),
                                      queue_id, first_queue_offset, topic, len(topic), have, count_max, bytes_max,
                                      ffi.from_buffer("uint8_t[]", out), len(out), res), "gather")
        return res.scanned, res.n, res.size, res.last_phy, res.stop_rc

    def misnamed(self, entries: bytes, from_phy: int, queue_id: int, first_queue_offset: int, topic: bytes) -> int:
        """Recovery: the index of the first ConsumeQueue entry of `entries` (queue offsets
        first_queue_offset on) at or past from_phy that names a whole record which says another
        queue or offset (mq_commitlog_misnamed: one of the two is damaged), len(entries) // 20 when none."""
        at = ffi.new("uint32_t *")
        check(lib.mq_commitlog_misnamed(self._h, ffi.from_buffer("uint8_t[]", entries), len(entries) // CQ_ENTRY_SIZE,
                                        from_phy, queue_id, first_queue_offset, topic, len(topic), at), "misnamed")
        return at[0]

    def scanner(self, capacity: int = 4096) -> "Scanner":
        return Scanner(self, capacity)

    @property
    def handle(self):
        """The C handle (mq_commitlog *), for C calls made by other store modules."""
        return self._h

    # ---- positions -------------------------------------------------------------
    @property
    def write_pos(self) -> int:
        return self.ctl.get(C.POS_WRITE)

    @property
    def flushed_pos(self) -> int:
        return self.ctl.get(C.POS_FLUSHED)

    @property
    def min_pos(self) -> int:
        return self.ctl.get(C.POS_MIN)

    def flush(self, least_pages: int = 0) -> int:
        """msync [flushed, write) if at least `least_pages` are dirty; returns the
        flushed position.  A failure sticks (StoreFatal from then on)."""
        out = ffi.new("uint64_t *")
        rc = lib.mq_commitlog_flush(self._h, least_pages, out)
        if rc == lib.MQ_E_IO:
            log.error("flush failed, the store now refuses writes: %s", self.ctl.fatal())
        check(rc, "flush: " + (self.ctl.fatal() or ""))
        return out[0]

    def flush_for(self, wait_ms: int, recs, cap: int, n) -> None:
        """SYNC_FLUSH's loop for up to wait_ms with the GIL released (mq_commitlog_flush_for): the
        flushes that moved FLUSHED are appended to `recs` (an ffi "mq_flush_rec[cap]"), their count
        in n[0] (an ffi "uint32_t *" the caller zeroes once it took them).  StoreFatal when the
        store is (or an msync made it) fatal."""
        rc = lib.mq_commitlog_flush_for(self._h, wait_ms, recs, cap, n)
        if rc == lib.MQ_E_IO:
            log.error("flush failed, the store now refuses writes: %s", self.ctl.fatal())
        check(rc, "flush: " + (self.ctl.fatal() or ""))

    def resync(self, offset: int, limit: int) -> int:
        """The first position in [offset, limit) where a whole record starts, or limit
        (mq_commitlog_resync: past damaged bytes to the records after them; DLedger: entries)."""
        at = ffi.new("uint64_t *")
        check(lib.mq_commitlog_resync(self._h, offset, limit, at), f"resync at {offset}")
        return at[0]

    def zero_tail(self, offset: int) -> None:
        check(lib.mq_commitlog_zero_tail(self._h, offset), f"zero tail at {offset}")

    def release(self, below: int = 0, from_index: int = 2 ** 64 - 1) -> None:
        """Unmaps files below `below` and from file index `from_index` on.
        The caller guarantees no view into them is still in use."""
        lib.mq_commitlog_release(self._h, below, from_index)

    def release_below_min(self) -> None:
        """Unmaps this handle's files below MIN once MIN passed a file boundary (retention deleted
        them, or an install moved past them): a process's mapping keeps a deleted file's blocks on
        disk.  The caller's process holds no view into them and no other thread of it reads them
        (the flush and dispatch loops and the Raft role call it between their C calls)."""
        low = self._min_moved()
        if low is not None:
            self.release(below=low)
            self._released_below = low

    def _min_moved(self) -> int | None:
        """MIN, when it passed a file boundary since the last release or retire; else None."""
        low = self.ctl.get(C.POS_MIN)
        return low if low // self.file_size > self._released_below // self.file_size else None

    def retire_below_min(self) -> None:
        """release_below_min for a process that may still hold record views into those files (an
        io worker across an await, an HA role's connection threads): the files go, the views read
        zeros and the handle never maps them again (mq_commitlog_retire).  No other thread of the
        caller's process is inside a DLedger send on them (the HA transport owns its fds)."""
        low = self._min_moved()
        if low is not None:
            check(lib.mq_commitlog_retire(self._h, low), f"retiring the files below {low}")
            self._released_below = low

    def errno(self) -> int:
        return lib.mq_commitlog_errno(self._h)

    # ---- HA transport (see csrc/ha.h) ----------------------------------------------
    def ha_send_frame(self, sock_fd: int, offset: int, max_body: int) -> int:
        """Master: one frame from `offset` (header + sendfile body); returns the body size."""
        out = ffi.new("uint32_t *")
        rc = lib.mq_ha_send_frame(self._h, sock_fd, offset, max_body, out)
        check(rc, f"HA send from {offset}: {os.strerror(self.errno()) if rc == lib.MQ_E_IO else ''}")
        return out[0]

    def ha_recv_body(self, sock_fd: int, offset: int, size: int) -> None:
        """Slave: `size` bytes from the socket straight into the mapped file at `offset`."""
        rc = lib.mq_ha_recv_body(self._h, sock_fd, offset, size)
        check(rc, f"HA receive at {offset}+{size}: {os.strerror(self.errno()) if rc == lib.MQ_E_IO else ''}")

    def ha_send_run(self, sock_fd: int, start: int, end: int, frame_max: int, in_flight_end, sent_end) -> int:
        """Master: [start, end) as frames of <= frame_max bytes in one C call (GIL released).
        `in_flight_end` and `sent_end` are ffi "uint64_t *" cells other threads read: C raises
        the first to each frame's end before sending it and sets the second after.  Returns the
        end sent (== end); raises StoreError on a socket error."""
        rc = lib.mq_ha_send_run(self._h, sock_fd, start, end, frame_max, in_flight_end, sent_end)
        check(rc, f"HA send of [{start}, {end}) stopped at {sent_end[0]}: "
                  f"{os.strerror(self.errno()) if rc == lib.MQ_E_IO else ''}")
        return sent_end[0]

    def ha_stream_for(self, sock_fd: int, stream, wait_ms: int, in_flight_end, sent_end) -> None:
        """Master: mq_ha_stream_for for up to wait_ms (GIL released): sends what lies between
        `stream.next` (an ffi "mq_ha_stream *") and WRITE, heartbeats, sleeps on SEQ_WRITE.  The
        cells as in ha_send_run.  Raises StoreError on a socket error."""
        rc = lib.mq_ha_stream_for(self._h, sock_fd, stream, wait_ms, in_flight_end, sent_end)
        if rc:
            check(rc, f"HA send at {stream.next}: {os.strerror(self.errno()) if rc == lib.MQ_E_IO else ''}")

    def ha_read_acks(self, sock_fd: int, acks, wait_ms: int, in_flight_end) -> None:
        """Master: mq_ha_read_acks for up to wait_ms (GIL released) on an ffi "mq_ha_acks *".
        Raises OSError when the receive fails (the errno is in `acks`: the handle's own belongs
        to the writer's thread)."""
        rc = lib.mq_ha_read_acks(self._h, sock_fd, acks, wait_ms, in_flight_end)
        if rc == lib.MQ_E_IO:
            raise OSError(acks.err, os.strerror(acks.err))
        check(rc, "HA acks")

    def ha_slave_for(self, sock_fd: int, rx, wait_ms: int) -> bool:
        """Slave: mq_ha_slave_for for up to wait_ms (GIL released) on an ffi "mq_ha_rx *";
        True when a received record is invalid (nothing past rx.published is published).
        Raises StoreError on a socket error."""
        rc = lib.mq_ha_slave_for(self._h, sock_fd, rx, wait_ms)
        if rc == lib.MQ_E_CORRUPT:
            return True
        if rc:
            check(rc, f"HA receive at {rx.expected}: {os.strerror(self.errno()) if rc == lib.MQ_E_IO else ''}")
        return False

    def ha_recv_run(self, sock_fd: int, expected: int, budget_bytes: int, body_max: int):
        """Slave: receives the frames that keep arriving at `expected` (see mq_ha_recv_run).
        Returns (why, expected, other, published, corrupt): why is "idle", "budget" or
        "other" (then other = (offset, size), a header the caller must judge).
        Raises StoreError on a socket error."""
        st = ffi.new("uint64_t[3]")          # expected, other offset, published
        why = ffi.new("int *")
        size = ffi.new("uint32_t *")
        st[0] = expected
        rc = lib.mq_ha_recv_run(self._h, sock_fd, st, budget_bytes, body_max, why, st + 1, size, st + 2)
        if rc not in (0, lib.MQ_E_CORRUPT):
            check(rc, f"HA receive at {st[0]}: {os.strerror(self.errno()) if rc == lib.MQ_E_IO else ''}")
        kind = {lib.MQ_HA_RX_IDLE: "idle", lib.MQ_HA_RX_BUDGET: "budget", lib.MQ_HA_RX_OTHER: "other"}[why[0]]
        other = (st[1], size[0]) if kind == "other" else None
        return kind, st[0], other, st[2], rc == lib.MQ_E_CORRUPT

    def ha_publish(self, received_end: int) -> tuple[int, bool]:
        """Slave: validate and publish what was received; (write_pos, corrupt)."""
        out = ffi.new("uint64_t *")
        rc = lib.mq_ha_publish(self._h, received_end, out)
        if rc not in (0, lib.MQ_E_CORRUPT):
            check(rc, "HA publish")
        return out[0], rc == lib.MQ_E_CORRUPT

    # ---- DLedger mode (see csrc/dledger.h) ---------------------------------------------
    def dledger_append_noop(self, term: int) -> int:
        """A new leader's no-op entry in `term`; its index."""
        out = ffi.new("mq_append_out[1]")
        check(lib.mq_dledger_append_noop(self._h, term, out), f"no-op entry in term {term}")
        return out[0].dl_index

    def dledger_entry(self, index: int) -> tuple[int, int, int]:
        """(pos, entry size, term) of entry `index` from its index unit (checked against the
        entry, and rewritten from the entries when damaged: csrc/dledger.h)."""
        pos, size, term = ffi.new("uint64_t *"), ffi.new("uint32_t *"), ffi.new("int64_t *")
        rc = lib.mq_dledger_entry(self._h, index, pos, size, term)
        if rc < 0:                          # (a leader looks up several entries a push)
            check(rc, f"DLedger entry {index}")
        return pos[0], size[0], term[0]

    def dledger_first_damaged(self, first: int, last: int) -> int:
        """The first of entries first..last whose bytes fail their CRC check (or whose index unit
        cannot be rebuilt); last + 1 when each one is whole (csrc/dledger.h)."""
        bad = ffi.new("uint64_t *")
        check(lib.mq_dledger_first_damaged(self._h, first, last, bad), f"DLedger entries {first}..{last}")
        return bad[0]

    def dledger_scrub(self, first: int, last: int, bytes_max: int) -> tuple[int | None, int]:
        """(the first damaged entry met or None, the index to go on from): entries first.. checked
        with their CRCs until about bytes_max bytes, `last`, or a damaged one (csrc/dledger.h)."""
        bad, nxt = ffi.new("uint64_t *"), ffi.new("uint64_t *")
        check(lib.mq_dledger_scrub(self._h, first, last, bytes_max, bad, nxt), f"DLedger entries {first}..{last}")
        return (None if bad[0] == 2 ** 64 - 1 else bad[0]), nxt[0]

    def dledger_repair_entry(self, index: int, buf) -> bool:
        """Rewrites damaged entry `index` from a peer's copy `buf` (csrc/dledger.h): True when it
        was damaged and is whole now, False when it was whole already.  InvalidArgument: the copy
        does not fit this log there; CorruptRecord: the copy is damaged; OutOfRange: not committed."""
        done = ffi.new("int *")
        check(lib.mq_dledger_repair_entry(self._h, index, ffi.from_buffer(buf), len(buf), done),
              f"repairing DLedger entry {index}")
        return bool(done[0])

    def dledger_entries_repaired(self) -> int:
        """Damaged entries this handle rewrote from a peer's copy since it opened."""
        return lib.mq_dledger_entries_repaired(self._h)

    def dledger_units_repaired(self) -> tuple[int, int]:
        """(units rewritten from their entries by this handle since it opened, the last one's index)."""
        last = ffi.new("uint64_t *")
        n = lib.mq_dledger_units_repaired(self._h, last)
        return n, last[0]

    def report_unit_repairs(self) -> None:
        """One line for the DLedger index units rewritten from their entries since the last report
        (the process that read them calls it: the Raft role every second, recovery once)."""
        n, last = self.dledger_units_repaired()
        if n > self._units_reported:
            log.warning("repaired: %d DLedger index unit(s) disagreed with their entries (damaged since written) "
                        "and were rewritten from the entries; the last: entry %d", n - self._units_reported, last)
            self._units_reported = n

    def dledger_entry_at(self, pos: int) -> tuple[int, int, int]:
        """(index, term, entry size) of the entry whose header sits at `pos` (read from the data file)."""
        head = self.view_raw(pos, DL_HEADER_SIZE)
        magic, size, index, term = _DL_HEAD.unpack_from(head, 0)
        if magic != 1:
            raise CorruptRecord(f"no DLedger entry at {pos} (magic {magic})")
        return index, term, size

    def dledger_index_ending_at(self, end: int) -> int:
        """The index of the entry that ends exactly at position `end` (binary search of the index)."""
        lo, hi = self.ctl.get(C.POS_DL_BEGIN_INDEX), self.ctl.get(C.POS_DL_NEXT_INDEX) - 1
        while lo <= hi:
            mid = (lo + hi) // 2
            pos, size, _ = self.dledger_entry(mid)
            if pos + size == end:
                return mid
            if pos + size < end:
                lo = mid + 1
            else:
                hi = mid - 1
        raise CorruptRecord(f"no DLedger entry ends at {end}")

    def dledger_append_raw(self, buf, first_index: int, first_pos: int, max_term: int) -> int:
        """A follower's append of the leader's bytes (validated first); entries appended."""
        n = ffi.new("uint32_t *")
        # the buffer is released before an error leaves: a traceback kept somewhere (a log record)
        # must not hold an export of the caller's bytearray, which could then never shrink
        with ffi.from_buffer(buf) as src:
            rc = lib.mq_dledger_append_raw(self._h, src, len(buf), first_index, first_pos, max_term, n)
        if rc < 0:
            check(rc, f"DLedger append of {len(buf)} bytes at index {first_index}, pos {first_pos}")
        return n[0]

    def dledger_follow_take(self, follow: "FollowTemplate", buf: bytearray, out: bytearray):
        """A follower's steady state: the PUSH frames at the start of buf that `follow` describes
        and that go at our end, appended and answered into out (csrc/dledger.h,
        mq_dledger_follow_take); follow.taken (the mq_dl_taken cdata) says what was taken.
        buf's buffer is released before this returns (the caller cuts what was taken from it)."""
        r = follow.taken
        with ffi.from_buffer(buf) as src, ffi.from_buffer(out) as dst:
            check(lib.mq_dledger_follow_take(self._h, follow.t, src, len(buf), dst, len(out), r), "DLedger follow take")
        return r

    def dledger_follow_read(self, follow: "FollowTemplate", fd: int, rd: "FollowReader", may_send: bool,
                            sync_flush: bool):
        """mq_dledger_follow_take on socket fd (csrc/dledger.h, mq_dledger_follow_read): one
        receive into rd.buf, the pushes taken, their answers sent (after a flush with
        sync_flush) unless may_send is false; rd.r (mq_dl_read) says what happened.  A failed
        flush raises StoreError (nothing was sent)."""
        rc = lib.mq_dledger_follow_read(self._h, follow.t, fd, rd.c_buf, len(rd.buf), rd.c_out, len(rd.out),
                                        int(may_send), int(sync_flush), rd.r)
        if rc:
            if rc == lib.MQ_E_IO:
                log.error("flush failed, the store now refuses writes: %s", self.ctl.fatal())
            check(rc, "DLedger follow read: flush: " + (self.ctl.fatal() or ""))
        return rd.r

    def dledger_lead_progress(self, lead: "LeadState") -> int:
        """A leader's log grew: the commit moves and each follower's window is filled in C
        (csrc/dledger.h, mq_dledger_lead_progress).  The MQ_E_* met first, or 0: each
        follower's own is in lead.ld.peer[i].err (the caller closes that connection)."""
        return lib.mq_dledger_lead_progress(self._h, lead.ld)

    def dledger_lead_take(self, lead: "LeadState", i: int, buf: bytearray):
        """The answers of follower i at the start of buf that C takes (mq_dledger_lead_take);
        lead.taken (the mq_dl_taken cdata) says how many.  buf's buffer is released before this
        returns (the caller cuts what was taken from it)."""
        r = lead.taken
        with ffi.from_buffer(buf) as src:
            lib.mq_dledger_lead_take(self._h, lead.ld, i, src, len(buf), r)
        return r

    def dledger_lead_read(self, lead: "LeadState", i: int, fd: int, rd: "FollowReader"):
        """mq_dledger_lead_take on the link's socket fd (csrc/dledger.h, mq_dledger_lead_read): one
        receive into rd.buf, the answers of follower i taken; rd.r (mq_dl_read) says what happened."""
        lib.mq_dledger_lead_read(self._h, lead.ld, i, fd, rd.c_buf, len(rd.buf), rd.r)
        return rd.r

    def dledger_install(self, buf, begin_index: int, begin_pos: int, max_term: int) -> int:
        """A follower behind the leader's first entry takes the leader's log from (begin_index,
        begin_pos) on, in one step (dledger.h); entries installed."""
        n = ffi.new("uint32_t *")
        with ffi.from_buffer(buf) as src:   # (as in dledger_append_raw)
            rc = lib.mq_dledger_install(self._h, src, len(buf), begin_index, begin_pos, max_term, n)
        check(rc, f"DLedger install of {len(buf)} bytes at index {begin_index}, pos {begin_pos}")
        return n[0]

    def dledger_truncate(self, next_index: int) -> None:
        check(lib.mq_dledger_truncate(self._h, next_index), f"DLedger truncate to index {next_index}")

    def dledger_set_commit(self, commit_next_index: int) -> None:
        rc = lib.mq_dledger_set_commit(self._h, commit_next_index)
        if rc < 0:
            check(rc, f"DLedger commit to {commit_next_index}")

    def dledger_set_append_term(self, term: int) -> None:
        check(lib.mq_dledger_set_append_term(self._h, term), f"DLedger append term {term}")

    def dledger_recover_index(self, from_pos: int, end_pos: int) -> tuple[int, int]:
        """Rewrites the index units of [from_pos, end_pos); (next index, last term)."""
        nxt, term = ffi.new("uint64_t *"), ffi.new("int64_t *")
        check(lib.mq_dledger_recover_index(self._h, from_pos, end_pos, nxt, term),
              f"DLedger index recovery of [{from_pos}, {end_pos})")
        return nxt[0], term[0]

    def dledger_send(self, sock_fd: int, head: bytes, pos: int, nbytes: int, done: int) -> tuple[bool, int]:
        """head + nbytes of the data files at pos to a (non-blocking) socket, resuming at `done`;
        (finished, progress).  Raises StoreError on a socket error."""
        prog = ffi.new("uint64_t *", done)
        rc = lib.mq_dledger_send(self._h, sock_fd, head, len(head), pos, nbytes, prog)
        if rc == lib.MQ_E_AGAIN:
            return False, prog[0]
        if rc == lib.MQ_E_IO:
            raise OSError(self.errno(), f"DLedger send: {os.strerror(self.errno())}")
        if rc < 0:
            check(rc, f"DLedger send of [{pos}, +{nbytes})")
        return True, prog[0]

    # ---- the next file, prepared ahead -----------------------------------------
    def prepare_file(self, file_index: int, from_pos: int = 0) -> None:
        """Creates, maps and pre-touches the file from log position from_pos's page on."""
        check(lib.mq_commitlog_prepare_file(self._h, file_index, from_pos), f"prepare file {file_index}")
        self._prepared.add(file_index)

    def start_preparer(self) -> None:
        """Background thread: keeps the current file, and from PREPARE_NEXT_AT of it the
        next, created, sized and pre-touched in this process's mapping."""
        if self._preparer:
            return
        self._stop.clear()
        self._preparer = threading.Thread(target=self._prepare_loop, name="commitlog-preparer", daemon=True)
        self._preparer.start()

    def _prepare_loop(self) -> None:
        # A timer, not SEQ_WRITE: waking on every append would make every append pay a
        # futex wake and this thread a GIL hand-off.  Preparing one file ahead leaves a
        # whole file of appends (1 GiB by default) to cover PREPARE_CHECK_S.
        while not self._stop.is_set():
            if self.dledger and not self.ctl.get(C.POS_DL_APPEND_TERM):
                # a DLedger member that does not serve writes: its role appends with pwrite
                # (mq_dledger_append_raw), which needs no pre-touched pages
                self._stop.wait(PREPARE_CHECK_S)
                continue
            pos = self.write_pos
            fi = pos // self.file_size
            ahead = (fi + 1,) if pos % self.file_size >= self.file_size * PREPARE_NEXT_AT else ()
            for idx in (fi, *ahead):
                if idx not in self._prepared:
                    try:
                        self.prepare_file(idx, pos)
                    except Exception as e:  # disk full etc.: appends will report it
                        log.warning("could not prepare commitlog file %d: %s", idx, e)
                        self._stop.wait(1.0)
                        break
            self._prepared = {i for i in self._prepared if i >= fi}
            self._stop.wait(PREPARE_CHECK_S)

    def stop_preparer(self) -> None:
        self._stop.set()
        if self._preparer:
            self._preparer.join()
            self._preparer = None

    def close(self) -> None:
        self.stop_preparer()
        if self._h is not None:
            lib.mq_commitlog_close(self._h)
            self._h = None


class FollowTemplate:
    """mq_dledger_follow_take's template: the literal text of a PUSH header around its eight
    values (req: nine byte strings) and of its SUCCESS answer around the index and the opaque
    (resp: three), for one term; kept alive with the C struct that points at them."""

    def __init__(self, req: list[bytes], resp: list[bytes], term: int, frame_max: int):
        assert len(req) == lib.MQ_DL_PUSH_VALUES + 1 and len(resp) == 3, (len(req), len(resp))
        self._keep = [ffi.from_buffer(b) for b in req + resp]
        t = self.t = ffi.new("mq_dl_follow *")
        for i, b in enumerate(req):
            t.req[i], t.req_len[i] = self._keep[i], len(b)
        for i, b in enumerate(resp):
            t.resp[i], t.resp_len[i] = self._keep[len(req) + i], len(b)
        t.term, t.frame_max = term, frame_max
        self.taken = ffi.new("mq_dl_taken *")


class FollowReader:
    """mq_dledger_follow_read's (and mq_dledger_lead_read's, out_bytes 0) state for one
    connection: its receive buffer (an incomplete frame kept at its start between reads:
    r.have), its answers' buffer, and the result (mq_dl_read).  The buffers keep their size:
    C holds them for the reader's life."""

    def __init__(self, buf_bytes: int, out_bytes: int = 0):
        self.buf = bytearray(buf_bytes)
        self.out = bytearray(out_bytes)
        self.c_buf = ffi.from_buffer(self.buf)
        self.c_out = ffi.from_buffer(self.out)
        self.r = ffi.new("mq_dl_read *")


class LeadState:
    """mq_dledger_lead_take's and mq_dledger_lead_progress's state (mq_dl_lead): a leader's view
    of its followers, shared by the Raft core (mq.dledger.role.CProgress reads and writes
    peer[i]) and C; set_templates() points it at the header texts of one term, kept alive here."""

    OPAQUE_BASE = lib.MQ_DL_LEAD_OPAQUE_BASE
    HEAD_MAX = lib.MQ_DL_LEAD_HEAD_MAX
    PEERS_MAX = lib.MQ_DL_LEAD_PEERS_MAX

    def __init__(self, n_peers: int, quorum: int, max_inflight: int, sync_durable: bool, push_bytes_max: int):
        assert n_peers <= lib.MQ_DL_LEAD_PEERS_MAX and max_inflight <= lib.MQ_DL_INFLIGHT_MAX, (n_peers, max_inflight)
        ld = self.ld = ffi.new("mq_dl_lead *")
        ld.n_peers, ld.quorum, ld.max_inflight = n_peers, quorum, max_inflight
        ld.sync_durable, ld.push_bytes_max, ld.commit = int(sync_durable), push_bytes_max, -1
        for i in range(n_peers):
            ld.peer[i].fd = -1
        self.taken = ffi.new("mq_dl_taken *")
        self._keep: list = []

    def set_templates(self, term: int, reqs: list[list[bytes]], resp: list[bytes]) -> bool:
        """The push header of each follower (reqs[i]: nine literals, mq_dl_follow's req) and the
        answer (resp: three) in `term`; False (and nothing set) when a push's header could
        exceed MQ_DL_LEAD_HEAD_MAX."""
        assert len(reqs) == self.ld.n_peers and len(resp) == 3, (len(reqs), len(resp))
        if any(8 + sum(map(len, req)) + lib.MQ_DL_PUSH_VALUES * 20 > self.HEAD_MAX for req in reqs):
            return False
        keep = []
        ld = self.ld
        for i, req in enumerate(reqs):
            assert len(req) == lib.MQ_DL_PUSH_VALUES + 1, len(req)
            for k, b in enumerate(req):
                keep.append(ffi.from_buffer(b))
                ld.peer[i].req[k], ld.peer[i].req_len[k] = keep[-1], len(b)
        for k, b in enumerate(resp):
            keep.append(ffi.from_buffer(b))
            ld.resp[k], ld.resp_len[k] = keep[-1], len(b)
        ld.term = term
        self._keep = keep                   # the old term's texts may go now: ld points at these
        return True

    def blocked_head(self, i: int) -> bytes:
        """The head of the push C left partly written to follower i (peer[i].blocked)."""
        p = self.ld.peer[i]
        return ffi.buffer(p.blk_head, p.blk_head_len)[:]


class Scanner:
    """Walks records with the C scanner into a reusable array (no per-record
    allocation in C; Python reads the fields it needs)."""

    def __init__(self, cl: CommitLog, capacity: int):
        self.cl = cl
        self.capacity = capacity
        self.recs = ffi.new("mq_scan_rec[]", capacity)
        self._n = ffi.new("uint32_t *")
        self._next = ffi.new("uint64_t *")
        self._stop = ffi.new("int *")

    def scan(self, start: int, limit: int, check_crc: bool = False, resolve_slots: int = 1):
        """Returns (count, next_offset, stop_kind); records are in self.recs[:count]."""
        check(lib.mq_commitlog_scan(self.cl._h, start, limit, 1 if check_crc else 0, resolve_slots,
                                    self.recs, self.capacity, self._n, self._next, self._stop), "scan")
        return self._n[0], self._next[0], self._stop[0]


class GroupAppend:
    """Single messages of any topic-queues appended with one C call
    (mq_commitlog_append_group): the io worker's group of the sends of one event-loop
    iteration.  add() a message and keep the index it returns, run(), then read that
    message's outcome by its index (rc, msg_id, queue_offset, end_offset, dl_term) before
    the next add().

    The builder's arrays are reused from group to group; a group holds at most
    GROUP_MSGS_MAX messages (add() returns -1 when full: run it and start over).  add()
    checks every number against its C field before it touches the group, so a refused
    message leaves the group as it was.  run() always leaves the builder empty; reset()
    empties it without appending (a caller whose build failed half-way).  The bytes passed
    to add() are kept alive until then."""

    __slots__ = ("cl", "n", "_msgs", "_out", "_rc", "_keep", "_topics", "_max_size")

    def __init__(self, cl: CommitLog, capacity: int = 0):
        self.cl = cl
        self.n = 0
        cap = capacity or GROUP_MSGS_MAX
        assert 0 < cap <= BATCH_MSGS_MAX
        self._msgs = ffi.new("mq_group_msg[]", cap)
        self._out = ffi.new("mq_append_out[]", cap)
        self._rc = ffi.new("int32_t[]", cap)
        self._keep: list = []
        self._topics: dict[bytes, object] = {}     # topic -> its C bytes (few topics, many messages)
        self._max_size = cl.max_message_size

    @property
    def capacity(self) -> int:
        return len(self._msgs)

    def c_bytes(self, data: bytes):
        """A C view of bytes that live as long as the caller keeps `data` (for born hosts and
        extra properties a caller reuses across groups)."""
        return ffi.from_buffer(data)

    def add(self, topic: bytes, queue_id: int, body: bytes, props: bytes, extra_props, extra_len: int,
            born_host, born_host_len: int, born_port: int, *, flag: int = 0, sys_flag: int = 0,
            born_ts_ms: int = 0, reconsume_times: int = 0) -> int:
        """Queues one message and returns its index in this group (-1: the group is full);
        born_host and extra_props are c_bytes() views (extra may be None).  ValueError, with
        the group untouched, when a number does not fit its field (int32; born_ts_ms int64)."""
        i = self.n
        if i >= len(self._msgs):
            return -1
        if not (INT32_MIN <= queue_id <= INT32_MAX and INT32_MIN <= flag <= INT32_MAX
                and INT32_MIN <= sys_flag <= INT32_MAX and INT32_MIN <= reconsume_times <= INT32_MAX
                and INT64_MIN <= born_ts_ms <= INT64_MAX and 0 <= born_port <= 0xFFFF):
            raise ValueError(f"a field does not fit: queueId={queue_id} flag={flag} sysFlag={sys_flag} "
                             f"reconsumeTimes={reconsume_times} bornTimestamp={born_ts_ms} bornPort={born_port}")
        m = self._msgs[i]
        t = self._topics.get(topic)
        if t is None:
            if len(self._topics) > 4096:
                self._topics.clear()
            t = self._topics[topic] = ffi.from_buffer(topic)
        m.topic = t
        m.topic_len = len(topic)
        m.queue_id = queue_id
        b = ffi.from_buffer(body)
        m.body = b
        m.body_len = len(body)
        keep = self._keep
        keep.append(b)
        if props:
            p = ffi.from_buffer(props)
            keep.append(p)
            m.props = p
        else:
            m.props = ffi.NULL
        m.props_len = len(props)
        m.extra_props = extra_props if extra_props is not None else ffi.NULL
        m.extra_props_len = extra_len
        m.born_host = born_host
        m.born_host_len = born_host_len
        m.born_port = born_port
        m.flag = flag
        m.sys_flag = sys_flag
        m.born_ts_ms = born_ts_ms
        m.reconsume_times = reconsume_times
        self.n = i + 1
        return i

    def run(self) -> int:
        """Appends the queued messages (one C call, one wake); returns how many were stored.
        Afterwards rc(i) says each one's outcome until the next add()."""
        n, self.n = self.n, 0
        if not n:
            return 0
        try:
            appended = lib.mq_commitlog_append_group(self.cl._h, self._msgs, n, self._max_size, self._out, self._rc)
        finally:
            self._keep.clear()
        check(appended if appended < 0 else 0, "group append")
        return appended

    def reset(self) -> None:
        """Drops whatever was queued and not run."""
        self.n = 0
        self._keep.clear()

    def rc(self, i: int) -> int:
        return self._rc[i]

    def error(self, i: int, topic: str, queue_id: int):
        """The StoreError message i's rc stands for (what CommitLog.append would have raised)."""
        return self.cl.append_error(self._rc[i], topic, queue_id)

    def msg_id(self, i: int) -> bytes:
        return ffi.string(self._out[i].msg_id)

    def queue_offset(self, i: int) -> int:
        return self._out[i].queue_offset

    def end_offset(self, i: int) -> int:
        o = self._out[i]
        return o.phy_offset + o.size

    def dl_term(self, i: int) -> int:
        return self._out[i].dl_term

    def result(self, i: int) -> AppendResult:
        """Message i's outcome as an AppendResult of its own (a copy: it outlives the group)."""
        one = ffi.new("mq_append_out[1]")
        ffi.memmove(one, self._out + i, ffi.sizeof("mq_append_out"))
        return AppendResult(one, 1)
