"""How RocketMQ names the files of a log: by the logical byte offset of their first byte, as 20
decimal digits (MappedFileQueue / UtilAll.offset2FileName).  CommitLog files, ConsumeQueue files
(the offset of their first entry times 20), DLedger's data and index files all follow it:
    00000000000000000000  00000000001073741824  ...
One declaration, so a reader, a tool and a test name and list them the same way."""
from __future__ import annotations

import os

__all__ = ["OFFSET_NAME_DIGITS", "offset_file_name", "offset_file_path", "parse_offset_file_name", "list_offset_files"]

OFFSET_NAME_DIGITS = 20


def offset_file_name(start: int) -> str:
    """The name of the file whose first byte is at logical offset `start`."""
    assert 0 <= start < 10 ** OFFSET_NAME_DIGITS, start
    return "%020d" % start


def offset_file_path(directory: str, start: int) -> str:
    return os.path.join(directory, offset_file_name(start))


def parse_offset_file_name(name: str) -> int | None:
    """The start offset a name says, or None when it is not such a name (a .tmp, a .damaged)."""
    if len(name) == OFFSET_NAME_DIGITS and name.isdigit():
        return int(name)
    return None


def list_offset_files(directory: str) -> list[int]:
    """Start offsets of the files in `directory` named so, ascending ([] when it does not exist)."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(s for s in map(parse_offset_file_name, names) if s is not None)
