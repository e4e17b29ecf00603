"""RouteInfoManager: the name server's in-memory registry (spec section 9,
RocketMQ N/routeinfo/RouteInfoManager.java).

    topic_queue_table   topic      -> {brokerName -> QueueData}     only masters (brokerId 0) write it
    broker_addr_table   brokerName -> BrokerData{cluster, brokerName, brokerAddrs {brokerId -> addr}}
    cluster_addr_table  cluster    -> {brokerName}
    broker_live_table   brokerAddr -> BrokerLiveInfo{last update, dataVersion, connection, haServerAddr}
    filter_server_table brokerAddr -> [filter server addr]          kept, never acted on

Nothing here is persisted: brokers re-register every 30 s with every name
server, so a restarted name server is whole again within one period.

Concurrency: every method runs on the event loop thread and none awaits, so
each is atomic with respect to the others (the part Java's read-write lock
plays).  Time is a monotonic millisecond clock (injectable for tests), so a
wall-clock step neither expires nor immortalises brokers.

Invariants (check_invariants, asserted by the tests after every step):
* a BrokerData has at least one address, and no address twice;
* a topic has at least one QueueData; a cluster has at least one brokerName;
* every QueueData's brokerName has a BrokerData (queue data goes when the
  last address of its brokerName goes).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from .bodies import MASTER_ID, PERM_READ, PERM_WRITE, DataVersion, TopicConfig

log = logging.getLogger("mq.namesrv.routeinfo")


@dataclass
class QueueData:
    brokerName: str
    readQueueNums: int
    writeQueueNums: int
    perm: int
    topicSysFlag: int = 0

    def to_obj(self) -> dict:
        return {"brokerName": self.brokerName, "perm": self.perm, "readQueueNums": self.readQueueNums,
                "topicSysFlag": self.topicSysFlag, "writeQueueNums": self.writeQueueNums}


@dataclass
class BrokerData:
    cluster: str
    brokerName: str
    brokerAddrs: dict[int, str] = field(default_factory=dict)

    def to_obj(self) -> dict:
        return {"brokerAddrs": dict(self.brokerAddrs), "brokerName": self.brokerName, "cluster": self.cluster}


@dataclass
class BrokerLiveInfo:
    last_update_ms: int          # on the manager's monotonic clock
    data_version: DataVersion
    conn: Any                    # the connection it last registered on (mq.remoting Connection), or None
    ha_server_addr: str | None
    last_update_wall_s: float = field(default_factory=time.time)   # the same moment on the wall clock, for operators


@dataclass
class RegisterBrokerResult:
    """For a slave: its master's address and HA address, when the master is registered and live."""
    master_addr: str | None = None
    ha_server_addr: str | None = None


def _monotonic_ms() -> int:
    return int(time.monotonic() * 1000)


