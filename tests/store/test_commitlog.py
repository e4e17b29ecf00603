"""CommitLog and ConsumeQueue through the real C core, parametrised over flush
mode and small file sizes so that files roll and blank fillers happen."""
import mmap
import os
import random
import shutil
import tempfile
import zlib

import pytest

from mq.store import (MessageIllegal, TopicIllegal, PropertiesTooLong, PutStatus, StoreConfig,
                      MessageStore)
from mq.store.native import lib
from mq.wire import batch as wbatch
from mq.wire import commitlog as wcl
from mq.wire import consumequeue as wcq
from mq.wire import msgid as wmsgid
from mq.wire.properties import encode_properties

FLUSH_MODES = ["ASYNC_FLUSH", "SYNC_FLUSH"]
FILE_SIZES = [16 * 1024, 64 * 1024]


def props(**kv):
    return encode_properties(kv)


@pytest.fixture(params=[(m, f) for m in FLUSH_MODES for f in FILE_SIZES],
                ids=lambda p: f"{p[0]}-{p[1] // 1024}k")
def store(request, make_store):
    mode, size = request.param
    return make_store(flushDiskType=mode, mappedFileSizeCommitLog=size, flushIntervalCommitLog=20)


def test_spec_vectors_in_c():
    """The C hashes equal the spec's vectors and zlib on random inputs."""
    assert lib.mq_crc32(0, b"Hello RocketMQ", 14) & 0x7FFFFFFF == 1774740973
    assert lib.mq_java_hash(b"TagA", 4) == 2598919
    assert lib.mq_java_hash(b"TagB", 4) == 2598920
    rnd = random.Random(7)
    for n in list(range(0, 200)) + [4095, 4096, 65537]:
        b = rnd.randbytes(n)
        assert lib.mq_crc32(0, b, n) == zlib.crc32(b)
    for s in ["", "TagA", "标签", "emoji😀tag", "a" * 100]:
        u = s.encode()
        assert lib.mq_java_hash(u, len(u)) == wcq.java_string_hashcode(s)


def test_c_msg_id_matches_spec():
    """The offset msgId for 192.168.0.10:10911 at 123456 is the spec's vector."""
    from mq.store.native import ffi
    out = ffi.new("char[64]")
    lib.mq_msg_id(bytes([192, 168, 0, 10]), 4, 10911, 123456, out)
    assert ffi.string(out).decode() == "C0A8000A00002A9F000000000001E240"
    assert wmsgid.offset_msg_id("192.168.0.10", 10911, 123456) == "C0A8000A00002A9F000000000001E240"


def test_records_parse_with_wire_and_match_reference_encoder(store):
    """Every record written by C parses with mq.wire field by field and is
    byte-identical to the pure-Python reference encoder."""
    rnd = random.Random(1)
    sent = []
    for i in range(400):
        body = rnd.randbytes(rnd.randint(1, 3000))
        p = props(TAGS=f"Tag{i % 3}", KEYS=f"k{i}", UNIQ_KEY=f"U{i}")
        r = store.put("TopicT", i % 3, body, p, flag=i, born_ts_ms=1700000000000 + i,
                      born_host="10.1.2.3", born_port=5555, reconsume_times=i % 2)
        assert r.status is PutStatus.PUT_OK
        sent.append((i, body, p, r.result))
    for i, body, p, res in sent:
        view = store.cl.read_record(res.phy_offset())
        rec = wcl.parse_record(view, check_crc=True)
        assert rec.total_size == res.size() == len(view)
        assert rec.body == body and rec.properties == p and rec.topic == "TopicT"
        assert rec.queue_id == i % 3 and rec.flag == i and rec.physical_offset == res.phy_offset()
        assert rec.queue_offset == res.queue_offset() == i // 3
        assert rec.store_timestamp_ms == res.store_ts_ms()
        assert rec.born_host == "10.1.2.3" and rec.born_port == 5555
        assert rec.store_port == 10911 and rec.reconsume_times == i % 2
        ref = wcl.build_record(body=body, topic="TopicT", properties=p, queue_id=i % 3, flag=i,
                               queue_offset=i // 3, physical_offset=res.phy_offset(),
                               born_timestamp_ms=1700000000000 + i, born_host="10.1.2.3", born_port=5555,
                               store_timestamp_ms=res.store_ts_ms(), store_host="127.0.0.1",
                               store_port=10911, reconsume_times=i % 2)
        assert bytes(view) == ref
        assert res.msg_id() == wmsgid.offset_msg_id("127.0.0.1", 10911, res.phy_offset())


