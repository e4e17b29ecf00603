"""The broker's own perf trace (perfTraceEnable; mq.broker.tracing, schema in mq.trace):
real name server and brokers, real sends over TCP, then the trace files read back with
mq.trace.read_records."""
import asyncio
import json
import os

from mq.broker.tracing import FLUSH_EVERY, REQ_ROW, OffloadedRowWriter, RowTraceWriter
from mq.remoting import RemotingClient
from mq.trace import FIELDS, REQ_PHASES, TraceWriter, read_records
from mq.wire.batch import build_batch
from mq.cluster import Broker, NameServer, wait_for
from mq.wire.headers import send_v2

SEND_V2, SEND_BATCH, PULL, RUNTIME_INFO, MAX_OFFSET = 310, 320, 11, 28, 30
PHASES = [p for p in REQ_PHASES if p != "total_us"]
ROUNDING_US = 1e-6    # phases are whole nanoseconds, written as thousandths of a microsecond
SINGLE_SENDS, PIPELINED_SENDS, BATCH_MSGS = 120, 64, 10
IN_QUEUE_0 = SINGLE_SENDS // 4 + PIPELINED_SENDS // 4     # sends go round-robin over 4 queues; the batch to 1


def _header(topic: str, qid: int, batch: bool = False) -> dict:
    h = send_v2(producerGroup="TraceProducer", topic=topic, defaultTopic="TBW102", defaultTopicQueueNums=4,
                queueId=qid, sysFlag=0, bornTimestamp=0, flag=0, properties="" if batch else "TAGS\x01T")
    if batch:
        h.update(send_v2(batch="true"))
    return h


async def _produce(addr: str, topic: str) -> list:
    """SINGLE_SENDS one at a time, PIPELINED_SENDS at once, one batch of BATCH_MSGS; then a pull of
    queue 0 from offset 0.  Returns every response (sends first, the pull last)."""
    c = RemotingClient()
    try:
        out = [await c.invoke(addr, c.request(SEND_V2, _header(topic, i % 4), b"single-%d" % i), 10)
               for i in range(SINGLE_SENDS)]
        out += await asyncio.gather(*(c.invoke(addr, c.request(SEND_V2, _header(topic, i % 4), b"piped-%d" % i), 10)
                                      for i in range(PIPELINED_SENDS)))
        batch = build_batch([(0, b"batched-%d" % i, b"TAGS\x01T") for i in range(BATCH_MSGS)])
        out.append(await c.invoke(addr, c.request(SEND_BATCH, _header(topic, 1, batch=True), batch), 10))
        return out
    finally:
        await c.close()


async def _call(addr: str, code: int, ext: dict | None = None, body: bytes = b""):
    c = RemotingClient()
    try:
        return await c.invoke(addr, c.request(code, ext, body), 10)
    finally:
        await c.close()


def _pull(addr: str, topic: str, qid: int, max_msgs: int):
    return asyncio.run(_call(addr, PULL, {"consumerGroup": "TraceGroup", "topic": topic, "queueId": qid,
                                          "queueOffset": 0, "maxMsgNums": max_msgs, "sysFlag": 4,
                                          "commitOffset": 0, "subscription": "*", "subVersion": 0,
                                          "suspendTimeoutMillis": 0}))


def _commitlog_end(addr: str) -> int:
    return int(json.loads(asyncio.run(_call(addr, RUNTIME_INFO)).body)["table"]["commitLogMaxOffset"])


def _check_req_phases(r: dict) -> None:
    for k in REQ_PHASES:
        assert r[k] >= 0, r
    assert sum(r[k] for k in PHASES) <= r["total_us"] + ROUNDING_US, r


def test_row_writer_lines_read_like_trace_writer_records(tmp_path):
    """The io worker's fast path (rows formatted in C from a template) writes lines that read back exactly as
    the dicts TraceWriter.write would write (durations given in ns read as microseconds), with
    every value of FIELDS's type."""
    fast_row = (1_700_000_000_123_456, 310, 1, 1024, 0, 12345, 5500, 0, 250, 7125, 40001)   # float fields in ns
    row = (1_700_000_000_123_456, 310, 1, 1024, "0", 12.345, 5.5, 0.0, 0.25, 7.125, 40.001)
    fast = RowTraceWriter(str(tmp_path / "fast"), "req-io-0", "req", {"broker": "127.0.0.1:1", "role": "io-0"},
                          REQ_ROW)
    fast.add(fast_row)
    fast.close()
    slow = TraceWriter(str(tmp_path / "slow"), "req-io-0")
    slow.write({"kind": "req", "broker": "127.0.0.1:1", "role": "io-0", **dict(zip(REQ_ROW, row))})
    slow.close()
    (a,), (b,) = list(read_records(str(tmp_path / "fast"))), list(read_records(str(tmp_path / "slow")))
    assert a == b and list(a) == list(b), (a, b)
    types = {"int": int, "float": float, "str": str}
    assert all(type(v) is types[FIELDS[k]] for k, v in a.items()), a


