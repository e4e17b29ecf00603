"""Broker metadata: topics, subscription groups, consumer offsets, delay
offsets and the live consumer/producer registry.

Exactly one process owns it (the supervisor, or a single-process broker); io
workers reach it through mq.broker.link.  It is persisted to
<store>/config/{topics,subscriptionGroup,consumerOffset,delayOffset}.json in
RocketMQ's shapes (so a RocketMQ broker can take over the directory), each
write atomic (mq.store.configfile)."""
from __future__ import annotations

import json
import logging
import os
import random
import time
from dataclasses import dataclass, field

from mq.store.configfile import ConfigFile
from mq.wire.topics import (AUTO_CREATE_TOPIC, DLQ_PREFIX, OFFSET_MOVED_EVENT, PERM_INHERIT,  # noqa: F401
                            PERM_PRIORITY, PERM_READ, PERM_WRITE, RETRY_PREFIX, SCHEDULE_TOPIC,
                            SELF_TEST_TOPIC, SEND_PROTECTED_TOPICS, TopicConfig, dlq_topic, reply_topic,
                            retry_topic)

log = logging.getLogger("mq.broker.metadata")

CHANNEL_EXPIRED_MS = 120_000
LOCK_MAX_LIVE_MS = 60_000   # rocketmq.broker.rebalance.lockMaxLiveTime
DELAY_LEVELS_MAX = 18


def topic_config(name: str, read: int, write: int, perm: int = 6, sys_flag: int = 0, order: bool = False) -> dict:
    """A TopicConfig as the metadata keeps it: its JSON (mq.wire.topics)."""
    return TopicConfig(name, read, write, perm, sys_flag, order=order).to_obj()


CONN_INFO_KEY = "_conn"     # heartbeat body key the io worker adds: {clientAddr, language, version}


def group_config(name: str) -> dict:
    return {"brokerId": 0, "consumeBroadcastEnable": True, "consumeEnable": True, "consumeFromMinEnable": True,
            "groupName": name, "notifyConsumerIdsChangedEnable": True, "retryMaxTimes": 16,
            "retryQueueNums": 1, "whichBrokerWhenConsumeSlowly": 1}


@dataclass
class DataVersion:
    counter: int = 0
    timestamp: int = field(default_factory=lambda: int(time.time() * 1000))

    def bump(self) -> None:
        self.counter += 1
        self.timestamp = int(time.time() * 1000)

    def as_json(self) -> dict:
        return {"counter": self.counter, "timestamp": self.timestamp}

    @classmethod
    def from_json(cls, d: dict | None) -> "DataVersion":
        d = d or {}
        return cls(int(d.get("counter", 0)), int(d.get("timestamp", 0)))


@dataclass
class ConsumerClient:
    client_id: str
    conn_key: tuple              # (worker id, connection id): where to push notifications
    last_seen_ms: int
    consume_type: str
    message_model: str
    consume_from_where: str
    subscriptions: dict          # topic -> {"subString", "tagsSet", "subVersion", "expressionType"}


_ENUMS = {
    "consumeType": ["CONSUME_ACTIVELY", "CONSUME_PASSIVELY"],
    "messageModel": ["BROADCASTING", "CLUSTERING"],
    "consumeFromWhere": ["CONSUME_FROM_LAST_OFFSET", "CONSUME_FROM_LAST_OFFSET_AND_FROM_MIN_WHEN_BOOT_FIRST",
                         "CONSUME_FROM_MIN_OFFSET", "CONSUME_FROM_MAX_OFFSET", "CONSUME_FROM_FIRST_OFFSET",
                         "CONSUME_FROM_TIMESTAMP"],
}


def enum_name(kind: str, value) -> str:
    """Heartbeat enums arrive as names (Java) or ordinals (C++): normalise to names."""
    names = _ENUMS[kind]
    if isinstance(value, int) or (isinstance(value, str) and value.isdigit()):
        i = int(value)
        return names[i] if 0 <= i < len(names) else str(value)
    return str(value) if value is not None else names[0]


