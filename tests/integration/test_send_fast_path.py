"""The io worker's request path against a real broker over raw sockets: the fast path (single
sends answered by the group append, responses from a template) stores and answers exactly what
the full path does, many frames in one read are answered together, and the sends of one read
share one wake of the store roles."""
import json
import socket
import struct

import pytest

from mq.cluster import Broker, NameServer, wait_for
from mq.remoting import make_response
from mq.store import control as C
from mq.store.control import ControlBlock
from mq.wire import commitlog as wcl
from mq.wire import batch as wbatch
from mq.wire.properties import decode_properties, encode_properties
from mq.wire.headers import send_v2
from mq.wire.remoting import (LANGUAGE_CPP, LANGUAGE_PYTHON, SERIALIZE_JSON, SERIALIZE_ROCKETMQ, RemotingCommand, decode_frame_payload, encode_frame,
                              frame_payload_size)

TOPIC = "FastPathTopic"
SEND_V2, SEND, PULL, UPDATE_TOPIC, SEND_BATCH = 310, 10, 11, 17, 320


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("fastpath"))
    ns = NameServer(tmp)
    b = Broker(tmp, ns.addr, sendMessageThreadPoolNums=1)
    yield b
    b.stop()
    ns.stop()


class Raw:
    """A blocking socket speaking frames; returns every response with its raw bytes."""

    def __init__(self, port: int):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.opaque = 0

    def frame(self, code: int, ext: dict, body: bytes = b"", language: int = 0, version: int = 409,
              serialize_type: int = SERIALIZE_JSON) -> tuple:
        self.opaque += 1
        cmd = RemotingCommand(code=code, language=language, version=version, opaque=self.opaque,
                              ext_fields=ext, body=body, serialize_type=serialize_type)
        return cmd, encode_frame(cmd)

    def read(self) -> tuple[RemotingCommand, bytes]:
        prefix = self._exactly(4)
        payload = self._exactly(frame_payload_size(prefix))
        return decode_frame_payload(payload), prefix + payload

    def _exactly(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            assert chunk, "connection closed"
            buf += chunk
        return buf

    def call(self, code: int, ext: dict, body: bytes = b"", **kw) -> tuple[RemotingCommand, bytes]:
        _, data = self.frame(code, ext, body, **kw)
        self.sock.sendall(data)
        return self.read()

    def close(self):
        self.sock.close()


def v2(topic: str, qid: int, props: str) -> dict:
    return send_v2(producerGroup="FastPathGroup", topic=topic, defaultTopic="TBW102", defaultTopicQueueNums="4",
                   queueId=str(qid), sysFlag="0", bornTimestamp="1700000000000", flag="0", properties=props,
                   reconsumeTimes="0", unitMode="false", batch="false")


def pull_one(raw: Raw, topic: str, qid: int, offset: int):
    resp, _ = raw.call(PULL, {"consumerGroup": "FastPathGroup", "topic": topic, "queueId": str(qid),
                              "queueOffset": str(offset), "maxMsgNums": "1", "sysFlag": "4",
                              "commitOffset": "0", "suspendTimeoutMillis": "0", "subscription": "*",
                              "subVersion": "0"})
    assert resp.code == 0, (resp.code, resp.remark)
    return wcl.parse_record(resp.body)


def test_fast_and_full_path_store_and_answer_the_same(broker):
    """The first send to a topic takes the full path (the worker learns the topic config);
    the next ones take the fast path.  Both store the same properties (WAIT removed, CLUSTER
    appended), and every response is byte-for-byte what make_response + encode_frame give for
    its values - for a Java-language V2 send, a C++-language SEND_MESSAGE, and a V2 send with a
    ROCKETMQ (binary) header."""
    raw = Raw(broker.port)
    try:
        resp, _ = raw.call(UPDATE_TOPIC, {"topic": TOPIC, "readQueueNums": "4", "writeQueueNums": "4",
                                          "perm": "6", "topicFilterType": "SINGLE_TAG", "topicSysFlag": "0",
                                          "order": "false"})
        assert resp.code == 0
        props = "KEYS\x01k1\x02WAIT\x01true\x02TAGS\x01tg"
        sent = []
        for i in range(3):
            req, data = raw.frame(SEND_V2, v2(TOPIC, 1, props), b"body-%d" % i)
            sent.append(req)
            raw.sock.sendall(data)
            sent[-1] = (req, *raw.read())
        req, data = raw.frame(SEND, {"producerGroup": "FastPathGroup", "topic": TOPIC, "defaultTopic": "TBW102",
                                     "defaultTopicQueueNums": "4", "queueId": "1", "sysFlag": "0",
                                     "bornTimestamp": "1700000000000", "flag": "0", "properties": props,
                                     "reconsumeTimes": "0", "unitMode": "false", "batch": "false"},
                              b"body-3", language=LANGUAGE_CPP, version=333)
        raw.sock.sendall(data)
        sent.append((req, *raw.read()))
        req, data = raw.frame(SEND_V2, v2(TOPIC, 1, props), b"body-4", language=LANGUAGE_PYTHON,
                              serialize_type=SERIALIZE_ROCKETMQ)
        raw.sock.sendall(data)
        sent.append((req, *raw.read()))
        assert sent[-1][1].serialize_type == SERIALIZE_ROCKETMQ
        for i, (req, resp, resp_bytes) in enumerate(sent):
            assert resp.code == 0 and resp.ext_fields["queueId"] == "1"
            assert resp.ext_fields["queueOffset"] == str(i)
            again = make_response(req, 0, None, {k: resp.ext_fields[k] for k in
                                                 ("msgId", "queueId", "queueOffset", "MSG_REGION", "TRACE_ON")})
            assert encode_frame(again) == resp_bytes, i
        wait_for(lambda: _max_offset(raw, TOPIC, 1) == 5, 10, what="dispatch")
        expected = {"KEYS": "k1", "TAGS": "tg", "CLUSTER": "TestCluster"}
        for i in range(5):
            rec = pull_one(raw, TOPIC, 1, i)
            assert rec.body == b"body-%d" % i
            assert rec.properties == encode_properties(expected), (i, rec.properties)
    finally:
        raw.close()


def _max_offset(raw: Raw, topic: str, qid: int) -> int:
    resp, _ = raw.call(30, {"topic": topic, "queueId": str(qid)})
    return int(resp.ext_fields["offset"])


def test_one_read_of_many_sends_is_one_group(broker):
    """300 single sends written in one go (plus a refused one and a batch among them) are all
    answered; queue offsets are dense per queue; and the store roles were woken far fewer
    times than once per message (SEQ_WRITE counts the wakes)."""
    raw = Raw(broker.port)
    topic = "FastPathGroupTopic"
    try:
        resp, _ = raw.call(UPDATE_TOPIC, {"topic": topic, "readQueueNums": "4", "writeQueueNums": "4",
                                          "perm": "6", "topicFilterType": "SINGLE_TAG", "topicSysFlag": "0",
                                          "order": "false"})
        assert resp.code == 0
        assert raw.call(SEND_V2, v2(topic, 0, ""), b"warm-up")[0].code == 0     # the worker learns the topic
        ctl = ControlBlock(broker.dir)
        try:
            seq0 = ctl.seq(C.SEQ_WRITE)
            frames, kinds = [], []
            for i in range(300):
                frames.append(raw.frame(SEND_V2, v2(topic, i % 4, "UNIQ_KEY\x01u%d" % i), b"m%d" % i)[1])
                kinds.append("single")
                if i == 100:
                    frames.append(raw.frame(SEND_V2, v2(topic, 9, ""), b"bad queue")[1])
                    kinds.append("bad")
                if i == 200:
                    body = wbatch.build_batch([(0, b"b1", b""), (0, b"b2", b"")])
                    frames.append(raw.frame(SEND_BATCH, {**v2(topic, 2, ""), **send_v2(batch="true")}, body)[1])
                    kinds.append("batch")
            raw.sock.sendall(b"".join(frames))
            resps = [raw.read()[0] for _ in frames]
            wakes = ctl.seq(C.SEQ_WRITE) - seq0
        finally:
            ctl.close()
        by_opaque = sorted(resps, key=lambda r: r.opaque)
        codes = [(k, r.code) for k, r in zip(kinds, by_opaque)]
        assert all(code == 0 for k, code in codes if k != "bad"), codes
        assert [code for k, code in codes if k == "bad"] == [29]          # INVALID_PARAMETER
        offsets = {}
        for k, r in zip(kinds, by_opaque):
            if k != "bad":       # the batch's two messages take two offsets of queue 2
                first = int(r.ext_fields["queueOffset"])
                offsets.setdefault(int(r.ext_fields["queueId"]), []).extend(
                    [first, first + 1] if k == "batch" else [first])
        for qid, got in offsets.items():
            assert sorted(got) == list(range(min(got), min(got) + len(got))), qid
        assert wakes < 60, f"{wakes} wakes of the store roles for 302 sends"
    finally:
        raw.close()


def test_bad_properties_take_the_full_path(broker):
    """A send whose properties the broker must rewrite (DELAY) or cannot pass through (a WAIT
    that does not start an entry) is handled by the full path, with its result."""
    raw = Raw(broker.port)
    try:
        props = "DELAY\x012\x02KEYS\x01d"
        resp, _ = raw.call(SEND_V2, v2(TOPIC, 0, props), b"delayed")
        assert resp.code == 0
        rec_props = decode_properties(pull_one_schedule(raw, resp))
        assert rec_props["REAL_TOPIC"] == TOPIC and rec_props["DELAY"] == "2"
        resp, _ = raw.call(SEND_V2, v2(TOPIC, 0, "KEYS\x01aWAIT\x01false"), b"odd")
        assert resp.code == 0
    finally:
        raw.close()


def pull_one_schedule(raw: Raw, send_resp) -> bytes:
    """The stored properties of the delayed message (read back by its offset msgId)."""
    from mq.wire.msgid import decode_offset_msg_id
    _, _, phy = decode_offset_msg_id(send_resp.ext_fields["msgId"])
    resp, _ = raw.call(33, {"offset": str(phy)})
    if resp.code == 0:
        return wcl.parse_record(resp.body).properties
    # no VIEW_MESSAGE_BY_ID on this broker: read the schedule queue (delay level 2 -> queue 1)
    wait_for(lambda: _max_offset(raw, "SCHEDULE_TOPIC_XXXX", 1) >= 1, 10, what="dispatch")
    return _pull_schedule(raw)


def _pull_schedule(raw: Raw) -> bytes:
    resp, _ = raw.call(PULL, {"consumerGroup": "FastPathGroup", "topic": "SCHEDULE_TOPIC_XXXX", "queueId": "1",
                              "queueOffset": "0", "maxMsgNums": "1", "sysFlag": "4", "commitOffset": "0",
                              "suspendTimeoutMillis": "0", "subscription": "*", "subVersion": "0"})
    assert resp.code == 0, (resp.code, resp.remark)
    return wcl.parse_record(resp.body).properties


def _json_frame(opaque: int, topic: str, qid: int, props_json: str, body: bytes) -> bytes:
    """A SEND_MESSAGE_V2 frame whose JSON header is written by hand: props_json is the JSON text
    of the properties value (escapes as given)."""
    ext = ",".join(f'"{k}":"{v}"' for k, v in v2(topic, qid, "").items() if k != "i")
    header = ('{"code":310,"extFields":{%s,"i":%s},"flag":0,"language":"JAVA","opaque":%d,'
              '"serializeTypeCurrentRPC":"JSON","version":409}' % (ext, props_json, opaque)).encode()
    return struct.pack(">II", 4 + len(header) + len(body), len(header)) + header + body


def test_a_connections_sends_are_appended_in_the_order_they_came(broker):
    """One connection pipelines sends to one queue, alternating ones the C path reads and ones it
    cannot (a \\u00e9 escape: C leaves the frame to Python without reading its header, so it
    cannot know it is a send; Python's send group takes it): each takes the next queue offset,
    in the order sent, as RocketMQ's one send thread appends them."""
    raw = Raw(broker.port)
    topic = "FastPathOrderTopic"
    try:
        resp, _ = raw.call(UPDATE_TOPIC, {"topic": topic, "readQueueNums": "1", "writeQueueNums": "1", "perm": "6"})
        assert resp.code == 0
        assert raw.call(SEND_V2, v2(topic, 0, ""), b"warm-up")[0].code == 0     # the worker learns the topic
        frames = []
        for i in range(60):
            opaque = 10_000 + i
            if i % 3 == 1:
                frames.append(_json_frame(opaque, topic, 0, '"KEYS\\u0001caf\\u00e9"', b"m%d" % i))
            else:
                cmd = RemotingCommand(code=SEND_V2, version=409, opaque=opaque, ext_fields=v2(topic, 0, "KEYS\x01k"),
                                      body=b"m%d" % i)
                frames.append(encode_frame(cmd))
        raw.sock.sendall(b"".join(frames))
        resps = {}
        for _ in frames:
            r = raw.read()[0]
            resps[r.opaque] = r
        offsets = [int(resps[10_000 + i].ext_fields["queueOffset"]) for i in range(60)]
        assert all(resps[10_000 + i].code == 0 for i in range(60))
        assert offsets == list(range(offsets[0], offsets[0] + 60)), offsets
    finally:
        raw.close()


# (JSON text in the header, the character it stands for): an escape C reads, one it leaves to
# Python, and raw UTF-8 of 2, 3 and 4 bytes
SPECIALS = [('\\"', '"'), ('\\\\', '\\'), ('\\u0003', '\x03'), ('\\/', '/'), ('\\u00e9', '\u00e9'),
            ('\u00e9', '\u00e9'), ('\u65e5', '\u65e5'), ('\U0001f600', '\U0001f600')]


def test_a_header_string_is_read_whatever_stands_where(broker):
    """A property value holding one special character -- an escape or a multi-byte UTF-8
    sequence -- at every offset from 0 to 40 (the C reader skips plain text 16 bytes a step, so
    the character falls at every place of a step and across steps): every send is stored with
    exactly the value the client meant, whichever path read it."""
    raw = Raw(broker.port)
    topic = "FastPathStringTopic"
    try:
        resp, _ = raw.call(UPDATE_TOPIC, {"topic": topic, "readQueueNums": "1", "writeQueueNums": "1", "perm": "6"})
        assert resp.code == 0
        warm = raw.call(SEND_V2, v2(topic, 0, ""), b"warm-up")[0]              # the worker learns the topic
        assert warm.code == 0
        base = int(warm.ext_fields["queueOffset"]) + 1
        fast_before = int(json.loads(raw.call(28, {})[0].body)["table"]["fastSendMsgs"])
        meant, frames = [], []
        for json_text, char in SPECIALS:
            for at in range(41):
                value_json = "v" * at + json_text + "w" * (40 - at)
                meant.append("v" * at + char + "w" * (40 - at))
                frames.append(_json_frame(20_000 + len(frames), topic, 0, f'"KEYS\\u0001{value_json}"',
                                          b"s%d" % len(frames)))
        raw.sock.sendall(b"".join(frames))
        resps = {}
        for _ in frames:
            r = raw.read()[0]
            resps[r.opaque] = r
        assert all(resps[20_000 + i].code == 0 for i in range(len(frames)))
        offsets = [int(resps[20_000 + i].ext_fields["queueOffset"]) for i in range(len(frames))]
        assert offsets == list(range(base, base + len(frames))), offsets
        # C read every one but the first after the warm-up (which publishes the topic to C) and
        # those with a \u escape beyond ASCII (Python's)
        fast = int(json.loads(raw.call(28, {})[0].body)["table"]["fastSendMsgs"]) - fast_before
        assert fast == len(frames) - 1 - 41, fast
        wait_for(lambda: _max_offset(raw, topic, 0) == base + len(frames), 10, what="dispatch")
        for i, value in enumerate(meant):
            rec = pull_one(raw, topic, 0, base + i)
            assert rec.body == b"s%d" % i
            assert decode_properties(rec.properties)["KEYS"] == value, (i, rec.properties)
    finally:
        raw.close()


def test_traced_sync_flush_pipelines_get_their_own_answers(tmp_path):
    """SYNC_FLUSH with perf tracing: answers held in C and released after the flush, on three
    connections pipelining 300 sends each, each answer its own (opaque, SUCCESS, a queue offset
    no other send got), and one req record per send in the trace."""
    from mq.trace import read_records
    ns = NameServer(str(tmp_path))
    b = Broker(str(tmp_path), ns.addr, sendMessageThreadPoolNums=1, flushDiskType="SYNC_FLUSH",
               perfTraceEnable="true", perfTraceDir=str(tmp_path / "trace"))
    raws = []
    topic = "FastPathTracedTopic"
    try:
        raws = [Raw(b.port) for _ in range(3)]
        resp, _ = raws[0].call(UPDATE_TOPIC, {"topic": topic, "readQueueNums": "4", "writeQueueNums": "4",
                                              "perm": "6"})
        assert resp.code == 0
        assert raws[0].call(SEND_V2, v2(topic, 0, ""), b"warm-up")[0].code == 0
        sent = [[raw.frame(SEND_V2, v2(topic, i % 4, "KEYS\x01k%d" % i), b"t%d" % i) for i in range(300)]
                for raw in raws]
        for raw, frames in zip(raws, sent):
            raw.sock.sendall(b"".join(data for _, data in frames))
        seen = set()
        for raw, frames in zip(raws, sent):
            want = {cmd.opaque for cmd, _ in frames}
            for _ in frames:
                r = raw.read()[0]
                assert r.code == 0 and r.opaque in want, (r.code, r.opaque, r.remark)
                want.discard(r.opaque)
                place = (r.ext_fields["queueId"], r.ext_fields["queueOffset"])
                assert place not in seen, f"{place} given twice"
                seen.add(place)
        info = json.loads(raws[0].call(28, {})[0].body)["table"]
        # all but the first after the warm-up, which publishes the topic to C
        assert int(info["fastSendMsgs"]) == 899, info["fastSendMsgs"]
    finally:
        for raw in raws:
            raw.close()
        b.stop()
        ns.stop()
    sends = [r for r in read_records(str(tmp_path / "trace")) if r.get("kind") == "req" and r.get("code") == SEND_V2]
    assert len(sends) == 901 and all(r["status"] == "0" and r["msgs"] == 1 for r in sends), len(sends)
