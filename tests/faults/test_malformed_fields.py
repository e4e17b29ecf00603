"""Well-framed requests whose fields are malformed, against a real broker (RELIABILITY.md,
"Bad input"): each is answered alone with a clear code, and never changes another request's
answer.

What it proves:
  * a single send whose integer field does not fit its type (flag, sysFlag, reconsumeTimes
    beyond int32; bornTimestamp beyond int64) or is not a number, pipelined between good
    sends on one connection (so they share a send group), is refused with SYSTEM_ERROR naming
    the field (RocketMQ's answer to a header it cannot decode), and every good send of the
    group -- and every later one -- is answered SEND_OK with its *own* queue offset and msgId:
    the record at that offset carries that send's body.  (Before: the group raised while it
    was built; its good sends were never answered, and later sends were answered with other
    messages' offsets.)
  * offsets that do not fit (-1, 10^15, "abc") in viewMessageById and consumerSendMsgBack,
    heartbeats whose JSON has the wrong types, and properties holding a lone surrogate get a
    clear code each; the broker logs no traceback for any of them;
  * offset queries, offset commits and pulls whose integers do not fit their Java types are
    refused before the store (a queueId 29, any other field SYSTEM_ERROR naming it), and
    nothing is committed."""
from __future__ import annotations

import itertools
import json
import struct
import time

import pytest

from mq.wire.remoting import RemotingCommand, encode_frame
from mq.wire.headers import send_v2
from tests.faults.rawpeer import Peer, next_opaque, pull_record, raw_broker

TOPIC = "MalformedTopic"
QUEUES = 2
_bodies = itertools.count()


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with raw_broker(str(tmp_path_factory.mktemp("malformed")), TOPIC, QUEUES,
                    autoCreateTopicEnable="false") as b:
        yield b


def send_header(queue_id: int = 0, **fields) -> dict:
    """SendMessageRequestHeaderV2 (letters on the wire) with some fields, by long name, replaced."""
    return send_v2(**{**dict(producerGroup="MalformedPG", topic=TOPIC, defaultTopic="TBW102",
                             defaultTopicQueueNums="4", queueId=str(queue_id), sysFlag="0",
                             bornTimestamp=str(int(time.time() * 1000)), flag="0", properties="",
                             reconsumeTimes="0"), **fields})


def pull_body(peer: Peer, queue_id: int, queue_offset: int) -> bytes:
    """The body of the record at (TOPIC, queue_id, queue_offset), waiting for dispatch."""
    return bytes(pull_record(peer, TOPIC, queue_id, queue_offset, group="MalformedCG").body)


def pipelined_sends(peer: Peer, headers: list[dict]) -> list[tuple[bytes, RemotingCommand]]:
    """Sends every request in one write (so the broker reads them together and groups them);
    returns (body, answer) per request, answers matched by opaque."""
    frames, sent = [], []
    for h in headers:
        body = b"malformed-%d" % next(_bodies)
        opaque = next_opaque()
        frames.append(encode_frame(RemotingCommand(code=310, version=409, opaque=opaque, ext_fields=h, body=body)))
        sent.append((opaque, body))
    peer.send_raw(b"".join(frames))
    answers = {}
    for _ in headers:
        resp = peer.read()
        answers[resp.opaque] = resp
    assert set(answers) == {o for o, _ in sent}, "every request got exactly one answer"
    return [(body, answers[opaque]) for opaque, body in sent]


def assert_own(peer: Peer, body: bytes, resp: RemotingCommand, queue_id: int) -> None:
    """resp is SEND_OK for exactly this body: the record at its queue offset carries it."""
    assert resp.code == 0, (resp.code, resp.remark)
    assert int(resp.ext_fields["queueId"]) == queue_id
    assert pull_body(peer, queue_id, int(resp.ext_fields["queueOffset"])) == body, \
        "the answer carries another message's queue offset"


BAD_FIELDS = [("flag", str(2 ** 31)), ("flag", str(-2 ** 31 - 1)), ("sysFlag", str(2 ** 31)),
              ("reconsumeTimes", str(2 ** 31)), ("bornTimestamp", str(2 ** 63)),
              ("bornTimestamp", str(-2 ** 63 - 1)), ("flag", "abc"), ("bornTimestamp", "1e3"),
              ("reconsumeTimes", "1.5")]


