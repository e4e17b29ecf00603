"""LD_PRELOAD shims for one broker's process tree, built here with gcc on first use and steered
through a file while the broker runs: ClockShift (clockshift.c) jumps its wall clock, SlowSync
(slowsync.c) makes its disk syncs slow.

The clock nemesis's tool: jumps of one broker's wall clock (CLOCK_REALTIME) while the machine's
clock stays put.

    shift = ClockShift(directory, "chaos-a")   # builds the shim, creates the offset file at 0
    Broker(..., env=shift.env())               # the broker and every process it forks see it
    shift.set(+300_000)                        # its wall clock jumps 5 minutes ahead, at once
    shift.set(0)                               # and back

Python's time.time(), the C module's clock_gettime(CLOCK_REALTIME) and Java-style
currentTimeMillis all move; time.monotonic() and CLOCK_MONOTONIC do not (what an NTP step does)."""
from __future__ import annotations

import mmap
import os
import struct
import subprocess
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
_build_lock = threading.Lock()


def build_shim(directory: str, name: str = "clockshift") -> str:
    """<name>.so in `directory`, from mq/chaos/<name>.c (compiled once per directory): an
    LD_PRELOAD shim (clockshift, slowsync).  Raises RuntimeError without gcc."""
    out = os.path.join(directory, f"{name}.so")
    with _build_lock:
        if not os.path.exists(out):
            os.makedirs(directory, exist_ok=True)
            try:
                subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-Wall", "-I", HERE, "-o", out + ".tmp",
                                os.path.join(HERE, f"{name}.c"), "-ldl"],
                               check=True, capture_output=True, text=True, timeout=120)
            except (OSError, subprocess.CalledProcessError) as e:
                raise RuntimeError(f"building the {name} shim failed: {getattr(e, 'stderr', '') or e}") from None
            os.replace(out + ".tmp", out)
    return out


class ShimFile:
    """The 8-byte file through which a test or nemesis steers a shim while its processes run
    (one signed native-order int64; one store, so readers see the old or the new value)."""

    def __init__(self, path: str):
        self.path = path
        with open(path, "wb") as f:
            f.write(bytes(8))
        self._fd = os.open(path, os.O_RDWR)
        self._map = mmap.mmap(self._fd, 8)

    def write(self, value: int) -> None:
        self._map[0:8] = struct.pack("=q", value)

    def close(self) -> None:
        self._map.close()
        os.close(self._fd)


class ClockShift:
    """One process tree's wall-clock offset (ms), shared with the shim through an 8-byte file."""

    def __init__(self, directory: str, name: str):
        self.shim = build_shim(directory, "clockshift")
        self.file = ShimFile(os.path.join(directory, f"clockshift-{name}"))
        self.path = self.file.path
        self.offset_ms = 0

    def env(self) -> dict:
        return {"LD_PRELOAD": self.shim, "MQ_CLOCK_SHIFT_FILE": self.path}

    def set(self, offset_ms: int) -> None:
        """The wall clock of every process started with env() is now offset_ms off."""
        self.file.write(offset_ms)
        self.offset_ms = offset_ms

    def close(self) -> None:
        self.file.close()


class SlowSync:
    """A slow disk for one process tree, through the LD_PRELOAD shim slowsync.c: every fsync,
    fdatasync, msync(MS_SYNC) and waiting sync_file_range of a process started with env()
    takes `delay_ms` more, as on a disk busy with other writes.

        slow = SlowSync(directory, "b")
        Broker(..., env=slow.env())
        slow.set(2000)                  # each sync now takes 2 s more
        slow.set(0)"""

    def __init__(self, directory: str, name: str):
        self.shim = build_shim(directory, "slowsync")
        self.file = ShimFile(os.path.join(directory, f"slowsync-{name}"))
        self.path = self.file.path
        self.delay_ms = 0

    def env(self) -> dict:
        return {"LD_PRELOAD": self.shim, "MQ_SLOW_SYNC_FILE": self.path}

    def set(self, delay_ms: int) -> None:
        self.file.write(delay_ms)
        self.delay_ms = delay_ms

    def close(self) -> None:
        self.file.close()
