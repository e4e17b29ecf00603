"""The suite's guard (tests/guard.py), run on small suites of its own in a fresh pytest:
a failed test shows its servers' log tails; a run that leaves a process or a shared-memory
segment behind fails, naming it, and removes it."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

# host_exclusive: these tests watch /dev/shm segments of processes they killed, and any broker
# started meanwhile sweeps every unheld segment on the host: `make test` runs them
# after its parallel run, alone (Makefile)
pytestmark = pytest.mark.host_exclusive

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFTEST = """
from tests.guard import (pytest_runtest_makereport, pytest_runtest_setup, pytest_sessionfinish,
                         pytest_sessionstart, pytest_testnodedown)
"""


def run_suite(tmp_path, body: str, parallel: int = 0) -> subprocess.CompletedProcess:
    """The suite `body` in a fresh pytest; parallel=N: on N pytest-xdist workers, as `make test` runs."""
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_inner.py").write_text(textwrap.dedent(body))
    env = {**os.environ, "PYTHONPATH": REPO, "MQ_TEST_EXIT_GRACE_S": "1"}
    for k in [k for k in env if k.startswith("PYTEST_XDIST") or k in ("MQ_PORT_RANGE", "MQ_TEST_RUN")]:
        del env[k]                  # this run's own worker identity is not the inner run's
    extra = ["-n", str(parallel)] if parallel else []
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *extra, str(tmp_path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_a_failed_test_shows_its_servers_log_tails(tmp_path):
    r = run_suite(tmp_path, """
        from mq.cluster import NameServer

        def test_fails(tmp_path):
            ns = NameServer(str(tmp_path))
            try:
                assert False, "on purpose"
            finally:
                ns.stop()
        """)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "log tail: " in r.stdout and "namesrv.log (exit status 0)" in r.stdout, r.stdout
    assert "The Name Server boot success" in r.stdout or "mq.namesrv" in r.stdout, r.stdout


def test_a_passing_run_that_leaves_nothing_passes(tmp_path):
    r = run_suite(tmp_path, """
        import subprocess

        def test_clean():
            subprocess.run(["true"], check=True)
        """)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "leftovers" not in r.stdout


def test_a_process_left_running_fails_the_run_and_is_killed(tmp_path):
    marker = tmp_path / "pid"
    r = run_suite(tmp_path, f"""
        import subprocess

        def test_leaks():
            p = subprocess.Popen(["sleep", "300"], start_new_session=True)
            open({str(marker)!r}, "w").write(str(p.pid))
        """)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "leftovers" in r.stdout and "sleep 300" in r.stdout, r.stdout
    pid = int(marker.read_text())
    assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"


def leak_a_segment(root) -> str:
    """A test body whose test leaves the control block of `root` behind (its process exits without
    closing it), and a clean test."""
    root.mkdir()
    return f"""
        import subprocess, sys

        def test_leaks_a_segment():
            code = "from mq.store import control as C; C.ControlBlock({str(root)!r}, 65536, create=True)"
            subprocess.run([sys.executable, "-c", code], check=True)   # exits without closing it

        def test_clean():
            pass
        """


def test_a_segment_left_behind_fails_the_run_and_is_removed(tmp_path):
    root = tmp_path / "store"
    r = run_suite(tmp_path, leak_a_segment(root))
    from mq.store import control as C
    name = C.segment_name(str(root))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "shared-memory segment(s) made during the run remain: " + name in r.stdout, r.stdout
    assert not os.path.exists("/dev/shm/" + name)


def test_a_namespace_and_a_link_left_behind_fail_the_run_and_are_deleted(tmp_path):
    """A test that builds a host as a network namespace (and a veth pair to it) and forgets to
    remove them fails the run; the guard deletes both.  Needs root and `ip`, as such tests do."""
    if os.geteuid() != 0 or not os.path.exists("/usr/sbin/ip") and not os.path.exists("/sbin/ip"):
        import pytest
        pytest.skip("namespaces need root and iproute2")
    tag = f"mqg{os.getpid() % 100000}"
    ns, link = f"{tag}ns", f"{tag}v0"
    r = run_suite(tmp_path, f"""
        import subprocess

        def test_leaks_a_namespace():
            subprocess.run(["ip", "netns", "add", {ns!r}], check=True)
            subprocess.run(["ip", "link", "add", {link!r}, "type", "veth", "peer", "name", {tag + "v1"!r},
                            "netns", {ns!r}], check=True)
        """)
    try:
        assert r.returncode == 1, r.stdout + r.stderr
        assert f"network namespace(s) made during the run remain (deleted now): {ns}" in r.stdout, r.stdout
        assert f"network link(s) made during the run remain (deleted now): {link}" in r.stdout, r.stdout
        assert not os.path.exists(f"/run/netns/{ns}")
        assert not os.path.exists(f"/sys/class/net/{link}")
    finally:
        subprocess.run(["ip", "link", "del", link], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def test_hosts_another_live_run_makes_meanwhile_are_not_its_leftovers(tmp_path):
    """A run's guard judges the namespaces that appeared during it; those mq.hosts made for a live
    process of another run (this test's, while the inner run sleeps) are not its to judge or
    delete.  A CI run's chaos cell lost its hosts' network to the guard of a pytest run that
    ended beside it."""
    from mq import hosts as mqhosts
    if mqhosts.unavailable() is not None:
        import pytest
        pytest.skip(mqhosts.unavailable())
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_inner.py").write_text(textwrap.dedent("""
        import os, time

        def test_waits_for_the_other_run():
            open("started", "w").close()          # the session noted what existed before this
            deadline = time.monotonic() + 30
            while not os.path.exists("made") and time.monotonic() < deadline:
                time.sleep(0.05)
        """))
    env = {**os.environ, "PYTHONPATH": REPO, "MQ_TEST_EXIT_GRACE_S": "1"}
    for k in [k for k in env if k.startswith("PYTEST_XDIST") or k in ("MQ_PORT_RANGE", "MQ_TEST_RUN")]:
        del env[k]
    inner = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                             cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60                       # the inner run noted what exists, then its test began
    while not (tmp_path / "started").exists() and time.monotonic() < deadline and inner.poll() is None:
        time.sleep(0.05)
    assert (tmp_path / "started").exists(), inner.communicate()[0]
    with mqhosts.Hosts(["g"]) as h:
        (tmp_path / "made").write_text(h.id)
        out, _ = inner.communicate(timeout=120)
        assert inner.returncode == 0, out
        assert "leftovers" not in out and os.path.exists(f"/run/netns/{h.id}-g"), out


def test_in_parallel_a_worker_s_leftover_process_fails_the_run(tmp_path):
    """On two workers: a process one worker's test leaves running is found by that worker (its
    own token), reported through the controller, which fails the run; the tests themselves pass,
    and each worker draws its ports from a slice of its own."""
    marker = tmp_path / "pid"
    r = run_suite(tmp_path, f"""
        import os, subprocess
        from mq.cluster import free_port, port_range

        def test_leaks():
            p = subprocess.Popen(["sleep", "301"], start_new_session=True)
            open({str(marker)!r}, "w").write(str(p.pid))

        def test_ports_are_the_workers_own():
            lo, hi = port_range()
            assert os.environ["MQ_PORT_RANGE"] == f"{{lo}}-{{hi}}"
            assert all(lo <= free_port((-2, 0, 1)) - 2 and free_port((-2, 0, 1)) + 1 < hi for _ in range(20))
            open({str(tmp_path)!r} + "/range-" + os.environ["PYTEST_XDIST_WORKER"], "w").write(f"{{lo}} {{hi}}")

        def test_ports_are_the_workers_own_too():
            test_ports_are_the_workers_own()
        """, parallel=2)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "leftovers" in r.stdout and "sleep 301" in r.stdout and "worker gw" in r.stdout, r.stdout
    assert "3 passed" in r.stdout, r.stdout              # the tests pass; the run fails
    pid = int(marker.read_text())
    assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"
    ranges = [tuple(map(int, open(tmp_path / f).read().split())) for f in os.listdir(tmp_path) if f.startswith("range-")]
    if len(ranges) == 2:                  # both tests ran on different workers: slices do not overlap
        (a_lo, a_hi), (b_lo, b_hi) = sorted(ranges)
        assert a_hi <= b_lo


def test_in_parallel_what_a_dead_worker_left_running_is_found_by_the_controller(tmp_path):
    """A worker that dies in a test (as one did when the official C++ client aborted in its
    shutdown) cannot check its own processes: the controller finds them by the worker's token,
    which extends its own, names them, kills them and fails the run."""
    marker = tmp_path / "pid"
    r = run_suite(tmp_path, f"""
        import os, subprocess

        def test_dies():
            p = subprocess.Popen(["sleep", "302"], start_new_session=True)
            open({str(marker)!r}, "w").write(str(p.pid))
            os.abort()
        """, parallel=2)
    assert r.returncode != 0, r.stdout + r.stderr
    assert "still alive (killed now)" in r.stdout and "sleep 302" in r.stdout, r.stdout
    pid = int(marker.read_text())
    assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"


def test_in_parallel_a_segment_left_behind_is_found_once_by_the_controller(tmp_path):
    root = tmp_path / "store"
    r = run_suite(tmp_path, leak_a_segment(root), parallel=2)
    from mq.store import control as C
    name = C.segment_name(str(root))
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stdout.count("shared-memory segment(s) made during the run remain: " + name) == 1, r.stdout
    assert not os.path.exists("/dev/shm/" + name)


def test_a_port_handed_out_is_not_handed_out_again_before_it_is_bound():
    """mq.cluster.free_port holds every port it handed out (as p + d of a span) for PORT_HOLD_S:
    a caller choosing several ports before binding any (a DLedger group's peer ports, then each
    member's broker ports) never gets one twice, although each still looks free to a bind."""
    from mq.cluster import free_port
    taken: set[int] = set()
    for _ in range(200):
        span = (-2, 0, 1)
        p = free_port(span)
        got = {p + d for d in span}
        assert not got & taken, sorted(got & taken)
        taken |= got
        q = free_port()
        assert q not in taken
        taken.add(q)


def test_a_worker_started_in_place_of_a_crashed_one_gets_ports_of_its_own(tmp_path):
    """On one worker, a test that kills it (as a segfault would): xdist starts another (gw1) for
    the rest, whose tests draw ports from a slice of their own below the ephemeral range, so the
    crash is the run's only failure.  (Before, its slice lay past the range, free_port refused it,
    and every test of the replacement failed: CI 90.)"""
    r = run_suite(tmp_path, """
        import os, signal
        import pytest
        from mq.cluster import free_port, port_range

        def test_crash():
            os.kill(os.getpid(), signal.SIGKILL)

        @pytest.mark.parametrize("i", range(12))
        def test_ports(i):
            lo, hi = port_range()
            assert lo < free_port((0,)) < hi
            open(os.path.join({tmp!r}, "ports-" + os.environ["PYTEST_XDIST_WORKER"]), "w").write(f"{{lo}} {{hi}}")
        """.format(tmp=str(tmp_path)), parallel=1)
    assert "1 failed" in r.stdout and "12 passed" in r.stdout, r.stdout + r.stderr
    assert "crashed" in r.stdout, r.stdout
    workers = {f.split("-", 1)[1] for f in os.listdir(tmp_path) if f.startswith("ports-")}
    assert workers == {"gw1"}, workers
