"""The pull path's C gather against its Python loop, as a property (mq.broker.pull, in-process).

PullProcessor.get_messages reads a pull's records with one C call per run of ConsumeQueue
entries (CommitLog.gather, csrc mq_commitlog_gather; an SQL92 filter is evaluated in Python over
what the calls gathered); the Python loop it replaced stays for a store switched to DLedger with
its old log, and a first record bigger than the gather's buffer.  Hypothesis draws a store (1-2 queues, up to 300 messages of varied sizes and
tags, 64 KiB CommitLog files so records cross file ends' fillers), records damaged while it runs
(a body byte flipped through the file: the mapped bytes change under the store), a lowest
readable CommitLog offset (files deleted by retention), and pulls (any start offset, maxMsgNums,
a tag filter, an SQL92 filter or none, the broker's maxTransferCount/BytesOnMessageInMemory).  Both paths must give
the same answer: code, status, nextBeginOffset, min/max offsets, the body byte for byte and the
last physical offset examined, and report the same damaged records (never serving one)."""
from __future__ import annotations

import os
import shutil
import tempfile
import types

from hypothesis import event, given, note, strategies as st

from mq.broker import pull
from mq.broker.pull import PullProcessor
from mq.broker.sql92 import compile_sql92
from mq.store import MessageStore, StoreConfig
from mq.store import control as C
from mq.wire.consumequeue import java_string_hashcode
from tests.properties.propkit import bounded

FS = 64 * 1024
TOPIC = "Gather"
TAGS = ["a", "b", "c", ""]
SQL = ["k > 2", "k = 1", "TAGS = 'b' OR k BETWEEN 3 AND 4", "k IS NULL", "k < 0"]  # k: i % 6, none for 5
RAM_DIR = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


@st.composite
def scenarios(draw):
    n = draw(st.integers(1, 300))
    return {
        "queues": draw(st.integers(1, 2)),
        "sizes": draw(st.lists(st.integers(1, 3000), min_size=n, max_size=n)),
        "tags": draw(st.lists(st.sampled_from(TAGS), min_size=n, max_size=n)),
        "damaged": draw(st.lists(st.integers(0, n - 1), max_size=4, unique=True)),
        "min_record": draw(st.none() | st.integers(0, n - 1)),
        "pulls": draw(st.lists(st.tuples(
            st.integers(0, 1),                                  # queue pick
            st.integers(0, 400),                                # start offset (modulo max + 2)
            st.integers(1, 64),                                 # maxMsgNums
            st.none() | st.sets(st.sampled_from(TAGS[:3]), min_size=1) | st.sampled_from(SQL),   # filter
            st.integers(1, 64),                                 # maxTransferCountOnMessageInMemory
            st.sampled_from([2000, 8192, 65536, 262144]),       # maxTransferBytesOnMessageInMemory
        ), min_size=1, max_size=12)),
    }


def user_props(i: int) -> bytes:
    """Message i's properties besides TAGS: k = i % 6 mostly, and the encodings a filter must read
    as Java's decoding does (a name's last non-empty value counts; a name inside a value or a
    longer name is not it)."""
    k = b"%d" % (i % 6)
    return [b"k\x01" + k, b"k\x01" + k, b"other\x01x",                 # no k at all
            b"kk\x019\x02k\x01" + k,                                   # a longer name first
            b"k\x019\x02k\x01" + k,                                    # twice: the last counts
            b"k\x01" + k + b"\x02k\x01",                                # the last empty: the one before
            b"other\x01k\x01" + k,                                      # inside a value: no k
            ][i % 7]


def processor(store, count_max: int, bytes_max: int) -> PullProcessor:
    config = types.SimpleNamespace(maxTransferCountOnMessageInMemory=count_max,
                                   maxTransferBytesOnMessageInMemory=bytes_max)
    return PullProcessor(types.SimpleNamespace(config=config, store=store, meta=None, tracer=None))


@bounded(60)
@given(sc=scenarios())
def test_the_c_gather_answers_every_pull_as_the_python_loop_does(tmp_path_factory, sc):
    root = tempfile.mkdtemp(prefix="prop-gather-", dir=RAM_DIR) if RAM_DIR else str(tmp_path_factory.mktemp("g"))
    store = None
    budget, pull.SQL_SCAN_BUDGET_NS = pull.SQL_SCAN_BUDGET_NS, 10 ** 12   # no time limit: both scan alike
    try:
        store = MessageStore.open(StoreConfig(storePathRootDir=root, mappedFileSizeCommitLog=FS))
        placed = []
        for i, (size, tag) in enumerate(zip(sc["sizes"], sc["tags"])):
            props = (b"TAGS\x01" + tag.encode() + b"\x02" if tag else b"") + user_props(i)
            r = store.put(TOPIC, i % sc["queues"], b"%06d" % i + b"x" * size, props)
            assert r.ok, r
            placed.append((r.result.phy_offset(), r.result.size()))
        assert store.wait_dispatched()
        for i in sc["damaged"]:
            phy, size = placed[i]
            fd = os.open(os.path.join(root, "commitlog", "%020d" % (phy // FS * FS)), os.O_RDWR)
            try:
                at = phy % FS + size - 1                     # the body's last byte: BODYCRC fails
                os.pwrite(fd, bytes([os.pread(fd, 1, at)[0] ^ 0x5A]), at)
            finally:
                os.close(fd)
        if sc["min_record"] is not None:
            store.cl.ctl.set(C.POS_MIN, placed[sc["min_record"]][0])
        note(f"min phy {store.min_phy}, damaged {[placed[i] for i in sc['damaged']]}")
        for pick, start, max_nums, tags, count_max, bytes_max in sc["pulls"]:
            qid = pick % sc["queues"]
            hi = store.max_offset(TOPIC, qid)
            offset = start % (hi + 2)
            if isinstance(tags, str):
                codes = compile_sql92(tags)
            else:
                codes = None if tags is None else frozenset(java_string_hashcode(t) for t in tags)
            fast, slow = processor(store, count_max, bytes_max), processor(store, count_max, bytes_max)
            slow._gather = lambda *a, **k: None              # the Python loop
            gathered = []
            fast._gather = lambda *a, _g=fast._gather: gathered.append(_g(*a)) or gathered[-1]
            got = fast.get_messages(TOPIC, qid, offset, max_nums, codes)
            want = slow.get_messages(TOPIC, qid, offset, max_nums, codes)
            note(f"pull q{qid}@{offset} max {max_nums} tags {tags} limits {count_max}/{bytes_max}: {want[:5]}")
            assert got == want
            if bytes_max > max(sc["sizes"]) + 200 and offset < hi:
                assert gathered and gathered[0] is not None, "the C gather was not used"
            assert (fast.damaged_records, fast._damaged_seen) == (slow.damaged_records, slow._damaged_seen)
            event(f"pull answered {want[1]}{', a damaged record skipped' if fast.damaged_records else ''}")
            event(f"filter: {'SQL92' if isinstance(tags, str) else 'tags' if tags else 'none'}")
    finally:
        pull.SQL_SCAN_BUDGET_NS = budget
        if store is not None:
            store.close()
        shutil.rmtree(root, ignore_errors=True)
