"""Recovery: torn tails and flipped bytes are cut at the first bad record and
never read; a clean stop rescans nothing; ConsumeQueues are rebuilt from the
CommitLog when they are lost or point past the recovered end."""
import os
import shutil

import pytest

from mq.store import MessageStore, StoreConfig
from mq.wire import commitlog as wcl

FS = 64 * 1024


def _fill(store, n, topic="R", queues=2):
    res = []
    for i in range(n):
        r = store.put(topic, i % queues, b"m%05d" % i + b"-" * (i % 500))
        assert r.ok
        res.append(r.result)
    assert store.wait_dispatched()
    return res


def _crash(store):
    """Leaves the store as a kill -9 would: no clean shutdown, abort file kept."""
    store._stop.set()
    for t in store._threads:
        t.join()
    store.cqs.close()
    store.cl.close()
    store.checkpoint.close()
    store.ctl.close()
    os.close(store._lock_fd)
    store._lock_fd = None


def _reopen(root, **kw):
    return MessageStore.open(StoreConfig(storePathRootDir=root, mappedFileSizeCommitLog=FS, **kw))


def _reopen_without_clean_mark(store):
    """Stops the store cleanly, then drops the checkpoint's clean mark (as an older store
    would have none), so the next open recovers in "normal" mode."""
    from mq.store.checkpoint import Checkpoint
    root = store.config.storePathRootDir
    store.close()
    cp = Checkpoint(os.path.join(root, "checkpoint"))
    cp.clear_clean()
    cp.close()
    return _reopen(root)


def _file_of(root, offset):
    return os.path.join(root, "commitlog", "%020d" % (offset - offset % FS))


def _readable(store, topic="R", queues=2):
    out = []
    for q in range(queues):
        qo = 0
        while qo < store.max_offset(topic, q):
            got = store.get_messages(topic, q, qo, 128)
            assert got
            for qoff, v in got:
                rec = wcl.parse_record(v, check_crc=True)
                out.append(rec.body[:6])
            qo += len(got)
    return out


def test_clean_stop_rescans_nothing(make_store):
    """After a clean stop the next open trusts the recorded end: no record is
    validated or re-dispatched, and everything is still there."""
    s = make_store(mappedFileSizeCommitLog=FS)
    root = s.config.storePathRootDir
    _fill(s, 400)
    end = s.cl.write_pos
    s.close()
    assert not os.path.exists(os.path.join(root, "abort"))
    s2 = _reopen(root)
    try:
        assert s2.recovery.mode == "clean"
        assert s2.recovery.records_validated == 0 and s2.recovery.records_redispatched == 0
        assert s2.cl.write_pos == end
        assert len(_readable(s2)) == 400
        assert s2.put("R", 0, b"next").result.queue_offset() == 200
    finally:
        s2.close()


