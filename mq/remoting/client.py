"""Asyncio remoting client: one connection per address, requests matched to
responses by opaque, timeouts, and handlers for requests the server pushes
(NOTIFY_CONSUMER_IDS_CHANGED)."""
from __future__ import annotations

import asyncio
import itertools
import logging
import socket
from typing import Awaitable, Callable

from mq.wire.errors import WireError
from mq.wire.remoting import (RPC_ONEWAY, LANGUAGE_PYTHON, RemotingCommand, decode_frame_payload,
                              encode_frame, frame_payload_size)

log = logging.getLogger("mq.remoting.client")

CLIENT_VERSION = 409   # V4_9_8


class RemotingError(Exception):
    pass


class RemotingTimeout(RemotingError):
    pass


class RemotingConnectError(RemotingError):
    pass


class _Conn:
    def __init__(self, addr: str, reader, writer, client: "RemotingClient"):
        self.addr = addr
        self.reader = reader
        self.writer = writer
        self.client = client
        self.pending: dict[int, asyncio.Future] = {}
        self.task = asyncio.create_task(self._read_loop())
        self.closed = False

    async def _read_loop(self) -> None:
        try:
            while True:
                prefix = await self.reader.readexactly(4)
                payload = await self.reader.readexactly(frame_payload_size(prefix))
                cmd = decode_frame_payload(payload)
                if cmd.is_response:
                    fut = self.pending.pop(cmd.opaque, None)
                    if fut is not None and not fut.done():
                        fut.set_result(cmd)
                else:
                    handler = self.client.push_handlers.get(cmd.code)
                    if handler is not None:
                        try:
                            await handler(self.addr, cmd)
                        except Exception:
                            log.exception("push handler for code %d failed", cmd.code)
        except (asyncio.IncompleteReadError, ConnectionError, WireError, OSError) as e:
            log.debug("connection to %s ended: %s", self.addr, e)
        finally:
            self.close()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.writer.close()
        for fut in self.pending.values():
            if not fut.done():
                fut.set_exception(RemotingConnectError(f"connection to {self.addr} closed"))
        self.pending.clear()
        self.client._conns.pop(self.addr, None)


class RemotingClient:
    def __init__(self, connect_timeout_s: float = 3.0):
        self.connect_timeout_s = connect_timeout_s
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
                    opening = asyncio.open_unix_connection(sock=usock)
                else:
                    host, _, port = addr.rpartition(":")
                    opening = asyncio.open_connection(host, int(port))
                reader, writer = await asyncio.wait_for(opening, self.connect_timeout_s)
            except (OSError, asyncio.TimeoutError, ValueError) as e:
                raise RemotingConnectError(f"cannot connect to {addr}: {e}") from None
            sock = writer.get_extra_info("socket")
            if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            c = _Conn(addr, reader, writer, self)
            self._conns[addr] = c
            return c

    def request(self, code: int, ext: dict | None = None, body: bytes = b"") -> RemotingCommand:
        return RemotingCommand(code=code, language=LANGUAGE_PYTHON, version=CLIENT_VERSION,
                               ext_fields={k: (str(v).lower() if isinstance(v, bool) else str(v))
                                           for k, v in (ext or {}).items() if v is not None},
                               body=body)

    async def invoke(self, addr: str, cmd: RemotingCommand, timeout_s: float = 3.0) -> RemotingCommand:
        c = await self._conn(addr)
        cmd.opaque = next(self._opaque) & 0x7FFFFFFF
        fut = asyncio.get_running_loop().create_future()
        c.pending[cmd.opaque] = fut
        try:
            c.writer.write(encode_frame(cmd))
        except (ConnectionError, RuntimeError) as e:
            c.pending.pop(cmd.opaque, None)
            c.close()
            raise RemotingConnectError(f"send to {addr} failed: {e}") from None
        # a timer on the future itself, not asyncio.wait_for: that adds a waiter future and two
        # event-loop iterations to every request (4 -> 2 per one-at-a-time send)
        timer = asyncio.get_running_loop().call_later(timeout_s, _expire, fut)
        try:
            return await fut
        except asyncio.TimeoutError:
            c.pending.pop(cmd.opaque, None)
            raise RemotingTimeout(f"no response from {addr} to code {cmd.code} within {timeout_s}s") from None
        finally:
            timer.cancel()

    async def invoke_oneway(self, addr: str, cmd: RemotingCommand) -> None:
        c = await self._conn(addr)
        cmd.opaque = next(self._opaque) & 0x7FFFFFFF
        cmd.flag |= RPC_ONEWAY
        c.writer.write(encode_frame(cmd))

    def close_connection(self, addr: str) -> None:
        c = self._conns.get(addr)
        if c:
            c.close()

    async def close(self) -> None:
        for c in list(self._conns.values()):
            c.close()
            c.task.cancel()
        self._conns.clear()


def _expire(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_exception(asyncio.TimeoutError())
