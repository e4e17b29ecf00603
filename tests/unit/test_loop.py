"""mq.loop.wait_for: asyncio.wait_for's contract without Python 3.11's lost cancellation.

On 3.11, a task cancelled in the same loop iteration as the awaitable it waits for completes
gets the result instead of CancelledError; a loop that waits so goes on as if never cancelled
(a broker's stop waited 30 s for its registration loop that way).  Both loops are checked."""
from __future__ import annotations

import asyncio
import pathlib
import re

import pytest

from mq import loop as mq_loop

LOOPS = [pytest.param(asyncio.new_event_loop, id="asyncio")]
if mq_loop.USING_UVLOOP:
    LOOPS.append(pytest.param(mq_loop.new_event_loop, id="uvloop"))


def _run(factory, coro):
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(coro)


@pytest.mark.parametrize("factory", LOOPS)
def test_a_waiting_loop_cancelled_as_its_event_is_set_ends(factory):
    """The registration loop's shape: wait for an event with a timeout, clear it, go round.
    The event is set and the task cancelled in one iteration; the task must end cancelled
    without going round again (asyncio.wait_for on 3.11 goes round: the bug this fixes)."""
    async def main():
        ev = asyncio.Event()
        rounds = 0

        async def waiting_loop():
            nonlocal rounds
            while True:
                try:
                    await mq_loop.wait_for(ev.wait(), 30)
                except TimeoutError:
                    pass
                ev.clear()
                rounds += 1

        task = asyncio.create_task(waiting_loop())
        await asyncio.sleep(0)                      # it waits on the event
        ev.set()
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=2)
        if task not in done:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        return task in done and task.cancelled(), rounds

    assert _run(factory, main()) == (True, 0)


@pytest.mark.parametrize("factory", LOOPS)
def test_result_timeout_and_no_limit(factory):
    """asyncio.wait_for's contract: the result; TimeoutError (asyncio.TimeoutError is the same
    class) with the awaitable cancelled; None waits without a limit."""
    async def main():
        loop = asyncio.get_running_loop()
        assert await mq_loop.wait_for(asyncio.sleep(0, "x"), 1) == "x"
        fut = loop.create_future()
        with pytest.raises(asyncio.TimeoutError):
            await mq_loop.wait_for(fut, 0.01)
        assert fut.cancelled()
        later = loop.create_future()
        loop.call_later(0.05, later.set_result, 7)
        assert await mq_loop.wait_for(later, None) == 7

    _run(factory, main())


def test_mq_never_calls_asyncio_wait_for():
    """Every wait with a timeout in the product goes through mq.loop.wait_for."""
    root = pathlib.Path(mq_loop.__file__).parent
    found = [f"{p.relative_to(root.parent)}:{n}" for p in sorted(root.rglob("*.py"))
             for n, line in enumerate(p.read_text().splitlines(), 1) if re.search(r"\basyncio\.wait_for\(", line)]
    assert found == []


TIMER_SLACK_S = 0.002       # how early an event loop's timer may end, read on that loop's own clock


@pytest.mark.parametrize("factory", LOOPS)
def test_cancel_all_returns_the_tasks_that_do_not_end(factory):
    """A stop's cancel of its loops: those that end are awaited (their failures retrieved, not
    raised); one that swallows its cancellation (as 3.11's wait_for made a loop do) is returned
    after the timeout instead of keeping the stop waiting."""
    stubborn = True

    async def main():
        nonlocal stubborn

        async def obeys():
            await asyncio.sleep(30)

        async def fails():
            await asyncio.sleep(0)
            raise RuntimeError("a loop that failed before the stop")

        async def ignores():
            while stubborn:
                try:
                    await asyncio.sleep(30)
                except asyncio.CancelledError:
                    continue

        tasks = [asyncio.create_task(f()) for f in (obeys, fails, ignores)]
        await asyncio.sleep(0.01)
        t0 = asyncio.get_running_loop().time()
        left = await mq_loop.cancel_all(tasks, 0.2)
        waited_s = asyncio.get_running_loop().time() - t0
        names = [t.get_coro().__qualname__.rsplit(".", 1)[-1] for t in left]
        assert tasks[0].cancelled() and isinstance(tasks[1].exception(), RuntimeError)
        stubborn = False                        # the test's own cleanup: the next cancel ends it
        assert await mq_loop.cancel_all(left, 1) == []
        return names, waited_s, await mq_loop.cancel_all([], 1)

    names, waited_s, none = _run(factory, main())
    # the wait ends on the loop's timer: uvloop's clock counts milliseconds, so a 0.2 s timeout can
    # read 0.19999999999 on it (CI run 26 of 2026-11-27); asyncio's may end a clock tick early too
    assert names == ["ignores"] and 0.2 - TIMER_SLACK_S <= waited_s < 2 and none == []
