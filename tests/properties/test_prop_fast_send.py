"""The C send path (csrc/fastsend.c, mq.broker.fastsend) against Python's, as a differential
property: two real brokers, one with fastSendEnable (the default) and one without, get the
same random send frames, and give byte-identical answers and store byte-identical records.

Hypothesis draws frames the way clients write them and the ways they might: SEND_MESSAGE with
long names or SEND_MESSAGE_V2 with letters (or both kinds of keys), JSON headers with values as
strings, JSON integers, booleans or null, escaped or raw text, unknown keys, whitespace, any
language by name or ordinal, and ROCKETMQ headers; numbers in and out of their types and in
odd spellings ("01", "-0", " 1", "1.0"), properties with WAIT anywhere, DELAY, TRAN_MSG or
CLUSTER, non-ASCII text, queue ids in and out of range, topics that are writable, read-only,
absent, illegal or %RETRY%, oneway flags, empty and non-empty bodies, and now and then a frame
Python refuses to read (invalid UTF-8), which closes the connection on both brokers.  The C
path takes what it can read exactly and hands back the rest, so whichever path a frame takes,
the answers must match.

An example is a list of frames, sent either one at a time (answer, then the next), pipelined
in one write, or split: after one clean send answered alone (which makes the C broker serve the
connection from C from then on: csrc/fastconn.h), the frames' bytes in a few writes cut at drawn
points (inside a length, a header, a body), each a read of its own -- so frames C holds in part
between its reads, and frames it hands back to Python with the bytes after them.  A pipelined
(or split) example holds no frame whose Python handler awaits before appending
(DELAY, TRAN_MSG, CLUSTER, batch=true, %RETRY%): those are appended in an order the await
decides, on both brokers alike but not necessarily the same order.  Compared, for each frame:
the answer's bytes (the msgId's port field, which is each broker's own listen port, aside),
or the connection closed on both; and for each stored send, the record pulled back by its
queue offset, byte for byte but for what differs between two brokers on one host: the store
timestamp, the born port (each connection's own) and the store port."""
from __future__ import annotations

import dataclasses
import json
import socket
import struct
import time

import pytest
from hypothesis import given, note, strategies as st

from mq.cluster import wait_for
from mq.wire.headers import SEND_V2_LETTER_OF, send_v2
from mq.wire.remoting import LANGUAGE_NAMES, RemotingCommand, decode_frame_payload, encode_frame, frame_payload_size
from tests.faults.rawpeer import Peer, raw_broker
from tests.properties.propkit import bounded, rocketmq_header

TOPICS = ["DiffA", "DiffB"]           # writable, 4 queues
READ_ONLY = "DiffRO"                  # perm 4: sends refused with NO_PERMISSION
QUEUES = 4
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
CLOSED = "closed"


def _make_topics(port: int) -> None:
    p = Peer(port)
    try:
        for topic, perm in [(t, "6") for t in TOPICS] + [(READ_ONLY, "4")]:
            resp = p.call(17, {"topic": topic, "readQueueNums": str(QUEUES), "writeQueueNums": str(QUEUES),
                               "perm": perm})
            assert resp.code == 0, (resp.code, resp.remark)
    finally:
        p.close()


def _warm(port: int) -> None:
    """One send to each topic, so the io worker caches every topic config before the examples
    (a send to a topic not cached awaits its config before appending: its place in a pipeline
    would be the await's)."""
    p = Peer(port)
    try:
        for topic in TOPICS + [READ_ONLY]:
            resp = p.call(310, send_v2(producerGroup="DiffPG", topic=topic, queueId="0", sysFlag="0",
                                       bornTimestamp="0", flag="0", properties="", reconsumeTimes="0"), b"warm")
            assert resp.code == (0 if topic != READ_ONLY else 16), (topic, resp.code, resp.remark)
    finally:
        p.close()


@pytest.fixture(scope="module", params=["ASYNC_FLUSH", "SYNC_FLUSH"])
def brokers(request, tmp_path_factory):
    """(C path broker, Python path broker), their topics made and cached alike; under
    SYNC_FLUSH the C path holds its answers until the flush passes them."""
    mode = dict(autoCreateTopicEnable="false", flushDiskType=request.param)
    with raw_broker(str(tmp_path_factory.mktemp("fastc")), TOPICS[0], QUEUES, **mode) as c, \
            raw_broker(str(tmp_path_factory.mktemp("fastpy")), TOPICS[0], QUEUES, fastSendEnable="false",
                       **mode) as py:
        for b in (c, py):
            _make_topics(b.port)
            _warm(b.port)
        yield c, py


