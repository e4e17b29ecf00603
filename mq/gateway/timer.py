"""Timer messages for 5.x producers: a DELAY message delivered at its delivery time, to the
second, up to TIMER_MAX_DELAY_MS ahead (RocketMQ 5's timer; the 4.x delay levels are not used).

A timer message is stored at once, in the timer topic rmq_sys_wheel_timer (queue 0), with its
real topic and queue in REAL_TOPIC / REAL_QID and its due time in TIMER_OUT_MS (the delivery
time rounded down to the second), as RocketMQ 5 stores it.  The gateway's timer loop reads that
topic in order and keeps (due time, offset) of every message not yet delivered in a heap; each
tick it puts those that are due into their real topic (the same body, properties and UNIQ_KEY, so
the same message id) and moves its progress on.

Progress is two numbers kept as consumer offsets of group CID_RMQ_SYS_TIMER on the timer topic
(so in the broker's offsets table, persisted and replicated with the others): queue 0's is the
offset of the oldest message not delivered (everything below it is); queue 1's is a time D such
that every message read with a due time <= D was delivered (the smallest due time still waiting,
minus one).  The broker persists those every few seconds, so each change of progress is also
written as a checkpoint record into the timer topic (TIMER_CHECKPOINT "<oldest> <through>"):
after a restart the loop reads from the saved offset to the end before it delivers anything, and
the last checkpoint read drops the messages before it that were due by its time.  A crash
delivers again at most what was delivered after the last checkpoint; it never loses one.  A recall (RecallMessage) is a record in the same topic naming the message's
UNIQ_KEY (TIMER_DEL_UNIQKEY): a message whose recall was read before it is due is not delivered.

Limits, named: TIMER_MAX_DELAY_MS (3 days, RocketMQ 5's timerMaxDelaySec); TIMER_PENDING_MAX
messages waiting at once (past it, a timer send is refused TOO_MANY_REQUESTS); delivery within
TICK_S of the due second; recalls remembered until their message's due time."""
from __future__ import annotations

import asyncio
import base64
import heapq
import logging
import time

from mq.remoting import RemotingClient
from mq.wire import commitlog as wcl
from mq.wire.codes import RequestCode as R, ResponseCode as RC
from mq.wire.errors import WireError
from mq.wire.grpc5 import Code
from mq.wire.headers import PULL_SUBSCRIPTION, send_v2
from mq.wire.properties import decode_properties, properties_to_string
from mq.wire.topics import AUTO_CREATE_TOPIC

from .background import Background, BrokerCalls
from .convert import Refused

log = logging.getLogger("mq.gateway.timer")

TIMER_TOPIC = "rmq_sys_wheel_timer"
TIMER_GROUP = "CID_RMQ_SYS_TIMER"
TIMER_MAX_DELAY_MS = 3 * 24 * 3600 * 1000
TIMER_PENDING_MAX = 2_000_000
TICK_S = 0.2
SCAN_BATCH = 32
TIMER_PROPS = ("REAL_TOPIC", "REAL_QID", "TIMER_OUT_MS")


def recall_handle(topic: str, broker: str, due_ms: int, uniq: str) -> str:
    """RocketMQ 5's recall handle: URL-safe base64 of "v1 <topic> <broker> <due ms + 1> <UNIQ_KEY>"."""
    return base64.urlsafe_b64encode(f"v1 {topic} {broker} {due_ms + 1} {uniq}".encode()).decode()


def parse_recall_handle(handle: str) -> tuple[str, str, int, str]:
    try:
        parts = base64.urlsafe_b64decode(handle.encode()).decode().split(" ")
        if len(parts) != 5 or parts[0] != "v1":
            raise ValueError("not v1 with 5 fields")
        return parts[1], parts[2], int(parts[3]) - 1, parts[4]
    except (ValueError, UnicodeDecodeError) as e:
        raise Refused(Code.BAD_REQUEST, f"not a recall handle: {e}") from None