def test_tracing_is_off_by_default_and_writes_nothing(tmp_path):
    """A broker started without perfTraceEnable serves sends and leaves no perftrace directory
    and no trace file anywhere under its store."""
    ns = NameServer(str(tmp_path))
    broker = Broker(str(tmp_path), ns.addr)
    try:
        assert all(r.code == 0 for r in asyncio.run(_produce(broker.addr, "Untraced")))
    finally:
        assert broker.stop() == 0
        ns.stop()
    assert not os.path.exists(os.path.join(broker.dir, "perftrace"))
    assert not [f for _, _, files in os.walk(broker.dir) for f in files if f.endswith(".jsonl")]


def test_requests_and_flushes_are_traced(tmp_path):
    """SYNC_FLUSH broker with perfTraceEnable and 2 io workers: after single, pipelined and
    batched sends and a pull, and a clean stop, the trace holds one req record per send request
    (right code, msgs, size and status; every phase >= 0 and the phases summing to at most
    total_us; the append and the flush wait measured), one for the pull with the messages it
    returned, and flush records whose group_msgs add up to every message stored and whose
    group_bytes add up to the CommitLog's end.  A perfTraceDir outside the store is honoured."""
    ns = NameServer(str(tmp_path))
    trace_dir = str(tmp_path / "trace")
    broker = Broker(str(tmp_path), ns.addr, flushDiskType="SYNC_FLUSH", perfTraceEnable="true",
                    perfTraceDir=trace_dir, sendMessageThreadPoolNums=2)
    topic = "Traced"
    try:
        sends = asyncio.run(_produce(broker.addr, topic))
        assert all(r.code == 0 for r in sends), [(r.code, r.remark) for r in sends if r.code]
        wait_for(lambda: int(asyncio.run(_call(broker.addr, MAX_OFFSET, {"topic": topic, "queueId": 0}))
                             .ext_fields["offset"]) == IN_QUEUE_0, 20, 0.05, "queue 0 dispatched")
        pull = _pull(broker.addr, topic, 0, 32)
        assert pull.code == 0 and pull.body
        end = _commitlog_end(broker.addr)
    finally:
        assert broker.stop() == 0, broker.proc.output()[-3000:]
        ns.stop()
    stored = SINGLE_SENDS + PIPELINED_SENDS + BATCH_MSGS
    records = list(read_records(trace_dir))
    assert records and all(r["broker"] == broker.addr for r in records)

    req = [r for r in records if r["kind"] == "req"]
    singles = [r for r in req if r["code"] == SEND_V2]
    batches = [r for r in req if r["code"] == SEND_BATCH]
    pulls = [r for r in req if r["code"] == PULL]
    assert len(singles) == SINGLE_SENDS + PIPELINED_SENDS
    assert len(batches) == 1 and batches[0]["msgs"] == BATCH_MSGS
    assert all(r["msgs"] == 1 and r["status"] == "0" and r["size_bytes"] > 0 for r in singles)
    assert {r["role"] for r in req} <= {"io-0", "io-1"}
    for r in req:
        _check_req_phases(r)
    for r in singles + batches:
        assert r["append_us"] > 0 and r["decode_us"] > 0 and r["encode_us"] > 0, r
        assert r["repl_wait_us"] == 0, r            # ASYNC_MASTER: no replication wait
    # SYNC_FLUSH: a send waits for its msync (a send that lands right after a flush still waits
    # for the next one, so nearly all wait measurably; the median is far above zero)
    waits = sorted(r["flush_wait_us"] for r in singles)
    assert waits[len(waits) // 2] > 1.0, waits
    (p,) = pulls
    assert p["msgs"] == min(32, IN_QUEUE_0), p
    assert p["size_bytes"] == len(pull.body) and p["append_us"] == p["flush_wait_us"] == 0
    assert min(r["ts_us"] for r in req) > 1_600_000_000_000_000     # wall clock, microseconds

    flushes = [r for r in records if r["kind"] == "flush"]
    assert flushes, "SYNC_FLUSH flushes at least once"
    assert all(f["group_msgs"] >= 0 and f["group_bytes"] > 0 and f["flush_us"] >= 0 for f in flushes)
    assert sum(f["group_msgs"] for f in flushes) == stored
    assert sum(f["group_bytes"] for f in flushes) == end
    assert max(f["group_msgs"] for f in flushes) > 1, "group commit: pipelined sends share flushes"
    assert not [r for r in records if r["kind"] == "lag"], "no slave, no lag samples"


def test_async_flush_sends_taken_by_c_are_traced(tmp_path):
    """ASYNC_FLUSH: single and pipelined sends, nearly all answered by the C send path at its run
    (a worker's first send to a topic takes Python's path), each get a req record: its wall-clock time inside the run's window (C derives it per frame
    from one clock read per read), every phase >= 0 and summing to at most total_us, the answer
    written after the append (encode_us > 0: one stamp per run, after all its answers)."""
    import time
    ns = NameServer(str(tmp_path))
    trace_dir = str(tmp_path / "trace")
    broker = Broker(str(tmp_path), ns.addr, perfTraceEnable="true", perfTraceDir=trace_dir)
    topic = "TracedAsync"
    try:
        asyncio.run(_call(broker.addr, SEND_V2, _header(topic, 0), b"create the topic"))
        t0_us = time.time_ns() // 1000
        sends = asyncio.run(_produce(broker.addr, topic))
        t1_us = time.time_ns() // 1000
        assert all(r.code == 0 for r in sends), [(r.code, r.remark) for r in sends if r.code]
    finally:
        assert broker.stop() == 0, broker.proc.output()[-3000:]
        ns.stop()
    creating = len(b"create the topic")
    singles = [r for r in read_records(trace_dir)
               if r["kind"] == "req" and r["code"] == SEND_V2 and r["size_bytes"] != creating]
    assert len(singles) == SINGLE_SENDS + PIPELINED_SENDS
    for r in singles:
        _check_req_phases(r)
        assert r["append_us"] > 0 and r["decode_us"] > 0 and r["encode_us"] > 0, r
        assert r["repl_wait_us"] == 0, r
        assert t0_us - 1000 <= r["ts_us"] <= t1_us + 1000, (t0_us, r, t1_us)


def test_sync_master_traces_replication_wait_and_lag(tmp_path):
    """SYNC_MASTER with perfTraceEnable and a slave: send requests answered SEND_OK carry a
    replication wait, and the master's HA role writes lag samples for the slave once per
    second, whose lag_bytes = master_offset - ack_offset, until one shows the slave caught up
    with everything sent."""
    ns = NameServer(str(tmp_path))
    master = Broker(str(tmp_path), ns.addr, name="broker-t", brokerRole="SYNC_MASTER", perfTraceEnable="true",
                    haSendHeartbeatInterval=500)
    slave = Broker(str(tmp_path), ns.addr, name="broker-t", brokerRole="SLAVE", brokerId=1,
                   haSendHeartbeatInterval=500, haMasterAddress=f"127.0.0.1:{master.port + 1}")
    trace_dir = os.path.join(master.dir, "perftrace")      # the default: <storePathRootDir>/perftrace
    try:
        wait_for(lambda: asyncio.run(_call(master.addr, SEND_V2, _header("Probe", 0), b"p")).code == 0,
                 40, 0.3, "the slave connected (SYNC_MASTER answers SEND_OK)")
        sends = asyncio.run(_produce(master.addr, "Replicated"))
        assert all(r.code == 0 for r in sends), [(r.code, r.remark) for r in sends if r.code]
        end = _commitlog_end(master.addr)

        def caught_up_sample():
            return [r for r in read_records(trace_dir) if r["kind"] == "lag" and r["master_offset"] >= end
                    and r["lag_bytes"] == 0]
        wait_for(caught_up_sample, 30, 0.2, "a lag sample showing the slave caught up")
    finally:
        slave.stop()
        assert master.stop() == 0, master.proc.output()[-3000:]
        ns.stop()
    records = list(read_records(trace_dir))
    lags = [r for r in records if r["kind"] == "lag"]
    assert lags and all(r["broker"] == master.addr for r in lags)
    assert all(r["lag_bytes"] == r["master_offset"] - r["ack_offset"] >= 0 for r in lags)
    assert len({r["slave"] for r in lags}) == 1 and lags[0]["slave"].startswith("127.0.0.1:")
    assert [r["ts_us"] for r in lags] == sorted(r["ts_us"] for r in lags)
    ok = [r for r in records if r["kind"] == "req" and r["code"] in (SEND_V2, SEND_BATCH) and r["status"] == "0"]
    assert len(ok) >= SINGLE_SENDS + PIPELINED_SENDS + 1
    for r in ok:
        _check_req_phases(r)
    waits = sorted(r["repl_wait_us"] for r in ok)
    # a SEND_OK from a SYNC_MASTER waited for the slave's ack: a round trip through two processes
    assert waits[0] > 0 and waits[len(waits) // 2] > 10.0, waits
    assert not os.path.exists(os.path.join(slave.dir, "perftrace")), "the slave was not traced"


def test_row_writer_extremes(tmp_path):
    """The C row formatter writes int64's extremes, negative thousandths and an empty status
    (a negative code) so that they read back as TraceWriter's dicts would."""
    rows = [(-2**63, 2**63 - 1, 0, 0, -1, -1, 0, 999, -2**63, 2**63 - 1, 1),
            (0, -5, 7, 2**40, 200, 1, -999, 0, 0, 0, 0)]
    fast = RowTraceWriter(str(tmp_path), "req-io-9", "req", {"broker": "b", "role": "io-9"}, REQ_ROW)
    for r in rows:
        fast.add(r)
    fast.close()
    got = list(read_records(str(tmp_path)))
    assert len(got) == 2
    for rec, row in zip(got, rows):
        want = {k: (("" if v < 0 else str(v)) if FIELDS[k] == "str" else v / 1000 if FIELDS[k] == "float" else v)
                for k, v in zip(REQ_ROW, row)}
        assert {k: rec[k] for k in REQ_ROW} == want


def test_offloaded_rows_are_the_same_lines_in_the_same_file(tmp_path, caplog):
    """The io worker's rows go raw to a formatter process (OffloadedRowWriter,
    mq.broker.traceformat): rows added one at a time and rows given flat, more than a message
    holds, come out as the same bytes RowTraceWriter writes here, in order, in a file named after
    this process; close() returns once they are written and the formatter has exited.  A
    formatter that died takes no more rows: the writer says so once and drops them, and adding
    rows never raises."""
    from array import array
    import random
    from mq.store.native import ffi
    rnd = random.Random(7)
    rows = [tuple(rnd.randrange(-2**40, 2**40) for _ in REQ_ROW)
            for _ in range(3 * OffloadedRowWriter.MESSAGE_ROWS_MAX + 5)]
    flat = array("q", [v for r in rows[100:] for v in r])
    cells = ffi.from_buffer("int64_t[]", flat)
    for kind in (RowTraceWriter, OffloadedRowWriter):
        w = kind(str(tmp_path / kind.__name__), "req-io-0", "req", {"broker": "b:1", "role": "io-0"}, REQ_ROW)
        for r in rows[:100]:
            w.add(r)
        w.flush()
        w.add_flat(cells, len(rows) - 100)
        w.close()
        assert os.path.basename(w.path) == f"req-io-0-{os.getpid()}.jsonl"
    with open(os.path.join(tmp_path, "RowTraceWriter", f"req-io-0-{os.getpid()}.jsonl"), "rb") as f:
        here = f.read()
    with open(os.path.join(tmp_path, "OffloadedRowWriter", f"req-io-0-{os.getpid()}.jsonl"), "rb") as f:
        there = f.read()
    assert here.count(b"\n") == len(rows) and there == here

    w = OffloadedRowWriter(str(tmp_path / "dead"), "req-io-1", "req", {"broker": "b:1", "role": "io-1"}, REQ_ROW)
    w.child.kill()
    w.child.wait()
    for r in rows[:3 * FLUSH_EVERY]:
        w.add(r)                                     # (flushes every FLUSH_EVERY rows)
    w.add_flat(cells, 10)
    w.close()
    assert w.failed
    assert sum("took no rows" in r.getMessage() for r in caplog.records) == 1
