"""The trace miner (perf/mqtrace.py) against plain Python.

A deterministic synthetic trace (perf/tracegen.py: all four record kinds, two
brokers, ~20 s, ~11 k records, nulls, a torn line) is mined once with Spark (one
session for the module).  Every aggregate is then recomputed here, in plain
Python, from the same records by the definitions in mqtrace's docstring, and
compared: counts, sums and percentiles exactly, means within float tolerance
(Spark sums in another order).  The percentile here is written independently
of Spark, as the definition says.  The report, its plots and the CLI (a real
subprocess, on a trace with missing kinds and nulls) are checked too.
"""
from __future__ import annotations

import json
import math
import os
import re
import shutil
import struct
import subprocess
import sys

import pytest

from mq.trace import REQ_PHASES
from perf import mqtrace, tracegen

if not os.environ.get("JAVA_HOME") and shutil.which("java") is None:
    pytest.skip("no Java runtime for Spark (`make java` installs one)", allow_module_level=True)

MISSING, ALL = "-", "*"
INSTANTS = ("send_us", "ack_us", "consume_us", "ts_us")
PCTS = {"p50": 0.5, "p90": 0.9, "p99": 0.99, "p999": 0.999}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# ---------------------------------------------------------------- plain-Python reference

def read_trace(directory: str) -> tuple[list[dict], int]:
    """(records, malformed lines) of every *.jsonl under directory, skipping what Spark skips."""
    recs, bad = [], 0
    for root, dirs, files in os.walk(directory):
        dirs[:] = [d for d in dirs if not d.startswith((".", "_"))]
        for name in files:
            if not name.endswith(".jsonl") or name.startswith((".", "_")):
                continue
            with open(os.path.join(root, name), encoding="utf-8") as f:
                for line in f:
                    if not line.strip():
                        continue
                    try:
                        rec = json.loads(line)
                    except ValueError:
                        bad += 1
                        continue
                    recs.append(rec)
    return recs, bad


def pct(values: list, p: float) -> float | None:
    """Linear interpolation between closest ranks: position (n-1)*p in the sorted values."""
    v = sorted(values)
    if not v:
        return None
    pos = (len(v) - 1) * p
    lo, hi = math.floor(pos), math.ceil(pos)
    if lo == hi or v[lo] == v[hi]:
        return float(v[lo])
    return (hi - pos) * v[lo] + (pos - lo) * v[hi]


def key(rec: dict, name: str):
    v = rec.get(name)
    return MISSING if v is None else v


def nonnull(rows, name):
    return [r[name] for r in rows if r.get(name) is not None]


def total(values):
    return sum(values) if values else None


def mean(values):
    return sum(values) / len(values) if values else None


def maximum(values):
    return max(values) if values else None


def group(rows, keyfn) -> dict:
    out: dict = {}
    for r in rows:
        out.setdefault(keyfn(r), []).append(r)
    return out


def t0_of(recs) -> int:
    return min(r[f] for r in recs for f in INSTANTS if r.get(f) is not None)


def sec_of(instant_us: int, t0_us: int) -> int:
    return (instant_us - t0_us) // 1_000_000


def legs(recs: list[dict], t0_us: int) -> list[dict]:
    """One observation per answer a msg record got (stage ack / consume)."""
    out = []
    for r in recs:
        if r["kind"] != "msg":
            continue
        for stage, instant in (("ack", "ack_us"), ("consume", "consume_us")):
            t = r.get(instant)
            if t is None:
                continue
            send = r.get("send_us")
            out.append({"run": key(r, "run"), "mode": key(r, "mode"), "stage": stage, "broker": key(r, "broker"),
                        "client": r.get("client"), "queue": r.get("queue"), "queue_offset": r.get("queue_offset"),
                        "send_us": send, "size_bytes": r.get("size_bytes"), "t_us": t,
                        "latency_us": None if send is None else t - send, "sec": sec_of(t, t0_us)})
    return out


def with_all_brokers(obs: list[dict], extra_keys: tuple = ()) -> dict:
    """Groups by (run, mode, stage, broker, *extra) and also with broker = '*'."""
    base = ("run", "mode", "stage")
    g = group(obs, lambda o: tuple(o[k] for k in base) + (o["broker"],) + tuple(o[k] for k in extra_keys))
    g.update(group(obs, lambda o: tuple(o[k] for k in base) + (ALL,) + tuple(o[k] for k in extra_keys)))
    return g


def latency_pcts(lat: list) -> dict:
    d = {f"latency_{n}_us": pct(lat, p) for n, p in PCTS.items()}
    d["latency_max_us"] = maximum(lat)
    return d


