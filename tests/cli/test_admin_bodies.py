"""The admin bodies a broker answers are the bytes RocketMQ 4.9.8's own classes give through
fastjson 1.2.69, so RocketMQ's mqadmin, rocketmq-dashboard and rocketmq-exporter decode them.

Two halves:
  * the encoder (mq.wire.fastjson, mq.wire.adminbodies) against reference bytes that fastjson
    itself wrote: fastjson/vectors.json holds, per body class, inputs and what
    fastjson/Vectors.java (RocketMQ 4.9.8's classes filled the way AdminBrokerProcessor fills
    them, fastjson 1.2.69's encode) made of them.  Object keys (MessageQueue), bare integers,
    Java doubles, fastjson's escapes and Java's HashMap / HashSet / ConcurrentHashMap iteration
    orders included: equal byte for byte.
  * a live broker (mq.cluster): each body it answers (28, 38, 41, 202, 203, 204, 208, 300, 315,
    317, 321) has exactly the class's fields with their JSON types, its maps in the order the
    Java broker's map would iterate them, and values that agree with what the broker holds; and
    our tools read them back.

Regenerate the vectors (needs a JDK, fastjson 1.2.69 and RocketMQ 4.9.8's common classes):
see the comment at the top of fastjson/Vectors.java."""
from __future__ import annotations

import asyncio
import json
import os
import re

import pytest

from mq.broker.metadata import dumps as metadata_dumps
from mq.client import Producer, PushConsumer
from mq.wire import adminbodies as B
from mq.wire.fastjson import Key, chm_order, hashmap_order, java_string_hash, loads
from tests.cli.adminkit import consumed_cluster
from tests.client.clientkit import Collector, message, run, uniq, until
from mq.cluster import call

VECTORS = json.load(open(os.path.join(os.path.dirname(__file__), "fastjson", "vectors.json"), encoding="utf-8"))


def _conn(c):
    return B.connection(c["clientId"], c["clientAddr"], c["language"], c["version"])


def _sub(s):
    return B.subscription_data(s["topic"], s["subString"], s["tags"], s["subVersion"])


def encode(body: str, i: dict) -> bytes:
    """Our encoder for one vector's input, as the broker calls it."""
    if body == "ConsumeStats":
        return B.encode_consume_stats(i["rows"], i["consumeTps"])
    if body == "TopicStatsTable":
        return B.encode_topic_stats(i["rows"])
    if body == "ConsumeStatsList":
        return B.encode_consume_stats_list(
            i["brokerAddr"], [(g, [B.consume_stats(s["rows"], s["consumeTps"]) for s in stats])
                              for g, stats in i["groups"]], i["totalDiff"])
    if body == "ConsumerConnection":
        return B.encode_consumer_connection([_conn(c) for c in i["conns"]], {s["topic"]: _sub(s) for s in i["subs"]},
                                            i["consumeType"], i["messageModel"], i["consumeFromWhere"])
    if body == "ProducerConnection":
        return B.encode_producer_connection([_conn(c) for c in i["conns"]])
    if body == "KVTable":
        return B.encode_kv_table(dict(i["table"]), i["capacity"])
    if body == "BrokerStatsData":
        return B.encode_broker_stats_data(i)
    if body == "GroupList":
        return B.encode_group_list(i["groups"])
    if body == "LockBatchResponseBody":
        return B.encode_lock_batch(i["mqs"])
    if body == "QueryConsumeQueueResponseBody":
        return B.encode_query_consume_queue(i["min"], i["max"], i.get("entries"),      # (nulls: left out of the file)
                                            _sub(i["sub"]) if i.get("sub") else None, i.get("filterData"))
    if body == "GetConsumerListByGroupResponseBody":
        return metadata_dumps({"consumerIdList": i["ids"]})          # mq.broker.admin.consumer_list's body
    raise AssertionError(body)


@pytest.mark.parametrize("n", range(len(VECTORS)), ids=[f"{v['body']}-{n}" for n, v in enumerate(VECTORS)])
def test_encoder_equals_fastjson(n):
    """Each body class, encoded here, is byte for byte what fastjson 1.2.69 wrote for the same
    RocketMQ 4.9.8 object (fastjson/vectors.json)."""
    v = VECTORS[n]
    assert encode(v["body"], v["input"]).decode("utf-8") == v["expected"]


@pytest.mark.parametrize("n", [n for n, v in enumerate(VECTORS) if v["body"] in ("ConsumeStats", "TopicStatsTable",
                                                                                 "ConsumeStatsList")])
