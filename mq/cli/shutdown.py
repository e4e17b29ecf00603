"""mqshutdown broker|namesrv: stop the running broker or name server, as RocketMQ's
bin/mqshutdown does (it finds the process and sends it SIGTERM).

    mqshutdown broker  [-c FILE] [-w SECONDS] [--dry-run]
    mqshutdown namesrv [-c FILE] [-w SECONDS] [--dry-run]

Finds this user's mqbroker (or mqnamesrv) processes from /proc: a console script `mqbroker`
(`mqnamesrv`) or `python -m mq.cli.broker` (`mq.cli.namesrv`).  A broker's io workers and store
roles are forks with the same command line; only the topmost process of each broker (its
supervisor) is signalled, and it stops the others in order (SIGTERM is the clean stop:
unregister, finish in-flight requests, flush, checkpoint, remove the abort file).

  -c FILE     only the process started with this config file (-c/--configFile FILE, resolved
              against that process's working directory): one broker among several
  -w SECONDS  wait until each signalled process has exited (0, the default: do not wait, as
              RocketMQ's script does not)
  --dry-run   say what would be signalled, send nothing

Prints RocketMQ's lines: "The mqbroker(PID) is running..." and "Send shutdown request to
mqbroker(PID) OK", or "No mqbroker running.".

Exit codes: 0 signalled (and with -w, exited); 1 none running, a signal refused, or still
running after -w; 2 bad command line."""
from __future__ import annotations

import argparse
import os
import signal
import sys
import time

PROGRAMS = {"broker": ("mqbroker", "mq.cli.broker"), "namesrv": ("mqnamesrv", "mq.cli.namesrv")}
WAIT_POLL_S = 0.1


def _cmdline(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    return [a.decode("utf-8", "replace") for a in raw.split(b"\0")[:-1]] or None


def _ppid(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for its parent has stopped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def is_program(argv: list[str], what: str) -> bool:
    """Whether a command line runs the console script or the module of `what` (broker, namesrv)."""
    script, module = PROGRAMS[what]
    if os.path.basename(argv[0]) == script:
        return True
    if len(argv) > 1 and os.path.basename(argv[0]).startswith("python") and os.path.basename(argv[1]) == script:
        return True
    return any(a == "-m" and b == module for a, b in zip(argv, argv[1:]))


def config_file_of(pid: int, argv: list[str]) -> str | None:
    """The -c/--configFile argument of a command line, made absolute against the process's
    working directory."""
    value = None
    for i, a in enumerate(argv):
        if a in ("-c", "--configFile") and i + 1 < len(argv):
            value = argv[i + 1]
        elif a.startswith("--configFile="):
            value = a.split("=", 1)[1]
    if value is None:
        return None
    if not os.path.isabs(value):
        try:
            value = os.path.join(os.readlink(f"/proc/{pid}/cwd"), value)
        except OSError:
            return None
    return os.path.realpath(value)


def find(what: str, config_file: str | None = None) -> list[int]:
    """This user's processes running `what`, only the topmost of each process tree (a broker's
    supervisor, not its forked roles); with config_file only those started with it."""
    uid = os.getuid()
    matches: dict[int, list[str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        pid = int(entry)
        try:
            if os.stat(f"/proc/{pid}").st_uid != uid:
                continue
        except OSError:
            continue
        argv = _cmdline(pid)
        if argv and is_program(argv, what) and _alive(pid):
            matches[pid] = argv
    want = os.path.realpath(config_file) if config_file else None
    out = []
    for pid, argv in sorted(matches.items()):
        if _ppid(pid) in matches:
            continue                      # a forked role of a process already listed
        if want is not None and config_file_of(pid, argv) != want:
            continue
        out.append(pid)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="mqshutdown", description="Stop the running mqbroker or mqnamesrv "
                                 "(SIGTERM, its clean stop), as RocketMQ's mqshutdown")
    ap.add_argument("what", choices=sorted(PROGRAMS), help="broker or namesrv")
    ap.add_argument("-c", "--configFile", help="only the one started with this config file")
    ap.add_argument("-w", "--wait", type=float, default=0.0, metavar="SECONDS",
                    help="wait up to this long for each to exit (0: do not wait)")
    ap.add_argument("--dry-run", action="store_true", help="say what would be signalled, send nothing")
    args = ap.parse_args(argv)
    name = PROGRAMS[args.what][0]
    pids = find(args.what, args.configFile)
    if not pids:
        print(f"No {name} running." + (f" (started with -c {args.configFile})" if args.configFile else ""))
        return 1
    rc = 0
    sent = []
    for pid in pids:
        print(f"The {name}({pid}) is running...")
        if args.dry_run:
            continue
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            print(f"{name}({pid}) exited meanwhile")
            continue
        except PermissionError as e:
            print(f"mqshutdown: cannot signal {name}({pid}): {e}", file=sys.stderr)
            rc = 1
            continue
        print(f"Send shutdown request to {name}({pid}) OK")
        sent.append(pid)
    if args.wait > 0 and sent:
        deadline = time.monotonic() + args.wait
        left = list(sent)
        while left and time.monotonic() < deadline:
            time.sleep(WAIT_POLL_S)
            left = [p for p in left if _alive(p)]
        for pid in sent:
            if pid in left:
                print(f"mqshutdown: {name}({pid}) still running after {args.wait:g}s", file=sys.stderr)
                rc = 1
            else:
                print(f"{name}({pid}) stopped")
    return rc


if __name__ == "__main__":
    sys.exit(main())
