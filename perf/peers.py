"""Peers side by side: Redis Streams and NATS JetStream, started on loopback from Debian's
packages, against our broker, with the same workloads in the same run (PERF.md, "Peers").

  mqpeers [--seconds S] [--only redis|nats|ours] [--client remoting|mqperf|library] [--json]
  python -m perf.peers ...                  (the same, from the repository root)

What runs (1 KiB messages, 127.0.0.1, persistence on):
  - Redis Streams (`redis-server`, AOF `everysec` and AOF `always`), client redis-py
    (blocking socket, the client a Python user would pick): XADD one at a time, a pipeline of
    100 XADDs, XREAD COUNT 1000 over a backlog; under `always` also `redis-benchmark -c 50`
    (the C tool with 50 connections, PERF.md's figure).
  - NATS JetStream (`nats-server -js`, file storage), client nats-py: publish one at a time
    (each awaits its ack), 100 publishes in flight, pull fetch of 1000 (ack policy none).
  - ours: a name server and a broker (ASYNC_FLUSH, and SYNC_FLUSH for the `always` rows) with
    256 MiB CommitLog files, the project's asyncio RemotingClient speaking the wire protocol:
    one SEND_MESSAGE_V2 at a time, 100 in flight, SEND_BATCH_MESSAGE of 100 (4 in flight),
    64 concurrent producers (2 processes x 4 connections x 8), one consumer pulling 32 at a
    time round-robin over 4 queues.  The workloads are those of the broker gates
    (perf/workloads.py, shared with perf/test_broker_bench.py), so the CLI and the gates
    measure the same thing.

Each row alternates rounds of our side and the peer's side (ROUNDS each), so load from
elsewhere falls on both alike, and reports medians and the ratio ours / peer.  Everything this
module starts (servers, temp dirs, client processes) is stopped and removed on the way out,
including on Ctrl-C and on errors: every server is a context manager, and the CLI holds them
in one ExitStack.

The servers get free ports below the kernel's ephemeral range (mq/cluster.py) and
their own temporary directories (under $MQ_PERF_DIR, default /tmp).  Redis runs with automatic
AOF rewrites off (`--auto-aof-rewrite-percentage 0`) and every stream is deleted between
rounds, so no background rewrite fork lands inside a measured round.

`ensure_installed()` installs the Debian packages (`redis-server`, which pulls `redis-tools`
for redis-benchmark; `nats-server`) when a program is missing: apt-get install, then apt-get
update and install again if that failed.  It needs root and apt-get, and says so otherwise.
On a machine with systemd, installing the packages also enables and starts the distribution's
own services on their default ports (this module never uses or stops those)."""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass

from mq import loop as mq_loop
from mq.cluster import Broker, NameServer, free_port, port_open, wait_for

from . import workloads as w
from .extras import MissingExtra, require
from .workloads import (MSG_BODY_SIZE, PIPELINE_DEPTH, PRINTABLE_BODY, XREAD_COUNT, Result, Series, per_round_ratios,
                        redis_benchmark_xadd, redis_fill, redis_xadd_one, redis_xadd_pipeline, redis_xread)

ROUNDS = 3                        # alternating rounds per side in the CLI
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
INSTALL_TIMEOUT_S = 900.0

# program -> Debian package, per peer
PACKAGES = {
    "redis": {"redis-server": "redis-server", "redis-benchmark": "redis-tools"},
    "nats": {"nats-server": "nats-server"},
}
# nats-server is installed in /usr/sbin, which is not on every user's PATH
_PROGRAM_DIRS = ("/usr/sbin", "/usr/bin", "/sbin", "/bin", "/usr/local/sbin", "/usr/local/bin")


class PeerUnavailable(RuntimeError):
    """A peer cannot be installed or started here; the message says why and what to do."""


