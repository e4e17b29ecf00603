"""The pull role: PULL_MESSAGE (11) with long polling.

Lookup statuses and their codes follow RocketMQ (spec 2.3):
  no queue / empty queue   -> 21 PULL_OFFSET_MOVED (19 when offset == 0)
  offset < min             -> 21 with nextBeginOffset = min
  offset == max            -> 19 PULL_NOT_FOUND (long-pollable)
  offset > max             -> 21 with nextBeginOffset = max
  all scanned filtered out -> 20 PULL_RETRY_IMMEDIATELY, nextBeginOffset advanced
  found                    -> 0, body = the stored records concatenated
Filtering is by tag *strings* from the subscription (their Java hashes
against the ConsumeQueue tags code): the C++ client sends zero hash codes.

Every record served is checked whole in C first (CommitLog.read_record: lengths,
BODYCRC, PHYSICALOFFSET): one damaged since it was written -- on disk, or in memory
under a live broker -- is skipped like a filtered message, logged once and counted,
never served.

Long polling: a PULL_NOT_FOUND with the SUSPEND flag is parked per
(topic, queueId) and re-run the moment dispatch makes the queue grow.  The
dispatch role bumps the SEQ_DISPATCH futex in the control block; while pulls
are parked it rings the worker's bell (mq.store.bells) and the event loop
checks only the queues that have parked pulls.  Without a bell (a store opened
outside a broker's roles) one thread per worker process sleeps on the futex and
hands the wake to the loop.  Bounds: PULLS_HELD_MAX parked pulls per worker
(beyond: answered at once)."""
from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from time import perf_counter_ns

from mq import loop as mq_loop
from mq.remoting import ResponseCode as RC, make_response
from mq.store import CorruptRecord, OutOfRange, control as C
from mq.store.commitlog import INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN
from mq.store.bells import RECHECK_S
from mq.store.consumequeue import ENTRY, ENTRY_SIZE
from mq.store.native import check, ffi, lib
from mq.store.store import TOTAL_PHYSICAL_MEMORY
from mq.wire.commitlog import record_properties
from mq.wire.consumequeue import java_string_hashcode, tags_code_of_properties
from mq.wire.headers import PULL_COMMIT_OFFSET, PULL_SUBSCRIPTION, PULL_SUSPEND
from mq.wire.topics import PERM_READ

from .link import SUBSCRIPTION_CACHE_S
from .send import as_int, header_int
from .sql92 import Sql92Filter, compile_sql92
from .tracing import CURRENT

log = logging.getLogger("mq.broker.pull")

CQ_SCAN_BYTES_MIN = 16000
# an SQL92-filtered pull stops scanning after this much evaluation (checked every SQL_CHECK_EVERY
# records) and answers with what it found, nextBeginOffset where it stopped: a costly filter over
# records that do not match cannot hold the io worker (and its other connections) for long
SQL_SCAN_BUDGET_NS = lib.MQ_FAST_SQL_SCAN_BUDGET_NS     # 5 ms (declared once: C's path stops alike)
SQL_CHECK_EVERY = lib.MQ_FAST_SQL_CHUNK                 # 32
PULLS_HELD_MAX = 100_000
STOP_WAKES_MAX = 40                # stop() wakes the watch thread every 50 ms, 2 s at most
DAMAGED_REPORTED_MAX = 10_000      # damaged records remembered as reported (one log line each)
CODES_CACHED_MAX = 1024            # tag-hash sets kept as C arrays for the gather (one per subscription seen)
SQL_VERDICTS_MAX = 4096            # an SQL92 filter's verdicts kept, by the values of the properties it reads
_MISSING = object()


def compile_filter(expression_type: str | None, sub: str | None):
    """A pull's filter: None (everything), the hash codes of a TAG expression (a frozenset), or an
    Sql92Filter; raises Sql92Error for an SQL92 text that does not parse, ValueError for a type
    that is neither.  Whether SQL92 is allowed (enablePropertyFilter) is the caller's check."""
    kind = (expression_type or "TAG").upper()
    if kind == "TAG":
        return parse_subscription(sub)
    if kind == "SQL92":
        return compile_sql92(sub)
    raise ValueError(f"expression type {expression_type!r} is neither TAG nor SQL92")


def parse_subscription(sub: str | None) -> frozenset | None:
    """'*' or empty -> None (everything); 'TagA || TagB' -> their hash codes."""
    if sub is None:
        return None
    sub = sub.strip()
    if sub in ("", "*"):
        return None
    return frozenset(java_string_hashcode(t.strip()) for t in sub.split("||") if t.strip())


