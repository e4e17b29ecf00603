"""The broker's Prometheus endpoint: `metricsPort` > 0 makes the supervisor serve Prometheus's
text exposition format on http://<listenAddress>:<metricsPort>/metrics.

Where each number comes from, read afresh on every scrape by one custom collector (no global
metric objects; prometheus_client only formats):
    stats block (mq.store.stats)    counters the io workers and the flush role keep, summed over
                                    their regions: puts and gets (mq.broker.iostats), send latency,
                                    flush latency and group sizes (mq.store.flush)
    control block (mq.store.control) dispatch and flush positions, DLedger indexes
    metadata (mq.broker.metadata)   consumer offsets, for each group's lag
    ha-status.json (hastatus)       what the HA role knows of each slave (master/slave mode)
    dledger status file             Raft role and term, followers' match indexes (DLedger mode)
    the supervisor                  io workers alive, restarts of each role
The TPS gauges are rates of the put and get counters over the last RATE_WINDOW_S, from the
samples the supervisor keeps for statsAll (mq.broker.statsdata.StatsHistory).

Every sample carries `cluster` and `broker` (brokerClusterName, brokerName), as
rocketmq-exporter's do; names that rocketmq-exporter has keep its name (rocketmq_*), ours
are mq_*.  Histograms have log2 buckets (mq.store.stats): `le` is 2**k microseconds (latency),
bytes or messages.

The server is a minimal HTTP/1.1 responder on the supervisor's event loop (asyncio streams):
the collector then reads metadata on the thread that changes it, with no lock.  One request
per connection; GET or HEAD of /metrics or /; anything else 404/405."""
from __future__ import annotations

import asyncio
import logging

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from prometheus_client.registry import CollectorRegistry

from mq import loop as mq_loop
from mq.dledger.role import read_status
from mq.gateway.stats import KIND_MSGS as GRPC_KIND_MSGS, KIND_RPC as GRPC_KIND_RPC, SEP as GRPC_SEP
from mq.wire.codes import RESPONSE_NAMES
from mq.store import control as C
from mq.store.stats import HIST_BUCKETS, HIST_SUM, StatsBlock

from .admin import _disk_ratio
from .hastatus import HAStatus
from .iostats import GROUP_TOPIC_SEP, KIND_GET, KIND_PUT, KIND_SEND, KIND_STORE
from .statsdata import StatsHistory

log = logging.getLogger("mq.broker.metrics")

RATE_WINDOW_S = 10.0
REQUEST_HEAD_MAX = 8192          # bytes of request line and headers read before giving up
REQUEST_TIMEOUT_S = 5.0
DLEDGER_ROLES = ("LEADER", "CANDIDATE", "FOLLOWER")

# histogram buckets exposed, as (first k, last k) of le = 2**k in the row's unit: the rows hold
# HIST_BUCKETS cells (k = 0 .. HIST_BUCKETS-1, the last open-ended); k below `first` fold into
# the first bucket (buckets are cumulative)
LATENCY_KS = (4, 25)             # 16 us .. 33.5 s
BYTES_KS = (10, 28)              # 1 KiB .. 256 MiB
MESSAGES_KS = (0, 16)            # 1 .. 65536


def _buckets(row: list[int], ks: tuple[int, int], scale: float) -> tuple[list[tuple[str, float]], int]:
    """Cumulative (le, count) pairs of a log2 histogram row, +Inf last; and the count."""
    first, last = ks
    assert 0 <= first <= last < HIST_BUCKETS - 1, ks
    out = []
    running = sum(row[:first])
    for k in range(first, last + 1):
        running += row[k]
        out.append((repr(float(2 ** k * scale)), running))
    count = sum(row[:HIST_BUCKETS])
    out.append(("+Inf", count))
    return out, count


