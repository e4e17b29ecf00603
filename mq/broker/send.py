"""The send role: SEND_MESSAGE (10, long header names, including the C++
client's batch:"1"), SEND_MESSAGE_V2 (310, short names), SEND_BATCH_MESSAGE
(320), CONSUMER_SEND_MSG_BACK (36), END_TRANSACTION (37; the store work is the
supervisor's, mq.broker.transaction) and SEND_REPLY_MESSAGE / _V2 (324 / 325).

Checks in RocketMQ's order (spec 2.2): broker role and permission, topic name,
protected system topics, topic config (auto-created from defaultTopic when
allowed), queue id, topic permission; then %RETRY% -> %DLQ% after max
reconsume times, DELAY -> SCHEDULE_TOPIC_XXXX, CLUSTER added, WAIT removed
(but honoured), and one store call.  Codes 10/11/12 still carry msgId,
queueId and queueOffset: the message was stored."""
from __future__ import annotations

import asyncio
import ipaddress
import logging
import random
import time
import types
import zlib
from time import perf_counter_ns

from mq.remoting import ResponseCode as RC, make_response
from mq.wire.codes import RequestCode as R
from mq.remoting.server import DEFERRED
from mq.store import PutStatus, PutResult, StoreError
from mq.store.commitlog import INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN, host_bytes
from mq.store.stats import HIST_BUCKETS, HIST_SUM
from mq.store.store import put_error
from mq.wire import commitlog as wcl
from mq.wire.errors import WireError
from mq.wire.headers import is_send_v2, send_long_names
from mq.wire.msgid import offset_msg_id
from mq.wire.properties import decode_properties, encode_properties
from mq.wire.remoting import ResponseTemplate
from mq.wire.topics import (PERM_READ, PERM_WRITE, RETRY_PREFIX, SCHEDULE_TOPIC, SEND_PROTECTED_TOPICS, TOPIC_LEN_MAX,
                            TOPIC_RE, dlq_topic, retry_topic)

from .tracing import CURRENT as CURRENT_TIMES
from .transaction import HALF_TOPIC, half_properties, is_half

log = logging.getLogger("mq.broker.send")

GROUP_LEN_MAX = 255          # RocketMQ's Validators.checkGroup: the topic's characters, at most 255
# RocketMQ's SendMessageProcessor, in one table: a store status's response code, its remark
# (None: the store's reason alone), and whether the message was stored (the answer then carries
# its msgId, queueId and queueOffset: codes 10/11/12 too)
SEND_STATUS: dict[PutStatus, tuple[int, str | None, bool]] = {
    PutStatus.PUT_OK: (RC.SUCCESS, None, True),
    PutStatus.FLUSH_DISK_TIMEOUT: (RC.FLUSH_DISK_TIMEOUT, None, True),
    PutStatus.FLUSH_SLAVE_TIMEOUT: (RC.FLUSH_SLAVE_TIMEOUT, None, True),
    PutStatus.SLAVE_NOT_AVAILABLE: (RC.SLAVE_NOT_AVAILABLE, None, True),
    PutStatus.MESSAGE_ILLEGAL: (RC.MESSAGE_ILLEGAL, None, False),
    PutStatus.PROPERTIES_SIZE_EXCEEDED: (RC.MESSAGE_ILLEGAL, None, False),
    PutStatus.SERVICE_NOT_AVAILABLE: (RC.SERVICE_NOT_AVAILABLE, None, False),
    PutStatus.CREATE_MAPPED_FILE_FAILED: (RC.SYSTEM_ERROR, None, False),
    PutStatus.UNKNOWN_ERROR: (RC.SYSTEM_ERROR, "UNKNOWN_ERROR", False),        # DLedger: the term changed
    PutStatus.OS_PAGECACHE_BUSY: (RC.SYSTEM_ERROR, "[PC_SYNCHRONIZED]broker busy, start flow control for a while",
                                  False),                                   # DLedger: no quorum in time
}
GOOD_TOPICS_MAX = 10_000


def send_status(result: PutResult) -> tuple[int, str | None, bool]:
    """(response code, remark, stored) of a store outcome (SEND_STATUS; the remark with the
    store's reason)."""
    code, remark, stored = SEND_STATUS[result.status]
    if remark is not None:
        return code, (f"{remark}: {result.reason}" if result.reason else remark), stored
    return code, result.reason or None, stored


def header_fields(cmd) -> dict[str, str]:
    """The send header with RocketMQ's long names, whichever form was sent."""
    return send_long_names(cmd.ext_fields or {})


def as_int(value, default: int = 0) -> int:
    if value is None or value == "":
        return default
    return int(str(value).strip())