def find_program(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    for d in _PROGRAM_DIRS:
        path = os.path.join(d, name)
        if os.access(path, os.X_OK):
            return path
    return None


def ensure_installed(peers: tuple[str, ...] = ("redis", "nats")) -> dict[str, str]:
    """Paths of the peers' programs (redis-server, redis-benchmark, nats-server), installing the
    Debian packages of any that are missing: `apt-get install -y -qq`, and if that fails,
    `apt-get update` and the install once more.  Raises PeerUnavailable when a program is
    missing and this process is not root or has no apt-get, or when the install fails."""
    for peer in peers:
        assert peer in PACKAGES, f"unknown peer {peer!r}"
    wanted = {prog: pkg for peer in peers for prog, pkg in PACKAGES[peer].items()}
    missing = {prog: pkg for prog, pkg in wanted.items() if not find_program(prog)}
    if missing:
        packages = sorted(set(missing.values()))
        how = f"apt-get install -y {' '.join(packages)}"
        if os.geteuid() != 0:
            raise PeerUnavailable(f"{', '.join(missing)} not installed, and installing needs root: run `{how}`")
        apt = find_program("apt-get")
        if apt is None:
            raise PeerUnavailable(f"{', '.join(missing)} not installed, and there is no apt-get here: install "
                                  f"{', '.join(packages)} (Debian packages) some other way")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        # Lock::Timeout: another apt run (another test, unattended-upgrades) waits instead of failing
        install = [apt, "-o", "DPkg::Lock::Timeout=300", "install", "-y", "-qq", *packages]

        def run(cmd: list[str]) -> subprocess.CompletedProcess:
            try:
                return subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                      timeout=INSTALL_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                raise PeerUnavailable(f"`{' '.join(cmd)}` took more than {INSTALL_TIMEOUT_S:.0f} s") from None

        done = run(install)
        if done.returncode != 0:
            run([apt, "-o", "DPkg::Lock::Timeout=300", "update", "-qq"])
            done = run(install)
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise PeerUnavailable(f"`{how}` failed (exit {done.returncode}): {' | '.join(tail)}")
    paths = {prog: find_program(prog) for prog in wanted}
    lost = [prog for prog, path in paths.items() if path is None]
    if lost:
        raise PeerUnavailable(f"{', '.join(lost)} still not found after installing {sorted(set(wanted.values()))}")
    return paths


def perf_dir() -> str:
    return os.environ.get("MQ_PERF_DIR", tempfile.gettempdir())


# =================================================================================================
# peer servers
# =================================================================================================
class PeerServer:
    """One peer server process on 127.0.0.1:<free port>, with a temporary directory of its own
    for its data and its log.  A context manager: start() on entry; stop() on exit stops the
    process (SIGTERM, then SIGKILL after STOP_TIMEOUT_S) and removes the directory.  stop() is
    idempotent and safe after a failed start."""

    name = "peer"
    START_TRIES = 3               # a port picked free can still be taken before the server binds

    def __init__(self):
        self.port: int | None = None
        self.dir: str | None = None
        self.proc: subprocess.Popen | None = None
        self._log = None

    # ---- per peer
    def args(self) -> list[str]:
        raise NotImplementedError

    def ready(self) -> bool:
        raise NotImplementedError

    # ----
    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def log_path(self) -> str:
        return os.path.join(self.dir, f"{self.name}.log")

    def output(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode("utf-8", "replace")
        except (OSError, TypeError):
            return ""

    def start(self) -> "PeerServer":
        assert self.proc is None, "started twice"
        self.dir = tempfile.mkdtemp(prefix=f"mq-peer-{self.name}-", dir=perf_dir())
        try:
            for attempt in range(self.START_TRIES):
                self.port = free_port()
                self._log = open(self.log_path, "ab")
                self.proc = subprocess.Popen(self.args(), stdout=self._log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, cwd=self.dir, start_new_session=True)
                wait_for(lambda: self.proc.poll() is not None or self.ready(), START_TIMEOUT_S,
                         what=f"{self.name} on {self.addr}")
                if self.proc.poll() is None:
                    return self
                self._log.close()
                if "in use" not in self.output() or attempt == self.START_TRIES - 1:
                    raise PeerUnavailable(f"{self.name} exited with {self.proc.returncode} at start:\n"
                                          f"{self.output()[-2000:]}")
                self.proc = None                    # the port was taken meanwhile: another one
        except BaseException:
            self.stop()
            raise
        raise AssertionError("unreachable")

    def stop(self) -> int | None:
        """Stops the process and removes the directory; the exit status (None if never started)."""
        rc = None
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(STOP_TIMEOUT_S)
            rc = self.proc.returncode
        if self._log is not None:
            self._log.close()
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
        return rc

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


class RedisServer(PeerServer):
    """redis-server with AOF on (`appendfsync` = mode), no RDB snapshots, no automatic AOF
    rewrites, bound to 127.0.0.1."""

    name = "redis"
    MODES = ("everysec", "always")

    def __init__(self, mode: str = "everysec"):
        super().__init__()
        if mode not in self.MODES:
            raise ValueError(f"appendfsync mode must be one of {self.MODES}, not {mode!r}")
        self.mode = mode
        require("redis", what="the Redis peer (client redis-py)")
        self.programs = ensure_installed(("redis",))

    def args(self) -> list[str]:
        return [self.programs["redis-server"], "--port", str(self.port), "--bind", "127.0.0.1",
                "--dir", self.dir, "--appendonly", "yes", "--appendfsync", self.mode, "--save", "",
                "--auto-aof-rewrite-percentage", "0", "--daemonize", "no", "--protected-mode", "yes",
                "--logfile", ""]

    def client(self):
        """A redis-py client (blocking socket, RESP2 as parsed by redis-py)."""
        import redis
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=30)

    def ready(self) -> bool:
        if not port_open(self.port):
            return False
        import redis
        try:
            with redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=1) as r:
                return bool(r.ping())
        except redis.RedisError:                    # e.g. LOADING
            return False