class BrokerCollector:
    """The custom collector: every family, read from the supervisor's state on each collect()."""

    def __init__(self, supervisor, block: StatsBlock, history: StatsHistory):
        self.sup = supervisor
        self.block = block
        self.history = history
        self.ha_status = HAStatus(supervisor.config.storePathRootDir)

    def collect(self):
        sup = self.sup
        cfg = sup.config
        const = [cfg.brokerClusterName, cfg.brokerName]
        base = ["cluster", "broker"]
        totals = self.block.read()
        rates = self.history.rates(RATE_WINDOW_S)

        put_msgs = CounterMetricFamily("rocketmq_topic_put_messages", "Messages stored by sends, by topic",
                                       labels=base + ["topic"])
        put_bytes = CounterMetricFamily("rocketmq_topic_put_bytes", "Body bytes of the messages stored by sends, "
                                        "by topic (a batch: its batch body)", labels=base + ["topic"])
        producer_tps = GaugeMetricFamily("rocketmq_producer_tps", f"Messages stored per second by topic, over the "
                                         f"last {RATE_WINDOW_S:g} s", labels=base + ["topic"])
        get_msgs = CounterMetricFamily("rocketmq_group_get_messages", "Messages returned by pulls, by consumer group "
                                       "and topic", labels=base + ["group", "topic"])
        get_bytes = CounterMetricFamily("rocketmq_group_get_bytes", "Stored record bytes returned by pulls, by "
                                        "consumer group and topic", labels=base + ["group", "topic"])
        consumer_tps = GaugeMetricFamily("rocketmq_consumer_tps", f"Messages returned per second by consumer group "
                                         f"and topic, over the last {RATE_WINDOW_S:g} s",
                                         labels=base + ["group", "topic"])
        send_latency = HistogramMetricFamily("mq_send_latency_seconds", "Send requests by response status: time "
                                             "from the event-loop pass that read the request to its answer",
                                             labels=base + ["status"])
        grpc_latency = HistogramMetricFamily("mq_grpc_request_latency_seconds", "gRPC calls of 5.x clients by RPC "
                                             "and the Status code answered (a ReceiveMessage stream: its first "
                                             "status; long polling included)", labels=base + ["rpc", "code"])
        grpc_msgs = CounterMetricFamily("mq_grpc_messages", "Messages through the gRPC endpoint: sent (stored), "
                                        "received (delivered by ReceiveMessage), acked, revived (not acked in "
                                        "their invisible time, sent back for redelivery)", labels=base + ["what"])
        broker_tps = broker_qps = 0.0
        for (kind, name), vals in sorted(totals.items()):
            if kind == KIND_PUT:
                put_msgs.add_metric(const + [name], vals[0])
                put_bytes.add_metric(const + [name], vals[1])
                tps = rates.get((kind, name), 0.0)
                producer_tps.add_metric(const + [name], tps)
                broker_tps += tps
            elif kind == KIND_GET:
                group, _, topic = name.partition(GROUP_TOPIC_SEP)
                get_msgs.add_metric(const + [group, topic], vals[0])
                get_bytes.add_metric(const + [group, topic], vals[1])
                tps = rates.get((kind, name), 0.0)
                consumer_tps.add_metric(const + [group, topic], tps)
                broker_qps += tps
            elif kind == KIND_SEND:
                status = RESPONSE_NAMES.get(int(name), name) if name.lstrip("-").isdigit() else name
                buckets, _ = _buckets(vals, LATENCY_KS, 1e-6)
                send_latency.add_metric(const + [status], buckets, vals[HIST_SUM] / 1e9)
            elif kind == GRPC_KIND_RPC:
                rpc, _, code = name.partition(GRPC_SEP)
                buckets, _ = _buckets(vals, LATENCY_KS, 1e-6)
                grpc_latency.add_metric(const + [rpc, code], buckets, vals[HIST_SUM] / 1e9)
            elif kind == GRPC_KIND_MSGS:
                grpc_msgs.add_metric(const + [name], vals[0])
        yield from (put_msgs, put_bytes, producer_tps, get_msgs, get_bytes, consumer_tps, send_latency, grpc_latency,
                    grpc_msgs)
        yield self._gauge("rocketmq_broker_tps", f"Messages stored per second, over the last {RATE_WINDOW_S:g} s",
                          base, const, broker_tps)
        yield self._gauge("rocketmq_broker_qps", f"Messages returned by pulls per second, over the last "
                          f"{RATE_WINDOW_S:g} s", base, const, broker_qps)
        yield self._group_diff(base, const)
        yield from self._flush(totals, base, const)
        yield from self._store(base, const)
        yield from self._integrity(totals, base, const)
        yield from self._replication(base, const)
        yield from self._processes(base, const)
        yield from self._transactions(base, const)

    # ---- helpers ---------------------------------------------------------------------------------------
    @staticmethod
    def _gauge(name: str, doc: str, labels: list[str], values: list[str], value: float) -> GaugeMetricFamily:
        g = GaugeMetricFamily(name, doc, labels=labels)
        g.add_metric(values, value)
        return g

    def _group_diff(self, base, const) -> GaugeMetricFamily:
        """Each group's lag per topic: the broker's max offset minus the group's committed offset,
        summed over the topic's queues (a queue with no committed offset counts whole), as
        GET_CONSUME_STATS's diffTotal (mq.broker.admin).  Max offsets come from the control block
        without opening the queue: the supervisor's store may create queues, a scrape must not."""
        sup = self.sup
        ctl = sup.store.ctl
        fam = GaugeMetricFamily("rocketmq_group_diff", "Messages not yet consumed: the broker's max offset minus "
                                "the group's committed offset, summed over the topic's queues",
                                labels=base + ["group", "topic"])
        for key, table in sorted(sup.metadata.offsets.items()):
            topic, _, group = key.rpartition("@")
            tc = sup.metadata.topic(topic)
            queues = range(tc["readQueueNums"]) if tc else sorted(table)
            diff = 0
            for q in queues:
                off = table.get(q, -1)
                slot = ctl.queue_slot(topic, q)
                broker_max = ctl.queue_get(slot, C.Q_CQ_MAX) if slot is not None else 0
                diff += max(0, broker_max - max(off, 0))
            fam.add_metric(const + [group, topic], diff)
        return fam

    def _flush(self, totals, base, const):
        for name, metric, doc, ks, unit_scale, sum_scale in (
                ("latency", "mq_flush_latency_seconds", "Time of each CommitLog flush (msync) that moved the "
                 "flushed position", LATENCY_KS, 1e-6, 1e-9),
                ("bytes", "mq_flush_group_bytes", "Bytes made durable by each flush (the group commit's size)",
                 BYTES_KS, 1, 1),
                ("messages", "mq_flush_group_messages", "Messages made durable by each flush (the group commit's "
                 "size; a message racing a flush may count in the next one)", MESSAGES_KS, 1, 1)):
            fam = HistogramMetricFamily(metric, doc, labels=base)
            row = totals.get(("flush", name))
            if row is not None:
                buckets, _ = _buckets(row, ks, unit_scale)
                fam.add_metric(const, buckets, row[HIST_SUM] * sum_scale)
            yield fam

    def _store(self, base, const):
        ctl = self.sup.store.ctl
        write = ctl.get(C.POS_WRITE)
        yield self._gauge("rocketmq_brokeruntime_dispatch_behind_bytes", "CommitLog bytes written but not yet "
                          "dispatched to the ConsumeQueues", base, const, max(0, write - ctl.get(C.POS_DISPATCHED)))
        yield self._gauge("mq_flush_behind_bytes", "CommitLog bytes written but not yet flushed", base, const,
                          max(0, write - ctl.get(C.POS_FLUSHED)))
        yield self._gauge("rocketmq_brokeruntime_commitlog_disk_ratio", "Used fraction of the CommitLog's file "
                          "system", base, const, _disk_ratio(self.sup.store))

    def _integrity(self, totals, base, const):
        """Damage the store met: on the read path since the start (the io workers' rows) and at this
        start's recovery (the supervisor's report)."""
        def row(name: str) -> int:
            return (totals.get((KIND_STORE, name)) or [0])[0]
        yield self._counter("mq_store_damaged_records_skipped", "Reads of records that failed the read check "
                            "(damaged since written): skipped, never served", base, const, row("damaged_skipped"))
        yield self._counter("mq_store_damaged_entries_found", "Reads of damaged ConsumeQueue entries whose record "
                            "was found whole in the CommitLog and served", base, const, row("entries_found"))
        rep = self.sup.store.recovery
        yield self._gauge("mq_store_recovery_dropped_bytes", "Bytes of data past the damage this start's recovery "
                          "truncated the CommitLog at", base, const, rep.dropped_bytes)
        yield self._gauge("mq_store_recovery_cq_entries_cut", "ConsumeQueue entries this start's recovery cut "
                          "(their records were past the recovered end)", base, const, rep.cq_entries_truncated)
        yield self._gauge("mq_store_recovery_queues_rebuilt", "ConsumeQueues this start's recovery rebuilt from "
                          "the CommitLog", base, const, len(rep.queues_rebuilt))
        yield self._gauge("mq_store_recovery_records_refused", "Records this start's recovery left out of every "
                          "ConsumeQueue (damaged queue fields)", base, const, rep.records_refused)

    def _replication(self, base, const):
        sup = self.sup
        ctl = sup.store.ctl
        if sup.dledger:
            st = read_status(sup.config.storePathRootDir) or {}
            yield self._gauge("mq_dledger_term", "The DLedger member's current Raft term", base, const,
                              int(st.get("term") or 0))
            role = GaugeMetricFamily("mq_dledger_role", "1 for the DLedger member's current Raft role",
                                     labels=base + ["role"])
            for r in DLEDGER_ROLES:
                role.add_metric(const + [r], 1 if st.get("role") == r else 0)
            yield role
            last = ctl.get(C.POS_DL_NEXT_INDEX) - 1
            committed = ctl.get(C.POS_DL_COMMIT_INDEX) - 1
            yield self._gauge("mq_dledger_commit_lag_entries", "Entries of the local log not known committed "
                              "(last index minus committed index)", base, const, max(0, last - committed))
            yield self._counter("mq_dledger_index_units_repaired", "DLedger index units that disagreed with their "
                                "entries (damaged since written) and were rewritten from them, by the Raft role "
                                "since it started", base, const, int(st.get("indexUnitsRepaired") or 0))
            yield self._counter("mq_dledger_damaged_entries_found", "Times this member, leading, had to serve a "
                                "follower an entry of its own log that fails its checks (damaged since written; "
                                "never sent: leadership goes to a member holding it), by the Raft role since it "
                                "started", base, const, int((st.get("stats") or {}).get("damaged_entries_found") or 0))
            yield self._counter("mq_dledger_entries_repaired", "Entries of this member's log that were damaged and "
                                "were rewritten from another member's copy (GET), by the Raft role since it started",
                                base, const, int((st.get("stats") or {}).get("entries_repaired") or 0))
            lag = GaugeMetricFamily("mq_dledger_follower_lag_entries", "On the leader: entries each follower's "
                                    "log is behind the leader's last index", labels=base + ["peer"])
            if st.get("role") == "LEADER":
                for peer, v in sorted((st.get("peers") or {}).items()):
                    lag.add_metric(const + [peer], max(0, last - int(v.get("match", -1))))
            yield lag
            return
        slaves = self.ha_status.slaves() if sup.config.brokerRole != "SLAVE" else []
        yield self._gauge("mq_ha_slaves", "Slaves connected to this master", base, const, len(slaves))
        lag = GaugeMetricFamily("mq_ha_slave_lag_bytes", "CommitLog bytes each slave has not acknowledged yet",
                                labels=base + ["slave"])
        write = ctl.get(C.POS_WRITE)
        for s in slaves:
            lag.add_metric(const + [str(s.get("addr"))], max(0, write - int(s.get("ackOffset") or 0)))
        yield lag

    def _transactions(self, base, const):
        tx = getattr(self.sup, "transactions", None)
        if tx is None:
            return
        yield self._gauge("mq_transaction_half_pending", "Half messages from the transaction check position on "
                          "(copies made by checks included): transactions not yet passed by the check",
                          base, const, tx.pending())
        yield self._counter("mq_transaction_checks", "CHECK_TRANSACTION_STATE requests sent to producers", base,
                            const, tx.checks_sent)
        yield self._counter("mq_transaction_discarded", "Half messages moved to TRANS_CHECK_MAX_TIME_TOPIC after "
                            "transactionCheckMax checks or fileReservedTime", base, const, tx.discarded)

    @staticmethod
    def _counter(name: str, doc: str, labels: list[str], values: list[str], value: float) -> CounterMetricFamily:
        c = CounterMetricFamily(name, doc, labels=labels)
        c.add_metric(values, value)
        return c

    def _processes(self, base, const):
        sup = self.sup
        yield self._gauge("mq_io_workers", "io worker processes alive", base, const,
                          sum(1 for p in sup.workers.values() if p.is_alive()))
        restarts = CounterMetricFamily("mq_role_restarts", "Restarts of each role process after it died",
                                       labels=base + ["role"])
        for role, n in sorted(sup.restarts_by_role.items()):
            restarts.add_metric(const + [role], n)
        yield restarts


