"""ClientInstance: what every producer, consumer and admin client shares (Java's MQClientInstance, one per
client object here): the remoting connection pool, the name server list, the route cache, broker addresses,
heartbeats and the periodic tasks.

Name servers: `namesrv_addr` is one address or several separated by ';'.  A request goes to the current
one; a connection failure or timeout moves on to the next (NettyRemotingClient's namesrvIndex), starting
from a random index.

Broker addresses: the union of brokerAddrs over every route fetched, refreshed whenever a route is.  A
route refresh that reveals a broker address not seen before calls `on_new_broker` (clients send a
heartbeat there at once instead of waiting for the 30 s tick).

Periodic tasks are plain asyncio tasks created by `every()`; `close()` cancels them, then closes every
connection.  Nothing here retries a broker request: callers decide (producers retry other brokers,
consumers back off)."""
from __future__ import annotations

import asyncio
import itertools
import logging
import os
import random
import time
from typing import Awaitable, Callable

from mq.remoting import RemotingClient, RemotingError
from mq.wire.codes import RequestCode as R, ResponseCode as RC

from .errors import MQBrokerError, MQClientError
from .message import MASTER_ID, local_ip
from .route import TopicRouteData, find_broker_addr_in_subscribe

log = logging.getLogger("mq.client")

NAMESRV_TIMEOUT_S = 3.0
BROKER_TIMEOUT_S = 3.0
_instance_seq = itertools.count(1)


def parse_namesrv_addr(namesrv_addr: str | list[str]) -> list[str]:
    addrs = namesrv_addr if isinstance(namesrv_addr, (list, tuple)) else str(namesrv_addr or "").split(";")
    addrs = [a.strip() for a in addrs if a and a.strip()]
    if not addrs:
        raise MQClientError("no name server address (-n host:port, or NAMESRV_ADDR)")
    for a in addrs:
        host, sep, port = a.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise MQClientError(f"bad name server address {a!r}: expected host:port")
    return addrs


def default_instance_name() -> str:
    """pid#n: unique per client object in this process (Java: pid#nanoTime for clustering clients)."""
    return f"{os.getpid()}#{next(_instance_seq)}"


