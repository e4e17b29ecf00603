"""The broker: request handlers by code, name server registration, metadata
persistence, delayed delivery, and a clean stop.

One `Broker` runs in one process with one event loop.  It owns the store (the
flush and dispatch roles run as processes of their own, mq.store.roles) and
the metadata (mq.broker.metadata).  The handler table below is the one place
that maps a request code to its handler."""
from __future__ import annotations

import asyncio
import logging
import os
import time

from mq.remoting import (RemotingClient, RemotingError, RemotingServer, RequestCode as R,
                         ResponseCode as RC, make_response)
from mq.store import MessageStore, PutStatus
from mq.store.roles import start_role_process
from mq.wire import commitlog as wcl
from mq.wire.properties import decode_properties, encode_properties

from .admin import AdminProcessor
from .config import BrokerConfig
from .metadata import SCHEDULE_TOPIC, Metadata, dumps
from .pull import PullProcessor
from .send import BadRequest, SendProcessor

log = logging.getLogger("mq.broker")

SCHEDULE_TICK_S = 0.1
SCHEDULE_BATCH_MAX = 256


class LocalMeta:
    """Awaitable face of Metadata for handlers running next to it; consumer
    membership changes are pushed to the group's connections."""

    def __init__(self, meta: Metadata, on_groups_changed):
        self._m = meta
        self._changed = on_groups_changed

    def __getattr__(self, name):
        fn = getattr(self._m, name)

        async def call(*a, **kw):
            return fn(*a, **kw)
        return call

    async def heartbeat(self, body, conn_key):
        self._changed(self._m.heartbeat(body, conn_key))

    async def unregister_client(self, client_id, producer_group, consumer_group):
        self._changed(self._m.unregister_client(client_id, producer_group, consumer_group))