class MetricsServer:
    """GET /metrics over HTTP on the supervisor's loop."""

    def __init__(self, supervisor, block: StatsBlock, history: StatsHistory):
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(BrokerCollector(supervisor, block, history))
        self._server: asyncio.AbstractServer | None = None
        self.port = 0

    async def start(self, host: str, port: int) -> int:
        self._server = await asyncio.start_server(self._serve, host, port, reuse_address=True,
                                                  limit=REQUEST_HEAD_MAX)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    def scrape(self) -> bytes:
        return generate_latest(self.registry)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            try:
                await mq_loop.wait_for(self._server.wait_closed(), 2)
            except asyncio.TimeoutError:
                pass

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await mq_loop.wait_for(reader.readuntil(b"\r\n\r\n"), REQUEST_TIMEOUT_S)
            parts = head.split(b"\r\n", 1)[0].split()
            method, path = (parts[0], parts[1].split(b"?", 1)[0]) if len(parts) >= 2 else (b"", b"")
            if method not in (b"GET", b"HEAD"):
                status, ctype, body = "405 Method Not Allowed", "text/plain", b"only GET and HEAD\n"
            elif path == b"/metrics":
                try:
                    status, ctype, body = "200 OK", CONTENT_TYPE_PLAIN_0_0_4, self.scrape()
                except Exception:                      # a collector bug must not take the broker down
                    log.exception("metrics: collecting failed")
                    status, ctype, body = "500 Internal Server Error", "text/plain", b"collecting failed\n"
            elif path == b"/":
                status, ctype, body = "200 OK", "text/html", b'<a href="/metrics">metrics</a>\n'
            else:
                status, ctype, body = "404 Not Found", "text/plain", b"not found; try /metrics\n"
            writer.write(f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                         "Connection: close\r\n\r\n".encode() + (body if method != b"HEAD" else b""))
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()


__all__ = ["MetricsServer", "BrokerCollector"]
