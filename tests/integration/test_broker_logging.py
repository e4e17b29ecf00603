"""One log stream for a broker's processes: multiprocessing-logging through
the launcher (mq.broker.launcher, mq.logs).

The first test runs a miniature supervisor in a fresh interpreter: the same
setup_broker_logging + Launcher as mqbroker, a formatter that stamps the pid
of the process *emitting* each line, and role processes that log.  A line
stamped with the supervisor's pid but naming the role's pid can only have
come through the supervisor's handler."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap

SUPERVISOR = textwrap.dedent("""
    import asyncio, logging, os, signal, sys, time
    from mq.logs import setup_broker_logging
    from mq.broker.launcher import Launcher, STOP_PIPE

    class Stamp(logging.Formatter):
        def format(self, record):
            return f"emitted-by={os.getpid()} " + super().format(record)

    def role(tag, stop):
        log = logging.getLogger("test.role")
        log.info("hello %s from pid %d", tag, os.getpid())
        if stop is None:
            return
        while not stop.wait(0.05):
            pass
        log.info("stopping %s", tag)

    setup_broker_logging()
    root = logging.getLogger()
    root.handlers[0].setFormatter(Stamp("%(processName)s[%(process)d] %(name)s: %(message)s"))
    launcher = Launcher()

    async def main():
        launcher.attach(asyncio.get_running_loop())
        logging.getLogger("test.sup").info("supervisor is pid %d", os.getpid())
        once = launcher.start("once", role, ("once", None))
        assert await once.wait(20) and once.exitcode == 0, (once.exitcode, once.error)
        first = launcher.start("keeper", role, ("first", STOP_PIPE))
        while first.pid is None:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.5)
        first.kill()                          # SIGKILL, as a crash
        assert await first.wait(20) and first.exitcode == -signal.SIGKILL, first.exitcode
        second = launcher.start("keeper", role, ("second", STOP_PIPE))   # the restart
        await asyncio.sleep(0.5)
        second.stop()
        assert await second.wait(20) and second.exitcode == 0, second.exitcode
        print(f"pids once={once.pid} first={first.pid} second={second.pid}", flush=True)

    asyncio.run(main())
    launcher.close()
    time.sleep(0.5)                            # the receiver thread writes what is queued
""")


def test_role_records_reach_the_supervisors_handler_also_after_a_restart():
    """Proves: records logged in forked role processes are emitted by the
    supervisor's handler (stamped with the supervisor's pid), each naming its
    role and its own pid; a role killed with SIGKILL and started again still
    logs through the same stream; the stop pipe reaches a restarted role."""
    r = subprocess.run([sys.executable, "-c", SUPERVISOR], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    pids = dict(kv.split("=") for kv in re.search(r"pids (.*)", r.stdout).group(1).split())
    sup = re.search(r"supervisor is pid (\d+)", r.stderr).group(1)
    lines = r.stderr.splitlines()

    def emitted(role: str, pid: str, text: str) -> bool:
        return any(line.startswith(f"emitted-by={sup} {role}[{pid}] test.role: {text}") for line in lines)

    assert emitted("once", pids["once"], f"hello once from pid {pids['once']}"), r.stderr
    assert emitted("keeper", pids["first"], f"hello first from pid {pids['first']}"), r.stderr
    assert emitted("keeper", pids["second"], f"hello second from pid {pids['second']}"), r.stderr
    assert emitted("keeper", pids["second"], "stopping second"), r.stderr
    assert len({pids["once"], pids["first"], pids["second"], sup}) == 4
    # nothing reached stderr except through the supervisor's handler
    assert all(line.startswith(f"emitted-by={sup} ") for line in lines if line.strip()), r.stderr


def test_the_launcher_exits_with_the_supervisor_and_takes_the_roles_along():
    """Proves the cleanup path of a crash: SIGKILL of the supervisor makes the
    launcher read EOF and exit, and its role processes follow (an io-worker-like
    role through PR_SET_PDEATHSIG, a stop-pipe role through EOF), including a role
    that arms PR_SET_PDEATHSIG only after the launcher is already gone: a role forked
    just before the kill, on a loaded machine (this test failed once in CI that way)."""
    script = textwrap.dedent("""
        import asyncio, os, sys, time
        from mq.logs import setup_broker_logging
        from mq.broker.launcher import Launcher, STOP_PIPE, die_with_parent

        def worker():
            die_with_parent()
            time.sleep(120)

        def piped(stop):
            stop.wait(120)

        def late(launcher_pid):
            while os.getppid() == launcher_pid:   # arm only once the launcher is gone
                time.sleep(0.01)
            die_with_parent()
            time.sleep(120)

        setup_broker_logging()
        launcher = Launcher()

        async def main():
            launcher.attach(asyncio.get_running_loop())
            a = launcher.start("w", worker, ())
            b = launcher.start("p", piped, (STOP_PIPE,))
            c = launcher.start("l", late, (launcher.pid,))
            while a.pid is None or b.pid is None or c.pid is None:
                await asyncio.sleep(0.01)
            print(launcher.pid, a.pid, b.pid, c.pid, flush=True)
            await asyncio.sleep(120)

        asyncio.run(main())
        """)
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        pids = [int(x) for x in p.stdout.readline().split()]
        assert len(pids) == 4
        os.kill(p.pid, signal.SIGKILL)
        p.wait(10)
        from mq.cluster import wait_for
        wait_for(lambda: not any(_alive(pid) for pid in pids), 15, what="launcher and roles gone")
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_role_killed_holding_the_stream_lock_does_not_silence_the_others():
    """Proves release_stuck_log_lock: a role process killed with SIGKILL while
    it holds the log queue's write lock (as if killed mid-record) would block
    every other process's records; the supervisor finds the lock stuck,
    releases it, and records from a role started afterwards arrive."""
    script = textwrap.dedent("""
        import asyncio, logging, os, signal, sys, time
        from mq.logs import setup_broker_logging, release_stuck_log_lock
        from mq.broker.launcher import Launcher

        def grab():
            logging.getLogger().handlers[0].queue._wlock.acquire()
            time.sleep(120)

        def speak():
            logging.getLogger("test.role").info("still heard from pid %d", os.getpid())

        setup_broker_logging()
        launcher = Launcher()

        async def main():
            launcher.attach(asyncio.get_running_loop())
            g = launcher.start("grabber", grab, ())
            await asyncio.sleep(1.0)
            g.kill()
            assert await g.wait(20) and g.exitcode == -signal.SIGKILL
            print("released", await asyncio.to_thread(release_stuck_log_lock, 0.5), flush=True)
            s = launcher.start("speaker", speak, ())
            assert await s.wait(20) and s.exitcode == 0
            print("speaker", s.pid, flush=True)

        asyncio.run(main())
        launcher.close()
        time.sleep(0.5)
        """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "released True" in r.stdout, r.stdout + r.stderr
    pid = re.search(r"speaker (\d+)", r.stdout).group(1)
    assert f"speaker[{pid}] test.role: still heard from pid {pid}" in r.stderr, r.stderr
