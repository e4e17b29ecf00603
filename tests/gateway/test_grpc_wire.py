"""Raw gRPC against the endpoint (our declarations, mq/wire/grpc5.py): every bad request gets the
Status code a 5.x client expects in the response body, with gRPC status OK; one bad message never
changes another's answer; a frame that is not the RPC's message is BAD_REQUEST, not gRPC INTERNAL.
And the declarations themselves: byte-for-byte the official client's (its stubs, in its venv)."""
import json
import os
import subprocess

import grpc
import pytest

from mq.wire.grpc5 import METHODS, SERVICE, Code, MessageType, _MESSAGES, msg

from tests.gateway.helpers import CLIENT5_PYTHON, messages_of_topic, wait_messages

METADATA = (("x-mq-client-id", "test@1@0@grpcwire"), ("x-mq-language", "PYTHON"))


@pytest.fixture(scope="module")
def channel(gateway):
    ch = grpc.insecure_channel(gateway.endpoint)
    yield ch
    ch.close()


def rpc(channel, name: str, request, metadata=METADATA, raw: bytes | None = None):
    req, resp, _ = METHODS[name]
    call = channel.unary_unary(f"/{SERVICE}/{name}", request_serializer=lambda b: b,
                               response_deserializer=msg(resp).FromString)
    return call(raw if raw is not None else request.SerializeToString(), metadata=metadata, timeout=10)


def message(topic: str, body: bytes = b"payload", **sp):
    m = msg("Message")(body=body)
    m.topic.name = topic
    m.system_properties.message_id = sp.pop("message_id", os.urandom(8).hex().upper())
    m.system_properties.message_type = sp.pop("message_type", MessageType.NORMAL)
    for k, v in sp.pop("user", {}).items():
        m.user_properties[k] = v
    for k, v in sp.items():
        setattr(m.system_properties, k, v)
    return m


def send(channel, *msgs):
    return rpc(channel, "SendMessage", msg("SendMessageRequest")(messages=list(msgs)))


def query_route(channel, topic: str, metadata=METADATA):
    req = msg("QueryRouteRequest")()
    req.topic.name = topic
    return rpc(channel, "QueryRoute", req, metadata)


def test_query_route_lists_the_brokers_queues_with_the_grpc_endpoint(gateway, channel):
    gateway.create_topic("G5Route", queues=4)
    r = query_route(channel, "G5Route")
    assert r.status.code == Code.OK, r.status
    assert [q.id for q in r.message_queues] == [0, 1, 2, 3]
    for q in r.message_queues:
        assert q.permission == 4 and q.broker.id == 0 and q.broker.name == gateway.broker.name   # READ_WRITE
        assert [(a.host, a.port) for a in q.broker.endpoints.addresses] == [("127.0.0.1", gateway.grpc_port)]
        assert list(q.accept_message_types) == [MessageType.NORMAL]


@pytest.mark.parametrize("topic,code", [("G5 bad name", Code.ILLEGAL_TOPIC), ("x" * 200, Code.ILLEGAL_TOPIC),
                                        ("rmq_sys_REVIVE_LOG_TestCluster", Code.ILLEGAL_TOPIC),
                                        ("SCHEDULE_TOPIC_XXXX", Code.ILLEGAL_TOPIC), ("TBW102", Code.ILLEGAL_TOPIC),
                                        ("G5Missing", Code.TOPIC_NOT_FOUND)])
def test_query_route_refusals(channel, topic, code):
    r = query_route(channel, topic)
    assert r.status.code == code and r.status.message


def test_a_request_without_a_client_id_is_refused(channel):
    assert query_route(channel, "G5Route", metadata=()).status.code == Code.CLIENT_ID_REQUIRED


def test_a_frame_that_is_not_the_rpcs_message_is_bad_request(channel):
    r = rpc(channel, "SendMessage", None, raw=b"\xff\xff\xff\xff")
    assert r.status.code == Code.BAD_REQUEST


