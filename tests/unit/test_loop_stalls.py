"""mq.loop.watch_stalls: a loop that ran nothing for a while is named in the log (what a client
sees as a timeout with nothing in any log: a blocking call on a server's loop), and a loop that
only waits is not."""
from __future__ import annotations

import asyncio
import logging
import time

from mq import loop as mq_loop


def test_a_blocked_loop_is_logged_with_its_length(caplog):
    async def flow():
        watch = asyncio.create_task(mq_loop.watch_stalls("test server", interval_s=0.02, warn_s=0.3))
        await asyncio.sleep(0.1)
        time.sleep(0.5)                         # a blocking call on the loop
        await asyncio.sleep(0.2)
        watch.cancel()
    with caplog.at_level(logging.WARNING, logger="mq.loop"):
        mq_loop.run(flow())
    lines = [r.getMessage() for r in caplog.records if r.name == "mq.loop"]
    assert lines and all(x.startswith("test server: the event loop ran nothing for ") for x in lines), lines
    assert max(float(x.split("for ")[1].split(" s")[0]) for x in lines) >= 0.4


def test_a_loop_that_only_waits_is_not_logged(caplog):
    async def flow():
        watch = asyncio.create_task(mq_loop.watch_stalls("test server", interval_s=0.02, warn_s=1.0))
        await asyncio.sleep(0.5)
        watch.cancel()
    with caplog.at_level(logging.WARNING, logger="mq.loop"):
        mq_loop.run(flow())
    assert not [r for r in caplog.records if r.name == "mq.loop"]
