"""The send role: SEND_MESSAGE (10, long header names, including the C++
client's batch:"1"), SEND_MESSAGE_V2 (310, short names), SEND_BATCH_MESSAGE
(320) and CONSUMER_SEND_MSG_BACK (36).

Checks in RocketMQ's order (spec 2.2): broker role and permission, topic name,
protected system topics, topic config (auto-created from defaultTopic when
allowed), queue id, topic permission; then %RETRY% -> %DLQ% after max
reconsume times, DELAY -> SCHEDULE_TOPIC_XXXX, CLUSTER added, WAIT removed
(but honoured), and one store call.  Codes 10/11/12 still carry msgId,
queueId and queueOffset: the message was stored."""
from __future__ import annotations

import ipaddress
import logging
import random
import re
import zlib

from mq.remoting import ResponseCode as RC, make_response
from mq.store import PutStatus
from mq.wire import commitlog as wcl
from mq.wire.msgid import offset_msg_id
from mq.wire.properties import decode_properties, encode_properties

from .metadata import (PERM_READ, PERM_WRITE, SCHEDULE_TOPIC, SEND_PROTECTED_TOPICS, RETRY_PREFIX,
                       dlq_topic, retry_topic)

log = logging.getLogger("mq.broker.send")

TOPIC_RE = re.compile(r"^[%|a-zA-Z0-9_-]+$")
TOPIC_LEN_MAX = 127
SYSFLAG_COMPRESSED = 0x1
SYSFLAG_COMPRESSION_TYPE = 0x700
V2_NAMES = {"a": "producerGroup", "b": "topic", "c": "defaultTopic", "d": "defaultTopicQueueNums",
            "e": "queueId", "f": "sysFlag", "g": "bornTimestamp", "h": "flag", "i": "properties",
            "j": "reconsumeTimes", "k": "unitMode", "l": "maxReconsumeTimes", "m": "batch", "n": "brokerName"}
STATUS_CODES = {
    PutStatus.PUT_OK: RC.SUCCESS, PutStatus.FLUSH_DISK_TIMEOUT: RC.FLUSH_DISK_TIMEOUT,
    PutStatus.FLUSH_SLAVE_TIMEOUT: RC.FLUSH_SLAVE_TIMEOUT, PutStatus.SLAVE_NOT_AVAILABLE: RC.SLAVE_NOT_AVAILABLE,
    PutStatus.MESSAGE_ILLEGAL: RC.MESSAGE_ILLEGAL, PutStatus.PROPERTIES_SIZE_EXCEEDED: RC.MESSAGE_ILLEGAL,
    PutStatus.SERVICE_NOT_AVAILABLE: RC.SERVICE_NOT_AVAILABLE,
    PutStatus.CREATE_MAPPED_FILE_FAILED: RC.SYSTEM_ERROR, PutStatus.UNKNOWN_ERROR: RC.SYSTEM_ERROR,
    PutStatus.OS_PAGECACHE_BUSY: RC.SYSTEM_ERROR,
}
# RocketMQ's remarks for the statuses a DLedger commit wait can end in (SendMessageProcessor)
STATUS_REMARKS = {
    PutStatus.OS_PAGECACHE_BUSY: "[PC_SYNCHRONIZED]broker busy, start flow control for a while",
    PutStatus.UNKNOWN_ERROR: "UNKNOWN_ERROR",
}
STORED_CODES = (RC.SUCCESS, RC.FLUSH_DISK_TIMEOUT, RC.FLUSH_SLAVE_TIMEOUT, RC.SLAVE_NOT_AVAILABLE)


def _remark(result) -> str | None:
    remark = STATUS_REMARKS.get(result.status)
    if remark is not None:
        return f"{remark}: {result.reason}" if result.reason else remark
    return result.reason or None


def header_fields(cmd) -> dict[str, str]:
    """The send header with RocketMQ's long names, whichever form was sent."""
    ext = cmd.ext_fields or {}
    if "b" in ext and "topic" not in ext:
        return {V2_NAMES.get(k, k): v for k, v in ext.items()}
    return dict(ext)


def as_int(value, default: int = 0) -> int:
    if value is None or value == "":
        return default
    return int(str(value).strip())


def as_bool(value) -> bool:
    return str(value).strip().lower() in ("true", "1")


def normalize_host(host: str) -> str:
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return "127.0.0.1"
    if ip.version == 6 and ip.ipv4_mapped:
        return str(ip.ipv4_mapped)
    return str(ip)


class BadRequest(Exception):
    def __init__(self, code: int, remark: str):
        super().__init__(remark)
        self.code = code
        self.remark = remark


