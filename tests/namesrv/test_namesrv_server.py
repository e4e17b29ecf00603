"""The name server in-process over real TCP on 127.0.0.1: registration,
routes, cluster info, topic lists, expiry, housekeeping, KV config."""
from __future__ import annotations

import asyncio
import json
import struct
import zlib

from mq.remoting import RemotingClient, RequestCode, ResponseCode
from mq.wire.remoting import SERIALIZE_ROCKETMQ, decode_frame, encode_frame

from nshelpers import (CLUSTER, MASTER_ADDR, MASTER_HA, SLAVE_ADDR, SLAVE_HA, namesrv, register_cmd, route,
                      run, wait_for)

ROUTE_STD = ('{"brokerDatas":[{"brokerAddrs":{"0":"127.0.0.1:10911","1":"127.0.0.1:10921"},'
             '"brokerName":"broker-a","cluster":"DefaultCluster"}],"filterServerTable":{},'
             '"queueDatas":[{"brokerName":"broker-a","perm":6,"readQueueNums":4,"topicSysFlag":0,'
             '"writeQueueNums":4}]}')


async def _master_and_slave(ns_addr):
    """Registers broker-a master (TopicTest 4/4 perm 6, TBW102 8/8 perm 7) and its slave on two
    connections, as two broker processes would; returns (master client, slave client, responses)."""
    master, slave = RemotingClient(), RemotingClient()
    r_master = await master.invoke(ns_addr, register_cmd(master, topics={"TopicTest": (4, 4, 6),
                                                                         "TBW102": (8, 8, 7)}), 3)
    r_slave = await slave.invoke(ns_addr, register_cmd(slave, addr=SLAVE_ADDR, broker_id=1, ha=SLAVE_HA,
                                                       topics={"TopicTest": (4, 4, 6), "TBW102": (8, 8, 7)}), 3)
    return master, slave, r_master, r_slave


def test_register_master_and_slave_then_route_field_by_field(tmp_path):
    """A master and a slave register with real 103 frames; the master's answer carries no master
    address, the slave's carries masterAddr and the master's haServerAddr; the 105 route (version
    409 -> standard JSON) is exactly the spec's TopicRouteData shape, byte for byte."""
    async def main():
        async with namesrv(tmp_path / "kv.json") as (ns, addr):
            master, slave, r_master, r_slave = await _master_and_slave(addr)
            assert r_master.code == ResponseCode.SUCCESS and r_master.is_response
            assert r_master.ext_fields == {} and r_master.body == b""
            assert r_slave.code == ResponseCode.SUCCESS
            assert r_slave.ext_fields == {"masterAddr": MASTER_ADDR, "haServerAddr": MASTER_HA}

            resp = await route(master, addr, "TopicTest")
            assert resp.code == ResponseCode.SUCCESS and resp.remark is None
            assert resp.ext_fields is None      # Java attaches no custom header to this response
            assert resp.body.decode() == ROUTE_STD
            data = json.loads(resp.body)
            assert [b["brokerName"] for b in data["brokerDatas"]] == ["broker-a"]
            assert data["brokerDatas"][0]["brokerAddrs"] == {"0": MASTER_ADDR, "1": SLAVE_ADDR}
            assert data["brokerDatas"][0]["cluster"] == CLUSTER
            assert data["queueDatas"] == [{"brokerName": "broker-a", "perm": 6, "readQueueNums": 4,
                                           "topicSysFlag": 0, "writeQueueNums": 4}]
            tbw = json.loads((await route(master, addr, "TBW102")).body)
            assert tbw["queueDatas"][0]["perm"] == 7 and tbw["queueDatas"][0]["readQueueNums"] == 8
            ns.routes.check_invariants()
            await master.close()
            await slave.close()
    run(main())


