"""The official RocketMQ C++ client (PyPI rocketmq==0.4.4, librocketmq.so),
unmodified, against our real mqnamesrv and mqbroker processes on loopback.

Every test uses its own topic and groups on one module-wide cluster, except
the restart test, which restarts the broker."""
import asyncio
import itertools
import json
import threading
import time

import pytest

rocketmq = pytest.importorskip("rocketmq.client", reason="pip install rocketmq==0.4.4 (make test does)")
from rocketmq.client import Message, PullConsumer  # noqa: E402

from mq.remoting import RemotingClient  # noqa: E402
from mq.cluster import Broker, NameServer, wait_dispatched, wait_for  # noqa: E402
from tests.compat.cpp_producer import Producer  # noqa: E402
from tests.compat.cpp_push import ChildPushConsumer  # noqa: E402

_ids = itertools.count()


def uniq(prefix: str) -> str:
    return f"{prefix}_{int(time.time() * 1000) % 10 ** 8}_{next(_ids)}"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    work = str(tmp_path_factory.mktemp("cpp"))
    ns = NameServer(work)
    broker = Broker(work, ns.addr)
    _wait_route(ns.addr, "TBW102")
    yield ns, broker
    assert broker.stop() == 0, broker.proc.output()[-5000:]
    ns.stop()


def _wait_route(ns_addr: str, topic: str) -> None:
    async def ask():
        c = RemotingClient()
        try:
            r = await c.invoke(ns_addr, c.request(105, {"topic": topic}), 2)
            return r.code == 0
        except Exception:
            return False
        finally:
            await c.close()
    wait_for(lambda: asyncio.run(ask()), 30, 0.2, f"route of {topic}")


def _consumer_ids(broker_addr: str, group: str) -> list:
    async def ask():
        c = RemotingClient()
        try:
            r = await c.invoke(broker_addr, c.request(38, {"consumerGroup": group}), 2)
            return json.loads(r.body)["consumerIdList"] if r.code == 0 else []
        finally:
            await c.close()
    return asyncio.run(ask())


def make_producer(ns_addr: str, group: str | None = None) -> Producer:
    p = Producer(group or uniq("PG"))
    p.set_namesrv_addr(ns_addr)
    p.start()
    return p


def produce(ns_addr: str, topic: str, n: int, tag: str = "TagA") -> None:
    """message(topic, i, tag) for i in range(n), each sent with send_sync and stored (SEND_OK)."""
    prod = make_producer(ns_addr)
    try:
        for i in range(n):
            assert prod.send_sync(message(topic, i, tag)).status == 0
    finally:
        prod.shutdown()


def message(topic: str, i: int, tag: str) -> Message:
    m = Message(topic)
    m.set_keys(f"key-{i}")
    m.set_tags(tag)
    m.set_property("seq", str(i))
    m.set_body(f"body-{i}-" + "x" * (i % 300))
    return m


class Collector:
    """Push-consumer callback that records what arrives (thread-safe)."""

    def __init__(self, fail_first_delivery: bool = False):
        self.lock = threading.Lock()
        self.got: list[tuple] = []
        self.fail_first_delivery = fail_first_delivery
        self.failed = 0
        self.queues: set[int] = set()

    def __call__(self, msg):
        body = msg.body.decode()
        with self.lock:
            # The C++ client hands a whole pulled batch to one listener call and sends the
            # whole batch back if any message fails, so failures are decided per delivery
            # round (reconsume_times), never per message, to keep the outcome deterministic.
            if self.fail_first_delivery and msg.reconsume_times == 0:
                self.failed += 1
                raise RuntimeError("fail the first delivery to force a retry")
            self.got.append((body, msg.keys.decode(), msg.tags.decode(), msg.get_property("seq").decode(),
                             msg.reconsume_times, msg.queue_id, msg.queue_offset))
            self.queues.add(msg.queue_id)

    def bodies(self) -> list[str]:
        with self.lock:
            return [g[0] for g in self.got]


def push_consumer(ns_addr: str, group: str, topic: str, collector: Collector, expression: str = "*",
                  instance: str | None = None, threads: int | None = None) -> ChildPushConsumer:
    """A started official C++ PushConsumer delivering to `collector`; it runs in a child process
    (tests/compat/cpp_push.py: librocketmq.so can abort in its shutdown)."""
    return ChildPushConsumer(ns_addr, group, topic, collector, expression, instance, threads=threads)


TAGS = ["TagA", "TagB", "TagC"]


