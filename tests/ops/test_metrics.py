"""Prometheus metrics (metricsPort; mq.broker.metrics, mq.store.stats, mq.broker.iostats).

Unit: the stats block sums rows over regions, a restarted writer continues its rows (no reset,
no double count), a full region spills into the kind's "~other" row, and the io worker's
bookkeeping costs well under a microsecond a send (measured and printed).
Integration: a real name server and broker; sends and pulls with mq.client; the scraped
counters equal what was sent, stored, pulled and committed; the send latency histogram counts
every send; the flush histograms count every message (SYNC_FLUSH); an io worker killed with
SIGKILL is counted as a restart and its totals survive; metricsPort=0 serves nothing but still
counts (the stats block feeds mqadmin statsAll).  The median time of a scrape is measured and printed."""
import asyncio
import os
import signal
import statistics
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from mq.broker.iostats import IoStats, KIND_SEND
from mq.broker.metrics import LATENCY_KS, _buckets
from mq.client import Message, Producer, PullConsumer
from mq.cluster import Broker, NameServer, free_port, wait_for
from mq.store.stats import (HIST_BUCKETS, HIST_SUM, OTHER, ROWS_RESERVED, StatsBlock, region_of,
                            remove_stats_segment, stats_segment_name)


# ---- the stats block ---------------------------------------------------------------------------------
def test_rows_are_summed_over_regions_and_published_only_on_publish(tmp_path):
    block = StatsBlock(str(tmp_path), regions=3, create=True)
    try:
        io0, io1 = block.writer(region_of("io", 0)), block.writer(region_of("io", 1))
        flush = block.writer(region_of("flush", regions=block.regions))
        assert flush.region == 2
        a0 = io0.row("put", "TopicA")
        a0[0] += 5
        a0[1] += 500
        assert block.read()[("put", "TopicA")][:2] == [0, 0]        # made, not published yet
        io0.publish()
        a1 = io1.row("put", "TopicA")
        a1[0] += 2
        a1[1] += 20
        io1.row("get", "G\x01TopicA")[0] += 7
        io1.publish()
        got = block.read()
        assert got[("put", "TopicA")][:2] == [7, 520]
        assert got[("get", "G\x01TopicA")][0] == 7
        assert io0.row("put", "TopicA") is a0                        # one list per key
        # another process's view (attach by the store root alone)
        other = StatsBlock(str(tmp_path))
        try:
            assert other.read() == got
            assert other.region_info(0)[:2] == (1, os.getpid())
        finally:
            other.close()
    finally:
        block.close()
    with pytest.raises(FileNotFoundError):
        StatsBlock(str(tmp_path))                                    # the owner's close unlinked it


def test_a_restarted_writer_continues_its_rows(tmp_path):
    """The role restart contract: a new writer on the same region reads its rows back and
    continues them (totals neither reset nor double-counted); what was not published is lost."""
    block = StatsBlock(str(tmp_path), regions=1, create=True)
    try:
        w = block.writer(0)
        w.row("put", "T")[0] += 10
        w.publish()
        w.row("put", "T")[0] += 3                                    # never published: the "kill"
        w2 = block.writer(0)
        row = w2.row("put", "T")
        assert row[0] == 10
        row[0] += 1
        w2.publish()
        assert block.read()[("put", "T")][0] == 11
        assert block.region_info(0) == (1, os.getpid(), 2)           # one row, two starts
    finally:
        block.close()


def test_a_full_region_spills_into_the_other_row(tmp_path):
    block = StatsBlock(str(tmp_path), regions=1, create=True, rows_max=ROWS_RESERVED + 4)
    try:
        w = block.writer(0)
        for i in range(10):
            w.row("put", f"T{i}")[0] += 1
        w.row("put", "x" * 300)[0] += 1                               # a key too long for a row
        w.publish()
        got = block.read()
        assert {name for kind, name in got} == {"T0", "T1", "T2", "T3", OTHER}
        assert got[("put", OTHER)][0] == 7
        assert sum(v[0] for v in got.values()) == 11
    finally:
        block.close()


