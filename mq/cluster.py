"""Real name servers and brokers as subprocesses on 127.0.0.1: for tests, benchmarks, the
perf tools and anyone who wants a throwaway cluster from Python.

    from mq.cluster import Broker, NameServer

    ns = NameServer(workdir)                      # mqnamesrv on a free port, serving on return
    broker = Broker(workdir, ns.addr)             # mqbroker, registered and serving on return
    ...                                           # ns.addr / broker.addr are "127.0.0.1:<port>"
    assert broker.stop() == 0 and ns.stop() == 0  # SIGTERM; exit status (SIGKILL after a timeout)

Every process listens on loopback only, on a port chosen free below the kernel's ephemeral
range, and keeps its config, log and store in a directory of its own under `workdir` (the
caller's, e.g. a temporary directory; nothing is removed).  The programs are the installed
console scripts `mqnamesrv` and `mqbroker` next to this interpreter (`BIN`, the directory of
sys.executable: a venv's bin/).  Each server runs in a session of its own, so a terminal's
Ctrl-C reaches only the caller.  Waits are conditions polled with a deadline (`wait_for`),
never bare sleeps."""
from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time

from mq.proxy import FaultProxy
from mq.remoting import RemotingClient, RemotingTimeout
from mq.dledger.role import read_status
from mq.store.commitlog import list_files
from mq.store.control import sweep_dead_segments
from mq.wire.filenames import offset_file_path

__all__ = ["BIN", "Broker", "NameServer", "Proc", "call", "free_port", "port_open", "wait_dispatched", "wait_for"]

#: where the console scripts (mqnamesrv, mqbroker, mqadmin, ...) are: next to this interpreter
BIN = os.path.dirname(sys.executable)


def wait_for(cond, timeout_s: float = 30.0, interval_s: float = 0.05, what: str = "condition"):
    """Calls cond() every `interval_s` until it returns something true, and returns that;
    raises TimeoutError naming `what` once `timeout_s` have passed.  A cond that times out itself
    (RemotingTimeout, TimeoutError: one poll's request went unanswered for its own timeout) is
    one more "not yet", and the last such error is the final TimeoutError's cause: the deadline
    is the verdict.  (A fresh-clone CI run saw every process of a test, the name server's too,
    stop for 2-7 s at the same instants; one poll's 5 s timeout then failed a module whose
    condition held well within its 30 s.)  Any other error propagates at once."""
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while True:
        try:
            v = cond()
        except (RemotingTimeout, TimeoutError) as e:
            v, last = None, e
        if v:
            return v
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s}s waiting for {what}") from last
        time.sleep(interval_s)


def call(addr: str, code: int, ext: dict | None = None, body: bytes = b"", timeout_s: float = 5.0,
         remark: str | None = None):
    """One remoting request to `addr` on a connection of its own; its answer (or raises)."""
    async def go():
        c = RemotingClient()
        try:
            cmd = c.request(code, ext, body)
            cmd.remark = remark
            return await c.invoke(addr, cmd, timeout_s)
        finally:
            await c.close()
    return asyncio.run(go())


def wait_dispatched(addr: str, timeout_s: float = 30.0) -> None:
    """Waits until the broker at `addr` has dispatched every record it holds (readable ones: up
    to the commit in DLedger mode) into its ConsumeQueues and index.  A
    send is answered once its record is stored; the dispatch role writes the ConsumeQueue entry
    after that (RocketMQ's ReputMessageService does the same), so a test that sends and then
    pulls, reads max offsets or queries by key must wait here first.  (GET_BROKER_RUNTIME_INFO:
    dispatchedOffset >= commitLogMaxOffset; the index is built before dispatchedOffset moves.)"""
    def done() -> bool:
        t = json.loads(call(addr, 28).body)["table"]
        return int(t["dispatchedOffset"]) >= int(t["commitLogMaxOffset"])
    wait_for(done, timeout_s, 0.02, f"{addr} to dispatch what it holds")


