"""The io worker's C send path (csrc/fastsend.h): one C call per read takes the single sends
Python would only store and answer SUCCESS, one call per event-loop iteration appends them
(one group, one wake of the dispatch and flush roles) and writes their answers, a write per
connection.  Everything else - other codes, sends to a topic not published here, anything
with a property or header field that needs a decision - is handed back at the first such
frame, and Python's send path (mq.broker.send) answers it as it always did.

Python keeps the policy: which topics C may take (published here once SendProcessor.handle
found them in the worker's topic cache and their sends would be stored as they are), whether
the path is used at all and how its answers wait (set_policy, from IoWorker._fast_policy: a
master or DLedger leader, no ACL, brokerPermission with write; answered at once, or held until
flushed, acknowledged or committed; the store's disk-full, take-back and DLedger-term states are
read by C per read), and every refusal and timeout: a send the store refuses, or whose wait
ends badly, comes back from C and is answered here with the code the group path gives.  With
perf tracing, C stamps the sends it takes and keeps their req rows (set_tracer).

Pulls that find data are answered in the same call (fastPullEnable): a pull of a group and a
topic Python published (PullProcessor.handle, once it found both in the worker's caches), with its
TAG expression sent along, is read, gathered and answered by C, one pull per call; Python writes
the answer and does the offset commit and the stats the pull path does.  Every other pull (no
data, a damaged record, a group's subscription from its heartbeat, SQL92, a first record over the
byte limit, ...) is handed back untouched and answered by Python's path as before.

Producer connections served from C (fastConnEnable; csrc/fastconn.h): a TCP connection whose
read C just took whole, with sends and no pull in it, is adopted (`adopt`, the server's adopter
hook): its protocol pauses reading ("adopted") and C reads it from an epoll set the loop watches
(`_poll`, one C call per wake for every readable one: read, walk, one run, the answers sent by C).
C gives it back at the first frame it does not take, at the end of the stream, on an error, a frame
over MQ_FAST_CONN_BUF_MAX or an answer the socket does not take whole; Python takes it back when a
write of its own is not taken whole (Connection.flush), when it closes it, and when the path's
policy changes (set_conns).  The unread bytes C hands back go to the protocol's held bytes, which
it reads first when reading resumes.  With perf tracing, mq_fast_read stamps the frames C reads there
as it stamps those Python hands it.

Limits, named: MQ_FAST_MSGS_MAX sends and MQ_FAST_ARENA_BYTES of properties per run (a read
that fills the stage runs it at once and goes on); MQ_FAST_TOPICS_MAX topics published (past
that, the others keep Python's path until the topic cache is cleared); MQ_FAST_PENDING_MAX
answers held at once, over all connections (past that, sends take Python's path).  Held sends
count against no connection's in-flight bound: one connection can fill the ring, and the others
then take Python's path until it drains.  Pulls: MQ_FAST_GROUPS_MAX groups published (past that,
the others' pulls keep Python's path until the group cache is cleared), MQ_FAST_CQ_MAPS_MAX
ConsumeQueue files mapped (then all are unmapped and mapped again as needed), MQ_FAST_CODES_MAX
tags and MQ_FAST_SUB_TEXT_MAX bytes of an expression."""
from __future__ import annotations

import asyncio
import logging
import selectors
import socket
import time
from time import perf_counter_ns

from mq.loop import USING_UVLOOP
from mq.remoting import RequestCode as R, ResponseCode as RC, make_response
from mq.remoting.server import ADOPTED, UNSENT_BYTES_FLUSH_MAX
from mq.store import PutResult, PutStatus
from mq.store import control as C
from mq.store.native import check, ffi, lib
from mq.store.stats import HIST_BUCKETS
from mq.store.store import put_error
from mq.wire.remoting import FRAME_SIZE_MAX, RemotingCommand
from mq.wire.topics import RETRY_PREFIX, SEND_PROTECTED_TOPICS, TOPIC_LEN_MAX, TOPIC_RE

from .hastatus import slave_ok
from .link import SUBSCRIPTION_CACHE_S
from .send import born_packed, send_status

log = logging.getLogger("mq.broker.fastsend")

MSGS_MAX = lib.MQ_FAST_MSGS_MAX
TRACE_FLUSH_ROWS = lib.MQ_FAST_TRACE_ROWS_MAX - MSGS_MAX      # C's rows are taken past this many
TOPICS_MAX = lib.MQ_FAST_TOPICS_MAX
STOP_END, STOP_HANDBACK, STOP_FULL, STOP_PULLED = (lib.MQ_FAST_END, lib.MQ_FAST_HANDBACK, lib.MQ_FAST_FULL,
                                                   lib.MQ_FAST_PULLED)
GROUPS_MAX = lib.MQ_FAST_GROUPS_MAX
PULL_HEADER_ROOM = lib.MQ_FAST_PULL_HEADER_ROOM
PULL_LIMIT_MAX = 0xFFFFFFFF        # C's count limit is a uint32
SQL_FILTERS_MAX = lib.MQ_FAST_SQL_FILTERS_MAX
SQL_SKIPPED_MAX = 1024             # SQL92 texts remembered as not C's (then forgotten and checked again)
SUBS_MAX = lib.MQ_FAST_SUBS_MAX
CONN_EVENTS_MAX = lib.MQ_FAST_POLL_BATCH + MSGS_MAX    # connections C gives back in a poll or a release, at most
assert lib.MQ_FAST_SENT_BUCKETS == HIST_BUCKETS, "C's poll counts sends in the stats rows' buckets"
GIVE_BACK_WHY = {lib.MQ_FAST_CONN_HANDBACK: "handback", lib.MQ_FAST_CONN_EOF: "eof", lib.MQ_FAST_CONN_ERROR: "error",
                 lib.MQ_FAST_CONN_WRITE: "write", lib.MQ_FAST_CONN_BIG: "big"}
