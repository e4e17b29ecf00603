"""The workloads shared by the broker gates (perf/test_broker_bench.py, test_ha_bench.py,
test_trace_overhead.py) and the side-by-side peers run (perf/peers.py, `mqpeers`), so that the
gates and the peers table measure exactly the same thing.  No pytest here, and no optional
package at import time: the installed `mqpeers` imports this module too.

  ours    requests to our broker over the project's asyncio RemotingClient, speaking the wire
          protocol directly (no client library on top): topic creation, single sends one at a
          time or in flight, SEND_BATCH_MESSAGE of 100, PULL_MESSAGE round-robin or one in
          flight per queue, and spawned client processes (batched producers balanced over io
          workers; 64 single-send producers).
  Redis   XADD one at a time, pipelines of XADDs, XREAD over a backlog (a redis-py client the
          caller passes in: redis-py is imported by whoever makes that client), and
          redis-benchmark against a running peers.RedisServer.
  results Result (one round) and Series (the rounds of one side of a comparison).

Bodies are 1 KiB: BODY (random bytes) for our broker's requests, PRINTABLE_BODY for the peers
(printable, so that the same bytes can be passed to redis-benchmark on its command line) and
for the mq.client library side of `mqpeers`."""
from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import os
import random
import statistics
import string
import struct
import subprocess
import time
import traceback
from dataclasses import dataclass, field

from mq import loop as mq_loop
from mq.remoting import RemotingClient
from mq.wire.codes import RequestCode as R, ResponseCode as RC
from mq.wire.batch import BatchItem, build_batch
from mq.wire.headers import send_v2
from mq.wire.topics import AUTO_CREATE_TOPIC

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB


# ---- what is sent ---------------------------------------------------------------------------------
COMMITLOG_FILE_SIZE = 256 * MIB
MSG_BODY_SIZE = 1 * KIB
QUEUES = 4                        # the topic's queues (d = defaultTopicQueueNums); sends spread over them
BATCH_MSGS = 100                  # messages per SEND_BATCH_MESSAGE
PIPELINE_IN_FLIGHT = 100          # concurrent single sends on one connection (gate 2a)
BATCH_IN_FLIGHT = 4               # concurrent batches on one connection (gate 2b)
PULL_MAX_MSGS = 32                # maxMsgNums per PULL_MESSAGE (the broker's in-memory cap is 32 too)
SEND_PROPERTIES = "TAGS\x01TagA\x02WAIT\x01true"
BATCH_ITEM_PROPERTIES = b"TAGS\x01TagA"
TIMEOUT_S = 10.0

# request and response codes, from the one table
PULL_MESSAGE = R.PULL_MESSAGE
GET_BROKER_RUNTIME_INFO = R.GET_BROKER_RUNTIME_INFO
GET_MAX_OFFSET = R.GET_MAX_OFFSET
SEND_MESSAGE_V2 = R.SEND_MESSAGE_V2
SEND_BATCH_MESSAGE = R.SEND_BATCH_MESSAGE
SUCCESS = RC.SUCCESS

BODY = os.urandom(MSG_BODY_SIZE)
# Printable, so that the same bytes can be passed to redis-benchmark on its command line.
PRINTABLE_BODY_TEXT = "".join(random.Random(1).choices(string.ascii_letters + string.digits, k=MSG_BODY_SIZE))
PRINTABLE_BODY = PRINTABLE_BODY_TEXT.encode()
PIPELINE_DEPTH = 100              # XADDs per redis-py pipeline; nats-py publishes in flight
XREAD_COUNT = 1000                # entries per XREAD; messages per JetStream pull fetch
BENCHMARK_CONNECTIONS = 50        # redis-benchmark -c


# =================================================================================================
# ours: requests to a broker
# =================================================================================================


def send_header(topic: str, queue_id: int, batch: bool = False) -> dict:
    return send_v2(producerGroup="PerfProducer", topic=topic, defaultTopic=AUTO_CREATE_TOPIC,
                   defaultTopicQueueNums=QUEUES, queueId=queue_id, sysFlag=0, bornTimestamp=int(time.time() * 1000), flag=0,
                   properties="" if batch else SEND_PROPERTIES, **({"batch": "true"} if batch else {}))


