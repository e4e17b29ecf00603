"""The local cluster launcher (`make run`, `python -m mq.cli.local LAYOUT`) as an operator meets it
in the first hour, with real processes: the launcher runs as a subprocess on free ports
(MQ_NAMESRV_PORT, MQ_BROKER_PORT, layouts written to a temporary directory) with MQ_RUN_DIR in a
temporary directory, and every process it started is gone at the end of each test.

Also here: the shipped layouts and `make run`'s embedded config (small files, ports below the
ephemeral range, the ACL file under run/), and the two broker fixes the launcher's Ctrl-C and
"kill the leader" walks exposed: the pull role's clean stop, and a DLedger member whose peer
port is taken."""
from __future__ import annotations

import asyncio
import filecmp
import os
import re
import signal
import socket
import subprocess
import sys

import pytest

from mq import conf
from mq.broker.config import BrokerConfig
from mq.cli.local import embedded_config, localize
from mq.cluster import BIN, DLedgerGroup, NameServer, free_port, port_open, processes_of_group, wait_for
from mq.store.config import load_properties_file, parse_properties
from tests.gateway.helpers import run_client5

MIB = 1024 * 1024
UP = "local cluster up"


def ephemeral_low() -> int:
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        return int(f.read().split()[0])


def disk_bytes(root: str) -> int:
    """Blocks really allocated under `root` (du), not file sizes."""
    total = 0
    for d, _, files in os.walk(root):
        for f in files:
            try:
                total += os.lstat(os.path.join(d, f)).st_blocks * 512
            except FileNotFoundError:
                pass
    return total


class Local:
    """`python -m mq.cli.local [ARG]` in a session of its own, stdin a pipe (what is typed),
    stdout and stderr to a file.  `pids()` are the processes of its last status table; stop()
    is Ctrl-C; cleanup() kills whatever is left, the launcher and each process's session."""

    def __init__(self, tmp: str, env: dict, arg: str | None = None, tag: str = "local"):
        self.log_path = os.path.join(tmp, f"{tag}.out")
        self.log = open(self.log_path, "ab")
        self.p = subprocess.Popen([sys.executable, "-m", "mq.cli.local", *([arg] if arg else [])],
                                  stdin=subprocess.PIPE, stdout=self.log, stderr=subprocess.STDOUT,
                                  env={**os.environ, **env}, start_new_session=True)
        self.seen: set[int] = set()

    def output(self) -> str:
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def wait_output(self, text: str, count: int = 1, timeout_s: float = 120) -> str:
        wait_for(lambda: self.output().count(text) >= count or self.p.poll() is not None, timeout_s, 0.1,
                 f"{text!r} x{count} from the launcher")
        out = self.output()
        assert out.count(text) >= count, f"the launcher exited ({self.p.returncode}) before {text!r}:\n{out[-6000:]}"
        return out

    def pids(self) -> dict[str, int]:
        """name -> pid from the last table it printed."""
        table = self.output().rsplit("  name ", 1)[-1]
        found = {m.group(1): int(m.group(2)) for m in re.finditer(r"^  (\S+)\s+(\d+)\s+(?:up|starting)\b", table, re.M)}
        self.seen.update(found.values())
        return found

    def type(self, line: str) -> None:
        self.p.stdin.write(line.encode() + b"\n")
        self.p.stdin.flush()

    def stop(self, timeout_s: float = 90) -> int:
        """Ctrl-C (SIGINT to the launcher alone: its processes are in sessions of their own)."""
        self.pids()
        self.p.send_signal(signal.SIGINT)
        return self.p.wait(timeout_s)

    def cleanup(self) -> None:
        self.pids()
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait(10)
        for pid in self.seen:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        wait_for(lambda: not any(processes_of_group(pid) for pid in self.seen), 20, what="the launcher's processes gone")
        self.log.close()


@pytest.fixture
def launchers():
    started: list[Local] = []
    yield started
    for local in started:
        local.cleanup()


def single_env(tmp_path) -> dict:
    return {"MQ_RUN_DIR": str(tmp_path / "run"), "MQ_NAMESRV_PORT": str(free_port()),
            "MQ_BROKER_PORT": str(free_port((-2, 0, 1))), "MQ_GRPC_PORT": str(free_port())}


def mqadmin(*args: str) -> subprocess.CompletedProcess:
    """The installed mqadmin from the repository root (it signs with conf/tools.yml there)."""
    root = os.path.dirname(conf.DIR)
    r = subprocess.run([os.path.join(BIN, "mqadmin"), *args], capture_output=True, text=True, timeout=60, cwd=root)
    assert r.returncode == 0 and "Traceback" not in r.stderr, f"mqadmin {args}: {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r


