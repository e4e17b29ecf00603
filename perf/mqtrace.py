"""mqtrace: mine a directory of perf traces (mq/trace.py records) with Spark,
write the aggregates as Parquet and a report with plots.

    mqtrace TRACE_DIR [-o OUT_DIR] [--master local[2]] [--format md|html] [--title T]
            [--driver-memory SIZE]

Reads every `*.jsonl` under TRACE_DIR, recursively, with an explicit schema
built from mq.trace.FIELDS (no inference): a field a record lacks is null; a
line that is not a JSON object with a kind (a writer killed mid-line) is
counted as malformed and skipped; a field of the wrong type (a float where an
int belongs) reads null, the rest of its record is kept, and such records are
counted.  Fields not in FIELDS are ignored.  OUT_DIR
(default TRACE_DIR/report) receives

    aggregates/<name>/   one Parquet data set per aggregate below
    plots/*.png          matplotlib plots of the data present
    report.md            (or report.html) tables + the plots

Definitions.  The tests compute the same things in plain Python from the same
records, so these are the contract:

  t0_us       the earliest instant in the trace: min over all records of
              send_us, ack_us, consume_us and ts_us.  Every plot's x axis is
              seconds from t0_us, shared by all kinds, so a lag spike lines up
              with the latency spike it causes.
  sec         (instant - t0_us) div 1_000_000.  Per-second aggregates have a row
              per second holding at least one record (none for empty seconds;
              the throughput plot draws those as 0).  Records without their
              instant are left out of per-second aggregates only.
  stage       a msg record yields one observation per answer it has:
                ack      if ack_us is set:     instant ack_us,     latency ack_us - send_us
                consume  if consume_us is set: instant consume_us, latency consume_us - send_us
              (an e2e record yields both).  Latency is null without send_us.
              Throughput per second counts observations by their instant.
  percentile  exact, linear interpolation between closest ranks, which is
              Spark's percentile(): over the n sorted non-null values v[0..n-1],
              position = (n-1)*p, result = v[lo] if lo == hi or v[lo] == v[hi],
              else (hi - position)*v[lo] + (position - lo)*v[hi]  (lo, hi =
              floor, ceil of position).  p50 p90 p99 p999 = 0.5 0.9 0.99 0.999.
  keys        a missing string group key (run, mode, broker, status, slave)
              reads "-"; broker "*" is all brokers together (msg aggregates).

Aggregates (an aggregate whose record kind is absent from the trace is not
written; the report says so):

  msg_latency       run, mode, stage, broker (+ "*"): msgs, bytes, first_us, last_us,
                    duration_s, msgs_per_s, latency_n, latency_mean_us,
                    latency_p50_us .. latency_p999_us, latency_max_us
  msg_per_second    run, mode, stage, broker (+ "*"), sec: msgs, bytes (= per second),
                    latency_p50_us .. latency_p999_us, latency_max_us
  msg_status        run, mode, broker, status: msgs (msg records, not observations)
  req_phases        broker, code, phase (each of mq.trace.REQ_PHASES): requests,
                    n (non-null values), mean_us, p50_us .. p999_us, max_us
  req_per_second    broker, code, sec: requests, msgs, total_p50_us, total_p99_us, total_max_us
  flush_stats       broker: flushes, msgs, bytes, group_msgs_{mean,p50,p99,max},
                    group_bytes_{mean,p50,p99,max}, flush_mean_us, flush_p50_us ..
                    flush_p999_us, flush_max_us
  flush_per_second  broker, sec: flushes, msgs, bytes, group_msgs_mean, group_msgs_max,
                    flush_p50_us, flush_p99_us, flush_max_us
  flush_group_hist  broker, group_msgs: flushes
  lag_stats         broker, slave: samples, lag_max_bytes, lag_mean_bytes, lag_p50_bytes,
                    lag_p99_bytes, lag_last_bytes (at the latest ts_us), first_us, last_us
  lag_per_second    broker, slave, sec: samples, lag_max_bytes
  slowest_msg       the SLOWEST_N observations with the largest latency_us (ties: earlier
                    instant first), with their record's fields, stage, t_us and sec
  slowest_req       the SLOWEST_N req records with the largest total_us (ties: earlier ts_us)

Spark runs in local mode by default, bound to 127.0.0.1 (SPARK_LOCAL_IP is set
before the JVM starts unless already set), UI off, 2 shuffle partitions, WARN
logging; every aggregate is plain Spark SQL (no Python UDFs, so no Python
workers are started).  With a cluster --master, TRACE_DIR and OUT_DIR must be
paths every executor sees (a shared file system).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import html
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from mq.trace import FIELDS, KINDS, REQ_PHASES

from .extras import MissingExtra, require

PCTS = (0.5, 0.9, 0.99, 0.999)
PCT_NAMES = ("p50", "p90", "p99", "p999")
SLOWEST_N = 20
ALL_BROKERS = "*"
MISSING = "-"
US_PER_S = 1_000_000
# Aggregates are computed by this many threads at once: their jobs overlap the
# driver's per-job work (planning, code generation, the Parquet commit) with the
# tasks of others.  A first run on the test trace took 18 s (median of 3) with 4
# against 26 s with 1, on a busy 2-vCPU machine.
JOB_THREADS = 4

# Tuned for a small local run that starts fast (CI): a 2-core machine gains
# nothing from more partitions, and every shuffle partition is a task.
SPARK_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.sql.session.timeZone": "UTC",
    # adaptive execution re-plans after every shuffle: nothing to gain on aggregates of
    # kilobytes (measured no difference within this machine's noise), so off
    "spark.sql.adaptive.enabled": "false",
    "spark.sql.debug.maxToStringFields": "100",     # the trace schema has 33 fields
    "spark.hadoop.mapreduce.fileoutputcommitter.marksuccessfuljobs": "false",
}
# C1-only JIT and the serial GC: the miner's jobs are short, and C2 compilation
# mostly burns CPU the jobs never get back.  Measured: the JVM's CPU time for a
# first run on the test trace went from ~24 s to ~12-14 s (busy 2-vCPU machine).
JVM_OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"

LOG4J2 = """\
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = stderr
appender.stderr.type = Console
appender.stderr.name = stderr
appender.stderr.target = SYSTEM_ERR
appender.stderr.layout.type = PatternLayout
appender.stderr.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n%ex
logger.native.name = org.apache.hadoop.util.NativeCodeLoader
logger.native.level = error
"""

AGGREGATES = ("msg_latency", "msg_per_second", "msg_status", "req_phases", "req_per_second",
              "flush_stats", "flush_per_second", "flush_group_hist", "lag_stats", "lag_per_second",
              "slowest_msg", "slowest_req")
PLOTS = ("latency_over_time.png", "throughput_over_time.png", "request_time_over_time.png",
         "request_phases.png", "flush_group_sizes.png", "replication_lag.png")


class TraceError(Exception):
    """A problem with the world (arguments, input, environment): one line, no traceback."""


@dataclass
class Mined:
    trace_dir: str
    out_dir: str
    files: int
    counts: dict[str, int]              # records per kind
    malformed: int                      # lines that were not a JSON record with a kind (skipped)
    bad_fields: int                     # records kept with a wrongly typed field read as null
    t0_us: int | None
    t1_us: int | None
    aggregates: dict[str, list[dict]] = field(default_factory=dict)
    report_path: str = ""
    plots: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)     # wall time per step


# ---------------------------------------------------------------- input, Spark

def trace_files(trace_dir: str) -> list[str]:
    """The *.jsonl files Spark will read (it skips names starting with '.' or '_',
    so this does too).  TraceError if there is no such directory or file."""
    if not os.path.isdir(trace_dir):
        raise TraceError(f"{trace_dir}: no such directory")
    found = []
    for root, dirs, files in os.walk(trace_dir):
        dirs[:] = [d for d in dirs if not d.startswith((".", "_"))]
        found += [os.path.join(root, f) for f in files
                  if f.endswith(".jsonl") and not f.startswith((".", "_"))]
    if not found:
        raise TraceError(f"{trace_dir}: no *.jsonl trace files in it")
    return sorted(found)


def _java_check() -> None:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and os.access(os.path.join(java_home, "bin", "java"), os.X_OK):
        return
    if shutil.which("java") is None:
        raise TraceError("no Java runtime (java is not on PATH, JAVA_HOME unset): "
                         "Spark needs one; `make java` installs Debian's default-jre-headless")


def spark_session(master: str = "local[2]", driver_memory: str | None = None):
    """A SparkSession for the miner, created once per process and reused by getOrCreate.
    A local master binds to loopback only; a cluster master needs the driver reachable,
    so its address is left to Spark.  driver_memory (e.g. "4g") only takes effect if
    this starts the JVM."""
    _java_check()
    local = master.startswith("local")
    if local:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    log4j_path = os.path.join(tempfile.gettempdir(), f"mqtrace-log4j2-{os.getuid()}.properties")
    with open(log4j_path, "w", encoding="utf-8") as f:
        f.write(LOG4J2)
    from pyspark.sql import SparkSession
    builder = SparkSession.builder.master(master).appName("mqtrace")
    for k, v in SPARK_CONF.items():
        builder = builder.config(k, v)
    if local:
        builder = builder.config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
    builder = builder.config("spark.driver.extraJavaOptions",
                             f"-Dlog4j2.configurationFile=file:{log4j_path} {JVM_OPTS}")
    if driver_memory:
        builder = builder.config("spark.driver.memory", driver_memory)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def stop_spark(spark, timeout_s: float = 30.0) -> None:
    """Stops the session and the JVM behind it.  SparkSession.stop() ends the SparkContext but
    keeps the JVM until this Python process exits; the JVM ends when the pipe to its stdin
    closes, so that is closed and the JVM awaited (a test run must not leave it behind)."""
    from pyspark import SparkContext
    spark.stop()
    gateway = SparkContext._gateway
    if gateway is None:
        return
    proc = getattr(gateway, "proc", None)
    try:
        gateway.shutdown()
    except Exception:           # noqa: BLE001 - already gone; the pipe below still ends the JVM
        pass
    SparkContext._gateway = None
    SparkContext._jvm = None
    if proc is not None:
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout_s)


def spark_schema():
    from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType
    types = {"str": StringType(), "int": LongType(), "float": DoubleType()}
    return StructType([StructField(name, types[t], True) for name, t in FIELDS.items()]
                      + [StructField("_corrupt_record", StringType(), True)])


# ---------------------------------------------------------------- aggregates (Spark SQL)

def _pct_agg(expr: str, alias: str, pcts=PCTS) -> str:
    return f"percentile({expr}, array({', '.join(repr(p) for p in pcts)})) AS {alias}"


def _pct_cols(alias: str, fmt: str, names=PCT_NAMES) -> str:
    """Unpacks a percentile array: fmt has {} for the percentile's name."""
    return ", ".join(f"{alias}[{i}] AS {fmt.format(n)}" for i, n in enumerate(names))


