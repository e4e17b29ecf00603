"""Files that must survive a crash, by path.

write_atomic(path, text): the new text goes to <path>.tmp, is fsynced, the old file is kept as
<path>.bak (a hard link: no bytes copied, so it works on a full disk), and the tmp file is
renamed over the original (then the directory is fsynced): a crash leaves the old or the new
version, never half; a failed write leaves the old version and no tmp file.  read_config(path)
reads it back (fastjson's unquoted integer keys accepted), falling back to .bak when the main
file is empty or unreadable.

replace_file(path, data) is for a status file other processes of this host read, not for a
crash: the text goes to <path>.tmp and is renamed over the original (a reader sees the old or
the new version whole), with no fsync and no .bak.  Such a file is rewritten every second and
means nothing after a restart; an fsync a second per writer (two, with the directory's) forced
a journal commit each time, pushing every other process's writes to the disk with it.

fsync_path and fsync_dir sync by path.  Why not mmap.flush() for a mapped file: CPython 3.11's
calls msync with the GIL held, so a thread syncing a mapped file on a busy disk (seconds, when
the kernel has gigabytes of other writes to push first) stops every other thread of its
process; os.fsync releases the GIL.  On Linux a page written through any shared mapping of a
file is a dirty page of that file's page cache, so fsync of a fresh descriptor makes it durable
exactly as msync(MS_SYNC) of the mapping would.

Nothing here loads the store or its C core: clients and the name server use it too."""
from __future__ import annotations

import errno
import json
import logging
import os
import shutil

from mq.options import format_value
from mq.wire.fastjson import loads_lenient

log = logging.getLogger("mq.files")

SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)      # a full disk: not fatal where a later retry can succeed


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


def write_atomic(path: str, text: str) -> None:
    """Replaces `path` with `text` (see the module docstring).  OSError when it could not:
    `path` is then its old version, and no tmp file is left (it would hold the disk's space)."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    _via_tmp(path, text.encode("utf-8"), durable=True)
    fsync_dir(directory)


def replace_file(path: str, data: str | bytes) -> None:
    """Replaces `path` with `data` for readers on this host (see the module docstring).  OSError
    when it could not: `path` is then its old version, and no tmp file is left."""
    _via_tmp(path, data.encode("utf-8") if isinstance(data, str) else data, durable=False)


def _via_tmp(path: str, data: bytes, durable: bool) -> None:
    """data to <path>.tmp (fsynced, and the old version kept as .bak, when durable), then renamed
    over `path`; the tmp file is removed when anything fails."""
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        if durable and os.path.exists(path):
            _keep_backup(path)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _keep_backup(path: str) -> None:
    """<path>.bak becomes the current version of `path`: a hard link renamed into place (no new
    blocks, so it works on a full disk, and never a half-copied .bak); a copy where the file
    system has no hard links."""
    bak, bak_tmp = path + ".bak", path + ".bak.tmp"
    try:
        os.unlink(bak_tmp)
    except FileNotFoundError:
        pass
    try:
        os.link(path, bak_tmp)
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
            raise
        shutil.copyfile(path, bak_tmp)
    os.replace(bak_tmp, bak)


def read_config(path: str):
    """The parsed content of path (or its .bak), or None when neither is usable."""
    for candidate in (path, path + ".bak"):
        try:
            with open(candidate, encoding="utf-8") as f:
                text = f.read()
        except FileNotFoundError:
            continue
        if not text.strip():
            continue
        try:
            return loads_lenient(text)
        except (json.JSONDecodeError, ValueError) as e:
            log.error("config file %s is unreadable (%s); trying the backup", candidate, e)
    return None


def rewrite_properties_file(path: str, values: dict) -> None:
    """Sets key=value lines of a properties file (broker.conf, namesrv.conf) in place -- other lines
    and comments kept, missing keys appended -- atomically (write_atomic), so a runtime change
    (UPDATE_BROKER_CONFIG, UPDATE_NAMESRV_CONFIG) outlives a restart, as RocketMQ's does."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    left = dict(values)
    out = []
    for line in lines:
        key = line.split("=", 1)[0].strip() if "=" in line and not line.lstrip().startswith(("#", "!")) else None
        out.append(f"{key}={format_value(left.pop(key))}" if key in left else line)
    out += [f"{k}={format_value(v)}" for k, v in left.items()]
    write_atomic(path, "\n".join(out) + "\n")
