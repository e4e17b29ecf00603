"""`make run`: a local cluster on loopback -- one name server and one broker -- under ./run/.

    python -m mq.cli.local             a name server (9876) and a broker (10911; 10909 and 10912 too)
    python -m mq.cli.local LAYOUT      a name server and every broker of a shipped layout
                                       (conf/LAYOUT/: 2m-2s-async, 2m-2s-sync, 2m-noslave, dledger),
                                       masters first; or of a directory of broker files
    python -m mq.cli.local hosts       every process on a host of its own (network namespaces,
                                       198.18.0.x; root): 2 name servers, 2 DLedger groups of 3 and
                                       a SYNC_MASTER with its slave, and a host for clients

Everything lives under the run directory, ./run or $MQ_RUN_DIR (a layout under RUN/LAYOUT/):
the config files the processes run (namesrv.properties, broker.conf or the layout's broker
files), the stores, the ACL file (conf/plain_acl.yml under rocketmqHome) and one log file a
process (logs/NAME.log).  The config files are written at the first start only -- `make run`'s
from an embedded default (conf/broker.conf's values with small files), a layout's as copies of
its shipped files with ./run/ replaced by the run directory -- and kept after that, so an edit or
an updateBrokerConfig write-back survives restarts, and the tracked conf/ files (the ACL file
included) are never written.  MQ_NAMESRV_PORT and MQ_BROKER_PORT choose the ports of a first
start; a kept file that disagrees with them is refused, not rewritten.  MQ_GRPC_PORT chooses the
gRPC endpoint's port of a first start (default 8081 + the broker port's distance from 10911).

Every port of every process is checked free (bindable) before anything starts, and the cluster
is "up" once every one of them accepts connections.  Each process runs in a session of its own,
its output appended to its log file, which this launcher copies to the terminal prefixed with
the process's name.  When one exits, the others keep running: the launcher says which, how (exit
status or signal) and shows the last lines of its log; typing its name and Enter starts it again
(a running process is stopped cleanly first), `status` prints the table of processes.  Ctrl-C
(or SIGTERM, SIGHUP) stops everything cleanly, brokers first so that they unregister; a second
Ctrl-C kills what is left.  The layouts are found through the installed package mq.conf, so
this works the same from a checkout and from an installed wheel."""
from __future__ import annotations

import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time

from mq.cluster import BIN, port_bindable, port_open

NAMESRV_PORT = 9876
BROKER_PORT = 10911
GRPC_PORT = 8081
PORT_WAIT_S = 60          # a started process has this long to open every port it listens on
STOP_WAIT_S = 75          # a clean stop (SIGTERM) this long, then SIGKILL to its session (a DLedger
                          # leader hands over and forwards for dLegerForwardOnStopMs, 35 s, first)
LOG_TAIL_LINES = 12       # lines of a log shown when its process exits
LOG_READ_MAX = 1 << 20    # bytes of a log copied to the terminal per turn of the loop
POLL_S = 0.1
LEFTOVER_WAIT_S = 10.0    # a restart waits this long for a dead run's processes to free its ports,
LEFTOVER_KILL_WAIT_S = 5.0  # then kills that run's session and waits this long more


class SetupError(Exception):
    """The cluster cannot start as asked; str() is the one line to print."""


def embedded_config(run_dir: str, ns_port: int, broker_port: int, grpc_port: int | None = None) -> tuple[str, str]:
    """The text of `make run`'s namesrv.properties and broker.conf: conf/broker.conf's and
    conf/namesrv.properties's values with the run directory's paths, the ACL file under it, and
    small files (a 64 MiB CommitLog file and a 4 MiB message index file instead of RocketMQ's
    1 GiB and 420 MB), and the gRPC endpoint for 5.x clients on grpc_port, by default GRPC_PORT +
    (broker_port - BROKER_PORT): 8081 (RocketMQ 5's proxy port) beside 10911, 8091 beside 10921."""
    if grpc_port is None:
        grpc_port = GRPC_PORT + broker_port - BROKER_PORT
    namesrv = (f"listenPort={ns_port}\nlistenAddress=127.0.0.1\n"
               f"kvConfigPath={run_dir}/namesrv/kvConfig.json\n")
    broker = "\n".join([
        "# make run's broker: written at its first start, then kept (edit it here; updateBrokerConfig",
        "# writes its changes here too).  Delete it to get the embedded default back.",
        "brokerClusterName=DefaultCluster", "brokerName=broker-a", "brokerId=0",
        "brokerRole=ASYNC_MASTER", "flushDiskType=ASYNC_FLUSH", "deleteWhen=04", "fileReservedTime=48",
        f"namesrvAddr=127.0.0.1:{ns_port}", f"listenPort={broker_port}", "brokerIP1=127.0.0.1",
        "listenAddress=127.0.0.1", f"storePathRootDir={run_dir}/store",
        f"rocketmqHome={run_dir}",
        "mappedFileSizeCommitLog=67108864", "maxHashSlotNum=50000", "maxIndexNum=200000",
        "# the gRPC endpoint for RocketMQ 5.x clients (mq.gateway); 0 turns it off",
        f"grpcServerPort={grpc_port}", ""])
    return namesrv, broker


