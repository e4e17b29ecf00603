"""What a RocketMQ operator reaches for in the first hour, against real processes (mq.cluster):
  * log files: logDir puts broker.log / namesrv.log next to stderr, rolled by size with the
    backups asked for, every process of the broker in the one file; an unwritable logDir is a
    config error (exit 2) said at start;
  * mqshutdown broker|namesrv: finds the running process (only the broker's supervisor, only
    the one started with -c FILE), sends SIGTERM, and the process stops cleanly (exit 0);
  * brokerIP1 left out: the broker advertises the host's first non-loopback IPv4 address when it
    listens on every address, its listenAddress when it listens on one, and clients reach it
    there; set explicitly it is kept;
  * systemd units for any installation (python -m mq.conf.systemd): ExecStart= at this
    interpreter's console scripts, every other line the shipped unit's, `systemd-analyze verify`
    clean."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap

import pytest

from mq.broker.config import BrokerConfig, host_ipv4_addresses, pick_broker_ip
from mq.cluster import BIN, Broker, NameServer, Proc, wait_for
from mq.wire.codes import RequestCode as R
from mq.wire.fastjson import loads
from mq.wire.headers import send_v2
from mq.cluster import call

CONF_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "conf")


def _run(*args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120, **kw)


def mqshutdown(*args) -> subprocess.CompletedProcess:
    """The command (python -m mq.cli.shutdown: the console script is mqshutdown once installed)."""
    return _run("-m", "mq.cli.shutdown", *args)


# ---- log files -----------------------------------------------------------------------------------------------

def test_broker_and_namesrv_log_files_roll_by_size(tmp_path):
    """With logDir, logFileMaxBytes=20000 and logFileBackups=2: broker.log holds the lines of the
    supervisor and of the io workers (the one stream), rolls into broker.log.1 and .2 and no
    more, no file past 20000 bytes; stderr still has every line; namesrv.log likewise."""
    logs = tmp_path / "logs"
    ns_conf_extra = f"logDir={logs}\nlogFileMaxBytes=20000\nlogFileBackups=2\n"
    ns = NameServer(str(tmp_path))
    ns.stop()
    with open(ns.conf, "a") as f:
        f.write(ns_conf_extra)
    ns.start()
    broker = None
    try:
        broker = Broker(str(tmp_path), ns.addr, logDir=str(logs), logFileMaxBytes=20000, logFileBackups=2)
        for i in range(250):                 # each creation logs a line (~250 bytes): ~60 KB in all
            ext = {"topic": f"T_log_{i:04d}", "defaultTopic": "TBW102", "readQueueNums": 1, "writeQueueNums": 1,
                   "perm": 6, "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0, "order": "false"}
            assert call(broker.addr, 17, ext).code == 0
        last = "topic T_log_0249 is now"
        wait_for(lambda: last in (logs / "broker.log").read_text(), 30, what="the last line in broker.log")
        names = sorted(p.name for p in logs.iterdir())
        assert [n for n in names if n.startswith("broker.")] == ["broker.log", "broker.log.1", "broker.log.2"]
        assert "namesrv.log" in names and set(names) <= {"broker.log", "broker.log.1", "broker.log.2",
                                                         "namesrv.log", "namesrv.log.1", "namesrv.log.2"}
        assert all(p.stat().st_size <= 20000 for p in logs.iterdir())
        text = "".join((logs / n).read_text() for n in ("broker.log.2", "broker.log.1", "broker.log"))
        assert all(line.split()[3].split("[")[0] == "broker" for line in text.splitlines() if "is now" in line)
        assert last in broker.proc.output()                       # stderr keeps every line
        ns_text = (logs / "namesrv.log").read_text()
        wait_for(lambda: "T_log_0249" in (logs / "namesrv.log").read_text(), 30, what="namesrv.log has the topic")
        assert "mqnamesrv[" in ns_text
    finally:
        if broker is not None:
            assert broker.stop() == 0
        assert ns.stop() == 0


def test_io_worker_lines_reach_the_log_file(tmp_path):
    """A line an io worker writes (a runtime config change, logged by the worker that applied it)
    arrives in broker.log through the supervisor's stream, tagged io-N[pid]."""
    ns = NameServer(str(tmp_path))
    try:
        broker = Broker(str(tmp_path), ns.addr, logDir=str(tmp_path / "logs"))
        try:
            assert call(broker.addr, 25, None, b"slaveReadEnable=true\n").code == 0
            log = tmp_path / "logs" / "broker.log"
            line = wait_for(lambda: next((ln for ln in log.read_text().splitlines()
                                          if "broker config changed at run time" in ln), None), 30,
                            what="the worker's line in broker.log")
            assert line.split()[3].startswith("io-")
        finally:
            assert broker.stop() == 0
    finally:
        ns.stop()


