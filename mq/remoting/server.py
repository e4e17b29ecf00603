"""Asyncio remoting server: frames in, handlers by request code, responses out.

Per connection a reader loop decodes frames (mq.wire.remoting) and runs each
request as its own task, so a long-polling pull never blocks the requests
behind it on the same connection.  Rules (spec 1.5, RELIABILITY.md):
  * a framing error (length < 4 or over FRAME_SIZE_MAX, header past the
    frame, unknown serialize type, bad JSON, TLS/HTTP probe) closes that
    connection only, and is logged;
  * a response echoes the opaque, sets the response flag and uses the
    request's serialize type; a oneway request is never answered;
  * unknown code -> REQUEST_CODE_NOT_SUPPORTED; a handler exception or a
    response that cannot be encoded -> SYSTEM_ERROR with its text; all logged;
  * a TCP connection idle for idle_timeout_s (serverChannelMaxIdleTimeSeconds,
    120 s) is closed and logged: idle means no frame read, nothing written and
    no request of it in flight.  Reads count per frame, so a frame whose bytes
    take longer than that to arrive is cut too.  Connections on a unix socket
    (links between the processes of one node) are never idle-closed: they live
    as long as the processes at both ends.
Bounds: IN_FLIGHT_PER_CONNECTION_MAX requests run at once per connection;
further frames wait (TCP backpressure) rather than queueing without limit.

Tracing (optional, the broker's perfTraceEnable): with a `tracer`, each
request's frame decode is timed, `tracer.begin(cmd, t0_ns, t1_ns)` runs first
thing in the request's task and returns a times object, the server stamps its
`resp_ns` when the handler returns, and `tracer.end(times, cmd, resp, done_ns)`
runs once the response frame is encoded and queued (instants from
time.perf_counter_ns; mq.broker.tracing is the tracer).  Without one a
request pays three `is None` tests."""
from __future__ import annotations

import asyncio
import itertools
import logging
import socket
import time
from dataclasses import dataclass, field
from time import perf_counter_ns
from typing import Awaitable, Callable

from mq.wire.errors import EncodeError, WireError
from mq.wire.remoting import (RPC_ONEWAY, RPC_RESPONSE, RemotingCommand, decode_frame_payload,
                              encode_frame, frame_payload_size)

from .codes import ResponseCode

log = logging.getLogger("mq.remoting.server")

IN_FLIGHT_PER_CONNECTION_MAX = 1024
IDLE_TIMEOUT_S_DEFAULT = 120.0   # serverChannelMaxIdleTimeSeconds
IDLE_SWEEP_S_MAX = 5.0           # an idle connection is closed within idle_timeout_s + this
Handler = Callable[["Connection", RemotingCommand], Awaitable[RemotingCommand | None]]


def make_response(request: RemotingCommand, code: int = ResponseCode.SUCCESS, remark: str | None = None,
                  ext: dict | None = None, body: bytes = b"") -> RemotingCommand:
    """A response to `request`: same opaque and serialize type, response flag set."""
    return RemotingCommand(code=code, language=request.language, version=request.version,
                           opaque=request.opaque, flag=RPC_RESPONSE, remark=remark,
                           ext_fields={k: str(v).lower() if isinstance(v, bool) else str(v)
                                       for k, v in (ext or {}).items() if v is not None},
                           body=body, serialize_type=request.serialize_type)