def test_route_key_quoting_follows_request_version(tmp_path):
    """brokerAddrs keys are bare (fastjson default) for version < 401, as the C++ client (version
    63) gets them; quoted for version >= 401 or acceptStandardJsonOnly=true (spec 2.1, App. A.4)."""
    async def main():
        async with namesrv(tmp_path / "kv.json") as (ns, addr):
            master, slave, _, _ = await _master_and_slave(addr)
            old = (await route(master, addr, "TopicTest", version=63)).body.decode()
            assert old == ROUTE_STD.replace('"0":', "0:").replace('"1":', "1:")
            assert (await route(master, addr, "TopicTest", version=63,
                                acceptStandardJsonOnly=True)).body.decode() == ROUTE_STD
            assert (await route(master, addr, "TopicTest", version=401)).body.decode() == ROUTE_STD
            assert (await route(master, addr, "TopicTest", version=400)).body.decode() == old
            await master.close()
            await slave.close()
    run(main())


def test_cluster_info_106_and_topic_lists_206_224(tmp_path):
    """106 answers ClusterInfo with fastjson's bare brokerId keys (4.9.8 has no switch there);
    206 lists every topic; 224 lists the topics on a cluster's brokers and nothing for an
    unknown cluster."""
    async def main():
        async with namesrv(tmp_path / "kv.json") as (ns, addr):
            master, slave, _, _ = await _master_and_slave(addr)
            other = RemotingClient()
            await other.invoke(addr, register_cmd(other, name="broker-b", addr="127.0.0.1:20911",
                                                  ha="127.0.0.1:20912", cluster="OtherCluster",
                                                  topics={"OnlyB": (2, 2, 6)}), 3)
            resp = await master.invoke(addr, master.request(RequestCode.GET_BROKER_CLUSTER_INFO), 3)
            assert resp.code == ResponseCode.SUCCESS
            assert resp.body.decode() == (
                '{"brokerAddrTable":{'
                '"broker-a":{"brokerAddrs":{0:"127.0.0.1:10911",1:"127.0.0.1:10921"},"brokerName":"broker-a",'
                '"cluster":"DefaultCluster"},'
                '"broker-b":{"brokerAddrs":{0:"127.0.0.1:20911"},"brokerName":"broker-b","cluster":"OtherCluster"}},'
                '"clusterAddrTable":{"DefaultCluster":["broker-a"],"OtherCluster":["broker-b"]}}')

            resp = await master.invoke(addr, master.request(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER), 3)
            assert resp.code == ResponseCode.SUCCESS
            assert json.loads(resp.body) == {"topicList": ["OnlyB", "TBW102", "TopicTest"]}
            for cluster, expected in ((CLUSTER, ["TBW102", "TopicTest"]), ("OtherCluster", ["OnlyB"]),
                                      ("NoSuchCluster", [])):
                resp = await master.invoke(addr, master.request(RequestCode.GET_TOPICS_BY_CLUSTER,
                                                                {"cluster": cluster}), 3)
                assert resp.code == ResponseCode.SUCCESS
                assert json.loads(resp.body) == {"topicList": expected}, cluster
            for c in (master, slave, other):
                await c.close()
    run(main())


def test_unknown_topic_is_17_with_remark(tmp_path):
    """An unknown topic answers TOPIC_NOT_EXIST (17) with RocketMQ's remark, no body; the C++
    producer falls back to TBW102 on exactly this."""
    async def main():
        async with namesrv(tmp_path / "kv.json") as (ns, addr):
            client = RemotingClient()
            resp = await route(client, addr, "NoSuchTopic")
            assert resp.code == ResponseCode.TOPIC_NOT_EXIST == 17
            assert resp.remark == ("No topic route info in name server for the topic: NoSuchTopic\n"
                                   "See http://rocketmq.apache.org/docs/faq/ for further details.")
            assert resp.body == b""
            await client.close()
    run(main())


