"""The group append (mq_commitlog_append_group through CommitLog.group()): single messages of
several topic-queues in one C call, each stored exactly as a single append stores it, each
with its own outcome, and one wake of SEQ_WRITE for the whole group."""
import random

import pytest

from mq.store import control as C
from mq.store.commitlog import host_bytes
from mq.store.native import MessageIllegal, PropertiesTooLong, TopicIllegal, lib
from mq.wire import commitlog as wcl
from mq.wire.properties import encode_properties

CLUSTER = encode_properties({"CLUSTER": "DefaultCluster"})


@pytest.fixture
def store(make_store):
    return make_store(mappedFileSizeCommitLog=64 * 1024, start_roles=False)


def test_group_records_equal_single_appends(make_store, tmp_path):
    """The same messages appended one by one (append with the CLUSTER suffix merged into the
    properties) and as one group give byte-identical CommitLogs but for the store timestamps,
    across file rolls, topics and queues, with queue offsets per topic-queue."""
    rnd = random.Random(5)
    msgs = []
    for i in range(300):
        props = encode_properties({"TAGS": f"T{i % 4}", "KEYS": f"k{i}"}) if i % 5 else b""
        msgs.append((f"Topic{i % 3}", i % 2, rnd.randbytes(rnd.randint(1, 2500)), props, i, 1700000000000 + i))
    one = make_store(root=tmp_path / "one", mappedFileSizeCommitLog=64 * 1024, start_roles=False)
    grp = make_store(root=tmp_path / "grp", mappedFileSizeCommitLog=64 * 1024, start_roles=False)
    singles = []
    for topic, qid, body, props, flag, born in msgs:
        merged = props + (b"\x02" if props else b"") + CLUSTER
        r = one.cl.append(topic, qid, body, merged, flag=flag, born_ts_ms=born, born_host="10.0.0.9",
                          born_port=4242)
        singles.append(r)
    g = grp.cl.group()
    host = host_bytes("10.0.0.9")
    host_c, cluster_c = g.c_bytes(host), g.c_bytes(CLUSTER)
    outcomes = []
    for start in range(0, len(msgs), 64):
        chunk = msgs[start:start + 64]
        for k, (topic, qid, body, props, flag, born) in enumerate(chunk):
            assert g.add(topic.encode(), qid, body, props, cluster_c, len(CLUSTER), host_c, 4, 4242, flag=flag,
                         born_ts_ms=born) == k
        assert g.run() == len(chunk)
        outcomes += [(g.rc(i), g.queue_offset(i), g.end_offset(i), g.msg_id(i)) for i in range(len(chunk))]
    for r, (rc, qoff, end, msg_id) in zip(singles, outcomes):
        assert rc == 0
        assert (qoff, end, msg_id.decode()) == (r.queue_offset(), r.end_offset, r.msg_id())
    for r, (topic, qid, body, props, flag, born) in zip(singles, msgs):
        a = wcl.parse_record(one.cl.read_record(r.phy_offset()), check_crc=True)
        b = wcl.parse_record(grp.cl.read_record(r.phy_offset()), check_crc=True)
        same = {k: v for k, v in a.items() if not k.startswith("_") and k != "store_timestamp_ms"}
        assert same == {k: v for k, v in b.items() if not k.startswith("_") and k != "store_timestamp_ms"}
        assert b.body == body and b.topic == topic and b.queue_id == qid and b.flag == flag