def one_kib_batch() -> bytes:
    return build_batch([BatchItem(0, BODY, BATCH_ITEM_PROPERTIES)] * BATCH_MSGS)


async def send_one(c: RemotingClient, addr: str, topic: str, queue_id: int):
    r = await c.invoke(addr, c.request(SEND_MESSAGE_V2, send_header(topic, queue_id), BODY), TIMEOUT_S)
    if r.code != SUCCESS:
        raise AssertionError(f"send failed: {r.code} {r.remark}")
    return r


async def send_batch(c: RemotingClient, addr: str, topic: str, queue_id: int, body: bytes):
    r = await c.invoke(addr, c.request(SEND_BATCH_MESSAGE, send_header(topic, queue_id, batch=True), body),
                       TIMEOUT_S)
    if r.code != SUCCESS:
        raise AssertionError(f"batch send failed: {r.code} {r.remark}")
    return r


async def max_offset(c: RemotingClient, addr: str, topic: str, queue_id: int) -> int | None:
    r = await c.invoke(addr, c.request(GET_MAX_OFFSET, {"topic": topic, "queueId": queue_id}), TIMEOUT_S)
    return int(r.ext_fields["offset"]) if r.code == SUCCESS else None


async def create_topic(c: RemotingClient, addr: str, topic: str) -> None:
    """One send auto-creates the topic (from TBW102, QUEUES queues); then wait until every
    queue answers GET_MAX_OFFSET and the first message is dispatched."""
    await send_one(c, addr, topic, 0)
    deadline = time.monotonic() + 30
    while True:
        offs = [await max_offset(c, addr, topic, q) for q in range(QUEUES)]
        if None not in offs and offs[0] >= 1:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"topic {topic} not ready: max offsets {offs}")
        await asyncio.sleep(0.02)


async def wait_dispatched(c: RemotingClient, addr: str, topic: str, total: int, timeout_s: float = 60) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while True:
        offs = [await max_offset(c, addr, topic, q) or 0 for q in range(QUEUES)]
        if sum(offs) >= total:
            return offs
        if time.monotonic() > deadline:
            raise TimeoutError(f"{topic}: {sum(offs)} of {total} messages dispatched after {timeout_s} s")
        await asyncio.sleep(0.02)


class Session:
    """One event loop and one RemotingClient (one connection per address) for a test."""

    def __init__(self):
        self.loop = mq_loop.new_event_loop()
        self.client = RemotingClient()

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    def close(self) -> None:
        # what asyncio.run does on the way out: a run cut short (Ctrl-C, SIGTERM in mqpeers)
        # leaves its task pending; cancelled and awaited here, it cannot end later with an
        # exception nobody retrieves (asyncio would print it with a traceback)
        pending = [t for t in asyncio.all_tasks(self.loop) if not t.done()]
        for t in pending:
            t.cancel()
        if pending:
            self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self.run(self.client.close())
        self.loop.close()


# ---- produce rounds (each returns seconds and appends per-request latencies) --------------------
async def sequential_sends(c, addr, topic, n: int, lat: list[float]) -> float:
    t0 = time.perf_counter()
    for i in range(n):
        s = time.perf_counter()
        await send_one(c, addr, topic, i % QUEUES)
        lat.append(time.perf_counter() - s)
    return time.perf_counter() - t0


async def pipelined_sends(c, addr, topic, n: int, in_flight: int, lat: list[float]) -> float:
    async def sender(k: int) -> None:
        for i in range(k, n, in_flight):
            s = time.perf_counter()
            await send_one(c, addr, topic, i % QUEUES)
            lat.append(time.perf_counter() - s)

    t0 = time.perf_counter()
    await asyncio.gather(*(sender(k) for k in range(in_flight)))
    return time.perf_counter() - t0


