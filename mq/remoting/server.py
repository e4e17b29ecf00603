"""Remoting server: frames in, handlers by request code, responses out.

Transport: an asyncio Protocol (uvloop's in the broker and the name server, mq.loop).  Each read
is parsed in one pass: every complete frame in it is decoded and handed to its handler, and every
response produced while handling that read goes out in one write.  A partial frame waits for the
rest of its bytes (chunks kept as they came, joined once when complete).

A handler is a plain function `handler(conn, cmd)` that returns one of:
  * a RemotingCommand (or None): answered at once, inside data_received - no Task, no await;
    this is the fast path (ASYNC_FLUSH sends, pulls that find data, offset queries);
  * a coroutine: the request must wait (a flush, a replica, a long poll, a metadata call): it
    runs as its own Task and its response is written when it returns, so a parked request never
    blocks the ones behind it on the same connection;
  * DEFERRED: the handler's owner took the request and will answer it with conn.respond() later
    (the broker's group append answers all sends of one loop iteration together).
`async def` handlers are simply handlers that always return a coroutine.
A server may also have a `taker` (the broker's C send path, mq.broker.fastsend): before a frame
is decoded, it is offered the rest of the read and takes the frames it answers itself (later,
in one write per connection), up to the first one it leaves to the handlers; the frames it
takes count against no in-flight bound (the taker answers them or holds their answers: it bounds
them itself).  And an `adopter` (the same owner): after the taker took a read whole, adopter.adopt
(conn) may take the connection over -- it pauses reading for the reason "adopted" and reads and
answers the socket itself (mq.broker.fastsend, csrc/fastconn.h) -- until adopter.give_back(conn)
puts its unread bytes in the held ones and resumes.  The server takes it back when a write of its
own is not taken whole (answers go out in order through one writer at a time), before it closes
it, and asks adopter.active_s(conn) when the connection last moved bytes (idle closing).

Rules (spec 1.5, RELIABILITY.md):
  * a framing error (length < 4 or over FRAME_SIZE_MAX, header past the frame, unknown
    serialize type, bad JSON, TLS/HTTP probe) closes that connection only, and is logged; the
    frames before it in the same read are still answered;
  * a response echoes the opaque, sets the response flag and uses the request's serialize type;
    a oneway request is never answered;
  * unknown code -> REQUEST_CODE_NOT_SUPPORTED; a handler exception or a response that cannot be
    encoded -> SYSTEM_ERROR with its text; all logged;
  * a TCP connection idle for idle_timeout_s (serverChannelMaxIdleTimeSeconds, 120 s) is closed
    and logged: idle means no bytes read, nothing written and no request of it in flight (or
    only requests waiting for its client to read: it is paused by the unsent caps below).
    Answers leaving the transport's buffer between two looks of the closer count as written (a
    client that reads a backlog slowly is not idle; one that stopped reading is).  The
    answers such a client left unread are dropped with it (abort), as Netty's close fails the
    writes still queued, so they stop counting against the process.
    Connections on a unix socket (links between the processes of one node) are never
    idle-closed: they live as long as the processes at both ends.
Bounds (memory per connection and per process, RELIABILITY.md "Bad input"): a request is always
read whole before it is handled and answered exactly once, so what bounds memory is when the
server stops reading.  A connection is not read (the rest of its read waits in its FrameBuffer,
then TCP backpressure holds the client) while
  * IN_FLIGHT_PER_CONNECTION_MAX of its requests are in flight, until one is answered;
  * its unsent answers (queued here or in the transport: not yet taken by the kernel) pass
    UNSENT_BYTES_PER_CONNECTION_MAX, until they drain to UNSENT_BYTES_PER_CONNECTION_RESUME.
    This is checked before each frame of a read, not only at its end: one read can hold
    hundreds of pipelined pulls whose answers are a few hundred KiB each;
  * the unsent answers of all connections of the process (an UnsentBudget; an io worker's two
    servers share the process's one) pass UNSENT_BYTES_PER_PROCESS_MAX and this connection has
    some of them, until its own have left.  Idle connections, and those whose answers the
    kernel takes at once, are never paused for the total.
Answers built after an await (a Task, a long poll that woke) wait in Connection.drained() before
they are built while their connection is over its cap or has queued more than the budget's
room_bytes in this loop iteration (congested), so requests already in flight cannot pile up
answers either, not even when hundreds wake together on many connections.  Bound on unsent answer bytes: per connection, the cap plus its last answer;
per process, about UNSENT_BYTES_PER_PROCESS_MAX plus, for each connection not yet paused,
UNSENT_BYTES_FLUSH_MIN and one answer.  The per-frame cost is one integer compare.

Tracing (optional, the broker's perfTraceEnable): with a `tracer`, each request's frame decode is
timed, `tracer.begin(cmd, t0_ns, t1_ns)` runs just before its handler (it sets the request's
times as the context's current ones; a Task copies them with the context), the server stamps
`resp_ns` when the handler's response is ready, and `tracer.end(times, cmd, code, body_size,
done_ns)` runs once the response frame is encoded and queued (instants from
time.perf_counter_ns; mq.broker.tracing is the tracer).  Without one a request pays a few
`is None` tests."""
from __future__ import annotations

