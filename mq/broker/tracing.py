"""The broker's perf trace (perfTraceEnable; schema and file layout in mq.trace).

Who writes what, each process into its own `<dir>/<prefix>-<pid>.jsonl`:
    io worker   one "req" record per request it answers      RequestTracer (here; the rows are
                formatted and written by a child process of the worker's, mq.broker.traceformat,
                into the worker's file)
    flush role  one "flush" record per flush that moved data  mq.store.flush.FlushService
    HA master   one "lag" record per slave per second        mq.ha.tracing.LagSampler
`<dir>` is perfTraceDir, or <storePathRootDir>/perftrace; `broker` in every
record is the broker's address (brokerIP1:listenPort), which tells a master
from its slave although they share brokerName.

A request's instants (time.perf_counter_ns), in order:
    t0        frame decode starts (mq.remoting.server; the bytes are read)
    t1        frame decoded; ts_us is the wall clock here
    start     the request's handler starts
    store     the store call starts (sends only)           mq.store.store.put_async
    appended  the C append returned                        mq.store.store.put_async
    flushed   SYNC_FLUSH wait over (without one: the       IoWorker.put_message
              store call's return, just after appended)
    acked     SYNC_MASTER slave ack (= flushed otherwise)  IoWorker.put_message
    resp      the handler returned its response            mq.remoting.server
    done      the response frame is encoded and queued     mq.remoting.server
and the record's phases:
    decode_us      (t1 - t0) + (store - start): frame, header and properties decode,
                   topic lookup, everything before the store call
    append_us      appended - store
    flush_wait_us  flushed - appended
    repl_wait_us   acked - flushed
    encode_us      done - acked: building the response and encoding its frame
    total_us       done - t0
Requests without a store call (pulls, admin codes, refused sends) have
decode_us = t1 - t0 (the frame only), append/flush/repl 0, encode_us =
done - resp (the frame only); for them total_us also holds the handler's own
work (for a pull: lookup and any long-poll hold).  For every record
total_us - (sum of the other phases) >= 0 is the time spent waiting for the
event loop (start - t1) plus that handler work.  The socket write itself
happens after `done`, coalesced with other responses, and is in no record.

msgs: messages stored (sends) or returned (pulls), else 0.  size_bytes: the
request body's length, or the response body's when the request has none
(pulls).  status: the response code, as a decimal string.

Cost when on (the budget is 5% of the io worker's CPU, perf/test_trace_overhead.py).  Today:
the C send path stamps the frames it takes into C arrays, taken in batches; the rows go raw to
the formatter process (OffloadedRowWriter), so the io worker pays the stamps and a send per
512 rows: 0.977-0.987 untraced / traced by hand on 2026-11-29 (the formatter 0.25 us a message
on its own).  The history below is of the Python path, which requests C does not take still use:
a handful of perf_counter_ns calls, one small object and one tuple per
request; records are formatted with one %-template of ints per record
(durations as 12345e-3, which JSON reads as 12.345) instead of json.dumps
(which alone costs ~5 us, as much as the whole budget of a single send), and
written every FLUSH_EVERY records and every second.  Measured (busy 2-vCPU
VM): py-spy puts 3.5-4.4% of a loaded io worker's main thread in this module,
a third of it formatting, but the io worker's CPU per pipelined single send
is 0.74-0.89 untraced / traced (2026-11-25: ~5 us of ~30 us; the stamps are
spread over the server, the send path and the group append), short of the
0.95 target; batches of 100 pay nothing measurable (perf/test_trace_overhead.py).  When off, the hot path
pays a few `is not None` tests per request."""
from __future__ import annotations

import contextvars
import json
import logging
import os
import socket
import subprocess
import sys
from array import array
from itertools import chain
from time import perf_counter_ns, time_ns

from mq.store.native import ffi, lib
from mq.trace import FIELDS, TraceWriter, trace_path

log = logging.getLogger("mq.broker.tracing")

FLUSH_EVERY = 1024          # req records buffered before they are formatted and written
FLUSH_INTERVAL_S = 1.0      # and at least this often (IoWorker's flush task), so a quiet worker's trace is current

