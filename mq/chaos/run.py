"""mqchaos: one cell of the fault matrix - a cluster of real processes on loopback, producers
recording every operation, a nemesis, a final drain of every queue, and the checker's verdict
(mq.chaos.history).

    mqchaos run --mode MODE --nemesis NEMESIS --seconds N [--dir DIR] [--producers P] [--workload W] [--json]

Modes (the broker configurations RELIABILITY.md makes promises for):
    async                   one broker, ASYNC_FLUSH
    sync                    one broker, SYNC_FLUSH
    async_master            ASYNC_MASTER + SLAVE, ASYNC_FLUSH
    sync_master             SYNC_MASTER + SLAVE, ASYNC_FLUSH
    sync_master_sync_flush  SYNC_MASTER + SLAVE, SYNC_FLUSH
    dledger                 a DLedger group of 3 brokers
The slave (and every DLedger peer) reaches its master (peers) through a FaultProxy, except
under the real-network nemeses (below), which put every process on a host of its own.
Nemeses, each fault lasting FAULT_S and repeated every CYCLE_S while the run lasts (the producers
go on RECOVERY_GRACE_S after the last fault ended, so its recovery is inside the run); the target
is the broker, the master or the current DLedger leader:
    none        no fault (the workload and the checker alone)
    kill        kill -9 of every process of the target, then a restart on the same store
    pause       SIGSTOP of every process of the target, then SIGCONT
    partition   the target cut off from its slave / peers (proxies black-hole), then healed;
                master/slave and DLedger modes only
    namesrv     kill -9 of the name server, then a restart on the same port
    powerloss   kill -9 of the target, then what it had not flushed is dropped (CommitLog bytes
                past the flushed position its control block recorded zeroed, ConsumeQueue
                entries pointing there zeroed; DLedger: its data and index files), then a restart
    diskfull    the target's store is a tmpfs of its own (mounted for the run: needs root) with
                1 MiB CommitLog files; a file takes all its free space, then goes (DLedger: the
                whole group's stores share that disk, so every member is full at once)
    clock       the target's wall clock (CLOCK_REALTIME, for it alone: an LD_PRELOAD shim,
                mq/chaos/clock.py) jumps CLOCK_JUMP_S ahead, or behind on every other fault,
                then back; monotonic clocks do not move, as with an NTP step
  byte-level (mq/chaos/damage.py; every other fault hits the slave or a DLedger follower
  instead of the master or leader, where there is one):
    corrupt     one byte of a workload record's body flipped in the newest data file: with the
                broker stopped cleanly (then restarted: its validation must find it), or under
                the running broker (its read check must never serve it), in turn
    truncate    kill -9, then the newest data file cut short in the middle of a record, restart
    cqloss      a clean stop or a kill -9 in turn, then one queue's ConsumeQueue directory
                removed, restart (rebuilt from the CommitLog; no queue offset handed out twice)
    hostile     for the whole run, a client per broker sending malformed requests pipelined
                between each other and garbage frames (mq/chaos/hostile.py); none may be stored
  real networks (mq.hosts: every broker, the name server and the clients - this process - in
  network namespaces of their own, 198.18.0.x; the kernel drops the packets; needs root):
    hostcut     a host's link down: the DLedger leader, or the slave and the master in turn,
                cut off from everything (clients and name server too)
    oneway      one-way loss: what the leader sends its followers is lost while theirs reach
                it (master/slave: master->slave, then slave->master, in turn)
    split       a majority/minority split of the members: the leader alone, or a follower
                alone, in turn (master/slave: master | slave); clients and name server see all
    bridge      the members in two halves that see one member (the bridge) but not each other
                (DLedger; the leader in a half, or the bridge, in turn)
    ring        every member sees its two neighbours in a ring only: overlapping majorities
                (DLedger; the group has RING_MEMBERS members for it)
Promises (RELIABILITY.md): no acknowledged message lost, except power loss on ASYNC_FLUSH
without a synchronous slave, where only a suffix of what was acknowledged before the fault may
go (never a hole); in every cell nothing unexpected, duplicated or reordered.  Byte-level cells:
no damaged message ever served, no queue offset used twice, no acknowledgement carrying another
message's place; a damaged message may be missing, and without a replica to give it back (one
broker, or an ASYNC_MASTER's unreplicated tail) so may what followed it in the damaged file
(recovery truncates at the first damaged record); nothing else.  A broken promise makes the run
exit 1.

The producers use mq.client with no retries (one attempt per recorded invoke, so a duplicate
in the history is the broker's, not a retry's); a send answered with a code that says nothing
was stored is a `fail`, a timeout or any other error an `info` (unknown outcome).

Workloads: `plain` (the default) sends as above; `tx` sends every message in a transaction
(mq.client.TransactionProducer, one producer group for all producers, so any of them answers the
broker's checks): value n is committed at once when n % 3 == 0, rolled back when n % 3 == 1, and
left unknown otherwise, which the checker then commits when n is even and rolls back when odd
(a function of the value, so every producer answers alike).  A committed transaction is an `ok`
without place, a rolled-back one a `fail` (mq.chaos.history); before the drain a producer of the
group stays connected until every committed one is readable (TX_RESOLVE_S at most), so halves
left pending by a fault get checked.  The promises: nothing committed lost, nothing rolled back
visible, nothing committed twice.  `grpc` sends through the brokers' gRPC endpoints as a RocketMQ
5.x producer does (mq.gateway; every broker serves one): QueryRoute through any endpoint that
answers, SendMessage to the endpoint of the master (broker id 0) it names, route asked again after
any failure; an answered SendMessage OK is an `ok` (without place: the 5.x answer has no queue
id), anything else `info` (a 5.x Status cannot say "not stored" for sure).  Beside them a 5.x
consumer (group chaos_c5) pops what they send, during the faults and after them, as a
SimpleConsumer does: ReceiveMessage from the masters' endpoints, then AckMessage of the batch;
after the producers it goes on (GRPC_REST_S at most) until every acknowledged send was delivered
to it.  Its promises (POP's): every acknowledged send delivered, nothing delivered that was not
sent, and nothing delivered again once its ack was answered OK (what was not acked may come
again)."""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import glob
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import zlib

from mq import loop as mq_loop
from mq.client import Message, MQBrokerError, MQClientError, Producer, PullConsumer, TransactionProducer
from mq.client.message import PullStatus
from mq.proxy import FaultProxy
from mq.cluster import Broker, DLedgerGroup, NameServer, free_port, port_open, stop_group, wait_for
from mq.hosts import Hosts, inside
from mq.store import control as C
from mq.store.commitlog import list_files
from mq.store.control import ControlBlock
from mq.wire.consumequeue import CQ_ENTRY_SIZE
from mq.wire.dledger import INDEX_UNIT_SIZE as DL_INDEX_UNIT_SIZE
from mq.wire.filenames import offset_file_path

