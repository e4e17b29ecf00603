"""mqchaos: one cell of the fault matrix - a cluster of real processes on loopback, producers
recording every operation, a nemesis, a final drain of every queue, and the checker's verdict
(mq.chaos.history).

    mqchaos run --mode MODE --nemesis NEMESIS --seconds N [--dir DIR] [--producers P] [--json]

Modes (the broker configurations RELIABILITY.md makes promises for):
    async      one broker, ASYNC_FLUSH
    sync       one broker, SYNC_FLUSH
    dledger    a DLedger group of 3 brokers
Nemeses, each fault lasting FAULT_S and repeated every CYCLE_S while the run lasts:
    none       no fault (the baseline: the workload and the checker alone)
    kill       kill -9 of the broker (dledger: of the current leader, every process of it), then
               a restart on the same store
    pause      SIGSTOP of every process of the broker (dledger: the leader), then SIGCONT
Every promise here is the same: a process fault loses no acknowledged message (its page cache
survives a kill; SYNC_FLUSH and DLedger's quorum cover the rest), nothing unexpected,
duplicated or reordered.  A broken promise makes the run exit 1.

The producers use mq.client with no retries (one attempt per recorded invoke, so a duplicate
in the history is the broker's, not a retry's); a send answered with a code that says nothing
was stored is a `fail`, a timeout or any other error an `info` (unknown outcome)."""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
import threading
import time

from mq import loop as mq_loop
from mq.client import Message, MQBrokerError, MQClientError, Producer, PullConsumer
from mq.client.message import PullStatus
from mq.cluster import Broker, DLedgerGroup, NameServer, wait_for

from .history import HistoryWriter, check, load

MODES = ("async", "sync", "dledger")
NEMESES = ("none", "kill", "pause")
TOPIC = "ChaosTopic"
QUEUES = 4
FAULT_S = 2.0          # how long a fault lasts
CYCLE_S = 6.0          # a fault starts every CYCLE_S (the first after CYCLE_S / 2)
HEAL_S = 30.0          # after the run: how long the cluster may take to serve again before the drain
# codes that say the message was not stored (anything else that is not SUCCESS may have been)
NOT_STORED = {13, 14, 16, 17, 23, 26, 29}


class Cluster:
    """The processes of one mode, and the nemesis's handles on them."""

    def __init__(self, mode: str, workdir: str):
        self.mode = mode
        self.ns = NameServer(workdir)
        opts = {"brokerClusterName": "ChaosCluster", "sendMessageThreadPoolNums": 1}
        self.group: DLedgerGroup | None = None
        self.broker: Broker | None = None
        try:
            if mode == "dledger":
                self.group = DLedgerGroup(workdir, self.ns.addr, name="ChaosRaft", **opts)
                self.group.wait_leader(60)
            else:
                self.broker = Broker(workdir, self.ns.addr, name="chaos-a", **opts,
                                     flushDiskType="SYNC_FLUSH" if mode == "sync" else "ASYNC_FLUSH")
        except BaseException:
            self.close()
            raise

    def target(self) -> Broker:
        """The broker the nemesis hits: the only one, or the DLedger leader now."""
        if self.group is None:
            return self.broker
        return self.group.brokers[self.group.wait_leader(HEAL_S)]

    def writable_addrs(self) -> list[str]:
        if self.group is None:
            return [self.broker.addr]
        return [self.group.addr(i) for i in self.group.ids]

    def close(self) -> None:
        if self.group is not None:
            self.group.close()
        if self.broker is not None and self.broker.proc is not None and self.broker.proc.p.poll() is None:
            os.killpg(self.broker.proc.p.pid, signal.SIGCONT)
            self.broker.stop()
        self.ns.stop()


class Nemesis(threading.Thread):
    """Starts a fault every CYCLE_S and ends it FAULT_S later, recording both."""

    def __init__(self, cluster: Cluster, kind: str, history: HistoryWriter, stop: threading.Event):
        super().__init__(name="nemesis", daemon=True)
        self.cluster, self.kind, self.history, self.stop_ev = cluster, kind, history, stop
        self.faults = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            if self.kind == "none":
                return
            if self.stop_ev.wait(CYCLE_S / 2):
                return
            while True:
                self._one_fault()
                if self.stop_ev.wait(CYCLE_S - FAULT_S):
                    return
        except BaseException as e:          # reported by the runner
            self.error = e

    def _one_fault(self) -> None:
        b = self.cluster.target()
        what = f"{self.kind} {b.name}:{b.port}"
        self.history.record("info", "start", what)
        if self.kind == "kill":
            b.kill()
            time.sleep(FAULT_S)
            b.start()
        else:
            os.killpg(b.proc.p.pid, signal.SIGSTOP)
            time.sleep(FAULT_S)
            os.killpg(b.proc.p.pid, signal.SIGCONT)
        self.history.record("info", "stop", what)
        self.faults += 1


async def produce(ns_addr: str, history: HistoryWriter, deadline: float, name: str) -> None:
    producer = Producer(f"chaos_{name}", ns_addr, send_timeout_s=2.0, retry_times_when_send_failed=0,
                        fault_isolation_s=1.0, route_refresh_interval_s=1.0)
    await producer.start()
    try:
        n = 0
        while time.monotonic() < deadline:
            value = f"{name}-{n}"
            n += 1
            history.record("invoke", "send", value)
            try:
                r = await producer.send(Message(TOPIC, value.encode()))
            except MQBrokerError as e:
                kind = "fail" if e.code in NOT_STORED else "info"
                history.record(kind, "send", value, code=e.code, error=str(e)[:200])
                await asyncio.sleep(0.05)
                continue
            except (MQClientError, OSError, asyncio.TimeoutError) as e:
                history.record("info", "send", value, error=f"{type(e).__name__}: {e}"[:200])
                await asyncio.sleep(0.05)
                continue
            history.record("ok", "send", value, queue=f"{r.queue.broker_name}@{r.queue.queue_id}",
                           offset=r.queue_offset)
    finally:
        await producer.shutdown()


