"""ConsumeQueue entry (spec 3.4) and the tagsCode hash.

    COMMITLOGOFFSET 8 (signed) | SIZE 4 (signed, the record's TOTALSIZE) | TAGSCODE 8 (signed)     = 20 bytes

Invariants:
* entry n of a queue sits at logical byte offset n * CQ_ENTRY_SIZE; a file holds CQ_ENTRIES_PER_FILE entries
  (CQ_FILE_SIZE = 6,000,000 bytes) and is named by the 20-digit logical byte offset of its first entry.
* a real entry has commit_log_offset >= 0 and size > 0 (recovery stops at the first entry that has not);
  FILLER_ENTRY (0, 0x7FFFFFFF, 0) pads a first file that starts at a non-zero logical offset.
* tags_code = Java String.hashCode() of the TAGS property (int32 arithmetic over UTF-16 code units,
  sign-extended to int64), 0 when there is no tag or it is empty. Clients send the same hashes in
  `codeSet`, so this must be bit-exact. (SCHEDULE_TOPIC_XXXX stores the deliver time instead: store policy.)
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from construct import Int32sb, Int64sb, Struct

from .errors import EncodeError, TruncatedError
from .properties import decode_properties

__all__ = [
    "CQ_ENTRY",
    "CQ_ENTRY_SIZE",
    "CQ_ENTRIES_PER_FILE",
    "CQ_FILE_SIZE",
    "FILLER_SIZE",
    "FILLER_ENTRY",
    "FILLER_ENTRY_BYTES",
    "ConsumeQueueEntry",
    "CqEntry",
    "pack_cq_entry",
    "unpack_cq_entry",
    "java_string_hashcode",
    "tags_code",
    "tags_code_of_properties",
]

CQ_ENTRY_SIZE = 20
CQ_ENTRIES_PER_FILE = 300000
CQ_FILE_SIZE = CQ_ENTRY_SIZE * CQ_ENTRIES_PER_FILE  # 6,000,000
FILLER_SIZE = 0x7FFFFFFF  # Integer.MAX_VALUE

ConsumeQueueEntry = """
One 20-byte ConsumeQueue entry: where the record is in the CommitLog, its TOTALSIZE, and its tagsCode.
""" * Struct(
    "commit_log_offset" / Int64sb,
    "size" / Int32sb,
    "tags_code" / Int64sb,
)


class CqEntry(NamedTuple):
    commit_log_offset: int
    size: int
    tags_code: int


FILLER_ENTRY = CqEntry(0, FILLER_SIZE, 0)

CQ_ENTRY = struct.Struct(">qiq")        # the fast path of ConsumeQueueEntry (proven equal in tests/unit/test_wire.py)
assert CQ_ENTRY.size == CQ_ENTRY_SIZE
_ENTRY = CQ_ENTRY


def pack_cq_entry(commit_log_offset: int, size: int, tags_code: int) -> bytes:
    """The 20 bytes of an entry. Raises EncodeError if a value does not fit its Java type."""
    try:
        return _ENTRY.pack(commit_log_offset, size, tags_code)
    except struct.error as exc:
        raise EncodeError(f"cq entry ({commit_log_offset}, {size}, {tags_code}): {exc}") from None


def unpack_cq_entry(buf, offset: int = 0) -> CqEntry:
    """The entry at byte `offset` of buf. Raises TruncatedError if fewer than 20 bytes remain."""
    if len(buf) - offset < CQ_ENTRY_SIZE:
        raise TruncatedError(f"consumequeue @{offset}: need {CQ_ENTRY_SIZE} bytes, {max(len(buf) - offset, 0)} left")
    return CqEntry(*_ENTRY.unpack_from(buf, offset))


FILLER_ENTRY_BYTES = pack_cq_entry(*FILLER_ENTRY)


def java_string_hashcode(s: str) -> int:
    """Java's String.hashCode(): h = 31*h + c over UTF-16 code units in int32 arithmetic, as a signed int.

    Characters outside the BMP count as two code units (a surrogate pair), exactly as in Java.
    """
    h = 0
    data = s.encode("utf-16-be", errors="surrogatepass")
    for (unit,) in struct.iter_unpack(">H", data):
        h = (31 * h + unit) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def tags_code(tags: str | None) -> int:
    """tagsCode of a normal topic's message: 0 for no/empty tag, else the hashCode sign-extended to int64."""
    if not tags:
        return 0
    return java_string_hashcode(tags)


def tags_code_of_properties(properties: bytes | str) -> int:
    """tagsCode of a stored record straight from its PROPERTIES bytes (TAGS decoded with the 2.6 rules,
    invalid UTF-8 replaced by U+FFFD as Java does). The C dispatcher's mq_tags_code must agree with this."""
    return tags_code(decode_properties(properties).get("TAGS"))
