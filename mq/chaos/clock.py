"""The clock nemesis's tool: jumps of one broker's wall clock (CLOCK_REALTIME) while the machine's
clock stays put, through the LD_PRELOAD shim clockshift.c (built here with gcc on first use).

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

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "clockshift.c")
_build_lock = threading.Lock()


def build_shim(directory: str) -> str:
    """clockshift.so in `directory` (compiled once per directory); raises RuntimeError without gcc."""
    out = os.path.join(directory, "clockshift.so")
    with _build_lock:
        if not os.path.exists(out):
            os.makedirs(directory, exist_ok=True)
            try:
                subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-o", out + ".tmp", SOURCE, "-ldl"],
                               check=True, capture_output=True, text=True, timeout=120)
            except (OSError, subprocess.CalledProcessError) as e:
                raise RuntimeError(f"building the clock shim failed: {getattr(e, 'stderr', '') or e}") from None
            os.replace(out + ".tmp", out)
    return out


class ClockShift:
    """One process tree's wall-clock offset (ms), shared with the shim through an 8-byte file."""

    def __init__(self, directory: str, name: str):
        self.shim = build_shim(directory)
        self.path = os.path.join(directory, f"clockshift-{name}")
        with open(self.path, "wb") as f:
            f.write(bytes(8))
        self._fd = os.open(self.path, os.O_RDWR)
        self._map = mmap.mmap(self._fd, 8)
        self.offset_ms = 0

    def env(self) -> dict:
        return {"LD_PRELOAD": self.shim, "MQ_CLOCK_SHIFT_FILE": self.path}

    def set(self, offset_ms: int) -> None:
        """The wall clock of every process started with env() is now offset_ms off (one 8-byte
        store: readers see the old or the new value, never a mix)."""
        self._map[0:8] = struct.pack("=q", offset_ms)
        self.offset_ms = offset_ms

    def close(self) -> None:
        self._map.close()
        os.close(self._fd)
