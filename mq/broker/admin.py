"""Client management, offsets and admin codes (spec 2.3, 2.4):
HEART_BEAT 34, UNREGISTER_CLIENT 35, GET_CONSUMER_LIST_BY_GROUP 38,
QUERY_CONSUMER_OFFSET 14, UPDATE_CONSUMER_OFFSET 15, SEARCH_OFFSET_BY_TIMESTAMP 29,
GET_MAX_OFFSET 30, GET_MIN_OFFSET 31, GET_EARLIEST_MSG_STORETIME 32,
LOCK_BATCH_MQ 41, UNLOCK_BATCH_MQ 42, UPDATE_AND_CREATE_TOPIC 17,
DELETE_TOPIC_IN_BROKER 215, GET_ALL_TOPIC_CONFIG 21, GET_ALL_CONSUMER_OFFSET 43,
GET_ALL_DELAY_OFFSET 45, GET_ALL_SUBSCRIPTIONGROUP_CONFIG 201,
UPDATE_AND_CREATE_SUBSCRIPTIONGROUP 200, GET_BROKER_RUNTIME_INFO 28,
GET_BROKER_CONFIG 26, VIEW_MESSAGE_BY_ID 33, GET_TOPIC_STATS_INFO 202,
GET_CONSUME_STATS 208, GET_TOPIC_CONFIG 351 and GET_SUBSCRIPTIONGROUP_CONFIG 352 (RocketMQ 5's: one
topic, its attributes too; one group); the ACL accounts: UPDATE_AND_CREATE_ACL_CONFIG 50, DELETE_ACL_CONFIG 51,
UPDATE_GLOBAL_WHITE_ADDRS_CONFIG 53 (edits of plain_acl.yml, mq.acl.plain).

The bodies RocketMQ's tools decode (GET_BROKER_RUNTIME_INFO's KVTable, GET_TOPIC_STATS_INFO's
TopicStatsTable, GET_CONSUME_STATS's ConsumeStats, LOCK_BATCH_MQ's answer) are written by
mq.wire.adminbodies, as fastjson writes RocketMQ's classes; the config wrappers (21, 43, 45,
201) stay standard JSON (fastjson reads them alike; our slaves and tests read them with json)."""
from __future__ import annotations

import logging

from mq.remoting import ResponseCode as RC, make_response
from mq.store import StoreError
from mq.store.commitlog import INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN
from mq.wire.adminbodies import (RUNTIME_INFO_CAPACITY, encode_consume_stats, encode_kv_table, encode_lock_batch,
                                 encode_topic_stats)
from mq.wire.errors import MalformedError
from mq.wire.topics import TOPIC_LEN_MAX, TOPIC_RE, apply_attributes

from .metadata import dumps, topic_config
from .send import BadRequest, as_bool, as_int, check_group, header_int

log = logging.getLogger("mq.broker.admin")