# C stops taking a heartbeat subscription this long before the worker's cache would refresh it
# (its time is a float of seconds here, nanoseconds there): C never answers a pull Python would not
SUB_FRESH_MARGIN_NS = 1_000_000
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
# requests whose handlers append: a connection's sends are appended in the order they came, as
# RocketMQ's one send thread appends them (the full path's awaits aside)
APPENDING_CODES = frozenset((R.SEND_MESSAGE, R.SEND_MESSAGE_V2, R.SEND_BATCH_MESSAGE, R.CONSUMER_SEND_MSG_BACK,
                             R.SEND_REPLY_MESSAGE, R.SEND_REPLY_MESSAGE_V2))


def fast_topic_ok(topic: str) -> bool:
    """May C take sends to `topic`?  Only names whose sends Python's group path stores as they
    are: legal, not protected, not %RETRY% (those may go to %DLQ%)."""
    return (0 < len(topic.encode()) <= TOPIC_LEN_MAX and TOPIC_RE.match(topic) is not None
            and not topic.startswith(RETRY_PREFIX) and topic not in SEND_PROTECTED_TOPICS)


def _backend_fd(loop) -> int | None:
    """The event loop's own epoll set: uvloop's (libuv) or asyncio's EpollSelector; both watch
    level-triggered with each descriptor as the event's data, which mq_fast_poll_wait relies on.
    None for any other loop: then every poll returns to the loop."""
    if USING_UVLOOP:
        get = getattr(loop, "_get_backend_id", None)   # uvloop's, "used by its tests, not API"
        try:
            fd = get() if get is not None else None
        except Exception:              # noqa: BLE001 -- a uvloop without it: poll the plain way
            fd = None
    else:
        sel = getattr(loop, "_selector", None)
        fd = sel.fileno() if isinstance(sel, selectors.EpollSelector) else None
    return fd if isinstance(fd, int) and fd >= 0 else None


