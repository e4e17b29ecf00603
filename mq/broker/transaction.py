"""Transactional messages as RocketMQ 4.9 keeps them (EndTransactionProcessor,
TransactionalMessageBridge, TransactionalMessageServiceImpl, DefaultTransactionalMessageCheckListener).

Durable state, all of it in the store, so it is replicated like every message (master/slave and
DLedger) and read back by whichever broker writes next:
  * a half message: a send whose TRAN_MSG property is "true", stored in HALF_TOPIC queue 0 with
    REAL_TOPIC / REAL_QID and its transaction type reset to NOT_TYPE (so it gets a queue entry);
    the producer's answer carries the half's msgId and queue offset (its tranStateTableOffset);
  * an op record per ended transaction, commit and rollback alike: OP_TOPIC queue 0, tags "d",
    body the ended half's queue offset as decimal text;
  * on commit, the message under its real topic and queue, transaction type COMMIT,
    PREPARED_TRANSACTION_OFFSET = the half's CommitLog offset, REAL_*/TRAN_MSG removed;
  * the check position: CHECK_GROUP's consumer offsets of HALF_TOPIC:0 and OP_TOPIC:0.

The check pass (the supervisor, every transactionCheckInterval, only while this broker takes
writes: the master, the DLedger leader) walks the halves from the check position.  A half whose
transaction ended is passed; one checked transactionCheckMax times already, or older than
fileReservedTime, goes to CHECK_MAX_TOPIC; one stored after the pass began, or younger than
transactionTimeOut (CHECK_IMMUNITY_TIME_IN_SECONDS when the producer set it), stops the pass;
otherwise a copy is stored again at the end of the half queue with TRANSACTION_CHECK_TIMES + 1
and CHECK_TRANSACTION_STATE (39) goes to a live connection of its producer group, naming the copy
(whose END_TRANSACTION then ends the transaction).

Beyond RocketMQ, a transaction is committed once:
  * END_TRANSACTION and the check pass run in one process (the supervisor's event loop), which
    knows the transactions ended within fileReservedTime, by their original half's queue offset
    (every copy a check stores carries it as TRAN_PREPARED_QUEUE_OFFSET; read back from the op
    queue at start; an older half is never checked again: it goes to CHECK_MAX_TOPIC), and the
    ones being ended right now, so a producer that answers both the original half and a checked
    copy, or sends END_TRANSACTION twice at once, commits it once (RocketMQ stores both);
  * a commit first asks the message index whether the real topic holds the transaction's
    message already (REAL_TOPIC#UNIQ_KEY, transaction type COMMIT, the same original half), and
    a check pass asks the
    same before it checks a half: a broker killed, or a DLedger leader deposed, between storing
    the committed message and its op record then writes the op record only, where RocketMQ
    would commit the message again.
A commit whose op record then fails to be stored is still a commit (answered SUCCESS, remembered
here; the index check covers a restart), as RocketMQ answers with the commit's result.
Named limits: without messageIndexEnable the second point does not hold; the memory of ended
transactions keeps at most ENDED_MAX of them (the oldest go first; the index check still stops a
second commit of a forgotten one), and a (re)started supervisor reads up to fileReservedTime of
the op queue (two record reads per op) before its first END_TRANSACTION or check."""
from __future__ import annotations

import asyncio
import logging
import time

from mq.remoting import ResponseCode as RC
from mq.store import PutStatus, StoreError
from mq.store.index import IndexReader
from mq.wire import commitlog as wcl
from mq.wire.errors import WireError
from mq.wire.msgid import offset_msg_id
from mq.wire.properties import decode_properties, encode_properties
from mq.wire.topics import SCHEDULE_TOPIC

log = logging.getLogger("mq.broker.transaction")

HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
OP_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
CHECK_MAX_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
CHECK_GROUP = "CID_SYS_RMQ_TRANS"
REMOVE_TAG = "d"
# properties (MessageConst)
TRAN_MSG = "TRAN_MSG"
PGROUP = "PGROUP"
REAL_TOPIC = "REAL_TOPIC"
REAL_QID = "REAL_QID"
UNIQ_KEY = "UNIQ_KEY"
CHECK_TIMES = "TRANSACTION_CHECK_TIMES"
CHECK_IMMUNITY_S = "CHECK_IMMUNITY_TIME_IN_SECONDS"
PREPARED_QUEUE_OFFSET = "TRAN_PREPARED_QUEUE_OFFSET"
PASS_TIME_MAX_S = 60.0            # MAX_PROCESS_TIME_LIMIT: one pass stops after this
PASS_BATCH = 64                   # queue entries read at a time
ENDED_MAX = 1_000_000             # ended transactions remembered (module docstring)
DISPATCH_WAIT_S = 2.0             # END_TRANSACTION waits this long for its half's queue entry


def is_half(props: dict) -> bool:
    """Is a send with these properties a half message?  (Boolean.parseBoolean of TRAN_MSG.)"""
    v = props.get(TRAN_MSG)
    return v is not None and v.strip().lower() == "true"


def half_properties(props: dict, topic: str, queue_id: int) -> dict:
    """A half's properties: the send's, with where it goes once committed."""
    props[REAL_TOPIC] = topic
    props[REAL_QID] = str(queue_id)
    return props


def _int(text, default: int) -> int:
    try:
        return int(str(text).strip())
    except (TypeError, ValueError):
        return default


