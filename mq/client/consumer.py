"""Consumers: PushConsumer (DefaultMQPushConsumer, concurrent listener) and PullConsumer.

PULL_MESSAGE (11) request (spec 2.3): consumerGroup, topic, queueId, queueOffset, maxMsgNums, sysFlag,
commitOffset, suspendTimeoutMillis, subscription, subVersion, expressionType=TAG, bname.  sysFlag here is
SUBSCRIPTION always (the broker need not know the subscription from a heartbeat), SUSPEND for the push
consumer's long polls (held up to suspendTimeoutMillis 15000; client timeout 30 s), and COMMIT_OFFSET when
the consumer already holds an offset > 0 for the queue and pulls from a master.

    response 0  FOUND           body = concatenated CommitLog records -> messages, re-filtered by tag string
             19 NO_NEW_MSG      \
             20 NO_MATCHED_MSG   } follow nextBeginOffset
             21 OFFSET_ILLEGAL  /   (push: the offset store jumps there too)
             other              MQBrokerError (push: pull again 3 s later)

suggestWhichBrokerId is remembered per queue: the next pull of that queue goes to that brokerId's address
in the route if present (else id+1 for slaves, else the lowest id), without COMMIT_OFFSET when that is a
slave; offsets are queried and committed at the master only (spec 5).

Push consumer, per process queue (one per assigned MessageQueue):

    pull loop --FOUND--> ProcessQueue (offset -> message, bounded by pull_threshold_per_queue)
                              |  one task per message, at most consume_thread_nums listeners at once
                              v
                         listener(msg) -> CONSUME_SUCCESS | RECONSUME_LATER (exception, False, None)
                              |  failure, CLUSTERING: CONSUMER_SEND_MSG_BACK (36) -> %RETRY%<group>
                              |  send-back failed: consume again locally local_retry_delay_s (5 s)
                              |  later, reconsume_times + 1 (the offset is held back meanwhile)
                              |  failure, BROADCASTING: dropped, as Java does
                              v
                         offset to commit = lowest offset still in the ProcessQueue, else max seen + 1

Invariant: the committed offset of a queue never passes a message whose listener has not succeeded (or
whose failure has not been handed to the broker), so a crash redelivers and never loses.

Offsets: CLUSTERING keeps them at the broker (QUERY_CONSUMER_OFFSET 14 when a queue is taken; one-way
UPDATE_CONSUMER_OFFSET 15 every persist_interval_s, on rebalance loss and, awaited, on shutdown).
BROADCASTING keeps them in <offset_store_dir>/<clientId>/<group>/offsets.json.  A queue with no stored
offset (QUERY_NOT_FOUND 22) starts per consume_from: LAST = GET_MAX_OFFSET (30) (0 for %RETRY% topics),
FIRST = 0, TIMESTAMP = SEARCH_OFFSET_BY_TIMESTAMP (29) of consume_timestamp_ms (%RETRY%: max).

Rebalance (every rebalance_interval_s, at once on NOTIFY_CONSUMER_IDS_CHANGED (40), 1 s later while a
topic has no route or the group list lacks this client): CLUSTERING allocates
AllocateMessageQueueAveragely over the sorted consumer ids from GET_CONSUMER_LIST_BY_GROUP (38) and the
sorted readable queues; BROADCASTING takes every queue.  CLUSTERING also subscribes %RETRY%<group> with
'*'; a message pulled from it gets its original topic back from the RETRY_TOPIC property.
"""
from __future__ import annotations

import asyncio
import inspect
import json
import logging
import os
import random
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Awaitable, Callable, Union

from mq import loop as mq_loop
from mq.remoting import RemotingError
from mq.wire.codes import RequestCode as R, ResponseCode as RC
from mq.files import write_atomic
from mq.wire.errors import WireError
from mq.wire.headers import PULL_COMMIT_OFFSET, PULL_SUBSCRIPTION, PULL_SUSPEND

from .errors import MQBrokerError, MQClientError
from .instance import ClientInstance, default_instance_name
from .message import (MASTER_ID, PROPERTY_CONSUME_START_TIMESTAMP, PROPERTY_MAX_OFFSET, PROPERTY_MIN_OFFSET,
                      PROPERTY_ORIGIN_MESSAGE_ID, PROPERTY_RETRY_TOPIC, RETRY_GROUP_TOPIC_PREFIX,
                      ConsumeFromWhere, ConsumeStatus, MessageExt, MessageModel, MessageQueue, PullResult,
                      PullStatus, SubscriptionData, _coerce, decode_messages, retry_topic)

log = logging.getLogger("mq.client.consumer")


PULL_DELAY_ON_EXCEPTION_S = 3.0          # PULL_TIME_DELAY_MILLS_WHEN_EXCEPTION
PULL_DELAY_ON_FLOW_CONTROL_S = 0.05      # PULL_TIME_DELAY_MILLS_WHEN_FLOW_CONTROL
LOCAL_RETRY_DELAY_S = 5.0                # a message whose send-back failed is consumed again this much later
REBALANCE_RETRY_S = 1.0                  # next rebalance when the last one could not see everything
SEND_BACK_TIMEOUT_S = 5.0
DEFAULT_MAX_RECONSUME_TIMES = 16

