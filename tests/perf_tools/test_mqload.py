"""Tests for the native load client (perf/mqload.c, built and run through perf/mqload.py).

Against a real name server and broker (mq/cluster.py) on loopback: a run's claims are checked
against the broker's queues (GET_MAX_OFFSET).  Against a scripted server in this process: every
request mqload sends decodes with mq.wire (the project's codec) into the SEND_MESSAGE_V2 it
should be, responses answered out of order, in other key orders and spacing, with decoy
"code"/"opaque" text in nested values, or with error codes are matched and counted, and a
silent or closing server ends the run with the requests counted as lost.  Then the exit codes
for bad arguments (2) and a closed port (3).  Each test's docstring says what it proves."""
from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import struct
import subprocess
import threading
from collections import Counter

import pytest

from mq.cluster import Broker, NameServer, wait_for
from mq.remoting import RemotingClient
from mq.wire.codes import RequestCode as R, ResponseCode as RC
from mq.wire.properties import decode_properties
from mq.wire.remoting import (LANGUAGE_CPP, RPC_RESPONSE, SERIALIZE_JSON, RemotingCommand, decode_frame_payload,
                              encode_frame)
from perf import mqload

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def binary() -> str:
    return mqload.build()


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    """A name server and one broker (4 default queues per new topic)."""
    d = str(tmp_path_factory.mktemp("mqload"))
    ns = NameServer(d)
    b = Broker(d, ns.addr, name="broker-a")
    yield b
    b.stop()
    ns.stop()


def max_offsets(addr: str, topic: str, queues: int) -> list[int]:
    async def ask():
        c = RemotingClient()
        try:
            out = []
            for q in range(queues):
                r = await c.invoke(addr, c.request(R.GET_MAX_OFFSET, {"topic": topic, "queueId": q}), 5)
                out.append(int(r.ext_fields["offset"]) if r.code == RC.SUCCESS else -1)
            return out
        finally:
            await c.close()
    return asyncio.run(ask())


