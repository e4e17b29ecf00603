"""Hosts on one machine: each a Linux network namespace with one interface, joined by veth links
to a bridge in a namespace of its own, so name servers, brokers and clients talk over real
interfaces and addresses, and a network fault is a fault of the kernel's, not of a proxy.

    with Hosts(["ns1", "a", "client"]) as hosts:
        ns = NameServer(workdir, host=hosts["ns1"])                 (mq.cluster)
        hosts.run("client", ["mqadmin", "clusterList", "-n", ns.addr])
        hosts.cut("a")              the host's link down: cut off from every other host
        hosts.drop("a", "ns1")      one way: what a sends to ns1 is lost (a blackhole route in a)
        hosts.heal()
        hosts.kill_host("a")        SIGKILL to every process in a's namespace
        with inside(hosts["client"]): ...   this thread's sockets are the client host's

Addresses: host i (in the order given) is 198.18.0.<i+1>/24, from the benchmarking range
198.18.0.0/15, and exists only inside the namespaces: no namespace has a default route, the
bridge namespace has no address, so nothing can leave them and nothing outside can reach them.
Each host also has its own loopback.  Needs root and iproute2 (`ip netns`, veth, bridge);
unavailable() says why not, for a test to skip on.

Names: every namespace is `mqh<pid>x<tag>-<host>`, <pid> the creating process's, so a harness
that finds namespaces of a dead creator (a crashed test) removes them and their processes
(sweep_leftovers, run by every new Hosts).  close() kills every process in the namespaces and
deletes them (deleting a namespace deletes its veth ends; the bridge goes with its namespace).
Limits: HOSTS_MAX hosts per harness; interface names are eth0 in a host and v<i> in the bridge
namespace."""
from __future__ import annotations

import contextlib
import ctypes
import os
import re
import secrets
import shutil
import signal
import subprocess
import time

PREFIX = "mqh"
SUBNET = "198.18.0"          # host i: SUBNET.<i + 1>/24
HOSTS_MAX = 200
NETNS_DIR = "/run/netns"     # where `ip netns add` pins a namespace by name
CLONE_NEWNET = 0x40000000
IP_TIMEOUT_S = 10.0
_NAME = re.compile(rf"^{PREFIX}(\d+)x([0-9a-f]+)-(.+)$")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=IP_TIMEOUT_S)
    if check and p.returncode != 0:
        raise OSError(f"ip {' '.join(args)}: {p.stderr.strip() or p.returncode}")
    return p


