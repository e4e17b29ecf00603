"""The store `checkpoint` file (S/StoreCheckpoint.java, spec 3.6).

    PHYSICMSGTIMESTAMP 8 | LOGICSMSGTIMESTAMP 8 | INDEXMSGTIMESTAMP 8 | zero padding to 4096 bytes

Big-endian signed longs, milliseconds. Invariants:
* the file is exactly CHECKPOINT_FILE_SIZE bytes; only the first 24 are meaningful (the rest is written as
  zeroes and ignored on read).
* physic = store time of the last flushed CommitLog record, logics = of the last record dispatched to a CQ,
  index = of the last record indexed. Each only moves forward while the broker runs.
* min_timestamp_ms = max(0, min(physic, logics) - 3000): abnormal recovery starts from the newest CommitLog
  file whose first record's STORETIMESTAMP <= it. min_timestamp_index_ms also takes the index time into
  account (used when messageIndexEnable && messageIndexSafe).
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from construct import Int64sb, Padding, Struct

from .errors import EncodeError, TruncatedError

__all__ = [
    "CHECKPOINT_FILE_SIZE",
    "CHECKPOINT_MIN_TIMESTAMP_SLACK_MS",
    "Checkpoint",
    "CheckpointValues",
    "parse_checkpoint",
    "build_checkpoint",
    "min_timestamp_ms",
    "min_timestamp_index_ms",
]

CHECKPOINT_FILE_SIZE = 4096
CHECKPOINT_MIN_TIMESTAMP_SLACK_MS = 3000

Checkpoint = """
The 4096-byte checkpoint file: three timestamps (ms) and zero padding.
""" * Struct(
    "physic_msg_timestamp_ms" / Int64sb,
    "logics_msg_timestamp_ms" / Int64sb,
    "index_msg_timestamp_ms" / Int64sb,
    Padding(CHECKPOINT_FILE_SIZE - 24),
)


class CheckpointValues(NamedTuple):
    physic_msg_timestamp_ms: int
    logics_msg_timestamp_ms: int
    index_msg_timestamp_ms: int


_TIMES = struct.Struct(">qqq")


def parse_checkpoint(buf) -> CheckpointValues:
    """The three timestamps of a checkpoint file. Raises TruncatedError if buf is shorter than 4096 bytes
    (Java maps the file at full size, so a shorter file is a torn or foreign one)."""
    if len(buf) < CHECKPOINT_FILE_SIZE:
        raise TruncatedError(f"checkpoint: {len(buf)} bytes, expected {CHECKPOINT_FILE_SIZE}")
    return CheckpointValues(*_TIMES.unpack_from(buf, 0))


def build_checkpoint(physic_msg_timestamp_ms: int, logics_msg_timestamp_ms: int, index_msg_timestamp_ms: int) -> bytes:
    """The full 4096-byte file content."""
    try:
        head = _TIMES.pack(physic_msg_timestamp_ms, logics_msg_timestamp_ms, index_msg_timestamp_ms)
    except struct.error as exc:
        raise EncodeError(f"checkpoint timestamps do not fit int64: {exc}") from None
    return head + bytes(CHECKPOINT_FILE_SIZE - len(head))


def min_timestamp_ms(cp) -> int:
    """StoreCheckpoint.getMinTimestamp: max(0, min(physic, logics) - 3000). cp: CheckpointValues or Container."""
    low = min(cp.physic_msg_timestamp_ms, cp.logics_msg_timestamp_ms) - CHECKPOINT_MIN_TIMESTAMP_SLACK_MS
    return max(0, low)


def min_timestamp_index_ms(cp) -> int:
    """StoreCheckpoint.getMinTimestampIndex: min(min_timestamp_ms(cp), index)."""
    return min(min_timestamp_ms(cp), cp.index_msg_timestamp_ms)
