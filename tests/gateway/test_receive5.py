"""POP consumption by the official 5.x consumers: SimpleConsumer receive / ack / change invisible
time, redelivery of what was not acked (with its delivery attempt), the group's retry limit
ending in %DLQ%<group>, PushConsumer with failures, 4.x and 5.x clients on one topic, and a
kill -9 of the whole broker that loses nothing acknowledged and redelivers only what was not."""
import asyncio
import time

from mq.client.message import Message
from mq.client.producer import Producer
from mq.cluster import call, wait_for
from mq.gateway.pop import REVIVE_GROUP, revive_topic
from mq.wire.codes import RequestCode, ResponseCode

from tests.gateway.helpers import create_group, messages_of_topic, produce5, run_client5, wait_messages


def receive(gateway, group, topic, want, **kw):
    req = {"op": "receive", "endpoint": gateway.endpoint, "group": group, "topic": topic, "want": want,
           "timeout_s": 40, **kw}
    out = run_client5(req)
    assert not out["errors"], out["errors"]
    return out["received"]


def revive_settled(gateway) -> bool:
    """Every CK of the revive topic is acked or revived: the revive group's offset is at its end."""
    topic = revive_topic("TestCluster")
    end = call(gateway.broker.addr, RequestCode.GET_MAX_OFFSET, {"topic": topic, "queueId": 0})
    at = call(gateway.broker.addr, RequestCode.QUERY_CONSUMER_OFFSET,
              {"consumerGroup": REVIVE_GROUP, "topic": topic, "queueId": 0})
    return at.code == ResponseCode.SUCCESS and int(at.ext_fields["offset"]) == int(end.ext_fields["offset"])


def test_receive_and_ack_gets_every_message_once(gateway):
    topic = "G5Recv"
    gateway.create_topic(topic)
    specs = [{"body": f"r{i}", "tag": "t", "keys": [f"key{i}"], "props": {"i": str(i)}} for i in range(30)]
    ids = produce5(gateway, topic, specs)
    got = receive(gateway, "G5RecvGroup", topic, 30, then="ack")
    assert sorted(m["message_id"] for m in got) == sorted(ids)
    by_id = {m["message_id"]: m for m in got}
    for spec, mid in zip(specs, ids):
        m = by_id[mid]
        assert (m["body"], m["tag"], m["keys"], m["props"]["i"], m["attempt"], m["topic"]) == \
            (spec["body"], "t", spec["keys"], spec["props"]["i"], 1, topic)
    wait_for(lambda: revive_settled(gateway), 15, what="every CK settled by its acks")
    time.sleep(1.0)                                      # a revive round that finds nothing to send back
    assert not messages_of_topic(gateway, "%RETRY%G5RecvGroup")


def test_a_tag_filter_selects_on_the_broker(gateway):
    topic = "G5Tags"
    gateway.create_topic(topic)
    produce5(gateway, topic, [{"body": f"x{i}", "tag": "even" if i % 2 == 0 else "odd"} for i in range(10)])
    got = receive(gateway, "G5TagGroup", topic, 5, expression="even", then="ack")
    assert sorted(m["body"] for m in got) == [f"x{i}" for i in range(0, 10, 2)]


def test_what_is_not_acked_comes_back_with_its_next_attempt(gateway):
    topic = "G5Again"
    gateway.create_topic(topic)
    ids = produce5(gateway, topic, [{"body": f"a{i}"} for i in range(5)])
    first = receive(gateway, "G5AgainGroup", topic, 5, then="change", change_s=1)
    assert sorted(m["message_id"] for m in first) == sorted(ids) and {m["attempt"] for m in first} == {1}
    again = receive(gateway, "G5AgainGroup", topic, 5, then="ack")
    assert sorted(m["message_id"] for m in again) == sorted(ids)
    assert {m["attempt"] for m in again} == {2} and {m["topic"] for m in again} == {topic}


def test_past_the_groups_retry_limit_a_message_goes_to_its_dlq(gateway):
    topic, group = "G5Dlq", "G5DlqGroup"
    gateway.create_topic(topic)
    create_group(gateway, group, retryMaxTimes=1)
    (mid,) = produce5(gateway, topic, [{"body": "doomed"}])
    for attempt in (1, 2):
        (m,) = receive(gateway, group, topic, 1, then="change", change_s=1)
        assert (m["message_id"], m["attempt"]) == (mid, attempt)
    wait_for(lambda: messages_of_topic(gateway, f"%DLQ%{group}"), 20, what="the message in the DLQ")
    (dead,) = messages_of_topic(gateway, f"%DLQ%{group}")
    assert dead.properties["UNIQ_KEY"] == mid and dead.body == b"doomed"


