"""The message index (mq.store.index): RocketMQ's IndexFile bytes, queries by key and
UNIQ_KEY, roll-over to new files, recovery after a crash, and retention.

The byte test replays RocketMQ's IndexFile.putKey in plain Python (written from the
Java algorithm: slot = |hashCode| % slots, head insertion, INDEXCOUNT from 1) and
compares whole files, so the C writer is checked against the format, not itself."""
import os
import struct

import pytest

from mq.store import MessageStore, StoreConfig
from mq.store.index import IndexReader, delete_files_below, list_index_files
from mq.wire import index as W
from mq.wire.properties import encode_properties
from tests.store.storekit import crash

FS = 64 * 1024
SLOTS, ENTRIES = 64, 100       # small: collisions in every slot and a new file every ~99 keys


def _opts(**kw):
    return dict(mappedFileSizeCommitLog=FS, maxHashSlotNum=SLOTS, maxIndexNum=ENTRIES, **kw)


def _put(store, i, topic="IX", keys=None, uniq=None, sys_flag=0):
    props = {"KEYS": keys if keys is not None else f"k{i} shared", "UNIQ_KEY": uniq or f"U{i:08d}"}
    r = store.put(topic, i % 2, b"body-%d" % i, encode_properties(props), sys_flag=sys_flag) \
        if sys_flag else store.put(topic, i % 2, b"body-%d" % i, encode_properties(props))
    assert r.ok
    return r.result.phy_offset()


def _reader(store):
    return IndexReader(store.config.storePathRootDir, SLOTS, ENTRIES)


