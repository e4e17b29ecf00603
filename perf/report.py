"""A real load run, traced end to end, mined into a report: `make report`
(= `python -m perf.report OUT_DIR`, from the repository root).

1. starts, on 127.0.0.1 with free ports and a temporary directory, a name
   server and a SYNC_MASTER + SLAVE pair with SYNC_FLUSH and perfTraceEnable,
   so every kind of trace record is produced (req, flush, lag, msg);
2. runs mqperf in phases against it, each writing its own trace records:
   produce one at a time, produce with 64 requests in flight, batched
   produce (100 x 1 KiB), then end to end (producers and consumers at once);
3. stops the brokers (their trace writers flush on the way down);
4. mines the whole trace directory with mqtrace (Spark, local mode) into
   OUT_DIR: report.md, PNG plots, Parquet aggregates.  The raw trace is
   kept under OUT_DIR/trace only with --keep-trace (it is large).

The phases are short (a few seconds each, --scale to change): the point is
a report a person can read about a real run, not a gate."""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

PHASES = (
    # (name, mqperf options)
    ("one at a time", dict(mode="produce", procs=1, in_flight=1, batch=1)),
    ("64 in flight", dict(mode="produce", procs=2, in_flight=32, batch=1)),
    ("batches of 100", dict(mode="produce", procs=1, in_flight=4, batch=100)),
    ("end to end", dict(mode="e2e", procs=1, in_flight=16, batch=1)),
)


def _cluster(workdir: str, trace_dir: str):
    # real processes (mqnamesrv, mqbroker) on free loopback ports, serving when these return
    from mq.cluster import Broker, NameServer, wait_for
    ns = NameServer(workdir)
    common = dict(flushDiskType="SYNC_FLUSH", perfTraceEnable="true", mappedFileSizeCommitLog=64 * 1024 * 1024,
                  sendMessageThreadPoolNums=1)
    master = Broker(workdir, ns.addr, name="broker-a", brokerRole="SYNC_MASTER",
                    perfTraceDir=os.path.join(trace_dir, "broker-a-master"), **common)
    slave = Broker(workdir, ns.addr, name="broker-a", brokerId=1, brokerRole="SLAVE",
                   haMasterAddress=f"127.0.0.1:{master.port + 1}",
                   perfTraceDir=os.path.join(trace_dir, "broker-a-slave"), **common)
    return ns, master, slave, wait_for


def run(out_dir: str, scale: float = 1.0, keep_trace: bool = False) -> str:
    from . import mqperf
    from . import mqtrace
    work = tempfile.mkdtemp(prefix="mq-report-")
    trace_dir = os.path.join(work, "trace")
    procs = []
    try:
        ns, master, slave, wait_for = _cluster(work, trace_dir)
        procs = [slave, master, ns]
        # SYNC_MASTER answers 11 until its slave is connected
        from mq.broker.hastatus import HAStatus
        wait_for(lambda: HAStatus(master.dir).slaves(), 30, 0.1, "the slave to connect")
        for name, opts in PHASES:
            o = mqperf.Options(namesrv=ns.addr, topic="ReportTopic", queues=8, create_topic=True,
                               duration_s=5.0 * scale, trace_dir=os.path.join(trace_dir, "mqperf"),
                               run_id=name.replace(" ", "-"), progress_interval_s=0, **opts)
            s = mqperf.run(o)
            print(f"report: phase {name!r}: {s.messages:,} messages, {s.msgs_per_s:,.0f} msgs/s, "
                  f"p50 {s.latency.p50_us} us, p99 {s.latency.p99_us} us", file=sys.stderr)
        for p in procs:
            p.stop()
        procs = []
        spark = mqtrace.spark_session()
        try:
            mined = mqtrace.mine(spark, trace_dir, out_dir, "md",
                                 "mq perf report: SYNC_MASTER + SLAVE, SYNC_FLUSH, 1 KiB messages (make report)")
        finally:
            mqtrace.stop_spark(spark)
        if keep_trace:
            shutil.copytree(trace_dir, os.path.join(out_dir, "trace"), dirs_exist_ok=True)
        return mined.report_path
    finally:
        for p in procs:
            try:
                p.stop()
            except Exception:
                pass
        shutil.rmtree(work, ignore_errors=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m perf.report", description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", metavar="OUT_DIR", help="where report.md, plots/ and aggregates/ go")
    ap.add_argument("--scale", type=float, default=1.0, help="phase length multiplier (1 = 5 s a phase)")
    ap.add_argument("--keep-trace", action="store_true", help="copy the raw trace into OUT_DIR/trace")
    a = ap.parse_args(argv)
    if a.scale <= 0:
        print("report: --scale must be > 0", file=sys.stderr)
        return 2
    from .extras import MissingExtra, require
    try:
        require("pyspark", "matplotlib", what="the report (mqtrace mines it)")
    except MissingExtra as e:
        print(f"report: {e}", file=sys.stderr)
        return 1
    t0 = time.monotonic()
    path = run(a.out_dir, a.scale, a.keep_trace)
    print(f"report: {path} ({time.monotonic() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
