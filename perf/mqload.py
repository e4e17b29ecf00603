"""mqload: the native load client (perf/mqload.c), built on demand, and a Python call to run it.

The broker gates need a client that costs far less CPU than the broker, or the client's cost
hides the broker's (the asyncio clients spend more per message than the io worker does).
mqload is one C file with no dependency beyond libc (one thread, epoll, SEND_MESSAGE_V2 from a
prebuilt template); see the top of mqload.c for its options, output and exit codes.

    build() -> path of the binary: compiled with `$CC` (default gcc) -O2 into a cache directory
        ($MQ_PERF_CACHE alone if set; else $XDG_CACHE_HOME/mq-perf or ~/.cache/mq-perf, and a
        temp directory when that is not writable), named after the source's SHA-256, so a changed source is rebuilt
        and an unchanged one is not.  No compiler: MqloadError saying so.
    run_mqload(addr, conns, n, depth=1, size=1024, topic=..., queues=4) -> dict, mqload's JSON
        line (msgs, acked, errors, seconds, msgs_per_s, p50_us, p99_us, ..., codes); exit 1
        (some answers were not SUCCESS) still returns it: check "errors".  Bad arguments (2),
        connect failure (3), anything else: MqloadError with mqload's stderr.

    python -m perf.mqload -p PORT -c 32 -n 100000     builds if needed and runs it with these args
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mqload.c")
CFLAGS = ["-O2", "-Wall", "-Wextra"]


class MqloadError(RuntimeError):
    """mqload could not be built, or a run ended without a result."""


def _source_digest() -> str:
    try:
        with open(SOURCE, "rb") as f:
            return hashlib.sha256(f.read() + " ".join(CFLAGS).encode()).hexdigest()[:16]
    except OSError as e:
        raise MqloadError(f"mqload's source is missing: {SOURCE} ({e.strerror})") from None


def _cache_dirs() -> list[str]:
    """$MQ_PERF_CACHE alone when set; else the user's cache directory, then a temp directory."""
    if os.environ.get("MQ_PERF_CACHE"):
        return [os.environ["MQ_PERF_CACHE"]]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return [os.path.join(base, "mq-perf"), os.path.join(tempfile.gettempdir(), f"mq-perf-{os.getuid()}")]


def _compiler() -> str:
    cc = os.environ.get("CC", "gcc")
    path = shutil.which(cc)
    if path is None:
        raise MqloadError(f"mqload needs a C compiler to build {SOURCE}: '{cc}' is not on PATH "
                          f"(install gcc, e.g. `apt-get install gcc`, or set CC)")
    return path


def build() -> str:
    """The path of an mqload binary built from the current source (built now if not cached)."""
    name = f"mqload-{_source_digest()}"
    for d in _cache_dirs():
        path = os.path.join(d, name)
        if os.access(path, os.X_OK):
            return path
    cc = _compiler()
    errors = []
    for d in _cache_dirs():
        try:
            os.makedirs(d, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{name}-", dir=d)
        except OSError as e:
            errors.append(f"{d}: {e.strerror}")
            continue
        os.close(fd)
        try:
            done = subprocess.run([cc, *CFLAGS, "-o", tmp, SOURCE], capture_output=True, text=True, timeout=120)
            if done.returncode != 0:
                raise MqloadError(f"building mqload failed ({cc} exited {done.returncode}):\n{done.stderr[-3000:]}")
            os.chmod(tmp, 0o755)
            path = os.path.join(d, name)
            os.replace(tmp, path)            # atomic: a concurrent build of the same source is harmless
            return path
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    raise MqloadError(f"no writable cache directory for mqload: {'; '.join(errors)}")


def split_addr(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"address must be host:port, not {addr!r}")
    return host, int(port)


def mqload_args(addr: str, conns: int, n: int | None = None, depth: int = 1, size: int = 1024,
                topic: str = "MqLoadTopic", queues: int = 4, group: str | None = None,
                seconds: float | None = None, stall_s: float | None = None) -> list[str]:
    host, port = split_addr(addr)
    args = ["-h", host, "-p", str(port), "-c", str(conns), "-P", str(depth), "-d", str(size), "-t", topic,
            "-q", str(queues)]
    if n is not None:
        args += ["-n", str(n)]
    if seconds is not None:
        args += ["-s", repr(float(seconds))]
    if group is not None:
        args += ["-g", group]
    if stall_s is not None:
        args += ["-T", repr(float(stall_s))]
    return args


def run_mqload(addr: str, conns: int, n: int | None = None, depth: int = 1, size: int = 1024,
               topic: str = "MqLoadTopic", queues: int = 4, group: str | None = None,
               seconds: float | None = None, stall_s: float | None = None, timeout_s: float = 600) -> dict:
    """Runs mqload against `addr` ("host:port"): `conns` connections, `depth` SEND_MESSAGE_V2 in
    flight on each, `n` messages overall (or for `seconds`), `size`-byte bodies, queueIds round
    robin over 0..queues-1.  Returns its JSON result (see the module docstring)."""
    binary = build()
    cmd = [binary, *mqload_args(addr, conns, n, depth, size, topic, queues, group, seconds, stall_s)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode not in (0, 1):
        raise MqloadError(f"mqload exited {done.returncode}: {done.stderr.strip()[-2000:]}")
    lines = done.stdout.strip().splitlines()
    try:
        result = json.loads(lines[-1])
    except (IndexError, ValueError):
        raise MqloadError(f"mqload printed no result (exit {done.returncode}): stdout {done.stdout[-500:]!r}, "
                          f"stderr {done.stderr[-1000:]!r}") from None
    result["exit_code"] = done.returncode
    if done.stderr.strip():
        result["stderr"] = done.stderr.strip()
    return result


def main(argv: list[str] | None = None) -> int:
    try:
        binary = build()
    except MqloadError as e:
        print(f"mqload: {e}", file=sys.stderr)
        return 4
    return subprocess.call([binary, *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