def test_rolling_fills_blank_and_reads_across_files(store):
    """Records never span files: each file ends with the blank filler when the
    next record does not fit, and reads work on both sides of every roll."""
    fs = store.config.mappedFileSizeCommitLog
    offsets = []
    for i in range(300):
        r = store.put("Roll", 0, bytes([i % 256]) * (500 + (i * 37) % 900))
        assert r.ok
        offsets.append((r.result.phy_offset(), r.result.size(), i))
    assert store.cl.write_pos > 3 * fs, "the test must roll several files"
    rolled = 0
    for (a, sa, _), (b, _, _) in zip(offsets, offsets[1:]):
        assert a // fs == (a + sa - 1) // fs, "record spans two files"
        if b // fs != a // fs:
            rolled += 1
            end = a + sa
            blank = store.cl.view_raw(end, 8)
            assert wcl.parse_blank(blank) == fs - end % fs
            assert b % fs == 0
    assert rolled >= 3
    store.wait_dispatched()
    got = store.get_messages("Roll", 0, 0, 1000)
    assert [q for q, _ in got[:len(got)]] == list(range(len(got)))
    total = 0
    q = 0
    while q < 300:   # CQ reads stop at CQ file ends: keep going
        batch = store.get_messages("Roll", 0, q, 64)
        assert batch, q
        for qoff, view in batch:
            assert wcl.parse_record(view).body[:1] == bytes([qoff % 256])
        q += len(batch)
        total += len(batch)
    assert total == 300


def test_batch_append_is_one_call_with_dense_offsets(store):
    """A SEND_BATCH_MESSAGE body is appended in one C call: consecutive queue
    offsets, batch-level properties appended to each message's properties."""
    items = [wbatch.BatchItem(flag=i, body=b"m%d" % i, properties=props(KEYS=f"k{i}")) for i in range(50)]
    items.append(wbatch.BatchItem(flag=0, body=b"noprops", properties=b""))
    body = wbatch.build_batch(items)
    store.put("B", 0, b"first")
    r = store.put_batch("B", 0, body, extra_props=b"CLUSTER\x01DefaultCluster")
    assert r.ok and r.result.count == 51
    assert [r.result.queue_offset(i) for i in range(51)] == list(range(1, 52))
    ids = r.result.msg_ids()
    assert len(set(ids)) == 51
    for i in range(51):
        rec = wcl.parse_record(store.cl.read_record(r.result.phy_offset(i)), check_crc=True)
        assert rec.body == items[i].body and rec.flag == items[i].flag
        if items[i].properties:
            assert rec.properties == items[i].properties + b"\x02CLUSTER\x01DefaultCluster"
        else:
            assert rec.properties == b"CLUSTER\x01DefaultCluster"


def test_tags_code_in_consume_queue(store):
    """ConsumeQueue entries carry Java's String.hashCode of TAGS (0 without)."""
    store.put("T", 0, b"a", props(TAGS="TagA"))
    store.put("T", 0, b"b", b"")
    store.put("T", 0, b"c", props(KEYS="x", TAGS="标签"))
    store.wait_dispatched()
    cq = store.cqs.get("T", 0)
    codes = [e[2] for e in cq.get(0, 10)]
    assert codes == [2598919, 0, wcq.java_string_hashcode("标签")]


