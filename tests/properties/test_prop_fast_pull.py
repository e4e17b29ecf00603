"""The C pull path (csrc/fastsend.c take_pull, mq.broker.fastsend) against Python's, as a
differential property: two real brokers serve byte-identical copies of one store, one with
fastPullEnable (the default) and one without, get the same random PULL_MESSAGE frames, and must
give byte-identical answers.

The store is filled once by a third broker and copied while it is stopped: every group the pulls
name is made then (the brokers make none: a group made while they run would empty their group
caches, C's too, at a moment of its own), topic PullA (4 queues) with messages tagged TagA, TagB, TagC or untagged, mostly 1 KiB and a few of 10 KiB
(over the brokers' maxTransferBytesOnMessageInMemory of 8 KiB, so a pull stops at its byte limit
and now and then meets a first record bigger than the limit), a write-only topic, and a group
whose consumeEnable is false.  Once both brokers run, the same record is damaged in both copies
(a body byte flipped on disk: a pull that meets it must skip and report it, never serve it).

Hypothesis draws pulls the way clients write them and the ways they might: JSON headers (values as
strings or JSON integers, escaped or raw, with or without spaces) or ROCKETMQ ones, any group
(published, unknown, disabled, empty), any topic (readable, write-only, absent, %RETRY%), queue
ids and offsets in and out of range and oddly spelled, maxMsgNums absent, empty, negative, small or
large, sysFlag with and without its subscription (without it, the groups' heartbeat subscriptions:
tags for DiffCG, SQL92 for OtherCG), commit and suspend bits, TAG expressions ("*", tags joined by
"||", white space, non-ASCII, empty tags), SQL92 expressions over the messages' user properties
(region, n), and other expression types.  Whatever
path a pull takes on the C broker, the answers must be the same bytes; a pull Python holds
(suspend, nothing found) is held for at most 1 ms."""
from __future__ import annotations

import json
import os
import shutil
import socket
import struct
import time

import pytest
from hypothesis import given, note, strategies as st

from mq.cluster import Broker, NameServer
from mq.wire.commitlog import parse_record
from mq.wire.headers import send_v2
from mq.wire.remoting import LANGUAGE_NAMES, RemotingCommand, decode_frame_payload, encode_frame, frame_payload_size
from tests.faults.rawpeer import Peer
from tests.properties.propkit import bounded, rocketmq_header

TOPIC, WRITE_ONLY = "PullA", "PullWO"
QUEUES = 4
PER_QUEUE = 48                         # messages per queue
BIG_EVERY = 11                         # every 11th message has a 10 KiB body
BYTES_MAX = 8192                       # maxTransferBytesOnMessageInMemory of both brokers
DAMAGED = (1, 9)                       # (queue, queue offset) of the record damaged on disk
GROUPS = ["DiffCG", "DiffCG", "DiffCG", "OtherCG", "DisabledCG", "NoSuchCG", ""]   # none made on the way
TAGS = ["TagA", "TagB", "TagC", None]
REGIONS = ["eu", "us", None, "eu", "\u00e9u"]    # the user property SQL92 pulls filter on, with n = i % 7
CLOSED = "closed"


def _send(p: Peer, topic: str, qid: int, tags: str | None, body: bytes, user: str = "") -> None:
    props = "\x02".join(x for x in (f"TAGS\x01{tags}" if tags else "", user, "WAIT\x01true") if x)
    resp = p.call(310, send_v2(producerGroup="DiffPG", topic=topic, queueId=str(qid), sysFlag="0",
                               bornTimestamp="1700000000000", flag="0", properties=props, reconsumeTimes="0"), body)
    assert resp.code == 0, (resp.code, resp.remark)