def expected_msg_latency(obs):
    exp = {}
    for k, rows in with_all_brokers(obs).items():
        lat = nonnull(rows, "latency_us")
        ts = [r["t_us"] for r in rows]
        first, last = min(ts), max(ts)
        exp[k] = {"msgs": len(rows), "bytes": total(nonnull(rows, "size_bytes")), "first_us": first,
                  "last_us": last, "duration_s": (last - first) / 1e6,
                  "msgs_per_s": len(rows) / ((last - first) / 1e6) if last > first else None,
                  "latency_n": len(lat), "latency_mean_us": mean(lat), **latency_pcts(lat)}
    return exp


def check(actual: list[dict], expected: dict, keys: tuple, close: tuple = ()) -> None:
    """Every expected group is a row with these values, and no other row exists."""
    got = {tuple(r[k] for k in keys): r for r in actual}
    assert len(got) == len(actual), "duplicate group rows"
    assert set(got) == set(expected), (set(got) ^ set(expected))
    for k, exp in expected.items():
        for name, value in exp.items():
            if name in close and value is not None:
                assert got[k][name] == pytest.approx(value, rel=1e-9), (k, name)
            else:
                assert got[k][name] == value, (k, name, got[k][name], value)


# ---------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("trace"))
    counts = tracegen.generate(directory, seed=7)
    recs, bad = read_trace(directory)
    assert bad == 1 and sum(counts.values()) == len(recs)       # the torn line
    return directory, recs, bad


@pytest.fixture(scope="module")
def spark():
    s = mqtrace.spark_session("local[2]")
    yield s
    mqtrace.stop_spark(s)


@pytest.fixture(scope="module")
def mined(spark, trace, tmp_path_factory):
    directory, _recs, _bad = trace
    return mqtrace.mine(spark, directory, str(tmp_path_factory.mktemp("out")), title="test trace")


# ---------------------------------------------------------------- tests

def test_counts_t0_and_malformed_lines(mined, trace):
    """The miner reads every record of every *.jsonl in subdirectories, counts the torn line as
    malformed instead of failing, and takes t0 as the earliest instant of any kind."""
    directory, recs, bad = trace
    assert mined.files == 8
    assert mined.counts == {k: sum(r["kind"] == k for r in recs) for k in ("msg", "req", "flush", "lag")}
    assert min(mined.counts.values()) > 0
    assert mined.malformed == bad == 1
    assert mined.bad_fields == 0
    assert mined.t0_us == t0_of(recs)
    assert mined.t1_us == max(r[f] for r in recs for f in INSTANTS if r.get(f) is not None)


def test_msg_latency_per_mode_stage_and_broker(mined, trace):
    """Message counts, bytes, duration, msgs/s and exact latency percentiles per run, mode, stage
    and broker (and all brokers) equal the plain-Python figures, nulls (no send_us) excluded."""
    _d, recs, _b = trace
    obs = legs(recs, t0_of(recs))
    exp = expected_msg_latency(obs)
    assert any(k[1] == "e2e" and k[2] == "consume" for k in exp)         # e2e records give 2 stages
    assert any(e["latency_n"] < e["msgs"] for e in exp.values())          # consume records without send_us
    check(mined.aggregates["msg_latency"], exp, ("run", "mode", "stage", "broker"),
          close=("latency_mean_us", "msgs_per_s", "duration_s"))


def test_msg_throughput_and_latency_per_second(mined, trace):
    """Per second of the answer's instant: messages, bytes and latency percentiles equal plain Python;
    the generated stall (seconds 12-13) shows up as a throughput dip."""
    _d, recs, _b = trace
    obs = legs(recs, t0_of(recs))
    exp = {k: {"msgs": len(rows), "bytes": total(nonnull(rows, "size_bytes")),
               **latency_pcts(nonnull(rows, "latency_us"))} for k, rows in with_all_brokers(obs, ("sec",)).items()}
    check(mined.aggregates["msg_per_second"], exp, ("run", "mode", "stage", "broker", "sec"))
    produced = {r["sec"]: r["msgs"] for r in mined.aggregates["msg_per_second"]
                if (r["mode"], r["stage"], r["broker"]) == ("produce", "ack", ALL)}
    assert produced[12] * 5 < produced[5]


