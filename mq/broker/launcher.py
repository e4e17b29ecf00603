"""The launcher: the one process that forks the broker's role processes.

Why a process of its own.  Every process of a broker logs through one
stream: multiprocessing-logging wraps the supervisor's handlers in a queue
that *forked* children inherit, and a thread in the supervisor emits what
they send (each record keeps its processName and pid, so every line says
which role and which pid wrote it).  Fork is only safe from a process with a
single thread: a lock another thread holds at the moment of the fork stays
held forever in the child.  The supervisor has threads almost at once (the
logging receiver itself, asyncio's resolver pool, the store's waiters), so
`mqbroker` forks this launcher right after installing the log handler,
before anything else runs, and creates every role process -- restarts
included -- from it.

The launcher stays single-threaded for its whole life: it never logs (a
record would start the queue's feeder thread here; its news goes to the
supervisor over the command pipe instead), never starts a thread, and only
forks, signals and reaps.  When the supervisor dies, the command pipe reads
EOF and the launcher exits; its children follow (io workers through
PR_SET_PDEATHSIG, the other roles through EOF on their stop pipes).

Protocol on one duplex pipe, pickled tuples:
    supervisor -> launcher: ("start", seq, name, target, args)   target(*args) in a new child
                            ("signal", seq, signum)               to the child of start `seq`
                            ("stop", seq)                          one byte on its stop pipe
                            ("exit",)
    launcher -> supervisor: ("started", seq, pid) | ("failed", seq, text) | ("exited", seq, exitcode)
In `args`, the value STOP_PIPE is replaced by the child's end of a fresh stop
pipe (mq.store.roles.PipeStop) whose writer the launcher keeps."""
from __future__ import annotations

import asyncio
import ctypes
import logging
import multiprocessing as mp
from multiprocessing import resource_tracker
import os
import signal
import time
import traceback

from mq import loop as mq_loop
from mq.store import bells as store_bells

log = logging.getLogger("mq.broker.launcher")

STOP_PIPE = "<launcher: stop pipe>"
POLL_S = 0.1                  # how often the launcher reaps children between commands
PR_SET_NAME = 15
PR_SET_PDEATHSIG = 1
_libc = None
_launcher_pid: int | None = None   # in a role: the pid of the launcher that forked it


def _prctl(option: int, value) -> None:
    global _libc
    try:
        if _libc is None:
            _libc = ctypes.CDLL("libc.so.6", use_errno=True)
        _libc.prctl(option, value, 0, 0, 0)
    except OSError:
        pass


def set_process_name(name: str) -> None:
    """The role's name where operators look: /proc/<pid>/comm (ps, top; 15 bytes) and
    multiprocessing's current_process().name, which every log record carries."""
    mp.current_process().name = name
    _prctl(PR_SET_NAME, name.encode()[:15])


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """PR_SET_PDEATHSIG: `sig` when the parent (the launcher, for a role) exits.

    The kernel only signals deaths that happen after the prctl.  A role runs this some
    milliseconds after its fork (more on a loaded machine), and a launcher that died in
    between (the supervisor was killed at once) would leave the role running for ever.
    So, once armed, check that the launcher that forked us is still our parent; if it is
    not, it is gone (we were reparented), and we take `sig` now."""
    _prctl(PR_SET_PDEATHSIG, int(sig))
    if _launcher_pid is not None and os.getppid() != _launcher_pid:
        os.kill(os.getpid(), int(sig))


# ---- the launcher process ------------------------------------------------------------------------
def _child_main(name: str, target, args: tuple, close_fds: list[int], launcher_pid: int) -> None:
    """First code of every role process: drop the launcher's descriptors (so the
    supervisor and the other roles see EOF when they should), default signal
    dispositions, then the role.  `launcher_pid` is read before the fork (getppid() here
    could already name the reaper that adopted us)."""
    global _launcher_pid
    _launcher_pid = launcher_pid
    for fd in close_fds:
        try:
            os.close(fd)
        except OSError:
            pass
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    set_process_name(name)
    target(*args)


class _Launcher:
    def __init__(self, conn):
        self.conn = conn
        self.ctx = mp.get_context("fork")
        self.children: dict[int, tuple] = {}      # seq -> (process, stop writer or None)

    def run(self) -> None:
        while True:
            try:
                ready = self.conn.poll(POLL_S)
                msg = self.conn.recv() if ready else None
            except (EOFError, OSError):
                return                            # the supervisor is gone
            if msg is not None:
                if msg[0] == "exit":
                    return
                self._handle(msg)
            self._reap()

    def _send(self, *msg) -> None:
        try:
            self.conn.send(msg)
        except (OSError, ValueError):
            pass

    def _handle(self, msg) -> None:
        kind, seq = msg[0], msg[1]
        if kind == "start":
            _, _, name, target, args = msg
            try:
                self._start(seq, name, target, args)
            except Exception:
                self._send("failed", seq, traceback.format_exc())
        elif kind == "signal":
            entry = self.children.get(seq)
            if entry is not None and entry[0].exitcode is None:
                try:
                    os.kill(entry[0].pid, msg[2])
                except ProcessLookupError:
                    pass
        elif kind == "stop":
            entry = self.children.get(seq)
            if entry is not None and entry[1] is not None:
                entry[1].set()

    def _start(self, seq: int, name: str, target, args: tuple) -> None:
        from mq.store.roles import PipeStop
        writer = None
        if STOP_PIPE in args:
            r, w = self.ctx.Pipe(duplex=False)
            writer = PipeStop(r, w)
            args = tuple(writer.child_side() if a == STOP_PIPE else a for a in args)
        # the child closes every stop writer (its own included: it must see EOF when we die)
        # and our end of the command pipe
        close = [self.conn.fileno()] + [e[1].writer_fileno() for e in self.children.values() if e[1] is not None]
        if writer is not None:
            close.append(writer.writer_fileno())
        p = self.ctx.Process(target=_child_main, name=name, args=(name, target, args, close, os.getpid()))
        p.start()
        if writer is not None:
            writer.close_reader()
        self.children[seq] = (p, writer)
        self._send("started", seq, p.pid)

    def _reap(self) -> None:
        for seq, (p, writer) in list(self.children.items()):
            code = p.exitcode                   # waitpid(WNOHANG) underneath
            if code is not None:
                del self.children[seq]
                if writer is not None:
                    writer.close_writer()
                self._send("exited", seq, code)


