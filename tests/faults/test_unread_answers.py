"""Clients that never read their answers (RELIABILITY.md "Bad input": memory is bounded per
connection and per process; a client that never reads is paused, not buffered without end).
A real mqnamesrv and mqbroker with one io worker on loopback (so every connection below shares
its process budget: the well-behaved ones are served by the worker the hostile ones load),
talked to through raw sockets.

With IDLE_CONNECTIONS idle connections open and HOSTILE_CLIENTS clients that each pipeline
PULLS_PER_CLIENT pulls of a topic holding data (answers of ~256 KiB) and never read, it proves
the following.  Half the clients pull for GROUP, which the workers soon have cached (answers
built inside the read); the other half each for a group of its own that no worker knows yet,
so all its pulls wait in Tasks for one metadata fetch and wake together (answers built after
an await, many connections in one loop iteration: before the process budget bounded those,
they queued a connection's whole cap each and a worker grew by ~200 MiB):
  * each io worker's anonymous memory grows by less than RSS_ANON_GROWTH_MAX_BYTES, a bound
    derived from UNSENT_BYTES_PER_PROCESS_MAX (without the caps every answer of every read
    request stays in the worker: PULLS_PER_CLIENT x 256 KiB per client).  RssAnon, not RSS:
    the CommitLog's pages are shared page cache, the answers are copies;
  * meanwhile idle connections are answered at once, and a well-behaved client on a new
    connection sends messages and pulls them back;
  * when the clients finally read, every request has exactly one answer, complete and its own:
    its opaque, and ANSWER_RECORDS records of the queue and offsets it asked for, intact."""
from __future__ import annotations

import fcntl
import itertools
import resource
import socket
import struct
import termios
import time

import pytest

from mq.cluster import Broker, NameServer, wait_for
from mq.remoting.server import UNSENT_BYTES_FLUSH_MAX, UNSENT_BYTES_FLUSH_MIN, UNSENT_BYTES_PER_PROCESS_MAX
from mq.wire.commitlog import MESSAGE_MAGIC_CODE, parse_record
from mq.wire.remoting import RemotingCommand, decode_frame_payload, encode_frame, frame_payload_size
from mq.wire.headers import send_v2

MIB = 1024 * 1024
TOPIC = "UnreadAnswersTopic"
GROUP = "UnreadAnswersCG"
QUEUES = 4
MSGS_PER_QUEUE = 64
MSG_BODY_BYTES = 7900             # 32 records (~8.1 KB each) fit maxTransferBytesOnMessageInMemory (256 KiB)
ANSWER_RECORDS = 32               # maxMsgNums of every hostile pull: each answer is ~256 KiB
IDLE_CONNECTIONS = 1000
HOSTILE_CLIENTS = 50
PULLS_PER_CLIENT = 120            # one write of ~40 KB of requests: ~30 MiB of answers per client
HOSTILE_RCVBUF_BYTES = 64 * 1024  # the hostile clients' receive buffers (the kernel doubles it)
IDLE_PROBES = 20                  # idle connections that make one request while the hostile ones wait
IO_TIMEOUT_S = 10.0
ANSWER_BYTES = 264 * 1024         # one pull's frame, with its header
CONNECTION_BYTES = 8 * 1024       # what an open connection costs the worker (protocol, transport, buffers)
ALLOCATOR_SLACK_BYTES = 16 * MIB
# the module docstring's bound: the process budget, plus per hostile connection what the budget
# does not count - the part the kernel already took of a write it took only part of (uvloop keeps
# the whole write; a write is at most UNSENT_BYTES_FLUSH_MAX and one answer) and, while not yet
# paused, UNSENT_BYTES_FLUSH_MIN and one answer - plus every connection's own cost
RSS_ANON_GROWTH_MAX_BYTES = (UNSENT_BYTES_PER_PROCESS_MAX
                             + HOSTILE_CLIENTS * (UNSENT_BYTES_FLUSH_MAX + UNSENT_BYTES_FLUSH_MIN + 2 * ANSWER_BYTES)
                             + (IDLE_CONNECTIONS + HOSTILE_CLIENTS) * CONNECTION_BYTES + ALLOCATOR_SLACK_BYTES)
NOFILE_NEEDED = IDLE_CONNECTIONS + HOSTILE_CLIENTS + 256

_opaque = itertools.count(1)
_RECORD_HEAD = struct.Struct(">iIiiiq")     # TOTALSIZE MAGIC BODYCRC QUEUEID FLAG QUEUEOFFSET


# ---- raw protocol ---------------------------------------------------------------------------------

def request(code: int, ext: dict, body: bytes = b"") -> tuple[int, bytes]:
    """(opaque, frame) of a request."""
    opaque = next(_opaque)
    return opaque, encode_frame(RemotingCommand(code=code, version=409, opaque=opaque, ext_fields=ext, body=body))


