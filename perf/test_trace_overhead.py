"""The cost of the broker's perf trace (perfTraceEnable): the io worker's CPU per message
traced stays within 1/0.95 of untraced (untraced / traced >= 0.95).

Two brokers run side by side for the whole test, the same in everything but perfTraceEnable
(1 io worker, ASYNC_FLUSH, 256 MiB CommitLog files, 1 KiB bodies, as in test_broker_bench.py).
One client process (the project's asyncio RemotingClient, one connection per broker) drives the
same produce workload against both AT ONCE for a fixed window, and counts what each answered:
  (a) SEND_MESSAGE_V2 of 1 KiB, PIPELINE_IN_FLIGHT in flight per broker: the per-request case,
      where the trace's few microseconds per request weigh most;
  (b) SEND_BATCH_MESSAGE of 100 x 1 KiB, BATCH_IN_FLIGHT in flight: one record per 100 messages.
Each io worker's CPU time (from /proc) over all windows, divided by the messages it stored, is
its cost per message; the gate is untraced cost / traced cost.  The throughput ratio per window
(traced msgs / untraced msgs, side that starts first alternating) is printed too.

Why the gate is the CPU ratio and not the throughput ratio: the two would agree if the io workers
were the limit, but with one Python client driving both brokers the client is (in 2026-11 the
untraced io worker ran at ~40% of a CPU), so the throughput ratio measures how the client's
time happened to be shared: four quick runs on one idle machine gave medians of 0.51-0.96 while
the CPU ratio of the same runs stayed within 0.74-0.89.  Windows run both sides at once rather
than alternating because on this 2-vCPU VM alternating rounds of one broker against an identical
one differed by 0.3-2.5x with drifts lasting many rounds.  Batches stay noisy either way (first
touches of fresh CommitLog pages, see perf/README.md).

The test also checks that the traced broker wrote one req record per send request, and the
untraced one nothing.  As in the other files: a missed target above the floor prints MISSED and
raises GateMissed; MQ_PERF_STRICT=1 asserts the target.  The floors (constants below) sit under
what this machine measured.  The quick variant runs (a) only, in 10 windows of 0.5 s (~9 s with
the brokers' start); the full one both, in 20 windows (~30 s)."""
from __future__ import annotations

import asyncio
import os
import statistics
import time
from dataclasses import dataclass

import pytest

from mq.cluster import Broker, NameServer
from mq.trace import read_records
from mq.wire.codes import RequestCode as R

from .test_broker_bench import (SAME_RUN, CpuMeter, broker_processes, judge, session,  # noqa: F401 (session: a fixture)
                                wait_io_settled)
from .workloads import (BATCH_MSGS, COMMITLOG_FILE_SIZE, GIB, QUEUES, Session, create_topic, one_kib_batch, send_batch,
                        send_one)

TARGET = 0.95                 # untraced / traced io-worker CPU per message (the "overhead under 5%")
# asserted floors.  (a) quick, on 2026-11-25: 0.74-0.89 over five runs (throughput medians of the
# same runs 0.51-0.96).  (b) its noise is the CommitLog's first page touches, while its real cost
# is one record per 100 messages.
SINGLES_FULL_FLOOR = 0.72
SINGLES_QUICK_FLOOR = 0.70
BATCHES_FLOOR = 0.70
PIPELINE_IN_FLIGHT = 64       # per broker, (a)
BATCH_IN_FLIGHT = 4           # per broker, (b)
SEND_V2, SEND_BATCH = R.SEND_MESSAGE_V2, R.SEND_BATCH_MESSAGE
TOPIC = "PerfTraceOverhead"


@dataclass(frozen=True)
class Scale:
    windows: int              # rounds: one window of each workload
    singles_s: float          # (a) window length
    batches_s: float          # (b) window length (short: every broker writes ~100 MB/s); 0: no (b)
    singles_floor: float


