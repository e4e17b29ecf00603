"""POP consumption for 5.x clients (ReceiveMessage, AckMessage, ChangeInvisibleDuration), built
on the broker's 4.x primitives, its state kept in the store.

A receive pops messages: it pulls them for the group from the consumer offset, writes a
checkpoint (CK) record naming them and their invisible time, then commits the group's offset
past them.  An ack writes an ACK record.  Both records are messages of the revive topic
(rmq_sys_REVIVE_LOG_<cluster>, one queue), so they are flushed, replicated to slaves and kept in
DLedger's log like any message, and survive a kill -9.  The revive loop reads that topic in order
(group CID_RMQ_SYS_REVIVE_GROUP, whose offset is the oldest CK not settled) and, for a CK whose
invisible time passed with messages not acked, sends each of them back the 4.x way
(CONSUMER_SEND_MSG_BACK, delay level REVIVE_DELAY_LEVEL): it comes back through %RETRY%<group>,
its reconsumeTimes one higher, and goes to %DLQ%<group> past the group's retryMaxTimes - the
broker's own rule, so 4.x and 5.x consumers of a group retry alike.

Order of writes, and what a crash between them costs: CK before the offset commit (a crash in
between pops the messages again and revives the CK: delivered twice, never lost); on revive, the
send-back before the revive offset moves (a crash in between revives again: twice, never lost).
A consumer offset the broker had not persisted when it died would roll back and pop acked
messages again: each CK also records where its pop left the offset, and the gateway, reading
the revive log from the revive offset (persisted in the same table, so never ahead of the lost
commits) before it serves a receive, puts the group's offsets back to at least there.

RocketMQ 5 differs, on purpose: its POP retry topic is %RETRY%<group>_<topic> and its revive
puts a copy there at once; here the retry topic is the 4.x %RETRY%<group> (one rule for retry and
DLQ, the group's retryMaxTimes) and a revived message is visible one delay level (1 s by default)
after its invisible time ended.

Orderly groups (consumeMessageOrderly): no checkpoint; a queue's batch is held in the gateway's
memory (_Orderly) and the offset moves past it once every message of it is acked; its invisible
time ending puts the same messages out again (attempt counts kept in memory: a gateway restart
starts them at 1 again, and delivers the unacked batch again from the committed offset).

Receipt handle (opaque to clients): "<ck start> <pop ms> <invisible ms> <kind> <queue id>
<queue offset> <commitlog offset> <broker>", kind 0 = the topic's queue, 1 = %RETRY%<group>,
2 = an orderly batch.

Limits, named: BATCH_MAX messages per receive (the proxy's 32); invisible time
INVISIBLE_MIN_MS..INVISIBLE_MAX_MS for a receive, up to INVISIBLE_MAX_MS for a change; long
polling checks every POLL_INTERVAL_S (no broker push: a receive sees a new message up to that
late); the revive loop runs every REVIVE_INTERVAL_S; a group's %RETRY% topic found empty is looked
at again after RETRY_PROBE_S (a revived message can wait that much longer)."""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

import orjson

from mq.remoting import RemotingClient
from mq.wire.codes import RequestCode as R, ResponseCode as RC
from mq.wire.properties import decode_properties
from mq.wire.topics import RETRY_PREFIX

from mq.wire.grpc5 import Code

from .background import Background, BrokerCalls
from .convert import Refused

log = logging.getLogger("mq.gateway.pop")

REVIVE_GROUP = "CID_RMQ_SYS_REVIVE_GROUP"
REVIVE_DELAY_LEVEL = 1
BATCH_MAX = 32
INVISIBLE_MIN_MS = 10_000
INVISIBLE_MAX_MS = 12 * 3600 * 1000
POLL_INTERVAL_S = 0.2
REVIVE_INTERVAL_S = 0.5
REVIVE_SCAN_BATCH = 32
RETRY_PROBE_S = 1.0
KIND_QUEUE, KIND_RETRY, KIND_ORDERLY = 0, 1, 2