def header_int(h: dict, name: str, default: int, lo: int = INT32_MIN, hi: int = INT32_MAX) -> int:
    """A request header's integer field (int32 unless told), `default` when absent or empty.
    One that is not a decimal integer in [lo, hi] is refused as RocketMQ refuses a header it
    cannot decode: SYSTEM_ERROR, the field named in the remark (before it reaches the store)."""
    v = h.get(name)
    if v is None or v == "":
        return default
    try:
        n = int(str(v).strip())
    except ValueError:
        n = None
    if n is None or not lo <= n <= hi:
        raise BadRequest(RC.SYSTEM_ERROR, f"the header field {name}={str(v)[:64]!r} is not an integer "
                                          f"in [{lo}, {hi}]")
    return n


def check_group(group) -> str:
    """A consumer or producer group name as RocketMQ's clients validate it; INVALID_PARAMETER
    otherwise.  It names directories under the store (its %RETRY% topic), so this is a guard."""
    if not isinstance(group, str) or not group or len(group) > GROUP_LEN_MAX or not TOPIC_RE.match(group):
        raise BadRequest(RC.INVALID_PARAMETER, f"the group name {str(group)[:300]!r} is illegal: 1 to "
                                               f"{GROUP_LEN_MAX} characters of [%|a-zA-Z0-9_-]")
    return group


def utf8(text: str, what: str) -> bytes:
    """`text` as UTF-8; MESSAGE_ILLEGAL when it cannot be (a lone surrogate a JSON header can carry)."""
    try:
        return text.encode()
    except UnicodeEncodeError as e:
        raise BadRequest(RC.MESSAGE_ILLEGAL, f"the {what} are not valid UTF-8: {e.reason} at {e.start}") from None


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


def born_packed(conn) -> bytes:
    """A connection's born host as a record stores it (4 or 16 bytes), computed once per connection
    (its normalized text is SendProcessor._born's)."""
    packed = conn.attrs.get("born_packed")
    if packed is None:
        packed = conn.attrs["born_packed"] = host_bytes(SendProcessor._born(conn)[0])
    return packed


class BadRequest(Exception):
    def __init__(self, code: int, remark: str):
        super().__init__(remark)
        self.code = code
        self.remark = remark