# ---- the shipped config -----------------------------------------------------------------------------
ALL_LAYOUTS = ["2m-2s-async", "2m-2s-sync", "2m-noslave", "dledger"]


@pytest.mark.parametrize("layout", ALL_LAYOUTS)
def test_layouts_use_small_files_low_ports_and_their_own_acl_file(layout):
    """Every broker of every shipped layout: CommitLog files of 64 MiB (a broker then takes ~130
    MiB of disk, not 2 GiB), a message index file of at most 8 MiB (not 420 MB), a DLedger index
    file of at most 8 MiB, rocketmqHome under ./run/<layout> (the ACL file is a copy, never
    conf/plain_acl.yml), and every port it listens on -- DLedger peer ports included -- below
    20000: under both Linux's ephemeral range (where an outgoing connection may hold a port)
    and the range mq.cluster picks test ports from."""
    files = conf.layout_files(layout)
    assert files
    for path in files:
        cfg = BrokerConfig(load_properties_file(path))
        store = cfg.store_config()
        assert store.mappedFileSizeCommitLog == 64 * MIB, path
        assert 40 + store.maxHashSlotNum * 4 + store.maxIndexNum * 20 <= 8 * MIB, path
        assert cfg.rocketmqHome == f"./run/{layout}", path
        ports = [cfg.fast_port, cfg.listenPort, cfg.ha_port]
        if cfg.enableDLegerCommitLog:
            assert store.mappedFileSizeForEntryIndex <= 8 * MIB, path
            ports += [port for _, port in store.dledger_peers.values()]
        assert all(1024 < p < min(20000, ephemeral_low()) for p in ports), (path, ports)


def test_make_run_config_is_small_and_keeps_acl_under_run():
    """`make run`'s embedded broker config: 64 MiB CommitLog files, a 4 MiB message index file,
    rocketmqHome the run directory (its conf/plain_acl.yml is the launcher's copy)."""
    _, broker = embedded_config("/srv/run", 9876, 10911)
    values = parse_properties(broker)
    store = BrokerConfig(values).store_config()
    assert store.mappedFileSizeCommitLog == 64 * MIB
    assert 40 + store.maxHashSlotNum * 4 + store.maxIndexNum * 20 <= 8 * MIB
    assert values["rocketmqHome"] == "/srv/run" and values["storePathRootDir"] == "/srv/run/store"


def test_localize_moves_run_paths_and_the_name_server_only():
    """A layout file as the launcher runs it: ./run/... values under the run directory,
    namesrvAddr the launcher's name server, comments and other values as they were."""
    text = "# ./run/x stays\nnamesrvAddr=127.0.0.1:9876\nstorePathRootDir=./run/L/a\nrocketmqHome = ./run/L\nlistenPort=10911\n"
    assert localize(text, "/tmp/r", "127.0.0.1:2345") == (
        "# ./run/x stays\nnamesrvAddr=127.0.0.1:2345\nstorePathRootDir=/tmp/r/L/a\nrocketmqHome = /tmp/r/L\n"
        "listenPort=10911\n")


