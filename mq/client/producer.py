"""Producer (DefaultMQProducer): route lookup, queue selection, SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE, retries.

Request (spec 2.2): code 310 (320 for a batch, which also sets m=true) with SendMessageRequestHeaderV2:

    a producerGroup  b topic  c defaultTopic (TBW102)  d defaultTopicQueueNums (4)  e queueId  f sysFlag
    g bornTimestamp  h flag  i properties  j reconsumeTimes  k unitMode  l maxReconsumeTimes (%RETRY% only)
    m batch  n brokerName

Every message gets a UNIQ_KEY (32 hex) unless it has one; bodies of COMPRESS_BODY_OVER_BYTES or more are
zlib-compressed (sysFlag COMPRESSED|ZLIB) as the 4.9.8 Java producer does; batches never are.

Send outcomes (DefaultMQProducerImpl.sendDefaultImpl):
* code 0 / 10 / 12 / 11 -> SendResult with SEND_OK / FLUSH_DISK_TIMEOUT / FLUSH_SLAVE_TIMEOUT /
  SLAVE_NOT_AVAILABLE (the message is stored in all four cases; no retry);
* codes 17, 14, 1, 16, 204, 205, a connection error or a timeout -> another attempt on a queue of a
  different broker than the one that just failed, up to retry_times_when_send_failed (2) more times for
  sync and async sends; one-way sends and sends to an explicit queue make one attempt;
* any other code -> MQBrokerError at once; all attempts failed -> MQClientError (cause chained).

Deviation from the Java default (sendLatencyFaultEnable=false): a broker that failed with a connection
error or a timeout is avoided for `fault_isolation_s` while other brokers have queues, and its topics'
routes are refreshed, so one dead broker costs one failed attempt rather than one per round-robin turn.
"""
from __future__ import annotations

import asyncio
import json
import logging
import random
import time
import zlib
from typing import Callable, Sequence

from mq import loop as mq_loop
from mq.remoting import RemotingError
from mq.wire.codes import RequestCode as R, ResponseCode as RC
from mq.wire.batch import build_batch
from mq.wire.commitlog import TRANSACTION_PREPARED
from mq.wire.consumequeue import java_string_hashcode
from mq.wire.errors import EncodeError
from mq.wire.headers import send_v2
from mq.wire.properties import encode_properties, properties_to_string
from mq.wire.topics import AUTO_CREATE_TOPIC as DEFAULT_TOPIC     # createTopicKey

from .errors import MQBrokerError, MQClientError
from .instance import ClientInstance
from .message import (COMPRESS_BODY_OVER_BYTES, COMPRESS_LEVEL, MESSAGE_BODY_SIZE_MAX,
                      PROPERTY_MAX_RECONSUME_TIMES, PROPERTY_RECONSUME_TIME,
                      PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, PROPERTY_WAIT_STORE_MSG_OK,
                      RETRY_GROUP_TOPIC_PREFIX, SYSFLAG_COMPRESSED, SYSFLAG_ZLIB, Message, MessageExt, MessageQueue,
                      SendResult, SendStatus, new_uniq_id)
from .reply import (PROPERTY_CORRELATION_ID, PROPERTY_MESSAGE_REPLY_TO_CLIENT, PROPERTY_MESSAGE_TTL, ReplyWaiters,
                    RequestTimeout, is_reply)
from .route import TopicRouteData

log = logging.getLogger("mq.client.producer")

RETRY_RESPONSE_CODES = frozenset({RC.TOPIC_NOT_EXIST, RC.SERVICE_NOT_AVAILABLE, RC.SYSTEM_ERROR,
                                  RC.NO_PERMISSION, 204, 205})   # 204 NO_BUYER_ID, 205 NOT_IN_CURRENT_UNIT