async def batched_sends(c, addr, topic, batches: int, in_flight: int, body: bytes, lat: list[float]) -> float:
    async def sender(k: int) -> None:
        for i in range(k, batches, in_flight):
            s = time.perf_counter()
            await send_batch(c, addr, topic, i % QUEUES, body)
            lat.append(time.perf_counter() - s)

    t0 = time.perf_counter()
    await asyncio.gather(*(sender(k) for k in range(in_flight)))
    return time.perf_counter() - t0


# ---- client processes (spawned) -----------------------------------------------------------------


CONNECT_TRIES = 64
WORKERS_BATCH_IN_FLIGHT = 2       # per connection


def _client_reply(pipe, fn, *args) -> None:
    try:
        pipe.send(("ok", fn(*args)))
    except BaseException:
        pipe.send(("error", traceback.format_exc()))


async def _balanced_connections(addr: str, per_worker: int, workers: int, clients: dict) -> dict[int, int]:
    """Opens connections (one RemotingClient each) until it holds `per_worker` on each of the
    `workers` io workers, asking each connection which worker serves it; closes the extras.
    SO_REUSEPORT spreads connections by a hash of the 4-tuple, so this takes a few tries."""
    by_pid: dict[int, list[RemotingClient]] = {}
    for _ in range(CONNECT_TRIES):
        c = RemotingClient()
        r = await c.invoke(addr, c.request(GET_BROKER_RUNTIME_INFO), TIMEOUT_S)
        pid = int(json.loads(r.body)["table"]["ioWorkerPid"])
        held = by_pid.setdefault(pid, [])
        if len(held) < per_worker:
            held.append(c)
        else:
            await c.close()
        if len(by_pid) >= workers and all(len(v) >= per_worker for v in by_pid.values()):
            break
    else:
        raise RuntimeError(f"could not balance connections over {workers} io workers: "
                           f"{ {p: len(v) for p, v in by_pid.items()} }")
    clients[addr] = [c for held in by_pid.values() for c in held]
    return {pid: len(v) for pid, v in by_pid.items()}


async def _timed_batches(clients: dict, addr: str, topic: str, start_at: float, batches_per_conn: int,
                         in_flight: int, body: bytes) -> dict:
    conns = clients[addr]
    lat: list[float] = []

    async def sender(c: RemotingClient, k: int, queue_id: int) -> None:
        for _ in range(k, batches_per_conn, in_flight):
            s = time.monotonic()
            await send_batch(c, addr, topic, queue_id, body)
            lat.append(time.monotonic() - s)

    await asyncio.sleep(max(0.0, start_at - time.monotonic()))
    t0 = time.monotonic()
    await asyncio.gather(*(sender(c, k, (i * in_flight + k + os.getpid()) % QUEUES)
                           for i, c in enumerate(conns) for k in range(in_flight)))
    t1 = time.monotonic()
    return {"start": t0, "end": t1, "msgs": len(conns) * batches_per_conn * BATCH_MSGS, "lat": lat}


def _serve_client_commands(pipe, connect, run) -> None:
    """The command loop of a spawned client process: ("connect", ...) -> connect(clients, ...),
    ("run", ...) -> run(clients, ...) (both coroutines), ("disconnect",) closes every connection,
    anything else ends it; each command is answered with ("ok", result) or ("error", traceback).
    `clients` maps a broker address to its connections."""
    loop = mq_loop.new_event_loop()
    clients: dict[str, list[RemotingClient]] = {}

    def close_all() -> None:
        for conns in clients.values():
            for c in conns:
                loop.run_until_complete(c.close())
        clients.clear()

    try:
        while True:
            cmd, *args = pipe.recv()
            if cmd == "connect":
                _client_reply(pipe, lambda: loop.run_until_complete(connect(clients, *args)))
            elif cmd == "run":
                _client_reply(pipe, lambda: loop.run_until_complete(run(clients, *args)))
            elif cmd == "disconnect":
                _client_reply(pipe, close_all)
            else:
                return
    finally:
        close_all()
        loop.close()


def _batch_client_main(pipe) -> None:
    """A producer process for gate 3 (spawned): batches over connections balanced across io workers."""
    body = one_kib_batch()
    _serve_client_commands(pipe, lambda clients, *a: _balanced_connections(*a, clients),
                           lambda clients, *a: _timed_batches(clients, *a, body))