def test_queue_data_only_from_master_and_only_on_new_data_version(tmp_path):
    """Slaves never contribute queue data; a master's topic table is re-read only when its
    DataVersion changes (or on first registration), as RocketMQ does."""
    async def main():
        async with namesrv(tmp_path / "kv.json") as (ns, addr):
            c = RemotingClient()
            s = RemotingClient()
            await s.invoke(addr, register_cmd(s, addr=SLAVE_ADDR, broker_id=1, ha=SLAVE_HA,
                                              topics={"SlaveOnly": (4, 4, 6)}), 3)
            assert (await route(c, addr, "SlaveOnly")).code == ResponseCode.TOPIC_NOT_EXIST
            await c.invoke(addr, register_cmd(c, topics={"A": (4, 4, 6)}, counter=1), 3)
            # same DataVersion, different table: ignored
            await c.invoke(addr, register_cmd(c, topics={"A": (8, 8, 6), "B": (4, 4, 6)}, counter=1), 3)
            assert (await route(c, addr, "B")).code == ResponseCode.TOPIC_NOT_EXIST
            assert json.loads((await route(c, addr, "A")).body)["queueDatas"][0]["readQueueNums"] == 4
            # new DataVersion: read
            await c.invoke(addr, register_cmd(c, topics={"A": (8, 8, 6), "B": (4, 4, 6)}, counter=2), 3)
            assert json.loads((await route(c, addr, "A")).body)["queueDatas"][0]["readQueueNums"] == 8
            assert (await route(c, addr, "B")).code == ResponseCode.SUCCESS
            ns.routes.check_invariants()
            await c.close()
            await s.close()
    run(main())


def test_slave_registered_before_master_learns_no_master(tmp_path):
    """A slave registering while its master is absent gets no masterAddr/haServerAddr; after the
    master registers, the slave's next registration gets them."""
    async def main():
        async with namesrv(tmp_path / "kv.json") as (ns, addr):
            m, s = RemotingClient(), RemotingClient()
            r = await s.invoke(addr, register_cmd(s, addr=SLAVE_ADDR, broker_id=1, ha=SLAVE_HA), 3)
            assert r.code == ResponseCode.SUCCESS and r.ext_fields == {}
            await m.invoke(addr, register_cmd(m), 3)
            r = await s.invoke(addr, register_cmd(s, addr=SLAVE_ADDR, broker_id=1, ha=SLAVE_HA), 3)
            assert r.ext_fields == {"masterAddr": MASTER_ADDR, "haServerAddr": MASTER_HA}
            await m.close()
            await s.close()
    run(main())


def test_silent_broker_expires_and_its_connection_is_closed(tmp_path):
    """With brokerExpiredMillis=400: a master that stops registering leaves brokerAddrs while its
    still-registering slave keeps the brokerName and the topic's queue data (consumers can read from
    it); once the slave goes silent too, the topic, the brokerName and the cluster are gone.  The
    server closes an expired broker's connection (the master, on a raw socket here, sees EOF)."""
    async def main():
        async with namesrv(tmp_path / "kv.json", brokerExpiredMillis=400,
                           scanNotActiveBrokerInterval=100) as (ns, addr):
            host, port = addr.split(":")
            reader, writer = await asyncio.open_connection(host, int(port))
            tmp = RemotingClient()
            writer.write(encode_frame(register_cmd(tmp, topics={"TopicTest": (4, 4, 6), "TBW102": (8, 8, 7)})))
            prefix = await reader.readexactly(4)
            assert decode_frame(prefix + await reader.readexactly(struct.unpack(">I", prefix)[0])).code == 0
            slave, probe = RemotingClient(), RemotingClient()
            await slave.invoke(addr, register_cmd(slave, addr=SLAVE_ADDR, broker_id=1, ha=SLAVE_HA), 3)

            async def slave_alive():
                while True:
                    await slave.invoke(addr, register_cmd(slave, addr=SLAVE_ADDR, broker_id=1, ha=SLAVE_HA), 3)
                    await asyncio.sleep(0.1)
            keep = asyncio.create_task(slave_alive())

            assert await asyncio.wait_for(reader.read(1), 3) == b""     # closed by the server
            assert MASTER_ADDR not in ns.routes.broker_live_table
            data = json.loads((await route(probe, addr, "TopicTest")).body)
            assert data["brokerDatas"][0]["brokerAddrs"] == {"1": SLAVE_ADDR}
            assert data["queueDatas"][0]["brokerName"] == "broker-a"
            ns.routes.check_invariants()
            writer.close()

            keep.cancel()

            async def all_gone():
                return (await route(probe, addr, "TopicTest")).code == ResponseCode.TOPIC_NOT_EXIST
            await wait_for(all_gone, what="slave expiry")
            assert ns.routes.broker_addr_table == {} and ns.routes.cluster_addr_table == {}
            assert ns.routes.topic_queue_table == {} and ns.routes.broker_live_table == {}
            for c in (slave, probe):
                await c.close()
    run(main())


