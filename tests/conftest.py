"""Shared fixtures: every test gets its own store directory under tmp_path; the run's guard (tests/guard.py)."""
import pytest

from mq.store import MessageStore, StoreConfig
# log tails of a failed test's servers; the run leaves no process or segment behind
from tests.guard import (pytest_runtest_makereport, pytest_runtest_setup, pytest_sessionfinish,  # noqa: F401
                         pytest_sessionstart)


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
