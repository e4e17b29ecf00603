"""The io worker's C send path (csrc/fastsend.h): one C call per read takes the single sends
Python would only store and answer SUCCESS, one call per event-loop iteration appends them
(one group, one wake of the dispatch and flush roles) and writes their answers, a write per
connection.  Everything else - other codes, sends to a topic not published here, anything
with a property or header field that needs a decision - is handed back at the first such
frame, and Python's send path (mq.broker.send) answers it as it always did.

Python keeps the policy: which topics C may take (published here once SendProcessor.handle
found them in the worker's topic cache and their sends would be stored as they are), whether
the path is used at all (FastSends.usable: only where a send needs no wait and no other check -
ASYNC_MASTER, ASYNC_FLUSH, no ACL, no perf tracing, brokerPermission with write; the store's
disk-full and take-back states are read by C per read), and every refusal: a send the store
refuses comes back from the run and is answered here with the code the group path gives.

Limits, named: MQ_FAST_MSGS_MAX sends and MQ_FAST_ARENA_BYTES of properties per run (a read
that fills the stage runs it at once and goes on); MQ_FAST_TOPICS_MAX topics published (past
that, the others keep Python's path until the topic cache is cleared)."""
from __future__ import annotations

import asyncio
import logging
from time import perf_counter_ns

from mq.remoting import RequestCode as R, ResponseCode as RC, make_response
from mq.store.commitlog import host_bytes
from mq.store.native import check, ffi, lib
from mq.store.store import put_error
from mq.wire.remoting import RemotingCommand
from mq.wire.topics import RETRY_PREFIX, SEND_PROTECTED_TOPICS, TOPIC_LEN_MAX, TOPIC_RE

from .send import normalize_host, send_status

log = logging.getLogger("mq.broker.fastsend")

MSGS_MAX = lib.MQ_FAST_MSGS_MAX
TOPICS_MAX = lib.MQ_FAST_TOPICS_MAX
STOP_END, STOP_HANDBACK, STOP_FULL = lib.MQ_FAST_END, lib.MQ_FAST_HANDBACK, lib.MQ_FAST_FULL
# requests whose handlers append: a connection's sends are appended in the order they came, as
# RocketMQ's one send thread appends them (the full path's awaits aside)
APPENDING_CODES = frozenset((R.SEND_MESSAGE, R.SEND_MESSAGE_V2, R.SEND_BATCH_MESSAGE, R.CONSUMER_SEND_MSG_BACK,
                             R.SEND_REPLY_MESSAGE, R.SEND_REPLY_MESSAGE_V2))