def test_min_max_and_search_by_timestamp(make_store):
    """max/min offsets follow the queue; search by store time finds the first
    message stored at or after a time."""
    s = make_store()
    stamps = []
    for i in range(30):
        r = s.put("S", 1, b"x%d" % i)
        stamps.append(r.result.store_ts_ms())
        if i % 10 == 9:
            import time
            time.sleep(0.02)
    s.wait_dispatched()
    assert s.max_offset("S", 1) == 30 and s.min_offset("S", 1) == 0
    assert s.max_offset("S", 0) == 0
    for i in (0, 10, 20):
        found = s.search_offset_by_time("S", 1, stamps[i])
        assert stamps[found] == stamps[i] and (found == 0 or stamps[found - 1] < stamps[i]), "exact match"
    # between two stored times: the closer neighbour (spec 2.3)
    gap_lo, gap_hi = stamps[9], stamps[10]
    assert gap_hi - gap_lo >= 10
    assert s.search_offset_by_time("S", 1, gap_lo + 1) == 9
    assert s.search_offset_by_time("S", 1, gap_hi - 1) == 10
    assert s.search_offset_by_time("S", 1, stamps[-1] + 10_000) == 29, "all older: the last message"
    assert s.search_offset_by_time("S", 1, stamps[0] - 10_000) == 0, "all newer: the first"
    assert s.search_offset_by_time("S", 0, stamps[0]) == 0, "empty queue"


@pytest.mark.parametrize("case", ["empty", "over", "exact"])
def test_body_limits(make_store, case):
    """Body empty or over maxMessageSize is MESSAGE_ILLEGAL and writes nothing;
    exactly maxMessageSize is accepted (the limit is inclusive)."""
    s = make_store(maxMessageSize=1024)
    before = s.cl.write_pos
    body = {"empty": b"", "over": b"x" * 1025, "exact": b"x" * 1024}[case]
    r = s.put("L", 0, body)
    if case == "exact":
        assert r.ok
    else:
        assert r.status is PutStatus.MESSAGE_ILLEGAL
        assert s.cl.write_pos == before
        with pytest.raises(MessageIllegal):
            s.cl.append("L", 0, body)


@pytest.mark.parametrize("topic,ok", [
    ("a" * 127, True), ("a" * 128, False), ("", False), ("bad topic", False), ("bad/topic", False),
    ("%RETRY%group_1", True), ("a|b-c_d", True), ("tópico", False),
])
def test_topic_rules(make_store, topic, ok):
    """Topics: at most 127 bytes of [%|a-zA-Z0-9_-]; others are refused, nothing written."""
    s = make_store()
    before = s.cl.write_pos
    if ok:
        assert s.put(topic, 0, b"x").ok
    else:
        with pytest.raises(TopicIllegal):
            s.cl.append(topic, 0, b"x")
        assert s.put(topic, 0, b"x").status is PutStatus.MESSAGE_ILLEGAL
        assert s.cl.write_pos == before


def test_properties_limit(make_store):
    """Properties of 32767 bytes are accepted, 32768 refused with nothing written."""
    s = make_store(mappedFileSizeCommitLog=256 * 1024)
    exact = b"K\x01" + b"v" * (32767 - 2)
    assert s.put("P", 0, b"x", exact).ok
    before = s.cl.write_pos
    with pytest.raises(PropertiesTooLong):
        s.cl.append("P", 0, b"x", exact + b"v")
    assert s.put("P", 0, b"x", exact + b"v").status is PutStatus.PROPERTIES_SIZE_EXCEEDED
    assert s.cl.write_pos == before


def test_malformed_batches_write_nothing(make_store):
    """Every malformed batch body (truncated at each byte, bad lengths) is
    MESSAGE_ILLEGAL and leaves the log untouched."""
    s = make_store()
    good = wbatch.build_batch([wbatch.BatchItem(0, b"hello", b"A\x01b"), wbatch.BatchItem(0, b"x", b"")])
    before = s.cl.write_pos
    first_len = int.from_bytes(good[:4], "big")
    for cut in range(1, len(good)):
        if cut == first_len:
            continue   # a cut at the record boundary is a valid one-message batch
        with pytest.raises(MessageIllegal):
            s.cl.append_batch("B", 0, good[:cut])
    bad = bytearray(good)
    bad[0:4] = (10 ** 6).to_bytes(4, "big")
    with pytest.raises(MessageIllegal):
        s.cl.append_batch("B", 0, bytes(bad))
    assert s.cl.write_pos == before
    assert s.put_batch("B", 0, good).ok


