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

A connection is RocketMQ's Connection: clientId, clientAddr, language, version (from the
client's heartbeats; mq.broker.metadata)."""
from __future__ import annotations

import logging

from mq.remoting import ResponseCode as RC, make_response
from mq.store.config import parse_properties
from mq.wire.offsets import encode_reset_offset_body

from .admin import Processor
from .config import ALL_OPTIONS
from .metadata import dumps
from .send import as_bool, as_int

log = logging.getLogger("mq.broker.ops")

# what every process reads at the moment it uses it (never cached at start), so a change
# takes effect at once: a send's, a pull's, a slave wait's, a group lookup's
RUNTIME_KEYS = frozenset({
    "brokerPermission", "autoCreateSubscriptionGroup", "slaveReadEnable", "accessMessageInMemoryMaxRatio",
    "maxTransferCountOnMessageInMemory", "maxTransferBytesOnMessageInMemory", "longPollingEnable",
    "shortPollingTimeMills", "slaveTimeout",
})


def parse_runtime_update(text: str) -> dict:
    """The properties of an UPDATE_BROKER_CONFIG body, parsed and checked; ValueError says
    which key cannot change at run time or which value is bad."""
    raw = parse_properties(text)
    if not raw:
        raise ValueError("no key=value in the body")
    out = {}
    for k, v in raw.items():
        if k not in RUNTIME_KEYS:
            raise ValueError(f"{k} cannot change while the broker runs (set it in broker.conf and restart); "
                             f"these can: {', '.join(sorted(RUNTIME_KEYS))}")
        out[k] = ALL_OPTIONS[k].parse(v)
    return out


class OpsProcessor(Processor):
    def handlers(self) -> dict:
        from mq.remoting import RequestCode as R
        return {
            R.GET_CONSUMER_CONNECTION_LIST: self.consumer_connection,
            R.GET_PRODUCER_CONNECTION_LIST: self.producer_connections,
            R.DELETE_SUBSCRIPTIONGROUP: self.delete_group,
            R.INVOKE_BROKER_TO_RESET_OFFSET: self.reset_offset,
            R.UPDATE_BROKER_CONFIG: self.update_config,
            R.GET_BROKER_CONSUME_STATS: self.broker_consume_stats,
            R.VIEW_BROKER_STATS_DATA: self.stats_data,
        }

    async def consumer_connection(self, conn, cmd):
        group = (cmd.ext_fields or {}).get("consumerGroup", "")
        cc = await self.meta.consumer_connection(group)
        if cc is None:
            return make_response(cmd, RC.CONSUMER_NOT_ONLINE, f"the consumer group[{group}] not online")
        return make_response(cmd, RC.SUCCESS, body=dumps(cc))

    async def producer_connections(self, conn, cmd):
        group = (cmd.ext_fields or {}).get("producerGroup", "")
        conns = await self.meta.producer_connections(group)
        if not conns:
            return make_response(cmd, RC.SYSTEM_ERROR, f"the producer group[{group}] not exist")
        return make_response(cmd, RC.SUCCESS, body=dumps({"connectionSet": conns}))

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
        return make_response(cmd, RC.SUCCESS, body=dumps(data))

    async def broker_consume_stats(self, conn, cmd):
        """ConsumeStatsList {"brokerAddr", "totalDiff", "consumeStatsList": [{group: [stats]}]}, each
        stats in GET_CONSUME_STATS's shape (mq.broker.admin)."""
        offsets = await self.meta.offsets_wrapper()
        groups = sorted({k.rpartition("@")[2] for k in offsets.get("offsetTable", {})})
        out, total = [], 0
        for g in groups:
            stats = await self.broker.admin.group_stats(g)
            total += stats["diffTotal"]
            out.append({g: [stats]})
        return make_response(cmd, RC.SUCCESS, body=dumps({"brokerAddr": self.config.broker_addr,
                                                          "totalDiff": total, "consumeStatsList": out}))


__all__ = ["OpsProcessor", "RUNTIME_KEYS", "parse_runtime_update"]
