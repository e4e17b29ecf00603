"""Waiting for a control-block position to reach a target, across processes,
without busy polling.

The C core bumps a futex word (SEQ_FLUSH, SEQ_DISPATCH, ...) after moving a
position.  A blocking waiter sleeps in futex_wait with the GIL released.  For
asyncio, with a bell (mq.store.bells: a role process of a broker), the loop
itself is rung and resolves its futures in the same pass; without one (a store
opened by a tool or a test), one thread per (process, position) sleeps on the
futex and resolves the loop's futures with call_soon_threadsafe.  The event
loop never blocks.  Waiters sit in a heap by target, so a wake costs
O(released), and the released futures of one loop are resolved in one hand-off.

use_bell(bell): the waits of bell.loop from then on go through the bell (the
waiter is the bell's user for its sequence); waits from any other loop keep the
thread."""
from __future__ import annotations

import asyncio
import heapq
import itertools
import threading

from .control import POS_COMMITTED, POS_DL_APPEND_TERM, SEQ_COMMIT, ControlBlock
from .native import lib

_POS_COMMITTED, _POS_APPEND_TERM, _SEQ_COMMIT = POS_COMMITTED, POS_DL_APPEND_TERM, SEQ_COMMIT


class PositionWaiter:
    def __init__(self, ctl: ControlBlock, seq: int, pos: int):
        self.ctl = ctl
        self.seq = seq
        self.pos = pos
        self._heap: list = []
        self._lock = threading.Lock()
        self._counter = itertools.count()
        self._thread: threading.Thread | None = None
        self._stop = False
        self._bell = None
        self._bell_heap: list = []                 # the bell loop's waits: (target, n, future)

    def use_bell(self, bell) -> None:
        bell.add(self.seq, self.ring)
        self._bell = bell

    # ---- blocking --------------------------------------------------------------
    def wait(self, target: int, timeout_s: float) -> bool:
        """True once position >= target; False on timeout or a fatal store."""
        # one C call: the loop, the futex sleeps and the re-checks run without the GIL
        return lib.mq_ctl_wait_pos(self.ctl.ptr, self.seq, self.pos, target, int(timeout_s * 1000)) == 0

    # ---- asyncio ---------------------------------------------------------------
    async def wait_async(self, target: int, timeout_s: float) -> bool:
        if self.ctl.get(self.pos) >= target:
            return True
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        bell = self._bell
        via_bell = bell is not None and bell.loop is loop
        if via_bell:
            heapq.heappush(self._bell_heap, (target, next(self._counter), fut))
            bell.want(self.seq)                   # then look: a move after this rings
            self.ring()
        else:
            self._push_threaded(target, fut, loop)
        # a timer that answers False, not asyncio.wait_for: that wraps every wait in a task
        # and a timeout context, and this runs once per SYNC_FLUSH / SYNC_MASTER send
        timer = loop.call_later(timeout_s, _resolve, fut, False)
        try:
            return await fut
        finally:
            timer.cancel()
            if via_bell:
                _prune(self._bell_heap, bell, self.seq)

    def ring(self) -> None:
        """(the bell's loop) Resolves the bell's waits the position or a fatal store settled;
        stops wanting the bell when none is left."""
        heap = self._bell_heap
        if not heap:
            return
        cur = self.ctl.get(self.pos)
        fatal = heap[0][0] > cur and self.ctl.failed()
        while heap and (heap[0][0] <= cur or fatal):
            target, _, fut = heapq.heappop(heap)
            _resolve(fut, target <= cur)
        _prune(heap, self._bell, self.seq)

    def _push_threaded(self, target: int, fut, loop) -> None:
        with self._lock:
            heapq.heappush(self._heap, (target, next(self._counter), fut, loop))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"waiter-{self.pos}", daemon=True)
                self._thread.start()
        if self.ctl.get(self.pos) >= target:      # reached between the check and the push
            self.ctl.wake(self.seq)

    def _run(self) -> None:
        while not self._stop:
            seen = self.ctl.seq(self.seq)
            cur = self.ctl.get(self.pos)
            fatal = self.ctl.fatal() is not None
            ready: dict = {}                       # loop -> [(future, reached)]
            with self._lock:
                while self._heap and (self._heap[0][0] <= cur or fatal):
                    target, _, fut, loop = heapq.heappop(self._heap)
                    ready.setdefault(loop, []).append((fut, target <= cur))
            # one hand-off per loop per wake (each call_soon_threadsafe writes the loop's
            # self-pipe): a flush that releases 40 senders wakes their loop once, not 40 times
            for loop, futs in ready.items():
                loop.call_soon_threadsafe(_resolve_all, futs)
            self.ctl.wait(self.seq, seen, 200)

    def close(self) -> None:
        self._stop = True
        if self._thread is not None:
            self.ctl.wake(self.seq)
            self._thread.join(timeout=2)
            self._thread = None