class _ReferenceIndex:
    """RocketMQ's IndexFile.putKey over a bytearray, file by file."""

    def __init__(self):
        self.files = []
        self._new(0, 0)

    def _new(self, end_phy, end_ts):
        buf = bytearray(W.index_file_size(SLOTS, ENTRIES))
        struct.pack_into(">qqqqii", buf, 0, end_ts, end_ts, end_phy, end_phy, 0, 1)
        self.files.append(buf)

    def put_record(self, keys, phy, ts):
        buf = self.files[-1]
        if struct.unpack_from(">i", buf, 36)[0] + len(keys) > ENTRIES:       # all keys of a record in one file
            b = struct.unpack_from(">qqqqii", buf, 0)
            self._new(b[3], b[1])
            buf = self.files[-1]
        for key in keys:
            begin_ts, end_ts, begin_phy, end_phy, used, count = struct.unpack_from(">qqqqii", buf, 0)
            kh = W.index_key_hash(key)
            slot_at = 40 + (kh % SLOTS) * 4
            prev = struct.unpack_from(">i", buf, slot_at)[0]
            if prev <= 0 or prev > count:
                prev = 0
            if count <= 1:
                begin_phy, begin_ts = phy, ts
            diff = max(0, min(2 ** 31 - 1, (ts - begin_ts) // 1000)) if begin_ts > 0 else 0
            struct.pack_into(">iqii", buf, 40 + SLOTS * 4 + count * 20, kh, phy, diff, prev)
            struct.pack_into(">i", buf, slot_at, count)
            used += prev == 0
            struct.pack_into(">qqqqii", buf, 0, begin_ts, ts, begin_phy, phy, used, count + 1)


def test_index_files_match_rocketmq_puts_byte_for_byte(make_store):
    """300 records x 3 keys (UNIQ_KEY and two KEYS words) fill several files exactly as
    RocketMQ's putKey would: same slots, chains, counts, headers."""
    s = make_store(**_opts())
    ref = _ReferenceIndex()
    for i in range(300):
        phy = _put(s, i)
        assert s.wait_dispatched()
        ts = s._store_ts_at(phy)
        ref.put_record([f"IX#U{i:08d}", f"IX#k{i}", "IX#shared"], phy, ts)
    s.close()
    d = os.path.join(s.config.storePathRootDir, "index")
    names = list_index_files(d)
    assert len(names) == len(ref.files) >= 9
    for name, want in zip(names, ref.files):
        with open(os.path.join(d, name), "rb") as fh:
            got = fh.read()
        assert len(got) == len(want)
        assert got[:40] == bytes(want[:40]), name
        assert got == bytes(want), name


def test_queries_by_key_and_unique_key_across_files(make_store):
    """Every record is found by each of its keys, across file roll-overs; a shared key
    returns the newest first, at most max_num, no duplicates; other topics and unknown
    keys find nothing."""
    s = make_store(**_opts())
    offs = [_put(s, i) for i in range(250)]
    assert s.wait_dispatched()
    r = _reader(s)
    assert len(r.files()) > 2
    for i in (0, 1, 97, 98, 99, 150, 249):
        assert r.query("IX", f"k{i}", 64, 0, 2 ** 62) == [offs[i]]
        assert r.query("IX", f"U{i:08d}", 64, 0, 2 ** 62) == [offs[i]]
    newest = r.query("IX", "shared", 32, 0, 2 ** 62)
    assert newest == sorted(offs, reverse=True)[:32]
    assert r.query("OTHER", "k5", 64, 0, 2 ** 62) == []
    assert r.query("IX", "nope", 64, 0, 2 ** 62) == []
    ts_last, phy_last = r.last_update()
    assert phy_last == offs[-1] and ts_last == s._store_ts_at(offs[-1])
    r.close()


def test_time_range_limits_the_answer(make_store):
    s = make_store(**_opts())
    off = _put(s, 1)
    assert s.wait_dispatched()
    ts = s._store_ts_at(off)
    r = _reader(s)
    assert r.query("IX", "k1", 8, ts, ts) == [off]            # the store time itself is inside
    assert r.query("IX", "k1", 8, ts + 5000, ts + 9000) == []
    assert r.query("IX", "k1", 8, 0, ts - 5000) == []
    r.close()


def test_prepared_transactions_and_keyless_records_get_no_entries(make_store):
    """RocketMQ indexes no prepared (sysFlag 0x4) or rolled-back message."""
    s = make_store(**_opts())
    _put(s, 1, sys_flag=0x4)
    r = s.put("IX", 0, b"no keys at all")
    assert r.ok
    assert s.wait_dispatched()
    rd = _reader(s)
    assert rd.query("IX", "k1", 8, 0, 2 ** 62) == []
    assert [W.parse_index_header(f.mm).index_count for f in rd.files()] in ([], [1])
    rd.close()


def test_index_recovers_after_a_crash_and_keeps_every_key(make_store):
    """A crash (no clean stop) with records dispatched but the index not flushed: the
    reopened store re-indexes from its recovery point; every key still finds its record
    once, and records put after the restart are indexed too."""
    s = make_store(**_opts())
    root = s.config.storePathRootDir
    offs = [_put(s, i) for i in range(120)]
    assert s.wait_dispatched()
    crash(s)
    s2 = MessageStore.open(StoreConfig(storePathRootDir=root, **_opts()), start_roles=True)
    try:
        assert s2.recovery.mode == "abnormal"
        offs += [_put(s2, i) for i in range(120, 160)]
        assert s2.wait_dispatched()
        r = _reader(s2)
        for i in range(160):
            assert r.query("IX", f"k{i}", 64, 0, 2 ** 62) == [offs[i]], i
        r.close()
    finally:
        s2.close()


def test_torn_commitlog_tail_is_reindexed_at_the_same_offsets(make_store):
    """Records cut by recovery leave stale entries; the records written at the same
    offsets afterwards are indexed (the resume point follows re-dispatch down)."""
    s = make_store(**_opts())
    root = s.config.storePathRootDir
    offs = [_put(s, i) for i in range(10)]
    assert s.wait_dispatched()
    crash(s)
    path = os.path.join(root, "commitlog", "%020d" % 0)
    with open(path, "r+b") as fh:                      # tear the last record
        fh.seek(offs[-1] + 4)
        fh.write(b"\0\0\0\0")
    s2 = MessageStore.open(StoreConfig(storePathRootDir=root, **_opts()), start_roles=True)
    try:
        again = _put(s2, 900, keys="fresh")
        assert again == offs[-1]
        assert s2.wait_dispatched()
        r = _reader(s2)
        assert r.query("IX", "fresh", 8, 0, 2 ** 62) == [again]
        r.close()
    finally:
        s2.close()


def test_retention_deletes_index_files_below_the_commitlog_minimum(make_store):
    s = make_store(**_opts())
    offs = [_put(s, i) for i in range(200)]
    assert s.wait_dispatched()
    root = s.config.storePathRootDir
    names = list_index_files(os.path.join(root, "index"))
    assert len(names) >= 5
    gone = delete_files_below(root, offs[100], SLOTS, ENTRIES)
    left = list_index_files(os.path.join(root, "index"))
    assert gone and set(gone) | set(left) == set(names) and left[-1] == names[-1]
    r = _reader(s)
    assert r.query("IX", "k150", 8, 0, 2 ** 62) == [offs[150]]
    assert r.query("IX", "k0", 8, 0, 2 ** 62) == []
    r.close()
    # the newest file stays even when everything is below the minimum
    delete_files_below(root, 2 ** 62, SLOTS, ENTRIES)
    assert list_index_files(os.path.join(root, "index")) == [names[-1]]


def test_index_off(make_store):
    s = make_store(messageIndexEnable=False, mappedFileSizeCommitLog=FS)
    _put(s, 1)
    assert s.wait_dispatched()
    assert list_index_files(os.path.join(s.config.storePathRootDir, "index")) == []


def test_sizes_are_checked():
    with pytest.raises(ValueError):
        StoreConfig(maxIndexNum=64)
    with pytest.raises(ValueError, match="2 GiB"):
        StoreConfig(maxHashSlotNum=100_000_000, maxIndexNum=100_000_000)


def test_mqdump_index_lists_checks_and_follows_a_key(make_store, capsys):
    """mqdump index reads what the C writer wrote through mq.wire alone: every entry, a key's
    chain, a wrong size named as such (exit 2), and a damaged chain found (exit 1)."""
    import json
    from mq.tools.mqdump import main as mqdump
    s = make_store(**_opts())
    offs = [_put(s, i) for i in range(150)]
    s.close()
    root = s.config.storePathRootDir
    sizes = ["--maxHashSlotNum", str(SLOTS), "--maxIndexNum", str(ENTRIES)]
    assert mqdump(["index", root, *sizes, "--json"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    entries = [x for x in lines if x["kind"] == "entry"]
    assert len(entries) == 3 * 150 and lines[-1]["problems"] == 0
    assert mqdump(["index", root, *sizes, "--json", "--key", "IX#k120"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [x["phy_offset"] for x in lines if x["kind"] == "entry"] == [offs[120]]
    assert mqdump(["index", root]) == 2                 # RocketMQ's default sizes do not fit these files
    assert "give --maxHashSlotNum" in capsys.readouterr().err
    first = os.path.join(root, "index", list_index_files(os.path.join(root, "index"))[0])
    with open(first, "r+b") as fh:                       # entry 5 points forward
        fh.seek(W.INDEX_HEADER_SIZE + W.INDEX_SLOT_SIZE * SLOTS + 5 * W.INDEX_ENTRY_SIZE + 16)
        fh.write(struct.pack(">i", 9))
    assert mqdump(["index", first, *sizes]) == 1
    assert "bad_chain" in capsys.readouterr().out


def test_a_put_cut_short_by_a_crash_keeps_the_chains_whole(make_store):
    """Killed after an entry and its slot were stored but before INDEXCOUNT moved: the next
    writer counts that entry instead of writing over it, so the slot's chain stays whole."""
    s = make_store(**_opts())
    offs = [_put(s, i, keys="same") for i in range(3)]
    assert s.wait_dispatched()
    root = s.config.storePathRootDir
    s.close()
    path = os.path.join(root, "index", list_index_files(os.path.join(root, "index"))[-1])
    with open(path, "r+b") as fh:                       # undo the last INDEXCOUNT store
        fh.seek(W.INDEX_COUNT_OFFSET)
        count = struct.unpack(">i", fh.read(4))[0]
        fh.seek(W.INDEX_COUNT_OFFSET)
        fh.write(struct.pack(">i", count - 1))
    s2 = MessageStore.open(StoreConfig(storePathRootDir=root, **_opts()), start_roles=True)
    try:
        offs.append(_put(s2, 3, keys="same"))
        assert s2.wait_dispatched()
        r = _reader(s2)
        assert r.query("IX", "same", 16, 0, 2 ** 62) == offs[::-1]
        r.close()
    finally:
        s2.close()


@pytest.mark.parametrize("damage", ["short file", "bad count"])
def test_a_damaged_index_file_is_set_aside_and_the_index_goes_on(make_store, damage):
    """The newest index file damaged while the store was stopped (cut short, or INDEXCOUNT
    garbage): the writer sets it aside (<name>.damaged, one log line) instead of failing at every
    dispatch, starts a new file, and new messages are found by key; the other files still
    answer, and queries never fail on the damaged one."""
    s = make_store(**_opts())
    offs = [_put(s, i) for i in range(250)]
    assert s.wait_dispatched()
    root = s.config.storePathRootDir
    s.close()
    d = os.path.join(root, "index")
    names = list_index_files(d)
    newest = os.path.join(d, names[-1])
    with open(newest, "r+b") as f:
        if damage == "short file":
            f.truncate(1000)
        else:
            f.seek(W.INDEX_COUNT_OFFSET)
            f.write(struct.pack(">i", 2 ** 30))
    s2 = MessageStore.open(StoreConfig(storePathRootDir=root, **_opts()))
    try:
        more = [_put(s2, i) for i in range(250, 260)]
        assert s2.wait_dispatched()
        r = _reader(s2)
        assert os.path.exists(newest + ".damaged") and names[-1] not in list_index_files(d)
        for i, off in zip(range(250, 260), more):
            assert r.query("IX", f"k{i}", 64, 0, 2 ** 62) == [off]
        assert r.query("IX", "k0", 64, 0, 2 ** 62) == [offs[0]], "the older files still answer"
        r.close()
    finally:
        s2.close()
