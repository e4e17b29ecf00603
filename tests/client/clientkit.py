"""Helpers for mq.client and mqadmin tests against real mqnamesrv/mqbroker processes
(mq/cluster.py)."""
import asyncio
import contextlib
import itertools
import threading
import time

from mq.client import AdminClient, ConsumeStatus, Message, PullConsumer, PullStatus
from mq.cluster import Broker, NameServer, wait_for

_ids = itertools.count()


def uniq(prefix: str) -> str:
    return f"{prefix}_{int(time.time() * 1000) % 10 ** 8}_{next(_ids)}"


def run(coro, timeout_s: float = 90.0):
    """Run one test flow on a fresh loop, bounded."""
    return asyncio.run(asyncio.wait_for(coro, timeout_s))


async def until(cond, timeout_s: float = 30.0, what: str = "condition", interval_s: float = 0.05):
    """Poll cond() (plain or async) until truthy; TimeoutError naming `what` after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        v = cond()
        if asyncio.iscoroutine(v):
            v = await v
        if v:
            return v
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(interval_s)


async def route_ready(ns_addr: str, topic: str, brokers: int = 1, timeout_s: float = 30.0) -> None:
    async with AdminClient(ns_addr, timeout_s=2.0) as admin:
        async def ok():
            try:
                return len((await admin.topic_route(topic)).broker_datas) >= brokers
            except Exception:   # noqa: BLE001 - not there yet
                return False
        await until(ok, timeout_s, f"route of {topic} on {brokers} broker(s)", 0.1)


def message(topic: str, i: int, tag: str) -> Message:
    return Message(topic, f"body-{i}-" + "x" * (i % 300), tags=tag, keys=f"key-{i}", properties={"seq": str(i)})


class Collector:
    """Listener that records what it is given (thread-safe: plain listeners run on a pool)."""

    def __init__(self, fail_first_delivery: bool = False):
        self.lock = threading.Lock()
        self.got: list = []
        self.failed = 0
        self.fail_first_delivery = fail_first_delivery

    def __call__(self, msg):
        with self.lock:
            if self.fail_first_delivery and msg.reconsume_times == 0:
                self.failed += 1
                return ConsumeStatus.RECONSUME_LATER
            self.got.append(msg)
        return ConsumeStatus.CONSUME_SUCCESS

    def seqs(self) -> list[int]:
        with self.lock:
            return [int(m.properties["seq"]) for m in self.got]

    def __len__(self) -> int:
        with self.lock:
            return len(self.got)


@contextlib.contextmanager
def own_cluster(work: str, **options):
    """A name server and one broker started with `options`, TBW102 routed; both stopped at the end
    (the broker's clean stop asserted)."""
    ns = NameServer(work)
    broker = None
    try:
        broker = Broker(work, ns.addr, **options)
        run(route_ready(ns.addr, "TBW102"))
        yield ns, broker
    finally:
        try:
            if broker is not None:
                assert broker.stop() == 0, broker.proc.output()[-5000:]
        finally:
            ns.stop()


async def read_topic(ns_addr: str, topic: str, expected: int = 0, settle_s: float = 0.0,
                     timeout_s: float = 20.0) -> list:
    """Every message of `topic`, each queue from offset 0 to its end; first waits until the queues
    hold at least `expected`, then settle_s more (so that a late extra one shows)."""
    async with PullConsumer(uniq("CG_read"), ns_addr) as pc:
        async def count():
            try:
                return sum([await pc.max_offset(q) for q in await pc.fetch_queues(topic)]) >= expected
            except Exception:      # noqa: BLE001 - no route yet
                return False
        if expected:
            await until(count, timeout_s, f"{expected} messages in {topic}")
        await asyncio.sleep(settle_s)
        got = []
        for q in await pc.fetch_queues(topic):
            offset = 0
            while True:
                res = await pc.pull(q, offset, 32)
                if res.status is not PullStatus.FOUND:
                    break
                got += res.messages
                offset = res.next_begin_offset
        return got


def start_cluster(work: str):
    """A name server and one broker (broker-a) with TBW102 routed."""
    ns = NameServer(work)
    try:
        broker = Broker(work, ns.addr)
    except BaseException:
        ns.stop()           # never leave a name server behind when the broker cannot start
        raise
    try:
        run(route_ready(ns.addr, "TBW102"))
    except BaseException:
        broker.stop()
        ns.stop()
        raise
    return ns, broker


__all__ = ["uniq", "run", "until", "route_ready", "message", "Collector", "start_cluster", "own_cluster", "read_topic",
           "Broker", "NameServer", "wait_for"]
