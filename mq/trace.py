"""Perf trace records: one schema for the load generator (perf/mqperf.py),
the broker's own tracing (perfTraceEnable in broker.conf) and the miner
(perf/mqtrace.py).  Declared once here; the miner's Spark schema and the
tests' plain-Python statistics are derived from FIELDS.

Format: JSON lines, one object per record, one file per writing process
(`<prefix>-<pid>.jsonl`) in a trace directory, so writers never share a file
and a directory of several runs/brokers is read as one data set.

Units are in the names: *_us are microseconds (wall-clock instants are
microseconds since the Unix epoch, durations are microseconds), *_ms are
milliseconds since the epoch (RocketMQ's storeTimestamp), *_bytes bytes.
A field a record kind does not have is absent (the miner reads it as null).

Record kinds and their fields:

  msg    one per message, written by mqperf
         run, mode (produce|consume|e2e), client, broker, topic, queue,
         queue_offset, size_bytes, batch (messages in the request that carried it),
         status (SEND_OK, FLUSH_DISK_TIMEOUT, ..., or ERROR:<text>),
         send_us (request written), ack_us (response read),
         store_ts_ms (the broker's storeTimestamp), consume_us (consumer got it)
  req    one per request handled by an io worker (broker tracing)
         broker, role (io-<n>), ts_us (request decoded), code, msgs, size_bytes,
         status (response code), decode_us, append_us, flush_wait_us,
         repl_wait_us, encode_us, total_us
  flush  one per flush (msync) by the flush role (broker tracing)
         broker, ts_us (flush started), group_msgs, group_bytes, flush_us
  lag    one per sample per slave, by the HA master (broker tracing)
         broker, ts_us, slave, master_offset, ack_offset, lag_bytes
"""
from __future__ import annotations

import json
import os
import threading
import time

# field -> type name ("str" | "int" | "float"); the Spark schema is built from this
FIELDS: dict[str, str] = {
    "kind": "str", "run": "str", "mode": "str", "client": "str", "broker": "str", "role": "str",
    "topic": "str", "queue": "int", "queue_offset": "int", "size_bytes": "int", "batch": "int",
    "status": "str", "send_us": "int", "ack_us": "int", "store_ts_ms": "int", "consume_us": "int",
    "ts_us": "int", "code": "int", "msgs": "int",
    "decode_us": "float", "append_us": "float", "flush_wait_us": "float", "repl_wait_us": "float",
    "encode_us": "float", "total_us": "float",
    "group_msgs": "int", "group_bytes": "int", "flush_us": "float",
    "slave": "str", "master_offset": "int", "ack_offset": "int", "lag_bytes": "int",
}
KINDS = ("msg", "req", "flush", "lag")
REQ_PHASES = ("decode_us", "append_us", "flush_wait_us", "repl_wait_us", "encode_us", "total_us")


def now_us() -> int:
    return time.time_ns() // 1000


def trace_path(directory: str, prefix: str, pid: int | None = None) -> str:
    """The file of `prefix` records of process `pid` (None: this one) -- pid given when another
    process writes them (mq.broker.traceformat writes an io worker's)."""
    return os.path.join(directory, f"{prefix}-{pid or os.getpid()}.jsonl")


class TraceWriter:
    """Appends records to `<directory>/<prefix>-<pid>.jsonl`.

    Records are buffered and written every `flush_every` records or
    `flush_interval_s`, whichever first, and on close(); a crash loses at most
    that buffer (traces are measurements, not data).  Thread-safe: the lock
    covers one list append.  Unknown fields are a programmer error."""

    def __init__(self, directory: str, prefix: str, *, flush_every: int = 4096, flush_interval_s: float = 1.0,
                 pid: int | None = None):
        os.makedirs(directory, exist_ok=True)
        self.path = trace_path(directory, prefix, pid)
        self._file = open(self.path, "ab")
        self._buf: list[bytes] = []           # UTF-8: one or many lines per item
        self._pending = 0                     # records in _buf
        self._lock = threading.Lock()
        self._flush_every = flush_every
        self._flush_interval_s = flush_interval_s
        self._last_flush = time.monotonic()
        self.records = 0

    def write(self, record: dict) -> None:
        assert record.get("kind") in KINDS, record
        assert all(k in FIELDS for k in record), [k for k in record if k not in FIELDS]
        self.write_lines(json.dumps(record, separators=(",", ":")) + "\n", 1)

    def write_lines(self, text: str | bytes, records: int) -> None:
        """Pre-formatted JSON lines (`records` of them; bytes: UTF-8 already), for writers on a
        hot path that format from a template: json.dumps of a dict per message costs more than
        sending the message.  Their tests read the lines back through read_records."""
        if text.__class__ is str:
            text = text.encode()
        with self._lock:
            self._buf.append(text)
            self.records += records
            self._pending += records
            due = (self._pending >= self._flush_every
                   or time.monotonic() - self._last_flush >= self._flush_interval_s)
        if due:
            self.flush()

    def flush(self) -> None:
        with self._lock:
            buf, self._buf = self._buf, []
            self._pending = 0
            self._last_flush = time.monotonic()
            if buf and not self._file.closed:
                self._file.write(b"".join(buf))
                self._file.flush()

    def close(self) -> None:
        self.flush()
        with self._lock:
            self._file.close()


def read_records(directory: str):
    """Every record under `directory` (recursively, *.jsonl), in file order.
    For tests and small traces; the miner reads with Spark."""
    for root, _dirs, files in os.walk(directory):
        for name in sorted(files):
            if name.endswith(".jsonl"):
                with open(os.path.join(root, name), encoding="utf-8") as f:
                    for line in f:
                        if line.strip():
                            yield json.loads(line)