def test_connection_close_removes_the_broker_registered_on_it(tmp_path):
    """Closing the connection a broker registered on removes it at once (BrokerHousekeepingService),
    long before expiry; a broker that re-registered over a new connection is not removed when its
    old connection closes."""
    async def main():
        async with namesrv(tmp_path / "kv.json") as (ns, addr):
            probe = RemotingClient()
            b = RemotingClient()
            await b.invoke(addr, register_cmd(b, name="broker-b", addr="127.0.0.1:20911",
                                              topics={"TopicB": (4, 4, 6)}), 3)
            old_conn = ns.routes.broker_live_table["127.0.0.1:20911"].conn
            b2 = RemotingClient()      # the same broker, reconnected
            await b2.invoke(addr, register_cmd(b2, name="broker-b", addr="127.0.0.1:20911",
                                               topics={"TopicB": (4, 4, 6)}), 3)
            assert ns.routes.broker_live_table["127.0.0.1:20911"].conn is not old_conn
            await b.close()
            await wait_for(lambda: old_conn.closed, what="old connection seen closed")
            await asyncio.sleep(0.05)
            assert (await route(probe, addr, "TopicB")).code == ResponseCode.SUCCESS

            m = RemotingClient()
            await m.invoke(addr, register_cmd(m, topics={"TopicTest": (4, 4, 6)}), 3)
            assert (await route(probe, addr, "TopicTest")).code == ResponseCode.SUCCESS
            await m.close()

            async def gone():
                return (await route(probe, addr, "TopicTest")).code == ResponseCode.TOPIC_NOT_EXIST
            await wait_for(gone, timeout_s=2, what="removal on close")
            assert "broker-a" not in ns.routes.broker_addr_table
            assert ns.routes.cluster_addr_table == {CLUSTER: {"broker-b"}}
            ns.routes.check_invariants()
            await b2.close()
            await probe.close()
    run(main())


def test_unregister_broker_104(tmp_path):
    """UNREGISTER_BROKER removes one brokerId; the brokerName and its topics go with its last address."""
    async def main():
        async with namesrv(tmp_path / "kv.json") as (ns, addr):
            master, slave, _, _ = await _master_and_slave(addr)

            def unreg(client, a, bid):
                return client.request(RequestCode.UNREGISTER_BROKER, {"brokerName": "broker-a", "brokerAddr": a,
                                                                      "clusterName": CLUSTER, "brokerId": bid})
            r = await master.invoke(addr, unreg(master, MASTER_ADDR, 0), 3)
            assert r.code == ResponseCode.SUCCESS
            data = json.loads((await route(master, addr, "TopicTest")).body)
            assert data["brokerDatas"][0]["brokerAddrs"] == {"1": SLAVE_ADDR}
            await slave.invoke(addr, unreg(slave, SLAVE_ADDR, 1), 3)
            assert (await route(master, addr, "TopicTest")).code == ResponseCode.TOPIC_NOT_EXIST
            assert ns.routes.cluster_addr_table == {} and ns.routes.broker_live_table == {}
            await master.close()
            await slave.close()
    run(main())


