"""mq.client against real mqnamesrv and mqbroker processes on loopback: the flows of
tests/compat/test_cpp_client.py, with our producer and consumers instead of the C++ client.

All tests share one module-wide cluster and use their own topics and groups."""
import asyncio
import json
import os

from mq.client import (BROADCASTING, FIRST, AdminClient, Message, Producer, PullConsumer, PullStatus, PushConsumer,
                       SendStatus, select_by_hash)
from mq.client.message import retry_topic
from mq.client.sync import SyncAdminClient, SyncProducer, SyncPullConsumer, SyncPushConsumer
from tests.client.clientkit import Collector, message, route_ready, run, uniq, until

TAGS = ["TagA", "TagB", "TagC"]


async def settle(collector: Collector, expected: int, what: str, timeout_s: float = 30.0) -> None:
    """Wait for `expected` deliveries, then a little longer so a duplicate would show up."""
    await until(lambda: len(collector) >= expected, timeout_s, what)
    await asyncio.sleep(0.5)


async def consume_all(ns_addr: str, topic: str, expected: int, expression: str = "*", **options) -> Collector:
    """A push consumer in a new group until `expected` messages arrived (plus a settle period)."""
    col = Collector(options.pop("fail_first_delivery", False))
    cons = PushConsumer(uniq("CG"), ns_addr, listener=col, **options)
    cons.subscribe(topic, expression)
    await cons.start()
    try:
        await settle(col, expected, f"{expected} messages of {topic}")
    finally:
        await cons.shutdown()
    return col


def test_every_send_mode_reaches_a_new_group_exactly_once(cluster):
    """send (sync), send_async (future and callback), send_oneway, send_batch, send_to_queue and an
    ordered send through select_by_hash, all with tags, keys and a user property: a push consumer in a
    new group receives exactly that set (none missing, none twice, bodies/keys/properties intact) with
    the UNIQ_KEY each send returned; queue-directed messages sit on their queue in send order with dense
    queue offsets."""
    ns, _ = cluster
    topic = uniq("T_modes")

    async def sends():
        sent: dict[int, str | None] = {}      # seq -> UNIQ_KEY when the send reported one
        async with Producer(uniq("PG"), ns.addr) as prod:
            for i in range(0, 300):
                r = await prod.send(message(topic, i, TAGS[i % 3]))
                assert r.status is SendStatus.SEND_OK and len(r.msg_id) == 32 and len(r.offset_msg_id) == 32
                sent[i] = r.msg_id
            callbacks = []
            futs = {i: prod.send_async(message(topic, i, "TagA"), lambda r, e: callbacks.append((r, e)))
                    for i in range(300, 400)}
            for i, f in futs.items():
                sent[i] = (await f).msg_id
            await until(lambda: len(callbacks) == 100, 5, "every send callback")   # callbacks run after the await
            assert all(r is not None and e is None for r, e in callbacks)
            for i in range(400, 500):
                await prod.send_oneway(message(topic, i, "TagB"))
                sent[i] = None
            for start in range(500, 700, 50):
                r = await prod.send_batch([message(topic, i, "TagC") for i in range(start, start + 50)])
                ids = r.msg_id.split(",")
                assert r.status is SendStatus.SEND_OK and len(ids) == 50 and len(r.offset_msg_id.split(",")) == 50
                sent.update(zip(range(start, start + 50), ids))
            queues = await prod.fetch_publish_queues(topic)
            target = queues[1]
            for i in range(700, 800):
                r = await prod.send_to_queue(message(topic, i, "TagA"), target)
                assert r.queue == target
                sent[i] = r.msg_id
            ordered = queues[7 % len(queues)]
            for i in range(800, 900):
                r = await prod.send_with_selector(message(topic, i, "TagB"), select_by_hash, 7)
                assert r.queue == ordered
                sent[i] = r.msg_id
        return sent, target, ordered

    async def flow():
        sent, target, ordered = await sends()
        return sent, target, ordered, await consume_all(ns.addr, topic, len(sent))

    sent, target, ordered, col = run(flow())
    got = col.seqs()
    assert len(got) == len(set(got)) == 900, "duplicates delivered"
    assert set(got) == set(sent)
    for m in col.got:
        i = int(m.properties["seq"])
        assert m.body == f"body-{i}-".encode() + b"x" * (i % 300)
        assert m.keys == f"key-{i}" and m.topic == topic and m.reconsume_times == 0
        assert m.msg_id == sent[i] if sent[i] is not None else len(m.msg_id) == 32
    directed = sorted((m.queue_offset, int(m.properties["seq"]), m.queue_id) for m in col.got
                      if 700 <= int(m.properties["seq"]) < 800)
    assert {q for _, _, q in directed} == {target.queue_id}
    assert [s for _, s, _ in directed] == list(range(700, 800)), "queue order differs from send order"
    assert [o for o, _, _ in directed] == list(range(directed[0][0], directed[0][0] + 100)), "offsets not dense"
    assert {m.queue_id for m in col.got if 800 <= int(m.properties["seq"]) < 900} == {ordered.queue_id}