from . import damage
from .clock import ClockShift
from .history import HistoryWriter, check, load
from .hostile import HostileClient

MODES = ("async", "sync", "async_master", "sync_master", "sync_master_sync_flush", "dledger")
NEMESES = ("none", "kill", "pause", "partition", "namesrv", "powerloss", "diskfull", "clock",
           "corrupt", "truncate", "cqloss", "hostile")
BYTE_LEVEL = ("corrupt", "truncate", "cqloss")
HOST_NEMESES = ("hostcut", "oneway", "split", "bridge", "ring")
NEMESES = NEMESES + HOST_NEMESES
RING_MEMBERS = 5        # a ring of overlapping majorities needs more than 3 members
CLOCK_JUMP_S = 600      # the clock nemesis's jump: past the 120 s client and channel expiries
DISK_BYTES = 96 * 1024 * 1024           # the diskfull nemesis's tmpfs
DISK_COMMITLOG_FILE_BYTES = 1024 * 1024  # files roll every ~1k messages there, so a full disk bites at once
# the store options of a broker on that disk: small files, and a message index sized to it (the default
# index file takes 20 MB of slots at once; three DLedger members' would be most of the disk)
SMALL_DISK_STORE = {"mappedFileSizeCommitLog": DISK_COMMITLOG_FILE_BYTES, "maxHashSlotNum": 65536,
                    "maxIndexNum": 262144}
MASTER_ROLES = {"async_master": ("ASYNC_MASTER", "ASYNC_FLUSH"), "sync_master": ("SYNC_MASTER", "ASYNC_FLUSH"),
                "sync_master_sync_flush": ("SYNC_MASTER", "SYNC_FLUSH")}
# cells that cannot be run: no slave or peer to cut off
NOT_APPLICABLE = {("async", "partition"), ("sync", "partition")} \
    | {(m, n) for m in ("async", "sync") for n in HOST_NEMESES} \
    | {(m, n) for m in MASTER_ROLES for n in ("bridge", "ring")}
# cells whose promise allows losing a suffix of what was acknowledged before the fault
SUFFIX_LOSS_ALLOWED = {("async", "powerloss"), ("async_master", "powerloss")}
# modes where what followed a damaged record in the damaged file may go with it (no replica
# holds it for sure: recovery truncates at the first damaged record)
CUT_WITH_DAMAGE_ALLOWED = {"async", "sync", "async_master"}
TOPIC = "ChaosTopic"
QUEUES = 4
FAULT_S = 2.0          # how long a fault lasts
CYCLE_S = 6.0          # a fault starts every CYCLE_S (the first after CYCLE_S / 2)
HEAL_S = 30.0          # after the run: how long the cluster may take to serve again before the drain
RECOVERY_GRACE_S = 3.0  # the producers keep going this long after the last fault ended
# codes that say the message was not stored (anything else that is not SUCCESS may have been)
NOT_STORED = {13, 14, 16, 17, 23, 26, 29}
WORKLOADS = ("plain", "tx", "grpc")
GRPC_GROUP = "chaos_c5"     # the grpc workload's 5.x consumer group
GRPC_INVISIBLE_MS = 10_000  # its receives' invisible time (the gateway's least)
GRPC_REST_S = 60.0          # after the faults: how long it may take to consume every acked send
ROUTE_REFRESH_S = 1.0       # it asks for the route again this often (a new leader's endpoint)
TX_GROUP = "chaos_tx"
# the brokers' transaction checks in a tx cell: quick, and never giving up within a run
TX_BROKER_OPTS = {"transactionTimeOut": 1000, "transactionCheckInterval": 500, "transactionCheckMax": 1000}
TX_RESOLVE_S = 60.0     # after the faults: how long pending transactions may take to be checked