def test_torn_tail_is_cut(make_store):
    """The last record half-written (its second half zero) is dropped; all
    records before it survive; the torn bytes are zeroed."""
    s = make_store(mappedFileSizeCommitLog=FS)
    root = s.config.storePathRootDir
    res = _fill(s, 300)
    last = res[-1]
    _crash(s)
    path = _file_of(root, last.phy_offset())
    with open(path, "r+b") as f:
        f.seek(last.phy_offset() % FS + last.size() // 2)
        f.write(b"\0" * (last.size() - last.size() // 2))
    s2 = _reopen(root)
    try:
        assert s2.recovery.mode == "abnormal"
        assert s2.recovery.stop == "bad crc" or s2.recovery.stop == "bad size"
        assert s2.cl.write_pos == last.phy_offset()
        bodies = _readable(s2)
        assert len(bodies) == 299 and b"m00299" not in bodies
        with open(path, "rb") as f:
            f.seek(last.phy_offset() % FS)
            assert f.read(last.size()) == b"\0" * last.size()
        r = s2.put("R", 1, b"again")
        assert r.result.phy_offset() == last.phy_offset() and r.result.queue_offset() == 149
    finally:
        s2.close()


def test_flipped_byte_in_the_middle_truncates_there(make_store):
    """A flipped body byte in the middle of the log: recovery stops at that
    record, reports it, cuts everything after (later files too), and no
    corrupt or later record is ever read."""
    s = make_store(mappedFileSizeCommitLog=FS)
    root = s.config.storePathRootDir
    res = _fill(s, 600)
    victim = res[250]
    _crash(s)
    with open(_file_of(root, victim.phy_offset()), "r+b") as f:
        pos = victim.phy_offset() % FS + 90
        f.seek(pos)
        b = f.read(1)
        f.seek(pos)
        f.write(bytes([b[0] ^ 0x40]))
    s2 = _reopen(root)
    try:
        rep = s2.recovery
        assert rep.stop == "bad crc"
        assert rep.end_offset == victim.phy_offset()
        assert rep.cq_entries_truncated == 350
        assert rep.removed_files, "files after the bad record are removed"
        bodies = _readable(s2)
        assert sorted(bodies) == [b"m%05d" % i for i in range(250)]
    finally:
        s2.close()


def test_normal_recovery_without_clean_mark_validates_the_tail(make_store):
    """No abort file but no clean mark (e.g. an older store): normal recovery
    validates from the third-last file and re-dispatches nothing."""
    s = make_store(mappedFileSizeCommitLog=FS)
    _fill(s, 1200)     # ~6 files, so the third-last is never the first
    s2 = _reopen_without_clean_mark(s)
    try:
        assert s2.recovery.mode == "normal"
        assert 0 < s2.recovery.records_validated < 1200
        assert s2.recovery.records_redispatched == 0
        assert len(_readable(s2)) == 1200
    finally:
        s2.close()


def test_normal_recovery_ignores_empty_trailing_files(make_store):
    """Normal recovery (no abort file, no clean mark) with three empty files after
    the one holding the end (files made ahead, or left by an HA truncation):
    the end is found inside the last file with data, not at the start of the
    third-last file, and the empty files are removed.  Before the fix the end
    landed past a stretch of zeros, which later reads took for data."""
    s = make_store(mappedFileSizeCommitLog=FS)
    _fill(s, 300)
    end = s.cl.write_pos
    assert end % FS, "the end is inside a file"
    last = end // FS
    for fi in (last + 1, last + 2, last + 3):
        s.cl.prepare_file(fi)
    s2 = _reopen_without_clean_mark(s)
    try:
        assert s2.recovery.mode == "normal"
        assert s2.cl.write_pos == end
        # removed (the preparer may create the next file again at once: it is empty)
        assert set(s2.recovery.removed_files) == {"%020d" % (fi * FS) for fi in (last + 1, last + 2, last + 3)}
        assert len(_readable(s2)) == 300
        assert s2.put("R", 0, b"after").ok, "appends continue at the real end"
        assert s2.wait_dispatched()
        assert len(_readable(s2)) == 301
    finally:
        s2.close()


@pytest.mark.parametrize("abort", [True, False])
def test_consume_queues_rebuilt_from_commitlog(make_store, abort):
    """With the consumequeue directory gone, the queues are rebuilt from the
    CommitLog (abnormal and normal start alike) with the same entries."""
    s = make_store(mappedFileSizeCommitLog=FS)
    root = s.config.storePathRootDir
    _fill(s, 300)
    before = {q: s.cqs.get("R", q).get(0, 1000) for q in range(2)}
    if abort:
        _crash(s)
    else:
        s.close()
        from mq.store.checkpoint import Checkpoint
        cp = Checkpoint(os.path.join(root, "checkpoint"))
        cp.clear_clean()
        cp.close()
    shutil.rmtree(os.path.join(root, "consumequeue"))
    s2 = _reopen(root)
    try:
        assert s2.recovery.records_redispatched == 300
        after = {q: s2.cqs.get("R", q).get(0, 1000) for q in range(2)}
        assert after == before
        assert s2.put("R", 0, b"x").result.queue_offset() == 150
    finally:
        s2.close()


def test_half_created_last_file_is_removed(make_store):
    """A last CommitLog file shorter than the configured size (creation cut
    short) holds no data and is removed; a wrong-size file elsewhere stops the open."""
    from mq.store import StoreError
    s = make_store(mappedFileSizeCommitLog=FS)
    root = s.config.storePathRootDir
    _fill(s, 50)
    s.close()
    files = sorted(os.listdir(os.path.join(root, "commitlog")))
    short = os.path.join(root, "commitlog", "%020d" % (int(files[-1]) + FS))
    with open(short, "wb") as f:
        f.write(b"\0" * 100)
    s2 = _reopen(root)
    assert os.path.basename(short) in s2.recovery.removed_files
    s2.close()
    with open(os.path.join(root, "commitlog", files[0]), "r+b") as f:
        f.truncate(FS // 2)
    with open(os.path.join(root, "commitlog", "%020d" % (int(files[-1]) + FS)), "wb") as f:
        f.truncate(FS)
    with pytest.raises(StoreError, match="has size"):
        _reopen(root)