def _launcher_main(conn, supervisor_conn) -> None:
    supervisor_conn.close()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)         # stopped by the supervisor, never by a group signal
    set_process_name("launcher")
    try:
        _Launcher(conn).run()
    finally:
        os._exit(0)


# ---- the supervisor's side -----------------------------------------------------------------------
class RoleProcess:
    """The supervisor's handle on one role process (one start of it)."""

    def __init__(self, launcher: "Launcher", seq: int, name: str):
        self.launcher = launcher
        self.seq = seq
        self.name = name
        self.pid: int | None = None
        self.exitcode: int | None = None
        self.error: str | None = None
        self._exited = asyncio.Event()

    def is_alive(self) -> bool:
        return self.exitcode is None and self.error is None

    def terminate(self) -> None:
        self.launcher._send("signal", self.seq, signal.SIGTERM)

    def kill(self) -> None:
        self.launcher._send("signal", self.seq, signal.SIGKILL)

    def stop(self) -> None:
        """Sets the role's stop pipe (roles started with STOP_PIPE)."""
        self.launcher._send("stop", self.seq)

    async def wait(self, timeout_s: float) -> bool:
        """True once the process exited (or never started)."""
        if not self.is_alive():
            return True
        try:
            await mq_loop.wait_for(self._exited.wait(), timeout_s)
            return True
        except asyncio.TimeoutError:
            return False

    def _ended(self) -> None:
        self._exited.set()


class Launcher:
    """Forks the launcher process (call before the process has any thread other than
    multiprocessing-logging's receiver, and before it opens anything a child must
    not inherit) and talks to it.  `attach(loop)` starts reading its news."""

    def __init__(self, n_bells: int = 0):
        """n_bells: eventfds made here, before the fork, so that this process, the launcher and
        every role share them under the same numbers (mq.store.bells)."""
        # every role attaches the control block through SharedMemory, which needs a
        # resource tracker: started here, before the fork, all roles share this one
        # instead of each starting its own (mq.store.control says why it tracks nothing)
        resource_tracker.ensure_running()
        self.bell_fds = store_bells.make(n_bells)
        ours, theirs = mp.Pipe(duplex=True)
        pid = os.fork()
        if pid == 0:                                # the launcher
            _launcher_main(theirs, ours)
        theirs.close()
        self.pid = pid
        self.conn = ours
        self._seq = 0
        self.procs: dict[int, RoleProcess] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        loop.add_reader(self.conn.fileno(), self._on_readable)

    def start(self, name: str, target, args: tuple) -> RoleProcess:
        """target(*args) in a new process named `name`; returns its handle at once
        (pid is filled in when the launcher reports the fork)."""
        self._seq += 1
        proc = RoleProcess(self, self._seq, name)
        self.procs[self._seq] = proc
        self._send("start", self._seq, name, target, args)
        return proc

    def _send(self, *msg) -> None:
        try:
            self.conn.send(msg)
        except (OSError, ValueError) as e:
            log.error("launcher: cannot send %s: %s", msg[0], e)

    def _on_readable(self) -> None:
        try:
            while self.conn.poll():
                self._on_news(self.conn.recv())
        except (EOFError, OSError):
            self._loop.remove_reader(self.conn.fileno())
            log.error("the launcher (pid %d) is gone: no role process can be started any more", self.pid)
            for proc in list(self.procs.values()):
                proc.error = proc.error or "launcher gone"
                proc._ended()

    def _on_news(self, msg) -> None:
        kind, seq = msg[0], msg[1]
        proc = self.procs.get(seq)
        if proc is None:
            return
        if kind == "started":
            proc.pid = msg[2]
        elif kind == "failed":
            proc.error = msg[2]
            log.error("starting %s failed in the launcher:\n%s", proc.name, msg[2])
            del self.procs[seq]
            proc._ended()
        elif kind == "exited":
            proc.exitcode = msg[2]
            del self.procs[seq]
            proc._ended()

    def close(self, timeout_s: float = 5.0) -> None:
        """Tells the launcher to exit and reaps it."""
        if self._loop is not None:
            try:
                self._loop.remove_reader(self.conn.fileno())
            except (ValueError, OSError):
                pass
        self._send("exit")
        self.conn.close()
        # not rung from here on: a closed number may be reused by a file or a socket
        store_bells.adopt([])
        for fd in self.bell_fds:
            os.close(fd)
        self.bell_fds = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if os.waitpid(self.pid, os.WNOHANG)[0]:
                return
            time.sleep(0.05)
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
