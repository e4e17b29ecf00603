"""Queries through the message index (spec 2.4): QUERY_MESSAGE 12, by topic and key
or, with the ext field _UNIQUE_KEY_QUERY=true, by UNIQ_KEY (the msgId producers
print).  VIEW_MESSAGE_BY_ID 33 (by the offset msgId's physical offset) is in
mq.broker.admin.  QUERY_TOPIC_CONSUME_BY_WHO 300 names the groups that consume a
topic here (committed offsets or an online subscription), for "who consumed it".

Answer: SUCCESS with every found record back to back in the body (as stored: the
client decodes them as it decodes a pull body) and indexLastUpdateTimestamp /
indexLastUpdatePhyoffset in the header; QUERY_NOT_FOUND when nothing matches.
Beyond RocketMQ, each candidate is checked against the record itself (its topic,
its KEYS words or UNIQ_KEY, its store time inside the range), so hash collisions
and entries left by a cut CommitLog tail never reach the client; and against its
queue (MessageStore.read_filed): a record whose queue fields were damaged after it
was indexed is not where they file it, and is not served.

Limits: maxNum is capped at 64 (RocketMQ's maxMsgsNumBatch) and a unique-key query
asks for 32 (defaultQueryMaxNum); the body stops before QUERY_BODY_MAX bytes."""
from __future__ import annotations

import logging

from mq.remoting import ResponseCode as RC, make_response
from mq.store import StoreError
from mq.store.index import IndexReader, QUERY_MAX_NUM
from mq.wire.adminbodies import encode_group_list
from mq.wire.commitlog import parse_record
from mq.wire.errors import WireError
from mq.wire.properties import decode_properties

from .admin import Processor
from .send import as_int

log = logging.getLogger("mq.broker.query")

UNIQUE_KEY_QUERY = "_UNIQUE_KEY_QUERY"     # MixAll.UNIQUE_MSG_QUERY_FLAG
UNIQUE_QUERY_MAX_NUM = 32                  # defaultQueryMaxNum
QUERY_BODY_MAX = 15 * 1024 * 1024          # under the 16 MiB frame limit


def record_matches(rec, topic: str, key: str, unique: bool, begin_ms: int, end_ms: int) -> bool:
    """Does the stored record carry `key` (its UNIQ_KEY, or one of its KEYS words) in `topic`?"""
    if rec.topic != topic or not begin_ms <= rec.store_timestamp_ms <= end_ms:
        return False
    props = decode_properties(rec.properties)
    if props.get("UNIQ_KEY") == key:
        return True
    return not unique and key in props.get("KEYS", "").split(" ")


class QueryProcessor(Processor):
    def __init__(self, broker):
        super().__init__(broker)
        cfg = broker.config.store_config()
        self.reader = (IndexReader(cfg.storePathRootDir, cfg.maxHashSlotNum, cfg.maxIndexNum)
                       if cfg.messageIndexEnable else None)

    def handlers(self) -> dict:
        from mq.remoting import RequestCode as R
        return {R.QUERY_MESSAGE: self.query_message, R.QUERY_TOPIC_CONSUME_BY_WHO: self.consumed_by}

    def find(self, topic: str, key: str, max_num: int, begin_ms: int, end_ms: int,
             unique: bool = False) -> list[memoryview]:
        """The matching records, newest first, at most max_num."""
        if self.reader is None:
            return []
        out: list[memoryview] = []
        size = 0
        for phy in self.reader.query(topic, key, QUERY_MAX_NUM * 4, begin_ms, end_ms):
            try:
                view = self.store.read_filed(phy)
                rec = parse_record(view)
            except (StoreError, WireError):
                continue                  # deleted by retention meanwhile, a cut tail's stale entry, or a
                                          # record not where its queue fields file it (damaged)
            if not record_matches(rec, topic, key, unique, begin_ms, end_ms):
                continue
            if size + len(view) > QUERY_BODY_MAX:
                break
            out.append(view)
            size += len(view)
            if len(out) >= max_num:
                break
        return out

    def query_message(self, conn, cmd):
        h = cmd.ext_fields or {}
        topic, key = h.get("topic"), h.get("key")
        if not topic or key is None:
            return make_response(cmd, RC.INVALID_PARAMETER, "topic and key are required")
        try:
            max_num = as_int(h.get("maxNum"), QUERY_MAX_NUM)
            begin_ms = as_int(h.get("beginTimestamp"), 0)
            end_ms = as_int(h.get("endTimestamp"), 2 ** 63 - 1)
        except ValueError as e:
            return make_response(cmd, RC.INVALID_PARAMETER, f"bad header: {e}")
        unique = h.get(UNIQUE_KEY_QUERY) == "true"
        if unique:
            max_num = UNIQUE_QUERY_MAX_NUM
        max_num = max(1, min(max_num, QUERY_MAX_NUM))
        found = self.find(topic, key, max_num, begin_ms, end_ms, unique)
        ts, phy = self.reader.last_update() if self.reader is not None else (0, 0)
        ext = {"indexLastUpdateTimestamp": ts, "indexLastUpdatePhyoffset": phy}
        if not found:
            return make_response(cmd, RC.QUERY_NOT_FOUND, "can not find message, maybe time range not correct",
                                 ext=ext)
        return make_response(cmd, RC.SUCCESS, ext=ext, body=b"".join(found))

    async def consumed_by(self, conn, cmd):
        """GroupList {"groupList": [...]} (a HashSet, mq.wire.adminbodies): groups whose online
        consumers subscribe to the topic, then groups with an offset committed for it, as
        AdminBrokerProcessor.queryTopicConsumeByWho adds them."""
        topic = (cmd.ext_fields or {}).get("topic")
        if not topic:
            return make_response(cmd, RC.INVALID_PARAMETER, "topic is required")
        groups = []
        wrapper = await self.meta.groups_wrapper()       # heartbeats create their groups here
        for g in sorted(wrapper.get("subscriptionGroupTable", {})):
            if await self.meta.subscription(g, topic) is not None:
                groups.append(g)
        offsets = await self.meta.offsets_wrapper()
        for key in sorted(offsets.get("offsetTable", {})):
            t, _, g = key.rpartition("@")
            if t == topic:
                groups.append(g)
        return make_response(cmd, RC.SUCCESS, body=encode_group_list(groups))


__all__ = ["QueryProcessor", "record_matches"]