def unavailable() -> str | None:
    """Why hosts cannot be made here (None: they can): not root, no iproute2, or the kernel
    refuses a namespace."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    probe = f"{PREFIX}{os.getpid()}x{secrets.token_hex(3)}-probe"
    p = _ip("netns", "add", probe, check=False)
    if p.returncode != 0:
        return f"`ip netns add` failed: {p.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


def _namespaces() -> list[str]:
    p = _ip("netns", "list", check=False)
    return [line.split()[0] for line in p.stdout.splitlines() if line.strip()]


def _pids(netns: str) -> list[int]:
    p = _ip("netns", "pids", netns, check=False)
    return [int(x) for x in p.stdout.split() if x.isdigit()]


def _kill_all(netns: str, timeout_s: float = 10.0) -> None:
    """SIGKILL to every process in the namespace, until none is left."""
    deadline = time.monotonic() + timeout_s
    while True:
        pids = _pids(netns)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if time.monotonic() > deadline:
            raise OSError(f"processes {pids} of {netns} survive SIGKILL")
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_leftovers() -> list[str]:
    """Removes the namespaces (and their processes) of harnesses whose creating process is
    gone; the names removed."""
    gone = []
    for ns in _namespaces():
        m = _NAME.match(ns)
        if m and not _alive(int(m.group(1))):
            _kill_all(ns)
            _ip("netns", "del", ns, check=False)
            gone.append(ns)
    return gone


class Host:
    """One host: its namespace, its address, and the argv prefix that runs a command in it."""

    def __init__(self, name: str, netns: str, ip: str):
        self.name, self.netns, self.ip = name, netns, ip

    @property
    def prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.netns]

    def __repr__(self) -> str:
        return f"Host({self.name} {self.ip} in {self.netns})"


def _setns(libc, fd: int, what: str) -> None:
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns {what}: {os.strerror(err)}")


@contextlib.contextmanager
def inside(host: Host):
    """The calling thread in the host's network: sockets it opens meanwhile are the host's
    (setns(2) on this thread; threads it starts meanwhile inherit it).  Back to the network it
    was in at the end.  For a process that is itself a client host (mqchaos)."""
    libc = ctypes.CDLL(None, use_errno=True)
    back = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        there = os.open(os.path.join(NETNS_DIR, host.netns), os.O_RDONLY)
        try:
            _setns(libc, there, f"into {host.netns}")
        finally:
            os.close(there)
        try:
            yield host
        finally:
            _setns(libc, back, "back")
    finally:
        os.close(back)


class Hosts:
    """The hosts named (see the module docstring); made when constructed, removed by close()."""

    def __init__(self, names: list[str]):
        assert names and len(names) <= HOSTS_MAX and len(set(names)) == len(names), names
        assert all(re.fullmatch(r"[a-z0-9_]+", n) for n in names), names
        sweep_leftovers()
        self.id = f"{PREFIX}{os.getpid()}x{secrets.token_hex(3)}"
        self.bridge = f"{self.id}-br"
        self.hosts: dict[str, Host] = {}
        self._made: list[str] = []
        try:
            self._add_ns(self.bridge)
            _ip("-n", self.bridge, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.bridge, "link", "set", "br0", "up")
            for i, name in enumerate(names):
                host = Host(name, f"{self.id}-{name}", f"{SUBNET}.{i + 1}")
                self._add_ns(host.netns)
                _ip("link", "add", "eth0", "netns", host.netns, "type", "veth", "peer", "name", f"v{i}",
                    "netns", self.bridge)
                _ip("-n", self.bridge, "link", "set", f"v{i}", "master", "br0")
                _ip("-n", self.bridge, "link", "set", f"v{i}", "up")
                _ip("-n", host.netns, "link", "set", "lo", "up")
                _ip("-n", host.netns, "addr", "add", f"{host.ip}/24", "dev", "eth0")
                _ip("-n", host.netns, "link", "set", "eth0", "up")
                self.hosts[name] = host
        except BaseException:
            self.close()
            raise

    def _add_ns(self, netns: str) -> None:
        _ip("netns", "add", netns)
        self._made.append(netns)

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    def __enter__(self) -> "Hosts":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- running things in a host ----------------------------------------------------------------
    def run(self, name: str, args: list[str], timeout_s: float = 60.0, **kw) -> subprocess.CompletedProcess:
        """args run in host `name` to completion (output captured as text)."""
        return subprocess.run(self.hosts[name].prefix + list(args), capture_output=True, text=True,
                              timeout=timeout_s, **kw)

    def popen(self, name: str, args: list[str], **kw) -> subprocess.Popen:
        return subprocess.Popen(self.hosts[name].prefix + list(args), **kw)

    def pids(self, name: str) -> list[int]:
        return _pids(self.hosts[name].netns)

    # ---- faults --------------------------------------------------------------------------------
    def cut(self, name: str) -> None:
        """The host's link down: it reaches no other host and none reaches it."""
        _ip("-n", self.hosts[name].netns, "link", "set", "eth0", "down")

    def drop(self, src: str, dst: str) -> None:
        """One way: what `src` sends to `dst` is lost (a blackhole route in src); dst's packets
        still reach src.  Both calls for a two-way cut between two hosts."""
        _ip("-n", self.hosts[src].netns, "route", "replace", "blackhole", f"{self.hosts[dst].ip}/32")

    def split(self, *sides: list[str]) -> None:
        """Hosts of different sides reach each other no more (both ways); a host in no side is
        untouched (a bridge between halves: it still reaches both)."""
        for i, a_side in enumerate(sides):
            for b_side in sides[i + 1:]:
                for a in a_side:
                    for b in b_side:
                        self.drop(a, b)
                        self.drop(b, a)

    def heal(self) -> None:
        """Every link up, every blackhole route gone."""
        for host in self.hosts.values():
            _ip("-n", host.netns, "link", "set", "eth0", "up", check=False)
            routes = _ip("-n", host.netns, "route", "show", "type", "blackhole", check=False).stdout
            for line in routes.splitlines():
                parts = line.split()
                if len(parts) >= 2 and parts[0] == "blackhole":
                    _ip("-n", host.netns, "route", "del", "blackhole", parts[1], check=False)

    def kill_host(self, name: str) -> None:
        """SIGKILL to every process in the host (a machine that died); its network stays."""
        _kill_all(self.hosts[name].netns)

    # ---- the end ---------------------------------------------------------------------------------
    def close(self) -> None:
        """Every process in the namespaces killed, every namespace deleted (idempotent)."""
        for netns in reversed(self._made):
            _kill_all(netns)
            _ip("netns", "del", netns, check=False)
        self._made.clear()


__all__ = ["Host", "Hosts", "HOSTS_MAX", "SUBNET", "inside", "sweep_leftovers", "unavailable"]
