"""Remoting client: one connection per address, requests matched to responses by opaque,
timeouts, and handlers for requests the server pushes (NOTIFY_CONSUMER_IDS_CHANGED).

Transport: an asyncio Protocol per connection (uvloop's where the process runs it, mq.loop).
Each read is parsed in one pass: every complete frame in it resolves its request's future (or
runs a push handler) before the next read; a partial frame waits for the rest of its bytes.
Requests go out with one transport write each (on loopback a write costs the sender the
receiver's TCP work, so coalescing would only delay the first request of a burst; pipelined
callers write many requests per loop iteration and TCP_NODELAY sends each at once).  A
connection whose unsent bytes pass WRITE_BUFFER_HIGH_BYTES makes invoke() wait for it to
drain below WRITE_BUFFER_LOW_BYTES, so a fast producer cannot queue without bound.  A broken
frame closes the connection and fails every request pending on it."""
from __future__ import annotations

import asyncio
import itertools
import logging
import socket
from typing import Awaitable, Callable

from mq import loop as mq_loop
from mq.acl.sign import sign_request
from mq.wire.errors import WireError
from mq.wire.remoting import LANGUAGE_PYTHON, RPC_ONEWAY, RPC_RESPONSE, RemotingCommand, decode_frame_payload, encode_frame

from .framing import FrameBuffer, frame_end

log = logging.getLogger("mq.remoting.client")

CLIENT_VERSION = 409   # V4_9_8
WRITE_BUFFER_HIGH_BYTES = 4 * 1024 * 1024
WRITE_BUFFER_LOW_BYTES = 1024 * 1024

class RemotingError(Exception):
    pass


class RemotingTimeout(RemotingError):
    pass


class RemotingConnectError(RemotingError):
    pass


class _Conn(asyncio.Protocol):
    """One connection: its transport, the requests waiting for an answer, and the frame parser."""

    def __init__(self, addr: str, client: "RemotingClient"):
        self.addr = addr
        self.client = client
        self.transport: asyncio.Transport | None = None
        self.pending: dict[int, asyncio.Future] = {}
        self.closed = False
        self._held = FrameBuffer()         # bytes of an incomplete frame
        self._drained: asyncio.Future | None = None   # set while writing is paused
        self._tasks: set[asyncio.Task] = set()        # push handlers running

    # ---- transport callbacks ----------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        transport.set_write_buffer_limits(WRITE_BUFFER_HIGH_BYTES, WRITE_BUFFER_LOW_BYTES)

    def connection_lost(self, exc) -> None:
        log.debug("connection to %s ended: %s", self.addr, exc)
        self.close()

    def pause_writing(self) -> None:
        if self._drained is None:
            self._drained = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        waiter, self._drained = self._drained, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def data_received(self, data: bytes) -> None:
        data = self._held.take(data)
        if data is None:
            return
        size = len(data)
        pos = 0
        view = memoryview(data)
        pending = self.pending
        try:
            while size - pos >= 4:
                end = frame_end(data, pos, size)
                if not end:
                    break
                cmd = decode_frame_payload(view[pos + 4:end])
                pos = end
                if cmd.flag & RPC_RESPONSE:
                    fut = pending.pop(cmd.opaque, None)
                    if fut is not None and not fut.done():
                        fut.set_result(cmd)
                else:
                    self._pushed(cmd)
        except WireError as e:
            log.warning("closing the connection to %s after a framing error: %s", self.addr, e)
            self.close()
            return
        finally:
            view.release()
        if pos < size:
            self._held.hold(data, pos)

    def _pushed(self, cmd: RemotingCommand) -> None:
        handler = self.client.push_handlers.get(cmd.code)
        if handler is None:
            return
        task = asyncio.get_running_loop().create_task(self._run_push(handler, cmd))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_push(self, handler, cmd: RemotingCommand) -> None:
        try:
            await handler(self.addr, cmd)
        except Exception:
            log.exception("push handler for code %d failed", cmd.code)

    # ---- ours ---------------------------------------------------------------------------------
    def write(self, frame: bytes) -> None:
        if self.closed:
            raise RemotingConnectError(f"connection to {self.addr} closed")
        self.transport.write(frame)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.transport is not None:
            self.transport.close()
        for fut in self.pending.values():
            if not fut.done():
                fut.set_exception(RemotingConnectError(f"connection to {self.addr} closed"))
        self.pending.clear()
        self.resume_writing()
        if self.client._conns.get(self.addr) is self:
            del self.client._conns[self.addr]