def _legs_sql(t0_us: int) -> str:
    parts = []
    for stage, instant in (("ack", "ack_us"), ("consume", "consume_us")):
        parts.append(f"""
          SELECT coalesce(run, '{MISSING}') AS run, coalesce(mode, '{MISSING}') AS mode,
                 '{stage}' AS stage, coalesce(broker, '{MISSING}') AS broker, client, topic, queue,
                 queue_offset, size_bytes, batch, status, send_us, ack_us, store_ts_ms, consume_us,
                 {instant} AS t_us, {instant} - send_us AS latency_us,
                 ({instant} - {t0_us}) div {US_PER_S} AS sec
          FROM trace WHERE kind = 'msg' AND {instant} IS NOT NULL""")
    return " UNION ALL ".join(parts)


def _queries(t0_us: int) -> dict[str, tuple[str, str]]:
    """name -> (record kind it needs, SQL).  Views: trace (parsed records), legs (msg observations)."""
    lat = _pct_agg("latency_us", "p")
    lat_cols = _pct_cols("p", "latency_{}_us")
    sec = f"(ts_us - {t0_us}) div {US_PER_S}"
    phases = ", ".join(f"'{p}', {p}" for p in REQ_PHASES)
    q = {}
    q["msg_latency"] = ("msg", f"""
        SELECT run, mode, stage, coalesce(broker, '{ALL_BROKERS}') AS broker, msgs, bytes,
               first_us, last_us, (last_us - first_us) / 1e6 AS duration_s,
               CASE WHEN last_us > first_us THEN msgs / ((last_us - first_us) / 1e6) END AS msgs_per_s,
               latency_n, latency_mean_us, {lat_cols}, latency_max_us
        FROM (SELECT run, mode, stage, broker, count(*) AS msgs, sum(size_bytes) AS bytes,
                     min(t_us) AS first_us, max(t_us) AS last_us, count(latency_us) AS latency_n,
                     avg(latency_us) AS latency_mean_us, {lat}, max(latency_us) AS latency_max_us
              FROM legs GROUP BY GROUPING SETS ((run, mode, stage, broker), (run, mode, stage)))""")
    q["msg_per_second"] = ("msg", f"""
        SELECT run, mode, stage, coalesce(broker, '{ALL_BROKERS}') AS broker, sec, msgs, bytes,
               {lat_cols}, latency_max_us
        FROM (SELECT run, mode, stage, broker, sec, count(*) AS msgs, sum(size_bytes) AS bytes,
                     {lat}, max(latency_us) AS latency_max_us
              FROM legs GROUP BY GROUPING SETS ((run, mode, stage, broker, sec), (run, mode, stage, sec)))""")
    q["msg_status"] = ("msg", f"""
        SELECT coalesce(run, '{MISSING}') AS run, coalesce(mode, '{MISSING}') AS mode,
               coalesce(broker, '{MISSING}') AS broker, coalesce(status, '{MISSING}') AS status,
               count(*) AS msgs
        FROM trace WHERE kind = 'msg' GROUP BY 1, 2, 3, 4""")
    q["req_phases"] = ("req", f"""
        SELECT broker, code, phase, requests, n, mean_us, {_pct_cols("p", "{}_us")}, max_us
        FROM (SELECT broker, code, phase, count(*) AS requests, count(value_us) AS n,
                     avg(value_us) AS mean_us, {_pct_agg("value_us", "p")}, max(value_us) AS max_us
              FROM (SELECT coalesce(broker, '{MISSING}') AS broker, code,
                           stack({len(REQ_PHASES)}, {phases}) AS (phase, value_us)
                    FROM trace WHERE kind = 'req')
              GROUP BY broker, code, phase)""")
    q["req_per_second"] = ("req", f"""
        SELECT broker, code, sec, requests, msgs, p[0] AS total_p50_us, p[1] AS total_p99_us, total_max_us
        FROM (SELECT coalesce(broker, '{MISSING}') AS broker, code, {sec} AS sec, count(*) AS requests,
                     sum(msgs) AS msgs, {_pct_agg("total_us", "p", (0.5, 0.99))}, max(total_us) AS total_max_us
              FROM trace WHERE kind = 'req' AND ts_us IS NOT NULL GROUP BY 1, 2, 3)""")
    q["flush_stats"] = ("flush", f"""
        SELECT broker, flushes, msgs, bytes,
               group_msgs_mean, gm[0] AS group_msgs_p50, gm[1] AS group_msgs_p99, group_msgs_max,
               group_bytes_mean, gb[0] AS group_bytes_p50, gb[1] AS group_bytes_p99, group_bytes_max,
               flush_mean_us, {_pct_cols("f", "flush_{}_us")}, flush_max_us
        FROM (SELECT coalesce(broker, '{MISSING}') AS broker, count(*) AS flushes,
                     sum(group_msgs) AS msgs, sum(group_bytes) AS bytes,
                     avg(group_msgs) AS group_msgs_mean, {_pct_agg("group_msgs", "gm", (0.5, 0.99))},
                     max(group_msgs) AS group_msgs_max,
                     avg(group_bytes) AS group_bytes_mean, {_pct_agg("group_bytes", "gb", (0.5, 0.99))},
                     max(group_bytes) AS group_bytes_max,
                     avg(flush_us) AS flush_mean_us, {_pct_agg("flush_us", "f")}, max(flush_us) AS flush_max_us
              FROM trace WHERE kind = 'flush' GROUP BY 1)""")
    q["flush_per_second"] = ("flush", f"""
        SELECT broker, sec, flushes, msgs, bytes, group_msgs_mean, group_msgs_max,
               f[0] AS flush_p50_us, f[1] AS flush_p99_us, flush_max_us
        FROM (SELECT coalesce(broker, '{MISSING}') AS broker, {sec} AS sec, count(*) AS flushes,
                     sum(group_msgs) AS msgs, sum(group_bytes) AS bytes,
                     avg(group_msgs) AS group_msgs_mean, max(group_msgs) AS group_msgs_max,
                     {_pct_agg("flush_us", "f", (0.5, 0.99))}, max(flush_us) AS flush_max_us
              FROM trace WHERE kind = 'flush' AND ts_us IS NOT NULL GROUP BY 1, 2)""")
    q["flush_group_hist"] = ("flush", f"""
        SELECT coalesce(broker, '{MISSING}') AS broker, group_msgs, count(*) AS flushes
        FROM trace WHERE kind = 'flush' AND group_msgs IS NOT NULL GROUP BY 1, 2""")
    q["lag_stats"] = ("lag", f"""
        SELECT broker, slave, samples, lag_max_bytes, lag_mean_bytes, p[0] AS lag_p50_bytes,
               p[1] AS lag_p99_bytes, lag_last_bytes, first_us, last_us
        FROM (SELECT coalesce(broker, '{MISSING}') AS broker, coalesce(slave, '{MISSING}') AS slave,
                     count(*) AS samples, max(lag_bytes) AS lag_max_bytes, avg(lag_bytes) AS lag_mean_bytes,
                     {_pct_agg("lag_bytes", "p", (0.5, 0.99))}, max_by(lag_bytes, ts_us) AS lag_last_bytes,
                     min(ts_us) AS first_us, max(ts_us) AS last_us
              FROM trace WHERE kind = 'lag' GROUP BY 1, 2)""")
    q["lag_per_second"] = ("lag", f"""
        SELECT coalesce(broker, '{MISSING}') AS broker, coalesce(slave, '{MISSING}') AS slave,
               {sec} AS sec, count(*) AS samples, max(lag_bytes) AS lag_max_bytes
        FROM trace WHERE kind = 'lag' AND ts_us IS NOT NULL GROUP BY 1, 2, 3""")
    q["slowest_msg"] = ("msg", f"""
        SELECT run, mode, stage, broker, client, topic, queue, queue_offset, size_bytes, batch, status,
               send_us, ack_us, consume_us, t_us, sec, latency_us
        FROM legs WHERE latency_us IS NOT NULL
        ORDER BY latency_us DESC, t_us, broker, client, stage LIMIT {SLOWEST_N}""")
    req_cols = "broker, role, ts_us, code, msgs, size_bytes, status, " + ", ".join(REQ_PHASES)
    q["slowest_req"] = ("req", f"""
        SELECT {req_cols}, {sec} AS sec
        FROM trace WHERE kind = 'req' AND total_us IS NOT NULL
        ORDER BY total_us DESC, ts_us, broker LIMIT {SLOWEST_N}""")
    assert tuple(q) == AGGREGATES
    return q