# The current request's RequestTimes, or None: set by RequestTracer.begin just before the request's
# handler runs; a request that waits runs in a Task, which copies the context, so concurrent
# requests never see each other's.  Read by the send path to stamp the store and wait phases.
CURRENT: contextvars.ContextVar = contextvars.ContextVar("mq_broker_request_times", default=None)

# the fields of a req record, in the order of RequestTracer's rows
REQ_ROW = ("ts_us", "code", "msgs", "size_bytes", "status", "decode_us", "append_us", "flush_wait_us",
           "repl_wait_us", "encode_us", "total_us")


def trace_dir(config) -> str:
    """perfTraceDir, or <storePathRootDir>/perftrace when it is empty."""
    return config.perfTraceDir or os.path.join(config.storePathRootDir, "perftrace")


def broker_label(config) -> str:
    """The `broker` field: the address clients use, unique per broker process."""
    return f"{config.brokerIP1}:{config.listenPort}"


class RequestTimes:
    """One request's instants (perf_counter_ns); 0 = not reached.  See the module docstring."""
    __slots__ = ("t0_ns", "t1_ns", "ts_us", "start_ns", "store_ns", "appended_ns", "flushed_ns", "acked_ns",
                 "resp_ns", "msgs", "status")

    def __init__(self, t0_ns: int, t1_ns: int):
        self.t0_ns = t0_ns
        self.t1_ns = t1_ns
        self.ts_us = time_ns() // 1000
        self.start_ns = perf_counter_ns()
        self.store_ns = self.appended_ns = self.flushed_ns = self.acked_ns = self.resp_ns = 0
        self.msgs = 0
        self.status = -1        # the response code, set by a path that answers with an encoded frame


class _RowBuffer:
    """The rows added one at a time (a list append each), taken as one flat int64 array every
    FLUSH_EVERY rows and at flush() -- the part both row writers share."""

    _nfields: int
    _pending: list

    def add(self, row: tuple) -> None:
        """Buffers one row (see RowTraceWriter's docstring for the values)."""
        rows = self._pending
        rows.append(row)
        if len(rows) >= FLUSH_EVERY:
            self.flush()

    def _take_values(self) -> tuple[array, int]:
        """The buffered rows as one flat array (one C loop for the batch), and their count."""
        pending, self._pending = self._pending, []
        values = array("q", chain.from_iterable(pending))
        assert len(values) == len(pending) * self._nfields, "a row of the wrong length"
        return values, len(pending)

    def flush(self) -> None:
        raise NotImplementedError