def read_frame(sock: socket.socket, buf: bytearray) -> RemotingCommand:
    """The next frame on `sock` (blocking); `buf` keeps bytes read past it."""
    need = 4
    while True:
        if len(buf) >= 4:
            need = 4 + frame_payload_size(bytes(buf[:4]))
            if len(buf) >= need:
                break
        chunk = sock.recv(max(need - len(buf), 1 << 20))
        if not chunk:
            raise EOFError(f"connection closed with {len(buf)} bytes of a frame read")
        buf += chunk
    cmd = decode_frame_payload(bytes(buf[4:need]))
    del buf[:need]
    return cmd


def call(sock: socket.socket, code: int, ext: dict, body: bytes = b"") -> RemotingCommand:
    opaque, frame = request(code, ext, body)
    sock.sendall(frame)
    resp = read_frame(sock, bytearray())
    assert resp.is_response and resp.opaque == opaque, resp
    return resp


def connect(port: int, rcvbuf_bytes: int = 0) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf_bytes:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf_bytes)   # before connect: fixes the window
    sock.settimeout(IO_TIMEOUT_S)
    sock.connect(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def pull_ext(queue_id: int, offset: int, max_msgs: int = ANSWER_RECORDS, suspend_ms: int = 0,
             group: str = GROUP) -> dict:
    return {"consumerGroup": group, "topic": TOPIC, "queueId": str(queue_id), "queueOffset": str(offset),
            "maxMsgNums": str(max_msgs), "sysFlag": str(4 | (2 if suspend_ms else 0)), "commitOffset": "0",
            "suspendTimeoutMillis": str(suspend_ms), "subscription": "*", "subVersion": "0"}


def send_ext(queue_id: int) -> dict:
    """SendMessageRequestHeaderV2 (short names)."""
    return send_v2(producerGroup="UnreadAnswersPG", topic=TOPIC, defaultTopic="TBW102",
                   defaultTopicQueueNums=str(QUEUES), queueId=str(queue_id), sysFlag="0",
                   bornTimestamp=str(int(time.time() * 1000)), flag="0", properties="")


def unread_bytes(sock: socket.socket) -> int:
    """Bytes the kernel holds for `sock` that it has not read (FIONREAD)."""
    return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0]


def rss_anon_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no RssAnon in /proc/{pid}/status")


def records_of(body: bytes) -> list[tuple[int, int]]:
    """(queueId, queueOffset) of each record of a pull's body, which must hold whole records only;
    the first and the last are parsed fully, with their CRC."""
    out, pos = [], 0
    while pos < len(body):
        total, magic, _, queue_id, _, queue_offset = _RECORD_HEAD.unpack_from(body, pos)
        assert magic == MESSAGE_MAGIC_CODE and total > 0, (pos, total, magic)
        out.append((queue_id, queue_offset, pos))
        pos += total
    assert pos == len(body), f"the last record is cut: {pos} != {len(body)}"
    for _, _, at in (out[0], out[-1]):
        rec = parse_record(body, at, check_crc=True)
        assert rec.topic == TOPIC and len(rec.body) == MSG_BODY_BYTES
    return [(q, o) for q, o, _ in out]


