"""The unsent-answer caps of RemotingServer (mq/remoting/server.py, "Bounds"), in process on
127.0.0.1, on uvloop and on asyncio's own loop: the server runs in a thread of its own, the
clients are blocking raw sockets that pipeline requests whose answers are ANSWER_BYTES each.

What it proves:
  * a connection whose unsent answers pass UNSENT_BYTES_PER_CONNECTION_MAX stops being read
    within its read, before the next frame is handled: of REQUESTS pipelined in one write, only
    about what the cap and the kernel's buffers hold are handled, the rest wait unread;
  * the same holds for answers built by Tasks (a handler that returns a coroutine): requests
    in flight wait for room before they build their answer;
  * over a process budget (UnsentBudget), connections with unsent answers stop being read
    until theirs left: the total stays near the budget, while an idle connection and one
    whose client reads are answered as usual;
  * when the clients read, every request has exactly one answer, its own (opaque and body),
    in order for answers given inside the read;
  * a client that goes away without reading, or reads nothing for the idle timeout (even with
    requests in flight waiting for room), takes its share of the budget with it."""
from __future__ import annotations

import asyncio
import itertools
import socket
import threading
import time

import pytest

from mq.cluster import wait_for
from mq.remoting import RemotingServer, make_response
from mq.remoting.server import (UNSENT_BYTES_FLUSH_MAX, UNSENT_BYTES_FLUSH_MIN, UNSENT_BYTES_PER_CONNECTION_MAX,
                                UnsentBudget)
from mq.wire.remoting import RemotingCommand, decode_frame_payload, encode_frame, frame_payload_size

MIB = 1024 * 1024
ANSWER_BYTES = 256 * 1024          # a pull's answer (maxTransferBytesOnMessageInMemory)
REQUESTS = 200                     # pipelined in one write: 50 MiB of answers
RCVBUF_BYTES = 64 * 1024           # the clients' receive buffers (the kernel doubles it)
BIG, BIG_TASK, PING = 40, 41, 30
TIMEOUT_S = 10.0

_opaque = itertools.count(1)

try:
    import uvloop
    LOOPS = ["uvloop", "asyncio"]
except ImportError:                # pragma: no cover - uvloop is a dependency
    LOOPS = ["asyncio"]


def kernel_bytes_max() -> int:
    """What loopback TCP can hold for one connection beyond our buffers: the sender's send
    buffer and the receiver's receive buffer at their largest (net.ipv4.tcp_wmem, RCVBUF_BYTES)."""
    with open("/proc/sys/net/ipv4/tcp_wmem") as f:
        wmem_max = int(f.read().split()[2])
    return wmem_max + 2 * RCVBUF_BYTES