def _fill(port: int) -> int:
    """The store's topics, groups and messages; returns the damaged record's CommitLog offset."""
    p = Peer(port)
    try:
        for topic, perm in ((TOPIC, "6"), (WRITE_ONLY, "2")):
            resp = p.call(17, {"topic": topic, "readQueueNums": str(QUEUES), "writeQueueNums": str(QUEUES),
                               "perm": perm})
            assert resp.code == 0, (resp.code, resp.remark)
        for name in ("DiffCG", "OtherCG", "DisabledCG", "SubCG"):   # made here: a group made later would clear
            group = {"groupName": name, "consumeEnable": name != "DisabledCG", "consumeFromMinEnable": True,
                     "consumeBroadcastEnable": True, "retryQueueNums": 1, "retryMaxTimes": 16, "brokerId": 0,
                     "whichBrokerWhenConsumeSlowly": 1, "notifyConsumerIdsChangedEnable": True}
            resp = p.call(200, None, json.dumps(group).encode())   # the workers' group caches (and C's) as
            assert resp.code == 0, (resp.code, resp.remark)       # it went, whenever its news came
        for i in range(PER_QUEUE):
            for qid in range(QUEUES):
                size = 10 * 1024 if i % BIG_EVERY == BIG_EVERY - 1 else 1024
                region = REGIONS[(i * 7 + qid) % len(REGIONS)]
                user = "\x02".join(x for x in (f"region\x01{region}" if region else "", f"n\x01{i % 7}") if x)
                _send(p, TOPIC, qid, TAGS[(i + qid) % len(TAGS)], bytes([65 + (i + qid) % 26]) * size, user)
        deadline = time.monotonic() + 30
        while True:
            resp = p.call(11, _clean_ext(DAMAGED[0], DAMAGED[1], "1"))
            if resp.code == 0:
                return parse_record(resp.body).physical_offset
            assert time.monotonic() < deadline, "the damaged record's queue was not dispatched"
            time.sleep(0.05)
    finally:
        p.close()


def _clean_ext(qid: int, offset: int, max_nums: str = "32", group: str = "DiffCG", sub: str = "*") -> dict:
    return {"consumerGroup": group, "topic": TOPIC, "queueId": str(qid), "queueOffset": str(offset),
            "maxMsgNums": max_nums, "sysFlag": "4", "commitOffset": "0", "suspendTimeoutMillis": "0",
            "subscription": sub, "subVersion": "0"}


HEARTBEAT_SUBS = {"DiffCG": ("TAG", "TagA || TagB"), "OtherCG": ("SQL92", "region = 'eu'")}
HEARTBEAT_VERSION = 1700000000000      # their subVersion: a pull with a higher one is not C's


def _register(p: Peer, subs: dict, version: int, client: str) -> None:
    """A consumer client's HEART_BEAT on connection p: groups -> (expression type, text) on TOPIC."""
    consumers = [{"groupName": group, "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
                  "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET", "unitMode": False,
                  "subscriptionDataSet": [{"topic": TOPIC, "subString": text, "expressionType": kind,
                                           "tagsSet": [t.strip() for t in text.split("||")] if kind == "TAG" else [],
                                           "subVersion": version, "classFilterMode": False}]}
                 for group, (kind, text) in subs.items()]
    opaque = p.send(34, None, json.dumps({"clientID": client, "producerDataSet": [],
                                          "consumerDataSet": consumers}).encode())
    while True:                        # NOTIFY_CONSUMER_IDS_CHANGED (40) pushes may come first
        resp = p.read()
        if resp.is_response and resp.opaque == opaque:
            break
    assert resp.code == 0, (resp.code, resp.remark)


def _heartbeat(port: int) -> Peer:
    """Registers DiffCG's and OtherCG's subscriptions to TOPIC (HEARTBEAT_SUBS); the returned
    connection keeps them registered while it is open."""
    p = Peer(port)
    _register(p, HEARTBEAT_SUBS, HEARTBEAT_VERSION, "diff-client@1")
    return p


def _runtime(port: int) -> dict:
    p = Peer(port)
    try:
        resp = p.call(28)                              # GET_BROKER_RUNTIME_INFO
        assert resp.code == 0, (resp.code, resp.remark)
        return json.loads(resp.body)["table"]
    finally:
        p.close()