def test_heartbeat_needs_the_clients_settings_first(channel):
    r = rpc(channel, "Heartbeat", msg("HeartbeatRequest")(client_type=1))
    assert r.status.code == Code.UNRECOGNIZED_CLIENT_TYPE


@pytest.fixture(scope="module")
def refuse_topic(gateway):
    gateway.create_topic("G5Refuse")
    return "G5Refuse"


@pytest.mark.parametrize("build,code", [
    (lambda t: message(t, body=b""), Code.MESSAGE_BODY_EMPTY),
    (lambda t: message(t, body=b"x" * (64 * 1024 + 1)), Code.MESSAGE_BODY_TOO_LARGE),
    (lambda t: message(t, user={"UNIQ_KEY": "mine"}), Code.ILLEGAL_MESSAGE_PROPERTY_KEY),
    (lambda t: message(t, user={"k": "line\nbreak"}), Code.ILLEGAL_MESSAGE_PROPERTY_KEY),
    (lambda t: message(t, user={f"k{i}": "v" for i in range(129)}), Code.MESSAGE_PROPERTIES_TOO_LARGE),
    (lambda t: message(t, user={"big": "v" * (16 * 1024 + 1)}), Code.MESSAGE_PROPERTIES_TOO_LARGE),
    (lambda t: message(t, tag="a|b"), Code.ILLEGAL_MESSAGE_TAG),
    (lambda t: message(t, tag="   "), Code.ILLEGAL_MESSAGE_TAG),
    (lambda t: message(t, message_id=""), Code.ILLEGAL_MESSAGE_ID),
    (lambda t: message(t, message_group="g" * 64), Code.ILLEGAL_MESSAGE_GROUP),
    (lambda t: message(t, message_type=MessageType.FIFO), Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
    (lambda t: message("G5 bad"), Code.ILLEGAL_TOPIC),
    (lambda t: message("RMQ_SYS_TRANS_HALF_TOPIC"), Code.ILLEGAL_TOPIC),
])
def test_send_refusals_store_nothing_and_leave_the_good_message_alone(gateway, channel, refuse_topic, build,
                                                                       code):
    topic = refuse_topic
    bad = build(topic)
    before = len(messages_of_topic(gateway, topic))
    r = send(channel, bad)
    assert r.status.code == code, r.status
    if bad.topic.name != topic:        # refused as a whole (the request's topic)
        assert not r.entries
    else:
        assert [e.status.code for e in r.entries] == [code]
        assert len(messages_of_topic(gateway, topic)) == before
        # the same bad message beside a good one: each gets its own answer, the good one is stored
        good = message(topic, body=b"good")
        r = send(channel, bad, good)
        assert r.status.code == Code.MULTIPLE_RESULTS
        assert [e.status.code for e in r.entries] == [code, Code.OK]
        assert r.entries[1].message_id == good.system_properties.message_id
        stored = wait_messages(gateway, topic, before + 1)
        assert len(stored) == before + 1
        (new,) = [m for m in stored if m.properties["UNIQ_KEY"] == good.system_properties.message_id]
        assert new.body == b"good" and new.queue_offset == r.entries[1].offset


def test_a_message_group_goes_to_one_queue(gateway, channel):
    topic = "G5Group"
    gateway.create_topic(topic)
    for i in range(8):
        assert send(channel, message(topic, body=b"g%d" % i, message_group="order-42")).status.code == Code.OK
    assert len({m.queue_id for m in wait_messages(gateway, topic, 8)}) == 1


DUMP = r"""
import json, sys
from rocketmq.grpc_protocol import definition_pb2, service_pb2
out = {}
for mod in (definition_pb2, service_pb2):
    for name, d in mod.DESCRIPTOR.message_types_by_name.items():
        out[name] = [[f.name, f.number, f.type, f.is_repeated, f.has_presence,
                      (f.message_type or f.enum_type).full_name if (f.message_type or f.enum_type) else "",
                      f.containing_oneof.name if f.containing_oneof else ""] for f in d.fields]
print(json.dumps(out))
"""


def test_declarations_match_the_official_clients_stubs():
    """Every message the broker declares has the official stubs' fields: names, numbers, types,
    repeated or not, presence (proto3 optional), message/enum types and oneofs (the client 5.1.2 lacks only Settings.client_properties,
    a later field)."""
    if not os.path.exists(CLIENT5_PYTHON):
        pytest.fail(f"the official 5.x client's venv is missing ({CLIENT5_PYTHON}): `make test` creates it")
    theirs = json.loads(subprocess.run([CLIENT5_PYTHON, "-c", DUMP], capture_output=True, text=True,
                                       check=True).stdout)
    for name in _MESSAGES:
        d = msg(name).DESCRIPTOR
        ours = [[f.name, f.number, f.type, f.is_repeated, f.has_presence,
                 (f.message_type or f.enum_type).full_name if (f.message_type or f.enum_type) else "",
                 f.containing_oneof.name if f.containing_oneof else ""] for f in d.fields]
        if name == "Settings":
            ours = [f for f in ours if f[0] != "client_properties"]
        assert name in theirs, name
        assert sorted(map(tuple, ours)) == sorted(map(tuple, theirs[name])), name


def test_ack_and_change_refuse_handles_that_are_not_ours_or_expired(gateway, channel):
    gateway.create_topic("G5Handles")
    req = msg("AckMessageRequest")()
    req.group.name, req.topic.name = "G5HandleGroup", "G5Handles"
    req.entries.add(message_id="m1", receipt_handle="not a handle")
    req.entries.add(message_id="m2", receipt_handle="0 1000 10000 0 0 0 0 " + gateway.broker.name)   # expired in 1970
    r = rpc(channel, "AckMessage", req)
    assert r.status.code == Code.INVALID_RECEIPT_HANDLE
    assert [e.status.code for e in r.entries] == [Code.INVALID_RECEIPT_HANDLE] * 2
    assert "expired" in r.entries[1].status.message
    ch = msg("ChangeInvisibleDurationRequest")(receipt_handle="1 2 3")
    ch.group.name, ch.topic.name = "G5HandleGroup", "G5Handles"
    ch.invisible_duration.FromSeconds(5)
    assert rpc(channel, "ChangeInvisibleDuration", ch).status.code == Code.INVALID_RECEIPT_HANDLE


def test_receive_refuses_a_bad_invisible_time_and_a_bad_filter(gateway, channel):
    gateway.create_topic("G5RecvBad")
    fn = channel.unary_stream(f"/{SERVICE}/ReceiveMessage", request_serializer=lambda m: m.SerializeToString(),
                              response_deserializer=msg("ReceiveMessageResponse").FromString)

    def receive(**kw):
        req = msg("ReceiveMessageRequest")(batch_size=1)
        req.group.name = "G5RecvBadGroup"
        req.message_queue.topic.name = "G5RecvBad"
        req.long_polling_timeout.FromSeconds(1)
        for k, v in kw.items():
            if k == "invisible_s":
                req.invisible_duration.FromSeconds(v)
            elif k == "sql":
                req.filter_expression.type, req.filter_expression.expression = 2, v
        return [f for f in fn(req, metadata=METADATA, timeout=10)]
    frames = receive(invisible_s=1)
    assert frames[0].status.code == Code.ILLEGAL_INVISIBLE_TIME and frames[-1].HasField("delivery_timestamp")
    frames = receive(invisible_s=30, sql="a >>> b")
    assert frames[0].status.code == Code.ILLEGAL_FILTER_EXPRESSION, frames[0]
    frames = receive(invisible_s=30)
    assert frames[0].status.code == Code.MESSAGE_NOT_FOUND          # nothing there: after the long polling