class ClientInstance:
    def __init__(self, namesrv_addr: str | list[str], instance_name: str | None = None,
                 timeout_s: float = BROKER_TIMEOUT_S, credentials=None):
        self.namesrv_addrs = parse_namesrv_addr(namesrv_addr)
        self._ns_index = random.randrange(len(self.namesrv_addrs))
        # credentials (mq.acl.sign.SessionCredentials): every request signed for an ACL broker
        self.remoting = RemotingClient(credentials=credentials)
        self.client_ip = local_ip()
        self.instance_name = instance_name or default_instance_name()
        self.client_id = f"{self.client_ip}@{self.instance_name}"
        self.timeout_s = timeout_s
        self.routes: dict[str, TopicRouteData] = {}
        self.broker_addrs: dict[str, dict[int, str]] = {}     # brokerName -> brokerId -> addr
        self.broker_versions: dict[str, int] = {}             # addr -> version from heartbeat answers
        self.on_new_broker: Callable[[], Awaitable[None]] | None = None
        self._tasks: set[asyncio.Task] = set()
        self.closed = False

    # ---- plumbing ----------------------------------------------------------------------------------
    def request(self, code: int, ext: dict | None = None, body: bytes = b""):
        return self.remoting.request(code, ext, body)

    async def invoke(self, addr: str, code: int, ext: dict | None = None, body: bytes = b"",
                     timeout_s: float | None = None):
        """One request to `addr`; returns the response whatever its code.  Raises RemotingError."""
        return await self.remoting.invoke(addr, self.request(code, ext, body), timeout_s or self.timeout_s)

    async def invoke_ok(self, addr: str, code: int, ext: dict | None = None, body: bytes = b"",
                        timeout_s: float | None = None):
        """Like invoke, but a non-SUCCESS answer raises MQBrokerError."""
        r = await self.invoke(addr, code, ext, body, timeout_s)
        if r.code != RC.SUCCESS:
            raise MQBrokerError(r.code, r.remark, addr)
        return r

    async def invoke_oneway(self, addr: str, code: int, ext: dict | None = None, body: bytes = b"") -> None:
        await self.remoting.invoke_oneway(addr, self.request(code, ext, body))

    async def invoke_namesrv(self, code: int, ext: dict | None = None, body: bytes = b"",
                             timeout_s: float = NAMESRV_TIMEOUT_S):
        """A request to the current name server, moving on to the next ones on connection errors and
        timeouts.  Raises the last RemotingError when none answers."""
        last: Exception | None = None
        n = len(self.namesrv_addrs)
        for i in range(n):
            addr = self.namesrv_addrs[(self._ns_index + i) % n]
            try:
                r = await self.remoting.invoke(addr, self.request(code, ext, body), timeout_s)
                self._ns_index = (self._ns_index + i) % n
                return r
            except RemotingError as e:
                log.info("name server %s: %s", addr, e)
                last = e
        raise last  # type: ignore[misc]

    def every(self, interval_s: float, fn: Callable[[], Awaitable[None]], initial_delay_s: float | None = None,
              name: str = "") -> asyncio.Task:
        """Run fn every interval_s until close(); failures are logged, never fatal."""
        async def loop():
            await asyncio.sleep(interval_s if initial_delay_s is None else initial_delay_s)
            while True:
                try:
                    await fn()
                except asyncio.CancelledError:
                    raise
                except Exception as e:   # noqa: BLE001 - a periodic task must survive anything
                    log.warning("%s failed: %s", name or fn, e)
                await asyncio.sleep(interval_s)
        return self.spawn(loop(), name)

    def spawn(self, coro, name: str = "") -> asyncio.Task:
        """A background task, cancelled by close(); its failure is logged, never left unretrieved."""
        t = asyncio.ensure_future(coro)
        self._tasks.add(t)

        def done(task: asyncio.Task) -> None:
            self._tasks.discard(task)
            if not task.cancelled() and task.exception() is not None:
                log.info("background task %s failed: %s", name or task, task.exception())
        t.add_done_callback(done)
        return t

    async def close(self) -> None:
        self.closed = True
        for t in list(self._tasks):
            t.cancel()
        for t in list(self._tasks):
            try:
                await t
            except (asyncio.CancelledError, Exception):   # noqa: BLE001
                pass
        await self.remoting.close()

    # ---- routes ------------------------------------------------------------------------------------
    async def fetch_route(self, topic: str) -> TopicRouteData | None:
        """GET_ROUTEINFO_BY_TOPIC; None when the name server says TOPIC_NOT_EXIST."""
        r = await self.invoke_namesrv(R.GET_ROUTEINFO_BY_TOPIC, {"topic": topic, "acceptStandardJsonOnly": True})
        if r.code == RC.TOPIC_NOT_EXIST:
            return None
        if r.code != RC.SUCCESS:
            raise MQBrokerError(r.code, r.remark, "name server")
        return TopicRouteData.decode(r.body)

    async def update_route(self, topic: str) -> TopicRouteData | None:
        """Fetch and cache the route of `topic` (dropping it when the topic is gone); None if none."""
        route = await self.fetch_route(topic)
        if route is None:
            self.routes.pop(topic, None)
            return None
        self.routes[topic] = route
        await self._merge_brokers(route)
        return route

    async def _merge_brokers(self, route: TopicRouteData) -> None:
        new = False
        for b in route.broker_datas:
            known = self.broker_addrs.get(b.broker_name, {})
            if any(known.get(i) != a for i, a in b.broker_addrs.items()):
                new = True
        self._rebuild_broker_addrs()
        if new and self.on_new_broker is not None:
            try:
                await self.on_new_broker()
            except (RemotingError, MQClientError) as e:
                log.info("heartbeat to new broker failed: %s", e)

    def _rebuild_broker_addrs(self) -> None:
        table: dict[str, dict[int, str]] = {}
        for route in self.routes.values():
            for b in route.broker_datas:
                table.setdefault(b.broker_name, {}).update(b.broker_addrs)
        self.broker_addrs = table

    def forget_route(self, topic: str) -> None:
        self.routes.pop(topic, None)
        self._rebuild_broker_addrs()

    async def refresh_routes(self, topics) -> None:
        """Refresh every listed topic's route; one failure does not stop the others."""
        for topic in list(topics):
            try:
                await self.update_route(topic)
            except (RemotingError, MQClientError, ValueError) as e:
                log.info("route refresh of %s failed: %s", topic, e)

    # ---- broker addresses ---------------------------------------------------------------------------
    def master_addr(self, broker_name: str) -> str | None:
        return self.broker_addrs.get(broker_name, {}).get(MASTER_ID)

    def admin_addr(self, broker_name: str) -> str | None:
        """Where offsets are queried and committed (Java's findBrokerAddressInAdmin):
        the master, or while it is gone the lowest-id slave."""
        addrs = self.broker_addrs.get(broker_name, {})
        if not addrs:
            return None
        return addrs.get(MASTER_ID) or addrs[min(addrs)]

    def pull_addr(self, broker_name: str, suggested_id: int) -> tuple[str, bool] | None:
        return find_broker_addr_in_subscribe(self.broker_addrs.get(broker_name, {}), suggested_id)

    def all_broker_addrs(self, masters_only: bool) -> list[str]:
        out = []
        for name in sorted(self.broker_addrs):
            for bid, addr in sorted(self.broker_addrs[name].items()):
                if bid == MASTER_ID or not masters_only:
                    out.append(addr)
        return out

    async def heartbeat(self, body: bytes, masters_only: bool) -> int:
        """HEART_BEAT (34) to every known broker (masters only for producer-only clients); returns how
        many answered SUCCESS.  Failures are logged: the next tick tries again."""
        ok = 0
        for addr in self.all_broker_addrs(masters_only):
            try:
                r = await self.invoke(addr, R.HEART_BEAT, None, body)
                if r.code == RC.SUCCESS:
                    ok += 1
                    self.broker_versions[addr] = r.version
                else:
                    log.info("heartbeat to %s: code %d %s", addr, r.code, r.remark)
            except RemotingError as e:
                log.info("heartbeat to %s failed: %s", addr, e)
        return ok

    async def unregister(self, producer_group: str | None = None, consumer_group: str | None = None) -> None:
        """UNREGISTER_CLIENT (35) to every known broker; best effort."""
        ext = {"clientID": self.client_id, "producerGroup": producer_group, "consumerGroup": consumer_group}
        for addr in self.all_broker_addrs(masters_only=consumer_group is None):
            try:
                await self.invoke(addr, R.UNREGISTER_CLIENT, ext, timeout_s=1.0)
            except RemotingError as e:
                log.debug("unregister at %s failed: %s", addr, e)


def now_ms() -> int:
    return int(time.time() * 1000)