@pytest.mark.host_exclusive          # a broker started meanwhile would sweep the stale segment
def test_stale_segment_is_replaced_or_removed(tmp_path):
    root = str(tmp_path)
    stale = StatsBlock(root, regions=1, create=True)
    stale.writer(0).row("put", "T")[0] += 1
    stale.owner = False                                              # a crashed owner: never unlinked
    stale.close()
    assert os.path.exists("/dev/shm/" + stats_segment_name(root))
    fresh = StatsBlock(root, regions=2, create=True)
    assert fresh.read() == {} and fresh.regions == 2
    fresh.owner = False
    fresh.close()
    assert remove_stats_segment(root) and not remove_stats_segment(root)


def test_latency_buckets_and_exposition():
    """bit_length buckets of microseconds, exposed cumulative with le = 2**k us."""
    block_row = [0] * 32

    class W:
        def row(self, kind, name):
            assert (kind, name) == (KIND_SEND, "0")
            return block_row
    st = IoStats(W())
    st.sent(0, 10_000)            # 10 us -> bit_length(10) = 4 -> le 16 us
    st.sent(0, 100_000, 2)        # 100 us -> 7 -> le 128 us
    st.sent(0, 10**12)            # past the last bucket
    assert block_row[4] == 1 and block_row[7] == 2 and block_row[HIST_BUCKETS - 1] == 1
    assert block_row[HIST_SUM] == 10_000 + 200_000 + 10**12
    buckets, count = _buckets(block_row, LATENCY_KS, 1e-6)
    assert count == 4 and buckets[-1] == ("+Inf", 4)
    le = dict(buckets)
    assert le[repr(16e-6)] == 1 and le[repr(64e-6)] == 1 and le[repr(128e-6)] == 3
    assert le[repr(float(2 ** LATENCY_KS[1]) * 1e-6)] == 3


# ---- a real broker -------------------------------------------------------------------------------------
def scrape(port: int) -> dict:
    """{(name, frozenset(labels without cluster/broker)): value} of one scrape."""
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out = {}
    for fam in text_string_to_metric_families(body):
        for s in fam.samples:
            labels = {k: v for k, v in s.labels.items() if k not in ("cluster", "broker")}
            out[(s.name, frozenset(labels.items()))] = s.value
    return out


def scraped_if(port: int, cond) -> dict | None:
    """One scrape if cond(scrape) holds, else None (for wait_for)."""
    m = scrape(port)
    return m if cond(m) else None


def value(m: dict, name: str, **labels) -> float | None:
    return m.get((name, frozenset(labels.items())))


def total(m: dict, name: str, **labels) -> float:
    want = set(labels.items())
    return sum(v for (n, ls), v in m.items() if n == name and want <= ls)


@pytest.fixture
def metered(tmp_path):
    ns = NameServer(str(tmp_path))
    port = free_port()
    broker = Broker(str(tmp_path), ns.addr, sendMessageThreadPoolNums=2, metricsPort=port,
                    flushDiskType="SYNC_FLUSH")
    yield ns, broker, port
    assert broker.stop() == 0, broker.proc.output()[-3000:]
    ns.stop()