PULL_STATUS_BY_CODE = {RC.SUCCESS: PullStatus.FOUND, RC.PULL_NOT_FOUND: PullStatus.NO_NEW_MSG,
                       RC.PULL_RETRY_IMMEDIATELY: PullStatus.NO_MATCHED_MSG,
                       RC.PULL_OFFSET_MOVED: PullStatus.OFFSET_ILLEGAL}

Listener = Callable[[MessageExt], Union[ConsumeStatus, bool, None, Awaitable]]


def allocate_averagely(mqs: list[MessageQueue], cids: list[str], current: str) -> list[MessageQueue]:
    """AllocateMessageQueueAveragely over sorted queues and sorted consumer ids: contiguous ranges, the
    first (len(mqs) % len(cids)) consumers get one extra queue; a consumer not in cids gets nothing."""
    mqs, cids = sorted(mqs), sorted(cids)
    if current not in cids or not mqs:
        return []
    index, n, c = cids.index(current), len(mqs), len(cids)
    mod = n % c
    if n <= c:
        average = 1
    elif mod > 0 and index < mod:
        average = n // c + 1
    else:
        average = n // c
    start = index * average if (mod > 0 and index < mod) else index * average + mod
    return [mqs[(start + i) % n] for i in range(min(average, n - start))]


async def pull_kernel(inst: ClientInstance, group: str, mq: MessageQueue, sub: SubscriptionData, offset: int,
                      max_nums: int, *, suspend: bool, commit_offset: int = 0, suggested_id: int = MASTER_ID,
                      suspend_timeout_ms: int = 15000, timeout_s: float = 30.0) -> PullResult:
    """One PULL_MESSAGE (see the module docstring).  Raises RemotingError, MQBrokerError for codes other
    than 0/19/20/21, MQClientError when the broker has no address, WireError for a malformed body."""
    found = inst.pull_addr(mq.broker_name, suggested_id)
    if found is None:
        await inst.update_route(mq.topic)
        found = inst.pull_addr(mq.broker_name, suggested_id)
        if found is None:
            raise MQClientError(f"the broker [{mq.broker_name}] is not in the route of {mq.topic}")
    addr, slave = found
    sys_flag = PULL_SUBSCRIPTION | (PULL_SUSPEND if suspend else 0)
    if commit_offset > 0 and not slave:
        sys_flag |= PULL_COMMIT_OFFSET
    # the header's values as the strings sent (request_str: no per-value conversion on a consumer's hot path)
    ext = {"consumerGroup": group, "topic": mq.topic, "queueId": str(mq.queue_id), "queueOffset": str(offset),
           "maxMsgNums": str(max_nums), "sysFlag": str(sys_flag), "commitOffset": str(commit_offset),
           "suspendTimeoutMillis": str(suspend_timeout_ms), "subscription": sub.sub_string,
           "subVersion": str(sub.sub_version), "expressionType": sub.expression_type, "bname": mq.broker_name}
    r = await inst.remoting.invoke(addr, inst.remoting.request_str(R.PULL_MESSAGE, ext), timeout_s or inst.timeout_s)
    status = PULL_STATUS_BY_CODE.get(r.code)
    if status is None:
        raise MQBrokerError(r.code, r.remark, addr)
    h = r.ext_fields or {}
    try:
        result = PullResult(status, int(h["nextBeginOffset"]), int(h.get("minOffset", 0)),
                            int(h.get("maxOffset", 0)), [], int(h.get("suggestWhichBrokerId", MASTER_ID)))
    except (KeyError, ValueError) as e:
        raise MQBrokerError(r.code, f"malformed pull response header {h}: {e}", addr) from None
    if status is PullStatus.FOUND:
        msgs = decode_messages(r.body, mq.broker_name, mq, {PROPERTY_MIN_OFFSET: str(result.min_offset),
                                                             PROPERTY_MAX_OFFSET: str(result.max_offset)})
        result.messages = [m for m in msgs if sub.matches(m)] if sub.tags else msgs
    return result


# --------------------------------------------------------------------------------------------------
# Offset stores

