"""The io worker's link to the supervisor (mq.broker.link) over a real abstract unix socket: the
supervisor's side is a RemotingServer with the LinkService over a Metadata in a temporary
directory, the worker's side a RemoteMeta, as the broker runs them.  A pull's offset commit is
coalesced: commits within COMMIT_COALESCE_S travel as one call with the last offset per queue,
and reach the supervisor before any later call of the same worker (its reads see them, its own
offset updates land after them)."""
from __future__ import annotations

import asyncio
import json
import os
import socket

from mq import loop as mq_loop
from mq.broker.config import BrokerConfig
from mq.broker.link import LINK_CALL, LinkService, RemoteMeta
from mq.broker.metadata import Metadata
from mq.remoting import RemotingServer


async def _with_link(tmp_path, body):
    """Runs body(meta, metadata, methods): `methods` lists the link calls the supervisor side
    took, in order."""
    metadata = Metadata(BrokerConfig(), str(tmp_path / "config"))
    service = LinkService(metadata, supervisor=None)
    methods: list[str] = []

    async def handle(conn, cmd):
        methods.append(json.loads(cmd.body)["m"])
        return await service.handle(conn, cmd)

    server = RemotingServer("link", {LINK_CALL: handle}, idle_timeout_s=None)
    addr = f"\0mq-test-link-{os.getpid()}-{id(server)}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(addr)
    sock.listen(8)
    await server.start(sock=sock)
    meta = RemoteMeta(addr, 0, on_notify=lambda *a: None)
    try:
        await body(meta, metadata, methods)
    finally:
        await meta.close()
        await server.stop(0.5)


async def _until(cond, timeout_s: float = 10.0) -> None:
    """Returns once cond() is true (polled each millisecond); AssertionError at the deadline."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "the supervisor's side never got there"
        await asyncio.sleep(0.001)


def test_pull_commits_travel_coalesced_and_before_the_next_call(tmp_path):
    async def body(meta, metadata, methods):
        await meta.query_offset("G", "T", 0)                  # the link is open
        methods.clear()
        for i in range(200):                                  # one loop turn: 200 pulls of 4 queues
            meta.commit_offset_nowait("G", "T", i % 4, 1000 + i)
        assert not methods                                    # none yet: they wait COMMIT_COALESCE_S
        await _until(lambda: [metadata.query_offset("G", "T", q) for q in range(4)] == [1196, 1197, 1198, 1199])
        assert methods == ["commit_offsets"], methods         # one call, not 200

        meta.commit_offset_nowait("G", "T", 0, 2000)          # then a read at once: it sees it
        assert await meta.query_offset("G", "T", 0) == 2000
        meta.commit_offset_nowait("G", "T", 1, 3000)          # then an update of the same queue
        await meta.commit_offset("G", "T", 1, 5)              # (UPDATE_CONSUMER_OFFSET): it wins
        assert await meta.query_offset("G", "T", 1) == 5
        assert methods[1:] == ["commit_offsets", "query_offset", "commit_offsets", "commit_offset",
                               "query_offset"], methods
        meta.commit_offset_nowait("G", "T", 2, 4000)          # pending when the worker closes:
        await meta.close()                                    # sent first
        await _until(lambda: metadata.query_offset("G", "T", 2) == 4000)
        assert methods[-1] == "commit_offsets"
    mq_loop.run(_with_link(tmp_path, body))