class ClientProcesses:
    """n spawned client processes, each running `target(pipe)` and answering
    ("ok", value) or ("error", text) to every command sent with call()."""

    def __init__(self, n: int, target=None):
        ctx = mp.get_context("spawn")
        self.pipes, self.procs = [], []
        for _ in range(n):
            mine, theirs = ctx.Pipe()
            p = ctx.Process(target=target or _batch_client_main, args=(theirs,), daemon=True)
            p.start()
            self.pipes.append(mine)
            self.procs.append(p)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def call(self, *cmd) -> list:
        for pipe in self.pipes:
            pipe.send(cmd)
        out = []
        for pipe in self.pipes:
            if not pipe.poll(120):
                raise TimeoutError(f"client process did not answer {cmd[0]}")
            status, value = pipe.recv()
            if status != "ok":
                raise RuntimeError(f"client process failed on {cmd[0]}:\n{value}")
            out.append(value)
        return out

    def run(self, addr: str, topic: str, batches_per_conn: int) -> tuple[int, float, list[float], float]:
        """All processes start together, 20 ms from now; (messages, seconds from the first start
        to the last end, per-batch latencies, seconds from the call to the first start)."""
        t0 = time.monotonic()
        res = self.call("run", addr, topic, t0 + 0.02, batches_per_conn, WORKERS_BATCH_IN_FLIGHT)
        start = min(r["start"] for r in res)
        return (sum(r["msgs"] for r in res), max(r["end"] for r in res) - start,
                [x for r in res for x in r["lat"]], start - t0)

    def close(self) -> None:
        for pipe, p in zip(self.pipes, self.procs):
            try:
                pipe.send(("exit",))
            except OSError:
                pass
            p.join(10)
            if p.is_alive():
                p.kill()


# ---- consume -------------------------------------------------------------------------------------


_I32 = struct.Struct(">i")


def count_records(body: bytes) -> int:
    """Records in a PULL_MESSAGE body (back-to-back CommitLog records, TOTALSIZE first)."""
    n = pos = 0
    end = len(body)
    while pos < end:
        pos += _I32.unpack_from(body, pos)[0]
        n += 1
    assert pos == end, "a pull body ended inside a record"
    return n


async def pull(c, addr, topic, queue_id: int, offset: int):
    r = await c.invoke(addr, c.request(PULL_MESSAGE, {
        "consumerGroup": "PerfConsumer", "topic": topic, "queueId": queue_id, "queueOffset": offset,
        "maxMsgNums": PULL_MAX_MSGS, "sysFlag": 4, "commitOffset": 0, "suspendTimeoutMillis": 0,
        "subscription": "*", "subVersion": 0}), TIMEOUT_S)
    if r.code != SUCCESS:
        raise AssertionError(f"pull {topic}:{queue_id}@{offset} failed: {r.code} {r.remark} {r.ext_fields}")
    nxt = int(r.ext_fields["nextBeginOffset"])
    n = count_records(r.body)
    assert n == nxt - offset, f"pull {topic}:{queue_id}@{offset}: {n} records, nextBeginOffset {nxt}"
    return n, len(r.body), nxt


# ---- filtered consumption: half the backlog selected by a TAG or an SQL92 expression ------------
FILTER_TAG = "TagA"
FILTER_SQL92 = "region = 'eu'"
FILTER_ITEMS = (BatchItem(0, BODY, b"TAGS\x01TagA\x02region\x01eu"), BatchItem(0, BODY, b"TAGS\x01TagB\x02region\x01us"))


def filtered_batch() -> bytes:
    """BATCH_MSGS 1 KiB messages, TagA / region=eu and TagB / region=us in turn."""
    return build_batch([FILTER_ITEMS[i % 2] for i in range(BATCH_MSGS)])


