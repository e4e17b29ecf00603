"""Routes as clients use them (spec 2.1 TopicRouteData and ClusterInfo, section 5 for the pull address).

    TopicRouteData  {"brokerDatas":[{"brokerAddrs":{0:"addr",..},"brokerName","cluster"}],
                     "queueDatas":[{"brokerName","perm","readQueueNums","writeQueueNums","topicSysFlag"}], ..}
    ClusterInfo     {"brokerAddrTable":{name: BrokerData},"clusterAddrTable":{cluster:[name,..]}}

Both key forms (`{0:"a"}` and `{"0":"a"}`) and both `topicSysFlag` / `topicSynFlag` are accepted.

How a route turns into queues (MQClientInstance.topicRouteData2TopicPublishInfo / ...SubscribeInfo):
* publish: for each QueueData in brokerName order whose perm is WRITE and whose broker has a master (id 0),
  queues 0..writeQueueNums-1;
* subscribe: for each QueueData whose perm is READ, queues 0..readQueueNums-1;
* a new topic borrows TBW102's route with min(defaultTopicQueueNums, readQueueNums) queues per broker.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from mq.wire.fastjson import loads_body
from mq.wire.topics import PERM_INHERIT, PERM_PRIORITY, PERM_READ, PERM_WRITE, perm_to_string  # noqa: F401

from .message import MASTER_ID, MessageQueue



@dataclass
class BrokerData:
    broker_name: str
    cluster: str
    broker_addrs: dict[int, str]           # brokerId -> "ip:port"; 0 is the master

    @classmethod
    def from_json(cls, d: dict) -> "BrokerData":
        return cls(str(d.get("brokerName", "")), str(d.get("cluster", "")),
                   {int(k): str(v) for k, v in (d.get("brokerAddrs") or {}).items()})

    @property
    def master_addr(self) -> str | None:
        return self.broker_addrs.get(MASTER_ID)

    def select_addr(self) -> str | None:
        """The master if present, else the lowest-id slave (BrokerData.selectBrokerAddr picks a random one)."""
        if not self.broker_addrs:
            return None
        return self.broker_addrs.get(MASTER_ID) or self.broker_addrs[min(self.broker_addrs)]

    def as_json(self) -> dict:
        return {"brokerAddrs": {str(k): v for k, v in sorted(self.broker_addrs.items())},
                "brokerName": self.broker_name, "cluster": self.cluster}


@dataclass
class QueueData:
    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    topic_sys_flag: int = 0

    @classmethod
    def from_json(cls, d: dict) -> "QueueData":
        return cls(str(d.get("brokerName", "")), int(d.get("readQueueNums", 0)), int(d.get("writeQueueNums", 0)),
                   int(d.get("perm", 0)), int(d.get("topicSysFlag", d.get("topicSynFlag", 0)) or 0))

    def as_json(self) -> dict:
        return {"brokerName": self.broker_name, "perm": self.perm, "readQueueNums": self.read_queue_nums,
                "topicSysFlag": self.topic_sys_flag, "writeQueueNums": self.write_queue_nums}


@dataclass
class TopicRouteData:
    queue_datas: list[QueueData]
    broker_datas: list[BrokerData]
    order_topic_conf: str | None = None
    filter_server_table: dict = field(default_factory=dict)

    @classmethod
    def decode(cls, body: bytes) -> "TopicRouteData":
        d = loads_body(body, "TopicRouteData")
        return cls([QueueData.from_json(q) for q in d.get("queueDatas") or []],
                   [BrokerData.from_json(b) for b in d.get("brokerDatas") or []],
                   d.get("orderTopicConf"), dict(d.get("filterServerTable") or {}))

    def as_json(self) -> dict:
        out = {"brokerDatas": [b.as_json() for b in self.broker_datas],
               "filterServerTable": self.filter_server_table,
               "queueDatas": [q.as_json() for q in self.queue_datas]}
        if self.order_topic_conf:
            out["orderTopicConf"] = self.order_topic_conf
        return out

    def broker(self, name: str) -> BrokerData | None:
        for b in self.broker_datas:
            if b.broker_name == name:
                return b
        return None

    def publish_queues(self, topic: str) -> list[MessageQueue]:
        out = []
        for qd in sorted(self.queue_datas, key=lambda q: q.broker_name):
            b = self.broker(qd.broker_name)
            if not qd.perm & PERM_WRITE or b is None or b.master_addr is None:
                continue
            out.extend(MessageQueue(topic, qd.broker_name, i) for i in range(qd.write_queue_nums))
        return out

    def subscribe_queues(self, topic: str) -> list[MessageQueue]:
        out = []
        for qd in self.queue_datas:
            if qd.perm & PERM_READ:
                out.extend(MessageQueue(topic, qd.broker_name, i) for i in range(qd.read_queue_nums))
        return sorted(out)

    def borrowed_for_new_topic(self, queue_nums_max: int) -> "TopicRouteData":
        """TBW102's route with at most queue_nums_max read/write queues per broker (producer auto-create)."""
        qds = []
        for qd in self.queue_datas:
            n = min(queue_nums_max, qd.read_queue_nums)
            qds.append(QueueData(qd.broker_name, n, n, qd.perm, qd.topic_sys_flag))
        return TopicRouteData(qds, list(self.broker_datas))


@dataclass
class ClusterInfo:
    broker_addr_table: dict[str, BrokerData]
    cluster_addr_table: dict[str, list[str]]

    @classmethod
    def decode(cls, body: bytes) -> "ClusterInfo":
        d = loads_body(body, "ClusterInfo")
        return cls({str(k): BrokerData.from_json(v) for k, v in (d.get("brokerAddrTable") or {}).items()},
                   {str(k): sorted(str(n) for n in v) for k, v in (d.get("clusterAddrTable") or {}).items()})

    def master_addrs(self, cluster: str) -> list[str]:
        """Master addresses of every broker of `cluster`, by broker name (CommandUtil.fetchMasterAddrByClusterName)."""
        out = []
        for name in self.cluster_addr_table.get(cluster, []):
            b = self.broker_addr_table.get(name)
            if b is not None and b.master_addr:
                out.append(b.master_addr)
        return out

    def all_addrs(self, cluster: str) -> list[str]:
        out = []
        for name in self.cluster_addr_table.get(cluster, []):
            b = self.broker_addr_table.get(name)
            if b is not None:
                out.extend(addr for _, addr in sorted(b.broker_addrs.items()))
        return out


def find_broker_addr_in_subscribe(broker_addrs: dict[int, str], broker_id: int) -> tuple[str, bool] | None:
    """Where to pull a queue from given the broker's suggestion (MQClientInstance.findBrokerAddressInSubscribe,
    spec 5): brokerAddrs[broker_id]; if missing and broker_id != 0, brokerAddrs[broker_id + 1]; failing that
    the lowest id present.  Returns (addr, is_slave) or None when the broker has no address at all."""
    addr = broker_addrs.get(broker_id)
    slave = broker_id != MASTER_ID
    if addr is None and slave:
        addr = broker_addrs.get(broker_id + 1)
    if addr is None:
        if not broker_addrs:
            return None
        first = min(broker_addrs)
        addr, slave = broker_addrs[first], first != MASTER_ID
    return addr, slave
