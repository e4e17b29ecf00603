"""sd_notify(3) without libsystemd: one datagram of newline-separated
assignments (READY=1, STOPPING=1, STATUS=..., WATCHDOG=1) to the unix socket
named by $NOTIFY_SOCKET.  A leading '@' names an abstract socket (the '@'
becomes a NUL byte).  Without $NOTIFY_SOCKET every call is a no-op returning
False; a failed send is logged and returns False, never raises: a daemon
must not die because its supervisor went away."""
from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger("mq.cli.sdnotify")


def notify(state: str, env=None) -> bool:
    """Sends `state` (e.g. "READY=1\\nSTATUS=serving"); True if it was sent."""
    addr = (os.environ if env is None else env).get("NOTIFY_SOCKET")
    if not addr:
        return False
    if addr[0] == "@":
        addr = "\0" + addr[1:]
    elif addr[0] != "/":
        log.warning("NOTIFY_SOCKET=%r: only unix socket paths and @abstract names are supported", addr)
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.connect(addr)
            s.sendall(state.encode("utf-8"))
        return True
    except OSError as e:
        log.warning("sd_notify %r to %r failed: %s", state.split("\n")[0], addr, e)
        return False


def watchdog_interval_s(env=None) -> float | None:
    """Half of $WATCHDOG_USEC (how often to send WATCHDOG=1), or None when no watchdog is asked
    for this process ($WATCHDOG_PID, when set, must be our pid)."""
    env = os.environ if env is None else env
    pid = env.get("WATCHDOG_PID")
    if pid and pid != str(os.getpid()):
        return None
    try:
        usec = int(env.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    return usec / 2e6 if usec > 0 else None