class RemotingClient:
    def __init__(self, connect_timeout_s: float = 3.0, credentials=None):
        self.connect_timeout_s = connect_timeout_s
        # an ACL account (mq.acl.SessionCredentials): every request is signed just before it
        # is written, as RocketMQ's AclClientRPCHook does; None sends requests unsigned
        self.credentials = credentials
        self._conns: dict[str, _Conn] = {}
        self._connecting: dict[str, asyncio.Lock] = {}
        self._opaque = itertools.count(1)
        self.push_handlers: dict[int, Callable[[str, RemotingCommand], Awaitable[None]]] = {}

    async def _conn(self, addr: str) -> _Conn:
        c = self._conns.get(addr)
        if c is not None and not c.closed:
            return c
        lock = self._connecting.setdefault(addr, asyncio.Lock())
        async with lock:
            c = self._conns.get(addr)
            if c is not None and not c.closed:
                return c
            loop = asyncio.get_running_loop()
            c = _Conn(addr, self)
            try:
                if addr.startswith(("\0", "/")):      # a unix socket (the broker's internal link)
                    # connected here: uvloop takes no abstract (NUL-led) path, any loop takes a socket
                    usock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    try:
                        usock.connect(addr)
                    except OSError:
                        usock.close()
                        raise
                    usock.setblocking(False)
                    opening = loop.create_unix_connection(lambda: c, sock=usock)
                else:
                    host, _, port = addr.rpartition(":")
                    opening = loop.create_connection(lambda: c, host, int(port))
                await mq_loop.wait_for(opening, self.connect_timeout_s)
            except (OSError, asyncio.TimeoutError, ValueError) as e:
                raise RemotingConnectError(f"cannot connect to {addr}: {e}") from None
            self._conns[addr] = c
            return c

    def request(self, code: int, ext: dict | None = None, body: bytes = b"") -> RemotingCommand:
        return RemotingCommand(code=code, language=LANGUAGE_PYTHON, version=CLIENT_VERSION,
                               ext_fields={k: (str(v).lower() if v.__class__ is bool else str(v))
                                           for k, v in ext.items() if v is not None} if ext else {},
                               body=body)

    def request_str(self, code: int, ext_fields: dict[str, str], body: bytes = b"") -> RemotingCommand:
        """request() for a caller whose header values are already the strings to send (every
        value a str: asserted by the frame's encoder, not converted here)."""
        return RemotingCommand(code=code, language=LANGUAGE_PYTHON, version=CLIENT_VERSION, ext_fields=ext_fields,
                               body=body)

    async def invoke(self, addr: str, cmd: RemotingCommand, timeout_s: float = 3.0) -> RemotingCommand:
        c = self._conns.get(addr)
        if c is None or c.closed:
            c = await self._conn(addr)
        if c._drained is not None:          # the connection's send buffer is full: wait for it
            await c._drained
        cmd.opaque = opaque = next(self._opaque) & 0x7FFFFFFF
        if self.credentials is not None:
            sign_request(cmd, self.credentials)
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        c.pending[opaque] = fut
        try:
            c.write(encode_frame(cmd))
        except (ConnectionError, RuntimeError, RemotingConnectError) as e:
            c.pending.pop(opaque, None)
            c.close()
            raise RemotingConnectError(f"send to {addr} failed: {e}") from None
        # a timer on the future itself, not asyncio.wait_for: that adds a waiter future and two
        # event-loop iterations to every request (4 -> 2 per one-at-a-time send)
        timer = loop.call_later(timeout_s, _expire, fut)
        try:
            return await fut
        except asyncio.TimeoutError:
            c.pending.pop(opaque, None)
            raise RemotingTimeout(f"no response from {addr} to code {cmd.code} within {timeout_s}s") from None
        finally:
            timer.cancel()

    async def invoke_oneway(self, addr: str, cmd: RemotingCommand) -> None:
        c = await self._conn(addr)
        cmd.opaque = next(self._opaque) & 0x7FFFFFFF
        cmd.flag |= RPC_ONEWAY
        if self.credentials is not None:
            sign_request(cmd, self.credentials)
        c.write(encode_frame(cmd))

    def send_oneway_nowait(self, addr: str, cmd: RemotingCommand) -> bool:
        """A oneway request written at once on the open connection to addr; False (nothing sent)
        when there is none, and the caller uses invoke_oneway."""
        c = self._conns.get(addr)
        if c is None or c.closed:
            return False
        cmd.opaque = next(self._opaque) & 0x7FFFFFFF
        cmd.flag |= RPC_ONEWAY
        if self.credentials is not None:
            sign_request(cmd, self.credentials)
        try:
            c.write(encode_frame(cmd))
        except (ConnectionError, RuntimeError, RemotingConnectError):
            c.close()
            return False
        return True

    def close_connection(self, addr: str) -> None:
        c = self._conns.get(addr)
        if c:
            c.close()

    async def close(self) -> None:
        for c in list(self._conns.values()):
            c.close()
            for t in list(c._tasks):
                t.cancel()
        self._conns.clear()


def _expire(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_exception(asyncio.TimeoutError())