class Broker:
    def __init__(self, config: BrokerConfig, role_processes: bool = True):
        self.config = config
        self.role_processes = role_processes
        self.store: MessageStore | None = None
        self.metadata: Metadata | None = None
        self.meta: LocalMeta | None = None
        self.servers: list[RemotingServer] = []
        self.client = RemotingClient()
        self.conns: dict[int, object] = {}
        self.boot_ms = int(time.time() * 1000)
        self._roles: list = []
        self._tasks: list[asyncio.Task] = []
        self._register_now = asyncio.Event()
        self.ports: dict[str, int] = {}
        self.master_addr: str | None = None
        self.master_ha_addr: str | None = None
        self.stopping = False

    # ---- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        cfg = self.config
        scfg = cfg.store_config()
        self.store = MessageStore.open(scfg, cfg.brokerIP1, cfg.listenPort, start_roles=not self.role_processes)
        if self.role_processes:
            for role in ("flush", "dispatch"):
                self._roles.append(start_role_process(role, scfg, cfg.brokerIP1, cfg.listenPort))
        self.metadata = Metadata(cfg, self.store.config_dir)
        self.metadata.on_topics_changed = self.register_soon
        self.meta = LocalMeta(self.metadata, self.notify_groups_changed)
        self.send = SendProcessor(self)
        self.pull = PullProcessor(self)
        self.admin = AdminProcessor(self)
        handlers = {R.SEND_MESSAGE: self.send.process, R.SEND_MESSAGE_V2: self.send.process,
                    R.SEND_BATCH_MESSAGE: self.send.process, R.CONSUMER_SEND_MSG_BACK: self.send.send_back,
                    R.PULL_MESSAGE: self.pull.process, **self.admin.handlers()}
        handlers = {code: _guarded(h) for code, h in handlers.items()}
        loop = asyncio.get_running_loop()
        self.pull.start(loop)
        main = RemotingServer("broker", handlers, on_close=self._conn_closed)
        fast_handlers = {c: h for c, h in handlers.items() if c != R.PULL_MESSAGE}
        fast = RemotingServer("broker-fast", fast_handlers, on_close=self._conn_closed)
        self.ports["listen"] = await main.start(cfg.listenAddress, cfg.listenPort)
        self.ports["fast"] = await fast.start(cfg.listenAddress, cfg.fast_port)
        self.servers = [main, fast]
        self._tasks = [asyncio.create_task(t()) for t in (self._register_loop, self._persist_loop,
                                                          self._schedule_loop, self._expire_loop)]
        log.info("broker %s (%s, id %d) serving on %s:%d and :%d; name servers: %s", cfg.brokerName,
                 cfg.brokerRole, cfg.brokerId, cfg.listenAddress, self.ports["listen"], self.ports["fast"],
                 cfg.namesrvAddr or "(none)")

    async def stop(self) -> None:
        """Clean stop: unregister, stop accepting, finish in-flight requests,
        persist metadata, stop the roles (they flush), close the store."""
        self.stopping = True
        await self._unregister_all()
        for s in self.servers:
            await s.stop(grace_s=3.0)
        self.pull.stop()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.metadata.persist_all()
        await self.client.close()
        for proc, stop in self._roles:
            stop.set()
        from mq.store import control as C
        self.store.ctl.wake(C.SEQ_WRITE)
        for proc, _ in self._roles:
            proc.join(10)
            if proc.is_alive():
                log.error("role process %s did not stop; killing it", proc.name)
                proc.kill()
        self.store.close()
        log.info("broker stopped cleanly")

    # ---- store access ---------------------------------------------------------------------
    async def put_message(self, topic, queue_id, body, properties, *, wait=True, **kw):
        return await self.store.put_async(topic, queue_id, body, properties, wait=wait, **kw)

    async def put_batch(self, topic, queue_id, batch_body, **kw):
        return await self.store.put_batch_async(topic, queue_id, batch_body, **kw)

    # ---- connections and notifications --------------------------------------------------------
    def conn_key(self, conn) -> tuple:
        self.conns[conn.id] = conn
        return (0, conn.id)

    def _conn_closed(self, conn) -> None:
        if self.conns.pop(conn.id, None) is not None and self.metadata is not None:
            self.notify_groups_changed(self.metadata.connection_closed((0, conn.id)))

    def notify_groups_changed(self, groups) -> None:
        for group in groups or ():
            log.info("consumer group %s is now %s", group, self.metadata.consumer_ids(group))
            g = self.metadata.groups.get(group) or {}
            if not g.get("notifyConsumerIdsChangedEnable", True):
                continue
            for _, conn_id in self.metadata.consumer_conns(group):
                conn = self.conns.get(conn_id)
                if conn is not None and not conn.closed:
                    conn.push_oneway(R.NOTIFY_CONSUMER_IDS_CHANGED, {"consumerGroup": group})

    def extra_runtime_info(self) -> dict:
        return {}

    # ---- name server registration -----------------------------------------------------------------
    def register_soon(self) -> None:
        self._register_now.set()

    def _register_request(self):
        cfg = self.config
        body = dumps({"filterServerList": [], "topicConfigSerializeWrapper": self.metadata.topics_wrapper()})
        return self.client.request(R.REGISTER_BROKER, {
            "brokerName": cfg.brokerName, "brokerAddr": cfg.broker_addr, "clusterName": cfg.brokerClusterName,
            "haServerAddr": cfg.ha_server_addr, "brokerId": cfg.brokerId, "compressed": False}, body)

    async def register_all(self) -> None:
        for addr in self.config.namesrv_list:
            try:
                resp = await self.client.invoke(addr, self._register_request(),
                                                self.config.registerBrokerTimeoutMills / 1000)
                if resp.code != RC.SUCCESS:
                    log.warning("name server %s refused the registration: %s %s", addr, resp.code, resp.remark)
                    continue
                ext = resp.ext_fields or {}
                if ext.get("masterAddr"):
                    self.master_addr = ext["masterAddr"]
                if ext.get("haServerAddr"):
                    self.master_ha_addr = ext["haServerAddr"]
            except RemotingError as e:
                log.warning("registration with name server %s failed: %s", addr, e)

    async def _unregister_all(self) -> None:
        cfg = self.config
        for addr in cfg.namesrv_list:
            try:
                await self.client.invoke(addr, self.client.request(R.UNREGISTER_BROKER, {
                    "brokerName": cfg.brokerName, "brokerAddr": cfg.broker_addr,
                    "clusterName": cfg.brokerClusterName, "brokerId": cfg.brokerId}), 3)
            except RemotingError as e:
                log.warning("unregistering from name server %s failed: %s", addr, e)

    async def _register_loop(self) -> None:
        while True:
            self._register_now.clear()
            await self.register_all()
            try:
                await asyncio.wait_for(self._register_now.wait(), self.config.registerNameServerPeriod / 1000)
            except asyncio.TimeoutError:
                pass

    # ---- periodic work ----------------------------------------------------------------------------
    async def _persist_loop(self) -> None:
        interval = self.config.flushConsumerOffsetInterval / 1000
        while True:
            await asyncio.sleep(interval)
            try:
                self.metadata.persist_offsets()
                self.metadata.persist_delay()
            except OSError as e:
                log.error("persisting metadata failed: %s", e)

    async def _expire_loop(self) -> None:
        while True:
            await asyncio.sleep(10)
            self.notify_groups_changed(self.metadata.expire_clients())

    async def _schedule_loop(self) -> None:
        """Delivers delayed messages: SCHEDULE_TOPIC_XXXX queue L-1 holds level L;
        an entry's tags code is its delivery time.  Each due message is stored
        again under REAL_TOPIC/REAL_QID, then the level's offset moves."""
        if self.config.brokerRole == "SLAVE":
            return
        while True:
            await asyncio.sleep(SCHEDULE_TICK_S)
            try:
                await self._deliver_due()
            except Exception:
                log.exception("delayed delivery failed; retrying")

    async def _deliver_due(self) -> None:
        now = int(time.time() * 1000)
        levels = len(self.store.config.delay_levels_ms)
        for level in range(1, levels + 1):
            cq = self.store.cqs.get(SCHEDULE_TOPIC, level - 1)
            if cq.slot is None:
                continue
            offset = max(self.metadata.delay_offsets.get(level, 0), cq.min_offset)
            for phy, size, deliver_ms in cq.get(offset, SCHEDULE_BATCH_MAX):
                if deliver_ms > now:
                    break
                rec = wcl.parse_record(self.store.cl.view(phy, size))
                props = decode_properties(rec.properties)
                topic = props.pop("REAL_TOPIC", None)
                qid = int(props.pop("REAL_QID", "0"))
                props.pop("DELAY", None)
                if topic:
                    r = await self.store.put_async(topic, qid, rec.body, encode_properties(props), wait=False,
                                                   flag=rec.flag, sys_flag=rec.sys_flag,
                                                   born_ts_ms=rec.born_timestamp_ms, born_host=rec.born_host,
                                                   born_port=rec.born_port, reconsume_times=rec.reconsume_times)
                    if r.status is not PutStatus.PUT_OK:
                        log.error("delayed message at %d not delivered: %s", phy, r.reason)
                        return
                offset += 1
                self.metadata.delay_offsets[level] = offset


def _guarded(handler):
    async def run(conn, cmd):
        try:
            return await handler(conn, cmd)
        except BadRequest as e:
            return make_response(cmd, e.code, e.remark)
    run.__name__ = getattr(handler, "__name__", "handler")
    return run


__all__ = ["Broker", "os"]