class ServerThread:
    """A RemotingServer on its own loop in a thread; it counts the requests it handled."""

    def __init__(self, loop_name: str, budget: UnsentBudget | None = None, idle_timeout_s: float | None = None):
        self.loop = uvloop.new_event_loop() if loop_name == "uvloop" else asyncio.new_event_loop()
        self.handled = {BIG: 0, BIG_TASK: 0, PING: 0}
        self.conns = []
        self.thread = threading.Thread(target=self.loop.run_forever, name="caps-server", daemon=True)
        self.thread.start()
        self.server = RemotingServer("caps-test", {BIG: self._big, BIG_TASK: self._big_task, PING: self._ping},
                                     idle_timeout_s=idle_timeout_s, budget=budget or UnsentBudget())
        self.port = self.run(self.server.start("127.0.0.1", 0))

    def run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(TIMEOUT_S)

    def at(self, fn):
        """fn() run on the server's loop (its state is the loop's)."""
        async def call():
            return fn()
        return self.run(call())

    def close(self) -> None:
        self.run(self.server.stop(grace_s=1))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(TIMEOUT_S)
        self.loop.close()

    def _answer(self, conn, cmd):
        if conn not in self.conns:
            self.conns.append(conn)
        self.handled[cmd.code] += 1
        return make_response(cmd, body=cmd.opaque.to_bytes(4, "big") * (ANSWER_BYTES // 4))

    def _big(self, conn, cmd):
        return self._answer(conn, cmd)

    def _big_task(self, conn, cmd):
        async def answer():
            return self._answer(conn, cmd)     # built in the Task's first step, as the admin handlers do
        return answer()

    def _ping(self, conn, cmd):
        self.handled[PING] += 1
        return make_response(cmd)

    def unsent(self) -> list[int]:
        """Each connection's answers not yet taken by the kernel (queued here or in its transport)."""
        return self.at(lambda: [c._out_bytes + (0 if c.closed else c.transport.get_write_buffer_size())
                                for c in self.conns])


@pytest.fixture(params=LOOPS)
def server(request):
    servers = []

    def make(budget=None, idle_timeout_s=None):
        s = ServerThread(request.param, budget, idle_timeout_s)
        servers.append(s)
        return s
    yield make
    for s in servers:
        s.close()


class Client:
    """A blocking connection that pipelines requests and reads their answers when told to."""

    def __init__(self, port: int, rcvbuf_bytes: int = RCVBUF_BYTES):
        self.sock = socket.socket()
        if rcvbuf_bytes:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf_bytes)
        self.sock.settimeout(TIMEOUT_S)
        self.sock.connect(("127.0.0.1", port))
        self.sent: list[int] = []
        self._buf = bytearray()

    def pipeline(self, code: int, n: int) -> None:
        frames = []
        for _ in range(n):
            opaque = next(_opaque)
            self.sent.append(opaque)
            frames.append(encode_frame(RemotingCommand(code=code, opaque=opaque)))
        self.sock.sendall(b"".join(frames))

    def read(self) -> RemotingCommand:
        need = 4
        while True:
            if len(self._buf) >= 4:
                need = 4 + frame_payload_size(bytes(self._buf[:4]))
                if len(self._buf) >= need:
                    break
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise EOFError("closed")
            self._buf += chunk
        cmd = decode_frame_payload(bytes(self._buf[4:need]))
        del self._buf[:need]
        return cmd

    def call(self, code: int) -> RemotingCommand:
        self.pipeline(code, 1)
        resp = self.read()
        assert resp.opaque == self.sent[-1]
        return resp

    def read_all(self, in_order: bool) -> None:
        """One answer per request sent, each its own (opaque, and a body made of it)."""
        got = []
        for _ in self.sent:
            resp = self.read()
            assert resp.code == 0 and resp.body == resp.opaque.to_bytes(4, "big") * (ANSWER_BYTES // 4)
            got.append(resp.opaque)
        assert (got if in_order else sorted(got)) == self.sent
        assert not self._buf

    def close(self) -> None:
        self.sock.close()


def settle(what, value):
    """Waits until value() is the same for 0.5 s; returns it."""
    seen = []

    def still():
        seen.append(value())
        return len(seen) >= 6 and all(v == seen[-1] for v in seen[-6:])
    wait_for(still, TIMEOUT_S, interval_s=0.1, what=what)
    return seen[-1]


@pytest.mark.parametrize("code", [BIG, BIG_TASK])
def test_a_connection_that_does_not_read_is_paused_within_its_read(server, code):
    """REQUESTS pipelined in one write, never read: reading stops once the cap is passed (the
    handled count is what the cap and the kernel hold, not REQUESTS); then every answer comes."""
    srv = server()
    client = Client(srv.port)
    client.pipeline(code, REQUESTS)
    handled = settle("the server to stop answering", lambda: srv.handled[code])
    unsent = srv.unsent()[0]
    bound = UNSENT_BYTES_PER_CONNECTION_MAX + UNSENT_BYTES_FLUSH_MAX + kernel_bytes_max()
    assert 0 < handled * ANSWER_BYTES <= bound + ANSWER_BYTES, (handled, bound)
    assert handled < REQUESTS
    assert UNSENT_BYTES_PER_CONNECTION_MAX - UNSENT_BYTES_FLUSH_MAX < unsent \
        <= UNSENT_BYTES_PER_CONNECTION_MAX + UNSENT_BYTES_FLUSH_MAX + ANSWER_BYTES, unsent
    client.read_all(in_order=code == BIG)
    assert srv.handled[code] == REQUESTS
    client.close()


def test_over_the_process_budget_only_connections_with_unsent_answers_wait(server):
    """Eight connections that do not read, under a budget of 8 MiB (their caps alone would let
    them hold 32 MiB): the total stays near the budget; an idle connection is answered, and a
    client that reads its answers gets all of them; finally everybody reads everything."""
    budget = UnsentBudget(8 * MIB)
    srv = server(budget)
    idle = Client(srv.port, rcvbuf_bytes=0)
    stuck = [Client(srv.port) for _ in range(8)]
    for c in stuck:
        c.pipeline(BIG, REQUESTS // 4)
    settle("the server to stop answering", lambda: srv.handled[BIG])
    total = sum(srv.unsent())
    slack = len(stuck) * (UNSENT_BYTES_FLUSH_MIN + ANSWER_BYTES) + UNSENT_BYTES_FLUSH_MAX
    assert budget.max_bytes < total <= budget.max_bytes + slack, (total, budget.max_bytes + slack)
    assert srv.handled[BIG] < len(stuck) * REQUESTS // 4

    assert idle.call(PING).code == 0
    reader = Client(srv.port)
    t0 = time.monotonic()
    for _ in range(20):
        reader.pipeline(BIG, 5)
        for _ in range(5):
            assert reader.read().code == 0
    assert time.monotonic() - t0 < TIMEOUT_S
    assert sum(srv.unsent()) <= budget.max_bytes + slack

    for c in stuck:
        c.read_all(in_order=True)
    assert srv.handled[BIG] == len(stuck) * REQUESTS // 4 + 100
    wait_for(lambda: srv.at(budget.over_max) is False, TIMEOUT_S, what="the budget to drain")
    for c in [idle, reader, *stuck]:
        c.close()


def test_budget_notes_shares():
    """UnsentBudget's arithmetic: shares replace each other, holders are those with a share."""
    class Conn:
        _unsent_counted = 0
    budget, a, b = UnsentBudget(100), Conn(), Conn()
    budget.note(a, 70)
    budget.note(b, 50)
    assert (budget.total_bytes, budget.holders) == (120, {a, b})
    budget.note(a, 10)
    budget.note(b, 0)
    assert (budget.total_bytes, budget.holders) == (10, {a})
    assert budget.room_bytes == UNSENT_BYTES_FLUSH_MIN         # 90 left, but at least FLUSH_MIN a read
    budget.note(a, 0)
    assert (budget.total_bytes, budget.holders, budget.room_bytes) == (0, set(), UNSENT_BYTES_FLUSH_MIN)
    assert UnsentBudget().room_bytes == UNSENT_BYTES_FLUSH_MAX


@pytest.mark.parametrize("code", [BIG, BIG_TASK])
def test_a_client_that_leaves_without_reading_takes_its_share(server, code):
    """Clients that pipeline, never read and close: their connections end, the budget is 0 again."""
    budget = UnsentBudget(2 * MIB)
    srv = server(budget)
    clients = [Client(srv.port) for _ in range(4)]
    for c in clients:
        c.pipeline(code, REQUESTS // 4)
    settle("the server to stop answering", lambda: srv.handled[code])
    assert srv.at(lambda: budget.total_bytes) > budget.max_bytes
    for c in clients:
        c.close()
    wait_for(lambda: srv.at(lambda: (budget.total_bytes, len(budget.holders), len(srv.server._conns))) == (0, 0, 0),
             TIMEOUT_S, what="the connections closed and their shares gone")
    assert srv.at(lambda: len(srv.server._tasks)) == 0


@pytest.mark.parametrize("code", [BIG, BIG_TASK])
def test_a_client_that_reads_nothing_for_the_idle_timeout_is_dropped(server, code):
    """A connection paused because its client reads nothing is idle once nothing moved for
    idle_timeout_s, even with requests waiting for room in flight: it is closed and what it left
    unread is dropped (not kept until the client reads), so its share of the budget goes."""
    budget = UnsentBudget()
    srv = server(budget, idle_timeout_s=0.5)
    client = Client(srv.port)
    client.pipeline(code, REQUESTS)
    wait_for(lambda: srv.server.idle_closes == 1, TIMEOUT_S, what="the idle close")
    wait_for(lambda: srv.at(lambda: (budget.total_bytes, len(srv.server._conns), len(srv.server._tasks))) == (0, 0, 0),
             TIMEOUT_S, what="the connection gone with its share and its waiting requests")
    assert srv.handled[code] < REQUESTS
    client.close()
