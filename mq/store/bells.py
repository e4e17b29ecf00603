"""Bells: a position moving in one process of a broker wakes another process's event loop
directly (csrc/ctl.h, "Bells").

Without them a loop that waits for a control-block position has a thread sleep on the futex and
hand over with call_soon_threadsafe: per wake two context switches, the loop's self-pipe, and
the GIL taken back from the loop's own thread, which on a busy machine waits until the loop
runs out of work.  A bell is an eventfd in the loop's selector: the waker's mq_ctl_wake writes
to it, the loop reads it and looks at the positions in the same pass.

    make(n)               the supervisor, before it forks the launcher: n eventfds adopted by
                          this process (and so by every process forked from it afterwards)
    Bell(ctl, index)      a role's own bell; usable is False where none was adopted (a store
                          opened by a tool or a test: the caller keeps its waiter thread)
      add(seq, on_ring)   a user: it wants `seq` through want(), and on_ring() runs in the loop
                          after every ring (one user per seq: one's want(seq, False) must not
                          turn off another's); an exception in one user is logged, the others run
      attach(loop)        the loop watches it (and drops what a predecessor left wanted)
      want(seq, on)       mq_ctl_wake(seq) rings it (until turned off)
      close()

A ring does not say which sequence moved: every user looks.  While anything is wanted the
loop also looks every RECHECK_S on its own, as the threads' futex timeouts did: a position
moved without a wake (dispatch's re-base after an install) or a ring lost to a bug costs that
long, not a wait's whole timeout.

Indexes: DLEDGER_BELL for the DLedger role, io_bell(worker_id) for io worker N.  A role
restarted by the supervisor gets the same bell back (it is the launcher's descriptor); what
its predecessor wanted is cleared when it attaches, and a ring it left unread only makes its
first look early."""
from __future__ import annotations

import logging
import os

from .control import ControlBlock
from .native import ffi, lib

log = logging.getLogger("mq.store.bells")

BELLS_MAX = lib.MQ_BELLS_MAX
SEQ_COUNT = lib.MQ_SEQ_COUNT_
RECHECK_S = 0.5                   # a bell's loop looks on its own this often while anything is wanted
DLEDGER_BELL = 0


def io_bell(worker_id: int) -> int:
    assert 0 <= worker_id < BELLS_MAX - 1, worker_id
    return 1 + worker_id


def count_for(io_workers: int) -> int:
    """Bells a broker with `io_workers` io workers uses; 0 with MQ_BELLS=off in the environment
    (the waiter threads then, to compare or to rule bells out when chasing a bug)."""
    if os.environ.get("MQ_BELLS", "").lower() == "off":
        return 0
    return min(BELLS_MAX, 1 + io_workers)


def make(n: int) -> list[int]:
    """n eventfds (non-blocking, closed on exec), adopted by this process."""
    assert 0 <= n <= BELLS_MAX, n
    fds = [os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC) for _ in range(n)]
    adopt(fds)
    return fds


def adopt(fds: list[int]) -> None:
    arr = ffi.new("int[]", fds) if fds else ffi.NULL
    rc = lib.mq_bells_adopt(arr, len(fds))
    assert rc == 0, rc


class Bell:
    def __init__(self, ctl: ControlBlock, index: int, recheck_s: float | None = None):
        """recheck_s: the slow look while anything is wanted (None: RECHECK_S; 0: none, for
        tests that must see a lost ring as a timeout)."""
        assert 0 <= index < BELLS_MAX, index
        self.ctl = ctl
        self.index = index
        self.fd = lib.mq_bell_fd(index)
        self.recheck_s = RECHECK_S if recheck_s is None else recheck_s
        self.loop = None
        self._users: dict[int, object] = {}      # seq -> on_ring
        self._wanted: set[int] = set()
        self._timer = None

    @property
    def usable(self) -> bool:
        return self.fd >= 0

    def add(self, seq: int, on_ring) -> None:
        assert seq not in self._users, f"bell {self.index}: seq {seq} has a user already"
        self._users[seq] = on_ring

    def attach(self, loop) -> None:
        assert self.usable and self.loop is None
        for seq in range(SEQ_COUNT):          # what a predecessor of this role left wanted
            lib.mq_bell_want(self.ctl.ptr, self.index, seq, 0)
        self.loop = loop
        loop.add_reader(self.fd, self._rung)

    def want(self, seq: int, on: bool = True) -> None:
        assert seq in self._users, f"bell {self.index}: seq {seq} has no user"
        if on != (seq in self._wanted):
            lib.mq_bell_want(self.ctl.ptr, self.index, seq, 1 if on else 0)
            if on:
                self._wanted.add(seq)
                if self._timer is None and self.recheck_s > 0 and self.loop is not None:
                    self._timer = self.loop.call_later(self.recheck_s, self._recheck)
            else:
                self._wanted.discard(seq)

    def _rung(self) -> None:
        try:
            os.eventfd_read(self.fd)         # every ring so far, at once
        except BlockingIOError:
            pass                             # read by an earlier pass (a spurious readiness)
        self._look(self._users)

    def _recheck(self) -> None:
        self._timer = None
        if self._wanted:
            self._look({seq: self._users[seq] for seq in self._wanted})
        if self._wanted and self.loop is not None:
            self._timer = self.loop.call_later(self.recheck_s, self._recheck)

    def _look(self, users: dict) -> None:
        called = set()
        for on_ring in list(users.values()):
            if id(on_ring) in called:        # one callback for several seqs: once
                continue
            called.add(id(on_ring))
            try:
                on_ring()
            except Exception:                # noqa: BLE001 - one user's bug must not starve the others
                log.exception("bell %d: a user failed on a ring", self.index)

    def close(self) -> None:
        for seq in list(self._wanted):
            self.want(seq, False)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.loop is not None:
            self.loop.remove_reader(self.fd)
            self.loop = None