def test_one_bad_message_fails_alone(store):
    """A message the single append would refuse gets that refusal (as the same StoreError) and
    takes no space; the messages around it are stored with dense queue offsets."""
    g = store.cl.group()
    host_c = g.c_bytes(host_bytes("127.0.0.1"))
    cases = [(b"TopicA", b"ok-1", b""), (b"Bad Topic", b"x", b""), (b"TopicA", b"", b""),
             (b"TopicA", b"p", b"K\x01" + b"v" * 40000), (b"TopicA", b"ok-2", b"")]
    for topic, body, props in cases:
        g.add(topic, 0, body, props, None, 0, host_c, 4, 1)
    assert g.run() == 2
    assert [g.rc(i) == 0 for i in range(5)] == [True, False, False, False, True]
    assert isinstance(g.error(1, "Bad Topic", 0), TopicIllegal)
    assert isinstance(g.error(2, "TopicA", 0), MessageIllegal)
    assert isinstance(g.error(3, "TopicA", 0), PropertiesTooLong)
    assert g.error(0, "TopicA", 0) is None
    assert (g.queue_offset(0), g.queue_offset(4)) == (0, 1)
    rec = wcl.parse_record(store.cl.read_record(g.end_offset(0)))
    assert rec.body == b"ok-2" and store.cl.write_pos == g.end_offset(4)


def test_one_wake_per_group(store):
    """SEQ_WRITE (what the dispatch and flush roles sleep on) moves once for a group of 50,
    where 50 single appends move it 50 times; an all-refused group does not move it."""
    g = store.cl.group()
    host_c = g.c_bytes(host_bytes("127.0.0.1"))
    seq0 = store.ctl.seq(C.SEQ_WRITE)
    for i in range(50):
        store.cl.append("TopicW", 0, b"single")
    seq1 = store.ctl.seq(C.SEQ_WRITE)
    for i in range(50):
        g.add(b"TopicW", i % 4, b"grouped", b"", None, 0, host_c, 4, 1)
    assert g.run() == 50
    seq2 = store.ctl.seq(C.SEQ_WRITE)
    g.add(b"Bad Topic", 0, b"x", b"", None, 0, host_c, 4, 1)
    assert g.run() == 0
    assert (seq1 - seq0, seq2 - seq1, store.ctl.seq(C.SEQ_WRITE) - seq2) == (50, 1, 0)


def test_group_capacity_and_bounds(store):
    """add() says -1 once the group is full; the C call refuses more than MQ_BATCH_MSGS_MAX."""
    g = store.cl.group()
    small = type(g)(store.cl, capacity=3)
    host_c = small.c_bytes(host_bytes("127.0.0.1"))
    assert [small.add(b"TopicC", 0, b"m", b"", None, 0, host_c, 4, 1) for _ in range(4)] == [0, 1, 2, -1]
    assert small.run() == 3 and small.run() == 0
    assert lib.mq_commitlog_append_group(store.cl._h, g._msgs, lib.MQ_BATCH_MSGS_MAX + 1, 1024, g._out,
                                         g._rc) == lib.MQ_E_INVAL


@pytest.mark.parametrize("field,value", [("flag", 2 ** 31), ("flag", -2 ** 31 - 1), ("sys_flag", 2 ** 31),
                                         ("reconsume_times", 2 ** 40), ("born_ts_ms", 2 ** 63),
                                         ("born_ts_ms", -2 ** 63 - 1)])
def test_a_number_that_does_not_fit_leaves_the_group_as_it_was(store, field, value):
    """add() checks every number against its C field before touching the group: the refused
    message takes no index, the ones before and after it keep theirs, and each outcome read by
    its index is that message's own (the broker's wrong-ack defect: a refusal half-way used to
    shift every later answer)."""
    g = store.cl.group()
    host_c = g.c_bytes(host_bytes("127.0.0.1"))
    first = g.add(b"TopicF", 0, b"first", b"", None, 0, host_c, 4, 1)
    with pytest.raises(ValueError):
        g.add(b"TopicF", 0, b"refused", b"", None, 0, host_c, 4, 1, **{field: value})
    second = g.add(b"TopicF", 0, b"second", b"", None, 0, host_c, 4, 1)
    assert (first, second) == (0, 1)
    assert g.run() == 2
    bodies = [bytes(wcl.parse_record(store.cl.read_record(g.end_offset(i) - g._out[i].size)).body)
              for i in (first, second)]
    assert bodies == [b"first", b"second"]
    g.add(b"TopicF", 0, b"dropped", b"", None, 0, host_c, 4, 1)
    g.reset()
    assert g.run() == 0