class RouteInfoManager:
    def __init__(self, expired_ms: int = 120000, clock_ms: Callable[[], int] = _monotonic_ms):
        assert expired_ms > 0, expired_ms
        self.expired_ms = expired_ms   # brokerExpiredMillis (Java BROKER_CHANNEL_EXPIRED_TIME)
        self.topic_queue_table: dict[str, dict[str, QueueData]] = {}
        self.broker_addr_table: dict[str, BrokerData] = {}
        self.cluster_addr_table: dict[str, set[str]] = {}
        self.broker_live_table: dict[str, BrokerLiveInfo] = {}
        self.filter_server_table: dict[str, list[str]] = {}
        self.clock_ms = clock_ms

    # ---------------------------------------------------------------------------------------------
    # Registration

    def register_broker(self, cluster: str, broker_addr: str, broker_name: str, broker_id: int,
                        ha_server_addr: str | None, data_version: DataVersion,
                        topic_configs: dict[str, TopicConfig] | None, filter_servers: list[str] | None,
                        conn: Any = None) -> RegisterBrokerResult:
        """REGISTER_BROKER, step by step as RocketMQ 4.9.8 does it:
        1. brokerName joins the cluster; its BrokerData is created if missing;
        2. an entry with the same address under another brokerId is dropped (slave -> master switch);
        3. brokerAddrs[brokerId] = addr;
        4. master only: when this is a first registration (new BrokerData or new id) or the
           DataVersion differs from the one last registered from this address, QueueData is
           (re)built for every topic in the body; topics absent from the body are left alone;
        5. the live entry is refreshed (now, DataVersion, connection, haServerAddr);
        6. a non-master learns its master's address and HA address if the master is live."""
        self.cluster_addr_table.setdefault(cluster, set()).add(broker_name)
        bd = self.broker_addr_table.get(broker_name)
        first = bd is None
        if bd is None:
            bd = self.broker_addr_table[broker_name] = BrokerData(cluster, broker_name)
        for bid in [bid for bid, addr in bd.brokerAddrs.items() if addr == broker_addr and bid != broker_id]:
            log.info("broker %s moves from id %d to id %d in %s", broker_addr, bid, broker_id, broker_name)
            del bd.brokerAddrs[bid]
        old_addr = bd.brokerAddrs.get(broker_id)
        bd.brokerAddrs[broker_id] = broker_addr
        first = first or old_addr is None

        if broker_id == MASTER_ID and topic_configs is not None:
            if first or self.is_broker_topic_config_changed(broker_addr, data_version):
                for tc in topic_configs.values():
                    self._create_and_update_queue_data(broker_name, tc)

        prev = self.broker_live_table.get(broker_addr)
        self.broker_live_table[broker_addr] = BrokerLiveInfo(self.clock_ms(), data_version, conn, ha_server_addr)
        if prev is None:
            log.info("new broker registered: %s (%s/%s id %d) HA %s", broker_addr, cluster, broker_name,
                     broker_id, ha_server_addr)

        if filter_servers is not None:
            if filter_servers:
                self.filter_server_table[broker_addr] = list(filter_servers)
            else:
                self.filter_server_table.pop(broker_addr, None)

        result = RegisterBrokerResult()
        if broker_id != MASTER_ID:
            master_addr = bd.brokerAddrs.get(MASTER_ID)
            if master_addr is not None:
                master_live = self.broker_live_table.get(master_addr)
                if master_live is not None:
                    result.master_addr = master_addr
                    result.ha_server_addr = master_live.ha_server_addr
        return result

    def _create_and_update_queue_data(self, broker_name: str, tc: TopicConfig) -> None:
        qd = QueueData(broker_name, tc.read_queue_nums, tc.write_queue_nums, tc.perm, tc.topic_sys_flag)
        by_broker = self.topic_queue_table.setdefault(tc.topic_name, {})
        old = by_broker.get(broker_name)
        if old != qd:
            log.info("topic %s on %s: %s -> %s", tc.topic_name, broker_name, old, qd)
        by_broker[broker_name] = qd

    def is_broker_topic_config_changed(self, broker_addr: str, data_version: DataVersion) -> bool:
        prev = self.broker_live_table.get(broker_addr)
        return prev is None or prev.data_version != data_version

    def query_broker_topic_config(self, broker_addr: str) -> DataVersion | None:
        prev = self.broker_live_table.get(broker_addr)
        return None if prev is None else prev.data_version

    def update_broker_info_update_timestamp(self, broker_addr: str) -> None:
        prev = self.broker_live_table.get(broker_addr)
        if prev is not None:
            prev.last_update_ms = self.clock_ms()

    def unregister_broker(self, cluster: str, broker_addr: str, broker_name: str, broker_id: int) -> None:
        """UNREGISTER_BROKER: drop the live entry and brokerAddrs[brokerId]; when that was the
        brokerName's last address, drop the BrokerData, its place in `cluster` and its queue data."""
        removed = self.broker_live_table.pop(broker_addr, None)
        self.filter_server_table.pop(broker_addr, None)
        log.info("unregister broker %s (%s/%s id %d)%s", broker_addr, cluster, broker_name, broker_id,
                 "" if removed else ": it was not live")
        bd = self.broker_addr_table.get(broker_name)
        if bd is None:
            return
        bd.brokerAddrs.pop(broker_id, None)
        if bd.brokerAddrs:
            return
        del self.broker_addr_table[broker_name]
        names = self.cluster_addr_table.get(cluster)
        if names is not None:
            names.discard(broker_name)
            if not names:
                del self.cluster_addr_table[cluster]
        self._remove_topics_of_broker_name(broker_name)

    # ---------------------------------------------------------------------------------------------
    # Liveness

    def scan_not_active_brokers(self) -> list[tuple[str, BrokerLiveInfo]]:
        """Removes every broker not heard from for longer than `expired_ms` and returns
        (addr, live info) of each, so the caller can close its connection.  Removal cascades as in
        on_broker_gone."""
        now = self.clock_ms()
        gone = [(addr, li) for addr, li in self.broker_live_table.items()
                if li.last_update_ms + self.expired_ms < now]
        for addr, li in gone:
            log.warning("broker %s expired: silent for %d ms (limit %d ms)", addr, now - li.last_update_ms,
                        self.expired_ms)
            del self.broker_live_table[addr]
            self.on_broker_gone(addr)
        return gone

    def on_connection_closed(self, conn: Any) -> list[str]:
        """BrokerHousekeepingService: every broker whose last registration came over `conn` is
        gone (Java drops only the first it finds; a connection carries one broker in practice).
        Returns their addresses."""
        addrs = [addr for addr, li in self.broker_live_table.items() if li.conn is conn]
        for addr in addrs:
            log.info("connection of broker %s closed: removing it", addr)
            del self.broker_live_table[addr]
            self.on_broker_gone(addr)
        return addrs

    def on_broker_gone(self, broker_addr: str) -> None:
        """onChannelDestroy's cleanup for an address already out of the live table: drop it from
        every BrokerData; a BrokerData left empty goes, with its brokerName in every cluster and
        its QueueData in every topic (topics left without queues go too)."""
        self.filter_server_table.pop(broker_addr, None)
        emptied = []
        for name, bd in list(self.broker_addr_table.items()):
            for bid in [bid for bid, addr in bd.brokerAddrs.items() if addr == broker_addr]:
                del bd.brokerAddrs[bid]
            if not bd.brokerAddrs:
                del self.broker_addr_table[name]
                emptied.append(name)
        for name in emptied:
            for cluster in list(self.cluster_addr_table):
                names = self.cluster_addr_table[cluster]
                names.discard(name)
                if not names:
                    del self.cluster_addr_table[cluster]
            self._remove_topics_of_broker_name(name)

    def _remove_topics_of_broker_name(self, broker_name: str) -> None:
        for topic in list(self.topic_queue_table):
            by_broker = self.topic_queue_table[topic]
            if by_broker.pop(broker_name, None) is not None and not by_broker:
                log.info("topic %s has no queues left: removed", topic)
                del self.topic_queue_table[topic]

    # ---------------------------------------------------------------------------------------------
    # Queries (return plain objects for mq.namesrv.bodies.fastjson_dumps)

    def pickup_topic_route_data(self, topic: str) -> dict | None:
        """TopicRouteData of `topic`, or None (TOPIC_NOT_EXIST) when it has no queue data or none of
        its brokerNames has a BrokerData.  Lists are sorted by brokerName (Java: hash order)."""
        by_broker = self.topic_queue_table.get(topic)
        if not by_broker:
            return None
        queue_datas = [by_broker[name].to_obj() for name in sorted(by_broker)]
        broker_datas, filter_servers = [], {}
        for name in sorted(by_broker):
            bd = self.broker_addr_table.get(name)
            if bd is None:
                continue
            broker_datas.append(bd.to_obj())
            for addr in bd.brokerAddrs.values():
                servers = self.filter_server_table.get(addr)
                if servers:
                    filter_servers[addr] = list(servers)
        if not broker_datas:
            return None
        return {"brokerDatas": broker_datas, "filterServerTable": filter_servers, "queueDatas": queue_datas}

    def cluster_info(self) -> dict:
        return {"brokerAddrTable": {name: bd.to_obj() for name, bd in self.broker_addr_table.items()},
                "clusterAddrTable": {c: sorted(names) for c, names in self.cluster_addr_table.items()}}

    def all_topics(self) -> list[str]:
        return sorted(self.topic_queue_table)

    def topics_by_cluster(self, cluster: str) -> list[str]:
        """Topics with queue data on any brokerName of `cluster` (none for an unknown cluster)."""
        names = self.cluster_addr_table.get(cluster) or set()
        return sorted(t for t, by_broker in self.topic_queue_table.items() if names & by_broker.keys())

    def delete_topic(self, topic: str, cluster: str | None = None) -> None:
        """DELETE_TOPIC_IN_NAMESRV: the whole topic, or only its queues on `cluster`'s brokerNames."""
        if not cluster:
            self.topic_queue_table.pop(topic, None)
            return
        by_broker = self.topic_queue_table.get(topic)
        if by_broker is None:
            return
        for name in self.cluster_addr_table.get(cluster, ()):
            by_broker.pop(name, None)
        if not by_broker:
            del self.topic_queue_table[topic]

    def operate_write_perm(self, broker_name: str, wipe: bool) -> int:
        """WIPE_WRITE_PERM_OF_BROKER (perm &= ~WRITE) or ADD_WRITE_PERM_OF_BROKER (perm = READ|WRITE)
        on every topic of `broker_name`; returns how many topics it touched."""
        count = 0
        for by_broker in self.topic_queue_table.values():
            qd = by_broker.get(broker_name)
            if qd is None:
                continue
            qd.perm = qd.perm & ~PERM_WRITE if wipe else PERM_READ | PERM_WRITE
            count += 1
        return count

    def check_invariants(self) -> None:
        for name, bd in self.broker_addr_table.items():
            assert bd.brokerName == name, (name, bd)
            assert bd.brokerAddrs, f"BrokerData {name} has no address"
            assert len(set(bd.brokerAddrs.values())) == len(bd.brokerAddrs), bd
        for topic, by_broker in self.topic_queue_table.items():
            assert by_broker, f"topic {topic} has no queue data"
            for name, qd in by_broker.items():
                assert qd.brokerName == name, (topic, name, qd)
                assert name in self.broker_addr_table, f"topic {topic}: queue data of unknown broker {name}"
        for cluster, names in self.cluster_addr_table.items():
            assert names, f"cluster {cluster} is empty"