def mine(spark, trace_dir: str, out_dir: str | None = None, fmt: str = "md",
         title: str | None = None) -> Mined:
    """Reads the trace, writes aggregates + plots + report under out_dir; returns
    everything computed (the tests compare it with plain Python).  TraceError if
    the directory holds no trace records."""
    assert fmt in ("md", "html"), fmt
    started = time.monotonic()
    files = trace_files(trace_dir)
    out_dir = out_dir or os.path.join(trace_dir, "report")
    os.makedirs(out_dir, exist_ok=True)
    seconds: dict[str, float] = {}

    raw = (spark.read.schema(spark_schema())
           .option("mode", "PERMISSIVE").option("columnNameOfCorruptRecord", "_corrupt_record")
           .option("recursiveFileLookup", "true").option("pathGlobFilter", "*.jsonl")
           .json(os.path.abspath(trace_dir)))
    # Cached once: every aggregate reads it, and Spark only allows queries on the
    # corrupt-record column of a cached JSON source.
    raw = raw.cache()
    raw.createOrReplaceTempView("raw")
    counts_sql = ", ".join(f"count_if(kind = '{k}') AS {k}" for k in KINDS)
    head = spark.sql(f"""
        SELECT least(min(send_us), min(ack_us), min(consume_us), min(ts_us)) AS t0_us,
               greatest(max(send_us), max(ack_us), max(consume_us), max(ts_us)) AS t1_us,
               {counts_sql}, count_if(kind IS NULL) AS malformed,
               count_if(kind IS NOT NULL AND _corrupt_record IS NOT NULL) AS bad_fields
        FROM raw WHERE kind IS NOT NULL OR _corrupt_record IS NOT NULL""").collect()[0].asDict()
    counts = {k: head[k] for k in KINDS}
    mined = Mined(trace_dir=trace_dir, out_dir=out_dir, files=len(files), counts=counts,
                  malformed=head["malformed"], bad_fields=head["bad_fields"], t0_us=head["t0_us"],
                  t1_us=head["t1_us"], seconds=seconds)
    seconds["read"] = time.monotonic() - started
    if sum(counts.values()) == 0 or mined.t0_us is None:
        raw.unpersist()
        raise TraceError(f"{trace_dir}: no trace records in {len(files)} *.jsonl file(s)")

    spark.sql("SELECT * FROM raw WHERE kind IS NOT NULL").createOrReplaceTempView("trace")
    spark.sql(_legs_sql(mined.t0_us)).createOrReplaceTempView("legs")
    agg_dir = os.path.join(out_dir, "aggregates")

    def one(name: str, sql: str) -> None:
        t = time.monotonic()
        df = spark.sql(sql).cache()
        df.coalesce(1).write.mode("overwrite").parquet(os.path.join(agg_dir, name))
        mined.aggregates[name] = [r.asDict() for r in df.collect()]   # from the cache
        df.unpersist()
        seconds[name] = time.monotonic() - t

    todo = []
    for name, (kind, sql) in _queries(mined.t0_us).items():
        if counts[kind] == 0:   # a stale aggregate from an earlier run would mislead
            shutil.rmtree(os.path.join(agg_dir, name), ignore_errors=True)
        else:
            todo.append((name, sql))
    with concurrent.futures.ThreadPoolExecutor(max_workers=JOB_THREADS) as pool:
        for f in [pool.submit(one, name, sql) for name, sql in todo]:
            f.result()
    raw.unpersist()

    t = time.monotonic()
    _sort_aggregates(mined.aggregates)
    mined.plots = make_plots(mined, os.path.join(out_dir, "plots"))
    mined.report_path = write_report(mined, fmt, title)
    seconds["report"] = time.monotonic() - t
    seconds["total"] = time.monotonic() - started
    return mined