class SendProcessor:
    def __init__(self, broker):
        self.broker = broker
        self.config = broker.config
        self.store = broker.store
        self.meta = broker.meta

    # ---- helpers -----------------------------------------------------------------------
    def _check_topic(self, topic: str) -> None:
        if not topic or len(topic.encode()) > TOPIC_LEN_MAX or not TOPIC_RE.match(topic):
            raise BadRequest(RC.MESSAGE_ILLEGAL, f"topic [{topic}] is illegal: at most {TOPIC_LEN_MAX} "
                                                 "characters of [%|a-zA-Z0-9_-]")

    async def _topic_config(self, h: dict) -> dict:
        topic = h.get("topic", "")
        tc = await self.meta.topic(topic)
        if tc is None:
            if topic.startswith(RETRY_PREFIX):
                tc = await self.meta.create_system_topic(topic, 1)
            else:
                tc = await self.meta.create_topic_on_send(topic, h.get("defaultTopic") or "TBW102",
                                                          as_int(h.get("defaultTopicQueueNums"), 4),
                                                          as_int(h.get("topicSysFlag"), 0))
            if tc is None:
                raise BadRequest(RC.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!")
        return tc

    def _common_checks(self, topic: str) -> None:
        if not self.broker.writable():
            raise BadRequest(RC.SERVICE_NOT_AVAILABLE, "the broker is a slave: it does not accept writes")
        if not self.config.brokerPermission & PERM_WRITE:
            raise BadRequest(RC.NO_PERMISSION, f"the broker[{self.config.brokerIP1}] sending message is forbidden")
        self._check_topic(topic)
        if topic in SEND_PROTECTED_TOPICS:
            raise BadRequest(RC.NO_PERMISSION, f"sending message to topic[{topic}] is forbidden")

    def _queue_id(self, h: dict, tc: dict) -> int:
        qid = as_int(h.get("queueId"), -1)
        if qid < 0:
            qid = random.randrange(max(1, tc["writeQueueNums"]))
        if qid >= max(tc["readQueueNums"], tc["writeQueueNums"]):
            raise BadRequest(RC.INVALID_PARAMETER,
                             f"queueId[{qid}] is illegal, topic {tc['topicName']} has "
                             f"{tc['writeQueueNums']} write queues")
        if not tc["perm"] & PERM_WRITE:
            raise BadRequest(RC.NO_PERMISSION, f"the topic[{tc['topicName']}] sending message is forbidden")
        return qid

    def _response(self, cmd, code: int, res=None, queue_id: int = 0, remark: str | None = None, batch=False):
        ext = None
        if res is not None and code in STORED_CODES:
            msg_id = ",".join(res.msg_ids()) if batch else res.msg_id()
            ext = {"msgId": msg_id, "queueId": queue_id, "queueOffset": res.queue_offset(0),
                   "MSG_REGION": self.config.regionId, "TRACE_ON": self.config.traceOn}
        return make_response(cmd, code, remark, ext)

    # ---- SEND_MESSAGE / V2 / BATCH --------------------------------------------------------
    async def process(self, conn, cmd):
        h = header_fields(cmd)
        try:
            topic = h.get("topic", "")
            self._common_checks(topic)
            tc = await self._topic_config(h)
            qid = self._queue_id(h, tc)
            born_host = conn.attrs.get("born_host")
            if born_host is None:
                born_host = conn.attrs["born_host"] = normalize_host(conn.peer[0])
            born_port = conn.peer[1]
            born_ts = as_int(h.get("bornTimestamp"), 0)
            sys_flag = as_int(h.get("sysFlag"), 0)
            props = decode_properties(h.get("properties") or "")
            batch = as_bool(h.get("batch")) or cmd.code == 320
            if batch:
                return await self._send_batch(cmd, topic, qid, props, sys_flag, born_ts, born_host, born_port)
            if not cmd.body:
                raise BadRequest(RC.MESSAGE_ILLEGAL, "message body is empty")
            reconsume = as_int(h.get("reconsumeTimes"), 0)
            if topic.startswith(RETRY_PREFIX):
                group = topic[len(RETRY_PREFIX):]
                g = await self.meta.group(group)
                max_times = as_int(h.get("maxReconsumeTimes"), (g or {}).get("retryMaxTimes", 16))
                if reconsume >= max_times:
                    topic = dlq_topic(group)
                    await self.meta.create_system_topic(topic, 1)
                    qid = 0
            wait = props.pop("WAIT", "true") != "false"
            store_topic, store_qid = topic, qid
            delay = as_int(props.get("DELAY"), 0)
            if delay > 0 and (sys_flag & 0xC) in (0, 0x8):
                delay = min(delay, len(self.store.config.delay_levels_ms))
                props["REAL_TOPIC"], props["REAL_QID"] = topic, str(qid)
                store_topic, store_qid = SCHEDULE_TOPIC, delay - 1
            props["CLUSTER"] = self.config.brokerClusterName
            result = await self.broker.put_message(
                store_topic, store_qid, cmd.body, encode_properties(props), wait=wait, flag=as_int(h.get("flag")),
                sys_flag=sys_flag, born_ts_ms=born_ts, born_host=born_host, born_port=born_port,
                reconsume_times=reconsume)
        except BadRequest as e:
            return make_response(cmd, e.code, e.remark)
        except (ValueError, KeyError) as e:
            return make_response(cmd, RC.INVALID_PARAMETER, f"bad send header: {e}")
        code = STATUS_CODES[result.status]
        if code not in STORED_CODES:
            log.info("send refused (%s): header=%s body=%d bytes", result.reason, h, len(cmd.body))
        return self._response(cmd, code, result.result, qid, _remark(result))

    async def _send_batch(self, cmd, topic, qid, props, sys_flag, born_ts, born_host, born_port):
        if props.get("DELAY") or (sys_flag & 0xC):
            raise BadRequest(RC.MESSAGE_ILLEGAL, "batch messages may not be delayed or transactional")
        if not cmd.body:
            raise BadRequest(RC.MESSAGE_ILLEGAL, "batch body is empty")
        body = cmd.body
        if sys_flag & SYSFLAG_COMPRESSED:
            # The C++ client zlib-compresses a batch body over 4 KiB as a whole; stored records
            # must be individually decodable, so the batch is inflated (bounded) and stored plain.
            body = self._inflate_batch(body)
            sys_flag &= ~(SYSFLAG_COMPRESSED | SYSFLAG_COMPRESSION_TYPE)
        props.pop("WAIT", None)
        props["CLUSTER"] = self.config.brokerClusterName
        result = await self.broker.put_batch(topic, qid, body, extra_props=encode_properties(props),
                                             sys_flag=sys_flag, born_ts_ms=born_ts, born_host=born_host,
                                             born_port=born_port)
        code = STATUS_CODES[result.status]
        if code not in STORED_CODES:
            log.info("batch send refused (%s): sysFlag=%d body=%d bytes, head %s", result.reason, sys_flag,
                     len(cmd.body), cmd.body[:32].hex())
        return self._response(cmd, code, result.result, qid, _remark(result), batch=True)

    def _inflate_batch(self, body: bytes) -> bytes:
        limit = self.store.config.maxMessageSize
        d = zlib.decompressobj()
        try:
            out = d.decompress(body, limit + 1)
        except zlib.error as e:
            raise BadRequest(RC.MESSAGE_ILLEGAL, f"compressed batch body does not inflate: {e}") from None
        if len(out) > limit or d.unconsumed_tail:
            raise BadRequest(RC.MESSAGE_ILLEGAL, f"batch body inflates past maxMessageSize ({limit} bytes)")
        return out

    # ---- CONSUMER_SEND_MSG_BACK -----------------------------------------------------------
    async def send_back(self, conn, cmd):
        """A message a consumer failed: to %RETRY%<group> through the delay
        levels (3 + reconsumeTimes unless given), or to %DLQ%<group>."""
        h = cmd.ext_fields or {}
        try:
            group = h["group"]
            phy = as_int(h.get("offset"))
            delay_level = as_int(h.get("delayLevel"), 0)
        except (KeyError, ValueError) as e:
            return make_response(cmd, RC.INVALID_PARAMETER, f"bad header: {e}")
        g = await self.meta.group(group)
        if g is None:
            return make_response(cmd, RC.SUBSCRIPTION_GROUP_NOT_EXIST, f"subscription group not exist, {group}")
        try:
            rec = wcl.parse_record(self.store.cl.read_record(phy))
        except Exception as e:
            return make_response(cmd, RC.SYSTEM_ERROR, f"look message by offset failed, {phy}: {e}")
        props = decode_properties(rec.properties)
        props.setdefault("RETRY_TOPIC", rec.topic)
        props.setdefault("ORIGIN_MESSAGE_ID", h.get("originMsgId") or offset_msg_id(rec.store_host, rec.store_port, phy))
        reconsume = rec.reconsume_times
        max_times = as_int(h.get("maxReconsumeTimes"), g.get("retryMaxTimes", 16))
        if reconsume >= max_times or delay_level < 0:
            topic, qid = dlq_topic(group), 0
            await self.meta.create_system_topic(topic, 1)
            store_topic, store_qid = topic, qid
        else:
            topic = retry_topic(group)
            tc = await self.meta.create_system_topic(topic, g.get("retryQueueNums", 1))
            qid = random.randrange(max(1, tc["writeQueueNums"]))
            level = delay_level if delay_level > 0 else 3 + reconsume
            level = min(level, len(self.store.config.delay_levels_ms))
            props["REAL_TOPIC"], props["REAL_QID"], props["DELAY"] = topic, str(qid), str(level)
            store_topic, store_qid = SCHEDULE_TOPIC, level - 1
        props.pop("WAIT", None)
        result = await self.broker.put_message(
            store_topic, store_qid, rec.body, encode_properties(props), wait=False, flag=rec.flag,
            sys_flag=rec.sys_flag, born_ts_ms=rec.born_timestamp_ms, born_host=rec.born_host,
            born_port=rec.born_port, reconsume_times=reconsume + 1)
        if result.status is PutStatus.PUT_OK:
            return make_response(cmd, RC.SUCCESS)
        return make_response(cmd, RC.SYSTEM_ERROR, result.status.value)


__all__ = ["SendProcessor", "header_fields", "as_int", "as_bool", "BadRequest", "PERM_READ"]
