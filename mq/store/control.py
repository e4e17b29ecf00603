"""The control block: the store's shared state in multiprocessing.shared_memory.

The C module owns its layout (mq_ctl in csrc/mqstore.c); Python only creates,
attaches and reads it through the C functions.  One control block per store
root, named after the root's real path, so every process of a broker (and a
tool) finds it from the path alone.

The segment is opened with shm_open + mmap directly, not through
multiprocessing.shared_memory: in Python 3.11 that registers every attach
with the resource tracker, which then unlinks the segment when an unrelated
attacher exits.  Only the owner (the process that created it) unlinks it, on
close; a crashed owner's stale segment is replaced at the next open."""
from __future__ import annotations

import hashlib
import mmap
import os

import _posixshmem

from .native import BadControlBlock, ffi, lib, check

POS_WRITE = lib.MQ_POS_WRITE
POS_FLUSHED = lib.MQ_POS_FLUSHED
POS_DISPATCHED = lib.MQ_POS_DISPATCHED
POS_ACKED = lib.MQ_POS_ACKED
POS_MIN = lib.MQ_POS_MIN
POS_LAST_STORE_TS = lib.MQ_POS_LAST_STORE_TS
POS_FLUSHED_STORE_TS = lib.MQ_POS_FLUSHED_STORE_TS
POS_CONFIRM = lib.MQ_POS_CONFIRM
POS_MSGS = lib.MQ_POS_MSGS            # messages appended since the block was made (a statistic)

SEQ_WRITE = lib.MQ_SEQ_WRITE
SEQ_FLUSH = lib.MQ_SEQ_FLUSH
SEQ_DISPATCH = lib.MQ_SEQ_DISPATCH
SEQ_ACK = lib.MQ_SEQ_ACK

Q_NEXT_OFFSET = lib.MQ_Q_NEXT_OFFSET
Q_CQ_MAX = lib.MQ_Q_CQ_MAX
Q_CQ_MIN = lib.MQ_Q_CQ_MIN


def segment_name(store_root: str) -> str:
    digest = hashlib.sha1(os.path.realpath(store_root).encode()).hexdigest()[:20]
    return f"mq-{digest}"


class ControlBlock:
    """A handle on one store's control block.  `create=True` makes a fresh one
    (replacing a stale segment left by a crashed owner); otherwise attach."""

    def __init__(self, store_root: str, file_size: int | None = None, create: bool = False):
        self.name = segment_name(store_root)
        self.owner = create
        size = lib.mq_ctl_size()
        path = "/" + self.name
        if create:
            assert file_size is not None
            try:
                _posixshmem.shm_unlink(path)       # a stale segment of a crashed owner
            except FileNotFoundError:
                pass
            fd = _posixshmem.shm_open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
        else:
            fd = _posixshmem.shm_open(path, os.O_RDWR, mode=0o600)
        try:
            if create:
                os.ftruncate(fd, size)
            elif os.fstat(fd).st_size < size:
                raise BadControlBlock(f"control block {self.name} is smaller than this build's layout")
            self._mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self._buf = ffi.from_buffer(self._mm)
        self.ptr = ffi.cast("void *", self._buf)
        self.size = size
        if create:
            check(lib.mq_ctl_init(self.ptr, size, file_size), "mq_ctl_init")
        else:
            check(lib.mq_ctl_check(self.ptr, size), f"control block {self.name}")

    # positions ------------------------------------------------------------
    def get(self, pos: int) -> int:
        return lib.mq_ctl_get(self.ptr, pos)

    def set(self, pos: int, value: int) -> None:
        check(lib.mq_ctl_set(self.ptr, pos, value))

    def advance(self, pos: int, value: int) -> None:
        lib.mq_ctl_advance(self.ptr, pos, value)

    # wakeups ---------------------------------------------------------------
    def seq(self, which: int) -> int:
        return lib.mq_ctl_seq(self.ptr, which)

    def wait(self, which: int, seen: int, timeout_ms: int) -> bool:
        """Sleeps (GIL released) until the sequence moves past `seen`; False on timeout."""
        return lib.mq_ctl_wait(self.ptr, which, seen, timeout_ms) == 0

    def wake(self, which: int) -> None:
        lib.mq_ctl_wake(self.ptr, which)

    # sticky error ------------------------------------------------------------
    def fatal(self) -> str | None:
        msg = ffi.new("char[256]")
        err = lib.mq_ctl_fatal(self.ptr, msg, 256)
        return ffi.string(msg).decode("utf-8", "replace") if err else None

    def set_fatal(self, err: int, message: str) -> None:
        lib.mq_ctl_set_fatal(self.ptr, err, message.encode()[:255])

    def stat(self, which: int) -> int:
        return lib.mq_ctl_stat(self.ptr, which)

    # topic-queue table -----------------------------------------------------
    def queue_slot(self, topic: str, queue_id: int, create: bool = False) -> int | None:
        out = ffi.new("uint32_t *")
        t = topic.encode()
        rc = lib.mq_queue_lookup(self.ptr, t, len(t), queue_id, 1 if create else 0, out)
        if rc == lib.MQ_E_RANGE and not create:
            return None
        check(rc, f"queue slot {topic}:{queue_id}")
        return out[0]

    def queue_get(self, slot: int, field: int) -> int:
        return lib.mq_queue_get(self.ptr, slot, field)

    def queue_set(self, slot: int, field: int, value: int) -> None:
        check(lib.mq_queue_set(self.ptr, slot, field, value))

    def queue_advance(self, slot: int, field: int, value: int) -> None:
        lib.mq_queue_advance(self.ptr, slot, field, value)

    def queue_info(self, slot: int) -> tuple[str, int]:
        buf = ffi.new("char[128]")
        n = ffi.new("uint32_t *")
        qid = ffi.new("int32_t *")
        check(lib.mq_queue_info(self.ptr, slot, buf, n, qid))
        return ffi.buffer(buf, n[0])[:].decode(), qid[0]

    def close(self) -> None:
        if self._mm is None:
            return
        self.ptr = None
        self._buf = None
        mm, self._mm = self._mm, None
        try:
            mm.close()
        except BufferError:
            pass  # a view is still exported; the mapping goes with the process
        if self.owner:
            try:
                _posixshmem.shm_unlink("/" + self.name)
            except FileNotFoundError:
                pass