def test_push_consumer_retries_what_its_listener_failed(gateway):
    topic = "G5Push"
    gateway.create_topic(topic)
    ids = produce5(gateway, topic, [{"body": f"p{i}"} for i in range(6)])
    out = run_client5({"op": "push", "endpoint": gateway.endpoint, "group": "G5PushGroup", "topic": topic,
                       "want": 6, "fail_first": 2, "timeout_s": 60})
    got = out["received"]
    failed, redelivered = got[:2], [m for m in got if m["attempt"] == 2]
    assert sorted({m["message_id"] for m in got}) == sorted(ids)
    assert sorted(m["message_id"] for m in redelivered) == sorted(m["message_id"] for m in failed)


def test_4x_producer_and_consumer_share_a_topic_with_5x_clients(gateway):
    """A 4.x producer's messages reach a 5.x consumer; a 5.x producer's reach a 4.x consumer
    (each group gets every message)."""
    topic = "G5Mixed"
    gateway.create_topic(topic)

    async def send4(n):
        async with Producer("G5MixedProducer", gateway.ns.addr) as p:
            return [(await p.send(Message(topic, f"v4-{i}".encode(), tags="four", keys=f"k4-{i}"))).msg_id
                    for i in range(n)]
    ids4 = asyncio.run(send4(5))
    ids5 = produce5(gateway, topic, [{"body": f"v5-{i}", "tag": "five"} for i in range(5)])
    got = receive(gateway, "G5MixedGroup5", topic, 10, then="ack")
    assert sorted(m["message_id"] for m in got) == sorted(ids4 + ids5)
    assert {m["tag"] for m in got if m["body"].startswith("v4-")} == {"four"}
    stored = wait_messages(gateway, topic, 10)                 # what a 4.x consumer reads
    assert sorted(m.properties["UNIQ_KEY"] for m in stored) == sorted(ids4 + ids5)


def test_kill_9_redelivers_what_was_not_acked_and_loses_nothing(gateway):
    topic, group = "G5Kill", "G5KillGroup"
    gateway.create_topic(topic)
    ids = produce5(gateway, topic, [{"body": f"k{i}"} for i in range(10)])
    acked = receive(gateway, group, topic, 5, then="ack", invisible_s=10)
    kept = receive(gateway, group, topic, 5, then="keep", invisible_s=10)
    assert len({m["message_id"] for m in acked + kept}) == 10
    gateway.broker.kill()
    gateway.broker.start()
    back = receive(gateway, group, topic, 5, then="ack", timeout_s=60)
    assert sorted(m["message_id"] for m in back) == sorted(m["message_id"] for m in kept)
    assert {m["attempt"] for m in back} == {2}
    assert set(ids) == {m["message_id"] for m in acked + back}


def test_the_endpoint_counts_into_the_brokers_metrics(gateway):
    """/metrics: each RPC by its answered code (latency histogram), and messages sent, received,
    acked (mq_grpc_*), from the gateway role's region of the stats block."""
    from tests.ops.test_metrics import scrape, total
    topic = "G5Metrics"
    gateway.create_topic(topic)
    produce5(gateway, topic, [{"body": f"x{i}"} for i in range(3)])
    receive(gateway, "G5MetricsGroup", topic, 3, then="ack")
    port = int(gateway.broker.options["metricsPort"])

    def counted():
        m = scrape(port)
        return (total(m, "mq_grpc_request_latency_seconds_count", rpc="SendMessage", code="OK") >= 3
                and total(m, "mq_grpc_request_latency_seconds_count", rpc="ReceiveMessage", code="OK") >= 1
                and total(m, "mq_grpc_request_latency_seconds_count", rpc="QueryRoute", code="OK") >= 1
                and total(m, "mq_grpc_messages_total", what="sent") >= 3
                and total(m, "mq_grpc_messages_total", what="received") >= 3
                and total(m, "mq_grpc_messages_total", what="acked") >= 3)
    wait_for(counted, 10, what="the gateway's counts in /metrics")