def test_send_sync_then_push_consumer_gets_exactly_the_set(cluster):
    """send_sync of 2000 messages with tags, keys and a user property: a push
    consumer in a new group receives exactly that set (bodies, keys, tags,
    properties), none missing and none duplicated; offsets are dense."""
    ns, _ = cluster
    topic = uniq("T_sync")
    prod = make_producer(ns.addr)
    sent = set()
    offsets = {}
    try:
        for i in range(2000):
            tag = TAGS[i % 3]
            r = prod.send_sync(message(topic, i, tag))
            assert r.status == 0, r
            sent.add((f"body-{i}-" + "x" * (i % 300), f"key-{i}", tag, str(i)))
            offsets.setdefault(r.offset, 0)
    finally:
        prod.shutdown()
    col = Collector()
    cons = push_consumer(ns.addr, uniq("CG"), topic, col)
    try:
        wait_for(lambda: len(col.got) >= len(sent), 60, 0.1, "all messages consumed")
        time.sleep(1.0)   # anything extra (a duplicate) would arrive now
    finally:
        cons.shutdown()
    got = [g[:4] for g in col.got]
    assert len(got) == len(set(got)) == 2000, "duplicates delivered"
    assert set(got) == sent


def test_oneway_orderly_and_batch_sends(cluster):
    """send_oneway, send_orderly (all to the queue the selector picks) and
    send_batch all arrive; orderly messages keep their order in their queue."""
    ns, _ = cluster
    topic = uniq("T_modes")
    prod = make_producer(ns.addr)
    expected = set()
    try:
        for i in range(300):
            prod.send_oneway(message(topic, i, "TagA"))
            expected.add(f"body-{i}-" + "x" * (i % 300))
        for i in range(300, 600):
            r = prod.send_orderly(message(topic, i, "TagB"), 7)
            assert r.status == 0
            expected.add(f"body-{i}-" + "x" * (i % 300))
        for start in range(600, 1000, 100):
            batch = [message(topic, i, "TagC") for i in range(start, start + 100)]
            r = prod.send_batch(batch)
            assert r.status == 0
            expected.update(f"body-{i}-" + "x" * (i % 300) for i in range(start, start + 100))
    finally:
        prod.shutdown()
    col = Collector()
    cons = push_consumer(ns.addr, uniq("CG"), topic, col)
    try:
        wait_for(lambda: set(col.bodies()) >= expected, 60, 0.1, "all sends consumed")
    finally:
        cons.shutdown()
    assert set(col.bodies()) == expected
    # a concurrent consumer's callbacks run on a pool; the order that matters is the queue's
    orderly = sorted((g[6], int(g[3])) for g in col.got if g[2] == "TagB")
    assert len({g[5] for g in col.got if g[2] == "TagB"}) == 1, "send_orderly used one queue"
    assert [seq for _, seq in orderly] == list(range(300, 600)), "queue order differs from send order"


def test_tag_expression_filters(cluster):
    """A consumer subscribed with 'TagA || TagC' receives exactly those tags
    (the C++ client sends zero hash codes: the broker filters by tag string)."""
    ns, _ = cluster
    topic = uniq("T_tags")
    prod = make_producer(ns.addr)
    try:
        for i in range(300):
            assert prod.send_sync(message(topic, i, TAGS[i % 3])).status == 0
    finally:
        prod.shutdown()
    col = Collector()
    cons = push_consumer(ns.addr, uniq("CG"), topic, col, "TagA || TagC")
    try:
        wait_for(lambda: len(col.got) >= 200, 60, 0.1, "tagged messages")
        time.sleep(1.0)
    finally:
        cons.shutdown()
    assert sorted(int(g[3]) for g in col.got) == [i for i in range(300) if i % 3 != 1]
    assert {g[2] for g in col.got} == {"TagA", "TagC"}


def test_failed_callback_redelivers_through_retry_topic(cluster):
    """A callback that fails once per message gets every message again (through
    %RETRY%<group> and the delay levels), with reconsume_times >= 1."""
    ns, _ = cluster
    topic = uniq("T_retry")
    produce(ns.addr, topic, 50)
    col = Collector(fail_first_delivery=True)
    # one consume thread: librocketmq.so sends each refused message back from the consume thread,
    # and two of its threads asking for the broker's connection at once can make one fail at
    # once ("GetTransport ... get timed_mutex timeout" in its log, seen once in ~60 consumers);
    # the client then drops that message (ConsumeMessageConcurrentlyService ignores a failed
    # sendMessageBack): a loss in the client, nothing the broker saw
    cons = push_consumer(ns.addr, uniq("CG"), topic, col, threads=1)
    try:
        wait_for(lambda: len({g[0] for g in col.got}) >= 50, 90, 0.2, "redelivered messages")
        time.sleep(1.0)
    finally:
        cons.shutdown()
    assert col.failed >= 1, "first deliveries were refused"
    assert sorted(int(g[3]) for g in col.got) == list(range(50)), "each redelivered exactly once"
    assert all(g[4] == 1 for g in col.got), "a redelivery counts one reconsume"