@dataclass(eq=False)
class Connection:
    """One client connection; handlers get it to learn the peer or push requests."""
    id: int
    peer: tuple[str, int]
    writer: asyncio.StreamWriter
    server: "RemotingServer"
    closed: bool = False
    attrs: dict = field(default_factory=dict)
    idle_close: bool = True            # False for unix-socket links
    last_active_s: float = field(default_factory=time.monotonic)   # last frame read or written
    in_flight: int = 0                 # requests of this connection being handled
    _opaque: itertools.count = field(default_factory=lambda: itertools.count(1 << 24))
    _out: list = field(default_factory=list)   # frames encoded in this loop iteration, not yet written

    def write(self, cmd: RemotingCommand) -> None:
        """Queues the frame; every frame queued in one event-loop iteration goes
        out in one write (one send(2) under pipelining instead of one each)."""
        if self.closed:
            return
        self.last_active_s = time.monotonic()
        frame = encode_frame(cmd)
        if not self._out:
            asyncio.get_running_loop().call_soon(self._flush)
        self._out.append(frame)

    def _flush(self) -> None:
        if not self._out:
            return
        data = self._out[0] if len(self._out) == 1 else b"".join(self._out)
        self._out.clear()
        if self.closed:
            return
        try:
            self.writer.write(data)
        except (ConnectionError, RuntimeError) as e:
            log.debug("write to %s failed: %s", self.peer, e)
            self.closed = True

    def push_oneway(self, code: int, ext: dict | None = None, body: bytes = b"") -> None:
        """A server-initiated oneway request (e.g. NOTIFY_CONSUMER_IDS_CHANGED)."""
        self.write(RemotingCommand(code=code, opaque=next(self._opaque) & 0x7FFFFFFF, flag=RPC_ONEWAY,
                                   ext_fields={k: str(v) for k, v in (ext or {}).items()}, body=body))

    def close(self) -> None:
        self._flush()
        self.closed = True
        self.writer.close()


