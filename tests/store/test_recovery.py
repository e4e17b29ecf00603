"""Recovery: torn tails and flipped bytes are cut at the first bad record and
never read, a clean start included; files cut short are extended and keep the
records before the cut; ConsumeQueues are rebuilt from the CommitLog when they
are lost, cut, or point past the recovered end, and queue offsets are never
handed out twice."""
import os
import shutil

import pytest

from mq.store import CorruptRecord, MessageStore, StoreConfig, control as C
from mq.wire import commitlog as wcl
from tests.store.storekit import crash, flip_byte

FS = 64 * 1024


def _fill(store, n, topic="R", queues=2):
    res = []
    for i in range(n):
        r = store.put(topic, i % queues, b"m%05d" % i + b"-" * (i % 500))
        assert r.ok
        res.append(r.result)
    assert store.wait_dispatched()
    return res


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


def test_clean_stop_still_validates_and_redispatches_nothing(make_store):
    """After a clean stop the next open still validates the last three files (a missing
    abort file proves nothing about the bytes), re-dispatches nothing, and everything is
    still there."""
    s = make_store(mappedFileSizeCommitLog=FS)
    root = s.config.storePathRootDir
    _fill(s, 400)
    end = s.cl.write_pos
    s.close()
    assert not os.path.exists(os.path.join(root, "abort"))
    s2 = _reopen(root)
    try:
        assert s2.recovery.mode == "clean"
        assert s2.recovery.records_validated == 400 and s2.recovery.records_redispatched == 0
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
    crash(s)
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
    crash(s)
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
        crash(s)
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


def test_half_created_last_file_is_extended_then_removed_and_a_longer_file_stops_the_open(make_store):
    """A last CommitLog file shorter than the configured size (creation cut short) is
    extended, holds no record and is removed as an empty trailing file; a file longer than
    mappedFileSizeCommitLog is a configuration that changed: the open stops with one line."""
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
    assert len(_readable(s2)) == 50
    s2.close()
    with open(os.path.join(root, "commitlog", files[0]), "r+b") as f:
        f.truncate(FS * 2)
    with pytest.raises(StoreError, match="has size"):
        _reopen(root)


