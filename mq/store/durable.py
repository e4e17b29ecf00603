"""Making files durable by path.

Why by path and not `mmap.flush()`: CPython 3.11's mmap.flush() calls msync with the GIL
held, so a thread syncing a mapped file on a busy disk (seconds, when the kernel has
gigabytes of other writes to push first) stops every other thread of its process.
`os.fsync` releases the GIL.  On Linux a page written through any shared mapping of a file
is a dirty page of that file's page cache, so fsync of a fresh descriptor makes it durable
exactly as msync(MS_SYNC) of the mapping would."""
from __future__ import annotations

import os


def fsync_path(path: str, data_only: bool = True) -> bool:
    """fdatasync (or fsync) of the file at `path`; False when it does not exist (deleted
    meanwhile: nothing of it needs to be durable).  Other errors raise OSError."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        (os.fdatasync if data_only else os.fsync)(fd)
    finally:
        os.close(fd)
    return True


def fsync_dir(path: str) -> None:
    """fsync of a directory: makes the creation, rename or removal of its entries durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
