"""truncate_to on one live store (dispatch running as a thread): the cut lands
on a record boundary, CommitLog and ConsumeQueues agree afterwards, appends
continue densely, and a restart recovers the same state; it refuses to run
under a dispatcher that has not caught up."""
import pytest

from mq.ha import DispatchBusy, truncate_to
from mq.store import MessageStore
from mq.store import control as C
from mq.wire import commitlog as wcl

from hakit import FS, QUEUES, TOPICS, fill, log_bytes


def _queues(store):
    """{(topic, qid): [(queue offset, physical offset, body)]} through the ConsumeQueues."""
    out = {}
    for t in TOPICS:
        for q in range(QUEUES):
            got = []
            for qo, view in store.get_messages(t, q, 0, 100_000):
                rec = wcl.parse_record(view, check_crc=True)
                assert rec.queue_offset == qo and rec.queue_id == q
                got.append((qo, rec.physical_offset, rec.body))
            assert [g[0] for g in got] == list(range(len(got))), "dense queue offsets"
            out[(t, q)] = got
    return out


def test_truncate_mid_record_cuts_at_the_boundary_and_stays_consistent(make_store):
    """Asked to cut inside a record, truncate_to cuts at that record's start;
    exactly the messages stored before it remain in every queue, the bytes after
    it are zero, later appends continue each queue without gaps, and a restart
    recovers the same log and queues."""
    store = make_store()
    end = fill(store, 300)
    assert store.wait_dispatched()
    before = _queues(store)
    victim = next(phy for _, phy, _ in before[("HA1", 2)] if phy > end // 3)
    assert victim // FS < end // FS, "the cut drops whole files too"
    rep = truncate_to(store, victim + 17)
    assert rep.new_end == victim and rep.dropped_bytes == end - victim
    assert store.cl.write_pos == victim and store.ctl.get(C.POS_DISPATCHED) == victim
    assert log_bytes(store, victim, end) == bytes(end - victim)
    after = _queues(store)
    assert after == {k: [m for m in v if m[1] < victim] for k, v in before.items()}
    assert rep.cq_entries_dropped == sum(len(v) for v in before.values()) - sum(len(v) for v in after.values())
    fill(store, 100, seed=4)
    assert store.wait_dispatched()
    grown = _queues(store)
    assert sum(len(v) for v in grown.values()) == sum(len(v) for v in after.values()) + 100
    cfg = store.config
    store.close()
    again = MessageStore.open(cfg)
    try:
        assert _queues(again) == grown
    finally:
        again.close()


def test_truncate_refuses_while_dispatch_lags(make_store):
    """With records not yet dispatched (no dispatcher running) truncate_to
    raises DispatchBusy and changes nothing."""
    store = make_store(start_roles=False)
    end = fill(store, 50)
    with pytest.raises(DispatchBusy):
        truncate_to(store, end // 2, dispatch_timeout_s=0.2)
    assert store.cl.write_pos == end