def port_bindable(port: int) -> bool:
    """Whether a server could bind 127.0.0.1:port now (as the servers do: SO_REUSEADDR, so a
    connection of an earlier run in TIME_WAIT does not count; a listener or a socket bound
    without it does)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


PORT_RANGE_ENV = "MQ_PORT_RANGE"


def port_range() -> tuple[int, int]:
    """[lo, hi) free_port chooses from: 20000 up to just below the kernel's ephemeral range (a
    port from that range can be taken by any outgoing connection between the check and the
    server's bind), or MQ_PORT_RANGE=lo-hi: the test suite gives each of its parallel workers a
    slice of its own, so a port one worker chose and has not bound yet is never another's."""
    lo, hi = 20000, _ephemeral_low() - 4
    given = os.environ.get(PORT_RANGE_ENV)
    if given:
        a, _, b = given.partition("-")
        lo, hi = max(lo, int(a)), min(hi, int(b))
        if hi - lo < 100:
            raise ValueError(f"{PORT_RANGE_ENV}={given}: fewer than 100 ports below the ephemeral range")
    return lo, hi


PORT_HOLD_S = 120.0                # a port free_port handed out is not handed out again for this long
_handed_out: dict[int, float] = {}  # port -> when free_port handed it out (as p + d of some span)


def free_port(span: tuple[int, ...] = (0,)) -> int:
    """A port p on 127.0.0.1 such that p+d is free for every d in span (a broker needs -2, 0
    and +1: its fast port, its port and its HA port), chosen at random from port_range().  A
    port it handed out in the last PORT_HOLD_S is never handed out again, as p+d of any span:
    a caller that chooses several ports before it binds them (a DLedger group chooses its
    members' peer ports, then starts the brokers, each choosing its own ports) would otherwise
    get one of them twice, the bind check seeing it still free (seen once: a member's peer port
    taken by another member's HA port)."""
    lo, hi = port_range()
    lo, hi = lo - min(span), hi - max(span)      # every p+d inside the range
    now = time.monotonic()
    for port, at in list(_handed_out.items()):
        if now - at > PORT_HOLD_S:
            del _handed_out[port]
    for _ in range(500):
        p = random.randrange(lo, hi)
        if any(p + d in _handed_out for d in span):
            continue
        if all(port_bindable(p + d) for d in span):
            for d in span:
                _handed_out[p + d] = now
            return p
    raise RuntimeError("no free port range found")


def port_open(port: int) -> bool:
    """Whether something accepts TCP connections on 127.0.0.1:port (0.2 s connect timeout)."""
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


STACK_DUMP_WAIT_S = 0.3           # for one process's stacks to be written before the next is asked


