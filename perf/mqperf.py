"""mqperf: a load generator for RocketMQ 4.x brokers (ours or Apache's), in the spirit of RocketMQ's
benchmark tools (Producer.java / Consumer.java), speaking the wire protocol directly.

    mqperf produce -n 127.0.0.1:9876 -t T [--size 1024] [--batch 1] [--procs 1] [--conns 1] [--in-flight 1]
                   [--count N | --duration S] [--queues N] [--create-topic] [--trace DIR] [--json]
    mqperf consume -n ... -t T [--pull-batch 32] [--count N | --duration S] [--group G]
    mqperf e2e     -n ... -t T  (producers and consumers at once; latency = consume_us - send_us)
    --broker HOST:PORT instead of -n talks to one broker and skips the name server.

Modes
  produce  SEND_MESSAGE_V2 (310) or, with --batch N > 1, SEND_BATCH_MESSAGE (320) of N messages,
           round-robin over the writable queues of every master (brokerId 0) in the topic's route.
           --in-flight requests are outstanding per connection; every response sends the next.
           Default: --duration 10.
  consume  PULL_MESSAGE (11) from every readable queue, one pull in flight per queue, starting at each
           queue's min offset.  Without --count/--duration it drains the backlog (up to the max offsets
           seen at the start); with --count N it reads N messages spread over the queues (long-polling
           where a queue has too few yet); with --duration it reads until the deadline, long-polling.
  e2e      --procs consumer processes start at the queues' current max offsets and long-poll; then
           --procs producer processes send.  When the producers finish, the consumers are told each
           queue's last acknowledged offset and stop there.  Latency is consume_us - send_us, where
           send_us travels in the body (below), so it holds across processes.

Message body (--size bytes): MAGIC "MQPF" (4) | send_us (8, big-endian) | producer index (4) | padding;
bodies under 16 bytes carry no stamp (e2e needs >= 16).  A consumer fills send_us from the stamp.

Processes: --procs worker processes (multiprocessing spawn: the brokers' code is threaded, fork is not
safe) each open --conns connections per broker and run one asyncio loop driven by protocol callbacks
(no task or future per request).  Requests are encoded from per-queue templates in RocketMQ's binary
header format and responses are decoded by a minimal reader, so the client spends a few microseconds
per request (tests/perf_tools/test_mqperf.py proves the fast paths equal to mq.wire).  The parent
plans (route, topic, offsets), starts every worker at the same instant, prints one progress line per
interval on stderr from the workers' per-interval counts and latency histograms, and merges their
results into a Summary (stdout, or one JSON object with --json).

Trace (--trace DIR): one `msg` record per message and per side (mq/trace.py), one file per process
(`mqperf-<mode>-p<k>-<pid>.jsonl` for producers, `...-c<k>-...` for consumers); `broker` is the address
talked to (brokerIP1:listenPort from the route), as in the broker's own trace records.  Producer records carry
send_us/ack_us/status/queue_offset (no store_ts_ms: 4.x send responses do not carry it); consumer records
carry store_ts_ms/consume_us and send_us from the body stamp.  In e2e each message has both records.

Python API: `run(Options(...)) -> Summary`; errors: OptionsError (bad options), MQPerfError (the world).
CLI exit codes: 0 done (errors are counted in the summary), 1 the run could not be done, 2 bad arguments
(one line on stderr)."""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import multiprocessing as mp
import multiprocessing.connection as mpc
import os
import re
import signal
import socket
import struct
import sys
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field

from mq import loop as mq_loop
from mq.client.route import ClusterInfo, TopicRouteData
from mq.remoting import RemotingClient, RemotingError
from mq.remoting.client import CLIENT_VERSION
from mq.wire.codes import RESPONSE_NAMES, RequestCode as R, ResponseCode as RC
from mq.trace import TraceWriter
from mq.wire import commitlog as wcl
from mq.wire.batch import BatchItem, build_batch
from mq.wire.errors import WireError
from mq.wire.headers import PULL_SUBSCRIPTION, PULL_SUSPEND, SEND_V2_LETTER_OF, send_v2
from mq.wire.remoting import (LANGUAGE_PYTHON, RPC_RESPONSE, SERIALIZE_ROCKETMQ, RemotingCommand,
                              decode_frame_payload, encode_frame)
from mq.wire.topics import AUTO_CREATE_TOPIC

PROG = "mqperf"
MODES = ("produce", "consume", "e2e")

# ---- limits and defaults ------------------------------------------------------------------------------
MESSAGE_SIZE_MAX = 4 * 1024 * 1024      # broker maxMessageSize default: a batch body may not exceed it either
BATCH_MAX = 10_000
PROCS_MAX = 64
CONNS_MAX = 256
IN_FLIGHT_MAX = 10_000
PULL_BATCH_MAX = 1024
DEFAULT_DURATION_S = 10.0
DEFAULT_QUEUES = 4                      # queues of a topic made by --create-topic
LONG_POLL_MS = 1000                     # suspendTimeoutMillis of a pull at a caught-up queue
RECONNECT_DELAY_S = 0.5
SWEEP_INTERVAL_S = 0.25                 # how often requests past their deadline are failed
READY_TIMEOUT_S = 60.0                  # spawned workers connect within this
E2E_DRAIN_TIMEOUT_S = 60.0              # consumers get this long after the producers end
ROUTE_WAIT_S = 15.0                     # after --create-topic, the route must appear within this
WORKER_EXIT_TIMEOUT_S = 10.0

STAMP_MAGIC = b"MQPF"
STAMP = struct.Struct(">4sQI")          # magic, send_us, producer index: 16 bytes
PRODUCER_GROUP = "mqperf_producer"
SEND_PROPERTIES = "WAIT\x01true"
SEND_STATUS = {RC.SUCCESS: "SEND_OK", RC.FLUSH_DISK_TIMEOUT: "FLUSH_DISK_TIMEOUT",
               RC.FLUSH_SLAVE_TIMEOUT: "FLUSH_SLAVE_TIMEOUT", RC.SLAVE_NOT_AVAILABLE: "SLAVE_NOT_AVAILABLE"}
TOPIC_RE = re.compile(r"^[A-Za-z0-9%|_-]{1,127}$")
_GUARD_ERROR = "ERROR:"


class OptionsError(ValueError):
    """Options that cannot make a run (the CLI exits 2)."""


class MQPerfError(Exception):
    """The run could not be done: no route, no connection, a worker died (the CLI exits 1)."""


def now_us() -> int:
    return time.time_ns() // 1000


# =======================================================================================================
# Options and results
# =======================================================================================================
@dataclass
class Options:
    """What to run; the CLI flags map one to one (see build_parser)."""
    mode: str = "produce"
    namesrv: str | None = None              # "host:port[;host:port...]"
    broker: str | None = None               # "host:port": skip the name server
    topic: str = "MQPerfTopic"
    queues: int | None = None               # create with this many; an existing topic: only queues < N
    size_bytes: int = 1024
    batch: int = 1                          # messages per send request
    pull_batch: int = 32                    # maxMsgNums per pull
    procs: int = 1                          # worker processes (e2e: this many producers and consumers)
    conns: int = 1                          # connections per broker per process
    in_flight: int = 1                      # requests outstanding per producer connection
    count: int | None = None                # messages (produce: in all; consume: to read)
    duration_s: float | None = None
    group: str = "mqperf_consumer"
    cluster: str | None = None              # --create-topic on this cluster's masters only
    create_topic: bool = False
    trace_dir: str | None = None
    run_id: str | None = None
    progress_interval_s: float = 1.0        # 0: no progress lines
    timeout_s: float = 10.0                 # per request


@dataclass
class Latency:
    """Percentiles of a latency distribution in microseconds (from a log-linear histogram, within
    1/64 of the true value; max is exact)."""
    count: int = 0
    p50_us: int = 0
    p90_us: int = 0
    p99_us: int = 0
    p999_us: int = 0
    max_us: int = 0
    mean_us: float = 0.0