class NatsServer(PeerServer):
    """nats-server with JetStream on and its file storage in the temp dir, on 127.0.0.1."""

    name = "nats"

    def __init__(self):
        super().__init__()
        require("nats", what="the NATS peer (client nats-py)")
        self.programs = ensure_installed(("nats",))

    def args(self) -> list[str]:
        return [self.programs["nats-server"], "-a", "127.0.0.1", "-p", str(self.port), "-js",
                "-sd", os.path.join(self.dir, "jetstream")]

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def ready(self) -> bool:
        return "Server is ready" in self.output() and port_open(self.port)


# =================================================================================================
# NATS JetStream workloads (nats-py, asyncio)
# =================================================================================================
class NatsClient:
    """A nats-py connection with its own event loop, a JetStream context and one file-storage
    stream `PEERS` over subject `peers.m`."""

    STREAM, SUBJECT = "PEERS", "peers.m"

    def __init__(self, server: NatsServer):
        import nats
        self.loop = mq_loop.new_event_loop()
        self._cut_short: list[asyncio.Task] = []
        self.nc = self.run(nats.connect(server.url, max_reconnect_attempts=0))
        self.js = self.nc.jetstream(timeout=30)
        self.run(self.js.add_stream(name=self.STREAM, subjects=[self.SUBJECT], storage="file"))

    def run(self, coro):
        task = self.loop.create_task(coro)
        try:
            return self.loop.run_until_complete(task)
        except BaseException:
            if not task.done():
                self._cut_short.append(task)
            raise

    def stored(self) -> int:
        return self.run(self.js.stream_info(self.STREAM)).state.messages

    def purge(self) -> None:
        self.run(self.js.purge_stream(self.STREAM))

    def close(self) -> None:
        try:
            # a run cut short (Ctrl-C, SIGTERM) left its task pending: cancel and await it before
            # the connection closes, so it cannot end later with an exception nobody retrieves
            # (nats-py's own tasks are left to nc.close())
            cut = [t for t in self._cut_short if not t.done()]
            for t in cut:
                t.cancel()
            if cut:
                self.loop.run_until_complete(asyncio.gather(*cut, return_exceptions=True))
            self.run(self.nc.close())
        finally:
            self.loop.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def publish_one(self, n: int) -> Result:
        """n publishes, each awaiting its JetStream ack before the next; latency per publish."""
        return self._publish(n, 1)

    def publish_in_flight(self, n: int, in_flight: int = PIPELINE_DEPTH) -> Result:
        """n publishes from `in_flight` concurrent publishers, each awaiting its ack."""
        return self._publish(n, in_flight)

    def _publish(self, n: int, in_flight: int) -> Result:
        before = self.stored()
        lat: list[float] = []
        js, subject = self.js, self.SUBJECT

        async def publisher(k: int) -> None:
            for _ in range(k, n, in_flight):
                s = time.perf_counter()
                await js.publish(subject, PRINTABLE_BODY)
                lat.append(time.perf_counter() - s)

        async def all_publishers() -> float:
            t0 = time.perf_counter()
            await asyncio.gather(*(publisher(k) for k in range(in_flight)))
            return time.perf_counter() - t0

        res = Result(n, self.run(all_publishers()), lat)
        assert self.stored() == before + n, "JetStream lost publishes"
        return res

    def fill(self, n: int) -> None:
        self.publish_in_flight(n, 256)

    def fetch(self, batch: int = XREAD_COUNT) -> Result:
        """The whole stream through a new pull consumer (deliver all, ack none), fetching
        `batch` at a time until every stored message was read; latency per fetch."""
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
        total = self.stored()
        durable = f"peers-{uuid.uuid4().hex[:8]}"
        lat: list[float] = []

        async def read() -> tuple[int, float, bytes]:
            sub = await self.js.pull_subscribe(self.SUBJECT, durable=durable, stream=self.STREAM, config=ConsumerConfig(
                ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL))
            n, last = 0, b""
            t0 = time.perf_counter()
            while n < total:
                s = time.perf_counter()
                msgs = await sub.fetch(min(batch, total - n), timeout=10)
                lat.append(time.perf_counter() - s)
                n += len(msgs)
                last = msgs[-1].data
            secs = time.perf_counter() - t0
            await sub.unsubscribe()
            await self.js.delete_consumer(self.STREAM, durable)
            return n, secs, last

        n, secs, last = self.run(read())
        assert n == total and last == PRINTABLE_BODY, "the pull consumer did not read the stream"
        return Result(n, secs, lat)