async def consume_filtered(c, addr, topic, ends: list[int], expression: str, expression_type: str
                           ) -> tuple[int, float]:
    """Every queue from 0 to its end with a filtered PULL_MESSAGE, one request at a time,
    round-robin; (messages delivered, seconds).  NO_MATCHED_MESSAGE answers move on as consumers do."""
    offsets = [0] * len(ends)
    active = [q for q, e in enumerate(ends) if e > 0]
    msgs = 0
    t0 = time.perf_counter()
    while active:
        for q in list(active):
            r = await c.invoke(addr, c.request(PULL_MESSAGE, {
                "consumerGroup": "PerfFiltered", "topic": topic, "queueId": q, "queueOffset": offsets[q],
                "maxMsgNums": PULL_MAX_MSGS, "sysFlag": 4, "commitOffset": 0, "suspendTimeoutMillis": 0,
                "subscription": expression, "expressionType": expression_type, "subVersion": 0}), TIMEOUT_S)
            if r.code not in (SUCCESS, RC.PULL_RETRY_IMMEDIATELY):
                raise AssertionError(f"filtered pull {topic}:{q}@{offsets[q]} failed: {r.code} {r.remark}")
            if r.code == SUCCESS:
                msgs += count_records(r.body)
            offsets[q] = int(r.ext_fields["nextBeginOffset"])
            if offsets[q] >= ends[q]:
                active.remove(q)
    return msgs, time.perf_counter() - t0


async def consume_round_robin(c, addr, topic, ends: list[int], lat: list[float]) -> tuple[int, int, float]:
    """One request at a time, round-robin over the queues, each from offset 0 to its end."""
    offsets = [0] * len(ends)
    active = [q for q, e in enumerate(ends) if e > 0]
    msgs = nbytes = 0
    t0 = time.perf_counter()
    while active:
        for q in list(active):
            s = time.perf_counter()
            n, size, offsets[q] = await pull(c, addr, topic, q, offsets[q])
            lat.append(time.perf_counter() - s)
            msgs += n
            nbytes += size
            if offsets[q] >= ends[q]:
                active.remove(q)
    return msgs, nbytes, time.perf_counter() - t0


async def consume_per_queue(c, addr, topic, ends: list[int]) -> tuple[int, int, float]:
    """One request in flight per queue (what RocketMQ's consumers do): len(ends) in flight."""
    totals = [0, 0]

    async def reader(q: int) -> None:
        off = 0
        while off < ends[q]:
            n, size, off = await pull(c, addr, topic, q, off)
            totals[0] += n
            totals[1] += size

    t0 = time.perf_counter()
    await asyncio.gather(*(reader(q) for q in range(len(ends))))
    return totals[0], totals[1], time.perf_counter() - t0


# ---- 64 concurrent producers: 2 processes x 4 connections x 8 single sends in flight ------------


SYNC_FLUSH_PROCESSES = 2
SYNC_FLUSH_CONNS_PER_PROCESS = 4
SYNC_FLUSH_IN_FLIGHT_PER_CONN = 8     # 2 x 4 x 8 = 64 producers, each one single send at a time
SYNC_FLUSH_PRODUCERS = SYNC_FLUSH_PROCESSES * SYNC_FLUSH_CONNS_PER_PROCESS * SYNC_FLUSH_IN_FLIGHT_PER_CONN


async def _single_producers(conns: list[RemotingClient], addr: str, topic: str, start_at: float, per_producer: int,
                            in_flight: int) -> dict:
    """len(conns) x in_flight producers; each sends `per_producer` single messages, one at a time
    (SEND_MESSAGE_V2 of 1 KiB, WAIT=true), and any answer but SUCCESS fails the round."""
    lat: list[float] = []

    async def producer(c: RemotingClient, n: int) -> None:
        for i in range(per_producer):
            s = time.monotonic()
            await send_one(c, addr, topic, (n + i) % QUEUES)
            lat.append(time.monotonic() - s)

    await asyncio.sleep(max(0.0, start_at - time.monotonic()))
    t0 = time.monotonic()
    await asyncio.gather(*(producer(c, i * in_flight + k + os.getpid()) for i, c in enumerate(conns)
                           for k in range(in_flight)))
    t1 = time.monotonic()
    return {"start": t0, "end": t1, "msgs": len(conns) * in_flight * per_producer, "lat": lat}