class Proc:
    """A subprocess in a session of its own, its stdout and stderr appended to `log_path`,
    its environment this process's plus `env`.  `p` is the subprocess.Popen.

    `Proc.started`: when a caller sets it to a list, every Proc appends itself there (the test
    suite does, to show a failed test the tail of each server's log)."""

    started: list | None = None

    def __init__(self, args: list[str], log_path: str, env: dict | None = None, prefix: list[str] | None = None):
        """prefix: argv that runs the command elsewhere (a host's `ip netns exec <ns>`: it execs
        the command, so the pid is the command's)."""
        args = list(prefix or []) + list(args)
        self.args = args
        self.log_path = log_path
        self.log = open(log_path, "ab")
        self.p = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT,
                                  env={**os.environ, **(env or {})}, start_new_session=True)
        if Proc.started is not None:
            Proc.started.append(self)

    def stop(self, timeout_s: float = 20.0) -> int:
        """SIGTERM (the servers' clean stop), then SIGKILL to its whole session if it has not
        exited after `timeout_s`; closes the log and returns the exit status (negative: the
        signal that ended it)."""
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.dump_stacks(f"not stopped {timeout_s:g} s after SIGTERM")
                self.kill()
        self.log.close()
        return self.p.returncode

    def dump_stacks(self, why: str) -> None:
        """SIGQUIT to each process of its session, one at a time and the leader last (its
        stacks then end the log, where a failed test's log tail looks): our servers print
        every thread's stack and go on (mq.logs.enable_stack_dumps)."""
        procs = processes_of_group(self.p.pid)
        leader = procs.pop("broker", [])
        for name, pids in sorted(procs.items()) + [("leader", leader)]:
            for pid in pids:
                self.log.write(f"--- {why}: the stacks of {name}[{pid}] (SIGQUIT) ---\n".encode())
                self.log.flush()
                try:
                    os.kill(pid, signal.SIGQUIT)
                except ProcessLookupError:
                    continue
                time.sleep(STACK_DUMP_WAIT_S)

    def kill(self) -> None:
        """SIGKILL to the process and everything in its session (a crash, as far as the
        store can tell); once they are gone, the shared-memory segments of dead brokers are
        removed, as the next mqbroker start on this host would (a caller that still wants
        to read a killed broker's control block attaches to it before the kill)."""
        if self.p.poll() is None:
            try:
                os.killpg(self.p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.p.wait(10)
            wait_for(lambda: not processes_of_group(self.p.pid), 10, what="the killed processes gone")
            sweep_dead_segments()

    def output(self) -> str:
        """Everything it has written so far (the whole log file)."""
        if not self.log.closed:
            self.log.flush()
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def tail(self, max_bytes: int = 6000) -> str:
        """The last `max_bytes` of its log, from a line start."""
        try:
            with open(self.log_path, "rb") as f:
                size = f.seek(0, os.SEEK_END)
                f.seek(max(0, size - max_bytes))
                text = f.read().decode("utf-8", "replace")
        except OSError as e:
            return f"(log unreadable: {e})"
        return text if size <= max_bytes else text.split("\n", 1)[-1]


class NameServer:
    """`mqnamesrv` on 127.0.0.1:<free port>, with its config, KV file and log in
    `workdir/namesrv-<port>/`; serving (its port accepts connections) when the constructor
    returns, RuntimeError with its output if it exited instead.  host (an mq.hosts.Host): run
    in that host instead, on its address and RocketMQ's port 9876 (the host's own)."""

    def __init__(self, workdir: str, host=None):
        self.host = host
        self.ip = host.ip if host is not None else "127.0.0.1"
        self.port = 9876 if host is not None else free_port()
        self.dir = os.path.join(workdir, f"namesrv-{host.name}" if host is not None else f"namesrv-{self.port}")
        os.makedirs(self.dir, exist_ok=True)
        self.conf = os.path.join(self.dir, "namesrv.conf")
        with open(self.conf, "w") as f:
            f.write(f"listenPort={self.port}\nlistenAddress={self.ip}\n"
                    f"kvConfigPath={self.dir}/kvConfig.json\n")
        self.start()

    def start(self) -> None:
        """Starts (or restarts, on the same port) the name server; returns once it listens."""
        self.proc = Proc([os.path.join(BIN, "mqnamesrv"), "-c", self.conf], os.path.join(self.dir, "namesrv.log"),
                         prefix=self.host.prefix if self.host is not None else None)
        self._starts = getattr(self, "_starts", 0) + 1
        if self.host is None:
            ready = lambda: port_open(self.port)                                      # noqa: E731
        else:                                    # its port is not reachable from here: its log says
            ready = lambda: self.proc.output().count("name server listening on") >= self._starts  # noqa: E731
        wait_for(lambda: ready() or self.proc.p.poll() is not None, 30, what="name server port")
        if self.proc.p.poll() is not None:
            raise RuntimeError("name server exited:\n" + self.proc.output())

    def kill(self) -> None:
        """SIGKILL (its routes are lost: brokers re-register within their 30 s interval)."""
        self.proc.kill()

    @property
    def addr(self) -> str:
        return f"{self.ip}:{self.port}"

    def stop(self) -> int:
        """SIGTERM; the exit status (0 for a clean stop)."""
        return self.proc.stop()


class Broker:
    """`mqbroker` of cluster TestCluster registering with `namesrv` ("host:port"), on
    127.0.0.1 at listenPort (free: -2, 0 and +1 are checked), its store, broker.conf and log
    in `workdir/<name>-<port>/`.  Defaults for quick starts: 16 MiB CommitLog files and every
    delay level 1 s; any broker option passed as a keyword overrides them (listenPort and
    storePathRootDir too).  Serving (every io worker up) when the constructor returns,
    RuntimeError with its output if it exited instead.  restart() stops it cleanly and starts
    it again on the same port and store.  `env`: variables added to the broker's environment
    (on every start).  host (an mq.hosts.Host): run in that host instead, on its address
    (listenAddress = brokerIP1) and RocketMQ's port 10911 (the host's own)."""

    def __init__(self, workdir: str, namesrv: str, name: str = "broker-a", env: dict | None = None, host=None,
                 **options):
        self.env = env
        self.host = host
        self.ip = host.ip if host is not None else "127.0.0.1"
        self.port = options.pop("listenPort", None) or (10911 if host is not None else free_port((-2, 0, 1)))
        self.name = name
        self.dir = options.pop("storePathRootDir", None) or os.path.join(
            workdir, f"{name}-{host.name}" if host is not None else f"{name}-{self.port}")
        os.makedirs(self.dir, exist_ok=True)
        self.options = {
            "brokerClusterName": "TestCluster", "brokerName": name, "listenPort": self.port,
            "listenAddress": self.ip, "brokerIP1": self.ip, "namesrvAddr": namesrv,
            "storePathRootDir": self.dir, "mappedFileSizeCommitLog": 16 * 1024 * 1024,
            "messageDelayLevel": " ".join(["1s"] * 18), **options}
        self.conf = os.path.join(self.dir, "broker.conf")
        self.proc: Proc | None = None
        self.start()

    def start(self) -> None:
        """Writes broker.conf from `options` and starts the broker; returns once it serves."""
        with open(self.conf, "w") as f:
            f.writelines(f"{k}={v}\n" for k, v in self.options.items())
        self.proc = Proc([os.path.join(BIN, "mqbroker"), "-c", self.conf], os.path.join(self.dir, "broker.log"),
                         env=self.env, prefix=self.host.prefix if self.host is not None else None)
        self._starts = getattr(self, "_starts", 0) + 1
        # ready = the supervisor's line saying every io worker is serving
        wait_for(lambda: self.proc.output().count(" io workers; name servers") >= self._starts
                 or self.proc.p.poll() is not None, 60, what="broker serving")
        if self.proc.p.poll() is not None:
            raise RuntimeError("broker exited:\n" + self.proc.output())

    @property
    def addr(self) -> str:
        return f"{self.ip}:{self.port}"

    def stop(self, timeout_s: float = 20.0) -> int:
        """SIGTERM; the exit status (0 for a clean stop: store flushed, abort file removed);
        SIGKILL after `timeout_s` (a DLedger leader's hand-over window needs longer)."""
        return self.proc.stop(timeout_s)

    def kill(self) -> None:
        """SIGKILL to the broker and all its processes (Proc.kill)."""
        self.proc.kill()

    def restart(self) -> None:
        """A clean stop (asserted: exit status 0), then start() on the same port and store."""
        assert self.stop() == 0, self.proc.output()[-3000:]
        self.start()

    def signal_all(self, sig: int) -> None:
        """`sig` to every process of the broker: its process group (the supervisor leads it;
        the launcher and every role process it forked belong to it).  SIGSTOP returns once
        every thread of the group is stopped (stop_group)."""
        if sig == signal.SIGSTOP:
            stop_group(self.proc.p.pid)
        else:
            os.killpg(self.proc.p.pid, sig)

    def processes(self) -> dict[str, list[int]]:
        """The broker's live processes by role name, from /proc: "broker" (the supervisor),
        "launcher", "io-0", ..., "flush", "dispatch", "ha-master"/"ha-slave", "dledger"
        (each role process names itself with prctl; multiprocessing's resource tracker, which
        is in the group too, is left out)."""
        return processes_of_group(self.proc.p.pid)

    def commitlog_maps(self) -> dict[str, tuple[int, int]]:
        """(CommitLog data-file mappings, of them of deleted files) per live process of the broker
        by role name, from /proc/<pid>/maps: a mapping keeps a deleted file's blocks on disk.  The
        data files are those under the store's `commitlog/` (master/slave) or a DLedger `data/`."""
        out: dict[str, tuple[int, int]] = {}
        for role, pids in self.processes().items():
            for pid in pids:
                try:
                    with open(f"/proc/{pid}/maps") as f:
                        lines = [line for line in f if self.dir in line and ("/commitlog/" in line or "/data/" in line)]
                except OSError:
                    continue                              # (ended meanwhile)
                if lines:
                    total, deleted = out.get(role, (0, 0))
                    out[role] = (total + len(lines), deleted + sum(line.endswith("(deleted)\n") for line in lines))
        return out


def _threads_stopped(pid: int) -> bool:
    """Every thread of process `pid` stopped (or the process gone)."""
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] not in "TtZX":
                    return False
    except (OSError, ValueError, IndexError):
        pass                              # gone meanwhile
    return True