def test_metrics_of_a_real_broker(metered):
    ns, broker, port = metered
    assert "Prometheus metrics on http://127.0.0.1:%d/metrics" % port in broker.proc.output()
    sent = {"MetricsA": 60, "MetricsB": 25}
    bodies = {t: [f"{t}-{i}-" * (1 + i % 5) for i in range(n)] for t, n in sent.items()}
    consumed = {}

    async def flow():
        async with Producer("PG_metrics", ns.addr) as p:
            for t, msgs in bodies.items():
                for b in msgs:
                    assert (await p.send(Message(t, b.encode()))).status.name == "SEND_OK"
        async with PullConsumer("CG_metrics", ns.addr) as c:
            queues = await c.fetch_queues("MetricsA")
            got = 0
            for q in queues[:2]:                           # consume two queues of four, commit them
                # held until dispatch filed them (SEND_OK follows the append, the queues follow
                # dispatch: an immediate pull found none once under CI load, and `got` stayed 0)
                r = await c.pull(q, 0, 32, block=True, suspend_timeout_ms=5000)
                n = len(r.messages)
                got += n
                if n:
                    await c.update_offset(q, n)
            consumed["MetricsA"] = got
            consumed["queues"] = len(queues)
    asyncio.run(asyncio.wait_for(flow(), 90))
    n_sent = sum(sent.values())

    want = {**{f"put {t}": n for t, n in sent.items()}, "got": consumed["MetricsA"], "flushed": n_sent,
            "dispatch behind": 0}
    seen = {}

    def settled():
        m = scrape(port)
        # every count is published within PUBLISH_INTERVAL_S of the request, each io worker its
        # own (every topic's count is waited for, not one's); the pulls came last
        seen.update({**{f"put {t}": value(m, "rocketmq_topic_put_messages_total", topic=t) for t in sent},
                     "got": value(m, "rocketmq_group_get_messages_total", group="CG_metrics", topic="MetricsA"),
                     "flushed": total(m, "mq_flush_group_messages_sum"),
                     "dispatch behind": value(m, "rocketmq_brokeruntime_dispatch_behind_bytes")})
        return m if seen == want else None
    try:
        m = wait_for(settled, 10, 0.1, "published counters")
    except TimeoutError as e:
        raise AssertionError(f"{e}: last scrape {seen}, want {want}") from e
    for t, n in sent.items():
        assert value(m, "rocketmq_topic_put_messages_total", topic=t) == n
        assert value(m, "rocketmq_topic_put_bytes_total", topic=t) == sum(len(b.encode()) for b in bodies[t])
        assert value(m, "rocketmq_producer_tps", topic=t) is not None
    assert consumed["MetricsA"] > 0
    # lag: what the group has not committed (two queues never committed count whole)
    assert value(m, "rocketmq_group_diff", group="CG_metrics", topic="MetricsA") == \
        sent["MetricsA"] - consumed["MetricsA"]
    assert value(m, "rocketmq_group_get_messages_total", group="CG_metrics", topic="MetricsA") == consumed["MetricsA"]
    assert value(m, "rocketmq_group_get_bytes_total", group="CG_metrics", topic="MetricsA") > 0
    # every send is in the latency histogram, all SEND_OK; +Inf == count
    assert total(m, "mq_send_latency_seconds_count") == n_sent
    assert value(m, "mq_send_latency_seconds_count", status="SUCCESS") == n_sent
    assert value(m, "mq_send_latency_seconds_bucket", status="SUCCESS", le="+Inf") == n_sent
    assert 0 < value(m, "mq_send_latency_seconds_sum", status="SUCCESS") < n_sent * 5
    # SYNC_FLUSH: every message flushed; groups of at most every message
    flushes = value(m, "mq_flush_latency_seconds_count")
    assert 1 <= flushes <= n_sent and value(m, "mq_flush_group_messages_count") == flushes
    assert value(m, "mq_flush_group_bytes_sum") > 0 and value(m, "mq_flush_behind_bytes") == 0
    assert value(m, "mq_io_workers") == 2
    assert value(m, "mq_ha_slaves") == 0
    assert 0 < value(m, "rocketmq_brokeruntime_commitlog_disk_ratio") <= 1
    assert value(m, "rocketmq_broker_tps") >= 0 and value(m, "rocketmq_broker_qps") >= 0
    # rates: live totals against the oldest sample of the 10 s window
    m = wait_for(lambda: scraped_if(port, lambda m: value(m, "rocketmq_broker_tps") > 0), 5, 0.2, "tps")
    assert value(m, "rocketmq_broker_tps") == pytest.approx(
        sum(value(m, "rocketmq_producer_tps", topic=t) for t in sent))

    # the scrape's cost, end to end (connect, collect, format, read)
    times = []
    for _ in range(50):
        t0 = time.perf_counter()
        raw = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
        times.append(time.perf_counter() - t0)
    print(f"\nscrape: median {statistics.median(times) * 1e3:.2f} ms of 50 ({len(m)} samples, {len(raw)} bytes)")
    assert statistics.median(times) < 0.25

    # other paths
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/nope", timeout=5)
    assert e.value.code == 404
    head = urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/metrics", method="HEAD"), timeout=5)
    assert head.status == 200 and head.read() == b""

    # an io worker killed with SIGKILL: counted as a restart, its totals survive its restart
    victim = broker.processes()["io-1"][0]
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: scraped_if(port, lambda m: value(m, "mq_role_restarts_total", role="io-1") == 1
                                and value(m, "mq_io_workers") == 2), 30, 0.2, "restart counted")
    wait_for(lambda: broker.processes().get("io-1", [victim]) != [victim], 30, what="io-1 back")
    # the new io-1 publishes the rows it continues within PUBLISH_INTERVAL_S; until then its
    # region reads as empty, and once published the totals must be exactly what was sent
    m = wait_for(lambda: scraped_if(port, lambda m: total(m, "mq_send_latency_seconds_count") == n_sent), 10, 0.1,
                 "io-1's continued rows")
    for t, n in sent.items():
        assert value(m, "rocketmq_topic_put_messages_total", topic=t) == n