def test_tag_expression_filters(cluster):
    """A consumer subscribed with 'TagA || TagC' receives exactly the messages with those tags."""
    ns, _ = cluster
    topic = uniq("T_tags")

    async def flow():
        async with Producer(uniq("PG"), ns.addr) as prod:
            for i in range(300):
                await prod.send(message(topic, i, TAGS[i % 3]))
        return await consume_all(ns.addr, topic, 200, "TagA || TagC")

    col = run(flow())
    assert sorted(col.seqs()) == [i for i in range(300) if i % 3 != 1]
    assert {m.tags for m in col.got} == {"TagA", "TagC"}


def test_failed_listener_redelivers_through_the_retry_topic(cluster):
    """A listener that fails each message's first delivery gets every message once more through
    %RETRY%<group> (CONSUMER_SEND_MSG_BACK, delay levels) with reconsume_times 1, its original topic
    restored from RETRY_TOPIC and its original msg_id (UNIQ_KEY)."""
    ns, _ = cluster
    topic = uniq("T_retry")

    async def flow():
        ids = {}
        async with Producer(uniq("PG"), ns.addr) as prod:
            for i in range(30):
                ids[i] = (await prod.send(message(topic, i, "TagA"))).msg_id
        return ids, await consume_all(ns.addr, topic, 30, fail_first_delivery=True)

    ids, col = run(flow())
    assert col.failed >= 30, "first deliveries were refused"
    assert sorted(col.seqs()) == list(range(30)), "each redelivered exactly once"
    for m in col.got:
        assert m.reconsume_times == 1 and m.topic == topic
        assert m.queue.topic.startswith("%RETRY%")
        assert m.msg_id == ids[int(m.properties["seq"])]


def test_pull_consumer_reads_every_queue_to_the_end(cluster):
    """PullConsumer walks every queue from offset 0 until NO_NEW_MSG and gets each message once; the
    offset helpers agree with the queues (min 0, max = the end reached); a committed offset reads back;
    a blocking pull at the end is answered as soon as a message arrives (long polling)."""
    ns, _ = cluster
    topic = uniq("T_pull")

    async def flow():
        async with Producer(uniq("PG"), ns.addr) as prod:
            for i in range(400):
                await prod.send(message(topic, i, TAGS[i % 3]))
            async with PullConsumer(uniq("CGP"), ns.addr) as pc:
                queues = await pc.fetch_queues(topic)
                assert len(queues) == 4
                for _ in range(200):     # dispatch follows the sends' answers
                    if sum([await pc.max_offset(q) for q in queues]) >= 400:
                        break
                    await asyncio.sleep(0.05)
                got, ends = [], {}
                for q in queues:
                    offset = 0
                    while True:
                        res = await pc.pull(q, offset, 32)
                        if res.status is PullStatus.NO_NEW_MSG:
                            break
                        assert res.status is PullStatus.FOUND
                        assert [m.queue_offset for m in res.messages] == list(range(offset, res.next_begin_offset))
                        got += [int(m.properties["seq"]) for m in res.messages]
                        offset = res.next_begin_offset
                    ends[q] = offset
                    assert await pc.max_offset(q) == offset and await pc.min_offset(q) == 0
                tagged = await pc.pull(queues[0], 0, 32, "TagB")
                assert tagged.messages and {m.tags for m in tagged.messages} == {"TagB"}
                await pc.update_offset(queues[0], 17)
                assert await pc.query_offset(queues[0]) == 17
                waiting = asyncio.ensure_future(pc.pull(queues[2], ends[queues[2]], 32, block=True,
                                                        suspend_timeout_ms=10000))
                await asyncio.sleep(0.3)
                assert not waiting.done(), "a pull at the end should be held"
                loop = asyncio.get_running_loop()
                t0 = loop.time()
                await prod.send_to_queue(message(topic, 400, "TagA"), queues[2])
                held = await waiting
                assert held.status is PullStatus.FOUND and loop.time() - t0 < 3.0
                assert [int(m.properties["seq"]) for m in held.messages] == [400]
        return got

    assert sorted(run(flow())) == list(range(400))