class Metadata:
    """The broker's topics, groups, offsets and clients, and their config files.

    With a `writer` (mq.store.configfile.Writer: the supervisor's, so that its event loop never
    waits for an fsync) the files are written by the writer's thread: each persist_* queues the
    state of that moment, and take_writes() gives the Futures of the writes queued since the
    last call (a link call answers once they are done, so a change is on disk when its caller
    learns it was made, as before).  Without one every persist_* writes before it returns."""

    def __init__(self, config, config_dir: str, writer=None):
        self.config = config
        self.dir = config_dir
        os.makedirs(config_dir, exist_ok=True)
        self._topics_file = ConfigFile(config_dir, "topics.json", writer)
        self._groups_file = ConfigFile(config_dir, "subscriptionGroup.json", writer)
        self._offsets_file = ConfigFile(config_dir, "consumerOffset.json", writer)
        self._delay_file = ConfigFile(config_dir, "delayOffset.json", writer)
        self._writes: list = []                   # Futures of queued writes not yet taken (writer only)
        t = self._topics_file.load()
        self.topics: dict[str, dict] = dict(t.get("topicConfigTable", {}))
        self.topics_version = DataVersion.from_json(t.get("dataVersion"))
        g = self._groups_file.load()
        self.groups: dict[str, dict] = dict(g.get("subscriptionGroupTable", {}))
        self.groups_version = DataVersion.from_json(g.get("dataVersion"))
        o = self._offsets_file.load()
        self.offsets: dict[str, dict[int, int]] = {
            k: {int(q): int(v) for q, v in m.items()} for k, m in o.get("offsetTable", {}).items()}
        d = self._delay_file.load()
        self.delay_offsets: dict[int, int] = {int(k): int(v) for k, v in d.get("offsetTable", {}).items()}
        self.consumers: dict[str, dict[str, ConsumerClient]] = {}   # group -> clientId -> client
        self.producers: dict[str, dict[str, tuple]] = {}            # group -> clientId -> conn_key
        self.client_info: dict[str, dict] = {}     # clientId -> {clientAddr, language, version} (connection lists)
        self.locks: dict[tuple, tuple[str, float]] = {}            # (group, topic, broker, qid) -> (client, ms)
        self._offsets_dirty = False
        self.on_topics_changed = lambda: None     # the broker re-registers with the name servers
        self._init_system_topics()

    # ---- topics ---------------------------------------------------------------------
    def _init_system_topics(self) -> None:
        cfg = self.config
        wanted = {
            SELF_TEST_TOPIC: topic_config(SELF_TEST_TOPIC, 1, 1),
            OFFSET_MOVED_EVENT: topic_config(OFFSET_MOVED_EVENT, 1, 1),
            SCHEDULE_TOPIC: topic_config(SCHEDULE_TOPIC, DELAY_LEVELS_MAX, DELAY_LEVELS_MAX),
            cfg.brokerClusterName: topic_config(cfg.brokerClusterName, 16, 16, perm=PERM_INHERIT | PERM_WRITE | PERM_READ),
            cfg.brokerName: topic_config(cfg.brokerName, 1, 1, perm=PERM_INHERIT | PERM_WRITE | PERM_READ),
            reply_topic(cfg.brokerClusterName): topic_config(reply_topic(cfg.brokerClusterName), 1, 1),
        }
        if cfg.autoCreateTopicEnable:
            wanted[AUTO_CREATE_TOPIC] = topic_config(AUTO_CREATE_TOPIC, cfg.defaultTopicQueueNums,
                                                     cfg.defaultTopicQueueNums, perm=7)
        changed = False
        for name, tc in wanted.items():
            if name not in self.topics:
                self.topics[name] = tc
                changed = True
        if not cfg.autoCreateTopicEnable and AUTO_CREATE_TOPIC in self.topics:
            del self.topics[AUTO_CREATE_TOPIC]
            changed = True
        if changed:
            self.topics_version.bump()
            self.persist_topics()

    def _queued(self, write) -> None:
        """Keeps the Future of a write the writer queued (None: written already).  Writes that
        succeeded are dropped here; a failed one is kept for the next take_writes (the writer
        logged it too; the writes a supervisor loop queues are not taken)."""
        if write is not None:
            self._writes = [w for w in self._writes if not w.done() or w.exception() is not None][-64:]
            self._writes.append(write)

    def take_writes(self) -> list:
        """The Futures of the writes queued since the last call (done ones included)."""
        writes, self._writes = self._writes, []
        return writes

    def topic(self, name: str) -> dict | None:
        return self.topics.get(name)

    def create_topic_on_send(self, topic: str, default_topic: str, queue_nums: int, sys_flag: int) -> dict | None:
        """RocketMQ's createTopicInSendMessageMethod: inherit from default_topic
        (which must exist with PERM_INHERIT).  Returns the config or None."""
        tc = self.topics.get(topic)
        if tc is not None:
            return tc
        base = self.topics.get(default_topic)
        if base is None or not (base["perm"] & PERM_INHERIT):
            return None
        n = max(1, min(int(queue_nums), base["writeQueueNums"]))
        tc = topic_config(topic, n, n, perm=base["perm"] & ~PERM_INHERIT, sys_flag=sys_flag)
        return self.put_topic(tc)

    def create_system_topic(self, topic: str, queues: int) -> dict:
        """Retry and DLQ topics (retryQueueNums / 1 queue, perm 6)."""
        tc = self.topics.get(topic)
        if tc is None:
            tc = self.put_topic(topic_config(topic, queues, queues))
        return tc

    def put_topic(self, tc: dict) -> dict:
        self.topics[tc["topicName"]] = tc
        self.topics_version.bump()
        self.persist_topics()
        log.info("topic %s is now %s", tc["topicName"], tc)
        self.on_topics_changed()
        return tc

    def delete_topic(self, name: str) -> bool:
        if self.topics.pop(name, None) is None:
            return False
        self.topics_version.bump()
        self.persist_topics()
        self.on_topics_changed()
        return True

    def topics_wrapper(self) -> dict:
        return {"dataVersion": self.topics_version.as_json(), "topicConfigTable": self.topics}

    def persist_topics(self) -> None:
        self._queued(self._topics_file.save(self.topics_wrapper()))

    def replace_topics(self, wrapper: dict) -> None:
        """Slave metadata sync: take the master's table and version as they are."""
        self.topics = dict(wrapper.get("topicConfigTable", {}))
        self.topics_version = DataVersion.from_json(wrapper.get("dataVersion"))
        self.persist_topics()

    def merge_topics(self, wrapper: dict) -> list[str]:
        """A new DLedger leader taking topics another member knows and it does not (created
        on an earlier leader while this one was away).  Its own configs win.  Returns the
        names added."""
        added = [name for name in wrapper.get("topicConfigTable", {}) if name not in self.topics]
        for name in added:
            self.topics[name] = wrapper["topicConfigTable"][name]
        if added:
            self.topics_version.bump()
            self.persist_topics()
            self.on_topics_changed()
        return added

    # ---- subscription groups --------------------------------------------------------
    def group(self, name: str, create: bool = True) -> dict | None:
        g = self.groups.get(name)
        if g is None and create and self.config.autoCreateSubscriptionGroup:
            g = self.groups[name] = group_config(name)
            self.groups_version.bump()
            self.persist_groups()
        return g

    def put_group(self, g: dict) -> None:
        self.groups[g["groupName"]] = {**group_config(g["groupName"]), **g}
        self.groups_version.bump()
        self.persist_groups()

    def replace_groups(self, wrapper: dict) -> None:
        """Slave metadata sync: take the master's groups and version as they are."""
        self.groups = dict(wrapper.get("subscriptionGroupTable", {}))
        self.groups_version = DataVersion.from_json(wrapper.get("dataVersion"))
        self.persist_groups()

    def merge_groups(self, wrapper: dict) -> list[str]:
        """Like merge_topics, for subscription groups."""
        added = [name for name in wrapper.get("subscriptionGroupTable", {}) if name not in self.groups]
        for name in added:
            self.groups[name] = wrapper["subscriptionGroupTable"][name]
        if added:
            self.groups_version.bump()
            self.persist_groups()
        return added

    def groups_wrapper(self) -> dict:
        return {"dataVersion": self.groups_version.as_json(), "subscriptionGroupTable": self.groups}

    def persist_groups(self) -> None:
        self._queued(self._groups_file.save(self.groups_wrapper()))

    # ---- consumer offsets -------------------------------------------------------------
    def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        self.offsets.setdefault(f"{topic}@{group}", {})[queue_id] = offset
        self._offsets_dirty = True

    def commit_offsets(self, batch: list) -> None:
        """commit_offset for each [group, topic, queue_id, offset] of `batch`, in order."""
        for group, topic, queue_id, offset in batch:
            self.commit_offset(group, topic, queue_id, offset)

    def query_offset(self, group: str, topic: str, queue_id: int) -> int | None:
        return self.offsets.get(f"{topic}@{group}", {}).get(queue_id)

    def offsets_wrapper(self) -> dict:
        return {"offsetTable": {k: {str(q): v for q, v in m.items()} for k, m in self.offsets.items()}}

    def persist_offsets(self, force: bool = False) -> None:
        if self._offsets_dirty or force:
            self._offsets_dirty = False
            self._queued(self._offsets_file.save(self.offsets_wrapper()))

    def merge_offsets(self, table: dict) -> None:
        """Slave sync (and a returning master taking its slaves' offsets): entries
        are never deleted, and an offset never moves back.
        (RocketMQ's putAll would let a returning master's older offsets overwrite
        what consumers committed here while it was down; the cost is that a
        deliberate reset to an earlier offset on the master does not reach slaves.)"""
        for k, m in table.get("offsetTable", {}).items():
            cur = self.offsets.setdefault(k, {})
            for q, v in m.items():
                cur[int(q)] = max(cur.get(int(q), -1), int(v))
        self.persist_offsets(force=True)

    # ---- delay offsets ------------------------------------------------------------------
    def delay_wrapper(self) -> dict:
        return {"offsetTable": {str(k): v for k, v in sorted(self.delay_offsets.items())}}

    def persist_delay(self) -> None:
        self._queued(self._delay_file.save(self.delay_wrapper()))

    # ---- clients ---------------------------------------------------------------------------
    def heartbeat(self, body: dict, conn_key: tuple) -> list[str]:
        """Registers the client's producers and consumers; returns the consumer
        groups whose membership changed (they get NOTIFY_CONSUMER_IDS_CHANGED)."""
        now = int(time.time() * 1000)
        client_id = str(body.get("clientID", ""))
        changed = []
        if isinstance(body.get(CONN_INFO_KEY), dict):       # the io worker adds who sent it
            self.client_info[client_id] = body[CONN_INFO_KEY]
        for pd in body.get("producerDataSet") or []:
            self.producers.setdefault(str(pd.get("groupName")), {})[client_id] = conn_key
        for cd in body.get("consumerDataSet") or []:
            group = str(cd.get("groupName"))
            self.group(group)
            self.create_system_topic(retry_topic(group), (self.groups.get(group) or group_config(group))["retryQueueNums"])
            subs = {}
            for sd in cd.get("subscriptionDataSet") or []:
                subs[str(sd.get("topic"))] = {"subString": str(sd.get("subString", "*")),
                                              "tagsSet": [str(t) for t in sd.get("tagsSet") or []],
                                              "expressionType": str(sd.get("expressionType") or "TAG").upper(),
                                              "subVersion": int(sd.get("subVersion") or 0)}
            members = self.consumers.setdefault(group, {})
            if client_id not in members or members[client_id].conn_key != conn_key:
                changed.append(group)
            members[client_id] = ConsumerClient(
                client_id, conn_key, now, enum_name("consumeType", cd.get("consumeType")),
                enum_name("messageModel", cd.get("messageModel")),
                enum_name("consumeFromWhere", cd.get("consumeFromWhere")), subs)
        return changed

    def unregister_client(self, client_id: str, producer_group: str | None, consumer_group: str | None) -> list[str]:
        changed = []
        if producer_group and producer_group in self.producers:
            self.producers[producer_group].pop(client_id, None)
        if consumer_group and client_id in self.consumers.get(consumer_group, {}):
            del self.consumers[consumer_group][client_id]
            changed.append(consumer_group)
        self._prune_client_info()
        return changed

    def _prune_client_info(self) -> None:
        """Connection details only of clients still known as a producer or a consumer."""
        live = {cid for m in self.producers.values() for cid in m} | {cid for m in self.consumers.values() for cid in m}
        for cid in [c for c in self.client_info if c not in live]:
            del self.client_info[cid]

    def _connection(self, client_id: str) -> dict:
        info = self.client_info.get(client_id, {})
        return {"clientId": client_id, "clientAddr": info.get("clientAddr", ""),
                "language": info.get("language", "OTHER"), "version": info.get("version", 0)}

    def producer_connections(self, group: str) -> list[dict]:
        """GET_PRODUCER_CONNECTION_LIST: the group's live producers (RocketMQ's Connection)."""
        return [self._connection(cid) for cid in sorted(self.producers.get(group, {}))]

    def producer_conn(self, group: str) -> tuple | None:
        """A connection (io worker id, connection id) of a live producer of the group, picked at
        random (ProducerManager.getAvailableChannel), for CHECK_TRANSACTION_STATE; None if none."""
        members = self.producers.get(group)
        return random.choice(list(members.values())) if members else None

    def client_conn(self, client_id: str) -> tuple | None:
        """The connection of a producer with this client id, whatever its group
        (ProducerManager.findChannel), for PUSH_REPLY_MESSAGE_TO_CLIENT; None if none."""
        for members in self.producers.values():
            key = members.get(client_id)
            if key is not None:
                return key
        return None

    def consumer_connection(self, group: str) -> dict | None:
        """GET_CONSUMER_CONNECTION_LIST: RocketMQ's ConsumerConnection, or None when no consumer
        of the group is online."""
        members = self.consumers.get(group) or {}
        if not members:
            return None
        subs: dict[str, dict] = {}
        for c in members.values():
            for topic, sd in c.subscriptions.items():
                if topic not in subs or sd["subVersion"] > subs[topic]["subVersion"]:
                    subs[topic] = {"topic": topic, "subString": sd["subString"], "tagsSet": sd["tagsSet"],
                                   "codeSet": [], "subVersion": sd["subVersion"],
                                   "expressionType": sd.get("expressionType", "TAG"),
                                   "classFilterMode": False}
        any_member = next(iter(members.values()))
        return {"connectionSet": [self._connection(cid) for cid in sorted(members)], "subscriptionTable": subs,
                "consumeType": any_member.consume_type, "messageModel": any_member.message_model,
                "consumeFromWhere": any_member.consume_from_where}

    def delete_group(self, name: str, remove_offsets: bool) -> bool:
        """DELETE_SUBSCRIPTIONGROUP: the group's config, and with remove_offsets its committed
        offsets on every topic; False when the group was not there."""
        existed = self.groups.pop(name, None) is not None
        if existed:
            self.groups_version.bump()
            self.persist_groups()
        if remove_offsets:
            gone = [k for k in self.offsets if k.rpartition("@")[2] == name]
            for k in gone:
                del self.offsets[k]
            if gone:
                self.persist_offsets(force=True)
        return existed

    def connection_closed(self, conn_key: tuple) -> list[str]:
        changed = []
        for group, members in self.consumers.items():
            gone = [cid for cid, c in members.items() if c.conn_key == conn_key]
            for cid in gone:
                del members[cid]
            if gone:
                changed.append(group)
        for members in self.producers.values():
            for cid in [cid for cid, k in members.items() if k == conn_key]:
                del members[cid]
        self._prune_client_info()
        return changed

    def worker_gone(self, worker_id: int) -> list[str]:
        """An io worker died: every client connected through it is gone."""
        changed = []
        for group, members in self.consumers.items():
            gone = [cid for cid, c in members.items() if c.conn_key[0] == worker_id]
            for cid in gone:
                del members[cid]
            if gone:
                changed.append(group)
        for members in self.producers.values():
            for cid in [cid for cid, k in members.items() if k[0] == worker_id]:
                del members[cid]
        self._prune_client_info()
        return changed

    # ---- ordered consumption locks (LOCK_BATCH_MQ / UNLOCK_BATCH_MQ) -----------------------------
    def lock_batch(self, group: str, client_id: str, mqs: list) -> list:
        now = time.monotonic() * 1000
        ok = []
        for mq in mqs:
            key = (group, mq.get("topic"), mq.get("brokerName"), int(mq.get("queueId", 0)))
            holder = self.locks.get(key)
            if holder is None or holder[0] == client_id or now - holder[1] > LOCK_MAX_LIVE_MS:
                self.locks[key] = (client_id, now)
                ok.append(mq)
        return ok

    def unlock_batch(self, group: str, client_id: str, mqs: list) -> None:
        for mq in mqs:
            key = (group, mq.get("topic"), mq.get("brokerName"), int(mq.get("queueId", 0)))
            if self.locks.get(key, ("",))[0] == client_id:
                del self.locks[key]

    def expire_clients(self) -> list[str]:
        now = int(time.time() * 1000)
        changed = []
        for group, members in self.consumers.items():
            gone = [cid for cid, c in members.items() if now - c.last_seen_ms > CHANNEL_EXPIRED_MS]
            for cid in gone:
                del members[cid]
            if gone:
                changed.append(group)
        self._prune_client_info()
        return changed

    def consumer_ids(self, group: str) -> list[str]:
        return sorted(self.consumers.get(group, {}))

    def consumer_conns(self, group: str) -> list[tuple]:
        return [c.conn_key for c in self.consumers.get(group, {}).values()]

    def subscription(self, group: str, topic: str) -> dict | None:
        best = None
        for c in self.consumers.get(group, {}).values():
            s = c.subscriptions.get(topic)
            if s is not None and (best is None or s["subVersion"] > best["subVersion"]):
                best = s
        return best

    def persist_all(self) -> None:
        self.persist_topics()
        self.persist_groups()
        self.persist_offsets(force=True)
        self.persist_delay()


def dumps(obj) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()
