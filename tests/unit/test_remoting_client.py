"""RemotingClient's Protocol transport against scripted raw servers on 127.0.0.1 (and an abstract
unix socket), under uvloop and under asyncio's own loop: responses split at every byte boundary
or packed many to a read all resolve their requests; a push runs its handler; a broken frame
closes the connection and fails what was pending; a silent server gives RemotingTimeout."""
from __future__ import annotations

import asyncio
import os
import socket
import threading

import pytest

from mq import loop as mq_loop
from mq.remoting import RemotingClient, RemotingServer, make_response
from mq.remoting.client import RemotingConnectError, RemotingTimeout
from mq.wire.remoting import RPC_ONEWAY, RPC_RESPONSE, RemotingCommand, decode_frame, encode_frame

LOOPS = ["uvloop", "asyncio"] if mq_loop.USING_UVLOOP else ["asyncio"]


def run(loop_kind: str, coro):
    factory = mq_loop.new_event_loop if loop_kind == "uvloop" else asyncio.new_event_loop
    with asyncio.Runner(loop_factory=factory) as r:
        return r.run(asyncio.wait_for(coro, 30))


class Scripted:
    """A one-connection TCP server in a thread: reads `expect` requests, then writes `script(reqs)`
    (a list of byte chunks, each sent separately), then holds the connection until closed."""

    def __init__(self, expect: int, script):
        self.lsock = socket.create_server(("127.0.0.1", 0))
        self.port = self.lsock.getsockname()[1]
        self.expect, self.script = expect, script
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        conn, _ = self.lsock.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf, reqs = b"", []
        while len(reqs) < self.expect:
            chunk = conn.recv(65536)
            if not chunk:
                return
            buf += chunk
            while len(buf) >= 4 and len(buf) >= 4 + int.from_bytes(buf[:4], "big"):
                n = 4 + int.from_bytes(buf[:4], "big")
                reqs.append(decode_frame(buf[:n]))
                buf = buf[n:]
        for part in self.script(reqs):
            conn.sendall(part)
        try:
            conn.recv(1)            # until the client closes
        except OSError:
            pass
        conn.close()

    def close(self):
        self.lsock.close()


def answer(req: RemotingCommand, remark: str = "") -> bytes:
    return encode_frame(RemotingCommand(code=0, opaque=req.opaque, flag=RPC_RESPONSE, remark=remark or None,
                                        ext_fields={"n": remark}, body=remark.encode()))


def against(loop_kind: str, srv: Scripted, body) -> None:
    """Runs `await body(client, addr)` with a fresh RemotingClient against srv, on the loop kind;
    closes both whatever happens."""
    async def main():
        c = RemotingClient()
        try:
            await body(c, f"127.0.0.1:{srv.port}")
        finally:
            await c.close()
    try:
        run(loop_kind, main())
    finally:
        srv.close()


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_responses_split_at_every_byte_and_packed_in_one_read(loop_kind):
    """Three requests in flight; their answers come back in reverse order as one byte string cut
    into 1-byte writes (every boundary is a split), then three more answered in one write."""
    def split(reqs):
        data = b"".join(answer(r, f"r{r.opaque}") for r in reversed(reqs[:3]))
        return [data[i:i + 1] for i in range(len(data))]

    def packed(reqs):
        return [b"".join(answer(r, f"r{r.opaque}") for r in reqs)]

    async def three(c, addr):
        reqs = [c.request(30, {"i": i}) for i in range(3)]
        resps = await asyncio.gather(*(c.invoke(addr, r, 10) for r in reqs))
        assert [r.remark for r in resps] == [f"r{q.opaque}" for q in reqs]
        assert all(r.body == r.remark.encode() for r in resps)

    against(loop_kind, Scripted(3, split), three)
    against(loop_kind, Scripted(3, packed), three)


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_push_then_broken_frame_fails_pending(loop_kind):
    """A server push (oneway request) reaches its handler; then a frame whose length prefix is over
    FRAME_SIZE_MAX closes the connection, and the two requests still pending fail with
    RemotingConnectError instead of waiting for their timeout."""
    push = encode_frame(RemotingCommand(code=40, opaque=1, flag=RPC_ONEWAY, ext_fields={"consumerGroup": "G"}))

    async def body(c, addr):
        got = asyncio.get_running_loop().create_future()

        async def on_push(addr, cmd):
            got.set_result((addr, cmd.ext_fields["consumerGroup"]))
        c.push_handlers[40] = on_push
        results = await asyncio.gather(*(c.invoke(addr, c.request(30), 20) for _ in range(2)),
                                       return_exceptions=True)
        assert all(isinstance(r, RemotingConnectError) for r in results), results
        assert await got == (addr, "G")

    against(loop_kind, Scripted(2, lambda reqs: [push, (0x7FFFFFFF).to_bytes(4, "big") + b"junk"]), body)


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_timeout(loop_kind):
    """A request nobody answers times out with RemotingTimeout after about its timeout."""
    async def body(c, addr):
        t0 = asyncio.get_running_loop().time()
        with pytest.raises(RemotingTimeout):
            await c.invoke(addr, c.request(30), 0.2)
        assert 0.15 <= asyncio.get_running_loop().time() - t0 < 2

    against(loop_kind, Scripted(1, lambda reqs: []), body)


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_abstract_unix_socket_and_oneway_nowait(loop_kind):
    """The broker's link: a RemotingServer on an abstract unix socket answers invoke();
    send_oneway_nowait writes at once on the open connection and says False without one."""
    name = f"\0mq-test-client-{os.getpid()}-{loop_kind}"

    async def main():
        seen = asyncio.Queue()

        async def echo(conn, cmd):
            return make_response(cmd, remark="unix")

        def oneway(conn, cmd):
            seen.put_nowait(cmd.ext_fields["k"])

        server = RemotingServer("link-test", {30: echo, 31: oneway}, idle_timeout_s=None)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(name)
        await server.start(sock=sock)
        c = RemotingClient()
        try:
            assert not c.send_oneway_nowait(name, c.request(31, {"k": "early"}))
            assert (await c.invoke(name, c.request(30), 5)).remark == "unix"
            assert c.send_oneway_nowait(name, c.request(31, {"k": "v"}))
            assert await asyncio.wait_for(seen.get(), 5) == "v"
        finally:
            await c.close()
            await server.stop(grace_s=1)
    run(loop_kind, main())