@pytest.fixture(scope="module")
def brokers(tmp_path_factory):
    """(C path broker, Python path broker) on copies of one store, the same record damaged in both."""
    work = str(tmp_path_factory.mktemp("fastpull"))
    ns = NameServer(work)
    running: list[Broker] = []
    try:
        opts = dict(autoCreateTopicEnable="false", autoCreateSubscriptionGroup="false", enablePropertyFilter="true",
                    maxTransferBytesOnMessageInMemory=str(BYTES_MAX),
                    sendMessageThreadPoolNums="1")          # one io worker: its counters are the runtime info's
        fill = Broker(work, ns.addr, name="fill", **opts)
        running.append(fill)
        phy = _fill(fill.port)
        assert fill.stop() == 0, fill.proc.output()[-3000:]
        running.remove(fill)
        c_dir, py_dir = os.path.join(work, "c-store"), os.path.join(work, "py-store")
        for d in (c_dir, py_dir):
            shutil.copytree(fill.dir, d)
            for name in ("broker.conf", "broker.log"):    # each broker writes its own
                os.remove(os.path.join(d, name))
        c = Broker(work, ns.addr, name="fastc", storePathRootDir=c_dir, **opts)
        running.append(c)
        py = Broker(work, ns.addr, name="fastpy", storePathRootDir=py_dir, fastPullEnable="false", **opts)
        running.append(py)
        heartbeats = [_heartbeat(b.port) for b in (c, py)]    # pulls without sysFlag bit 4 use these
        size = 16 * 1024 * 1024                       # mq.cluster.Broker's CommitLog files
        for d in (c_dir, py_dir):                     # a body byte of the record, through the page cache
            fd = os.open(os.path.join(d, "commitlog", f"{phy - phy % size:020d}"), os.O_RDWR)
            try:
                at = phy % size + 120
                os.pwrite(fd, bytes([os.pread(fd, 1, at)[0] ^ 0xFF]), at)
            finally:
                os.close(fd)
        for b in (c, py):                             # the io worker reads the groups and topic (the first
            p = Peer(b.port)                          # pull of each), then publishes them to C (the second)
            try:
                for group in ("DiffCG", "DiffCG", "OtherCG", "OtherCG"):
                    assert p.call(11, _clean_ext(0, 0, group=group)).code == 0
            finally:
                p.close()
        assert _runtime(c.port)["fastPullOn"] == "true" and _runtime(py.port)["fastPullOn"] == "false"
        yield c, py
        for hb in heartbeats:
            hb.close()
        for b in (c, py):
            log = b.proc.output()
            assert b.stop() == 0, log[-3000:]
            assert "Traceback" not in log, log[log.index("Traceback") - 300:][:3000]
            running.remove(b)
    finally:
        for b in running:
            b.stop()
        ns.stop()


# --------------------------------------------------------------------------------------------------
# Strategies

def _number(lo: int, hi: int, clean: bool):
    plain = st.integers(lo, hi).map(str)
    if clean:
        return plain
    return st.one_of(plain, st.sampled_from(["", "01", "-0", " 1", "+1", "1.0", "1_0", "x", str(1 << 63), "-5"]))


SUBS_CLEAN = ["*", "*", "", "TagA", "TagA || TagB", "TagB||TagC", " TagC ", None]
SUBS_ODD = ["TagA||", "||", " * ", "*||TagA", "T\u00e1g", "TagA\t", "NoSuchTag", "TagA || TagA", "a|||b",
            "|| TagB ||", " ", "TagA" * 300]
SQL_CLEAN = ["region = 'eu'", "n > 3", "region = 'us' AND n < 5", "region IS NULL OR n = 2", "n BETWEEN 1 AND 4",
             "region <> 'eu'", "region = '\u00e9u'"]
SQL_ODD = ["region =", "zz = 1", "n > 3 AND", "REGION = 'eu'", "region = \"eu\"", "n > 'x'", "TRUE",
           "region = 'eu' OR " * 40 + "n = 1"]


