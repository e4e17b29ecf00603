"""Several processes appending to one store through the shared control block:
offsets come out dense and ordered, and a writer killed with SIGKILL (even
while it holds the append lock) does not wedge the others."""
import multiprocessing as mp
import os
import signal
import time

import pytest

from mq.store import MessageStore, StoreConfig
from mq.store import control as C
from mq.store.native import lib
from mq.wire import commitlog as wcl

QUEUES = 4
CTX = mp.get_context("spawn")


def _writer(root, file_size, writer_id, count, ready=None):
    cfg = StoreConfig(storePathRootDir=root, mappedFileSizeCommitLog=file_size)
    s = MessageStore.attach(cfg)
    if ready is not None:
        ready.set()
    for i in range(count):
        r = s.put("MP", i % QUEUES, b"w%d-%d" % (writer_id, i) + b"." * (i % 200))
        assert r.ok, r
    s.close()


def _hold_lock_then_wait(root, file_size, journal_bytes, ready):
    cfg = StoreConfig(storePathRootDir=root, mappedFileSizeCommitLog=file_size)
    s = MessageStore.attach(cfg, prepare_files=False)
    slot = s.ctl.queue_slot("MP", 0, create=True)
    if journal_bytes:
        # write one real record beyond write_pos, as an append would before publishing
        rec = wcl.build_record(body=b"journaled", topic="MP", queue_id=0,
                               queue_offset=s.ctl.queue_get(slot, C.Q_NEXT_OFFSET),
                               physical_offset=s.cl.write_pos, store_host="127.0.0.1", store_port=10911)
        assert len(rec) == journal_bytes
        view = s.cl.view_raw(s.cl.write_pos, len(rec))
        view[:] = rec
    assert lib.mq_ctl_debug_lock_and_hold(s.ctl.ptr, slot, journal_bytes) == 0
    ready.set()
    time.sleep(60)   # killed long before this ends


def _all_records(store):
    """Every (queue, queue offset, body) reachable through the ConsumeQueues."""
    out = []
    for q in range(QUEUES):
        n = store.max_offset("MP", q)
        qo = 0
        while qo < n:
            got = store.get_messages("MP", q, qo, 256)
            assert got, (q, qo, n)
            for qoff, view in got:
                rec = wcl.parse_record(view, check_crc=True)
                assert rec.queue_offset == qoff and rec.queue_id == q
                out.append((q, qoff, rec.body))
            qo += len(got)
    return out


def _assert_dense(store):
    recs = _all_records(store)
    for q in range(QUEUES):
        offs = [o for qq, o, _ in recs if qq == q]
        assert offs == list(range(len(offs))), f"queue {q} has gaps or repeats"
    return recs


@pytest.mark.parametrize("file_size", [64 * 1024, 1024 * 1024])
def test_two_processes_append_concurrently(make_store, file_size):
    """Two writer processes + the owner: every message found exactly once,
    queue offsets dense per queue, physical offsets increasing."""
    s = make_store(mappedFileSizeCommitLog=file_size)
    root = s.config.storePathRootDir
    procs = [CTX.Process(target=_writer, args=(root, file_size, w, 1500)) for w in (1, 2)]
    for p in procs:
        p.start()
    for i in range(500):
        assert s.put("MP", i % QUEUES, b"w0-%d" % i).ok
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert s.wait_dispatched()
    recs = _assert_dense(s)
    bodies = [b.split(b".")[0] for _, _, b in recs]
    expected = {b"w0-%d" % i for i in range(500)} | {b"w%d-%d" % (w, i) for w in (1, 2) for i in range(1500)}
    assert len(bodies) == len(expected) == len(set(bodies))
    assert set(bodies) == expected


def test_kill_9_writer_mid_stream_others_continue(make_store):
    """A writer killed with SIGKILL mid-stream leaves no gap and no stuck lock:
    the other writer finishes, and everything in the log is valid."""
    fs = 64 * 1024
    s = make_store(mappedFileSizeCommitLog=fs)
    root = s.config.storePathRootDir
    ready = CTX.Event()
    victim = CTX.Process(target=_writer, args=(root, fs, 1, 10 ** 6, ready))
    victim.start()
    assert ready.wait(30)
    time.sleep(0.3)
    os.kill(victim.pid, signal.SIGKILL)
    victim.join()
    survivor = CTX.Process(target=_writer, args=(root, fs, 2, 800))
    survivor.start()
    survivor.join(60)
    assert survivor.exitcode == 0
    assert s.put("MP", 0, b"owner-after").ok
    assert s.wait_dispatched()
    recs = _assert_dense(s)
    assert sum(1 for _, _, b in recs if b.startswith(b"w2-")) == 800


@pytest.mark.parametrize("journal", [False, True], ids=["no-journal", "complete-journal"])
def test_writer_killed_holding_the_lock(make_store, journal):
    """A process killed while holding the append lock: the next append gets the
    lock (robust mutex), drops an unpublished append, or replays a complete
    journal, and offsets stay dense either way."""
    fs = 64 * 1024
    s = make_store(mappedFileSizeCommitLog=fs)
    root = s.config.storePathRootDir
    for i in range(10):
        assert s.put("MP", 0, b"before-%d" % i).ok
    size = len(wcl.build_record(body=b"journaled", topic="MP")) if journal else 0
    ready = CTX.Event()
    holder = CTX.Process(target=_hold_lock_then_wait, args=(root, fs, size, ready))
    holder.start()
    assert ready.wait(30)
    os.kill(holder.pid, signal.SIGKILL)
    holder.join()
    r = s.put("MP", 0, b"after")
    assert r.ok
    assert s.ctl.stat(0) >= 1, "the robust mutex reported the dead owner"
    assert s.ctl.stat(1) == (1 if journal else 0)
    assert r.result.queue_offset() == (11 if journal else 10)
    assert s.wait_dispatched()
    recs = _assert_dense(s)
    bodies = [b for q, _, b in recs if q == 0]
    assert bodies[-1] == b"after"
    assert (b"journaled" in bodies) == journal


def _owner_then_crash(root, fs, ready):
    cfg = StoreConfig(storePathRootDir=root, mappedFileSizeCommitLog=fs)
    s = MessageStore.open(cfg)
    i = 0
    while True:
        s.put("MP", i % QUEUES, b"c-%d" % i + b"x" * (i % 300))
        i += 1
        if i == 500:
            ready.set()


def test_recovery_after_kill_9_of_the_owner_gives_a_valid_prefix(tmp_path):
    """The owning process killed mid-stream: the next open recovers abnormally
    to a valid prefix whose queues are dense and whose records all check."""
    fs = 64 * 1024
    root = str(tmp_path / "store")
    ready = CTX.Event()
    p = CTX.Process(target=_owner_then_crash, args=(root, fs, ready))
    p.start()
    assert ready.wait(30)
    time.sleep(0.2)
    os.kill(p.pid, signal.SIGKILL)
    p.join()
    assert os.path.exists(os.path.join(root, "abort"))
    s = MessageStore.open(StoreConfig(storePathRootDir=root, mappedFileSizeCommitLog=fs))
    try:
        assert s.recovery.mode == "abnormal"
        recs = _assert_dense(s)
        assert len(recs) >= 500
        bodies = sorted(int(b.split(b"-")[1].rstrip(b"x")) for _, _, b in recs)
        assert bodies == list(range(len(bodies))), "the recovered log is a prefix of what was sent"
        assert s.put("MP", 0, b"new").ok
    finally:
        s.close()
