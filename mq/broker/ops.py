"""The operators' request codes behind mqadmin (RocketMQ's AdminBrokerProcessor):

    GET_CONSUMER_CONNECTION_LIST 203   a group's online consumers, subscriptions and mode
    GET_PRODUCER_CONNECTION_LIST 204   a producer group's online producers
    DELETE_SUBSCRIPTIONGROUP     207   a group's config (and, with removeOffset, its offsets)
    INVOKE_BROKER_TO_RESET_OFFSET 222  offsets of a group on a topic moved to a time: the broker
                                       computes them and sends RESET_CONSUMER_CLIENT_OFFSET (220)
                                       to every online consumer of the group, which resets and
                                       commits them (CONSUMER_NOT_ONLINE when none is: mqadmin
                                       then commits them itself, as RocketMQ's does)
    UPDATE_BROKER_CONFIG         25    keys that are safe at run time (RUNTIME_KEYS), applied by
                                       every process of the broker and written to its conf file
    GET_BROKER_CONSUME_STATS     317   every group's consume stats on this broker
    VIEW_BROKER_STATS_DATA       315   a counter's last minute, hour and day (mq.broker.statsdata)
    CLONE_GROUP_OFFSET           314   a group's committed offsets copied to another group
    QUERY_CONSUME_QUEUE          321   entries of a ConsumeQueue from an index (mqadmin queryCq)

A connection is RocketMQ's Connection: clientId, clientAddr, language, version (from the
client's heartbeats; mq.broker.metadata).  Every body is written as fastjson writes RocketMQ's
classes (mq.wire.adminbodies), so RocketMQ's tools and dashboards decode them."""
from __future__ import annotations

import logging

from mq.remoting import ResponseCode as RC, make_response
from mq.wire.codes import RequestCode as R
from mq import options
from mq.wire.adminbodies import (connection, consume_stats, encode_broker_stats_data, encode_consume_stats_list,
                                 encode_consumer_connection, encode_producer_connection, encode_query_consume_queue,
                                 subscription_data)
from mq.wire.offsets import encode_reset_offset_body
from mq.wire.topics import TOPIC_LEN_MAX, TOPIC_RE

from .admin import Processor
from .config import ALL_OPTIONS, IGNORED_KEYS
from .send import as_bool, as_int

QUERY_CQ_COUNT_MAX = 1000           # entries one QUERY_CONSUME_QUEUE answers at most (ours; RocketMQ: a file)

log = logging.getLogger("mq.broker.ops")

# what every process reads at the moment it uses it (never cached at start), so a change
# takes effect at once: a send's, a pull's, a slave wait's, a group lookup's
RUNTIME_KEYS = frozenset({
    "brokerPermission", "autoCreateSubscriptionGroup", "slaveReadEnable", "accessMessageInMemoryMaxRatio",
    "maxTransferCountOnMessageInMemory", "maxTransferBytesOnMessageInMemory", "longPollingEnable",
    "shortPollingTimeMills", "slaveTimeout", "rejectTransactionMessage", "transactionTimeOut", "transactionCheckMax",
    "transactionCheckInterval",
})


def parse_runtime_update(text: str) -> dict:
    """The properties of an UPDATE_BROKER_CONFIG body, parsed and checked (mq.options)."""
    return options.parse_runtime_update(text, ALL_OPTIONS, RUNTIME_KEYS, IGNORED_KEYS, "broker", "broker.conf")


