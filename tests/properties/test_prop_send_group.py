"""Send groups of random good and bad requests against a real broker, as a property
(RELIABILITY.md, "Bad input": every request gets exactly one answer, its own).

Hypothesis draws 1-3 connections, each pipelining 1-8 SEND_MESSAGE_V2 (310) frames in one
write, all connections' writes back to back, so the broker's io worker reads them together and
appends the good ones as one group (tests/faults/test_malformed_fields.py shows the mechanics).
Each send is good -- any flag, reconsumeTimes and bornTimestamp within int32/int64 (the limits
included), sysFlag 0 or MULTI_TAGS, queueId in range or -1 (the broker picks), properties or
none, a JSON or a ROCKETMQ header -- or bad in one way: an integer header field beyond its
type or not a number (SYSTEM_ERROR, 1), a queueId out of range or not a number
(INVALID_PARAMETER, 29), an empty body, properties holding a lone surrogate (a hand-built JSON
header), properties over 32767 bytes, an illegal topic (MESSAGE_ILLEGAL, 13).

What it proves, for every drawn mix:
  * every request gets exactly one answer, matched by opaque (a duplicate or a stray answer
    breaks the opaque check of the pulls that follow on the same connection);
  * each bad one gets its refusal code;
  * each good one is SEND_OK, and the record at its (queueId, queueOffset), pulled back (code
    11), carries exactly its body and says that queue offset;
  * queue offsets of good sends on one queue are unique, across all examples of the run.
"""
from __future__ import annotations

import itertools
import json
import struct
import time

import pytest
from hypothesis import given, note, strategies as st

from mq.wire.headers import send_v2
from mq.wire.remoting import RemotingCommand, encode_frame
from tests.faults.rawpeer import Peer, next_opaque, pull_record, raw_broker
from tests.properties.propkit import bounded

TOPIC = "PropGroupTopic"
QUEUES = 4
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
_bodies = itertools.count()
# every queue offset a good send was given in this run, by queue: never given twice
TAKEN: dict[int, dict[int, bytes]] = {q: {} for q in range(QUEUES)}


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with raw_broker(str(tmp_path_factory.mktemp("propgroup")), TOPIC, QUEUES, autoCreateTopicEnable="false") as b:
        yield b


# --------------------------------------------------------------------------------------------------
# Strategies: a send is (kind, header fields, body, serialize type, expected code or None for good)

INT_FIELDS = ["bornTimestamp", "flag", "reconsumeTimes", "sysFlag"]     # bornTimestamp is int64, the rest int32
PROP_TEXT = st.text(st.characters(exclude_characters="\x01\x02", exclude_categories=("Cs",)), min_size=1,
                    max_size=12)


def header(queue_id, **fields) -> dict:
    """SendMessageRequestHeaderV2 by long names (mq.wire.headers.send_v2 puts the letters on the
    wire) with some fields replaced."""
    h = dict(producerGroup="PropGroupPG", topic=TOPIC, defaultTopic="TBW102", defaultTopicQueueNums=str(QUEUES),
             queueId=str(queue_id), sysFlag="0", bornTimestamp=str(int(time.time() * 1000)), flag="0",
             properties="", reconsumeTimes="0")
    h.update(fields)
    return h


@st.composite
def good_sends(draw) -> dict:
    props = draw(st.dictionaries(st.sampled_from(["KEYS", "TAGS", "userProp"]), PROP_TEXT, max_size=3))
    h = header(draw(st.integers(-1, QUEUES - 1)),
               flag=str(draw(st.integers(INT32_MIN, INT32_MAX))),
               sysFlag=str(draw(st.sampled_from([0, 2]))),
               bornTimestamp=str(draw(st.integers(INT64_MIN, INT64_MAX))),
               reconsumeTimes=str(draw(st.integers(INT32_MIN, INT32_MAX))),
               properties="\x02".join(f"{k}\x01{v}" for k, v in props.items()))
    for name in draw(st.lists(st.sampled_from(["flag", "bornTimestamp", "reconsumeTimes", "properties"]),
                              max_size=2)):
        h[name] = ""                                  # absent: the default
    return dict(kind="good", header=h, body=draw(st.binary(max_size=200)),
                serialize_type=draw(st.sampled_from([0, 1])), expect=None)