def test_two_consumers_in_one_group_split_the_queues(cluster):
    """Two push consumers of one group divide the queues (both registered at the broker, per 38,
    rebalanced through NOTIFY_CONSUMER_IDS_CHANGED): no queue is consumed by both, each gets some,
    together they get every message once.  When one shuts down, the other takes every queue over and
    receives what is sent next."""
    ns, broker = cluster
    topic, group = uniq("T_split"), uniq("CG")

    async def flow():
        async with Producer(uniq("PG"), ns.addr) as prod, AdminClient(ns.addr) as admin:
            await prod.send(message(topic, 0, "TagA"))        # creates the topic (4 queues)
            await route_ready(ns.addr, topic)
            c1, c2 = Collector(), Collector()
            cons1 = PushConsumer(group, ns.addr, listener=c1, instance_name="one")
            cons2 = PushConsumer(group, ns.addr, listener=c2, instance_name="two")
            for c in (cons1, cons2):
                c.subscribe(topic)
                await c.start()
            try:
                await until(lambda: _len_is(admin.consumer_ids(group, broker.addr), 2), 20, "both registered")

                def split():
                    a, b = set(cons1.assigned_queues()), set(cons2.assigned_queues())
                    return not (a & b) and len(a | b) == 5 and a and b
                await until(split, 20, "a disjoint split of the 4 queues + the retry queue")
                await until(lambda: len(c1) + len(c2) >= 1, 20, "the first message")
                with c1.lock, c2.lock:
                    c1.got.clear(), c2.got.clear()
                for i in range(1, 401):
                    await prod.send(message(topic, i, "TagA"))
                await until(lambda: len(set(c1.seqs()) | set(c2.seqs())) >= 400, 30, "all messages")
                await asyncio.sleep(0.5)
                split_seen = (list(c1.got), list(c2.got))
                await cons2.shutdown()
                await until(lambda: len(cons1.assigned_queues()) == 5, 20, "the survivor owning every queue")
                for i in range(401, 421):
                    await prod.send(message(topic, i, "TagA"))
                await until(lambda: set(c1.seqs()) >= set(range(401, 421)), 20, "messages after the leave")
            finally:
                await cons1.shutdown()
                await cons2.shutdown()
        return split_seen

    got1, got2 = run(flow())
    # seq 0 was consumed before the split settled: at-least-once may deliver it twice, so it is left out
    got1, got2 = [m for m in got1 if m.properties["seq"] != "0"], [m for m in got2 if m.properties["seq"] != "0"]
    q1, q2 = {m.queue_id for m in got1}, {m.queue_id for m in got2}
    assert q1 and q2, "both consumers got queues"
    assert not (q1 & q2), f"queues consumed by both: {q1 & q2}"
    assert sorted(int(m.properties["seq"]) for m in got1 + got2) == list(range(1, 401))


async def _len_is(coro, n: int) -> bool:
    return len(await coro) == n


def test_broadcasting_consumers_each_get_everything(cluster, tmp_path):
    """BROADCASTING: two consumers of one group each receive every message; their offsets live in
    local files, so a restarted consumer gets only what was sent while it was down."""
    ns, _ = cluster
    topic, group = uniq("T_bcast"), uniq("CG")
    store = str(tmp_path)

    async def flow():
        async with Producer(uniq("PG"), ns.addr) as prod:
            await prod.send(message(topic, 0, "TagA"))
            await route_ready(ns.addr, topic)
            cols = [Collector(), Collector()]
            cons = [PushConsumer(group, ns.addr, BROADCASTING, FIRST, listener=c, instance_name=f"b{i}",
                                 offset_store_dir=store) for i, c in enumerate(cols)]
            for c in cons:
                c.subscribe(topic)
                await c.start()
                assert len(c.assigned_queues()) == 4       # every queue, no retry topic
            for i in range(1, 101):
                await prod.send(message(topic, i, "TagB"))
            for c in cols:
                await settle(c, 101, "every message at both consumers")
            for c in cons:
                await c.shutdown()
            for i in range(101, 121):
                await prod.send(message(topic, i, "TagC"))
            again = Collector()
            c = PushConsumer(group, ns.addr, BROADCASTING, FIRST, listener=again, instance_name="b0",
                             offset_store_dir=store)
            c.subscribe(topic)
            await c.start()
            try:
                await settle(again, 20, "messages sent while down")
            finally:
                await c.shutdown()
        return cols, again

    cols, again = run(flow())
    for c in cols:
        assert sorted(c.seqs()) == list(range(101))
    assert sorted(again.seqs()) == list(range(101, 121))
    files = [os.path.join(d, f) for d, _, fs in os.walk(store) for f in fs if f == "offsets.json"]
    assert len(files) == 2 and all(f.endswith(os.path.join(group, "offsets.json")) for f in files)
    table = json.load(open(files[0]))["offsetTable"]
    assert sum(e["offset"] for e in table) in (101, 121)