# ---- make run -----------------------------------------------------------------------------------------
def test_make_run_checks_ports_first_and_keeps_its_config(tmp_path, launchers):
    """`make run` (no layout): it writes run/broker.conf once (small files: the store of a
    running broker with a few messages takes < 256 MiB of disk, not 2 GiB) and a copy of
    conf/plain_acl.yml under run/conf/.  A second start while it runs is refused before it
    touches anything, with one message naming the port and MQ_RUN_DIR, no traceback; one with
    another MQ_BROKER_PORT is refused as disagreeing with the kept file; a broker.conf naming the
    running store from another run directory fails to start with the store's one line, no
    traceback, the launcher reporting it (status 1).  An updateBrokerConfig
    write-back and an operator's edit (aclEnable=true) survive a Ctrl-C and a new start and take
    effect; updateAclConfig then changes run/'s copy, never conf/plain_acl.yml."""
    env = single_env(tmp_path)
    run_dir = tmp_path / "run"
    ns = f"127.0.0.1:{env['MQ_NAMESRV_PORT']}"
    broker_addr = f"127.0.0.1:{env['MQ_BROKER_PORT']}"
    first = Local(str(tmp_path), env, tag="first")
    launchers.append(first)
    first.wait_output(UP)
    conf_text = (run_dir / "broker.conf").read_text()
    assert "mappedFileSizeCommitLog=67108864" in conf_text and f"rocketmqHome={run_dir}" in conf_text
    assert filecmp.cmp(run_dir / "conf" / "plain_acl.yml", conf.path("plain_acl.yml"), shallow=False)
    mqadmin("updateTopic", "-n", ns, "-c", "DefaultCluster", "-t", "DemoTopic")
    demo = subprocess.run([sys.executable, "-m", "mq.cli.demo_client", ns], capture_output=True, text=True, timeout=120)
    assert demo.returncode == 0, demo.stdout + demo.stderr
    # the gRPC endpoint is on: the official 5.x producer sends through it
    sent = run_client5({"op": "produce", "endpoint": f"127.0.0.1:{env['MQ_GRPC_PORT']}", "topic": "DemoTopic",
                        "messages": [{"body": "from a 5.x client"}]})["sent"]
    assert "message_id" in sent[0], sent
    assert disk_bytes(str(run_dir)) < 256 * MIB, disk_bytes(str(run_dir))

    for extra, expect in (({}, ["is in use", "MQ_RUN_DIR"]),
                          ({"MQ_BROKER_PORT": str(free_port((-2, 0, 1)))}, ["kept from an earlier start"])):
        second = subprocess.run([sys.executable, "-m", "mq.cli.local"], capture_output=True, text=True, timeout=60,
                                stdin=subprocess.DEVNULL, env={**os.environ, **env, **extra})
        assert second.returncode == 2, second
        assert all(e in second.stderr for e in expect) and "Traceback" not in second.stderr, second.stderr
        assert (run_dir / "broker.conf").read_text() == conf_text

    other = tmp_path / "run2"                   # a directory of its own, but its broker.conf names run/'s store
    other.mkdir()
    (other / "broker.conf").write_text(conf_text.replace(f"listenPort={env['MQ_BROKER_PORT']}",
                                                         f"listenPort={free_port((-2, 0, 1))}")
                                       .replace(f"grpcServerPort={env['MQ_GRPC_PORT']}",
                                                f"grpcServerPort={free_port()}"))
    clash = subprocess.run([sys.executable, "-m", "mq.cli.local"], capture_output=True, text=True, timeout=120,
                           stdin=subprocess.DEVNULL, env={**os.environ, "MQ_RUN_DIR": str(other),
                                                          "MQ_NAMESRV_PORT": str(free_port())})
    assert clash.returncode == 1, clash
    assert re.search(r"\*\*\* broker \(pid \d+\) exited with status 1", clash.stdout), clash.stdout[-4000:]
    assert "is in use by another process" in clash.stdout and "Traceback" not in clash.stdout + clash.stderr

    mqadmin("updateBrokerConfig", "-n", ns, "-b", broker_addr, "-k", "slaveTimeout", "-v", "4321")
    wait_for(lambda: "slaveTimeout=4321" in (run_dir / "broker.conf").read_text(), 10, what="the write-back")
    assert first.stop() == 0
    assert "*** stopped" in first.output() and "Traceback" not in first.output()

    with open(run_dir / "broker.conf", "a") as f:
        f.write("aclEnable=true\n")
    acl_before = open(conf.path("plain_acl.yml"), "rb").read()
    again = Local(str(tmp_path), env, tag="again")
    launchers.append(again)
    again.wait_output(UP)
    config = mqadmin("getBrokerConfig", "-n", ns, "-b", broker_addr).stdout
    assert re.search(r"^slaveTimeout\s+=\s+4321$", config, re.M), config
    assert re.search(r"^aclEnable\s+=\s+true$", config, re.M), config
    mqadmin("updateAclConfig", "-n", ns, "-b", broker_addr, "-a", "localtest01", "-s", "localsecret01")
    assert "localtest01" in (run_dir / "conf" / "plain_acl.yml").read_text()
    assert open(conf.path("plain_acl.yml"), "rb").read() == acl_before
    assert again.stop() == 0


# ---- layouts ----------------------------------------------------------------------------------------
def write_layout(root, name: str = "ms") -> str:
    """A master/slave layout like conf/2m-2s-async's group broker-a, on free ports, in root/name/."""
    d = root / name
    d.mkdir()
    for file, bid, role in (("broker-a", 0, "ASYNC_MASTER"), ("broker-a-s", 1, "SLAVE")):
        (d / f"{file}.properties").write_text(
            f"brokerClusterName=LocalTest\nbrokerName=broker-a\nbrokerId={bid}\nbrokerRole={role}\n"
            f"namesrvAddr=127.0.0.1:9876\nbrokerIP1=127.0.0.1\nlistenAddress=127.0.0.1\n"
            f"listenPort={free_port((-2, 0, 1))}\nstorePathRootDir=./run/{name}/{file}\nrocketmqHome=./run/{name}\n"
            "mappedFileSizeCommitLog=4194304\nmaxHashSlotNum=1000\nmaxIndexNum=4000\n")
    return str(d)