SEND_STATUS_BY_CODE = {RC.SUCCESS: SendStatus.SEND_OK, RC.FLUSH_DISK_TIMEOUT: SendStatus.FLUSH_DISK_TIMEOUT,
                       RC.FLUSH_SLAVE_TIMEOUT: SendStatus.FLUSH_SLAVE_TIMEOUT,
                       RC.SLAVE_NOT_AVAILABLE: SendStatus.SLAVE_NOT_AVAILABLE}
BORROWED_ROUTE_RECHECK_S = 1.0                # a topic on TBW102's route: look for its own route this often
TOPIC_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789%|_-")
TOPIC_LEN_MAX = 127
CHECKED_TOPICS_MAX = 4096                     # topic names remembered as legal (checked once each)
HEADERS_CACHED_MAX = 4096                     # queues whose send header is kept (one per queue sent to)
_NONE_ISOLATED: frozenset = frozenset()

MessageQueueSelector = Callable[[list[MessageQueue], Message, object], MessageQueue]
SendCallback = Callable[[SendResult | None, BaseException | None], None]


def select_by_hash(queues: list[MessageQueue], msg: Message, arg) -> MessageQueue:
    """SelectMessageQueueByHash: abs(arg.hashCode() % n), with Java's hashCode for ints and strings
    (Java's % keeps the dividend's sign, so its absolute value is abs(h) % n)."""
    if isinstance(arg, int):
        h = arg & 0xFFFFFFFF
        h = h - (1 << 32) if h & 0x80000000 else h
    else:
        h = java_string_hashcode(str(arg))
    return queues[abs(h) % len(queues)]


def check_topic(topic: str) -> None:
    if not topic or len(topic) > TOPIC_LEN_MAX or not set(topic) <= TOPIC_CHARS:
        raise MQClientError(f"topic [{topic}] is illegal: 1..{TOPIC_LEN_MAX} characters of [%|a-zA-Z0-9_-]")
    if topic == DEFAULT_TOPIC:
        raise MQClientError(f"topic [{topic}] is the default topic key, not a sending topic")


class _PublishInfo:
    """The writable queues of a topic and the round-robin index (TopicPublishInfo)."""

    def __init__(self, queues: list[MessageQueue], route: TopicRouteData, borrowed: bool):
        self.queues = queues
        self.route = route
        self.borrowed = borrowed            # TBW102's route, until the broker has created the topic
        self.index = random.randrange(1 << 16)
        self.fetched_at = time.monotonic()

    def select(self, last_broker: str | None, avoid: set[str]) -> MessageQueue:
        n = len(self.queues)
        if last_broker is None and not avoid:       # the usual case: the next queue
            self.index += 1
            return self.queues[self.index % n]
        for skip in (avoid | {last_broker}, {last_broker}):
            for _ in range(n):
                self.index += 1
                q = self.queues[self.index % n]
                if q.broker_name not in skip:
                    return q
        self.index += 1
        return self.queues[self.index % n]