def _cut_mid_record(root, rec, keep_next_file: bool):
    """Cuts the file holding `rec` in the middle of it; keep_next_file: an empty next file
    (as the preparer makes ahead) stays after it, else every later file is gone."""
    path = _file_of(root, rec.phy_offset())
    with open(path, "r+b") as f:
        f.truncate(rec.phy_offset() % FS + rec.size() // 2)
    start = rec.phy_offset() - rec.phy_offset() % FS
    for name in os.listdir(os.path.join(root, "commitlog")):
        if int(name) > start:
            os.unlink(os.path.join(root, "commitlog", name))
    if keep_next_file:
        with open(os.path.join(root, "commitlog", "%020d" % (start + FS)), "wb") as f:
            f.truncate(FS)


@pytest.mark.parametrize("keep_next_file", [True, False])
@pytest.mark.parametrize("clean", [True, False])
def test_a_file_cut_mid_record_keeps_every_record_before_the_cut(make_store, keep_next_file, clean):
    """Proves the short-file repair: the last data file cut in the middle of a record (after a
    clean stop or a crash, with or without an empty next file) is extended, recovery truncates
    at the cut record, and every record before it is kept and readable; appends go on at the
    cut.  (Before: with a next file the open stopped with a traceback; without one the file
    was deleted whole, with the intact records before the cut.)"""
    s = make_store(mappedFileSizeCommitLog=FS)
    root = s.config.storePathRootDir
    res = _fill(s, 400)
    victim = res[-30]
    if clean:
        s.close()
    else:
        crash(s)
    _cut_mid_record(root, victim, keep_next_file)
    s2 = _reopen(root)
    try:
        rep = s2.recovery
        assert any("cut short: extended" in line for line in rep.repaired), rep
        assert s2.cl.write_pos == victim.phy_offset()
        kept = [r for r in res if r.phy_offset() < victim.phy_offset()]
        assert sorted(_readable(s2)) == sorted(b"m%05d" % i for i in range(len(kept)))
        assert rep.cq_entries_truncated == (30 if clean else rep.cq_entries_truncated)
        assert s2.put("R", 0, b"after-cut").result.phy_offset() == victim.phy_offset()
    finally:
        s2.close()


@pytest.mark.parametrize("damage", ["body byte", "magic byte", "zeroed tail"])
def test_a_clean_start_catches_damage_in_the_last_files(make_store, damage):
    """Proves start-up validation after a clean stop: a flipped body byte (bad CRC), a flipped
    MAGIC byte, or a zeroed tail in the last file is found, the log is truncated at the first
    damaged record, what that cost is reported, and no damaged byte is ever read.  (Before: a
    clean stop's mark was trusted and the damage was served.)"""
    s = make_store(mappedFileSizeCommitLog=FS)
    root = s.config.storePathRootDir
    res = _fill(s, 400)
    victim = res[-20]
    s.close()
    with open(_file_of(root, victim.phy_offset()), "r+b") as f:
        at = victim.phy_offset() % FS + {"body byte": 100, "magic byte": 5, "zeroed tail": 0}[damage]
        f.seek(at)
        if damage == "zeroed tail":
            f.write(b"\0" * (FS - at))
        else:
            b = f.read(1)
            f.seek(at)
            f.write(bytes([b[0] ^ 0x10]))
    s2 = _reopen(root)
    try:
        rep = s2.recovery
        assert rep.mode == "clean"
        assert rep.end_offset == victim.phy_offset(), rep
        assert rep.cq_entries_truncated == 20
        assert rep.dropped_bytes > 0 or damage == "zeroed tail"
        assert sorted(_readable(s2)) == sorted(b"m%05d" % i for i in range(380))
    finally:
        s2.close()


def test_a_deleted_consume_queue_is_rebuilt_and_no_queue_offset_is_reused(make_store):
    """Proves the ConsumeQueue check at start: one queue's directory deleted while the broker
    was stopped cleanly (its records far older than the last three files, so no re-dispatch
    reaches them) is rebuilt from the CommitLog with the same entries, and the next send to it
    gets the next offset, not 0.  (Before: the queue served nothing and new sends reused taken
    queue offsets.)"""
    s = make_store(mappedFileSizeCommitLog=FS)
    root = s.config.storePathRootDir
    _fill(s, 300, topic="Old", queues=2)
    _fill(s, 1500, topic="New", queues=2)     # many files: Old's records are not in the last three
    before = {q: s.cqs.get("Old", q).get(0, 1000) for q in range(2)}
    s.close()
    shutil.rmtree(os.path.join(root, "consumequeue", "Old", "1"))
    s2 = _reopen(root)
    try:
        assert s2.recovery.queues_rebuilt == ["Old:1"]
        assert {q: s2.cqs.get("Old", q).get(0, 1000) for q in range(2)} == before
        assert s2.put("Old", 1, b"next").result.queue_offset() == 150
        assert len(_readable(s2, "New")) == 1500
    finally:
        s2.close()


@pytest.mark.parametrize("stop", ["clean", "crash"])
@pytest.mark.parametrize("damage", ["hole", "wrong records", "short file", "missing file", "first file missing"])
def test_a_damaged_consume_queue_is_rebuilt(make_store, damage, stop):
    """A queue whose entries have a hole in the middle (a zeroed range), point at records that
    are not its own, whose file was cut short, or whose middle or first file is missing, is
    rebuilt from the CommitLog: every entry is its own record again and nothing is lost.  The
    queue here was born after the store's last start, so the manifest of that start does not
    know it: a crash leaves it unlisted, and it must start at 0."""
    s = make_store(mappedFileSizeCommitLog=FS, mappedFileSizeConsumeQueue=20 * 64)
    root = s.config.storePathRootDir
    _fill(s, 600, topic="D", queues=2)
    before = {q: s.cqs.get("D", q).get(0, 1000) for q in range(2)}
    s.close() if stop == "clean" else crash(s)
    qdir = os.path.join(root, "consumequeue", "D", "0")
    names = sorted(os.listdir(qdir))
    if damage == "hole":
        with open(os.path.join(qdir, names[-1]), "r+b") as f:
            f.seek(20 * 3)
            f.write(b"\0" * 20 * 5)
    elif damage == "wrong records":
        other = os.path.join(root, "consumequeue", "D", "1", names[-1])
        shutil.copyfile(other, os.path.join(qdir, names[-1]))
    elif damage == "short file":
        with open(os.path.join(qdir, names[-1]), "r+b") as f:
            f.truncate(20 * 10)
    elif damage == "missing file":
        os.unlink(os.path.join(qdir, names[1]))
    else:
        os.unlink(os.path.join(qdir, names[0]))
    s2 = _reopen(root, mappedFileSizeConsumeQueue=20 * 64)
    try:
        assert s2.recovery.queues_rebuilt == ["D:0"], s2.recovery
        assert {q: s2.cqs.get("D", q).get(0, 1000) for q in range(2)} == before
        assert sorted(_readable(s2, "D")) == sorted(b"m%05d" % i for i in range(600))
    finally:
        s2.close()


def test_the_zero_tail_check_sees_one_stray_byte_anywhere(tmp_path):
    """The check behind "entries follow a hole" compares a MiB at a time: one non-zero byte at
    either edge of a chunk, or in the short last chunk, is found; bytes before `at` are not
    looked at."""
    from mq.store.consumequeue import _zeros_from
    import mmap
    size = 2 * 1024 * 1024 + 4000
    path = tmp_path / "q"
    path.write_bytes(bytes(size))
    with open(path, "r+b") as f, mmap.mmap(f.fileno(), size) as mm:
        assert _zeros_from(mm, 0) and _zeros_from(mm, size)
        for at in (0, 1024 * 1024 - 1, 1024 * 1024, size - 1):
            mm[at] = 7
            assert not _zeros_from(mm, 0) and not _zeros_from(mm, at)
            assert _zeros_from(mm, at + 1)
            mm[at] = 0


def test_a_queue_rebuilt_after_retention_starts_with_fillers_and_is_trusted_at_the_next_start(make_store):
    """A ConsumeQueue lost while its first CommitLog files are already deleted by retention is
    rebuilt from the first record left, whose queue offset is past the start of its queue file:
    the file gets FILLER entries before it (RocketMQ's fillPreBlank), so the next start reads
    the queue's bounds from its files and trusts it.  (Before: the entries before it were zero,
    recovery saw the queue end there, and rebuilt it again at every start.)"""
    from mq.store.retention import Retention
    s = make_store(mappedFileSizeCommitLog=FS, mappedFileSizeConsumeQueue=20 * 64, fileReservedTime=1)
    root = s.config.storePathRootDir
    _fill(s, 1500, topic="R", queues=2)
    s.cl.flush(0)
    assert Retention(s, usage_fn=lambda _: 0.99).run_once(force=True)
    bounds = {q: (s.min_offset("R", q), s.max_offset("R", q)) for q in range(2)}
    assert all(lo % 64 for lo, _ in bounds.values()), bounds         # starts inside a queue file
    s.close()
    shutil.rmtree(os.path.join(root, "consumequeue", "R", "1"))
    s2 = _reopen(root, mappedFileSizeConsumeQueue=20 * 64)
    try:
        assert s2.recovery.queues_rebuilt == ["R:1"]
        assert {q: (s2.min_offset("R", q), s2.max_offset("R", q)) for q in range(2)} == bounds
    finally:
        s2.close()
    s3 = _reopen(root, mappedFileSizeConsumeQueue=20 * 64)
    try:
        assert s3.recovery.queues_rebuilt == []
        assert {q: (s3.min_offset("R", q), s3.max_offset("R", q)) for q in range(2)} == bounds
        assert s3.put("R", 1, b"next").result.queue_offset() == bounds[1][1]
    finally:
        s3.close()


def _patch(root, rec, at, data: bytes) -> None:
    """Writes data at byte `at` of the record `rec` (a PutResult) in its CommitLog file."""
    with open(_file_of(root, rec.phy_offset()), "r+b") as f:
        f.seek(rec.phy_offset() % FS + at)
        f.write(data)


# Fields no checksum covers (BODYCRC covers the body only) that hold a value no append writes.
IMPOSSIBLE_FIELDS = {
    "topic not UTF-8": lambda rec: (88 + int.from_bytes(rec[84:88], "big") + 1, b"\xd0"),
    "topic outside [%|a-zA-Z0-9_-]": lambda rec: (88 + int.from_bytes(rec[84:88], "big") + 1, b"\x12"),
    "negative QUEUEID": lambda rec: (wcl.POS_QUEUE_ID, b"\x80"),
    "negative QUEUEOFFSET": lambda rec: (wcl.POS_QUEUE_OFFSET, b"\x80"),
}


@pytest.mark.parametrize("field", sorted(IMPOSSIBLE_FIELDS))
def test_a_record_whose_queue_fields_no_append_writes_is_cut_there(make_store, field):
    """Proves the record check covers the fields the store files a record by: a record whose
    TOPIC, QUEUEID or QUEUEOFFSET holds a value no append writes is damaged, like one whose body
    fails its CRC -- recovery cuts the log there ("bad field") and serves every record before it.
    (Before: a topic byte that is not UTF-8 crashed recovery with a UnicodeDecodeError, a
    negative QUEUEOFFSET with an AssertionError naming a ConsumeQueue file, and a negative
    QUEUEID made a queue of its own; the randomized recovery property found them.)"""
    s = make_store(mappedFileSizeCommitLog=FS)
    root = s.config.storePathRootDir
    res = _fill(s, 600)
    victim = res[560]
    written = bytes(s.cl.read_record(victim.phy_offset(), victim.size()))
    crash(s)
    _patch(root, victim, *IMPOSSIBLE_FIELDS[field](written))
    s2 = _reopen(root)
    try:
        assert (s2.recovery.stop, s2.recovery.end_offset) == ("bad field", victim.phy_offset()), s2.recovery
        assert sorted(_readable(s2)) == [b"m%05d" % i for i in range(560)]
        assert s2.put("R", 0, b"next").result.queue_offset() == 280
    finally:
        s2.close()


@pytest.mark.parametrize("queue_offset", [279, 280 + 1024], ids=["another record's", "past what the log holds"])
def test_a_record_whose_queue_offset_was_damaged_in_range_is_left_out_of_its_queue(make_store, caplog,
                                                                                   queue_offset):
    """Proves dispatch checks a QUEUEOFFSET it did not expect: re-dispatched after a crash, a
    record whose QUEUEOFFSET was damaged to another record's offset (279 for 280) does not take
    that record's entry, and one damaged past anything the CommitLog before it can hold does not
    move its queue's end; each is left out of every queue with one line, and every other record
    is served at its own offset.  (Before: the first overwrote record 279's entry, so the intact
    record was lost and the damaged one served in its place; the second put the queue's end at
    1305, and new sends got offsets from there.)"""
    s = make_store(mappedFileSizeCommitLog=FS)
    root = s.config.storePathRootDir
    res = _fill(s, 600)
    victim = res[560]                       # queue 0, offset 280, in the last file: re-dispatched
    assert victim.queue_offset() == 280
    crash(s)
    _patch(root, victim, wcl.POS_QUEUE_OFFSET, queue_offset.to_bytes(8, "big"))
    with caplog.at_level("ERROR", logger="mq.store.dispatch"):
        s2 = _reopen(root)
    try:
        lines = [r.getMessage() for r in caplog.records if "left out of every ConsumeQueue" in r.getMessage()]
        assert len(lines) == 1 and f"the record at {victim.phy_offset()} names R:0 queue offset {queue_offset}" \
            in lines[0], lines
        assert s2.dispatcher.records_refused == 1
        assert s2.max_offset("R", 0) == 300
        served = {}
        for q in range(2):
            for qo in range(300):
                for at, view in s2.get_messages("R", q, qo, 1):
                    served[(q, at)] = wcl.parse_record(view, check_crc=True).body[:6]
        assert sorted(served.values()) == [b"m%05d" % i for i in range(600) if i != 560]
        assert all(body == b"m%05d" % (2 * qo + q) for (q, qo), body in served.items())
        (at, view), = s2.get_messages("R", 0, 279, 1)
        assert (at, bytes(view)) == (279, bytes(s2.cl.read_record(res[558].phy_offset(), res[558].size())))
        assert s2.put("R", 0, b"next").result.queue_offset() == 300
    finally:
        s2.close()


@pytest.mark.parametrize("queue_offset", [279, 280 + 1024], ids=["another record's", "past what the log holds"])
def test_a_record_left_out_of_every_queue_is_not_served_by_its_offset_either(make_store, queue_offset):
    """Proves MessageStore.read_filed, the read of those who hold an offset and not a queue
    position (the message index, an offset msgId, send-back, END_TRANSACTION): the record the test
    above leaves out of every queue is whole to read_record (its body's CRC holds) and the message
    index keeps its keys from before the crash, but it is not where its fields file it, so
    read_filed refuses it; every other record is served, one whose ConsumeQueue entry is damaged
    after the start too (its record found by the damaged-entry search, as a pull finds it).  (Before: a query by
    key and viewMessageById served the damaged record.)"""
    s = make_store(mappedFileSizeCommitLog=FS)
    root = s.config.storePathRootDir
    res = _fill(s, 600)
    victim = res[560]                       # queue 0, offset 280, in the last file: re-dispatched
    crash(s)
    _patch(root, victim, wcl.POS_QUEUE_OFFSET, queue_offset.to_bytes(8, "big"))
    s2 = _reopen(root)
    try:
        assert s2.dispatcher.records_refused == 1
        _flip_entry_phy(root, "R", 1, 5, bit=1)             # record 11's entry, under the open store
        assert s2.cqs.get("R", 1).entry(5)[0] != res[11].phy_offset()
        assert wcl.parse_record(s2.read_record(victim.phy_offset()), check_crc=True).queue_offset == queue_offset
        with pytest.raises(CorruptRecord, match=f"the record at {victim.phy_offset()} says R:0 queue offset "
                                                f"{queue_offset}, where that queue serves"):
            s2.read_filed(victim.phy_offset())
        served = [wcl.parse_record(s2.read_filed(r.phy_offset()), check_crc=True).body[:6]
                  for i, r in enumerate(res) if i != 560]
        assert served == [b"m%05d" % i for i in range(600) if i != 560]
    finally:
        s2.close()


def test_a_queue_whose_records_were_all_cut_restarts_at_its_first_offset(make_store):
    """Proves an empty recovered log empties every queue the same way: the first record damaged
    (everything cut) and the queue's first ConsumeQueue file deleted leaves it at [0, 0), as
    when that file is kept.  (Before: the files after the deleted one survived empty and the
    queue read [32, 32), because the queues were checked against the manifest only when the
    log held a record; a log that starts at 0 tells what every queue holds even when empty.)"""
    s = make_store(mappedFileSizeCommitLog=FS, mappedFileSizeConsumeQueue=20 * 32)
    root = s.config.storePathRootDir
    res = _fill(s, 100, queues=1)
    s.close()
    _patch(root, res[0], 0, b"\xff")       # TOTALSIZE
    os.unlink(os.path.join(root, "consumequeue", "R", "0", "%020d" % 0))
    s2 = _reopen(root, mappedFileSizeConsumeQueue=20 * 32)
    try:
        assert s2.recovery.end_offset == 0
        assert (s2.min_offset("R", 0), s2.max_offset("R", 0)) == (0, 0)
        assert s2.put("R", 0, b"again").result.queue_offset() == 0
    finally:
        s2.close()


@pytest.mark.parametrize("damage", ["bad magic", "zeroed", "cut"])
def test_a_queue_rebuilt_over_a_damaged_file_keeps_the_records_after_the_damage(make_store, caplog, damage):
    """Proves recovery's walks go past damage in files it did not validate: a queue lost while
    the broker was stopped is rebuilt from the whole CommitLog, and a record in the first file
    whose MAGIC was flipped, a range of it zeroed, or the file cut inside it, costs the records
    it covers -- the walk goes on at the next whole record (one line says what was skipped), so
    every other record is in the queue at its own offset, the gaps are fillers (across
    ConsumeQueue files too: the next start trusts the queue), and new sends continue after the
    last one.  (Before: the open failed with "dispatch stopped at ...: bad magic", or a hole of
    zeros ended the rebuilt queue there and new sends reused the queue offsets of the records
    after it.)"""
    cq_size = 20 * 32                       # a cut file's records span several ConsumeQueue files
    s = make_store(mappedFileSizeCommitLog=FS, mappedFileSizeConsumeQueue=cq_size)
    root = s.config.storePathRootDir
    res = _fill(s, 1500)
    s.close()
    victim = res[20]                        # queue 0, offset 10, in the first file
    if damage == "bad magic":
        _patch(root, victim, 4, b"\0")
        lost = {20}
    elif damage == "zeroed":
        _patch(root, victim, 0, bytes(victim.size() + res[21].size()))
        lost = {20, 21}
    else:
        with open(_file_of(root, victim.phy_offset()), "r+b") as f:
            f.truncate(victim.phy_offset() % FS + 10)
        lost = {i for i, r in enumerate(res) if victim.phy_offset() <= r.phy_offset() < FS}
    shutil.rmtree(os.path.join(root, "consumequeue", "R", "0"))
    shutil.rmtree(os.path.join(root, "consumequeue", "R", "1"))
    with caplog.at_level("ERROR", logger="mq.store.dispatch"):
        s2 = _reopen(root, mappedFileSizeConsumeQueue=cq_size)
    try:
        assert sorted(s2.recovery.queues_rebuilt) == ["R:0", "R:1"]
        lines = [r.getMessage() for r in caplog.records if "bytes skipped to the next whole record" in r.getMessage()]
        assert len(lines) == 1 and lines[0].startswith(f"dispatch: the CommitLog is damaged at {victim.phy_offset()}")
        kept = [i for i in range(1500) if i not in lost]
        for i in kept:
            (at, view), = s2.get_messages("R", i % 2, i // 2, 1)
            assert at == i // 2 and wcl.parse_record(view, check_crc=True).body.startswith(b"m%05d" % i)
        for i in lost:
            assert s2.cqs.get("R", i % 2).get_raw(i // 2) == (0, 0x7FFFFFFF, 0)     # a filler
        assert [s2.max_offset("R", q) for q in range(2)] == [750, 750]
        assert s2.put("R", 0, b"next").result.queue_offset() == 750
    finally:
        s2.close()
    s3 = _reopen(root, mappedFileSizeConsumeQueue=cq_size)
    try:
        assert s3.recovery.queues_rebuilt == []
        assert [s3.max_offset("R", q) for q in range(2)] == [751, 750]
    finally:
        s3.close()


def test_a_rebuilt_queue_makes_no_file_for_a_damaged_queue_offset(make_store, caplog):
    """Proves a gap is checked before a ConsumeQueue file is made for it: a queue rebuilt from
    the CommitLog whose first record's QUEUEOFFSET had bit 56 flipped leaves that record out
    (one line) and makes no file at 2^56 entries; the other records keep their offsets and the
    hole is a filler.  (Before the check came first, the file was made, and the queue's bounds
    read [2^56, 0) -- the randomized recovery property's example.)"""
    s = make_store(mappedFileSizeCommitLog=FS)
    root = s.config.storePathRootDir
    res = _fill(s, 10, queues=1)
    s.close()
    _patch(root, res[0], wcl.POS_QUEUE_OFFSET, (1 << 56).to_bytes(8, "big"))
    shutil.rmtree(os.path.join(root, "consumequeue", "R", "0"))
    with caplog.at_level("ERROR", logger="mq.store.dispatch"):
        s2 = _reopen(root)
    try:
        assert s2.recovery.queues_rebuilt == ["R:0"]
        assert any(f"names R:0 queue offset {1 << 56}" in r.getMessage() for r in caplog.records)
        assert os.listdir(os.path.join(root, "consumequeue", "R", "0")) == ["%020d" % 0]
        assert (s2.min_offset("R", 0), s2.max_offset("R", 0)) == (0, 10)
        assert s2.cqs.get("R", 0).get_raw(0) == (0, 0x7FFFFFFF, 0)
        assert [at for at, _ in s2.get_messages("R", 0, 0, 32)] == list(range(1, 10))
    finally:
        s2.close()


def _flip_entry_phy(root, topic, qid, queue_offset, bit=0):
    """Flips a bit of the top byte of ConsumeQueue entry queue_offset's PHYSICALOFFSET: it then
    points far past the CommitLog's end (default-sized queue files: one file)."""
    assert flip_byte(os.path.join(root, "consumequeue", topic, str(qid), "%020d" % 0), queue_offset * 20, 1 << bit)


@pytest.mark.parametrize("which", ["last entry, clean stop", "middle entry, crash", "last entry, crash"])
def test_an_entry_damaged_to_point_past_the_end_is_not_taken_for_a_cut_log(make_store, which):
    """Proves recovery tells a ConsumeQueue entry damaged to point past the log's end from one a
    crash or a cut log left: after a clean stop whose end the files still reach nothing can lie
    past it (the queue is rebuilt); an entry past the end before entries that are not is damaged,
    not a tail (kept; the read path finds its record); and after a crash, a last entry past the
    end whose record is found after the queue's previous one, before the files re-dispatched, gets
    its queue rebuilt.  Every message stays served at its offset.  (Before: the binary search cut
    every entry from the damaged one on, and those messages were lost -- the randomized recovery
    property's example was the first, with one message in the queue.)"""
    s = make_store(mappedFileSizeCommitLog=FS)
    root = s.config.storePathRootDir
    middle = which.startswith("middle")
    # the middle one lies before the 1024 tail entries recovery checks, where a binary search for the
    # cut probes first
    n = 2100 if middle else 40
    old = _fill(s, n, topic="Old", queues=1)
    _fill(s, 1500, topic="New", queues=2)          # many files: Old's records are not re-dispatched
    if which == "last entry, clean stop":
        s.close()
    else:
        last_ts = s.ctl.get(C.POS_LAST_STORE_TS)
        crash(s)
        # a checkpoint written a while after the last record (recovery starts 3 s before it): the
        # crash re-dispatches the last file only
        from mq.store.checkpoint import Checkpoint
        cp = Checkpoint(os.path.join(root, "checkpoint"))
        cp.physic_ts_ms = cp.logics_ts_ms = last_ts + 3001
        cp.flush()
        cp.close()
    _flip_entry_phy(root, "Old", 0, n // 2 if middle else n - 1)
    s2 = _reopen(root)
    try:
        rep = s2.recovery
        assert rep.start_offset > old[-1].phy_offset(), rep          # Old lies before what is re-dispatched
        assert rep.queues_rebuilt == ([] if middle else ["Old:0"]), rep
        assert s2.max_offset("Old", 0) == n
        got = [(at, wcl.parse_record(v, check_crc=True).body[:6]) for qo in range(n)
               for at, v in s2.get_messages("Old", 0, qo, 1)]
        assert got == [(i, b"m%05d" % i) for i in range(n)]
        assert len(_readable(s2, "New")) == 1500
    finally:
        s2.close()


def test_an_entry_damaged_past_the_end_is_not_cut_with_a_tail_that_damage_cut_after_a_clean_stop(make_store):
    """Proves the same after a clean stop whose log damage cut short (the end the stop recorded is
    not reached, so entries past the recovered end may be the cut tail's): record 61's body is
    flipped, so the log ends before it, and queue 2's entry 19 (record 59, before the cut) is
    damaged to point past the end.  Entry 20 (record 62, after the cut) goes with the tail; entry
    19's record is found in the log after entry 18's, so queue 2 is rebuilt and keeps offset 19,
    and the next message there gets 20.  (Before: only a crash searched, so entry 19 was cut as
    tail -- the intact message lost and its offset given again; found by the randomized recovery
    property, blob b'AEEDQT9BAAEBQQFBAEIZ30EAAUEHQgDOQQBCAXxBAAA='.)"""
    s = make_store(mappedFileSizeCommitLog=FS)
    root = s.config.storePathRootDir
    res = _fill(s, 63, queues=3)
    s.close()
    _patch(root, res[61], res[61].size() - 10, b"\xff")                 # a body byte: BODYCRC fails
    _flip_entry_phy(root, "R", 2, 19)
    s2 = _reopen(root)
    try:
        rep = s2.recovery
        assert (rep.mode, rep.stop, rep.end_offset) == ("clean", "bad crc", res[61].phy_offset()), rep
        assert rep.queues_rebuilt == ["R:2"], rep
        assert s2.max_offset("R", 2) == 20
        got = [(at, wcl.parse_record(v, check_crc=True).body[:6]) for qo in range(20)
               for at, v in s2.get_messages("R", 2, qo, 1)]
        assert got == [(qo, b"m%05d" % (3 * qo + 2)) for qo in range(20)]
        assert s2.put("R", 2, b"next").result.queue_offset() == 20
    finally:
        s2.close()


def test_a_damaged_entry_is_found_past_another_damaged_record(make_store):
    """Proves the damaged-entry search walks past damage in its window: with three queues, queue
    0's entry 11 (record 33) has its size flipped, and record 32 (queue 2), between record 31 and
    it in the window the entries 10 and 12 bound, has a bad MAGIC (all in the first file, which a
    clean start does not validate).  Record 33 is still found and served; record 32 is not.
    (Before: the walk stopped at record 32 and message 33 was skipped.)"""
    s = make_store(mappedFileSizeCommitLog=FS)
    root = s.config.storePathRootDir
    res = _fill(s, 1500, queues=3)
    s.close()
    _patch(root, res[32], 4, b"\0")                                     # MAGIC
    with open(os.path.join(root, "consumequeue", "R", "0", "%020d" % 0), "r+b") as f:
        f.seek(11 * 20 + 8 + 3)                                         # entry 11's SIZE, low byte
        b = f.read(1)
        f.seek(11 * 20 + 8 + 3)
        f.write(bytes([b[0] ^ 4]))
    s2 = _reopen(root)
    try:
        assert s2.recovery.end_offset == res[-1].end_offset
        (at, view), = s2.get_messages("R", 0, 11, 1)
        assert at == 11 and wcl.parse_record(view, check_crc=True).body.startswith(b"m00033")
        assert s2.get_messages("R", 2, 10, 1) == []
    finally:
        s2.close()


def _fill_even(store, n, queues=2):
    """n records of one size (so an entry can be damaged to name another queue's record whole)."""
    res = [store.put("R", i % queues, b"m%05d" % i + b"-" * 100) for i in range(n)]
    assert all(r.ok for r in res) and store.wait_dispatched()
    return [r.result for r in res]


def _entry_path(root, qid):
    return os.path.join(root, "consumequeue", "R", str(qid), "%020d" % 0)


def _served(store, queues=2):
    """{(queue, queue offset): the first 6 body bytes} of every record served."""
    out = {}
    for q in range(queues):
        for qo in range(store.max_offset("R", q)):
            for at, view in store.get_messages("R", q, qo, 1):
                out[(q, at)] = wcl.parse_record(view, check_crc=True).body[:6]
    return out


@pytest.mark.parametrize("where", ["its queue's last entry", "a middle entry"])
def test_a_record_whose_queue_id_was_damaged_is_not_filed_at_another_queues_end(make_store, caplog, where):
    """Proves recovery does not file a record at another queue's end when its QUEUEID was damaged
    into that queue: record R:0:20 has QUEUEID bit 0 flipped, so it says R:1:20, and R:1 ends at 20
    after the crash (its record 20, after the victim, is torn: the log is cut there) -- the offset
    re-dispatch would give the victim, where dispatch's own check sees nothing wrong.  R:0's entry
    names that record, an entry is written from its record's fields, R:1 does not have it and R:0:20
    is nowhere else: the record is left out of every queue with one line, never served.  As R:0's
    last entry, its queue is rebuilt (to 20 entries); in the middle (R:0 goes on to 30) the entry
    stays and names no record of its own (skipped when read).  (Before: found by the randomized
    recovery property, blob b'AEECQQJBAAABQQBBAEIA20EAAUEAQQFBAEEAAA==': the damaged record was
    served as R:1:20.)"""
    s = make_store(mappedFileSizeCommitLog=FS)
    root = s.config.storePathRootDir
    _fill_even(s, 40)                                       # R:0 and R:1, offsets 0..19
    victim = s.put("R", 0, b"victim").result                # R:0:20
    middle = where == "a middle entry"
    if middle:
        for i in range(9):
            assert s.put("R", 0, b"after%d" % i).result.queue_offset() == 21 + i
    torn = s.put("R", 1, b"torn").result                    # R:1:20
    assert victim.queue_offset() == torn.queue_offset() == 20 and s.wait_dispatched()
    crash(s)
    _patch(root, victim, wcl.POS_QUEUE_ID + 3, b"\x01")
    _patch(root, torn, wcl.POS_TOTAL_SIZE, b"\x7f")
    with caplog.at_level("ERROR", logger="mq.store.dispatch"):
        s2 = _reopen(root)
    try:
        assert s2.recovery.end_offset == torn.phy_offset()
        assert s2.recovery.queues_rebuilt == ([] if middle else ["R:0"])
        lines = [r.getMessage() for r in caplog.records if "left out of every ConsumeQueue" in r.getMessage()]
        assert len(lines) == 1 and f"the record at {victim.phy_offset()} names R:1 queue offset 20" in lines[0], \
            lines
        assert s2.dispatcher.records_refused == 1
        served = _served(s2)
        assert sorted(served) == sorted([(q, qo) for q in range(2) for qo in range(20)] +
                                        ([(0, 21 + i) for i in range(9)] if middle else []))
        assert all(served[(q, qo)] == b"m%05d" % (2 * qo + q) for q in range(2) for qo in range(20))
        assert (s2.max_offset("R", 0), s2.max_offset("R", 1)) == (30 if middle else 20, 20)
        assert s2.put("R", 1, b"next").result.queue_offset() == 20
    finally:
        s2.close()


@pytest.mark.parametrize("other", ["has the record there", "lost its entry (crash)", "is the queue rebuilt"])
def test_an_entry_damaged_to_name_another_queues_record_does_not_cost_that_record(make_store, other):
    """Proves the other side of the rule above: when it is the ConsumeQueue entry that is damaged
    (R:0's last entry, 19, made to name R:1's record 19, of the same size), the record is not
    refused -- R:1 has it at the offset it says (here R:0's own record 19 is torn by the crash, so
    it cannot be found), or, R:1's entry 19 lost in the crash, R:0's own record 19 is found after
    its record 18; or the entry names R:0's own record 0 (its position zeroed, as the randomized
    recovery property drew it), which R:0's files, untrusted and about to be rebuilt, still name
    at 0.  R:0 is rebuilt, and every message left is served at its offset."""
    s = make_store(mappedFileSizeCommitLog=FS)
    root = s.config.storePathRootDir
    first = _fill_even(s, 38)[0]                                         # offsets 0..18
    named = s.put("R", 1, b"m%05d" % 39 + b"-" * 100).result             # R:1:19
    own = s.put("R", 0, b"m%05d" % 38 + b"-" * 100).result               # R:0:19, last
    assert named.size() == own.size() and s.wait_dispatched()
    crash(s)
    with open(_entry_path(root, 0), "r+b") as f:
        f.seek(19 * 20)
        # R:0:19 -> R:1:19's record, or R:0:0's
        f.write((first if other == "is the queue rebuilt" else named).phy_offset().to_bytes(8, "big"))
    kept = 20
    if other != "lost its entry (crash)":
        _patch(root, own, wcl.POS_TOTAL_SIZE, b"\x7f")
        kept = 19
    else:
        with open(_entry_path(root, 1), "r+b") as f:
            f.seek(19 * 20)
            f.write(bytes(20))
    s2 = _reopen(root)
    try:
        assert s2.recovery.queues_rebuilt == ["R:0"]
        assert s2.dispatcher.records_refused == 0
        served = _served(s2)
        assert served == {(q, qo): b"m%05d" % (2 * qo + q) for q in range(2) for qo in range(20 if q else kept)}
    finally:
        s2.close()
