"""Shared fixtures: every test gets its own store directory under tmp_path; the run's guard (tests/guard.py)."""
import pytest

from mq.store import MessageStore, StoreConfig
# log tails of a failed test's servers; the run leaves no process or segment behind
from tests.guard import (pytest_runtest_makereport, pytest_runtest_setup, pytest_sessionfinish,  # noqa: F401
                         pytest_sessionstart, pytest_testnodedown)

# Run in parallel (`make test`: pytest -n 3 --dist loadscope), a test file is one unit of work
# (its module fixtures start once), and the tiers whose tests time elections, failovers and
# faults are two units: the fault matrix's cells (tests/chaos, whose verdicts are invariants and
# a 20 s recovery bound), and the replication tiers (tests/dledger, tests/ha, tests/faults: their
# election and failover timings).  Each runs on one worker, its tests one after the other as they
# would alone; the two are handed out first, as they are the longest, and the lighter files share
# the third worker.  With fewer than three workers (`make test` where /dev/shm has no room for
# the run: two) they are one unit, beside the lighter files.  (A scheduler of our own:
# pytest-xdist's xdist_group marks rename node ids, which pytest 9.2 no longer lets them do.)
SERIAL_TIERS = {"chaos": "serial-chaos", "dledger": "serial-replication", "ha": "serial-replication",
                "faults": "serial-replication"}
SERIAL_ONE_UNIT = "serial-tiers"          # all of SERIAL_TIERS, with fewer than three workers
SERIAL_UNITS = {*SERIAL_TIERS.values(), SERIAL_ONE_UNIT}


def unit_of_work(nodeid: str, workers: int = 3) -> str:
    """The scope a test is scheduled with: its file, or its tier's unit of SERIAL_TIERS (with
    fewer than three workers, SERIAL_ONE_UNIT)."""
    path = nodeid.split("::", 1)[0]
    parts = path.split("/")
    if len(parts) > 2 and parts[0] == "tests" and parts[1] in SERIAL_TIERS:
        return SERIAL_TIERS[parts[1]] if workers >= 3 else SERIAL_ONE_UNIT
    return path


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class TierScheduling(LoadScopeScheduling):
        """LoadScopeScheduling with two faults of its crash path (pytest-xdist 3.8) fixed; a test
        that kills its worker (an abort inside a client library) must fail alone, not hang the run.

        1. remove_node put the dead worker's whole unit back with the test that crashed still
           pending, so every replacement ran it again and died too.  It is done: xdist reports it
           failed (handle_crashitem) and the replacement runs only the tests after it.
        2. A replacement got one unit and then only more on its own completions; a unit of one
           test never completes, since a worker holds its last test until it is sent another or
           told to shut down (it needs the next item for teardown).  The controller waited for
           the worker and the worker for the controller (seen: a CI run stuck 20 minutes).  Here a
           worker is given units until it holds more than two tests or none are left, and is told
           to shut down as soon as none are left."""

        def _split_scope(self, nodeid: str) -> str:
            return unit_of_work(nodeid, self.numnodes)

        def _assign_work_unit(self, node) -> None:
            """The serial units first, whatever their test counts: they are the run's longest."""
            for scope in [s for s in self.workqueue if s in SERIAL_UNITS]:
                self.workqueue.move_to_end(scope, last=False)
            super()._assign_work_unit(node)

        def remove_node(self, node):
            workload = self.assigned_work.pop(node)
            crashed = next((nodeid for unit in workload.values()
                            for nodeid, done in unit.items() if not done), None)
            if crashed is None:
                return None                     # a worker that ended with its work done
            workload[self._split_scope(crashed)][crashed] = True
            for scope, unit in workload.items():
                if not all(unit.values()):
                    self.workqueue[scope] = unit
            for other in self.assigned_work:
                self._reschedule(other)
            return crashed

        def _reschedule(self, node) -> None:
            if node.shutting_down:
                return
            while self.workqueue and self._pending_of(self.assigned_work[node]) <= 2:
                self._assign_work_unit(node)
            if not self.workqueue:
                node.shutdown()
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
