"""What every test run checks around its tests (hooks imported by tests/conftest.py and
perf/conftest.py, so `pytest tests` and `pytest perf` both have them):

* A failed test shows the tail of the log of every server (mq.cluster.Proc: mqnamesrv, mqbroker)
  it started, and of every one still running when it failed (a module fixture's), as report
  sections: the reason a broker stalled or exited is in the output, not lost with the tmp dir.
* The run leaves nothing behind.  Every process started under it inherits MQ_TEST_RUN=<token>
  in its environment, whatever started it (a fixture, a helper, a role forked by a broker); at
  the end no such process may be alive, and no shared-memory segment `mq-*` that appeared
  during the run may remain unheld (brokers killed with -9 leave theirs until a sweep:
  mq.store.control.sweep_dead_segments), and no network namespace (`ip netns`) or network link
  (a veth end in this namespace) that appeared during the run may remain: tests that build hosts
  as namespaces remove them.  A leftover is named, removed, and fails the run.

Run in parallel (`pytest -n 2`, pytest-xdist): each worker is a session with a token of its own
and checks its own processes; the machine-wide things (segments, namespaces, links) are checked
once, by the controller after every worker ended, since one worker's segment of a broker it just
killed is not another's leftover.  Each worker draws ports from a slice of its own
(MQ_PORT_RANGE, mq.cluster.free_port)."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import time
import uuid

import pytest

from mq.cluster import PORT_RANGE_ENV, Proc
from mq.store.control import SHM_DIR

RUN_ENV = "MQ_TEST_RUN"
LOG_TAIL_BYTES = 6000
LOG_TAILS_MAX = 8                 # servers shown per failed test, the newest first
SPARE_SLICES = 2                  # port slices for workers started in place of crashed ones
EXIT_GRACE_S = float(os.environ.get("MQ_TEST_EXIT_GRACE_S", "10"))  # for processes of the run to exit after its last test
_first_proc = pytest.StashKey[int]()
_shm_before: set[str] = set()
_netns_before: set[str] = set()
_links_before: set[str] = set()
NETNS_DIR = "/run/netns"          # where `ip netns add` pins a namespace by name
LINKS_DIR = "/sys/class/net"      # this namespace's network links


def _names(directory: str) -> set[str]:
    try:
        return set(os.listdir(directory))
    except OSError:
        return set()


def _segments() -> set[str]:
    try:
        return {n for n in os.listdir(SHM_DIR) if n.startswith("mq-")}
    except FileNotFoundError:
        return set()


def _worker(config) -> tuple[int, int] | None:
    """(this worker's number, the number of workers) in a parallel run's worker, else None."""
    wi = getattr(config, "workerinput", None)
    if wi is None:
        return None
    return int(wi["workerid"].lstrip("gw")), int(wi["workercount"])


def _controller(config) -> bool:
    """The process that runs no test of a parallel run, only its workers."""
    return getattr(config, "workerinput", None) is None and getattr(config.option, "numprocesses", None) not in (None, 0)


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session):
    if Proc.started is not None:
        return                  # both conftests registered these hooks (`pytest tests perf`)
    w = _worker(session.config)
    inherited = os.environ.get(RUN_ENV)
    # a parallel run's worker inherits the controller's token: its own extends it, so the
    # controller can find what a worker that died (a crash in a client library) left running
    os.environ[RUN_ENV] = f"{inherited}-gw{w[0]}" if w is not None and inherited else uuid.uuid4().hex
    if w is not None:
        from mq.cluster import port_range
        os.environ.pop(PORT_RANGE_ENV, None)
        lo, hi = port_range()
        # a slice per worker, and SPARE_SLICES for the workers xdist starts in place of crashed
        # ones (gw<count>, gw<count+1>, ...: past the slices, such a worker's ports were refused
        # and every test it ran failed, hiding the one crash that mattered; CI 90)
        number, count = w
        step = (hi - lo) // (count + SPARE_SLICES)
        k = number if number < count else count + (number - count) % SPARE_SLICES
        os.environ[PORT_RANGE_ENV] = f"{lo + k * step}-{lo + (k + 1) * step}"
    Proc.started = []
    _shm_before.clear()
    _shm_before.update(_segments())
    _netns_before.clear()
    _netns_before.update(_names(NETNS_DIR))
    _links_before.clear()
    _links_before.update(_names(LINKS_DIR))


def pytest_runtest_setup(item):
    item.stash[_first_proc] = len(Proc.started or [])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not report.failed or Proc.started is None:
        return
    first = item.stash.get(_first_proc, len(Proc.started))
    shown = [p for i, p in enumerate(Proc.started) if i >= first or p.p.poll() is None]
    titled = {title for title, _ in report.sections}
    for p in shown[-LOG_TAILS_MAX:][::-1]:
        state = "running" if p.p.poll() is None else f"exit status {p.p.returncode}"
        title = f"log tail: {p.log_path} ({state})"
        if title not in titled:
            report.sections.append((title, p.tail(LOG_TAIL_BYTES)))


_HOSTS_NETNS = re.compile(r"^mqh(\d+)x")     # mq.hosts names a namespace after the pid that made it


def _another_runs(netns: str, token: str) -> bool:
    """Is this an mq.hosts namespace of a live process of another run?  Not ours to judge or
    delete: a pytest run that ended beside a CI run deleted the hosts of the CI run's chaos cell
    (its network gone mid-cell).  A process's run is the token in its environment as it was
    started (/proc/PID/environ: a worker inherits its controller's); this process and a
    namespace whose maker is gone, or of no known maker, are judged as ours."""
    m = _HOSTS_NETNS.match(netns)
    if not m or int(m.group(1)) == os.getpid():
        return False
    try:
        with open(f"/proc/{m.group(1)}/environ", "rb") as f:
            env = f.read().split(b"\0")
    except OSError:
        return False
    marker = f"{RUN_ENV}={token}".encode()
    return not any(e == marker or e.startswith(marker + b"-gw") for e in env)


def _processes_of_run(token: str, workers: bool = False) -> list[tuple[int, str]]:
    """(pid, command line) of every live process carrying this run's token (workers: the token
    of one of its parallel workers, `<token>-gwN`), but this one and its own multiprocessing
    helpers (the resource tracker lives until this process exits)."""
    marker = f"{RUN_ENV}={token}".encode()

    def carries(env: bytes) -> bool:
        entries = env.split(b"\0")
        if workers:
            return any(e.startswith(marker + b"-gw") for e in entries)
        return marker in entries
    me = os.getpid()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        pid = int(entry)
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if not carries(f.read()):
                    continue
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
        except OSError:
            continue                                  # gone meanwhile, or not ours to read
        if fields[0] == "Z":
            continue
        if int(fields[1]) == me and "multiprocessing" in cmd:
            continue
        found.append((pid, cmd))
    return found


def _segment_owners() -> dict[str, str]:
    """segment name -> the log of the server whose store it is (a broker keeps broker.conf and its
    log in its store directory; mq.cluster.Broker)."""
    from mq.store.control import segment_name
    out = {}
    for p in Proc.started or []:
        root = os.path.dirname(p.log_path)
        for name in (segment_name(root), segment_name(root) + "-st", segment_name(root) + "-legacy"):
            out[name] = p.log_path
    return out


_from_workers: list[str] = []


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """Controller of a parallel run: what a worker found left behind by its own tests."""
    left = getattr(node, "workeroutput", {}).get("mq_leftovers") or []
    if left:
        _from_workers.append(f"worker {node.gateway.id}:")
        _from_workers.extend(left)


def pytest_sessionfinish(session, exitstatus):
    from mq.store.control import segment_in_use, sweep_dead_segments
    controller = _controller(session.config)
    token = os.environ.get(RUN_ENV)     # a worker checks its own; the controller what no worker did (one died)
    problems = []
    # a process killed or stopped by the last test may still be exiting (orphaned roles, a
    # resource tracker reading its EOF): only what is alive after the grace period is left over
    deadline = time.monotonic() + EXIT_GRACE_S
    while True:
        left = _processes_of_run(token, workers=controller) if token else []
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    if left:
        problems.append(f"{len(left)} process(es) started by the run are still alive (killed now):")
        problems += [f"  {pid} {cmd[:200]}" for pid, cmd in left]
        for pid, _ in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.2)                               # the kernel drops their segment locks
    if _worker(session.config) is not None:
        # the controller decides the run's status: it reports these with its own (below)
        session.config.workeroutput["mq_leftovers"] = problems
        _report(session, problems)
        return                  # the machine-wide checks are the controller's, after every worker
    problems += _from_workers
    # a segment some live process holds is in use (ours would be named above, with its process;
    # another run's on the same machine is not ours to judge); one nobody holds was left behind
    new = sorted(n for n in _segments() - _shm_before if not segment_in_use(n))
    if new:
        problems.append(f"{len(new)} shared-memory segment(s) made during the run remain: {' '.join(new)}")
        owners = _segment_owners()
        problems += [f"  {n}: the store of {owners[n]}" for n in new if n in owners]
        sweep_dead_segments()
    token = os.environ.get(RUN_ENV, "")
    netns = sorted(n for n in _names(NETNS_DIR) - _netns_before if not _another_runs(n, token))
    links = sorted(_names(LINKS_DIR) - _links_before)     # before deleting a namespace ends its veths
    if netns:
        problems.append(f"{len(netns)} network namespace(s) made during the run remain (deleted now): "
                        + " ".join(netns))
        for name in netns:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
    if links:
        problems.append(f"{len(links)} network link(s) made during the run remain (deleted now): " + " ".join(links))
        for name in links:
            subprocess.run(["ip", "link", "del", name], capture_output=True)
    _report(session, problems)


def _report(session, problems: list[str]) -> None:
    if problems:
        tr = session.config.pluginmanager.get_plugin("terminalreporter")
        text = "the run left things behind:\n" + "\n".join(problems)
        if tr is not None:
            tr.write_sep("=", "leftovers", red=True)
            tr.write_line(text)
        else:
            print(text)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