def test_metrics_port_0_serves_nothing_but_still_counts(tmp_path):
    """No endpoint; the counters are still kept (mqadmin statsAll reads them through
    VIEW_BROKER_STATS_DATA), as RocketMQ's BrokerStatsManager always counts."""
    ns = NameServer(str(tmp_path))
    broker = Broker(str(tmp_path), ns.addr, sendMessageThreadPoolNums=1)
    try:
        async def send():
            async with Producer("PG_nometrics", ns.addr) as p:
                await p.send(Message("NoMetrics", b"x"))
        asyncio.run(asyncio.wait_for(send(), 60))
        assert "Prometheus metrics" not in broker.proc.output()
        assert os.path.exists("/dev/shm/" + stats_segment_name(broker.dir))
    finally:
        assert broker.stop() == 0
        ns.stop()


def test_metrics_port_is_a_broker_option():
    from mq.broker.config import ALL_OPTIONS, BrokerConfig
    assert ALL_OPTIONS["metricsPort"].default == 0
    assert BrokerConfig({"metricsPort": "9600"}).metricsPort == 9600
    with pytest.raises(ValueError):
        BrokerConfig({"metricsPort": "70000"})


def test_grafana_dashboard_uses_only_exposed_metrics():
    """conf/grafana/rocketmq-broker.json (shipped as mq.conf package data) is valid JSON and
    every metric its queries name is a family the collector declares (counters with _total,
    histograms with _bucket/_sum/_count)."""
    import json
    import re
    from mq import conf
    from mq.broker import metrics
    with open(conf.path("grafana", "rocketmq-broker.json")) as f:
        dash = json.load(f)
    with open(metrics.__file__) as f:
        src = f.read()
    declared = set()
    for kind, name in re.findall(r'(Counter|Gauge|Histogram)MetricFamily\(\s*"((?:rocketmq|mq)_\w+)"', src):
        declared |= {"Counter": {name + "_total"}, "Gauge": {name},
                     "Histogram": {name + "_bucket", name + "_sum", name + "_count"}}[kind]
    declared |= set(re.findall(r'self\._gauge\(\s*"((?:rocketmq|mq)_\w+)"', src))
    declared |= {n + "_total" for n in re.findall(r'self\._counter\(\s*"((?:rocketmq|mq)_\w+)"', src)}
    declared |= {n for _, n, *_ in re.findall(r'\("(\w+)", "((?:mq)_\w+)"', src)
                 for n in (n + "_bucket", n + "_sum", n + "_count")}
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    used = {n for e in exprs for n in re.findall(r"\b((?:rocketmq|mq)_[a-z_]+)\b", e)}
    assert len(exprs) >= 10 and used, exprs
    assert used <= declared, sorted(used - declared)
    titles = " ".join(p["title"] for p in dash["panels"]).lower()
    for want in ("put tps", "lag", "send latency", "flush latency", "dispatch", "replication", "dledger", "disk",
                 "damage"):
        assert want in titles, want


