"""AdminClient (DefaultMQAdminExt): the requests behind `mqadmin`.

    name server  106 GET_BROKER_CLUSTER_INFO   206 GET_ALL_TOPIC_LIST_FROM_NAMESERVER
                 105 GET_ROUTEINFO_BY_TOPIC    216 DELETE_TOPIC_IN_NAMESRV (every name server)
    brokers      17 UPDATE_AND_CREATE_TOPIC (each master of a cluster, or one address)
                 215 DELETE_TOPIC_IN_BROKER (each master of the cluster)
                 202 GET_TOPIC_STATS_INFO   -> TopicStatsTable          208 GET_CONSUME_STATS -> ConsumeStats
                 203 / 204 consumer / producer connections     317 GET_BROKER_CONSUME_STATS -> ConsumeStatsList
                 (RocketMQ's classes as fastjson writes them, object keys and all: mq.wire.adminbodies)
                 28 GET_BROKER_RUNTIME_INFO -> {"table":{..}}      26 GET_BROKER_CONFIG -> properties text
                 33 VIEW_MESSAGE_BY_ID (header offset = commit-log offset) -> one stored record
                 12 QUERY_MESSAGE (topic, key, maxNum, time range; _UNIQUE_KEY_QUERY) -> stored records
                 300 QUERY_TOPIC_CONSUME_BY_WHO -> {"groupList": [...]}
                 314 R.CLONE_GROUP_OFFSET      321 R.QUERY_CONSUME_QUEUE -> QueryConsumeQueueResponseBody
                 11 PULL_MESSAGE of one message (queryMsgByOffset), group TOOLS_CONSUMER, no offset commit
    name servers 100/101/102 PUT/GET/DELETE_KV_CONFIG (every name server; GET from one)
                 318/319 UPDATE/R.GET_NAMESRV_CONFIG (properties text, every name server)
    DLedger      51005 LEADERSHIP_TRANSFER to the leader's DLedger peer port (mq.wire.dledger_rpc)

Every method raises MQBrokerError for a failure answer, RemotingError when a server cannot be reached,
MQClientError for anything else (unknown cluster, no route, no message there).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from mq.remoting import RemotingError
from mq.wire.codes import RequestCode as R, ResponseCode as RC
from mq.wire.topics import TopicConfig, attributes_text
from mq.options import parse_properties
from mq.wire import adminbodies as bodies
from mq.wire import commitlog as wcl
from mq.wire.errors import WireError

from .consumer import pull_kernel
from .errors import MQBrokerError, MQClientError
from .instance import ClientInstance
from .message import MessageExt, MessageQueue, PullStatus, SubscriptionData, decode_messages, message_from_record
from .route import ClusterInfo, TopicRouteData

TOOLS_CONSUMER_GROUP = "TOOLS_CONSUMER"
ADMIN_TIMEOUT_S = 5.0
NAMESPACE_ORDER_TOPIC_CONFIG = "ORDER_TOPIC_CONFIG"     # NamesrvUtil's namespace of updateOrderConf


def version_desc(version: int) -> str:
    """MQVersion.getVersionDesc for 4.x and 5.x clients (ordinals from V4_0_0_SNAPSHOT = 212 go
    SNAPSHOT, release for each x.y.z); the number itself for older ones."""
    n, snapshot = divmod(version - 212, 2)
    if version < 212 or n >= 200:
        return str(version)
    return f"V{4 + n // 100}_{n % 100 // 10}_{n % 10}" + ("_SNAPSHOT" if snapshot == 0 else "")


def _body(r, what: str, decode):
    try:
        return decode(r.body or b"")
    except ValueError as e:
        raise MQClientError(f"undecodable {what}: {e}") from None


parse_properties_text = parse_properties   # GET_BROKER_CONFIG bodies are properties text


@dataclass
class ConsumeStats:
    # topic, brokerName, queueId, brokerOffset, consumerOffset, lastTimestamp, diff (brokerOffset - consumerOffset)
    rows: list[dict] = field(default_factory=list)
    consume_tps: float = 0.0
    diff_total: int = 0


class AdminClient:
    def __init__(self, namesrv_addr: str, *, timeout_s: float = ADMIN_TIMEOUT_S, instance_name: str | None = None,
                 credentials=None):
        self.instance = ClientInstance(namesrv_addr, instance_name or "admin", timeout_s, credentials=credentials)
        self.timeout_s = timeout_s

    async def close(self) -> None:
        await self.instance.close()

    async def __aenter__(self) -> "AdminClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def _namesrv_ok(self, code: int, ext: dict | None = None):
        r = await self.instance.invoke_namesrv(code, ext, timeout_s=self.timeout_s)
        if r.code != RC.SUCCESS:
            raise MQBrokerError(r.code, r.remark, "name server")
        return r

    # ---- name server ----------------------------------------------------------------------------------
    async def cluster_info(self) -> ClusterInfo:
        return ClusterInfo.decode((await self._namesrv_ok(R.GET_BROKER_CLUSTER_INFO)).body)

    async def topic_list(self) -> list[str]:
        body = json.loads((await self._namesrv_ok(R.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)).body or b"{}")
        return sorted(body.get("topicList") or [])

    async def topic_route(self, topic: str) -> TopicRouteData:
        route = await self.instance.update_route(topic)
        if route is None:
            raise MQBrokerError(RC.TOPIC_NOT_EXIST, f"No topic route info in name server for the topic: {topic}",
                                "name server")
        return route

    async def _cluster_masters(self, cluster: str) -> list[str]:
        info = await self.cluster_info()
        if cluster not in info.cluster_addr_table:
            known = ", ".join(sorted(info.cluster_addr_table)) or "none"
            raise MQClientError(f"cluster [{cluster}] not found (known clusters: {known})")
        masters = info.master_addrs(cluster)
        if not masters:
            raise MQClientError(f"cluster [{cluster}] has no master broker")
        return masters

    # ---- topics ----------------------------------------------------------------------------------------
    async def create_topic(self, config: TopicConfig, *, cluster: str | None = None,
                           broker_addr: str | None = None) -> list[str]:
        """UPDATE_AND_CREATE_TOPIC at `broker_addr`, or at every master of `cluster`; returns the addresses."""
        if (cluster is None) == (broker_addr is None):
            raise MQClientError("give exactly one of cluster and broker_addr")
        addrs = [broker_addr] if broker_addr else await self._cluster_masters(cluster)
        ext = {"topic": config.topic_name, "defaultTopic": "TBW102", "readQueueNums": config.read_queue_nums,
               "writeQueueNums": config.write_queue_nums, "perm": config.perm,
               "topicFilterType": config.topic_filter_type, "topicSysFlag": config.topic_sys_flag,
               "order": config.order}
        if config.attributes:
            ext["attributes"] = attributes_text(config.attributes)
        for addr in addrs:
            await self.instance.invoke_ok(addr, R.UPDATE_AND_CREATE_TOPIC, ext, timeout_s=self.timeout_s)
        return addrs

    async def delete_topic(self, topic: str, cluster: str) -> list[str]:
        """DELETE_TOPIC_IN_BROKER at every master of `cluster`, then DELETE_TOPIC_IN_NAMESRV at every
        name server; returns the broker addresses."""
        addrs = await self._cluster_masters(cluster)
        for addr in addrs:
            await self.instance.invoke_ok(addr, R.DELETE_TOPIC_IN_BROKER, {"topic": topic}, timeout_s=self.timeout_s)
        for ns in self.instance.namesrv_addrs:
            await self.instance.invoke_ok(ns, R.DELETE_TOPIC_IN_NAMESRV, {"topic": topic, "clusterName": cluster},
                                          timeout_s=self.timeout_s)
        return addrs

    async def acl_edit(self, code: int, ext: dict, *, cluster: str | None = None,
                       broker_addr: str | None = None) -> list[str]:
        """One of the ACL codes (UPDATE_AND_CREATE_ACL_CONFIG 50, DELETE_ACL_CONFIG 51,
        UPDATE_GLOBAL_WHITE_ADDRS_CONFIG 53) at `broker_addr` or every master of `cluster`;
        returns the addresses.  MQBrokerError (code 209/210/211 and the reason) on a refusal."""
        return [addr for addr, _ in await self.on_brokers(code, ext, cluster=cluster, broker_addr=broker_addr)]

    async def on_brokers(self, code: int, ext: dict | None = None, body: bytes = b"", *, cluster: str | None = None,
                         broker_addr: str | None = None) -> list[tuple[str, object]]:
        """One request at `broker_addr`, or at every master of `cluster`: [(address, response)].
        MQBrokerError for the first refusal."""
        if (cluster is None) == (broker_addr is None):
            raise MQClientError("give exactly one of cluster and broker_addr")
        addrs = [broker_addr] if broker_addr else await self._cluster_masters(cluster)
        return [(addr, await self.instance.invoke_ok(addr, code, ext, body, timeout_s=self.timeout_s))
                for addr in addrs]

    # ---- groups, offsets, connections, config (mq.broker.ops) -----------------------------------------
    async def update_sub_group(self, config: dict, **where) -> list[str]:
        """UPDATE_AND_CREATE_SUBSCRIPTIONGROUP (200) with a SubscriptionGroupConfig."""
        body = json.dumps(config, separators=(",", ":")).encode()
        return [a for a, _ in await self.on_brokers(R.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, None, body, **where)]

    async def delete_sub_group(self, group: str, remove_offset: bool, **where) -> list[str]:
        """DELETE_SUBSCRIPTIONGROUP (207)."""
        ext = {"groupName": group, "removeOffset": str(remove_offset).lower()}
        return [a for a, _ in await self.on_brokers(R.DELETE_SUBSCRIPTIONGROUP, ext, **where)]

    async def update_broker_config(self, values: dict, **where) -> list[str]:
        """UPDATE_BROKER_CONFIG (25), body properties text."""
        body = "".join(f"{k}={v}\n" for k, v in values.items()).encode()
        return [a for a, _ in await self.on_brokers(R.UPDATE_BROKER_CONFIG, None, body, **where)]

    async def write_perm(self, broker_name: str, add: bool) -> list[tuple[str, int]]:
        """WIPE_WRITE_PERM_OF_BROKER (205) or ADD_WRITE_PERM_OF_BROKER (327) at every name server:
        [(name server, topics changed)]."""
        code, key = (R.ADD_WRITE_PERM_OF_BROKER, "addTopicCount") if add else \
            (R.WIPE_WRITE_PERM_OF_BROKER, "wipeTopicCount")
        out = []
        for ns in self.instance.namesrv_addrs:
            r = await self.instance.invoke_ok(ns, code, {"brokerName": broker_name}, timeout_s=self.timeout_s)
            out.append((ns, int((r.ext_fields or {}).get(key, 0))))
        return out

    async def reset_offset_by_time(self, topic: str, group: str, ts_ms: int, force: bool = True) -> list[tuple]:
        """resetOffsetByTime: INVOKE_BROKER_TO_RESET_OFFSET (222) at the master of each broker of the
        route, which tells the group's online consumers; where none is online (CONSUMER_NOT_ONLINE)
        the offsets are committed here instead, queue by queue, as RocketMQ's tool falls back to.
        Returns [(brokerName, queueId, offset)]."""
        from mq.wire.offsets import decode_reset_offset_body
        route = await self.topic_route(topic)
        out = []
        for bd in sorted(route.broker_datas, key=lambda b: b.broker_name):
            addr = bd.master_addr
            if addr is None:
                continue
            ext = {"topic": topic, "group": group, "timestamp": ts_ms, "isForce": str(force).lower()}
            r = await self.instance.invoke(addr, R.INVOKE_BROKER_TO_RESET_OFFSET, ext, timeout_s=self.timeout_s)
            if r.code == RC.SUCCESS:
                table = decode_reset_offset_body(r.body or b"")
                out += sorted((b, q, off) for (_, b, q), off in table.items())
                continue
            if r.code != RC.CONSUMER_NOT_ONLINE:
                raise MQBrokerError(r.code, r.remark, addr)
            queues = [qd.write_queue_nums for qd in route.queue_datas if qd.broker_name == bd.broker_name]
            for q in range(queues[0] if queues else 0):
                mq_ext = {"topic": topic, "queueId": q}
                cur = await self.instance.invoke(addr, R.QUERY_CONSUMER_OFFSET, {**mq_ext, "consumerGroup": group},
                                                 timeout_s=self.timeout_s)
                current = int(cur.ext_fields["offset"]) if cur.code == RC.SUCCESS else -1
                at = await self.queue_offset_at(MessageQueue(topic, bd.broker_name, q), addr,
                                                None if ts_ms == -1 else ts_ms)
                offset = at if force or current < 0 or at < current else current
                await self.instance.invoke_ok(addr, R.UPDATE_CONSUMER_OFFSET,
                                              {**mq_ext, "consumerGroup": group, "commitOffset": offset},
                                              timeout_s=self.timeout_s)
                out.append((bd.broker_name, q, offset))
        return out

    async def masters_of(self, topic: str) -> list[tuple[str, str]]:
        route = await self.topic_route(topic)
        return [(bd.broker_name, bd.master_addr) for bd in sorted(route.broker_datas, key=lambda b: b.broker_name)
                if bd.master_addr]

    async def producer_connections(self, group: str, topic: str) -> list[dict]:
        """GET_PRODUCER_CONNECTION_LIST (204) at the masters of the topic's route, merged."""
        seen: dict[str, dict] = {}
        for _, addr in await self.masters_of(topic):
            r = await self.instance.invoke(addr, R.GET_PRODUCER_CONNECTION_LIST, {"producerGroup": group},
                                           timeout_s=self.timeout_s)
            if r.code == RC.SUCCESS:
                for c in _body(r, "ProducerConnection", bodies.decode_connections)["connectionSet"]:
                    seen[c["clientId"]] = c
        if not seen:
            raise MQClientError(f"no producer of group {group} is online at the brokers of topic {topic}")
        return [seen[k] for k in sorted(seen)]

    async def consumer_connection(self, group: str, broker_addr: str | None = None) -> dict:
        """GET_CONSUMER_CONNECTION_LIST (203) at `broker_addr`, or at the masters of the group's
        %RETRY% topic (every consumer heartbeats to every broker of its topics)."""
        addrs = [broker_addr] if broker_addr else [a for _, a in await self.masters_of(f"%RETRY%{group}")]
        last = None
        for addr in addrs:
            r = await self.instance.invoke(addr, R.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": group},
                                           timeout_s=self.timeout_s)
            if r.code == RC.SUCCESS:
                return _body(r, "ConsumerConnection", bodies.decode_connections)
            last = MQBrokerError(r.code, r.remark, addr)
        raise last or MQClientError(f"no broker for group {group}")

    async def broker_consume_stats(self, addr: str, is_order: bool = False, timeout_ms: int = 50000) -> dict:
        """GET_BROKER_CONSUME_STATS (317) of one broker: {"brokerAddr", "totalDiff", "groups":
        [(group, [(rows, consumeTps) per topic])]} (mq.wire.adminbodies.decode_consume_stats_list)."""
        r = await self.instance.invoke_ok(addr, R.GET_BROKER_CONSUME_STATS,
                                          {"isOrder": str(is_order).lower(), "timeoutMillis": timeout_ms},
                                          timeout_s=max(self.timeout_s, timeout_ms / 1000))
        return _body(r, "ConsumeStatsList", bodies.decode_consume_stats_list)

    async def view_broker_stats(self, addr: str, stats_name: str, stats_key: str) -> dict | None:
        """VIEW_BROKER_STATS_DATA (315): {"statsMinute"|"statsHour"|"statsDay": {"sum", "tps", "avgpt"}},
        or None when the broker has no such counter."""
        r = await self.instance.invoke(addr, R.VIEW_BROKER_STATS_DATA, {"statsName": stats_name,
                                                                        "statsKey": stats_key},
                                       timeout_s=self.timeout_s)
        return json.loads(r.body) if r.code == RC.SUCCESS else None

    async def topic_status(self, topic: str) -> list[dict]:
        """GET_TOPIC_STATS_INFO from the master of every broker of the topic's route, rows sorted."""
        route = await self.topic_route(topic)
        rows = []
        for b in sorted(route.broker_datas, key=lambda b: b.broker_name):
            if b.master_addr is None:
                continue
            r = await self.instance.invoke_ok(b.master_addr, R.GET_TOPIC_STATS_INFO, {"topic": topic},
                                              timeout_s=self.timeout_s)
            rows.extend(_body(r, "TopicStatsTable", bodies.decode_topic_stats))
        return sorted(rows, key=lambda x: (x.get("brokerName", ""), int(x.get("queueId", 0))))

    # ---- consumers ---------------------------------------------------------------------------------------
    async def consumer_progress(self, group: str, topic: str | None = None, *, info: ClusterInfo | None = None,
                                allow_empty: bool = False) -> ConsumeStats:
        """GET_CONSUME_STATS from the master of every broker of every cluster (`info`: the cluster
        info to use, else fetched), merged; MQClientError when no broker has a row, unless
        allow_empty."""
        info = info or await self.cluster_info()
        stats = ConsumeStats()
        for name in sorted(info.broker_addr_table):
            addr = info.broker_addr_table[name].master_addr
            if addr is None:
                continue
            r = await self.instance.invoke_ok(addr, R.GET_CONSUME_STATS, {"consumerGroup": group, "topic": topic},
                                              timeout_s=self.timeout_s)
            rows, tps = _body(r, "ConsumeStats", bodies.decode_consume_stats)
            stats.rows += rows
            stats.consume_tps += tps
        stats.rows.sort(key=lambda x: (x.get("topic", ""), x.get("brokerName", ""), int(x.get("queueId", 0))))
        stats.diff_total = sum(r["diff"] for r in stats.rows)
        if not stats.rows and not allow_empty:
            raise MQClientError(f"no consume progress for group [{group}]"
                                + (f" on topic [{topic}]" if topic else "")
                                + ": the group has committed no offset (or does not exist)")
        return stats

    async def groups_progress(self) -> list[dict]:
        """consumerProgress without a group, as RocketMQ's: every group that has a %RETRY% topic at
        the name server, with its online consumers (count, lowest version, type, model), consume
        TPS and diff total, sorted by group.  Each: {"group", "count", "version", "consumeType",
        "messageModel", "consumeTps", "diffTotal"} (version None when nobody is online)."""
        info = await self.cluster_info()
        groups = sorted(t[len("%RETRY%"):] for t in await self.topic_list() if t.startswith("%RETRY%"))
        out = []
        for group in groups:
            try:
                stats = await self.consumer_progress(group, info=info, allow_empty=True)
            except (MQBrokerError, RemotingError):
                continue
            try:
                cc = await self.consumer_connection(group)
            except (MQClientError, MQBrokerError, RemotingError):
                cc = {}
            conns = cc.get("connectionSet") or []
            out.append({"group": group, "count": len(conns),
                        "version": min((int(c.get("version") or 0) for c in conns), default=None),
                        "consumeType": cc.get("consumeType"), "messageModel": cc.get("messageModel"),
                        "consumeTps": stats.consume_tps, "diffTotal": stats.diff_total})
        return out

    async def consumer_ids(self, group: str, broker_addr: str) -> list[str]:
        """GET_CONSUMER_LIST_BY_GROUP at one broker ([] when nobody is registered)."""
        r = await self.instance.invoke(broker_addr, R.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": group},
                                       timeout_s=self.timeout_s)
        if r.code != RC.SUCCESS:
            return []
        return sorted(json.loads(r.body).get("consumerIdList") or [])

    async def clone_group_offset(self, src: str, dest: str, topic: str | None, offline: bool) -> list[str]:
        """R.CLONE_GROUP_OFFSET (314) at the master of every broker of %RETRY%<src>'s route, as
        DefaultMQAdminExt.cloneGroupOffset; returns the addresses."""
        ext = {"srcGroup": src, "destGroup": dest, "topic": topic, "offline": str(offline).lower()}
        addrs = [a for _, a in await self.masters_of(f"%RETRY%{src}")]
        for addr in addrs:
            await self.instance.invoke_ok(addr, R.CLONE_GROUP_OFFSET, ext, timeout_s=self.timeout_s)
        return addrs

    async def query_consume_queue(self, addr: str, topic: str, queue_id: int, index: int, count: int,
                                  group: str | None = None) -> tuple[dict | None, str | None]:
        """R.QUERY_CONSUME_QUEUE (321) at `addr`: (QueryConsumeQueueResponseBody as plain values, or None
        when the broker answered without one, the answer's remark)."""
        ext = {"topic": topic, "queueId": queue_id, "index": index, "count": count, "consumerGroup": group}
        r = await self.instance.invoke_ok(addr, R.QUERY_CONSUME_QUEUE, ext, timeout_s=self.timeout_s)
        return (_body(r, "QueryConsumeQueueResponseBody", bodies.decode_query_consume_queue) if r.body else None,
                r.remark)

    # ---- name servers: KV config and their own config ---------------------------------------------------------
    async def put_kv_config(self, namespace: str, key: str, value: str) -> list[str]:
        """PUT_KV_CONFIG (100) at every name server (they share nothing); returns them."""
        for ns in self.instance.namesrv_addrs:
            await self.instance.invoke_ok(ns, R.PUT_KV_CONFIG, {"namespace": namespace, "key": key, "value": value},
                                          timeout_s=self.timeout_s)
        return list(self.instance.namesrv_addrs)

    async def delete_kv_config(self, namespace: str, key: str) -> list[str]:
        """DELETE_KV_CONFIG (102) at every name server."""
        for ns in self.instance.namesrv_addrs:
            await self.instance.invoke_ok(ns, R.DELETE_KV_CONFIG, {"namespace": namespace, "key": key},
                                          timeout_s=self.timeout_s)
        return list(self.instance.namesrv_addrs)

    async def get_kv_config(self, namespace: str, key: str) -> str | None:
        """GET_KV_CONFIG (101) at one name server; None when it has no such item."""
        r = await self.instance.invoke_namesrv(R.GET_KV_CONFIG, {"namespace": namespace, "key": key},
                                               timeout_s=self.timeout_s)
        if r.code == RC.QUERY_NOT_FOUND:
            return None
        if r.code != RC.SUCCESS:
            raise MQBrokerError(r.code, r.remark, "name server")
        return (r.ext_fields or {}).get("value")

    async def namesrv_config(self) -> dict[str, dict[str, str]]:
        """R.GET_NAMESRV_CONFIG (319) of every name server: {address: {key: value}}."""
        out = {}
        for ns in self.instance.namesrv_addrs:
            r = await self.instance.invoke_ok(ns, R.GET_NAMESRV_CONFIG, timeout_s=self.timeout_s)
            out[ns] = parse_properties_text((r.body or b"").decode("utf-8", "replace"))
        return out

    async def update_namesrv_config(self, values: dict[str, str]) -> list[str]:
        """R.UPDATE_NAMESRV_CONFIG (318), body properties text, at every name server."""
        body = "".join(f"{k}={v}\n" for k, v in values.items()).encode()
        for ns in self.instance.namesrv_addrs:
            await self.instance.invoke_ok(ns, R.UPDATE_NAMESRV_CONFIG, None, body, timeout_s=self.timeout_s)
        return list(self.instance.namesrv_addrs)

    async def topic_clusters(self, topic: str) -> list[str]:
        """The clusters of the brokers in the topic's route (getTopicClusterList)."""
        route = await self.topic_route(topic)
        info = await self.cluster_info()
        names = {bd.broker_name for bd in route.broker_datas}
        return sorted(c for c, brokers in info.cluster_addr_table.items() if names & set(brokers))

    # ---- brokers --------------------------------------------------------------------------------------------
    async def broker_runtime_info(self, addr: str) -> dict[str, str]:
        r = await self.instance.invoke_ok(addr, R.GET_BROKER_RUNTIME_INFO, timeout_s=self.timeout_s)
        return {str(k): str(v) for k, v in (json.loads(r.body).get("table") or {}).items()}

    # ---- DLedger groups (requests to a member's DLedger peer port, mq.wire.dledger_rpc) --------------
    async def dledger_group(self, broker_name: str) -> dict:
        """What a DLedger group's members say of themselves: {"group", "peers" {id: peer addr},
        "leader" id or None, "members" {id: runtime info of the member's broker}}, from the
        brokers of `broker_name` the name server knows."""
        info = await self.cluster_info()
        b = info.broker_addr_table.get(broker_name)
        if b is None:
            raise MQClientError(f"broker [{broker_name}] is not registered with the name server")
        out: dict = {"group": None, "peers": {}, "leader": None, "members": {}}
        for addr in b.broker_addrs.values():
            try:
                t = await self.broker_runtime_info(addr)
            except (RemotingError, MQBrokerError):
                continue
            if "dLegerSelfId" not in t:
                raise MQClientError(f"broker [{broker_name}] at {addr} is not in DLedger mode")
            out["group"] = t.get("dLegerGroup") or out["group"]
            out["members"][t["dLegerSelfId"]] = t
            for item in filter(None, t.get("dLegerPeers", "").split(";")):
                pid, _, paddr = item.partition("-")
                if pid == t["dLegerSelfId"] or pid not in out["peers"]:
                    out["peers"][pid] = paddr          # a member's own entry is its own port, never a relay
            if t.get("dLegerRole") == "LEADER":
                out["leader"] = t["dLegerSelfId"]
        if not out["members"]:
            raise MQClientError(f"no broker of [{broker_name}] answered")
        return out

    async def dledger_transfer(self, peer_addr: str, group: str, transferee: str) -> dict:
        """LEADERSHIP_TRANSFER (51005) to the leader's DLedger port: hand leadership to `transferee`
        (it takes over once caught up).  Returns the answer's fields (code 200: started)."""
        from mq.wire import dledger_rpc as RPC
        ext = RPC.encode(RPC.LEADERSHIP_TRANSFER, False, {"group": group, "transfereeId": transferee})
        r = await self.instance.invoke(peer_addr, RPC.LEADERSHIP_TRANSFER, ext, timeout_s=self.timeout_s)
        return RPC.decode(RPC.LEADERSHIP_TRANSFER, True, r.ext_fields)

    async def broker_config(self, addr: str) -> dict[str, str]:
        r = await self.instance.invoke_ok(addr, R.GET_BROKER_CONFIG, timeout_s=self.timeout_s)
        return parse_properties_text(r.body.decode("utf-8", "replace"))

    async def view_message(self, addr: str, commitlog_offset: int, broker_name: str = "") -> MessageExt:
        """VIEW_MESSAGE_BY_ID: the record at a commit-log offset of the broker at `addr`."""
        r = await self.instance.invoke_ok(addr, R.VIEW_MESSAGE_BY_ID, {"offset": commitlog_offset},
                                          timeout_s=self.timeout_s)
        try:
            return message_from_record(wcl.parse_record(r.body), broker_name)
        except (WireError, ValueError) as e:
            raise MQClientError(f"the broker answered an undecodable record: {e}") from None

    async def query_message(self, topic: str, key: str, max_num: int = 64, begin_ms: int = 0,
                            end_ms: int = 2 ** 63 - 1, unique: bool = False) -> list[MessageExt]:
        """QUERY_MESSAGE to every broker of the topic's route (the master where there is one):
        the messages stored under `key` (a KEYS word, or with unique=True the UNIQ_KEY),
        newest first.  An empty list when none has it."""
        route = await self.topic_route(topic)
        ext = {"topic": topic, "key": key, "maxNum": max_num, "beginTimestamp": begin_ms, "endTimestamp": end_ms}
        if unique:
            ext["_UNIQUE_KEY_QUERY"] = "true"
        found: list[MessageExt] = []
        for bd in route.broker_datas:
            addr = bd.select_addr()
            if addr is None:
                continue
            r = await self.instance.invoke(addr, R.QUERY_MESSAGE, ext, timeout_s=self.timeout_s)
            if r.code == RC.QUERY_NOT_FOUND:
                continue
            if r.code != RC.SUCCESS:
                raise MQBrokerError(r.code, r.remark or "", addr)
            try:
                found += decode_messages(r.body, bd.broker_name)
            except (WireError, ValueError) as e:
                raise MQClientError(f"{addr} answered an undecodable query body: {e}") from None
        found.sort(key=lambda m: m.store_timestamp_ms, reverse=True)
        return found[:max_num]

    async def view_message_by_id(self, msg_id: str) -> MessageExt:
        """The message of an offset msgId (store host + commit-log offset), from that broker."""
        from mq.wire.msgid import decode_offset_msg_id
        host, port, offset = decode_offset_msg_id(msg_id)
        addr = f"{host}:{port}"
        names = {a: bd.broker_name for bd in (await self.cluster_info()).broker_addr_table.values()
                 for a in bd.broker_addrs.values()}
        if addr not in names:
            raise MQClientError(f"{msg_id} is not an offset msgId of a broker of this cluster "
                                f"(it names {addr}); give the topic to look it up as a unique key")
        return await self.view_message(addr, offset, names[addr])

    async def consumed_by(self, topic: str) -> list[str]:
        """QUERY_TOPIC_CONSUME_BY_WHO on every broker of the route: groups consuming the topic."""
        route = await self.topic_route(topic)
        groups: set[str] = set()
        for bd in route.broker_datas:
            addr = bd.select_addr()
            if addr is not None:
                r = await self.instance.invoke_ok(addr, R.QUERY_TOPIC_CONSUME_BY_WHO, {"topic": topic},
                                                  timeout_s=self.timeout_s)
                groups.update(json.loads(r.body or b"{}").get("groupList", []))
        return sorted(groups)

    async def message_track(self, m: MessageExt) -> list[tuple[str, str]]:
        """(group, CONSUMED | NOT_CONSUME_YET | NOT_ONLINE) for each group consuming the message's
        topic: its committed offset of the message's queue compared with the message's queue offset."""
        out = []
        for group in await self.consumed_by(m.topic):
            stats = await self.consumer_progress(group, m.topic)
            done = any(row["brokerName"] == m.broker_name and row["queueId"] == m.queue_id
                       and row["consumerOffset"] > m.queue_offset for row in stats.rows)
            if done:
                out.append((group, "CONSUMED"))
                continue
            online = False
            bd = (await self.topic_route(m.topic)).broker(m.broker_name)
            if bd is not None and bd.select_addr():
                try:
                    online = bool(await self.consumer_ids(group, bd.select_addr()))
                except MQBrokerError:
                    online = False
            out.append((group, "NOT_CONSUME_YET" if online else "NOT_ONLINE"))
        return out

    async def queue_offset_at(self, mq: MessageQueue, addr: str, ts_ms: int | None) -> int:
        """SEARCH_OFFSET_BY_TIMESTAMP for ts_ms, or GET_MAX_OFFSET when ts_ms is None."""
        ext = {"topic": mq.topic, "queueId": mq.queue_id}
        if ts_ms is None:
            r = await self.instance.invoke_ok(addr, R.GET_MAX_OFFSET, ext, timeout_s=self.timeout_s)
        else:
            r = await self.instance.invoke_ok(addr, R.SEARCH_OFFSET_BY_TIMESTAMP, {**ext, "timestamp": ts_ms},
                                              timeout_s=self.timeout_s)
        return int(r.ext_fields["offset"])

    async def messages_from(self, topic: str, broker_name: str | None = None, queue_id: int | None = None,
                            offset: int | None = None, begin_ms: int | None = None, end_ms: int | None = None,
                            group: str | None = None, sub_expression: str = "*", batch: int = 32):
        """Messages pulled queue by queue (only broker_name's, only queue_id), from `offset`, else
        those stored from begin_ms on; up to those stored at end_ms (inclusive), else to the
        queue's end (group TOOLS_CONSUMER unless given).  Nothing is committed.

        The time window is checked on each message's store time.  SEARCH_OFFSET_BY_TIMESTAMP
        answers the message nearest in time, which may lie on either side of the time asked:
        RocketMQ's tools take it as an exact bound at both ends (and leave out the message at
        the end offset), so they drop messages inside the window.  Here the walk starts at the
        offset found for begin_ms (nearest: at most one message early, skipped by its time) and
        stops at the first message stored after end_ms."""
        route = await self.topic_route(topic)
        sub = SubscriptionData.build(topic, sub_expression)
        for mq in route.subscribe_queues(topic):
            if (broker_name is not None and mq.broker_name != broker_name) or \
                    (queue_id is not None and mq.queue_id != queue_id):
                continue
            bd = route.broker(mq.broker_name)
            addr = bd.select_addr() if bd else None
            if addr is None:
                continue
            lo = offset if offset is not None else await self.queue_offset_at(mq, addr, begin_ms or 0)
            hi = await self.queue_offset_at(mq, addr, None)
            past_end = False
            while lo < hi and not past_end:
                try:
                    res = await pull_kernel(self.instance, group or TOOLS_CONSUMER_GROUP, mq, sub, lo, batch,
                                            suspend=False, timeout_s=self.timeout_s)
                except WireError as e:
                    raise MQClientError(f"the broker answered an undecodable pull body: {e}") from None
                if res.status is PullStatus.NO_MATCHED_MSG and res.next_begin_offset > lo:
                    lo = res.next_begin_offset          # a stretch of other tags: go on after it
                    continue
                if res.status is not PullStatus.FOUND:
                    break
                for m in res.messages:
                    if m.queue_offset >= hi or (end_ms is not None and m.store_timestamp_ms > end_ms):
                        past_end = True
                        break
                    if offset is None and begin_ms and m.store_timestamp_ms < begin_ms:
                        continue
                    yield m
                lo = res.next_begin_offset

    async def query_msg_by_offset(self, topic: str, broker_name: str, queue_id: int, queue_offset: int) -> MessageExt:
        """The message at consume-queue offset `queue_offset` of topic@broker_name:queue_id (a pull of one
        message at the master, group TOOLS_CONSUMER, no offset committed)."""
        route = await self.topic_route(topic)
        if route.broker(broker_name) is None:
            raise MQClientError(f"broker [{broker_name}] is not in the route of topic [{topic}]")
        mq = MessageQueue(topic, broker_name, queue_id)
        try:
            res = await pull_kernel(self.instance, TOOLS_CONSUMER_GROUP, mq, SubscriptionData.build(topic, "*"),
                                    queue_offset, 1, suspend=False, timeout_s=self.timeout_s)
        except WireError as e:
            raise MQClientError(f"the broker answered an undecodable pull body: {e}") from None
        if res.status is not PullStatus.FOUND or not res.messages or res.messages[0].queue_offset != queue_offset:
            raise MQClientError(f"no message at offset {queue_offset} of {mq} (pull status {res.status.value}; "
                                f"the queue holds offsets {res.min_offset}..{res.max_offset - 1})")
        return res.messages[0]


__all__ = ["AdminClient", "TopicConfig", "ConsumeStats", "parse_properties_text", "TOOLS_CONSUMER_GROUP",
           "RemotingError", "version_desc", "NAMESPACE_ORDER_TOPIC_CONFIG"]