class PullHoldService:
    """Parked pulls, woken when dispatch moves (SEQ_DISPATCH: the worker's bell, or a thread on
    the futex)."""

    def __init__(self, store, loop: asyncio.AbstractEventLoop, bell=None):
        """bell: the worker's (mq.store.bells), attached to `loop`.  None: a thread watches the
        futex."""
        self.store = store
        self.loop = loop
        self.held: dict[tuple[str, int], list[tuple[int, asyncio.Future]]] = {}
        self.count = 0
        self._stop = False
        self._parked = threading.Event()    # set while any pull is parked
        self._bell = bell
        self._dispatch_seen: int | None = None     # SEQ_DISPATCH at the last look (bell path)
        self._looked_at = 0.0                      # time.monotonic() of that look
        self._thread: threading.Thread | None = None
        if bell is not None:
            bell.add(C.SEQ_DISPATCH, self.ring)
        else:
            self._thread = threading.Thread(target=self._watch, name="pull-hold", daemon=True)
            self._thread.start()

    def ring(self) -> None:
        """(the bell's loop) Re-checks the parked pulls if dispatch moved since the last look, or
        the last look is RECHECK_S old (a queue moved without a wake, as the thread's futex
        timeout caught): the bell also rings for the worker's flush, ack and commit waits, and
        a look visits every parked queue.  The sequence is read before the queues, so a
        dispatch after the read is seen by the next ring."""
        if not self.held:
            return
        seen = self.store.ctl.seq(C.SEQ_DISPATCH)
        now = time.monotonic()
        if seen == self._dispatch_seen and now - self._looked_at < RECHECK_S:
            return
        self._dispatch_seen, self._looked_at = seen, now
        self._check()

    def _parking(self, on: bool) -> None:
        if on:
            self._parked.set()
        else:
            self._parked.clear()
        if self._bell is not None:
            self._bell.want(C.SEQ_DISPATCH, on)

    def _watch(self) -> None:
        ctl = self.store.ctl
        while not self._stop:
            # with nothing parked, do not wake (and take the GIL) on every dispatch
            if not self._parked.wait(1.0) or self._stop:
                continue
            seen = ctl.seq(C.SEQ_DISPATCH)
            ctl.wait(C.SEQ_DISPATCH, seen, 1000)
            if self.held:
                try:
                    self.loop.call_soon_threadsafe(self._check)
                except RuntimeError:
                    return   # loop closed

    def _check(self) -> None:
        for key in list(self.held):
            waiters = self.held.get(key)
            if not waiters:
                self.held.pop(key, None)
                continue
            max_off = self.store.max_offset(*key)
            keep = []
            for offset, fut in waiters:
                if fut.done():
                    continue
                if max_off > offset:
                    fut.set_result(True)
                else:
                    keep.append((offset, fut))
            if keep:
                self.held[key] = keep
            else:
                del self.held[key]
        self.count = sum(len(v) for v in self.held.values())
        if not self.held:
            self._parking(False)

    async def hold(self, topic: str, queue_id: int, offset: int, timeout_s: float) -> bool:
        """Waits until the queue has a message at `offset` or the timeout; True if it does."""
        if self.count >= PULLS_HELD_MAX or self._stop:
            return False
        key = (topic, queue_id)
        entry = (offset, self.loop.create_future())
        self.held.setdefault(key, []).append(entry)
        self.count += 1
        self._parking(True)                 # then look: a dispatch after this wakes us
        try:
            if self.store.max_offset(topic, queue_id) > offset:   # arrived before we parked
                return True
            return await mq_loop.wait_for(entry[1], timeout_s)
        except asyncio.TimeoutError:
            return False
        finally:
            # leave the table whatever woke us, so an idle broker's table stays empty
            waiters = self.held.get(key)
            if waiters and entry in waiters:
                waiters.remove(entry)
                self.count -= 1
                if not waiters:
                    del self.held[key]
            if not self.held:
                self._parking(False)

    def stop(self) -> None:
        """Answers the parked pulls and returns once the watch thread has left the control
        block: the store is closed next, and a thread still inside it would call into a
        closed handle (a TypeError at every Ctrl-C) or wait on unmapped memory."""
        self._stop = True
        self._parked.set()
        if self._thread is not None:
            for _ in range(STOP_WAKES_MAX):     # it may have read the sequence just before the wake
                self.store.ctl.wake(C.SEQ_DISPATCH)
                self._thread.join(0.05)
                if not self._thread.is_alive():
                    break
        if self._bell is not None:
            self._bell.want(C.SEQ_DISPATCH, False)
        for waiters in self.held.values():
            for _, fut in waiters:
                if not fut.done():
                    fut.set_result(False)
        self.held.clear()