def _key(v):
    """Sort key that puts None first and never compares None with a value."""
    return (v is not None, v)


SORT_KEYS = {
    "msg_latency": ("run", "mode", "stage", "broker"),
    "msg_per_second": ("run", "mode", "stage", "broker", "sec"),
    "msg_status": ("run", "mode", "broker", "status"),
    "req_phases": ("broker", "code", "phase"),
    "req_per_second": ("broker", "code", "sec"),
    "flush_stats": ("broker",),
    "flush_per_second": ("broker", "sec"),
    "flush_group_hist": ("broker", "group_msgs"),
    "lag_stats": ("broker", "slave"),
    "lag_per_second": ("broker", "slave", "sec"),
}


def _sort_aggregates(aggs: dict[str, list[dict]]) -> None:
    for name, keys in SORT_KEYS.items():
        if name in aggs:
            aggs[name].sort(key=lambda r: tuple(_key(r[k]) for k in keys))
    if "slowest_msg" in aggs:
        aggs["slowest_msg"].sort(key=lambda r: (-r["latency_us"], r["t_us"]))
    if "slowest_req" in aggs:
        aggs["slowest_req"].sort(key=lambda r: (-r["total_us"], _key(r["ts_us"])))


# ---------------------------------------------------------------- plots

def _code_name(code) -> str:
    from mq.wire.codes import REQUEST_NAMES
    if code is None:
        return "code ?"
    return REQUEST_NAMES.get(code, f"code {code}")