def test_two_name_servers_do_not_talk(tmp_path):
    """Two name servers side by side share nothing: a broker registered with one is unknown to the
    other, and removal on one leaves the other's copy alone."""
    async def main():
        async with namesrv(tmp_path / "kv1.json") as (ns1, addr1), \
                namesrv(tmp_path / "kv2.json") as (ns2, addr2):
            b = RemotingClient()
            probe = RemotingClient()
            await b.invoke(addr1, register_cmd(b, topics={"TopicTest": (4, 4, 6)}), 3)
            assert (await route(probe, addr1, "TopicTest")).code == ResponseCode.SUCCESS
            await asyncio.sleep(0.1)
            assert (await route(probe, addr2, "TopicTest")).code == ResponseCode.TOPIC_NOT_EXIST
            info = await probe.invoke(addr2, probe.request(RequestCode.GET_BROKER_CLUSTER_INFO), 3)
            assert info.body == b'{"brokerAddrTable":{},"clusterAddrTable":{}}'

            await b.invoke(addr2, register_cmd(b, topics={"TopicTest": (4, 4, 6)}), 3)
            b.close_connection(addr1)

            async def gone_on_1():
                return (await route(probe, addr1, "TopicTest")).code == ResponseCode.TOPIC_NOT_EXIST
            await wait_for(gone_on_1, what="removal on ns1")
            assert (await route(probe, addr2, "TopicTest")).code == ResponseCode.SUCCESS
            await b.close()
            await probe.close()
    run(main())


def test_kv_config_round_trip_and_persists_across_restart(tmp_path):
    """PUT/GET/DELETE_KV_CONFIG and GET_KVLIST_BY_NAMESPACE work; the table is written to
    kvConfigPath in Java's {"configTable":...} shape and is back after a restart; missing items
    answer QUERY_NOT_FOUND (22)."""
    kv_path = tmp_path / "namesrv" / "kvConfig.json"

    async def first():
        async with namesrv(kv_path) as (ns, addr):
            c = RemotingClient()
            for ns_name, key, value in (("ORDER_TOPIC_CONFIG", "TopicOrder", "broker-a:4"),
                                        ("ns1", "k1", "v1"), ("ns1", "k2", "v2")):
                r = await c.invoke(addr, c.request(RequestCode.PUT_KV_CONFIG,
                                                   {"namespace": ns_name, "key": key, "value": value}), 3)
                assert r.code == ResponseCode.SUCCESS
            r = await c.invoke(addr, c.request(RequestCode.DELETE_KV_CONFIG, {"namespace": "ns1", "key": "k2"}), 3)
            assert r.code == ResponseCode.SUCCESS
            await c.close()

    async def second():
        async with namesrv(kv_path) as (ns, addr):
            c = RemotingClient()
            r = await c.invoke(addr, c.request(RequestCode.GET_KV_CONFIG, {"namespace": "ns1", "key": "k1"}), 3)
            assert r.code == ResponseCode.SUCCESS and r.ext_fields == {"value": "v1"}
            r = await c.invoke(addr, c.request(RequestCode.GET_KV_CONFIG, {"namespace": "ns1", "key": "k2"}), 3)
            assert r.code == ResponseCode.QUERY_NOT_FOUND == 22
            assert r.remark == "No config item, Namespace: ns1 Key: k2"
            r = await c.invoke(addr, c.request(RequestCode.GET_KVLIST_BY_NAMESPACE, {"namespace": "ns1"}), 3)
            assert r.code == ResponseCode.SUCCESS and json.loads(r.body) == {"table": {"k1": "v1"}}
            r = await c.invoke(addr, c.request(RequestCode.GET_KVLIST_BY_NAMESPACE, {"namespace": "nope"}), 3)
            assert r.code == ResponseCode.QUERY_NOT_FOUND
            # the register answer carries the ORDER_TOPIC_CONFIG namespace as a KVTable
            r = await c.invoke(addr, register_cmd(c, topics={"TopicOrder": (4, 4, 6)}), 3)
            assert json.loads(r.body) == {"table": {"TopicOrder": "broker-a:4"}}
            await c.close()

    run(first())
    on_disk = json.loads(kv_path.read_text())
    assert on_disk == {"configTable": {"ORDER_TOPIC_CONFIG": {"TopicOrder": "broker-a:4"}, "ns1": {"k1": "v1"}}}
    run(second())