@st.composite
def pulls(draw) -> dict:
    clean = draw(st.integers(0, 9)) < 6
    qid = st.integers(0, QUEUES - 1).map(str) if clean else _number(-1, QUEUES + 1, False)
    offsets = st.integers(0, PER_QUEUE - 1) if clean else st.integers(-2, PER_QUEUE + 2)
    sys_flag = draw(st.sampled_from([4, 5, 0, 1]) if clean else st.integers(0, 15))   # 0, 1: the heartbeat's
    h = {"consumerGroup": draw(st.sampled_from(GROUPS[:4] if clean else GROUPS)),
         "topic": draw(st.sampled_from([TOPIC] if clean else [TOPIC, TOPIC, WRITE_ONLY, "PullNone", "%RETRY%DiffCG"])),
         "queueId": draw(qid),
         "queueOffset": draw(offsets.map(str) if clean else st.one_of(offsets.map(str), _number(0, 9, False))),
         "maxMsgNums": draw(st.sampled_from(["1", "2", "5", "32", "64", None]) if clean else
                            st.one_of(_number(-3, 100, False), st.none())),
         "sysFlag": str(sys_flag) if clean or draw(st.integers(0, 5)) else draw(_number(0, 15, False)),
         "commitOffset": draw(_number(0, 40, clean)),
         "suspendTimeoutMillis": draw(st.sampled_from(["0", "1"])),
         "subscription": draw(st.sampled_from(SUBS_CLEAN if clean else SUBS_CLEAN + SUBS_ODD)),
         "subVersion": draw(st.one_of(_number(0, 1 << 40, clean),       # and around the heartbeats' version:
                                      st.sampled_from([str(HEARTBEAT_VERSION + d) for d in (-1, 0, 1, 1 << 40)]))),
         "expressionType": draw(st.sampled_from([None, None, "TAG", "SQL92", "SQL92"] if clean else
                                                [None, "TAG", "", "tag", "SQL92", "SQL92", "sql92", "XYZ"]))}
    if h["expressionType"] in ("SQL92", "sql92"):
        h["subscription"] = draw(st.sampled_from(SQL_CLEAN if clean else SQL_CLEAN + SQL_ODD + SUBS_CLEAN))
    if not sys_flag & 2 and not clean and draw(st.integers(0, 3)) == 0:
        h["suspendTimeoutMillis"] = draw(st.sampled_from(["", "x", " 1", None]))   # no hold: read, not used
    for name in draw(st.lists(st.sampled_from(["maxMsgNums", "commitOffset", "subVersion", "subscription"]),
                              max_size=1 if clean else 2)):
        h[name] = None
    return dict(header=h, code=11, **_framing(draw, clean))


def _framing(draw, clean: bool) -> dict:
    return dict(
        serialize_type=draw(st.sampled_from([0, 0, 1])),
        language=draw(st.sampled_from(["JAVA", "CPP", "PYTHON"]) if clean else
                      st.one_of(st.integers(0, 14), st.sampled_from(["JAVA", "GO"]), st.none())),
        version=draw(st.integers(-(1 << 15), (1 << 15) - 1)),
        oneway=not clean and draw(st.integers(0, 14)) == 0,
        json_style=dict(ints=draw(st.booleans()), ascii=draw(st.booleans()), spaces=draw(st.booleans())),
    )


@st.composite
def offset_queries(draw) -> dict:
    """GET_MAX_OFFSET (30) and GET_MIN_OFFSET (31), of queues that exist and of others."""
    clean = draw(st.integers(0, 9)) < 6
    h = {"topic": draw(st.sampled_from([TOPIC] if clean else
                                       [TOPIC, WRITE_ONLY, "PullNone", "%RETRY%DiffCG", "", "Pull A", "T" * 200,
                                        "Pull\u00c1"])),
         "queueId": draw(st.integers(0, QUEUES - 1).map(str) if clean else _number(-1, QUEUES + 1, False))}
    if draw(st.booleans()):
        h["consumerGroup"] = draw(st.sampled_from(GROUPS))
    if not clean and draw(st.integers(0, 4)) == 0:
        h[draw(st.sampled_from(["topic", "queueId"]))] = None
    return dict(header=h, code=draw(st.sampled_from([30, 31])), **_framing(draw, clean))


def frame_bytes(f: dict, opaque: int) -> bytes:
    ext = {k: v for k, v in f["header"].items() if v is not None}
    flag = 2 if f["oneway"] else 0
    if f["serialize_type"] == 1:
        lang = f["language"] if isinstance(f["language"], int) else 0
        header = rocketmq_header(f["code"], lang, f["version"], opaque, flag,
                                 [(k.encode(), v.encode()) for k, v in ext.items()])
    else:
        style = f["json_style"]
        if style["ints"]:                                # numbers as JSON integers, where they are integers
            ext = {k: (int(v) if v.lstrip("-").isdigit() and v == str(int(v)) else v) for k, v in ext.items()}
        obj = {"code": f["code"], "extFields": ext, "flag": flag}
        if f["language"] is not None:
            obj["language"] = LANGUAGE_NAMES.get(f["language"], f["language"]) if isinstance(f["language"], int) \
                else f["language"]
        obj["opaque"] = opaque
        obj["serializeTypeCurrentRPC"] = "JSON"
        obj["version"] = f["version"]
        text = json.dumps(obj, ensure_ascii=style["ascii"], separators=(", ", ": ") if style["spaces"] else (",", ":"))
        header = text.encode("utf-8")
    return struct.pack(">II", 4 + len(header), (f["serialize_type"] << 24) | len(header)) + header


