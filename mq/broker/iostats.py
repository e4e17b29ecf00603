"""What an io worker counts for the broker's metrics and statsAll: rows of its region of
the stats block (mq.store.stats), summed over workers by the supervisor (mq.broker.metrics).

    kind "put"   name topic                  [messages stored by sends, their body bytes]
    kind "get"   name group + "\\x01" + topic  [messages returned by pulls, their record bytes]
    kind "send"  name response code           histogram of send latency: bucket k counts sends
                                              whose latency in microseconds has bit_length() k;
                                              HIST_SUM the latencies' sum in nanoseconds
    kind "store" name "damaged_skipped"       [records the read check refused: never served]
                 name "entries_found"         [records of damaged ConsumeQueue entries found, served]

A send's latency runs from the start of the event-loop pass that read it (the first send of a
SendGroup stamps it; every send of the group was read in that pass) to its answer: right after
the group append, or after the group's flush/replication wait; a send of the full path from
its handler's start.  Messages count under the topic they were stored to by the send (a
%DLQ% topic after max reconsumes; a delayed message under the topic it will be delivered to),
once appended (fast path) or once answered with a stored code (full path); so in DLedger mode a
fast-path entry that a leader change cuts before its commit has still counted.  Delayed
deliveries and CONSUMER_SEND_MSG_BACK re-puts are not sends and count nowhere.

The hot path increments cached lists in place (`put_rows[topic][0] += 1`): one dict lookup and
a few list item additions per send, no shared-memory write (the worker publishes its region
every PUBLISH_INTERVAL_S; see mq.store.stats for what a killed worker loses)."""
from __future__ import annotations

from mq.store.stats import HIST_BUCKETS, HIST_SUM, ROWS_MAX, StatsWriter

KIND_PUT, KIND_GET, KIND_SEND, KIND_STORE = "put", "get", "send", "store"
GROUP_TOPIC_SEP = "\x01"           # in no topic or group name (mq.broker.send.TOPIC_RE)
CACHE_MAX = 4 * ROWS_MAX           # names cached per dict before it is emptied (the rows stay)


class IoStats:
    def __init__(self, writer: StatsWriter):
        self.writer = writer
        self.put_rows: dict = {}                     # topic (bytes on the fast path, else str) -> row
        self.get_rows: dict[tuple[str, str], list] = {}
        self.send_rows: dict[int, list] = {}
        self.ok_row = self.send_row(0)               # SUCCESS's histogram: the fast path adds to it inline
        self._integrity_seen = (0, 0)                # the process's totals last added (integrity())

    def put_row(self, topic) -> list:
        if len(self.put_rows) >= CACHE_MAX:
            self.put_rows.clear()
        name = topic.decode("utf-8", "replace") if topic.__class__ is bytes else topic
        row = self.put_rows[topic] = self.writer.row(KIND_PUT, name)
        return row

    def get_row(self, group: str, topic: str) -> list:
        if len(self.get_rows) >= CACHE_MAX:
            self.get_rows.clear()
        row = self.get_rows[(group, topic)] = self.writer.row(KIND_GET, group + GROUP_TOPIC_SEP + topic)
        return row

    def send_row(self, code: int) -> list:
        row = self.send_rows[code] = self.writer.row(KIND_SEND, str(code))
        return row

    def put(self, topic, msgs: int, size_bytes: int) -> None:
        row = self.put_rows.get(topic) or self.put_row(topic)
        row[0] += msgs
        row[1] += size_bytes

    def got(self, group: str, topic: str, msgs: int, size_bytes: int) -> None:
        row = self.get_rows.get((group, topic)) or self.get_row(group, topic)
        row[0] += msgs
        row[1] += size_bytes

    def sent(self, code: int, latency_ns: int, sends: int = 1) -> None:
        """`sends` answers with response `code`, each after latency_ns."""
        row = self.send_rows.get(code) or self.send_row(code)
        k = (latency_ns // 1000).bit_length()
        row[k if k < HIST_BUCKETS else HIST_BUCKETS - 1] += sends
        row[HIST_SUM] += latency_ns * sends

    def sent_counts(self, code: int, counts, sum_ns: int) -> None:
        """Adds a histogram counted elsewhere (C's: counts[k] sends with latency bucket k, sum_ns
        their latencies' sum) to code's row."""
        if not sum_ns and not any(counts):
            return
        row = self.send_rows.get(code) or self.send_row(code)
        for k in range(HIST_BUCKETS):
            row[k] += counts[k]
        row[HIST_SUM] += sum_ns

    def integrity(self, damaged_skipped: int, entries_found: int) -> None:
        """Adds what the read path counted since the last call (its totals in this process; the
        rows continue a restarted worker's, so only differences are added)."""
        skipped0, found0 = self._integrity_seen
        if (damaged_skipped, entries_found) == (skipped0, found0):
            return
        self.writer.row(KIND_STORE, "damaged_skipped")[0] += damaged_skipped - skipped0
        self.writer.row(KIND_STORE, "entries_found")[0] += entries_found - found0
        self._integrity_seen = (damaged_skipped, entries_found)

    def publish(self) -> None:
        self.writer.publish()


__all__ = ["IoStats", "KIND_PUT", "KIND_GET", "KIND_SEND", "KIND_STORE", "GROUP_TOPIC_SEP"]