@pytest.mark.parametrize("name,value", BAD_FIELDS, ids=[f"{n}={v}" for n, v in BAD_FIELDS])
def test_a_field_that_does_not_fit_is_refused_alone(broker, name, value):
    p = Peer(broker.port)
    try:
        q = next(_bodies) % QUEUES
        results = pipelined_sends(p, [send_header(q), send_header(q), send_header(q, **{name: value}),
                                      send_header(q)])
        (b1, r1), (b2, r2), (_, bad), (b4, r4) = results
        assert bad.code == 1 and name in bad.remark and value in bad.remark, (bad.code, bad.remark)
        for body, resp in ((b1, r1), (b2, r2), (b4, r4)):
            assert_own(p, body, resp, q)
        # the group left nothing behind: the next send is answered with its own offset too
        (b5, r5), = pipelined_sends(p, [send_header(q)])
        assert_own(p, b5, r5, q)
        assert int(r5.ext_fields["queueOffset"]) == int(r4.ext_fields["queueOffset"]) + 1
    finally:
        p.close()


def test_a_bad_send_on_one_connection_changes_no_answer_on_another(broker):
    """Two connections whose sends share groups: one sends a malformed field among good sends;
    every good send of both connections is answered with its own offset."""
    a, b = Peer(broker.port), Peer(broker.port)
    try:
        for _ in range(5):
            a_frames = [send_header(0), send_header(0, flag=str(2 ** 40)), send_header(0)]
            b_frames = [send_header(0), send_header(0)]
            ra = pipelined_sends(a, a_frames)
            rb = pipelined_sends(b, b_frames)
            assert ra[1][1].code == 1
            for body, resp in ra[::2] + rb:
                assert_own(a, body, resp, 0)
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("code,ext", [(33, {"offset": "-1"}), (33, {"offset": str(10 ** 15)}), (33, {"offset": "abc"}),
                                      (33, {"offset": str(2 ** 64)}), (33, {}),
                                      (36, {"group": "MalformedCG", "offset": "-1", "delayLevel": "0"}),
                                      (36, {"group": "MalformedCG", "offset": str(10 ** 15)}),
                                      (36, {"group": "MalformedCG", "offset": "abc"}),
                                      (36, {"group": "../../escape", "offset": "0"}),
                                      (36, {"group": "MalformedCG", "offset": "0", "delayLevel": str(2 ** 31)})])
def test_offsets_that_do_not_fit_get_a_clear_code(broker, code, ext):
    p = Peer(broker.port)
    try:
        resp = p.call(code, ext)
        assert resp.code in (1, 29), (resp.code, resp.remark)
        assert resp.remark and "Error" not in resp.remark, resp.remark   # a reason, not an exception's name
    finally:
        p.close()


@pytest.mark.parametrize("body", [
    {"clientID": 5, "producerDataSet": "x"},
    {"clientID": "c", "producerDataSet": [1]},
    {"clientID": "c", "producerDataSet": [{"groupName": 3}]},
    {"clientID": "c", "consumerDataSet": [{"groupName": "G", "subscriptionDataSet": "x"}]},
    {"clientID": "c", "consumerDataSet": [{"groupName": "G", "subscriptionDataSet": [{"topic": 1}]}]},
    {"clientID": "c", "consumerDataSet": [{"groupName": "G", "subscriptionDataSet": [
        {"topic": "T", "subVersion": "abc"}]}]},
    {"clientID": "c", "consumerDataSet": [{"groupName": "G", "subscriptionDataSet": [{"topic": "T", "tagsSet": 7}]}]},
    {"clientID": "c", "consumerDataSet": [{"groupName": "../../escape"}]},
    {"clientID": "c", "consumerDataSet": [{"groupName": "G", "consumeType": {"a": 1}}]},
], ids=lambda b: json.dumps(b)[:60])
def test_heartbeat_with_wrong_types_is_refused(broker, body):
    p = Peer(broker.port)
    try:
        resp = p.call(34, None, json.dumps(body).encode())
        assert resp.code in (1, 29) and resp.remark.startswith(("heartbeat body: ", "the group name")), \
            (resp.code, resp.remark)
        good = {"clientID": "c", "producerDataSet": [{"groupName": "PG_ok"}]}
        assert p.call(34, None, json.dumps(good).encode()).code == 0, "the connection still works"
    finally:
        p.close()