import asyncio
import itertools
import logging
import socket
import time
from time import perf_counter_ns
from typing import Callable

from mq import loop as mq_loop
from mq.wire.errors import EncodeError, WireError
from mq.wire.remoting import RPC_ONEWAY, RPC_RESPONSE, RemotingCommand, decode_frame_payload, encode_frame

from mq.wire.codes import ResponseCode
from .framing import FrameBuffer, frame_end

log = logging.getLogger("mq.remoting.server")

# ---- the bounds of the module docstring, in one place ------------------------------------------
IN_FLIGHT_PER_CONNECTION_MAX = 1024
UNSENT_BYTES_PER_CONNECTION_MAX = 4 * 1024 * 1024      # stop reading a connection whose answers are not leaving
UNSENT_BYTES_PER_CONNECTION_RESUME = 1024 * 1024       # ... and read it again once they drained to this
UNSENT_BYTES_PER_PROCESS_MAX = 64 * 1024 * 1024        # all connections of one process (an io worker) together
# a read's answers go to the transport at least every UNSENT_BYTES_FLUSH_MAX (the transport keeps a
# whole write until its last byte is taken), and every UNSENT_BYTES_FLUSH_MIN over the process total
UNSENT_BYTES_FLUSH_MAX = 1024 * 1024
UNSENT_BYTES_FLUSH_MIN = 64 * 1024
UNSENT_SWEEP_INTERVAL_S = 0.01        # over the total, shares are measured again at most this often
IDLE_TIMEOUT_S_DEFAULT = 120.0   # serverChannelMaxIdleTimeSeconds
ADOPTED = "adopted"             # the pause reason of a connection its server's adopter serves
IDLE_SWEEP_S_MAX = 5.0           # an idle connection is closed within idle_timeout_s + this
Handler = Callable[["Connection", RemotingCommand], object]

class _Deferred:
    """What a handler returns when its owner will answer with Connection.respond later."""
    __slots__ = ()

    def __repr__(self) -> str:
        return "DEFERRED"


DEFERRED = _Deferred()


def make_response(request: RemotingCommand, code: int = ResponseCode.SUCCESS, remark: str | None = None,
                  ext: dict | None = None, body: bytes = b"") -> RemotingCommand:
    """A response to `request`: same opaque and serialize type, response flag set."""
    return RemotingCommand(code=code, language=request.language, version=request.version,
                           opaque=request.opaque, flag=RPC_RESPONSE, remark=remark,
                           ext_fields={k: str(v).lower() if v.__class__ is bool else str(v)
                                       for k, v in ext.items() if v is not None} if ext else {},
                           body=body, serialize_type=request.serialize_type)


