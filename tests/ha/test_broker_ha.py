"""Master and slave brokers as real processes: metadata sync, slave
read-only-ness, SYNC_MASTER without a slave."""
import asyncio
import json

from mq.remoting import RemotingClient
from tests.harness.cluster import Broker, NameServer, wait_for


def call(addr: str, code: int, ext: dict | None = None, body: bytes = b""):
    async def go():
        c = RemotingClient()
        try:
            return await c.invoke(addr, c.request(code, ext, body), 5)
        finally:
            await c.close()
    return asyncio.run(go())


def send(addr: str, topic: str, body: bytes, qid: int = 0):
    return call(addr, 310, {"a": "PG", "b": topic, "c": "TBW102", "d": 4, "e": qid, "f": 0, "g": 0, "h": 0,
                            "i": "TAGS\x01TagA"}, body)


def test_slave_syncs_topics_and_offsets_and_refuses_writes(tmp_path):
    """A topic created and an offset committed on the master appear on the
    slave within a few sync intervals; the slave answers sends with
    SERVICE_NOT_AVAILABLE (14) and topic updates with SYSTEM_ERROR."""
    ns = NameServer(str(tmp_path))
    master = Broker(str(tmp_path), ns.addr, name="broker-a")
    slave = Broker(str(tmp_path), ns.addr, name="broker-a", brokerRole="SLAVE", brokerId=1,
                   slaveMetadataSyncInterval=300)
    try:
        r = call(master.addr, 17, {"topic": "SyncedTopic", "defaultTopic": "TBW102", "readQueueNums": 3,
                                   "writeQueueNums": 3, "perm": 6, "topicFilterType": "SINGLE_TAG",
                                   "topicSysFlag": 0, "order": "false"})
        assert r.code == 0, r.remark
        assert call(master.addr, 15, {"consumerGroup": "G1", "topic": "SyncedTopic", "queueId": 2,
                                      "commitOffset": 42}).code == 0

        def synced():
            topics = json.loads(call(slave.addr, 21).body)["topicConfigTable"]
            offsets = json.loads(call(slave.addr, 43).body)["offsetTable"]
            return "SyncedTopic" in topics and offsets.get("SyncedTopic@G1", {}).get("2") == 42

        wait_for(synced, 30, 0.2, "metadata on the slave")
        assert json.loads(call(slave.addr, 21).body)["topicConfigTable"]["SyncedTopic"]["readQueueNums"] == 3
        assert send(slave.addr, "SyncedTopic", b"x").code == 14
        assert call(slave.addr, 17, {"topic": "Other", "defaultTopic": "TBW102", "readQueueNums": 1,
                                     "writeQueueNums": 1, "perm": 6}).code == 1
        route = json.loads(call(ns.addr, 105, {"topic": "SyncedTopic"}).body)
        addrs = route["brokerDatas"][0]["brokerAddrs"]
        assert addrs == {"0": master.addr, "1": slave.addr}, "the route lists the group by brokerId"
    finally:
        slave.stop()
        master.stop()
        ns.stop()


def test_sync_master_without_a_slave_is_slave_not_available(tmp_path):
    """SYNC_MASTER with no slave connected: the message is stored and the send
    answers SLAVE_NOT_AVAILABLE (11), never SEND_OK."""
    ns = NameServer(str(tmp_path))
    master = Broker(str(tmp_path), ns.addr, brokerRole="SYNC_MASTER")
    try:
        for i in range(3):
            r = send(master.addr, "SyncT", b"m%d" % i)
            assert r.code == 11, (r.code, r.remark)
            assert r.ext_fields["msgId"], "the message was stored: it has an id"
        assert int(call(master.addr, 30, {"topic": "SyncT", "queueId": 0}).ext_fields["offset"]) == 3
    finally:
        master.stop()
        ns.stop()
