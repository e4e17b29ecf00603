"""RemotingServer's own answers to requests it cannot serve normally, in process on 127.0.0.1:
a handler that raises and a response too large to encode each give SYSTEM_ERROR on the same
connection (never a silent drop that leaves the client waiting for its timeout), and the
connection keeps working."""
from __future__ import annotations

import asyncio

from mq.remoting import RemotingClient, RemotingServer, make_response
from mq.wire.remoting import FRAME_SIZE_MAX

OK, RAISES, TOO_BIG = 30, 31, 32


async def ok(conn, cmd):
    return make_response(cmd)


async def raises(conn, cmd):
    raise RuntimeError("boom")


async def too_big(conn, cmd):
    return make_response(cmd, body=b"x" * FRAME_SIZE_MAX)


def test_unanswerable_requests_get_system_error():
    async def main():
        server = RemotingServer("robustness", {OK: ok, RAISES: raises, TOO_BIG: too_big})
        port = await server.start("127.0.0.1", 0)
        client = RemotingClient()
        addr = f"127.0.0.1:{port}"
        try:
            resp = await client.invoke(addr, client.request(RAISES), 5)
            assert resp.code == 1 and "boom" in resp.remark
            resp = await client.invoke(addr, client.request(TOO_BIG), 5)
            assert resp.code == 1 and "cannot be encoded" in resp.remark
            assert (await client.invoke(addr, client.request(OK), 5)).code == 0
            assert server.framing_errors == 0
        finally:
            await client.close()
            await server.stop(grace_s=1)
    asyncio.run(asyncio.wait_for(main(), 30))


SLOW = 33


def slow_handler(answered: asyncio.Event):
    async def slow(conn, cmd):
        await asyncio.sleep(0.5)
        answered.set()           # the late answer is queued on the connection in this same step
        return make_response(cmd, remark="late")
    return slow


def test_client_timeout_then_the_late_answer_is_ignored():
    """RemotingClient.invoke gives up after its timeout with RemotingTimeout; the answer that
    comes later is dropped (it matches no pending request), and the same connection serves the
    next request with its own answer."""
    from mq.remoting.client import RemotingTimeout

    async def main():
        answered = asyncio.Event()
        server = RemotingServer("timeouts", {OK: ok, SLOW: slow_handler(answered)})
        port = await server.start("127.0.0.1", 0)
        client = RemotingClient()
        addr = f"127.0.0.1:{port}"
        try:
            t0 = asyncio.get_running_loop().time()
            try:
                await client.invoke(addr, client.request(SLOW), 0.1)
                raise AssertionError("no timeout")
            except RemotingTimeout:
                pass
            assert 0.09 <= asyncio.get_running_loop().time() - t0 < 0.4
            await answered.wait()
            # the late answer is on the wire before the next request is even read, so the
            # client meets it first and must drop it
            resp = await client.invoke(addr, client.request(OK), 5)
            assert resp.code == 0 and resp.remark != "late"
        finally:
            await client.close()
            await server.stop(grace_s=1)
    asyncio.run(asyncio.wait_for(main(), 30))