class UnsentBudget:
    """The unsent answer bytes of every connection of one process, for UNSENT_BYTES_PER_PROCESS_MAX.

    A connection's share is what its transport still held after its last write (the transport
    says nothing as the kernel takes bytes), noted after each flush and when its transport
    drains; a share is never below the truth at the moment it is noted, but can be stale-high
    later.  So before a connection is paused for the total, over_max() measures every share
    again (at most every UNSENT_SWEEP_INTERVAL_S): a connection whose answers left counts 0.
    Only connections that hold a share are in `holders`: an idle connection costs nothing.
    Invariant: total_bytes == sum of c._unsent_counted over holders."""
    __slots__ = ("max_bytes", "total_bytes", "room_bytes", "holders", "_swept_s")

    def __init__(self, max_bytes: int = UNSENT_BYTES_PER_PROCESS_MAX):
        assert max_bytes > 0, max_bytes
        self.max_bytes = max_bytes
        self.total_bytes = 0
        # what one read may queue before its answers are handed to the transport and the total checked
        self.room_bytes = UNSENT_BYTES_FLUSH_MAX
        self.holders: set[Connection] = set()
        self._swept_s = 0.0

    def note(self, conn: "Connection", size: int) -> None:
        """conn's transport holds `size` unsent bytes now."""
        self.total_bytes += size - conn._unsent_counted
        conn._unsent_counted = size
        if size:
            self.holders.add(conn)
        else:
            self.holders.discard(conn)
        self.room_bytes = min(max(self.max_bytes - self.total_bytes, UNSENT_BYTES_FLUSH_MIN), UNSENT_BYTES_FLUSH_MAX)
        assert self.total_bytes >= 0, self.total_bytes

    def over_max(self) -> bool:
        """Is the total over max_bytes, measured afresh unless that was done just now?"""
        if self.total_bytes <= self.max_bytes:
            return False
        now = time.monotonic()
        if now - self._swept_s >= UNSENT_SWEEP_INTERVAL_S:
            self._swept_s = now
            for c in list(self.holders):
                self.note(c, 0 if c.closed else c.transport.get_write_buffer_size())
        return self.total_bytes > self.max_bytes


# the process's budget: every RemotingServer that is not given one shares it.  One event loop per
# budget; a process forked while it serves would inherit shares of connections it does not have
# (mq.broker.launcher forks the io workers from a process that serves nothing).
PROCESS_BUDGET = UnsentBudget()