def _broker_ports(cfg) -> list[tuple[int, str]]:
    """Every port a broker listens on, with what it is: the fast port and listenPort, then the
    HA port (listenPort+1; a master's) or, in DLedger mode, its own DLedger peer port, then the
    gRPC port when it serves one."""
    ports = [(cfg.fast_port, "fast port (listenPort-2)"), (cfg.listenPort, "listenPort")]
    if cfg.enableDLegerCommitLog:
        ports.append((cfg.store_config().dledger_peers[cfg.dLegerSelfId][1], "DLedger peer port (dLegerPeers)"))
    elif cfg.brokerRole != "SLAVE":
        ports.append((cfg.ha_port, "HA port (listenPort+1)"))
    if cfg.grpcServerPort:
        ports.append((cfg.grpcServerPort, "gRPC port (grpcServerPort)"))
    return ports


def _layout_files(layout: str) -> list[str]:
    """The broker files of a shipped layout (mq.conf) or of a directory; SystemExit naming the
    shipped layouts when there is neither."""
    from mq import conf
    if os.sep in layout and os.path.isdir(layout):
        files = [os.path.join(layout, f) for f in sorted(os.listdir(layout)) if f.endswith(conf.BROKER_FILE_SUFFIXES)]
    else:
        files = conf.layout_files(layout)
    if not files:
        raise SystemExit(f"no layout {layout!r} in {conf.DIR} (try {', '.join(conf.layouts())})")
    return files


def _brokers(texts: dict[str, str]) -> list[tuple[str, int, list[tuple[int, str]], str]]:
    """(broker file, listenPort, every port it listens on, cluster) for files given by their
    text, masters first."""
    from mq.broker.config import BrokerConfig
    from mq.options import parse_properties
    out = []
    for path, text in texts.items():
        try:
            cfg = BrokerConfig(parse_properties(text))
        except ValueError as e:
            raise SetupError(f"{_show(path)}: {e}") from None
        out.append((cfg.brokerId, path, cfg.listenPort, _broker_ports(cfg), cfg.brokerClusterName))
    return [entry[1:] for entry in sorted(out)]


def _layout_brokers(layout: str) -> list[tuple[str, int, list[tuple[int, str]], str]]:
    """(broker file, listenPort, every port it uses, cluster) of a shipped layout's brokers
    (mq.conf), masters first."""
    files = _layout_files(layout)
    texts = {}
    for path in files:
        with open(path, encoding="utf-8") as f:
            texts[path] = f.read()
    return _brokers(texts)


_PROPERTY = re.compile(r"^(\s*)([^\s=:#!]+)(\s*[=:]\s*|\s+)(.*)$")


def localize(text: str, run_dir: str, namesrv: str) -> str:
    """A shipped layout file as the launcher runs it: values under ./run/ moved under `run_dir`,
    namesrvAddr set to `namesrv`; comments and everything else as they are."""
    out = []
    for line in text.splitlines():
        m = _PROPERTY.match(line)
        if m and not line.lstrip().startswith(("#", "!")):
            indent, key, sep, value = m.groups()
            if key == "namesrvAddr":
                value = namesrv
            elif value == "./run" or value.startswith("./run/"):
                value = run_dir + value[len("./run"):]
            line = f"{indent}{key}{sep}{value}"
        out.append(line)
    return "\n".join(out) + "\n"


def _show(path: str) -> str:
    """A path as an operator would type it: relative under the working directory."""
    cwd = os.getcwd() + os.sep
    return os.path.relpath(path) if path.startswith(cwd) else path


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        return None


def listening_ports(net: str = "/proc/net") -> set[int] | None:
    """The TCP ports something listens on (any address), from /proc/net/tcp and tcp6 (net: a
    process's /proc/PID/net for its network namespace's); None where they cannot be read.
    Unlike connecting, asking leaves no line in the servers' logs (an HA master logs every
    connection)."""
    ports: set[int] = set()
    for path in (f"{net}/tcp", f"{net}/tcp6"):
        try:
            with open(path) as f:
                next(f, None)
                for line in f:
                    fields = line.split()
                    if len(fields) > 3 and fields[3] == "0A":           # TCP_LISTEN
                        ports.add(int(fields[1].rsplit(":", 1)[1], 16))
        except (OSError, ValueError):
            return None
    return ports