@dataclass
class Summary:
    mode: str
    run_id: str
    topic: str
    brokers: list[str]
    queues: int
    procs: int
    conns: int
    in_flight: int
    batch: int
    pull_batch: int
    size_bytes: int
    messages: int                           # produce: stored (any non-error status); consume/e2e: consumed
    bytes: int                              # body bytes of those messages
    errors: int                             # messages whose send failed (ERROR:* statuses)
    duration_s: float                       # from the common start to the last response
    msgs_per_s: float
    mb_per_s: float                         # 10^6 body bytes per second
    latency_kind: str                       # "send->ack" | "pull round trip" | "send->consume"
    latency: Latency
    statuses: dict[str, int]                # produce/e2e: per send status; consume: per pull outcome
    produced: int = 0                       # e2e: messages the producers got stored
    missing: int = 0                        # e2e: stored but not consumed before the consumers stopped
    send_latency: Latency | None = None     # e2e: the producers' send->ack
    client_cpu_s: float = 0.0               # CPU the worker processes used from the start to their end
    trace_files: list[str] = field(default_factory=list)

    def as_json(self) -> dict:
        return dataclasses.asdict(self)

    def text(self) -> str:
        lat = self.latency
        shape = (f"pull batch {self.pull_batch}" if self.mode == "consume" else
                 f"{self.in_flight} in flight, batch {self.batch}, {self.size_bytes}-byte bodies")
        lines = [f"{PROG} {self.mode}: topic {self.topic} on {', '.join(self.brokers)} ({self.queues} queues), "
                 f"{self.procs} procs x {self.conns} conns, {shape}, run {self.run_id}",
                 f"  messages   {self.messages:,}  ({self.bytes:,} bytes, errors {self.errors:,})",
                 f"  duration   {self.duration_s:.3f} s",
                 f"  throughput {self.msgs_per_s:,.0f} msgs/s  {self.mb_per_s:,.2f} MB/s",
                 f"  client cpu {self.client_cpu_s:.2f} s ({self.client_cpu_s / max(1, self.messages) * 1e6:.1f} us "
                 f"per message, {self.client_cpu_s / self.duration_s:.2f} CPUs)",
                 f"  latency {self.latency_kind} (us, n={lat.count:,}): p50 {lat.p50_us:,}  p90 {lat.p90_us:,}  "
                 f"p99 {lat.p99_us:,}  p99.9 {lat.p999_us:,}  max {lat.max_us:,}  mean {lat.mean_us:,.0f}"]
        if self.send_latency is not None:
            s = self.send_latency
            lines.append(f"  produced   {self.produced:,}  (missing at the end: {self.missing:,}); send->ack (us): "
                         f"p50 {s.p50_us:,}  p99 {s.p99_us:,}  max {s.max_us:,}")
        lines.append("  statuses   " + ("  ".join(f"{k} {v:,}" for k, v in sorted(self.statuses.items())) or "-"))
        if self.trace_files:
            lines.append(f"  trace      {len(self.trace_files)} files under "
                         f"{os.path.dirname(self.trace_files[0]) or '.'}")
        return "\n".join(lines)


# =======================================================================================================
# Latency histogram: log-linear buckets, mergeable, shipped between processes as {index: count}
# =======================================================================================================
_SUB_BITS = 6                   # 64 sub-buckets per power of two: relative bucket width <= 1/64
_SUB = 1 << _SUB_BITS
_EXACT_BELOW = 2 * _SUB         # values below 128 us have a bucket each


def bucket_index(v: int) -> int:
    if v < _EXACT_BELOW:
        return v if v > 0 else 0
    shift = v.bit_length() - _SUB_BITS - 1
    return shift * _SUB + (v >> shift)


def bucket_low(i: int) -> int:
    """The smallest value of bucket i (bucket_index(bucket_low(i)) == i)."""
    if i < _EXACT_BELOW:
        return i
    shift = i // _SUB - 1
    return (i - shift * _SUB) << shift


