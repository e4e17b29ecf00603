"""Tests for the load generator (perf/mqperf.py, installed as mq.perf.mqperf and the `mqperf` script).

Runs go against a real name server and broker (mq/cluster.py) on loopback, through both the
CLI (a subprocess of the installed `mqperf`) and the Python API (run(Options) -> Summary).  What a run
claims is checked against the broker (GET_MAX_OFFSET per queue) and against the trace records, read
back through mq.trace.read_records and checked against mq.trace.FIELDS.  The wire fast paths are
proven equal to the mq.wire declarations.  Each test's docstring says what it proves."""
from __future__ import annotations

import asyncio
import json
import math
import os
import random
import subprocess
import sys
from collections import Counter, defaultdict

import pytest

from mq.cluster import Broker, NameServer, wait_dispatched, wait_for
from mq.remoting import RemotingClient
from mq.wire.codes import RequestCode as R, ResponseCode as RC
from mq.trace import FIELDS, read_records
from mq.wire.batch import parse_batch
from mq.wire.commitlog import build_record, iter_records, parse_record
from mq.wire.remoting import RemotingCommand, decode_frame_payload, encode_frame
from perf import mqperf
from perf.mqperf import (STAMP, STAMP_MAGIC, BatchBody, Histogram, Options, SendTemplate, make_body,
                         parse_response, scan_records, split_count)

MQPERF = os.path.join(os.path.dirname(sys.executable), "mqperf")
TYPES = {"str": str, "int": int, "float": (int, float)}
PRODUCE_FIELDS = {"kind", "run", "mode", "client", "broker", "topic", "queue", "queue_offset", "size_bytes",
                  "batch", "status", "send_us", "ack_us"}