class RowTraceWriter(_RowBuffer):
    """Rows of one record kind onto a TraceWriter: tuples of ints in the order of `fields`,
    buffered, then turned into one flat int64 array and formatted as JSON lines by the C
    module (mq_format_rows) one batch at a time, then handed over with TraceWriter.write_lines.
    The lines read back exactly as the dicts TraceWriter.write would write.  Rows are added
    and flushed by one thread (the io worker's event loop).

    A row's values: ints for int fields; thousandths as ints for float fields (e.g.
    nanoseconds for *_us fields: written as 12345e-3, which JSON reads as 12.345); and for
    str fields a decimal code as an int, negative for "" (the only str field of a req row is
    its response code).  Adding a row costs a list append; the conversion and the C formatting
    well under a microsecond a row, per batch of FLUSH_EVERY rows (a batch stalls the loop for
    a fraction of a millisecond)."""

    def __init__(self, directory: str, prefix: str, kind: str, constants: dict, fields: tuple[str, ...],
                 pid: int | None = None):
        assert all(k in FIELDS for k in constants) and all(k in FIELDS for k in fields), (constants, fields)
        self.writer = TraceWriter(directory, prefix, flush_every=FLUSH_EVERY, flush_interval_s=FLUSH_INTERVAL_S,
                                  pid=pid)
        self.path = self.writer.path
        head = json.dumps({"kind": kind, **constants}, separators=(",", ":"))[:-1]
        segs = [(head if i == 0 else "") + f',"{name}":' for i, name in enumerate(fields)] + ["}\n"]
        encoded = [seg.encode() for seg in segs]
        self._segs = ffi.new("char[]", b"".join(encoded))
        self._seg_len = ffi.new("uint32_t[]", [len(e) for e in encoded])
        kinds = {"int": lib.MQ_FMT_INT, "float": lib.MQ_FMT_MILLI, "str": lib.MQ_FMT_CODE}
        self._kinds = ffi.new("uint8_t[]", [kinds[FIELDS[name]] for name in fields])
        self._nfields = len(fields)
        self._row_max = sum(len(e) for e in encoded) + len(fields) * lib.MQ_FMT_VALUE_MAX
        self._out = None                   # _text's buffer, grown to the largest call
        self._pending: list[tuple] = []
        self.failed = False

    def _text(self, values, rows: int) -> bytes:
        """`rows` rows of C int64 values back to back as JSON lines (mq_format_rows), formatted
        in a buffer kept and grown to the largest call (a fresh MB-sized one per call cost page
        faults and an munmap each time)."""
        cap = rows * self._row_max
        out = self._out
        if out is None or len(out) < cap:
            out = self._out = ffi.new("char[]", cap)
        n = lib.mq_format_rows(self._segs, self._seg_len, self._kinds, self._nfields, values, rows, out, cap)
        assert n >= 0, n
        return ffi.buffer(out, n)[:]

    def add_flat(self, values, rows: int) -> None:
        """Writes `rows` rows given as C int64 values back to back (the C send path's,
        mq.broker.fastsend): formatted at once, no tuple made."""
        if self.failed or not rows:
            return
        try:
            self.writer.write_lines(self._text(values, rows), rows)
        except OSError as e:
            log.error("perf trace: writing %s failed (%s); dropping this process's records from now on",
                      self.path, e)
            self.failed = True

    def flush(self) -> None:
        """Writes the buffered rows.  A write error is logged once and the rows are dropped
        from then on: tracing never stops the broker."""
        values, rows = self._take_values()
        if self.failed:
            return
        try:
            if rows:
                self.writer.write_lines(self._text(ffi.from_buffer("int64_t[]", values), rows), rows)
            self.writer.flush()
        except OSError as e:
            log.error("perf trace: writing %s failed (%s); dropping this process's records from now on",
                      self.path, e)
            self.failed = True

    def close(self) -> None:
        self.flush()
        try:
            self.writer.close()
        except OSError as e:
            log.error("perf trace: closing %s failed: %s", self.path, e)


