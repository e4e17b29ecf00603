"""Message types for 5.x producers: RocketMQ 5's topic attribute message.type (mqadmin
updateTopic -a +message.type=FIFO), checked on send and listed in QueryRoute; FIFO messages of a
group in one queue in send order; DELAY messages through the broker's delay levels; transactions
committed, rolled back, and resolved by the producer's TransactionChecker when left open."""
import subprocess
import time

import grpc
import pytest

from mq.cluster import BIN, call, port_open, wait_for
from mq.gateway.timer import TIMER_TOPIC
from mq.wire.codes import RequestCode, ResponseCode
from mq.wire.grpc5 import METHODS, SERVICE, Code, MessageType, msg

from tests.gateway.helpers import GatewayCluster, messages_of_topic, produce5, run_client5, wait_messages

METADATA = (("x-mq-client-id", "test@1@0@types"),)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    g = GatewayCluster(str(tmp_path_factory.mktemp("types5")), messageDelayLevel="1s 2s 3s 5s 10s",
                       transactionTimeOut=1000, transactionCheckInterval=1000)
    yield g
    g.stop()


def typed_topic(cluster, topic: str, kind: str) -> None:
    p = subprocess.run([f"{BIN}/mqadmin", "updateTopic", "-n", cluster.ns.addr, "-c", "TestCluster", "-t", topic,
                        "-r", "4", "-w", "4", "-a", f"+message.type={kind}"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert f"attributes={{message.type={kind}}}" in p.stdout


def query_route(cluster, topic):
    with grpc.insecure_channel(cluster.endpoint) as ch:
        req = msg("QueryRouteRequest")()
        req.topic.name = topic
        fn = ch.unary_unary(f"/{SERVICE}/QueryRoute", request_serializer=lambda m: m.SerializeToString(),
                            response_deserializer=msg(METHODS["QueryRoute"][1]).FromString)
        return fn(req, metadata=METADATA, timeout=10)


def test_the_topic_type_is_kept_by_the_broker_and_listed_in_the_route(cluster):
    typed_topic(cluster, "T5Fifo", "FIFO")
    r = call(cluster.broker.addr, RequestCode.GET_TOPIC_CONFIG, {"topic": "T5Fifo"})
    assert r.code == ResponseCode.SUCCESS and b'"message.type":"FIFO"' in r.body.replace(b" ", b"")
    route = query_route(cluster, "T5Fifo")
    assert route.status.code == Code.OK
    assert {tuple(q.accept_message_types) for q in route.message_queues} == {(MessageType.FIFO,)}
    typed_topic(cluster, "T5Mixed", "MIXED")
    route = query_route(cluster, "T5Mixed")
    assert {tuple(q.accept_message_types) for q in route.message_queues} == \
        {(MessageType.NORMAL, MessageType.FIFO, MessageType.DELAY, MessageType.TRANSACTION)}
    bad = subprocess.run([f"{BIN}/mqadmin", "updateTopic", "-n", cluster.ns.addr, "-c", "TestCluster", "-t", "T5Bad",
                          "-a", "+message.type=SOMETIMES"], capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "SOMETIMES" in bad.stderr and "Traceback" not in bad.stderr
    r = call(cluster.broker.addr, RequestCode.UPDATE_AND_CREATE_TOPIC,
             {"topic": "T5Bad", "readQueueNums": 1, "writeQueueNums": 1, "perm": 6, "attributes": "+colour=red"})
    assert r.code == ResponseCode.INVALID_PARAMETER and "colour" in r.remark


def test_a_message_of_another_type_is_refused(cluster):
    typed_topic(cluster, "T5FifoOnly", "FIFO")
    out = run_client5({"op": "produce", "endpoint": cluster.endpoint, "topic": "T5FifoOnly",
                       "messages": [{"body": "plain"}]})
    assert "error" in out["sent"][0]                  # the client checks the route's accepted types first
    assert not messages_of_topic(cluster, "T5FifoOnly")


def test_fifo_messages_of_a_group_keep_their_order_in_one_queue(cluster):
    typed_topic(cluster, "T5Order", "FIFO")
    specs = [{"body": f"{g}-{i}", "group": g} for i in range(10) for g in ("order-a", "order-b")]
    ids = produce5(cluster, "T5Order", specs)
    stored = wait_messages(cluster, "T5Order", 20)
    assert sorted(m.properties["UNIQ_KEY"] for m in stored) == sorted(ids)
    for g in ("order-a", "order-b"):
        mine = [m for m in stored if m.properties["__SHARDINGKEY"] == g]
        assert len({m.queue_id for m in mine}) == 1
        assert [m.body.decode() for m in sorted(mine, key=lambda m: m.queue_offset)] == \
            [f"{g}-{i}" for i in range(10)]


def test_a_delay_message_is_delivered_at_its_second_and_a_recalled_one_never(cluster):
    """RocketMQ 5's timer: a DELAY message stored at once (rmq_sys_wheel_timer) and put into its
    topic at its delivery second, not a delay level's (this broker's levels are 1 2 3 5 10 s: a
    delay of 6-7 s would take 10); a message recalled with its recall handle is never delivered."""
    typed_topic(cluster, "T5Delay", "DELAY")
    t0 = time.time()
    out = run_client5({"op": "produce", "endpoint": cluster.endpoint, "topic": "T5Delay",
                       "messages": [{"body": "later", "delay_s": 7}, {"body": "recalled", "delay_s": 5,
                                                                       "recall": True}]})
    (later, recalled) = out["sent"]
    assert later.get("message_id") and recalled.get("recall_handle"), out
    assert not messages_of_topic(cluster, "T5Delay")                      # not before its time
    got = run_client5({"op": "receive", "endpoint": cluster.endpoint, "group": "T5DelayGroup", "topic": "T5Delay",
                       "want": 1, "timeout_s": 30})["received"]
    assert [m["message_id"] for m in got] == [later["message_id"]] and time.time() - t0 >= 5.5
    time.sleep(1.0)
    (stored,) = messages_of_topic(cluster, "T5Delay")                     # the recalled one never came
    assert stored.properties["UNIQ_KEY"] == later["message_id"] and "TIMER_OUT_MS" not in stored.properties
    # stored into its topic at its second: 7 s after its (whole-second) birth, not at the 10 s level;
    # measured on the broker's clocks, so a slow client start does not count
    waited_s = (stored.store_timestamp_ms - stored.born_timestamp_ms) / 1000
    assert 5.5 <= waited_s < 9.5, waited_s


def test_the_timer_keeps_its_messages_across_a_broker_kill(cluster):
    """Timer messages waiting when the whole broker is killed are delivered after its restart,
    each once the progress was saved; a message due before the kill is not delivered twice."""
    typed_topic(cluster, "T5TimerKill", "DELAY")
    out = run_client5({"op": "produce", "endpoint": cluster.endpoint, "topic": "T5TimerKill",
                       "messages": [{"body": "early", "delay_s": 2}, {"body": "late", "delay_s": 8}]})
    assert all(r.get("message_id") for r in out["sent"]), out
    wait_for(lambda: messages_of_topic(cluster, "T5TimerKill"), 20, what="the early one delivered")
    (early,) = messages_of_topic(cluster, "T5TimerKill")

    def progress_saved() -> bool:                   # a checkpoint record written after the delivery
        return any("TIMER_CHECKPOINT" in m.properties and m.born_timestamp_ms >= early.store_timestamp_ms
                   for m in messages_of_topic(cluster, TIMER_TOPIC))
    wait_for(progress_saved, 20, what="the timer's checkpoint after the early delivery")
    cluster.broker.kill()
    cluster.broker.start()
    wait_for(lambda: port_open(cluster.grpc_port), 30, what="the gRPC port again")
    wait_for(lambda: len(messages_of_topic(cluster, "T5TimerKill")) >= 2, 40, what="the late one delivered")
    time.sleep(1.5)
    assert sorted(m.body for m in messages_of_topic(cluster, "T5TimerKill")) == [b"early", b"late"]


def test_transactions_commit_rollback_and_the_checker_resolves_an_open_one(cluster):
    typed_topic(cluster, "T5Tx", "TRANSACTION")
    out = run_client5({"op": "produce", "endpoint": cluster.endpoint, "topic": "T5Tx", "check_answer": "commit",
                       "wait_checks": 1, "linger_s": 1.0, "checks_timeout_s": 60,
                       "messages": [{"body": "yes", "tx": "commit"}, {"body": "no", "tx": "rollback"},
                                    {"body": "asked", "tx": "leave"}]})
    ids = [r.get("message_id") for r in out["sent"]]
    assert all(ids), out
    assert ids[2] in out["checked"]                   # the broker asked about the open one, the checker said commit
    stored = wait_messages(cluster, "T5Tx", 2, timeout_s=30)
    assert sorted(m.body for m in stored) == [b"asked", b"yes"]
    time.sleep(2.0)                                   # a check pass later, the rolled-back one is still not there
    assert sorted(m.body for m in messages_of_topic(cluster, "T5Tx")) == [b"asked", b"yes"]


def test_fifo_push_consumer_keeps_each_groups_order_and_forwards_what_it_gives_up(cluster):
    """An orderly group (mqadmin updateSubGroup -o true): the official PushConsumer gets fifo in
    its settings; each message group's messages arrive in send order; the first message, failed
    past the group's retry limit (retryMaxTimes 1: 2 attempts), goes to %DLQ%<group> through
    ForwardMessageToDeadLetterQueue and the rest still arrive in order."""
    from tests.gateway.helpers import create_group
    typed_topic(cluster, "T5FifoPush", "FIFO")
    create_group(cluster, "T5FifoGroup", consumeMessageOrderly=True, retryMaxTimes=1)
    specs = [{"body": f"{g}-{i}", "group": g} for i in range(8) for g in ("ga", "gb")]
    ids = produce5(cluster, "T5FifoPush", specs)
    out = run_client5({"op": "push", "endpoint": cluster.endpoint, "group": "T5FifoGroup", "topic": "T5FifoPush",
                       "want": 15, "fail_bodies": ["ga-0"], "timeout_s": 90})
    got = out["received"]
    failed = [m for m in got if m["body"] == "ga-0"]
    # retried in place by the client (its FIFO retry re-runs the listener on the same delivery, so
    # the attempt it reports stays 1), then given up after the group's 2 attempts
    assert len(failed) == 2, failed
    for g in ("ga", "gb"):
        bodies = [m["body"] for m in got if m["group"] == g and m["body"] != "ga-0"]
        assert bodies == [f"{g}-{i}" for i in range(8) if f"{g}-{i}" != "ga-0"], (g, bodies)
    wait_for(lambda: messages_of_topic(cluster, "%DLQ%T5FifoGroup"), 30, what="the given-up message in the DLQ")
    (dead,) = messages_of_topic(cluster, "%DLQ%T5FifoGroup")
    assert dead.properties["UNIQ_KEY"] == failed[0]["message_id"] and failed[0]["message_id"] in ids


def test_an_orderly_group_gets_a_queue_again_only_after_its_batch_is_settled(cluster):
    """Orderly POP: while a queue's batch is out and not acked, nothing more of it goes out; when
    its invisible time ends the same messages come again, in the same order, attempt 2."""
    from tests.gateway.helpers import create_group
    typed_topic(cluster, "T5Orderly", "FIFO")
    create_group(cluster, "T5OrderlyGroup", consumeMessageOrderly=True)
    produce5(cluster, "T5Orderly", [{"body": f"o{i}", "group": "one"} for i in range(6)])
    req = {"op": "receive", "endpoint": cluster.endpoint, "group": "T5OrderlyGroup", "topic": "T5Orderly",
           "timeout_s": 30}
    first = run_client5({**req, "want": 6, "then": "keep", "invisible_s": 15})["received"]
    assert [m["body"] for m in first] == [f"o{i}" for i in range(6)]
    none = run_client5({**req, "want": 1, "then": "ack", "timeout_s": 3})["received"]
    assert none == []                                   # the queue's batch is out: nothing else of it
    again = run_client5({**req, "want": 6, "then": "ack", "timeout_s": 30})["received"]
    assert [m["body"] for m in again] == [f"o{i}" for i in range(6)] and {m["attempt"] for m in again} == {2}