# --------------------------------------------------------------------------------------------------
# Strategies: a frame is built from a dict of header fields by long name (None: left out), the
# body, and how the header is written

PROP_TEXT = st.text(st.characters(exclude_characters="\x01\x02", exclude_categories=("Cs",)), min_size=0,
                    max_size=8)


def _number_text(lo: int, hi: int, clean: bool):
    """Integers as a client might write them: plain, or (not clean) also spelled oddly (Python
    reads some) or out of range."""
    plain = st.integers(lo, hi).map(str)
    if clean:
        return plain
    odd = st.builds(lambda n, f: f.format(n), st.integers(0, 99),
                    st.sampled_from(["0{}", " {}", "{} ", "+{}", "-0", "{}.0", "1_{}", "x{}", ""]))
    wide = st.sampled_from([str(hi + 1), str(lo - 1), str(10 ** 20)])
    return st.one_of(plain, plain, odd, wide)


@st.composite
def properties(draw, special: bool) -> str:
    entries = [f"{k}\x01{v}" for k, v in draw(st.dictionaries(st.sampled_from(["KEYS", "TAGS", "UNIQ_KEY", "u"]),
                                                               PROP_TEXT, max_size=3)).items()]
    if draw(st.booleans()):
        wait = "WAIT\x01" + draw(st.sampled_from(["true", "false", "x"]))
        entries.insert(draw(st.integers(0, len(entries))), wait)
        if draw(st.integers(0, 9)) == 0:
            entries.append(wait)                        # twice: Python's full path
    if special and draw(st.integers(0, 4)) == 0:
        entries.append("CLUSTER\x01other")
    text = "\x02".join(entries)
    if draw(st.integers(0, 9)) == 0:
        text = text.replace("WAIT", "xWAIT", 1)          # WAIT inside another entry's text
    return text


@st.composite
def frames(draw, special: bool) -> dict:
    """A frame; most are clean (as clients write them: the C path's), the rest draw from the odd."""
    clean = draw(st.integers(0, 9)) < 7
    topics = TOPICS if clean else TOPICS * 4 + [READ_ONLY, "DiffNone", "bad topic"]
    queue_ids = st.integers(0, QUEUES - 1).map(str) if clean else \
        st.one_of(st.integers(0, QUEUES + 1).map(str), st.sampled_from(["01", "-0", " 1", "1.0", "x", str(1 << 31)]))
    h = {"producerGroup": "DiffPG", "topic": draw(st.sampled_from(topics)), "defaultTopic": "TBW102",
         "defaultTopicQueueNums": "4",
         "queueId": draw(queue_ids),
         "sysFlag": draw(st.one_of(st.sampled_from(["0", "2", "4", "8", "12", "1"]),
                                   _number_text(INT32_MIN, INT32_MAX, clean))),
         "bornTimestamp": draw(_number_text(INT64_MIN, INT64_MAX, clean)),
         "flag": draw(_number_text(INT32_MIN, INT32_MAX, clean)),
         "properties": draw(properties(special and not clean)),
         "reconsumeTimes": draw(_number_text(INT32_MIN, INT32_MAX, clean)),
         "unitMode": "false",
         "batch": draw(st.sampled_from(["false", "0", None] if clean else
                                       ["false", "0", "", "no", None] + (["true", "1", " TRUE"] if special else [])))}
    for name in draw(st.lists(st.sampled_from(["sysFlag", "bornTimestamp", "flag", "properties",
                                               "reconsumeTimes", "batch"]), max_size=2)):
        h[name] = None                                   # left out
    body = draw(st.one_of(st.binary(min_size=1, max_size=300), st.just(b"")))
    return dict(
        header=h, body=body,
        v2=draw(st.sampled_from(["long", "letters", "letters", "both"])),
        serialize_type=draw(st.sampled_from([0, 0, 1])),
        code=draw(st.sampled_from([10, 310])),
        oneway=not special and draw(st.integers(0, 9)) == 0,
        language=draw(st.sampled_from(["JAVA", "CPP", "PYTHON", None]) if clean else
                      st.one_of(st.sampled_from(["JAVA", "CPP", "PYTHON"]), st.integers(0, 14), st.just("NOPE"),
                                st.none())),
        version=draw(st.integers(-(1 << 15), (1 << 15) - 1)),
        json_style=dict(ints=draw(st.booleans()), ascii=draw(st.booleans()), null=draw(st.booleans()),
                        unknown=draw(st.booleans()), spaces=draw(st.booleans()), slash=draw(st.booleans()),
                        remark=draw(st.sampled_from([None, "", "r\u00e9"]))),
        broken=special and not clean and draw(st.integers(0, 9)) == 0,  # a value Python cannot read: the connection closes
    )