def test_pull_consumer_reads_every_queue_to_the_end(cluster):
    """The C++ PullConsumer walks every queue of the topic to its end and gets
    each message once."""
    ns, broker = cluster
    topic = uniq("T_pull")
    prod = make_producer(ns.addr)
    try:
        for i in range(400):
            assert prod.send_sync(message(topic, i, TAGS[i % 3])).status == 0
    finally:
        prod.shutdown()
    wait_dispatched(broker.addr)          # (the pull consumer stops at the end it finds)
    pc = PullConsumer(uniq("CGP"))
    pc.set_namesrv_addr(ns.addr)
    pc.start()
    try:
        got = [int(m.get_property("seq")) for m in pc.pull(topic)]
    finally:
        pc.shutdown()
    assert sorted(got) == list(range(400))


def test_two_consumers_in_one_group_split_the_queues(cluster):
    """Two push consumers of one group divide the queues between them (no queue
    consumed by both once rebalanced) and together get every message."""
    ns, broker = cluster
    topic = uniq("T_split")
    group = uniq("CG")
    prod = make_producer(ns.addr)
    c1, c2 = Collector(), Collector()
    cons1 = cons2 = None
    try:
        # create the topic first: a consumer that starts before its topic has a route
        # sends its first heartbeat only 30 s later (client behaviour)
        assert prod.send_sync(message(topic, 0, "TagA")).status == 0
        _wait_route(ns.addr, topic)
        cons1 = push_consumer(ns.addr, group, topic, c1, instance="one")
        cons2 = push_consumer(ns.addr, group, topic, c2, instance="two")
        wait_for(lambda: len(_consumer_ids(broker.addr, group)) == 2, 40, 0.2, "both consumers registered")
        time.sleep(11)   # the C++ client rebalances every 10 s; let both settle on their queues
        with c1.lock, c2.lock:
            c1.got.clear(), c2.got.clear(), c1.queues.clear(), c2.queues.clear()
        for i in range(1, 401):
            assert prod.send_sync(message(topic, i, "TagA")).status == 0
        wait_for(lambda: len(set(c1.bodies()) | set(c2.bodies())) >= 400, 60, 0.1, "all messages")
    finally:
        prod.shutdown()
        for c in (cons1, cons2):
            if c is not None:
                c.shutdown()
    assert c1.queues and c2.queues, "both consumers got queues"
    assert not (c1.queues & c2.queues), f"queues consumed by both: {c1.queues & c2.queues}"
    assert {int(g[3]) for g in c1.got + c2.got} == set(range(1, 401))


def test_offsets_survive_a_broker_restart(tmp_path):
    """A group consumes everything, the broker restarts (clean stop), more is
    sent: the same group receives only the new messages."""
    ns = NameServer(str(tmp_path))
    broker = Broker(str(tmp_path), ns.addr)
    try:
        _wait_route(ns.addr, "TBW102")
        topic, group = uniq("T_restart"), uniq("CG")
        prod = make_producer(ns.addr)
        for i in range(200):
            assert prod.send_sync(message(topic, i, "TagA")).status == 0
        prod.shutdown()
        col = Collector()
        cons = push_consumer(ns.addr, group, topic, col)
        wait_for(lambda: len(col.got) >= 200, 60, 0.1, "first batch")
        cons.shutdown()    # commits its offsets
        broker.restart()
        _wait_route(ns.addr, topic)
        prod = make_producer(ns.addr)
        for i in range(200, 300):
            assert prod.send_sync(message(topic, i, "TagA")).status == 0
        prod.shutdown()
        col2 = Collector()
        cons = push_consumer(ns.addr, group, topic, col2)
        wait_for(lambda: len(col2.got) >= 100, 60, 0.1, "second batch")
        time.sleep(1.0)
        cons.shutdown()
        assert sorted(int(g[3]) for g in col2.got) == list(range(200, 300))
    finally:
        assert broker.stop() == 0
        ns.stop()


def test_delay_level_holds_the_message(cluster):
    """set_delay_time_level(2) (1 s with the test broker's messageDelayLevel):
    the message goes through SCHEDULE_TOPIC_XXXX and arrives no earlier than
    its delay, with its own topic, tags and properties."""
    ns, _ = cluster
    topic = uniq("T_delay")
    col = Collector()
    prod = make_producer(ns.addr)
    try:
        assert prod.send_sync(message(topic, 0, "TagA")).status == 0     # creates the topic
        cons = push_consumer(ns.addr, uniq("CG"), topic, col)
        wait_for(lambda: len(col.got) >= 1, 30, 0.1, "the plain message")
        m = message(topic, 1, "TagD")
        m.set_delay_time_level(2)
        sent_at = time.monotonic()
        assert prod.send_sync(m).status == 0
        wait_for(lambda: len(col.got) >= 2, 30, 0.05, "the delayed message")
        waited = time.monotonic() - sent_at
        cons.shutdown()
    finally:
        prod.shutdown()
    delayed = col.got[1]
    assert delayed[2] == "TagD" and delayed[3] == "1"
    assert waited >= 0.9, f"a level-2 (1 s) delayed message arrived after {waited:.2f}s"
