"""The control block's life as a multiprocessing.shared_memory segment: who
may unlink it, and what happens to the segment of a crashed owner.

Each scenario runs in fresh interpreters (subprocesses), because what is
tested is the interplay with Python's resource tracker, which is per process
family and would otherwise be shared with pytest's own process."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from mq.store import control as C

# host_exclusive: these tests watch /dev/shm segments of processes they killed, and any broker
# started meanwhile sweeps every unheld segment on the host: `make test` runs them
# after its parallel run, alone (Makefile)
pytestmark = pytest.mark.host_exclusive

FILE_SIZE = 64 * 1024


def run_py(code: str, *args: str, timeout_s: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True,
                          timeout=timeout_s)


def segment_exists(root: str) -> bool:
    return os.path.exists("/dev/shm/" + C.segment_name(root))


def test_an_attacher_exiting_never_unlinks_the_owners_segment(tmp_path):
    """Proves the resource-tracker protection: a process that is not of the
    owner's family (its own tracker) attaches, writes and exits; the owner's
    segment stays, with what the attacher wrote."""
    root = str(tmp_path)
    owner = C.ControlBlock(root, FILE_SIZE, create=True)
    try:
        r = run_py("""
            import sys
            from mq.store import control as C
            ctl = C.ControlBlock(sys.argv[1])
            ctl.set(C.POS_MIN, 4096)
            ctl.close()
            """, root)
        assert r.returncode == 0, r.stderr
        assert "leaked" not in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert segment_exists(root)
        assert owner.get(C.POS_MIN) == 4096
        again = C.ControlBlock(root)               # a later attacher still finds it
        assert again.get(C.POS_MIN) == 4096
        again.close()
    finally:
        owner.close()
    assert not segment_exists(root), "the owner's clean close unlinks the segment"


def test_the_segment_of_a_killed_owner_is_replaced_by_the_next_owner(tmp_path):
    """Proves stale-segment handling: an owner killed with SIGKILL leaves its
    segment (no tracker removes it); the next owner replaces it with a fresh
    block instead of failing or inheriting the dead owner's positions."""
    root = str(tmp_path)
    p = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import sys, time
        from mq.store import control as C
        ctl = C.ControlBlock(sys.argv[1], 65536, create=True)
        ctl.set(C.POS_MIN, 8192)
        print("ready", flush=True)
        time.sleep(60)
        """), root], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        os.kill(p.pid, signal.SIGKILL)
        p.wait(10)
    finally:
        if p.poll() is None:
            p.kill()
    assert segment_exists(root), "a killed owner leaves its segment behind"
    stale = C.ControlBlock(root)
    assert stale.get(C.POS_MIN) == 8192
    stale.close()
    fresh = C.ControlBlock(root, FILE_SIZE, create=True)
    try:
        assert fresh.get(C.POS_MIN) == 0
    finally:
        fresh.close()
    assert not segment_exists(root)
    assert C.remove_segment(root) is False


def test_one_familys_concurrent_attaches_keep_the_tracker_quiet(tmp_path):
    """Proves the flock around register/unregister: an owner and 8 children
    that share its resource tracker attach and detach at the same moment; the
    tracker reports no KeyError (a double unregister) and no leak, and the
    owner's close still unlinks the segment."""
    root = str(tmp_path)
    r = run_py("""
        import multiprocessing as mp, sys
        from mq.store import control as C

        def child(root, go):
            go.wait()
            for _ in range(20):
                C.ControlBlock(root).close()

        if __name__ == "__main__":
            ctx = mp.get_context(sys.argv[2])
            owner = C.ControlBlock(sys.argv[1], 65536, create=True)
            go = ctx.Event()
            ps = [ctx.Process(target=child, args=(sys.argv[1], go)) for _ in range(8)]
            for p in ps:
                p.start()
            go.set()
            for p in ps:
                p.join(60)
            assert all(p.exitcode == 0 for p in ps), [p.exitcode for p in ps]
            owner.close()
            print("done")
        """, root, "fork")
    assert r.returncode == 0 and "done" in r.stdout, r.stderr
    assert "KeyError" not in r.stderr and "Traceback" not in r.stderr and "leaked" not in r.stderr, r.stderr
    assert not segment_exists(root)


def _owner_process(root: str) -> subprocess.Popen:
    """A fresh interpreter that creates the control block of `root` and the stats block beside
    it, says "ready" and waits."""
    p = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import sys, time
        from mq.store import control as C
        from mq.store.stats import StatsBlock
        ctl = C.ControlBlock(sys.argv[1], 65536, create=True)
        st = StatsBlock(sys.argv[1], regions=1, create=True)
        print("ready", flush=True)
        time.sleep(60)
        """), root], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    return p


def test_the_sweep_removes_the_segments_of_dead_owners_only(tmp_path):
    """Proves the host-wide sweep (mqbroker runs it at every start): the control and stats
    blocks of an owner killed with SIGKILL go; those of a live owner, and of a dead owner's
    segment that a live process still has attached, stay until nobody holds them."""
    from mq.store.stats import stats_segment_name
    dead, live = str(tmp_path / "dead"), str(tmp_path / "live")
    os.makedirs(dead)
    os.makedirs(live)
    a, b = _owner_process(dead), _owner_process(live)
    try:
        os.kill(a.pid, signal.SIGKILL)
        a.wait(10)
        attached = C.ControlBlock(dead)              # a reader still using the dead owner's block
        swept = C.sweep_dead_segments()
        assert C.segment_name(dead) not in swept and segment_exists(dead)
        assert stats_segment_name(dead) in swept, "nobody holds the dead owner's stats block"
        attached.close()
        swept = C.sweep_dead_segments()
        assert C.segment_name(dead) in swept and not segment_exists(dead)
        assert C.segment_name(live) not in swept and segment_exists(live)
        assert os.path.exists("/dev/shm/" + stats_segment_name(live))
    finally:
        for p in (a, b):
            if p.poll() is None:
                p.kill()
                p.wait(10)
    assert set(C.sweep_dead_segments()) == {C.segment_name(live), stats_segment_name(live)}
    assert not segment_exists(live)