def test_zero_copy_view_is_the_mapped_bytes(make_store):
    """view() returns the mapped bytes themselves (no copy) and refuses ranges
    outside [min, write)."""
    from mq.store import OutOfRange
    s = make_store()
    r = s.put("Z", 0, b"abc")
    v1 = s.cl.view(r.result.phy_offset(), r.result.size())
    v2 = s.cl.view(r.result.phy_offset(), r.result.size())
    from mq.store.native import ffi
    assert ffi.from_buffer(v1) == ffi.from_buffer(v2)
    with pytest.raises(OutOfRange):
        s.cl.view(s.cl.write_pos, 1)


def test_next_file_is_prepared_in_background_from_half_way(make_store):
    """The preparer creates the next CommitLog file at full size before an append needs it, once
    the write position is PREPARE_NEXT_AT into the current file, not before (a pre-touched page is
    a page of zeros the kernel writes to the disk)."""
    import time
    from mq.store.commitlog import PREPARE_CHECK_S, PREPARE_NEXT_AT
    size = 64 * 1024
    s = make_store(mappedFileSizeCommitLog=size)
    s.put("N", 0, b"x")
    nxt = os.path.join(s.config.commitlog_dir, "%020d" % size)
    time.sleep(PREPARE_CHECK_S * 4)                          # four of the preparer's looks
    assert not os.path.exists(nxt)
    while s.cl.write_pos < size * PREPARE_NEXT_AT:
        s.put("N", 0, b"x" * 1000)
    deadline = time.monotonic() + 5
    while not os.path.exists(nxt) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert s.cl.write_pos < size and os.path.getsize(nxt) == size