def _single_producer_main(pipe) -> None:
    """A producer process (spawned) for SingleProducerProcesses: single sends, in flight per connection."""
    async def connect(clients: dict, addr: str, n: int) -> int:
        clients[addr] = [RemotingClient() for _ in range(n)]
        for c in clients[addr]:                                 # opens each connection
            await c.invoke(addr, c.request(GET_BROKER_RUNTIME_INFO), TIMEOUT_S)
        return n

    async def run(clients: dict, addr: str, *rest):
        return await _single_producers(clients[addr], addr, *rest)

    _serve_client_commands(pipe, connect, run)


class SingleProducerProcesses(ClientProcesses):
    """ClientProcesses running single-send producers, `in_flight` per connection (gate 5, the
    HA benchmark's SYNC vs ASYNC master, perf/peers.py)."""

    def __init__(self, n: int, in_flight: int = SYNC_FLUSH_IN_FLIGHT_PER_CONN):
        super().__init__(n, target=_single_producer_main)
        self.in_flight = in_flight

    def run(self, addr: str, topic: str, per_producer: int) -> tuple[int, float, list[float], float]:
        """All processes start together, 20 ms from now; (messages, seconds from the first start
        to the last end, per-send latencies, seconds from the call to the first start)."""
        t0 = time.monotonic()
        res = self.call("run", addr, topic, t0 + 0.02, per_producer, self.in_flight)
        start = min(r["start"] for r in res)
        return (sum(r["msgs"] for r in res), max(r["end"] for r in res) - start,
                [x for r in res for x in r["lat"]], start - t0)


