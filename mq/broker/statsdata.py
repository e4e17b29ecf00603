"""RocketMQ's BrokerStatsManager windows over the stats block's counters (mq.store.stats,
mq.broker.iostats): VIEW_BROKER_STATS_DATA (315) answers, per stats name and key, what was
counted in the last minute, hour and day, for `mqadmin statsAll`.

    TOPIC_PUT_NUMS / TOPIC_PUT_SIZE   key topic          messages / body bytes stored by sends
    GROUP_GET_NUMS / GROUP_GET_SIZE   key topic@group    messages / bytes returned to pulls

Answer (BrokerStatsData): {"statsMinute": {"sum", "tps", "avgpt"}, "statsHour": ..., "statsDay": ...};
sum is the counter's growth over the window, tps that growth per second of the time actually
covered (a broker up for 5 minutes has an hour window of 5 minutes), avgpt is 0 (RocketMQ's is
the mean per increment, which these counters do not keep).

broker_tps() gives GET_BROKER_RUNTIME_INFO's putTps and getTransferedTps from the same samples.

The supervisor samples the totals every SHORT_SAMPLE_S for the minute window and every
LONG_SAMPLE_S for the hour and day windows: at most 13 + 1441 samples of the put and get rows."""
from __future__ import annotations

import asyncio
import collections
import time

from .iostats import GROUP_TOPIC_SEP, KIND_GET, KIND_PUT

STATS_NAMES = {"TOPIC_PUT_NUMS": (KIND_PUT, 0), "TOPIC_PUT_SIZE": (KIND_PUT, 1),
               "GROUP_GET_NUMS": (KIND_GET, 0), "GROUP_GET_SIZE": (KIND_GET, 1)}
SHORT_SAMPLE_S = 5.0
LONG_SAMPLE_S = 60.0
WINDOWS = (("statsMinute", 60.0), ("statsHour", 3600.0), ("statsDay", 86400.0))


def row_key(stats_name: str, stats_key: str) -> tuple[str, str] | None:
    """The stats block key of a RocketMQ stats name and key, or None for a name we do not keep."""
    found = STATS_NAMES.get(stats_name)
    if found is None:
        return None
    kind = found[0]
    if kind == KIND_GET:
        topic, _, group = stats_key.rpartition("@")
        return kind, group + GROUP_TOPIC_SEP + topic
    return kind, stats_key


class StatsHistory:
    def __init__(self, block, clock=time.monotonic):
        self.block = block
        self.clock = clock
        self.short: collections.deque = collections.deque(maxlen=int(60 / SHORT_SAMPLE_S) + 1)
        self.long: collections.deque = collections.deque(maxlen=int(86400 / LONG_SAMPLE_S) + 1)

    def _totals(self) -> dict:
        return {key: vals[:2] for key, vals in self.block.read().items() if key[0] in (KIND_PUT, KIND_GET)}

    def sample(self) -> None:
        now, totals = self.clock(), self._totals()
        self.short.append((now, totals))
        if not self.long or now - self.long[-1][0] >= LONG_SAMPLE_S - 0.5:
            self.long.append((now, totals))

    async def run(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(SHORT_SAMPLE_S)

    def stats_data(self, stats_name: str, stats_key: str) -> dict | None:
        key = row_key(stats_name, stats_key)
        if key is None:
            return None
        idx = STATS_NAMES[stats_name][1]
        now, totals = self.clock(), self._totals()
        if key not in totals:
            return None
        out = {}
        for label, window_s in WINDOWS:
            grown, covered = self._growth(now, totals, lambda t: t.get(key, [0, 0])[idx], window_s)
            out[label] = {"sum": grown, "tps": grown / covered if covered > 0 else 0.0, "avgpt": 0.0}
        return out

    def _growth(self, now: float, totals: dict, value, window_s: float) -> tuple[int, float]:
        """(growth of value(totals) since the oldest sample inside the window, seconds covered)."""
        samples = self.short if window_s <= 60 else self.long
        base_t, base = now, value(totals)
        for t, old in samples:
            if t >= now - window_s:
                base_t, base = t, value(old)
                break
        return max(0, value(totals) - base), now - base_t

    def rates(self, window_s: float) -> dict[tuple[str, str], float]:
        """Messages a second of every put and get row over the last window_s (<= 60 s): the
        Prometheus endpoint's TPS gauges (mq.broker.metrics)."""
        now, totals = self.clock(), self._totals()
        out = {}
        for key in totals:
            grown, covered = self._growth(now, totals, lambda t, key=key: t.get(key, [0, 0])[0], window_s)
            out[key] = grown / covered if covered > 0 else 0.0
        return out

    def broker_tps(self) -> dict[str, str]:
        """GET_BROKER_RUNTIME_INFO's putTps and getTransferedTps: messages a second over the last
        10 s, 1 min and 10 min (RocketMQ's StoreStatsService windows), "%.2f %.2f %.2f"."""
        now, totals = self.clock(), self._totals()
        out = {}
        for field, kind in (("putTps", KIND_PUT), ("getTransferedTps", KIND_GET)):
            def value(t, kind=kind):
                return sum(v[0] for (k, _), v in t.items() if k == kind)
            rates = []
            for window_s in (10.0, 60.0, 600.0):
                grown, covered = self._growth(now, totals, value, window_s)
                rates.append(grown / covered if covered > 0 else 0.0)
            out[field] = " ".join("%.2f" % r for r in rates)
        return out


__all__ = ["StatsHistory", "STATS_NAMES", "row_key"]
