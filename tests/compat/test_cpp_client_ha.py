"""The official C++ client with a master/slave group: when the master dies,
a push consumer keeps consuming from the slave and commits offsets there."""
import json
import time

import pytest

pytest.importorskip("rocketmq.client", reason="pip install rocketmq==0.4.4 (make test does)")

from tests.compat.test_cpp_client import Collector, _wait_route, make_producer, message, push_consumer, uniq  # noqa: E402
from mq.cluster import call  # noqa: E402
from mq.cluster import Broker, NameServer, wait_dispatched, wait_for  # noqa: E402


@pytest.mark.parametrize("role", ["ASYNC_MASTER", "SYNC_MASTER"])
def test_consumers_continue_from_the_slave_when_the_master_dies(tmp_path, role):
    """C++ producer -> master (replicated to the slave); the master is killed
    with SIGKILL; a C++ push consumer in a new group then receives every message
    from the slave, and its offsets are committed on the slave."""
    ns = NameServer(str(tmp_path))
    master = Broker(str(tmp_path), ns.addr, name="broker-a", brokerRole=role, haFullCopy="true",
                    haSendHeartbeatInterval=500)
    slave = Broker(str(tmp_path), ns.addr, name="broker-a", brokerRole="SLAVE", brokerId=1,
                   haSendHeartbeatInterval=500)
    topic, group = uniq("T_ha"), uniq("CG_ha")
    try:
        _wait_route(ns.addr, "TBW102")
        prod = make_producer(ns.addr)
        try:
            def replicated_send():
                try:   # a SYNC_MASTER answers 11 until the slave connected; the client raises on that
                    return prod.send_sync(message(topic, -1, "TagA")).status == 0
                except Exception:
                    return False
            wait_for(replicated_send, 60, 0.5, "replicated send")
            for i in range(300):
                assert prod.send_sync(message(topic, i, "TagA")).status == 0
        finally:
            prod.shutdown()
        master_max = int(json.loads(call(master.addr, 28).body)["table"]["commitLogMaxOffset"])
        wait_for(lambda: int(json.loads(call(slave.addr, 28).body)["table"]["commitLogMaxOffset"]) >= master_max,
                 30, 0.1, "slave caught up")
        wait_for(lambda: topic in json.loads(call(slave.addr, 21).body)["topicConfigTable"], 30, 0.3,
                 "topic synced to the slave")
        master.kill()
        wait_for(lambda: "0" not in json.loads(call(ns.addr, 105, {"topic": topic}).body)["brokerDatas"][0]["brokerAddrs"],
                 30, 0.2, "the route without the master")
        col = Collector()
        cons = push_consumer(ns.addr, group, topic, col)
        try:
            wait_for(lambda: len({g[3] for g in col.got}) >= 301, 60, 0.2, "everything consumed from the slave")
            time.sleep(6)    # the client commits offsets every 5 s
        finally:
            cons.shutdown()
        assert {int(g[3]) for g in col.got} == set(range(-1, 300))
        offsets = json.loads(call(slave.addr, 43).body)["offsetTable"]
        committed = offsets.get(f"{topic}@{group}", {})
        # every queue committed to its end (probe sends answered 11 while the slave
        # connected were stored too: 11 means stored, not lost)
        # (the client commits on a 5 s timer, so the last few may still be uncommitted)
        ends = {str(q): int(call(slave.addr, 30, {"topic": topic, "queueId": q}).ext_fields["offset"]) for q in range(4)}
        assert set(committed) == {q for q, v in ends.items() if v > 0}, (committed, ends)
        assert all(0 < int(committed[q]) <= ends[q] for q in committed), (committed, ends)
    finally:
        slave.stop()
        master.proc.kill()
        ns.stop()


@pytest.mark.parametrize("role,flush", [("ASYNC_MASTER", "ASYNC_FLUSH"), ("ASYNC_MASTER", "SYNC_FLUSH"),
                                        ("SYNC_MASTER", "ASYNC_FLUSH"), ("SYNC_MASTER", "SYNC_FLUSH")])
def test_slave_is_byte_identical_after_cpp_load(tmp_path, role, flush):
    """Each role combination under load from the C++ producer (sync and batch
    sends): the slave's CommitLog is byte-identical to the master's and its
    ConsumeQueues give the same messages."""
    from tests.ha.test_broker_ha import _commitlog_bytes, _max_phy
    ns = NameServer(str(tmp_path))
    master = Broker(str(tmp_path), ns.addr, name="broker-a", brokerRole=role, flushDiskType=flush,
                    haFullCopy="true", haSendHeartbeatInterval=500)
    slave = Broker(str(tmp_path), ns.addr, name="broker-a", brokerRole="SLAVE", brokerId=1,
                   flushDiskType=flush, haSendHeartbeatInterval=500)
    topic = uniq("T_bytes")
    try:
        _wait_route(ns.addr, "TBW102")
        prod = make_producer(ns.addr)
        try:
            def first_send():
                try:
                    return prod.send_sync(message(topic, 0, "TagA")).status == 0
                except Exception:
                    return False
            wait_for(first_send, 60, 0.5, "first send")
            for i in range(1, 400):
                assert prod.send_sync(message(topic, i, ["TagA", "TagB"][i % 2])).status == 0
            for start in range(400, 600, 50):
                assert prod.send_batch([message(topic, i, "TagC") for i in range(start, start + 50)]).status == 0
        finally:
            prod.shutdown()
        end = _max_phy(master.addr)
        wait_for(lambda: _max_phy(slave.addr) >= end, 30, 0.1, "slave caught up")
        assert _commitlog_bytes(slave, end) == _commitlog_bytes(master, end)
        wait_dispatched(master.addr)
        for q in range(4):
            m = call(master.addr, 30, {"topic": topic, "queueId": q}).ext_fields["offset"]
            wait_for(lambda: call(slave.addr, 30, {"topic": topic, "queueId": q}).ext_fields["offset"] == m, 20, 0.1,
                     "slave queue dispatched")
            pull = {"consumerGroup": "G", "topic": topic, "queueId": q, "queueOffset": 0, "maxMsgNums": 32,
                    "sysFlag": 4, "commitOffset": 0, "subscription": "*", "subVersion": 0, "suspendTimeoutMillis": 0}
            assert call(master.addr, 11, pull).body == call(slave.addr, 11, pull).body
    finally:
        slave.stop()
        master.stop()
        ns.stop()