def test_order_topic_conf_in_route_when_enabled(tmp_path):
    """With orderMessageEnable=true the route carries orderTopicConf from the ORDER_TOPIC_CONFIG
    KV namespace (absent when the topic has none, since fastjson skips nulls)."""
    async def main():
        async with namesrv(tmp_path / "kv.json", orderMessageEnable=True) as (ns, addr):
            c = RemotingClient()
            await c.invoke(addr, c.request(RequestCode.PUT_KV_CONFIG, {"namespace": "ORDER_TOPIC_CONFIG",
                                                                       "key": "T1", "value": "broker-a:4"}), 3)
            await c.invoke(addr, register_cmd(c, topics={"T1": (4, 4, 6), "T2": (4, 4, 6)}), 3)
            assert json.loads((await route(c, addr, "T1")).body)["orderTopicConf"] == "broker-a:4"
            assert "orderTopicConf" not in json.loads((await route(c, addr, "T2")).body)
            await c.close()
    run(main())


def test_delete_topic_216_whole_or_per_cluster(tmp_path):
    """DELETE_TOPIC_IN_NAMESRV drops a topic's route; with clusterName only that cluster's queues."""
    async def main():
        async with namesrv(tmp_path / "kv.json") as (ns, addr):
            a, b = RemotingClient(), RemotingClient()
            await a.invoke(addr, register_cmd(a, topics={"T": (4, 4, 6), "U": (4, 4, 6)}), 3)
            await b.invoke(addr, register_cmd(b, name="broker-b", addr="127.0.0.1:20911", cluster="C2",
                                              topics={"T": (2, 2, 6)}), 3)
            r = await a.invoke(addr, a.request(RequestCode.DELETE_TOPIC_IN_NAMESRV,
                                               {"topic": "T", "clusterName": "C2"}), 3)
            assert r.code == ResponseCode.SUCCESS
            data = json.loads((await route(a, addr, "T")).body)
            assert [q["brokerName"] for q in data["queueDatas"]] == ["broker-a"]
            await a.invoke(addr, a.request(RequestCode.DELETE_TOPIC_IN_NAMESRV, {"topic": "U"}), 3)
            assert (await route(a, addr, "U")).code == ResponseCode.TOPIC_NOT_EXIST
            ns.routes.check_invariants()
            await a.close()
            await b.close()
    run(main())


def test_compressed_body_crc_and_bad_requests(tmp_path):
    """A compressed RegisterBrokerBody (zlib of length-prefixed DataVersion JSON, compact topic
    lines and the filter list, built here by hand) registers its topics; a bodyCrc32 mismatch
    answers SYSTEM_ERROR "crc32 not match" and registers nothing; a missing required header field
    and a body that is not JSON answer SYSTEM_ERROR naming the problem; unknown codes answer 3."""
    def lp(b: bytes) -> bytes:
        return struct.pack(">i", len(b)) + b

    raw = (lp(b'{"counter":3,"timestamp":1700000000000}') + struct.pack(">i", 2)
           + lp(b"Zipped 8 8 6 SINGLE_TAG") + lp(b"Zipped2 2 2 4 SINGLE_TAG") + lp(b"[]"))
    compressed = zlib.compress(raw, 9)

    async def main():
        async with namesrv(tmp_path / "kv.json") as (ns, addr):
            c = RemotingClient()
            r = await c.invoke(addr, register_cmd(c, body=compressed, compressed=True), 3)
            assert r.code == ResponseCode.SUCCESS
            q = json.loads((await route(c, addr, "Zipped")).body)["queueDatas"][0]
            assert (q["readQueueNums"], q["writeQueueNums"], q["perm"]) == (8, 8, 6)
            assert ns.routes.broker_live_table[MASTER_ADDR].data_version.counter == 3

            d = RemotingClient()
            r = await d.invoke(addr, register_cmd(d, name="broker-x", addr="127.0.0.1:30911",
                                                  topics={"X": (4, 4, 6)}, crc=12345), 3)
            assert (r.code, r.remark) == (ResponseCode.SYSTEM_ERROR, "crc32 not match")
            assert "broker-x" not in ns.routes.broker_addr_table

            cmd = c.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {})
            r = await c.invoke(addr, cmd, 3)
            assert r.code == ResponseCode.SYSTEM_ERROR and "topic" in r.remark
            r = await d.invoke(addr, register_cmd(d, name="broker-x", addr="127.0.0.1:30911", body=b"{not json"), 3)
            assert r.code == ResponseCode.SYSTEM_ERROR and "not JSON" in r.remark
            r = await c.invoke(addr, c.request(9999), 3)
            assert r.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
            ns.routes.check_invariants()
            await c.close()
            await d.close()
    run(main())