# ---- the cluster ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def nofile():
    """Room for NOFILE_NEEDED descriptors in this process and the broker it starts (which inherits
    the limit): the soft limit raised to the hard one if need be, restored afterwards."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < NOFILE_NEEDED:
        if hard != resource.RLIM_INFINITY and hard < NOFILE_NEEDED:
            pytest.skip(f"needs {NOFILE_NEEDED} open files, the hard limit (ulimit -Hn) is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else NOFILE_NEEDED,
                                                    hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.fixture(scope="module")
def cluster(nofile, tmp_path_factory):
    work = str(tmp_path_factory.mktemp("unread"))
    ns = NameServer(work)
    broker = Broker(work, ns.addr, autoCreateTopicEnable="false", sendMessageThreadPoolNums=1)
    admin = connect(broker.port)
    resp = call(admin, 17, {"topic": TOPIC, "readQueueNums": str(QUEUES), "writeQueueNums": str(QUEUES),
                            "perm": "6"})
    assert resp.code == 0, (resp.code, resp.remark)
    body = b"u" * MSG_BODY_BYTES
    for i in range(QUEUES * MSGS_PER_QUEUE):
        resp = call(admin, 310, send_ext(i % QUEUES), body)
        assert resp.code == 0, (resp.code, resp.remark)
    wait_for(lambda: all(int(call(admin, 30, {"topic": TOPIC, "queueId": str(q)}).ext_fields["offset"])
                         == MSGS_PER_QUEUE for q in range(QUEUES)), 10, what="every queue dispatched")
    admin.close()
    yield broker
    assert broker.stop() == 0, broker.proc.output()[-5000:]
    assert ns.stop() == 0, ns.proc.output()[-5000:]


# ---- the test -----------------------------------------------------------------------------------------

def test_clients_that_never_read_are_paused_not_buffered(cluster):
    """See the module docstring."""
    broker = cluster
    workers = {name: pids[0] for name, pids in broker.processes().items() if name.startswith("io-")}
    assert len(workers) == 1, workers
    base = {name: rss_anon_bytes(pid) for name, pid in workers.items()}

    idle = [connect(broker.port) for _ in range(IDLE_CONNECTIONS)]
    hostile = []          # (socket, {opaque: (queueId, queueOffset)})
    try:
        for i in range(HOSTILE_CLIENTS):
            sock = connect(broker.port, HOSTILE_RCVBUF_BYTES)
            asked, frames = {}, []
            group = GROUP if i % 5 == 0 else f"{GROUP}-{i}"     # cached soon / unknown to every worker
            for j in range(PULLS_PER_CLIENT):
                queue_id, offset = j % QUEUES, (i * 7 + j) % (MSGS_PER_QUEUE - ANSWER_RECORDS + 1)
                opaque, frame = request(11, pull_ext(queue_id, offset, group=group))
                asked[opaque] = (queue_id, offset)
                frames.append(frame)
            sock.sendall(b"".join(frames))
            hostile.append((sock, asked))

        # the caps hold: every hostile client has answers waiting in its kernel buffer, and the
        # workers' memory stopped growing (or went past the bound: then there is nothing to wait for)
        samples = []

        def settled():
            now = {name: rss_anon_bytes(pid) - base[name] for name, pid in workers.items()}
            samples.append(now)
            if max(now.values()) > RSS_ANON_GROWTH_MAX_BYTES:
                return True
            if len(samples) < 6 or not all(unread_bytes(sock) > 0 for sock, _ in hostile):
                return False
            return all(max(s[n] for s in samples[-6:]) - min(s[n] for s in samples[-6:]) <= MIB for n in now)
        wait_for(settled, 30, interval_s=0.2, what="the io workers' memory to settle")
        growth = samples[-1]
        report = ", ".join(f"{n} +{g / MIB:.0f} MiB (from {base[n] / MIB:.0f} MiB)" for n, g in sorted(growth.items()))
        print(f"\nRssAnon growth with {IDLE_CONNECTIONS} idle connections and {HOSTILE_CLIENTS} clients that do "
              f"not read: {report}; bound {RSS_ANON_GROWTH_MAX_BYTES / MIB:.0f} MiB")
        assert max(growth.values()) <= RSS_ANON_GROWTH_MAX_BYTES, report

        # other connections are unaffected: idle ones are answered at once...
        for sock in idle[::IDLE_CONNECTIONS // IDLE_PROBES]:
            resp = call(sock, 30, {"topic": TOPIC, "queueId": "0"})
            assert resp.code == 0 and int(resp.ext_fields["offset"]) >= MSGS_PER_QUEUE, (resp.code, resp.remark)
        # ...and a well-behaved client sends and pulls back what it sent
        good = connect(broker.port)
        sent = {}
        for k in range(5):
            body = (b"well-behaved-%d-" % k).ljust(MSG_BODY_BYTES, b".")
            resp = call(good, 310, send_ext(0), body)
            assert resp.code == 0, (resp.code, resp.remark)
            sent[int(resp.ext_fields["queueOffset"])] = body
        first = min(sent)
        got = {}
        deadline = time.monotonic() + IO_TIMEOUT_S
        while len(got) < len(sent):
            resp = call(good, 11, pull_ext(0, first + len(got), suspend_ms=1000))
            assert resp.code in (0, 19) and time.monotonic() < deadline, (resp.code, resp.remark)
            if resp.code == 0:
                for q, o in records_of_any(resp.body, got):
                    assert q == 0
        assert got == sent
        good.close()
        growth_after = {n: rss_anon_bytes(pid) - base[n] for n, pid in workers.items()}
        assert max(growth_after.values()) <= RSS_ANON_GROWTH_MAX_BYTES, growth_after

        # the hostile clients read at last: one answer per request, each complete and its own
        for sock, asked in hostile:
            buf = bytearray()
            answered = set()
            for _ in range(PULLS_PER_CLIENT):
                resp = read_frame(sock, buf)
                assert resp.is_response and resp.opaque in asked and resp.opaque not in answered, resp.opaque
                answered.add(resp.opaque)
                assert resp.code == 0, (resp.code, resp.remark)
                queue_id, offset = asked[resp.opaque]
                assert records_of(resp.body) == [(queue_id, offset + k) for k in range(ANSWER_RECORDS)]
            assert answered == set(asked) and not buf
            sock.settimeout(0.2)
            with pytest.raises(socket.timeout):
                sock.recv(1)                 # and nothing more
    finally:
        for sock in idle:
            sock.close()
        for sock, _ in hostile:
            sock.close()


def records_of_any(body: bytes, into: dict) -> list[tuple[int, int]]:
    """(queueId, queueOffset) of each record of a pull's body; their bodies go into `into` by offset."""
    out, pos = [], 0
    while pos < len(body):
        rec = parse_record(body, pos, check_crc=True)
        into[rec.queue_offset] = bytes(rec.body)
        out.append((rec.queue_id, rec.queue_offset))
        pos += rec.total_size
    return out