class OffloadedRowWriter(_RowBuffer):
    """RowTraceWriter's interface (add, add_flat, flush, close, path, failed) with the formatting
    and the file in a child process of its own (mq.broker.traceformat): rows go to it raw, as
    int64 values, over a SOCK_SEQPACKET socket pair, at most MESSAGE_ROWS_MAX rows a message, and
    it formats them into the same file RowTraceWriter would write (named after this process).
    The formatting was most of what tracing cost the io worker (its CPU per pipelined send
    0.960-0.966 of untraced with it, 0.969-1.0 without, by hand on 2026-11-29).  A send waits
    up to SEND_TIMEOUT_S for room (the child is behind by the socket's whole buffer); past that,
    or when the child is gone, this writer drops its rows from then on (one line): tracing never
    stops the broker.  close() sends what is buffered and waits for the child to write it."""

    MESSAGE_ROWS_MAX = 512              # 45 KiB a message with the 11 values of a req row
    SEND_TIMEOUT_S = 2.0
    CHILD_EXIT_S = 10.0
    SNDBUF_BYTES = 4 * 1024 * 1024      # (capped by net.core.wmem_max without CAP_NET_ADMIN)

    def __init__(self, directory: str, prefix: str, kind: str, constants: dict, fields: tuple[str, ...]):
        assert all(k in FIELDS for k in constants) and all(k in FIELDS for k in fields), (constants, fields)
        os.makedirs(directory, exist_ok=True)
        self.path = trace_path(directory, prefix)
        self._nfields = len(fields)
        self._pending: list[tuple] = []
        self.failed = False
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        for opt in (getattr(socket, "SO_SNDBUFFORCE", 32), socket.SO_SNDBUF):
            try:
                ours.setsockopt(socket.SOL_SOCKET, opt, self.SNDBUF_BYTES)
                break
            except OSError:
                continue
        try:
            self.child = subprocess.Popen([sys.executable, "-m", "mq.broker.traceformat", str(theirs.fileno())],
                                          pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL)
        finally:
            theirs.close()
        self.sock = ours
        ours.settimeout(self.SEND_TIMEOUT_S)
        self._send(json.dumps({"directory": directory, "prefix": prefix, "kind": kind, "constants": constants,
                               "fields": list(fields), "pid": os.getpid()}).encode())

    def _send(self, message) -> None:
        if self.failed:
            return
        try:
            self.sock.send(message)
        except OSError as e:               # socket.timeout too: the child is stuck or gone
            log.error("perf trace: the formatter of %s took no rows (%s); dropping this process's records "
                      "from now on", self.path, e or type(e).__name__)
            self.failed = True

    def _send_values(self, view, rows: int) -> None:
        """rows x nfields int64 values (a buffer) as messages of at most MESSAGE_ROWS_MAX rows."""
        row_bytes = 8 * self._nfields
        for first in range(0, rows, self.MESSAGE_ROWS_MAX):
            last = min(rows, first + self.MESSAGE_ROWS_MAX)
            self._send(view[first * row_bytes:last * row_bytes])

    def add_flat(self, values, rows: int) -> None:
        """`rows` rows of C int64 values back to back (the C send path's): sent as they are."""
        if rows and not self.failed:
            self._send_values(ffi.buffer(values, rows * self._nfields * 8), rows)

    def flush(self) -> None:
        values, rows = self._take_values()
        if rows and not self.failed:
            self._send_values(memoryview(values).cast("B"), rows)

    def close(self) -> None:
        """Sends the buffered rows, then the end (EOF), and waits for the child's last write."""
        self.flush()
        self.sock.close()
        try:
            self.child.wait(self.CHILD_EXIT_S)
        except subprocess.TimeoutExpired:  # it is stuck (a write to a stalled disk)
            log.error("perf trace: the formatter of %s did not finish in %.0f s; killed", self.path,
                      self.CHILD_EXIT_S)
            self.child.kill()
            self.child.wait()


class RequestTracer:
    """The io worker's side: RemotingServer calls begin() just before each
    request's handler and end() once its response is encoded (see
    mq.remoting.server); the send path stamps the phases in between through
    CURRENT (or, for sends the group append answers, on the times it keeps)."""

    def __init__(self, directory: str, broker: str, role: str, offload: bool = False):
        """offload: format in a child process (OffloadedRowWriter; the io worker's), else here."""
        kind = OffloadedRowWriter if offload else RowTraceWriter
        self.writer = kind(directory, f"req-{role}", "req", {"broker": broker, "role": role}, REQ_ROW)

    def begin(self, cmd, t0_ns: int, t1_ns: int) -> RequestTimes:
        times = RequestTimes(t0_ns, t1_ns)
        CURRENT.set(times)
        return times

    def end(self, times: RequestTimes, cmd, resp, done_ns: int) -> None:
        t0 = times.t0_ns
        store = times.store_ns
        if store:
            appended = times.appended_ns or store
            flushed = times.flushed_ns or appended
            acked = times.acked_ns or flushed
            decode = times.t1_ns - t0 + store - times.start_ns
            append, flush_wait, repl_wait = appended - store, flushed - appended, acked - flushed
            encode = done_ns - acked
        else:
            decode = times.t1_ns - t0
            append = flush_wait = repl_wait = 0
            encode = done_ns - (times.resp_ns or done_ns)
        if resp is None or resp.__class__ is bytes:     # an encoded frame: its path set times.status
            status, resp_size = times.status, 0
        else:
            status, resp_size = resp.code, len(resp.body) if resp.body else 0
        size = len(cmd.body) if cmd.body else resp_size
        # durations in ns: the writer writes them as microseconds (thousandths, see RowTraceWriter)
        self.writer.add((times.ts_us, cmd.code, times.msgs, size, status,
                         decode, append, flush_wait, repl_wait, encode, done_ns - t0))

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


__all__ = ["CURRENT", "RequestTimes", "RequestTracer", "RowTraceWriter", "OffloadedRowWriter", "trace_dir",
           "broker_label"]