def _prune(heap: list, bell, seq: int) -> None:
    """Drops the bell waits at the top of `heap` that timed out (nothing awaits them; the future
    is an entry's last field); no wait left: `seq` is not wanted from the bell any more."""
    while heap and heap[0][-1].done():
        heapq.heappop(heap)
    if not heap:
        bell.want(seq, False)


def _resolve(fut: asyncio.Future, ok: bool) -> None:
    if not fut.done():
        fut.set_result(ok)


def _resolve_all(futs: list) -> None:
    for fut, ok in futs:
        if not fut.done():
            fut.set_result(ok)


class CommitWaiter:
    """DLedger mode: waits until an entry appended in term T is committed -- COMMITTED covers
    its end while DL_APPEND_TERM is still T.  COMMITTED is read before the term: the Raft role
    fences (DL_APPEND_TERM 0) before it ever moves COMMITTED as a follower, so a commit seen
    with the term unchanged was made by this leader, over this entry.  A changed term means the
    outcome is unknown (the entry may be cut, or committed by the next leader): never success.

    wait_async(end, term, timeout_s) -> "ok" | "term" (term changed) | "timeout"."""

    def __init__(self, ctl: ControlBlock):
        self.ctl = ctl
        self._waiting: list = []                   # heap of (end, n, term, future, loop)
        self._lock = threading.Lock()
        self._counter = itertools.count()
        self._thread: threading.Thread | None = None
        self._stop = False
        self._bell = None
        self._bell_heap: list = []                 # the bell loop's waits: (end, n, term, future)
        self._bell_term: int | None = None         # the append term the bell's waits were last checked in

    def use_bell(self, bell) -> None:
        bell.add(_SEQ_COMMIT, self.ring)
        self._bell = bell

    def _outcome(self, end: int, term: int) -> str | None:
        committed = self.ctl.get(_POS_COMMITTED)
        if self.ctl.get(_POS_APPEND_TERM) != term:
            return "term"
        return "ok" if committed >= end else None

    async def wait_async(self, end: int, term: int, timeout_s: float) -> str:
        now = self._outcome(end, term)
        if now is not None:
            return now
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        bell = self._bell
        via_bell = bell is not None and bell.loop is loop
        if via_bell:
            heapq.heappush(self._bell_heap, (end, next(self._counter), term, fut))
            bell.want(_SEQ_COMMIT)                 # then look: a move after this rings
            self.ring()
        else:
            with self._lock:
                heapq.heappush(self._waiting, (end, next(self._counter), term, fut, loop))
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name="commit-waiter", daemon=True)
                    self._thread.start()
            if self._outcome(end, term) is not None:   # settled between the check and the push: the
                self.ctl.wake(_SEQ_COMMIT)             # thread may have looked just before; look again
        timer = loop.call_later(timeout_s, _resolve, fut, "timeout")
        try:
            return await fut
        finally:
            timer.cancel()
            if via_bell:
                _prune(self._bell_heap, bell, _SEQ_COMMIT)

    def ring(self) -> None:
        """(the bell's loop) The thread's _run, one pass: waits of another term fail, waits the
        commit covers succeed; stops wanting the bell when none is left."""
        heap = self._bell_heap
        if not heap:
            return
        committed = self.ctl.get(_POS_COMMITTED)      # before the term: see the class docstring
        term_now = self.ctl.get(_POS_APPEND_TERM)
        if term_now != self._bell_term:
            keep = []
            for w in heap:
                if w[2] != term_now:
                    _resolve(w[3], "term")
                else:
                    keep.append(w)
            heapq.heapify(keep)
            heap[:] = keep
            self._bell_term = term_now
        while heap and heap[0][0] <= committed:
            _, _, term, fut = heapq.heappop(heap)
            _resolve(fut, "ok" if term == term_now else "term")
        _prune(heap, self._bell, _SEQ_COMMIT)

    def _run(self) -> None:
        term_seen = None
        while not self._stop:
            seen = self.ctl.seq(_SEQ_COMMIT)
            committed = self.ctl.get(_POS_COMMITTED)      # before the term: see the class docstring
            term_now = self.ctl.get(_POS_APPEND_TERM)
            ready: dict = {}
            with self._lock:
                if term_now != term_seen and self._waiting:
                    # the term changed: every waiter of another term fails (rare: a step-down)
                    keep = []
                    for w in self._waiting:
                        if w[2] != term_now:
                            ready.setdefault(w[4], []).append((w[3], "term"))
                        else:
                            keep.append(w)
                    heapq.heapify(keep)
                    self._waiting = keep
                term_seen = term_now
                while self._waiting and self._waiting[0][0] <= committed:
                    _, _, term, fut, loop = heapq.heappop(self._waiting)
                    ready.setdefault(loop, []).append((fut, "ok" if term == term_now else "term"))
            for loop, futs in ready.items():
                loop.call_soon_threadsafe(_resolve_all, futs)
            self.ctl.wait(_SEQ_COMMIT, seen, 200)

    def close(self) -> None:
        self._stop = True
        if self._thread is not None:
            self.ctl.wake(_SEQ_COMMIT)
            self._thread.join(timeout=2)
            self._thread = None