SCALES = [
    # quick: (a) only; (b) needs many windows to get a median out of its noise
    # (10 windows: with 6 the median of one CI run fell to 0.796 while other tests ran beside it)
    pytest.param(Scale(10, 0.5, 0.0, SINGLES_QUICK_FLOOR), id="quick", marks=pytest.mark.quick),
    pytest.param(Scale(20, 1.0, 0.25, SINGLES_FULL_FLOOR), id="full"),
]


@pytest.fixture
def pair(store_dir, need_disk, tmp_path):
    """(untraced, traced): two running brokers, stopped afterwards."""
    need_disk(3 * GIB)
    ns = NameServer(str(tmp_path))
    brokers = []
    try:
        for name, traced in (("plain", "false"), ("traced", "true")):
            brokers.append(Broker(store_dir, ns.addr, name=name, sendMessageThreadPoolNums=1,
                                  mappedFileSizeCommitLog=COMMITLOG_FILE_SIZE, flushDiskType="ASYNC_FLUSH",
                                  perfTraceEnable=traced))
        for b in brokers:           # the gate divides io-worker CPU: none of it may be file preparation
            wait_io_settled(b)
        yield brokers[0], brokers[1]
    finally:
        for b in brokers:
            if b.proc.p.poll() is None:
                b.stop()
        ns.stop()


class Side:
    """One broker's counts over the windows."""

    def __init__(self, name: str, broker: Broker):
        self.name = name
        self.broker = broker
        self.msgs = {"singles": [], "batches": []}        # per window
        self.requests = {"singles": 0, "batches": 0}      # every send request answered, warm-up included
        self.reset_meters()

    def reset_meters(self) -> None:
        procs = self.broker.processes()
        worker = {"io worker": broker_processes(self.broker)["io workers"],   # the gate's
                  # the traced io worker's row formatter, a process of its own (mq.broker.traceformat)
                  "trace formatter": sorted(p for name, ps in procs.items() if name.startswith("trace-") for p in ps)}
        self.meter = {"singles": CpuMeter(worker), "batches": CpuMeter(worker)}


async def _drive(c, side: Side, kind: str, deadline: float, body: bytes) -> int:
    """Sends until `deadline` with the kind's requests in flight; returns the messages stored."""
    addr = side.broker.addr
    in_flight = PIPELINE_IN_FLIGHT if kind == "singles" else BATCH_IN_FLIGHT
    msgs = 0

    async def sender(k: int) -> None:
        nonlocal msgs
        i = k
        while time.monotonic() < deadline:
            if kind == "singles":
                await send_one(c, addr, TOPIC, i % QUEUES)
                msgs += 1
            else:
                await send_batch(c, addr, TOPIC, i % QUEUES, body)
                msgs += BATCH_MSGS
            side.requests[kind] += 1
            i += in_flight

    await asyncio.gather(*(sender(k) for k in range(in_flight)))
    return msgs


def _window(sess: Session, sides: list[Side], kind: str, seconds: float, body: bytes) -> list[int]:
    """Both sides at once for `seconds`, started in the given order; messages stored by each."""
    async def both():
        deadline = time.monotonic() + seconds
        return await asyncio.gather(*(_drive(sess.client, s, kind, deadline, body) for s in sides))
    with sides[0].meter[kind], sides[1].meter[kind]:
        return sess.run(both())