def test_properties_with_a_lone_surrogate_are_message_illegal(broker):
    """A JSON header may carry "\\ud800" (legal JSON, not UTF-8): MESSAGE_ILLEGAL, nothing stored."""
    p = Peer(broker.port)
    try:
        header = json.dumps({"code": 310, "extFields": send_header(1, properties="KEYS\x01\ud800"), "flag": 0,
                             "language": "JAVA", "opaque": 4242, "serializeTypeCurrentRPC": "JSON",
                             "version": 409}).encode()
        assert b"\\ud800" in header
        p.send_raw(struct.pack(">II", 4 + len(header) + 1, len(header)) + header + b"x")
        resp = p.read()
        assert resp.opaque == 4242 and resp.code == 13, (resp.code, resp.remark)
        (body, ok), = pipelined_sends(p, [send_header(1)])
        assert_own(p, body, ok, 1)
    finally:
        p.close()


PULL_OK = {"consumerGroup": "MalformedCG", "topic": TOPIC, "queueId": "0", "queueOffset": "0", "maxMsgNums": "1",
           "sysFlag": "4", "commitOffset": "0", "suspendTimeoutMillis": "0", "subscription": "*", "subVersion": "0"}
BIG = str(2 ** 63)
QUEUE_FIELDS = [(30, {"topic": TOPIC, "queueId": BIG}), (31, {"topic": TOPIC, "queueId": str(2 ** 31)}),
                (29, {"topic": TOPIC, "queueId": BIG, "timestamp": "0"}), (29, {"topic": TOPIC, "queueId": "0",
                                                                               "timestamp": BIG}),
                (32, {"topic": TOPIC, "queueId": str(-2 ** 31 - 1)}),
                (14, {"consumerGroup": "MalformedCG", "topic": TOPIC, "queueId": BIG}),
                (15, {"consumerGroup": "MalformedCG", "topic": TOPIC, "queueId": BIG, "commitOffset": "1"}),
                (15, {"consumerGroup": "MalformedCG", "topic": TOPIC, "queueId": "0", "commitOffset": BIG}),
                (11, {**PULL_OK, "queueId": BIG}), (11, {**PULL_OK, "queueOffset": BIG}),
                (11, {**PULL_OK, "maxMsgNums": str(2 ** 31)}), (11, {**PULL_OK, "sysFlag": str(2 ** 31 + 4)}),
                (11, {**PULL_OK, "sysFlag": "5", "commitOffset": BIG}),
                (11, {**PULL_OK, "suspendTimeoutMillis": BIG}), (11, {**PULL_OK, "subVersion": BIG})]


@pytest.mark.parametrize("code,ext", QUEUE_FIELDS, ids=[f"{c}-{json.dumps(e)[-60:]}" for c, e in QUEUE_FIELDS])
def test_offset_and_pull_fields_that_do_not_fit_are_refused_before_the_store(broker, code, ext):
    """An offset query, offset commit or pull whose queueId, offset, timestamp or other integer
    does not fit its Java type: a queueId INVALID_PARAMETER (as one past the topic's queues,
    tests/faults/test_bad_input.py), any other field SYSTEM_ERROR naming it (as RocketMQ's header
    decode); nothing committed, no traceback (they reached the C store as an OverflowError, or
    were committed: an offset past int64 in the group's offset table).  The connection goes on."""
    p = Peer(broker.port)
    try:
        bad = [k for k, v in ext.items() if v in (BIG, str(2 ** 31), str(-2 ** 31 - 1), str(2 ** 31 + 4))]
        resp = p.call(code, ext)
        assert resp.code == (29 if bad[0] == "queueId" else 1), (resp.code, resp.remark)
        assert (bad[0] in resp.remark or bad[0] == "queueId") and "Error" not in resp.remark, resp.remark
        resp = p.call(14, {"consumerGroup": "MalformedCG", "topic": TOPIC, "queueId": "0"})
        assert resp.code in (0, 22) and int((resp.ext_fields or {}).get("offset", "-1")) < 2 ** 31, \
            (resp.code, resp.ext_fields)
    finally:
        p.close()
