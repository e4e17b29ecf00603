"""What the HA master and slave share: file names, named limits, socket set-up.

Sockets stay in blocking mode (the C transport, sendfile and recv straight into
the mapped CommitLog, needs that: Python's settimeout would make the fd
non-blocking).  Stalls are bounded instead by SO_SNDTIMEO / SO_RCVTIMEO, so a
peer that stops reading or writing makes the blocked call fail with EAGAIN
after the housekeeping interval, and by poll(2) with a timeout before every
Python-level read.  A socket is only ever closed by the thread that owns it,
after every other thread using its fd has let go: closing an fd another
thread is inside sendfile() with could hand the number to a new connection."""
from __future__ import annotations

import select
import socket
import struct
import time

from mq.store import control as C

# files in the store root (mq.broker.hastatus reads the first; the supervisor writes the second)
STATUS_FILE = "ha-status.json"
MASTER_ADDR_FILE = "ha-master.txt"

# named limits
CONNECTIONS_MAX = 16                   # HA connections a master serves at once; more are refused
FRAME_BODY_SIZE_MAX = 4 * 1024 * 1024  # the 4.x slave's read buffer: no master frame body is larger
REPORT_READ_SIZE_MAX = 4096            # bytes of reports the master reads per recv
RUN_BYTES_MAX = 4 * 1024 * 1024        # bytes one C streaming call moves before Python looks at its flags
REPORT_EVERY_BYTES = 1024 * 1024       # a catching-up slave reports at least this often (and whenever idle)
# SO_RCVBUF of a slave's connection (the kernel caps the request at net.core.rmem_max and
# doubles it: 8 MiB here).  Autotuning alone left the master blocked while the slave wrote and
# checked a run: catch-up of 1 GiB went from 1.16-1.22 to 1.30-1.40 GB/s with it.  Setting
# the master's SO_SNDBUF as well changed nothing measurable.
SLAVE_RCVBUF_BYTES = 8 * 1024 * 1024
WRITE_WAIT_MS = 100                    # the master's writer sleeps at most this long waiting for data
STOP_CHECK_MS = 200                    # every blocking wait in these threads looks at its stop flag this often
STATUS_INTERVAL_S = 1.0                # ha-status.json is rewritten at least this often
JOIN_TIMEOUT_S = 10.0


def configure_socket(sock: socket.socket, io_timeout_ms: int) -> None:
    """Blocking mode, TCP_NODELAY, and send/receive calls that give up (EAGAIN)
    after io_timeout_ms without progress."""
    sock.setblocking(True)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    tv = struct.pack("ll", io_timeout_ms // 1000, (io_timeout_ms % 1000) * 1000)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)


def readable(sock: socket.socket, timeout_ms: int) -> bool:
    """True when a recv on sock would not block (data, EOF or an error)."""
    p = select.poll()
    p.register(sock.fileno(), select.POLLIN | select.POLLERR | select.POLLHUP)
    return bool(p.poll(max(0, int(timeout_ms))))


def parse_addr(addr: str) -> tuple[str, int]:
    """"host:port" or "[v6]:port" -> (host, port).  Raises ValueError."""
    addr = addr.strip()
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"bad HA address {addr!r}: expected host:port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def shutdown_quietly(sock: socket.socket) -> None:
    """Wakes every thread blocked on sock (they see EOF or an error); the fd stays open."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


TAKE_BACK_FOREVER_MS = 1 << 62         # the write gate while taken-back records are being dispatched


def monotonic_ms() -> int:
    """The clock of POS_HA_TAKE_BACK_UNTIL and of the C loops' timestamps (CLOCK_MONOTONIC: one
    clock for all processes, and C's mono_ms)."""
    return int(time.monotonic() * 1000)


def taking_back(ctl) -> bool:
    """Do a master's writes still wait for a slave's give-back (mq.ha.master, take-back)?"""
    until = ctl.get(C.POS_HA_TAKE_BACK_UNTIL)
    return until != 0 and until > monotonic_ms()
