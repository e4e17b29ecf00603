"""The event loop every process of ours runs: uvloop where it is installed, asyncio's own otherwise.

uvloop is the asyncio loop written in C over libuv.  Measured here with a native load client
against a minimal frame-answering server: the same per-request Python work reaches ~3.5x more
requests/s with 32 connections (129 k vs 36 k) and as much one at a time, because the loop's
own bookkeeping per ready socket and per callback is C instead of Python.  Nothing of ours
depends on which loop runs; MQ_EVENT_LOOP=asyncio forces the stdlib loop (to compare, or to
rule uvloop out when chasing a bug).

    run(coro)            asyncio.run with our loop
    new_event_loop()     a loop of our kind (for code that drives its own loop in a thread)
    USING_UVLOOP         whether run/new_event_loop give uvloop's loop
    wait_for(aw, t)      asyncio.wait_for without Python 3.11's lost cancellation (use it, never
                         asyncio.wait_for: tests/unit/test_loop.py checks mq/ for it)
    cancel_all(tasks, t) cancels tasks and waits for them, at most t seconds; returns those that
                         did not end (a stop names them and goes on instead of hanging)
    watch_stalls(what)   a task that logs each time this loop ran nothing for a second or more

A stall of a server's loop is what a client sees as a timeout with nothing in any log; the
watch names it (a blocking call on the loop: a disk write, a long computation; or the whole
process stopped, as SIGSTOP does).  Costs four timer wakeups a second."""
from __future__ import annotations

import asyncio
import logging
import os

log = logging.getLogger("mq.loop")

try:
    if os.environ.get("MQ_EVENT_LOOP", "").lower() == "asyncio":
        raise ImportError("MQ_EVENT_LOOP=asyncio")
    import uvloop as _uvloop
except ImportError:          # not installed (or not wanted): asyncio's loop does the same, slower
    _uvloop = None

USING_UVLOOP = _uvloop is not None
LOOP_NAME = "uvloop" if USING_UVLOOP else "asyncio"


def new_event_loop() -> asyncio.AbstractEventLoop:
    return _uvloop.new_event_loop() if _uvloop is not None else asyncio.new_event_loop()


def run(main, *, debug: bool | None = None):
    """Runs the coroutine `main` to completion on a new loop of our kind, as asyncio.run does."""
    with asyncio.Runner(debug=debug, loop_factory=new_event_loop) as runner:
        return runner.run(main)


async def wait_for(aw, timeout_s: float | None):
    """`aw`'s result, or TimeoutError after timeout_s (None: no limit), as asyncio.wait_for.

    Python 3.11's asyncio.wait_for loses a cancellation that arrives as `aw` completes: the
    task gets aw's result instead of CancelledError (CPython gh-86296; 3.12 rebuilt wait_for on
    asyncio.timeout).  A loop that waits so goes on as if never cancelled: a broker's
    registration loop, woken by a DLedger role change in the same instant its stop cancelled
    it, registered again and kept the stop waiting 30 s for it (CI killed the broker at 20 s).
    asyncio.timeout keeps the cancellation."""
    async with asyncio.timeout(timeout_s):
        return await aw


async def cancel_all(tasks, timeout_s: float) -> list[asyncio.Task]:
    """Cancels `tasks` and waits until they end, at most timeout_s; returns the ones still
    running (a task that lost or ignores its cancellation), for the caller to name.  What the
    others ended with is retrieved and dropped, as gather(return_exceptions=True) would."""
    tasks = list(tasks)
    for t in tasks:
        t.cancel()
    if not tasks:
        return []
    done, pending = await asyncio.wait(tasks, timeout=timeout_s)
    for t in done:
        if not t.cancelled():
            t.exception()
    return [t for t in tasks if t in pending]


STALL_CHECK_INTERVAL_S = 0.25
STALL_WARN_S = 1.0


async def watch_stalls(what: str, interval_s: float = STALL_CHECK_INTERVAL_S,
                       warn_s: float = STALL_WARN_S) -> None:
    """Until cancelled: a WARNING naming `what` each time the running loop ran nothing for
    `warn_s` or more (a sleep of interval_s that ended that much late)."""
    loop = asyncio.get_running_loop()
    while True:
        t0 = loop.time()
        await asyncio.sleep(interval_s)
        late_s = loop.time() - t0 - interval_s
        if late_s >= warn_s:
            log.warning("%s: the event loop ran nothing for %.1f s (a blocking call on it, or the process "
                        "was stopped)", what, late_s)
