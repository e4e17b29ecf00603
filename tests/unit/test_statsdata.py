"""mq.broker.statsdata: RocketMQ's minute/hour/day windows over the stats block's running totals
(VIEW_BROKER_STATS_DATA 315), with a fake clock and block."""
from mq.broker.statsdata import StatsHistory, row_key


class FakeBlock:
    def __init__(self):
        self.totals = {}

    def read(self):
        return {k: list(v) for k, v in self.totals.items()}


def test_windows_sum_the_growth_inside_them():
    now = [1000.0]
    block = FakeBlock()
    h = StatsHistory(block, clock=lambda: now[0])
    put = ("put", "T")
    # 100 messages (1 KB each) a minute for two hours, sampled as the supervisor does
    for minute in range(120):
        for _ in range(6):
            block.totals[put] = [minute * 100 + _ * 100 // 6, (minute * 100 + _ * 100 // 6) * 1000]
            h.sample()
            now[0] += 10
    block.totals[put] = [12000, 12_000_000]
    d = h.stats_data("TOPIC_PUT_NUMS", "T")
    assert 90 <= d["statsMinute"]["sum"] <= 110 and 1.4 <= d["statsMinute"]["tps"] <= 1.8
    assert 5900 <= d["statsHour"]["sum"] <= 6100 and abs(d["statsHour"]["tps"] - 100 / 60) < 0.1
    assert d["statsDay"]["sum"] == 12000            # the broker is younger than a day: everything
    size = h.stats_data("TOPIC_PUT_SIZE", "T")
    assert size["statsDay"]["sum"] == 12_000_000


def test_group_keys_and_unknown_names():
    block = FakeBlock()
    block.totals[("get", "G\x01T")] = [5, 50]
    h = StatsHistory(block, clock=lambda: 0.0)
    assert row_key("GROUP_GET_NUMS", "T@G") == ("get", "G\x01T")
    assert h.stats_data("GROUP_GET_NUMS", "T@G")["statsDay"]["sum"] == 0       # no time has passed
    assert h.stats_data("GROUP_GET_NUMS", "T@nobody") is None
    assert h.stats_data("SNDBCK_PUT_NUMS", "T") is None


def test_broker_tps_over_10_s_1_min_and_10_min():
    now = [0.0]
    block = FakeBlock()
    h = StatsHistory(block, clock=lambda: now[0])
    for step in range(200):                     # 1000 s: 10 messages a second put, 5 a second got
        now[0] += 5
        block.totals[("put", "A")] = [step * 30, 0]
        block.totals[("put", "B")] = [step * 20, 0]
        block.totals[("get", "G\x01A")] = [step * 25, 0]
        h.sample()
    tps = h.broker_tps()
    put = [float(x) for x in tps["putTps"].split()]
    got = [float(x) for x in tps["getTransferedTps"].split()]
    assert all(abs(r - 10.0) < 0.6 for r in put), put
    assert all(abs(r - 5.0) < 0.3 for r in got), got
    rates = h.rates(10.0)                     # per row, as the Prometheus TPS gauges read them
    assert rates[("put", "A")] == 6.0 and rates[("put", "B")] == 4.0 and rates[("get", "G\x01A")] == 5.0