# --------------------------------------------------------------------------------------------------
# Sending and comparing

def _exactly(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return buf


def exchange(port: int, fs: list, opaques: list) -> list:
    """Each pull's answer bytes, one at a time (None for a oneway pull, CLOSED once the broker
    closed); a GET_MAX_OFFSET barrier after a oneway one, so nothing is left unread."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    out: list = []
    try:
        for f, opaque in zip(fs, opaques):
            sock.sendall(frame_bytes(f, opaque))
            if f["oneway"]:
                out.append(None)
                continue
            try:
                head = _exactly(sock, 4)
                out.append(head + _exactly(sock, frame_payload_size(head)))
            except (EOFError, ConnectionResetError):
                out.append(CLOSED)
                break
    finally:
        sock.close()
    return out


@bounded(120)
@given(st.lists(st.one_of(pulls(), pulls(), offset_queries()), min_size=1, max_size=4))
def test_c_and_python_pulls_answer_the_same_bytes(brokers, fs):
    c, py = brokers
    opaques = list(range(1, len(fs) + 1))
    got_c = exchange(c.port, fs, opaques)
    got_py = exchange(py.port, fs, opaques)
    for i, (a, b) in enumerate(zip(got_c, got_py)):
        note(f"pull {i}: {fs[i]}")
        if a != b and a not in (None, CLOSED) and b not in (None, CLOSED):
            ca, cb = decode_frame_payload(a[4:]), decode_frame_payload(b[4:])
            note(f"C: code {ca.code} {ca.remark} {ca.ext_fields} {len(ca.body or b'')} body bytes")
            note(f"Python: code {cb.code} {cb.remark} {cb.ext_fields} {len(cb.body or b'')} body bytes")
        assert a == b, f"pull {i}: the answers differ"
    assert len(got_c) == len(got_py)


def test_clean_pulls_are_answered_in_c_and_read_every_record(brokers):
    """Clean pulls of a whole queue are answered by C (the broker's fastPulls count grows by as
    many) but for the two kinds it hands back: a pull that meets the damaged record (Python's path
    skips and reports it) and one whose first record is over the byte limit (Python's loop sends
    it alone).  What they return is every record once, in queue order, checked, the damaged one
    alone skipped."""
    c, _ = brokers
    before = int(_runtime(c.port)["fastPulls"])
    p = Peer(c.port)
    pulls_made = c_expected = 0
    try:
        for qid in range(QUEUES):
            offset, seen = 0, []
            while True:
                resp = p.call(11, _clean_ext(qid, offset))
                pulls_made += 1
                if resp.code != 0:
                    assert resp.code == 19, (resp.code, resp.remark)     # PULL_NOT_FOUND at the end
                    break
                damaged_here = qid == DAMAGED[0] and offset <= DAMAGED[1] < int(resp.ext_fields["nextBeginOffset"])
                first_too_big = offset % BIG_EVERY == BIG_EVERY - 1      # over BYTES_MAX: Python's loop takes it
                c_expected += 0 if damaged_here or first_too_big else 1
                body, at = resp.body, 0
                while at < len(body):
                    rec = parse_record(body, at, check_crc=True)
                    assert rec.topic == TOPIC and rec.queue_id == qid
                    seen.append(rec.queue_offset)
                    at += rec.total_size
                offset = int(resp.ext_fields["nextBeginOffset"])
            expected = [i for i in range(PER_QUEUE) if (qid, i) != DAMAGED]
            assert seen == expected, (qid, seen)
    finally:
        p.close()
    answered = int(_runtime(c.port)["fastPulls"]) - before
    assert answered == c_expected, (answered, c_expected, pulls_made)


def test_sql92_pulls_are_answered_in_c_once_their_verdicts_are_published(brokers):
    """An SQL92 pull is C's once Python published its filter (the pull's first time on the fast
    path) and the verdicts its records need (a pull C hands back for a missing one): of three
    identical pulls the third at least is C's, and each answer equals the Python broker's."""
    c, py = brokers
    fs = [dict(header={**_clean_ext(qid, 0), "expressionType": "SQL92", "subscription": text}, code=11,
               serialize_type=0, language="JAVA", version=409, oneway=False,
               json_style=dict(ints=False, ascii=False, spaces=False))
          for text in SQL_CLEAN for qid in (0, 2)]
    before = int(_runtime(c.port)["fastPulls"])
    for f in fs:
        got_c = exchange(c.port, [f] * 3, [1, 2, 3])
        got_py = exchange(py.port, [f] * 3, [1, 2, 3])
        assert got_c == got_py, f["header"]
        assert all(decode_frame_payload(a[4:]).code == 0 for a in got_c), f["header"]
    answered = int(_runtime(c.port)["fastPulls"]) - before
    assert len(fs) <= answered <= 3 * len(fs), (answered, len(fs))


def test_pulls_relying_on_the_heartbeat_subscription_are_answered_in_c(brokers):
    """A pull without sysFlag bit 4 (Java's push consumer by default) filters by its group's
    heartbeat subscription: C takes it once Python published that subscription (the worker's
    cached copy, while fresh), tags and SQL92 alike, and answers as Python does."""
    c, py = brokers
    fs = [dict(header={**_clean_ext(qid, 0, group=group), "sysFlag": "0", "subscription": "TagC",
                       "expressionType": "TAG"},     # not read: the heartbeat's filter is the pull's
               serialize_type=1, code=11, language="JAVA", version=409, oneway=False,
               json_style=dict(ints=False, ascii=True, spaces=False))
          for group in HEARTBEAT_SUBS for qid in (1, 3)]
    before = int(_runtime(c.port)["fastPulls"])
    for f in fs:
        got_c = exchange(c.port, [f] * 4, [1, 2, 3, 4])
        got_py = exchange(py.port, [f] * 4, [1, 2, 3, 4])
        assert got_c == got_py, f["header"]
        assert all(decode_frame_payload(a[4:]).code == 0 for a in got_c), f["header"]
    answered = int(_runtime(c.port)["fastPulls"]) - before
    assert len(fs) <= answered <= 4 * len(fs), (answered, len(fs))


def _tags_pulled(port: int, f: dict) -> set:
    frame = exchange(port, [f], [1])[0]
    resp = decode_frame_payload(frame[4:])
    assert resp.code == 0, (resp.code, resp.remark)
    tags, at = set(), 0
    while at < len(resp.body):
        rec = parse_record(resp.body, at)
        tags.add(dict(kv.split(b"\x01", 1) for kv in rec.properties.split(b"\x02") if kv).get(b"TAGS"))
        at += rec.total_size
    return tags


def test_a_changed_heartbeat_subscription_reaches_c_within_the_cache_time(brokers):
    """C takes a heartbeat subscription only while the worker's copy of it is fresh
    (SUBSCRIPTION_CACHE_S, 1 s): a consumer that changes its filter from TagA to TagB gets TagB's
    records within that time on the C path as on Python's, and C takes the new filter's pulls."""
    c, _ = brokers
    f = dict(header={**_clean_ext(0, 0, group="SubCG"), "sysFlag": "0"}, serialize_type=0, code=11, language="JAVA",
             version=409, oneway=False, json_style=dict(ints=False, ascii=True, spaces=False))
    hb = Peer(c.port)
    try:
        _register(hb, {"SubCG": ("TAG", "TagA")}, 1, "sub-client@1")
        before = int(_runtime(c.port)["fastPulls"])
        assert all(_tags_pulled(c.port, f) == {b"TagA"} for _ in range(4))
        middle = int(_runtime(c.port)["fastPulls"])
        assert middle > before, "C took none of the pulls with the TagA subscription"
        _register(hb, {"SubCG": ("TAG", "TagB")}, 2, "sub-client@1")
        changed = time.monotonic()
        while (tags := _tags_pulled(c.port, f)) != {b"TagB"}:
            assert tags == {b"TagA"}, tags
            assert time.monotonic() - changed < 3.0, "the changed subscription did not reach the pulls"
            time.sleep(0.02)
        assert all(_tags_pulled(c.port, f) == {b"TagB"} for _ in range(4))
        assert int(_runtime(c.port)["fastPulls"]) > middle, "C took none of the pulls with the TagB subscription"
    finally:
        hb.close()


def test_offset_queries_of_existing_queues_are_answered_in_c(brokers):
    """GET_MAX_OFFSET and GET_MIN_OFFSET of every queue of the topic, in both serialize types:
    C answers each (fastOffsetQueries), with the bytes Python gives, and the values are the
    queue's bounds."""
    c, py = brokers
    fs = [dict(header={"topic": TOPIC, "queueId": str(qid)}, code=code, serialize_type=ser, language="CPP",
               version=409, oneway=False, json_style=dict(ints=False, ascii=True, spaces=False))
          for qid in range(QUEUES) for code in (30, 31) for ser in (0, 1)]
    before = int(_runtime(c.port)["fastOffsetQueries"])
    opaques = list(range(1, len(fs) + 1))
    got_c, got_py = exchange(c.port, fs, opaques), exchange(py.port, fs, opaques)
    assert got_c == got_py
    assert int(_runtime(c.port)["fastOffsetQueries"]) - before == len(fs)
    for f, frame in zip(fs, got_c):
        resp = decode_frame_payload(frame[4:])
        assert resp.code == 0 and resp.remark is None
        assert int(resp.ext_fields["offset"]) == (PER_QUEUE if f["code"] == 30 else 0), (f, resp.ext_fields)


def test_many_pulls_in_one_read_are_all_answered(brokers):
    """A read of 64 pipelined pulls: C answers them one after another within the read, and each
    answer equals the Python broker's to the same pull."""
    c, py = brokers
    fs = [dict(header=_clean_ext(i % QUEUES, (i * 3) % PER_QUEUE, str(1 + i % 7)), serialize_type=i % 2, code=11,
               language="JAVA", version=409, oneway=False, json_style=dict(ints=False, ascii=True, spaces=False))
          for i in range(64)]
    answers = {}
    for name, port in (("c", c.port), ("py", py.port)):
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        try:
            sock.sendall(b"".join(frame_bytes(f, 1000 + i) for i, f in enumerate(fs)))
            got = {}
            for _ in fs:
                head = _exactly(sock, 4)
                frame = head + _exactly(sock, frame_payload_size(head))
                got[decode_frame_payload(frame[4:]).opaque] = frame
            answers[name] = got
        finally:
            sock.close()
    assert answers["c"] == answers["py"]


def test_pulls_that_pause_their_connection_leave_the_rest_of_the_read_in_order(brokers):
    """One write of [GET_MAX_OFFSET, SEND A, 2,000 pulls, SEND B] from a client that reads nothing
    until it has written it all: the pulls' answers (~16 MB) pass what the kernel holds, so the
    connection pauses (its unsent caps) while C answers pulls; once the client reads, every pull is
    answered whole, and A is stored before B.  (Whether the pause falls inside the read that holds
    B is the kernel's: the walk's check after each taker call is argued in mq.remoting.server.)"""
    c, _ = brokers
    send = {"a": "DiffPG", "b": WRITE_ONLY, "c": "TBW102", "d": "4", "e": "0", "f": "0", "g": "0", "h": "0", "i": "",
            "j": "0", "k": "false", "m": "false"}
    warm = Peer(c.port)                  # the worker caches the topic first (a send to a topic it has
    try:                                 # not read yet awaits its config: its place would be the await's)
        assert warm.call(310, send, b"warm").code == 0
    finally:
        warm.close()
    # first a frame C hands back (GET_MAX_OFFSET): the taker then runs again inside Python's walk
    frames = [(3, 30, {"topic": TOPIC, "queueId": "0"}, b""), (1, 310, send, b"A" * 100)]
    frames += [(10 + i, 11, _clean_ext(i % QUEUES, 0, "8"), b"") for i in range(2000)]
    frames.append((2, 310, send, b"B" * 100))
    data = b"".join(encode_frame(RemotingCommand(code=code, opaque=opaque, version=409, ext_fields=ext, body=body))
                    for opaque, code, ext, body in frames)
    sock = socket.create_connection(("127.0.0.1", c.port), timeout=30)
    try:
        sock.sendall(data)
        got = {}
        for _ in frames:
            head = _exactly(sock, 4)
            cmd = decode_frame_payload(_exactly(sock, frame_payload_size(head)))
            got[cmd.opaque] = cmd
    finally:
        sock.close()
    assert all(got[10 + i].code == 0 and got[10 + i].body for i in range(2000))
    assert got[3].code == 0 and got[1].code == 0 and got[2].code == 0, (got[1].remark, got[2].remark)
    assert int(got[1].ext_fields["queueOffset"]) < int(got[2].ext_fields["queueOffset"])