class Connection:
    """One client connection; handlers get it to learn the peer, push requests, or answer a
    deferred request (respond)."""
    __slots__ = ("id", "peer", "transport", "server", "closed", "attrs", "idle_close", "last_active_s",
                 "unsent_seen", "in_flight", "_opaque", "_out", "_out_bytes", "_flush_scheduled", "_protocol",
                 "_budget", "_unsent_counted", "_drain_waiters")

    def __init__(self, conn_id: int, peer: tuple[str, int], transport, server: "RemotingServer", protocol=None):
        self.id = conn_id
        self.peer = peer
        self.transport = transport
        self.server = server
        self.closed = False
        self.attrs: dict = {}
        self.idle_close = True             # False for unix-socket links
        self.last_active_s = time.monotonic()   # last bytes read or frame written
        self.unsent_seen = 0               # the transport's unsent bytes at the idle closer's last look
        self.in_flight = 0                 # requests of this connection being handled
        self._opaque = itertools.count(1 << 24)
        self._out: list[bytes] = []        # frames queued and not yet written
        self._out_bytes = 0                # their size
        self._flush_scheduled = False
        self._protocol = protocol
        self._budget: UnsentBudget = server.budget
        self._unsent_counted = 0           # this connection's share of _budget (its transport's, at the last note)
        self._drain_waiters: list[asyncio.Future] = []   # drained() callers

    def write(self, cmd: RemotingCommand) -> None:
        """Queues the frame of `cmd` (raises EncodeError if it cannot be encoded)."""
        self.write_frame(encode_frame(cmd))

    def write_frame(self, frame: bytes) -> None:
        """Queues an encoded frame.  Frames queued while a read is being handled go out at its end;
        others at the end of this event-loop iteration, together (one send(2) for many)."""
        if self.closed:
            return
        self._out.append(frame)
        self._out_bytes += len(frame)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def queue_frame(self, frame: bytes) -> None:
        """Queues an encoded frame for a caller that calls flush() itself before it returns to
        the event loop (write_frame would also schedule a flush: a callback per connection)."""
        if not self.closed:
            self._out.append(frame)
            self._out_bytes += len(frame)

    def flush(self) -> None:
        """Writes every queued frame now, in one write.  The transport pauses reading (through
        pause_writing) when it then holds over UNSENT_BYTES_PER_CONNECTION_MAX; what it holds is
        this connection's share of the process budget, and pauses reading too when the budget
        is over (see the module docstring)."""
        self._flush_scheduled = False
        out = self._out
        if not out:
            return
        data = out[0] if len(out) == 1 else b"".join(out)
        out.clear()
        self._out_bytes = 0
        if self.closed:
            return
        self.last_active_s = time.monotonic()
        transport = self.transport
        try:
            transport.write(data)
        except (ConnectionError, RuntimeError) as e:
            log.debug("write to %s failed: %s", self.peer, e)
            self.closed = True
            return
        unsent = transport.get_write_buffer_size()
        if unsent and self._protocol is not None and ADOPTED in self._protocol._paused_by:
            self.server.adopter.give_back(self)     # the transport holds answers: C may not write now
        if unsent or self._unsent_counted:
            budget = self._budget
            budget.note(self, unsent)
            if unsent and budget.total_bytes > budget.max_bytes and budget.over_max() and self._unsent_counted:
                self._protocol._pause_for_total()
        if self._drain_waiters and not self.congested():
            self._wake_drain_waiters()

    def congested(self) -> bool:
        """Would an answer now go past this connection's cap, or the process's (module docstring)?
        Answers queued past the budget's room_bytes wait for the flush at the end of this loop
        iteration, which notes them in the budget (and pauses the connection if the process is
        over): handlers woken together (hundreds of pulls that awaited one metadata fetch, on
        many connections) would otherwise each queue up to the connection's cap in one
        iteration, before the process total is looked at - the rule data_received applies per frame."""
        return (self._out_bytes > self._budget.room_bytes
                or self._out_bytes + self._unsent_counted > UNSENT_BYTES_PER_CONNECTION_MAX
                or (self._protocol is not None and self._protocol._write_paused))

    async def drained(self) -> None:
        """Returns once this connection may take another answer (not congested()), or is closed.
        A handler that builds a large answer after an await (a parked pull that woke) waits here
        first, so the requests a paused connection has in flight cannot pile up answers."""
        while self.congested() and not self.closed:
            waiter = asyncio.get_running_loop().create_future()
            self._drain_waiters.append(waiter)
            await waiter

    def _wake_drain_waiters(self) -> None:
        waiters, self._drain_waiters = self._drain_waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    def respond(self, cmd: RemotingCommand, resp: RemotingCommand | bytes | None, times=None) -> None:
        """Answers a request its handler DEFERRED (once): `resp` is a RemotingCommand, an encoded
        frame, or None for no answer; `times` is the request's trace times (the tracer's, or None)."""
        self.server._answer(self, cmd, resp, times)

    def push_oneway(self, code: int, ext: dict | None = None, body: bytes = b"") -> None:
        """A server-initiated oneway request (e.g. NOTIFY_CONSUMER_IDS_CHANGED)."""
        self.write(RemotingCommand(code=code, opaque=next(self._opaque) & 0x7FFFFFFF, flag=RPC_ONEWAY,
                                   ext_fields={k: str(v) for k, v in (ext or {}).items()}, body=body))

    def close(self) -> None:
        if self.closed:
            return
        if self._protocol is not None and ADOPTED in self._protocol._paused_by:
            self.server.adopter.give_back(self, closing=True)
        self.flush()
        self.closed = True
        self.transport.close()