def revive_topic(cluster: str) -> str:
    return f"rmq_sys_REVIVE_LOG_{cluster}"


def retry_topic(group: str) -> str:
    return RETRY_PREFIX + group


@dataclass
class Popped:
    """One message popped for a client: the record's values and its receipt handle."""
    topic: str                   # the topic it is delivered as (a retry's original topic)
    queue_id: int
    queue_offset: int
    commitlog_offset: int
    body: bytes
    properties: dict
    sys_flag: int
    born_ms: int
    born_host: str
    store_ms: int
    store_host: str
    reconsume_times: int
    handle: str


def popped(rec, handle: str = "", retry_of: str | None = None, extra_attempts: int = 0) -> Popped:
    """The Popped a pulled record (a tuple of wcl.RECORD_VALUE_FIELDS) is delivered as.
    retry_of: the record is of %RETRY%<group>, delivered as its original topic (this one when it
    names none); extra_attempts: deliveries the broker's count does not know of (orderly)."""
    (_size, _crc, queue_id, _flag, queue_offset, phy, sys_flag, born_ts, born_host, born_port, store_ts,
     store_host, store_port, reconsume, _prep, body, rtopic, props, _packed) = rec
    p = decode_properties(props)
    return Popped(p.get("RETRY_TOPIC", retry_of) if retry_of is not None else rtopic, queue_id, queue_offset, phy,
                  bytes(body), p, sys_flag, born_ts, f"{born_host}:{born_port}", store_ts,
                  f"{store_host}:{store_port}", reconsume + extra_attempts, handle)


@dataclass(frozen=True)
class Handle:
    start: int
    pop_ms: int
    invisible_ms: int
    kind: int
    queue_id: int
    offset: int
    commitlog_offset: int
    broker: str

    def text(self) -> str:
        return (f"{self.start} {self.pop_ms} {self.invisible_ms} {self.kind} {self.queue_id} {self.offset} "
                f"{self.commitlog_offset} {self.broker}")

    @classmethod
    def parse(cls, text: str) -> "Handle":
        parts = text.split(" ")
        try:
            if len(parts) != 8:
                raise ValueError(f"{len(parts)} fields, not 8")
            h = cls(*(int(p) for p in parts[:7]), parts[7])
        except ValueError as e:
            raise Refused(Code.INVALID_RECEIPT_HANDLE, f"not a receipt handle of this broker: {e}") from None
        if h.kind not in (KIND_QUEUE, KIND_RETRY, KIND_ORDERLY) or min(h.start, h.pop_ms, h.invisible_ms, h.offset) < 0:
            raise Refused(Code.INVALID_RECEIPT_HANDLE, "not a receipt handle of this broker")
        return h

    @property
    def deadline_ms(self) -> int:
        return self.pop_ms + self.invisible_ms


@dataclass
class _Orderly:
    """A queue's batch out to an orderly group: nothing more of the queue goes out until every
    message of it is acked (the offset then moves past it) or its invisible time ends (then the
    same messages go out again, their attempt one higher)."""
    pop_ms: int
    deadline_ms: int
    end: int                                  # the offset past the batch (committed once all are acked)
    pending: set = field(default_factory=set)


@dataclass
class _Ck:
    """A checkpoint read from the revive topic, until every message is acked or revived."""
    group: str
    qtopic: str
    queue_id: int
    deadline_ms: int
    revive_offset: int                       # its own offset in the revive queue
    pending: dict = field(default_factory=dict)   # queue offset -> commitlog offset, not acked yet