def test_msg_status_counts(mined, trace):
    """Answer status counts per run, mode and broker cover every msg record, failed sends included."""
    _d, recs, _b = trace
    msgs = [r for r in recs if r["kind"] == "msg"]
    exp = {k: {"msgs": len(rows)} for k, rows in
           group(msgs, lambda r: (key(r, "run"), key(r, "mode"), key(r, "broker"), key(r, "status"))).items()}
    assert any(k[3].startswith("ERROR:") for k in exp)
    check(mined.aggregates["msg_status"], exp, ("run", "mode", "broker", "status"))


def test_req_phase_percentiles(mined, trace):
    """Per broker, request code and phase: request count, non-null count, mean and exact
    percentiles; phases a request lacks (an async master's repl_wait_us) are null, not zero."""
    _d, recs, _b = trace
    reqs = [r for r in recs if r["kind"] == "req"]
    exp = {}
    for (broker, code), rows in group(reqs, lambda r: (key(r, "broker"), r.get("code"))).items():
        for phase in REQ_PHASES:
            v = nonnull(rows, phase)
            exp[(broker, code, phase)] = {"requests": len(rows), "n": len(v), "mean_us": mean(v),
                                          **{f"{n}_us": pct(v, p) for n, p in PCTS.items()}, "max_us": maximum(v)}
    assert exp[("broker-b", 310, "repl_wait_us")]["n"] == 0
    check(mined.aggregates["req_phases"], exp, ("broker", "code", "phase"), close=("mean_us",))


def test_req_per_second(mined, trace):
    """Per broker, code and second of ts_us: requests, messages and total_us p50/p99/max."""
    _d, recs, _b = trace
    t0 = t0_of(recs)
    reqs = [r for r in recs if r["kind"] == "req" and r.get("ts_us") is not None]
    exp = {}
    for k, rows in group(reqs, lambda r: (key(r, "broker"), r.get("code"), sec_of(r["ts_us"], t0))).items():
        v = nonnull(rows, "total_us")
        exp[k] = {"requests": len(rows), "msgs": total(nonnull(rows, "msgs")), "total_p50_us": pct(v, 0.5),
                  "total_p99_us": pct(v, 0.99), "total_max_us": maximum(v)}
    check(mined.aggregates["req_per_second"], exp, ("broker", "code", "sec"))


def test_flush_group_sizes(mined, trace):
    """Flush group statistics per broker, per second, and the group-size histogram."""
    _d, recs, _b = trace
    t0 = t0_of(recs)
    flushes = [r for r in recs if r["kind"] == "flush"]
    exp = {}
    for (broker,), rows in group(flushes, lambda r: (key(r, "broker"),)).items():
        gm, gb, fu = nonnull(rows, "group_msgs"), nonnull(rows, "group_bytes"), nonnull(rows, "flush_us")
        exp[(broker,)] = {"flushes": len(rows), "msgs": total(gm), "bytes": total(gb),
                          "group_msgs_mean": mean(gm), "group_msgs_p50": pct(gm, 0.5), "group_msgs_p99": pct(gm, 0.99),
                          "group_msgs_max": maximum(gm), "group_bytes_mean": mean(gb),
                          "group_bytes_p50": pct(gb, 0.5), "group_bytes_p99": pct(gb, 0.99),
                          "group_bytes_max": maximum(gb), "flush_mean_us": mean(fu),
                          **{f"flush_{n}_us": pct(fu, p) for n, p in PCTS.items()}, "flush_max_us": maximum(fu)}
    check(mined.aggregates["flush_stats"], exp, ("broker",),
          close=("group_msgs_mean", "group_bytes_mean", "flush_mean_us"))

    exp = {}
    for k, rows in group(flushes, lambda r: (key(r, "broker"), sec_of(r["ts_us"], t0))).items():
        gm, fu = nonnull(rows, "group_msgs"), nonnull(rows, "flush_us")
        exp[k] = {"flushes": len(rows), "msgs": total(gm), "bytes": total(nonnull(rows, "group_bytes")),
                  "group_msgs_mean": mean(gm), "group_msgs_max": maximum(gm), "flush_p50_us": pct(fu, 0.5),
                  "flush_p99_us": pct(fu, 0.99), "flush_max_us": maximum(fu)}
    check(mined.aggregates["flush_per_second"], exp, ("broker", "sec"), close=("group_msgs_mean",))

    exp = {k: {"flushes": len(rows)} for k, rows in
           group(flushes, lambda r: (key(r, "broker"), r["group_msgs"])).items()}
    check(mined.aggregates["flush_group_hist"], exp, ("broker", "group_msgs"))