class OpsProcessor(Processor):
    def handlers(self) -> dict:
        return {
            R.GET_CONSUMER_CONNECTION_LIST: self.consumer_connection,
            R.GET_PRODUCER_CONNECTION_LIST: self.producer_connections,
            R.DELETE_SUBSCRIPTIONGROUP: self.delete_group,
            R.INVOKE_BROKER_TO_RESET_OFFSET: self.reset_offset,
            R.UPDATE_BROKER_CONFIG: self.update_config,
            R.GET_BROKER_CONSUME_STATS: self.broker_consume_stats,
            R.VIEW_BROKER_STATS_DATA: self.stats_data,
            R.CLONE_GROUP_OFFSET: self.clone_group_offset,
            R.QUERY_CONSUME_QUEUE: self.query_consume_queue,
        }

    async def consumer_connection(self, conn, cmd):
        group = (cmd.ext_fields or {}).get("consumerGroup", "")
        cc = await self.meta.consumer_connection(group)
        if cc is None:
            return make_response(cmd, RC.CONSUMER_NOT_ONLINE, f"the consumer group[{group}] not online")
        subs = {topic: _subscription(sd) for topic, sd in (cc.get("subscriptionTable") or {}).items()}
        return make_response(cmd, RC.SUCCESS, body=encode_consumer_connection(
            [_connection(c) for c in cc.get("connectionSet") or []], subs, cc.get("consumeType"),
            cc.get("messageModel"), cc.get("consumeFromWhere")))

    async def producer_connections(self, conn, cmd):
        group = (cmd.ext_fields or {}).get("producerGroup", "")
        conns = await self.meta.producer_connections(group)
        if not conns:
            return make_response(cmd, RC.SYSTEM_ERROR, f"the producer group[{group}] not exist")
        return make_response(cmd, RC.SUCCESS, body=encode_producer_connection([_connection(c) for c in conns]))

    async def delete_group(self, conn, cmd):
        if self.config.brokerRole == "SLAVE":
            return make_response(cmd, RC.SYSTEM_ERROR, "Can't modify topic or subscription group from slave broker")
        h = cmd.ext_fields or {}
        name = h.get("groupName", "")
        if not name:
            return make_response(cmd, RC.INVALID_PARAMETER, "groupName is required")
        existed = await self.meta.delete_group(name, as_bool(h.get("removeOffset") or h.get("cleanOffset")))
        if not existed:
            log.warning("delete subscription group %s: not here", name)
        return make_response(cmd, RC.SUCCESS)

    async def reset_offset(self, conn, cmd):
        h = cmd.ext_fields or {}
        topic, group = h.get("topic", ""), h.get("group", "")
        try:
            ts = as_int(h.get("timestamp"), -1)
        except ValueError as e:
            return make_response(cmd, RC.INVALID_PARAMETER, f"bad header: {e}")
        force = as_bool(h.get("isForce", "true"))
        tc = await self.meta.topic(topic)
        if tc is None:
            return make_response(cmd, RC.SYSTEM_ERROR,
                                 f"[reset-offset] reset offset failed, no topic in this broker. topic={topic}")
        table = await self.reset_table(topic, group, ts, force, tc["writeQueueNums"])
        if table is None:
            return make_response(cmd, RC.SYSTEM_ERROR, f"THe consumer group <{group}> not exist")
        rows = [[t, b, q, off] for (t, b, q), off in table.items()]
        notified = await self.meta.reset_offsets_notify(group, topic, ts, force, rows)
        if not notified:
            return make_response(cmd, RC.CONSUMER_NOT_ONLINE,
                                 f"Consumer not online, so can not reset offset, Group: {group} Topic: {topic} "
                                 f"Timestamp: {ts}")
        return make_response(cmd, RC.SUCCESS, body=encode_reset_offset_body(table))

    async def reset_table(self, topic: str, group: str, ts: int, force: bool, queues: int):
        """Broker2Client.resetOffset's table: each queue's offset at `ts` (-1: its end), or the
        group's own offset when that is earlier and not `force`; None when the group has no
        offset on the topic here."""
        table, known = {}, False
        for q in range(queues):
            cur = await self.meta.query_offset(group, topic, q)
            known |= cur is not None
            at = self.store.max_offset(topic, q) if ts == -1 else self.store.search_offset_by_time(topic, q, ts)
            at = max(at, 0)
            table[(topic, self.config.brokerName, q)] = at if force or cur is None or at < cur else cur
        return table if known else None

    async def update_config(self, conn, cmd):
        try:
            values = parse_runtime_update((cmd.body or b"").decode("utf-8", "replace"))
        except ValueError as e:
            return make_response(cmd, RC.SYSTEM_ERROR, f"update broker config failed: {e}")
        for k, v in values.items():          # here at once; the other processes on the supervisor's push
            setattr(self.config, k, v)
        await self.meta.update_config(values)
        log.warning("broker config changed at run time by %s: %s", conn.peer, values)
        return make_response(cmd, RC.SUCCESS)

    async def stats_data(self, conn, cmd):
        h = cmd.ext_fields or {}
        name, key = h.get("statsName", ""), h.get("statsKey", "")
        data = await self.meta.stats_data(name, key)
        if data is None:
            return make_response(cmd, RC.SYSTEM_ERROR, f"The stats <{name}> <{key}> not exist")
        return make_response(cmd, RC.SUCCESS, body=encode_broker_stats_data(data))

    async def broker_consume_stats(self, conn, cmd):
        """ConsumeStatsList, as AdminBrokerProcessor.fetchAllConsumeStatsInBroker: for every
        subscription group of the broker, one ConsumeStats per topic it has offsets for (over the
        topic's write queues; with isOrder only order topics); totalDiff sums
        brokerOffset - consumerOffset over all of them."""
        order_only = as_bool((cmd.ext_fields or {}).get("isOrder"))
        groups = (await self.meta.groups_wrapper()).get("subscriptionGroupTable") or {}
        out, total = [], 0
        for g in groups:
            per_topic = await self.broker.admin.group_stats(g, order_only=order_only, queues_of="writeQueueNums",
                                                            per_topic=True)
            stats = []
            for rows, tps in per_topic:
                total += sum(r["brokerOffset"] - r["consumerOffset"] for r in rows)
                stats.append(consume_stats(rows, tps))
            out.append((g, stats))
        return make_response(cmd, RC.SUCCESS, body=encode_consume_stats_list(self.config.broker_addr, out, total))

    async def clone_group_offset(self, conn, cmd):
        """CLONE_GROUP_OFFSET (314), as AdminBrokerProcessor.cloneGroupOffset: the committed offsets
        of srcGroup on `topic` (every topic it has offsets for when none is given) are committed
        for destGroup too.  A topic with no config here is skipped, and unless `offline`, so is a
        topic srcGroup's online consumers do not subscribe.  (RocketMQ clones `topic` itself for
        each topic it walks, which copies nothing when no topic was given; each topic here.)"""
        h = cmd.ext_fields or {}
        src, dest, only = h.get("srcGroup") or "", h.get("destGroup") or "", h.get("topic") or ""
        if not src or not dest:
            return make_response(cmd, RC.SYSTEM_ERROR, "srcGroup and destGroup are required")
        if self.config.brokerRole == "SLAVE":
            return make_response(cmd, RC.SYSTEM_ERROR, "Can't clone group offset on a slave broker")
        table = (await self.meta.offsets_wrapper()).get("offsetTable") or {}
        topics = [only] if only else sorted(k.rpartition("@")[0] for k in table if k.rpartition("@")[2] == src)
        subscribed = set()
        if not as_bool(h.get("offline")):
            cc = await self.meta.consumer_connection(src)
            subscribed = set((cc or {}).get("subscriptionTable") or {})
        cloned = 0
        for topic in topics:
            if await self.meta.topic(topic) is None or (subscribed and topic not in subscribed):
                log.warning("clone group offset %s -> %s: topic %s skipped (%s)", src, dest, topic,
                            "not subscribed by the online consumers" if subscribed else "no such topic here")
                continue
            for q, off in sorted((table.get(f"{topic}@{src}") or {}).items()):
                await self.meta.commit_offset(dest, topic, int(q), int(off))
                cloned += 1
        log.warning("group offsets of %s cloned to %s by %s: %d queue(s) of %s", src, dest, conn.peer, cloned,
                    only or "every topic")
        return make_response(cmd, RC.SUCCESS)

    async def query_consume_queue(self, conn, cmd):
        """QUERY_CONSUME_QUEUE (321), as AdminBrokerProcessor.queryConsumeQueue: the queue's min and
        max index and up to `count` entries (commit-log offset, size, tags hash) from `index`;
        with consumerGroup, that group's online subscription of the topic (or filterData
        "<group>@<topic> is not online!").  An index outside the queue answers SUCCESS with the
        remark "Index .. is not exist!" and no body; an unknown queue SYSTEM_ERROR."""
        h = cmd.ext_fields or {}
        topic = h.get("topic") or ""
        try:
            qid, index, count = as_int(h.get("queueId")), as_int(h.get("index"), 0), as_int(h.get("count"), 10)
        except (TypeError, ValueError) as e:
            return make_response(cmd, RC.SYSTEM_ERROR, f"bad header: {e}")
        if not topic or len(topic) > TOPIC_LEN_MAX or not TOPIC_RE.match(topic) or qid < 0 or \
                await self.meta.topic(topic) is None or self.store.cqs.get(topic, qid).slot is None:
            return make_response(cmd, RC.SYSTEM_ERROR, f"{qid}@{topic} is not exist!")
        cq = self.store.cqs.get(topic, qid)
        sub, filter_data = None, None
        group = h.get("consumerGroup")
        if group is not None:
            sd = await self.meta.subscription(group, topic)
            if sd is None:
                filter_data = f"{group}@{topic} is not online!"
            else:
                sub = _subscription({"topic": topic, **sd})
                filter_data = "null"          # JSON.toJSONString of the (absent) ConsumerFilterData of a TAG group
        lo, hi = max(cq.min_offset, 0), max(cq.max_offset, 0)
        if not lo <= index < hi:
            return make_response(cmd, RC.SUCCESS, f"Index {index} of {qid}@{topic} is not exist!")
        entries = cq.get(index, max(0, min(count, QUERY_CQ_COUNT_MAX)))
        return make_response(cmd, RC.SUCCESS, body=encode_query_consume_queue(lo, hi, entries, sub, filter_data))


def _connection(c: dict):
    return connection(c.get("clientId", ""), c.get("clientAddr", ""), c.get("language") or "OTHER",
                      int(c.get("version") or 0))


def _subscription(sd: dict):
    return subscription_data(sd.get("topic", ""), sd.get("subString", "*"), sd.get("tagsSet") or [],
                             int(sd.get("subVersion") or 0), sd.get("expressionType") or "TAG",
                             bool(sd.get("classFilterMode")))


__all__ = ["OpsProcessor", "RUNTIME_KEYS", "parse_runtime_update"]
