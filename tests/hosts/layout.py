"""Driving `python -m mq.cli.local hosts` as a user does (its output read line by line, Ctrl-C to
stop), and running commands in its client host: for tests/hosts and perf/test_capacity_bench.py."""
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time

from mq.cli.local import HOSTS_CLIENT, HOSTS_CLUSTER
from mq.cluster import BIN


class Layout:
    """The launcher as a user runs it: its output read line by line, typed input, Ctrl-C."""

    def __init__(self, run_dir: str):
        self.p = subprocess.Popen([sys.executable, "-m", "mq.cli.local", "hosts"], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  env={**os.environ, "MQ_RUN_DIR": run_dir})
        self.lines: queue.Queue = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        self.base = os.path.join(run_dir, "hosts")

    def _read(self) -> None:
        for line in self.p.stdout:
            self.lines.put(line.rstrip("\n"))

    def wait_line(self, text: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.5)
            except queue.Empty:
                assert self.p.poll() is None, "\n".join(self.seen[-40:])
                continue
            self.seen.append(line)
            if text in line:
                return
        raise AssertionError(f"no {text!r} in {timeout_s} s:\n" + "\n".join(self.seen[-40:]))

    def hosts(self) -> dict:
        """hosts.json: host name -> {"netns", "ip"} (written once the hosts are made)."""
        with open(os.path.join(self.base, "hosts.json")) as f:
            return json.load(f)

    def namesrv(self) -> str:
        """The name servers' address list, as clients in the client host use it."""
        hosts = self.hosts()
        return ";".join(f"{hosts[n]['ip']}:9876" for n in ("ns1", "ns2"))

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGINT)
            try:
                self.p.wait(15)
            except subprocess.TimeoutExpired:
                self.p.send_signal(signal.SIGINT)             # a second Ctrl-C kills what is left
                self.p.wait(30)


def in_client(hosts: dict, args: list[str], timeout_s: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", "netns", "exec", hosts[HOSTS_CLIENT]["netns"], *args], capture_output=True,
                          text=True, timeout=timeout_s)


def masters(hosts: dict, ns: str) -> dict[str, str]:
    """broker name -> its master's address, from clusterList in the client host."""
    out = in_client(hosts, [f"{BIN}/mqadmin", "clusterList", "-n", ns]).stdout
    found = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[0] == HOSTS_CLUSTER and parts[2] == "0":
            found[parts[1]] = parts[3]
    return found