@st.composite
def bad_sends(draw) -> dict:
    kind = draw(st.sampled_from(["int_range", "int_nan", "queue", "empty_body", "surrogate", "props_long",
                                 "topic"]))
    h, body, expect = header(draw(st.integers(0, QUEUES - 1))), draw(st.binary(max_size=64)), 13
    if kind == "int_range":
        name = draw(st.sampled_from(INT_FIELDS))
        lo, hi = (INT64_MIN, INT64_MAX) if name == "bornTimestamp" else (INT32_MIN, INT32_MAX)
        value = draw(st.one_of(st.integers(hi + 1, hi << 2), st.integers(lo << 2, lo - 1),
                               st.sampled_from([hi + 1, lo - 1, 10 ** 30, -10 ** 30])))
        h[name], expect = str(value), 1
    elif kind == "int_nan":
        name = draw(st.sampled_from(INT_FIELDS))
        h[name] = draw(st.sampled_from(["abc", "1e3", "1.5", "0x10", "--1", "1 2", "NaN", "12a"]))
        expect = 1
    elif kind == "queue":
        h["queueId"] = str(draw(st.one_of(st.integers(QUEUES, INT32_MAX), st.sampled_from([1 << 31, 1 << 40, 10 ** 20,
                                                                                        "x", "1.0"]))))
        expect = 29
    elif kind == "empty_body":
        body = b""
    elif kind == "surrogate":
        h["properties"] = "KEYS\x01" + draw(st.sampled_from(["\ud800", "a\udfff", "\udbff\udbff"]))
    elif kind == "props_long":
        h["properties"] = "KEYS\x01" + "k" * draw(st.integers(32768 - 5, 33000))
    else:
        h["topic"] = draw(st.sampled_from(["bad topic", "a/b", "t" * 128, "tö", "%RETRY%x y"]))
    if not body and kind != "empty_body":
        body = b"x"
    stype = 0 if kind == "surrogate" else draw(st.sampled_from([0, 1]))
    return dict(kind=kind, header=h, body=body, serialize_type=stype, expect=expect)


def connections():
    return st.lists(st.lists(st.one_of(good_sends(), bad_sends()), min_size=1, max_size=8), min_size=1, max_size=3)


# --------------------------------------------------------------------------------------------------
# Sending and checking


def frame_of(send: dict, opaque: int) -> bytes:
    if send["kind"] == "surrogate":
        # json.dumps writes the lone surrogate as the escape "\\ud800": legal JSON, not UTF-8
        hdr = json.dumps({"code": 310, "extFields": send_v2(**send["header"]), "flag": 0, "language": "JAVA", "opaque": opaque,
                          "serializeTypeCurrentRPC": "JSON", "version": 409}).encode()
        return struct.pack(">II", 4 + len(hdr) + len(send["body"]), len(hdr)) + hdr + send["body"]
    return encode_frame(RemotingCommand(code=310, version=409, opaque=opaque, ext_fields=send_v2(**send["header"]),
                                        body=send["body"], serialize_type=send["serialize_type"]))


@bounded(300)
@given(plan=connections())
def test_a_group_of_good_and_bad_sends_answers_each_its_own(broker, plan):
    peers = [Peer(broker.port) for _ in plan]
    try:
        sent: list[list[tuple[int, dict]]] = []
        placed: dict[int, tuple[int, int]] = {}        # opaque of a good send -> (queueId, queueOffset)
        writes = []
        for sends in plan:
            mine = []
            for send in sends:
                if send["kind"] == "good":
                    send = dict(send, body=b"g%d:" % next(_bodies) + send["body"])
                mine.append((next_opaque(), send))
            sent.append(mine)
            writes.append(b"".join(frame_of(s, o) for o, s in mine))
        for peer, data in zip(peers, writes):          # back to back: one read, one group
            peer.send_raw(data)
        for peer, mine in zip(peers, sent):
            answers = {}
            for _ in mine:
                resp = peer.read()
                assert resp.is_response and resp.opaque not in answers, f"a second answer to {resp.opaque}"
                answers[resp.opaque] = resp
            assert set(answers) == {o for o, _ in mine}, "every request got exactly one answer, its own"
            for opaque, send in mine:
                resp = answers[opaque]
                note(f"{send['kind']} {send['header']} body {len(send['body'])} -> {resp.code} {resp.remark}")
                if send["expect"] is not None:
                    assert resp.code == send["expect"], (send["kind"], resp.code, resp.remark)
                    continue
                assert resp.code == 0, (resp.code, resp.remark)
                q, qo = int(resp.ext_fields["queueId"]), int(resp.ext_fields["queueOffset"])
                asked = int(send["header"]["queueId"])
                assert asked in (-1, q) and 0 <= q < QUEUES, f"asked for queue {asked}, answered {q}"
                assert qo not in TAKEN[q], f"queue {q} offset {qo} given twice"
                TAKEN[q][qo] = send["body"]
                placed[opaque] = (q, qo)
        for peer, mine in zip(peers, sent):           # on the same connections: any stray answer shows
            for opaque, send in mine:
                if opaque in placed:
                    q, qo = placed[opaque]
                    rec = pull_record(peer, TOPIC, q, qo, group="PropGroupCG")
                    assert (rec.queue_id, rec.queue_offset, rec.body) == (q, qo, send["body"]), \
                        f"queue {q} offset {qo} holds another message"
    finally:
        for peer in peers:
            peer.close()