def _bytes_unit(max_bytes: float) -> tuple[float, str]:
    for div, unit in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if max_bytes >= div:
            return div, unit
    return 1, "bytes"


PLOT_CODES_MAX = 4          # request codes per broker in the request plots (the busiest)


def _busy_codes(rows: list[dict]) -> list[tuple]:
    """(broker, code) of the busiest request codes of each broker, busiest first: at most
    PLOT_CODES_MAX, and none under 1% of the broker's requests (admin calls at startup
    would only clutter a plot; the tables keep every code)."""
    requests: dict[tuple, int] = {}
    for r in rows:      # req_phases repeats a code's count once per phase: take it once
        k = (r["broker"], r["code"])
        if "phase" in r:
            requests[k] = r["requests"]
        else:
            requests[k] = requests.get(k, 0) + r["requests"]
    out = []
    for broker in sorted({b for b, _c in requests}):
        mine = sorted(((n, c) for (b, c), n in requests.items() if b == broker), key=lambda nc: (-nc[0], _key(nc[1])))
        total = sum(n for n, _c in mine)
        out += [(broker, c) for n, c in mine[:PLOT_CODES_MAX] if n * 100 >= total]
    return out


def _minor_label(v: float, _pos=None) -> str:
    """Labels 20, 30, 50 (200, 300, 500, ...) between the decades of a short log axis."""
    if v <= 0:
        return ""
    lead = round(v / 10 ** math.floor(math.log10(v)), 6)
    return f"{v:g}" if lead in (2, 3, 5) else ""


