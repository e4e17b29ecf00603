"""Shared fixtures: every test gets its own store directory under tmp_path; the run's guard (tests/guard.py)."""
import pytest

from mq.store import MessageStore, StoreConfig
# log tails of a failed test's servers; the run leaves no process or segment behind
from tests.guard import (pytest_runtest_makereport, pytest_runtest_setup, pytest_sessionfinish,  # noqa: F401
                         pytest_sessionstart, pytest_testnodedown)

# Run in parallel (`make test`: pytest -n 2 --dist loadscope), a test file is one unit of work
# (its module fixtures start once), and the tiers whose tests time elections, failovers and
# faults of several brokers are one unit together: they run on one worker, one after the other,
# as they would alone, and only lighter work shares the machine with them.  (A scheduler of our
# own: pytest-xdist's xdist_group marks rename node ids, which pytest 9.2 no longer lets them do.)
SERIAL_TIERS = ("chaos", "dledger", "ha", "faults")


def unit_of_work(nodeid: str) -> str:
    """The scope a test is scheduled with: its file, or one scope for all of SERIAL_TIERS."""
    path = nodeid.split("::", 1)[0]
    parts = path.split("/")
    if len(parts) > 2 and parts[0] == "tests" and parts[1] in SERIAL_TIERS:
        return "serial-tiers"
    return path


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class TierScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of_work(nodeid)
    return TierScheduling(config, log)


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