def _pagemap(path: str, pages: int) -> tuple[int, ...]:
    """The /proc/self/pagemap entries of the first `pages` pages of this process's first mapping
    of `path`: bit 63 present (readable without privileges), bits 0-54 the frame (root only)."""
    import struct
    with open("/proc/self/maps") as f:
        start = next(int(line.split("-", 1)[0], 16) for line in f if line.rstrip().endswith(path))
    with open("/proc/self/pagemap", "rb") as pm:
        pm.seek(start // mmap.PAGESIZE * 8)
        return struct.unpack(f"<{pages}Q", pm.read(8 * pages))


def _present_pages(path: str, pages: int) -> list[bool]:
    """Which pages of this process's mapping of `path` have a page table entry; a shared
    mapping's page gets one at its first access."""
    return [bool(v >> 63) for v in _pagemap(path, pages)]


def test_a_file_is_pre_touched_from_the_given_position_only(make_store):
    """mq_commitlog_prepare_file(cl, file, from_pos) writes (an atomic add of 0) every page from
    from_pos's page to the file's end and none before it: the store's open passes its write
    position, so a restart does not dirty its records' pages again (a dirtied page is written to
    the disk again).  Seen through this process's page table: the mapping is made by the call
    and nothing else touches it."""
    size = 64 * 1024
    pages = size // mmap.PAGESIZE
    s = make_store(mappedFileSizeCommitLog=size)
    s.put("N", 0, b"x")                                 # far below PREPARE_NEXT_AT: file 1 is not prepared
    nxt = os.path.join(s.config.commitlog_dir, "%020d" % size)
    assert not os.path.exists(nxt)
    s.cl.prepare_file(1, size + 5 * mmap.PAGESIZE + 100)
    assert _present_pages(os.path.realpath(nxt), pages) == [False] * 5 + [True] * (pages - 5)


def _pages_in_large_folios(path: str, size: int) -> int | None:
    """How many pages of `path` (all cached, mapped by the store in this process) the page cache
    holds in folios larger than a page: each page's frame from /proc/self/pagemap (_pagemap), its
    flags from /proc/kpageflags (COMPOUND_HEAD 15, COMPOUND_TAIL 16).  None: frames not readable
    (not root)."""
    import struct
    pfns = [v & ((1 << 55) - 1) for v in _pagemap(path, size // mmap.PAGESIZE)]
    if not all(pfns):
        return None
    large = 0
    with open("/proc/kpageflags", "rb") as kf:
        for pfn in pfns:
            kf.seek(pfn * 8)
            large += bool(struct.unpack("<Q", kf.read(8))[0] & (1 << 15 | 1 << 16))
    return large


def test_a_sync_flush_store_prepares_files_one_page_a_folio(make_store):
    """Under SYNC_FLUSH the preparer touches a new file with readahead off, so the page cache
    holds it in one-page folios; under ASYNC_FLUSH (the control) it touches with readahead, and
    ext4 on Linux 6.x caches the file in large folios.  Writeback writes whole folios: with them
    every SYNC_FLUSH group's msync of ~32 KiB wrote ~0.9 MiB to the disk.  On a disk (the test's
    own directory under /var/tmp), not the run's tmpfs; 64 MiB files, since readahead went to
    large folios here only in files larger than 8 MiB."""
    size = 64 << 20
    root = tempfile.mkdtemp(prefix="mq-folios-", dir="/var/tmp")
    try:
        seen = {}
        for mode in ("ASYNC_FLUSH", "SYNC_FLUSH"):
            s = make_store(root=os.path.join(root, mode), mappedFileSizeCommitLog=size, flushDiskType=mode)
            try:                # closed before the directory goes (a close writes its files)
                s.cl.prepare_file(1)
                seen[mode] = _pages_in_large_folios(
                    os.path.realpath(os.path.join(s.config.commitlog_dir, "%020d" % size)), size)
            finally:
                s.close()
        if seen["ASYNC_FLUSH"] is None:
            pytest.skip("page frames are not readable here (/proc/self/pagemap needs root)")
        if seen["ASYNC_FLUSH"] == 0:
            pytest.skip("this kernel caches the disk's files one page a folio anyway: nothing to tell apart")
        assert seen["SYNC_FLUSH"] == 0, seen
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_second_owner_is_refused(make_store, tmp_path):
    """Only one process may own a store directory (the lock file)."""
    from mq.store import StoreError
    make_store()
    with pytest.raises(StoreError, match="in use"):
        MessageStore.open(StoreConfig(storePathRootDir=str(tmp_path / "store"),
                                      mappedFileSizeCommitLog=64 * 1024))


def test_records_props_finds_named_values_and_refuses_a_cut_record(make_store):
    """mq_records_props (the SQL92 pull's property reader) over records as the store wrote them:
    each record's offset and size, each named property's value span (-1 when absent or empty),
    and MQ_E_CORRUPT for a run whose last record is cut, with the records before it filled."""
    from mq.store.native import ffi
    s = make_store()
    recs = []
    for p in (b"a\x01one\x02b\x01two", b"b\x01\x02a\x01x", b"zz\x01a\x01no"):
        r = s.put("P", 0, b"body", p)
        recs.append(bytes(s.cl.view(r.result.phy_offset(), r.result.size())))
    buf = b"".join(recs)
    names, lens = ffi.new("uint8_t[]", b"a\x01b\x01"), ffi.new("uint32_t[]", [2, 2])
    spans = ffi.new("int32_t[]", 3 * 6)
    assert lib.mq_records_props(buf, len(buf), 3, names, lens, 2, spans) == lib.MQ_OK
    got = list(spans)

    def value(k):
        return None if got[k] < 0 else buf[got[k]:got[k] + got[k + 1]]
    assert [(got[6 * i], got[6 * i + 1]) for i in range(3)] == [(0, len(recs[0])), (len(recs[0]), len(recs[1])),
                                                                (len(recs[0]) + len(recs[1]), len(recs[2]))]
    assert [(value(6 * i + 2), value(6 * i + 4)) for i in range(3)] == [(b"one", b"two"), (b"x", None), (None, None)]
    cut = buf[:-1]
    spans = ffi.new("int32_t[]", 3 * 6)
    assert lib.mq_records_props(cut, len(cut), 3, names, lens, 2, spans) == lib.MQ_E_CORRUPT
    assert (spans[0], spans[1], spans[6], spans[7]) == (0, len(recs[0]), len(recs[0]), len(recs[1]))
