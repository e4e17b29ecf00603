"""JSON config files under <store>/config (topics.json, consumerOffset.json,
delayOffset.json, subscriptionGroup.json): written with mq.files.write_atomic (crash-safe:
the old or the new version, never half) and read with mq.files.read_config (fastjson's
unquoted integer keys; the .bak when the main file is unreadable).

A full disk (ENOSPC, EDQUOT) is not fatal: a failed write leaves the old
version and no tmp file behind.  ConfigFile.save then keeps the text, logs
once, and writes it at its next save or at retry_pending_writes() (the broker's
supervisor calls it with every disk check), logging once when it got through;
the caller goes on, as RocketMQ's ConfigManager.persist does.  Other errors
raise.

Off the event loop (`Writer`): a write ends in two fsyncs, and on a busy disk one fsync can
wait for the journal to commit every other process's dirty data first (seconds; 15 s was seen
under the test suite's parallel load).  A process that serves requests on an event loop (the
broker's supervisor) must not stop serving for that: it gives its ConfigFiles a Writer, and
save() then hands the text to the Writer's one thread and returns that write's
concurrent.futures.Future (the text is taken at the call, so the file gets the state of that
moment; a save whose text is still queued when a newer save of the same file comes is
replaced by it, and its Future is answered by the newer text's write: a group commit).  A caller
that answers a request only once the change is on disk awaits the Future.  Writer.close()
writes what is queued and ends the thread."""
from __future__ import annotations

import concurrent.futures
import json
import logging
import os
import threading

from mq.files import SPACE_ERRNOS, read_config, write_atomic  # noqa: F401 (re-exported)
from mq.wire.fastjson import loads_lenient  # noqa: F401 (re-exported)

log = logging.getLogger("mq.store.configfile")


_pending_lock = threading.Lock()
_pending: dict[str, "ConfigFile"] = {}       # path -> the file whose last save a full disk refused


class Writer:
    """One thread that writes ConfigFiles' saves for an event loop (module docstring)."""

    def __init__(self, name: str = "config-writer"):
        self._cv = threading.Condition()
        # file -> (its newest text, the Futures of every save that text answers); insertion-ordered
        self._queued: dict[ConfigFile, tuple[str, list[concurrent.futures.Future]]] = {}
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, file: "ConfigFile", text: str) -> concurrent.futures.Future:
        """`text` for `file`, replacing a text of it still queued (whose saves it answers too)."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        with self._cv:
            assert not self._closed, "save() after Writer.close()"
            waiters = self._queued[file][1] if file in self._queued else []
            waiters.append(fut)
            self._queued[file] = (text, waiters)
            self._cv.notify()
        return fut

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._queued and not self._closed:
                    self._cv.wait()
                if not self._queued:
                    return                        # closed, and everything queued is written
                file = next(iter(self._queued))
                text, waiters = self._queued.pop(file)
            try:
                with file._write_lock:
                    file._write_locked(text)
            except BaseException as e:            # noqa: BLE001 - handed to every waiter
                log.error("config file %s not written: %s", file.path, e)
                for w in waiters:
                    w.set_exception(e)
            else:
                for w in waiters:
                    w.set_result(None)

    def close(self) -> None:
        """Writes every save queued so far, then ends the thread."""
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._thread.join()


class ConfigFile:
    """One JSON config file with a dict payload; written at once, or by `writer`'s thread."""

    def __init__(self, config_dir: str, name: str, writer: Writer | None = None):
        self.path = os.path.join(config_dir, name)
        self.writer = writer
        self._unwritten: str | None = None       # the text a full disk refused, until written
        self._write_lock = threading.Lock()      # one write at a time: a retry never undoes a newer save

    def load(self) -> dict:
        data = read_config(self.path)
        return data if isinstance(data, dict) else {}

    def save(self, data: dict) -> concurrent.futures.Future | None:
        """Writes `data`; on a full disk keeps it for later (module docstring).  With a writer,
        returns at once the Future of that write (its exception: an error other than a full
        disk); without one, writes before returning None."""
        text = json.dumps(data, indent=2, sort_keys=True)
        if self.writer is not None:
            return self.writer.submit(self, text)
        with self._write_lock:
            self._write_locked(text)
        return None

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