class SendProcessor:
    def __init__(self, broker, group: "SendGroup | None" = None):
        self.broker = broker
        self.config = broker.config
        self.store = broker.store
        self.meta = broker.meta
        self.group = group                 # None: every send takes the full path
        self.fast = None                   # the C path (mq.broker.fastsend.FastSends), or None
        self.stats = getattr(broker, "stats", None)     # mq.broker.iostats.IoStats, or None (no stats block)
        self._good_topics: set[str] = set()   # names _check_topic passed
        trace_on = self.config.traceOn
        # a stored send's answer: SendMessageResponseHeader, then the broker's region and trace switch
        self._stored = self.stored_template = ResponseTemplate(("msgId", "queueId", "queueOffset"), {
            "MSG_REGION": str(self.config.regionId),
            "TRACE_ON": str(trace_on).lower() if isinstance(trace_on, bool) else str(trace_on)})

    # ---- helpers -----------------------------------------------------------------------
    def _check_topic(self, topic: str) -> None:
        if topic in self._good_topics:
            return
        if not topic or len(topic.encode()) > TOPIC_LEN_MAX or not TOPIC_RE.match(topic):
            raise BadRequest(RC.MESSAGE_ILLEGAL, f"topic [{topic}] is illegal: at most {TOPIC_LEN_MAX} "
                                                 "characters of [%|a-zA-Z0-9_-]")
        if len(self._good_topics) >= GOOD_TOPICS_MAX:
            self._good_topics.clear()
        self._good_topics.add(topic)

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
            raise BadRequest(RC.SERVICE_NOT_AVAILABLE, "the broker does not accept writes now (a slave, a DLedger "
                                                       "follower, or a master taking back data from its slave "
                                                       "after a crash)")
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

    @staticmethod
    def _born(conn) -> tuple[str, int]:
        """(born host, born port) of a connection's messages: its peer, the host normalized once."""
        born_host = conn.attrs.get("born_host")
        if born_host is None:
            born_host = conn.attrs["born_host"] = normalize_host(conn.peer[0])
        return born_host, conn.peer[1]

    async def _target(self, h: dict) -> tuple[str, dict, int]:
        """(topic, its config, queue id) of a send header, checked in RocketMQ's order (BadRequest)."""
        topic = h.get("topic", "")
        self._common_checks(topic)
        tc = await self._topic_config(h)
        return topic, tc, self._queue_id(h, tc)

    def _response(self, cmd, result: PutResult, queue_id: int = 0, batch=False):
        code, remark, stored = send_status(result)
        res = result.result
        ext = None
        if res is not None and stored:
            msg_id = ",".join(res.msg_ids()) if batch else res.msg_id()
            ext = {"msgId": msg_id, "queueId": queue_id, "queueOffset": res.queue_offset(0),
                   "MSG_REGION": self.config.regionId, "TRACE_ON": self.config.traceOn}
        return make_response(cmd, code, remark, ext)

    # ---- the fast path: single sends, appended in groups ---------------------------------------
    def handle(self, conn, cmd):
        """SEND_MESSAGE / SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE.  A single send to a topic this
        worker knows, needing no property rewrite beyond CLUSTER and WAIT, joins the current
        group (answered when the group is appended: DEFERRED); everything else - batches,
        %RETRY% topics, DELAY, a topic not cached yet, a header that does not parse - takes the
        full path (process), which gives every refusal its RocketMQ code.  The checks are the
        full path's, in its order."""
        group = self.group
        if group is None or cmd.code == R.SEND_BATCH_MESSAGE:
            return self.process(conn, cmd)
        ext = cmd.ext_fields
        if ext is None:
            return self.process(conn, cmd)
        if is_send_v2(ext):                             # SEND_MESSAGE_V2's letters (mq.wire.headers)
            topic, qid_s, props, batch = ext.get("b"), ext.get("e"), ext.get("i"), ext.get("m")
            sys_flag_s, born_s, flag_s, reconsume_s = ext.get("f"), ext.get("g"), ext.get("h"), ext.get("j")
        else:
            topic, qid_s, props, batch = ext.get("topic"), ext.get("queueId"), ext.get("properties"), ext.get("batch")
            sys_flag_s, born_s = ext.get("sysFlag"), ext.get("bornTimestamp")
            flag_s, reconsume_s = ext.get("flag"), ext.get("reconsumeTimes")
        if not topic or (batch and batch.strip().lower() in ("true", "1")) or topic.startswith(RETRY_PREFIX):
            return self.process(conn, cmd)
        tc = self.meta.cached_topics.get(topic)
        if tc is None or not cmd.body:
            return self.process(conn, cmd)
        fast = self.fast
        if fast is not None and fast.usable:
            fast.publish(topic, tc)         # C takes this topic's sends from the next one on
        props = props or ""
        wait = True
        if "\x01" in props:
            if "DELAY\x01" in props or "CLUSTER\x01" in props or "TRAN_MSG\x01" in props:
                return self.process(conn, cmd)
            at = props.find("WAIT\x01")
            if at >= 0:
                # WAIT is honoured, not stored: cut its entry (it must start an entry, and be the only one)
                if at and props[at - 1] != "\x02":
                    return self.process(conn, cmd)
                stop = props.find("\x02", at)
                wait = props[at + 5:stop if stop >= 0 else len(props)] != "false"
                props = props[:at] + (props[stop + 1:] if stop >= 0 else "")
                if "WAIT\x01" in props:
                    return self.process(conn, cmd)
        try:
            self._common_checks(topic)
            qid = int(qid_s) if qid_s else -1
            sys_flag = int(sys_flag_s) if sys_flag_s else 0
            born_ts = int(born_s) if born_s else 0
            flag = int(flag_s) if flag_s else 0
            reconsume = int(reconsume_s) if reconsume_s else 0
            if not (INT32_MIN <= qid <= INT32_MAX and INT32_MIN <= sys_flag <= INT32_MAX
                    and INT32_MIN <= flag <= INT32_MAX and INT32_MIN <= reconsume <= INT32_MAX
                    and INT64_MIN <= born_ts <= INT64_MAX):
                return self.process(conn, cmd)          # the full path names the field that does not fit
            props_b = props.encode() if props else b""
            if qid < 0:
                qid = random.randrange(max(1, tc["writeQueueNums"]))
            if qid >= max(tc["readQueueNums"], tc["writeQueueNums"]):
                return self.process(conn, cmd)          # its refusal comes from the full path
            if not tc["perm"] & PERM_WRITE:
                raise BadRequest(RC.NO_PERMISSION, f"the topic[{tc['topicName']}] sending message is forbidden")
        except BadRequest as e:
            if self.stats is not None:
                self.stats.sent(e.code, 0)
            return make_response(cmd, e.code, e.remark)
        except ValueError:                              # not a number, or properties not UTF-8
            return self.process(conn, cmd)
        born = conn.attrs.get("born_c")
        if born is None:
            packed = born_packed(conn)
            born = conn.attrs["born_c"] = (packed, group.appender.c_bytes(packed), len(packed))
        group.add(conn, cmd, topic.encode(), qid, props_b, flag, sys_flag, born_ts, born, conn.peer[1], reconsume,
                  wait)
        return DEFERRED

    def respond_stored(self, conn, cmd, code: int, msg_id: bytes, qid: int, queue_offset: int, remark, times):
        """The response to a stored single send (a `stored` status of SEND_STATUS): from the template
        when there is no remark -- the bytes make_response + encode_frame would give."""
        if remark is None:
            frame = self._stored.frame(cmd.serialize_type, code, cmd.language, cmd.version, cmd.opaque,
                                       msg_id, b"%d" % qid, b"%d" % queue_offset)
            if frame is not None:
                if times is not None:
                    times.status = code
                conn.respond(cmd, frame, times)
                return
        ext = {"msgId": msg_id.decode(), "queueId": qid, "queueOffset": queue_offset,
               **self._stored.fixed}
        conn.respond(cmd, make_response(cmd, code, remark, ext), times)

    # ---- SEND_MESSAGE / V2 / BATCH --------------------------------------------------------
    def process(self, conn, cmd):
        """The full path (a coroutine); with a stats block, its answer is timed and counted."""
        if self.stats is None:
            return self._process(conn, cmd)
        return self._process_counted(conn, cmd)

    async def _process_counted(self, conn, cmd):
        t0_ns = perf_counter_ns()
        try:
            resp = await self._process(conn, cmd)
        except Exception:                       # the server answers SYSTEM_ERROR
            self.stats.sent(RC.SYSTEM_ERROR, perf_counter_ns() - t0_ns)
            raise
        self.stats.sent(resp.code, perf_counter_ns() - t0_ns)
        return resp

    async def _process(self, conn, cmd):
        h = header_fields(cmd)
        try:
            topic, tc, qid = await self._target(h)
            born_host, born_port = self._born(conn)
            born_ts = header_int(h, "bornTimestamp", 0, INT64_MIN, INT64_MAX)
            sys_flag = header_int(h, "sysFlag", 0)
            flag = header_int(h, "flag", 0)
            reconsume = header_int(h, "reconsumeTimes", 0)
            max_times_h = header_int(h, "maxReconsumeTimes", -1)
            raw_props = h.get("properties") or ""
            utf8(raw_props, "properties")
            props = decode_properties(raw_props)
            batch = as_bool(h.get("batch")) or cmd.code == R.SEND_BATCH_MESSAGE
            if batch:
                return await self._send_batch(cmd, topic, qid, props, sys_flag, born_ts, born_host, born_port)
            if not cmd.body:
                raise BadRequest(RC.MESSAGE_ILLEGAL, "message body is empty")
            if topic.startswith(RETRY_PREFIX):
                group = topic[len(RETRY_PREFIX):]
                g = await self.meta.group(group)
                max_times = max_times_h if max_times_h >= 0 else (g or {}).get("retryMaxTimes", 16)
                if reconsume >= max_times:
                    topic = dlq_topic(group)
                    await self.meta.create_system_topic(topic, 1)
                    qid = 0
            wait = props.pop("WAIT", "true") != "false"
            store_topic, store_qid = topic, qid
            delay = as_int(props.get("DELAY"), 0)
            if is_half(props):
                # a half message (mq.broker.transaction): kept aside until END_TRANSACTION or the check
                if self.config.rejectTransactionMessage:
                    raise BadRequest(RC.NO_PERMISSION,
                                     f"the broker[{self.config.brokerIP1}] sending transaction message is forbidden")
                if await self.meta.topic(HALF_TOPIC) is None:
                    await self.meta.create_system_topic(HALF_TOPIC, 1)
                half_properties(props, topic, qid)
                store_topic, store_qid = HALF_TOPIC, 0
                sys_flag &= ~wcl.TRANSACTION_MASK
            elif delay > 0 and (sys_flag & wcl.TRANSACTION_MASK) in (wcl.TRANSACTION_NOT_TYPE, wcl.TRANSACTION_COMMIT):
                delay = min(delay, len(self.store.config.delay_levels_ms))
                props["REAL_TOPIC"], props["REAL_QID"] = topic, str(qid)
                store_topic, store_qid = SCHEDULE_TOPIC, delay - 1
            props["CLUSTER"] = self.config.brokerClusterName
            result = await self.broker.put_message(
                store_topic, store_qid, cmd.body, encode_properties(props), wait=wait, flag=flag, sys_flag=sys_flag,
                born_ts_ms=born_ts, born_host=born_host, born_port=born_port, reconsume_times=reconsume)
        except BadRequest as e:
            return make_response(cmd, e.code, e.remark)
        except (ValueError, KeyError) as e:
            return make_response(cmd, RC.INVALID_PARAMETER, f"bad send header: {e}")
        if not SEND_STATUS[result.status][2]:
            log.info("send refused (%s): header=%s body=%d bytes", result.reason, h, len(cmd.body))
        elif self.stats is not None:
            self.stats.put(topic, 1, len(cmd.body))
        return self._response(cmd, result, qid)

    async def _send_batch(self, cmd, topic, qid, props, sys_flag, born_ts, born_host, born_port):
        if props.get("DELAY") or (sys_flag & wcl.TRANSACTION_MASK):
            raise BadRequest(RC.MESSAGE_ILLEGAL, "batch messages may not be delayed or transactional")
        if not cmd.body:
            raise BadRequest(RC.MESSAGE_ILLEGAL, "batch body is empty")
        body = cmd.body
        if sys_flag & wcl.COMPRESSED:
            # The C++ client zlib-compresses a batch body over 4 KiB as a whole; stored records
            # must be individually decodable, so the batch is inflated (bounded) and stored plain.
            body = self._inflate_batch(body)
            sys_flag &= ~(wcl.COMPRESSED | wcl.COMPRESSION_TYPE_MASK)
        props.pop("WAIT", None)
        props["CLUSTER"] = self.config.brokerClusterName
        result = await self.broker.put_batch(topic, qid, body, extra_props=encode_properties(props),
                                             sys_flag=sys_flag, born_ts_ms=born_ts, born_host=born_host,
                                             born_port=born_port)
        if not SEND_STATUS[result.status][2]:
            log.info("batch send refused (%s): sysFlag=%d body=%d bytes, head %s", result.reason, sys_flag,
                     len(cmd.body), cmd.body[:32].hex())
        elif self.stats is not None and result.result is not None:
            self.stats.put(topic, result.result.count, len(body))
        return self._response(cmd, result, qid, batch=True)

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

    # ---- END_TRANSACTION ----------------------------------------------------------------------
    async def end_transaction(self, conn, cmd):
        """END_TRANSACTION (37, one-way from RocketMQ's clients): the header checked here, the
        store work done by the supervisor (mq.broker.transaction), which answers every producer
        of the broker in one order.  A type other than commit or rollback is not answered
        (EndTransactionProcessor returns null)."""
        if self.config.brokerRole == "SLAVE":
            return make_response(cmd, RC.SLAVE_NOT_AVAILABLE, "the broker is a slave")
        h = cmd.ext_fields or {}
        try:
            for name in ("producerGroup", "tranStateTableOffset", "commitLogOffset", "commitOrRollback"):
                if h.get(name) in (None, ""):
                    raise BadRequest(RC.SYSTEM_ERROR, f"the custom field <{name}> is null")
            header = {"producerGroup": h["producerGroup"],
                      "tranStateTableOffset": header_int(h, "tranStateTableOffset", 0, INT64_MIN, INT64_MAX),
                      "commitLogOffset": header_int(h, "commitLogOffset", 0, INT64_MIN, INT64_MAX),
                      "commitOrRollback": header_int(h, "commitOrRollback", 0)}
        except BadRequest as e:
            return make_response(cmd, e.code, e.remark)
        kind = header["commitOrRollback"]
        if kind not in (wcl.TRANSACTION_COMMIT, wcl.TRANSACTION_ROLLBACK):
            log.info("END_TRANSACTION from %s with type %d (%s): not answered", conn.peer, kind,
                     "unknown state" if kind == wcl.TRANSACTION_NOT_TYPE else "not a transaction type")
            return None
        if as_bool(h.get("fromTransactionCheck")):
            log.info("transaction %s of %s %s after a check", h.get("msgId"), header["producerGroup"],
                     "committed" if kind == wcl.TRANSACTION_COMMIT else "rolled back")
        code, remark = await self.meta.end_transaction(header)
        return make_response(cmd, code, remark)

    # ---- SEND_REPLY_MESSAGE / _V2 -------------------------------------------------------------
    async def send_reply(self, conn, cmd):
        """SEND_REPLY_MESSAGE (324) / _V2 (325), RocketMQ's ReplyMessageProcessor: a replier's answer
        to a request goes to the requester named by REPLY_TO_CLIENT as PUSH_REPLY_MESSAGE_TO_CLIENT
        (326), on whichever io worker holds its connection (the supervisor knows), and is stored in
        its topic (<cluster>_REPLY_TOPIC) with storeReplyMessageEnable.  SUCCESS means pushed:
        SYSTEM_ERROR names why not (no REPLY_TO_CLIENT, or no connection of that client here),
        stored or not.  The push is one-way: a requester that fails to take it is not noticed
        (RocketMQ waits for the client's answer)."""
        h = header_fields(cmd)
        try:
            topic, tc, qid = await self._target(h)
            born_ts = header_int(h, "bornTimestamp", 0, INT64_MIN, INT64_MAX)
            sys_flag = header_int(h, "sysFlag", 0)
            flag = header_int(h, "flag", 0)
            reconsume = header_int(h, "reconsumeTimes", 0)
            raw_props = h.get("properties") or ""
            props_b = utf8(raw_props, "properties")
            props = decode_properties(raw_props)
            if not cmd.body:
                raise BadRequest(RC.MESSAGE_ILLEGAL, "message body is empty")
        except BadRequest as e:
            return make_response(cmd, e.code, e.remark)
        except (ValueError, KeyError) as e:
            return make_response(cmd, RC.INVALID_PARAMETER, f"bad send header: {e}")
        born_host, _ = self._born(conn)
        cfg = self.config
        client = props.get("REPLY_TO_CLIENT")
        if not client:
            pushed, remark = False, "reply message properties[REPLY_TO_CLIENT] is null"
        else:
            now_ms = int(time.time() * 1000)
            props["PUSH_REPLY_TIME"] = str(now_ms)
            ext = {"producerGroup": h.get("producerGroup", ""), "topic": topic,
                   "defaultTopic": h.get("defaultTopic", ""), "defaultTopicQueueNums": h.get("defaultTopicQueueNums", "0"),
                   "queueId": str(qid), "sysFlag": str(sys_flag), "bornTimestamp": str(born_ts), "flag": str(flag),
                   "properties": encode_properties(props).decode(), "reconsumeTimes": str(reconsume),
                   "unitMode": h.get("unitMode", "false"), "bornHost": f"{born_host}:{conn.peer[1]}",
                   "storeHost": f"{cfg.brokerIP1}:{cfg.listenPort}", "storeTimestamp": str(now_ms)}
            pushed = await self.meta.push_reply(client, ext, cmd.body.hex())
            remark = None if pushed else f"push reply message fail, channel of <{client}> not found."
            if not pushed:
                log.warning("%s", remark)
        resp_ext = {"MSG_REGION": cfg.regionId, "TRACE_ON": cfg.traceOn}
        if pushed:
            resp_ext.update(msgId="0", queueId=qid, queueOffset=0)
        if cfg.storeReplyMessageEnable:
            result = await self.broker.put_message(topic, qid, cmd.body, props_b, wait=False, flag=flag,
                                                   sys_flag=sys_flag, born_ts_ms=born_ts, born_host=born_host,
                                                   born_port=conn.peer[1], reconsume_times=reconsume)
            if SEND_STATUS[result.status][2]:
                if self.stats is not None:
                    self.stats.put(topic, 1, len(cmd.body))
                if pushed:
                    resp_ext.update(msgId=result.result.msg_id(), queueOffset=result.result.queue_offset(0))
            else:
                log.warning("reply message to %s not stored: %s", topic, result.reason or result.status.name)
        return make_response(cmd, RC.SUCCESS if pushed else RC.SYSTEM_ERROR, remark, resp_ext)

    # ---- CONSUMER_SEND_MSG_BACK -----------------------------------------------------------
    async def send_back(self, conn, cmd):
        """A message a consumer failed: to %RETRY%<group> through the delay
        levels (3 + reconsumeTimes unless given), or to %DLQ%<group>."""
        h = cmd.ext_fields or {}
        try:
            group = check_group(h["group"])
            phy = header_int(h, "offset", -1, INT64_MIN, INT64_MAX)
            delay_level = header_int(h, "delayLevel", 0)
            max_times_h = header_int(h, "maxReconsumeTimes", -1)
        except KeyError as e:
            return make_response(cmd, RC.INVALID_PARAMETER, f"bad header: {e} is missing")
        except BadRequest as e:
            return make_response(cmd, e.code, e.remark)
        g = await self.meta.group(group)
        if g is None:
            return make_response(cmd, RC.SUBSCRIPTION_GROUP_NOT_EXIST, f"subscription group not exist, {group}")
        try:
            rec = wcl.parse_record(self.store.read_filed(phy))
        except (StoreError, WireError) as e:
            return make_response(cmd, RC.SYSTEM_ERROR, f"look message by offset failed, {phy}: {e}")
        props = decode_properties(rec.properties)
        props.setdefault("RETRY_TOPIC", rec.topic)
        props.setdefault("ORIGIN_MESSAGE_ID", h.get("originMsgId") or offset_msg_id(rec.store_host, rec.store_port, phy))
        reconsume = rec.reconsume_times
        max_times = max_times_h if max_times_h >= 0 else g.get("retryMaxTimes", 16)
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