def run(binary: str, *args: str, timeout_s: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run([binary, *args], capture_output=True, text=True, timeout=timeout_s)


# ---------------------------------------------------------------------------------------------------
# against the broker
# ---------------------------------------------------------------------------------------------------
def test_build_is_cached(binary, monkeypatch, tmp_path):
    """build() names the binary after the source's hash and does not rebuild an unchanged
    source; with $MQ_PERF_CACHE set it builds there, and a changed source gets a new binary."""
    assert os.access(binary, os.X_OK)
    assert re.search(r"mqload-[0-9a-f]{16}$", binary)
    mtime = os.stat(binary).st_mtime_ns
    assert mqload.build() == binary and os.stat(binary).st_mtime_ns == mtime
    monkeypatch.setenv("MQ_PERF_CACHE", str(tmp_path / "cache"))
    first = mqload.build()
    assert os.path.dirname(first) == str(tmp_path / "cache") and os.path.basename(first) == os.path.basename(binary)
    changed = tmp_path / "mqload.c"
    with open(mqload.SOURCE) as f:
        changed.write_text(f.read() + "\n/* changed */\n")
    monkeypatch.setattr(mqload, "SOURCE", str(changed))
    second = mqload.build()
    assert second != first and os.access(second, os.X_OK) and sorted(os.listdir(tmp_path / "cache")) == \
        sorted(os.path.basename(p) for p in (first, second))


def test_against_a_broker(broker):
    """4 connections x depth 4, 2000 messages of 1 KiB to a new topic (created from TBW102 by the
    first sends): every one answered SUCCESS, latencies and CPU reported, and the broker's 4
    queues hold exactly 2000 messages, 500 each (queueIds round robin)."""
    topic = "MqLoadFunctional"
    r = mqload.run_mqload(broker.addr, conns=4, n=2000, depth=4, size=1024, topic=topic, queues=4)
    assert r["exit_code"] == 0, r
    assert (r["msgs"], r["acked"], r["errors"]) == (2000, 2000, 0), r
    assert r["codes"] == {"0": 2000}, r
    assert (r["connections"], r["depth"], r["body_bytes"]) == (4, 4, 1024)
    assert 0 < r["p50_us"] <= r["p99_us"] <= r["p999_us"] <= r["max_us"]
    assert r["seconds"] > 0 and r["msgs_per_s"] == pytest.approx(2000 / r["seconds"], rel=1e-3)
    assert r["cpu_s"] >= 0
    wait_for(lambda: sum(max_offsets(broker.addr, topic, 4)) >= 2000, 10, what="messages dispatched")
    assert max_offsets(broker.addr, topic, 4) == [500, 500, 500, 500]


def test_duration_mode_against_a_broker(broker):
    """-s: sends for about that long, then waits for what is in flight; nothing is lost."""
    topic = "MqLoadDuration"
    r = mqload.run_mqload(broker.addr, conns=2, depth=2, topic=topic, seconds=0.5)
    assert r["exit_code"] == 0 and r["errors"] == 0 and r["msgs"] == r["acked"] > 0, r
    assert 0.5 <= r["seconds"] < 3, r
    wait_for(lambda: sum(max_offsets(broker.addr, topic, 4)) >= r["acked"], 10, what="messages dispatched")
    assert sum(max_offsets(broker.addr, topic, 4)) == r["acked"]


# ---------------------------------------------------------------------------------------------------
# against a scripted server
# ---------------------------------------------------------------------------------------------------
class ScriptedServer:
    """Accepts connections and decodes every frame with mq.wire.  `answer(cmd, index)` -> None
    (no answer) or (code, style); style "wire" = encode_frame, "loose" = a hand-written header
    (opaque first, spaces, decoys).  Requests read together are answered in reverse order, after
    a server-initiated request the client must ignore.  `close_after` closes every connection
    after that many requests."""

    def __init__(self, answer, close_after: int | None = None):
        self.answer = answer
        self.close_after = close_after
        self.requests: list[RemotingCommand] = []
        self.lock = threading.Lock()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.threads: list[threading.Thread] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            t.start()
            self.threads.append(t)

    def _serve(self, conn: socket.socket) -> None:
        buf = b""
        seen = 0
        with conn:
            while True:
                try:
                    data = conn.recv(1 << 16)
                except OSError:
                    return
                if not data:
                    return
                buf += data
                batch = []
                while len(buf) >= 4 and len(buf) >= 4 + struct.unpack_from(">I", buf)[0]:
                    n = struct.unpack_from(">I", buf)[0]
                    cmd = decode_frame_payload(buf[4:4 + n])
                    buf = buf[4 + n:]
                    with self.lock:
                        index = len(self.requests)
                        self.requests.append(cmd)
                    batch.append((cmd, index))
                    seen += 1
                    if self.close_after is not None and seen >= self.close_after:
                        conn.shutdown(socket.SHUT_RDWR)
                        return
                if not batch:
                    continue
                out = [encode_frame(RemotingCommand(code=40, opaque=999_999, flag=0, ext_fields={"a": "b"}))]
                for cmd, index in reversed(batch):
                    plan = self.answer(cmd, index)
                    if plan is not None:
                        out.append(self._response(cmd, *plan))
                conn.sendall(b"".join(out))

    @staticmethod
    def _response(cmd: RemotingCommand, code: int, style: str) -> bytes:
        ext = {"msgId": "7F000001", "queueId": cmd.ext_fields["e"], "decoy": '"code":77,"opaque":1'}
        if style == "wire":
            return encode_frame(RemotingCommand(code=code, opaque=cmd.opaque, flag=RPC_RESPONSE, remark="r",
                                                ext_fields=ext))
        header = json.dumps({"opaque": cmd.opaque, "extFields": {**ext, "code": "5", "nested": {"opaque": [1, 2]}},
                             "remark": 'code":3 "opaque": 4', "flag": str(RPC_RESPONSE),
                             "code": code, "language": "JAVA"}, indent=1).encode()
        return struct.pack(">II", 4 + len(header), len(header)) + header

    def close(self) -> None:
        # shutdown wakes the accept thread (a close alone leaves it blocked in accept() for good)
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


def test_requests_decode_and_responses_are_matched(binary):
    """Every request decodes with mq.wire as SEND_MESSAGE_V2 (310) with a JSON header: language
    CPP, version 409, producer group, topic, TBW102, 4 default queues, queueIds round robin over
    0..3, bornTimestamp, a 1 KiB body, and properties UNIQ_KEY (32 uppercase hex, unique) and
    WAIT=true; opaques are unique among the requests of a connection in flight.  The server
    answers reversed, half in a hand-written header (other key order, spaces, the "code" and
    "opaque" keys inside nested values and the remark as decoys, a string flag), every 7th with
    code 14, after an unsolicited server request: mqload matches every response, ignores the
    request, counts 14 as errors and exits 1."""
    def answer(cmd, index):
        return (14 if index % 7 == 6 else 0), ("wire" if index % 2 else "loose")

    server = ScriptedServer(answer)
    try:
        done = run(binary, "-p", str(server.port), "-c", "3", "-P", "4", "-n", "700", "-d", "1024",
                   "-t", "TopicX", "-g", "GroupY", "-q", "4")
    finally:
        server.close()
    assert done.returncode == 1, done.stderr
    r = json.loads(done.stdout)
    errors = sum(1 for i in range(700) if i % 7 == 6)
    assert (r["msgs"], r["acked"], r["errors"]) == (700, 700 - errors, errors), r
    assert r["codes"] == {"0": 700 - errors, "14": errors}, r
    reqs = server.requests
    assert len(reqs) == 700
    uniq = set()
    for cmd in reqs:
        assert (cmd.code, cmd.language, cmd.version, cmd.flag, cmd.serialize_type) == \
            (R.SEND_MESSAGE_V2, LANGUAGE_CPP, 409, 0, SERIALIZE_JSON)
        ext = cmd.ext_fields
        assert (ext["a"], ext["b"], ext["c"], ext["d"], ext["f"], ext["h"], ext["j"], ext["k"], ext["m"]) == \
            ("GroupY", "TopicX", "TBW102", "4", "0", "0", "0", "false", "false")
        assert int(ext["g"]) > 1_600_000_000_000
        props = decode_properties(ext["i"])
        assert set(props) == {"UNIQ_KEY", "WAIT"} and props["WAIT"] == "true"
        assert re.fullmatch(r"[0-9A-F]{32}", props["UNIQ_KEY"]), props
        uniq.add(props["UNIQ_KEY"])
        assert len(cmd.body) == 1024
    assert len(uniq) == 700
    assert Counter(int(c.ext_fields["e"]) for c in reqs) == {0: 175, 1: 175, 2: 175, 3: 175}


def test_many_queues_zero_padded(binary):
    """With -q 12 the queueId is written at a fixed width (zero-padded inside its string), and
    decodes to every id 0..11 equally often."""
    server = ScriptedServer(lambda cmd, index: (0, "wire"))
    try:
        done = run(binary, "-p", str(server.port), "-c", "2", "-P", "3", "-n", "120", "-q", "12", "-d", "10")
    finally:
        server.close()
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["errors"] == 0
    assert Counter(int(c.ext_fields["e"]) for c in server.requests) == {q: 10 for q in range(12)}
    assert {c.ext_fields["e"] for c in server.requests} >= {"00", "11"}


def test_silent_server_times_out(binary):
    """No responses at all: after -T seconds mqload gives up, counts what was in flight as
    "timeout" errors, still prints its JSON line, and exits 1."""
    server = ScriptedServer(lambda cmd, index: None)
    try:
        done = run(binary, "-p", str(server.port), "-c", "2", "-P", "2", "-n", "100", "-T", "0.3")
    finally:
        server.close()
    assert done.returncode == 1
    r = json.loads(done.stdout)
    assert (r["msgs"], r["errors"], r["codes"]) == (0, 4, {"timeout": 4}), r
    assert "no response" in done.stderr


def test_closing_server_loses_requests(binary):
    """A server that closes each connection after 5 requests (answering none from the last read):
    the requests in flight are counted as "closed" errors and mqload ends with exit 1."""
    server = ScriptedServer(lambda cmd, index: (0, "wire"), close_after=5)
    try:
        done = run(binary, "-p", str(server.port), "-c", "2", "-P", "1", "-n", "100", "-T", "5")
    finally:
        server.close()
    assert done.returncode == 1, done.stderr
    r = json.loads(done.stdout)
    assert r["codes"].get("closed") == 2 and r["errors"] == 2 and r["acked"] == 8, r
    assert "connection closed" in done.stderr


# ---------------------------------------------------------------------------------------------------
# exit codes
# ---------------------------------------------------------------------------------------------------
BAD_ARGS = [["-c", "0"], ["-P", "-1"], ["-n", "abc"], ["-d", "0"], ["-q", "0"], ["-s", "x"], ["-p", "70000"],
            ["-t", "bad topic"], ["-g", 'quote"'], ["-x"], ["-c"], ["positional"]]


@pytest.mark.parametrize("args", BAD_ARGS, ids=" ".join)
def test_bad_arguments_exit_2(binary, args):
    """Bad arguments: usage on stderr with what is wrong, nothing on stdout, exit 2 (before any
    connection is tried: the port here is closed, which would be exit 3)."""
    done = run(binary, "-p", "1", *args)
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "usage: mqload" in done.stderr and done.stdout == ""


def test_closed_port_exits_3(binary):
    """Nothing listening: a clear message naming the address, nothing on stdout, exit 3; and
    run_mqload raises MqloadError with that message."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    done = run(binary, "-p", str(port), "-c", "2", "-n", "10")
    assert done.returncode == 3
    assert f"cannot connect to 127.0.0.1:{port}" in done.stderr and done.stdout == ""
    with pytest.raises(mqload.MqloadError, match="exited 3: mqload: cannot connect"):
        mqload.run_mqload(f"127.0.0.1:{port}", conns=1, n=10)


def test_no_compiler_is_named(monkeypatch, tmp_path):
    """No cached binary and no compiler: MqloadError naming the missing compiler."""
    monkeypatch.setenv("MQ_PERF_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", "no-such-cc")
    with pytest.raises(mqload.MqloadError, match="needs a C compiler.*no-such-cc"):
        mqload.build()