def stop_group(pgid: int, timeout_s: float = 10.0) -> None:
    """SIGSTOP to process group `pgid`, returning once every thread of its processes is stopped.
    kill() only queues the signal: a thread running on another CPU stops when that CPU takes the
    interrupt, which on a busy VM can come after the caller's next request was served (a
    "stalled" slave acknowledged a send once that way)."""
    os.killpg(pgid, signal.SIGSTOP)

    def all_stopped() -> bool:
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if int(fields[2]) != pgid or fields[0] in "ZX":
                    continue
            except (OSError, ValueError, IndexError):
                continue                  # gone meanwhile
            if not _threads_stopped(int(entry)):
                return False
        return True
    wait_for(all_stopped, timeout_s, 0.002, f"every thread of process group {pgid} stopped")


def stop_process(pid: int, timeout_s: float = 10.0) -> None:
    """SIGSTOP to the one process `pid`, returning once every thread of it is stopped (as
    stop_group)."""
    os.kill(pid, signal.SIGSTOP)
    wait_for(lambda: _threads_stopped(pid), timeout_s, 0.002, f"every thread of process {pid} stopped")


def processes_of_group(pgid: int) -> dict[str, list[int]]:
    """Live processes of process group `pgid` by their /proc comm name, the group leader as
    "broker"."""
    out: dict[str, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[2]) != pgid or fields[0] == "Z":
                continue
            with open(f"/proc/{pid}/comm") as f:
                comm = f.read().strip()
        except (OSError, ValueError, IndexError):
            continue
        if pid == pgid:
            comm = "broker"
        elif comm in ("python", "python3") or comm.startswith("python3."):
            continue                      # the resource tracker (a fresh interpreter, not a role)
        out.setdefault(comm, []).append(pid)
    return out