class TimerService(BrokerCalls, Background):
    def __init__(self, remoting: RemotingClient, broker_addr: str, broker_name: str, stats=None):
        self.remoting = remoting
        self.broker_addr = broker_addr
        self.broker_name = broker_name
        self.stats = stats
        self._heap: list[tuple[int, int]] = []        # (due ms, queue offset in the timer topic)
        self._recalled: dict[str, int] = {}           # UNIQ_KEY -> due ms
        self._scan = -1                               # next timer-topic offset to read
        self._skip_through_ms = -1                    # read messages due by then were delivered
        self._through_ms = -1                         # the latest due time delivered
        self._saved = (-1, -1)
        self.delivered = 0

    # ---- storing ---------------------------------------------------------------------------------
    async def store(self, ext_fields: dict, props: dict, body: bytes, topic: str, qid: int, due_ms: int):
        """Stores a timer message (its send header fields and properties as the gateway built
        them for `topic`/`qid`); the broker's answer.  ext_fields: send_v2 fields."""
        if len(self._heap) >= TIMER_PENDING_MAX:
            raise Refused(Code.TOO_MANY_REQUESTS, f"{TIMER_PENDING_MAX} timer messages are waiting already")
        props = {**props, "REAL_TOPIC": topic, "REAL_QID": str(qid), "TIMER_OUT_MS": str(due_ms)}
        ext = send_v2(**{**ext_fields, "topic": TIMER_TOPIC, "queueId": 0,
                         "properties": properties_to_string(props)})
        return await self._call(R.SEND_MESSAGE_V2, ext, body)

    async def recall(self, topic: str, handle: str) -> str:
        """Records the recall of the timer message of `handle`; its message id."""
        htopic, broker, due_ms, uniq = parse_recall_handle(handle)
        if htopic != topic or broker != self.broker_name:
            raise Refused(Code.BAD_REQUEST, "the recall handle is of another topic or broker")
        props = {"TIMER_DEL_UNIQKEY": uniq, "TIMER_OUT_MS": str(due_ms), "REAL_TOPIC": topic, "UNIQ_KEY": uniq + "-del"}
        await self._put_record(TIMER_TOPIC, TIMER_GROUP, props, b"recall", "recall")
        return uniq

    # ---- the loop --------------------------------------------------------------------------------
    async def _loop(self) -> None:
        created = False
        while True:
            try:
                if not created:
                    if not await self._create_topic(TIMER_TOPIC, 2):   # a slave or a DLedger follower: not now
                        await asyncio.sleep(1.0)
                        continue
                    created = True
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Refused as e:
                log.warning("timer: %s", e.text)
            except Exception:
                log.exception("timer tick failed; next tick")
            await asyncio.sleep(TICK_S)

    async def _offset(self, qid: int) -> int:
        r = await self._call(R.QUERY_CONSUMER_OFFSET, {"consumerGroup": TIMER_GROUP, "topic": TIMER_TOPIC,
                                                       "queueId": qid})
        return int((r.ext_fields or {}).get("offset", -1)) if r.code == RC.SUCCESS else -1

    async def _commit(self, qid: int, value: int) -> None:
        await self._call(R.UPDATE_CONSUMER_OFFSET, {"consumerGroup": TIMER_GROUP, "topic": TIMER_TOPIC,
                                                    "queueId": qid, "commitOffset": value})

    async def _pull(self, offset: int, n: int):
        r = await self._call(R.PULL_MESSAGE, {
            "consumerGroup": TIMER_GROUP, "topic": TIMER_TOPIC, "queueId": 0, "queueOffset": offset,
            "maxMsgNums": n, "sysFlag": PULL_SUBSCRIPTION, "commitOffset": 0, "suspendTimeoutMillis": 0,
            "subscription": "*", "subVersion": 0, "expressionType": "TAG"})
        nxt = int((r.ext_fields or {}).get("nextBeginOffset", offset)) if r.ext_fields else offset
        if r.code != RC.SUCCESS or not r.body:
            return nxt, []
        try:
            return nxt, list(wcl.iter_record_values(r.body))
        except WireError as e:
            raise Refused(Code.INTERNAL_SERVER_ERROR, f"the timer topic's pull answer is malformed: {e}") from None

    async def tick(self) -> None:
        """Reads what was stored since, delivers what is due, saves the progress."""
        catching_up = self._scan < 0
        last_checkpoint = None                         # (its offset, delivered-through ms), read catching up
        if catching_up:
            self._scan = max(0, await self._offset(0))
            self._skip_through_ms = self._through_ms = await self._offset(1)
        while True:                                    # read the new timer records
            nxt, recs = await self._pull(self._scan, SCAN_BATCH)
            for rec in recs:
                props = decode_properties(rec[17])
                if "TIMER_CHECKPOINT" in props:
                    if catching_up:
                        try:
                            last_checkpoint = (rec[4], int(props["TIMER_CHECKPOINT"].split(" ")[1]))
                        except (IndexError, ValueError):
                            pass
                    continue
                try:
                    due = int(props.get("TIMER_OUT_MS", "0"))
                except ValueError:
                    due = 0
                if "TIMER_DEL_UNIQKEY" in props:
                    self._recalled[props["TIMER_DEL_UNIQKEY"]] = due
                elif due > self._skip_through_ms:
                    heapq.heappush(self._heap, (due, rec[4]))
            if nxt == self._scan or not recs:
                self._scan = max(self._scan, nxt)
                break
            self._scan = nxt
        if last_checkpoint is not None:
            # the last checkpoint record knew every message before it: those due by its time
            # were delivered (the offsets saved may be older: the broker persists them every few s)
            at, through = last_checkpoint
            self._heap = [(due, o) for due, o in self._heap if not (o < at and due <= through)]
            heapq.heapify(self._heap)
        now_ms = int(time.time() * 1000)
        settled = False
        while self._heap and self._heap[0][0] <= now_ms:
            due, offset = self._heap[0]
            await self._deliver(offset)
            heapq.heappop(self._heap)
            self._through_ms = max(self._through_ms, due)
            settled = True
        for uniq in [u for u, due in self._recalled.items() if due < now_ms - 60_000]:
            del self._recalled[uniq]
        oldest = min((o for _, o in self._heap), default=self._scan)
        through = (self._heap[0][0] - 1) if self._heap else self._through_ms
        if settled:                                    # only deliveries move it: checkpoints are not news
            await self._checkpoint(oldest, through)
        if (oldest, through) != self._saved:
            await self._commit(1, through)            # the time first: either order is safe (module docstring)
            await self._commit(0, oldest)
            self._saved = (oldest, through)

    async def _checkpoint(self, oldest: int, through: int) -> None:
        """A checkpoint record: the progress in the log itself, read back after a crash that
        lost the consumer offsets the broker had not persisted yet."""
        await self._put_record(TIMER_TOPIC, TIMER_GROUP, {"TIMER_CHECKPOINT": f"{oldest} {through}",
                                                         "TIMER_OUT_MS": "0"}, b"checkpoint", "timer checkpoint")

    async def _deliver(self, offset: int) -> None:
        _, recs = await self._pull(offset, 1)
        if not recs or recs[0][4] != offset:
            log.warning("timer: the message at offset %d of %s is gone; not delivered", offset, TIMER_TOPIC)
            return
        rec = recs[0]
        props = decode_properties(rec[17])
        uniq = props.get("UNIQ_KEY", "")
        if uniq in self._recalled:
            return                                     # recalled before it was due
        topic, qid = props.pop("REAL_TOPIC", ""), int(props.pop("REAL_QID", "0") or 0)
        props.pop("TIMER_OUT_MS", None)
        ext = send_v2(producerGroup=props.get("PGROUP", TIMER_GROUP), topic=topic, defaultTopic=AUTO_CREATE_TOPIC,
                      defaultTopicQueueNums=4, queueId=qid, sysFlag=rec[6], bornTimestamp=rec[7], flag=rec[3],
                      properties=properties_to_string(props), reconsumeTimes=rec[13], unitMode=False, batch=False)
        r = await self._call(R.SEND_MESSAGE_V2, ext, bytes(rec[15]))
        if r.code not in (RC.SUCCESS, RC.FLUSH_DISK_TIMEOUT, RC.FLUSH_SLAVE_TIMEOUT, RC.SLAVE_NOT_AVAILABLE):
            raise Refused(Code.INTERNAL_SERVER_ERROR, f"delivering timer message {uniq} to {topic} failed: "
                                                      f"{r.code} {r.remark}")
        self.delivered += 1
        if self.stats is not None:
            self.stats.messages("timer-delivered")