def _ext(f: dict) -> dict:
    h = {k: v for k, v in f["header"].items() if v is not None}
    if f["v2"] == "letters":
        return {SEND_V2_LETTER_OF[k]: v for k, v in h.items()}
    if f["v2"] == "both":                                # Python reads the long names then
        return {**{SEND_V2_LETTER_OF[k]: v for k, v in h.items()}, **h}
    return h


def frame_bytes(f: dict, opaque: int) -> bytes:
    ext = _ext(f)
    flag = 2 if f["oneway"] else 0
    if f["serialize_type"] == 1:
        lang = f["language"] if isinstance(f["language"], int) else 0
        header = rocketmq_header(f["code"], lang, f["version"], opaque, flag,
                                 [(k.encode(), v.encode() + (b"\xff" if f["broken"] and k in ("topic", "b") else b""))
                                  for k, v in ext.items()])
    else:
        style = f["json_style"]
        if style["ints"]:                                # numbers as JSON integers, where they are integers
            ext = {k: (int(v) if v.lstrip("-").isdigit() and v == str(int(v)) else v) for k, v in ext.items()}
            if "batch" in ext and ext["batch"] == "false":
                ext["batch"] = False
        if style["null"]:
            ext["userNull"] = None
        obj = {"code": f["code"], "extFields": ext, "flag": flag}
        if f["language"] is not None:
            obj["language"] = LANGUAGE_NAMES.get(f["language"], f["language"]) if isinstance(f["language"], int) \
                else f["language"]
        obj["opaque"] = opaque
        if style["remark"] is not None:
            obj["remark"] = style["remark"]
        obj["serializeTypeCurrentRPC"] = "JSON"
        obj["version"] = f["version"]
        if style["unknown"]:
            obj["extra"] = 1
        text = json.dumps(obj, ensure_ascii=style["ascii"], separators=(", ", ": ") if style["spaces"] else (",", ":"))
        if style["slash"]:
            text = text.replace("/", "\\/")
        header = text.encode("utf-8", "surrogatepass")
        if f["broken"]:
            header = header.replace(b'"extFields"', b'"ext\xc0Fields"', 1)
        if style["spaces"]:
            header += b"\n"
    return struct.pack(">II", 4 + len(header) + len(f["body"]), (f["serialize_type"] << 24) | len(header)) + \
        header + f["body"]


@st.composite
def examples(draw):
    """(mode, frames, cuts): mode "one", "pipelined" or "split"; a pipeline (split or not) draws no
    frame that closes the connection, nor one Python appends after an await (CLUSTER, batch=true;
    frames(special=False)).  cuts: where a split example's bytes are cut, as fractions."""
    mode = draw(st.sampled_from(["one", "pipelined", "split"]))
    fs = draw(st.lists(frames(special=mode == "one"), min_size=1, max_size=6))
    cuts = sorted(draw(st.lists(st.floats(0, 1), max_size=4))) if mode == "split" else []
    return mode, fs, cuts


# the first frame of a split example: a clean send C takes, answered before the rest is written
OPENER = dict(header={"producerGroup": "DiffPG", "topic": TOPICS[0], "defaultTopic": "TBW102",
                      "defaultTopicQueueNums": "4", "queueId": "0", "sysFlag": "0", "bornTimestamp": "1",
                      "flag": "0", "properties": "KEYS\x01k", "reconsumeTimes": "0", "unitMode": "false",
                      "batch": "false"},
              body=b"opener", v2="letters", serialize_type=0, code=310, oneway=False, language="JAVA",
              version=399, json_style=dict(ints=False, ascii=True, null=False, unknown=False, spaces=False,
                                           slash=False, remark=None), broken=False)


# --------------------------------------------------------------------------------------------------
# Sending and comparing


