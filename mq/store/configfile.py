"""JSON config files under <store>/config (topics.json, consumerOffset.json,
delayOffset.json, subscriptionGroup.json).

Writes are crash-safe: the new text goes to <file>.tmp, is fsynced, the old
file is kept as <file>.bak (a hard link: no bytes copied), and the tmp file is
renamed over the original (then the directory is fsynced), so a crash leaves
the old or the new version, never half.  Reads accept fastjson's unquoted
integer map keys ({0:12}) and fall back to .bak when the main file is empty or
unreadable.

A full disk (ENOSPC, EDQUOT) is not fatal: a failed write leaves the old
version and no tmp file behind.  ConfigFile.save then keeps the text, logs
once, and writes it at its next save or at retry_pending_writes() (the broker's
supervisor calls it with every disk check), logging once when it got through;
the caller goes on, as RocketMQ's ConfigManager.persist does.  Other errors
raise."""
from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
import threading

from .durable import fsync_dir

log = logging.getLogger("mq.store.configfile")

SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)

# a bare integer key after '{' or ',' (outside strings: the config texts we
# read have no strings containing '{' or ',' followed by digits and ':')
_BARE_KEY = re.compile(r'([{,]\s*)(-?\d+)(\s*:)')


def loads_lenient(text: str):
    """json.loads that also accepts fastjson's unquoted integer keys."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return json.loads(_quote_bare_keys(text))


def _quote_bare_keys(text: str) -> str:
    out = []
    # only rewrite outside string literals
    parts = re.split(r'("(?:[^"\\]|\\.)*")', text)
    for part in parts:
        if part.startswith('"') and part.endswith('"') and len(part) >= 2:
            out.append(part)
        else:
            out.append(_BARE_KEY.sub(lambda m: f'{m.group(1)}"{m.group(2)}"{m.group(3)}', part))
    return "".join(out)


def write_atomic(path: str, text: str) -> None:
    """Replaces `path` with `text` (see the module docstring).  OSError when it could not:
    `path` is then its old version, and no tmp file is left (it would hold the disk's space)."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    tmp = path + ".tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if os.path.exists(path):
            _keep_backup(path)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(directory)


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


_pending_lock = threading.Lock()
_pending: dict[str, "ConfigFile"] = {}       # path -> the file whose last save a full disk refused


class ConfigFile:
    """One JSON config file with a dict payload."""

    def __init__(self, config_dir: str, name: str):
        self.path = os.path.join(config_dir, name)
        self._unwritten: str | None = None       # the text a full disk refused, until written
        self._write_lock = threading.Lock()      # one write at a time: a retry never undoes a newer save

    def load(self) -> dict:
        data = read_config(self.path)
        return data if isinstance(data, dict) else {}

    def save(self, data: dict) -> None:
        """Writes `data`; on a full disk keeps it for later (module docstring) and returns."""
        text = json.dumps(data, indent=2, sort_keys=True)
        with self._write_lock:
            self._write_locked(text)

    def retry(self) -> bool:
        """Writes the text a full disk refused, if no newer save wrote since; True when nothing
        is left unwritten."""
        with self._write_lock:
            return self._unwritten is None or self._write_locked(self._unwritten)

    def _write_locked(self, text: str) -> bool:
        """True when `text` is on disk; False when a full disk refused it (kept, logged once).
        _write_lock should be held."""
        try:
            write_atomic(self.path, text)
        except OSError as e:
            if e.errno not in SPACE_ERRNOS:
                raise
            if self._unwritten is None:
                log.error("config file %s not written: %s; the change is kept and written once the disk has "
                          "room", self.path, e)
            self._unwritten = text
            with _pending_lock:
                _pending[self.path] = self
            return False
        if self._unwritten is not None:
            log.warning("config file %s written: the disk has room again", self.path)
            self._unwritten = None
            with _pending_lock:
                _pending.pop(self.path, None)
        return True


def retry_pending_writes() -> int:
    """Tries again every config file whose last save a full disk refused; how many are still
    unwritten."""
    with _pending_lock:
        files = list(_pending.values())
    return sum(not f.retry() for f in files)