class Histogram:
    __slots__ = ("counts", "n", "total", "max")

    def __init__(self):
        self.counts: dict[int, int] = {}
        self.n = 0
        self.total = 0
        self.max = 0

    def add(self, v: int, weight: int = 1) -> None:
        if v < 0:
            v = 0
        i = bucket_index(v)
        c = self.counts
        c[i] = c.get(i, 0) + weight
        self.n += weight
        self.total += v * weight
        if v > self.max:
            self.max = v

    def merge(self, state: tuple) -> None:
        counts, n, total, vmax = state
        for i, k in counts.items():
            self.counts[i] = self.counts.get(i, 0) + k
        self.n += n
        self.total += total
        self.max = max(self.max, vmax)

    def state(self) -> tuple:
        return dict(self.counts), self.n, self.total, self.max

    def percentile(self, q: float) -> int:
        """The value at rank ceil(q * n) (q in [0, 1]): the middle of its bucket, at most the max."""
        if not self.n:
            return 0
        rank = max(1, math.ceil(q * self.n))
        seen = 0
        for i in sorted(self.counts):
            seen += self.counts[i]
            if seen >= rank:
                lo, hi = bucket_low(i), bucket_low(i + 1)
                return min(self.max, (lo + hi - 1) // 2)
        return self.max

    def latency(self) -> Latency:
        return Latency(self.n, self.percentile(0.50), self.percentile(0.90), self.percentile(0.99),
                       self.percentile(0.999), self.max, self.total / self.n if self.n else 0.0)


# =======================================================================================================
# Wire fast paths (proven equal to mq.wire by the tests)
# =======================================================================================================
_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")
_I16 = struct.Struct(">h")
_FRAME_HEAD = struct.Struct(">II")
_BIN_FIXED = struct.Struct(">hBhiii")    # code, language, version, opaque, flag, remark length


def _ext_entry(key: str, value: str) -> bytes:
    k, v = key.encode(), value.encode()
    return _I16.pack(len(k)) + k + _I32.pack(len(v)) + v


_QUEUE_ID = SEND_V2_LETTER_OF["queueId"]
_BORN_KEY = _I16.pack(1) + SEND_V2_LETTER_OF["bornTimestamp"].encode()


class SendTemplate:
    """SEND_MESSAGE_V2 (310) / SEND_BATCH_MESSAGE (320) frames for one topic, binary header
    (serialize type ROCKETMQ).  Per request only the opaque, the queue id and the born timestamp
    change; the fixed ext entries are encoded once per queue."""

    def __init__(self, topic: str, queues_total: int, batch: bool):
        self.code = R.SEND_BATCH_MESSAGE if batch else R.SEND_MESSAGE_V2
        const = send_v2(producerGroup=PRODUCER_GROUP, topic=topic, defaultTopic=AUTO_CREATE_TOPIC,
                        defaultTopicQueueNums=str(queues_total), sysFlag="0", flag="0", properties=SEND_PROPERTIES)
        if batch:
            const.update(send_v2(batch="true"))
        self._const = b"".join(_ext_entry(k, v) for k, v in const.items())
        self._per_queue: dict[int, bytes] = {}

    def frame(self, opaque: int, queue_id: int, born_ms: int, body: bytes) -> bytes:
        ext_q = self._per_queue.get(queue_id)
        if ext_q is None:
            ext_q = self._per_queue[queue_id] = self._const + _ext_entry(_QUEUE_ID, str(queue_id))
        g = b"%d" % born_ms
        ext = b"".join((ext_q, _BORN_KEY, _I32.pack(len(g)), g))
        header = b"".join((_BIN_FIXED.pack(self.code, LANGUAGE_PYTHON, CLIENT_VERSION, opaque, 0, 0),
                           _I32.pack(len(ext)), ext))
        return b"".join((_FRAME_HEAD.pack(4 + len(header) + len(body), (SERIALIZE_ROCKETMQ << 24) | len(header)),
                         header, body))


def parse_response(payload: bytes) -> tuple[int, int, int, str | None, dict[str, str], bytes]:
    """(code, opaque, flag, remark, ext fields, body) of a frame without its length prefix.  The binary
    header is read here (ext keys and values as text); a JSON header goes through mq.wire."""
    word = _U32.unpack_from(payload, 0)[0]
    hlen = word & 0xFFFFFF
    if word >> 24 != SERIALIZE_ROCKETMQ:
        cmd = decode_frame_payload(payload)
        return cmd.code, cmd.opaque, cmd.flag, cmd.remark, cmd.ext_fields or {}, cmd.body
    code, _lang, _ver, opaque, flag, rlen = _BIN_FIXED.unpack_from(payload, 4)
    pos = 4 + _BIN_FIXED.size
    remark = payload[pos:pos + rlen].decode("utf-8", "replace") if rlen else None
    pos += rlen
    elen = _I32.unpack_from(payload, pos)[0]
    pos += 4
    end = pos + elen
    ext = {}
    while pos < end:
        klen = _I16.unpack_from(payload, pos)[0]
        pos += 2
        key = payload[pos:pos + klen].decode("utf-8", "replace")
        pos += klen
        vlen = _I32.unpack_from(payload, pos)[0]
        pos += 4
        ext[key] = payload[pos:pos + vlen].decode("utf-8", "replace")
        pos += vlen
    return code, opaque, flag, remark, ext, payload[4 + hlen:]


# TOTALSIZE .. BODYLEN of a record with IPv4 born and store hosts (mq.wire.commitlog), hosts and ports skipped
_REC_V4 = struct.Struct(">iIiiiqqiq8xq8xiqi")
assert _REC_V4.size == 88


def scan_records(body: bytes) -> list[tuple[int, int, int, int, int]]:
    """(queue_id, queue_offset, store_ts_ms, body_size, stamped send_us or 0) of every record of a
    PULL_MESSAGE body.  Raises mq.wire.errors.WireError for a malformed body."""
    out = []
    pos, end = 0, len(body)
    while pos < end:
        if end - pos >= 88:
            (total, magic, _crc, qid, _flag, qoff, _phy, sys_flag, _born, store_ts, _rt, _pto,
             blen) = _REC_V4.unpack_from(body, pos)
        else:
            total, magic, sys_flag = 0, 0, wcl.BORNHOST_V6
        if magic != wcl.MESSAGE_MAGIC_CODE or sys_flag & (wcl.BORNHOST_V6 | wcl.STOREHOST_V6) \
                or total < wcl.RECORD_SIZE_MIN or pos + total > end:
            rec = wcl.parse_record(body, pos)        # IPv6 hosts, or a malformed record: raises
            total, qid, qoff, store_ts, blen = (rec.total_size, rec.queue_id, rec.queue_offset,
                                                rec.store_timestamp_ms, len(rec.body))
            bstart = pos + total - len(rec.body) - 1 - len(rec.topic.encode()) - 2 - len(rec.properties)
        else:
            bstart = pos + 88
        sent = 0
        if blen >= STAMP.size:
            magic_s, send_us, _pid = STAMP.unpack_from(body, bstart)
            if magic_s == STAMP_MAGIC:
                sent = send_us
        out.append((qid, qoff, store_ts, blen, sent))
        pos += total
    return out


def make_body(size_bytes: int, pad: bytes, send_us: int, producer: int) -> bytes:
    if size_bytes < STAMP.size:
        return pad[:size_bytes]
    return STAMP.pack(STAMP_MAGIC, send_us, producer) + pad[:size_bytes - STAMP.size]


class BatchBody:
    """A SEND_BATCH_MESSAGE body of n stamped messages, built once; stamp() writes send_us into
    every message's body in place (all of a batch go out at the same instant)."""

    def __init__(self, n: int, size_bytes: int, pad: bytes, producer: int):
        body = make_body(size_bytes, pad, 0, producer)
        self.buf = bytearray(build_batch([BatchItem(0, body, b"")] * n))
        rec = 22 + size_bytes                 # mq.wire.batch: TOTALSIZE = 22 + BODYLEN + PROPSLEN(0)
        self.stamp_at = [i * rec + 20 + 4 for i in range(n)] if size_bytes >= STAMP.size else []

    def stamp(self, send_us: int) -> bytes:
        packed = struct.pack(">Q", send_us)
        buf = self.buf
        for p in self.stamp_at:
            buf[p:p + 8] = packed
        return bytes(buf)


# =======================================================================================================
# Trace lines, formatted from a fixed per-connection template (TraceWriter.write_lines, mq/trace.py)
# =======================================================================================================
def _trace_prefix(run: str, mode: str, client: str, broker: str, topic: str) -> str:
    d = json.dumps
    return (f'{{"kind":"msg","run":{d(run)},"mode":{d(mode)},"client":{d(client)},"broker":{d(broker)},'
            f'"topic":{d(topic)},')


# =======================================================================================================
# One connection: frames out coalesced per event-loop callback, responses to per-request callbacks
# =======================================================================================================
class Link(asyncio.Protocol):
    def __init__(self, addr: str, on_lost):
        self.addr = addr
        self.transport: asyncio.Transport | None = None
        self.pending: dict[int, tuple] = {}     # opaque -> (callback, deadline_mono)
        self.closed = False
        self._opaque = 0
        self._in = bytearray()
        self._out: list[bytes] = []
        self._on_lost = on_lost

    @classmethod
    async def open(cls, addr: str, on_lost, timeout_s: float) -> "Link":
        host, _, port = addr.rpartition(":")
        link = cls(addr, on_lost)
        loop = asyncio.get_running_loop()
        try:
            await asyncio.wait_for(loop.create_connection(lambda: link, host, int(port)), timeout_s)
        except (OSError, asyncio.TimeoutError, ValueError) as e:
            raise MQPerfError(f"cannot connect to {addr}: {e or type(e).__name__}") from None
        return link

    def connection_made(self, transport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def next_opaque(self) -> int:
        self._opaque = (self._opaque + 1) & 0x7FFFFFFF
        return self._opaque

    def send(self, opaque: int, frame: bytes, callback, deadline_mono: float) -> None:
        """Queues a request; callback(code, remark, ext, body) gets the response, or
        callback(None, "TIMEOUT"|"CONNECTION_LOST", {}, b"") if none comes.  Call flush() after."""
        self.pending[opaque] = (callback, deadline_mono)
        self._out.append(frame)

    def flush(self) -> None:
        if self._out and not self.closed:
            out, self._out = self._out, []
            self.transport.write(b"".join(out))

    def data_received(self, data: bytes) -> None:
        buf = self._in
        buf += data
        pos, n = 0, len(buf)
        while n - pos >= 4:
            size = _U32.unpack_from(buf, pos)[0]
            if n - pos - 4 < size:
                break
            payload = buf[pos + 4:pos + 4 + size]          # a copy: buf moves below
            pos += 4 + size
            code, opaque, flag, remark, ext, body = parse_response(payload)
            if flag & RPC_RESPONSE:
                entry = self.pending.pop(opaque, None)
                if entry is not None:            # a late answer to a request already failed is dropped
                    entry[0](code, remark, ext, body)
        del buf[:pos]
        self.flush()

    def expire(self, now_mono: float) -> None:
        late = [o for o, (_, deadline) in self.pending.items() if deadline < now_mono]
        for o in late:
            cb, _ = self.pending.pop(o)
            cb(None, "TIMEOUT", {}, b"")
        if late:
            self.flush()

    def connection_lost(self, exc) -> None:
        self.closed = True
        pending, self.pending = self.pending, {}
        for cb, _ in pending.values():
            cb(None, "CONNECTION_LOST", {}, b"")
        self._on_lost(self)

    def close(self) -> None:
        """Ends the connection; requests still pending (held pulls at the end of a run) are dropped
        without their callbacks."""
        self.pending.clear()
        self._on_lost = lambda link: None
        if self.transport is not None and not self.closed:
            self.transport.close()


# =======================================================================================================
# Worker process: plan, stats, producer and consumer lanes
# =======================================================================================================
@dataclass
class QueuePlan:
    queue_id: int
    start: int                      # consumers: first offset to read
    end: int | None                 # consumers: stop here (None: until told / the deadline)


@dataclass
class LanePlan:
    """One connection of a worker: a broker and the queues it serves."""
    broker_name: str
    addr: str
    queues: list[QueuePlan]


@dataclass
class WorkerSpec:
    role: str                       # "producer" | "consumer"
    index: int
    mode: str
    run_id: str
    options: Options
    lanes: list[LanePlan]
    quota_msgs: int | None          # producers: messages to send (None: until the deadline)
    queues_total: int               # the topic's queue count per broker (SEND header d)


class WorkerStats:
    def __init__(self):
        self.hist = Histogram()             # producers: send->ack per message; consumers: pull round trips
        self.tick_hist = Histogram()        # since the last tick (consumers in e2e: send->consume)
        self.e2e_hist = Histogram()         # consumers: consume_us - send_us of stamped messages
        self.msgs = 0                       # producers: stored; consumers: consumed
        self.bytes = 0
        self.errors = 0                     # producers: messages; consumers: pulls
        self.tick_msgs = 0
        self.tick_errors = 0
        self.statuses: Counter = Counter()
        self.last_mono = 0.0                # producers: the last response; consumers: the last with messages
        self.end_offsets: dict[str, int] = {}   # producers: "broker:queue" -> last stored offset + 1

    def tick(self) -> dict:
        t = {"msgs": self.tick_msgs, "errors": self.tick_errors, "hist": self.tick_hist.state()}
        self.tick_msgs = self.tick_errors = 0
        self.tick_hist = Histogram()
        return t

    def result(self) -> dict:
        return {"msgs": self.msgs, "bytes": self.bytes, "errors": self.errors, "statuses": dict(self.statuses),
                "hist": self.hist.state(), "e2e_hist": self.e2e_hist.state(), "last_mono": self.last_mono,
                "end_offsets": self.end_offsets}


class Worker:
    """The loop of one worker process: its lanes (connections), the common start, the deadline,
    per-interval ticks to the parent and the sweep that fails requests past their deadline."""

    def __init__(self, spec: WorkerSpec, pipe):
        self.spec = spec
        self.o = spec.options
        self.pipe = pipe
        self.stats = WorkerStats()
        self.loop = asyncio.get_running_loop()
        self.done = self.loop.create_future()
        self.stopping = False                   # deadline passed or told to stop: no new requests
        self.remaining = spec.quota_msgs        # producers: messages not yet sent (None: no quota)
        self.trace: TraceWriter | None = None
        self.lanes: list[_Lane] = []
        tag = ("p" if spec.role == "producer" else "c") + str(spec.index)
        self.client = f"{tag}@{socket.gethostname()}:{os.getpid()}"
        if self.o.trace_dir:
            self.trace = TraceWriter(self.o.trace_dir, f"mqperf-{spec.mode}-{tag}")

    def check_done(self) -> None:
        if not self.done.done() and all(lane.finished() for lane in self.lanes):
            self.done.set_result(None)

    async def run(self) -> dict:
        lane_cls = ProducerLane if self.spec.role == "producer" else ConsumerLane
        self.lanes = [lane_cls(self, plan, i) for i, plan in enumerate(self.spec.lanes)]
        for lane in self.lanes:
            await lane.connect()
        self.pipe.send(("ready",))
        go_at = await self._wait_command("go")
        self.loop.add_reader(self.pipe.fileno(), self._on_command)
        await asyncio.sleep(max(0.0, go_at - time.monotonic()))
        # e2e consumers ignore the duration: they stop where the producers' last stored offsets are
        if self.o.duration_s is not None and not (self.spec.mode == "e2e" and self.spec.role == "consumer"):
            self.loop.call_at(self._loop_time(go_at + self.o.duration_s), self.stop)
        if self.o.progress_interval_s > 0:
            self._schedule_tick(go_at, 1)
        self._sweep()
        cpu0_s = time.process_time()
        for lane in self.lanes:
            lane.resume()
        self.check_done()
        await self.done
        cpu_s = time.process_time() - cpu0_s
        self.loop.remove_reader(self.pipe.fileno())
        for lane in self.lanes:
            lane.close()
        if self.trace is not None:
            self.trace.close()
        return {"role": self.spec.role, "index": self.spec.index, "cpu_s": cpu_s, **self.stats.result(),
                "trace": self.trace.path if self.trace else None,
                "trace_records": self.trace.records if self.trace else 0}

    def _loop_time(self, mono: float) -> float:
        return self.loop.time() + (mono - time.monotonic())

    async def _wait_command(self, name: str):
        while not self.pipe.poll():
            await asyncio.sleep(0.002)
        cmd, *args = self.pipe.recv()
        if cmd != name:
            raise MQPerfError(f"told {cmd!r} before {name!r}")
        return args[0]

    def _on_command(self) -> None:
        while self.pipe.poll():
            cmd, *args = self.pipe.recv()
            if cmd == "stop":
                self.stop()
            elif cmd == "until":
                for lane in self.lanes:
                    lane.until(args[0])
                self.check_done()

    def stop(self) -> None:
        self.stopping = True
        self.check_done()

    def _schedule_tick(self, go_at: float, i: int) -> None:
        def fire():
            if not self.done.done():
                self.pipe.send(("tick", i, self.stats.tick()))
                self._schedule_tick(go_at, i + 1)
        self.loop.call_at(self._loop_time(go_at + i * self.o.progress_interval_s), fire)

    def _sweep(self) -> None:
        if self.done.done():
            return
        now = time.monotonic()
        for lane in self.lanes:
            if lane.link is not None:
                lane.link.expire(now)
        self.loop.call_later(SWEEP_INTERVAL_S, self._sweep)


class _Lane:
    """A connection and the requests that run on it; reconnects after a loss until the run stops."""

    def __init__(self, worker: Worker, plan: LanePlan, index: int):
        self.w = worker
        self.plan = plan
        self.index = index
        self.link: Link | None = None
        # `broker` is the address, as in the broker's own trace (mq/broker/tracing.py): it tells a
        # master from its slave, which share brokerName
        self.prefix = _trace_prefix(worker.spec.run_id, worker.spec.mode, worker.client, plan.addr, worker.o.topic)

    async def connect(self) -> None:
        self.link = await Link.open(self.plan.addr, self._lost, self.w.o.timeout_s)

    def _lost(self, link: Link) -> None:
        if not self.w.done.done() and not self.finished():
            self.w.loop.call_later(RECONNECT_DELAY_S, lambda: self.w.loop.create_task(self._reconnect()))
        self.w.check_done()

    async def _reconnect(self) -> None:
        if self.w.done.done() or self.finished():
            return
        try:
            await self.connect()
        except MQPerfError:
            self.w.loop.call_later(RECONNECT_DELAY_S, lambda: self.w.loop.create_task(self._reconnect()))
            return
        self.resume()

    def close(self) -> None:
        if self.link is not None:
            self.link.close()

    def finished(self) -> bool:
        raise NotImplementedError

    def resume(self, flush: bool = True) -> None:
        raise NotImplementedError

    def until(self, ends: dict[str, int]) -> None:
        pass


def _error_status(code: int | None, remark: str | None) -> str:
    """ERROR:<response code name>, or ERROR:TIMEOUT / ERROR:CONNECTION_LOST when no response came."""
    return _GUARD_ERROR + (str(remark) if code is None else RESPONSE_NAMES.get(code, str(code)))


class ProducerLane(_Lane):
    """Keeps `in_flight` send requests outstanding, round-robin over the broker's queues; each
    response records its messages and sends the next request (written together with the other
    requests of the same read, in one write)."""

    def __init__(self, worker: Worker, plan: LanePlan, index: int):
        super().__init__(worker, plan, index)
        o = worker.o
        self.queue_ids = [q.queue_id for q in plan.queues]
        assert self.queue_ids, plan
        self.next_q = worker.spec.index * len(worker.spec.lanes) + index     # lanes start on different queues
        self.template = SendTemplate(o.topic, worker.spec.queues_total, batch=o.batch > 1)
        self.pad = os.urandom(o.size_bytes)
        self.batches: dict[int, BatchBody] = {}      # by message count (the last batch of a quota may be short)
        self.inflight = 0

    def _more(self) -> bool:
        return not self.w.stopping and (self.w.remaining is None or self.w.remaining > 0)

    def finished(self) -> bool:
        return self.inflight == 0 and not self._more()

    def resume(self, flush: bool = True) -> None:
        link, o, w = self.link, self.w.o, self.w
        if link is None or link.closed:
            return
        while self.inflight < o.in_flight and self._more():
            n = o.batch if w.remaining is None else min(o.batch, w.remaining)
            if w.remaining is not None:
                w.remaining -= n
            qid = self.queue_ids[self.next_q % len(self.queue_ids)]
            self.next_q += 1
            send_us = now_us()
            if o.batch > 1:
                bb = self.batches.get(n)
                if bb is None:
                    bb = self.batches[n] = BatchBody(n, o.size_bytes, self.pad, w.spec.index)
                body = bb.stamp(send_us)
            else:
                body = make_body(o.size_bytes, self.pad, send_us, w.spec.index)
            opaque = link.next_opaque()
            self.inflight += 1
            link.send(opaque, self.template.frame(opaque, qid, send_us // 1000, body),
                      self._callback(qid, n, send_us), time.monotonic() + o.timeout_s)
        if flush:
            link.flush()

    def _callback(self, qid: int, n: int, send_us: int):
        return lambda code, remark, ext, body: self._record(qid, n, send_us, code, remark, ext)

    def _record(self, qid: int, n: int, send_us: int, code, remark, ext) -> None:
        """One response (or failure) for n messages: stats, trace records, then the next request."""
        ack_us = now_us()
        w, s = self.w, self.w.stats
        self.inflight -= 1
        status = SEND_STATUS.get(code)
        offset = None
        if status is None:                          # no answer, or an answer saying it was not stored
            status = _error_status(code, remark)
            s.errors += n
            s.tick_errors += n
        else:                                       # stored (10/11/12 too): the answer carries its offset
            try:
                offset = int(ext["queueOffset"])
            except (KeyError, ValueError):
                pass
            s.msgs += n
            s.tick_msgs += n
            s.bytes += n * w.o.size_bytes
            if offset is not None:
                key = f"{self.plan.broker_name}:{qid}"
                if offset + n > s.end_offsets.get(key, 0):
                    s.end_offsets[key] = offset + n
            s.hist.add(ack_us - send_us, n)
            s.tick_hist.add(ack_us - send_us, n)
        s.statuses[status] += n
        s.last_mono = time.monotonic()
        if w.trace is not None:
            head = f'{self.prefix}"queue":{qid},'
            tail = (f'"size_bytes":{w.o.size_bytes},"batch":{n},"status":{json.dumps(status)},'
                    f'"send_us":{send_us},"ack_us":{ack_us}}}\n')
            if offset is None:
                w.trace.write_lines((head + tail) * n, n)
            else:
                w.trace.write_lines("".join(f'{head}"queue_offset":{offset + i},{tail}' for i in range(n)), n)
        self.resume(flush=False)                    # Link.data_received flushes after the whole read
        if self.inflight == 0:
            w.check_done()


class ConsumerLane(_Lane):
    """One pull in flight per queue.  A queue is done at its end offset; a caught-up queue (19
    PULL_NOT_FOUND) long-polls.  Records must come in queue-offset order without gaps: anything
    else is counted as UNEXPECTED_OFFSET."""

    def __init__(self, worker: Worker, plan: LanePlan, index: int):
        super().__init__(worker, plan, index)
        self.next = {q.queue_id: q.start for q in plan.queues}
        self.end = {q.queue_id: q.end for q in plan.queues}
        self.busy: set[int] = set()                 # queues with a pull outstanding
        self.caught_up: set[int] = set()            # their last answer was PULL_NOT_FOUND: long-poll

    def _queue_done(self, qid: int) -> bool:
        end = self.end[qid]
        return self.w.stopping or (end is not None and self.next[qid] >= end)

    def finished(self) -> bool:
        # A pull outstanding on a done queue asks for offsets at or past its end: nothing this run
        # counts.  Such pulls (long polls held by the broker) are abandoned when the connection closes.
        return self.w.stopping or all(self._queue_done(q) for q in self.next)

    def resume(self, flush: bool = True) -> None:
        for qid in self.next:
            self._pull(qid)
        if flush and self.link is not None:
            self.link.flush()

    def until(self, ends: dict[str, int]) -> None:
        for qid in self.next:
            if self.end[qid] is None:
                self.end[qid] = max(self.next[qid], ends.get(f"{self.plan.broker_name}:{qid}", 0))

    def _pull(self, qid: int) -> None:
        link = self.link
        if qid in self.busy or link is None or link.closed or self._queue_done(qid):
            return
        o = self.w.o
        suspend = qid in self.caught_up
        nums = o.pull_batch
        if self.end[qid] is not None:
            nums = min(nums, self.end[qid] - self.next[qid])
        opaque = link.next_opaque()
        sys_flag = PULL_SUBSCRIPTION | (PULL_SUSPEND if suspend else 0)
        frame = encode_frame(RemotingCommand(
            code=R.PULL_MESSAGE, language=LANGUAGE_PYTHON, version=CLIENT_VERSION, opaque=opaque,
            serialize_type=SERIALIZE_ROCKETMQ, ext_fields={
                "consumerGroup": o.group, "topic": o.topic, "queueId": str(qid), "queueOffset": str(self.next[qid]),
                "maxMsgNums": str(nums), "sysFlag": str(sys_flag), "commitOffset": "0",
                "suspendTimeoutMillis": str(LONG_POLL_MS), "subscription": "*", "subVersion": "0",
                "expressionType": "TAG"}))
        self.busy.add(qid)
        deadline = time.monotonic() + o.timeout_s + (LONG_POLL_MS / 1000 if suspend else 0)
        sent_us = now_us()
        link.send(opaque, frame, lambda code, remark, ext, body: self._record(qid, sent_us, code, remark, ext, body),
                  deadline)

    def _record(self, qid: int, sent_us: int, code, remark, ext, body) -> None:
        got_us = now_us()
        w, s = self.w, self.w.stats
        self.busy.discard(qid)
        retry_later = False
        if code == RC.SUCCESS:
            self.caught_up.discard(qid)
            try:
                self._consume(qid, got_us, body)
                s.statuses["FOUND"] += 1
            except WireError as e:
                s.statuses[_GUARD_ERROR + "MALFORMED_BODY"] += 1
                s.errors += 1
                print(f"{PROG}: malformed pull body from {self.plan.addr} {self.w.o.topic}:{qid}: {e}",
                      file=sys.stderr)
            s.hist.add(got_us - sent_us)
            if w.spec.mode != "e2e":
                s.tick_hist.add(got_us - sent_us)
            s.last_mono = time.monotonic()            # the run's end: the last pull that brought messages
            self.next[qid] = int(ext.get("nextBeginOffset", self.next[qid]))
        elif code == RC.PULL_NOT_FOUND:
            self.caught_up.add(qid)
            s.statuses["NO_NEW_MSG"] += 1
        elif code in (RC.PULL_RETRY_IMMEDIATELY, RC.PULL_OFFSET_MOVED):
            s.statuses["OFFSET_MOVED" if code == RC.PULL_OFFSET_MOVED else "NO_MATCHED_MSG"] += 1
            self.next[qid] = int(ext.get("nextBeginOffset", self.next[qid]))
        else:
            s.statuses[_error_status(code, remark)] += 1
            s.errors += 1
            s.tick_errors += 1
            retry_later = True
        if retry_later:
            w.loop.call_later(RECONNECT_DELAY_S, self._retry, qid)
        else:
            self._pull(qid)                         # Link.data_received flushes after the whole read
        w.check_done()

    def _retry(self, qid: int) -> None:
        self._pull(qid)
        if self.link is not None:
            self.link.flush()
        self.w.check_done()

    def _consume(self, qid: int, got_us: int, body: bytes) -> None:
        w, s = self.w, self.w.stats
        recs = scan_records(body)
        expected = self.next[qid]
        end = self.end[qid]
        e2e = w.spec.mode == "e2e"
        lines = []
        head = f'{self.prefix}"queue":{qid},'
        tail = f'"batch":{len(recs)},"status":"FOUND",'
        for rqid, qoff, store_ts, size, sent in recs:
            if rqid != qid or qoff != expected:
                s.statuses["UNEXPECTED_OFFSET"] += 1
            expected = qoff + 1
            if end is not None and qoff >= end:
                continue                            # beyond where this run stops
            s.msgs += 1
            s.tick_msgs += 1
            s.bytes += size
            if sent:
                s.e2e_hist.add(got_us - sent)
                if e2e:
                    s.tick_hist.add(got_us - sent)
            if w.trace is not None:
                stamp = f'"send_us":{sent},' if sent else ""
                lines.append(f'{head}"queue_offset":{qoff},"size_bytes":{size},{tail}{stamp}'
                             f'"store_ts_ms":{store_ts},"consume_us":{got_us}}}\n')
        if lines:
            w.trace.write_lines("".join(lines), len(lines))


def _worker_main(pipe, spec: WorkerSpec) -> None:
    """A spawned worker: connects, says ready, runs from the common start, answers ("done", result)
    or ("error", text)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)        # the parent handles ^C and sends "stop"

    async def main():
        return await Worker(spec, pipe).run()

    try:
        result = mq_loop.run(main())
        pipe.send(("done", result))
    except MQPerfError as e:
        pipe.send(("error", str(e)))
    except BaseException:
        pipe.send(("error", traceback.format_exc()))


# =======================================================================================================
# Planning (parent): route, topic, queues, offsets
# =======================================================================================================
@dataclass
class BrokerPlan:
    name: str
    addr: str
    write_queues: list[int]
    read_queues: list[int]
    min_offsets: dict[int, int]
    max_offsets: dict[int, int]


async def _invoke_ok(c: RemotingClient, addr: str, code: int, ext: dict | None, timeout_s: float, what: str):
    r = await c.invoke(addr, c.request(code, ext), timeout_s)
    if r.code != RC.SUCCESS:
        raise MQPerfError(f"{what} at {addr}: {RESPONSE_NAMES.get(r.code, r.code)} {r.remark or ''}".strip())
    return r


async def _namesrv(c: RemotingClient, addrs: list[str], code: int, ext: dict | None, timeout_s: float):
    last = None
    for a in addrs:
        try:
            return await c.invoke(a, c.request(code, ext), timeout_s)
        except RemotingError as e:
            last = e
    raise MQPerfError(f"no name server answers ({'; '.join(addrs)}): {last}")


async def _topic_stats(c: RemotingClient, addr: str, topic: str, timeout_s: float):
    """(broker name, {queue: min}, {queue: max}) from GET_TOPIC_STATS_INFO, or None if no such topic."""
    r = await c.invoke(addr, c.request(R.GET_TOPIC_STATS_INFO, {"topic": topic}), timeout_s)
    if r.code == RC.TOPIC_NOT_EXIST:
        return None
    if r.code != RC.SUCCESS:
        raise MQPerfError(f"topic stats of {topic} at {addr}: {RESPONSE_NAMES.get(r.code, r.code)} {r.remark}")
    from mq.wire.adminbodies import decode_topic_stats     # RocketMQ's TopicStatsTable (MessageQueue keys)
    try:
        rows = decode_topic_stats(r.body or b"{}")
    except ValueError as e:
        raise MQPerfError(f"topic stats of {topic} at {addr}: {e}") from None
    name = rows[0]["brokerName"] if rows else addr
    return (name, {int(x["queueId"]): int(x["minOffset"]) for x in rows},
            {int(x["queueId"]): int(x["maxOffset"]) for x in rows})


def _create_ext(o: Options) -> dict:
    n = o.queues or DEFAULT_QUEUES
    return {"topic": o.topic, "defaultTopic": "TBW102", "readQueueNums": n, "writeQueueNums": n, "perm": 6,
            "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0, "order": False}


async def plan_brokers(o: Options) -> list[BrokerPlan]:
    c = RemotingClient(connect_timeout_s=o.timeout_s)
    try:
        return await (_plan_direct(c, o) if o.broker else _plan_route(c, o))
    except RemotingError as e:
        raise MQPerfError(str(e)) from None
    finally:
        await c.close()


async def _plan_direct(c: RemotingClient, o: Options) -> list[BrokerPlan]:
    stats = await _topic_stats(c, o.broker, o.topic, o.timeout_s)
    if stats is None and o.create_topic:
        await _invoke_ok(c, o.broker, R.UPDATE_AND_CREATE_TOPIC, _create_ext(o), o.timeout_s, "create topic")
        stats = await _topic_stats(c, o.broker, o.topic, o.timeout_s)
    if stats is None:
        raise MQPerfError(f"topic {o.topic} does not exist at {o.broker} (use --create-topic)")
    name, mins, maxs = stats
    queues = sorted(q for q in maxs if o.queues is None or q < o.queues)
    return [BrokerPlan(name, o.broker, queues, queues, mins, maxs)]


async def _plan_route(c: RemotingClient, o: Options) -> list[BrokerPlan]:
    ns = [a.strip() for a in o.namesrv.split(";") if a.strip()]
    r = await _namesrv(c, ns, R.GET_ROUTEINFO_BY_TOPIC, {"topic": o.topic}, o.timeout_s)
    if r.code != RC.SUCCESS and o.create_topic:
        info = ClusterInfo.decode((await _namesrv(c, ns, R.GET_BROKER_CLUSTER_INFO, None, o.timeout_s)).body)
        clusters = [o.cluster] if o.cluster else sorted(info.cluster_addr_table)
        masters = [a for cl in clusters for a in info.master_addrs(cl)]
        if not masters:
            raise MQPerfError(f"no master broker to create {o.topic} on (clusters: {', '.join(clusters) or 'none'})")
        for addr in masters:
            await _invoke_ok(c, addr, R.UPDATE_AND_CREATE_TOPIC, _create_ext(o), o.timeout_s, "create topic")
        deadline = time.monotonic() + ROUTE_WAIT_S
        while True:     # the brokers register the new topic with the name server
            r = await _namesrv(c, ns, R.GET_ROUTEINFO_BY_TOPIC, {"topic": o.topic}, o.timeout_s)
            if r.code == RC.SUCCESS and len(TopicRouteData.decode(r.body).queue_datas) >= len(masters):
                break
            if time.monotonic() > deadline:
                raise MQPerfError(f"created {o.topic}, but its route did not appear within {ROUTE_WAIT_S:.0f} s")
            await asyncio.sleep(0.05)
    if r.code != RC.SUCCESS:
        raise MQPerfError(f"topic {o.topic} has no route at the name server (use --create-topic): "
                          f"{RESPONSE_NAMES.get(r.code, r.code)}")
    route = TopicRouteData.decode(r.body)
    plans = []
    writable = {}
    for mq_ in route.publish_queues(o.topic):
        writable.setdefault(mq_.broker_name, []).append(mq_.queue_id)
    readable = {}
    for mq_ in route.subscribe_queues(o.topic):
        readable.setdefault(mq_.broker_name, []).append(mq_.queue_id)
    for b in sorted(route.broker_datas, key=lambda b: b.broker_name):
        addr = b.master_addr if o.mode != "consume" else b.select_addr()
        if addr is None:
            continue
        w = [q for q in writable.get(b.broker_name, []) if o.queues is None or q < o.queues]
        rd = [q for q in readable.get(b.broker_name, []) if o.queues is None or q < o.queues]
        stats = await _topic_stats(c, addr, o.topic, o.timeout_s)
        mins, maxs = (stats[1], stats[2]) if stats else ({}, {})
        plans.append(BrokerPlan(b.broker_name, addr, w, rd, mins, maxs))
    return plans


def split_count(n: int, available: list[int]) -> list[int]:
    """n messages over queues: as evenly as the backlog (`available` per queue) allows, the rest of
    an even share where the backlog is short (those queues wait for new messages)."""
    k = len(available)
    assert k > 0 and n >= 0
    take = [0] * k
    left = n
    if sum(available) >= n:        # water-filling within the backlog
        order = sorted(range(k), key=lambda i: available[i])
        for j, i in enumerate(order):
            take[i] = min(available[i], left // (k - j))
            left -= take[i]
        for i in order:               # integer leftovers onto queues with room
            extra = min(left, available[i] - take[i])
            take[i] += extra
            left -= extra
        assert left == 0
        return take
    for i in range(k):
        take[i] = n // k + (1 if i < n % k else 0)
    return take


def _worker_specs(o: Options, brokers: list[BrokerPlan], run_id: str) -> list[WorkerSpec]:
    specs = []
    queues_total = max((len(b.write_queues) for b in brokers), default=1)
    if o.mode in ("produce", "e2e"):
        lanes_of = [LanePlan(b.name, b.addr, [QueuePlan(q, 0, None) for q in b.write_queues])
                    for b in brokers if b.write_queues]
        if not lanes_of:
            raise MQPerfError(f"topic {o.topic} has no writable queue on a master broker")
        for k in range(o.procs):
            quota = None if o.count is None else o.count // o.procs + (1 if k < o.count % o.procs else 0)
            lanes = [lane for lane in lanes_of for _ in range(o.conns)]
            specs.append(WorkerSpec("producer", k, o.mode, run_id, o, lanes, quota, queues_total))
    if o.mode in ("consume", "e2e"):
        allq = [(b, q) for b in brokers for q in b.read_queues]
        if not allq:
            raise MQPerfError(f"topic {o.topic} has no readable queue")
        plans: list[tuple[BrokerPlan, QueuePlan]] = []
        if o.mode == "e2e":
            plans = [(b, QueuePlan(q, b.max_offsets.get(q, 0), None)) for b, q in allq]
        else:
            starts = [b.min_offsets.get(q, 0) for b, q in allq]
            avail = [max(0, b.max_offsets.get(q, 0) - s) for (b, q), s in zip(allq, starts)]
            if o.count is not None:
                ends = [s + t for s, t in zip(starts, split_count(o.count, avail))]
            elif o.duration_s is not None:
                ends = [None] * len(allq)
            else:                                   # drain the backlog seen now
                ends = [s + a for s, a in zip(starts, avail)]
            plans = [(b, QueuePlan(q, s, e)) for (b, q), s, e in zip(allq, starts, ends)]
        for k in range(o.procs):
            mine = [p for i, p in enumerate(plans) if i % o.procs == k]
            lanes = []
            for b in brokers:
                qs = [qp for bb, qp in mine if bb is b]
                for j in range(min(o.conns, len(qs))):
                    lanes.append(LanePlan(b.name, b.addr, qs[j::o.conns]))
            specs.append(WorkerSpec("consumer", k, o.mode, run_id, o, lanes, None, queues_total))
    return specs


# =======================================================================================================
# run(): spawn, start together, progress, merge
# =======================================================================================================
def validate(o: Options) -> None:
    """Raises OptionsError for options no run can use."""
    def need(cond: bool, text: str) -> None:
        if not cond:
            raise OptionsError(text)
    need(o.mode in MODES, f"mode must be one of {', '.join(MODES)}, not {o.mode!r}")
    need(bool(o.namesrv) != bool(o.broker), "give exactly one of -n/--namesrv and --broker")
    for a in ([o.broker] if o.broker else [x for x in (o.namesrv or "").split(";") if x.strip()]):
        host, _, port = a.strip().rpartition(":")
        need(bool(host) and port.isdigit() and 0 < int(port) < 65536, f"not a host:port address: {a!r}")
    need(bool(TOPIC_RE.match(o.topic or "")), f"bad topic name {o.topic!r}: 1-127 of [A-Za-z0-9%|_-]")
    need(1 <= o.size_bytes <= MESSAGE_SIZE_MAX, f"--size must be 1..{MESSAGE_SIZE_MAX}, not {o.size_bytes}")
    need(1 <= o.batch <= BATCH_MAX, f"--batch must be 1..{BATCH_MAX}, not {o.batch}")
    need(o.batch == 1 or o.batch * (o.size_bytes + 22) <= MESSAGE_SIZE_MAX,
         f"a batch of {o.batch} x {o.size_bytes} bytes exceeds the broker's {MESSAGE_SIZE_MAX}-byte maximum")
    need(1 <= o.pull_batch <= PULL_BATCH_MAX, f"--pull-batch must be 1..{PULL_BATCH_MAX}")
    need(1 <= o.procs <= PROCS_MAX, f"--procs must be 1..{PROCS_MAX}, not {o.procs}")
    need(1 <= o.conns <= CONNS_MAX, f"--conns must be 1..{CONNS_MAX}, not {o.conns}")
    need(1 <= o.in_flight <= IN_FLIGHT_MAX, f"--in-flight must be 1..{IN_FLIGHT_MAX}, not {o.in_flight}")
    need(o.count is None or o.duration_s is None, "give at most one of --count and --duration")
    need(o.count is None or o.count >= 1, f"--count must be >= 1, not {o.count}")
    need(o.duration_s is None or 0 < o.duration_s < 1e7, f"--duration must be > 0, not {o.duration_s}")
    need(o.queues is None or 1 <= o.queues <= 1024, f"--queues must be 1..1024, not {o.queues}")
    need(o.progress_interval_s >= 0, "--progress-interval must be >= 0")
    need(o.timeout_s > 0, "--timeout must be > 0")
    need(o.mode != "e2e" or o.size_bytes >= STAMP.size, f"e2e needs --size >= {STAMP.size} (the send stamp)")
    need(bool(o.group) and bool(TOPIC_RE.match(o.group)), f"bad group name {o.group!r}")
    need(o.run_id is None or (0 < len(o.run_id) <= 200 and o.run_id.isprintable()), "bad --run-id")


class _Progress:
    """One line per interval on stderr, printed once every worker still running reported that
    interval (a worker that finished counts as reported)."""

    def __init__(self, o: Options, roles: list[str], out):
        self.o = o
        self.roles = roles                          # by worker index
        self.out = out
        self.ticks: dict[int, dict[int, dict]] = {}  # interval -> worker -> counts
        self.last = [0] * len(roles)                # the last interval each worker reported
        self.printed = 0
        self.totals: Counter = Counter()

    def add(self, worker: int, i: int, t: dict) -> None:
        if i > self.printed:
            self.ticks.setdefault(i, {})[worker] = t
        self.last[worker] = i

    def emit(self, running: set[int]) -> None:
        while self.printed + 1 in self.ticks and all(self.last[w] > self.printed for w in running):
            i = self.printed = self.printed + 1
            parts = self.ticks.pop(i)
            if self.out is not None:
                self._print(i, parts)

    def _print(self, i: int, parts: dict[int, dict]) -> None:
        secs = self.o.progress_interval_s
        text = []
        for role in ("producer", "consumer"):
            mine = [t for w, t in parts.items() if self.roles[w] == role]
            if not mine:
                continue
            h = Histogram()
            for t in mine:
                h.merge(t["hist"])
            msgs = sum(t["msgs"] for t in mine)
            self.totals[role] += msgs
            verb, lat = (("sent", "ack") if role == "producer" else
                         ("got", "e2e" if self.o.mode == "e2e" else "pull"))
            text.append(f"{verb} {msgs / secs:>9,.0f} msgs/s total {self.totals[role]:>11,} "
                        f"errors {sum(t['errors'] for t in mine):,} "
                        f"{lat} p50 {h.percentile(0.5):,} p99 {h.percentile(0.99):,} us")
        print(f"{PROG} {self.o.mode} {i * secs:7.1f}s  " + " | ".join(text), file=self.out, flush=True)


def run(o: Options, progress=None) -> Summary:
    """Runs the load described by `o` and returns its Summary.  Progress lines go to the text
    stream `progress` (None: silent; the CLI passes stderr).  Raises OptionsError or MQPerfError."""
    validate(o)
    run_id = o.run_id or f"{o.mode}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    if o.duration_s is None and o.count is None and o.mode != "consume":
        o = dataclasses.replace(o, duration_s=DEFAULT_DURATION_S)
    brokers = mq_loop.run(plan_brokers(o))
    if not brokers:
        raise MQPerfError(f"topic {o.topic}: no broker in its route")
    specs = _worker_specs(o, brokers, run_id)
    ctx = mp.get_context("spawn")
    procs, pipes = [], []
    try:
        for spec in specs:
            mine, theirs = ctx.Pipe()
            p = ctx.Process(target=_worker_main, args=(theirs, spec), daemon=True, name=f"mqperf-{spec.role}")
            p.start()
            theirs.close()
            procs.append(p)
            pipes.append(mine)
        return _drive(o, run_id, brokers, specs, procs, pipes, progress)
    finally:
        for pipe in pipes:
            try:
                pipe.send(("stop",))
            except (OSError, BrokenPipeError):
                pass
        for p in procs:
            p.join(WORKER_EXIT_TIMEOUT_S)
            if p.is_alive():
                p.kill()
                p.join(5)


def _recv_all(pipes, want: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    waiting = set(range(len(pipes)))
    while waiting:
        ready = mpc.wait([pipes[i] for i in waiting], max(0.0, deadline - time.monotonic()))
        if not ready:
            raise MQPerfError(f"workers did not get {want} within {timeout_s:.0f} s")
        for conn in ready:
            i = pipes.index(conn)
            try:
                msg = conn.recv()
            except EOFError:
                raise MQPerfError("a worker process died while starting") from None
            if msg[0] == "error":
                raise MQPerfError(f"worker: {msg[1]}")
            if msg[0] == want:
                waiting.discard(i)


def _drive(o, run_id, brokers, specs, procs, pipes, progress) -> Summary:
    _recv_all(pipes, "ready", READY_TIMEOUT_S)
    go_at = time.monotonic() + 0.05
    for pipe in pipes:
        pipe.send(("go", go_at))
    prog = _Progress(o, [s.role for s in specs], progress if o.progress_interval_s > 0 else None)
    results: dict[int, dict] = {}
    running = set(range(len(pipes)))
    producers = {i for i, s in enumerate(specs) if s.role == "producer"}
    told_until = False
    drain_deadline = math.inf
    interrupted = False
    while running:
        try:
            ready = mpc.wait([pipes[i] for i in running], timeout=0.2)
        except KeyboardInterrupt:
            interrupted = True
            for i in running:
                pipes[i].send(("stop",))
            continue
        for conn in ready:
            i = pipes.index(conn)
            try:
                msg = conn.recv()
            except EOFError:
                raise MQPerfError(f"worker {specs[i].role} {specs[i].index} died (exit code {procs[i].exitcode})") \
                    from None
            if msg[0] == "tick":
                prog.add(i, msg[1], msg[2])
            elif msg[0] == "done":
                results[i] = msg[1]
                running.discard(i)
            elif msg[0] == "error":
                raise MQPerfError(f"worker {specs[i].role} {specs[i].index}: {msg[1]}")
        prog.emit(running)
        if o.mode == "e2e" and not told_until and producers and producers <= set(results):
            ends: dict[str, int] = {}
            for i in producers:
                for k, v in results[i]["end_offsets"].items():
                    ends[k] = max(ends.get(k, 0), v)
            for i in running:
                pipes[i].send(("until", ends))
            told_until = True
            drain_deadline = time.monotonic() + E2E_DRAIN_TIMEOUT_S
        if time.monotonic() > drain_deadline:
            for i in running:
                pipes[i].send(("stop",))
            drain_deadline = math.inf
    if interrupted and progress is not None:
        print(f"{PROG}: interrupted; summary of what was done", file=progress)
    return _summary(o, run_id, brokers, specs, results, go_at)


def _summary(o, run_id, brokers, specs, results, go_at) -> Summary:
    prod = [r for r in results.values() if r["role"] == "producer"]
    cons = [r for r in results.values() if r["role"] == "consumer"]
    main_side = cons if o.mode in ("consume", "e2e") else prod
    hist = Histogram()
    for r in main_side:
        hist.merge(r["e2e_hist"] if o.mode == "e2e" else r["hist"])
    statuses: Counter = Counter()
    for r in (prod if o.mode == "e2e" else main_side):
        statuses.update(r["statuses"])
    last = max((r["last_mono"] for r in main_side if r["last_mono"]), default=go_at)
    duration_s = max(1e-9, last - go_at)
    msgs = sum(r["msgs"] for r in main_side)
    nbytes = sum(r["bytes"] for r in main_side)
    queues = sum(len(b.write_queues if o.mode != "consume" else b.read_queues) for b in brokers)
    s = Summary(mode=o.mode, run_id=run_id, topic=o.topic, brokers=[f"{b.name}@{b.addr}" for b in brokers],
                queues=queues, procs=o.procs, conns=o.conns, in_flight=o.in_flight, batch=o.batch,
                pull_batch=o.pull_batch,
                size_bytes=o.size_bytes, messages=msgs, bytes=nbytes,
                errors=sum(r["errors"] for r in (prod if o.mode == "e2e" else main_side)),
                duration_s=duration_s, msgs_per_s=msgs / duration_s, mb_per_s=nbytes / duration_s / 1e6,
                latency_kind={"produce": "send->ack", "consume": "pull round trip", "e2e": "send->consume"}[o.mode],
                latency=hist.latency(), statuses=dict(statuses),
                trace_files=sorted(r["trace"] for r in results.values() if r["trace"]),
                client_cpu_s=sum(r["cpu_s"] for r in results.values()))
    if o.mode == "e2e":
        sh = Histogram()
        for r in prod:
            sh.merge(r["hist"])
        s.send_latency = sh.latency()
        s.produced = sum(r["msgs"] for r in prod)
        s.missing = max(0, s.produced - msgs)
    return s


# =======================================================================================================
# CLI
# =======================================================================================================
class _Parser(argparse.ArgumentParser):
    def error(self, message):                 # exit 2 with one line
        self.exit(2, f"{self.prog}: error: {message} (see {PROG} -h)\n")


def _int_arg(text: str) -> int:
    try:
        return int(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None


def _float_arg(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"not a finite number: {text!r}")
    return v


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description="Load generator for RocketMQ 4.x brokers: produce, consume, end-to-end.",
                epilog="Latencies are in microseconds. Trace records: mq/trace.py. See perf/README.md.")
    p.add_argument("mode", choices=MODES, help="produce | consume | e2e (both at once)")
    p.add_argument("-n", "--namesrv", "--namesrvAddr", metavar="ADDR",
                   help="name server address(es) host:port[;host:port] (default $NAMESRV_ADDR)")
    p.add_argument("--broker", metavar="HOST:PORT", help="talk to this broker only, without a name server")
    p.add_argument("-t", "--topic", default=Options.topic, help=f"topic (default {Options.topic})")
    p.add_argument("--queues", type=_int_arg, metavar="N", help=f"queues of a topic made by --create-topic (default "
                   f"{DEFAULT_QUEUES}); of an existing topic, use only queue ids below this")
    p.add_argument("--create-topic", action="store_true", help="create the topic on the masters if it is missing")
    p.add_argument("-c", "--cluster", help="with --create-topic: only this cluster's masters")
    p.add_argument("-s", "--size", dest="size_bytes", type=_int_arg, default=Options.size_bytes, metavar="BYTES",
                   help="message body bytes (default 1024)")
    p.add_argument("-b", "--batch", type=_int_arg, default=1, metavar="N",
                   help="messages per send; > 1 uses SEND_BATCH_MESSAGE (default 1)")
    p.add_argument("--pull-batch", type=_int_arg, default=Options.pull_batch, metavar="N",
                   help="maxMsgNums per pull (default 32)")
    p.add_argument("-p", "--procs", type=_int_arg, default=1, metavar="P",
                   help="worker processes (e2e: this many producers and as many consumers) (default 1)")
    p.add_argument("--conns", type=_int_arg, default=1, metavar="C",
                   help="connections per broker per process (default 1)")
    p.add_argument("-k", "--in-flight", type=_int_arg, default=1, metavar="K",
                   help="send requests outstanding per connection (default 1)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--count", type=_int_arg, metavar="N", help="messages in all (produce: to send; consume: to read)")
    g.add_argument("-d", "--duration", dest="duration_s", type=_float_arg, metavar="S",
                   help=f"seconds to run (produce/e2e default {DEFAULT_DURATION_S:g}; consume default: "
                        f"drain the backlog)")
    p.add_argument("-g", "--group", default=Options.group, metavar="G", help="consumer group (default mqperf_consumer)")
    p.add_argument("--trace", dest="trace_dir", metavar="DIR",
                   help="write one trace record per message under this directory")
    p.add_argument("--run-id", metavar="ID", help="run id in the trace records (default <mode>-<time>-<pid>)")
    p.add_argument("--progress-interval", dest="progress_interval_s", type=_float_arg, default=1.0, metavar="S",
                   help="seconds between progress lines on stderr; 0 for none (default 1)")
    p.add_argument("--timeout", dest="timeout_s", type=_float_arg, default=Options.timeout_s, metavar="S",
                   help="seconds before a request counts as failed (default 10)")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    return p


def options_from_args(args) -> Options:
    fields = {f.name for f in dataclasses.fields(Options)}
    o = Options(**{k: v for k, v in vars(args).items() if k in fields})
    if o.namesrv is None and o.broker is None:
        o.namesrv = os.environ.get("NAMESRV_ADDR") or None
    return o


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    o = options_from_args(args)
    try:
        validate(o)
    except OptionsError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    try:
        summary = run(o, progress=sys.stderr)
    except MQPerfError as e:
        print(f"{PROG} {o.mode}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    print(json.dumps(summary.as_json()) if args.json else summary.text(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