def test_a_broker_that_exits_leaves_the_others_running_and_restarts_by_name(tmp_path, launchers):
    """A layout (master + slave) from a directory: kill -9 of the slave is reported with its name,
    pid, "killed by SIGKILL" and the last lines of its log file, while the name server and the
    master keep running; typing its name starts it again and the launcher says when it is up.
    Ctrl-C then stops everything with status 0 and no traceback -- the slave's pull role used
    to print a TypeError at every Ctrl-C -- and every process is gone."""
    layout = write_layout(tmp_path)
    env = {"MQ_RUN_DIR": str(tmp_path / "run"), "MQ_NAMESRV_PORT": str(free_port())}
    local = Local(str(tmp_path), env, layout)
    launchers.append(local)
    local.wait_output(UP)
    pids = local.pids()
    assert list(pids) == ["namesrv", "broker-a", "broker-a-s"], pids
    copy = tmp_path / "run" / "ms" / "broker-a-s.properties"
    assert f"namesrvAddr=127.0.0.1:{env['MQ_NAMESRV_PORT']}" in copy.read_text()
    assert f"storePathRootDir={tmp_path}/run/ms/broker-a-s" in copy.read_text()

    os.kill(pids["broker-a-s"], signal.SIGKILL)
    out = local.wait_output("type broker-a-s and Enter")
    assert f"*** broker-a-s (pid {pids['broker-a-s']}) killed by SIGKILL; the last lines of" in out
    assert "logs/broker-a-s.log" in out
    assert local.p.poll() is None
    for name in ("namesrv", "broker-a"):
        os.kill(pids[name], 0)                       # still there
    master = BrokerConfig(load_properties_file(str(tmp_path / "run" / "ms" / "broker-a.properties")))
    assert port_open(master.listenPort)

    local.type("broker-a-s")
    local.wait_output("*** broker-a-s is up")
    local.type("status")
    wait_for(lambda: local.pids().get("broker-a-s") not in (None, pids["broker-a-s"]), 30, what="the new table")
    assert local.stop() == 0
    out = local.output()
    assert "*** stopped" in out and "not cleanly" not in out
    assert "Traceback" not in out and "TypeError" not in out, out[-6000:]
    assert not any(processes_of_group(pid) for pid in local.seen)


def test_a_taken_port_is_refused_before_anything_starts(tmp_path, launchers):
    """A port of the layout held by another process (bound, not listening: what an outgoing
    connection does to a port in the ephemeral range, and what a connect test cannot see): the
    launcher refuses in one message naming the port and whose it is, status 2, having started
    nothing and written nothing."""
    layout = write_layout(tmp_path)
    cfg = BrokerConfig(load_properties_file(os.path.join(layout, "broker-a.properties")))
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", cfg.ha_port))
        env = {"MQ_RUN_DIR": str(tmp_path / "run"), "MQ_NAMESRV_PORT": str(free_port())}
        r = subprocess.run([sys.executable, "-m", "mq.cli.local", layout], capture_output=True, text=True,
                           timeout=60, stdin=subprocess.DEVNULL, env={**os.environ, **env})
    assert r.returncode == 2, r
    assert f"port {cfg.ha_port} on 127.0.0.1, broker-a's HA port (listenPort+1), is in use" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and UP not in r.stdout
    assert not (tmp_path / "run").exists()


# A process that listens on argv[1] and forks a child holding that socket for argv[2] seconds,
# whatever becomes of its parent: a broker's io worker outliving its killed supervisor a moment.
HOLDER = """
import os, socket, sys, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen()
if os.fork() == 0:
    time.sleep(float(sys.argv[2]))
    os._exit(0)
print("child", "forked", flush=True)            # (the log's first line holds this text)
time.sleep(3600)
"""