# bounds on a hang, not speed checks: under the suite's disk writes this machine has held every
# process still for up to 9 s (the brokers' stall watch logged it), and an exchange cut short by
# a bound leaves the two brokers' logs apart for every later example
ANSWER_TIMEOUT_S = 30.0
DISPATCH_TIMEOUT_S = 30.0


class Conn:
    def __init__(self, port: int):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=ANSWER_TIMEOUT_S)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def read_frame(self):
        """The next answer's bytes, or CLOSED."""
        try:
            head = self._exactly(4)
            return head + self._exactly(frame_payload_size(head))
        except (EOFError, ConnectionResetError):
            return CLOSED

    def _exactly(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise EOFError
            buf += chunk
        return buf


SPLIT_PAUSE_S = 0.003                  # between a split example's writes: each is a read of its own


def exchange(port: int, mode: str, fs: list, opaques: list, cuts: list) -> list:
    """Each frame's answer bytes (None for a oneway frame, CLOSED once the broker closed).  A
    pipelined example's answers come in the order they were ready (the C path's and the group's
    are written at different moments): they are matched by opaque.  A barrier (GET_MAX_OFFSET) on
    the same connection ends the exchange, so every frame was read before the next example's."""
    conn = Conn(port)
    try:
        if mode != "one":
            data = b"".join(frame_bytes(f, o) for f, o in zip(fs, opaques))
            if mode == "split":        # fs[0] is the OPENER
                first = len(frame_bytes(fs[0], opaques[0]))
                conn.sock.sendall(data[:first])
                opener = conn.read_frame()
                assert opener != CLOSED
                at = first
                for cut in [first + int(c * (len(data) - first)) for c in cuts] + [len(data)]:
                    if cut > at:
                        conn.sock.sendall(data[at:cut])
                        at = cut
                        time.sleep(SPLIT_PAUSE_S)
                by_opaque = {decode_frame_payload(opener[4:]).opaque: opener}
            else:
                conn.sock.sendall(data)
                by_opaque = {}
            for _ in range(sum(1 for f in fs if not f["oneway"]) - len(by_opaque)):
                a = conn.read_frame()
                assert a != CLOSED, "a pipelined example has no frame that closes the connection"
                by_opaque[decode_frame_payload(a[4:]).opaque] = a
            out = [None if f["oneway"] else by_opaque[o] for f, o in zip(fs, opaques)]
        else:
            out = []
            for f, o in zip(fs, opaques):
                if out and out[-1] == CLOSED:
                    out.append(CLOSED)
                    continue
                try:
                    conn.sock.sendall(frame_bytes(f, o))
                except (BrokenPipeError, ConnectionResetError):
                    out.append(CLOSED)
                    continue
                out.append(conn.read_frame())
        if not out or out[-1] != CLOSED:
            conn.sock.sendall(frame_bytes_barrier())
            assert conn.read_frame() != CLOSED
    finally:
        conn.sock.close()
    return out


def frame_bytes_barrier() -> bytes:
    return encode_frame(RemotingCommand(code=30, opaque=0, ext_fields={"topic": TOPICS[0], "queueId": "0"}))


def record(port: int, queue_id: int, queue_offset: int, topic: str) -> bytes:
    """The raw record at the queue offset, waiting for dispatch: first until the queue's max
    offset passes it (a pull beyond the max by more than one is answered PULL_OFFSET_MOVED at
    once, not held -- CI 74 met a queue whose earlier message was not dispatched yet, and 200
    such answers took under a second), then by pulls that long-poll."""
    p = Peer(port)
    try:
        max_offset = lambda: int(p.call(30, {"topic": topic, "queueId": str(queue_id)}).ext_fields["offset"])  # noqa: E731
        wait_for(lambda: max_offset() > queue_offset, 30, 0.005, f"{topic}:{queue_id}:{queue_offset} dispatched")
        for _ in range(200):
            resp = p.call(11, {"consumerGroup": "DiffCG", "topic": topic, "queueId": str(queue_id),
                               "queueOffset": str(queue_offset), "maxMsgNums": "1", "sysFlag": "6",
                               "commitOffset": "0", "suspendTimeoutMillis": "200", "subscription": "*",
                               "subVersion": "0"})
            if resp.code == 0:
                return resp.body
        raise AssertionError(f"no record at {topic}:{queue_id}:{queue_offset}")
    finally:
        p.close()


def normalized_record(rec: bytes, placement_aside: bool = False) -> bytes:
    """A v1 record (IPv4 hosts) with what two brokers on one host write differently zeroed: the
    born port and the store timestamp (52..64), the store port (68..72), and with placement_aside
    its QUEUEOFFSET and PHYSICALOFFSET (20..36)."""
    b = bytearray(rec)
    b[52:64] = bytes(12)
    b[68:72] = bytes(4)
    if placement_aside:
        b[20:36] = bytes(16)
    return bytes(b)


_opaque = iter(range(1, 1 << 30))


@bounded(120)
@given(example=examples())
def test_c_and_python_paths_answer_and_store_the_same(brokers, example):
    c, py = brokers
    mode, fs, cuts = example
    if mode == "split":
        fs = [OPENER] + fs
    pipelined = mode != "one"
    opaques = [next(_opaque) for _ in fs]
    got_c = exchange(c.port, mode, fs, opaques, cuts)
    got_py = exchange(py.port, mode, fs, opaques, cuts)
    port_c, port_py = b"%08X" % c.port, b"%08X" % py.port
    for f, a, b in zip(fs, got_c, got_py):
        note(f"{mode} {f['v2']} ser={f['serialize_type']} code={f['code']} "
             f"{f['header']} body={len(f['body'])} -> C {a if a in (None, CLOSED) else a[:160]}")
        if a in (None, CLOSED) or b in (None, CLOSED):
            assert a == b, f"C path answered {a!r}, Python path {b!r}"
            continue
        ra, rb = decode_frame_payload(a[4:]), decode_frame_payload(b[4:])
        stored = ra.code == 0 and bool(ra.ext_fields) and "queueOffset" in ra.ext_fields
        if pipelined and stored:
            # placement aside: Python's own path appends a pipeline's awaited sends after the
            # others of its read, the C path keeps the order they came in (RocketMQ's), so where
            # such a pipeline's messages went may differ; what they are may not
            a, b = _placement_aside(ra), _placement_aside(rb)
        else:
            a = a.replace(port_c, port_py, 1)          # the msgId's port: each broker's own
        assert a == b, f"C path answered {a!r}, Python path {b!r}"
        if stored and int(f["header"]["sysFlag"] or 0) & 0xC not in (4, 12):   # prepared/rolled back: no entry
            topic = f["header"]["topic"]
            rc = record(c.port, int(ra.ext_fields["queueId"]), int(ra.ext_fields["queueOffset"]), topic)
            rp = record(py.port, int(rb.ext_fields["queueId"]), int(rb.ext_fields["queueOffset"]), topic)
            assert normalized_record(rc, pipelined) == normalized_record(rp, pipelined), "the stored records differ"
    # oneway frames are not answered: what they stored shows in the queues' ends
    assert max_offsets(c.port) == max_offsets(py.port), "the brokers' queues hold different counts"


def _placement_aside(resp) -> bytes:
    """An answer re-encoded without its msgId's offset and its queueOffset."""
    ext = dict(resp.ext_fields)
    ext["msgId"], ext["queueOffset"] = ext["msgId"][:8], "-"
    return encode_frame(dataclasses.replace(resp, ext_fields=ext))


def max_offsets(port: int) -> list[int]:
    """Each queue's end, once everything appended is dispatched (a queue's end is the ConsumeQueue's,
    which the dispatch role writes after the append)."""
    p = Peer(port)
    try:
        deadline = time.monotonic() + DISPATCH_TIMEOUT_S
        while True:
            info = json.loads(p.call(28, {}).body)["table"]
            if int(info["dispatchedOffset"]) >= int(info["commitLogMaxOffset"]):
                break
            assert time.monotonic() < deadline, f"dispatch stays behind: {info}"
            time.sleep(0.01)
        return [int(p.call(30, {"topic": t, "queueId": str(q)}).ext_fields["offset"]) for t in TOPICS
                for q in range(QUEUES)]
    finally:
        p.close()


def test_differential_draws_reach_both_paths(brokers):
    """The property above means something only if the C path took many of its frames and handed
    back many others: the C broker's io worker counts the sends it took."""
    c, _ = brokers
    p = Peer(c.port)
    try:
        info = json.loads(p.call(28, {}).body)["table"]
    finally:
        p.close()
    assert info["fastSendOn"] == "true"
    assert int(info["fastSendMsgs"]) >= 50, info["fastSendMsgs"]
    # and that many of its connections were served from C (one at a time, split)
    assert int(info["fastConnAdoptions"]) >= 10, info["fastConnAdoptions"]