@pytest.mark.parametrize("scale", SCALES)
def test_trace_overhead(benchmark, pair, session: Session, scale: Scale):
    """Gate: with perfTraceEnable the broker keeps >= 95% of its produce throughput, for
    pipelined single sends (and, in the full variant, batches of 100), measured against an
    untraced broker in the same windows; and the traced broker did trace (one req record per
    send request)."""
    benchmark.group = "broker perf trace overhead"
    plain, traced = pair
    c = session.client
    body = one_kib_batch()
    workloads = [("singles", scale.singles_s, f"(a) SEND_MESSAGE_V2, {PIPELINE_IN_FLIGHT} in flight")]
    if scale.batches_s:
        workloads.append(("batches", scale.batches_s, f"(b) SEND_BATCH_MESSAGE of {BATCH_MSGS}, "
                                                      f"{BATCH_IN_FLIGHT} in flight"))
    sides = [Side("untraced", plain), Side("traced", traced)]
    for s in sides:
        session.run(create_topic(c, s.broker.addr, TOPIC))        # one SEND_MESSAGE_V2 each
        s.requests["singles"] += 1
    for kind, seconds, _ in workloads:                            # warm-up: connections, pages, caches
        _window(session, sides, kind, seconds / 2, body)
    for s in sides:
        s.reset_meters()
    rounds = 0

    def one_round() -> None:
        nonlocal rounds
        order = sides if rounds % 2 == 0 else sides[::-1]         # A B, then B A: who starts first
        rounds += 1
        for kind, seconds, _ in workloads:
            for s, n in zip(order, _window(session, order, kind, seconds, body)):
                s.msgs[kind].append(n)

    benchmark.pedantic(one_round, rounds=scale.windows)

    print(f"\nperf trace overhead: an untraced and a traced broker driven at once (1 io worker each, ASYNC_FLUSH, "
          f"1 KiB), {scale.windows} windows per workload, medians; taken on a shared machine")
    ratios = {}
    for kind, seconds, label in workloads:
        print(f"  {label}, windows of {seconds:g} s:")
        for s in sides:
            rate = statistics.median(s.msgs[kind]) / seconds
            cpu_us = s.meter[kind].cpu["io worker"] / max(1, sum(s.msgs[kind])) * 1e6
            fmt_us = s.meter[kind].cpu["trace formatter"] / max(1, sum(s.msgs[kind])) * 1e6
            print(f"    {s.name:9} {rate:9,.0f} msgs/s (windows {min(s.msgs[kind]) / seconds:,.0f}-"
                  f"{max(s.msgs[kind]) / seconds:,.0f})  io worker CPU {cpu_us:6.1f} us per message"
                  + (f" (+ its trace formatter's {fmt_us:.2f})" if s.meter[kind].groups["trace formatter"] else ""))
            benchmark.extra_info[f"{kind}_{s.name}_msgs_per_s"] = rate
            benchmark.extra_info[f"{kind}_{s.name}_io_cpu_us_per_msg"] = cpu_us
        per_window = [t / u for u, t in zip(sides[0].msgs[kind], sides[1].msgs[kind])]
        throughput_ratio = statistics.median(per_window)
        cpu = [s.meter[kind].cpu["io worker"] / max(1, sum(s.msgs[kind])) for s in sides]
        ratios[kind] = cpu[0] / cpu[1] if cpu[1] else float("nan")
        print(f"    traced / untraced throughput per window: {', '.join(f'{r:.2f}' for r in per_window)}")
        print(f"    throughput median {throughput_ratio:.3f}; io worker CPU per message, untraced / traced "
              f"(the gate): {ratios[kind]:.3f}")
        benchmark.extra_info[f"{kind}_ratio"] = throughput_ratio
        benchmark.extra_info[f"{kind}_cpu_ratio"] = ratios[kind]

    # the traced broker traced: one req record per send request it answered; the other wrote nothing
    traced.stop()
    req = [r for r in read_records(os.path.join(traced.dir, "perftrace")) if r["kind"] == "req"]
    assert sum(r["code"] == SEND_V2 for r in req) == sides[1].requests["singles"]
    assert sum(r["code"] == SEND_BATCH for r in req) == sides[1].requests["batches"]
    assert not os.path.exists(os.path.join(plain.dir, "perftrace"))
    print(f"  the traced broker wrote {len(req):,} req records, one per request; the untraced one none")
    try:
        judge("(a) pipelined single sends, io worker CPU per message untraced / traced", ratios["singles"], TARGET,
              scale.singles_floor, SAME_RUN)
    finally:
        if "batches" in ratios:
            judge("(b) batches of 100, io worker CPU per message untraced / traced", ratios["batches"], TARGET,
                  BATCHES_FLOOR, SAME_RUN)