# =================================================================================================
# results
# =================================================================================================
def _pct(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


@dataclass
class Result:
    """One round: `msgs` messages in `seconds`; per-request latencies in seconds (a request is
    one message, one pipeline, one batch or one read, as the workload says), or, for a tool
    that reports percentiles itself (redis-benchmark), its p50/p99."""
    msgs: int
    seconds: float
    lat_s: list[float] = field(default_factory=list, repr=False)
    p50_us: float | None = None
    p99_us: float | None = None

    @property
    def msgs_per_s(self) -> float:
        return self.msgs / self.seconds


@dataclass
class Series:
    """The rounds of one side of a comparison: median rate, pooled latency percentiles."""
    rounds: list[Result] = field(default_factory=list)

    def add(self, r: Result) -> Result:
        self.rounds.append(r)
        return r

    @property
    def msgs_per_s(self) -> float:
        return statistics.median(r.msgs_per_s for r in self.rounds)

    def rate_range(self) -> tuple[float, float]:
        rates = [r.msgs_per_s for r in self.rounds]
        return min(rates), max(rates)

    def percentile_us(self, q: float) -> float | None:
        lat = sorted(x for r in self.rounds for x in r.lat_s)
        if lat:
            return _pct(lat, q) * 1e6
        given = [r.p50_us if q == 0.5 else r.p99_us for r in self.rounds]
        given = [g for g in given if g is not None]
        return statistics.median(given) if given else None

    @property
    def p50_us(self) -> float | None:
        return self.percentile_us(0.5)

    @property
    def p99_us(self) -> float | None:
        return self.percentile_us(0.99)

    def text(self) -> str:
        lo, hi = self.rate_range()
        p50, p99 = self.p50_us, self.p99_us
        lat = f", p50 {p50:,.0f} us, p99 {p99:,.0f} us" if p50 is not None else ""
        return f"{self.msgs_per_s:,.0f} msgs/s (rounds {lo:,.0f}-{hi:,.0f}){lat}"


def per_round_ratios(ours: Series, peer: Series) -> tuple[float, float]:
    """The range of ours / peer over neighbouring pairs of rounds."""
    ratios = sorted(a.msgs_per_s / b.msgs_per_s for a, b in zip(ours.rounds, peer.rounds))
    return ratios[0], ratios[-1]


# =================================================================================================
# Redis workloads (redis-py, blocking socket); each checks the stream grew or was read in full
# =================================================================================================
FIELDS = {"f": PRINTABLE_BODY}


def _xlen(r, stream: str) -> int:
    return int(r.xlen(stream))


def redis_xadd_one(r, stream: str, n: int) -> Result:
    """n XADDs of 1 KiB, each reply awaited before the next; latency per XADD."""
    before = _xlen(r, stream)
    xadd, lat = r.xadd, []
    t0 = time.perf_counter()
    for _ in range(n):
        s = time.perf_counter()
        xadd(stream, FIELDS)
        lat.append(time.perf_counter() - s)
    res = Result(n, time.perf_counter() - t0, lat)
    assert _xlen(r, stream) == before + n, "XADD one at a time lost entries"
    return res


def redis_xadd_pipeline(r, stream: str, n: int, depth: int = PIPELINE_DEPTH) -> Result:
    """n XADDs in pipelines of `depth` (no MULTI), one pipeline at a time; latency per pipeline
    (queueing its commands, sending them, reading every reply)."""
    before = _xlen(r, stream)
    pipe, lat = r.pipeline(transaction=False), []
    t0 = time.perf_counter()
    for i in range(0, n, depth):
        s = time.perf_counter()
        for _ in range(min(depth, n - i)):
            pipe.xadd(stream, FIELDS)
        pipe.execute()
        lat.append(time.perf_counter() - s)
    res = Result(n, time.perf_counter() - t0, lat)
    assert _xlen(r, stream) == before + n, "XADD pipeline lost entries"
    return res


def redis_fill(r, stream: str, n: int) -> None:
    """A backlog of n entries (pipelines of 1000), for the XREAD workload."""
    pipe = r.pipeline(transaction=False)
    for i in range(0, n, 1000):
        for _ in range(min(1000, n - i)):
            pipe.xadd(stream, FIELDS)
        pipe.execute()
    assert _xlen(r, stream) >= n


def redis_xread(r, stream: str, count: int = XREAD_COUNT) -> Result:
    """The whole stream from its start with XREAD COUNT `count`, one request at a time, until
    XLEN entries were read; latency per XREAD.  Checks every entry holds the 1 KiB body."""
    total = _xlen(r, stream)
    last, n, lat = "0-0", 0, []
    t0 = time.perf_counter()
    while n < total:
        s = time.perf_counter()
        reply = r.xread({stream: last}, count=count)
        lat.append(time.perf_counter() - s)
        entries = reply[0][1]
        n += len(entries)
        last = entries[-1][0]
    res = Result(n, time.perf_counter() - t0, lat)
    assert n == total and entries[-1][1][b"f"] == PRINTABLE_BODY, "XREAD did not return the stream"
    return res


def redis_benchmark_xadd(server, stream: str, n: int,
                         connections: int = BENCHMARK_CONNECTIONS, pipeline: int = 1) -> Result:
    """`redis-benchmark -c connections -P pipeline -n n XADD stream * f <1 KiB>` against `server`
    (a running peers.RedisServer): its own rate and latency percentiles (per XADD).  The seconds
    are n / its rate, which excludes the tool's start; checks the stream grew by n."""
    with server.client() as r:
        before = _xlen(r, stream)
        done = subprocess.run([server.programs["redis-benchmark"], "-h", "127.0.0.1", "-p", str(server.port),
                               "-c", str(connections), "-P", str(pipeline), "-n", str(n), "--csv", "XADD", stream,
                               "*", "f", PRINTABLE_BODY_TEXT],
                              capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(f"redis-benchmark failed ({done.returncode}): {done.stderr[-500:]}")
        grown = _xlen(r, stream) - before
    # "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max..."
    rows = [line for line in done.stdout.splitlines() if line.startswith('"XADD')]
    assert len(rows) == 1, f"unexpected redis-benchmark output: {done.stdout[:300]!r}"
    cols = [c.strip('"') for c in rows[0].rsplit('",', 7)[1:]]
    rps, p50_ms, p99_ms = float(cols[0]), float(cols[3]), float(cols[5])
    assert grown == n, f"redis-benchmark: the stream grew by {grown}, not {n}"
    return Result(n, n / rps, p50_us=p50_ms * 1e3, p99_us=p99_ms * 1e3)