class RemoteOffsetStore:
    """CLUSTERING offsets: memory table, read from and committed to the master of each queue's broker."""

    def __init__(self, inst: ClientInstance, group: str):
        self.inst = inst
        self.group = group
        self.table: dict[MessageQueue, int] = {}

    def read(self, mq: MessageQueue) -> int:
        return self.table.get(mq, -1)

    def update(self, mq: MessageQueue, offset: int, increase_only: bool) -> None:
        if increase_only and self.table.get(mq, -1) >= offset:
            return
        self.table[mq] = offset

    def remove(self, mq: MessageQueue) -> None:
        self.table.pop(mq, None)

    async def _master(self, mq: MessageQueue) -> str:
        """The master, or a slave while the master is gone (offsets follow the consumer)."""
        addr = self.inst.admin_addr(mq.broker_name)
        if addr is None:
            await self.inst.update_route(mq.topic)
            addr = self.inst.admin_addr(mq.broker_name)
        if addr is None:
            raise MQClientError(f"The broker[{mq.broker_name}] not exist")
        return addr

    async def read_from_store(self, mq: MessageQueue) -> int:
        """The broker's offset (also kept in memory), or -1 when it has none (QUERY_NOT_FOUND).
        Raises RemotingError / MQClientError when it cannot be asked."""
        addr = await self._master(mq)
        r = await self.inst.invoke(addr, R.QUERY_CONSUMER_OFFSET,
                                   {"consumerGroup": self.group, "topic": mq.topic, "queueId": mq.queue_id,
                                    "bname": mq.broker_name})
        if r.code == RC.QUERY_NOT_FOUND:
            return -1
        if r.code != RC.SUCCESS:
            raise MQBrokerError(r.code, r.remark, addr)
        offset = int((r.ext_fields or {}).get("offset", -1))
        if offset >= 0:
            self.table[mq] = offset
        return offset

    async def persist(self, mq: MessageQueue, oneway: bool = True) -> None:
        offset = self.table.get(mq)
        if offset is None or offset < 0:
            return
        addr = await self._master(mq)
        ext = {"consumerGroup": self.group, "topic": mq.topic, "queueId": mq.queue_id, "commitOffset": offset,
               "bname": mq.broker_name}
        if oneway:
            await self.inst.invoke_oneway(addr, R.UPDATE_CONSUMER_OFFSET, ext)
        else:
            await self.inst.invoke_ok(addr, R.UPDATE_CONSUMER_OFFSET, ext)

    async def persist_all(self, mqs, oneway: bool = True) -> None:
        for mq in list(mqs):
            try:
                await self.persist(mq, oneway)
            except (RemotingError, MQClientError) as e:
                log.info("committing the offset of %s failed: %s", mq, e)


class LocalOffsetStore(RemoteOffsetStore):
    """BROADCASTING offsets in a JSON file (LocalFileOffsetStore; the layout is ours):
        {"offsetTable":[{"topic":..,"brokerName":..,"queueId":..,"offset":..},..]}
    written atomically (temp file + rename)."""

    def __init__(self, inst: ClientInstance, group: str, directory: str):
        super().__init__(inst, group)
        self.path = os.path.join(directory, inst.client_id, group, "offsets.json")
        self.stored: dict[MessageQueue, int] = {}
        try:
            with open(self.path, encoding="utf-8") as f:
                data = json.load(f)
            for e in data.get("offsetTable", []):
                self.stored[MessageQueue(e["topic"], e["brokerName"], int(e["queueId"]))] = int(e["offset"])
        except FileNotFoundError:
            pass
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.warning("ignoring unreadable offset file %s: %s", self.path, e)

    async def read_from_store(self, mq: MessageQueue) -> int:
        offset = self.stored.get(mq, -1)
        if offset >= 0:
            self.table[mq] = offset
        return offset

    async def persist(self, mq: MessageQueue, oneway: bool = True) -> None:
        await self.persist_all([mq])

    async def persist_all(self, mqs, oneway: bool = True) -> None:
        for mq in list(mqs):
            if self.table.get(mq, -1) >= 0:
                self.stored[mq] = self.table[mq]
        rows = [{"topic": mq.topic, "brokerName": mq.broker_name, "queueId": mq.queue_id, "offset": off}
                for mq, off in sorted(self.stored.items())]
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            write_atomic(self.path, json.dumps({"offsetTable": rows}, indent=1))
        except OSError as e:
            log.warning("writing the offset file %s failed: %s", self.path, e)


# --------------------------------------------------------------------------------------------------
# Push consumer

class _ProcessQueue:
    """Messages of one queue pulled but not yet consumed, by queue offset."""

    def __init__(self, mq: MessageQueue, next_offset: int):
        self.mq = mq
        self.next_offset = next_offset
        self.msgs: dict[int, MessageExt] = {}
        self.max_offset_seen = -1
        self.dropped = False
        self.task: asyncio.Task | None = None

    def put(self, msgs: list[MessageExt]) -> None:
        for m in msgs:
            self.msgs[m.queue_offset] = m
            self.max_offset_seen = max(self.max_offset_seen, m.queue_offset)

    def remove(self, msg: MessageExt) -> int:
        """Drops a consumed message; returns the offset now safe to commit (-1 if it was not held)."""
        if self.msgs.pop(msg.queue_offset, None) is None:
            return -1
        return min(self.msgs) if self.msgs else self.max_offset_seen + 1


