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
      attach(loop, on_ring)   the loop watches it; on_ring() runs in the loop after every ring
      claim(seq)          a user of the bell says it wants `seq` (one user per seq: want(seq,
                          False) of one user must not turn off another's)
      want(seq, on)       mq_ctl_wake(seq) rings it (until turned off)
      close()

Indexes: DLEDGER_BELL for the DLedger role, io_bell(worker_id) for io worker N.  A role
restarted by the supervisor gets the same bell back (it is the launcher's descriptor); what
its predecessor wanted is cleared when it attaches, and a ring it left unread only makes its
first look early."""
from __future__ import annotations

import os

from .control import ControlBlock
from .native import ffi, lib

BELLS_MAX = lib.MQ_BELLS_MAX
SEQ_COUNT = lib.MQ_SEQ_COUNT_
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
    def __init__(self, ctl: ControlBlock, index: int):
        assert 0 <= index < BELLS_MAX, index
        self.ctl = ctl
        self.index = index
        self.fd = lib.mq_bell_fd(index)
        self.loop = None
        self._on_ring = None
        self._wanted: set[int] = set()
        self._claimed: set[int] = set()

    @property
    def usable(self) -> bool:
        return self.fd >= 0

    def attach(self, loop, on_ring) -> None:
        assert self.usable and self.loop is None
        for seq in range(SEQ_COUNT):          # what a predecessor of this role left wanted
            lib.mq_bell_want(self.ctl.ptr, self.index, seq, 0)
        self.loop = loop
        self._on_ring = on_ring
        loop.add_reader(self.fd, self._rung)

    def claim(self, seq: int) -> None:
        assert seq not in self._claimed, f"bell {self.index}: seq {seq} claimed twice"
        self._claimed.add(seq)

    def want(self, seq: int, on: bool = True) -> None:
        if on != (seq in self._wanted):
            lib.mq_bell_want(self.ctl.ptr, self.index, seq, 1 if on else 0)
            if on:
                self._wanted.add(seq)
            else:
                self._wanted.discard(seq)

    def _rung(self) -> None:
        try:
            os.eventfd_read(self.fd)         # every ring so far, at once
        except BlockingIOError:
            pass                             # read by an earlier pass (a spurious readiness)
        self._on_ring()

    def close(self) -> None:
        for seq in list(self._wanted):
            self.want(seq, False)
        if self.loop is not None:
            self.loop.remove_reader(self.fd)
            self.loop = None