# =================================================================================================
# ours: a name server and brokers on loopback, driven with the broker gates' request helpers
# =================================================================================================
OUR_PRODUCER_PROCESSES = 2        # 2 x 4 connections x 8 in flight = 64 concurrent producers
OUR_CONNS_PER_PROCESS = 4


class OurBrokers:
    """A name server and brokers (1 io worker, 256 MiB CommitLog files) in a temp dir, one per
    flushDiskType asked for, plus a Session (event loop + RemotingClient) and, on demand, the
    64-producer client processes.  A context manager that stops all of it and removes the dir.

    client="remoting": the workloads run the broker gates' loops over the project's asyncio
    RemotingClient (perf/workloads.py), so the table and the gates agree.
    client="mqperf": they run perf/mqperf.py (`run(Options) -> Summary`), the load generator
    with callback-driven connections and templated frames, which spends less client CPU per
    message; its consumer keeps one pull in flight per queue (RocketMQ's consumers do that)
    instead of one pull at a time.  Every mqperf run spawns its worker processes; they start
    at one instant, so the spawn is outside the measured time.
    client="library": the project's client library as an application uses it (mq.client
    Producer: route lookup, queue selection, retries; PullConsumer.pull decoding every
    message), in this process: send() one at a time, 100 send() tasks in flight, send_batch()
    of 100 (4 in flight), 64 concurrent send() tasks, and pulls of 32 round-robin."""

    CLIENTS = ("remoting", "mqperf", "library")

    TOPIC = "PeersTopic"              # the produce workloads: PeersTopic_ASYNC, PeersTopic_SYNC (topic())
    BACKLOG_TOPIC = "PeersBacklog"    # the consume workload: holds the backlog and nothing else

    def __init__(self, flush_types: tuple[str, ...] = ("ASYNC_FLUSH",), client: str = "remoting"):
        assert client in self.CLIENTS, client
        self.client = client
        self.dir = tempfile.mkdtemp(prefix="mq-peer-ours-", dir=perf_dir())
        self.namesrv = None
        self.brokers: dict[str, object] = {}
        self.session = None
        self._producers = None        # SingleProducerProcesses, started by the first producers_64()
        self._connected: set[str] = set()   # flush types whose broker the producers are connected to
        self._library: dict[str, tuple] = {}  # flush -> (Producer, PullConsumer), client="library"
        try:
            self.namesrv = NameServer(self.dir)
            for flush in flush_types:
                self.brokers[flush] = Broker(self.dir, self.namesrv.addr, name=f"peers-{flush.split('_')[0].lower()}",
                                             mappedFileSizeCommitLog=w.COMMITLOG_FILE_SIZE, flushDiskType=flush)
            self.session = w.Session()
            for flush in flush_types:
                self.run(w.create_topic(self.session.client, self.addr(flush), self.topic(flush)))
        except BaseException:
            self.close()
            raise

    def addr(self, flush: str) -> str:
        return self.brokers[flush].addr

    def topic(self, flush: str) -> str:
        """The produce topic of this flush type's broker, on that broker only: a client that
        routes by topic (the library) must not spread one workload over both brokers."""
        return f"{self.TOPIC}_{flush.split('_')[0]}"

    def run(self, coro):
        return self.session.run(coro)

    def close(self) -> None:
        with contextlib.ExitStack() as stack:           # every step runs even if one fails
            stack.callback(shutil.rmtree, self.dir, ignore_errors=True)
            if self.namesrv is not None:
                stack.callback(self.namesrv.stop)
            for b in self.brokers.values():
                stack.callback(b.stop)
            if self.session is not None:
                stack.callback(self.session.close)
            if self._producers is not None:
                stack.callback(self._producers.close)
            for producer, consumer in self._library.values():
                stack.callback(lambda p=producer, c=consumer: self.run(shutdown_library(p, c)))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- workloads; each returns a Result for n messages (rounded as the workload needs)
    def _mqperf(self, flush: str, **options) -> Result:
        from . import mqperf
        o = mqperf.Options(broker=self.addr(flush), progress_interval_s=0, size_bytes=MSG_BODY_SIZE, **options)
        s = mqperf.run(o)
        if s.errors or not s.messages:
            raise RuntimeError(f"mqperf {options}: {s.errors} errors, {s.messages} messages, statuses {s.statuses}")
        return Result(s.messages, s.duration_s, p50_us=s.latency.p50_us, p99_us=s.latency.p99_us)

    def _lib(self, flush: str) -> tuple:
        """(Producer, PullConsumer) of mq.client against this flush type's broker, started once."""
        if flush not in self._library:
            self._library[flush] = self.run(start_library(self.namesrv.addr, flush))
        return self._library[flush]

    def _lib_sends(self, flush: str, n: int, in_flight: int, batch: int = 1) -> Result:
        producer, _ = self._lib(flush)
        return self.run(library_sends(producer, self.topic(flush), n, in_flight, batch))

    def one_at_a_time(self, flush: str, n: int) -> Result:
        if self.client == "mqperf":
            return self._mqperf(flush, topic=self.topic(flush), count=n)
        if self.client == "library":
            return self._lib_sends(flush, n, 1)
        lat: list[float] = []
        s = self.run(w.sequential_sends(self.session.client, self.addr(flush), self.topic(flush), n, lat))
        return Result(n, s, lat)

    def pipelined(self, flush: str, n: int) -> Result:
        if self.client == "mqperf":
            return self._mqperf(flush, topic=self.topic(flush), count=n, in_flight=w.PIPELINE_IN_FLIGHT)
        if self.client == "library":
            return self._lib_sends(flush, n, w.PIPELINE_IN_FLIGHT)
        lat: list[float] = []
        s = self.run(w.pipelined_sends(self.session.client, self.addr(flush), self.topic(flush), n,
                                       w.PIPELINE_IN_FLIGHT, lat))
        return Result(n, s, lat)

    def batched(self, flush: str, n: int) -> Result:
        batches = max(1, n // w.BATCH_MSGS)
        if self.client == "mqperf":
            return self._mqperf(flush, topic=self.topic(flush), count=batches * w.BATCH_MSGS,
                                batch=w.BATCH_MSGS, in_flight=w.BATCH_IN_FLIGHT)
        if self.client == "library":
            return self._lib_sends(flush, batches * w.BATCH_MSGS, w.BATCH_IN_FLIGHT, w.BATCH_MSGS)
        lat: list[float] = []
        s = self.run(w.batched_sends(self.session.client, self.addr(flush), self.topic(flush), batches,
                                     w.BATCH_IN_FLIGHT, w.one_kib_batch(), lat))
        return Result(batches * w.BATCH_MSGS, s, lat)

    def producers_64(self, flush: str, n: int) -> Result:
        if self.client == "mqperf":
            return self._mqperf(flush, topic=self.topic(flush), count=max(1, n // w.SYNC_FLUSH_PRODUCERS) *
                                w.SYNC_FLUSH_PRODUCERS, procs=OUR_PRODUCER_PROCESSES, conns=OUR_CONNS_PER_PROCESS,
                                in_flight=w.SYNC_FLUSH_IN_FLIGHT_PER_CONN)
        if self.client == "library":
            return self._lib_sends(flush, max(1, n // w.SYNC_FLUSH_PRODUCERS) * w.SYNC_FLUSH_PRODUCERS,
                                   w.SYNC_FLUSH_PRODUCERS)
        if self._producers is None:
            self._producers = w.SingleProducerProcesses(OUR_PRODUCER_PROCESSES)
        if flush not in self._connected:
            self._producers.call("connect", self.addr(flush), OUR_CONNS_PER_PROCESS)
            self._connected.add(flush)
        per_producer = max(1, n // w.SYNC_FLUSH_PRODUCERS)
        msgs, secs, lat, _ = self._producers.run(self.addr(flush), self.topic(flush), per_producer)
        return Result(msgs, secs, lat)

    def fill(self, flush: str, n: int) -> list[int]:
        """The backlog topic, created with one message and then about n more in batches, all
        dispatched; the queues' ends.  Call once."""
        batches = max(1, n // w.BATCH_MSGS)
        c, addr = self.session.client, self.addr(flush)
        self.run(w.create_topic(c, addr, self.BACKLOG_TOPIC))
        self.run(w.batched_sends(c, addr, self.BACKLOG_TOPIC, batches, w.BATCH_IN_FLIGHT, w.one_kib_batch(), []))
        return self.run(w.wait_dispatched(c, addr, self.BACKLOG_TOPIC, 1 + batches * w.BATCH_MSGS))

    def consume(self, flush: str, ends: list[int]) -> Result:
        """The whole backlog from offset 0, PULL_MESSAGE of 32: one at a time, round-robin over the
        queues (remoting), or one in flight per queue (mqperf)."""
        if self.client == "mqperf":
            r = self._mqperf(flush, mode="consume", topic=self.BACKLOG_TOPIC, pull_batch=w.PULL_MAX_MSGS)
            assert r.msgs == sum(ends), (r.msgs, ends)
            return r
        if self.client == "library":
            _, consumer = self._lib(flush)
            r = self.run(library_consume(consumer, self.BACKLOG_TOPIC, w.PULL_MAX_MSGS))
            assert r.msgs == sum(ends), (r.msgs, ends)
            return r
        lat: list[float] = []
        msgs, _, s = self.run(w.consume_round_robin(self.session.client, self.addr(flush), self.BACKLOG_TOPIC,
                                                    ends, lat))
        assert msgs == sum(ends), (msgs, ends)
        return Result(msgs, s, lat)


# ---- client="library": mq.client as an application uses it ---------------------------------------
async def start_library(namesrv: str, flush: str):
    """(Producer, PullConsumer), started; `flush` names them (the broker they are for)."""
    from mq.client import Producer, PullConsumer
    tag = flush.split("_")[0].lower()
    producer = await Producer(f"peers_producer_{tag}", namesrv, instance_name=f"peers-{tag}-{os.getpid()}").start()
    consumer = await PullConsumer(f"peers_consumer_{tag}", namesrv,
                                  instance_name=f"peers-c-{tag}-{os.getpid()}").start()
    return producer, consumer


async def shutdown_library(producer, consumer) -> None:
    await producer.shutdown()
    await consumer.shutdown()


async def library_sends(producer, topic: str, n: int, in_flight: int, batch: int) -> Result:
    """n messages by `in_flight` concurrent senders, each awaiting send() (batch 1) or
    send_batch() of `batch` messages; any status but SEND_OK fails the round."""
    from mq.client import Message, SendStatus
    requests = max(1, n // batch)
    lat: list[float] = []
    next_request = iter(range(requests))

    async def sender() -> None:
        for _ in next_request:
            t = time.perf_counter()
            if batch == 1:
                r = await producer.send(Message(topic, PRINTABLE_BODY))
            else:
                r = await producer.send_batch([Message(topic, PRINTABLE_BODY) for _ in range(batch)])
            lat.append(time.perf_counter() - t)
            if r.status != SendStatus.SEND_OK:
                raise RuntimeError(f"send answered {r.status}")

    t0 = time.perf_counter()
    await asyncio.gather(*(sender() for _ in range(in_flight)))
    return Result(requests * batch, time.perf_counter() - t0, lat)


async def library_consume(consumer, topic: str, max_nums: int) -> Result:
    """Every message of `topic` from offset 0: PullConsumer.pull of max_nums, one at a time,
    round-robin over the queues, until each queue answers NO_NEW_MSG."""
    from mq.client import PullStatus
    queues = await consumer.fetch_queues(topic)
    offsets = {q: 0 for q in queues}
    lat: list[float] = []
    msgs = 0
    t0 = time.perf_counter()
    while offsets:
        for q in list(offsets):
            t = time.perf_counter()
            r = await consumer.pull(q, offsets[q], max_nums)
            lat.append(time.perf_counter() - t)
            if r.status == PullStatus.FOUND:
                msgs += len(r.messages)
                offsets[q] = r.next_begin_offset
            else:
                del offsets[q]
    return Result(msgs, time.perf_counter() - t0, lat)


# =================================================================================================
# the side-by-side run (CLI)
# =================================================================================================
@dataclass
class Row:
    workload: str
    peer: str
    ours: Series | None = None
    theirs: Series | None = None

    @property
    def ratio(self) -> float | None:
        if self.ours is None or self.theirs is None:
            return None
        return self.ours.msgs_per_s / self.theirs.msgs_per_s

    def as_dict(self) -> dict:
        def side(s: Series | None) -> dict | None:
            if s is None:
                return None
            lo, hi = s.rate_range()
            return {"msgs_per_s": s.msgs_per_s, "rounds_msgs_per_s": [lo, hi], "p50_us": s.p50_us,
                    "p99_us": s.p99_us, "rounds": len(s.rounds), "msgs_per_round": s.rounds[0].msgs}
        pairs = per_round_ratios(self.ours, self.theirs) if self.ratio is not None else None
        return {"workload": self.workload, "peer": self.peer, "ours": side(self.ours), "peer_side": side(self.theirs),
                "ratio": self.ratio, "ratio_per_round_pair": pairs}


def _calibrated(fn, seconds: float, probe: int, multiple: int = 1) -> int:
    """Runs fn(probe) once (the warm-up; probe is for rounds of 1 s and shrinks with shorter
    ones) and returns the message count that takes about `seconds` per round at the rate it
    showed (at least the probe, a multiple of `multiple`)."""
    probe = max(multiple, int(probe * min(1.0, seconds)) // multiple * multiple)
    r = fn(probe)
    n = max(probe, int(r.msgs_per_s * seconds))
    return max(multiple, n // multiple * multiple)


def alternate(ours_fn, peer_fn, seconds: float, probe: int, multiple: int = 1, rounds: int = ROUNDS,
              between=None) -> tuple[Series | None, Series | None]:
    """Warm-up and calibration on each side, then `rounds` alternating rounds (ours, peer, ...)
    of about `seconds` each; either side may be None.  between() runs after every round."""
    ours, theirs = (Series() if ours_fn else None), (Series() if peer_fn else None)
    n_ours = _calibrated(ours_fn, seconds, probe, multiple) if ours_fn else 0
    n_peer = _calibrated(peer_fn, seconds, probe, multiple) if peer_fn else 0
    for _ in range(rounds):
        if ours_fn:
            ours.add(ours_fn(n_ours))
        if peer_fn:
            theirs.add(peer_fn(n_peer))
        if between:
            between()
    return ours, theirs


def run_side_by_side(seconds: float, only: str | None, progress=print, client: str = "remoting") -> list[Row]:
    """Every row of the table.  `only`: the Redis rows, the NATS rows, or our side of every
    distinct workload with no peer at all ("ours").  `client`: see OurBrokers."""
    with_redis = only in (None, "redis")
    with_nats = only in (None, "nats")
    # the peers' Python clients first: a missing one is said before anything is installed or started
    require(*(m for m, wanted in (("redis", with_redis), ("nats", with_nats)) if wanted),
            what="mqpeers" + (f" --only {only}" if only else ""))
    ensure_installed(tuple(p for p, wanted in (("redis", with_redis), ("nats", with_nats)) if wanted))
    flushes = ("ASYNC_FLUSH",) if only == "nats" else ("ASYNC_FLUSH", "SYNC_FLUSH")
    backlog = max(10_000, int(50_000 * seconds)) // 1000 * 1000
    rows: list[Row] = []
    with contextlib.ExitStack() as stack:
        progress(f"starting our name server and brokers ({', '.join(flushes)}) ...")
        ours = stack.enter_context(OurBrokers(flushes, client))
        progress(f"name server pid {ours.namesrv.proc.p.pid}, brokers " + ", ".join(
            f"{flush} pid {b.proc.p.pid} on {b.addr}" for flush, b in ours.brokers.items()))
        redis_srv, rc = {}, {}
        if with_redis:
            for mode in RedisServer.MODES:
                redis_srv[mode] = stack.enter_context(RedisServer(mode))
                progress(f"redis-server (AOF {mode}) pid {redis_srv[mode].pid} on {redis_srv[mode].addr}")
                rc[mode] = stack.enter_context(contextlib.closing(redis_srv[mode].client()))
        nc = None
        if with_nats:
            nats_srv = stack.enter_context(NatsServer())
            progress(f"nats-server (JetStream, file storage) pid {nats_srv.pid} on {nats_srv.addr}")
            nc = stack.enter_context(NatsClient(nats_srv))
        progress(f"filling the consume backlogs ({backlog:,} messages) ...")
        ends = ours.fill("ASYNC_FLUSH", backlog)
        total = sum(ends)
        if with_redis:
            redis_fill(rc["everysec"], "backlog", total)

        # (workload, ours, peer label, peer, warm-up messages, round multiple, after each round)
        specs = []
        for mode, flush in (("everysec", "ASYNC_FLUSH"), ("always", "SYNC_FLUSH")):
            if not (with_redis or only == "ours"):
                break
            r = rc.get(mode)
            label = f"Redis AOF {mode}, redis-py"
            clear = (lambda r=r: r.delete("s")) if r else None
            specs.append((f"one at a time, {flush}", lambda n, f=flush: ours.one_at_a_time(f, n),
                          f"{label} XADD one at a time", r and (lambda n, r=r: redis_xadd_one(r, "s", n)), 200, 1,
                          clear))
            specs.append((f"100 sends in flight, {flush}", lambda n, f=flush: ours.pipelined(f, n),
                          f"{label} pipeline of 100", r and (lambda n, r=r: redis_xadd_pipeline(r, "s", n)), 2000,
                          100, clear))
            if mode == "everysec":
                specs.append(("batches of 100, 4 in flight, ASYNC_FLUSH", lambda n: ours.batched("ASYNC_FLUSH", n),
                              f"{label} pipeline of 100", r and (lambda n, r=r: redis_xadd_pipeline(r, "s", n)),
                              5000, 100, clear))
                specs.append((f"one consumer (pull 32), {total:,} backlog", lambda n: ours.consume("ASYNC_FLUSH", ends),
                              f"{label} XREAD COUNT 1000", r and (lambda n, r=r: redis_xread(r, "backlog")), 0, 1,
                              None))
            else:
                s = redis_srv.get(mode)
                specs.append(("64 producers, SYNC_FLUSH", lambda n: ours.producers_64("SYNC_FLUSH", n),
                              "Redis AOF always, redis-benchmark -c 50",
                              s and (lambda n, s=s: redis_benchmark_xadd(s, "s", n)), 1280, 64, clear))
        if with_nats:
            label = "NATS JetStream file, nats-py"
            nc.fill(total)                         # read by the first NATS row; publish rows purge after
            specs += [
                (f"one consumer (pull 32), {total:,} backlog", lambda n: ours.consume("ASYNC_FLUSH", ends),
                 f"{label} pull fetch 1000", lambda n: nc.fetch(), 0, 1, None),
                ("one at a time, ASYNC_FLUSH", lambda n: ours.one_at_a_time("ASYNC_FLUSH", n),
                 f"{label} publish one at a time", nc.publish_one, 200, 1, nc.purge),
                ("100 sends in flight, ASYNC_FLUSH", lambda n: ours.pipelined("ASYNC_FLUSH", n),
                 f"{label} 100 in flight", nc.publish_in_flight, 2000, 100, nc.purge),
            ]
        done: set[str] = set()
        for workload, ours_fn, label, peer_fn, probe, multiple, between in specs:
            if peer_fn is None:                    # --only ours: each workload of ours once
                if workload in done:
                    continue
                done.add(workload)
                label = "-"
            progress(f"  {workload} | {label} ...")
            rows.append(Row(workload, label, *alternate(ours_fn, peer_fn, seconds, probe, multiple,
                                                         between=between)))
    return rows


def format_table(rows: list[Row]) -> str:
    def rate(s: Series | None) -> str:
        return f"{s.msgs_per_s:,.0f}" if s else "-"

    def lat(s: Series | None) -> str:
        if s is None or s.p50_us is None:
            return "-"
        return f"{s.p50_us:,.0f} / {s.p99_us:,.0f}"

    head = ("workload (ours)", "peer", "ours msgs/s", "peer msgs/s", "ratio", "ours p50/p99 us", "peer p50/p99 us")
    body = [(r.workload, r.peer, rate(r.ours), rate(r.theirs), f"{r.ratio:.2f}" if r.ratio else "-", lat(r.ours),
             lat(r.theirs)) for r in rows]
    widths = [max(len(x[i]) for x in [head, *body]) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(x, widths)))
             for x in [head, *body]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


class _Parser(argparse.ArgumentParser):
    def error(self, message):                    # one line, no usage block
        self.exit(2, f"{self.prog}: {message}\n")


def main(argv: list[str] | None = None) -> int:
    ap = _Parser(prog="mqpeers", description="Our broker side by side with Redis Streams and NATS "
                                 "JetStream on loopback (1 KiB messages), with the same workloads in the same run.")
    ap.add_argument("--seconds", type=float, default=1.0, help="about how long each round of each side runs "
                    f"({ROUNDS} alternating rounds per side and row; default 1)")
    ap.add_argument("--only", choices=("redis", "nats", "ours"), help="only the Redis rows, only the NATS rows, or "
                    "only our side of every row")
    ap.add_argument("--client", choices=OurBrokers.CLIENTS, default="remoting", help="our side's client: the "
                    "broker gates' RemotingClient loops (default), the mqperf load generator, or the mq.client "
                    "library (Producer / PullConsumer) as an application uses it")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    try:
        args = ap.parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    if not (0.05 <= args.seconds <= 600):
        print(f"mqpeers: --seconds must be between 0.05 and 600, not {args.seconds:g}", file=sys.stderr)
        return 2

    # SIGTERM and Ctrl-C unwind, so the ExitStack stops everything this run started; a second
    # signal during that cleanup ends the process at once (SIG_DFL).  While an event loop runs,
    # the handler does not raise where it lands (inside a transport callback uvloop would turn the
    # exception into a "fatal error on transport" and a closed connection): it cancels the loop's
    # tasks instead, and whatever unwinds out of the run is taken as the interruption.
    interrupted = False

    def on_term(signum, frame):
        nonlocal interrupted
        interrupted = True
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        loop = asyncio._get_running_loop()
        if loop is None:
            raise KeyboardInterrupt
        loop.call_soon_threadsafe(lambda: [t.cancel() for t in asyncio.all_tasks(loop)])

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    progress = lambda msg: print(msg, file=sys.stderr, flush=True)       # noqa: E731 (stdout: the results)
    try:
        rows = run_side_by_side(args.seconds, args.only, progress, args.client)
    except BaseException as e:
        if interrupted:
            print("mqpeers: interrupted; everything it started is stopped", file=sys.stderr)
            return 130
        if isinstance(e, (PeerUnavailable, MissingExtra)):
            print(f"mqpeers: {e}", file=sys.stderr)
            return 1
        raise
    if args.json:
        print(json.dumps([r.as_dict() for r in rows], indent=2))
    else:
        print(f"1 KiB messages on 127.0.0.1, {ROUNDS} alternating rounds of ~{args.seconds:g} s per side, medians; "
              f"ratio = ours / peer (msgs/s); latency per request (a pipeline, batch or read is one request); "
              f"our client: {args.client}")
        print(format_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