def test_unwritable_log_dir_is_a_config_error(tmp_path):
    """logDir under a regular file cannot be created: mqbroker and mqnamesrv exit 2 at once, naming
    it (systemd's RestartPreventExitStatus=2: no restart loop), instead of running without logs."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    conf = tmp_path / "b.conf"
    conf.write_text(f"brokerName=b\nlistenPort=20911\nlistenAddress=127.0.0.1\nbrokerIP1=127.0.0.1\n"
                    f"storePathRootDir={tmp_path}/store\nlogDir={blocker}/logs\n")
    r = subprocess.run([os.path.join(BIN, "mqbroker"), "-c", str(conf)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and f"logDir={blocker}/logs" in r.stderr
    nconf = tmp_path / "n.conf"
    nconf.write_text(f"listenPort=0\nlistenAddress=127.0.0.1\nlogDir={blocker}/logs\n")
    r = subprocess.run([os.path.join(BIN, "mqnamesrv"), "-c", str(nconf)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and "cannot write namesrv.log" in r.stderr


# ---- mqshutdown ------------------------------------------------------------------------------------------------

def test_mqshutdown_stops_the_broker_and_the_name_server_cleanly(tmp_path):
    """mqshutdown broker -c CONF names only that broker's supervisor (not its forked roles, not
    other brokers), SIGTERMs it, waits, and the broker exits 0 (a clean stop: no abort file);
    then "No mqbroker running." with exit 1; the same for namesrv."""
    ns = NameServer(str(tmp_path))
    other = None
    try:
        broker = Broker(str(tmp_path), ns.addr)
        other = Broker(str(tmp_path), ns.addr, name="broker-b")
        assert len(broker.processes()) > 2                      # supervisor, launcher, roles
        r = mqshutdown("broker", "-c", broker.conf, "--dry-run")
        assert r.returncode == 0 and r.stdout.splitlines() == [f"The mqbroker({broker.proc.p.pid}) is running..."]
        r = mqshutdown("broker", "-c", broker.conf, "-w", "60")
        assert r.returncode == 0, r.stdout + r.stderr
        pid = broker.proc.p.pid
        assert r.stdout.splitlines() == [f"The mqbroker({pid}) is running...",
                                         f"Send shutdown request to mqbroker({pid}) OK", f"mqbroker({pid}) stopped"]
        assert broker.proc.p.wait(30) == 0
        assert not os.path.exists(os.path.join(broker.dir, "abort"))
        assert other.proc.p.poll() is None                        # the other broker runs on
        r = mqshutdown("broker", "-c", broker.conf)
        assert r.returncode == 1 and r.stdout.startswith("No mqbroker running.")
        r = mqshutdown("namesrv", "-c", ns.conf, "-w", "30")
        assert r.returncode == 0 and f"Send shutdown request to mqnamesrv({ns.proc.p.pid}) OK" in r.stdout
        assert ns.proc.p.wait(30) == 0
        # a relative -c given to mqshutdown names the same file as the broker's absolute one
        assert mqshutdown("broker", "-c", os.path.relpath(other.conf)).stdout.startswith(
            f"The mqbroker({other.proc.p.pid})")
        assert other.proc.p.wait(30) == 0
        other = None
    finally:
        if other is not None:
            other.stop()
        ns.stop()


# ---- kill -3 -------------------------------------------------------------------------------------------------

def test_kill_quit_prints_every_threads_stack_and_the_processes_go_on(tmp_path):
    """kill -3 (SIGQUIT), as on a JVM broker: the supervisor, an io worker and the name server
    each print every thread's Python stack to stderr (which the harness keeps in their logs),
    serve on, and stop cleanly afterwards."""
    ns = NameServer(str(tmp_path))
    broker = None
    try:
        broker = Broker(str(tmp_path), ns.addr)
        io = broker.processes()["io-0"][0]
        for proc, pid, frame in ((broker.proc, broker.proc.p.pid, "mq/cli/broker.py"),
                                 (broker.proc, io, "mq/broker/worker.py"),
                                 (ns.proc, ns.proc.p.pid, "mq/cli/namesrv.py")):
            before = len(proc.output())
            os.kill(pid, signal.SIGQUIT)
            wait_for(lambda: frame in proc.output()[before:], 10, what=f"the stacks of {pid}")
            dump = proc.output()[before:]
            assert "(most recent call first)" in dump, dump[-2000:]
        assert call(broker.addr, R.GET_BROKER_RUNTIME_INFO, {}).code == 0     # still serving
        assert broker.stop() == 0
        assert ns.stop() == 0
    finally:
        if broker is not None:
            broker.stop()
        ns.stop()


def test_a_server_that_does_not_stop_shows_its_stacks_before_it_is_killed(tmp_path):
    """The harness's stop: a server still running `timeout_s` after SIGTERM gets SIGQUIT first,
    so the log a failed test shows ends with where it was stuck, then SIGKILL."""
    script = textwrap.dedent("""
        import signal, time
        from mq.logs import enable_stack_dumps
        enable_stack_dumps()
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        def stuck_here():
            print("ready", flush=True)
            time.sleep(60)
        stuck_here()
        """)
    proc = Proc([sys.executable, "-c", script], str(tmp_path / "server.log"))
    wait_for(lambda: "ready" in proc.output(), 10, what="the server up")
    assert proc.stop(timeout_s=0.5) == -signal.SIGKILL
    out = proc.output()
    assert f"not stopped 0.5 s after SIGTERM: the stacks of leader[{proc.p.pid}] (SIGQUIT)" in out, out
    assert "in stuck_here" in out.split("(SIGQUIT)")[-1], out


# ---- brokerIP1 ------------------------------------------------------------------------------------------------

def test_broker_ip_rule():
    """RocketMQ's choice: the first address not in 127.0 or 192.168, else the last one, else
    loopback; a broker bound to one address advertises that address; explicit values stay."""
    assert pick_broker_ip(["192.168.1.5", "10.1.2.3", "172.16.0.1"]) == "10.1.2.3"
    assert pick_broker_ip(["192.168.1.5", "192.168.9.9"]) == "192.168.9.9"
    assert pick_broker_ip([]) == "127.0.0.1"
    assert BrokerConfig({"listenAddress": "10.9.8.7"}).brokerIP1 == "10.9.8.7"
    assert BrokerConfig({"listenAddress": "0.0.0.0"}).brokerIP1 == pick_broker_ip(host_ipv4_addresses())
    assert BrokerConfig({"brokerIP1": "127.0.0.1", "listenAddress": "0.0.0.0"}).brokerIP1 == "127.0.0.1"
    assert all(not ip.startswith("127.") for ip in host_ipv4_addresses())


def test_broker_without_broker_ip1_advertises_the_host_address(tmp_path):
    """A broker listening on 0.0.0.0 with no brokerIP1 registers host-ip:port, an address of this
    host that is not loopback (when the host has one), and serves a send through it; `-p`
    prints the chosen value."""
    expected = pick_broker_ip(host_ipv4_addresses())
    if expected == "127.0.0.1":
        pytest.skip("this host has no non-loopback IPv4 address")
    with socket.socket() as s:
        s.bind((expected, 0))                                     # an address of this host
    ns = NameServer(str(tmp_path))
    try:
        broker = Broker(str(tmp_path), ns.addr, brokerIP1="", listenAddress="0.0.0.0")
        try:
            info = loads(call(ns.addr, 106).body)                   # ClusterInfo: bare brokerId keys
            assert info["brokerAddrTable"]["broker-a"]["brokerAddrs"][0] == f"{expected}:{broker.port}"
            r = call(f"{expected}:{broker.port}", 310, send_v2(producerGroup="PG", topic="T_ip",
                                                               defaultTopic="TBW102", defaultTopicQueueNums=4,
                                                               queueId=0, sysFlag=0, bornTimestamp=0, flag=0), b"hello")
            assert r.code == 0 and r.ext_fields["msgId"].startswith(
                "".join(f"{int(x):02X}" for x in expected.split(".")))    # store host in the offset msgId
            printed = subprocess.run([os.path.join(BIN, "mqbroker"), "-c", broker.conf, "-p"], capture_output=True,
                                     text=True, timeout=60).stdout
            assert f"brokerIP1={expected}" in printed.splitlines()
        finally:
            assert broker.stop() == 0
    finally:
        ns.stop()


# ---- systemd units for any installation ------------------------------------------------------------------------

def _directives(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln and ln[0] not in "#;"]


def test_units_for_this_installation(tmp_path):
    """python -m mq.conf.systemd writes both units with ExecStart= at this interpreter's mqbroker
    and mqnamesrv and -c in --config-dir; every other directive is the shipped unit's, no
    /opt/mq is left, and systemd-analyze verify is silent; --with-config copies the shipped
    config files without overwriting; a --bin-dir without the commands is refused (exit 1)."""
    units, etc = tmp_path / "units", tmp_path / "etc"
    etc.mkdir()
    (etc / "broker.conf").write_text("# mine\n")
    r = _run("-m", "mq.conf.systemd", "--dest", str(units), "--config-dir", str(etc), "--with-config")
    assert r.returncode == 0, r.stderr
    for name, conf in (("mqbroker", "broker.conf"), ("mqnamesrv", "namesrv.properties")):
        text = (units / f"{name}.service").read_text()
        shipped = open(os.path.join(CONF_DIR, "systemd", f"{name}.service")).read()
        assert "/opt/mq" not in text
        exec_start = [d for d in _directives(text) if d.startswith("ExecStart=")]
        assert exec_start == [f"ExecStart={os.path.join(BIN, name)} -c {etc}/{conf}"]
        assert [d for d in _directives(text) if not d.startswith("ExecStart=")] == \
            [d for d in _directives(shipped) if not d.startswith("ExecStart=")]
    assert (etc / "broker.conf").read_text() == "# mine\n" and "kept" in r.stdout
    assert (etc / "namesrv.properties").read_text() == open(os.path.join(CONF_DIR, "namesrv.properties")).read()
    analyze = shutil.which("systemd-analyze")
    if analyze:
        v = subprocess.run([analyze, "verify", "--man=no", str(units / "mqnamesrv.service"),
                            str(units / "mqbroker.service")], capture_output=True, text=True, timeout=60,
                           env={**os.environ, "SYSTEMD_LOG_COLOR": "0", "SYSTEMD_PAGER": "", "LC_ALL": "C"})
        assert v.returncode == 0 and v.stdout == "" and v.stderr == "", v.stdout + v.stderr
    r = _run("-m", "mq.conf.systemd", "--dest", str(units), "--bin-dir", str(tmp_path))
    assert r.returncode == 1 and "no mqnamesrv and mqbroker found" in r.stderr
