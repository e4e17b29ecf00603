"""JSON config files under <store>/config (topics.json, consumerOffset.json,
delayOffset.json, subscriptionGroup.json): written with mq.files.write_atomic (crash-safe:
the old or the new version, never half) and read with mq.files.read_config (fastjson's
unquoted integer keys; the .bak when the main file is unreadable).

A full disk (ENOSPC, EDQUOT) is not fatal: a failed write leaves the old
version and no tmp file behind.  ConfigFile.save then keeps the text, logs
once, and writes it at its next save or at retry_pending_writes() (the broker's
supervisor calls it with every disk check), logging once when it got through;
the caller goes on, as RocketMQ's ConfigManager.persist does.  Other errors
raise."""
from __future__ import annotations

import json
import logging
import os
import threading

from mq.files import SPACE_ERRNOS, read_config, write_atomic  # noqa: F401 (re-exported)
from mq.wire.fastjson import loads_lenient  # noqa: F401 (re-exported)

log = logging.getLogger("mq.store.configfile")


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
