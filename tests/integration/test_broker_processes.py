"""The broker's process model under faults: io workers share the port
(SO_REUSEPORT), a killed worker is restarted by the supervisor, clients
reconnect, and no acknowledged message is lost."""
import asyncio
import json
import os
import signal
import threading

import pytest

from mq.remoting import RemotingClient
from mq.cluster import Broker, NameServer, wait_dispatched, wait_for
from mq.wire.headers import send_v2

rocketmq = pytest.importorskip("rocketmq.client")
from rocketmq.client import Message, Producer, PullConsumer  # noqa: E402


def runtime_info(addr: str) -> dict:
    async def ask():
        c = RemotingClient()
        try:
            r = await c.invoke(addr, c.request(28), 3)
            return json.loads(r.body)["table"]
        finally:
            await c.close()
    return asyncio.run(ask())


def worker_pids(addr: str, tries: int = 40) -> set[int]:
    """Pids of the io workers, learned over fresh connections (the kernel
    spreads them over the workers).  A probe that lands on a worker being
    killed or restarted fails; that probe is skipped."""
    pids = set()
    for _ in range(tries):
        try:
            pids.add(int(runtime_info(addr)["ioWorkerPid"]))
        except Exception:
            pass
    return pids


@pytest.fixture
def cluster(tmp_path):
    ns = NameServer(str(tmp_path))
    broker = Broker(str(tmp_path), ns.addr, sendMessageThreadPoolNums=2)
    yield ns, broker
    broker.stop()
    ns.stop()


def test_connections_are_spread_over_two_workers(cluster):
    """With sendMessageThreadPoolNums=2 both io workers accept connections."""
    _, broker = cluster
    assert len(worker_pids(broker.addr)) == 2


def test_kill_9_of_an_io_worker_under_load(cluster):
    """A producer sends continuously; one io worker is killed with SIGKILL:
    the supervisor restarts it, the producer keeps going, and every message
    that got SEND_OK is in the store afterwards."""
    ns, broker = cluster
    topic = "T_kill_worker"
    prod = Producer("PG_kill")
    prod.set_namesrv_addr(ns.addr)
    prod.start()
    acked, failed = [], 0
    stop = threading.Event()

    def load():
        nonlocal failed
        i = 0
        while not stop.is_set() and i < 20000:
            m = Message(topic)
            m.set_keys(f"k{i}")
            m.set_body(f"m{i}")
            try:
                if prod.send_sync(m).status == 0:
                    acked.append(f"m{i}")
            except Exception:
                failed += 1
            i += 1

    t = threading.Thread(target=load)
    t.start()
    try:
        wait_for(lambda: len(acked) > 300, 30, what="load under way")
        before = worker_pids(broker.addr)
        victim = sorted(before)[0]
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: len(worker_pids(broker.addr, 20) - before) >= 1, 30, 0.2, "a restarted worker")
        n_at_restart = len(acked)
        wait_for(lambda: len(acked) > n_at_restart + 300, 30, what="load continuing after the restart")
    finally:
        stop.set()
        t.join(60)
        prod.shutdown()
    assert "died with exit code" in broker.proc.output()
    wait_dispatched(broker.addr)
    pc = PullConsumer("CG_kill_check")
    pc.set_namesrv_addr(ns.addr)
    pc.start()
    try:
        stored = {m.body.decode() for m in pc.pull(topic)}
    finally:
        pc.shutdown()
    missing = set(acked) - stored
    assert not missing, f"{len(missing)} acknowledged messages lost, e.g. {sorted(missing)[:5]}"
    assert len(acked) > 600


def test_sigterm_to_the_whole_process_group_stops_cleanly(tmp_path):
    """SIGTERM to every process of the broker at once (what a terminal's Ctrl-C
    or systemd's default KillMode does): the roles ignore it and are stopped by
    the supervisor, which exits 0 and leaves a clean store (no abort file)."""
    ns = NameServer(str(tmp_path))
    broker = Broker(str(tmp_path), ns.addr)
    try:
        os.killpg(broker.proc.p.pid, signal.SIGTERM)
        assert broker.proc.p.wait(30) == 0, broker.proc.output()[-3000:]
        assert not os.path.exists(os.path.join(broker.dir, "abort"))
        assert "broker stopped cleanly" in broker.proc.output()
    finally:
        broker.proc.kill()
        ns.stop()