def fast_topic_ok(topic: str) -> bool:
    """May C take sends to `topic`?  Only names whose sends Python's group path stores as they
    are: legal, not protected, not %RETRY% (those may go to %DLQ%)."""
    return (0 < len(topic.encode()) <= TOPIC_LEN_MAX and TOPIC_RE.match(topic) is not None
            and not topic.startswith(RETRY_PREFIX) and topic not in SEND_PROTECTED_TOPICS)


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
        check(lib.mq_fast_open(broker.store.cl._h, opts, out), "fast send open")
        self._h = ffi.gc(out[0], lib.mq_fast_close)
        self._out = ffi.new("uint8_t[]", MSGS_MAX * lib.MQ_FAST_ANSWER_MAX)
        self._out_buf = ffi.buffer(self._out)
        self._spans = ffi.new("mq_fast_span[]", MSGS_MAX)
        self._fails = ffi.new("mq_fast_fail[]", MSGS_MAX)
        self._n3 = ffi.new("uint32_t[3]")
        self._consumed = ffi.new("size_t *")
        self._stop = ffi.new("int *")
        self._code = ffi.new("int32_t *")
        self._topic_ids: dict[str, int] = {}
        self._topic_names: list[bytes] = []
        self._conns: dict[int, object] = {}      # slot -> Connection, of the staged sends
        self._keep: list = []                    # the reads staged sends point into
        self._next_slot = 0
        self._t_first_ns = 0
        self.loop = asyncio.get_running_loop()
        self.usable = False                      # set by the worker (policy)
        self.runs = 0                            # for tests and the trace
        self.msgs = 0

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

    def clear_topics(self) -> None:
        """The worker's topic cache was dropped (a topic changed): C forgets every topic, after
        appending what it staged and counting what it stored."""
        self.run()
        self.take_counts()
        check(lib.mq_fast_topics_clear(self._h), "fast send clear")
        self._topic_ids.clear()
        self._topic_names.clear()

    def take_counts(self) -> None:
        """Adds what C stored per topic since the last take to the stats rows."""
        if self.stats is None or not self._topic_names:
            return
        n = len(self._topic_names)
        msgs, size = ffi.new("uint64_t[]", n), ffi.new("uint64_t[]", n)
        check(lib.mq_fast_take_counts(self._h, msgs, size, n, self._n3), "fast send counts")
        put = self.stats.put
        for i in range(self._n3[0]):
            if msgs[i]:
                put(self._topic_names[i], msgs[i], size[i])

    # ---- reads -----------------------------------------------------------------------------
    def take(self, conn, data: bytes, pos: int, size: int) -> int:
        """Stages the sends of data[pos:size] C takes; returns where the first frame it did not
        take starts (size: every complete frame was taken, or pos when the first is Python's)."""
        slot = conn.attrs.get("fast_slot")
        if slot is None:
            slot = conn.attrs["fast_slot"] = self._next_slot
            self._next_slot = (self._next_slot + 1) & 0x7FFFFFFF
            host = conn.attrs.get("born_host")
            if host is None:
                host = conn.attrs["born_host"] = normalize_host(conn.peer[0])
            conn.attrs["fast_born"] = host_bytes(host)
        born = conn.attrs["fast_born"]
        buf = ffi.from_buffer(data)
        h, consumed, stop, code = self._h, self._consumed, self._stop, self._code
        while True:
            check(lib.mq_fast_read(h, slot, born, len(born), conn.peer[1], buf + pos, size - pos, consumed, stop,
                                   code), "fast send read")
            took = consumed[0]
            if took:
                if not self._conns:
                    self.loop.call_soon(self.run)
                    if self.stats is not None:
                        self._t_first_ns = perf_counter_ns()
                self._conns[slot] = conn
                self._keep.append(data)
                pos += took
            if stop[0] == STOP_FULL:
                self.run()
                continue
            if stop[0] == STOP_HANDBACK and code[0] in APPENDING_CODES and self._conns:
                self.run()                 # what came before it is appended before it
            return pos

    # ---- runs ------------------------------------------------------------------------------
    def run(self) -> None:
        """Appends what is staged and writes the answers (a loop callback, and at once when the
        stage is full or the topics change)."""
        if not self._conns:
            return
        conns, self._conns = self._conns, {}
        n3 = self._n3
        try:
            check(lib.mq_fast_run(self._h, self._out, len(self._out), self._spans, n3, self._fails, n3 + 1, n3 + 2),
                  "fast send run")
        finally:
            self._keep.clear()
        n_spans, n_fails, n_ok = n3[0], n3[1], n3[2]
        self.runs += 1
        self.msgs += n_ok + n_fails
        out, spans = self._out_buf, self._spans
        for i in range(n_spans):
            s = spans[i]
            conns[s.conn].write_frame(out[s.offset:s.offset + s.len])
        if n_fails:
            self._answer_fails(conns, n_fails)
        for conn in conns.values():
            conn.flush()
        if self.stats is not None and n_ok:
            self.stats.sent(RC.SUCCESS, perf_counter_ns() - self._t_first_ns, n_ok)

    def _answer_fails(self, conns: dict, n: int) -> None:
        """Sends the store refused: answered as the group path answers them (SendGroup._refuse's
        codes through put_error and SEND_STATUS)."""
        cl = self.broker.store.cl
        for i in range(n):
            f = self._fails[i]
            topic = self._topic_names[f.topic_id].decode()
            result = put_error(cl.append_error(f.rc, topic, f.queue_id))
            code, remark, _ = send_status(result)
            log.info("send refused (%s): body=%d bytes", result.reason, f.body_len)
            if self.stats is not None:
                self.stats.sent(code, 0)
            if f.oneway:
                continue
            req = RemotingCommand(language=f.language, version=f.version, opaque=f.opaque,
                                  serialize_type=f.serialize_type)
            conns[f.conn].write(make_response(req, code, remark))


__all__ = ["FastSends", "fast_topic_ok"]
