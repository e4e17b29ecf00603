"""What the mqadmin tests share: a live cluster whose topic has been produced and fully consumed,
and the committed offsets of a group read straight from the broker (QUERY_CONSUMER_OFFSET)."""
from __future__ import annotations

import asyncio
import contextlib

from mq.client import MessageQueue, Producer, PushConsumer
from tests.client.clientkit import Collector, message, run, start_cluster, uniq, until
from mq.cluster import call

QUEUES = 4


def committed(broker, group: str, topic: str, queues: int = QUEUES) -> list[int]:
    """The group's committed offset of each queue (-1 where the broker has none)."""
    out = []
    for q in range(queues):
        r = call(broker.addr, 14, {"consumerGroup": group, "topic": topic, "queueId": q})
        out.append(int(r.ext_fields["offset"]) if r.code == 0 else -1)
    return out


@contextlib.contextmanager
def consumed_cluster(root: str, name: str, messages: int):
    """(ns, broker, topic, group): a name server and broker-a under `root`, a 4-queue topic holding
    `messages` messages (TagA, spread evenly over the queues), consumed by a push consumer group
    whose offsets are committed (messages / 4 each) before it goes offline.  Stopped on exit."""
    assert messages % QUEUES == 0, messages
    ns, broker = start_cluster(root)
    topic, group = uniq(f"T_{name}"), uniq(f"CG_{name}")

    async def prepare():
        async with Producer(uniq("PG"), ns.addr) as prod:
            for i in range(messages):
                await prod.send_to_queue(message(topic, i, "TagA"), MessageQueue(topic, "broker-a", i % QUEUES))
        col = Collector()
        cons = PushConsumer(group, ns.addr, listener=col)
        cons.subscribe(topic)
        await cons.start()
        try:
            await until(lambda: len(col) >= messages, 30, f"all {messages} consumed")

            async def all_committed():
                return await asyncio.to_thread(committed, broker, group, topic) == [messages // QUEUES] * QUEUES
            await until(all_committed, 30, "offsets committed")
        finally:
            await cons.shutdown()
    try:
        run(prepare())
        yield ns, broker, topic, group
    finally:
        broker.stop()
        ns.stop()
