"""The perf tools' tests import perf/test_broker_bench.py (perf/peers.py drives our broker with
its request helpers), whose parametrisations carry the `quick` marker; under --strict-markers
that marker must be known here too, as perf/conftest.py declares it for perf/."""


def pytest_configure(config):
    config.addinivalue_line("markers", "quick: the small variant of each perf gate, for CI (pytest perf/ -m quick)")