class PopService(BrokerCalls, Background):
    def __init__(self, remoting: RemotingClient, broker_addr: str, broker_name: str, cluster: str, stats=None):
        """stats: a GatewayStats (revived messages are counted there)."""
        self.remoting = remoting
        self.stats = stats
        self.broker_addr = broker_addr
        self.broker_name = broker_name
        self.revive_topic = revive_topic(cluster)
        self._locks: dict[tuple, asyncio.Lock] = {}
        self._cks: dict[tuple, _Ck] = {}          # (group, qtopic, qid, start, pop_ms) -> CK
        # (group, qtopic, qid) -> the end of the last pop of the queue a CK records: the group's
        # offset is at least that, whatever the broker says after a crash (module docstring)
        self._floors: dict[tuple, int] = {}
        self.ready = asyncio.Event()              # set once the revive log was read from the revive offset
        self._scan_offset = -1                    # next revive-queue offset to read
        self._committed_revive = -1
        self._rr = 0
        self._retry_idle: dict[str, float] = {}  # group -> until when its empty retry topic is not looked at
        self._orderly: dict[tuple, _Orderly] = {}          # (group, topic, qid) -> its batch out
        self._attempts: dict[tuple, int] = {}              # (group, topic, qid, offset) -> deliveries so far
        self.revived = 0

    async def _record(self, tag: str, body: dict) -> int:
        """Appends a CK or ACK record to the revive topic; its queue offset."""
        return await self._put_record(self.revive_topic, REVIVE_GROUP, {"TAGS": tag}, orjson.dumps(body), tag)

    # ---- start ----------------------------------------------------------------------------------
    # start() runs _loop, the revive loop, which first creates the revive topic (the role starts
    # before the broker's io workers serve: it retries until they do)

    # ---- receive --------------------------------------------------------------------------------
    def _lock(self, key: tuple) -> asyncio.Lock:
        lock = self._locks.get(key)
        if lock is None:
            if len(self._locks) > 65536:
                self._locks = {k: v for k, v in self._locks.items() if v.locked()}
            lock = self._locks[key] = asyncio.Lock()
        return lock

    async def pop(self, group: str, topic: str, queues: int, retry_queues: int, expr_type: str, expr: str,
                  batch: int, invisible_ms: int, orderly: bool = False) -> list[Popped]:
        """Up to `batch` messages of topic (its `queues` read queues here) and of %RETRY%<group>
        (`retry_queues` of them; 0: none yet), retry first.  orderly (a group with
        consumeMessageOrderly): from the topic's queues only, each queue's messages in order,
        one batch of a queue out at a time (_Orderly)."""
        if orderly:
            return await self._pop_orderly(group, topic, queues, expr_type, expr, batch, invisible_ms)
        out: list[Popped] = []
        now = time.monotonic()
        skip_retry = self._retry_idle.get(group, 0.0) > now
        sources = [] if skip_retry else [(retry_topic(group), q, KIND_RETRY) for q in range(retry_queues)]
        start = self._rr
        self._rr += 1
        sources += [(topic, (start + i) % queues, KIND_QUEUE) for i in range(queues)]
        for qtopic, qid, kind in sources:
            if len(out) >= batch:
                break
            async with self._lock((group, qtopic, qid)):
                got = await self._pop_queue(group, qtopic, qid, kind, topic, expr_type, expr, batch - len(out),
                                            invisible_ms)
            if kind == KIND_RETRY and not got:
                if len(self._retry_idle) > 65536:
                    self._retry_idle.clear()
                self._retry_idle[group] = now + RETRY_PROBE_S
            out += got
        return out

    async def _pop_queue(self, group, qtopic, qid, kind, topic, expr_type, expr, n, invisible_ms) -> list[Popped]:
        offset = max(await self._offset(group, qtopic, qid), self._floors.get((group, qtopic, qid), -1))
        if offset < 0:   # a new group: a fresh queue from its start, else from its end (RocketMQ's MAX init)
            low = await self._min_offset(qtopic, qid)
            offset = low if (low == 0 or kind == KIND_RETRY) else await self._max_offset(qtopic, qid)
        code, nxt, recs = await self._pull(group, qtopic, qid, offset, n, expr_type if kind == KIND_QUEUE else "TAG",
                                           expr if kind == KIND_QUEUE else "*")
        if not recs:
            if nxt != offset:      # filtered out, or an offset the broker moved: skip them for good
                await self._commit(group, qtopic, qid, nxt)
            return []
        pop_ms = int(time.time() * 1000)
        start = recs[0][4]
        await self._record("ck", {"g": group, "t": qtopic, "q": qid, "s": start, "p": pop_ms, "i": invisible_ms,
                                  "n": nxt, "o": [[r[4], r[5]] for r in recs]})
        await self._commit(group, qtopic, qid, nxt)
        self._floors[(group, qtopic, qid)] = nxt
        return [popped(r, Handle(start, pop_ms, invisible_ms, kind, r[2], r[4], r[5], self.broker_name).text(),
                       retry_of=topic if kind == KIND_RETRY else None) for r in recs]

    async def _pop_orderly(self, group, topic, queues, expr_type, expr, batch, invisible_ms) -> list[Popped]:
        out: list[Popped] = []
        start = self._rr
        self._rr += 1
        for i in range(queues):
            if len(out) >= batch:
                break
            qid = (start + i) % queues
            key = (group, topic, qid)
            async with self._lock(key):
                held = self._orderly.get(key)
                now_ms = int(time.time() * 1000)
                if held is not None and held.pending and held.deadline_ms > now_ms:
                    continue                                   # its batch is out
                offset = max(await self._offset(group, topic, qid), self._floors.get(key, -1))
                if offset < 0:
                    low = await self._min_offset(topic, qid)
                    offset = low if low == 0 else await self._max_offset(topic, qid)
                _, nxt, recs = await self._pull(group, topic, qid, offset, batch - len(out), expr_type, expr)
                if not recs:
                    if nxt != offset:
                        await self._commit(group, topic, qid, nxt)
                    self._orderly.pop(key, None)
                    continue
                self._orderly[key] = _Orderly(now_ms, now_ms + invisible_ms, nxt, {r[4] for r in recs})
                for r in recs:
                    akey = (group, topic, qid, r[4])
                    attempt = self._attempts.get(akey, 0) + 1
                    if len(self._attempts) > 1 << 20:
                        self._attempts.clear()
                    self._attempts[akey] = attempt
                    handle = Handle(offset, now_ms, invisible_ms, KIND_ORDERLY, r[2], r[4], r[5], self.broker_name)
                    out.append(popped(r, handle.text(), extra_attempts=attempt - 1))
        return out

    async def _ack_orderly(self, group: str, topic: str, h: Handle) -> None:
        key = (group, topic, h.queue_id)
        async with self._lock(key):
            held = self._orderly.get(key)
            if held is None or held.pop_ms != h.pop_ms:
                return                              # an older batch's handle: that batch is settled
            held.pending.discard(h.offset)
            self._attempts.pop((group, topic, h.queue_id, h.offset), None)
            if not held.pending:
                await self._commit(group, topic, h.queue_id, held.end)
                self._floors[key] = held.end
                del self._orderly[key]

    # ---- ack and change ---------------------------------------------------------------------------
    def _qtopic(self, group: str, topic: str, h: Handle) -> str:
        return retry_topic(group) if h.kind == KIND_RETRY else topic

    def _check_live(self, h: Handle) -> None:
        if h.broker != self.broker_name:
            raise Refused(Code.INVALID_RECEIPT_HANDLE, f"the receipt handle is of broker {h.broker}")
        if h.deadline_ms <= time.time() * 1000:
            raise Refused(Code.INVALID_RECEIPT_HANDLE, "receipt handle is expired")

    async def ack(self, group: str, topic: str, handles: list[str]) -> list[Refused | None]:
        """Acks the messages of `handles`: one ACK record per checkpoint they belong to (a
        receive's batch is acked with one record, as RocketMQ's BatchAckMsg).  Per handle: None
        when acked, else the Refused it got (a bad or expired handle; a record the broker did
        not take fails every handle of that record)."""
        out: list[Refused | None] = [None] * len(handles)
        by_ck: dict[tuple, list[tuple[int, int]]] = {}    # checkpoint -> (index, queue offset) of its handles
        for i, text in enumerate(handles):
            try:
                h = Handle.parse(text)
                self._check_live(h)
                if h.kind == KIND_ORDERLY:
                    await self._ack_orderly(group, topic, h)
                    continue
            except Refused as e:
                out[i] = e
                continue
            by_ck.setdefault((self._qtopic(group, topic, h), h.queue_id, h.start, h.pop_ms), []).append((i, h.offset))
        for (qtopic, qid, start, pop_ms), acked in by_ck.items():
            try:
                await self._record("ack", {"g": group, "t": qtopic, "q": qid, "s": start, "p": pop_ms,
                                           "os": sorted({o for _, o in acked})})
            except Refused as e:
                for i, _ in acked:
                    out[i] = e
        return out

    async def change_invisible(self, group: str, topic: str, handle: str, invisible_ms: int) -> str:
        """A new CK for the one message (visible again invisible_ms from now), then the old one
        acked; the new handle."""
        h = Handle.parse(handle)
        self._check_live(h)
        if h.kind == KIND_ORDERLY:             # orderly: only the batch's next-visible time moves
            key = (group, topic, h.queue_id)
            held = self._orderly.get(key)
            if held is None or held.pop_ms != h.pop_ms:
                raise Refused(Code.INVALID_RECEIPT_HANDLE, "the receipt handle's batch is settled")
            held.deadline_ms = int(time.time() * 1000) + invisible_ms
            return Handle(h.start, h.pop_ms, held.deadline_ms - h.pop_ms, h.kind, h.queue_id, h.offset,
                          h.commitlog_offset, self.broker_name).text()
        qtopic = self._qtopic(group, topic, h)
        pop_ms = int(time.time() * 1000)
        await self._record("ck", {"g": group, "t": qtopic, "q": h.queue_id, "s": h.offset, "p": pop_ms,
                                  "i": invisible_ms, "o": [[h.offset, h.commitlog_offset]]})
        await self._record("ack", {"g": group, "t": qtopic, "q": h.queue_id, "s": h.start, "p": h.pop_ms,
                                   "o": h.offset})
        return Handle(h.offset, pop_ms, invisible_ms, h.kind, h.queue_id, h.offset, h.commitlog_offset,
                      self.broker_name).text()

    async def forward_to_dlq(self, group: str, topic: str, handle: str) -> None:
        """The message of `handle` to %DLQ%<group> (CONSUMER_SEND_MSG_BACK with delay level -1,
        the 4.x way), then acked: a FIFO consumer that gave up on it."""
        h = Handle.parse(handle)
        self._check_live(h)
        r = await self._call(R.CONSUMER_SEND_MSG_BACK, {"group": group, "offset": h.commitlog_offset,
                                                         "delayLevel": -1, "originMsgId": "",
                                                         "originTopic": self._qtopic(group, topic, h)})
        if r.code != RC.SUCCESS:
            raise Refused(Code.INTERNAL_SERVER_ERROR if r.code != RC.SUBSCRIPTION_GROUP_NOT_EXIST
                          else Code.CONSUMER_GROUP_NOT_FOUND, f"forward to the DLQ failed: {r.code} {r.remark}")
        (refused,) = await self.ack(group, topic, [handle])
        if refused is not None:
            raise refused

    # ---- revive -----------------------------------------------------------------------------------
    async def _loop(self) -> None:
        created = False
        while True:
            try:
                if not created:
                    if not await self._create_topic(self.revive_topic, 1):
                        await asyncio.sleep(1.0)      # not taking writes yet (starting, a slave, a follower)
                        continue
                    created = True
                await self.revive_once()
            except asyncio.CancelledError:
                raise
            except Refused as e:
                if created:
                    log.warning("POP revive: %s", e.text)
            except Exception:
                log.exception("POP revive failed; retrying")
            await asyncio.sleep(REVIVE_INTERVAL_S)

    async def revive_once(self) -> None:
        """Reads the revive queue's new records, revives the CKs past their deadline, and moves
        the revive group's offset to the oldest CK still open."""
        if self._scan_offset < 0:
            start = await self._offset(REVIVE_GROUP, self.revive_topic, 0)
            self._scan_offset = self._committed_revive = max(0, start)
        while True:
            _, nxt, recs = await self._pull(REVIVE_GROUP, self.revive_topic, 0, self._scan_offset, REVIVE_SCAN_BATCH,
                                            "TAG", "*")
            for rec in recs:
                self._apply(rec)
            if nxt == self._scan_offset:
                break
            self._scan_offset = nxt
            if not recs:
                break
        if not self.ready.is_set():
            await self._restore_offsets()
            self.ready.set()
        now_ms = time.time() * 1000
        for key, ck in list(self._cks.items()):
            if ck.deadline_ms > now_ms:
                continue
            for offset, phy in list(ck.pending.items()):
                r = await self._call(R.CONSUMER_SEND_MSG_BACK, {"group": ck.group, "offset": phy,
                                                                "delayLevel": REVIVE_DELAY_LEVEL, "originMsgId": "",
                                                                "originTopic": ck.qtopic})
                if r.code != RC.SUCCESS:
                    log.warning("POP revive: sending back %s@%d:%d for %s failed (%s %s); next round", ck.qtopic,
                                ck.queue_id, offset, ck.group, r.code, r.remark)
                    break
                del ck.pending[offset]
                self.revived += 1
                if self.stats is not None:
                    self.stats.messages("revived")
            if not ck.pending:
                del self._cks[key]
        oldest = min((ck.revive_offset for ck in self._cks.values()), default=self._scan_offset)
        if oldest > self._committed_revive:
            await self._commit(REVIVE_GROUP, self.revive_topic, 0, oldest)
            self._committed_revive = oldest

    async def _restore_offsets(self) -> None:
        """After the first read of the revive log: every queue a CK since the revive offset popped
        gets its group's offset back to at least that pop's end.  A broker killed before it
        persisted its consumer offsets comes back with older ones; the revive offset is one of
        them (same table, same write), so the CKs read from it cover every pop it lost."""
        for (group, qtopic, qid), floor in self._floors.items():
            if await self._offset(group, qtopic, qid) < floor:
                log.info("POP: %s's offset of %s:%d restored to %d from the revive log", group, qtopic, qid, floor)
                await self._commit(group, qtopic, qid, floor)

    def _apply(self, rec) -> None:
        body, props, queue_offset = rec[15], rec[17], rec[4]
        try:
            d = orjson.loads(bytes(body))
            tag = decode_properties(props).get("TAGS")
            key = (d["g"], d["t"], int(d["q"]), int(d["s"]), int(d["p"]))
            if tag == "ck":
                if "n" in d:
                    fkey = (d["g"], d["t"], int(d["q"]))
                    if int(d["n"]) > self._floors.get(fkey, -1):
                        self._floors[fkey] = int(d["n"])
                ck = _Ck(d["g"], d["t"], int(d["q"]), int(d["p"]) + int(d["i"]), queue_offset,
                         {int(o): int(phy) for o, phy in d["o"]})
                if ck.pending:
                    self._cks[key] = ck
            elif tag == "ack":
                # an ACK follows its CK in the queue; one with no CK open acks a settled CK
                ck = self._cks.get(key)
                if ck is not None:
                    for o in d["os"] if "os" in d else (d["o"],):
                        ck.pending.pop(int(o), None)
                    if not ck.pending:
                        del self._cks[key]
        except (ValueError, KeyError, TypeError, orjson.JSONDecodeError) as e:
            log.warning("POP revive: record %d of %s is not a CK or ACK (%s); skipped", queue_offset,
                        self.revive_topic, e)