def test_replication_lag(mined, trace):
    """Lag per master and slave: max, mean, percentiles, the last sample's lag, and the
    per-second maximum; the generated fall-behind (seconds 8-15, one slave) is the max."""
    _d, recs, _b = trace
    t0 = t0_of(recs)
    lags = [r for r in recs if r["kind"] == "lag"]
    exp = {}
    for k, rows in group(lags, lambda r: (key(r, "broker"), key(r, "slave"))).items():
        v = nonnull(rows, "lag_bytes")
        last = max(rows, key=lambda r: r["ts_us"])
        exp[k] = {"samples": len(rows), "lag_max_bytes": maximum(v), "lag_mean_bytes": mean(v),
                  "lag_p50_bytes": pct(v, 0.5), "lag_p99_bytes": pct(v, 0.99), "lag_last_bytes": last["lag_bytes"],
                  "first_us": min(r["ts_us"] for r in rows), "last_us": last["ts_us"]}
    check(mined.aggregates["lag_stats"], exp, ("broker", "slave"), close=("lag_mean_bytes",))

    exp = {k: {"samples": len(rows), "lag_max_bytes": maximum(nonnull(rows, "lag_bytes"))} for k, rows in
           group(lags, lambda r: (key(r, "broker"), key(r, "slave"), sec_of(r["ts_us"], t0))).items()}
    check(mined.aggregates["lag_per_second"], exp, ("broker", "slave", "sec"))
    worst = max(mined.aggregates["lag_per_second"], key=lambda r: r["lag_max_bytes"])
    assert worst["slave"] == tracegen.SLAVES["broker-a"][1] and 8 <= worst["sec"] <= 15


def test_slowest_requests_and_messages(mined, trace):
    """The top SLOWEST_N messages (by latency) and requests (by total_us) are the same records,
    in the same order, as a plain sort of all of them."""
    _d, recs, _b = trace
    t0 = t0_of(recs)
    n = mqtrace.SLOWEST_N
    nk = lambda v: (v is not None, v)       # noqa: E731 -- Spark's ascending order puts nulls first
    obs = [o for o in legs(recs, t0) if o["latency_us"] is not None]
    obs.sort(key=lambda o: (-o["latency_us"], o["t_us"], o["broker"], nk(o["client"]), o["stage"]))
    fields = ("latency_us", "t_us", "sec", "run", "mode", "stage", "broker", "client", "queue", "queue_offset",
              "send_us")
    got = mined.aggregates["slowest_msg"]
    assert len(got) == n
    assert [tuple(r[f] for f in fields) for r in got] == [tuple(o[f] for f in fields) for o in obs[:n]]

    reqs = [r for r in recs if r["kind"] == "req" and r.get("total_us") is not None]
    reqs.sort(key=lambda r: (-r["total_us"], nk(r.get("ts_us")), nk(r.get("broker"))))
    fields = ("total_us", "ts_us", "broker", "role", "code", "msgs") + REQ_PHASES
    got = mined.aggregates["slowest_req"]
    assert [tuple(r[f] for f in fields) for r in got] == [tuple(q.get(f) for f in fields) for q in reqs[:n]]
    assert [r["sec"] for r in got] == [sec_of(q["ts_us"], t0) for q in reqs[:n]]


def test_parquet_aggregates_hold_the_same_rows(mined, spark):
    """Each aggregate is one Parquet file under aggregates/<name>/, and reading it back gives
    exactly the rows the report was made from."""
    assert set(mined.aggregates) == set(mqtrace.AGGREGATES)
    for name, rows in mined.aggregates.items():
        d = os.path.join(mined.out_dir, "aggregates", name)
        parts = [f for f in os.listdir(d) if f.endswith(".parquet")]
        assert len(parts) == 1, (name, parts)
        with open(os.path.join(d, parts[0]), "rb") as f:
            data = f.read()
        assert data[:4] == b"PAR1" and data[-4:] == b"PAR1", name
        back = [r.asDict() for r in spark.read.parquet(d).collect()]
        assert sorted(back, key=repr) == sorted(rows, key=repr), name


def check_png(path: str) -> None:
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == PNG_MAGIC, path
    assert data[12:16] == b"IHDR", path
    width, height = struct.unpack(">II", data[16:24])
    assert width >= 600 and height >= 300, (path, width, height)
    assert len(data) > 15_000, (path, len(data))       # a drawn plot, not an empty canvas