def _json_body(cmd) -> dict:
    if not cmd.body:
        return {}
    try:
        from mq.wire.fastjson import loads_lenient
        data = loads_lenient(cmd.body.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise BadRequest(RC.INVALID_PARAMETER, f"body is not JSON: {e}") from None
    if not isinstance(data, dict):
        raise BadRequest(RC.INVALID_PARAMETER, "body is not a JSON object")
    return data


def check_heartbeat(body: dict) -> None:
    """HEART_BEAT's body has the shapes of RocketMQ's HeartbeatData, which its broker's JSON
    decoder insists on: anything else is refused (SYSTEM_ERROR naming the field) here, before
    the supervisor reads it; group names are checked (they name store directories)."""
    def bad(path: str, kind: str):
        raise BadRequest(RC.SYSTEM_ERROR, f"heartbeat body: {path} is not {kind}")

    def scalar(v) -> bool:
        return v is None or isinstance(v, (str, int, float, bool))

    if not scalar(body.get("clientID")):
        bad("clientID", "a string")
    for name in ("producerDataSet", "consumerDataSet"):
        items = body.get(name)
        if items is None:
            continue
        if not isinstance(items, list):
            bad(name, "a list")
        for k, item in enumerate(items):
            where = f"{name}[{k}]"
            if not isinstance(item, dict):
                bad(where, "an object")
            check_group(item.get("groupName"))
            if name == "producerDataSet":
                continue
            for key in ("consumeType", "messageModel", "consumeFromWhere"):
                if not scalar(item.get(key)):
                    bad(f"{where}.{key}", "a name or an ordinal")
            subs = item.get("subscriptionDataSet")
            if subs is None:
                continue
            if not isinstance(subs, list):
                bad(f"{where}.subscriptionDataSet", "a list")
            for j, sd in enumerate(subs):
                sw = f"{where}.subscriptionDataSet[{j}]"
                if not isinstance(sd, dict):
                    bad(sw, "an object")
                if not isinstance(sd.get("topic"), str) or not scalar(sd.get("subString")):
                    bad(f"{sw}.topic", "a string")
                tags = sd.get("tagsSet")
                if tags is not None and (not isinstance(tags, list) or not all(scalar(t) for t in tags)):
                    bad(f"{sw}.tagsSet", "a list of strings")
                version = sd.get("subVersion")
                if version is not None:
                    try:
                        int(version)
                    except (TypeError, ValueError):
                        bad(f"{sw}.subVersion", "a number")


class Processor:
    """A set of request handlers of an io worker: handlers() maps request codes to them."""

    def __init__(self, broker):
        self.broker = broker
        self.config = broker.config
        self.store = broker.store
        self.meta = broker.meta

    def handlers(self) -> dict:
        raise NotImplementedError


class AdminProcessor(Processor):
    def handlers(self) -> dict:
        from mq.remoting import RequestCode as R
        return {
            R.HEART_BEAT: self.heartbeat, R.UNREGISTER_CLIENT: self.unregister_client,
            R.GET_CONSUMER_LIST_BY_GROUP: self.consumer_list, R.QUERY_CONSUMER_OFFSET: self.query_offset,
            R.UPDATE_CONSUMER_OFFSET: self.update_offset, R.SEARCH_OFFSET_BY_TIMESTAMP: self.search_offset,
            R.GET_MAX_OFFSET: self.max_offset, R.GET_MIN_OFFSET: self.min_offset,
            R.GET_EARLIEST_MSG_STORETIME: self.earliest_time, R.LOCK_BATCH_MQ: self.lock_batch,
            R.UNLOCK_BATCH_MQ: self.unlock_batch, R.UPDATE_AND_CREATE_TOPIC: self.update_topic,
            R.DELETE_TOPIC_IN_BROKER: self.delete_topic, R.GET_ALL_TOPIC_CONFIG: self.all_topics,
            R.GET_TOPIC_CONFIG: self.topic_config, R.GET_SUBSCRIPTIONGROUP_CONFIG: self.group_config,
            R.GET_ALL_CONSUMER_OFFSET: self.all_offsets, R.GET_ALL_DELAY_OFFSET: self.all_delay,
            R.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: self.all_groups,
            R.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: self.update_group,
            R.GET_BROKER_RUNTIME_INFO: self.runtime_info, R.GET_BROKER_CONFIG: self.broker_config,
            R.VIEW_MESSAGE_BY_ID: self.view_message, R.GET_TOPIC_STATS_INFO: self.topic_stats,
            R.GET_CONSUME_STATS: self.consume_stats,
            R.UPDATE_AND_CREATE_ACL_CONFIG: self.update_acl, R.DELETE_ACL_CONFIG: self.delete_acl,
            R.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG: self.update_global_white,
        }

    # ---- ACL accounts (RocketMQ's codes 50, 51, 53): edits of plain_acl.yml ------------------
    def _acl_edit(self, cmd, failed_code: int, edit) -> object:
        """Runs `edit(path)` on the accounts file; this worker reloads at once, the others within
        their poll interval.  Without aclEnable there are no accounts to edit."""
        from mq.acl.plain import AclConfigError
        acl = self.broker.acl
        if acl is None:
            return make_response(cmd, failed_code, "the broker does not enable acl (aclEnable=false)")
        try:
            edit(acl.path)
        except (AclConfigError, OSError) as e:
            return make_response(cmd, failed_code, str(e))
        acl.poll()
        log.warning("ACL: %s changed by request code %d", acl.path, cmd.code)
        return make_response(cmd, RC.SUCCESS)

    def update_acl(self, conn, cmd):
        from mq.acl.plain import ACCOUNT_KEYS, update_account
        h = cmd.ext_fields or {}
        fields = {k: h[k] for k in ACCOUNT_KEYS if h.get(k) is not None}
        return self._acl_edit(cmd, RC.UPDATE_AND_CREATE_ACL_CONFIG_FAILED, lambda path: update_account(path, fields))

    def delete_acl(self, conn, cmd):
        from mq.acl.plain import delete_account
        ak = (cmd.ext_fields or {}).get("accessKey")
        if not ak:
            return make_response(cmd, RC.DELETE_ACL_CONFIG_FAILED, "accessKey is required")
        return self._acl_edit(cmd, RC.DELETE_ACL_CONFIG_FAILED, lambda path: delete_account(path, ak))

    def update_global_white(self, conn, cmd):
        from mq.acl.plain import update_global_white
        addrs = (cmd.ext_fields or {}).get("globalWhiteAddrs")
        if addrs is None:
            return make_response(cmd, RC.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG_FAILED, "globalWhiteAddrs is required")
        return self._acl_edit(cmd, RC.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG_FAILED,
                              lambda path: update_global_white(path, addrs))

    # ---- clients ------------------------------------------------------------------------
    async def heartbeat(self, conn, cmd):
        from mq.wire.remoting import LANGUAGE_NAMES
        from .metadata import CONN_INFO_KEY
        body = _json_body(cmd)
        check_heartbeat(body)
        peer = conn.peer or ("", 0)
        body[CONN_INFO_KEY] = {"clientAddr": f"{peer[0]}:{peer[1]}",
                               "language": LANGUAGE_NAMES.get(cmd.language, "OTHER"), "version": cmd.version}
        await self.meta.heartbeat(body, self.broker.conn_key(conn))
        return make_response(cmd, RC.SUCCESS)

    async def unregister_client(self, conn, cmd):
        h = cmd.ext_fields or {}
        await self.meta.unregister_client(h.get("clientID", ""), h.get("producerGroup"), h.get("consumerGroup"))
        return make_response(cmd, RC.SUCCESS)

    async def consumer_list(self, conn, cmd):
        group = (cmd.ext_fields or {}).get("consumerGroup", "")
        ids = await self.meta.consumer_ids(group)
        if not ids:
            return make_response(cmd, RC.SYSTEM_ERROR, f"no consumer for this group, {group}")
        return make_response(cmd, RC.SUCCESS, body=dumps({"consumerIdList": ids}))

    # ---- offsets --------------------------------------------------------------------------
    def _gtq(self, cmd) -> tuple[str, str, int]:
        h = cmd.ext_fields or {}
        if "topic" not in h or "queueId" not in h:
            raise BadRequest(RC.INVALID_PARAMETER, f"bad header: {'topic' if 'topic' not in h else 'queueId'} missing")
        group, topic = h.get("consumerGroup", ""), h["topic"]
        try:
            qid = as_int(h["queueId"])
        except ValueError as e:
            raise BadRequest(RC.INVALID_PARAMETER, f"bad header: {e}") from None
        if not INT32_MIN <= qid <= INT32_MAX:      # as a send's or a pull's queueId past its queues: 29
            raise BadRequest(RC.INVALID_PARAMETER, f"queueId[{qid}] is illegal: not an int32")
        # the topic names a directory under the store: only legal names reach it
        if not topic or len(topic) > TOPIC_LEN_MAX or not TOPIC_RE.match(topic):
            raise BadRequest(RC.INVALID_PARAMETER, f"topic [{topic}] is illegal")
        return group, topic, qid

    async def query_offset(self, conn, cmd):
        group, topic, qid = self._gtq(cmd)
        off = await self.meta.query_offset(group, topic, qid)
        if off is not None:
            return make_response(cmd, RC.SUCCESS, ext={"offset": off})
        # a new group starts at 0 only while the queue still begins at 0 and that
        # message is still in memory (RocketMQ); otherwise the client applies consumeFrom
        cq = self.store.cqs.get(topic, qid)
        first = cq.entry(0) if cq.min_offset <= 0 else None
        if cq.min_offset <= 0 and (first is None or
                                   self.store.in_memory(first[0], self.config.accessMessageInMemoryMaxRatio)):
            return make_response(cmd, RC.SUCCESS, ext={"offset": 0})
        return make_response(cmd, RC.QUERY_NOT_FOUND, "Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first")

    async def update_offset(self, conn, cmd):
        group, topic, qid = self._gtq(cmd)
        h = cmd.ext_fields or {}
        if "commitOffset" not in h:
            return make_response(cmd, RC.INVALID_PARAMETER, "bad header: commitOffset missing")
        off = header_int(h, "commitOffset", 0, INT64_MIN, INT64_MAX)
        # slaves accept explicit commits too: while the master is down, consumers
        # read from the slave and commit there (pull-carried commits stay master-only)
        await self.meta.commit_offset(group, topic, qid, off)
        return make_response(cmd, RC.SUCCESS)

    def search_offset(self, conn, cmd):          # these four read the store only: answered inside the read
        _, topic, qid = self._gtq(cmd)
        ts = header_int(cmd.ext_fields or {}, "timestamp", 0, INT64_MIN, INT64_MAX)
        return make_response(cmd, RC.SUCCESS, ext={"offset": self.store.search_offset_by_time(topic, qid, ts)})

    def max_offset(self, conn, cmd):
        _, topic, qid = self._gtq(cmd)
        return make_response(cmd, RC.SUCCESS, ext={"offset": self.store.max_offset(topic, qid)})

    def min_offset(self, conn, cmd):
        _, topic, qid = self._gtq(cmd)
        cq = self.store.cqs.get(topic, qid)
        return make_response(cmd, RC.SUCCESS, ext={"offset": cq.min_offset if cq.slot is not None else -1})

    def earliest_time(self, conn, cmd):
        _, topic, qid = self._gtq(cmd)
        cq = self.store.cqs.get(topic, qid)
        e = cq.entry(cq.min_offset)
        ts = self.store._store_ts_at(e[0]) if e else None
        if ts is None:
            return make_response(cmd, RC.SYSTEM_ERROR, f"no message in queue {topic}:{qid}")
        return make_response(cmd, RC.SUCCESS, ext={"timestamp": ts})

    # ---- ordered consumption locks -------------------------------------------------------------
    async def lock_batch(self, conn, cmd):
        body = _json_body(cmd)
        ok = await self.meta.lock_batch(body.get("consumerGroup", ""), body.get("clientId", ""),
                                        body.get("mqSet") or [])
        return make_response(cmd, RC.SUCCESS, body=encode_lock_batch(ok))

    async def unlock_batch(self, conn, cmd):
        body = _json_body(cmd)
        await self.meta.unlock_batch(body.get("consumerGroup", ""), body.get("clientId", ""), body.get("mqSet") or [])
        return make_response(cmd, RC.SUCCESS)

    # ---- topics and groups ------------------------------------------------------------------------
    async def update_topic(self, conn, cmd):
        if self.config.brokerRole == "SLAVE":
            return make_response(cmd, RC.SYSTEM_ERROR, "Can't modify topic or subscription group from slave broker")
        h = cmd.ext_fields or {}
        topic = h.get("topic", "")
        if not topic or len(topic) > TOPIC_LEN_MAX or not TOPIC_RE.match(topic):
            return make_response(cmd, RC.INVALID_PARAMETER, f"topic [{topic}] is illegal")
        if topic == h.get("defaultTopic", "TBW102") and topic != "TBW102":
            return make_response(cmd, RC.SYSTEM_ERROR, f"the topic[{topic}] is conflict with system reserved words.")
        try:
            read, write = as_int(h.get("readQueueNums"), 8), as_int(h.get("writeQueueNums"), 8)
            perm = as_int(h.get("perm"), 6)
        except ValueError as e:
            return make_response(cmd, RC.INVALID_PARAMETER, f"bad header: {e}")
        if not (1 <= read <= 1024 and 1 <= write <= 1024):
            return make_response(cmd, RC.INVALID_PARAMETER, "queue numbers must be between 1 and 1024")
        tc = topic_config(topic, read, write, perm, as_int(h.get("topicSysFlag"), 0), as_bool(h.get("order")))
        tc["topicFilterType"] = h.get("topicFilterType") or "SINGLE_TAG"
        # RocketMQ 5's attributes ("+message.type=FIFO"): changes to the topic's, kept otherwise
        old = await self.meta.topic(topic)
        try:
            attrs = apply_attributes((old or {}).get("attributes") or {}, h.get("attributes") or "")
        except MalformedError as e:
            return make_response(cmd, RC.INVALID_PARAMETER, str(e))
        if attrs:
            tc = {"attributes": attrs, **tc}
        await self.meta.put_topic(tc)
        return make_response(cmd, RC.SUCCESS)

    async def group_config(self, conn, cmd):
        """GET_SUBSCRIPTIONGROUP_CONFIG (RocketMQ 5): the group's SubscriptionGroupConfig JSON;
        SUBSCRIPTION_GROUP_NOT_EXIST when it has none (none is created by asking)."""
        group = (cmd.ext_fields or {}).get("group", "")
        g = await self.meta.group(group, create=False) if group else None
        if g is None:
            return make_response(cmd, RC.SUBSCRIPTION_GROUP_NOT_EXIST, f"subscription group not exist, {group}")
        return make_response(cmd, RC.SUCCESS, body=dumps(g))

    async def topic_config(self, conn, cmd):
        """GET_TOPIC_CONFIG (RocketMQ 5): the topic's TopicConfig JSON (TopicConfigAndQueueMapping
        without a mapping: this broker has no static topics); TOPIC_NOT_EXIST when it has none."""
        topic = (cmd.ext_fields or {}).get("topic", "")
        tc = await self.meta.topic(topic) if topic else None
        if tc is None:
            return make_response(cmd, RC.TOPIC_NOT_EXIST, f"No topic in this broker. topic: {topic}")
        return make_response(cmd, RC.SUCCESS, body=dumps(tc))

    async def delete_topic(self, conn, cmd):
        topic = (cmd.ext_fields or {}).get("topic", "")
        await self.meta.delete_topic(topic)
        return make_response(cmd, RC.SUCCESS)

    async def update_group(self, conn, cmd):
        body = _json_body(cmd)
        if not body.get("groupName"):
            return make_response(cmd, RC.INVALID_PARAMETER, "groupName missing")
        await self.meta.put_group(body)
        return make_response(cmd, RC.SUCCESS)

    async def all_topics(self, conn, cmd):
        return make_response(cmd, RC.SUCCESS, body=dumps(await self.meta.topics_wrapper()))

    async def all_offsets(self, conn, cmd):
        return make_response(cmd, RC.SUCCESS, body=dumps(await self.meta.offsets_wrapper()))

    async def all_delay(self, conn, cmd):
        return make_response(cmd, RC.SUCCESS, body=dumps(await self.meta.delay_wrapper()))

    async def all_groups(self, conn, cmd):
        return make_response(cmd, RC.SUCCESS, body=dumps(await self.meta.groups_wrapper()))

    # ---- status --------------------------------------------------------------------------------------
    async def runtime_info(self, conn, cmd):
        from mq.store import control as C
        ctl = self.store.ctl
        table = {
            "brokerVersionDesc": "V4_9_8", "brokerVersion": "409",
            "brokerRole": self.config.brokerRole, "brokerId": str(self.config.brokerId),
            # DLedger mode: the committed end, what consumers can see (RocketMQ's getMaxPhyOffset)
            "commitLogMaxOffset": str(ctl.get(self.store.visible_end_pos)),
            "commitLogMinOffset": str(self.store.min_phy),      # a switched store's old log too
            "flushedOffset": str(ctl.get(C.POS_FLUSHED)), "dispatchedOffset": str(ctl.get(C.POS_DISPATCHED)),
            "sendThreadPoolQueueSize": "0", "pullThreadPoolQueueSize": "0",
            "pageCacheLockTimeMills": "0", "commitLogDiskRatio": "%.4f" % _disk_ratio(self.store),
            "bootTimestamp": str(self.broker.boot_ms), "flushDiskType": self.config.flushDiskType,
            "earliestMessageTimeStamp": str(self._earliest_store_ts()),
            "sendThreadPoolQueueHeadWaitTimeMills": "0", "pullThreadPoolQueueHeadWaitTimeMills": "0",
        }
        table.update(await self.meta.broker_tps())          # putTps, getTransferedTps (mq.broker.statsdata)
        table.update(self.broker.extra_runtime_info())
        return make_response(cmd, RC.SUCCESS, body=encode_kv_table(table, RUNTIME_INFO_CAPACITY))

    def _earliest_store_ts(self) -> int:
        """Store time of the oldest message still in the CommitLog (0 if none)."""
        lo = self.store.min_phy
        cl = self.store.log_at(lo)        # a switched store's old log while it has a file
        try:
            scan = self._scanner(cl)
            n, _, _ = scan.scan(lo, cl.write_pos, resolve_slots=0)
        except StoreError:
            return 0
        return scan.recs[0].store_ts_ms if n else 0

    def _scanner(self, cl):
        scans = self.__dict__.setdefault("_scans", {})
        if id(cl) not in scans:
            scans[id(cl)] = cl.scanner(1)
        return scans[id(cl)]

    async def broker_config(self, conn, cmd):
        return make_response(cmd, RC.SUCCESS, body=self.config.as_properties().encode())

    async def view_message(self, conn, cmd):
        try:
            off = header_int(cmd.ext_fields or {}, "offset", -1, INT64_MIN, INT64_MAX)
            view = self.store.read_filed(off)
        except BadRequest as e:
            return make_response(cmd, e.code, e.remark)
        except StoreError as e:
            return make_response(cmd, RC.SYSTEM_ERROR, f"no message at that offset: {e}")
        return make_response(cmd, RC.SUCCESS, body=bytes(view))

    async def topic_stats(self, conn, cmd):
        """TopicStatsTable (mq.wire.adminbodies): each write queue's min and max offset (0 when
        negative) and the store time of its last message (0 when empty), as AdminBrokerProcessor."""
        topic = (cmd.ext_fields or {}).get("topic", "")
        tc = await self.meta.topic(topic)
        if tc is None:
            return make_response(cmd, RC.TOPIC_NOT_EXIST, f"topic[{topic}] not exist")
        rows = []
        for q in range(tc["writeQueueNums"]):
            cq = self.store.cqs.get(topic, q)
            mx = max(cq.max_offset, 0)
            rows.append({"topic": topic, "brokerName": self.config.brokerName, "queueId": q,
                         "minOffset": max(cq.min_offset, 0), "maxOffset": mx,
                         "lastUpdateTimestamp": self._store_ts(topic, q, mx - 1)})
        return make_response(cmd, RC.SUCCESS, body=encode_topic_stats(rows))

    async def consume_stats(self, conn, cmd):
        h = cmd.ext_fields or {}
        rows, tps = await self.group_stats(h.get("consumerGroup", ""), h.get("topic") or None)
        return make_response(cmd, RC.SUCCESS, body=encode_consume_stats(rows, tps))

    async def group_stats(self, group: str, only: str | None = None, order_only: bool = False,
                          queues_of: str = "readQueueNums", per_topic: bool = False):
        """ConsumeStats of `group` as AdminBrokerProcessor.getConsumeStats builds it: every queue
        of each topic the group has offsets for here (or of `only`), skipping topics with no
        config here, and, while the group has consumers online, topics they do not subscribe;
        per queue the broker's max offset, the group's offset (both 0 when negative) and the
        store time of the last message consumed (0: none); consumeTps the group's pulled
        messages a second over the last minute, summed over the topics.
        Returns (rows, consumeTps), or with per_topic [(rows, consumeTps)] a topic (317 answers
        one ConsumeStats per topic, over its write queues, and `order_only` skips unordered
        topics)."""
        committed: dict[str, dict[int, int]] = {}
        for key, table in (await self.meta.offsets_wrapper())["offsetTable"].items():
            topic, _, g = key.rpartition("@")
            if g == group:
                committed[topic] = {int(q): int(v) for q, v in table.items()}
        topics = [only] if only else sorted(committed)
        online = await self.meta.consumer_connection(group) if topics else None
        subscribed = set((online or {}).get("subscriptionTable") or {})
        out, rows, tps = [], [], 0.0
        for topic in topics:
            tc = await self.meta.topic(topic)
            if tc is None or (order_only and not tc.get("order")):
                continue
            if subscribed and topic not in subscribed:
                continue
            topic_rows = []
            for q in range(tc[queues_of]):
                off = max(committed.get(topic, {}).get(q, 0), 0)
                topic_rows.append({"topic": topic, "brokerName": self.config.brokerName, "queueId": q,
                                   "brokerOffset": max(self.store.max_offset(topic, q), 0), "consumerOffset": off,
                                   "lastTimestamp": self._store_ts(topic, q, off - 1)})
            stats = await self.meta.stats_data("GROUP_GET_NUMS", f"{topic}@{group}")
            topic_tps = float(stats["statsMinute"]["tps"]) if stats else 0.0
            out.append((topic_rows, topic_tps))
            rows += topic_rows
            tps += topic_tps
        return out if per_topic else (rows, tps)

    def _store_ts(self, topic: str, qid: int, queue_offset: int) -> int:
        """Store time of the message at `queue_offset` of the queue (0: none there)."""
        if queue_offset < 0:
            return 0
        e = self.store.cqs.get(topic, qid).entry(queue_offset)
        return (self.store._store_ts_at(e[0]) or 0) if e else 0


def _disk_ratio(store) -> float:
    import shutil
    u = shutil.disk_usage(store.config.commitlog_dir)
    return u.used / u.total if u.total else 0.0


__all__ = ["AdminProcessor", "Processor"]
