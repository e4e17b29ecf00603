"""Bells (mq.store.bells, csrc/ctl.h): a position moved by another process of the broker wakes
an event loop's waits with no waiter thread, only while a wait wants it, and every outcome of
the threaded waiters (reached, timeout, fatal store, a DLedger term that ended) is the same.

Each scenario runs in a fresh interpreter: adopting bells is process-wide state (every later
mq_ctl_wake of that process may ring them), which pytest's own process must not keep.  In it
a forked child plays the other role process (it inherits the bells, as roles inherit the
supervisor's) and moves positions when told to through a pipe."""
from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = r'''
import asyncio, os, sys, threading, time
from mq.store import bells, control as C
from mq.store.notify import CommitWaiter, PositionWaiter

fds = bells.make(2)
ctl = C.ControlBlock(sys.argv[1], 65536, create=True)
cmd_r, cmd_w = os.pipe()
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
                ctl.set_fatal(5, "disk gone")
                continue                        # set_fatal wakes every seq itself
            elif op == "quit":
                break
            for _ in range(int(args[3]) if len(args) > 3 else 1):
                ctl.wake(getattr(C, args[2]))
    os._exit(0)
os.close(cmd_r)

def tell(line):
    os.write(cmd_w, (line + "\n").encode())

async def main():
    loop = asyncio.get_running_loop()
    assert not bells.Bell(ctl, 5).usable        # a bell this process did not adopt
    bell = bells.Bell(ctl, 1)
    assert bell.usable and bell.fd == fds[1]
    acks = PositionWaiter(ctl, C.SEQ_ACK, C.POS_ACKED)
    commits = CommitWaiter(ctl)
    acks.use_bell(bell)
    commits.use_bell(bell)
    rings = []
    bell.attach(loop, lambda: (rings.append(1), acks.ring(), commits.ring()))
    threads = threading.active_count()

    # reached: the other process's advance rings this loop
    later = loop.call_later(0.2, tell, "advance POS_ACKED 100 SEQ_ACK")
    t0 = time.monotonic()
    assert await acks.wait_async(100, 5) is True
    assert 0.15 < time.monotonic() - t0 < 2, time.monotonic() - t0
    assert rings, "resolved without a ring"
    assert acks._thread is None and commits._thread is None and threading.active_count() == threads

    # reached already: no wait at all; timeout: False, and the want is dropped on the next ring
    assert await acks.wait_async(50, 5) is True
    t0 = time.monotonic()
    assert await acks.wait_async(200, 0.2) is False
    assert time.monotonic() - t0 < 2

    # several waits, released in one ring up to where the position got
    waits = [asyncio.ensure_future(acks.wait_async(t, 5)) for t in (300, 150, 250)]
    await asyncio.sleep(0.05)
    tell("advance POS_ACKED 260 SEQ_ACK")
    done, pending = await asyncio.wait(waits, timeout=2)
    assert [w.done() for w in waits] == [False, True, True], waits
    tell("advance POS_ACKED 300 SEQ_ACK")
    assert await waits[0] is True

    # DLedger: committed in the entry's term -> ok; the term changed -> "term", never ok
    tell("set POS_DL_APPEND_TERM 3 SEQ_COMMIT")
    await asyncio.sleep(0.05)
    loop.call_later(0.1, tell, "advance POS_COMMITTED 50 SEQ_COMMIT")
    assert await commits.wait_async(50, 3, 5) == "ok"
    loop.call_later(0.1, tell, "set POS_DL_APPEND_TERM 4 SEQ_COMMIT")
    assert await commits.wait_async(80, 3, 5) == "term"
    assert await commits.wait_async(90, 4, 0.2) == "timeout"

    # nothing wants the bell now: wakes do not ring it
    loop.remove_reader(bell.fd)
    try:
        os.eventfd_read(bell.fd)                # drop what the waits above left unread
    except BlockingIOError:
        pass
    tell("advance POS_ACKED 400 SEQ_ACK 50")
    tell("advance POS_COMMITTED 60 SEQ_COMMIT 50")
    await asyncio.sleep(0.3)
    try:
        os.eventfd_read(bell.fd)
        raise AssertionError("rung with no wait wanting it")
    except BlockingIOError:
        pass
    loop.add_reader(bell.fd, bell._rung)

    # a fatal store ends a wait at once (False), as the threaded waiter does
    loop.call_later(0.1, tell, "fatal")
    t0 = time.monotonic()
    assert await acks.wait_async(10_000, 5) is False
    assert time.monotonic() - t0 < 2
    bell.close()
    print("OK")

try:
    asyncio.run(main())
finally:
    tell("quit")
    os.waitpid(pid, 0)
    ctl.close()
'''


def test_bells_wake_a_loop_from_another_process(tmp_path):
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(SCRIPT), str(tmp_path)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip().endswith("OK"), (r.stdout, r.stderr)
