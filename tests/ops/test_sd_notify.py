"""sd_notify as systemd sees it (Type=notify, NotifyAccess=main, WatchdogSec=): mqbroker and
mqnamesrv as real subprocesses with $NOTIFY_SOCKET naming a unix datagram socket this test
binds, the way systemd's manager does.

What it proves, for both programs:
  * READY=1 arrives once, and by then the port(s) accept connections;
  * with WATCHDOG_USEC=1000000, WATCHDOG=1 arrives about every 0.5 s; without it, never;
  * SIGTERM to the main process gives STOPPING=1, then exit 0 within 20 s;
  * every datagram comes from the main pid (SCM_CREDENTIALS), as NotifyAccess=main demands."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import struct
import tempfile
import time

import pytest

from mq.cluster import BIN, Proc, free_port, port_open

STOP_TIMEOUT_S = 20
WATCHDOG_USEC = 1_000_000


class NotifySocket:
    """A bound AF_UNIX datagram socket collecting (seconds since bind, sender pid, message)."""

    def __init__(self):
        # a short path: sun_path holds 108 bytes, pytest's tmp_path can be longer
        self.dir = tempfile.mkdtemp(prefix="sdn-", dir="/tmp")
        self.path = os.path.join(self.dir, "notify")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.t0 = time.monotonic()
        self.messages: list[tuple[float, int, str]] = []

    def _receive(self, timeout_s: float) -> bool:
        self.sock.settimeout(max(timeout_s, 0.001))
        try:
            data, ancillary, _, _ = self.sock.recvmsg(4096, socket.CMSG_SPACE(struct.calcsize("iII")))
        except socket.timeout:
            return False
        pid = -1
        for level, kind, cdata in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                pid = struct.unpack_from("iII", cdata)[0]
        self.messages.append((time.monotonic() - self.t0, pid, data.decode()))
        return True

    def wait_for(self, assignment: str, timeout_s: float, proc: Proc | None = None) -> float:
        """Receives until a datagram holds the line `assignment`; returns its time."""
        deadline = time.monotonic() + timeout_s
        while True:
            for t, _, message in self.messages:
                if assignment in message.split("\n"):
                    return t
            left = deadline - time.monotonic()
            if left <= 0:
                tail = proc.output()[-3000:] if proc else ""
                pytest.fail(f"no {assignment} within {timeout_s}s; got {self.messages}\n{tail}")
            if not self._receive(min(left, 0.2)) and proc is not None and proc.p.poll() is not None:
                pytest.fail(f"exited {proc.p.returncode} before {assignment}:\n{proc.output()[-3000:]}")

    def drain(self, duration_s: float) -> None:
        deadline = time.monotonic() + duration_s
        while (left := deadline - time.monotonic()) > 0:
            self._receive(left)

    def count(self, assignment: str) -> int:
        return sum(assignment in m[2].split("\n") for m in self.messages)

    def close(self) -> None:
        self.sock.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def notify_socket():
    ns = NotifySocket()
    yield ns
    ns.close()


def _env(notify: NotifySocket, watchdog: bool) -> dict:
    """$NOTIFY_SOCKET, and $WATCHDOG_USEC when asked (empty means none; the harness merges
    the environment, so an inherited value is overridden rather than removed)."""
    return {"NOTIFY_SOCKET": notify.path, "WATCHDOG_USEC": str(WATCHDOG_USEC) if watchdog else "",
            "WATCHDOG_PID": ""}


def _start_broker(tmp_path, notify: NotifySocket, watchdog: bool) -> tuple[Proc, int]:
    port = free_port((-2, 0, 1))
    store = tmp_path / "store"
    conf = tmp_path / "broker.conf"
    conf.write_text(f"brokerName=sdnotify\nlistenPort={port}\nlistenAddress=127.0.0.1\nbrokerIP1=127.0.0.1\n"
                    f"storePathRootDir={store}\nmappedFileSizeCommitLog={4 * 1024 * 1024}\nnamesrvAddr=\n")
    return Proc([os.path.join(BIN, "mqbroker"), "-c", str(conf)], str(tmp_path / "broker.log"),
                env=_env(notify, watchdog)), port


def _start_namesrv(tmp_path, notify: NotifySocket, watchdog: bool) -> tuple[Proc, int]:
    port = free_port()
    conf = tmp_path / "namesrv.properties"
    conf.write_text(f"listenPort={port}\nlistenAddress=127.0.0.1\nkvConfigPath={tmp_path}/kvConfig.json\n")
    return Proc([os.path.join(BIN, "mqnamesrv"), "-c", str(conf)], str(tmp_path / "namesrv.log"),
                env=_env(notify, watchdog)), port


def _ports(program: str, port: int) -> list[int]:
    return [port, port - 2] if program == "mqbroker" else [port]


@pytest.mark.parametrize("program", ["mqbroker", "mqnamesrv"])
def test_ready_watchdog_stopping(tmp_path, notify_socket, program):
    start = _start_broker if program == "mqbroker" else _start_namesrv
    proc, port = start(tmp_path, notify_socket, watchdog=True)
    try:
        ready_at = notify_socket.wait_for("READY=1", 60, proc)
        for p in _ports(program, port):
            assert port_open(p), f"READY=1 came before port {p} accepted connections"

        notify_socket.drain(1.6)
        pings = [t for t, _, m in notify_socket.messages if "WATCHDOG=1" in m.split("\n") and t >= ready_at]
        assert len(pings) >= 3, notify_socket.messages
        gaps = [b - a for a, b in zip(pings, pings[1:])]
        assert max(gaps) < WATCHDOG_USEC / 1e6, f"watchdog pings too far apart: {gaps}"

        proc.p.send_signal(signal.SIGTERM)
        t_term = time.monotonic()
        notify_socket.wait_for("STOPPING=1", STOP_TIMEOUT_S, proc)
        rc = proc.p.wait(max(0.1, STOP_TIMEOUT_S - (time.monotonic() - t_term)))
        assert rc == 0, proc.output()[-3000:]
        assert time.monotonic() - t_term < STOP_TIMEOUT_S
    finally:
        proc.kill()
        proc.stop()
    assert notify_socket.count("READY=1") == 1 and notify_socket.count("STOPPING=1") == 1
    senders = {pid for _, pid, _ in notify_socket.messages}
    assert senders == {proc.p.pid}, f"notifications from {senders}, main pid {proc.p.pid}"


@pytest.mark.parametrize("program", ["mqbroker", "mqnamesrv"])
def test_no_watchdog_pings_unless_asked(tmp_path, notify_socket, program):
    start = _start_broker if program == "mqbroker" else _start_namesrv
    proc, _ = start(tmp_path, notify_socket, watchdog=False)
    try:
        notify_socket.wait_for("READY=1", 60, proc)
        notify_socket.drain(0.7)
        proc.p.send_signal(signal.SIGTERM)
        notify_socket.wait_for("STOPPING=1", STOP_TIMEOUT_S, proc)
        assert proc.p.wait(STOP_TIMEOUT_S) == 0, proc.output()[-3000:]
    finally:
        proc.kill()
        proc.stop()
    assert notify_socket.count("WATCHDOG=1") == 0, notify_socket.messages
