"""Master/slave HA frames (4.x classic HAService, spec 4.2); plain TCP, not the remoting protocol.

    slave -> master:  MAXPHYOFFSET 8                                   (HaSlaveReport, exactly 8 bytes)
    master -> slave:  MASTERPHYOFFSET 8 | BODYSIZE 4 | BODY (BODYSIZE raw CommitLog bytes)   (HaFrameHeader + body)

Big-endian signed. Invariants:
* the master reads reports in 8-byte units and acts on the last complete one (last_slave_report).
* MASTERPHYOFFSET is the CommitLog offset of the first body byte; the body is a verbatim byte range of the
  master's CommitLog that may start or end mid-record but never crosses a CommitLog file boundary.
* 0 <= BODYSIZE <= HA_TRANSFER_BATCH_SIZE (32 KiB) from a 4.x master; BODYSIZE == 0 is the heartbeat.
  unpack_ha_frame_header takes the bound to enforce as an argument (the slave's read buffer decides).

Take-back (ours, not in RocketMQ): a SYNC_MASTER that restarts after a crash may have lost an
unflushed tail its slave acknowledged.  When the slave's first report is beyond the master's end
and the master still refuses writes for this reason, the master asks for the slave's surplus
instead of telling it to truncate, and the roles of the two directions swap once:

    master -> slave:  MASTERPHYOFFSET 8 | BODYSIZE 4 = -1         "give back from here to your end"
    slave -> master:  -1 as a report (8 bytes, TAKE_BACK_MARK)    "frames follow"
                      then frames (header + body, as above) from MASTERPHYOFFSET to the slave's
                      first report, after which the slave reports as before.

Only an exact -1 has this meaning; any other negative value stays a protocol error.  A RocketMQ
slave never sees the request unless our master waits for a give-back (docs: README, HA).
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from construct import Int32sb, Int64sb, Struct

from .errors import EncodeError, SizeMismatchError, TruncatedError

__all__ = [
    "HA_SLAVE_REPORT_SIZE",
    "HA_FRAME_HEADER_SIZE",
    "HA_TRANSFER_BATCH_SIZE",
    "HaSlaveReport",
    "HaFrameHeader",
    "HaHeader",
    "pack_slave_report",
    "unpack_slave_report",
    "last_slave_report",
    "pack_ha_frame_header",
    "unpack_ha_frame_header",
    "TAKE_BACK_SIZE",
    "TAKE_BACK_MARK",
    "pack_take_back_request",
    "pack_take_back_mark",
    "unpack_slave_word",
]

HA_SLAVE_REPORT_SIZE = 8
HA_FRAME_HEADER_SIZE = 12
HA_TRANSFER_BATCH_SIZE = 32768
TAKE_BACK_SIZE = -1          # BODYSIZE of the master's take-back request (0xFFFFFFFF read unsigned)
TAKE_BACK_MARK = -1          # the slave's 8-byte answer before it gives back

HaSlaveReport = """
Slave -> master: the slave's CommitLog max physical offset (first one = where to start, later ones = acks).
""" * Struct("max_phy_offset" / Int64sb)

HaFrameHeader = """
Master -> slave: CommitLog offset of the first body byte and the body size; body_size bytes follow.
""" * Struct("master_phy_offset" / Int64sb, "body_size" / Int32sb)


class HaHeader(NamedTuple):
    master_phy_offset: int
    body_size: int


_REPORT = struct.Struct(">q")
_HEADER = struct.Struct(">qi")


def pack_slave_report(max_phy_offset: int) -> bytes:
    """The 8-byte report. Raises EncodeError if the offset is negative or over int64."""
    if not 0 <= max_phy_offset < (1 << 63):
        raise EncodeError(f"HA report offset {max_phy_offset} is not a non-negative int64")
    return _REPORT.pack(max_phy_offset)


def unpack_slave_report(buf, offset: int = 0) -> int:
    """The report at `offset`. Raises TruncatedError (< 8 bytes) or SizeMismatchError (negative offset)."""
    if len(buf) - offset < HA_SLAVE_REPORT_SIZE:
        raise TruncatedError(f"HA report @{offset}: need 8 bytes, {max(len(buf) - offset, 0)} left")
    (value,) = _REPORT.unpack_from(buf, offset)
    if value < 0:
        raise SizeMismatchError(f"HA report @{offset}: negative offset {value}")
    return value


def last_slave_report(buf) -> tuple[int | None, int]:
    """(value of the last complete 8-byte report or None, bytes consumed = len aligned down to 8).

    What the master's ReadSocketService does with whatever it has read so far; the caller keeps the
    unconsumed tail (< 8 bytes) for the next read.
    """
    consumed = len(buf) - len(buf) % HA_SLAVE_REPORT_SIZE
    if consumed == 0:
        return None, 0
    return unpack_slave_report(buf, consumed - HA_SLAVE_REPORT_SIZE), consumed


def pack_ha_frame_header(master_phy_offset: int, body_size: int) -> bytes:
    """The 12-byte header; the caller sends body_size CommitLog bytes after it."""
    if not 0 <= master_phy_offset < (1 << 63) or not 0 <= body_size < (1 << 31):
        raise EncodeError(f"HA header ({master_phy_offset}, {body_size}) out of range")
    return _HEADER.pack(master_phy_offset, body_size)


def unpack_ha_frame_header(buf, offset: int = 0, *, body_size_max: int | None = None) -> HaHeader:
    """The header at `offset`. Raises TruncatedError (< 12 bytes), SizeMismatchError (negative offset or size,
    or size over body_size_max when given)."""
    if len(buf) - offset < HA_FRAME_HEADER_SIZE:
        raise TruncatedError(f"HA header @{offset}: need 12 bytes, {max(len(buf) - offset, 0)} left")
    master_phy_offset, body_size = _HEADER.unpack_from(buf, offset)
    if master_phy_offset < 0 or body_size < 0:
        raise SizeMismatchError(f"HA header @{offset}: negative offset {master_phy_offset} or body size {body_size}")
    if body_size_max is not None and body_size > body_size_max:
        raise SizeMismatchError(f"HA header @{offset}: body size {body_size} over the limit {body_size_max}")
    return HaHeader(master_phy_offset, body_size)


def pack_take_back_request(master_end: int) -> bytes:
    """The master's request: give back everything from `master_end` to your end."""
    if not 0 <= master_end < (1 << 63):
        raise EncodeError(f"take-back offset {master_end} is not a non-negative int64")
    return _HEADER.pack(master_end, TAKE_BACK_SIZE)


def pack_take_back_mark() -> bytes:
    """The slave's answer to a take-back request; its frames follow."""
    return _REPORT.pack(TAKE_BACK_MARK)


def unpack_slave_word(buf, offset: int = 0) -> int:
    """An 8-byte word from the slave while the master waits for a give-back: a report (>= 0) or
    TAKE_BACK_MARK.  Raises TruncatedError (< 8 bytes) or SizeMismatchError (another negative)."""
    if len(buf) - offset < HA_SLAVE_REPORT_SIZE:
        raise TruncatedError(f"HA word @{offset}: need 8 bytes, {max(len(buf) - offset, 0)} left")
    (value,) = _REPORT.unpack_from(buf, offset)
    if value < 0 and value != TAKE_BACK_MARK:
        raise SizeMismatchError(f"HA word @{offset}: negative value {value}")
    return value
