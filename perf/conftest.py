"""Fixtures for the store benchmarks (perf/test_store_bench.py).

Run:  .venv/bin/pytest perf/ -q -s            (full: every variant, ~1-2 min on 2 vCPU)
      .venv/bin/pytest perf/ -q -s -m quick   (one small variant per gate, < 60 s)

Store directories are made with tempfile under $MQ_PERF_DIR (default /tmp) and
removed after each test, not under pytest's tmp_path: pytest keeps the last
three runs there, and the recovery benchmark writes GiB-sized files."""
from __future__ import annotations

import os
import platform
import shutil
import tempfile

import pytest

# log tails of a failed gate's servers; the run leaves no process or segment behind
from tests.guard import (pytest_runtest_makereport, pytest_runtest_setup, pytest_sessionfinish,  # noqa: F401
                         pytest_sessionstart)


def pytest_configure(config):
    config.addinivalue_line("markers", "quick: the small variant of each gate, for CI (pytest perf/ -m quick)")


def pytest_report_header(config):
    return (f"mq perf: {os.cpu_count()} CPUs, Python {platform.python_version()}, "
            f"store dirs under {perf_dir()}")


def perf_dir() -> str:
    return os.environ.get("MQ_PERF_DIR", tempfile.gettempdir())


@pytest.fixture
def store_dir():
    """A fresh, empty directory for one store (or a baseline file); removed afterwards."""
    d = tempfile.mkdtemp(prefix="mq-perf-", dir=perf_dir())
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def need_disk():
    """need_disk(n_bytes): fails the test, saying why, when the store directory's disk has
    less free: a gate that cannot run is not a gate that passed (set MQ_PERF_DIR elsewhere)."""
    def check(n_bytes: int) -> None:
        free = shutil.disk_usage(perf_dir()).free
        if free < n_bytes:
            pytest.fail(f"needs {n_bytes / 2**30:.1f} GiB free under {perf_dir()}, has {free / 2**30:.1f} GiB "
                        "(set MQ_PERF_DIR to a roomier directory)", pytrace=False)
    return check


@pytest.fixture(scope="module")
def namesrv(tmp_path_factory):
    """A name server (a real mqnamesrv process on 127.0.0.1) for one benchmark module."""
    from mq.cluster import NameServer
    ns = NameServer(str(tmp_path_factory.mktemp("namesrv")))
    yield ns
    ns.stop()
