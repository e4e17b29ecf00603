"""A 5.x pull consumer's RPCs over raw gRPC (no released 5.x client calls them yet): QueryOffset
finds a queue's bounds and the offset of a time, PullMessage reads from an offset with its
filter and long polling, UpdateOffset / GetOffset keep the group's offset - the same offset a 4.x
consumer of the group reads - and bad requests get their Status codes."""
import time

import grpc
import pytest

from mq.cluster import call
from mq.wire.codes import RequestCode, ResponseCode
from mq.wire.grpc5 import METHODS, SERVICE, Code, msg

from tests.gateway.helpers import produce5, wait_messages

METADATA = (("x-mq-client-id", "test@1@0@pull5"),)
TOPIC, GROUP = "G5Pull", "G5PullGroup"


@pytest.fixture(scope="module")
def channel(gateway):
    ch = grpc.insecure_channel(gateway.endpoint)
    yield ch
    ch.close()


def unary(channel, name, request):
    _, resp, _ = METHODS[name]
    return channel.unary_unary(f"/{SERVICE}/{name}", request_serializer=lambda m: m.SerializeToString(),
                               response_deserializer=msg(resp).FromString)(request, metadata=METADATA, timeout=10)


def pull(channel, qid: int, offset: int, batch: int = 32, expression: str = "*", poll_ms: int = 0, topic=TOPIC):
    """(status code, bodies, next offset, messages) of one PullMessage."""
    req = msg("PullMessageRequest")(offset=offset, batch_size=batch)
    req.group.name = GROUP
    req.message_queue.topic.name = topic
    req.message_queue.id = qid
    req.filter_expression.expression = expression
    req.long_polling_timeout.FromMilliseconds(poll_ms)
    _, resp, _ = METHODS["PullMessage"]
    frames = list(channel.unary_stream(f"/{SERVICE}/PullMessage", request_serializer=lambda m: m.SerializeToString(),
                                       response_deserializer=msg(resp).FromString)(req, metadata=METADATA, timeout=30))
    kinds = [f.WhichOneof("content") for f in frames]
    assert kinds[0] == "status", kinds
    msgs = [f.message for f in frames if f.WhichOneof("content") == "message"]
    nxt = [f.next_offset for f in frames if f.WhichOneof("content") == "next_offset"]
    return frames[0].status.code, [m.body.decode() for m in msgs], (nxt[0] if nxt else None), msgs


def query_offset(channel, qid, policy, ts_ms=None):
    req = msg("QueryOffsetRequest")(query_offset_policy=policy)
    req.message_queue.topic.name = TOPIC
    req.message_queue.id = qid
    if ts_ms is not None:
        req.timestamp.FromMilliseconds(ts_ms)
    r = unary(channel, "QueryOffset", req)
    return r.status.code, r.offset


def offset_request(name, qid, **fields):
    req = msg(f"{name}Request")(**fields)
    req.group.name = GROUP
    req.message_queue.topic.name = TOPIC
    req.message_queue.id = qid
    return req


@pytest.fixture(scope="module")
def one_queue(gateway):
    """TOPIC with one queue: 6 messages, tags a/b, then 2 more; their store times by offset."""
    gateway.create_topic(TOPIC, queues=1)
    produce5(gateway, TOPIC, [{"body": f"m{i}", "tag": "a" if i % 2 == 0 else "b"} for i in range(6)])
    wait_messages(gateway, TOPIC, 6)
    time.sleep(0.01)
    produce5(gateway, TOPIC, [{"body": f"m{i}"} for i in range(6, 8)])
    return {m.queue_offset: m.store_timestamp_ms for m in wait_messages(gateway, TOPIC, 8)}


def test_query_offset_gives_the_queues_bounds_and_the_offset_of_a_time(channel, one_queue):
    """TIMESTAMP is RocketMQ's search by time: the message stored at that millisecond, the last
    one for a later time, the first for an earlier one."""
    assert query_offset(channel, 0, 0) == (Code.OK, 0)                 # BEGINNING
    assert query_offset(channel, 0, 1) == (Code.OK, 8)                 # END
    assert one_queue[6] > one_queue[5]
    assert query_offset(channel, 0, 2, one_queue[6]) == (Code.OK, 6)   # TIMESTAMP
    assert query_offset(channel, 0, 2, one_queue[7] + 60_000) == (Code.OK, 7)
    assert query_offset(channel, 0, 2, one_queue[0] - 60_000) == (Code.OK, 0)
    assert query_offset(channel, 0, 2)[0] == Code.BAD_REQUEST          # TIMESTAMP without a time


def test_pull_reads_from_an_offset_with_its_filter(channel, one_queue):
    code, bodies, nxt, msgs = pull(channel, 0, 0, batch=4)
    assert (code, bodies, nxt) == (Code.OK, ["m0", "m1", "m2", "m3"], 4)
    assert [m.system_properties.queue_offset for m in msgs] == [0, 1, 2, 3]
    assert not any(m.system_properties.HasField("receipt_handle") for m in msgs)   # nothing to ack
    code, bodies, nxt, _ = pull(channel, 0, 4)
    assert (code, bodies, nxt) == (Code.OK, ["m4", "m5", "m6", "m7"], 8)
    code, bodies, _, _ = pull(channel, 0, 0, expression="b")
    assert code == Code.OK and bodies == ["m1", "m3", "m5"]


def test_pull_waits_for_a_new_message_and_refuses_an_offset_outside_the_queue(gateway, channel, one_queue):
    t0 = time.monotonic()
    code, bodies, nxt, _ = pull(channel, 0, 8, poll_ms=600)
    assert (code, bodies, nxt) == (Code.MESSAGE_NOT_FOUND, [], 8) and time.monotonic() - t0 >= 0.4
    code, _, nxt, _ = pull(channel, 0, 100)
    assert (code, nxt) == (Code.ILLEGAL_OFFSET, 8)                    # past the end: go on from it
    assert pull(channel, 0, -1)[0] == Code.ILLEGAL_OFFSET
    assert pull(channel, 3, 0)[0] == Code.BAD_REQUEST                 # not one of the topic's queues
    assert pull(channel, 0, 0, topic="G5NoSuchTopic")[0] == Code.TOPIC_NOT_FOUND


def test_the_groups_offset_is_kept_and_shared_with_4x_consumers(gateway, channel, one_queue):
    # a group that never committed one: the broker's 4.x answer, 0 while the queue still starts
    # at its first message (OFFSET_NOT_FOUND once retention took it)
    r = unary(channel, "GetOffset", offset_request("GetOffset", 0))
    assert (r.status.code, r.offset) == (Code.OK, 0)
    assert unary(channel, "UpdateOffset", offset_request("UpdateOffset", 0, offset=5)).status.code == Code.OK
    r = unary(channel, "GetOffset", offset_request("GetOffset", 0))
    assert (r.status.code, r.offset) == (Code.OK, 5)
    # what a 4.x consumer of the group reads as its offset (QUERY_CONSUMER_OFFSET)
    r4 = call(gateway.broker.addr, RequestCode.QUERY_CONSUMER_OFFSET, {"consumerGroup": GROUP, "topic": TOPIC,
                                                                      "queueId": 0})
    assert r4.code == ResponseCode.SUCCESS and int(r4.ext_fields["offset"]) == 5
    assert unary(channel, "UpdateOffset", offset_request("UpdateOffset", 0, offset=-2)).status.code == Code.ILLEGAL_OFFSET