class PullProcessor:
    def __init__(self, broker):
        self.broker = broker
        self.config = broker.config
        self.store = broker.store
        self.meta = broker.meta
        self.hold_service: PullHoldService | None = None
        self._sub_codes: dict = {}
        self.stats = getattr(broker, "stats", None)     # mq.broker.iostats.IoStats, or None (no stats block)
        self.damaged_records = 0                        # reads the check refused (never served)
        self._damaged_seen: set[int] = set()            # CommitLog offsets already reported
        self._gather_buf: bytearray | None = None       # the C gather's output (maxTransferBytesOnMessageInMemory)
        self._codes_c: dict = {}                        # tag-hash frozenset -> its sorted int64[] (the gather's filter)
        self._sql_c: dict = {}                          # Sql92Filter -> its _SqlPlan
        self.fast = getattr(broker, "fast", None)       # the C path (mq.broker.fastsend), or None

    def start(self, loop, bell=None) -> None:
        self.hold_service = PullHoldService(self.store, loop, bell)

    def stop(self) -> None:
        if self.hold_service:
            self.hold_service.stop()

    def handle(self, conn, cmd):
        """PULL_MESSAGE.  The fast path answers inside the read (no Task) when everything it
        needs is in this worker's caches - group, topic, subscription - and the pull finds data
        or is not to be held; otherwise the full path (process) runs as a Task: it fetches what
        is missing and parks a long poll.  The checks are process's, in its order."""
        h = cmd.ext_fields
        if not h:
            return self.process(conn, cmd)
        meta = self.meta
        try:
            group = h["consumerGroup"]
            topic = h["topic"]
            qid = int(h["queueId"])
            offset = int(h["queueOffset"])
            max_nums = h.get("maxMsgNums")
            max_nums = max(1, int(max_nums)) if max_nums else 32
            sys_flag = h.get("sysFlag")
            sys_flag = int(sys_flag) if sys_flag else 0
            sub_version = h.get("subVersion")
            sub_version = int(sub_version) if sub_version else 0
            commit = h.get("commitOffset")
            commit = int(commit) if commit else 0
            suspend_ms = h.get("suspendTimeoutMillis")
            suspend_ms = int(suspend_ms) if suspend_ms else 15000
        except (KeyError, ValueError):          # the full path names the bad field
            return self.process(conn, cmd)
        if not (INT32_MIN <= qid <= INT32_MAX and INT32_MIN <= max_nums <= INT32_MAX
                and INT32_MIN <= sys_flag <= INT32_MAX and INT64_MIN <= offset <= INT64_MAX
                and INT64_MIN <= commit <= INT64_MAX and INT64_MIN <= suspend_ms <= INT64_MAX
                and INT64_MIN <= sub_version <= INT64_MAX):
            return self.process(conn, cmd)      # past its Java type: so does the full path, naming it
        cfg = self.config
        g = meta._groups.get(group)
        tc = meta.cached_topics.get(topic)
        if (g is None or tc is None or not cfg.brokerPermission & PERM_READ or not g.get("consumeEnable", True)
                or not tc["perm"] & PERM_READ or qid < 0 or qid >= tc["readQueueNums"]):
            return self.process(conn, cmd)
        if sys_flag & PULL_SUBSCRIPTION:
            kind, text = h.get("expressionType") or "TAG", h.get("subscription")
            hit = None
        else:
            hit = meta._subs.get((group, topic))
            if hit is None or hit[1] is None or time.monotonic() - hit[0] >= SUBSCRIPTION_CACHE_S \
                    or hit[1]["subVersion"] < sub_version:
                return self.process(conn, cmd)
            kind, text = hit[1].get("expressionType", "TAG"), hit[1]["subString"]
        if kind != "TAG" and (kind.upper() != "SQL92" or not cfg.enablePropertyFilter):
            return self.process(conn, cmd)              # its refusal comes from the full path
        fast = self.fast
        if fast is not None and fast.pulls_on:
            fast.publish_group(group)                   # C answers this group's pulls of this topic
            fast.publish(topic, tc)                     # that find data from the next one on
        try:
            codes = self._codes(kind, text)
        except ValueError:                              # Sql92Error too: named by the full path
            return self.process(conn, cmd)
        if fast is not None and fast.pulls_on:
            if hit is not None:                         # pulls relying on this subscription, while fresh
                fast.publish_sub(group, topic, hit, codes)
            elif codes.__class__ is Sql92Filter and kind == "SQL92":
                fast.publish_sql(codes)                 # its pulls, once C holds their verdicts
        if sys_flag & PULL_COMMIT_OFFSET and cfg.brokerRole != "SLAVE":
            meta.commit_offset_nowait(group, topic, qid, commit)
        code, status, next_off, lo, hi, body, last_phy = self.get_messages(topic, qid, offset, max_nums, codes, group)
        if code == RC.PULL_NOT_FOUND and sys_flag & PULL_SUSPEND and self.hold_service is not None:
            return self._held(conn, cmd, g, topic, qid, offset, max_nums, codes, suspend_ms)
        ext = {"suggestWhichBrokerId": self.suggest_broker(g, last_phy), "nextBeginOffset": next_off,
               "minOffset": lo, "maxOffset": hi}
        return make_response(cmd, code, status, ext, body)

    def check_client_config(self, conn, cmd):
        """CHECK_CLIENT_CONFIG (46): a consumer about to subscribe with a filter asks whether this
        broker takes it (ClientManageProcessor.checkClientConfig): SYSTEM_ERROR without
        enablePropertyFilter, SUBSCRIPTION_PARSE_FAILED with the reason for text that does not parse."""
        try:
            body = json.loads(cmd.body) if cmd.body else {}
            sd = body.get("subscriptionData") if isinstance(body, dict) else None
        except ValueError:
            sd = None
        if not isinstance(sd, dict):
            return make_response(cmd, RC.SUCCESS)
        kind = str(sd.get("expressionType") or "TAG")
        if kind.upper() == "TAG":
            return make_response(cmd, RC.SUCCESS)
        if not self.config.enablePropertyFilter:
            return make_response(cmd, RC.SYSTEM_ERROR, f"The broker does not support consumer to filter message by {kind}")
        try:
            compile_filter(kind, sd.get("subString"))
        except ValueError as e:
            return make_response(cmd, RC.SUBSCRIPTION_PARSE_FAILED, str(e))
        return make_response(cmd, RC.SUCCESS)

    def _codes(self, kind: str, sub: str | None):
        """compile_filter, remembered per expression type and text (a failure is not remembered)."""
        cache = self._sub_codes
        key = (kind, sub)
        codes = cache.get(key, _MISSING)
        if codes is _MISSING:
            if len(cache) > 10_000:
                cache.clear()
            codes = cache[key] = compile_filter(kind, sub)
        return codes

    async def _held(self, conn, cmd, g, topic, qid, offset, max_nums, codes, suspend_ms):
        """A long poll the fast path parked: hold, then answer with whatever is there (once
        the connection has room for it: Connection.drained)."""
        hold_s = (suspend_ms if self.config.longPollingEnable else self.config.shortPollingTimeMills) / 1000
        await self.hold_service.hold(topic, qid, offset, hold_s)
        if conn.congested():                 # the answer is built only once the connection has room
            await conn.drained()
            if conn.closed:
                return None
        code, status, next_off, lo, hi, body, last_phy = self.get_messages(topic, qid, offset, max_nums, codes,
                                                                           g.get("groupName"))
        ext = {"suggestWhichBrokerId": self.suggest_broker(g, last_phy), "nextBeginOffset": next_off,
               "minOffset": lo, "maxOffset": hi}
        return make_response(cmd, code, status, ext, body)

    async def process(self, conn, cmd):
        h = cmd.ext_fields or {}
        missing = [k for k in ("consumerGroup", "topic", "queueId", "queueOffset") if k not in h]
        if missing:
            return make_response(cmd, RC.INVALID_PARAMETER, f"bad pull header: {missing[0]} missing")
        group, topic = h["consumerGroup"], h["topic"]
        try:                    # checked against the topic's queues below (29), as a send's
            qid = as_int(h["queueId"])
        except ValueError as e:
            return make_response(cmd, RC.INVALID_PARAMETER, f"bad pull header: {e}")
        # the other integers of PullMessageRequestHeader, each checked against its Java type
        # (Integer or Long): one that does not fit is refused as RocketMQ refuses a header it
        # cannot decode
        offset = header_int(h, "queueOffset", 0, INT64_MIN, INT64_MAX)
        max_nums = max(1, header_int(h, "maxMsgNums", 32))
        sys_flag = header_int(h, "sysFlag", 0)
        commit_offset = header_int(h, "commitOffset", 0, INT64_MIN, INT64_MAX)
        suspend_ms = header_int(h, "suspendTimeoutMillis", 15000, INT64_MIN, INT64_MAX)
        sub_version = header_int(h, "subVersion", 0, INT64_MIN, INT64_MAX)
        if not self.config.brokerPermission & PERM_READ:
            return make_response(cmd, RC.NO_PERMISSION, f"the broker[{self.config.brokerIP1}] pulling message is forbidden")
        g = await self.meta.group(group)
        if g is None:
            return make_response(cmd, RC.SUBSCRIPTION_GROUP_NOT_EXIST, f"subscription group [{group}] does not exist")
        if not g.get("consumeEnable", True):
            return make_response(cmd, RC.NO_PERMISSION, f"subscription group no permission, {group}")
        tc = await self.meta.topic(topic)
        if tc is None and (self.config.brokerRole == "SLAVE" or self.config.enableDLegerCommitLog) \
                and self.store.max_offset(topic, qid) > 0:
            # the replicated data is here but its topic's config is not (the master died before
            # the first metadata sync; a DLedger member leads before it learned the topic):
            # serve the queue read-only rather than refuse data we hold
            tc = {"perm": PERM_READ, "readQueueNums": qid + 1, "writeQueueNums": 0}
        if tc is None:
            return make_response(cmd, RC.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!")
        if not tc["perm"] & PERM_READ:
            return make_response(cmd, RC.NO_PERMISSION, f"the topic[{topic}] pulling message is forbidden")
        if qid < 0 or qid >= tc["readQueueNums"]:
            return make_response(cmd, RC.INVALID_PARAMETER,
                                 f"queueId[{qid}] is illegal, topic:[{topic}] readQueueNums:[{tc['readQueueNums']}]")
        if sys_flag & PULL_SUBSCRIPTION:
            kind, text = h.get("expressionType") or "TAG", h.get("subscription")
        else:
            sub = await self.meta.subscription(group, topic)
            if sub is None:
                return make_response(cmd, RC.SUBSCRIPTION_NOT_EXIST,
                                     f"the consumer's subscription not exist, group: {group}")
            if sub["subVersion"] < sub_version:
                return make_response(cmd, RC.SUBSCRIPTION_NOT_LATEST, "the consumer's subscription not latest")
            kind, text = sub.get("expressionType", "TAG"), sub["subString"]
        if kind.upper() != "TAG" and not self.config.enablePropertyFilter:
            return make_response(cmd, RC.SYSTEM_ERROR,
                                 f"The broker does not support consumer to filter message by {kind}")
        try:
            codes = self._codes(kind, text)
        except ValueError as e:
            log.info("pull of %s for %s: %s expression %r refused: %s", topic, group, kind, text, e)
            return make_response(cmd, RC.SUBSCRIPTION_PARSE_FAILED, "parse the consumer's subscription failed")
        if sys_flag & PULL_COMMIT_OFFSET and self.config.brokerRole != "SLAVE":
            await self.meta.commit_offset(group, topic, qid, commit_offset)

        allow_suspend = bool(sys_flag & PULL_SUSPEND)
        hold_s = (suspend_ms if self.config.longPollingEnable else self.config.shortPollingTimeMills) / 1000
        while True:
            if conn.congested():             # the answer is built only once the connection has room
                await conn.drained()
                if conn.closed:
                    return None
            code, status, next_off, lo, hi, body, last_phy = self.get_messages(topic, qid, offset, max_nums, codes,
                                                                               group)
            if code == RC.PULL_NOT_FOUND and allow_suspend and self.hold_service is not None:
                allow_suspend = False      # a replay answers whatever it finds
                await self.hold_service.hold(topic, qid, offset, hold_s)
                continue
            break
        ext = {"suggestWhichBrokerId": self.suggest_broker(g, last_phy), "nextBeginOffset": next_off,
               "minOffset": lo, "maxOffset": hi}
        return make_response(cmd, code, status, ext, body)

    def suggest_broker(self, group: dict, last_phy: int | None) -> int:
        """RocketMQ's read/write split (spec 5): with slaveReadEnable, a consumer
        reading further behind the newest data than accessMessageInMemoryMaxRatio%
        of RAM is sent to whichBrokerWhenConsumeSlowly, otherwise to the group's
        brokerId; without slaveReadEnable always to the master (0)."""
        cfg = self.config
        if not cfg.slaveReadEnable:
            return 0
        ram = cfg.totalPhysicalMemoryOverride or TOTAL_PHYSICAL_MEMORY
        slow = last_phy is not None and \
            self.store.cl.write_pos - last_phy > ram * cfg.accessMessageInMemoryMaxRatio // 100
        return int(group.get("whichBrokerWhenConsumeSlowly", 1)) if slow else int(group.get("brokerId", 0))

    def _damaged(self, topic: str, qid: int, queue_offset: int, phy: int, size: int) -> None:
        """A record the read check refused (damaged since it was written): never served, logged
        once per record (the set is bounded), counted for the metrics."""
        self.damaged_records += 1
        if phy in self._damaged_seen:
            return
        if len(self._damaged_seen) >= DAMAGED_REPORTED_MAX:
            self._damaged_seen.clear()
        self._damaged_seen.add(phy)
        log.error("damaged record skipped, not served: %s:%d queue offset %d, CommitLog %d (%d bytes) fails its "
                  "check (CRC or lengths); consumers move past it", topic, qid, queue_offset, phy, size)

    def get_messages(self, topic: str, qid: int, offset: int, max_nums: int, codes: "frozenset | Sql92Filter | None",
                     group: str | None = None):
        """(code, status name, nextBeginOffset, min, max, body, physical offset of
        the last entry examined or None).  What is found counts for `group` in the metrics."""
        cq = self.store.cqs.get(topic, qid)
        lo, hi = cq.min_offset, cq.max_offset
        if hi == 0:
            code = RC.PULL_NOT_FOUND if offset == 0 else RC.PULL_OFFSET_MOVED
            return code, "NO_MESSAGE_IN_QUEUE", 0, lo, hi, b"", None
        if offset < lo:
            return RC.PULL_OFFSET_MOVED, "OFFSET_TOO_SMALL", lo, lo, hi, b"", None
        if offset == hi:
            return RC.PULL_NOT_FOUND, "OFFSET_OVERFLOW_ONE", offset, lo, hi, b"", None
        if offset > hi:
            return RC.PULL_OFFSET_MOVED, "OFFSET_OVERFLOW_BADLY", hi, lo, hi, b"", None
        cfg = self.config
        count_max = min(max_nums, cfg.maxTransferCountOnMessageInMemory)
        bytes_max = cfg.maxTransferBytesOnMessageInMemory
        n_entries = max(CQ_SCAN_BYTES_MIN, max_nums * 20) // 20
        if self.store.legacy is None:
            found = self._gather(cq, topic, qid, offset, n_entries, count_max, bytes_max, codes)
            if found is not None:
                n, scanned, body, last_phy = found
                return self._found(topic, group, n, scanned, offset, lo, hi, body, last_phy)
        entries = cq.get(offset, n_entries)
        parts, size, scanned = [], 0, 0
        last_phy = None
        min_phy = self.store.min_phy
        topic_bytes = topic.encode()
        sql = codes if codes.__class__ is Sql92Filter else None
        if sql is not None:
            codes = None
            sql_deadline_ns = perf_counter_ns() + SQL_SCAN_BUDGET_NS
        for phy, msg_size, tags in entries:
            if parts and (len(parts) >= count_max or size + msg_size > bytes_max):
                break
            scanned += 1
            last_phy = phy
            if phy < min_phy:
                continue     # the file behind it was deleted
            if codes is not None and tags not in codes:
                continue
            try:
                view = self.store.read_entry(cq, offset + scanned - 1, phy, msg_size, topic_bytes)
            except OutOfRange:
                continue     # deleted: between a switched store's old log and a later DLedger start
            except CorruptRecord:
                self._damaged(topic, qid, offset + scanned - 1, phy, msg_size)
                continue             # skipped like a filtered message: the consumer moves past it
            if sql is not None:
                if scanned % SQL_CHECK_EVERY == 0 and perf_counter_ns() > sql_deadline_ns:
                    scanned -= 1                 # this one is left for the next pull
                    break
                if not sql.matches_raw(record_properties(view)):
                    continue
            if len(view) != msg_size and parts and size + len(view) > bytes_max:
                scanned -= 1                     # a damaged entry's record, found bigger: the next pull's
                break
            parts.append(view)
            size += len(view)
        return self._found(topic, group, len(parts), scanned, offset, lo, hi, b"".join(parts),
                           last_phy)

    def _found(self, topic: str, group: str | None, n: int, scanned: int, offset: int, lo: int, hi: int,
               body: bytes, last_phy: int | None):
        """get_messages' answer once its n records (body) are gathered from `scanned` entries."""
        next_off = offset + scanned
        if not n:
            return RC.PULL_RETRY_IMMEDIATELY, "NO_MATCHED_MESSAGE", next_off, lo, hi, b"", last_phy
        if self.broker.tracer is not None:
            times = CURRENT.get()
            if times is not None:
                times.msgs = n               # the req record's msgs: messages returned
        if self.stats is not None and group is not None:
            self.stats.got(group, topic, n, len(body))
        return RC.SUCCESS, "FOUND", next_off, lo, hi, body, last_phy

    def _gather(self, cq, topic: str, qid: int, offset: int, n_entries: int, count_max: int, bytes_max: int,
                codes: "frozenset | Sql92Filter | None"):
        """get_messages' loop as C calls (CommitLog.gather): the same entries skipped, filtered,
        checked and copied, the same stops.  (records, entries examined, body, last phy or None),
        or None when the first record does not fit the buffer (get_messages' loop takes it).  A
        record that fails its check is reported and skipped here, as the loop does.  An SQL92
        filter: C gathers up to SQL_CHECK_EVERY records unfiltered per call, within what is left
        of the pull's count and bytes, and Python keeps those whose properties match; the scan
        budget is checked between calls."""
        raw = cq.get_bytes(offset, n_entries)
        if not raw:
            return 0, 0, b"", None
        buf = self._gather_buf
        if buf is None or len(buf) < bytes_max:
            buf = self._gather_buf = bytearray(bytes_max)
        sql = None
        if codes is None:
            arr = None
        elif codes.__class__ is Sql92Filter:
            arr = None
            sql = self._sql_c.get(codes)
            if sql is None:
                if len(self._sql_c) >= CODES_CACHED_MAX:
                    self._sql_c.clear()
                sql = self._sql_c[codes] = _SqlPlan(codes)
            sql_deadline_ns = perf_counter_ns() + SQL_SCAN_BUDGET_NS
            fast = self.fast
            if fast is not None and codes.text in fast.sql_resync:   # C lacked a verdict of this filter's
                fast.sql_resync.discard(codes.text)
                publish = fast.sql_verdict
            else:
                publish = None
        else:
            arr = self._codes_c.get(codes)
            if arr is None:
                if len(self._codes_c) >= CODES_CACHED_MAX:
                    self._codes_c.clear()
                arr = self._codes_c[codes] = ffi.new("int64_t[]", sorted(codes))
        cl, min_phy, topic_bytes = self.store.cl, self.store.min_phy, topic.encode()
        n = size = scanned = 0
        last_phy = None
        total = len(raw) // ENTRY_SIZE
        chunks = []
        while scanned < total:
            part = raw if not scanned else raw[scanned * ENTRY_SIZE:]
            want = count_max - n if sql is None else min(count_max - n, SQL_CHECK_EVERY)
            done, got, nbytes, last, rc = cl.gather(part, min_phy, arr, qid, offset + scanned, topic_bytes, n,
                                                     want, max(0, bytes_max - size), buf)
            if got:
                if sql is None:
                    chunks.append(bytes(memoryview(buf)[:nbytes]))
                    n += got
                    size += nbytes
                else:
                    kept, kept_bytes = sql.keep_matching(buf, nbytes, got, chunks, publish)
                    n += kept
                    size += kept_bytes
            scanned += done
            if last >= 0:
                last_phy = last
            if rc == 0:
                # the gather stopped at the end of the entries, or at the count or byte limit; an
                # SQL92 pull counts only the records kept, so it goes on while it has room
                if sql is None or n >= count_max or not done or perf_counter_ns() > sql_deadline_ns:
                    break
                continue
            if rc == lib.MQ_E_FULL:
                if n:
                    break
                return None
            phy, msg_size, _ = ENTRY.unpack_from(raw, scanned * ENTRY_SIZE)
            if rc not in (lib.MQ_E_CORRUPT, lib.MQ_E_RANGE):
                check(rc, f"record at {phy} ({msg_size} bytes)")
            view = None
            try:
                view = self.store.read_entry(cq, offset + scanned, phy, msg_size, topic_bytes)
            except CorruptRecord:
                self._damaged(topic, qid, offset + scanned, phy, msg_size)
            except OutOfRange:
                pass
            if view is not None and _keeps(view, codes):
                # the record of a damaged entry, found near it (the entry's tags code is not trusted)
                if n and size + len(view) > bytes_max:
                    break                # the next pull starts with it
                chunks.append(bytes(view))
                n += 1
                size += len(view)
            scanned += 1                 # else skipped like a filtered message: the consumer moves past it
            last_phy = phy
            if n >= count_max:
                break
        return n, scanned, chunks[0] if len(chunks) == 1 else b"".join(chunks), last_phy


def _keeps(view, codes) -> bool:
    """Does a pull's filter keep this record (by its own properties: a found record of a
    damaged ConsumeQueue entry, whose tags code is not trusted)?"""
    if codes is None:
        return True
    props = record_properties(view)
    if codes.__class__ is Sql92Filter:
        return codes.matches_raw(props)
    return tags_code_of_properties(props) in codes


class _SqlPlan:
    """An SQL92 filter as the gather applies it: the properties it reads are found in C
    (mq_records_props, for a whole gathered run at once) and its verdict is kept by their values,
    so the expression runs once per distinct combination (region = 'eu' over a million records:
    twice), not once per record.  The C pull path keeps the same verdicts (by the same values) for
    the pulls it answers: keep_matching publishes them for a pull C handed back for one it lacked."""
    __slots__ = ("sql", "names", "n_names", "stride", "keys", "key_lens", "spans", "verdicts")

    def __init__(self, sql: Sql92Filter):
        self.sql = sql
        self.names = sql.property_names
        self.n_names = len(self.names)
        self.stride = 2 * (self.n_names + 1)
        encoded = [name.encode() + b"\x01" for name in self.names]
        self.keys = ffi.new("uint8_t[]", b"".join(encoded) or b"\0")
        self.key_lens = ffi.new("uint32_t[]", [len(k) for k in encoded] or [0])
        self.spans = ffi.new("int32_t[]", SQL_CHECK_EVERY * self.stride)
        self.verdicts: dict = {}

    def _judge(self, values) -> bool:
        if self.n_names == 1:
            values = (values,)
        props = {name: v.decode("utf-8", "replace") for name, v in zip(self.names, values) if v is not None}
        verdict = self.sql.matches(props)
        if len(self.verdicts) >= SQL_VERDICTS_MAX:
            self.verdicts.clear()
        self.verdicts[values if self.n_names != 1 else values[0]] = verdict
        return verdict

    def keep_matching(self, buf: bytearray, nbytes: int, got: int, chunks: list, publish=None) -> tuple[int, int]:
        """Of the `got` whole records in buf[:nbytes] (a gather's output, at most SQL_CHECK_EVERY,
        each checked), append those the filter selects to chunks: (records kept, their bytes).
        publish: called with (text, values tuple, verdict) for every record (the C path's verdicts)."""
        assert got <= SQL_CHECK_EVERY
        check(lib.mq_records_props(ffi.from_buffer("uint8_t[]", buf), nbytes, got, self.keys, self.key_lens,
                                   self.n_names, self.spans), "gathered records' properties")
        data = bytes(memoryview(buf)[:nbytes])
        spans = ffi.unpack(self.spans, got * self.stride)
        verdicts, judge, n_names = self.verdicts, self._judge, self.n_names
        kept = kept_bytes = 0
        for base in range(0, got * self.stride, self.stride):
            if n_names == 1:
                at = spans[base + 2]
                values = data[at:at + spans[base + 3]] if at >= 0 else None
            else:
                values = tuple(data[spans[k]:spans[k] + spans[k + 1]] if spans[k] >= 0 else None
                               for k in range(base + 2, base + self.stride, 2))
            verdict = verdicts.get(values)
            if verdict is None:
                verdict = judge(values)
            if publish is not None:
                publish(self.sql.text, (values,) if n_names == 1 else values, verdict)
            if verdict:
                start, size = spans[base], spans[base + 1]
                chunks.append(data[start:start + size])
                kept += 1
                kept_bytes += size
        return kept, kept_bytes