class FastSends:
    """The C stage of one io worker (both its servers share it)."""

    def __init__(self, broker, template):
        """template: the SendProcessor's ResponseTemplate of a stored send (its fixed entries)."""
        self.broker = broker
        cfg = broker.config
        self.stats = getattr(broker, "stats", None)
        self._cluster = ("CLUSTER\x01" + cfg.brokerClusterName).encode()
        opts = ffi.new("mq_fast_opts *")
        keep = [ffi.from_buffer(self._cluster), ffi.from_buffer(template.json_fixed),
                ffi.from_buffer(template.bin_fixed)]
        opts.cluster_prop, opts.cluster_prop_len = keep[0], len(self._cluster)
        opts.json_fixed, opts.json_fixed_len = keep[1], len(template.json_fixed)
        opts.bin_fixed, opts.bin_fixed_len = keep[2], len(template.bin_fixed)
        opts.max_message_size = broker.store.cl.max_message_size
        out = ffi.new("mq_fast **")
        rc = lib.mq_fast_open(broker.store.cl._h, opts, out)
        if rc == lib.MQ_E_INVAL:           # fixed answer fields over MQ_FAST_FIXED_MAX (a very long regionId)
            log.warning("the C send path is off: a stored send's fixed answer fields take %d bytes (JSON), over "
                        "%d", len(template.json_fixed), lib.MQ_FAST_FIXED_MAX)
            self._h = None
        else:
            check(rc, "fast send open")
            self._h = ffi.gc(out[0], lib.mq_fast_close)
        self._out = ffi.new("uint8_t[]", MSGS_MAX * lib.MQ_FAST_ANSWER_MAX)
        self._out_buf = ffi.buffer(self._out)
        self._spans = ffi.new("mq_fast_span[]", MSGS_MAX)
        self._fails = ffi.new("mq_fast_fail[]", MSGS_MAX)
        self._n = ffi.new("uint32_t[4]")
        self._head, self._tail = ffi.new("mq_fast_fail *"), ffi.new("mq_fast_fail *")
        self._consumed = ffi.new("size_t *")
        self._stop = ffi.new("int *")
        self._code = ffi.new("int32_t *")
        self._pulled = ffi.new("mq_fast_pulled *")
        self._group_ids: dict[str, int] = {}
        self._group_names: list[str] = []
        self._sql_ids: dict[str, int] = {}       # SQL92 text -> its id in C
        self._sql_texts: list[str] = []          # id -> text
        self._sql_skipped: set[str] = set()      # texts C cannot take (the limits in publish_sql)
        self.sql_resync: set[str] = set()        # texts C handed a pull back for, for a verdict it lacks
        self._subs_published: dict[tuple[str, str], tuple] = {}   # (group, topic) -> the cache entry published
        self.pulls_on = False                    # C answers pulls that find data (set_pulls)
        self._pull_buf = None                    # their answers are built here (C's, while pulls are on)
        self._pull_settings = None
        self.pulls = 0                           # pulls C answered, for tests and the runtime info
        self.offset_queries = 0                  # GET_MAX_OFFSET / GET_MIN_OFFSET C answered, likewise
        self._topic_ids: dict[str, int] = {}
        self._topic_names: list[bytes] = []
        self._by_slot: dict[int, object] = {}    # slot -> Connection, of every open connection seen
        self._staged: set[int] = set()           # slots of the staged sends
        self._fixed = template.fixed             # a stored send's fixed answer fields
        self.hold: str | None = None             # None, "flush", "ack" or "commit" (set_policy)
        self._hold_rule = "flush"                # what the answers held now wait for
        self._settler: asyncio.Task | None = None
        self.tracer = None                       # mq.broker.tracing.RequestTracer (set_tracer)
        self.group = None                        # the worker's SendGroup: its pending sends are appended first
        self._trace_rows = None
        self._keep: list = []                    # the reads staged sends point into
        self._next_slot = 0
        self._t_first_ns = 0
        self.loop = asyncio.get_running_loop()
        self.usable = False                      # set by the worker (policy)
        self.runs = 0                            # for tests and the trace
        self.msgs = 0
        # connections served from C (set_conns); the last take's reads: sends staged, a pull answered
        self._ch = None                          # mq_fast_conns, made on first use
        self.conns_on = False
        self._owned: dict[int, object] = {}      # cid -> Connection, adopted
        self._took_sends = self._took_pull = False
        self._events = ffi.new("mq_fast_conn_event[]", CONN_EVENTS_MAX)
        self._sent = ffi.new("mq_fast_sent *")
        self._poll_out = ffi.new("mq_fast_poll_out *")
        self._cid = ffi.new("uint32_t *")
        self._rest = ffi.new("uint8_t **")
        self._n_rest = ffi.new("size_t *")
        self._owed = ffi.new("uint8_t **")
        self._n_owed = ffi.new("size_t *")
        self._conn_pulled = ffi.new("mq_fast_pulled[]", lib.MQ_FAST_CONN_PULLED_MAX)
        self.adoptions = 0                       # for tests and the runtime info
        self.given_back = dict.fromkeys(GIVE_BACK_WHY.values(), 0)     # by C, by why
        self.polls = 0                           # C's polls of them ...
        self.wakes = 0                           # ... in this many calls from the loop (mq_fast_poll_wait)
        self._loop_fd = _backend_fd(self.loop)          # the loop's epoll set, for mq_fast_poll_wait; or None
        self._wait_ms = 0                                # set_conns

    # ---- the topics C may take ------------------------------------------------------------
    def publish(self, topic: str, tc: dict) -> None:
        """Lets C take sends to `topic` (config tc) from now on, if its sends qualify."""
        tid = self._topic_ids.get(topic)
        if tid is None:
            if len(self._topic_names) >= TOPICS_MAX or not fast_topic_ok(topic):
                return
            tid = len(self._topic_names)
            name = topic.encode()
            check(lib.mq_fast_topic_put(self._h, tid, name, len(name), tc["writeQueueNums"], tc["readQueueNums"],
                                        tc["perm"]), "fast send topic")
            self._topic_ids[topic] = tid
            self._topic_names.append(name)

    def publish_group(self, group: str) -> None:
        """Lets C answer pulls of consumer group `group` from now on (the pull path found it in
        the worker's group cache with consumeEnable)."""
        if group in self._group_ids or len(self._group_names) >= GROUPS_MAX:
            return
        try:
            name = group.encode()
        except UnicodeEncodeError:         # a lone surrogate (read by the lenient JSON parser): Python's
            return
        if not 0 < len(name) <= lib.MQ_FAST_GROUP_LEN_MAX:
            return
        gid = len(self._group_names)
        check(lib.mq_fast_group_put(self._h, gid, name, len(name)), "fast pull group")
        self._group_ids[group] = gid
        self._group_names.append(group)

    def publish_sql(self, sql) -> None:
        """Lets C answer SQL92 pulls whose subscription is sql.text (an Sql92Filter) once it holds
        the verdicts their records need: the records of a pull it hands back for one are judged
        here and their verdicts published (sql_verdict, for the texts in sql_resync)."""
        ids = self._sql_ids
        if sql.text in ids or sql.text in self._sql_skipped:
            return
        try:
            text = sql.text.encode()
            names = [name.encode() + b"\x01" for name in sql.property_names]
        except UnicodeEncodeError:         # a lone surrogate (read by the lenient JSON parser): Python's
            text = None
        if (text is None or not 0 < len(text) <= lib.MQ_FAST_SUB_TEXT_MAX or len(names) > lib.MQ_FAST_SQL_NAMES_MAX
                or any(len(k) > lib.MQ_FAST_SQL_NAME_LEN_MAX + 1 for k in names)):
            if len(self._sql_skipped) >= SQL_SKIPPED_MAX:
                self._sql_skipped.clear()
            self._sql_skipped.add(sql.text)
            return
        if len(ids) >= SQL_FILTERS_MAX:
            check(lib.mq_fast_sql_clear(self._h), "fast pull SQL92 clear")     # subscriptions too
            ids.clear()
            self._sql_texts.clear()
            self.sql_resync.clear()
            self._subs_published.clear()
        fid = len(ids)
        blob = b"".join(names)
        check(lib.mq_fast_sql_put(self._h, fid, ffi.from_buffer("uint8_t[]", text), len(text),
                                  ffi.from_buffer("uint8_t[]", blob) if blob else ffi.NULL,
                                  [len(k) for k in names] if names else ffi.NULL, len(names)), "fast pull SQL92 filter")
        ids[sql.text] = fid
        self._sql_texts.append(sql.text)

    def sql_verdict(self, text: str, values: tuple, verdict: bool) -> None:
        """Publishes SQL92 filter `text`'s verdict for one combination of its properties' values
        (bytes, or None for a property the record lacks, in property_names order)."""
        fid = self._sql_ids.get(text)
        if fid is None:
            return
        key = b"".join(b"\0" if v is None else b"\1" + len(v).to_bytes(4, "big") + v for v in values)
        if len(key) <= lib.MQ_FAST_SQL_KEY_MAX:
            raw = ffi.from_buffer("uint8_t[]", key) if key else ffi.NULL
            check(lib.mq_fast_sql_verdict(self._h, fid, raw, len(key), 1 if verdict else 0), "fast pull SQL92 verdict")

    def publish_sub(self, group: str, topic: str, hit: tuple, codes) -> None:
        """Lets C answer pulls of `group` from `topic` that rely on the group's heartbeat
        subscription (no PULL_SUBSCRIPTION), until the worker's cache entry `hit` (its
        (time.monotonic(), subscription) in RemoteMeta._subs) would be refreshed; codes: the
        subscription's filter as compile_filter made it.  A pair is published again when its
        entry was refreshed."""
        key = (group, topic)
        if self._subs_published.get(key) is hit:
            return
        gid, tid = self._group_ids.get(group), self._topic_ids.get(topic)
        version = hit[1].get("subVersion")
        if gid is None or tid is None or version.__class__ is not int or not INT64_MIN <= version <= INT64_MAX:
            return
        sql_id, arr = -1, []
        if codes.__class__ is frozenset:
            if len(codes) > lib.MQ_FAST_CODES_MAX:
                return
            arr = sorted(codes)
        elif codes is not None:            # an Sql92Filter
            self.publish_sql(codes)
            sql_id = self._sql_ids.get(codes.text)
            if sql_id is None:
                return
        if key not in self._subs_published and len(self._subs_published) >= SUBS_MAX:
            self._subs_published.clear()   # as C forgets them all at its limit: a new pair past it
        fresh_until_ns = int((hit[0] + SUBSCRIPTION_CACHE_S) * 1e9) - SUB_FRESH_MARGIN_NS
        check(lib.mq_fast_sub_put(self._h, gid, tid, fresh_until_ns, version, arr if arr else ffi.NULL, len(arr),
                                  sql_id), "fast pull subscription")
        self._subs_published[key] = hit

    def clear_groups(self) -> None:
        """The worker's group cache was dropped (a group changed): C forgets every group (and
        every subscription)."""
        if self._h is not None:
            check(lib.mq_fast_groups_clear(self._h), "fast pull groups clear")
        self._group_ids.clear()
        self._group_names.clear()
        self._subs_published.clear()

    def set_pulls(self, on: bool, cq_root: str = "", cq_file_size: int = 0, count_max: int = 0,
                  bytes_max: int = 0) -> None:
        """C answers pulls that find data (on) or none; the ConsumeQueue files' root and size,
        maxTransferCountOnMessageInMemory and maxTransferBytesOnMessageInMemory (csrc/fastsend.h,
        mq_fast_set_pulls).  Settings C refuses (a byte limit past what one frame holds) leave
        every pull to Python."""
        settings = (cq_root, cq_file_size, count_max, bytes_max) if on and self._h is not None else None
        if settings == self._pull_settings:
            return
        self._pull_settings = settings
        self.pulls_on = False
        if self._h is None:
            return
        if settings is None or count_max > PULL_LIMIT_MAX or bytes_max > FRAME_SIZE_MAX - PULL_HEADER_ROOM:
            check(lib.mq_fast_set_pulls(self._h, ffi.NULL, 0, 0, 0, 0, ffi.NULL, 0), "fast pulls off")
            self._pull_buf = None
            if settings is not None:
                log.warning("pulls are not answered in C: maxTransferCountOnMessageInMemory %d or "
                            "maxTransferBytesOnMessageInMemory %d is past what one frame holds", count_max, bytes_max)
            return
        buf = ffi.new("uint8_t[]", PULL_HEADER_ROOM + bytes_max)
        root = cq_root.encode()
        rc = lib.mq_fast_set_pulls(self._h, root, len(root), cq_file_size, count_max, bytes_max, buf, len(buf))
        if rc == lib.MQ_E_INVAL:           # C has let go of its old buffer: so does this side
            self._pull_buf = None
            log.warning("pulls are not answered in C: the ConsumeQueue settings (root %r, file size %d) are past "
                        "what it takes", cq_root, cq_file_size)
            return
        check(rc, "fast pulls on")
        self._pull_buf = buf
        self.pulls_on = True

    def clear_topics(self) -> None:
        """The worker's topic cache was dropped (a topic changed): C forgets every topic, after
        appending what it staged and counting what it stored."""
        self.run()
        self.take_counts()
        if self._h is not None:
            check(lib.mq_fast_topics_clear(self._h), "fast send clear")    # subscriptions too
        self._topic_ids.clear()
        self._topic_names.clear()
        self._subs_published.clear()

    def take_counts(self) -> None:
        """Adds what C stored per topic, and the sends its polls answered, since the last take to
        the stats rows."""
        if self.stats is None:
            return
        if self._ch is not None:
            sent = self._sent
            lib.mq_fast_conns_take_sent(self._ch, sent)
            self.stats.sent_counts(RC.SUCCESS, sent.n, sent.sum_ns)
        if not self._topic_names:
            return
        n = len(self._topic_names)
        msgs, size = ffi.new("uint64_t[]", n), ffi.new("uint64_t[]", n)
        check(lib.mq_fast_take_counts(self._h, msgs, size, n, self._n), "fast send counts")
        put = self.stats.put
        for i in range(self._n[0]):
            if msgs[i]:
                put(self._topic_names[i], msgs[i], size[i])

    # ---- reads -----------------------------------------------------------------------------
    def take(self, conn, data: bytes, pos: int, size: int) -> int:
        """Stages the sends of data[pos:size] C takes and writes the answers of the pulls it
        answers; returns where the first frame it did not take starts (size: every complete frame
        was taken, or pos when the first is Python's).  It also stops early when the pulls'
        answers paused the connection (its unsent caps): the caller then holds the rest."""
        me = conn.attrs.get("fast")
        if me is None:
            born = born_packed(conn)
            # the fast (VIP) port serves no pulls: C leaves them to that server's answer
            pulls = 1 if R.PULL_MESSAGE in conn.server.handlers else 0
            me = conn.attrs["fast"] = (self._next_slot, born, len(born), conn.peer[1], pulls)
            self._by_slot[self._next_slot] = conn
            self._next_slot = (self._next_slot + 1) & 0x7FFFFFFF
        slot, born, born_len, port, pulls = me
        buf = ffi.from_buffer(data)
        h, consumed, stop, code, pulled = self._h, self._consumed, self._stop, self._code, self._pulled
        pulls = pulls if self.pulls_on else 0
        answered = False
        self._took_sends = False
        try:
            while True:
                rc = lib.mq_fast_read(h, slot, born, born_len, port, pulls, buf + pos, size - pos, consumed, stop,
                                      code, pulled)
                if rc:
                    check(rc, "fast send read")
                if pulled.sends_staged:
                    self._took_sends = True
                    if not self._staged:
                        self.loop.call_soon(self.run)
                        if self.stats is not None:
                            self._t_first_ns = perf_counter_ns()
                    self._staged.add(slot)
                    self._keep.append(data)
                pos += consumed[0]
                if stop[0] == STOP_PULLED:
                    answered = True
                    self._pulled_answer(conn, pulled)
                    if conn._out_bytes > UNSENT_BYTES_FLUSH_MAX:
                        conn.flush()
                        if conn.closed or conn._protocol is None or conn._protocol._paused_by:
                            return pos
                    continue
                if stop[0] == STOP_FULL:
                    self.run()
                    continue
                if pulled.sql_missed:      # the pull handed back now: Python publishes its verdicts
                    fid, pulled.sql_missed = pulled.sql_missed - 1, 0
                    self._sql_missed(fid)
                if stop[0] == STOP_HANDBACK and self._staged and (code[0] < 0 or code[0] in APPENDING_CODES):
                    # what came before it is appended (and answered) before it: it may be a send C
                    # could not read, or a broken frame that closes the connection
                    self.run()
                return pos
        finally:
            self._took_pull = answered
            if answered:
                conn.flush()

    def _pulled_answer(self, conn, p) -> None:
        """Queues the answer of the pull C answered (p: its mq_fast_pulled) and does what Python's
        path does besides: the offset commit it carried, the stats."""
        at = p.frame_offset
        conn.queue_frame(ffi.buffer(self._pull_buf + at, p.frame_len)[:])
        self._after_pull(p)

    def _after_pull(self, p) -> None:
        """What Python's path does for a pull besides its answer (which C wrote): the offset
        commit the pull carried, the stats; for an offset query, a count."""
        if p.kind == lib.MQ_FAST_PULLED_OFFSET:
            self.offset_queries += 1
            return
        self.pulls += 1
        group = self._group_names[p.group_id]
        topic = self._topic_names[p.topic_id].decode()
        if p.commit:
            self.broker.meta.commit_offset_nowait(group, topic, p.queue_id, p.commit_offset)
        if self.stats is not None:
            self.stats.got(group, topic, p.msgs, p.body_len)

    def _sql_missed(self, fid: int) -> None:
        """C handed an SQL92 pull back for want of a verdict of filter fid: its verdicts are resent."""
        if fid < len(self._sql_texts):
            self.sql_resync.add(self._sql_texts[fid])

    def forget(self, conn) -> None:
        """conn closed: answers still held for it are dropped when released."""
        self.give_back(conn, closing=True)
        me = conn.attrs.get("fast")
        if me is not None:
            self._by_slot.pop(me[0], None)

    # ---- policy ----------------------------------------------------------------------------
    def set_policy(self, usable: bool, hold: str | None) -> None:
        """usable: C takes sends at all; hold: None (answered at once), "flush" (SYNC_FLUSH: held
        until flushed), "ack" (SYNC_MASTER: until a slave acknowledged) or "commit" (DLedger:
        every send, until committed).  What it staged is appended first; answers already held
        are released under the rule they were held by."""
        self.run()
        self.usable = usable and self._h is not None
        if hold != self.hold and self._h is not None:
            mode = {None: lib.MQ_FAST_ANSWER_NOW, "flush": lib.MQ_FAST_HOLD_WAITING, "ack": lib.MQ_FAST_HOLD_WAITING,
                    "commit": lib.MQ_FAST_HOLD_ALL}[hold]
            check(lib.mq_fast_set_hold(self._h, mode), "fast send hold")
            if hold is not None:
                self._hold_rule = hold
            self.hold = hold

    def set_tracer(self, tracer) -> None:
        """Perf tracing on: C stamps each send it takes and keeps its req row, written here after
        every run and release (csrc/fastsend.h, mq_fast_set_trace)."""
        if tracer is None or self.tracer is tracer or self._h is None:
            return
        self.tracer = tracer
        self._trace_rows = ffi.new("int64_t[]", lib.MQ_FAST_TRACE_ROWS_MAX * lib.MQ_FAST_TRACE_FIELDS)
        self._trace_n = ffi.new("uint32_t *")
        self._trace_kept = 0                     # rows C keeps, at most (since the last take)
        check(lib.mq_fast_set_trace(self._h, 1), "fast send trace")

    def flush_trace(self) -> None:
        """Writes the req rows C keeps (the worker's trace flush, every FLUSH_INTERVAL_S, and
        stopping)."""
        if self.tracer is None:
            return
        n = self._trace_n
        check(lib.mq_fast_take_trace(self._h, self._trace_rows, lib.MQ_FAST_TRACE_ROWS_MAX, n), "fast send trace")
        self._trace_kept = 0
        self.tracer.writer.add_flat(self._trace_rows, n[0])

    def _trace_room(self, added: int) -> None:
        """`added` rows were kept in C: they are formatted in batches (a call per run would cost
        more than the rows), before C's room could run out in the next call (a run adds at most
        MSGS_MAX rows, a release stops when the room is gone)."""
        self._trace_kept += added
        if self._trace_kept >= TRACE_FLUSH_ROWS:
            self.flush_trace()

    def _trace_fail(self, f, status: int) -> None:
        """The req row of a send Python answered for C (refused, or stored and not held)."""
        done = perf_counter_ns()
        if f.store_ns:
            phases = (f.store_ns - f.t0_ns, f.appended_ns - f.store_ns, done - f.appended_ns, 0, 0)
        else:
            phases = (f.t1_ns - f.t0_ns, 0, 0, 0, 0)
        self.tracer.writer.add((f.ts_us, f.code, 1 if f.rc == lib.MQ_FAST_RC_STORED else 0, f.body_len,
                                status, *phases, done - f.t0_ns))

    # ---- runs ------------------------------------------------------------------------------
    def run(self) -> None:
        """Appends what is staged and writes the answers (a loop callback, and at once when the
        stage is full, before a send C left to Python, or when the topics or the policy change)."""
        if not self._staged:
            return
        group = self.group
        if group is not None and group.pending:
            group.run()                    # sends Python's group took from earlier frames go first
        staged, self._staged = self._staged, set()
        n = self._n
        refuse = self._refuse_held()
        try:
            check(lib.mq_fast_run(self._h, refuse, self._out, len(self._out), self._spans, n, self._fails, n + 1,
                                  n + 2, n + 3), "fast send run")
        finally:
            self._keep.clear()
        self.runs += 1
        self._finish(staged, n[0], n[1], n[2], n[3], self._t_first_ns)

    def _refuse_held(self) -> int:
        """1 when a run must refuse the answers it would hold: SYNC_MASTER without a slave in reach
        (RocketMQ's isSlaveOK, on the end before this group)."""
        if self.hold != "ack":
            return 0
        ctl = self.broker.store.ctl
        return 0 if slave_ok(ctl, ctl.get(C.POS_WRITE), self.broker.config.haSlaveFallbehindMax) else 1

    def _finish(self, staged: set, n_spans: int, n_fails: int, n_ok: int, n_held: int,
                t_first_ns: int | None) -> None:
        """After a run (run, _poll): the answers left to Python written, the refused ones answered,
        the counts, the settler for held answers.  t_first_ns None: C counted the sends answered
        now for the stats (a poll's run)."""
        touched: set = set()
        try:
            touched = self._write_spans(n_spans)
            refused_stored = self._answer_fails(n_fails, PutStatus.SLAVE_NOT_AVAILABLE,
                                                "no slave connected, or it is too far behind") if n_fails else 0
            self.msgs += n_ok + n_fails - refused_stored      # a stored send refused an answer is in both
        finally:                           # the spans' frames were queued without a flush of their own
            by_slot = self._by_slot
            for slot in staged:
                conn = by_slot.get(slot)
                if conn is not None:
                    touched.add(conn)
            for conn in touched:
                conn.flush()
        if self.tracer is not None:
            self._trace_room(n_ok + n_fails)
        answered_now = n_ok - n_held - refused_stored
        if t_first_ns is not None and self.stats is not None and answered_now:
            self.stats.sent(RC.SUCCESS, perf_counter_ns() - t_first_ns, answered_now)
        if n_held and (self._settler is None or self._settler.done()):
            self._settler = self.loop.create_task(self._settle())

    def _write_spans(self, n_spans: int) -> set:
        """Queues the spans' answers on their connections (those C did not send itself); returns
        those connections, which the caller flushes (_finish, _release)."""
        out, spans, by_slot = self._out_buf, self._spans, self._by_slot
        touched = set()
        for i in range(n_spans):
            s = spans[i]
            conn = by_slot.get(s.conn)
            if conn is not None:
                conn.queue_frame(out[s.offset:s.offset + s.len])
                touched.add(conn)
        return touched

    def _answer_fails(self, n: int, stored_status: PutStatus, stored_reason: str) -> int:
        """Answers fails[0:n] as the group path answers them: a send the store refused through
        put_error, a stored one (rc MQ_FAST_RC_STORED: not held, or held too long) with
        stored_status and its msgId, queueId and queueOffset.  Returns how many were stored."""
        cl = self.broker.store.cl
        stored = 0
        for i in range(n):
            f = self._fails[i]
            ext = None
            if f.rc == lib.MQ_FAST_RC_STORED:
                stored += 1
                code, remark, known = send_status(PutResult(stored_status, None, stored_reason))
                if known:                  # the answer says where it was stored (codes 10/11/12)
                    ext = {"msgId": ffi.string(f.msg_id).decode(), "queueId": f.queue_id,
                           "queueOffset": f.queue_offset, **self._fixed}
            else:
                topic = self._topic_names[f.topic_id].decode()
                result = put_error(cl.append_error(f.rc, topic, f.queue_id))
                code, remark, _ = send_status(result)
                log.info("send refused (%s): body=%d bytes", result.reason, f.body_len)
            if self.stats is not None:
                self.stats.sent(code, 0)
            if self.tracer is not None:
                self._trace_fail(f, code)
            conn = self._by_slot.get(f.conn)
            if f.oneway or conn is None:
                continue
            req = RemotingCommand(language=f.language, version=f.version, opaque=f.opaque,
                                  serialize_type=f.serialize_type)
            conn.write(make_response(req, code, remark, ext))
        return stored

    # ---- connections served from C (csrc/fastconn.h) ----------------------------------------
    def set_conns(self, on: bool, wait_ms: int = 0) -> None:
        """Serve producer connections from C from now on (on), or give back every one it serves.
        wait_ms: how long a poll may go on serving them in C while the loop has nothing else ready
        (fastConnWaitMs; mq_fast_poll_wait, where the loop is epoll-based: _backend_fd)."""
        self._wait_ms = wait_ms if self._loop_fd is not None else 0
        if on and self._h is not None:
            if self._ch is None:
                out = ffi.new("mq_fast_conns **")
                check(lib.mq_fast_conns_open(self._h, out), "fast conns open")
                self._ch = ffi.gc(out[0], lib.mq_fast_conns_close)
            if not self.conns_on:
                self.loop.add_reader(lib.mq_fast_conns_fd(self._ch), self._poll)
                self.conns_on = True
            return
        if self._ch is not None:
            self._take_pulled()
        for conn in list(self._owned.values()):
            self.give_back(conn)
        if self.conns_on:
            self.loop.remove_reader(lib.mq_fast_conns_fd(self._ch))
            self.conns_on = False

    def adopt(self, conn) -> None:
        """(the server's adopter hook, after the taker took a read whole) Serves conn from C if that
        read staged sends or answered a pull, and Python holds nothing of it: no bytes, no request
        in flight, no answer unsent, no pause; TCP only (the links of a node stay Python's).  C
        answers its pulls where this side's read would have (pulls on, the port serves them)."""
        if not (self._took_sends or self._took_pull) or not self.conns_on or not self.usable:
            return
        proto = conn._protocol
        if (conn.closed or conn.in_flight or conn._out or proto is None or proto._paused_by or len(proto._held)
                or conn.transport.get_write_buffer_size()):
            return
        sock = conn.transport.get_extra_info("socket")
        if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
            return
        slot, born, born_len, port, pulls = conn.attrs["fast"]
        rc = lib.mq_fast_adopt(self._ch, slot, sock.fileno(), born, born_len, port, pulls, self._cid)
        if rc == lib.MQ_E_FULL:            # MQ_FAST_CONNS_MAX served: this one stays Python's
            return
        check(rc, "fast conn adopt")
        cid = self._cid[0]
        conn.attrs["cid"] = cid
        self._owned[cid] = conn
        self.adoptions += 1
        proto._pause(ADOPTED)

    def give_back(self, conn, closing: bool = False) -> None:
        """Python serves conn again: its unread bytes from C go first (held by the protocol), then
        reading resumes (unless paused for another reason).  closing: they are dropped."""
        cid = conn.attrs.pop("cid", None)
        if cid is None:
            return
        self._owned.pop(cid, None)
        check(lib.mq_fast_disown(self._ch, cid, self._rest, self._n_rest, self._owed, self._n_owed), "fast conn disown")
        n, n_owed = self._n_rest[0], self._n_owed[0]
        rest = ffi.buffer(self._rest[0], n)[:] if n else b""
        owed = ffi.buffer(self._owed[0], n_owed)[:] if n_owed else b""
        proto = conn._protocol
        if closing or conn.closed or proto is None:
            return
        if owed:                           # the rest of answers C began to send: before anything else
            conn.queue_frame(owed)
            conn.flush()
        if rest:
            proto._held.add(rest)
        proto._resume(ADOPTED)

    def owing(self) -> int:
        """Connections C serves whose sockets have not taken all their answers yet."""
        return lib.mq_fast_conns_owing(self._ch) if self._ch is not None else 0

    def active_s(self, conn) -> float | None:
        """When conn last read or wrote bytes in C (time.monotonic()'s clock); None if C does not serve it."""
        cid = conn.attrs.get("cid")
        if cid is None:
            return None
        ms = lib.mq_fast_conn_active_ms(self._ch, cid)
        return ms / 1000 if ms >= 0 else None

    def _poll(self) -> None:
        """(the loop's reader on C's epoll set) Serves every readable connection C serves in one
        call, then does what run() does after its C call, and takes back the connections C gave back.

        One at a time this ran once a message, and the loop's turn around it was most of the io
        worker's user time.  So where no answer is held (ASYNC_FLUSH, ASYNC_MASTER), C goes on
        serving its connections in the same call while the loop has nothing else ready, up to
        fastConnWaitMs (mq_fast_poll_wait); and a call that leaves Python nothing to write,
        answer or settle costs three counters (C counts the answered sends for the stats:
        take_counts), traced one more: the rows C kept (_trace_room)."""
        group = self.group
        if group is not None and group.pending:
            group.run()                    # sends Python's group took from earlier frames go first
        refuse = self._refuse_held()
        o = self._poll_out
        staged = self._staged
        try:
            if self._wait_ms and self.hold is None:
                check(lib.mq_fast_poll_wait(self._ch, self._loop_fd, self._wait_ms, refuse, self._out, len(self._out),
                                            self._spans, self._fails, self._events, CONN_EVENTS_MAX, o),
                      "fast conn poll")
            else:
                check(lib.mq_fast_poll(self._ch, refuse, self._out, len(self._out), self._spans, self._fails,
                                       self._events, CONN_EVENTS_MAX, o), "fast conn poll")
        finally:
            if o.ran and staged:           # Python's staged sends went with the first run
                self._staged = set()
                self._keep.clear()
        self.polls += o.polls
        self.wakes += 1
        self.runs += o.ran
        try:
            if o.n_pulled:                 # first: a connection given back below may ask for its offsets
                self._take_pulled()
            if o.ran:
                if staged or o.n_spans or o.n_fails or o.n_held:
                    self._finish(staged, o.n_spans, o.n_fails, o.n_ok, o.n_held, None)
                else:
                    self.msgs += o.n_ok
                    if self.tracer is not None:
                        self._trace_room(o.n_ok)
        finally:
            if o.n_events:
                self._given_back(o.n_events)
            if o.more:
                self.loop.call_soon(self._poll)

    def _take_pulled(self) -> None:
        """The commits and stats of the pulls C answered on the connections it serves."""
        arr = self._conn_pulled
        while True:
            n = lib.mq_fast_conns_take_pulled(self._ch, arr, lib.MQ_FAST_CONN_PULLED_MAX)
            for i in range(n):
                self._after_pull(arr[i])
            if n < lib.MQ_FAST_CONN_PULLED_MAX:
                return

    def _given_back(self, n_events: int) -> None:
        """Takes back the connections C gave back (self._events[0:n_events])."""
        events, by_slot, counts = self._events, self._by_slot, self.given_back
        for i in range(n_events):
            ev = events[i]
            counts[GIVE_BACK_WHY[ev.why]] += 1
            if ev.sql_missed:              # an SQL92 pull handed back: Python publishes its verdicts
                self._sql_missed(ev.sql_missed - 1)
            conn = by_slot.get(ev.slot)
            if conn is not None:
                self.give_back(conn)
            else:                          # closed meanwhile (forget disowns first: not expected)
                check(lib.mq_fast_disown(self._ch, ev.cid, self._rest, self._n_rest, self._owed, self._n_owed),
                      "fast conn disown")

    # ---- held answers (SYNC_FLUSH, SYNC_MASTER) --------------------------------------------
    async def _settle(self) -> None:
        """Runs _settle_loop; should it ever fail (a bug), the failure is logged and the loop
        starts again while answers are held, so none is left waiting for good."""
        while True:
            try:
                await self._settle_loop()
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("releasing held send answers failed; starting over")
                await asyncio.sleep(0.01)

    async def _settle_loop(self) -> None:
        """Releases held answers as the flushed, acknowledged or committed position passes them,
        answering as the group path does those that cannot be: held longer than syncFlushTimeout
        / slaveTimeout / maxWaitAckTimeMs, FLUSH_DISK_TIMEOUT / FLUSH_SLAVE_TIMEOUT (stored) or
        OS_PAGECACHE_BUSY (DLedger: outcome unknown); appended in a DLedger term that ended,
        UNKNOWN_ERROR; a fatal store ends every wait at once (a flush's reason is its error)."""
        broker = self.broker
        ctl = broker.store.ctl
        head, tail, n = self._head, self._tail, self._n
        while True:
            check(lib.mq_fast_pending(self._h, head, tail, n), "fast send pending")
            if not n[0]:
                return
            rule = self._hold_rule
            if rule == "flush":
                timeout_s = broker.store.config.syncFlushTimeout / 1000
                status, reason = PutStatus.FLUSH_DISK_TIMEOUT, "flush timed out"
            elif rule == "ack":
                timeout_s = broker.config.slaveTimeout / 1000
                status, reason = PutStatus.FLUSH_SLAVE_TIMEOUT, "the slave did not acknowledge in time"
            else:
                timeout_s = broker.config.maxWaitAckTimeMs / 1000
                status, reason = PutStatus.OS_PAGECACHE_BUSY, "wait quorum ack timeout"
            left_s = timeout_s - (time.monotonic() * 1000 - head.t_ms) / 1000
            if left_s <= 0:
                ok = False
            elif rule == "flush":
                ok = await broker.store.flush_waiter.wait_async(head.end_offset, left_s)
            elif rule == "ack":
                ok = await broker.ack_waiter.wait_async(head.end_offset, left_s)
            else:
                ok = await broker.commit_waiter.wait_async(head.end_offset, head.dl_term, left_s) == "ok"
            if rule == "commit":
                # COMMITTED before the term (CommitWaiter's order): a commit seen with the term
                # unchanged covers entries of this term only
                position = ctl.get(C.POS_COMMITTED)
                if ctl.get(C.POS_DL_APPEND_TERM) == head.dl_term:
                    self._release(position, head.dl_term)
            else:
                self._release(ctl.get(C.POS_FLUSHED if rule == "flush" else C.POS_ACKED), -1)
            if ok:
                continue
            fatal = ctl.fatal()
            if fatal and rule == "flush":
                reason = fatal
            if rule == "commit":          # entries of a term that ended: outcome unknown
                self._expire(-(1 << 62), ctl.get(C.POS_DL_APPEND_TERM), PutStatus.UNKNOWN_ERROR,
                             "the leader's term changed before the commit")
            now_ms = time.monotonic() * 1000
            self._expire(int(now_ms) + 1 if fatal else int(now_ms - timeout_s * 1000) + 1, -1, status, reason)

    def _expire(self, before_ms: int, keep_term: int, status: PutStatus, reason: str) -> None:
        """Answers, with status, the held sends appended before before_ms or (keep_term >= 0) in
        another term (mq_fast_release_expired)."""
        n = self._n
        while True:
            check(lib.mq_fast_release_expired(self._h, before_ms, keep_term, self._fails, MSGS_MAX, n),
                  "fast send expire")
            if not n[0]:
                return
            self._answer_fails(n[0], status, reason)       # each write schedules its connection's flush

    def _release(self, position: int, term: int) -> None:
        n = self._n
        acked = 0 if self._hold_rule == "flush" else 1
        while True:
            if self.conns_on:              # the answers of the connections C serves sent by C
                o = self._poll_out
                check(lib.mq_fast_conns_release(self._ch, position, term, acked, self._out, len(self._out),
                                                self._spans, MSGS_MAX, self._events, CONN_EVENTS_MAX, o),
                      "fast send release")
                n_spans, released, n_events = o.n_spans, o.n_ok, o.n_events
            else:
                check(lib.mq_fast_release(self._h, position, term, acked, self._out, len(self._out), self._spans,
                                          MSGS_MAX, n, n + 1), "fast send release")
                n_spans, released, n_events = n[0], n[1], 0
            if not released:
                return
            if self.tracer is not None:
                self._trace_room(released)
            try:
                for conn in self._write_spans(n_spans):
                    conn.flush()
            finally:
                self._given_back(n_events)
            if self.stats is not None:
                self.stats.sent(RC.SUCCESS, int(time.monotonic() * 1e9) - self._head.t_ms * 1_000_000, released)

    async def drain(self, timeout_s: float = 3.0) -> None:
        """Gives back the connections C serves, appends what is staged and waits for the held
        answers (stopping)."""
        self.set_conns(False)
        self.run()
        if self._settler is not None and not self._settler.done():
            await asyncio.wait([self._settler], timeout=timeout_s)


__all__ = ["FastSends", "fast_topic_ok"]