@pytest.mark.parametrize("hold_s", [1.5, 3600.0], ids=["exits-by-itself", "killed"])
def test_a_restart_waits_for_the_dead_runs_processes_to_free_its_ports(tmp_path, capsys, monkeypatch, hold_s):
    """Typing a dead process's name right after it died: the processes it left (they hold its ports
    a moment) are waited for, or after LEFTOVER_WAIT_S killed with the rest of that run's session,
    and it starts again, instead of "port in use" (CI saw a broker's restart refused that way,
    typed within milliseconds of its kill -9).  A port held by a process outside the session is
    still refused, in one line."""
    from mq.cli import local as L
    monkeypatch.setattr(L, "LEFTOVER_WAIT_S", 3.0)
    monkeypatch.setattr(L, "LEFTOVER_KILL_WAIT_S", 5.0)
    port = free_port()
    m = L.Member("holder", [sys.executable, "-c", HOLDER, str(port), str(hold_s)], [(port, "its port")],
                 str(tmp_path / "holder.log"))
    launcher = L.Launcher(L.Plan(str(tmp_path), [m], {}, 0, "Test", ""))
    runs = []
    try:
        m.start(launcher.env)
        runs.append(m.proc)
        log_path = tmp_path / "holder.log"
        wait_for(lambda: b"child forked" in log_path.read_bytes(), 10, what="the holder's child forked")
        m.signal(signal.SIGKILL)
        m.proc.wait(5)
        assert not L.port_bindable(port)               # its child still holds the port
        launcher.restart("holder")
        runs.append(m.proc)
        out = capsys.readouterr().out
        assert f"*** waiting for holder's last run to release port {port} (its port)" in out, out
        assert ("*** killing what is left of holder's last run" in out) == (hold_s > L.LEFTOVER_WAIT_S), out
        assert "*** holder started again" in out, out
        wait_for(lambda: m.closed_ports() == [], 10, what="the restarted holder listening")
    finally:
        for p in runs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(5)
    # a port taken by someone else: one line, nothing started
    wait_for(lambda: L.port_bindable(port), 10, what="the port free")
    with socket.socket() as other:
        other.bind(("127.0.0.1", port))
        m.proc = runs[-1]
        monkeypatch.setattr(L, "LEFTOVER_WAIT_S", 0.2)
        monkeypatch.setattr(L, "LEFTOVER_KILL_WAIT_S", 0.2)
        launcher.restart("holder")
        out = capsys.readouterr().out
    assert f"*** cannot start holder: port {port} (its port) is still in use after 0.4 s (another program?)" in out, out
    assert m.proc is runs[-1] and "started again" not in out


# ---- the broker fixes ---------------------------------------------------------------------------------
def test_pull_hold_stop_waits_for_its_thread(make_store):
    """PullHoldService.stop() returns only once its watch thread has left the control block,
    with a pull parked (the thread then sits in the futex wait): the store closes right after,
    and a thread still inside used to raise a TypeError on the closed handle at every Ctrl-C."""
    from mq.broker.pull import PullHoldService
    store = make_store()

    async def flow():
        svc = PullHoldService(store, asyncio.get_running_loop())
        parked = asyncio.create_task(svc.hold("T", 0, 0, 30))
        await asyncio.sleep(0)
        await asyncio.to_thread(wait_for, svc._parked.is_set, 10, 0.01, "a parked pull")
        svc.stop()
        assert not svc._thread.is_alive()
        assert await parked is False

    asyncio.run(flow())


def test_a_taken_dledger_peer_port_is_one_line_then_retried(tmp_path):
    """A DLedger member whose peer port another process listens on: one ERROR line naming the
    port (no traceback, its role is not restarted), retries with a growing wait (its DEBUG
    lines), and once the port is free it binds, says so and -- a group of one -- leads.  Its
    first stop, as the leader of a group of one, is clean: no traceback (its role once failed
    on the peer it could hand the lead to, there being none)."""
    ns = NameServer(str(tmp_path))
    group = None
    holder = socket.socket()
    try:
        group = DLedgerGroup(str(tmp_path), ns.addr, n=1, env_for=lambda i: {"MQ_LOG_LEVEL": "DEBUG"})
        group.wait_leader()
        broker = group.brokers["n0"]
        assert broker.stop() == 0
        assert "Traceback" not in broker.proc.output(), broker.proc.output()[-3000:]   # a leader of none stops too
        port = group.peer_port["n0"]
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("127.0.0.1", port))
        holder.listen()
        start = len(broker.proc.output())
        broker.start()
        since = lambda: broker.proc.output()[start:]          # noqa: E731
        wait_for(lambda: since().count(f"peer port 127.0.0.1:{port}: ") >= 3, 30, what="three retries")
        failed = [line for line in since().splitlines() if "listening on its peer port" in line and " failed: " in line]
        assert len(failed) == 1 and f"127.0.0.1:{port}" in failed[0] and " ERROR " in failed[0], failed
        assert "Traceback" not in since() and "died with exit code" not in since()
        holder.close()
        wait_for(lambda: "works again (after" in since(), 30, what="the bind after the port was freed")
        group.wait_leader()
    finally:
        holder.close()
        if group is not None:
            group.close()
        ns.stop()
