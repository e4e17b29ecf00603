"""mq.store.configfile.Writer: config files written by a thread of their own (the broker's
supervisor must not wait for an fsync on its event loop).  Proves the promises its callers rely
on: a save's Future is done only once a text at least as new as that save's is on disk; saves
queued behind a write are written once, newest text (a group commit); a write error reaches
every Future it answers; a full disk keeps the text for later, as a direct save does."""
from __future__ import annotations

import errno
import json
import time

import pytest

from mq.store import configfile
from mq.store.configfile import ConfigFile, Writer


def test_saves_are_written_in_order_and_answered_once_on_disk(tmp_path, monkeypatch):
    written = []
    real = configfile.write_atomic

    def recording(path, text):
        written.append(json.loads(text)["n"])
        real(path, text)
    monkeypatch.setattr(configfile, "write_atomic", recording)
    w = Writer()
    f = ConfigFile(str(tmp_path), "t.json", w)
    try:
        with f._write_lock:              # the thread takes save 0, then waits here while 1..4 queue
            futs = [f.save({"n": 0})]
            deadline = time.monotonic() + 10
            while f in w._queued:        # not taken by the thread yet
                assert time.monotonic() < deadline, "the writer thread never took the save"
                time.sleep(0.001)
            futs += [f.save({"n": i}) for i in range(1, 5)]
            assert not any(x.done() for x in futs)
    finally:
        w.close()
    assert all(x.done() and x.exception() is None for x in futs)
    assert written == [0, 4]             # 1..4 were queued behind 0: one write, the newest text
    assert f.load() == {"n": 4}


def test_a_write_error_reaches_every_save_it_answers(tmp_path, monkeypatch):
    def failing(path, text):
        raise PermissionError(errno.EACCES, "read-only", path)
    monkeypatch.setattr(configfile, "write_atomic", failing)
    w = Writer()
    f = ConfigFile(str(tmp_path), "t.json", w)
    try:
        futs = [f.save({"n": i}) for i in range(3)]
        for x in futs:
            with pytest.raises(PermissionError):
                x.result(10)
    finally:
        w.close()


def test_a_full_disk_keeps_the_text_for_later_and_answers(tmp_path, monkeypatch):
    real = configfile.write_atomic

    def full(path, text):
        raise OSError(errno.ENOSPC, "No space left on device", path)
    monkeypatch.setattr(configfile, "write_atomic", full)
    w = Writer()
    f = ConfigFile(str(tmp_path), "t.json", w)
    try:
        assert f.save({"n": 1}).result(10) is None        # answered: the change is kept, as a direct save keeps it
        assert f._unwritten is not None
        monkeypatch.setattr(configfile, "write_atomic", real)
        assert configfile.retry_pending_writes() == 0
    finally:
        w.close()
    assert f.load() == {"n": 1}


def test_close_writes_what_is_queued(tmp_path):
    w = Writer()
    files = [ConfigFile(str(tmp_path), f"f{i}.json", w) for i in range(3)]
    for i, f in enumerate(files):
        for n in range(5):
            f.save({"n": n, "file": i})
    w.close()
    assert [f.load() for f in files] == [{"n": 4, "file": i} for i in range(3)]
    with pytest.raises(AssertionError):
        files[0].save({"n": 5})