class PushConsumer:
    """An asyncio push consumer.  subscribe() and a listener, then `await start()`; `await shutdown()`.

    The listener gets one MessageExt and returns ConsumeStatus.CONSUME_SUCCESS (or True) on success;
    RECONSUME_LATER, False, None or an exception mean failure (Java treats a null status as failure too).
    A plain function runs on a thread pool of consume_thread_nums threads; a coroutine function runs on
    the event loop.  Delivery is at least once and unordered across messages."""

    def __init__(self, group: str, namesrv_addr: str, message_model: MessageModel | str = MessageModel.CLUSTERING,
                 consume_from: ConsumeFromWhere | str = ConsumeFromWhere.LAST, *, listener: Listener | None = None,
                 consume_timestamp_ms: int | None = None, instance_name: str | None = None,
                 consume_thread_nums: int = 20, pull_batch_size: int = 32,
                 max_reconsume_times: int = DEFAULT_MAX_RECONSUME_TIMES, pull_threshold_per_queue: int = 1000,
                 offset_store_dir: str | None = None, rebalance_interval_s: float = 20.0,
                 heartbeat_interval_s: float = 30.0, persist_interval_s: float = 5.0,
                 route_refresh_interval_s: float = 30.0, suspend_timeout_ms: int = 15000,
                 pull_timeout_s: float = 30.0, await_termination_s: float = 10.0,
                 local_retry_delay_s: float = LOCAL_RETRY_DELAY_S, credentials=None):
        self.group = group
        self.namesrv_addr = namesrv_addr
        self.message_model = _coerce(MessageModel, message_model)
        self.consume_from = _coerce(ConsumeFromWhere, consume_from)
        self.listener = listener
        self.consume_timestamp_ms = consume_timestamp_ms if consume_timestamp_ms is not None else \
            int(time.time() * 1000) - 30 * 60 * 1000     # consumeTimestamp default: half an hour ago
        if instance_name is None and self.message_model is MessageModel.BROADCASTING:
            instance_name = "DEFAULT"                   # Java keeps DEFAULT so the offset file path is stable
        self.instance_name = instance_name
        self.consume_thread_nums = max(1, consume_thread_nums)
        self.pull_batch_size = pull_batch_size
        self.max_reconsume_times = max_reconsume_times
        self.pull_threshold_per_queue = pull_threshold_per_queue
        self.offset_store_dir = offset_store_dir or os.path.join(os.path.expanduser("~"), ".rocketmq_offsets")
        self.rebalance_interval_s = rebalance_interval_s
        self.heartbeat_interval_s = heartbeat_interval_s
        self.persist_interval_s = persist_interval_s
        self.route_refresh_interval_s = route_refresh_interval_s
        self.suspend_timeout_ms = suspend_timeout_ms
        self.pull_timeout_s = pull_timeout_s
        self.await_termination_s = await_termination_s
        self.local_retry_delay_s = local_retry_delay_s
        self.credentials = credentials          # mq.acl.sign.SessionCredentials for an ACL broker
        self.instance: ClientInstance | None = None
        self.offset_store: RemoteOffsetStore | None = None
        self._subs: dict[str, SubscriptionData] = {}
        self._pqs: dict[MessageQueue, _ProcessQueue] = {}
        self._suggested: dict[MessageQueue, int] = {}
        self._consuming: set[asyncio.Task] = set()
        self._delayed: set[asyncio.Task] = set()
        self._periodic: list[asyncio.Task] = []
        self._executor: ThreadPoolExecutor | None = None
        self._sem: asyncio.Semaphore | None = None
        self._rebalance_event: asyncio.Event | None = None
        self._rebalance_lock: asyncio.Lock | None = None
        self._stopping = False
        self.rebalance_count = 0

    @property
    def client_id(self) -> str:
        return self.instance.client_id if self.instance else ""

    def subscribe(self, topic: str, expression: str = "*", expression_type: str = "TAG") -> None:
        """Subscribe `topic` with a TAG expression ('*', 'TagA', 'TagA || TagC') or, with
        expression_type "SQL92", a filter over message properties ("a > 5 AND region = 'eu'") that
        the broker evaluates (it must run with enablePropertyFilter=true)."""
        if not topic:
            raise MQClientError("topic is empty")
        try:
            self._subs[topic] = SubscriptionData.build(topic, expression, expression_type)
        except ValueError as e:
            raise MQClientError(str(e)) from None
        if self.instance is not None:
            self.instance.spawn(self._after_subscription_change(), "subscribe")

    def register_listener(self, listener: Listener) -> None:
        self.listener = listener

    def assigned_queues(self) -> list[MessageQueue]:
        """The queues this consumer currently pulls (after rebalance)."""
        return sorted(mq for mq, pq in self._pqs.items() if not pq.dropped)

    # ---- lifecycle --------------------------------------------------------------------------------
    async def start(self) -> "PushConsumer":
        if self.instance is not None:
            raise MQClientError("consumer already started")
        if not self.group:
            raise MQClientError("consumer group is empty")
        if self.listener is None:
            raise MQClientError("no listener: register_listener(fn) first")
        if not self._subs:
            raise MQClientError("no subscription: subscribe(topic, expression) first")
        if self.message_model is MessageModel.CLUSTERING:
            self._subs.setdefault(retry_topic(self.group), SubscriptionData.build(retry_topic(self.group), "*"))
        inst = self.instance = ClientInstance(self.namesrv_addr, self.instance_name, credentials=self.credentials)
        self.offset_store = (LocalOffsetStore(inst, self.group, self.offset_store_dir)
                             if self.message_model is MessageModel.BROADCASTING
                             else RemoteOffsetStore(inst, self.group))
        self._executor = ThreadPoolExecutor(self.consume_thread_nums, thread_name_prefix=f"consume-{self.group}")
        self._sem = asyncio.Semaphore(self.consume_thread_nums)
        self._rebalance_event = asyncio.Event()
        self._rebalance_lock = asyncio.Lock()
        self._stopping = False
        inst.on_new_broker = self.send_heartbeat
        inst.remoting.push_handlers[R.NOTIFY_CONSUMER_IDS_CHANGED] = self._on_consumer_ids_changed
        inst.remoting.push_handlers[R.RESET_CONSUMER_CLIENT_OFFSET] = self._on_reset_offset
        await inst.refresh_routes(self._subs)
        await self.send_heartbeat()
        complete = await self._rebalance()
        self._periodic = [
            inst.spawn(self._rebalance_service(REBALANCE_RETRY_S if not complete else self.rebalance_interval_s),
                       "rebalance"),
            inst.every(self.heartbeat_interval_s, self.send_heartbeat, name="consumer heartbeat"),
            inst.every(self.route_refresh_interval_s, lambda: inst.refresh_routes(self._subs), name="route refresh"),
            inst.every(self.persist_interval_s, self._persist_offsets, name="offset persist"),
        ]
        return self

    async def shutdown(self) -> None:
        """Stop pulling, let running listeners finish (up to await_termination_s), commit offsets
        (awaited), unregister from the brokers, close connections."""
        inst = self.instance
        if inst is None:
            return
        self._stopping = True
        for t in self._periodic:
            t.cancel()
        for t in list(self._delayed):
            t.cancel()
        for pq in self._pqs.values():
            if pq.task is not None:
                pq.task.cancel()
        if self._consuming:
            await asyncio.wait(list(self._consuming), timeout=self.await_termination_s)
        for pq in self._pqs.values():
            pq.dropped = True
        await self.offset_store.persist_all(list(self._pqs), oneway=False)
        await inst.unregister(consumer_group=self.group)
        self.instance = None
        await inst.close()
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._pqs.clear()

    async def __aenter__(self) -> "PushConsumer":
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.shutdown()

    def _heartbeat_body(self) -> bytes:
        inst = self.instance
        consumer = {"consumeFromWhere": self.consume_from.value, "consumeType": "CONSUME_PASSIVELY",
                    "groupName": self.group, "messageModel": self.message_model.value,
                    "subscriptionDataSet": [s.as_json() for s in self._subs.values()], "unitMode": False}
        return json.dumps({"clientID": inst.client_id, "consumerDataSet": [consumer], "producerDataSet": []},
                          separators=(",", ":")).encode()

    async def send_heartbeat(self) -> None:
        if self.instance is not None:
            await self.instance.heartbeat(self._heartbeat_body(), masters_only=False)

    async def _after_subscription_change(self) -> None:
        await self.instance.refresh_routes(self._subs)
        await self.send_heartbeat()
        self._rebalance_event.set()

    async def _on_consumer_ids_changed(self, addr: str, cmd) -> None:
        """NOTIFY_CONSUMER_IDS_CHANGED (40), pushed one-way by a broker: rebalance now (runs on the
        connection's read loop, so it only sets the event)."""
        if (cmd.ext_fields or {}).get("consumerGroup", self.group) == self.group and self._rebalance_event:
            self._rebalance_event.set()

    async def _on_reset_offset(self, addr: str, cmd) -> None:
        """RESET_CONSUMER_CLIENT_OFFSET (220), one-way from a broker (mqadmin resetOffsetByTime):
        the queues named are dropped, their offsets set and committed, and the next rebalance
        takes them again from there (as the Java client's resetOffset)."""
        from mq.wire.errors import WireError
        from mq.wire.offsets import decode_reset_offset_body
        ext = cmd.ext_fields or {}
        if ext.get("group") != self.group or self.instance is None:
            return
        try:
            table = decode_reset_offset_body(cmd.body or b"")
        except WireError as e:
            log.warning("%s: ignored an offset reset from %s: %s", self.group, addr, e)
            return
        self.instance.spawn(self._reset_offsets({MessageQueue(t, b, q): off for (t, b, q), off in table.items()}),
                            "offset reset")

    async def _reset_offsets(self, table: dict) -> None:
        for mq, offset in table.items():
            pq = self._pqs.pop(mq, None)
            if pq is not None:
                pq.dropped = True
                if pq.task is not None:
                    pq.task.cancel()
            self.offset_store.update(mq, offset, increase_only=False)
            try:
                await self.offset_store.persist(mq, oneway=False)
            except (RemotingError, MQClientError) as e:
                log.warning("%s: committing the reset offset of %s failed: %s", self.group, mq, e)
            self.offset_store.remove(mq)
        log.info("%s: offsets reset by a broker: %s", self.group, {str(mq): o for mq, o in table.items()})
        self._rebalance_event.set()

    async def _persist_offsets(self) -> None:
        await self.offset_store.persist_all(self.assigned_queues(), oneway=True)

    # ---- rebalance ----------------------------------------------------------------------------------------
    async def _rebalance_service(self, first_wait_s: float) -> None:
        wait_s = first_wait_s
        while True:
            try:
                await mq_loop.wait_for(self._rebalance_event.wait(), wait_s)
            except asyncio.TimeoutError:
                pass
            self._rebalance_event.clear()
            try:
                complete = await self._rebalance()
            except (RemotingError, MQClientError, ValueError) as e:
                log.warning("rebalance of %s failed: %s", self.group, e)
                complete = False
            wait_s = self.rebalance_interval_s if complete else REBALANCE_RETRY_S

    async def _rebalance(self) -> bool:
        """One rebalance of every subscribed topic; True when every topic had a route and (CLUSTERING)
        a consumer list that includes this client."""
        inst = self.instance
        complete, changed = True, False
        async with self._rebalance_lock:
            self.rebalance_count += 1
            for topic in list(self._subs):
                route = inst.routes.get(topic)
                if route is None:
                    try:
                        route = await inst.update_route(topic)
                    except (RemotingError, MQClientError, ValueError) as e:
                        log.info("route of %s: %s", topic, e)
                if route is None:
                    complete = False
                    continue
                mqs = route.subscribe_queues(topic)
                if self.message_model is MessageModel.BROADCASTING:
                    allocated = mqs
                else:
                    cids = await self._consumer_ids(route)
                    if cids is None:
                        complete = False
                        continue
                    if inst.client_id not in cids:
                        complete = False
                    allocated = allocate_averagely(mqs, cids, inst.client_id)
                changed |= await self._update_process_queues(topic, set(allocated))
        if changed:
            await self.send_heartbeat()
        return complete

    async def _consumer_ids(self, route) -> list[str] | None:
        """GET_CONSUMER_LIST_BY_GROUP from one broker of the route (random order, first that answers)."""
        brokers = list(route.broker_datas)
        random.shuffle(brokers)
        for b in brokers:
            addr = b.select_addr()
            if addr is None:
                continue
            try:
                r = await self.instance.invoke(addr, R.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": self.group})
            except RemotingError as e:
                log.info("consumer list from %s: %s", addr, e)
                continue
            if r.code == RC.SUCCESS:
                try:
                    return sorted(json.loads(r.body).get("consumerIdList") or [])
                except (ValueError, AttributeError) as e:
                    log.warning("consumer list from %s is not JSON: %s", addr, e)
                    continue
            return []     # SYSTEM_ERROR "no consumer for this group": nobody registered there yet
        return None

    async def _update_process_queues(self, topic: str, allocated: set[MessageQueue]) -> bool:
        changed = False
        for mq, pq in list(self._pqs.items()):
            if mq.topic == topic and mq not in allocated:
                pq.dropped = True
                if pq.task is not None:
                    pq.task.cancel()
                del self._pqs[mq]
                try:
                    await self.offset_store.persist(mq, oneway=True)
                except (RemotingError, MQClientError) as e:
                    log.info("committing the offset of released %s failed: %s", mq, e)
                self.offset_store.remove(mq)
                changed = True
                log.info("%s: released %s", self.group, mq)
        for mq in sorted(allocated - set(self._pqs)):
            self.offset_store.remove(mq)
            offset = await self._compute_pull_from_where(mq)
            if offset < 0:
                continue
            pq = _ProcessQueue(mq, offset)
            self._pqs[mq] = pq
            pq.task = self.instance.spawn(self._pull_loop(pq), f"pull {mq}")
            changed = True
            log.info("%s: took %s from offset %d", self.group, mq, offset)
        return changed

    async def _compute_pull_from_where(self, mq: MessageQueue) -> int:
        """The offset to start a newly assigned queue at, or -1 when it cannot be known now."""
        try:
            last = await self.offset_store.read_from_store(mq)
            if last >= 0:
                return last
            is_retry = mq.topic.startswith(RETRY_GROUP_TOPIC_PREFIX)
            if self.consume_from is ConsumeFromWhere.FIRST:
                return 0
            if self.consume_from is ConsumeFromWhere.LAST and is_retry:
                return 0
            if self.consume_from is ConsumeFromWhere.LAST or is_retry:
                return await self._queue_offset(mq, R.GET_MAX_OFFSET, {})
            return await self._queue_offset(mq, R.SEARCH_OFFSET_BY_TIMESTAMP,
                                            {"timestamp": self.consume_timestamp_ms})
        except (RemotingError, MQClientError, ValueError) as e:
            log.info("start offset of %s unknown for now: %s", mq, e)
            return -1

    async def _queue_offset(self, mq: MessageQueue, code: int, extra: dict) -> int:
        addr = await self.offset_store._master(mq)
        r = await self.instance.invoke_ok(addr, code, {"topic": mq.topic, "queueId": mq.queue_id,
                                                       "bname": mq.broker_name, **extra})
        return int((r.ext_fields or {})["offset"])

    # ---- pulling ----------------------------------------------------------------------------------------------
    async def _pull_loop(self, pq: _ProcessQueue) -> None:
        mq = pq.mq
        while not pq.dropped and not self._stopping:
            if len(pq.msgs) > self.pull_threshold_per_queue:
                await asyncio.sleep(PULL_DELAY_ON_FLOW_CONTROL_S)
                continue
            sub = self._subs.get(mq.topic)
            if sub is None:
                await asyncio.sleep(PULL_DELAY_ON_EXCEPTION_S)
                continue
            commit = self.offset_store.read(mq) if self.message_model is MessageModel.CLUSTERING else 0
            try:
                res = await pull_kernel(self.instance, self.group, mq, sub, pq.next_offset, self.pull_batch_size,
                                        suspend=True, commit_offset=max(commit, 0),
                                        suggested_id=self._suggested.get(mq, MASTER_ID),
                                        suspend_timeout_ms=self.suspend_timeout_ms, timeout_s=self.pull_timeout_s)
            except (RemotingError, MQClientError, WireError, ValueError) as e:
                log.info("pull of %s at %d failed: %s", mq, pq.next_offset, e)
                await asyncio.sleep(PULL_DELAY_ON_EXCEPTION_S)
                continue
            if pq.dropped:
                return
            self._suggested[mq] = res.suggest_which_broker_id
            if res.status is PullStatus.FOUND:
                pq.next_offset = res.next_begin_offset
                if res.messages:
                    pq.put(res.messages)
                    for m in res.messages:
                        self._submit(pq, m)
            elif res.status in (PullStatus.NO_NEW_MSG, PullStatus.NO_MATCHED_MSG):
                pq.next_offset = res.next_begin_offset
                if not pq.msgs:
                    self.offset_store.update(mq, res.next_begin_offset, increase_only=True)
            else:
                log.warning("%s: offset %d of %s is illegal, moving to %d", self.group, pq.next_offset, mq,
                            res.next_begin_offset)
                pq.next_offset = res.next_begin_offset
                if not pq.msgs:
                    self.offset_store.update(mq, res.next_begin_offset, increase_only=False)
                    try:
                        await self.offset_store.persist(mq, oneway=True)
                    except (RemotingError, MQClientError) as e:
                        log.info("committing the corrected offset of %s failed: %s", mq, e)

    # ---- consuming ----------------------------------------------------------------------------------------------
    def _submit(self, pq: _ProcessQueue, msg: MessageExt, delay_s: float = 0.0) -> None:
        task = asyncio.ensure_future(self._consume(pq, msg, delay_s))
        group = self._delayed if delay_s else self._consuming
        group.add(task)
        task.add_done_callback(group.discard)

    async def _consume(self, pq: _ProcessQueue, msg: MessageExt, delay_s: float) -> None:
        if delay_s:
            await asyncio.sleep(delay_s)
            if pq.dropped or self._stopping:
                return
            self._submit(pq, msg)      # from the delayed set into the consuming set
            return
        retry = retry_topic(self.group)
        if msg.topic == retry and PROPERTY_RETRY_TOPIC in msg.properties:
            msg.topic = msg.properties[PROPERTY_RETRY_TOPIC]
        async with self._sem:
            if pq.dropped or self._stopping:
                return
            msg.properties[PROPERTY_CONSUME_START_TIMESTAMP] = str(int(time.time() * 1000))
            ok = await self._call_listener(msg)
        if pq.dropped:
            return      # the queue moved to another consumer, which starts from the committed offset
        if not ok:
            if self.message_model is MessageModel.CLUSTERING:
                if not await self._send_back(msg, pq.mq.broker_name):
                    msg.reconsume_times += 1
                    self._submit(pq, msg, self.local_retry_delay_s)
                    return
            else:
                log.warning("BROADCASTING: consuming %s failed; dropped, as Java does", msg.msg_id)
        offset = pq.remove(msg)
        if offset >= 0 and not pq.dropped:
            self.offset_store.update(pq.mq, offset, increase_only=True)

    async def _call_listener(self, msg: MessageExt) -> bool:
        try:
            if inspect.iscoroutinefunction(self.listener):
                status = await self.listener(msg)
            else:
                status = await asyncio.get_running_loop().run_in_executor(self._executor, self.listener, msg)
                if inspect.isawaitable(status):
                    status = await status
        except asyncio.CancelledError:
            raise
        except Exception as e:   # noqa: BLE001 - a listener failure means "reconsume later"
            log.info("listener failed on %s: %r", msg.msg_id, e)
            return False
        return status is True or status == ConsumeStatus.CONSUME_SUCCESS

    async def _send_back(self, msg: MessageExt, broker_name: str) -> bool:
        """CONSUMER_SEND_MSG_BACK (36) to the master of the queue's broker; True when the broker took it."""
        addr = self.instance.master_addr(broker_name) if self.instance else None
        addr = addr or msg.store_host
        ext = {"offset": msg.commitlog_offset, "group": self.group, "delayLevel": 0,
               "originMsgId": msg.properties.get(PROPERTY_ORIGIN_MESSAGE_ID) or msg.msg_id,
               "originTopic": msg.topic, "unitMode": False, "maxReconsumeTimes": self.max_reconsume_times,
               "bname": broker_name}
        try:
            r = await self.instance.invoke(addr, R.CONSUMER_SEND_MSG_BACK, ext, timeout_s=SEND_BACK_TIMEOUT_S)
        except (RemotingError, AttributeError) as e:
            log.info("send-back of %s failed: %s", msg.msg_id, e)
            return False
        if r.code != RC.SUCCESS:
            log.info("send-back of %s refused: %d %s", msg.msg_id, r.code, r.remark)
            return False
        return True


# --------------------------------------------------------------------------------------------------
# Pull consumer

class PullConsumer:
    """An asyncio pull consumer: the caller picks queues and offsets (DefaultMQPullConsumer)."""

    def __init__(self, group: str, namesrv_addr: str, *, instance_name: str | None = None,
                 timeout_s: float = 10.0, heartbeat_interval_s: float = 30.0, credentials=None):
        self.group = group
        self.credentials = credentials          # mq.acl.sign.SessionCredentials for an ACL broker
        self.namesrv_addr = namesrv_addr
        self.instance_name = instance_name
        self.timeout_s = timeout_s
        self.heartbeat_interval_s = heartbeat_interval_s
        self.instance: ClientInstance | None = None
        self._topics: set[str] = set()

    async def start(self) -> "PullConsumer":
        if self.instance is not None:
            raise MQClientError("consumer already started")
        if not self.group:
            raise MQClientError("consumer group is empty")
        self.instance = ClientInstance(self.namesrv_addr, self.instance_name or default_instance_name(),
                                       credentials=self.credentials)
        self.instance.every(self.heartbeat_interval_s, self.send_heartbeat, name="pull consumer heartbeat")
        return self

    async def shutdown(self) -> None:
        inst, self.instance = self.instance, None
        if inst is not None:
            await inst.unregister(consumer_group=self.group)
            await inst.close()

    async def __aenter__(self) -> "PullConsumer":
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.shutdown()

    def _inst(self) -> ClientInstance:
        if self.instance is None:
            raise MQClientError("consumer not started")
        return self.instance

    async def send_heartbeat(self) -> None:
        inst = self._inst()
        subs = [SubscriptionData.build(t, "*").as_json() for t in sorted(self._topics)]
        body = json.dumps({"clientID": inst.client_id, "producerDataSet": [], "consumerDataSet": [
            {"consumeFromWhere": ConsumeFromWhere.LAST.value, "consumeType": "CONSUME_ACTIVELY",
             "groupName": self.group, "messageModel": MessageModel.CLUSTERING.value,
             "subscriptionDataSet": subs, "unitMode": False}]}, separators=(",", ":")).encode()
        await inst.heartbeat(body, masters_only=False)

    async def fetch_queues(self, topic: str) -> list[MessageQueue]:
        """The readable queues of `topic`, sorted.  Raises MQClientError when the topic has no route."""
        route = await self._inst().update_route(topic)
        if route is None:
            raise MQClientError(f"No route info of this topic: {topic}", RC.TOPIC_NOT_EXIST)
        if topic not in self._topics:
            self._topics.add(topic)
            await self.send_heartbeat()
        return route.subscribe_queues(topic)

    async def pull(self, queue: MessageQueue, offset: int, max_nums: int = 32, expression: str = "*", *,
                   block: bool = False, suspend_timeout_ms: int = 15000, timeout_s: float | None = None,
                   expression_type: str = "TAG") -> PullResult:
        """Messages of `queue` from `offset` (at most max_nums, matching the TAG expression, or the SQL92
        one with expression_type="SQL92").  With block, the broker holds the request up to
        suspend_timeout_ms when nothing is there yet."""
        if offset < 0:
            raise MQClientError(f"offset {offset} < 0")
        if max_nums <= 0:
            raise MQClientError(f"max_nums {max_nums} <= 0")
        inst = self._inst()
        if inst.pull_addr(queue.broker_name, MASTER_ID) is None:
            await inst.update_route(queue.topic)
        try:
            sub = SubscriptionData.build(queue.topic, expression, expression_type)
        except ValueError as e:
            raise MQClientError(str(e)) from None
        wait_s = timeout_s or (self.timeout_s + (suspend_timeout_ms / 1000 if block else 0))
        return await pull_kernel(inst, self.group, queue, sub, offset, max_nums, suspend=block,
                                 suspend_timeout_ms=suspend_timeout_ms, timeout_s=wait_s)

    async def _master(self, queue: MessageQueue) -> str:
        """The master, or a slave while the master is gone (Java's findBrokerAddressInAdmin)."""
        inst = self._inst()
        addr = inst.admin_addr(queue.broker_name)
        if addr is None:
            await inst.update_route(queue.topic)
            addr = inst.admin_addr(queue.broker_name)
        if addr is None:
            raise MQClientError(f"The broker[{queue.broker_name}] not exist")
        return addr

    async def _offset_call(self, queue: MessageQueue, code: int, extra: dict | None = None) -> int:
        addr = await self._master(queue)
        r = await self._inst().invoke_ok(addr, code, {"topic": queue.topic, "queueId": queue.queue_id,
                                                      "bname": queue.broker_name, **(extra or {})})
        return int((r.ext_fields or {})["offset"])

    async def query_offset(self, queue: MessageQueue) -> int:
        """This group's committed offset of `queue`, or -1 when none is stored (QUERY_NOT_FOUND)."""
        try:
            return await self._offset_call(queue, R.QUERY_CONSUMER_OFFSET, {"consumerGroup": self.group})
        except MQBrokerError as e:
            if e.code == RC.QUERY_NOT_FOUND:
                return -1
            raise

    async def update_offset(self, queue: MessageQueue, offset: int) -> None:
        """Commit `offset` for this group (UPDATE_CONSUMER_OFFSET, awaited) at the queue's master."""
        addr = await self._master(queue)
        await self._inst().invoke_ok(addr, R.UPDATE_CONSUMER_OFFSET, {
            "consumerGroup": self.group, "topic": queue.topic, "queueId": queue.queue_id, "commitOffset": offset,
            "bname": queue.broker_name})

    async def max_offset(self, queue: MessageQueue) -> int:
        return await self._offset_call(queue, R.GET_MAX_OFFSET)

    async def min_offset(self, queue: MessageQueue) -> int:
        return await self._offset_call(queue, R.GET_MIN_OFFSET)

    async def search_offset(self, queue: MessageQueue, timestamp_ms: int) -> int:
        return await self._offset_call(queue, R.SEARCH_OFFSET_BY_TIMESTAMP, {"timestamp": timestamp_ms})


__all__ = ["PushConsumer", "PullConsumer", "allocate_averagely", "pull_kernel", "RemoteOffsetStore",
           "LocalOffsetStore"]