class _ServerProtocol(asyncio.Protocol):
    """One connection's bytes: frames parsed per read, handlers run, answers written per read."""

    def __init__(self, server: "RemotingServer"):
        self.server = server
        self.conn: Connection | None = None
        self._held = FrameBuffer()         # bytes not parsed yet: an incomplete frame, or a paused read
        self._paused_by = set()            # "inflight" / "write": why reading is paused
        self._write_paused = False         # between the transport's pause_writing and resume_writing
        self._total_paused = False         # its limits lowered to 0 for the process budget (_pause_for_total)

    # ---- connection -----------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        server = self.server
        peer = transport.get_extra_info("peername") or ("?", 0)
        sock = transport.get_extra_info("socket")
        conn = Connection(next(server._ids), (peer[0], peer[1]) if isinstance(peer, tuple) else ("?", 0),
                          transport, server, self)
        if sock is not None:
            if sock.family == socket.AF_UNIX:
                conn.idle_close = False
            else:
                try:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                except OSError:
                    pass
        transport.set_write_buffer_limits(UNSENT_BYTES_PER_CONNECTION_MAX, UNSENT_BYTES_PER_CONNECTION_RESUME)
        self.conn = conn
        server._conns.add(conn)

    def connection_lost(self, exc) -> None:
        conn = self.conn
        conn.closed = True
        conn._out.clear()
        conn._out_bytes = 0
        conn._budget.note(conn, 0)
        if conn._drain_waiters:
            conn._wake_drain_waiters()     # they see it closed
        server = self.server
        server._conns.discard(conn)
        if server.on_close:
            try:
                server.on_close(conn)
            except Exception:
                log.exception("%s: on_close failed", server.name)

    def pause_writing(self) -> None:
        self._write_paused = True
        self._pause("write")

    def resume_writing(self) -> None:
        """The transport drained to its low-water mark (to nothing after _pause_for_total)."""
        self._write_paused = False
        conn = self.conn
        if self._total_paused:
            self._set_limits(UNSENT_BYTES_PER_CONNECTION_MAX, UNSENT_BYTES_PER_CONNECTION_RESUME)
        if not conn.closed:
            conn._budget.note(conn, conn.transport.get_write_buffer_size())
        self._resume("write")
        if conn._drain_waiters:
            conn._wake_drain_waiters()     # each checks congested() again

    def _pause_for_total(self) -> None:
        """The process budget is over and this connection's transport holds some of it: stop
        reading until it holds nothing.  Lowering its limits to 0 makes the transport call
        pause_writing now and resume_writing once its last byte is taken (the transport has no
        other way to say so)."""
        if self._write_paused or self.conn.closed:
            return
        self._set_limits(0, 0)
        if not self._write_paused:         # it held nothing after all
            self._set_limits(UNSENT_BYTES_PER_CONNECTION_MAX, UNSENT_BYTES_PER_CONNECTION_RESUME)

    def _set_limits(self, high_bytes: int, low_bytes: int) -> None:
        """The transport's write-buffer limits: the connection's cap, or 0 while paused for the total."""
        self._total_paused = high_bytes == 0
        try:
            self.conn.transport.set_write_buffer_limits(high_bytes, low_bytes)
        except RuntimeError:               # closed meanwhile
            pass

    def _pause(self, why: str) -> None:
        if not self._paused_by:
            try:
                self.conn.transport.pause_reading()
            except RuntimeError:
                pass
        self._paused_by.add(why)

    def _resume(self, why: str) -> None:
        if why not in self._paused_by:
            return
        self._paused_by.discard(why)
        if not self._paused_by and not self.conn.closed:
            try:
                self.conn.transport.resume_reading()
            except RuntimeError:
                return
            if self._held.ready():                 # frames held back at the in-flight bound
                asyncio.get_running_loop().call_soon(self.data_received, b"")

    # ---- frames -----------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        conn = self.conn
        if conn.closed:
            return
        conn.last_active_s = time.monotonic()
        if self._paused_by:
            self._held.add(data)
            return
        server = self.server
        taker = server.taker
        pos = 0
        handed_back = -1                    # where the taker stopped: that frame is Python's
        if taker is not None and not len(self._held):
            # the C send path takes every frame of most reads: then nothing is queued here (its
            # answers go out from its run), and the general walk below is not needed
            try:
                pos = handed_back = taker(conn, data, 0, len(data))
            except WireError as e:
                self._framing_error(e)
                return
            if pos == len(data) or conn.closed:
                adopter = server.adopter
                if adopter is not None and not conn.closed:
                    adopter.adopt(conn)
                return
        else:
            data = self._held.take(data)
            if data is None:
                return
        size = len(data)
        view = memoryview(data)
        tracer = server.tracer
        conn._flush_scheduled = True        # answers of this read go out in the flush below, together
        # the answer bytes this read may queue before they are handed to the transport mid-read,
        # which pauses the connection if they then pass its cap or the process's (flush)
        room = UNSENT_BYTES_PER_CONNECTION_MAX - conn._unsent_counted
        if conn._budget.room_bytes < room:
            room = conn._budget.room_bytes
        try:
            while size - pos >= 4:
                if self._paused_by:                 # the taker's answers paused it: the rest waits
                    break
                if taker is not None and pos != handed_back:
                    pos = taker(conn, data, pos, size)     # the frames it takes from here on
                    if conn.closed:
                        return
                    if size - pos < 4 or self._paused_by:  # paused by its pulls' answers: the frame at
                        break                               # pos is not known to be Python's; it waits
                end = frame_end(data, pos, size)
                if not end:
                    break
                if conn.in_flight >= IN_FLIGHT_PER_CONNECTION_MAX:
                    self._pause("inflight")
                    break
                if conn._out_bytes > room:          # the one per-frame cost of the unsent caps
                    conn.flush()
                    if conn.closed:
                        return
                    if self._paused_by:
                        break
                    conn._flush_scheduled = True
                    room = UNSENT_BYTES_PER_CONNECTION_MAX - conn._unsent_counted
                    if conn._budget.room_bytes < room:
                        room = conn._budget.room_bytes
                if tracer is None:
                    cmd = decode_frame_payload(view[pos + 4:end])
                    pos = end
                    if not cmd.flag & RPC_RESPONSE:        # we send only oneway pushes: a stray response is ignored
                        server._dispatch(conn, cmd, None)
                else:
                    t0_ns = perf_counter_ns()
                    cmd = decode_frame_payload(view[pos + 4:end])
                    t1_ns = perf_counter_ns()
                    pos = end
                    if not cmd.flag & RPC_RESPONSE:
                        server._dispatch(conn, cmd, tracer.begin(cmd, t0_ns, t1_ns))
                if conn.closed:
                    return
        except WireError as e:
            self._framing_error(e)
            return
        finally:
            view.release()
            conn.flush()
        if pos < size:
            self._held.hold(data, pos)

    def _framing_error(self, e: WireError) -> None:
        server = self.server
        server.framing_errors += 1
        log.warning("%s: closing connection %s after a framing error: %s", server.name, self.conn.peer, e)
        self.conn.close()

    def eof_received(self):
        if len(self._held):
            log.warning("%s: connection %s closed mid-frame", self.server.name, self.conn.peer)
        return False