class RemotingServer:
    def __init__(self, name: str, handlers: dict[int, Handler] | None = None,
                 on_close: Callable[[Connection], None] | None = None,
                 idle_timeout_s: float | None = IDLE_TIMEOUT_S_DEFAULT, tracer=None):
        """idle_timeout_s: close TCP connections idle this long (see the module docstring); None never.
        tracer: times every request (see the module docstring); None does not."""
        if idle_timeout_s is not None and not idle_timeout_s > 0:
            raise ValueError(f"idle_timeout_s must be > 0 or None, not {idle_timeout_s!r}")
        self.name = name
        self.idle_timeout_s = idle_timeout_s
        self.handlers: dict[int, Handler] = dict(handlers or {})
        self.on_close = on_close
        self.tracer = tracer
        self._server: asyncio.base_events.Server | None = None
        self._conns: set[Connection] = set()
        self._ids = itertools.count(1)
        self._tasks: set[asyncio.Task] = set()
        self._idle_sweeper: asyncio.Task | None = None
        self.framing_errors = 0
        self.idle_closes = 0

    def register(self, code: int, handler: Handler) -> None:
        self.handlers[code] = handler

    async def start(self, host: str = "127.0.0.1", port: int = 0, reuse_port: bool = False,
                    sock: socket.socket | None = None) -> int:
        """Listens (on `sock` if given); returns the bound port."""
        if sock is not None:
            self._server = await asyncio.start_server(self._serve, sock=sock, limit=2 ** 16)
        else:
            self._server = await asyncio.start_server(self._serve, host, port, reuse_port=reuse_port,
                                                      reuse_address=True, limit=2 ** 16)
        if self.idle_timeout_s is not None:
            self._idle_sweeper = asyncio.create_task(self._close_idle())
        return self._server.sockets[0].getsockname()[1]

    async def stop(self, grace_s: float = 5.0) -> None:
        """Stops accepting, lets in-flight requests finish (up to grace_s), closes."""
        if self._server is not None:
            self._server.close()
        if self._idle_sweeper is not None:
            self._idle_sweeper.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=grace_s)
        for c in list(self._conns):
            c.close()
        if self._server is not None:
            try:
                await asyncio.wait_for(self._server.wait_closed(), 2)
            except asyncio.TimeoutError:
                pass

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername") or ("?", 0)
        sock = writer.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        conn = Connection(next(self._ids), (peer[0], peer[1]), writer, self)
        if sock is not None and sock.family == socket.AF_UNIX:
            conn.idle_close = False
        self._conns.add(conn)
        slots = asyncio.Semaphore(IN_FLIGHT_PER_CONNECTION_MAX)
        spawn = asyncio.get_running_loop().create_task      # per request: skips create_task's lookups
        handled = self._handled
        try:
            while True:
                try:
                    prefix = await reader.readexactly(4)
                except (asyncio.IncompleteReadError, ConnectionError):
                    break
                conn.last_active_s = time.monotonic()
                try:
                    size = frame_payload_size(prefix)
                    payload = await reader.readexactly(size)
                    conn.last_active_s = time.monotonic()
                    if self.tracer is None:
                        cmd = decode_frame_payload(payload)
                        t0_ns = t1_ns = 0
                    else:
                        t0_ns = perf_counter_ns()
                        cmd = decode_frame_payload(payload)
                        t1_ns = perf_counter_ns()
                except asyncio.IncompleteReadError:
                    log.warning("%s: connection %s closed mid-frame", self.name, conn.peer)
                    break
                except WireError as e:
                    self.framing_errors += 1
                    log.warning("%s: closing connection %s after a framing error: %s", self.name, conn.peer, e)
                    break
                if cmd.is_response:
                    continue   # we send only oneway pushes; a stray response is ignored
                await slots.acquire()
                conn.in_flight += 1
                task = spawn(self._handle(conn, cmd, t0_ns, t1_ns))
                self._tasks.add(task)
                task.add_done_callback(lambda t: handled(t, conn, slots))
                if writer.transport.get_write_buffer_size() > 4 * 1024 * 1024:
                    await writer.drain()
        except ConnectionError:
            pass
        finally:
            conn.closed = True
            self._conns.discard(conn)
            writer.close()
            if self.on_close:
                try:
                    self.on_close(conn)
                except Exception:
                    log.exception("%s: on_close failed", self.name)

    def _handled(self, task: asyncio.Task, conn: Connection, slots: asyncio.Semaphore) -> None:
        self._tasks.discard(task)
        slots.release()
        conn.in_flight -= 1
        conn.last_active_s = time.monotonic()

    async def _close_idle(self) -> None:
        """Closes TCP connections idle for idle_timeout_s.  Runs every quarter of it, at most every
        IDLE_SWEEP_S_MAX, so a connection goes that much after idle_timeout_s at the latest."""
        interval_s = min(self.idle_timeout_s / 4, IDLE_SWEEP_S_MAX)
        while True:
            await asyncio.sleep(interval_s)
            now = time.monotonic()
            for conn in list(self._conns):
                idle_s = now - conn.last_active_s
                if conn.idle_close and not conn.in_flight and not conn.closed and idle_s >= self.idle_timeout_s:
                    self.idle_closes += 1
                    log.info("%s: closing connection %s: idle for %.1f s", self.name, conn.peer, idle_s)
                    conn.close()

    async def _handle(self, conn: Connection, cmd: RemotingCommand, t0_ns: int = 0, t1_ns: int = 0) -> None:
        """Runs the handler and queues its response.  Traced (t0_ns, t1_ns: the frame decode's
        start and end): the tracer's begin() and end() around it, in this request's own task."""
        times = self.tracer.begin(cmd, t0_ns, t1_ns) if t0_ns else None
        handler = self.handlers.get(cmd.code)
        if handler is None:
            log.info("%s: request code %d not supported (from %s)", self.name, cmd.code, conn.peer)
            resp = make_response(cmd, ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                                 f" request type {cmd.code} not supported")
        else:
            try:
                resp = await handler(conn, cmd)
            except Exception as e:
                log.exception("%s: handler for code %d failed", self.name, cmd.code)
                resp = make_response(cmd, ResponseCode.SYSTEM_ERROR, f"{type(e).__name__}: {e}")
        if times is not None:
            times.resp_ns = perf_counter_ns()
        if resp is not None and not cmd.is_oneway:
            try:
                conn.write(resp)
            except EncodeError as e:   # e.g. a body past FRAME_SIZE_MAX: say so rather than leave the client waiting
                log.error("%s: the response to code %d (from %s) cannot be encoded: %s", self.name, cmd.code,
                          conn.peer, e)
                resp = make_response(cmd, ResponseCode.SYSTEM_ERROR, f"response cannot be encoded: {e}")
                conn.write(resp)
        if times is not None:
            self.tracer.end(times, cmd, resp, perf_counter_ns())
