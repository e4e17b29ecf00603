"""mq.client across broker restarts and broker loss, each test with its own name server and brokers."""
import asyncio

from mq.client import AdminClient, Producer, PullConsumer, PushConsumer, SendStatus, TopicConfig
from tests.client.clientkit import Broker, Collector, message, route_ready, run, start_cluster, uniq, until


def test_offsets_survive_a_broker_restart(tmp_path):
    """A group consumes everything and shuts down (committing its offsets); the broker restarts (clean
    stop); after more sends the same group receives only the new messages.  A consumer of another group
    that stays up across the restart reconnects and ends up with every message."""
    ns, broker = start_cluster(str(tmp_path))
    topic, group = uniq("T_restart"), uniq("CG")

    async def phase1():
        async with Producer(uniq("PG"), ns.addr) as prod:
            for i in range(200):
                await prod.send(message(topic, i, "TagA"))
        col = Collector()
        cons = PushConsumer(group, ns.addr, listener=col)
        cons.subscribe(topic)
        await cons.start()
        await until(lambda: len(col) >= 200, 30, "first batch")
        await cons.shutdown()
        survivor_col = Collector()
        survivor = PushConsumer(uniq("CG"), ns.addr, listener=survivor_col)
        survivor.subscribe(topic)
        await survivor.start()
        await until(lambda: len(survivor_col) >= 200, 30, "first batch at the survivor")
        return col, survivor, survivor_col

    async def phase2(survivor, survivor_col):
        await route_ready(ns.addr, topic)
        async with Producer(uniq("PG"), ns.addr) as prod:
            for i in range(200, 300):
                await prod.send(message(topic, i, "TagA"))
        col = Collector()
        cons = PushConsumer(group, ns.addr, listener=col)
        cons.subscribe(topic)
        await cons.start()
        try:
            await until(lambda: len(col) >= 100, 30, "second batch")
            await until(lambda: set(survivor_col.seqs()) >= set(range(300)), 30, "everything at the survivor")
            await asyncio.sleep(0.5)
        finally:
            await cons.shutdown()
            await survivor.shutdown()
        return col

    loop = asyncio.new_event_loop()
    try:
        first, survivor, survivor_col = loop.run_until_complete(asyncio.wait_for(phase1(), 60))
        broker.restart()
        second = loop.run_until_complete(asyncio.wait_for(phase2(survivor, survivor_col), 60))
    finally:
        loop.close()
        try:
            assert broker.stop() == 0, broker.proc.output()[-5000:]
        finally:
            ns.stop()
    assert sorted(first.seqs()) == list(range(200))
    assert sorted(second.seqs()) == list(range(200, 300)), "offsets were lost or ignored"
    assert set(survivor_col.seqs()) == set(range(300))


def test_producer_retries_on_another_broker_when_one_dies(tmp_path):
    """Two brokers (broker-a, broker-b) of one cluster on one name server: a topic created on both
    (UPDATE_AND_CREATE_TOPIC to each master) takes sends on both; after broker-b is killed every sync
    and async send still succeeds, on broker-a, and broker-a holds exactly what it acknowledged."""
    ns, a = start_cluster(str(tmp_path))
    try:
        b = Broker(str(tmp_path), ns.addr, "broker-b")
    except BaseException:
        a.stop()
        ns.stop()
        raise
    topic = uniq("T_failover")

    async def flow():
        await route_ready(ns.addr, "TBW102", brokers=2)
        async with AdminClient(ns.addr) as admin:
            addrs = await admin.create_topic(TopicConfig(topic, 4, 4), cluster="TestCluster")
            assert sorted(addrs) == sorted([a.addr, b.addr])
        await route_ready(ns.addr, topic, brokers=2)
        on_a = 0
        async with Producer(uniq("PG"), ns.addr) as prod:
            before = [await prod.send(message(topic, i, "TagA")) for i in range(40)]
            assert {r.queue.broker_name for r in before} == {"broker-a", "broker-b"}
            on_a += sum(r.queue.broker_name == "broker-a" for r in before)
            b.kill()
            after = [await prod.send(message(topic, i, "TagA")) for i in range(40, 140)]
            after += await asyncio.gather(*(prod.send_async(message(topic, i, "TagA")) for i in range(140, 160)))
            assert all(r.status is SendStatus.SEND_OK for r in after)
            assert {r.queue.broker_name for r in after} == {"broker-a"}
            assert prod.isolated_brokers() == {"broker-b"}, "no send ever failed over"
            on_a += len(after)
        async with PullConsumer(uniq("CGP"), ns.addr) as pc:
            queues = [q for q in await pc.fetch_queues(topic) if q.broker_name == "broker-a"]

            async def visible():
                n = sum([await pc.max_offset(q) for q in queues])
                return n if n >= on_a else None
            # SEND_OK means stored; the max offset counts what dispatch has put in the queues, which
            # follows within milliseconds (the answer does not wait for it, in RocketMQ either)
            stored = await until(visible, 10, "broker-a's queues to hold what it acknowledged")
        return on_a, stored

    try:
        on_a, stored = run(flow(), 60)
    finally:
        a.stop()
        b.stop()
        ns.stop()
    assert stored == on_a