def test_decoders_read_fastjson_text(n):
    """Our tools read fastjson's object-keyed maps back into the rows they were made of."""
    v = VECTORS[n]
    text = v["expected"].encode()
    key = lambda r: (r["topic"], r["brokerName"], r["queueId"])      # noqa: E731
    if v["body"] == "ConsumeStats":
        rows, tps = B.decode_consume_stats(text)
        assert tps == v["input"]["consumeTps"]
        assert [{k: r[k] for k in v["input"]["rows"][0]} for r in rows] == sorted(v["input"]["rows"], key=key) \
            if v["input"]["rows"] else rows == []
        assert all(r["diff"] == r["brokerOffset"] - r["consumerOffset"] for r in rows)
    elif v["body"] == "TopicStatsTable":
        assert B.decode_topic_stats(text) == sorted(v["input"]["rows"], key=key)
    else:
        got = B.decode_consume_stats_list(text)
        assert got["brokerAddr"] == v["input"]["brokerAddr"] and got["totalDiff"] == v["input"]["totalDiff"]
        assert [(g, len(s)) for g, s in got["groups"]] == [(g, len(s)) for g, s in v["input"]["groups"]]


# ---- a live broker --------------------------------------------------------------------------------------------

MQ_FIELDS = ["brokerName", "queueId", "topic"]


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """A broker with a 4-queue topic of 20 messages (5 a queue); group CG consumed them (offline now)."""
    with consumed_cluster(str(tmp_path_factory.mktemp("bodies")), "bodies", 20) as cluster:
        yield cluster


def _ok(broker, code, ext=None, body=b""):
    r = call(broker.addr, code, ext, body)
    assert r.code == 0, (code, r.code, r.remark)
    return r.body


def _mq_map_in_java_order(table: dict, queue_order: list[tuple]) -> None:
    """`table` (parsed) is keyed by MessageQueue objects and iterates as a Java HashMap filled in
    `queue_order` (topic, brokerName, queueId) does."""
    keys = list(table)
    assert all(isinstance(k, Key) and sorted(k.fields()) == MQ_FIELDS for k in keys)
    expected = hashmap_order([Key.message_queue(*q) for q in queue_order])
    assert [tuple(k) for k in keys] == [tuple(k) for k in expected]


def _text_fields(body: bytes, field: str) -> list[str]:
    """The literal texts of every `"field":value` in a body (to check number forms)."""
    return re.findall(rf'"{field}":([^,}}\]]+)', body.decode())


def test_topic_stats_table(live):
    """GET_TOPIC_STATS_INFO (202): TopicStatsTable, MessageQueue keys in HashMap order, each
    TopicOffset exactly {lastUpdateTimestamp, maxOffset, minOffset} as longs, 5 messages a queue."""
    ns, broker, topic, group = live
    body = _ok(broker, 202, {"topic": topic})
    data = loads(body)
    assert list(data) == ["offsetTable"]
    _mq_map_in_java_order(data["offsetTable"], [(topic, "broker-a", q) for q in range(4)])
    for k, off in data["offsetTable"].items():
        assert list(off) == ["lastUpdateTimestamp", "maxOffset", "minOffset"]
        assert (off["minOffset"], off["maxOffset"]) == (0, 5) and off["lastUpdateTimestamp"] > 1.7e12
    assert B.encode_topic_stats(B.decode_topic_stats(body)) == body


def test_consume_stats(live):
    """GET_CONSUME_STATS (208): ConsumeStats {consumeTps (a Java double), offsetTable {MQ:
    OffsetWrapper}}: each queue's broker offset 5, the group's 5, lastTimestamp the store time of
    the last message it consumed; a group with no offsets gets consumerOffset 0 (not -1)."""
    ns, broker, topic, group = live
    body = _ok(broker, 208, {"consumerGroup": group, "topic": topic})
    data = loads(body)
    assert list(data) == ["consumeTps", "offsetTable"] and "." in _text_fields(body, "consumeTps")[0]
    _mq_map_in_java_order(data["offsetTable"], [(topic, "broker-a", q) for q in range(4)])
    stats = loads(_ok(broker, 202, {"topic": topic}))["offsetTable"]
    for k, w in data["offsetTable"].items():
        assert list(w) == ["brokerOffset", "consumerOffset", "lastTimestamp"]
        assert (w["brokerOffset"], w["consumerOffset"]) == (5, 5)
        assert w["lastTimestamp"] == stats[k]["lastUpdateTimestamp"]      # the 5th is the last stored
    rows, _ = B.decode_consume_stats(body)
    assert B.encode_consume_stats(rows, data["consumeTps"]) == body
    other = loads(_ok(broker, 208, {"consumerGroup": uniq("CG_none"), "topic": topic}))
    assert {(w["consumerOffset"], w["lastTimestamp"]) for w in other["offsetTable"].values()} == {(0, 0)}