async def drain(ns_addr: str, history: HistoryWriter) -> int:
    """Reads every queue of the topic from its start to its end; returns the messages read."""
    consumer = PullConsumer("chaos_drain", ns_addr)
    await consumer.start()
    read = 0
    try:
        for mq in await consumer.fetch_queues(TOPIC):
            offset = 0
            while True:
                r = await consumer.pull(mq, offset, 32, timeout_s=10)
                if r.status is not PullStatus.FOUND:
                    if r.status is PullStatus.OFFSET_ILLEGAL or r.next_begin_offset > offset:
                        offset = max(offset, r.next_begin_offset)
                        if offset < r.max_offset:
                            continue
                    break
                for m in r.messages:
                    history.record("ok", "read", m.body.decode(), queue=f"{mq.broker_name}@{mq.queue_id}",
                                   offset=m.queue_offset)
                    read += 1
                offset = r.next_begin_offset
    finally:
        await consumer.shutdown()
    return read


def _create_topic(cluster: Cluster) -> None:
    from mq.cli import admin
    with open(os.devnull, "w") as quiet:
        out, sys.stdout = sys.stdout, quiet
        try:
            rc = admin.main(["updateTopic", "-n", cluster.ns.addr, "-c", "ChaosCluster", "-t", TOPIC,
                             "-r", str(QUEUES), "-w", str(QUEUES)])
        finally:
            sys.stdout = out
    if rc != 0:
        raise RuntimeError(f"mqadmin updateTopic failed ({rc})")


def run_cell(mode: str, nemesis: str, seconds: float, directory: str, producers: int = 2) -> dict:
    """One cell: returns the checker's summary plus the cell's own fields."""
    assert mode in MODES and nemesis in NEMESES, (mode, nemesis)
    hist_dir = os.path.join(directory, "history")
    cluster = Cluster(mode, os.path.join(directory, "cluster"))
    try:
        _create_topic(cluster)
        wait_for(lambda: _routed(cluster.ns.addr), 30, 0.1, "the topic's route")
        stop = threading.Event()
        nem = Nemesis(cluster, nemesis, HistoryWriter(hist_dir, "nemesis"), stop)
        writers = [HistoryWriter(hist_dir, f"p{i}") for i in range(producers)]
        deadline = time.monotonic() + seconds

        async def workload():
            await asyncio.gather(*(produce(cluster.ns.addr, w, deadline, f"p{i}") for i, w in enumerate(writers)))

        nem.start()
        mq_loop.run(workload())
        stop.set()
        nem.join(FAULT_S + HEAL_S)
        if nem.error is not None:
            raise RuntimeError(f"the nemesis failed: {nem.error!r}")
        for b in ([cluster.broker] if cluster.group is None else list(cluster.group.brokers.values())):
            if b.proc.p.poll() is None:
                os.killpg(b.proc.p.pid, signal.SIGCONT)
        cluster.target()                              # healed: a broker (leader) serves again
        reader = HistoryWriter(hist_dir, "drain")
        mq_loop.run(asyncio.wait_for(drain(cluster.ns.addr, reader), 120))
        for w in writers + [reader, nem.history]:
            w.close()
    finally:
        cluster.close()
    verdict = check(load(hist_dir))
    return {"mode": mode, "nemesis": nemesis, "seconds": seconds, "faults": nem.faults, **verdict.summary()}


def _routed(ns_addr: str) -> bool:
    from mq.client import AdminClient

    async def ask():
        async with AdminClient(ns_addr, timeout_s=2.0) as admin:
            try:
                route = await admin.topic_route(TOPIC)
            except MQClientError:
                return False
            return any(bd.broker_addrs.get(0) for bd in route.broker_datas)
    return mq_loop.run(ask())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="mqchaos", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run one cell of the fault matrix")
    r.add_argument("--mode", choices=MODES, required=True)
    r.add_argument("--nemesis", choices=NEMESES, required=True)
    r.add_argument("--seconds", type=float, default=20.0, help="how long the producers run (default 20)")
    r.add_argument("--producers", type=int, default=2, help="producer connections (default 2)")
    r.add_argument("--dir", help="where the cluster and the history go (default: a temporary directory, removed)")
    r.add_argument("--json", action="store_true", help="print the verdict as one JSON object")
    args = p.parse_args(argv)
    if not 1 <= args.seconds <= 3600 or not 1 <= args.producers <= 64:
        p.error("--seconds must be in [1, 3600] and --producers in [1, 64]")
    if args.dir:
        os.makedirs(args.dir, exist_ok=True)
        result = run_cell(args.mode, args.nemesis, args.seconds, args.dir, args.producers)
    else:
        with tempfile.TemporaryDirectory(prefix="mqchaos-") as d:
            result = run_cell(args.mode, args.nemesis, args.seconds, d, args.producers)
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{result['mode']:8s} {result['nemesis']:6s} faults {result['faults']}: acked {result['acked']} "
              f"of {result['sends']} sends ({result['failed']} refused, {result['unknown']} unknown), "
              f"read {result['read']}; lost {result['lost']}, unexpected {result['unexpected']}, "
              f"duplicated {result['duplicated']}, reordered {result['reordered']}; "
              f"max unavailable {result['max_unavailable_s']} s; recovery {result['recovery_s']}; "
              f"{'OK' if result['valid'] else 'PROMISE BROKEN'}")
    return 0 if result["valid"] else 1


if __name__ == "__main__":
    sys.exit(main())
