"""What a push consumer costs the broker per delivered message (information, no gate yet): a
broker with 1 io worker, a producer process sending 512-byte messages one at a time at RATE
msgs/s (our library's Producer, paced), then the same with our library's PushConsumer
(long-polling pulls with commitOffset, as every RocketMQ push consumer pulls) keeping up with
it.  The io worker's and the supervisor's CPU from /proc over the window, per message produced,
without and with the consumer: the difference is the consumer's.

At this rate a push consumer pulls about once a message: each pull parks (nothing yet), is
resumed by the dispatch role's bell and answered with one message, so the parked pull's own
path dominates.  Measured 2026-11-29 (README, the fast connections' pulls): io worker ~34 us a
message for the producer alone, 190 with the consumer; 174-180 once the pulls' offset commits
were coalesced (the supervisor 57 -> 7-9 us; the first run of this file: 191 and 7.0).  Answering
resumed pulls in C is the next cut."""
from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import time

import pytest

from mq.cluster import Broker, call

RATE = 2000                   # msgs/s produced
WINDOW_S = 5.0
TOPIC = "PerfPushCost"
TICK = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def _producer(ns_addr: str, stop) -> None:
    from mq.client.message import Message
    from mq.client.producer import Producer

    async def run():
        p = Producer("PerfPushPG", ns_addr)
        await p.start()
        t0, k = time.monotonic(), 0
        while not stop.is_set():
            await p.send(Message(TOPIC, b"x" * 512))
            k += 1
            ahead = t0 + k / RATE - time.monotonic()
            if ahead > 0:
                await asyncio.sleep(ahead)
        await p.shutdown()
    asyncio.run(run())


def _consumer(ns_addr: str, stop, count) -> None:
    from mq.client.consumer import ConsumeFromWhere, PushConsumer

    async def run():
        async def on(_msg):
            with count.get_lock():
                count.value += 1
            return True
        c = PushConsumer("PerfPushCG", ns_addr, consume_from=ConsumeFromWhere.LAST, listener=on)
        c.subscribe(TOPIC, "*")
        await c.start()
        while not stop.is_set():
            await asyncio.sleep(0.1)
        await c.shutdown()
    asyncio.run(run())


@pytest.mark.parametrize("rate", [RATE])
def test_push_consumer_cost(benchmark, namesrv, store_dir, rate):
    benchmark.group = "push consumer: broker CPU per delivered message"
    b = Broker(store_dir, namesrv.addr, name="perf-push", sendMessageThreadPoolNums=1)
    ctx = mp.get_context("spawn")
    stop, count = ctx.Event(), ctx.Value("l", 0)
    procs = []
    try:
        r = call(b.addr, 17, {"topic": TOPIC, "defaultTopic": "TBW102", "readQueueNums": 4, "writeQueueNums": 4,
                              "perm": 6, "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0, "order": "false"})
        assert r.code == 0, r.remark
        io, sup = b.processes()["io-0"][0], b.processes()["broker"][0]
        procs.append(ctx.Process(target=_producer, args=(namesrv.addr, stop)))
        procs[-1].start()
        time.sleep(3)

        def window():
            c0, s0, n0 = _cpu_s(io), _cpu_s(sup), count.value
            time.sleep(WINDOW_S)
            return ((_cpu_s(io) - c0) / (WINDOW_S * rate) * 1e6, (_cpu_s(sup) - s0) / (WINDOW_S * rate) * 1e6,
                    (count.value - n0) / WINDOW_S)

        alone = window()
        procs.append(ctx.Process(target=_consumer, args=(namesrv.addr, stop, count)))
        procs[-1].start()
        time.sleep(6)                                  # its rebalance, then caught up
        both = benchmark.pedantic(window, rounds=1, iterations=1)
    finally:
        stop.set()
        for p in procs:
            p.join(20)
        b.stop()
    print(f"\n  producer alone at {rate:,} msgs/s: io worker {alone[0]:.0f} us, supervisor {alone[1]:.1f} us a message")
    print(f"  with a push consumer ({both[2]:,.0f} msgs/s delivered): io worker {both[0]:.0f} us, "
          f"supervisor {both[1]:.1f} us a message")
    benchmark.extra_info.update({"io_us_alone": alone[0], "io_us_with_consumer": both[0],
                                 "supervisor_us_with_consumer": both[1], "delivered_per_s": both[2]})
    assert both[2] > rate / 2, "the consumer kept up"