def test_consume_stats_list(live):
    """GET_BROKER_CONSUME_STATS (317): ConsumeStatsList {brokerAddr, consumeStatsList [{group:
    [ConsumeStats per topic]}], totalDiff}: every subscription group of the broker, one map each;
    the consumed group's topic with no lag, totalDiff the sum over all."""
    ns, broker, topic, group = live
    body = _ok(broker, 317, {"isOrder": "false", "timeoutMillis": 5000})
    data = loads(body)
    assert list(data) == ["brokerAddr", "consumeStatsList", "totalDiff"] and data["brokerAddr"] == broker.addr
    assert all(len(m) == 1 for m in data["consumeStatsList"])
    groups = json.loads(_ok(broker, 201))["subscriptionGroupTable"]
    assert {g for m in data["consumeStatsList"] for g in m} == set(groups)
    mine = next(m[group] for m in data["consumeStatsList"] if group in m)
    ours = [s for s in mine if any(k.fields()["topic"] == topic for k in s["offsetTable"])]
    assert len(ours) == 1 and {w["consumerOffset"] for w in ours[0]["offsetTable"].values()} == {5}
    total = sum(w["brokerOffset"] - w["consumerOffset"] for m in data["consumeStatsList"] for stats in m.values()
                for s in stats for w in s["offsetTable"].values())
    assert data["totalDiff"] == total
    assert B.decode_consume_stats_list(body)["totalDiff"] == total


def test_runtime_info_kv_table(live):
    """GET_BROKER_RUNTIME_INFO (28): KVTable {"table": {String: String}}, in the order of
    RocketMQ's HashMap(64) -- every value a string."""
    ns, broker, *_ = live
    body = _ok(broker, 28)
    data = loads(body)
    assert list(data) == ["table"] and all(isinstance(v, str) for v in data["table"].values())
    keys = list(data["table"])
    assert keys == hashmap_order(keys, initial_capacity=64)
    assert data["table"]["brokerVersionDesc"] == "V4_9_8"


def test_connections(live):
    """GET_CONSUMER_CONNECTION_LIST (203) and GET_PRODUCER_CONNECTION_LIST (204): Connection
    {clientAddr, clientId, language (a name), version}; ConsumerConnection's subscriptionTable a
    ConcurrentHashMap of SubscriptionData with codeSet the tags' String.hashCode() and tagsSet,
    both in HashSet order; GET_CONSUMER_LIST_BY_GROUP (38) {"consumerIdList": [..]}."""
    ns, broker, _, group = live
    pg, cg, topic = uniq("PG_b"), uniq("CG_b"), uniq("T_conn")       # a topic of its own: others count messages

    async def go():
        async with Producer(pg, ns.addr) as prod:
            await prod.send(message(topic, 1, "TagA"))
            cons = PushConsumer(cg, ns.addr, listener=Collector())
            cons.subscribe(topic, "TagA || TagB || TagC")
            await cons.start()
            try:
                async def registered():
                    return (await asyncio.to_thread(call, broker.addr, 203, {"consumerGroup": cg})).code == 0
                await until(registered, 30, "the consumer registered")
                c_body = await asyncio.to_thread(_ok, broker, 203, {"consumerGroup": cg})
                p_body = await asyncio.to_thread(_ok, broker, 204, {"producerGroup": pg})
                ids_body = await asyncio.to_thread(_ok, broker, 38, {"consumerGroup": cg})
                return c_body, p_body, ids_body, prod.instance.client_id, cons.instance.client_id
            finally:
                await cons.shutdown()
    c_body, p_body, ids_body, pid, cid = run(go())
    cc = loads(c_body)
    assert list(cc) == ["connectionSet", "consumeFromWhere", "consumeType", "messageModel", "subscriptionTable"]
    (conn,) = cc["connectionSet"]
    assert list(conn) == ["clientAddr", "clientId", "language", "version"] and conn["clientId"] == cid
    assert isinstance(conn["version"], int) and conn["language"].isupper()
    subs = cc["subscriptionTable"]
    assert list(subs) == chm_order(list(subs))
    sd = subs[topic]
    assert list(sd) == ["classFilterMode", "codeSet", "expressionType", "subString", "subVersion", "tagsSet", "topic"]
    assert sd["tagsSet"] == hashmap_order(["TagA", "TagB", "TagC"])
    assert sd["codeSet"] == hashmap_order([java_string_hash(t) for t in ("TagA", "TagB", "TagC")])
    assert sd["subString"] == "TagA || TagB || TagC" and sd["expressionType"] == "TAG"
    pc = loads(p_body)
    assert list(pc) == ["connectionSet"] and [c["clientId"] for c in pc["connectionSet"]] == [pid]
    assert json.loads(ids_body) == {"consumerIdList": [cid]}


