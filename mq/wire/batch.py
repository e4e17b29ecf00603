"""SEND_BATCH_MESSAGE (code 320) request body: back-to-back records as MessageDecoder.encodeMessages writes them.

    TOTALSIZE 4 | MAGIC 4 (0) | BODYCRC 4 (0) | FLAG 4 | BODYLEN 4 | BODY | PROPSLEN 2 (signed) | PROPS ... repeated

Big-endian, signed ints. Invariants checked by parse_batch:
* every record has TOTALSIZE == 22 + BODYLEN + PROPSLEN (BATCH_RECORD_SIZE_MIN = 22), with BODYLEN >= 0 and
  PROPSLEN >= 0, and lies entirely inside the buffer; the records tile the buffer exactly.
* MAGIC and BODYCRC are written as 0 by clients and ignored by the broker (which computes its own CRC), so
  parse_batch keeps whatever it reads and does not judge them.
* PROPS are raw bytes (UTF-8 from Java clients); the broker appends the batch-level properties (header `i`
  plus CLUSTER) to each record's own, with a 0x02 separator when needed. That is store policy, not here.
The Java broker itself reads BODYLEN and PROPSLEN and ignores TOTALSIZE; checking TOTALSIZE here is stricter
and never rejects what a Java or C++ client sends (both write it correctly).
An empty buffer parses to an empty list; rejecting an empty batch is the caller's decision.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import NamedTuple

from construct import (
    Check,
    Default,
    FocusedSeq,
    GreedyBytes,
    GreedyRange,
    Int16sb,
    Int32sb,
    Prefixed,
    Rebuild,
    Struct,
    Terminated,
    len_,
    this,
)

from .errors import EncodeError, SizeMismatchError, TruncatedError
from .properties import PROPERTIES_SIZE_MAX

__all__ = [
    "BATCH_RECORD_SIZE_MIN",
    "BatchRecord",
    "Batch",
    "BatchItem",
    "build_batch",
    "parse_batch",
]

BATCH_RECORD_SIZE_MIN = 4 + 4 + 4 + 4 + 4 + 2  # 22: empty body and properties

BatchRecord = """
One record of a SEND_BATCH_MESSAGE body. Building computes total_size and writes magic = body_crc = 0.
""" * Struct(
    "total_size" / Rebuild(Int32sb, BATCH_RECORD_SIZE_MIN + len_(this.body) + len_(this.properties)),
    "magic" / Default(Int32sb, 0),
    "body_crc" / Default(Int32sb, 0),
    "flag" / Int32sb,
    "body" / Prefixed(Int32sb, GreedyBytes),
    "properties" / Prefixed(Int16sb, GreedyBytes),
    Check(this.total_size == BATCH_RECORD_SIZE_MIN + len_(this.body) + len_(this.properties)),
)

Batch = """
A whole SEND_BATCH_MESSAGE body: BatchRecords tiling the buffer exactly (a partial tail is an error).
""" * FocusedSeq("records", "records" / GreedyRange(BatchRecord), Terminated)


class BatchItem(NamedTuple):
    """One message of a batch as the broker needs it (equal to a plain (flag, body, properties) tuple)."""

    flag: int
    body: bytes
    properties: bytes


_HEAD = struct.Struct(">iiiii")  # TOTALSIZE, MAGIC, BODYCRC, FLAG, BODYLEN
_I16 = struct.Struct(">h")


def build_batch(items: Iterable[tuple[int, bytes, bytes | str]]) -> bytes:
    """Encode (flag, body, properties) triples as a client does; properties as bytes or str (UTF-8).

    Raises EncodeError for a flag outside int32 or properties over 32767 bytes.
    """
    parts: list[bytes] = []
    for index, (flag, body, properties) in enumerate(items):
        properties_bytes = properties.encode("utf-8") if isinstance(properties, str) else bytes(properties)
        body = bytes(body)
        if len(properties_bytes) > PROPERTIES_SIZE_MAX:
            raise EncodeError(f"batch record {index}: properties are {len(properties_bytes)} bytes, limit {PROPERTIES_SIZE_MAX}")
        total_size = BATCH_RECORD_SIZE_MIN + len(body) + len(properties_bytes)
        if not -(1 << 31) <= flag < (1 << 31) or total_size >= (1 << 31):
            raise EncodeError(f"batch record {index}: flag {flag} or size {total_size} does not fit an int32")
        parts.append(_HEAD.pack(total_size, 0, 0, flag, len(body)))
        parts.append(body)
        parts.append(_I16.pack(len(properties_bytes)))
        parts.append(properties_bytes)
    return b"".join(parts)


def parse_batch(buf) -> list[BatchItem]:
    """Split a batch body into BatchItems, validating every length before trusting it.

    Raises TruncatedError when the buffer ends inside a record (fewer than 4 bytes for TOTALSIZE, or fewer
    than TOTALSIZE bytes), SizeMismatchError when TOTALSIZE is below 22, a length is negative or runs past
    TOTALSIZE, or TOTALSIZE != 22 + BODYLEN + PROPSLEN. Messages name the record index and byte offset.
    """
    items: list[BatchItem] = []
    offset = 0
    end = len(buf)
    while offset < end:
        where = f"batch record {len(items)} @{offset}"
        available = end - offset
        if available < 4:
            raise TruncatedError(f"{where}: {available} bytes left, TOTALSIZE needs 4")
        (total_size,) = struct.unpack_from(">i", buf, offset)
        if total_size < BATCH_RECORD_SIZE_MIN:
            raise SizeMismatchError(f"{where}: TOTALSIZE {total_size} is below the minimum {BATCH_RECORD_SIZE_MIN}")
        if total_size > available:
            raise TruncatedError(f"{where}: TOTALSIZE {total_size} but only {available} bytes left")
        record_end = offset + total_size
        _, _, _, flag, body_size = _HEAD.unpack_from(buf, offset)
        pos = offset + 20
        if body_size < 0 or pos + body_size + 2 > record_end:
            raise SizeMismatchError(f"{where}: BODYLEN {body_size} does not fit in TOTALSIZE {total_size}")
        body = bytes(buf[pos:pos + body_size])
        pos += body_size
        (properties_size,) = _I16.unpack_from(buf, pos)
        pos += 2
        if properties_size < 0 or pos + properties_size > record_end:
            raise SizeMismatchError(f"{where}: PROPERTIESLEN {properties_size} does not fit in TOTALSIZE {total_size}")
        properties = bytes(buf[pos:pos + properties_size])
        pos += properties_size
        if pos != record_end:
            raise SizeMismatchError(
                f"{where}: TOTALSIZE {total_size} != recomputed {pos - offset} "
                f"(BODYLEN {body_size}, PROPERTIESLEN {properties_size})"
            )
        items.append(BatchItem(flag, body, properties))
        offset = record_end
    return items