class Cluster:
    """The processes of one mode, and the nemesis's handles on them."""

    def __init__(self, mode: str, workdir: str, small_disk: bool = False, clocks: bool = False,
                 extra_opts: dict | None = None, grpc: bool = False, hosts: bool = False, members: int = 3):
        """small_disk: the (master) broker's store on a tmpfs of its own (DISK_BYTES), with
        small CommitLog files, for the diskfull nemesis to fill.  clocks: every broker's wall
        clock can be shifted (self.clocks, by broker port) for the clock nemesis.  grpc: every
        broker serves the 5.x gRPC endpoint on a port of its own (grpc_endpoints()).  hosts:
        every process on a host of its own (mq.hosts: "ns", "client" - where the caller runs its
        clients, with mq.hosts.inside - and one per broker: "master"/"slave" or the DLedger ids);
        members: the DLedger group's size."""
        self.mode = mode
        self.hosts: Hosts | None = None
        if hosts:
            assert not (small_disk or clocks or grpc), "real-network cells run the plain and tx workloads only"
            brokers = [f"n{i}" for i in range(members)] if mode == "dledger" else ["master", "slave"]
            self.hosts = Hosts(["ns", "client"] + brokers)
        try:
            self.ns = NameServer(workdir, host=self.hosts["ns"] if self.hosts else None)
        except BaseException:
            if self.hosts is not None:
                self.hosts.close()
            raise
        self.clocks: dict[int, ClockShift] = {}
        self._clock_by_name: dict[str, ClockShift] = {}

        def env(name: str) -> dict | None:
            if not clocks:
                return None
            shift = self._clock_by_name[name] = ClockShift(workdir, name)
            return shift.env()
        # registerNameServerPeriod: the shortest RocketMQ allows (10 s, not 30 s), so a name server
        # restarted by the namesrv nemesis knows the brokers again within 10 s
        opts = {"brokerClusterName": "ChaosCluster", "sendMessageThreadPoolNums": 1,
                "registerNameServerPeriod": 10000, **(extra_opts or {})}
        grpc_port = (lambda: {"grpcServerPort": free_port()}) if grpc else (lambda: {})
        self.group: DLedgerGroup | None = None
        self.broker: Broker | None = None
        self.slave: Broker | None = None
        self.proxy: FaultProxy | None = None
        self.disk: str | None = None
        master_opts = {}
        if small_disk:
            self.disk = os.path.join(workdir, "small-disk")
            os.makedirs(self.disk, exist_ok=True)
            subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_BYTES}", "tmpfs", self.disk], check=True,
                           capture_output=True, timeout=30)
            master_opts = {"storePathRootDir": os.path.join(self.disk, "store"), **SMALL_DISK_STORE}
        try:
            if mode == "dledger":
                # diskfull: the whole group's stores on the one small disk (all members fill at once)
                on_hosts = {f"n{i}": self.hosts[f"n{i}"] for i in range(members)} if self.hosts else None
                self.group = DLedgerGroup(self.disk or workdir, self.ns.addr, name="ChaosRaft", n=members,
                                          proxied=not on_hosts, hosts=on_hosts,
                                          env_for=lambda i: env(f"raft-{i}"), options_for=lambda i: grpc_port(),
                                          **opts,
                                          **(SMALL_DISK_STORE if small_disk else {}))
                for i, b in self.group.brokers.items():
                    if clocks:
                        self.clocks[b.port] = self._clock_by_name[f"raft-{i}"]
                self.group.wait_leader(60)
            elif mode in MASTER_ROLES:
                role, flush = MASTER_ROLES[mode]
                on = (lambda name: self.hosts[name]) if self.hosts else (lambda name: None)
                self.broker = Broker(workdir, self.ns.addr, name="chaos-a", brokerRole=role, flushDiskType=flush,
                                     env=env("master"), host=on("master"), **opts, **master_opts, **grpc_port())
                if self.hosts is None:
                    self.proxy = FaultProxy("127.0.0.1", self.broker.port + 1)    # the master's HA port
                ha = f"127.0.0.1:{self.proxy.port}" if self.proxy else f"{self.broker.ip}:{self.broker.port + 1}"
                self.slave = Broker(workdir, self.ns.addr, name="chaos-a", brokerRole="SLAVE", brokerId=1,
                                    flushDiskType=flush, haMasterAddress=ha, host=on("slave"),
                                    env=env("slave"), **opts, **grpc_port())
            else:
                self.broker = Broker(workdir, self.ns.addr, name="chaos-a", **opts, **master_opts, env=env("broker"),
                                     flushDiskType="SYNC_FLUSH" if mode == "sync" else "ASYNC_FLUSH",
                                     **grpc_port())
            if clocks and self.group is None:
                for b, name in ((self.broker, "master" if self.slave else "broker"), (self.slave, "slave")):
                    if b is not None:
                        self.clocks[b.port] = self._clock_by_name[name]
        except BaseException:
            self.close()
            raise

    def grpc_endpoints(self) -> list[str]:
        """The brokers' gRPC endpoints ("127.0.0.1:port"), for the grpc workload."""
        return [f"127.0.0.1:{b.options['grpcServerPort']}" for b in self.brokers() if "grpcServerPort" in b.options]

    def brokers(self) -> list[Broker]:
        if self.group is not None:
            return list(self.group.brokers.values())
        return [b for b in (self.broker, self.slave) if b is not None]

    def target(self) -> Broker:
        """The broker the nemesis hits: the only one, the master, or the DLedger leader now."""
        if self.group is None:
            return self.broker
        return self.group.brokers[self.group.wait_leader(HEAL_S)]

    def replica(self) -> Broker | None:
        """The slave, or a DLedger follower now; None for a lone broker."""
        if self.group is not None:
            leader = self.group.wait_leader(HEAL_S)
            return next(b for i, b in sorted(self.group.brokers.items()) if i != leader)
        return self.slave

    def cut(self, target: Broker) -> None:
        if self.group is not None:
            self.group.isolate(next(i for i, b in self.group.brokers.items() if b is target))
        else:
            self.proxy.blackhole()

    def heal(self) -> None:
        if self.hosts is not None:
            self.hosts.heal()
        elif self.group is not None:
            self.group.heal()
        elif self.proxy is not None:
            self.proxy.heal()

    def host_fault(self, kind: str, n: int) -> str:
        """Applies real-network fault `kind` (HOST_NEMESES; the n-th fault of the run picks
        which variant); what it did, for the history.  Cluster.heal() ends it."""
        h = self.hosts
        if self.group is None:                                # master/slave
            if kind == "hostcut":
                victim = "slave" if n % 2 == 0 else "master"
                h.cut(victim)
                return f"hostcut {victim}"
            if kind == "oneway":
                src, dst = ("master", "slave") if n % 2 == 0 else ("slave", "master")
                h.drop(src, dst)
                return f"oneway {src}->{dst} lost"
            h.split(["master"], ["slave"])
            return "split master | slave"
        leader = self.group.wait_leader(HEAL_S)
        others = [i for i in self.group.ids if i != leader]
        if kind == "hostcut":
            h.cut(leader)
            return f"hostcut {leader} (leader)"
        if kind == "oneway":
            for o in others:
                h.drop(leader, o)
            return f"oneway {leader} (leader)->{','.join(others)} lost"
        if kind == "split":
            alone = [leader] if n % 2 == 0 else others[:1]
            rest = [i for i in self.group.ids if i not in alone]
            h.split(alone, rest)
            return f"split {','.join(alone)} | {','.join(rest)} (leader {leader})"
        if kind == "bridge":
            bridge = others[0] if n % 2 == 0 else leader
            rest = [i for i in self.group.ids if i != bridge]
            half_a, half_b = rest[:len(rest) // 2], rest[len(rest) // 2:]
            h.split(half_a, half_b)
            return f"bridge {bridge} between {','.join(half_a)} | {','.join(half_b)} (leader {leader})"
        # ring: a shuffled order, every member reaching its two neighbours only
        order = list(self.group.ids)
        random.Random(n).shuffle(order)
        k = len(order)
        for i, a in enumerate(order):
            for j, b in enumerate(order):
                if a != b and (i - j) % k not in (1, k - 1):
                    h.drop(a, b)
        return f"ring {'-'.join(order)} (leader {leader})"

    def close(self) -> None:
        if self.group is not None:
            self.group.close()
        for b in (self.slave, self.broker):
            if b is not None and b.proc is not None and b.proc.p.poll() is None:
                os.killpg(b.proc.p.pid, signal.SIGCONT)
                b.stop()
        if self.proxy is not None:
            self.proxy.close()
        if self.ns.proc.p.poll() is None:
            self.ns.stop()
        if self.disk is not None:
            subprocess.run(["umount", "-l", self.disk], capture_output=True, timeout=30)
        for shift in self._clock_by_name.values():
            shift.close()
        if self.hosts is not None:
            self.hosts.close()

    def fill_disk(self) -> str:
        """Takes every free byte of the small disk with a file; returns its path."""
        path = os.path.join(self.disk, "filler")
        with open(path, "wb") as f:
            chunk = bytes(1 << 20)
            try:
                while True:
                    f.write(chunk)
                    f.flush()
            except OSError:             # ENOSPC: full
                pass
        return path


def kill_with_power_loss(broker) -> tuple[int, int]:
    """kill -9 of `broker` (mq.cluster.Broker), then the power loss of its store (drop_unflushed).
    Its control block is attached before the kill: a handle holds the segment, so no sweep of
    dead brokers' segments (Broker.kill's, or any mqbroker's start) takes it before it is read."""
    ctl = ControlBlock(broker.dir)
    try:
        broker.kill()
        return drop_unflushed(broker.dir, ctl)
    finally:
        ctl.close()


def drop_unflushed(store_root: str, ctl: ControlBlock) -> tuple[int, int]:
    """Power loss for a killed broker's store: the log bytes past the flushed position its control
    block `ctl` (attached before the kill) recorded are zeroed and later files removed,
    ConsumeQueue entries pointing at or past it zeroed, and in DLedger mode the index units past
    the flushed index zeroed too.  Returns (flushed position, log bytes dropped)."""
    flushed, written = ctl.get(C.POS_FLUSHED), ctl.get(C.POS_WRITE)
    flushed_index = ctl.get(C.POS_DL_FLUSHED_INDEX)
    dledger = sorted(glob.glob(os.path.join(store_root, "dledger-*")))
    log_dir = os.path.join(dledger[0], "data") if dledger else os.path.join(store_root, "commitlog")
    for start in list_files(log_dir):
        path = offset_file_path(log_dir, start)
        size = os.path.getsize(path)
        if start >= flushed and start > 0:
            os.remove(path)
        elif start + size > flushed:
            with open(path, "r+b") as f:
                f.seek(flushed - start)
                f.write(bytes(size - (flushed - start)))
    if dledger:
        _zero_from(os.path.join(dledger[0], "index"), flushed_index * DL_INDEX_UNIT_SIZE)
    cq_root = os.path.join(store_root, "consumequeue")
    for dirpath, _dirs, files in os.walk(cq_root):
        for name in files:
            path = os.path.join(dirpath, name)
            with open(path, "r+b") as f:
                data = bytearray(f.read())
                for at in range(0, len(data) - CQ_ENTRY_SIZE + 1, CQ_ENTRY_SIZE):
                    if int.from_bytes(data[at:at + 8], "big") >= flushed and any(data[at:at + CQ_ENTRY_SIZE]):
                        data[at:at + CQ_ENTRY_SIZE] = bytes(CQ_ENTRY_SIZE)
                f.seek(0)
                f.write(data)
    return flushed, max(0, written - flushed)


def _zero_from(directory: str, from_byte: int) -> None:
    """Zeroes a file list (files named by start offset) from logical byte from_byte on."""
    for start in list_files(directory):
        path = offset_file_path(directory, start)
        size = os.path.getsize(path)
        if start + size > from_byte:
            at = max(0, from_byte - start)
            with open(path, "r+b") as f:
                f.seek(at)
                f.write(bytes(size - at))


class Nemesis(threading.Thread):
    """Starts a fault every CYCLE_S and ends it FAULT_S later, recording both."""

    def __init__(self, cluster: Cluster, kind: str, history: HistoryWriter, deadline: float):
        super().__init__(name="nemesis", daemon=True)
        self.cluster, self.kind, self.history, self.deadline = cluster, kind, history, deadline
        self.faults = 0
        self.rng = random.Random(0x6d71)      # which record, which byte: reproducible per cell
        self.error: BaseException | None = None
        self.done = threading.Event()       # no fault is or will be under way
        self.last_end = 0.0                 # monotonic time the last fault ended

    def run(self) -> None:
        """Faults every CYCLE_S until the deadline; none starts after it."""
        try:
            if self.kind not in ("none", "hostile"):    # hostile: clients for the whole run instead
                time.sleep(CYCLE_S / 2)
                while time.monotonic() < self.deadline:
                    self._one_fault()
                    self.last_end = time.monotonic()
                    time.sleep(max(0.0, min(CYCLE_S - FAULT_S, self.deadline - time.monotonic())))
        except BaseException as e:          # reported by the runner
            self.error = e
        finally:
            self.done.set()

    def settled(self) -> bool:
        """May the producers stop: no fault under way, and RECOVERY_GRACE_S since the last one
        ended (so every fault's recovery lies inside the run)?"""
        return self.done.is_set() and time.monotonic() - self.last_end >= RECOVERY_GRACE_S

    def _one_fault(self) -> None:
        """Applies the fault, then records its start: from that instant it is in effect (a
        process is dead, stopped or cut off), so every send acknowledged before the record went
        to the store as it was before the fault."""
        c = self.cluster
        if self.kind == "namesrv":
            what = f"kill -9 name server :{c.ns.port}"
            c.ns.kill()
            self.history.record("info", "start", what)
            time.sleep(FAULT_S)
            c.ns.start()
        else:
            b = c.target()
            what = f"{self.kind} {b.name}:{b.port}"
            if self.kind in ("kill", "powerloss"):
                if self.kind == "powerloss":
                    flushed, dropped = kill_with_power_loss(b)
                    what += f" (dropped {dropped} bytes past {flushed})"
                else:
                    b.kill()
                self.history.record("info", "start", what)
                time.sleep(FAULT_S)
                b.start()
            elif self.kind == "diskfull":
                filler = c.fill_disk()
                self.history.record("info", "start", what)
                time.sleep(FAULT_S)
                os.remove(filler)
            elif self.kind == "clock":
                shift = c.clocks[b.port]
                jump_ms = CLOCK_JUMP_S * 1000 * (1 if self.faults % 2 == 0 else -1)
                what += f" ({jump_ms // 1000:+d} s)"
                shift.set(jump_ms)
                self.history.record("info", "start", what)
                time.sleep(FAULT_S)
                shift.set(0)
            elif self.kind in HOST_NEMESES:
                what = c.host_fault(self.kind, self.faults)
                self.history.record("info", "start", what)
                time.sleep(FAULT_S)
                c.heal()
            elif self.kind == "partition":
                c.cut(b)
                self.history.record("info", "start", what)
                time.sleep(FAULT_S)
                c.heal()
            elif self.kind in BYTE_LEVEL:
                if self.faults % 2 and c.replica() is not None:
                    b = c.replica()
                    what = f"{self.kind} {b.name}:{b.port} (replica)"
                what += self._damage(b, self.kind, stopped=self.kind != "corrupt" or (self.faults // 2) % 2 == 0)
            else:
                stop_group(b.proc.p.pid)          # returns once every thread is stopped
                self.history.record("info", "start", what)
                time.sleep(FAULT_S)
                os.killpg(b.proc.p.pid, signal.SIGCONT)
        self.history.record("info", "stop", what)
        self.faults += 1

    def _damage(self, b: Broker, kind: str, stopped: bool) -> str:
        """One byte-level fault on broker b; records what it damaged (f "damage": the record's
        value and place, so the checker can tell damaged from intact) and returns a note."""
        store = f"127.0.0.1:{b.port}"
        if stopped:
            if kind == "corrupt" or (kind == "cqloss" and self.faults % 4 < 2):
                b.stop()                          # a clean stop: the damage comes while it is down
            else:
                b.kill()
        if kind == "cqloss":
            lost = damage.drop_consume_queue(b.dir, TOPIC, self.rng)
            note = f": {lost or 'no queue yet'} removed"
        else:
            hit = (damage.flip_body_byte if kind == "corrupt" else damage.cut_mid_record)(b.dir, TOPIC, self.rng)
            if hit is None:
                note = ": no record to damage yet"
            else:
                self.history.record("info", "damage", hit.value, store=store, phy=hit.phy, how=hit.what,
                                    at=hit.at)
                note = f": {hit.what} of {hit.value!r} at {hit.phy}" + ("" if stopped else " (live)")
        self.history.record("info", "start", f"{kind} {b.name}:{b.port}{note}")
        time.sleep(FAULT_S)
        if stopped:
            b.start()
        return note


async def _produce(history: HistoryWriter, deadline: float, name: str, nemesis: "Nemesis", attempt) -> None:
    """Invokes `attempt(value)` for value name-0, name-1, ... until the deadline and until the
    nemesis has settled (bounded by HEAL_S more), recording each invoke and its outcome: what
    attempt returns (type, fields), `fail` for a refusal that stored nothing, `info` otherwise."""
    n = 0
    while time.monotonic() < deadline or (not nemesis.settled() and time.monotonic() < deadline + HEAL_S):
        value = f"{name}-{n}"
        n += 1
        history.record("invoke", "send", value)
        try:
            kind, fields = await attempt(value)
        except MQBrokerError as e:
            history.record("fail" if e.code in NOT_STORED else "info", "send", value, code=e.code,
                           error=str(e)[:200])
            await asyncio.sleep(0.05)
            continue
        except (MQClientError, OSError, asyncio.TimeoutError) as e:
            history.record("info", "send", value, error=f"{type(e).__name__}: {e}"[:200])
            await asyncio.sleep(0.05)
            continue
        history.record(kind, "send", value, **fields)


async def produce(ns_addr: str, history: HistoryWriter, deadline: float, name: str, nemesis: "Nemesis") -> None:
    """The plain workload's producer: one send per value, no retries."""
    producer = Producer(f"chaos_{name}", ns_addr, send_timeout_s=2.0, retry_times_when_send_failed=0,
                        fault_isolation_s=1.0, route_refresh_interval_s=1.0)
    await producer.start()

    async def send(value: str):
        r = await producer.send(Message(TOPIC, value.encode()))
        return "ok", {"queue": f"{r.queue.broker_name}@{r.queue.queue_id}", "offset": r.queue_offset,
                      "msgid": r.offset_msg_id}
    try:
        await _produce(history, deadline, name, nemesis, send)
    finally:
        await producer.shutdown()


class Grpc5:
    """What the grpc workload's clients share: a channel per gateway endpoint, unary and
    server-streaming calls of the 5.x service, and the masters' endpoints from QueryRoute asked
    of any endpoint that answers (a 5.x client's access point is any one of them)."""

    def __init__(self, endpoints: list[str], name: str):
        import uuid

        import grpc
        self.grpc = grpc
        self.endpoints = endpoints
        self.metadata = (("x-mq-client-id", f"chaos@{name}@{uuid.uuid4().hex[:8]}"),)
        self.channels = {ep: grpc.aio.insecure_channel(ep) for ep in endpoints}

    def unary(self, ep: str, rpc: str):
        from mq.wire.grpc5 import METHODS, SERVICE, msg
        return self.channels[ep].unary_unary(f"/{SERVICE}/{rpc}", request_serializer=lambda m: m.SerializeToString(),
                                             response_deserializer=msg(METHODS[rpc][1]).FromString)

    def stream(self, ep: str, rpc: str):
        from mq.wire.grpc5 import METHODS, SERVICE, msg
        return self.channels[ep].unary_stream(f"/{SERVICE}/{rpc}", request_serializer=lambda m: m.SerializeToString(),
                                              response_deserializer=msg(METHODS[rpc][1]).FromString)

    async def masters(self) -> list[str]:
        """The endpoints of the brokers with id 0 holding TOPIC; OSError when none answers."""
        from mq.wire.grpc5 import Code, msg
        req = msg("QueryRouteRequest")()
        req.topic.name = TOPIC
        for ep in self.endpoints:
            try:
                r = await self.unary(ep, "QueryRoute")(req, metadata=self.metadata, timeout=2)
            except self.grpc.aio.AioRpcError:
                continue
            found = {f"{a.host}:{a.port}" for q in (r.message_queues if r.status.code == Code.OK else ())
                     if q.broker.id == 0 for a in q.broker.endpoints.addresses[:1]}
            found &= set(self.channels)
            if found:
                return sorted(found)
        raise OSError("no gRPC endpoint answered QueryRoute with a master")

    async def close(self) -> None:
        for ch in self.channels.values():
            await ch.close()


async def produce_grpc(endpoints: list[str], history: HistoryWriter, deadline: float, name: str,
                       nemesis: "Nemesis", acked: set) -> None:
    """The grpc workload's producer (the module docstring): one SendMessage per value, no
    retries; adds the values answered OK to `acked` (what the 5.x consumer must get)."""
    import uuid

    from mq.wire.grpc5 import Code, MessageType, msg
    g = Grpc5(endpoints, name)
    target: list[str | None] = [None]                 # the master's endpoint, from the last route

    async def send(value: str):
        if target[0] is None:
            target[0] = (await g.masters())[0]
        m = msg("Message")(body=value.encode())
        m.topic.name = TOPIC
        m.system_properties.message_id = uuid.uuid4().hex.upper()
        m.system_properties.message_type = MessageType.NORMAL
        try:
            r = await g.unary(target[0], "SendMessage")(msg("SendMessageRequest")(messages=[m]),
                                                       metadata=g.metadata, timeout=3)
        except g.grpc.aio.AioRpcError as e:
            target[0] = None
            raise OSError(f"SendMessage: {e.code().name} {e.details()}") from None
        if r.status.code != Code.OK:
            target[0] = None
            raise MQClientError(f"SendMessage answered {Code(r.status.code).name}: {r.status.message}")
        acked.add(value)
        return "ok", {"msgid5": m.system_properties.message_id}
    try:
        await _produce(history, deadline, name, nemesis, send)
    finally:
        await g.close()


async def consume_grpc(endpoints: list[str], history: HistoryWriter, acked: set, producing: asyncio.Event,
                       rest_s: float) -> None:
    """The grpc workload's consumer (the module docstring), group GRPC_GROUP: ReceiveMessage from
    every master's endpoint (the route asked again after a failure and every ROUTE_REFRESH_S:
    a new leader's endpoint), then AckMessage of the batch; records each delivery (`info receive`, with
    its attempt) and each ack answered OK (`ok consume`).  Runs while `producing` is clear, then
    up to rest_s more until every value in `acked` was delivered."""
    from mq.wire.grpc5 import Code, msg
    g = Grpc5(endpoints, "c5")
    delivered: set = set()
    targets: list[str] = []
    routed_at = 0.0
    rest_deadline: float | None = None
    try:
        while True:
            if producing.is_set():
                rest_deadline = rest_deadline or time.monotonic() + rest_s
                if acked <= delivered or time.monotonic() > rest_deadline:
                    return
            if not targets or time.monotonic() - routed_at > ROUTE_REFRESH_S:
                try:
                    targets, routed_at = await g.masters(), time.monotonic()
                except OSError:
                    await asyncio.sleep(0.2)
                    continue
            got_any = False
            for ep in targets:
                req = msg("ReceiveMessageRequest")(batch_size=32)
                req.group.name = GRPC_GROUP
                req.message_queue.topic.name = TOPIC
                req.filter_expression.expression = "*"
                req.invisible_duration.FromMilliseconds(GRPC_INVISIBLE_MS)
                req.long_polling_timeout.FromMilliseconds(1000)
                ack = msg("AckMessageRequest")()
                ack.group.name = GRPC_GROUP
                ack.topic.name = TOPIC
                values = []
                try:
                    async for r in g.stream(ep, "ReceiveMessage")(req, metadata=g.metadata, timeout=5):
                        if r.WhichOneof("content") == "message":
                            m = r.message
                            values.append(m.body.decode("utf-8", "replace"))
                            delivered.add(values[-1])
                            history.record("info", "receive", values[-1], endpoint=ep,
                                           attempt=m.system_properties.delivery_attempt)
                            ack.entries.add(message_id=m.system_properties.message_id,
                                            receipt_handle=m.system_properties.receipt_handle)
                    if values:
                        a = await g.unary(ep, "AckMessage")(ack, metadata=g.metadata, timeout=5)
                        for value, result in zip(values, a.entries):
                            if result.status.code == Code.OK:
                                history.record("ok", "consume", value)
                except g.grpc.aio.AioRpcError:
                    targets = []
                    await asyncio.sleep(0.2)
                    break
                got_any = got_any or bool(values)
            if not got_any:
                await asyncio.sleep(0.1)
    finally:
        await g.close()


def tx_decision(value: str) -> tuple[str, str]:
    """(what the local transaction says, what the producer finally wants) for a tx value
    "<name>-<n>" (the module docstring)."""
    n = int(value.rsplit("-", 1)[1])
    final = "COMMIT_MESSAGE" if n % 3 == 0 or (n % 3 == 2 and n % 2 == 0) else "ROLLBACK_MESSAGE"
    return ("COMMIT_MESSAGE", "ROLLBACK_MESSAGE", "UNKNOW")[n % 3], final


def tx_checker(msg) -> str:
    return tx_decision(msg.body.decode())[1]


async def produce_tx(ns_addr: str, history: HistoryWriter, deadline: float, name: str, nemesis: "Nemesis",
                     committed: set) -> None:
    """The tx workload's producer (the module docstring); adds the values it commits to `committed`.
    A half whose send failed is `info` when its transaction was to commit (the check may still
    commit it), `fail` when it was to roll back (never to be read)."""
    producer = TransactionProducer(TX_GROUP, ns_addr, checker=tx_checker, send_timeout_s=2.0,
                                   retry_times_when_send_failed=0, fault_isolation_s=1.0,
                                   route_refresh_interval_s=1.0, heartbeat_interval_s=1.0)
    await producer.start()

    async def send_in_transaction(value: str):
        local, final = tx_decision(value)
        try:
            await producer.send_in_transaction(Message(TOPIC, value.encode()), lambda m, a: local)
        except MQBrokerError as e:
            if final == "COMMIT_MESSAGE" or e.code in NOT_STORED:
                raise
            return "fail", {"code": e.code, "error": str(e)[:200]}
        except (MQClientError, OSError, asyncio.TimeoutError) as e:
            if final == "COMMIT_MESSAGE":
                raise
            return "fail", {"error": f"{type(e).__name__}: {e}"[:200]}
        if final == "COMMIT_MESSAGE":
            committed.add(value)
            return "ok", {"local": local}
        return "fail", {"local": local}
    try:
        await _produce(history, deadline, name, nemesis, send_in_transaction)
    finally:
        await producer.shutdown()


async def resolve_pending(ns_addr: str, committed: set, timeout_s: float = TX_RESOLVE_S) -> None:
    """A producer of the tx group stays connected (answering the brokers' checks) until every
    committed value is readable, or timeout_s; what is then still missing is the checker's to judge."""
    async with TransactionProducer(TX_GROUP, ns_addr, checker=tx_checker, route_refresh_interval_s=1.0,
                                   heartbeat_interval_s=1.0):
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            try:
                if committed <= await read_values(ns_addr):
                    return
            except (MQClientError, OSError, asyncio.TimeoutError):
                pass
            await asyncio.sleep(1.0)


async def read_values(ns_addr: str) -> set:
    """Every value readable in the topic (not recorded: the drain records what it reads)."""
    consumer = PullConsumer("chaos_resolve", ns_addr)
    await consumer.start()
    out = set()
    try:
        for mq in await consumer.fetch_queues(TOPIC):
            offset = 0
            while True:
                r = await consumer.pull(mq, offset, 32, timeout_s=10)
                if r.status is not PullStatus.FOUND:
                    if r.next_begin_offset > offset and r.next_begin_offset < r.max_offset:
                        offset = r.next_begin_offset
                        continue
                    break
                out.update(m.body.decode("utf-8", "replace") for m in r.messages)
                offset = r.next_begin_offset
    finally:
        await consumer.shutdown()
    return out


async def drain(ns_addr: str, history: HistoryWriter) -> int:
    """Reads every queue of the topic from its start to its end; returns the messages read."""
    consumer = PullConsumer("chaos_drain", ns_addr)
    await consumer.start()
    read = 0
    try:
        for mq in await consumer.fetch_queues(TOPIC):
            offset = 0
            first = await consumer.pull(mq, 0, 1, timeout_s=10)
            if first.min_offset > 0:         # retention deleted the queue's head (a full disk forces it)
                history.record("info", "expired", f"{mq.broker_name}@{mq.queue_id}",
                               queue=f"{mq.broker_name}@{mq.queue_id}", offset=first.min_offset)
            while True:
                r = await consumer.pull(mq, offset, 32, timeout_s=10)
                if r.status is not PullStatus.FOUND:
                    if r.status is PullStatus.OFFSET_ILLEGAL or r.next_begin_offset > offset:
                        offset = max(offset, r.next_begin_offset)
                        if offset < r.max_offset:
                            continue
                    break
                for m in r.messages:
                    history.record("ok", "read", m.body.decode("utf-8", "replace"),
                                   queue=f"{mq.broker_name}@{mq.queue_id}", offset=m.queue_offset,
                                   msgid=m.offset_msg_id, intact=zlib.crc32(m.body) & 0x7FFFFFFF == m.body_crc)
                    read += 1
                offset = r.next_begin_offset
    finally:
        await consumer.shutdown()
    return read


def _create_topic(cluster: Cluster) -> None:
    """The topic on the cluster's master(s), retried until one is registered (a DLedger leader
    registers as brokerId 0 a moment after it is elected)."""
    from mq.cli import admin

    def created() -> bool:
        with open(os.devnull, "w") as quiet:
            out, err, sys.stdout, sys.stderr = sys.stdout, sys.stderr, quiet, quiet
            try:
                return admin.main(["updateTopic", "-n", cluster.ns.addr, "-c", "ChaosCluster", "-t", TOPIC,
                                   "-r", str(QUEUES), "-w", str(QUEUES)]) == 0
            finally:
                sys.stdout, sys.stderr = out, err
    wait_for(created, 60, 0.5, "mqadmin updateTopic on the cluster's master")


def run_cell(mode: str, nemesis: str, seconds: float, directory: str, producers: int = 2,
             workload: str = "plain") -> dict:
    """One cell: returns the checker's summary plus the cell's own fields."""
    assert mode in MODES and nemesis in NEMESES and workload in WORKLOADS, (mode, nemesis, workload)
    if (mode, nemesis) in NOT_APPLICABLE:
        raise ValueError(f"the {nemesis} nemesis does not apply to mode {mode}")
    hist_dir = os.path.join(directory, "history")
    if nemesis in HOST_NEMESES and workload == "grpc":
        raise ValueError("the grpc workload does not run on hosts (its endpoints are on 127.0.0.1)")
    cluster = Cluster(mode, os.path.join(directory, "cluster"), small_disk=nemesis == "diskfull",
                      clocks=nemesis == "clock", extra_opts=TX_BROKER_OPTS if workload == "tx" else None,
                      grpc=workload == "grpc", hosts=nemesis in HOST_NEMESES,
                      members=RING_MEMBERS if nemesis == "ring" else 3)
    committed: set = set()
    acked5: set = set()                               # grpc: sends answered OK, for its consumer
    try:
        # on hosts, this process is the client host: every socket of the workload and the drain
        with inside(cluster.hosts["client"]) if cluster.hosts else contextlib.nullcontext():
            _create_topic(cluster)
            wait_for(lambda: _routed(cluster.ns.addr), 30, 0.1, "the topic's route")
            for ep in cluster.grpc_endpoints():
                wait_for(lambda: port_open(int(ep.rsplit(":", 1)[1])), 30, 0.1, f"the gRPC endpoint {ep}")
            deadline = time.monotonic() + seconds
            nem = Nemesis(cluster, nemesis, HistoryWriter(hist_dir, "nemesis"), deadline)
            writers = [HistoryWriter(hist_dir, f"p{i}") for i in range(producers)]
            consumer5 = HistoryWriter(hist_dir, "c5") if workload == "grpc" else None

            async def run_workload():
                if workload == "tx":
                    await asyncio.gather(*(produce_tx(cluster.ns.addr, w, deadline, f"p{i}", nem, committed)
                                           for i, w in enumerate(writers)))
                elif workload == "grpc":
                    produced = asyncio.Event()
                    consumer = asyncio.ensure_future(consume_grpc(cluster.grpc_endpoints(), consumer5, acked5, produced,
                                                                  GRPC_REST_S))
                    try:
                        await asyncio.gather(*(produce_grpc(cluster.grpc_endpoints(), w, deadline, f"p{i}", nem, acked5)
                                               for i, w in enumerate(writers)))
                    finally:
                        produced.set()
                    await consumer
                else:
                    await asyncio.gather(*(produce(cluster.ns.addr, w, deadline, f"p{i}", nem)
                                           for i, w in enumerate(writers)))

            hostiles = [HostileClient(b.port, TOPIC, seed=i) for i, b in enumerate(cluster.brokers())] \
                if nemesis == "hostile" else []
            for h in hostiles:
                h.start()
            nem.start()
            try:
                mq_loop.run(run_workload())
            finally:
                for h in hostiles:
                    h.stop()
                for h in hostiles:
                    h.join(10)
            nem.join(FAULT_S + HEAL_S)
            if nem.error is not None:
                raise RuntimeError(f"the nemesis failed: {nem.error!r}")
            cluster.heal()
            for b in cluster.brokers():
                if b.proc.p.poll() is None:
                    os.killpg(b.proc.p.pid, signal.SIGCONT)
            if cluster.ns.proc.p.poll() is not None:
                cluster.ns.start()
            cluster.target()                              # healed: a broker (leader) serves again
            wait_for(lambda: _routed(cluster.ns.addr), HEAL_S + 30, 0.2, "the topic's route after the faults")
            if workload == "tx":
                mq_loop.run(resolve_pending(cluster.ns.addr, committed))
            reader = HistoryWriter(hist_dir, "drain")
            mq_loop.run(mq_loop.wait_for(drain(cluster.ns.addr, reader), 120))
            for w in writers + [reader, nem.history] + ([consumer5] if consumer5 else []):
                w.close()
    finally:
        cluster.close()
    verdict = check(load(hist_dir), cut_allowed=mode in CUT_WITH_DAMAGE_ALLOWED)
    summary = verdict.summary()
    if hostiles:
        summary["hostile"] = {k: sum(h.stats[k] for h in hostiles) for k in hostiles[0].stats}
        if summary["hostile"]["accepted"]:
            summary["valid"] = False
    # the cell's promise: the checker's verdict, except where a lost suffix is allowed
    if (mode, nemesis) in SUFFIX_LOSS_ALLOWED and verdict.lost and verdict.suffix_loss:
        summary["valid"] = not (verdict.unexpected or verdict.duplicated or verdict.reordered or verdict.failed_read)
    return {"mode": mode, "nemesis": nemesis, "workload": workload, "seconds": seconds, "faults": nem.faults,
            **summary}


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


def run_matrix(seconds: float, directory: str, modes=MODES, nemeses=NEMESES, out=None) -> list[dict]:
    """Every applicable cell, one after another; a cell that cannot even run (a start failure)
    counts as broken.  The real-network nemeses are left out, saying why, where hosts cannot be
    made (mq.hosts.unavailable: not root).  Writes the table to `out` (markdown) when given."""
    from mq.hosts import unavailable
    no_hosts = unavailable()
    if no_hosts is not None and any(n in HOST_NEMESES for n in nemeses):
        print(f"the real-network nemeses are left out: {no_hosts}", flush=True)
        nemeses = [n for n in nemeses if n not in HOST_NEMESES]
    results = []
    for mode in modes:
        for nemesis in nemeses:
            if (mode, nemesis) in NOT_APPLICABLE:
                continue
            cell_dir = os.path.join(directory, f"{mode}-{nemesis}")
            try:
                r = run_cell(mode, nemesis, seconds, cell_dir)
            except Exception as e:                      # noqa: BLE001 - reported in the table
                r = {"mode": mode, "nemesis": nemesis, "valid": False, "error": f"{type(e).__name__}: {e}"[:300]}
            print(_line(r), flush=True)
            results.append(r)
    if out:
        with open(out, "w") as f:
            f.write(matrix_table(results, seconds))
    return results


def matrix_table(results: list[dict], seconds: float) -> str:
    """Mode x fault: acked / lost (duplicated, reordered) / longest time without an ack."""
    cells = {(r["mode"], r["nemesis"]): r for r in results}
    nemeses = [n for n in NEMESES if any(r["nemesis"] == n for r in results)]
    lines = [f"Each cell: {seconds:g} s of 2 producers, a fault every {CYCLE_S:g} s lasting {FAULT_S:g} s; "
             "acked / lost / longest time without an acknowledged send; ✔ the promise held, ✘ it broke "
             "(lost is allowed only as a suffix under power loss without a synchronous copy; `damaged`: "
             "messages a byte-level fault hit, missing and never served; `cut`: what followed a damaged "
             "record in a log without a replica that must hold it).", "",
             "| mode | " + " | ".join(nemeses) + " |", "|---|" + "---|" * len(nemeses)]
    for mode in MODES:
        row = []
        for n in nemeses:
            r = cells.get((mode, n))
            if r is None:
                row.append("–")
            elif "error" in r:
                row.append(f"✘ {r['error'][:60]}")
            else:
                extra = "".join(f", {r[k]} {k.replace('_', ' ')}" for k in
                                ("damaged", "cut", "duplicated", "reordered", "unexpected", "damaged_served",
                                 "offset_reused", "wrong_ack") if r.get(k))
                row.append(f"{'✔' if r['valid'] else '✘'} {r['acked']} / {r['lost']}{extra} / "
                           f"{r['max_unavailable_s']:.1f} s")
        if any(c != "–" for c in row):
            lines.append(f"| {mode} | " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def _line(r: dict) -> str:
    if "error" in r:
        return f"{r['mode']:22s} {r['nemesis']:9s} could not run: {r['error']}"
    mode = r["mode"] + (" (tx)" if r.get("workload") == "tx" else "")
    return (f"{mode:22s} {r['nemesis']:9s} faults {r['faults']}: acked {r['acked']} of {r['sends']} sends "
            f"({r['failed']} refused, {r['unknown']} unknown), read {r['read']}, expired {r['expired']}; lost {r['lost']}, "
            f"unexpected {r['unexpected']}, duplicated {r['duplicated']}, reordered {r['reordered']}, "
            f"refused but read {r.get('failed_read', 0)}, "
            f"damaged {r['damaged']} (served {r['damaged_served']}), cut {r['cut']}, offsets reused "
            f"{r['offset_reused']}, wrong acks {r['wrong_ack']}{_hostile(r)}{_pop(r)}; "
            f"max unavailable {r['max_unavailable_s']} s; recovery {r['recovery_s']}; "
            f"{'OK' if r['valid'] else 'PROMISE BROKEN'}")


def _pop(r: dict) -> str:
    return "" if "consumed" not in r else (
        f"; 5.x consumer: consumed {r['consumed']}, undelivered {r['undelivered']}, unexpected "
        f"{r['delivered_unexpected']}, redelivered {r['redelivered']} (after their ack {r['redelivered_acked']})")


def _hostile(r: dict) -> str:
    h = r.get("hostile")
    return "" if not h else (f"; hostile: {h['requests']} malformed requests, {h['refused']} refused, "
                             f"{h['accepted']} accepted, {h['garbage']} garbage frames")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="mqchaos", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run one cell of the fault matrix")
    r.add_argument("--mode", choices=MODES, required=True)
    r.add_argument("--nemesis", choices=NEMESES, required=True)
    r.add_argument("--seconds", type=float, default=20.0, help="how long the producers run (default 20)")
    r.add_argument("--producers", type=int, default=2, help="producer connections (default 2)")
    r.add_argument("--workload", choices=WORKLOADS, default="plain",
                   help="plain sends, or every message in a transaction (default plain)")
    r.add_argument("--dir", help="where the cluster and the history go (default: a temporary directory, removed)")
    r.add_argument("--json", action="store_true", help="print the verdict as one JSON object")
    m = sub.add_parser("matrix", help="every mode x every nemesis; writes the table")
    m.add_argument("--seconds", type=float, default=10.0, help="per cell (default 10)")
    m.add_argument("--out", default="chaos-report.md", help="the markdown table (default chaos-report.md)")
    m.add_argument("--dir", help="where the clusters and histories go (default: a temporary directory, removed)")
    m.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of the modes")
    m.add_argument("--nemeses", default=",".join(NEMESES), help="comma-separated subset of the nemeses")
    args = p.parse_args(argv)
    if args.cmd == "matrix":
        modes, nemeses = args.modes.split(","), args.nemeses.split(",")
        bad = [x for x in modes if x not in MODES] + [x for x in nemeses if x not in NEMESES]
        if bad or not 1 <= args.seconds <= 3600:
            p.error(f"unknown modes/nemeses {bad}, or --seconds outside [1, 3600]")
        with tempfile.TemporaryDirectory(prefix="mqchaos-") as d:
            results = run_matrix(args.seconds, args.dir or d, modes, nemeses, args.out)
        print(f"wrote {args.out}")
        return 0 if all(r["valid"] for r in results) else 1
    if not 1 <= args.seconds <= 3600 or not 1 <= args.producers <= 64:
        p.error("--seconds must be in [1, 3600] and --producers in [1, 64]")
    if (args.mode, args.nemesis) in NOT_APPLICABLE:
        p.error(f"the {args.nemesis} nemesis does not apply to mode {args.mode}")
    if args.dir:
        os.makedirs(args.dir, exist_ok=True)
        result = run_cell(args.mode, args.nemesis, args.seconds, args.dir, args.producers, args.workload)
    else:
        with tempfile.TemporaryDirectory(prefix="mqchaos-") as d:
            result = run_cell(args.mode, args.nemesis, args.seconds, d, args.producers, args.workload)
    print(json.dumps(result) if args.json else _line(result))
    return 0 if result["valid"] else 1


if __name__ == "__main__":
    sys.exit(main())