def test_broker_stats_data_and_group_list(live):
    """VIEW_BROKER_STATS_DATA (315): BrokerStatsData {statsDay, statsHour, statsMinute} of
    BrokerStatsItem {avgpt, sum, tps} with avgpt and tps Java doubles, sum a long (the 20 messages
    put today); QUERY_TOPIC_CONSUME_BY_WHO (300): GroupList {"groupList": [...]}."""
    ns, broker, topic, group = live
    body = _ok(broker, 315, {"statsName": "TOPIC_PUT_NUMS", "statsKey": topic})
    data = loads(body)
    assert list(data) == ["statsDay", "statsHour", "statsMinute"]
    assert all(list(item) == ["avgpt", "sum", "tps"] for item in data.values())
    assert data["statsDay"]["sum"] >= 20 and all("." in t or "E" in t for t in _text_fields(body, "tps"))
    groups = loads(_ok(broker, 300, {"topic": topic}))
    assert list(groups) == ["groupList"] and group in groups["groupList"]
    assert groups["groupList"] == hashmap_order(groups["groupList"])


def test_lock_batch(live):
    """LOCK_BATCH_MQ (41): LockBatchResponseBody {"lockOKMQSet": [MessageQueue]} in HashSet order."""
    ns, broker, topic, group = live
    mqs = [{"topic": topic, "brokerName": "broker-a", "queueId": q} for q in range(4)]
    body = _ok(broker, 41, None, json.dumps({"consumerGroup": group, "clientId": "c1", "mqSet": mqs}).encode())
    data = loads(body)
    assert list(data) == ["lockOKMQSet"] and all(list(m) == MQ_FIELDS for m in data["lockOKMQSet"])
    got = [(m["topic"], m["brokerName"], m["queueId"]) for m in data["lockOKMQSet"]]
    assert got == [tuple(k.fields()[f] for f in ("topic", "brokerName", "queueId"))
                   for k in hashmap_order([Key.message_queue(topic, "broker-a", q) for q in range(4)])]
    _ok(broker, 42, None, json.dumps({"consumerGroup": group, "clientId": "c1", "mqSet": mqs}).encode())


def test_query_consume_queue(live):
    """QUERY_CONSUME_QUEUE (321): QueryConsumeQueueResponseBody {filterData, maxQueueIndex,
    minQueueIndex, queueData [{eval, physicOffset, physicSize, tagsCode}], subscriptionData}:
    the entries from the index asked, each pointing at its message (VIEW_MESSAGE_BY_ID reads a
    record of that size there), TagA's hash as tagsCode; an index past the end is SUCCESS with a
    remark and no body; an unknown queue SYSTEM_ERROR."""
    ns, broker, topic, group = live
    body = _ok(broker, 321, {"topic": topic, "queueId": 1, "index": 2, "count": 10})
    data = loads(body)
    assert list(data) == ["maxQueueIndex", "minQueueIndex", "queueData"]
    assert (data["minQueueIndex"], data["maxQueueIndex"]) == (0, 5) and len(data["queueData"]) == 3
    for e in data["queueData"]:
        assert list(e) == ["eval", "physicOffset", "physicSize", "tagsCode"] and e["tagsCode"] == 2598919
        assert len(_ok(broker, 33, {"offset": e["physicOffset"]})) == e["physicSize"]
    with_group = loads(_ok(broker, 321, {"topic": topic, "queueId": 1, "index": 0, "count": 1,
                                         "consumerGroup": group}))
    assert with_group["filterData"] == f"{group}@{topic} is not online!" and "subscriptionData" not in with_group
    r = call(broker.addr, 321, {"topic": topic, "queueId": 1, "index": 9, "count": 1})
    assert r.code == 0 and not r.body and "Index 9 of 1@" in r.remark
    assert call(broker.addr, 321, {"topic": topic, "queueId": 7, "index": 0}).code == 1