class RemotingServer:
    def __init__(self, name: str, handlers: dict[int, Handler] | None = None,
                 on_close: Callable[[Connection], None] | None = None,
                 idle_timeout_s: float | None = IDLE_TIMEOUT_S_DEFAULT, tracer=None,
                 budget: UnsentBudget | None = None):
        """idle_timeout_s: close TCP connections idle this long (see the module docstring); None never.
        tracer: times every request (see the module docstring); None does not.
        budget: the unsent answers this server's connections share with others; None: the
        process's (PROCESS_BUDGET)."""
        if idle_timeout_s is not None and not idle_timeout_s > 0:
            raise ValueError(f"idle_timeout_s must be > 0 or None, not {idle_timeout_s!r}")
        self.name = name
        self.idle_timeout_s = idle_timeout_s
        self.handlers: dict[int, Handler] = dict(handlers or {})
        self.on_close = on_close
        self.tracer = tracer
        self.budget = budget if budget is not None else PROCESS_BUDGET
        # taker(conn, data, pos, size) -> pos: takes the frames of a read from pos on that its owner
        # handles itself (the broker's C send path), returning where the first one it left starts
        self.taker = None
        # adopter: the taker's owner when it may serve connections itself (module docstring)
        self.adopter = None
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
        loop = asyncio.get_running_loop()
        factory = lambda: _ServerProtocol(self)     # noqa: E731
        if sock is not None:
            if sock.family == socket.AF_UNIX:
                self._server = await loop.create_unix_server(factory, sock=sock)
            else:
                self._server = await loop.create_server(factory, sock=sock)
        else:
            self._server = await loop.create_server(factory, host, port, reuse_port=reuse_port or None,
                                                    reuse_address=True)
        if self.idle_timeout_s is not None:
            self._idle_sweeper = asyncio.create_task(self._close_idle())
        name = self._server.sockets[0].getsockname()
        return name[1] if isinstance(name, tuple) else 0

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
                await mq_loop.wait_for(self._server.wait_closed(), 2)
            except asyncio.TimeoutError:
                pass

    # ---- requests ----------------------------------------------------------------------------
    def _dispatch(self, conn: Connection, cmd: RemotingCommand, times) -> None:
        """Runs cmd's handler: answers at once, or parks a Task, or leaves it DEFERRED."""
        handler = self.handlers.get(cmd.code)
        if handler is None:
            log.info("%s: request code %d not supported (from %s)", self.name, cmd.code, conn.peer)
            resp = make_response(cmd, ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                                 f" request type {cmd.code} not supported")
        else:
            try:
                resp = handler(conn, cmd)
            except Exception as e:
                log.exception("%s: handler for code %d failed", self.name, cmd.code)
                resp = make_response(cmd, ResponseCode.SYSTEM_ERROR, f"{type(e).__name__}: {e}")
            else:
                if resp is DEFERRED:
                    conn.in_flight += 1
                    return
                if resp is not None and resp.__class__ is not RemotingCommand and resp.__class__ is not bytes:
                    conn.in_flight += 1     # a coroutine: the request waits in a Task of its own
                    task = asyncio.get_running_loop().create_task(self._wait(conn, cmd, resp, times))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
                    return
        self._reply(conn, cmd, resp, times)

    def _answer(self, conn: Connection, cmd: RemotingCommand, resp, times) -> None:
        """A deferred or waited-for request's answer: frees its in-flight slot, then replies."""
        conn.in_flight -= 1
        conn.last_active_s = time.monotonic()
        self._reply(conn, cmd, resp, times)
        if conn.in_flight < IN_FLIGHT_PER_CONNECTION_MAX and conn._protocol is not None:
            conn._protocol._resume("inflight")

    async def _wait(self, conn: Connection, cmd: RemotingCommand, coro, times) -> None:
        if conn.congested():
            # a handler that answers without awaiting first builds its answer in its first step,
            # and a read can start hundreds: they wait for room one by one
            await conn.drained()
            if conn.closed:
                coro.close()
                self._answer(conn, cmd, None, times)
                return
        try:
            resp = await coro
        except Exception as e:
            log.exception("%s: handler for code %d failed", self.name, cmd.code)
            resp = make_response(cmd, ResponseCode.SYSTEM_ERROR, f"{type(e).__name__}: {e}")
        self._answer(conn, cmd, resp, times)

    def _reply(self, conn: Connection, cmd: RemotingCommand, resp, times) -> None:
        """Queues the response (a RemotingCommand or an encoded frame) unless cmd is oneway."""
        if times is not None:
            times.resp_ns = perf_counter_ns()
        if resp is not None and not cmd.flag & RPC_ONEWAY:
            if resp.__class__ is bytes:
                conn.write_frame(resp)
            else:
                try:
                    conn.write(resp)
                except EncodeError as e:   # e.g. a body past FRAME_SIZE_MAX: say so rather than leave the client waiting
                    log.error("%s: the response to code %d (from %s) cannot be encoded: %s", self.name, cmd.code,
                              conn.peer, e)
                    resp = make_response(cmd, ResponseCode.SYSTEM_ERROR, f"response cannot be encoded: {e}")
                    conn.write(resp)
        if times is not None:
            self.tracer.end(times, cmd, resp, perf_counter_ns())

    async def _close_idle(self) -> None:
        """Closes TCP connections idle for idle_timeout_s.  Runs every quarter of it, at most every
        IDLE_SWEEP_S_MAX, so a connection goes that much after idle_timeout_s at the latest."""
        interval_s = min(self.idle_timeout_s / 4, IDLE_SWEEP_S_MAX)
        while True:
            await asyncio.sleep(interval_s)
            now = time.monotonic()
            for conn in list(self._conns):
                if self.adopter is not None and ADOPTED in conn._protocol._paused_by:
                    active_s = self.adopter.active_s(conn)
                    if active_s is not None and active_s > conn.last_active_s:
                        conn.last_active_s = active_s
                if not conn.closed:
                    # answers leaving for the client count as writes (Netty counts a write when it
                    # completes): a client draining a backlog slowly is reading, not idle
                    unsent = conn.transport.get_write_buffer_size()
                    if unsent < conn.unsent_seen:
                        conn.last_active_s = now
                    conn.unsent_seen = unsent
                idle_s = now - conn.last_active_s
                if conn.idle_close and not conn.closed and idle_s >= self.idle_timeout_s \
                        and (not conn.in_flight or conn._protocol._write_paused):
                    self.idle_closes += 1
                    conn.close()
                    unread = conn.transport.get_write_buffer_size()
                    log.info("%s: closing connection %s: idle for %.1f s%s", self.name, conn.peer, idle_s,
                             f", dropping {unread} bytes of answers its client did not read" if unread else "")
                    if unread:
                        conn.transport.abort()
