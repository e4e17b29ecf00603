"""A master/slave broker switched to DLedger (enableDLegerCommitLog=true over its store, as
RocketMQ's upgrade guide does it), with real processes and the official C++ client: what it
stored before the switch is still served, every queue's offsets go on where they were, and a
consumer group's committed offsets carry across.  Store-level cases (damage, rebuild,
retention) are in tests/store/test_legacy_switch.py."""
from __future__ import annotations

import os
import shutil

import pytest

from mq.cluster import Broker, NameServer, wait_dispatched, wait_for
from tests.dledger.dlkit import DLedgerGroup
from tests.dledger.test_dledger_cluster import _route_master

rocketmq = pytest.importorskip("rocketmq.client", reason="pip install rocketmq==0.4.4 (make test does)")
from rocketmq.client import PullConsumer  # noqa: E402

from tests.compat.test_cpp_client import Collector, make_producer, message, push_consumer, uniq  # noqa: E402

NAME = "RaftNode00"
BEFORE, AFTER = 200, 200
# what an operator copies to the new members (RocketMQ: align the CommitLogs, copy the master's):
# the store, not the broker's own files
NOT_STORE = shutil.ignore_patterns("broker.conf", "broker.log*", "lock", "abort", "*.json.tmp")


def _send(ns_addr: str, topic: str, seqs: range) -> None:
    prod = make_producer(ns_addr)
    try:
        for i in seqs:
            assert prod.send_sync(message(topic, i, "TagA")).status == 0, i
    finally:
        prod.shutdown()


def _consume(ns_addr: str, group: str, topic: str, until: int) -> set[int]:
    """A push consumer of `group` until it got `until` distinct messages; shut down (which
    commits its offsets).  Returns the seq numbers it got."""
    col = Collector()
    cons = push_consumer(ns_addr, group, topic, col)
    try:
        wait_for(lambda: len({m[3] for m in col.got}) >= until, 60, 0.2, f"{until} consumed by {group}")
    finally:
        cons.shutdown()
    return {int(m[3]) for m in col.got}


def _pull_everything(ns_addr: str, topic: str) -> list:
    """(queue id, queue offset, seq) of every message, by the C++ PullConsumer from each queue's offset 0."""
    pc = PullConsumer(uniq("CGP"))
    pc.set_namesrv_addr(ns_addr)
    pc.start()
    try:
        return [(m.queue_id, m.queue_offset, int(m.get_property("seq"))) for m in pc.pull(topic)]
    finally:
        pc.shutdown()


def _check_every_queue_contiguous(got: list) -> None:
    by_queue: dict[int, list[int]] = {}
    for qid, off, _ in got:
        by_queue.setdefault(qid, []).append(off)
    for qid, offs in by_queue.items():
        assert sorted(offs) == list(range(len(offs))), qid


def test_the_official_client_reads_across_a_switch_to_dledger(tmp_path):
    work = str(tmp_path)
    ns = NameServer(work)
    group = None
    try:
        topic, consumers = uniq("T_switch"), uniq("CG_switch")
        master = Broker(work, ns.addr, name=NAME, brokerClusterName="RaftCluster",
                        storePathRootDir=os.path.join(work, f"{NAME}-n0"))
        try:
            wait_for(lambda: (_route_master(ns.addr, "TBW102") or {}).get("0"), 30, 0.2, "the master routed")
            _send(ns.addr, topic, range(BEFORE))
            wait_dispatched(master.addr)
            assert _consume(ns.addr, consumers, topic, BEFORE) == set(range(BEFORE))
        finally:
            assert master.stop() == 0, master.proc.output()[-3000:]
        for member in ("n1", "n2"):
            shutil.copytree(os.path.join(work, f"{NAME}-n0"), os.path.join(work, f"{NAME}-{member}"), ignore=NOT_STORE)

        group = DLedgerGroup(work, ns.addr, name=NAME)
        leader = group.wait_leader()
        for i in group.ids:
            assert "switched to DLedger" in group.brokers[i].proc.output(), i
        wait_for(lambda: (_route_master(ns.addr, topic) or {}).get("0") == group.addr(leader), 40, 0.2,
                 "the topic routed to the leader")
        _send(ns.addr, topic, range(BEFORE, BEFORE + AFTER))
        wait_dispatched(group.addr(leader))

        # the group's committed offsets carried across: it gets the new messages only
        assert _consume(ns.addr, consumers, topic, AFTER) == set(range(BEFORE, BEFORE + AFTER))
        # a new group reads every queue from offset 0, across the switch, without a gap
        got = _pull_everything(ns.addr, topic)
        assert sorted(s for _, _, s in got) == list(range(BEFORE + AFTER))
        _check_every_queue_contiguous(got)

        # another member, leading after this one stops, serves the old log from its own copy
        assert group.brokers[leader].stop() == 0
        new = group.wait_leader(among=[i for i in group.ids if i != leader])
        wait_for(lambda: (_route_master(ns.addr, topic) or {}).get("0") == group.addr(new), 40, 0.2,
                 "the topic routed to the new leader")
        wait_dispatched(group.addr(new))
        # a push consumer of a new group, in a client instance of its own (the C++ client keeps
        # one route cache per instance, and this process's still names the stopped leader until
        # its 30 s poll), reads from offset 0 too
        col = Collector()
        cons = push_consumer(ns.addr, uniq("CG_after"), topic, col, instance=uniq("after"))
        try:
            wait_for(lambda: len({m[3] for m in col.got}) >= BEFORE + AFTER, 60, 0.2, "all consumed from the new leader")
        finally:
            cons.shutdown()
        got = {(m[5], m[6], int(m[3])) for m in col.got}
        assert sorted(s for _, _, s in got) == list(range(BEFORE + AFTER))
        _check_every_queue_contiguous(got)
    finally:
        if group is not None:
            group.close()
        ns.stop()