def make_plots(mined: Mined, plot_dir: str) -> list[str]:
    """Writes the PNGs the data supports; returns their paths.  Old PNGs of ours
    are removed first, so a plot never outlives the data it showed."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter

    os.makedirs(plot_dir, exist_ok=True)
    for name in PLOTS:
        try:
            os.remove(os.path.join(plot_dir, name))
        except FileNotFoundError:
            pass
    aggs = mined.aggregates
    made = []

    def save(fig, name):
        path = os.path.join(plot_dir, name)
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        made.append(path)

    def style(ax, title, ylabel, xlabel="seconds from start of trace", log_y=False, legend=True):
        ax.set_title(title, fontsize=11)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        if log_y:   # plain numbers on the axis (200, not 2x10^2); minor labels only on a short range
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
            lo, hi = ax.get_ylim()
            ax.yaxis.set_minor_formatter(FuncFormatter(_minor_label) if hi / lo < 100 else NullFormatter())
        if legend:
            ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)

    runs = {r["run"] for r in aggs.get("msg_latency", [])}

    def series_label(r):
        return (f"{r['run']} " if len(runs) > 1 else "") + f"{r['mode']} ({r['stage']})"

    per_s = [r for r in aggs.get("msg_per_second", []) if r["broker"] == ALL_BROKERS]
    groups: dict[tuple, list[dict]] = {}
    for r in per_s:
        groups.setdefault((r["run"], r["mode"], r["stage"]), []).append(r)

    if any(r["latency_p50_us"] is not None for r in per_s):
        fig, ax = plt.subplots(figsize=(10, 4.8))
        for i, (key, rows) in enumerate(sorted(groups.items())):
            rows = [r for r in rows if r["latency_p50_us"] is not None]
            if not rows:
                continue
            color = f"C{i % 10}"
            xs = [r["sec"] + 0.5 for r in rows]     # a second's value at its middle
            label = series_label(rows[0])
            ax.plot(xs, [r["latency_p50_us"] / 1000 for r in rows], color=color, lw=1.8, marker=".",
                    label=f"{label} p50")
            ax.plot(xs, [r["latency_p99_us"] / 1000 for r in rows], color=color, lw=1.2, ls="--", marker=".",
                    label=f"{label} p99")
        style(ax, "Message latency per second (all brokers): p50 solid, p99 dashed",
              "latency (ms, log scale)", log_y=True)
        save(fig, "latency_over_time.png")

    if per_s:
        fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(10, 6.4), sharex=True)
        max_bytes = max((r["bytes"] or 0) for r in per_s)
        div, unit = _bytes_unit(max_bytes)
        for i, (key, rows) in enumerate(sorted(groups.items())):
            # empty seconds between the first and last one are 0, not a gap: a stall must show
            by_sec = {r["sec"]: r for r in rows}
            secs = range(min(by_sec), max(by_sec) + 1)
            edges = range(min(by_sec), max(by_sec) + 2)
            color = f"C{i % 10}"
            label = series_label(rows[0])
            ax1.stairs([by_sec[s]["msgs"] if s in by_sec else 0 for s in secs], edges, color=color,
                       label=label, lw=1.5)
            ax2.stairs([(by_sec[s]["bytes"] or 0) / div if s in by_sec else 0 for s in secs], edges,
                       color=color, label=label, lw=1.5)
        ax1.set_ylim(bottom=0)
        ax2.set_ylim(bottom=0)
        style(ax1, "Throughput per second (all brokers; ack = produced, consume = consumed)",
              "messages / s", xlabel="")
        style(ax2, "", f"{unit} / s", legend=False)
        save(fig, "throughput_over_time.png")

    req_s = aggs.get("req_per_second", [])
    if any(r["total_p50_us"] is not None for r in req_s):
        brokers = sorted({r["broker"] for r in req_s})
        fig, axes = plt.subplots(len(brokers), 1, figsize=(10, 3.2 * len(brokers) + 0.8), sharex=True,
                                 squeeze=False)
        busy = _busy_codes(req_s)
        colors = {c: f"C{i % 10}" for i, c in enumerate(sorted({c for b, c in busy}, key=_key))}
        for ax, broker in zip(axes[:, 0], brokers):
            for code in [c for b, c in busy if b == broker]:
                rows = [r for r in req_s if r["broker"] == broker and r["code"] == code
                        and r["total_p50_us"] is not None]
                xs = [r["sec"] + 0.5 for r in rows]
                ax.plot(xs, [r["total_p50_us"] for r in rows], color=colors[code], lw=1.8, marker=".",
                        label=f"{_code_name(code)} p50")
                ax.plot(xs, [r["total_p99_us"] for r in rows], color=colors[code], lw=1.2, ls="--", marker=".",
                        label=f"{_code_name(code)} p99")
            style(ax, f"{broker}: request time in the broker (total_us) per second, p50 solid, p99 dashed",
                  "µs (log scale)", xlabel="seconds from start of trace" if ax is axes[-1, 0] else "",
                  log_y=True)
        save(fig, "request_time_over_time.png")

    phases = aggs.get("req_phases", [])
    if phases:
        mean = {(r["broker"], r["code"], r["phase"]): (r["mean_us"] or 0.0) for r in phases}
        requests = {(r["broker"], r["code"]): r["requests"] for r in phases}
        bars = _busy_codes(phases)
        parts = [p for p in REQ_PHASES if p != "total_us"]
        fig, ax = plt.subplots(figsize=(10, 1.0 + 0.55 * len(bars)))
        left = [0.0] * len(bars)
        labels = [f"{b} {_code_name(c)} (n={requests[(b, c)]:,})" for b, c in bars]
        for i, phase in enumerate(parts + ["other"]):
            if phase == "other":    # time in total_us not covered by a traced phase
                widths = [max(0.0, mean[(b, c, "total_us")] - sum(mean[(b, c, p)] for p in parts))
                          for b, c in bars]
                color = "lightgray"
            else:
                widths = [mean[(b, c, phase)] for b, c in bars]
                color = f"C{i}"
            ax.barh(labels, widths, left=left, color=color, label=phase.removesuffix("_us"))
            left = [a + w for a, w in zip(left, widths)]
        ax.invert_yaxis()
        style(ax, "Where a request's time goes in the broker (mean per request)", "",
              xlabel="mean time per request (µs)")
        save(fig, "request_phases.png")

    hist = aggs.get("flush_group_hist", [])
    if hist:
        fig, ax = plt.subplots(figsize=(10, 4.2))
        brokers = sorted({r["broker"] for r in hist})
        max_g = max(r["group_msgs"] for r in hist)
        min_g = min(r["group_msgs"] for r in hist)
        wide = max_g - min_g > 80
        if not wide:                # one bar per group size
            edges = [g - 0.5 for g in range(min_g, max_g + 2)]
        else:                       # 40 bins of equal ratio: small groups keep their detail
            lo, hi = max(min_g, 1) - 0.5, max_g + 0.5
            edges = [lo * (hi / lo) ** (i / 40) for i in range(41)]
        for broker in brokers:
            rows = [r for r in hist if r["broker"] == broker]
            ax.hist([r["group_msgs"] for r in rows], weights=[r["flushes"] for r in rows], bins=edges,
                    alpha=0.55 if len(brokers) > 1 else 0.85, label=broker)
        if wide:
            ax.set_xscale("log")
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
        style(ax, "Flush group sizes (messages made durable by one msync)", "flushes (log scale)" if wide
              else "flushes", xlabel="messages per flush (group_msgs" + (", log scale)" if wide else ")"),
              log_y=wide)
        save(fig, "flush_group_sizes.png")

    lag_s = aggs.get("lag_per_second", [])
    if lag_s:
        fig, ax = plt.subplots(figsize=(10, 4.2))
        div, unit = _bytes_unit(max(r["lag_max_bytes"] or 0 for r in lag_s))
        for i, key in enumerate(sorted({(r["broker"], r["slave"]) for r in lag_s})):
            rows = [r for r in lag_s if (r["broker"], r["slave"]) == key and r["lag_max_bytes"] is not None]
            ax.plot([r["sec"] + 0.5 for r in rows], [r["lag_max_bytes"] / div for r in rows], color=f"C{i % 10}",
                    marker=".", ms=4, label=f"{key[0]} -> {key[1]}")
        ax.set_ylim(bottom=0)
        style(ax, "Replication lag: master offset minus slave ack (max per second)", f"lag ({unit})")
        save(fig, "replication_lag.png")
    return made


# ---------------------------------------------------------------- report

class Doc:
    """A report as blocks, rendered to Markdown or HTML."""

    def __init__(self):
        self.blocks: list[tuple] = []

    def h(self, level: int, text: str):
        self.blocks.append(("h", level, text))

    def p(self, text: str):
        self.blocks.append(("p", text))

    def table(self, header: list[str], rows: list[list]):
        self.blocks.append(("table", header, rows))

    def img(self, rel_path: str, alt: str):
        self.blocks.append(("img", rel_path, alt))

    def markdown(self) -> str:
        out = []
        for b in self.blocks:
            if b[0] == "h":
                out.append("#" * b[1] + " " + b[2])
            elif b[0] == "p":
                out.append(b[1])
            elif b[0] == "img":
                out.append(f"![{b[2]}]({b[1]})")
            else:
                cell = lambda v: str(v).replace("|", "\\|")
                lines = ["| " + " | ".join(b[1]) + " |", "|" + "---|" * len(b[1])]
                lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in b[2]]
                out.append("\n".join(lines))
        return "\n\n".join(out) + "\n"

    def html(self, title: str) -> str:
        e = html.escape
        out = [f"<!doctype html><html><head><meta charset='utf-8'><title>{e(title)}</title>",
               "<style>body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em}"
               "table{border-collapse:collapse;font-size:13px;margin:.5em 0}"
               "td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}"
               "th{background:#f2f2f2}img{max-width:100%}</style></head><body>"]
        for b in self.blocks:
            if b[0] == "h":
                out.append(f"<h{b[1]}>{e(b[2])}</h{b[1]}>")
            elif b[0] == "p":
                out.append("<p>" + re.sub(r"`([^`]*)`", r"<code>\1</code>", e(b[1])) + "</p>")
            elif b[0] == "img":
                out.append(f"<p><img src='{e(b[1])}' alt='{e(b[2])}'></p>")
            else:
                out.append("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in b[1]) + "</tr>")
                out += ["<tr>" + "".join(f"<td>{e(str(v))}</td>" for v in row) + "</tr>" for row in b[2]]
                out.append("</table>")
        out.append("</body></html>")
        return "\n".join(out) + "\n"


def _n(v, digits: int = 0) -> str:
    if v is None:
        return "–"
    if digits == 0:
        return f"{int(round(v)):,}"
    return f"{v:,.{digits}f}"


def _ms(us) -> str:
    if us is None:
        return "–"
    ms = us / 1000
    return f"{ms:.3f}" if ms < 10 else f"{ms:,.1f}"


def _us(us) -> str:
    if us is None:
        return "–"
    return f"{us:.1f}" if us < 1000 else f"{us:,.0f}"


def _size(b) -> str:
    if b is None:
        return "–"
    div, unit = _bytes_unit(b)
    return f"{b:,} B" if div == 1 else f"{b / div:.2f} {unit}"


def write_report(mined: Mined, fmt: str, title: str | None) -> str:
    aggs = mined.aggregates
    title = title or f"mqtrace report: {os.path.basename(os.path.abspath(mined.trace_dir))}"
    plots = {os.path.basename(p) for p in mined.plots}
    doc = Doc()

    def plot(name, alt):
        if name in plots:
            doc.img(f"plots/{name}", alt)

    doc.h(1, title)
    start = datetime.datetime.fromtimestamp(mined.t0_us / US_PER_S, datetime.timezone.utc)
    span_s = (mined.t1_us - mined.t0_us) / US_PER_S
    kinds = ", ".join(f"{mined.counts[k]:,} {k}" for k in KINDS)
    doc.p(f"Trace `{mined.trace_dir}`: {mined.files} file(s), {kinds} records"
          + (f", {mined.malformed:,} malformed line(s) skipped" if mined.malformed else "")
          + (f", {mined.bad_fields:,} record(s) with a wrongly typed field (read as null)"
             if mined.bad_fields else "")
          + f". Starts {start:%Y-%m-%d %H:%M:%S} UTC and spans {span_s:.1f} s; every time axis is seconds"
          f" from that start. Aggregates are Parquet under `aggregates/`; percentiles are exact"
          f" (linear interpolation); latencies of messages are in ms, times inside the broker in µs.")

    doc.h(2, "Messages")
    lat = aggs.get("msg_latency")
    if not lat:
        doc.p("No msg records in this trace (no load generator trace).")
    else:
        doc.p("Each message counts once per answer it got: stage `ack` is send → ack (produce latency),"
              " `consume` is send → consume (end to end). Broker `*` is all brokers together.")
        header = ["run", "mode", "stage", "broker", "msgs", "duration s", "msgs/s", "MiB/s", "p50 ms", "p90 ms",
                  "p99 ms", "p99.9 ms", "max ms"]
        rows = [[r["run"], r["mode"], r["stage"], r["broker"], _n(r["msgs"]), _n(r["duration_s"], 1),
                 _n(r["msgs_per_s"]),
                 _n(r["bytes"] / r["duration_s"] / 2**20, 2) if r["bytes"] and r["duration_s"] else "–",
                 _ms(r["latency_p50_us"]), _ms(r["latency_p90_us"]),
                 _ms(r["latency_p99_us"]), _ms(r["latency_p999_us"]), _ms(r["latency_max_us"])]
                for r in sorted(lat, key=lambda r: (r["run"], r["mode"], r["stage"], r["broker"] != ALL_BROKERS,
                                                    r["broker"]))]
        doc.table(header, rows)
        plot("latency_over_time.png", "latency percentiles over time")
        plot("throughput_over_time.png", "throughput over time")
        status = aggs.get("msg_status", [])
        doc.h(3, "Answers")
        doc.table(["run", "mode", "broker", "status", "msgs"],
                  [[r["run"], r["mode"], r["broker"], r["status"], _n(r["msgs"])] for r in status])

    doc.h(2, "Requests inside the broker")
    phases = aggs.get("req_phases")
    if not phases:
        doc.p("No req records in this trace (broker tracing was off).")
    else:
        doc.p("Per request code: p50 / p99 of each traced phase in µs (p99.9 and max are in"
              " `aggregates/req_phases`). – means the phase was not traced (e.g. no replication wait on an"
              " async master).")
        by = {(r["broker"], r["code"], r["phase"]): r for r in phases}
        # busiest codes first within a broker
        keys = sorted({(r["broker"], r["code"]) for r in phases},
                      key=lambda k: (k[0], -by[(k[0], k[1], REQ_PHASES[0])]["requests"], _key(k[1])))
        rows = []
        for b, c in keys:
            cells = []
            for p in REQ_PHASES:
                r = by[(b, c, p)]
                cells.append("–" if r["n"] == 0 else f"{_us(r['p50_us'])} / {_us(r['p99_us'])}")
            rows.append([b, _code_name(c), _n(by[(b, c, REQ_PHASES[0])]["requests"])] + cells)
        doc.table(["broker", "request", "requests"] + [p.removesuffix("_us") for p in REQ_PHASES], rows)
        plot("request_phases.png", "request phase breakdown")
        plot("request_time_over_time.png", "request time over time")

    doc.h(2, "Flushes (group commit)")
    flush = aggs.get("flush_stats")
    if not flush:
        doc.p("No flush records in this trace.")
    else:
        doc.table(["broker", "flushes", "msgs", "msgs/flush mean", "p50", "p99", "max", "bytes/flush p99",
                   "flush p50 µs", "p99 µs", "max µs"],
                  [[r["broker"], _n(r["flushes"]), _n(r["msgs"]), _n(r["group_msgs_mean"], 1),
                    _n(r["group_msgs_p50"], 1), _n(r["group_msgs_p99"], 1), _n(r["group_msgs_max"]),
                    _size(r["group_bytes_p99"] and int(r["group_bytes_p99"])), _us(r["flush_p50_us"]),
                    _us(r["flush_p99_us"]), _us(r["flush_max_us"])] for r in flush])
        plot("flush_group_sizes.png", "flush group size histogram")

    doc.h(2, "Replication lag")
    lag = aggs.get("lag_stats")
    if not lag:
        doc.p("No lag samples in this trace (no slave, or broker tracing was off).")
    else:
        doc.table(["master", "slave", "samples", "max lag", "mean", "p99", "last"],
                  [[r["broker"], r["slave"], _n(r["samples"]), _size(r["lag_max_bytes"]),
                    _size(r["lag_mean_bytes"] and int(r["lag_mean_bytes"])),
                    _size(r["lag_p99_bytes"] and int(r["lag_p99_bytes"])), _size(r["lag_last_bytes"])]
                   for r in lag])
        plot("replication_lag.png", "replication lag over time")

    doc.h(2, f"Slowest {SLOWEST_N}")
    slow_msg = aggs.get("slowest_msg", [])
    if slow_msg:
        doc.h(3, "Messages (by latency)")
        doc.table(["t s", "run", "mode", "stage", "broker", "client", "queue", "queue offset", "status",
                   "latency ms"],
                  [[_n((r["t_us"] - mined.t0_us) / US_PER_S, 3), r["run"], r["mode"], r["stage"], r["broker"],
                    r["client"] or MISSING, _n(r["queue"]), _n(r["queue_offset"]), r["status"] or MISSING,
                    _ms(r["latency_us"])] for r in slow_msg])
    slow_req = aggs.get("slowest_req", [])
    if slow_req:
        doc.h(3, "Requests (by total_us)")
        doc.table(["t s", "broker", "role", "request", "msgs"] + [p.removesuffix("_us") + " µs" for p in REQ_PHASES],
                  [[_n((r["ts_us"] - mined.t0_us) / US_PER_S, 3) if r["ts_us"] is not None else "–",
                    r["broker"] or MISSING, r["role"] or MISSING, _code_name(r["code"]), _n(r["msgs"])]
                   + [_us(r[p]) for p in REQ_PHASES] for r in slow_req])
    if not slow_msg and not slow_req:
        doc.p("No latencies in this trace.")

    path = os.path.join(mined.out_dir, "report." + fmt)
    with open(path, "w", encoding="utf-8") as f:
        f.write(doc.markdown() if fmt == "md" else doc.html(title))
    return path


# ---------------------------------------------------------------- CLI

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="mqtrace", description="Mine a directory of mq perf traces with Spark: "
                                 "Parquet aggregates and a report with plots.")
    ap.add_argument("trace_dir", metavar="TRACE_DIR", help="directory of *.jsonl trace files (read recursively)")
    ap.add_argument("-o", "--out", metavar="OUT_DIR", help="output directory (default TRACE_DIR/report)")
    ap.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    ap.add_argument("--format", choices=("md", "html"), default="md", help="report format (default md)")
    ap.add_argument("--title", help="report title")
    ap.add_argument("--driver-memory", metavar="SIZE", help="Spark driver memory, e.g. 4g (default Spark's 1g; "
                    "exact percentiles of ~10 M latencies in one group need more)")
    a = ap.parse_args(argv)
    try:
        require("pyspark", "matplotlib", what="mqtrace")
    except MissingExtra as e:
        print(f"mqtrace: {e}", file=sys.stderr)
        return 1
    try:
        trace_files(a.trace_dir)
    except TraceError as e:
        print(f"mqtrace: {e}", file=sys.stderr)
        return 2
    try:
        spark = spark_session(a.master, a.driver_memory)
    except TraceError as e:
        print(f"mqtrace: {e}", file=sys.stderr)
        return 1
    except Exception as e:      # the JVM did not start: say why in one line
        print(f"mqtrace: could not start Spark ({a.master}): {str(e).strip().splitlines()[0]}", file=sys.stderr)
        return 1
    try:
        mined = mine(spark, a.trace_dir, a.out, a.format, a.title)
    except TraceError as e:
        print(f"mqtrace: {e}", file=sys.stderr)
        return 2
    finally:
        stop_spark(spark)
    print(f"mqtrace: {sum(mined.counts.values()):,} records from {mined.files} file(s) in "
          f"{mined.seconds['total']:.1f} s; report {mined.report_path}, {len(mined.plots)} plot(s), "
          f"aggregates under {os.path.join(mined.out_dir, 'aggregates')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
