"""Shared fixtures: every test gets its own store directory under tmp_path; the run's guard (tests/guard.py)."""
import pytest

from mq.store import MessageStore, StoreConfig
# log tails of a failed test's servers; the run leaves no process or segment behind
from tests.guard import (pytest_runtest_makereport, pytest_runtest_setup, pytest_sessionfinish,  # noqa: F401
                         pytest_sessionstart, pytest_testnodedown)

# Run in parallel (`make test`: pytest -n 2 --dist loadgroup), a test file is one unit of work
# (its module fixtures start once), and the tiers whose tests time elections, failovers and
# faults of several brokers run on one worker, one after the other, as they would alone: only
# lighter work shares the machine with them.
SERIAL_TIERS = ("chaos", "dledger", "ha", "faults")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    import os
    here = os.path.dirname(os.path.abspath(__file__))
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        rel = os.path.relpath(str(item.path), here)
        tier = rel.split(os.sep, 1)[0]
        item.add_marker(pytest.mark.xdist_group("serial-tiers" if tier in SERIAL_TIERS else rel))


@pytest.fixture
def make_store(tmp_path):
    """make_store(**options) -> an open MessageStore (roles as threads); closed at teardown."""
    opened = []

    def make(root=None, start_roles=True, **options):
        options.setdefault("mappedFileSizeCommitLog", 64 * 1024)
        cfg = StoreConfig(storePathRootDir=str(root or tmp_path / "store"), **options)
        s = MessageStore.open(cfg, start_roles=start_roles)
        opened.append(s)
        return s

    yield make
    for s in opened:
        if s.ctl is not None and s.ctl.ptr is not None:
            s.close()