def test_replication_lag_of_a_slave(tmp_path):
    """Master/slave: the master's scrape names its connected slave and how far behind it is
    (0 once it acknowledged everything); the slave's own scrape has no slaves."""
    ns = NameServer(str(tmp_path))
    mport, sport = free_port(), free_port()
    master = Broker(str(tmp_path), ns.addr, name="broker-a", metricsPort=mport)
    slave = Broker(str(tmp_path), ns.addr, name="broker-a", brokerRole="SLAVE", brokerId=1, metricsPort=sport)
    try:
        async def send():
            async with Producer("PG_ha_metrics", ns.addr) as p:
                for i in range(20):
                    await p.send(Message("HaMetrics", b"x" * 100))
        asyncio.run(asyncio.wait_for(send(), 60))

        def caught_up():
            m = scrape(mport)
            lags = [v for (n, ls), v in m.items() if n == "mq_ha_slave_lag_bytes"]
            return m if value(m, "mq_ha_slaves") == 1 and lags == [0] else None
        m = wait_for(caught_up, 30, 0.2, "the slave acknowledging everything")
        assert value(m, "rocketmq_topic_put_messages_total", topic="HaMetrics") == 20
        s = scrape(sport)
        assert value(s, "mq_ha_slaves") == 0 and value(s, "mq_io_workers") >= 1
    finally:
        slave.stop()
        master.stop()
        ns.stop()


def test_dledger_role_term_and_lag(tmp_path):
    """DLedger: every member's scrape says its Raft role (exactly one LEADER among three) and the
    same term; the leader lists both followers' lag, 0 once they caught up."""
    from mq.cluster import DLedgerGroup
    ns = NameServer(str(tmp_path))
    ports = {}
    group = None
    try:
        group = DLedgerGroup(str(tmp_path), ns.addr,
                             options_for=lambda i: {"metricsPort": ports.setdefault(i, free_port())})
        leader = group.wait_leader(60)

        def settled():
            ms = {i: scrape(ports[i]) for i in group.ids}
            roles = {i: [r for r in ("LEADER", "FOLLOWER", "CANDIDATE") if value(m, "mq_dledger_role", role=r) == 1]
                     for i, m in ms.items()}
            lags = {ls: v for (n, ls), v in ms[leader].items() if n == "mq_dledger_follower_lag_entries"}
            ok = (roles[leader] == ["LEADER"] and all(roles[i] == ["FOLLOWER"] for i in group.ids if i != leader)
                  and len({value(m, "mq_dledger_term") for m in ms.values()}) == 1 and len(lags) == 2
                  and set(lags.values()) == {0})
            return ms if ok else None
        ms = wait_for(settled, 30, 0.2, "roles, terms and follower lags")
        assert value(ms[leader], "mq_dledger_term") >= 1
        assert value(ms[leader], "mq_dledger_commit_lag_entries") == 0
        assert value(ms[leader], "mq_dledger_index_units_repaired_total") == 0
        assert value(ms[leader], "mq_dledger_damaged_entries_found_total") == 0
        assert value(ms[leader], "mq_dledger_entries_repaired_total") == 0
    finally:
        if group is not None:
            group.close()
        ns.stop()