class TransactionService:
    """The supervisor's side: END_TRANSACTION (end) and the check pass (check_pass).  Both run
    on the supervisor's event loop, which is what makes `ended` exact (module docstring)."""

    def __init__(self, sup):
        self.sup = sup
        self.store = sup.store
        self.config = sup.config
        self.metadata = sup.metadata
        # original half's queue offset -> time.monotonic() it ended here or was read back (oldest first)
        self.ended: dict[int, float] = {}
        self._ending: dict[int, asyncio.Future] = {}     # being ended now: a second END waits for the first
        scfg = sup.config.store_config()
        self.index = (IndexReader(scfg.storePathRootDir, scfg.maxHashSlotNum, scfg.maxIndexNum)
                      if scfg.messageIndexEnable else None)
        self._op_cursor: int | None = None     # the next op queue offset read into `ended`
        self.checks_sent = 0
        self.discarded = 0

    # ---- reading -----------------------------------------------------------------------------
    def _record(self, phy: int, size: int = 0, queue_id: int | None = None, queue_offset: int | None = None,
                topic: str | None = None):
        view = (self.store.read_entry(self.store.cqs.get(topic, queue_id), queue_offset, phy, size, topic.encode())
                if size else self.store.read_filed(phy))
        return wcl.parse_record(view)

    def _half_at(self, queue_offset: int):
        """The half at HALF_TOPIC:0 `queue_offset`, or None (not there, or damaged)."""
        e = self.store.cqs.get(HALF_TOPIC, 0).entry(queue_offset)
        if e is None:
            return None
        try:
            return self._record(e[0], e[1], 0, queue_offset, HALF_TOPIC)
        except StoreError as err:
            log.error("half message %d at %d is damaged: %s", queue_offset, e[0], err)
            return None

    @staticmethod
    def root_of(half, props: dict) -> int:
        """The queue offset of the transaction's original half: a copy names it."""
        root = _int(props.get(PREPARED_QUEUE_OFFSET), -1)
        return root if root >= 0 else half.queue_offset

    def _remember(self, root: int) -> None:
        self.ended.pop(root, None)               # to the end: the dict stays oldest first
        self.ended[root] = time.monotonic()
        if len(self.ended) > ENDED_MAX:
            for r in list(self.ended)[:ENDED_MAX // 10]:
                del self.ended[r]

    def uniq_of(self, rec, props: dict) -> str:
        return props.get(UNIQ_KEY) or self._offset_id(rec.physical_offset)

    def _offset_id(self, phy: int) -> str:
        return offset_msg_id(self.store.store_host, self.store.store_port, phy)

    def _horizon_s(self) -> float:
        return self.store.config.fileReservedTime * 3600.0

    def read_ops(self) -> None:
        """Adds the transactions of op records not read yet to `ended`; at the first call from
        the check position, or from fileReservedTime ago when that is earlier."""
        cq = self.store.cqs.get(OP_TOPIC, 0)
        if self._op_cursor is None:
            start = self.metadata.query_offset(CHECK_GROUP, OP_TOPIC, 0)
            if cq.max_offset > cq.min_offset:
                since = self.store.search_offset_by_time(OP_TOPIC, 0, int((time.time() - self._horizon_s()) * 1000))
                start = since if start is None else min(start, since)
            self._op_cursor = max(start or 0, cq.min_offset)
        now = time.monotonic()
        while self._op_cursor < cq.max_offset:
            entries = cq.get(self._op_cursor, PASS_BATCH)
            if not entries:
                self._op_cursor = max(self._op_cursor, cq.min_offset)
                if self._op_cursor >= cq.max_offset or not cq.get(self._op_cursor, 1):
                    break
                continue
            for phy, size, _ in entries:
                try:
                    op = self._record(phy, size, 0, self._op_cursor, OP_TOPIC)
                except StoreError as err:
                    log.error("op record %d at %d is damaged and skipped: %s", self._op_cursor, phy, err)
                else:
                    half = self._half_at(_int(bytes(op.body).decode("ascii", "replace"), -1))
                    if half is not None:
                        self.ended.setdefault(self.root_of(half, decode_properties(half.properties)), now)
                self._op_cursor += 1
        horizon = now - self._horizon_s()
        if self.ended and next(iter(self.ended.values())) < horizon:
            self.ended = {u: t for u, t in self.ended.items() if t >= horizon}

    # ---- END_TRANSACTION ---------------------------------------------------------------------------
    async def end(self, h: dict) -> tuple[int, str | None]:
        """An END_TRANSACTION whose header the io worker parsed: (response code, remark)."""
        if not self.sup.writable():
            return RC.SLAVE_NOT_AVAILABLE, "this broker does not take writes now (a slave or a DLedger follower)"
        kind, phy = h["commitOrRollback"], h["commitLogOffset"]
        try:
            rec = self._record(phy)
        except StoreError as err:
            log.warning("END_TRANSACTION for %d: %s", phy, err)
            rec = None
        if rec is None or rec.topic != HALF_TOPIC:
            return RC.SYSTEM_ERROR, "Find prepared transaction message failed"
        props = decode_properties(rec.properties)
        # EndTransactionProcessor.checkPrepareMessage
        if props.get(PGROUP) != h["producerGroup"]:
            return RC.SYSTEM_ERROR, "The producer group wrong"
        if rec.queue_offset != h["tranStateTableOffset"]:
            return RC.SYSTEM_ERROR, "The transaction state table offset wrong"
        if rec.physical_offset != phy:
            return RC.SYSTEM_ERROR, "The commit log offset wrong"
        # ours: the half queue must name that record too (RocketMQ trusts any record at the offset,
        # so a "half" forged inside another message's body could be committed)
        cq = self.store.cqs.get(HALF_TOPIC, 0)
        deadline = time.monotonic() + DISPATCH_WAIT_S
        while cq.max_offset <= rec.queue_offset and time.monotonic() < deadline:
            await asyncio.sleep(0.002)           # an END right after its half: the entry is being dispatched
        entry = cq.entry(rec.queue_offset)
        if entry is None or entry[0] != phy:
            return RC.SYSTEM_ERROR, "The commit log offset wrong"
        self.read_ops()
        root = self.root_of(rec, props)
        what = "commit" if kind == wcl.TRANSACTION_COMMIT else "rollback"
        if root in self.ended:
            log.info("transaction %s (half %d) ended already; END_TRANSACTION (%s) for half %d changes nothing",
                     self.uniq_of(rec, props), root, what, rec.queue_offset)
            return RC.SUCCESS, None
        pending = self._ending.get(root)
        if pending is not None:                  # being ended by another END_TRANSACTION: its outcome
            return await asyncio.shield(pending)
        pending = self._ending[root] = asyncio.get_running_loop().create_future()
        outcome: tuple[int, str | None] = (RC.SYSTEM_ERROR, "UNKNOWN_ERROR")
        try:
            outcome = await self._end(rec, props, root, kind)
        finally:
            del self._ending[root]
            pending.set_result(outcome)
        return outcome

    async def _end(self, rec, props: dict, root: int, kind: int) -> tuple[int, str | None]:
        if kind == wcl.TRANSACTION_COMMIT:
            if self.committed_already(rec, props):
                log.warning("transaction %s (half %d) is in %s already (its op record was lost): not committed "
                            "again", self.uniq_of(rec, props), root, props.get(REAL_TOPIC))
            else:
                code, remark = await self._commit(rec, dict(props))
                if code != RC.SUCCESS:
                    return code, remark
            self._remember(root)                 # committed: whatever happens to its op record
        code, remark = await self._put_op(rec)
        if code == RC.SUCCESS:
            self._remember(root)
        elif kind == wcl.TRANSACTION_COMMIT:
            log.error("transaction %s (half %d) committed, but its op record was not stored (%s): remembered "
                      "here, and the message index stops a second commit after a restart",
                      self.uniq_of(rec, props), root, remark)
            return RC.SUCCESS, None
        return code, remark

    def committed_already(self, half, props: dict) -> bool:
        """Does the real topic hold this transaction's committed message (the message index's
        REAL_TOPIC#UNIQ_KEY entries, each checked against its record)?"""
        topic, uniq = props.get(REAL_TOPIC), props.get(UNIQ_KEY)
        if self.index is None or not topic or not uniq:
            return False
        root = self.root_of(half, props)
        for phy in self.index.query(topic, uniq, 16, half.store_timestamp_ms - 3600_000, 2 ** 62):
            try:
                rec = wcl.parse_record(self.store.read_filed(phy))
            except (StoreError, WireError):
                continue
            c_props = decode_properties(rec.properties)
            if (rec.topic != topic or rec.sys_flag & wcl.TRANSACTION_MASK != wcl.TRANSACTION_COMMIT
                    or c_props.get(UNIQ_KEY) != uniq):
                continue
            # the same transaction, not another one whose producer reused the message (and its
            # UNIQ_KEY): committed from a copy, it names the original half; from the original, it
            # points at it (PREPARED_TRANSACTION_OFFSET)
            c_root = _int(c_props.get(PREPARED_QUEUE_OFFSET), -1)
            if c_root < 0:
                try:
                    c_root = self._record(rec.prepared_transaction_offset).queue_offset
                except (StoreError, WireError):
                    return True              # its half is gone: assume it is this one (never commit twice)
            if c_root == root:
                return True
        return False

    async def _commit(self, rec, props: dict) -> tuple[int, str | None]:
        topic = props.pop(REAL_TOPIC, None)
        qid = _int(props.pop(REAL_QID, None), -1)
        props.pop(TRAN_MSG, None)
        if not topic or qid < 0:
            return RC.SYSTEM_ERROR, "the half message names no REAL_TOPIC / REAL_QID"
        sys_flag = (rec.sys_flag & ~wcl.TRANSACTION_MASK) | wcl.TRANSACTION_COMMIT
        store_topic, store_qid = topic, qid
        delay = _int(props.get("DELAY"), 0)
        if delay > 0:                 # CommitLog.putMessage: a committed message may be delayed
            props[REAL_TOPIC], props[REAL_QID] = topic, str(qid)
            store_topic, store_qid = SCHEDULE_TOPIC, min(delay, len(self.store.config.delay_levels_ms)) - 1
        return await self._put(store_topic, store_qid, rec.body, props, flag=rec.flag, sys_flag=sys_flag,
                               born_ts_ms=rec.born_timestamp_ms, born_host=rec.born_host, born_port=rec.born_port,
                               reconsume_times=rec.reconsume_times, prepared_tx_offset=rec.physical_offset)

    async def _put_op(self, half) -> tuple[int, str | None]:
        return await self._put(OP_TOPIC, 0, str(half.queue_offset).encode(), {"TAGS": REMOVE_TAG},
                               born_ts_ms=int(time.time() * 1000), born_host=self.store.store_host,
                               born_port=self.store.store_port)

    async def _put(self, topic: str, queue_id: int, body: bytes, props: dict, **kw) -> tuple[int, str | None]:
        """One store write, waited for as a send is (flush; DLedger: the commit); SendMessageProcessor's
        success codes (a slave or flush timeout is still stored) answer SUCCESS."""
        if self.sup.disk.full:               # as every send is refused (mq.store.retention)
            return RC.SERVICE_NOT_AVAILABLE, "service not available now: the disk is full"
        if topic in (OP_TOPIC, CHECK_MAX_TOPIC):
            self.metadata.create_system_topic(topic, 1)      # made on first use (never a real topic: its
                                                             # config is the producer's, or a follower's to learn)
        r = await self.store.put_async(topic, queue_id, body, encode_properties(props), wait=True, **kw)
        if r.status is PutStatus.PUT_OK and self.sup.dledger:
            res = r.result
            outcome = await self.sup.commit_waiter.wait_async(res.end_offset, res.dl_term(0),
                                                              self.config.maxWaitAckTimeMs / 1000)
            if outcome != "ok":
                return RC.SYSTEM_ERROR, f"UNKNOWN_ERROR: not committed ({outcome})"
        if r.status in (PutStatus.PUT_OK, PutStatus.FLUSH_DISK_TIMEOUT):
            return RC.SUCCESS, None
        from .send import send_status
        code, remark, _ = send_status(r)
        return code, remark or r.status.name

    # ---- the check pass ---------------------------------------------------------------------------
    async def check_pass(self) -> None:
        """One pass over the halves (module docstring); RocketMQ's check(), with `ended` in place of
        its op-queue window."""
        cfg = self.config
        cq = self.store.cqs.get(HALF_TOPIC, 0)
        if cq.max_offset == 0:
            return
        self.read_ops()
        start_ms = int(time.time() * 1000)
        deadline = time.monotonic() + PASS_TIME_MAX_S
        i = max(self.metadata.query_offset(CHECK_GROUP, HALF_TOPIC, 0) or 0, cq.min_offset)
        begin = i
        reserved_ms = self.store.config.fileReservedTime * 3600 * 1000
        try:
            while i < cq.max_offset and time.monotonic() < deadline:
                half = self._half_at(i)
                if half is None:
                    i += 1                          # damaged (logged): never checked, never committed
                    continue
                props = decode_properties(half.properties)
                root = self.root_of(half, props)
                if root in self.ended or root in self._ending:
                    i += 1
                    continue
                if self.committed_already(half, props):
                    # committed, its op record lost (a crash or a leader change between the two)
                    code, remark = await self._put_op(half)
                    if code != RC.SUCCESS:
                        break
                    self._remember(root)
                    i += 1
                    continue
                now_ms = int(time.time() * 1000)
                age_ms = now_ms - half.born_timestamp_ms
                times = _int(props.get(CHECK_TIMES), 0)
                if times >= cfg.transactionCheckMax or age_ms > reserved_ms:
                    if not await self._discard(half, props):
                        break
                    i += 1
                    continue
                if half.store_timestamp_ms >= start_ms:
                    break                           # stored during this pass
                immunity_s = props.get(CHECK_IMMUNITY_S)
                immunity_ms = cfg.transactionTimeOut
                if immunity_s is not None:
                    n = _int(immunity_s, -1)
                    immunity_ms = cfg.transactionTimeOut if n == -1 else n * 1000
                    if age_ms < immunity_ms:
                        # not checked yet: kept at the end of the queue (RocketMQ's immunity copy)
                        props.setdefault(PREPARED_QUEUE_OFFSET, str(half.queue_offset))
                        if await self._put_back(half, props) is None:
                            break
                        i += 1
                        continue
                elif 0 <= age_ms < immunity_ms:
                    break                           # too young: everything after it is younger still
                props[CHECK_TIMES] = str(times + 1)
                props.setdefault(PREPARED_QUEUE_OFFSET, str(half.queue_offset))    # the copy names the original
                copy = await self._put_back(half, props)
                if copy is None:
                    break
                self._send_check(half, props, copy)
                i += 1
        finally:
            if i != begin:
                self.metadata.commit_offset(CHECK_GROUP, HALF_TOPIC, 0, i)
            if self._op_cursor is not None:
                self.metadata.commit_offset(CHECK_GROUP, OP_TOPIC, 0, self._op_cursor)

    async def _put_back(self, half, props: dict):
        """The half stored again at the end of its queue (renewHalfMessageInner); (queue offset,
        CommitLog offset) of the copy, or None when it could not be stored (the pass stops)."""
        r = await self.store.put_async(HALF_TOPIC, 0, half.body, encode_properties(props), wait=True,
                                       flag=half.flag, sys_flag=half.sys_flag, born_ts_ms=half.born_timestamp_ms,
                                       born_host=half.born_host, born_port=half.born_port,
                                       reconsume_times=half.reconsume_times)
        if r.status is not PutStatus.PUT_OK:
            log.error("half message %d could not be stored again (%s): the check pass stops", half.queue_offset,
                      r.reason or r.status.name)
            return None
        res = r.result
        if self.sup.dledger:
            outcome = await self.sup.commit_waiter.wait_async(res.end_offset, res.dl_term(0),
                                                              self.config.maxWaitAckTimeMs / 1000)
            if outcome != "ok":
                log.warning("half message %d: its copy was not committed (%s)", half.queue_offset, outcome)
                return None
        return res.queue_offset(0), res.phy_offset(0), res.msg_id(0), res.store_ts_ms(0)

    async def _discard(self, half, props: dict) -> bool:
        """resolveDiscardMsg: checked too often or too old: kept in CHECK_MAX_TOPIC, never delivered."""
        log.error("half message %d (transaction %s of %s) checked %s time(s), born %d: moved to %s",
                  half.queue_offset, props.get(UNIQ_KEY), props.get(PGROUP), props.get(CHECK_TIMES, "0"),
                  half.born_timestamp_ms, CHECK_MAX_TOPIC)
        code, remark = await self._put(CHECK_MAX_TOPIC, 0, half.body, props, flag=half.flag, sys_flag=half.sys_flag,
                                       born_ts_ms=half.born_timestamp_ms, born_host=half.born_host,
                                       born_port=half.born_port, reconsume_times=half.reconsume_times)
        if code != RC.SUCCESS:
            log.error("half message %d not moved to %s: %s", half.queue_offset, CHECK_MAX_TOPIC, remark)
            return False
        self.discarded += 1
        # not remembered as ended: an END_TRANSACTION that arrives after all still commits or rolls
        # it back (as RocketMQ's does); no copy of it comes after this one, so no check asks again
        return True

    def _send_check(self, half, props: dict, copy) -> None:
        """CHECK_TRANSACTION_STATE (39) about the copy, to one live connection of the producer
        group (through the io worker holding it); none: the next pass checks again."""
        queue_offset, phy, msg_id, store_ts = copy
        group = props.get(PGROUP, "")
        target = self.metadata.producer_conn(group)
        if target is None:
            log.warning("transaction %s of group %s: no producer of the group is connected; checked later",
                        props.get(UNIQ_KEY), group)
            return
        real_topic, real_qid = props.get(REAL_TOPIC, half.topic), _int(props.get(REAL_QID), 0)
        uniq = props.get(UNIQ_KEY, "")
        body = wcl.build_record(body=bytes(half.body), topic=real_topic, properties=props, queue_id=real_qid,
                                flag=half.flag, queue_offset=queue_offset, physical_offset=phy,
                                sys_flag=half.sys_flag, born_timestamp_ms=half.born_timestamp_ms,
                                born_host=half.born_host, born_port=half.born_port, store_timestamp_ms=store_ts,
                                store_host=half.store_host, store_port=half.store_port,
                                reconsume_times=half.reconsume_times)
        ext = {"tranStateTableOffset": str(queue_offset), "commitLogOffset": str(phy), "msgId": uniq,
               "transactionId": uniq, "offsetMsgId": msg_id}
        self.sup.push_check(target, ext, body)
        self.checks_sent += 1

    def pending(self) -> int:
        """Half messages from the check position on (copies included): the metrics' pending count."""
        cq = self.store.cqs.get(HALF_TOPIC, 0)
        pos = max(self.metadata.query_offset(CHECK_GROUP, HALF_TOPIC, 0) or 0, cq.min_offset)
        return max(0, cq.max_offset - pos)


async def check_loop(service: TransactionService) -> None:
    """TransactionalMessageCheckService: a pass every transactionCheckInterval while this broker
    takes writes."""
    while True:
        await asyncio.sleep(service.config.transactionCheckInterval / 1000)
        if not service.sup.writable() or service.sup.disk.full:
            continue
        try:
            await service.check_pass()
        except Exception:
            log.exception("transaction check pass failed; next pass in %d ms", service.config.transactionCheckInterval)
