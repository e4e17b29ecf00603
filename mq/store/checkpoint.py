"""The `checkpoint` file: 4096 bytes, mmapped, written by several roles.

Layout (mq.wire.checkpoint declares it):
  0 physicMsgTimestamp | 8 logicsMsgTimestamp | 16 indexMsgTimestamp   (RocketMQ's)
  24 cleanCommitLogEnd | 32 cleanMagic                                   (ours; RocketMQ ignores them)
The flush role writes physic, the dispatch role logics; each field is one
aligned 8-byte store, so roles never tear each other's fields.  The clean
fields are written only by a clean shutdown, after everything was flushed
and dispatched, and cleared at start: with them, a clean restart trusts the
exact end offset and rescans nothing.

The file's block is allocated (fallocate) before it is mapped, so a write through
the map never needs space: on a full disk opening fails with OSError (ENOSPC),
never a SIGBUS later.  Allocating what is already allocated needs no space, so a
role restarting on a full disk opens the existing file."""
from __future__ import annotations

import errno
import mmap
import os
import struct

from mq.wire import checkpoint as W

from mq.files import fsync_path

FILE_SIZE = W.CHECKPOINT_FILE_SIZE
CLEAN_MAGIC = 0x4D51434C45414E31  # "MQCLEAN1"
_Q = struct.Struct(">q")
OFF_PHYSIC, OFF_LOGICS, OFF_INDEX, OFF_CLEAN_END, OFF_CLEAN_MAGIC = 0, 8, 16, 24, 32


def _allocate(fd: int, size: int) -> None:
    """Blocks for bytes [0, size) of fd (the file grows to size if shorter).  Where the file
    system has no fallocate, ftruncate (sparse: the old behaviour, the best it allows)."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as e:
        if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise
        if os.fstat(fd).st_size < size:
            os.ftruncate(fd, size)


class Checkpoint:
    def __init__(self, path: str):
        self.path = path
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            _allocate(fd, FILE_SIZE)
            self._mm = mmap.mmap(fd, FILE_SIZE)
        finally:
            os.close(fd)

    def _get(self, off: int) -> int:
        return _Q.unpack_from(self._mm, off)[0]

    def _set(self, off: int, v: int) -> None:
        _Q.pack_into(self._mm, off, v)

    physic_ts_ms = property(lambda s: s._get(OFF_PHYSIC), lambda s, v: s._set(OFF_PHYSIC, v))
    logics_ts_ms = property(lambda s: s._get(OFF_LOGICS), lambda s, v: s._set(OFF_LOGICS, v))
    index_ts_ms = property(lambda s: s._get(OFF_INDEX), lambda s, v: s._set(OFF_INDEX, v))

    def min_timestamp_ms(self) -> int:
        return max(0, min(self.physic_ts_ms, self.logics_ts_ms) - 3000)

    def clean_end(self) -> int | None:
        """The CommitLog end recorded by the last clean shutdown, or None."""
        if self._get(OFF_CLEAN_MAGIC) == CLEAN_MAGIC:
            return self._get(OFF_CLEAN_END)
        return None

    def mark_clean(self, end: int) -> None:
        self._set(OFF_CLEAN_END, end)
        self._set(OFF_CLEAN_MAGIC, CLEAN_MAGIC)
        self.flush()

    def clear_clean(self) -> None:
        self._set(OFF_CLEAN_MAGIC, 0)
        self.flush()

    def flush(self) -> None:
        fsync_path(self.path)         # not mmap.flush(): that holds the GIL (mq.store.durable)

    def close(self) -> None:
        try:
            self._mm.close()
        except BufferError:
            pass