def test_report_tables_and_plots(mined, trace):
    """report.md has the summary, phase, flush, lag and slowest tables, with figures that match the
    trace, and links every plot; each linked file exists and is a real PNG of a drawn plot."""
    _d, recs, _b = trace
    with open(mined.report_path, encoding="utf-8") as f:
        report = f.read()
    assert report.startswith("# test trace\n")
    for heading in ("## Messages", "## Requests inside the broker", "## Flushes (group commit)",
                    "## Replication lag", "## Slowest 20"):
        assert heading in report
    produce = [o for o in legs(recs, t0_of(recs)) if o["mode"] == "produce"]
    assert f"| gen | produce | ack | * | {len(produce):,} |" in report
    assert "| broker-b | SEND_MESSAGE_V2 |" in report
    linked = re.findall(r"!\[[^\]]*\]\((plots/[^)]+\.png)\)", report)
    assert sorted(os.path.basename(p) for p in linked) == sorted(mqtrace.PLOTS)
    assert sorted(mined.plots) == sorted(os.path.join(mined.out_dir, p) for p in linked)
    for rel in linked:
        check_png(os.path.join(mined.out_dir, rel))


def _cli() -> list[str]:
    exe = os.path.join(os.path.dirname(sys.executable), "mqtrace")
    return [exe] if os.path.exists(exe) else [sys.executable, "-m", "perf.mqtrace"]


def test_cli_partial_trace_single_broker_with_nulls(trace, spark, tmp_path):
    """The mqtrace command on a trace with only msg records, one broker, missing fields and a wrongly
    typed field: exits 0, prints one summary line and no JVM chatter, writes an HTML report that
    says which kinds are missing, only the plots the data supports, only the aggregates it can, and
    msg_latency equal to plain Python (missing broker/run grouped as '-', the mistyped record kept)."""
    _d, recs, _b = trace
    partial = []
    for i, r in enumerate(r for r in recs if r["kind"] == "msg" and r.get("broker") == "broker-a"):
        r = dict(r)
        if i % 7 == 0:
            del r["broker"]
            r.pop("size_bytes")
        if i % 11 == 0:
            del r["run"]
        if i == 3:
            r["queue"] = 0.5        # wrongly typed: read as null, the record is kept
        partial.append(r)
    src = tmp_path / "trace"
    (src / "deep").mkdir(parents=True)
    with open(src / "deep" / "mqperf-1.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in partial)
    out = tmp_path / "out"
    p = subprocess.run(_cli() + [str(src), "-o", str(out), "--format", "html", "--title", "partial"],
                       capture_output=True, text=True, timeout=240, cwd=REPO)
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("\n") == 1 and p.stdout.startswith("mqtrace: "), p.stdout
    assert " INFO " not in p.stderr and "Traceback" not in p.stderr, p.stderr

    html = (out / "report.html").read_text(encoding="utf-8")
    for missing in ("No req records", "No flush records", "No lag samples",
                    "1 record(s) with a wrongly typed field"):
        assert missing in html
    assert sorted(os.listdir(out / "plots")) == ["latency_over_time.png", "throughput_over_time.png"]
    for name in os.listdir(out / "plots"):
        assert f"src='plots/{name}'" in html
        check_png(str(out / "plots" / name))
    assert sorted(os.listdir(out / "aggregates")) == ["msg_latency", "msg_per_second", "msg_status", "slowest_msg"]

    rows = [r.asDict() for r in spark.read.parquet(str(out / "aggregates" / "msg_latency")).collect()]
    exp = expected_msg_latency(legs(partial, t0_of(partial)))
    assert {k[3] for k in exp} == {"broker-a", MISSING, ALL} and any(k[0] == MISSING for k in exp)
    check(rows, exp, ("run", "mode", "stage", "broker"), close=("latency_mean_us", "msgs_per_s", "duration_s"))


def test_cli_missing_or_empty_dir_exits_2(tmp_path):
    """A missing directory, or one without *.jsonl files, is one line on stderr and exit 2."""
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    (tmp_path / "empty" / "notes.txt").write_text("not a trace\n")
    for d in (tmp_path / "empty", tmp_path / "nope"):
        p = subprocess.run(_cli() + [str(d)], capture_output=True, text=True, timeout=60, cwd=REPO)
        assert p.returncode == 2, (d, p.stderr)
        assert p.stdout == "" and p.stderr.count("\n") == 1 and p.stderr.startswith("mqtrace: "), p.stderr


def test_cli_without_java_says_how_to_get_it(trace, monkeypatch, capsys):
    """Without a Java runtime the command fails with one line naming the make target that
    installs one, before starting anything."""
    directory, _r, _b = trace
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    assert mqtrace.main([directory]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "`make java` installs" in err, err