def test_sigterm_while_the_broker_starts_is_a_clean_stop(tmp_path):
    """A SIGTERM that comes while the supervisor still starts -- its io workers serve, the name
    servers are being told -- stops the broker cleanly once it has started (exit 0, no abort
    file).  The start is held open by a name server that never answers (a listening socket
    nobody reads: the registration waits its registerBrokerTimeoutMills).  Before, the signal
    handlers were set after the start and the signal's default action killed the supervisor:
    `mq.cli.local` reported a slave restarted and stopped at once as "not cleanly"."""
    import socket
    import time
    from mq.cluster import BIN, Proc, free_port
    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(8)
    port = free_port((-2, 0, 1))
    store = tmp_path / "store"
    conf = tmp_path / "broker.conf"
    conf.write_text("".join(f"{k}={v}\n" for k, v in {
        "brokerClusterName": "TestCluster", "brokerName": "broker-a", "listenPort": port,
        "listenAddress": "127.0.0.1", "brokerIP1": "127.0.0.1",
        "namesrvAddr": "127.0.0.1:%d" % hole.getsockname()[1], "storePathRootDir": store,
        "mappedFileSizeCommitLog": 16 * 1024 * 1024, "registerBrokerTimeoutMills": 4000}.items()))
    proc = Proc([os.path.join(BIN, "mqbroker"), "-c", str(conf)], str(tmp_path / "broker.log"))
    try:
        wait_for(lambda: "io worker 0 (pid" in proc.output() or proc.p.poll() is not None, 60,
                 what="an io worker up")
        assert " io workers; name servers" not in proc.output()          # still starting
        t0 = time.monotonic()
        proc.p.send_signal(signal.SIGTERM)
        assert proc.p.wait(60) == 0, proc.output()[-3000:]
        out = proc.output()
        assert out.index(" io workers; name servers") < out.index("broker stopped cleanly")
        assert not os.path.exists(store / "abort")
        print(f"\nstopped {time.monotonic() - t0:.1f} s after the SIGTERM (the start waited for the name server)")
    finally:
        proc.kill()
        hole.close()


def test_long_poll_answers_at_once_on_arrival_and_times_out_cleanly(cluster):
    """A pull parked on an empty queue is answered as soon as a message arrives
    (woken through the dispatch futex), and one that times out answers
    PULL_NOT_FOUND after its suspend time."""
    _, broker = cluster

    async def go():
        c = RemotingClient()
        try:
            base = send_v2(producerGroup="PG", topic="LP", defaultTopic="TBW102", defaultTopicQueueNums=4, queueId=0,
                           sysFlag=0, bornTimestamp=0, flag=0, properties="")
            assert (await c.invoke(broker.addr, c.request(310, base, b"first"))).code == 0
            for _ in range(200):      # dispatch follows the answer: wait until the queue shows it
                r = await c.invoke(broker.addr, c.request(30, {"topic": "LP", "queueId": 0}))
                if r.ext_fields["offset"] == "1":
                    break
                await asyncio.sleep(0.05)
            pull = {"consumerGroup": "G", "topic": "LP", "queueId": 0, "queueOffset": 1, "maxMsgNums": 32,
                    "sysFlag": 6, "commitOffset": 0, "subscription": "*", "subVersion": 0}
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            r = await c.invoke(broker.addr, c.request(11, {**pull, "suspendTimeoutMillis": 400}), 5)
            assert r.code == 19 and 0.35 < loop.time() - t0 < 5
            parked = asyncio.ensure_future(c.invoke(broker.addr, c.request(11, {**pull, "suspendTimeoutMillis": 10000}), 15))
            await asyncio.sleep(0.3)
            sent_at = loop.time()
            assert (await c.invoke(broker.addr, c.request(310, base, b"second"))).code == 0
            r = await parked
            assert r.code == 0 and b"second" in r.body
            # the hold is 10 s: an answer well before it means the arrival woke it
            assert loop.time() - sent_at < 3.0, "woken by the arrival, not by the timeout"
        finally:
            await c.close()
    asyncio.run(go())
