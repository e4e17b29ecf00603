"""Bells (mq.store.bells, csrc/ctl.h): a position moved by another process of the broker wakes
an event loop's waits with no waiter thread, only while a wait wants it, with the outcomes of
the threaded waiters (reached, timeout, fatal store, a DLedger term that ended) -- each scenario
runs on both paths and must answer the same.

Each run is a fresh interpreter: adopting bells is process-wide state (every later
mq_ctl_wake of that process may ring them), which pytest's own process must not keep.  In it a
forked child plays the other role process (it inherits the bells, as roles inherit the
supervisor's) and moves positions when told to through a pipe, answering "done" once it woke.
The bells are made with no slow re-check (recheck_s=0), so a lost ring shows as a timeout."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

SCRIPT = r'''
import asyncio, os, sys, threading, time
from mq.store import bells, control as C
from mq.store.notify import CommitWaiter, PositionWaiter

path = sys.argv[2]                              # "bell" or "thread"
fds = bells.make(2)
ctl = C.ControlBlock(sys.argv[1], 65536, create=True)
cmd_r, cmd_w = os.pipe()
done_r, done_w = os.pipe()
pid = os.fork()
if pid == 0:                                    # the other process: moves positions, wakes
    with os.fdopen(cmd_r) as commands:
        for line in commands:
            op, *args = line.split()
            if op == "advance":
                ctl.advance(getattr(C, args[0]), int(args[1]))
            elif op == "set":
                ctl.set(getattr(C, args[0]), int(args[1]))
            elif op == "fatal":
                ctl.set_fatal(5, "disk gone")   # wakes every seq itself
            elif op == "quit":
                break
            if op in ("advance", "set"):
                for _ in range(int(args[3]) if len(args) > 3 else 1):
                    ctl.wake(getattr(C, args[2]))
            os.write(done_w, b"d")
    os._exit(0)
os.close(cmd_r)
os.close(done_w)

unanswered = 0

def tell(line):
    global unanswered
    os.write(cmd_w, (line + "\n").encode())
    unanswered += 1

def drain():
    """Every command told so far is done (the child woke for it)."""
    global unanswered
    while unanswered:
        assert os.read(done_r, 1) == b"d"
        unanswered -= 1

def tell_and_wait(line):
    drain()
    tell(line)
    drain()

acks = PositionWaiter(ctl, C.SEQ_ACK, C.POS_ACKED)
commits = CommitWaiter(ctl)

async def main():
    loop = asyncio.get_running_loop()
    assert not bells.Bell(ctl, 5).usable        # a bell this process did not adopt
    bell = None
    if path == "bell":
        bell = bells.Bell(ctl, 1, recheck_s=0)
        assert bell.usable and bell.fd == fds[1]
        bell.attach(loop)
        acks.use_bell(bell)
        commits.use_bell(bell)
    threads = threading.active_count()

    # reached: the other process's advance wakes this loop
    loop.call_later(0.2, tell, "advance POS_ACKED 100 SEQ_ACK")
    t0 = time.monotonic()
    assert await acks.wait_async(100, 5) is True
    assert 0.15 < time.monotonic() - t0 < 2, time.monotonic() - t0
    assert (acks._thread is None) == (path == "bell")
    if path == "bell":
        assert threading.active_count() == threads, "a waiter thread on the bell path"

    # reached already: no wait at all; a timeout: False
    assert await acks.wait_async(50, 5) is True
    t0 = time.monotonic()
    assert await acks.wait_async(200, 0.2) is False
    assert time.monotonic() - t0 < 2

    # several waits released up to where the position got; one timed out meanwhile, the
    # others still wait and are still woken
    waits = [asyncio.ensure_future(acks.wait_async(t, 5)) for t in (300, 150, 250)]
    short = asyncio.ensure_future(acks.wait_async(400, 0.1))
    assert await short is False
    tell_and_wait("advance POS_ACKED 260 SEQ_ACK")
    await asyncio.wait(waits[1:], timeout=2)
    assert [w.done() for w in waits] == [False, True, True], waits
    tell("advance POS_ACKED 300 SEQ_ACK")
    assert await waits[0] is True

    # many rounds, each one wake: none is lost (a lost ring would be a 2 s timeout: False)
    for target in range(1000, 1400):
        loop.call_soon(tell, f"advance POS_ACKED {target} SEQ_ACK")
        assert await acks.wait_async(target, 2) is True, target

    # DLedger: committed in the entry's term -> ok; the term changed -> "term", never ok
    tell_and_wait("set POS_DL_APPEND_TERM 3 SEQ_COMMIT")
    loop.call_later(0.1, tell, "advance POS_COMMITTED 50 SEQ_COMMIT")
    assert await commits.wait_async(50, 3, 5) == "ok"
    loop.call_later(0.1, tell, "set POS_DL_APPEND_TERM 4 SEQ_COMMIT")
    assert await commits.wait_async(80, 3, 5) == "term"
    assert await commits.wait_async(90, 4, 0.2) == "timeout"

    if bell is not None:
        # nothing wants the bell now: the other process's wakes do not ring it
        loop.remove_reader(bell.fd)
        try:
            os.eventfd_read(bell.fd)            # what the waits above left unread
        except BlockingIOError:
            pass
        tell_and_wait("advance POS_ACKED 2000 SEQ_ACK 50")
        tell_and_wait("advance POS_COMMITTED 60 SEQ_COMMIT 50")
        try:
            os.eventfd_read(bell.fd)
            raise AssertionError("rung with no wait wanting it")
        except BlockingIOError:
            pass
        loop.add_reader(bell.fd, bell._rung)

        # a wait from another loop than the bell's takes the thread, and is woken too
        def other_loop():
            return asyncio.run(acks.wait_async(2100, 5))
        fut = loop.run_in_executor(None, other_loop)
        while not acks._heap:                   # its wait is in the thread's heap: then move
            await asyncio.sleep(0.005)
        tell_and_wait("advance POS_ACKED 2100 SEQ_ACK")
        assert await fut is True
        assert acks._thread is not None

    # a fatal store ends a wait at once (False)
    loop.call_later(0.1, tell, "fatal")
    t0 = time.monotonic()
    assert await acks.wait_async(10_000, 5) is False
    assert time.monotonic() - t0 < 2
    if bell is not None:
        bell.close()
    print("OK")

try:
    asyncio.run(main())
finally:
    os.write(cmd_w, b"quit\n")
    os.waitpid(pid, 0)
    acks.close()                                # their threads leave the block before it is unmapped
    commits.close()
    ctl.close()
'''


@pytest.mark.parametrize("path", ["bell", "thread"])
def test_waits_woken_from_another_process(tmp_path, path):
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(SCRIPT), str(tmp_path), path], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip().endswith("OK"), (r.stdout, r.stderr)