CONSUME_FIELDS = {"kind", "run", "mode", "client", "broker", "topic", "queue", "queue_offset", "size_bytes",
                  "batch", "status", "send_us", "store_ts_ms", "consume_us"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A name server and one broker (broker-a, 4 default queues per new topic)."""
    d = str(tmp_path_factory.mktemp("mqperf"))
    ns = NameServer(d)
    broker = Broker(d, ns.addr, name="broker-a")
    yield ns, broker
    broker.stop()
    ns.stop()


def max_offsets(broker_addr: str, topic: str, queues: int) -> list[int]:
    async def ask():
        c = RemotingClient()
        try:
            out = []
            for q in range(queues):
                r = await c.invoke(broker_addr, c.request(R.GET_MAX_OFFSET, {"topic": topic, "queueId": q}), 5)
                assert r.code == RC.SUCCESS, (r.code, r.remark)
                out.append(int(r.ext_fields["offset"]))
            return out
        finally:
            await c.close()
    return asyncio.run(ask())


def check_schema(records: list[dict], fields: set[str]) -> None:
    for r in records:
        assert set(r) <= set(FIELDS), set(r) - set(FIELDS)
        for k, v in r.items():
            assert isinstance(v, TYPES[FIELDS[k]]) and not isinstance(v, bool), (k, v)
        assert r["kind"] == "msg"
        assert set(r) <= fields, set(r) - fields


def run_cli(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "NAMESRV_ADDR"}
    return subprocess.run([MQPERF, *args], capture_output=True, text=True, timeout=timeout_s, env=env)


# ---------------------------------------------------------------------------------------------------
# Runs against a broker
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("batch", [1, 10])
def test_produce_cli_counts_trace_and_offsets(cluster, tmp_path, batch):
    """`mqperf produce --count 2000 --procs 2` (SEND_MESSAGE_V2 for batch 1, SEND_BATCH_MESSAGE for 10)
    exits 0 and its JSON summary counts 2000 stored messages; the trace has exactly one record per
    message, in one file per process, with the schema's fields and types; the queue offsets are unique
    and dense from 0 in every queue; a batch's records share its send/ack instants and take consecutive
    offsets; and the broker's GET_MAX_OFFSET of each queue equals what the trace says was stored there."""
    ns, broker = cluster
    topic, trace = f"PerfCli{batch}", str(tmp_path / "trace")
    p = run_cli("produce", "-n", ns.addr, "-t", topic, "--create-topic", "--count", "2000", "--procs", "2",
                "--batch", str(batch), "--in-flight", "4", "--size", "100", "--trace", trace, "--run-id", "r1",
                "--json", "--progress-interval", "0")
    assert p.returncode == 0, p.stderr
    s = json.loads(p.stdout)
    assert (s["messages"], s["errors"], s["statuses"], s["bytes"]) == (2000, 0, {"SEND_OK": 2000}, 200_000)
    assert s["latency"]["count"] == 2000 and 0 < s["latency"]["p50_us"] <= s["latency"]["p99_us"] <= \
        s["latency"]["max_us"]
    assert sorted(os.path.basename(f).rsplit("-", 1)[0] for f in s["trace_files"]) == \
        ["mqperf-produce-p0", "mqperf-produce-p1"]

    recs = list(read_records(trace))
    assert len(recs) == 2000
    check_schema(recs, PRODUCE_FIELDS)
    assert all(r["run"] == "r1" and r["mode"] == "produce" and r["topic"] == topic and r["broker"] == broker.addr
               and r["batch"] == batch and r["size_bytes"] == 100 and r["status"] == "SEND_OK"
               and 0 < r["send_us"] <= r["ack_us"] for r in recs)
    assert len({r["client"] for r in recs}) == 2
    by_queue = defaultdict(list)
    for r in recs:
        by_queue[r["queue"]].append(r["queue_offset"])
    assert set(by_queue) == {0, 1, 2, 3}
    for q, offs in by_queue.items():
        assert sorted(offs) == list(range(len(offs))), f"queue {q}: offsets not unique and dense"
    if batch > 1:
        requests = defaultdict(list)
        for r in recs:
            requests[(r["client"], r["send_us"], r["queue"])].append(r["queue_offset"])
        for offs in requests.values():
            assert len(offs) == batch and sorted(offs) == list(range(min(offs), min(offs) + batch))
    # the ConsumeQueues are built by the dispatch role a moment after the acknowledgements
    want = [len(by_queue[q]) for q in range(4)]
    wait_for(lambda: max_offsets(broker.addr, topic, 4) == want, 10, 0.05, "every send dispatched")


def test_consume_reads_everything_once(cluster, tmp_path):
    """A backlog produced with the API (batches of 5) is drained by `consume` (2 processes) exactly
    once: every (queue, offset) the producers stored appears in one consumer record, nothing else
    does; each consumer record carries the producer's send_us from the body stamp, the broker's
    store timestamp and a consume_us after both.  --count 300 then reads exactly 300 messages."""
    ns, broker = cluster
    topic, ptrace, ctrace = "PerfConsume", str(tmp_path / "p"), str(tmp_path / "c")
    sp = mqperf.run(Options(mode="produce", namesrv=ns.addr, topic=topic, create_topic=True, count=1000, batch=5,
                            in_flight=2, size_bytes=64, trace_dir=ptrace, progress_interval_s=0), progress=None)
    assert (sp.messages, sp.errors) == (1000, 0)
    wait_dispatched(broker.addr)      # `consume` reads to the end it finds when it starts
    sc = mqperf.run(Options(mode="consume", namesrv=ns.addr, topic=topic, procs=2, trace_dir=ctrace,
                            progress_interval_s=0), progress=None)
    assert (sc.messages, sc.bytes, sc.errors) == (1000, 64_000, 0), sc
    assert "UNEXPECTED_OFFSET" not in sc.statuses and sc.statuses["FOUND"] == sc.latency.count
    produced = {(r["queue"], r["queue_offset"]): r for r in read_records(ptrace)}
    consumed = list(read_records(ctrace))
    check_schema(consumed, CONSUME_FIELDS)
    keys = Counter((r["queue"], r["queue_offset"]) for r in consumed)
    assert set(keys) == set(produced) and set(keys.values()) == {1}
    for r in consumed:
        p = produced[(r["queue"], r["queue_offset"])]
        assert r["mode"] == "consume" and r["status"] == "FOUND" and r["size_bytes"] == 64
        assert r["send_us"] == p["send_us"]
        assert p["send_us"] // 1000 - 1 <= r["store_ts_ms"] <= p["ack_us"] // 1000 + 1
        assert r["consume_us"] >= p["ack_us"]

    part = mqperf.run(Options(mode="consume", namesrv=ns.addr, topic=topic, count=300, progress_interval_s=0),
                      progress=None)
    assert (part.messages, part.errors) == (300, 0)


def test_e2e_latency_from_the_body_stamp(cluster, tmp_path):
    """e2e with one producer and one consumer process: every message the producer stored is consumed
    once (missing 0), and for each the consumer's record has consume_us >= the producer's send_us (taken
    from the body stamp, equal to the producer record's) and >= the store timestamp; the summary's
    latency counts one send->consume sample per message."""
    ns, broker = cluster
    topic, trace = "PerfE2E", str(tmp_path / "t")
    s = mqperf.run(Options(mode="e2e", namesrv=ns.addr, topic=topic, create_topic=True, count=2000, in_flight=8,
                           size_bytes=32, trace_dir=trace, progress_interval_s=0.5), progress=None)
    assert (s.produced, s.messages, s.missing, s.errors) == (2000, 2000, 0, 0), s
    assert s.latency.count == 2000 and s.send_latency.count == 2000 and s.statuses == {"SEND_OK": 2000}
    recs = list(read_records(trace))
    prod = {(r["queue"], r["queue_offset"]): r for r in recs if "ack_us" in r}
    cons = [r for r in recs if "consume_us" in r]
    assert len(prod) == 2000 and len(cons) == 2000 and all(r["mode"] == "e2e" for r in recs)
    for r in cons:
        p = prod.pop((r["queue"], r["queue_offset"]))
        assert r["send_us"] == p["send_us"] and r["consume_us"] >= r["send_us"]
        assert r["consume_us"] // 1000 >= r["store_ts_ms"] - 1
    assert not prod


def test_cli_broker_duration_and_progress(cluster):
    """--broker HOST:PORT skips the name server; --duration 1.5 with --progress-interval 0.5 prints a
    progress line per interval on stderr and a text summary on stdout; the stored count agrees with
    the broker's max offsets."""
    ns, broker = cluster
    topic = "PerfDirect"
    p = run_cli("produce", "--broker", broker.addr, "-t", topic, "--create-topic", "--queues", "2",
                "--duration", "1.5", "--in-flight", "16", "--progress-interval", "0.5")
    assert p.returncode == 0, p.stderr
    progress = [line for line in p.stderr.splitlines() if line.startswith("mqperf produce ")]
    assert len(progress) >= 2, p.stderr
    assert "msgs/s" in progress[0] and "p99" in progress[0]
    stored = int(next(line for line in p.stdout.splitlines() if "messages" in line).split()[1].replace(",", ""))
    assert "errors 0" in p.stdout and "SEND_OK" in p.stdout
    wait_dispatched(broker.addr)
    assert stored > 0 and sum(max_offsets(broker.addr, topic, 2)) == stored


def test_cli_errors(cluster):
    """Bad arguments exit 2 with one line on stderr and no traceback; a run that cannot be done (no
    such topic without --create-topic) exits 1 with one line."""
    ns, _ = cluster
    bad = [
        ["produce"],                                                       # neither -n nor --broker
        ["produce", "-n", ns.addr, "--batch", "0"],
        ["produce", "-n", ns.addr, "--count", "5", "--duration", "2"],
        ["produce", "-n", ns.addr, "--size", "abc"],
        ["e2e", "-n", ns.addr, "--size", "8"],
        ["fly", "-n", ns.addr],
        ["produce", "-n", "nohostport"],
        ["produce", "-n", ns.addr, "-t", "bad topic"],
    ]
    for args in bad:
        p = run_cli(*args)
        assert p.returncode == 2, (args, p.returncode, p.stderr)
        assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr, (args, p.stderr)
    p = run_cli("produce", "-n", ns.addr, "-t", "NoSuchTopic", "--count", "1")
    assert p.returncode == 1 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "NoSuchTopic" in p.stderr and "Traceback" not in p.stderr


# ---------------------------------------------------------------------------------------------------
# Fast paths equal to mq.wire; histogram; count split
# ---------------------------------------------------------------------------------------------------
def test_send_template_equals_wire_encoding():
    """SendTemplate's frames decode through mq.wire to the SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE
    request a client would build: code, opaque, every header field, the body; and BatchBody's
    body parses with mq.wire.batch into n stamped messages of the right size."""
    body = make_body(40, b"x" * 40, 1_795_000_000_123_456, 3)
    for batch in (False, True):
        frame = SendTemplate("TopicX", 8, batch).frame(77, 5, 1_795_000_000_123, body)
        cmd = decode_frame_payload(memoryview(frame)[4:])
        assert (cmd.code, cmd.opaque, cmd.flag, cmd.body) == (320 if batch else 310, 77, 0, body)
        want = {"a": "mqperf_producer", "b": "TopicX", "c": "TBW102", "d": "8", "e": "5", "f": "0",
                "g": "1795000000123", "h": "0", "i": "WAIT\x01true", **({"m": "true"} if batch else {})}
        assert cmd.ext_fields == want
    assert STAMP.unpack_from(body) == (STAMP_MAGIC, 1_795_000_000_123_456, 3) and len(body) == 40
    assert make_body(10, b"y" * 10, 5, 0) == b"y" * 10
    bb = BatchBody(7, 40, b"z" * 40, 2)
    items = parse_batch(bb.stamp(42))
    assert len(items) == 7
    assert all(len(i.body) == 40 and STAMP.unpack_from(i.body) == (STAMP_MAGIC, 42, 2) for i in items)


def test_parse_response_equals_wire_decoding():
    """parse_response reads binary (ROCKETMQ) and JSON headers as mq.wire.remoting does: code, opaque,
    flag, remark, ext fields and body."""
    for st in (0, 1):
        for remark, ext, body in ((None, {"queueOffset": "12", "msgId": "AB", "k\u00e9": "v\u00e9"}, b""),
                                  ("broker busy", None, b"\x00\x01body")):
            cmd = RemotingCommand(code=2, opaque=99, flag=1, remark=remark, ext_fields=ext, body=body,
                                  serialize_type=st)
            payload = encode_frame(cmd)[4:]
            ref = decode_frame_payload(payload)
            assert parse_response(payload) == (ref.code, ref.opaque, ref.flag, ref.remark, ref.ext_fields or {},
                                               ref.body)


def test_scan_records_equals_parse_record():
    """scan_records gives each record's queue id, queue offset, store timestamp, body size and stamped
    send_us as mq.wire.commitlog.parse_record does, for IPv4 and IPv6 hosts, stamped and plain bodies."""
    rng = random.Random(7)
    blobs = []
    for i in range(40):
        size = rng.choice([0, 5, 16, 100, 1024])
        body = make_body(size, bytes(rng.randrange(256) for _ in range(size)), 1_795_000_000_000_000 + i, i)
        v6 = i % 5 == 0
        blobs.append(build_record(body=body, topic="T", properties={"TAGS": "a"}, queue_id=i % 3, queue_offset=i,
                                  store_timestamp_ms=1_795_000_000_000 + i, born_host="::1" if v6 else "10.0.0.1",
                                  store_host="fe80::2" if i % 10 == 0 else "10.0.0.2"))
    buf = b"".join(blobs)
    want = []
    for rec in iter_records(buf):
        sent = 0
        if len(rec.body) >= 16 and rec.body[:4] == STAMP_MAGIC:
            sent = STAMP.unpack_from(rec.body)[1]
        want.append((rec.queue_id, rec.queue_offset, rec.store_timestamp_ms, len(rec.body), sent))
    assert scan_records(buf) == want
    assert sum(1 for w in want if w[4]) == sum(1 for b in blobs if len(parse_record(b).body) >= 16)


def test_histogram_percentiles_within_bucket_precision():
    """Histogram percentiles stay within 1/64 of the exact order statistic (weights included), the max
    is exact, and merging two histograms equals adding everything to one."""
    rng = random.Random(3)
    values = [int(rng.lognormvariate(7, 1.5)) for _ in range(20000)] + [0, 1, 127, 128, 10**9]
    a, b, both = Histogram(), Histogram(), Histogram()
    for i, v in enumerate(values):
        (a if i % 2 else b).add(v, 1 + i % 3)
        both.add(v, 1 + i % 3)
    a.merge(b.state())
    assert a.state() == both.state()
    expanded = sorted(v for i, v in enumerate(values) for _ in range(1 + i % 3))
    for q in (0.5, 0.9, 0.99, 0.999):
        exact = expanded[max(1, math.ceil(q * len(expanded))) - 1]
        assert abs(both.percentile(q) - exact) <= exact / 64 + 1, (q, both.percentile(q), exact)
    assert both.max == 10**9 and both.percentile(1.0) == 10**9


def test_split_count():
    """split_count spreads n over queues within the backlog when it suffices (never more than a queue
    has, as even as possible), and evenly otherwise; the total is always n."""
    assert split_count(10, [100, 100, 100, 100]) == [2, 2, 3, 3]
    assert split_count(10, [0, 2, 100, 100]) == [0, 2, 4, 4]
    assert split_count(10, [1, 1, 1, 1]) == [3, 3, 2, 2]
    rng = random.Random(5)
    for _ in range(200):
        avail = [rng.randrange(50) for _ in range(rng.randrange(1, 9))]
        n = rng.randrange(1, 120)
        got = split_count(n, avail)
        assert sum(got) == n
        if sum(avail) >= n:
            assert all(0 <= g <= a for g, a in zip(got, avail))