def test_query_data_version_322_and_write_perm_205_327(tmp_path):
    """QUERY_DATA_VERSION says whether the broker's DataVersion differs from the registered one and
    returns the name server's copy; WIPE/ADD_WRITE_PERM_OF_BROKER rewrite perm on every topic of
    the brokerName and report how many."""
    async def main():
        async with namesrv(tmp_path / "kv.json") as (ns, addr):
            c = RemotingClient()
            await c.invoke(addr, register_cmd(c, topics={"A": (4, 4, 6), "B": (4, 4, 6)}, counter=5), 3)
            hdr = {"brokerName": "broker-a", "brokerAddr": MASTER_ADDR, "clusterName": CLUSTER, "brokerId": 0}
            same = b'{"counter":5,"timestamp":1700000000000}'
            r = await c.invoke(addr, c.request(RequestCode.QUERY_DATA_VERSION, hdr, same), 3)
            assert r.code == ResponseCode.SUCCESS and r.ext_fields == {"changed": "false"}
            assert json.loads(r.body) == {"counter": 5, "timestamp": 1700000000000}
            r = await c.invoke(addr, c.request(RequestCode.QUERY_DATA_VERSION, hdr,
                                               b'{"counter":6,"timestamp":1700000000000}'), 3)
            assert r.ext_fields == {"changed": "true"}

            r = await c.invoke(addr, c.request(RequestCode.WIPE_WRITE_PERM_OF_BROKER, {"brokerName": "broker-a"}), 3)
            assert r.code == ResponseCode.SUCCESS and r.ext_fields == {"wipeTopicCount": "2"}
            assert json.loads((await route(c, addr, "A")).body)["queueDatas"][0]["perm"] == 4
            r = await c.invoke(addr, c.request(RequestCode.ADD_WRITE_PERM_OF_BROKER, {"brokerName": "broker-a"}), 3)
            assert r.ext_fields == {"addTopicCount": "2"}
            assert json.loads((await route(c, addr, "A")).body)["queueDatas"][0]["perm"] == 6
            await c.close()
    run(main())


def test_spec_test_vectors_over_a_raw_socket(tmp_path):
    """The JSON and ROCKETMQ-binary frames of spec Appendix C, sent as raw bytes, get responses in
    the request's serialize type with opaque 0 and the response flag (spec 1.1, 1.5)."""
    json_frame = bytes.fromhex("0000008700000083") + (
        b'{"code":105,"extFields":{"topic":"TopicTest"},"flag":0,"language":"JAVA","opaque":0,'
        b'"serializeTypeCurrentRPC":"JSON","version":409}')
    bin_frame = bytes.fromhex("0000002d010000290069000199000000000000000000000000000000140005746f70696300000009"
                              "546f70696354657374")
    assert len(json_frame) == 139 and len(bin_frame) == 49

    async def exchange(addr, frame):
        host, port = addr.split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(frame)
        prefix = await reader.readexactly(4)
        rest = await reader.readexactly(struct.unpack(">I", prefix)[0])
        writer.close()
        return prefix + rest

    async def main():
        async with namesrv(tmp_path / "kv.json") as (ns, addr):
            c = RemotingClient()
            await c.invoke(addr, register_cmd(c, topics={"TopicTest": (4, 4, 6)}), 3)
            for frame, stype in ((json_frame, 0), (bin_frame, SERIALIZE_ROCKETMQ)):
                raw = await exchange(addr, frame)
                assert raw[4] == stype
                resp = decode_frame(raw)
                assert (resp.code, resp.opaque, resp.flag) == (0, 0, 1)
                assert json.loads(resp.body)["queueDatas"][0]["writeQueueNums"] == 4
            await c.close()
    run(main())