def _flush_all(entries) -> None:
    """Writes the answers queued on the entries' connections now (one write per connection),
    not an event-loop iteration later."""
    seen = set()
    for entry in entries:
        conn = entry[0]
        if conn.id not in seen:
            seen.add(conn.id)
            conn.flush()


class SendGroup:
    """The single sends of one event-loop iteration, across every connection of this io worker:
    appended with one C call (one wake of the dispatch and flush roles), then answered together.
    Sends that need no wait are answered at once; under SYNC_FLUSH, SYNC_MASTER or DLedger the
    group waits once - for its last end offset to be flushed, acknowledged by a slave or
    committed - in one Task, and every send of it gets the outcome (a send is never answered
    SEND_OK before its own end is covered: the group's last end covers every earlier one)."""

    def __init__(self, broker, sender: SendProcessor):
        self.broker = broker
        self.sender = sender
        self.appender = broker.store.cl.group()
        self.loop = asyncio.get_running_loop()
        self.pending: list[tuple] = []
        self.cluster = ("CLUSTER\x01" + broker.config.brokerClusterName).encode()
        self._cluster_c = self.appender.c_bytes(self.cluster)
        self.waits: set[asyncio.Task] = set()
        self.groups = 0                    # groups appended, for tests and the trace
        self.msgs = 0
        self.stats = sender.stats          # counters (mq.broker.iostats), or None
        self._t_first_ns = 0               # metrics: when the pending group's first send came

    def add(self, conn, cmd, topic: bytes, qid: int, props: bytes, flag: int, sys_flag: int, born_ts: int,
            born, born_port: int, reconsume: int, wait: bool) -> None:
        tracer = self.broker.tracer
        times = CURRENT_TIMES.get() if tracer is not None else None
        if not self.pending:
            self.loop.call_soon(self.run)
            if self.stats is not None:
                self._t_first_ns = perf_counter_ns()
        self.pending.append((conn, cmd, topic, qid, props, flag, sys_flag, born_ts, born, born_port, reconsume,
                             wait, times))

    def run(self) -> None:
        """Appends and answers the pending sends (a loop callback: runs once per iteration).
        Every send taken is answered exactly once, whatever fails: a chunk that raises
        anyway (a bug) answers what it had not answered with SYSTEM_ERROR, logged once."""
        pending, self.pending = self.pending, []
        cap = self.appender.capacity
        for start in range(0, len(pending), cap):
            chunk = pending[start:start + cap]
            answered: set[int] = set()          # ids of the chunk's entries answered or handed to a wait
            try:
                self._run(chunk, answered)
            except Exception as e:
                log.exception("send group failed; its unanswered sends get SYSTEM_ERROR")
                self.appender.reset()
                for entry in chunk:
                    if id(entry) not in answered:
                        self._refuse(entry, RC.SYSTEM_ERROR, f"{type(e).__name__}: {e}")
                _flush_all(chunk)

    def _refuse(self, entry: tuple, code: int, remark: str) -> None:
        """Answers one send of the group alone (never stored)."""
        conn, cmd, times = entry[0], entry[1], entry[12]
        if self.stats is not None:
            self.stats.sent(code, 0)
        conn.respond(cmd, make_response(cmd, code, remark), times)

    def _run(self, batch: list[tuple], answered: set[int]) -> None:
        app = self.appender
        cluster, cluster_len = self._cluster_c, len(self.cluster)
        add = app.add
        t_store = perf_counter_ns() if self.broker.tracer is not None else 0
        members = []                         # (entry, its index in the appender): answers follow the index
        for entry in batch:
            (conn, cmd, topic, qid, props, flag, sys_flag, born_ts, born, born_port, reconsume, _w, _t) = entry
            try:
                i = add(topic, qid, cmd.body, props, cluster, cluster_len, born[1], born[2], born_port, flag=flag,
                        sys_flag=sys_flag, born_ts_ms=born_ts, reconsume_times=reconsume)
            except ValueError as e:          # handle() checked the ranges: this is a second line
                answered.add(id(entry))
                self._refuse(entry, RC.SYSTEM_ERROR, str(e))
                continue
            assert i >= 0, "run() splits pending into chunks of the appender's capacity"
            members.append((entry, i))
            conn._flush_scheduled = True    # its answers go out in _flush_all below, not a callback each
        try:
            app.run()
        except Exception as e:               # a fatal store error: nothing of the group is known stored
            log.error("group append of %d sends failed: %s", len(members), e)
            for entry, _ in members:
                answered.add(id(entry))
                self._refuse(entry, RC.SYSTEM_ERROR, f"the store refused the append: {e}")
            _flush_all(batch)
            return
        self.groups += 1
        self.msgs += len(members)
        t_appended = perf_counter_ns() if t_store else 0
        stats = self.stats
        if stats is not None:
            put_rows = stats.put_rows
            latency_ns = perf_counter_ns() - self._t_first_ns
            refused = 0
        broker = self.broker
        waiting = []                         # (entry, its AppendResult) of stored sends that must wait
        dledger = broker.commit_waiter is not None
        sync_flush = broker.store.config.flushDiskType == "SYNC_FLUSH"
        sync_master = broker.config.brokerRole == "SYNC_MASTER"
        respond = self.sender.respond_stored
        for entry, i in members:
            conn, cmd, topic, qid, wait, times = entry[0], entry[1], entry[2], entry[3], entry[11], entry[12]
            answered.add(id(entry))
            if times is not None:
                times.store_ns, times.appended_ns, times.msgs = t_store, t_appended, 1
            if app.rc(i) != 0:
                result = put_error(app.error(i, topic.decode(), qid))
                self._respond_result(conn, cmd, qid, result, times)
                if stats is not None:
                    refused += 1
                    stats.sent(SEND_STATUS[result.status][0], latency_ns)
                continue
            if stats is not None:
                row = put_rows.get(topic) or stats.put_row(topic)
                row[0] += 1
                row[1] += len(cmd.body)
            if dledger or (wait and (sync_flush or sync_master)):
                waiting.append((entry, app.result(i)))
                continue
            respond(conn, cmd, RC.SUCCESS, app.msg_id(i), qid, app.queue_offset(i), None, times)
        _flush_all(batch)
        if stats is not None:
            answered_now = len(members) - refused - len(waiting)
            if answered_now:                 # IoStats.sent for SUCCESS, inline: this runs for every group
                ok, k = stats.ok_row, (latency_ns // 1000).bit_length()
                ok[k if k < HIST_BUCKETS else HIST_BUCKETS - 1] += answered_now
                ok[HIST_SUM] += latency_ns * answered_now
        if waiting:
            task = self.loop.create_task(self._settle(waiting, self._t_first_ns))
            self.waits.add(task)
            task.add_done_callback(self.waits.discard)

    async def _settle(self, waiting: list, t_first_ns: int = 0) -> None:
        """One wait for the whole group (its last end), then every send's answer.  t_first_ns:
        when the group's first send came (metrics)."""
        broker = self.broker
        last = waiting[-1][1]                 # appended last: its end covers every earlier one
        span = types.SimpleNamespace(flushed_ns=0, acked_ns=0) if broker.tracer is not None else None
        try:
            outcome = await broker.settle(await broker.store.durable(last, True), True, span)
            statuses = [outcome if outcome.result is None else PutResult(outcome.status, r, outcome.reason)
                        for _, r in waiting]
        except Exception as e:                # never leave a client waiting
            log.exception("group wait failed")
            statuses = [PutResult(PutStatus.UNKNOWN_ERROR, None, f"{type(e).__name__}: {e}") for _ in waiting]
        t_flushed, t_acked = (span.flushed_ns, span.acked_ns) if span is not None else (0, 0)
        if self.stats is not None:
            latency_ns = perf_counter_ns() - t_first_ns
            for result in statuses:
                self.stats.sent(SEND_STATUS[result.status][0], latency_ns)
        for (entry, _), result in zip(waiting, statuses):
            times = entry[12]
            if times is not None:
                times.flushed_ns = t_flushed or times.appended_ns
                times.acked_ns = t_acked or times.flushed_ns
            if entry[0].closed:
                entry[0].respond(entry[1], None, times)
                continue
            entry[0]._flush_scheduled = True    # written by _flush_all below
            try:
                self._respond_result(entry[0], entry[1], entry[3], result, times)
            except Exception as e:            # never leave a client waiting
                log.exception("answering a waited send failed")
                entry[0].respond(entry[1], make_response(entry[1], RC.SYSTEM_ERROR, f"{type(e).__name__}: {e}"),
                                 times)
        _flush_all(entry for entry, _ in waiting)

    def _respond_result(self, conn, cmd, qid: int, result: PutResult, times) -> None:
        code, remark, stored = send_status(result)
        if stored and result.result is not None:
            res = result.result
            self.sender.respond_stored(conn, cmd, code, res.msg_id().encode(), qid, res.queue_offset(0), remark,
                                       times)
            return
        log.info("send refused (%s): code=%d body=%d bytes", result.reason, cmd.code, len(cmd.body))
        conn.respond(cmd, make_response(cmd, code, remark), times)

    async def drain(self, timeout_s: float = 3.0) -> None:
        """Appends what is pending and waits for the group waits (stopping)."""
        if self.pending:
            self.run()
        if self.waits:
            await asyncio.wait(list(self.waits), timeout=timeout_s)


__all__ = ["SendProcessor", "SendGroup", "header_fields", "header_int", "check_group", "as_int", "as_bool",
           "BadRequest", "PERM_READ"]
