"""perf/peers.py: the peer servers (redis-server, nats-server) start on loopback from Debian's
packages (installed first if missing: these tests install, they do not skip), serve the
workloads, and leave nothing behind: no process, no directory.  Plus the `mqpeers` CLI end to
end, finished and interrupted, with every directory it made under a test-owned $MQ_PERF_DIR."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from nats.js.api import StorageType

from mq.cluster import port_open, wait_for
from perf import peers, workloads

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(autouse=True)
def own_perf_dir(tmp_path, monkeypatch):
    """Every peer directory goes under this test's own $MQ_PERF_DIR, so leftovers are visible."""
    d = tmp_path / "perf"
    d.mkdir()
    monkeypatch.setenv("MQ_PERF_DIR", str(d))
    return d


def gone(pid: int) -> bool:
    """The process has exited: no such pid, or a zombie (an orphan whose parent exited first
    stays a zombie until pid 1 reaps it, and this machine's pid 1 may not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def processes_mentioning(text: str) -> list[int]:
    """Pids of live processes whose command line contains `text` (not zombies)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
            with open(f"/proc/{entry}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text.encode() in cmdline and state != "Z":
            found.append(int(entry))
    return found


def test_ensure_installed_finds_every_program():
    """ensure_installed() returns an executable path for redis-server, redis-benchmark and
    nats-server, installing the Debian packages first if one is missing."""
    paths = peers.ensure_installed()
    assert set(paths) == {"redis-server", "redis-benchmark", "nats-server"}
    for prog, path in paths.items():
        assert os.access(path, os.X_OK), (prog, path)
    out = subprocess.run([paths["redis-server"], "--version"], capture_output=True, text=True, timeout=10).stdout
    assert "Redis server v=" in out


@pytest.mark.parametrize("mode", ["everysec", "always"])
def test_redis_server_serves_persists_and_leaves_nothing(mode, own_perf_dir):
    """RedisServer(mode) listens on 127.0.0.1 only, with AOF on in the asked fsync mode and no
    RDB snapshots; XADDs one at a time and pipelined land in the stream (the workloads check
    XLEN) and in the AOF file in its temp dir; an XREAD workload reads them all back.  After the
    `with`, the process is gone (pid reaped, port closed) and the directory removed."""
    with peers.RedisServer(mode) as server, server.client() as r:
        pid, port, d = server.pid, server.port, server.dir
        assert server.addr == f"127.0.0.1:{port}" and d.startswith(str(own_perf_dir))
        assert r.config_get("appendonly")["appendonly"] == "yes"
        assert r.config_get("appendfsync")["appendfsync"] == mode
        assert r.config_get("save")["save"] == ""
        assert r.config_get("bind")["bind"] == "127.0.0.1"
        one = workloads.redis_xadd_one(r, "s", 20)
        piped = workloads.redis_xadd_pipeline(r, "s", 250)      # pipelines of 100, 100, 50
        assert (one.msgs, len(one.lat_s), piped.msgs, len(piped.lat_s)) == (20, 20, 250, 3)
        assert r.xlen("s") == 270
        read = workloads.redis_xread(r, "s", count=100)
        assert read.msgs == 270 and len(read.lat_s) == 3

        def in_aof() -> int:
            aof = b""
            for root, _, files in os.walk(os.path.join(d, "appendonlydir")):
                for name in files:
                    with open(os.path.join(root, name), "rb") as f:
                        aof += f.read()
            return aof.count(workloads.PRINTABLE_BODY)
        # always: in the AOF (and fsynced) before the reply; everysec: Redis postpones the AOF
        # write while the last second's background fsync still runs (up to 2 s on a busy disk)
        if mode == "always":
            assert in_aof() == 270, "every XADD is in the AOF"
        else:
            wait_for(lambda: in_aof() == 270, 10, 0.1, "every XADD in the AOF")
    assert gone(pid) and not port_open(port) and not os.path.exists(d)
    assert os.listdir(own_perf_dir) == []


def test_redis_benchmark_workload_counts_its_xadds():
    """redis_benchmark_xadd runs redis-benchmark with N connections against the server and
    returns its own rate and percentiles; the stream grows by exactly -n entries of the 1 KiB
    body (checked inside, and here)."""
    with peers.RedisServer("always") as server, server.client() as r:
        res = workloads.redis_benchmark_xadd(server, "bench", 500, connections=10)
        assert res.msgs == 500 and res.msgs_per_s > 0
        assert res.p50_us is not None and res.p99_us >= res.p50_us > 0
        assert r.xlen("bench") == 500
        assert r.xrange("bench", count=1)[0][1][b"f"] == workloads.PRINTABLE_BODY


def test_nats_server_jetstream_file_storage_and_cleanup(own_perf_dir):
    """NatsServer runs JetStream with file storage in its temp dir on 127.0.0.1: publishes one at
    a time and 100 in flight are all stored (the stream's message count), the stream is file
    backed and has files on disk, and a pull consumer fetching 1000 at a time reads every
    message.  Afterwards the process is gone and the directory removed."""
    with peers.NatsServer() as server, peers.NatsClient(server) as nc:
        pid, port, d = server.pid, server.port, server.dir
        assert server.url == f"nats://127.0.0.1:{port}"
        one = nc.publish_one(30)
        many = nc.publish_in_flight(400)
        assert (one.msgs, len(one.lat_s), many.msgs, len(many.lat_s)) == (30, 30, 400, 400)
        assert nc.stored() == 430
        info = nc.run(nc.js.stream_info(nc.STREAM))
        assert info.config.storage == StorageType.FILE
        stored_files = [f for _, _, fs in os.walk(os.path.join(d, "jetstream")) for f in fs]
        assert stored_files, "JetStream wrote no files"
        read = nc.fetch(batch=1000)
        assert read.msgs == 430
        nc.purge()
        assert nc.stored() == 0
    assert gone(pid) and not port_open(port) and not os.path.exists(d)
    assert os.listdir(own_perf_dir) == []


def test_failed_start_is_a_clear_error_and_leaves_nothing(own_perf_dir):
    """A server that exits at start (here redis-server given an unknown option) raises
    PeerUnavailable carrying its log, and leaves no directory behind."""
    class BadRedis(peers.RedisServer):
        def args(self):
            return super().args() + ["--no-such-option", "1"]

    with pytest.raises(peers.PeerUnavailable, match="exited with"):
        with BadRedis("everysec"):
            pass
    assert os.listdir(own_perf_dir) == []


def test_stop_after_the_server_died_cleans_up(own_perf_dir):
    """stop() copes with a server that already died (SIGKILL from outside): it reaps it and
    removes the directory; a second stop() is harmless."""
    server = peers.RedisServer("everysec").start()
    os.kill(server.pid, signal.SIGKILL)
    assert server.stop() == -signal.SIGKILL
    server.stop()
    assert gone(server.pid) and os.listdir(own_perf_dir) == []


def descendants(pids: list[int]) -> list[int]:
    """Every live descendant of `pids` (a broker's io workers and store roles, spawned)."""
    parent = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                pass
    found, frontier = [], set(pids)
    while frontier:
        kids = [p for p, pp in parent.items() if pp in frontier]
        found += kids
        frontier = set(kids)
    return found


def run_cli(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "perf.peers", *args], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def test_cli_rejects_bad_arguments_with_one_line():
    """Bad arguments: exit 2 and one line on stderr, no traceback."""
    p = run_cli("--seconds", "0")
    out, err = p.communicate(timeout=60)
    assert p.returncode == 2 and err.strip().count("\n") == 0 and "Traceback" not in err, err
    for bad in (["--only", "kafka"], ["--seconds", "soon"], ["--frobnicate"]):
        p = run_cli(*bad)
        out, err = p.communicate(timeout=60)
        assert p.returncode == 2 and err.count("\n") == 1 and err.startswith("mqpeers: "), (bad, err)


def test_cli_redis_rows_end_to_end(own_perf_dir):
    """`mqpeers --only redis --json` with very short rounds: every Redis row comes back with
    both sides measured (3 rounds each, a positive rate, a ratio); ours and Redis processes are
    all stopped and every directory removed."""
    p = run_cli("--only", "redis", "--seconds", "0.05", "--json", env={**os.environ})
    out, err = p.communicate(timeout=240)
    assert p.returncode == 0, err[-3000:]
    rows = json.loads(out)
    assert [r["workload"].split(",")[0] for r in rows] == [
        "one at a time", "100 sends in flight", "batches of 100", "one consumer (pull 32)",
        "one at a time", "100 sends in flight", "64 producers"]
    for r in rows:
        assert r["ours"]["rounds"] == r["peer_side"]["rounds"] == peers.ROUNDS, r
        assert r["ours"]["msgs_per_s"] > 0 and r["peer_side"]["msgs_per_s"] > 0, r
        assert r["ratio"] == pytest.approx(r["ours"]["msgs_per_s"] / r["peer_side"]["msgs_per_s"])
    started = [int(pid) for pid in re.findall(r"pid (\d+)", err)]
    assert len(started) == 5 and all(gone(pid) for pid in started), err
    assert processes_mentioning(str(own_perf_dir)) == []
    assert os.listdir(own_perf_dir) == []


def test_cli_interrupted_stops_everything(own_perf_dir):
    """SIGTERM in the middle of a run (everything started, the consume backlog being written):
    the CLI exits 130 with one line, and every process it started (brokers, name server, both
    redis-servers) is gone and every directory removed."""
    p = run_cli("--only", "redis", "--seconds", "2")
    lines: list[str] = []
    deadline = time.monotonic() + 120
    while not any("filling the consume backlogs" in line for line in lines):
        assert time.monotonic() < deadline and p.poll() is None, "".join(lines)
        lines.append(p.stderr.readline())
    started = [int(pid) for pid in re.findall(r"pid (\d+)", "".join(lines))]
    assert len(started) == 5, lines                         # a name server, 2 brokers, 2 redis-servers
    assert all(not gone(pid) for pid in started)
    started += descendants(started)
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 130, "".join(lines) + err
    assert "interrupted" in err and "Traceback" not in err, err
    assert [pid for pid in started if not gone(pid)] == []
    assert processes_mentioning(str(own_perf_dir)) == []
    assert os.listdir(own_perf_dir) == []


def test_our_side_with_every_client(own_perf_dir):
    """OurBrokers runs our side of the rows with each client (the gates' loops, mqperf, the
    mq.client library) on one broker: sends one at a time, 100 in flight and in batches of 100
    store exactly the messages asked for (the topic's queue ends grow by that much), and the
    consume workload reads the whole backlog (checked inside against the queue ends).  Afterwards the broker and name server are stopped and
    the directory removed."""
    with peers.OurBrokers(("ASYNC_FLUSH",)) as ours:
        c, addr = ours.session.client, ours.addr("ASYNC_FLUSH")
        pids = [ours.namesrv.proc.p.pid, ours.brokers["ASYNC_FLUSH"].proc.p.pid]
        before = sum(ours.run(workloads.wait_dispatched(c, addr, ours.topic("ASYNC_FLUSH"), 0)))
        sent = 0
        for client in peers.OurBrokers.CLIENTS:
            ours.client = client
            for res in (ours.one_at_a_time("ASYNC_FLUSH", 40), ours.pipelined("ASYNC_FLUSH", 300),
                        ours.batched("ASYNC_FLUSH", 500)):
                assert res.msgs_per_s > 0 and workloads.Series([res]).p50_us > 0
                sent += res.msgs
        assert sent == len(peers.OurBrokers.CLIENTS) * (40 + 300 + 500)
        assert sum(ours.run(workloads.wait_dispatched(c, addr, ours.topic("ASYNC_FLUSH"), before + sent))) == before + sent
        ends = ours.fill("ASYNC_FLUSH", 1000)
        for client in peers.OurBrokers.CLIENTS:
            ours.client = client
            assert ours.consume("ASYNC_FLUSH", ends).msgs == sum(ends) == 1001
        d = ours.dir
    assert all(gone(pid) for pid in pids) and not os.path.exists(d)
    assert os.listdir(own_perf_dir) == []