def _env_port(name: str) -> int | None:
    value = os.environ.get(name)
    if not value:
        return None
    if not value.isdigit() or not 0 < int(value) < 65536:
        raise SetupError(f"{name}={value!r} is not a port number")
    return int(value)


# ---- the plan: files to write, processes to run ---------------------------------------------------
class Member:
    """One process of the local cluster: `name` (namesrv, broker, broker-a-s, broker-n0 ...),
    its command, the ports it listens on (with what each is) and its log file.  `proc` is its
    subprocess.Popen once started; `log_pos` how much of its log is on the terminal; `run_pos`
    where its current run's lines start."""

    def __init__(self, name: str, argv: list[str], ports: list[tuple[int, str]], log_path: str,
                 host: str | None = None):
        """host: the name of the host (mq.hosts) it runs in, whose ports are its own; the
        Launcher sets `prefix` to the argv that runs a command there."""
        self.name = name
        self.argv = argv
        self.host = host
        self.prefix: list[str] = []
        self.ports = ports
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self.log_pos = 0
        self.run_pos = 0
        self.started_at = 0.0
        self.up = False           # every port listened since the last start
        self.reported = False     # its exit has been reported
        self.stopping = False     # stopped on purpose: its exit is not news

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def busy_port(self) -> tuple[int, str] | None:
        if self.host is not None:             # its host's ports are its own
            return None
        return next(((p, what) for p, what in self.ports if not port_bindable(p)), None)

    def start(self, env: dict) -> None:
        with open(self.log_path, "ab") as log:
            self.run_pos = log.seek(0, os.SEEK_END)
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            log.write(f"--- {stamp} mq.cli.local starts: {' '.join(self.argv)}\n".encode())
            self.proc = subprocess.Popen(self.prefix + self.argv, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.log_pos = max(self.log_pos, self.run_pos)
        self.started_at = time.monotonic()
        self.up = self.reported = self.stopping = False

    def closed_ports(self) -> list[tuple[int, str]]:
        """Its ports that do not listen yet (in a host: as its own process sees its network)."""
        listening = listening_ports(f"/proc/{self.proc.pid}/net" if self.host is not None else "/proc/net")
        if listening is None:
            if self.host is not None:        # gone meanwhile; 127.0.0.1 here is not its host's network
                return list(self.ports)
            return [(p, what) for p, what in self.ports if not port_open(p)]
        return [(p, what) for p, what in self.ports if p not in listening]

    def signal(self, sig: int, group: bool = False) -> None:
        try:
            if group:
                os.killpg(self.proc.pid, sig)
            else:
                self.proc.send_signal(sig)
        except (ProcessLookupError, PermissionError):
            pass

    def how_it_ended(self) -> str:
        code = self.proc.returncode
        if code is not None and code < 0:
            try:
                return f"killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exited with status {code}"

    def tail(self, lines: int = LOG_TAIL_LINES) -> list[str]:
        """The last `lines` lines its current run wrote."""
        try:
            with open(self.log_path, "rb") as f:
                end = f.seek(0, os.SEEK_END)
                f.seek(max(self.run_pos, end - 64 * 1024))
                text = f.read().decode("utf-8", "replace")
        except OSError as e:
            return [f"(its log is unreadable: {e})"]
        return text.splitlines()[-lines:]


class Plan:
    """What a start needs: the base directory, the files to write (those missing), the
    processes in start order (the name server first), the name server's port and the cluster's
    name; `hint` is what to do when a port is taken."""

    def __init__(self, base: str, members: list[Member], writes: dict[str, str], ns_port: int, cluster: str,
                 hint: str, hosts: list[str] | None = None, namesrv: str | None = None):
        """hosts: the hosts (mq.hosts) to make, in address order, when the members run in hosts;
        namesrv: the name server address(es) clients use, when not 127.0.0.1:ns_port."""
        self.base, self.members, self.writes = base, members, writes
        self.ns_port, self.cluster, self.hint = ns_port, cluster, hint
        self.hosts, self.namesrv = hosts, namesrv or f"127.0.0.1:{ns_port}"


def _namesrv_member(base: str, ns_text: str, ns_path: str) -> tuple[Member, int]:
    from mq.options import parse_properties
    try:
        ns_port = int(parse_properties(ns_text).get("listenPort", NAMESRV_PORT))
    except ValueError:
        raise SetupError(f"{_show(ns_path)}: listenPort is not a number") from None
    return Member("namesrv", [os.path.join(BIN, "mqnamesrv"), "-c", ns_path], [(ns_port, "listenPort")],
                  os.path.join(base, "logs", "namesrv.log")), ns_port


def _kept(path: str, default: str, writes: dict[str, str]) -> str:
    """The text of `path` if it exists (kept), else `default`, to be written."""
    text = _read(path)
    if text is None:
        writes[path] = default
        return default
    return text


def _refuse_other_port(env: str, want: int | None, path: str, have: int) -> None:
    if want is not None and want != have:
        raise SetupError(f"{_show(path)} (kept from an earlier start) has listenPort={have} but {env}={want}: "
                         "edit that file, or set MQ_RUN_DIR to a directory of its own")


def plan_single(run_dir: str) -> Plan:
    """`make run`: run_dir/namesrv.properties and run_dir/broker.conf, kept once written."""
    ns_env, broker_env = _env_port("MQ_NAMESRV_PORT"), _env_port("MQ_BROKER_PORT")
    grpc_env = _env_port("MQ_GRPC_PORT")
    writes: dict[str, str] = {}
    ns_path, broker_path = os.path.join(run_dir, "namesrv.properties"), os.path.join(run_dir, "broker.conf")
    ns_default, _ = embedded_config(run_dir, ns_env or NAMESRV_PORT, BROKER_PORT)
    namesrv, ns_port = _namesrv_member(run_dir, _kept(ns_path, ns_default, writes), ns_path)
    _refuse_other_port("MQ_NAMESRV_PORT", ns_env, ns_path, ns_port)
    _, broker_default = embedded_config(run_dir, ns_port, broker_env or BROKER_PORT, grpc_env)
    (_, port, ports, cluster), = _brokers({broker_path: _kept(broker_path, broker_default, writes)})
    _refuse_other_port("MQ_BROKER_PORT", broker_env, broker_path, port)
    broker = Member("broker", [os.path.join(BIN, "mqbroker"), "-c", broker_path], ports,
                    os.path.join(run_dir, "logs", "broker.log"))
    other = f"MQ_NAMESRV_PORT={ns_port + 1} MQ_BROKER_PORT={port + 10}"     # a broker takes port-2 .. port+1
    if writes:
        hint = (f"stop what holds it, or choose other ports for a first start in {_show(run_dir)}/: {other} "
                "(a second cluster also needs a directory of its own: MQ_RUN_DIR)")
    else:
        hint = (f"stop what holds it (another `make run` in {_show(run_dir)}/?); this directory's ports are in its "
                f"namesrv.properties and broker.conf (kept from its first start); a second cluster needs "
                f"a directory and ports of its own: MQ_RUN_DIR=run2 {other} make run")
    return Plan(run_dir, [namesrv, broker], writes, ns_port, cluster, hint)


def plan_layout(layout: str, run_dir: str) -> Plan:
    """A layout: its broker files copied (localize) into run_dir/NAME/ and a name server there,
    each kept once written."""
    from mq.options import parse_properties
    files = _layout_files(layout)
    name = os.path.basename(os.path.normpath(layout))
    base = os.path.join(run_dir, name)
    ns_env = _env_port("MQ_NAMESRV_PORT")
    writes: dict[str, str] = {}
    ns_path = os.path.join(base, "namesrv.properties")
    ns_default, _ = embedded_config(base, ns_env or NAMESRV_PORT, BROKER_PORT)
    namesrv, ns_port = _namesrv_member(base, _kept(ns_path, ns_default, writes), ns_path)
    _refuse_other_port("MQ_NAMESRV_PORT", ns_env, ns_path, ns_port)
    texts = {}
    for shipped in files:
        copy = os.path.join(base, os.path.basename(shipped))
        with open(shipped, encoding="utf-8") as f:
            texts[copy] = _kept(copy, localize(f.read(), run_dir, f"127.0.0.1:{ns_port}"), writes)
    members = [namesrv]
    for path, _, ports, _ in _brokers(texts):
        stem = os.path.splitext(os.path.basename(path))[0]
        members.append(Member(stem, [os.path.join(BIN, "mqbroker"), "-c", path], ports,
                              os.path.join(base, "logs", f"{stem}.log")))
    cluster = parse_properties(next(iter(texts.values()))).get("brokerClusterName", "DefaultCluster")
    hint = (f"the layout's ports are in {_show(base)}/ (copies of {_show(os.path.dirname(files[0]))}/ made at its "
            f"first start): stop what holds the port, or edit them there")
    return Plan(base, members, writes, ns_port, cluster, hint)


# the hosts layout: every process on a host of its own (mq.hosts), addresses in this order
HOSTS_NAMESRVS = ("ns1", "ns2")
HOSTS_GROUPS = {"RaftNode00": ("r0a", "r0b", "r0c"), "RaftNode01": ("r1a", "r1b", "r1c")}
HOSTS_MASTER_SLAVE = ("bm", "bs")         # broker-m: a SYNC_MASTER and its slave
HOSTS_CLIENT = "client"
# every host in address order (mq.hosts gives host i SUBNET.<i + 1>)
HOSTS_ORDER = (*HOSTS_NAMESRVS, *(h for g in HOSTS_GROUPS.values() for h in g), *HOSTS_MASTER_SLAVE, HOSTS_CLIENT)
HOSTS_CLUSTER = "HostsCluster"
DLEDGER_PORT = 40911


def hosts_layout_files(base: str) -> tuple[dict[str, str], dict[str, str], str]:
    """The hosts layout's files: (name server path -> text, broker path -> text, the name servers'
    address list), every process on its own host (see plan_hosts)."""
    from mq.hosts import SUBNET
    ip = {name: f"{SUBNET}.{i + 1}" for i, name in enumerate(HOSTS_ORDER)}
    nsaddr = ";".join(f"{ip[n]}:{NAMESRV_PORT}" for n in HOSTS_NAMESRVS)
    namesrvs = {os.path.join(base, f"{n}.properties"):
                f"listenPort={NAMESRV_PORT}\nlistenAddress={ip[n]}\nkvConfigPath={base}/{n}/kvConfig.json\n"
                for n in HOSTS_NAMESRVS}

    def broker(host: str, name: str, lines: list[str]) -> str:
        return "\n".join([
            "# the hosts layout (python -m mq.cli.local hosts): one broker of a host of its own",
            f"brokerClusterName={HOSTS_CLUSTER}", f"brokerName={name}", f"namesrvAddr={nsaddr}",
            f"listenAddress={ip[host]}", f"brokerIP1={ip[host]}", f"listenPort={BROKER_PORT}",
            f"storePathRootDir={base}/store-{host}", f"rocketmqHome={base}", "flushDiskType=ASYNC_FLUSH",
            "mappedFileSizeCommitLog=67108864", "maxHashSlotNum=50000", "maxIndexNum=200000",
            f"grpcServerPort={GRPC_PORT}", *lines, ""])
    brokers = {}
    for group, members in HOSTS_GROUPS.items():
        peers = ";".join(f"{h}-{ip[h]}:{DLEDGER_PORT}" for h in members)
        for h in members:
            brokers[os.path.join(base, f"{h}.conf")] = broker(h, group, [
                "enableDLegerCommitLog=true", f"dLegerGroup={group}", f"dLegerPeers={peers}", f"dLegerSelfId={h}"])
    master, slave = HOSTS_MASTER_SLAVE
    brokers[os.path.join(base, f"{master}.conf")] = broker(master, "broker-m", ["brokerId=0",
                                                                               "brokerRole=SYNC_MASTER"])
    brokers[os.path.join(base, f"{slave}.conf")] = broker(slave, "broker-m", [
        "brokerId=1", "brokerRole=SLAVE", f"haMasterAddress={ip[master]}:{BROKER_PORT + 1}"])
    return namesrvs, brokers, nsaddr


def plan_hosts(run_dir: str) -> Plan:
    """`python -m mq.cli.local hosts`: 2 name servers, 2 DLedger groups of 3 and a SYNC_MASTER
    with its slave, every one on a host of its own (network namespaces with addresses
    198.18.0.1..; mq.hosts; root), and a host `client` for clients; files under run_dir/hosts/,
    kept once written; the hosts' names and addresses in hosts.json there while it runs."""
    from mq.hosts import unavailable
    why = unavailable()
    if why is not None:
        raise SetupError(f"the hosts layout cannot run here: {why}")
    base = os.path.join(run_dir, "hosts")
    writes: dict[str, str] = {}
    namesrvs, brokers, nsaddr = hosts_layout_files(base)
    members = []
    for path, default in namesrvs.items():
        _kept(path, default, writes)
        n = os.path.splitext(os.path.basename(path))[0]
        members.append(Member(n, [os.path.join(BIN, "mqnamesrv"), "-c", path], [(NAMESRV_PORT, "listenPort")],
                              os.path.join(base, "logs", f"{n}.log"), host=n))
    texts = {path: _kept(path, default, writes) for path, default in brokers.items()}
    for path, _, ports, _ in _brokers(texts):
        h = os.path.splitext(os.path.basename(path))[0]
        members.append(Member(h, [os.path.join(BIN, "mqbroker"), "-c", path], ports,
                              os.path.join(base, "logs", f"{h}.log"), host=h))
    return Plan(base, members, writes, NAMESRV_PORT, HOSTS_CLUSTER,
                f"the layout's files are in {_show(base)}/", hosts=list(HOSTS_ORDER), namesrv=nsaddr)


def check_ports(plan: Plan) -> None:
    """SetupError naming the first port that two processes share or that is taken."""
    seen: dict[int, str] = {}
    for m in plan.members:
        if m.host is not None:                # a host's ports are its own
            continue
        for port, what in m.ports:
            if port in seen:
                raise SetupError(f"port {port} is {seen[port]} and {m.name}'s {what}: {plan.hint}")
            seen[port] = f"{m.name}'s {what}"
            if not port_bindable(port):
                raise SetupError(f"port {port} on 127.0.0.1, {m.name}'s {what}, is in use "
                                 f"(`ss -ltnp 'sport = :{port}'` shows by whom)\n  {plan.hint}")


def write_files(plan: Plan) -> None:
    """The missing config files, the ACL file under the base directory and the logs directory."""
    from mq import conf
    for path, text in plan.writes.items():
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    acl = os.path.join(plan.base, "conf", "plain_acl.yml")
    if not os.path.exists(acl):
        os.makedirs(os.path.dirname(acl), exist_ok=True)
        shutil.copyfile(conf.path("plain_acl.yml"), acl)
    os.makedirs(os.path.join(plan.base, "logs"), exist_ok=True)


# ---- running it ------------------------------------------------------------------------------------
class Console:
    """The terminal side: the processes' new log lines, prefixed with their names, and the
    lines typed on stdin (when it is readable and this process is in the foreground)."""

    def __init__(self, members: list[Member]):
        self.members = members
        self.width = max(len(m.name) for m in members)
        self.partial = {m.name: b"" for m in members}
        self.typed = b""
        try:
            self.stdin = sys.stdin.fileno()
        except (AttributeError, ValueError, OSError):
            self.stdin = None

    def say(self, text: str = "") -> None:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()

    def pump(self) -> None:
        for m in self.members:
            try:
                with open(m.log_path, "rb") as f:
                    f.seek(m.log_pos)
                    data = f.read(LOG_READ_MAX)
            except OSError:
                continue
            if not data:
                continue
            m.log_pos += len(data)
            data = self.partial[m.name] + data
            *lines, self.partial[m.name] = data.split(b"\n")
            for line in lines:
                sys.stdout.write(f"{m.name:<{self.width}} | {line.decode('utf-8', 'replace')}\n")
        sys.stdout.flush()

    def _may_read(self) -> bool:
        if self.stdin is None:
            return False
        if not os.isatty(self.stdin):
            return True
        try:
            return os.tcgetpgrp(self.stdin) == os.getpgrp()     # a background job must not read the tty
        except OSError:
            return False

    def lines(self, timeout_s: float) -> list[str]:
        """The lines typed within `timeout_s` (the loop's sleep)."""
        if not self._may_read():
            time.sleep(timeout_s)
            return []
        try:
            ready, _, _ = select.select([self.stdin], [], [], timeout_s)
            data = os.read(self.stdin, 4096) if ready else None
        except InterruptedError:
            return []
        except OSError:
            self.stdin = None
            return []
        if data == b"":                 # end of input: nothing more will be typed
            self.stdin = None
        if not data:
            return []
        *lines, self.typed = (self.typed + data).split(b"\n")
        return [line.decode("utf-8", "replace").strip() for line in lines]


class Launcher:
    def __init__(self, plan: Plan):
        self.plan = plan
        self.members = plan.members
        self.console = Console(plan.members)
        self.stop_requests = 0
        self.env = {**os.environ, "ROCKETMQ_HOME": plan.base}   # the ACL file under run/, never conf/'s
        self.hosts = None                                        # mq.hosts.Hosts of a hosts plan

    def on_signal(self, *_) -> None:
        self.stop_requests += 1

    def _wait_up(self, m: Member) -> str | None:
        """Waits until every port of `m` accepts connections; None, or why it did not."""
        deadline = time.monotonic() + PORT_WAIT_S
        while not self.stop_requests:
            self.console.pump()
            if not m.running:
                return m.how_it_ended()
            closed = m.closed_ports()
            if not closed:
                m.up = True
                return None
            if time.monotonic() > deadline:
                return f"did not open port {', '.join(f'{p} ({what})' for p, what in closed)} within {PORT_WAIT_S} s"
            time.sleep(POLL_S)
        return "stopped (Ctrl-C)"

    def _report(self, m: Member, how: str) -> None:
        self.console.pump()
        self.console.say(f"*** {m.name} (pid {m.proc.pid}) {how}; the last lines of {_show(m.log_path)}:")
        for line in m.tail():
            self.console.say(f"***   {line}")

    def make_hosts(self) -> None:
        """A hosts plan's hosts (mq.hosts), each member's command prefixed to run in its own, and
        hosts.json (name -> namespace, address) under the base directory for clients and tools."""
        import json

        from mq.hosts import Hosts
        self.hosts = Hosts(self.plan.hosts)
        for m in self.members:
            m.prefix = self.hosts[m.host].prefix
        with open(os.path.join(self.plan.base, "hosts.json"), "w", encoding="utf-8") as f:
            json.dump({h.name: {"netns": h.netns, "ip": h.ip} for h in self.hosts.hosts.values()}, f, indent=1)

    def close_hosts(self) -> None:
        if self.hosts is not None:
            self.hosts.close()
            self.hosts = None
            try:
                os.remove(os.path.join(self.plan.base, "hosts.json"))
            except OSError:
                pass

    def start_all(self) -> bool:
        if self.plan.hosts:
            self.make_hosts()
        for m in self.members:
            m.start(self.env)
            why = self._wait_up(m)
            if why is not None:
                if not self.stop_requests:
                    self._report(m, why)
                    self.console.say(f"*** {m.name} did not start: stopping the others")
                return False
        return True

    def table(self) -> None:
        say = self.console.say
        width = self.console.width
        say(f"  {'name':<{width}}  {'pid':>7}  {'state':<8} ports")
        for m in self.members:
            state = "up" if m.running and m.up else "starting" if m.running else "exited"
            pid = m.proc.pid if m.proc else "-"
            ports = " ".join(f"{p}" for p, _ in m.ports)
            say(f"  {m.name:<{width}}  {pid:>7}  {state:<8} {ports}")
        say(f"  logs: {_show(os.path.join(self.plan.base, 'logs'))}/NAME.log")

    def greet(self) -> None:
        bin_dir = _show(BIN)
        ns = self.plan.namesrv
        if self.hosts is not None:
            run = f"ip netns exec {self.hosts[HOSTS_CLIENT].netns}"
            self.console.say(f"\nhosts cluster up, under {_show(self.plan.base)}/ (config, stores, logs; hosts.json):")
            self.table()
            for h in self.hosts.hosts.values():
                self.console.say(f"  host {h.name:<7} {h.ip:<12} netns {h.netns}")
            self.console.say(f"""clients run in the host `{HOSTS_CLIENT}` ({self.hosts[HOSTS_CLIENT].ip}); try, as root:
  {run} {bin_dir}/mqadmin clusterList -n '{ns}'
  {run} {bin_dir}/mqadmin updateTopic -n '{ns}' -c {self.plan.cluster} -t DemoTopic
  {run} {bin_dir}/python -m mq.cli.demo_client '{ns}'
A host's network: ip netns exec NETNS ip link set eth0 down (and up).  Type a process's name and
Enter to start it again, `status` for the table.  Ctrl-C stops them all and removes the hosts.
""")
            return
        self.console.say(f"\nlocal cluster up, under {_show(self.plan.base)}/ (config, stores, ACL file, logs):")
        self.table()
        self.console.say(f"""try, in another terminal:
  {bin_dir}/mqadmin clusterList -n {ns}
  {bin_dir}/mqadmin updateTopic -n {ns} -c {self.plan.cluster} -t DemoTopic
  {bin_dir}/python -m mq.cli.demo_client {ns}
When a process exits the others keep running: type its name and Enter to start it again (a
running one is stopped first), `status` for the table above.  Ctrl-C stops them all.
""")

    def _release_ports(self, m: Member) -> tuple[int, str] | None:
        """Waits until the ports of `m` are free; the one still taken after that, or None.  Its last
        run's processes can hold them a moment after the one the launcher started died: a broker
        killed with SIGKILL leaves its io workers and roles, which exit once they see their parent
        gone (seen: a restart typed right after the kill found the fast port taken).  They are
        given LEFTOVER_WAIT_S, then SIGKILL to that run's session (its process group: only processes
        it started), then LEFTOVER_KILL_WAIT_S."""
        busy = m.busy_port()
        if busy is None or m.proc is None:
            return busy
        self.console.say(f"*** waiting for {m.name}'s last run to release port {busy[0]} ({busy[1]})")
        for wait_s, kill_first in ((LEFTOVER_WAIT_S, False), (LEFTOVER_KILL_WAIT_S, True)):
            if kill_first:
                self.console.say(f"*** killing what is left of {m.name}'s last run (session {m.proc.pid})")
                m.signal(signal.SIGKILL, group=True)
            deadline = time.monotonic() + wait_s
            while busy is not None and time.monotonic() < deadline and not self.stop_requests:
                self.console.pump()
                time.sleep(POLL_S)
                busy = m.busy_port()
            if busy is None or self.stop_requests:
                return busy
        return busy

    def restart(self, name: str) -> None:
        m = next((m for m in self.members if m.name == name), None)
        if m is None:
            self.console.say(f"*** no process {name!r}: type one of {', '.join(x.name for x in self.members)}, "
                             "or `status`")
            return
        if m.running:
            self.console.say(f"*** stopping {m.name} (pid {m.proc.pid})")
            self._stop([m])
        busy = self._release_ports(m)
        if busy is not None:
            if not self.stop_requests:             # (a Ctrl-C while waiting: stop_all follows)
                self.console.say(f"*** cannot start {m.name}: port {busy[0]} ({busy[1]}) is still in use "
                                 f"after {LEFTOVER_WAIT_S + LEFTOVER_KILL_WAIT_S:g} s (another program?)")
            return
        m.start(self.env)
        self.console.say(f"*** {m.name} started again (pid {m.proc.pid})")

    def watch(self) -> int:
        """Until Ctrl-C (0) or until every process has exited (1)."""
        while not self.stop_requests:
            self.console.pump()
            for m in self.members:
                if m.proc is None:
                    continue
                if not m.running and not m.reported and not m.stopping:
                    m.reported = True
                    self._report(m, m.how_it_ended())
                    self.console.say(f"*** the others keep running; type {m.name} and Enter to start it again")
                elif m.running and not m.up:
                    closed = m.closed_ports()
                    if not closed:
                        m.up = True
                        self.console.say(f"*** {m.name} is up (pid {m.proc.pid})")
                    elif time.monotonic() - m.started_at > PORT_WAIT_S and not m.reported:
                        m.reported = True
                        ports = ", ".join(f"{p} ({what})" for p, what in closed)
                        self._report(m, f"has not opened port {ports} within {PORT_WAIT_S} s")
            if not any(m.running for m in self.members):
                self.console.say("*** every process has exited")
                return 1
            for line in self.console.lines(POLL_S):
                if line in ("status", ""):
                    self.table()
                else:
                    self.restart(line)
        return 0

    def _stop(self, members: list[Member]) -> None:
        """SIGTERM to each running one, then waits; SIGKILL to the sessions of those still
        running after STOP_WAIT_S or at a further Ctrl-C."""
        running = [m for m in members if m.running]
        for m in running:
            m.stopping = True
            m.signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_WAIT_S
        requests = self.stop_requests
        while any(m.running for m in running):
            self.console.pump()
            if time.monotonic() > deadline or self.stop_requests > max(requests, 1):
                self.console.say(f"*** killing {', '.join(m.name for m in running if m.running)}")
                for m in running:
                    if m.running:
                        m.signal(signal.SIGKILL, group=True)
                requests = self.stop_requests
                deadline = time.monotonic() + STOP_WAIT_S
            time.sleep(POLL_S)
        self.console.pump()

    def stop_all(self) -> int:
        """Brokers first (they unregister from the name server), then the name server; the
        number of processes that did not exit with status 0."""
        namesrvs = [m for m in self.members if os.path.basename(m.argv[0]) == "mqnamesrv"]
        self._stop([m for m in self.members if m not in namesrvs])
        self._stop(namesrvs)
        return sum(1 for m in self.members if m.stopping and m.proc.returncode != 0)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    if len(argv) > 1:
        print("usage: python -m mq.cli.local [LAYOUT | DIRECTORY]   (-h for more)", file=sys.stderr)
        return 2
    run_dir = os.path.abspath(os.environ.get("MQ_RUN_DIR") or "run")
    try:
        plan = (plan_hosts(run_dir) if argv == ["hosts"] else plan_layout(argv[0], run_dir) if argv
                else plan_single(run_dir))
        check_ports(plan)
        write_files(plan)
    except SetupError as e:
        print(f"mq.cli.local: {e}", file=sys.stderr)
        return 2
    launcher = Launcher(plan)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, launcher.on_signal)
    if launcher.start_all():
        launcher.greet()
        code = launcher.watch()
    else:
        code = 0 if launcher.stop_requests else 1
    unclean = launcher.stop_all()
    launcher.close_hosts()
    if launcher.stop_requests and code == 0:
        launcher.console.say(f"*** stopped{'' if not unclean else f'; {unclean} process(es) not cleanly'}")
    return code


if __name__ == "__main__":
    sys.exit(main())