DLEDGER_INDEX_FILE_SIZE = 1024 * 1024  # 32768 entries per index file: tests roll them
DLEDGER_PORT = 40911                   # a DLedger member's peer port in a host of its own


class DLedgerGroup:
    """`n` mqbroker processes of one DLedger group (ids n0..), name server `namesrv`.  proxied: member A
    reaches member B through proxies[(A, B)], so a test can cut any link in any direction.
    env_for(id): the environment variables added for that member (or None); options_for(id): broker
    options for that member only (e.g. a metricsPort each), over `options`.  hosts: member id ->
    the mq.hosts.Host it runs in (peers then talk over the hosts' addresses, port DLEDGER_PORT)."""

    def __init__(self, workdir: str, namesrv: str, n: int = 3, name: str = "RaftNode00", proxied: bool = False,
                 ids: list[str] | None = None, env_for=None, options_for=None, hosts: dict | None = None, **options):
        self.workdir = workdir
        self.namesrv = namesrv
        self.name = name
        self.ids = ids or [f"n{i}" for i in range(n)]
        self.hosts = hosts or {}
        assert not (proxied and hosts), "a group in hosts is cut by the hosts' network, not by proxies"
        self.peer_port = {i: DLEDGER_PORT if i in self.hosts else free_port() for i in self.ids}
        self.proxies: dict[tuple[str, str], FaultProxy] = {}
        if proxied:
            for a in self.ids:
                for b in self.ids:
                    if a != b:
                        self.proxies[(a, b)] = FaultProxy("127.0.0.1", self.peer_port[b])
        # dLegerForwardOnStopMs 0: a stopped leader exits at once (a test that wants the hand-over
        # window passes its own)
        self.options = {"brokerClusterName": "RaftCluster", "enableDLegerCommitLog": "true", "dLegerForwardOnStopMs": 0,
                        "dLegerGroup": name, "mappedFileSizeForEntryIndex": DLEDGER_INDEX_FILE_SIZE,
                        "sendMessageThreadPoolNums": 1, **options}
        self.brokers: dict[str, Broker] = {}
        try:
            for i in self.ids:
                self.brokers[i] = Broker(workdir, namesrv, name=name, dLegerSelfId=i, dLegerPeers=self._peers(i),
                                         storePathRootDir=os.path.join(workdir, f"{name}-{i}"),
                                         env=env_for(i) if env_for else None, host=self.hosts.get(i),
                                         **{**self.options, **(options_for(i) if options_for else {})})
        except BaseException:
            self.close()
            raise

    def _peers(self, me: str) -> str:
        parts = []
        for i in self.ids:
            port = self.peer_port[i] if i == me or (me, i) not in self.proxies else self.proxies[(me, i)].port
            parts.append(f"{i}-{self.hosts[i].ip if i in self.hosts else '127.0.0.1'}:{port}")
        return ";".join(parts)

    # ---- state ------------------------------------------------------------------------------------
    def status(self, i: str) -> dict:
        return read_status(self.brokers[i].dir) or {}

    def leader(self, among=None) -> str | None:
        """The member that leads and serves writes, if exactly one does."""
        found = [i for i in (among or self.ids) if self.alive(i)
                 and self.status(i).get("role") == "LEADER" and self.status(i).get("ready")]
        return found[0] if len(found) == 1 else None

    def wait_leader(self, timeout_s: float = 30.0, among=None) -> str:
        return wait_for(lambda: self.leader(among), timeout_s, 0.02, "a ready DLedger leader")

    def alive(self, i: str) -> bool:
        b = self.brokers.get(i)
        return b is not None and b.proc is not None and b.proc.p.poll() is None

    def addr(self, i: str) -> str:
        return self.brokers[i].addr

    # ---- faults -----------------------------------------------------------------------------------
    def kill(self, i: str) -> None:
        self.brokers[i].kill()

    def restart(self, i: str) -> None:
        b = self.brokers[i]
        if self.alive(i):
            b.stop()
        b.start()

    def freeze(self, i: str) -> None:
        """SIGSTOP the whole broker (supervisor, launcher and every role); returns once stopped."""
        stop_group(self.brokers[i].proc.p.pid)

    def thaw(self, i: str) -> None:
        os.killpg(self.brokers[i].proc.p.pid, signal.SIGCONT)

    def isolate(self, i: str, how: str = "blackhole") -> None:
        """Every link to and from member i stops carrying data (or is cut)."""
        assert self.proxies, "the group was not started with proxied=True"
        for (a, b), p in self.proxies.items():
            if i in (a, b):
                getattr(p, how)()

    def heal(self) -> None:
        for p in self.proxies.values():
            p.heal()

    # ---- the logs ---------------------------------------------------------------------------------
    def data_files(self, i: str) -> list[int]:
        """Start positions of member i's data files."""
        return list_files(os.path.join(self.brokers[i].dir, f"dledger-{i}", "data"))

    def data_bytes(self, i: str, end: int, start: int | None = None) -> bytes:
        """Member i's data-file bytes [start (default: its first retained file), end)."""
        d = os.path.join(self.brokers[i].dir, f"dledger-{i}", "data")
        files = list_files(d)
        fs = int(self.options.get("mappedFileSizeCommitLog", 16 * 1024 * 1024))
        out = bytearray()
        pos = start if start is not None else files[0] if files else 0
        while pos < end:
            with open(offset_file_path(d, (pos - pos % fs)), "rb") as f:
                f.seek(pos % fs)
                chunk = f.read(min(end, pos - pos % fs + fs) - pos)
            out += chunk
            pos += len(chunk)
        return bytes(out)

    def committed_pos(self, i: str) -> int:
        return int(self.status(i).get("committedPos", 0))

    # ---- teardown ---------------------------------------------------------------------------------
    def close(self) -> None:
        for i, b in self.brokers.items():
            if self.alive(i):
                try:
                    self.thaw(i)
                except ProcessLookupError:
                    pass
                b.stop()
        for p in self.proxies.values():
            p.close()
