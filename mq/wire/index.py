"""The message index file (S/index/IndexFile.java, IndexHeader.java; spec 3.4).

    header (40): BEGINTIMESTAMP 8 | ENDTIMESTAMP 8 | BEGINPHYOFFSET 8 | ENDPHYOFFSET 8 |
                 HASHSLOTCOUNT 4 | INDEXCOUNT 4
    slots:       slotNum x int32, the newest entry of each hash slot (0: none)
    entries:     indexNum x (KEYHASH 4 | PHYOFFSET 8 | TIMEDIFF 4 | PREVINDEX 4)

Big-endian. Invariants:
* the file is exactly 40 + 4 * slotNum + 20 * indexNum bytes (maxHashSlotNum, maxIndexNum);
* entry 0 is never written: INDEXCOUNT starts at 1 and counts entries + 1; the file is full at indexNum;
* a key is "<topic>#<key>" (UNIQ_KEY or a KEYS word); KEYHASH = |String.hashCode(key)|, 0 for MIN_VALUE;
  its slot is KEYHASH % slotNum;
* TIMEDIFF = (storeTimestamp - BEGINTIMESTAMP) / 1000, in [0, 2^31 - 1]; PREVINDEX < the entry's own index;
* files are named by their creation time, yyyyMMddHHmmssSSS; a new file starts where the last one ended.
The C core (mq_index_build, mq_index_query) writes and walks them; this declaration is what tools read.
"""
from __future__ import annotations

import struct
from typing import NamedTuple

from construct import Int32sb, Int64sb, Struct

from .consumequeue import java_string_hashcode
from .errors import TruncatedError

__all__ = ["INDEX_COUNT_OFFSET", "INDEX_DIR_NAME", "is_index_file_name", "INDEX_HEADER_SIZE", "INDEX_SLOT_SIZE", "INDEX_ENTRY_SIZE", "IndexHeader", "IndexEntry",
           "IndexHeaderValues", "IndexEntryValues", "index_file_size", "parse_index_header",
           "parse_index_entry", "unpack_index_entry", "unpack_slots", "index_key_hash"]

INDEX_HEADER_SIZE = 40
INDEX_SLOT_SIZE = 4
INDEX_ENTRY_SIZE = 20
INDEX_COUNT_OFFSET = 36           # INDEXCOUNT: the header's last int32

IndexHeader = """
The 40-byte header of an index file.
""" * Struct(
    "begin_timestamp_ms" / Int64sb,
    "end_timestamp_ms" / Int64sb,
    "begin_phy_offset" / Int64sb,
    "end_phy_offset" / Int64sb,
    "hash_slot_count" / Int32sb,
    "index_count" / Int32sb,
)

IndexEntry = """
One 20-byte index entry.
""" * Struct(
    "key_hash" / Int32sb,
    "phy_offset" / Int64sb,
    "time_diff_s" / Int32sb,
    "prev_index" / Int32sb,
)


class IndexHeaderValues(NamedTuple):
    begin_timestamp_ms: int
    end_timestamp_ms: int
    begin_phy_offset: int
    end_phy_offset: int
    hash_slot_count: int
    index_count: int


class IndexEntryValues(NamedTuple):
    key_hash: int
    phy_offset: int
    time_diff_s: int
    prev_index: int


_HEADER = struct.Struct(">qqqqii")
_ENTRY = struct.Struct(">iqii")


INDEX_DIR_NAME = "index"          # <storePathRootDir>/index


def is_index_file_name(name: str) -> bool:
    """yyyyMMddHHmmssSSS: 17 digits (names sort in creation order)."""
    return len(name) == 17 and name.isdigit()


def index_file_size(slot_num: int, index_num: int) -> int:
    return INDEX_HEADER_SIZE + INDEX_SLOT_SIZE * slot_num + INDEX_ENTRY_SIZE * index_num


def parse_index_header(buf) -> IndexHeaderValues:
    if len(buf) < INDEX_HEADER_SIZE:
        raise TruncatedError(f"index header: {len(buf)} bytes, expected {INDEX_HEADER_SIZE}")
    return IndexHeaderValues(*_HEADER.unpack_from(buf, 0))


def parse_index_entry(buf, slot_num: int, index: int) -> IndexEntryValues:
    at = INDEX_HEADER_SIZE + INDEX_SLOT_SIZE * slot_num + INDEX_ENTRY_SIZE * index
    if len(buf) < at + INDEX_ENTRY_SIZE:
        raise TruncatedError(f"index entry {index}: the file ends at {len(buf)}")
    return IndexEntryValues(*_ENTRY.unpack_from(buf, at))


def unpack_index_entry(raw) -> IndexEntryValues:
    """One entry from its own 20 bytes."""
    if len(raw) < INDEX_ENTRY_SIZE:
        raise TruncatedError(f"index entry: {len(raw)} bytes, expected {INDEX_ENTRY_SIZE}")
    return IndexEntryValues(*_ENTRY.unpack_from(raw, 0))


def unpack_slots(raw) -> tuple[int, ...]:
    """Consecutive slot values (entry numbers, 0 for none)."""
    return struct.unpack(f">{len(raw) // INDEX_SLOT_SIZE}i", raw[:len(raw) - len(raw) % INDEX_SLOT_SIZE])


def index_key_hash(key: str) -> int:
    """IndexFile.indexKeyHashMethod: |String.hashCode|, with Integer.MIN_VALUE as 0."""
    h = java_string_hashcode(key)
    return 0 if h == -2 ** 31 else abs(h)