def test_blocking_wrappers(cluster):
    """The sync wrappers drive the same clients from plain threads: send, send_async with a callback,
    a push consumer with a plain listener, a pull consumer and the admin client."""
    ns, _ = cluster
    topic = uniq("T_sync")
    with SyncProducer(uniq("PG"), ns.addr) as prod:
        results = [prod.send(message(topic, i, "TagA")) for i in range(20)]
        done = []
        fut = prod.send_async(message(topic, 20, "TagA"), lambda r, e: done.append(r))
        assert fut.result(10).status is SendStatus.SEND_OK
    assert all(r.status is SendStatus.SEND_OK for r in results)
    col = Collector()
    cons = SyncPushConsumer(uniq("CG"), ns.addr, listener=col)
    cons.subscribe(topic)
    cons.start()
    try:
        run(until(lambda: len(col) >= 21, 20, "21 messages"))
    finally:
        cons.shutdown()
    assert sorted(col.seqs()) == list(range(21)) and done and done[0].status is SendStatus.SEND_OK
    with SyncPullConsumer(uniq("CGP"), ns.addr) as pc:
        total = sum(pc.max_offset(q) for q in pc.fetch_queues(topic))
    assert total == 21
    admin = SyncAdminClient(ns.addr)
    try:
        assert topic in admin.topic_list()
        assert sum(r["maxOffset"] for r in admin.topic_status(topic)) == 21
    finally:
        admin.close()


def test_send_errors_are_clear(cluster):
    """Bad sends fail before touching the network, with a reason: empty body, illegal topic, mixed-topic
    batch, a queue of another topic, a property value holding the 0x02 separator."""
    ns, _ = cluster
    from mq.client import MessageQueue, MQClientError
    import pytest

    async def flow():
        async with Producer(uniq("PG"), ns.addr) as prod:
            for bad, why in [(lambda: prod.send(Message("T", b"")), "empty"),
                             (lambda: prod.send(Message("bad topic!", b"x")), "illegal"),
                             (lambda: prod.send_batch([Message("A", b"x"), Message("B", b"y")]), "same topic"),
                             (lambda: prod.send_to_queue(Message("A", b"x"), MessageQueue("B", "b", 0)), "differs"),
                             (lambda: prod.send(Message("A", b"x", properties={"k": "a\x02b"})), "properties")]:
                with pytest.raises(MQClientError, match=why):
                    await bad()
    run(flow())
    assert retry_topic("g") == "%RETRY%g"


def test_large_bodies_are_compressed_and_restored(cluster):
    """A body of 4096 bytes or more travels zlib-compressed (stored sysFlag COMPRESSED|ZLIB, smaller on
    disk) and comes back byte for byte; a smaller one is stored as is."""
    ns, _ = cluster
    topic = uniq("T_zip")
    big = bytes(range(256)) * 64 + b"tail"          # 16 KiB + 4, compressible
    small = b"s" * 4095

    async def flow():
        async with Producer(uniq("PG"), ns.addr) as prod:
            q = (await prod.fetch_publish_queues(topic))[0]
            await prod.send_to_queue(Message(topic, big, tags="Z"), q)
            await prod.send_to_queue(Message(topic, small, tags="Z"), q)
        async with PullConsumer(uniq("CGP"), ns.addr) as pc:
            for _ in range(100):         # dispatch follows the send's answer: retry until both are there
                got = (await pc.pull(q, 0, 2)).messages
                if len(got) == 2:
                    return got
                await asyncio.sleep(0.05)
            return got

    first, second = run(flow())
    assert first.body == big and first.sys_flag & 0x1 and first.sys_flag & 0x700 == 0x300
    assert first.store_size < len(big)
    assert second.body == small and not second.sys_flag & 0x1


def test_consumer_started_before_its_topic_exists(cluster):
    """A push consumer subscribed to a topic with no route yet keeps looking (every second, not every
    30 s) and receives the first messages once a producer creates the topic."""
    ns, _ = cluster
    topic = uniq("T_late")

    async def flow():
        col = Collector()
        cons = PushConsumer(uniq("CG"), ns.addr, listener=col)
        cons.subscribe(topic)
        await cons.start()
        try:
            assert [q for q in cons.assigned_queues() if q.topic == topic] == []
            async with Producer(uniq("PG"), ns.addr) as prod:
                for i in range(10):
                    await prod.send(message(topic, i, "TagA"))
            await settle(col, 10, "messages of a topic created after the consumer started", 15)
        finally:
            await cons.shutdown()
        return col

    assert sorted(run(flow()).seqs()) == list(range(10))
