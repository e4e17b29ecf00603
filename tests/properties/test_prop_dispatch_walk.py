"""The dispatch role's steady state in C (`Dispatcher.dispatch_for`, mq_dispatch_for) against
the Python walk (`Dispatcher.dispatch_once`), as a property, in-process.

Hypothesis draws puts (two topics and SCHEDULE_TOPIC_XXXX, several queues, prepared and
rolled-back transactions, 0-5 keys each, bodies of 1-900 bytes) in waves.  Each wave is put and
then dispatched by the C walk, with ConsumeQueue files of 64 entries and index files of 80,
so it often stops for Python to map a file or to start one (mq_dispatch_for's
MQ_DISPATCH_CALLER: Python's walk takes the rest of that batch) and goes on after.  Then the same CommitLog is walked once more from 0 by
dispatch_once alone, into ConsumeQueues and an index of its own.  What the two walks wrote must
be byte-identical: every ConsumeQueue file, and the index files in order.  A second test
checks that small waves after the first are the C walk's own (it does not hand every batch
back).

Mutations tried, each fails it: leaving DISPATCHED where the batch started when C stopped at
an index file without room after indexing some of its records (the caller's walk, which lowers
the index's resume point to DISPATCHED, indexed them twice: the property found this in the
first version), not counting the records C dispatched (the second test)."""
from __future__ import annotations

import os

from hypothesis import HealthCheck, given, note, settings, strategies as st

from mq.store import MessageStore, StoreConfig
from mq.store import control as C
from mq.store.consumequeue import ConsumeQueueSet
from mq.store.dispatch import Dispatcher
from mq.store.index import IndexWriter, list_index_files
from mq.store.native import lib
from mq.wire.properties import encode_properties

SLOTS, ENTRIES = 16, 80                          # index files roll every ~80 keys
CQ_ENTRIES = 64                                  # ConsumeQueue files roll every 64 entries
TOPICS = ("WalkA", "WalkB", "SCHEDULE_TOPIC_XXXX")
PREPARED, ROLLED_BACK = 1 << 2, 3 << 2           # the transaction kinds that get no queue entry

PUT = st.tuples(st.sampled_from(TOPICS), st.integers(0, 2), st.integers(1, 900),
                st.lists(st.sampled_from(["a", "b", "order-1", "x" * 40]), max_size=5),
                st.sampled_from([0, 0, 0, PREPARED, ROLLED_BACK]))


def _put(store: MessageStore, i: int, put) -> None:
    topic, queue, size, keys, sys_flag = put
    props = {"UNIQ_KEY": f"U{i:06d}"}
    if keys:
        props["KEYS"] = " ".join(keys)
    r = store.put(topic, queue, bytes([65 + i % 26]) * size, encode_properties(props), sys_flag=sys_flag)
    assert r.ok, r


def _files(directory: str) -> dict[str, bytes]:
    out = {}
    for root, _, names in os.walk(directory):
        for n in names:
            path = os.path.join(root, n)
            with open(path, "rb") as f:
                out[os.path.relpath(path, directory)] = f.read()
    return out


def _index_files(directory: str) -> list[bytes]:
    out = []
    for n in list_index_files(os.path.join(directory, "index")):
        with open(os.path.join(directory, "index", n), "rb") as f:
            out.append(f.read())
    return out


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(waves=st.lists(st.lists(PUT, min_size=1, max_size=30), min_size=1, max_size=8))
def test_the_c_walk_writes_what_the_python_walk_writes(tmp_path_factory, waves):
    root = tmp_path_factory.mktemp("walk")
    cfg = StoreConfig(storePathRootDir=str(root / "c"), mappedFileSizeCommitLog=64 * 1024,
                      mappedFileSizeConsumeQueue=CQ_ENTRIES * 20, maxHashSlotNum=SLOTS, maxIndexNum=ENTRIES)
    store = MessageStore.open(cfg, start_roles=False)
    try:
        d = store.dispatcher
        by_c = i = 0
        for wave in waves:
            for put in wave:
                _put(store, i, put)
                i += 1
            end = store.ctl.get(C.POS_WRITE)
            for _ in range(1000):
                if store.ctl.get(C.POS_DISPATCHED) >= end:
                    break
                if d.dispatch_for(20):
                    by_c += d._run.records           # what C dispatched itself in that call
                else:
                    d.dispatch_once()                # the index opens at its first build
            assert store.ctl.get(C.POS_DISPATCHED) == end
        note(f"records the C walk dispatched itself: {by_c} of {i}")

        # the Python walk, from 0, over the same CommitLog into its own queues and index
        ref_root = str(root / "py")
        ref = Dispatcher(store.cl, ConsumeQueueSet(os.path.join(ref_root, "consumequeue"), cfg.cq_file_size,
                                                   store.ctl, writable=True),
                         cfg.delay_levels_ms, index=IndexWriter(ref_root, SLOTS, ENTRIES))
        store.ctl.set(C.POS_DISPATCHED, 0)
        while store.ctl.get(C.POS_DISPATCHED) < end:
            assert ref.dispatch_once() > 0 or store.ctl.get(C.POS_DISPATCHED) >= end
        assert _files(os.path.join(ref_root, "consumequeue")) == _files(os.path.join(cfg.storePathRootDir,
                                                                                      "consumequeue"))
        assert _index_files(ref_root) == _index_files(cfg.storePathRootDir)
        ref.cqs.close()
        ref.index.close()
    finally:
        store.close()


def test_small_waves_are_the_c_walks_own(tmp_path):
    """After the first wave (Python's walk opens the index and maps the queues' files), waves that need no new file are
    dispatched and indexed by C alone: every record, each queue's CQ_MAX and the index's resume
    point, one wave at a time."""
    cfg = StoreConfig(storePathRootDir=str(tmp_path / "c"), mappedFileSizeCommitLog=64 * 1024,
                      maxHashSlotNum=SLOTS, maxIndexNum=ENTRIES * 10)
    store = MessageStore.open(cfg, start_roles=False)
    try:
        d = store.dispatcher
        for q in range(3):                          # Python's walk: the index opened, every queue's file mapped
            _put(store, q, ("WalkA", q, 10, ["a"], 0))
        assert not d.dispatch_for(20)                # the index has no open file yet
        d.dispatch_once()
        per_queue = [1, 1, 1]
        for wave in range(1, 6):
            for i in range(wave * 10, wave * 10 + 5):
                _put(store, i, ("WalkA", i % 3, 100, ["a", "order-1"], 0))
                per_queue[i % 3] += 1
            end = store.ctl.get(C.POS_WRITE)
            assert d.dispatch_for(20)
            assert d._run.why == lib.MQ_DISPATCH_WAITED and d._run.records == 5
            assert store.ctl.get(C.POS_DISPATCHED) == end and end - 300 < d.index.from_phy <= end   # past the last record
        assert [store.ctl.queue_get(store.ctl.queue_slot("WalkA", q), C.Q_CQ_MAX) for q in range(3)] == per_queue
        assert d.records_dispatched == 28
    finally:
        store.close()