class Producer:
    """An asyncio producer.  `await start()` before sending, `await shutdown()` at the end."""

    def __init__(self, group: str, namesrv_addr: str, *, instance_name: str | None = None,
                 send_timeout_s: float = 3.0, retry_times_when_send_failed: int = 2,
                 default_topic_queue_nums: int = 4, compress_over_bytes: int = COMPRESS_BODY_OVER_BYTES,
                 max_message_size: int = MESSAGE_BODY_SIZE_MAX, heartbeat_interval_s: float = 30.0,
                 route_refresh_interval_s: float = 30.0, fault_isolation_s: float = 30.0,
                 credentials=None):
        self.group = group
        self.credentials = credentials          # mq.acl.sign.SessionCredentials for an ACL broker
        self.namesrv_addr = namesrv_addr
        self.instance_name = instance_name
        self.send_timeout_s = send_timeout_s
        self.retry_times_when_send_failed = retry_times_when_send_failed
        self.default_topic_queue_nums = default_topic_queue_nums
        self.compress_over_bytes = compress_over_bytes
        self.max_message_size = max_message_size
        self.heartbeat_interval_s = heartbeat_interval_s
        self.route_refresh_interval_s = route_refresh_interval_s
        self.fault_isolation_s = fault_isolation_s
        self.instance: ClientInstance | None = None
        self._publish: dict[str, _PublishInfo] = {}
        self._checked_topics: set[str] = set()          # legal topic names seen (_prepare)
        self._headers: dict[MessageQueue, dict[str, str]] = {}   # queue -> its plain send header (_queue_header)
        self._route_locks: dict[str, asyncio.Lock] = {}
        self._isolated_until: dict[str, float] = {}   # brokerName -> monotonic deadline
        self._pending: set[asyncio.Task] = set()
        self._replies: ReplyWaiters | None = None     # request(): created on first use

    @property
    def client_id(self) -> str:
        return self.instance.client_id if self.instance else ""

    # ---- lifecycle --------------------------------------------------------------------------------
    async def start(self) -> "Producer":
        if self.instance is not None:
            raise MQClientError("producer already started")
        if not self.group:
            raise MQClientError("producer group is empty")
        self.instance = ClientInstance(self.namesrv_addr, self.instance_name, self.send_timeout_s,
                                       credentials=self.credentials)
        self.instance.on_new_broker = self.send_heartbeat
        self.instance.every(self.heartbeat_interval_s, self.send_heartbeat, name="producer heartbeat")
        self.instance.every(self.route_refresh_interval_s, self._refresh_routes, name="producer route refresh")
        return self

    async def shutdown(self) -> None:
        """Let pending async sends finish (bounded by their retries' timeouts), unregister, close."""
        if self.instance is None:
            return
        if self._pending:
            attempts = 1 + self.retry_times_when_send_failed
            await asyncio.wait(list(self._pending), timeout=self.send_timeout_s * attempts)
        inst, self.instance = self.instance, None
        await inst.unregister(producer_group=self.group)
        await inst.close()

    async def __aenter__(self) -> "Producer":
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.shutdown()

    def _inst(self) -> ClientInstance:
        if self.instance is None:
            raise MQClientError("producer not started")
        return self.instance

    async def send_heartbeat(self) -> None:
        inst = self._inst()
        body = json.dumps({"clientID": inst.client_id, "consumerDataSet": [],
                           "producerDataSet": [{"groupName": self.group}]}, separators=(",", ":")).encode()
        await inst.heartbeat(body, masters_only=True)

    async def _refresh_routes(self) -> None:
        """The route of every topic sent to, and TBW102's (the Java producer keeps it in its table
        too): a broker that became a master - a DLedger failover - is learned, and the heartbeats
        reach it, even while no topic sent to has a route through it (a transaction producer must
        be known there to be asked about its transactions)."""
        for topic in list(self._publish):
            await self._update_publish_info(topic)
        if DEFAULT_TOPIC not in self._publish:
            try:
                await self._inst().update_route(DEFAULT_TOPIC)
            except (RemotingError, MQClientError, ValueError) as e:
                log.info("route of %s: %s", DEFAULT_TOPIC, e)

    # ---- routes ---------------------------------------------------------------------------------------
    async def _update_publish_info(self, topic: str) -> _PublishInfo | None:
        inst = self._inst()
        try:
            route = await inst.update_route(topic)
        except (RemotingError, MQClientError, ValueError) as e:
            log.info("route of %s: %s", topic, e)
            return self._publish.get(topic)
        borrowed = False
        old = self._publish.get(topic)
        if route is None and old is not None and not old.borrowed:
            # the name server does not know the topic (it restarted and the brokers have not
            # re-registered yet, up to 30 s): keep sending where it was, as RocketMQ's client does
            log.info("route of %s: the name server does not know the topic; keeping the last route", topic)
            return old
        if route is None:
            try:
                default = await inst.update_route(DEFAULT_TOPIC)
            except (RemotingError, MQClientError, ValueError) as e:
                log.info("route of %s: %s", DEFAULT_TOPIC, e)
                return self._publish.get(topic)
            if default is None:
                self._publish.pop(topic, None)
                return None
            route, borrowed = default.borrowed_for_new_topic(self.default_topic_queue_nums), True
        queues = route.publish_queues(topic)
        if not queues:
            self._publish.pop(topic, None)
            return None
        info = _PublishInfo(queues, route, borrowed)
        if old is not None:
            info.index = old.index
        self._publish[topic] = info
        return info

    async def _publish_info(self, topic: str) -> _PublishInfo:
        info = self._publish.get(topic)
        if info is None or info.borrowed:
            lock = self._route_locks.setdefault(topic, asyncio.Lock())
            async with lock:
                info = self._publish.get(topic)
                if info is None or (info.borrowed and time.monotonic() - info.fetched_at > BORROWED_ROUTE_RECHECK_S):
                    info = await self._update_publish_info(topic)
        if info is None:
            raise MQClientError(f"No route info of this topic: {topic} (is the name server {self.namesrv_addr} "
                                f"reachable, and does the topic exist or autoCreateTopicEnable hold?)",
                                RC.TOPIC_NOT_EXIST)
        return info

    async def fetch_publish_queues(self, topic: str) -> list[MessageQueue]:
        """The queues sends to `topic` may use (for selectors and send_to_queue)."""
        return list((await self._publish_info(topic)).queues)

    def isolated_brokers(self) -> set[str]:
        """Broker names avoided for now after a connection error or timeout (fault_isolation_s)."""
        if not self._isolated_until:
            return _NONE_ISOLATED
        now = time.monotonic()
        return {b for b, until in self._isolated_until.items() if until > now}

    def _isolate(self, broker_name: str) -> None:
        if self.fault_isolation_s > 0:
            self._isolated_until[broker_name] = time.monotonic() + self.fault_isolation_s
        for topic, info in list(self._publish.items()):
            if any(q.broker_name == broker_name for q in info.queues):
                self._inst().spawn(self._update_publish_info(topic), "route refresh after failure")

    # ---- public send API ---------------------------------------------------------------------------------
    async def send(self, msg: Message, *, timeout_s: float | None = None) -> SendResult:
        """Synchronous send with retries on other brokers (see the module docstring)."""
        text = self._prepare(msg)
        return await self._send_with_retries(msg, None, 1 + self.retry_times_when_send_failed, timeout_s, text)

    def send_async(self, msg: Message, callback: SendCallback | None = None, *,
                   timeout_s: float | None = None) -> "asyncio.Future[SendResult]":
        """Start a send and return its future at once; `callback(result, None)` or `callback(None, error)`
        runs when it completes (Java SendCallback onSuccess / onException).  Must be called from the loop."""
        text = self._prepare(msg)
        task = asyncio.ensure_future(
            self._send_with_retries(msg, None, 1 + self.retry_times_when_send_failed, timeout_s, text))
        self._pending.add(task)

        def done(t: asyncio.Future) -> None:
            self._pending.discard(t)
            exc = None if t.cancelled() else t.exception()
            if callback is not None:
                try:
                    callback(None if exc or t.cancelled() else t.result(),
                             asyncio.CancelledError() if t.cancelled() else exc)
                except Exception:   # noqa: BLE001 - a user callback must not break the loop
                    log.exception("send callback failed")
            elif exc is not None:
                log.debug("async send failed: %s", exc)
        task.add_done_callback(done)
        return task

    async def send_oneway(self, msg: Message) -> None:
        """Fire and forget: one attempt, no response awaited (errors before the write still raise)."""
        self._prepare(msg)
        info = await self._publish_info(msg.topic)
        q = info.select(None, self.isolated_brokers())
        await self._send_kernel(msg, q, oneway=True)

    async def send_to_queue(self, msg: Message, queue: MessageQueue, *, timeout_s: float | None = None) -> SendResult:
        """Send to exactly this queue (one attempt, as Java's send(msg, mq))."""
        if queue.topic != msg.topic:
            raise MQClientError(f"message topic {msg.topic!r} differs from the queue's topic {queue.topic!r}")
        text = self._prepare(msg)
        return await self._send_with_retries(msg, queue, 1, timeout_s, text)

    async def send_with_selector(self, msg: Message, selector: MessageQueueSelector, arg=None, *,
                                 timeout_s: float | None = None) -> SendResult:
        """Ordered sends: selector(queues, msg, arg) picks the queue (e.g. select_by_hash with an order id)."""
        text = self._prepare(msg)
        queues = list((await self._publish_info(msg.topic)).queues)
        queue = selector(queues, msg, arg)
        if queue not in queues:
            raise MQClientError(f"selector returned {queue}, which is not a queue of {msg.topic}")
        return await self._send_with_retries(msg, queue, 1, timeout_s, text)

    async def request(self, msg: Message, timeout_s: float = 3.0) -> MessageExt:
        """Request-reply (mq.client.reply): sends `msg` and returns the reply a consumer of it sent
        back with create_reply; RequestTimeout when none came within timeout_s (which is the TTL
        the request carries)."""
        if timeout_s <= 0:
            raise MQClientError("the request timeout must be > 0")
        inst = self._inst()
        if self._replies is None:
            self._replies = ReplyWaiters()
            inst.remoting.push_handlers[R.PUSH_REPLY_MESSAGE_TO_CLIENT] = self._replies.on_push
        correlation_id, fut = self._replies.new()
        msg.properties[PROPERTY_CORRELATION_ID] = correlation_id
        msg.properties[PROPERTY_MESSAGE_REPLY_TO_CLIENT] = inst.client_id
        msg.properties[PROPERTY_MESSAGE_TTL] = str(int(timeout_s * 1000))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        try:
            if msg.topic not in self._publish:      # a new topic: make sure its brokers know us first
                await self._publish_info(msg.topic)
                await self.send_heartbeat()
            await self.send(msg, timeout_s=max(0.001, deadline - loop.time()))
            try:
                return await mq_loop.wait_for(fut, max(0.001, deadline - loop.time()))
            except asyncio.TimeoutError:
                raise RequestTimeout(f"no reply to the request to {msg.topic} within {timeout_s} s "
                                     f"(correlation id {correlation_id})") from None
        finally:
            self._replies.drop(correlation_id)

    async def send_batch(self, msgs: Sequence[Message], *, timeout_s: float | None = None) -> SendResult:
        """SEND_BATCH_MESSAGE: all to one topic and one queue, consecutive queue offsets.  The result's
        msg_id and offset_msg_id are comma-joined, one id per message."""
        batch = self._prepare_batch(msgs)
        return await self._send_with_retries(batch, None, 1 + self.retry_times_when_send_failed, timeout_s)

    # ---- internals ------------------------------------------------------------------------------------------
    def _prepare(self, msg: Message) -> str:
        """Checks `msg` and gives it its UNIQ_KEY; returns its properties encoded (what a send
        of it to a topic that is not a retry topic carries)."""
        if msg.topic not in self._checked_topics:
            check_topic(msg.topic)
            if len(self._checked_topics) < CHECKED_TOPICS_MAX:
                self._checked_topics.add(msg.topic)
        if not msg.body:
            raise MQClientError("the message body is empty")
        if len(msg.body) > self.max_message_size:
            raise MQClientError(f"the message body is {len(msg.body)} bytes, the limit is {self.max_message_size}")
        if PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX not in msg.properties:
            msg.properties[PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX] = new_uniq_id()
        try:
            return properties_to_string(msg.properties)
        except EncodeError as e:
            raise MQClientError(f"bad message properties: {e}") from None

    def _queue_header(self, q: MessageQueue) -> dict[str, str]:
        """The SEND_MESSAGE_V2 header of a plain send to `q` (what _request builds for one),
        bornTimestamp and properties left to fill in: the same keys in the same order."""
        return send_v2(properties="", producerGroup=self.group, topic=q.topic, defaultTopic=DEFAULT_TOPIC,
                       defaultTopicQueueNums=str(self.default_topic_queue_nums), queueId=str(q.queue_id),
                       sysFlag="0", bornTimestamp="", flag="0", reconsumeTimes="0", unitMode="false",
                       batch="false", brokerName=q.broker_name)

    def _request(self, msg, q: MessageQueue, is_batch: bool):
        """The send request of msg (a batch, a compressed body, a half, a retry-topic send, or a
        send_oneway) to q, every header field derived afresh."""
        props = dict(msg.properties)
        body, sys_flag = msg.body, 0
        if not is_batch and len(body) >= self.compress_over_bytes > 0:
            body = zlib.compress(body, COMPRESS_LEVEL)
            sys_flag |= SYSFLAG_COMPRESSED | SYSFLAG_ZLIB
        if props.get("TRAN_MSG", "").lower() == "true":    # a half (mq.client.transaction)
            sys_flag |= TRANSACTION_PREPARED
        fields = dict(producerGroup=self.group, topic=q.topic, defaultTopic=DEFAULT_TOPIC,
                      defaultTopicQueueNums=self.default_topic_queue_nums, queueId=q.queue_id, sysFlag=sys_flag,
                      bornTimestamp=int(time.time() * 1000), flag=msg.flag, reconsumeTimes=0, unitMode=False,
                      batch=is_batch, brokerName=q.broker_name)
        if q.topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            reconsume = props.pop(PROPERTY_RECONSUME_TIME, None)
            max_times = props.pop(PROPERTY_MAX_RECONSUME_TIMES, None)
            if reconsume is not None:
                fields["reconsumeTimes"] = reconsume
            if max_times is not None:
                fields["maxReconsumeTimes"] = max_times
        ext = send_v2(properties=properties_to_string(props), **fields)
        code = R.SEND_BATCH_MESSAGE if is_batch else R.SEND_REPLY_MESSAGE_V2 if is_reply(msg) else R.SEND_MESSAGE_V2
        return self._inst().request(code, ext, body)

    def _prepare_batch(self, msgs: Sequence[Message]) -> "_Batch":
        if not msgs:
            raise MQClientError("the batch is empty")
        topic = msgs[0].topic
        for m in msgs:
            if m.topic != topic:
                raise MQClientError("every message of a batch must have the same topic")
            if m.topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
                raise MQClientError("retry-group messages cannot be batched")
            if m.delay_level > 0:
                raise MQClientError("delayed messages cannot be batched")
            if not m.body:
                raise MQClientError("a message body of the batch is empty")
            check_topic(m.topic)
            m.properties.setdefault(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, new_uniq_id())
        try:
            body = build_batch((m.flag, m.body, encode_properties(m.properties)) for m in msgs)
        except EncodeError as e:
            raise MQClientError(f"bad batch message: {e}") from None
        if len(body) > self.max_message_size:
            raise MQClientError(f"the batch body is {len(body)} bytes, the limit is {self.max_message_size}")
        return _Batch(topic, body, msgs)

    async def _send_with_retries(self, msg, queue: MessageQueue | None, attempts: int,
                                 timeout_s: float | None, text: str | None = None) -> SendResult:
        info = self._publish.get(msg.topic)
        if info is None or info.borrowed:
            info = await self._publish_info(msg.topic)
        last_broker: str | None = None
        last_exc: Exception | None = None
        tried = []
        for attempt in range(attempts):
            q = queue if queue is not None else info.select(last_broker, self.isolated_brokers())
            tried.append(q.broker_name)
            try:
                return await self._send_kernel(msg, q, timeout_s=timeout_s, text=text)
            except RemotingError as e:
                log.info("send to %s failed (attempt %d/%d): %s", q, attempt + 1, attempts, e)
                self._isolate(q.broker_name)
                last_exc = e
            except MQBrokerError as e:
                if e.code not in RETRY_RESPONSE_CODES:
                    raise
                log.info("send to %s refused (attempt %d/%d): %s", q, attempt + 1, attempts, e)
                last_exc = e
            last_broker = q.broker_name
            if queue is None:
                info = self._publish.get(msg.topic) or info
        raise MQClientError(f"send to {msg.topic} failed {attempts} time(s) (brokers {', '.join(tried)}): {last_exc}",
                            getattr(last_exc, "code", None)) from last_exc

    async def _send_kernel(self, msg, q: MessageQueue, *, oneway: bool = False,
                           timeout_s: float | None = None, text: str | None = None) -> SendResult | None:
        """One attempt.  `text`: msg's properties as _prepare encoded them (None: encoded here)."""
        inst = self._inst()
        addr = inst.master_addr(q.broker_name)
        if addr is None:
            await self._update_publish_info(q.topic)
            addr = inst.master_addr(q.broker_name)
            if addr is None:
                raise MQClientError(f"the broker {q.broker_name} has no master address", RC.SERVICE_NOT_AVAILABLE)
        is_batch = isinstance(msg, _Batch)
        body = msg.body
        if (text is not None and not is_batch and not len(body) >= self.compress_over_bytes > 0
                and not q.topic.startswith(RETRY_GROUP_TOPIC_PREFIX) and "TRAN_MSG" not in msg.properties):
            # the usual single send: the queue's header with this message's time, flag and properties
            ext = self._headers.get(q)
            if ext is None:
                if len(self._headers) >= HEADERS_CACHED_MAX:
                    self._headers.clear()
                ext = self._headers[q] = self._queue_header(q)
            ext = ext.copy()
            ext["g"] = str(int(time.time() * 1000))
            ext["i"] = text
            if msg.flag:
                ext["h"] = str(msg.flag)
            cmd = inst.remoting.request_str(R.SEND_REPLY_MESSAGE_V2 if is_reply(msg) else R.SEND_MESSAGE_V2, ext, body)
        else:
            cmd = self._request(msg, q, is_batch)
        props = msg.properties
        if oneway:
            await inst.remoting.invoke_oneway(addr, cmd)
            return None
        r = await inst.remoting.invoke(addr, cmd, timeout_s or self.send_timeout_s)
        status = SEND_STATUS_BY_CODE.get(r.code)
        if status is None:
            raise MQBrokerError(r.code, r.remark, addr)
        h = r.ext_fields or {}
        try:
            qid = h.get("queueId")
            queue = q if qid is None or qid == str(q.queue_id) else MessageQueue(q.topic, q.broker_name, int(qid))
            result = SendResult(status, msg.uniq_id if is_batch else props[PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX],
                                h.get("msgId", ""), queue, int(h.get("queueOffset", -1)),
                                h.get("MSG_REGION", ""), h.get("TRACE_ON", "true") != "false")
        except ValueError as e:
            raise MQBrokerError(r.code, f"malformed send response header {h}: {e}", addr) from None
        if self._publish.get(q.topic) is not None and self._publish[q.topic].borrowed:
            self._inst().spawn(self._update_publish_info(q.topic), "route of a new topic")
        return result


class _Batch:
    """A prepared batch: one topic, the encoded body, WAIT as the batch-level property."""

    def __init__(self, topic: str, body: bytes, msgs: Sequence[Message]):
        self.topic = topic
        self.body = body
        self.flag = 0
        self.properties = {PROPERTY_WAIT_STORE_MSG_OK: "true" if msgs[0].wait_store_msg_ok else "false"}
        self.uniq_id = ",".join(m.properties[PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX] for m in msgs)


__all__ = ["Producer", "select_by_hash", "MessageQueueSelector", "RETRY_RESPONSE_CODES", "DEFAULT_TOPIC"]
