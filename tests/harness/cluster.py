"""Real name servers and brokers as subprocesses on 127.0.0.1, on free ports,
with temporary store directories; stopped (SIGTERM, then SIGKILL) afterwards.
Waits are conditions polled with a deadline, never bare sleeps."""
from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time

BIN = os.path.dirname(sys.executable)


def wait_for(cond, timeout_s: float = 30.0, interval_s: float = 0.05, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(interval_s)


def _free(port: int) -> bool:
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


def free_port(span: tuple[int, ...] = (0,)) -> int:
    """A port p such that p+d is free for every d in span (a broker needs -2, 0, +1).
    Chosen below the kernel's ephemeral range: a port from that range can be taken
    by any outgoing connection between this check and the server's bind."""
    hi = _ephemeral_low() - 4
    for _ in range(500):
        p = random.randrange(20000, hi)
        if all(_free(p + d) for d in span):
            return p
    raise RuntimeError("no free port range found")


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


class Proc:
    def __init__(self, args: list[str], log_path: str, env: dict | None = None):
        self.args = args
        self.log_path = log_path
        self.log = open(log_path, "ab")
        self.p = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT,
                                  env={**os.environ, **(env or {})}, start_new_session=True)

    def stop(self, timeout_s: float = 20.0) -> int:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        self.log.close()
        return self.p.returncode

    def kill(self) -> None:
        if self.p.poll() is None:
            try:
                os.killpg(self.p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.p.wait(10)

    def output(self) -> str:
        if not self.log.closed:
            self.log.flush()
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")


class NameServer:
    def __init__(self, workdir: str):
        self.port = free_port()
        self.dir = os.path.join(workdir, f"namesrv-{self.port}")
        os.makedirs(self.dir, exist_ok=True)
        conf = os.path.join(self.dir, "namesrv.conf")
        with open(conf, "w") as f:
            f.write(f"listenPort={self.port}\nlistenAddress=127.0.0.1\n"
                    f"kvConfigPath={self.dir}/kvConfig.json\n")
        self.proc = Proc([os.path.join(BIN, "mqnamesrv"), "-c", conf], os.path.join(self.dir, "namesrv.log"))
        wait_for(lambda: port_open(self.port) or self.proc.p.poll() is not None, 30, what="name server port")
        if self.proc.p.poll() is not None:
            raise RuntimeError("name server exited:\n" + self.proc.output())

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> int:
        return self.proc.stop()


class Broker:
    def __init__(self, workdir: str, namesrv: str, name: str = "broker-a", **options):
        self.port = options.pop("listenPort", None) or free_port((-2, 0, 1))
        self.name = name
        self.dir = options.pop("storePathRootDir", None) or os.path.join(workdir, f"{name}-{self.port}")
        os.makedirs(self.dir, exist_ok=True)
        self.options = {
            "brokerClusterName": "TestCluster", "brokerName": name, "listenPort": self.port,
            "listenAddress": "127.0.0.1", "brokerIP1": "127.0.0.1", "namesrvAddr": namesrv,
            "storePathRootDir": self.dir, "mappedFileSizeCommitLog": 16 * 1024 * 1024,
            "messageDelayLevel": " ".join(["1s"] * 18), **options}
        self.conf = os.path.join(self.dir, "broker.conf")
        self.proc: Proc | None = None
        self.start()

    def start(self) -> None:
        with open(self.conf, "w") as f:
            f.writelines(f"{k}={v}\n" for k, v in self.options.items())
        self.proc = Proc([os.path.join(BIN, "mqbroker"), "-c", self.conf], os.path.join(self.dir, "broker.log"))
        self._starts = getattr(self, "_starts", 0) + 1
        # ready = the supervisor's line saying every io worker is serving
        wait_for(lambda: self.proc.output().count(" io workers; name servers") >= self._starts
                 or self.proc.p.poll() is not None, 60, what="broker serving")
        if self.proc.p.poll() is not None:
            raise RuntimeError("broker exited:\n" + self.proc.output())

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> int:
        return self.proc.stop()

    def kill(self) -> None:
        self.proc.kill()

    def restart(self) -> None:
        assert self.stop() == 0, self.proc.output()[-3000:]
        self.start()
