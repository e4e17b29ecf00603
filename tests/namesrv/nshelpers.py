"""Helpers for name server tests: an in-process NameServer on 127.0.0.1 port 0
(pytest-asyncio is not installed: each test drives its own asyncio.run), and
REGISTER_BROKER frames built from spec 2.1 by hand, independent of
mq.namesrv.bodies."""
from __future__ import annotations

import asyncio
import json
import time
import zlib
from contextlib import asynccontextmanager

import pytest

from mq.namesrv import NameServer
from mq.remoting import RemotingClient, RequestCode

CLUSTER = "DefaultCluster"
MASTER_ADDR = "127.0.0.1:10911"
SLAVE_ADDR = "127.0.0.1:10921"
MASTER_HA = "127.0.0.1:10912"
SLAVE_HA = "127.0.0.1:10922"


def run(coro, timeout_s: float = 15.0):
    """asyncio.run with a bound, so a hung test fails instead of stalling the suite."""
    async def bounded():
        return await asyncio.wait_for(coro, timeout_s)
    return asyncio.run(bounded())


@asynccontextmanager
async def namesrv(kv_path, **options):
    """A started NameServer on 127.0.0.1:0; yields (server, "127.0.0.1:port")."""
    options.setdefault("listenAddress", "127.0.0.1")
    options.setdefault("listenPort", 0)
    ns = NameServer(kvConfigPath=str(kv_path), **options)
    port = await ns.start()
    try:
        yield ns, f"127.0.0.1:{port}"
    finally:
        await ns.stop()


async def wait_for(predicate, timeout_s: float = 5.0, what: str = "condition"):
    """Polls `predicate` (sync or async) until true; fails the test after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(0.02)


def topic_config(name, read=4, write=4, perm=6, sys_flag=0):
    """TopicConfig JSON as fastjson writes it (keys alphabetical)."""
    return {"order": False, "perm": perm, "readQueueNums": read, "topicFilterType": "SINGLE_TAG",
            "topicName": name, "topicSysFlag": sys_flag, "writeQueueNums": write}


def register_body(topics: dict, counter=1, timestamp=1700000000000) -> bytes:
    """RegisterBrokerBody JSON (spec 2.1), uncompressed."""
    return json.dumps({"filterServerList": [],
                       "topicConfigSerializeWrapper": {
                           "dataVersion": {"counter": counter, "timestamp": timestamp},
                           "topicConfigTable": {name: topic_config(name, *spec) for name, spec in topics.items()}}},
                      separators=(",", ":")).encode()


def register_cmd(client: RemotingClient, *, name="broker-a", addr=MASTER_ADDR, broker_id=0, ha=MASTER_HA,
                 cluster=CLUSTER, topics=None, counter=1, timestamp=1700000000000, body=None,
                 compressed=False, crc=None):
    """REGISTER_BROKER (103) as a 4.9.8 broker sends it: header fields + body + bodyCrc32."""
    if body is None:
        body = register_body(topics or {}, counter, timestamp)
    return client.request(RequestCode.REGISTER_BROKER, {
        "brokerName": name, "brokerAddr": addr, "clusterName": cluster, "haServerAddr": ha,
        "brokerId": broker_id, "compressed": compressed,
        "bodyCrc32": zlib.crc32(body) & 0x7FFFFFFF if crc is None else crc}, body)


async def route(client: RemotingClient, ns_addr: str, topic: str, version: int | None = None, **ext):
    cmd = client.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic, **ext})
    if version is not None:
        cmd.version = version
    return await client.invoke(ns_addr, cmd, 3)
