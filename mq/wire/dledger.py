"""DLedger's on-disk layouts (openmessaging/dledger 0.3, spec §7): the data files of a CommitLog in
DLedger mode, their index files, and the two small properties files.  Big-endian, signed (Java).

    entry:  MAGIC 4 (=1) | SIZE 4 (48 + BODYSIZE) | INDEX 8 | TERM 8 | POS 8 | CHANNEL 4 (0) |
            CHAINCRC 4 (0) | BODYCRC 4 (0) | BODYSIZE 4 | BODY           (BODY = one CommitLog record)
    filler: MAGIC 4 (= -1) | SIZE 4 (bytes to the end of the file)     (the next entry opens the next file)
    index unit (entry i at byte i * 32 of the index files):
            MAGIC 4 (=1) | POS 8 | SIZE 4 | INDEX 8 | TERM 8
    checkpoint (properties):  endIndex=<n>  committedIndex=<n>  crc=<n>
    currterm   (properties):  currTerm=<n>  voteLeader=<member id or empty>  crc=<n>

The properties files carry no checksum in DLedger; ours end with a line `crc=<CRC-32 of every byte
before that line>` (Java's Properties ignores an unknown key), so a digit damaged into another digit
-- a term or a vote forgotten, a commit restored past what was committed -- is noticed.  A file
without the line (written by Java DLedger) is read as before; one with "crc=" anywhere but not a
matching last line is damaged (MalformedError).

Invariants: POS is the entry's own position in the data files; the record in BODY has
PHYSICALOFFSET = POS + 48 and TOTALSIZE = BODYSIZE; an entry never spans two files (entry + 8 >
room left -> filler); indexes start at 0 and are dense, terms never go down along the log.
DLedger does not compute CHAINCRC or BODYCRC (the record carries its own body CRC).

EntryHeader, Filler and IndexUnit are the declarations; the struct fast paths below are proven
equal to them in tests/unit/test_wire_dledger.py.  The C core (csrc/dledger.c) writes and checks
the same layouts."""
from __future__ import annotations

import struct
import zlib
from typing import Iterator, NamedTuple

from construct import Const, Int32sb, Int64sb, Struct

from .errors import BadMagicError, EncodeError, MalformedError, SizeMismatchError, TruncatedError

__all__ = ["ENTRY_MAGIC", "BLANK_MAGIC", "ENTRY_HEADER_SIZE", "INDEX_UNIT_SIZE", "MIN_BLANK_SIZE",
           "EntryHeader", "Filler", "IndexUnit", "Entry", "Blank", "Unit",
           "build_entry", "parse_entry_header", "build_index_unit", "parse_index_unit", "iter_entries",
           "parse_checkpoint", "build_checkpoint", "parse_currterm", "build_currterm"]

ENTRY_MAGIC = 1                 # DLedgerMmapFileStore.MAGIC_1
BLANK_MAGIC = -1                # MmapFileList.BLANK_MAGIC_CODE
ENTRY_HEADER_SIZE = 48          # DLedgerEntry.BODY_OFFSET
INDEX_UNIT_SIZE = 32            # DLedgerMmapFileStore.INDEX_NUIT_SIZE
MIN_BLANK_SIZE = 8              # MmapFileList.MIN_BLANK_LEN

EntryHeader = """
A DLedger entry's 48-byte header; body_size bytes (one CommitLog record) follow.
""" * Struct(
    "magic" / Const(ENTRY_MAGIC, Int32sb),
    "size" / Int32sb,
    "index" / Int64sb,
    "term" / Int64sb,
    "pos" / Int64sb,
    "channel" / Int32sb,
    "chain_crc" / Int32sb,
    "body_crc" / Int32sb,
    "body_size" / Int32sb,
)

Filler = """
End of a data file: the rest of the file (size bytes, these 8 included) holds no entry.
""" * Struct("magic" / Const(BLANK_MAGIC, Int32sb), "size" / Int32sb)

IndexUnit = """
Entry `index`'s slot in the index files, at byte index * 32.
""" * Struct(
    "magic" / Const(ENTRY_MAGIC, Int32sb),
    "pos" / Int64sb,
    "size" / Int32sb,
    "index" / Int64sb,
    "term" / Int64sb,
)

_HEADER = struct.Struct(">iiqqqiiii")
_UNIT = struct.Struct(">iqiqq")
_MAGIC_SIZE = struct.Struct(">ii")


class Entry(NamedTuple):
    index: int
    term: int
    pos: int
    size: int            # the whole entry, header included
    body_size: int

    @property
    def body_pos(self) -> int:
        """Where the record sits: its PHYSICALOFFSET."""
        return self.pos + ENTRY_HEADER_SIZE


class Blank(NamedTuple):
    pos: int
    size: int


class Unit(NamedTuple):
    pos: int
    size: int
    index: int
    term: int


def build_entry(index: int, term: int, pos: int, body: bytes) -> bytes:
    """An entry's bytes (header + body).  Raises EncodeError for negative or oversized values."""
    if index < 0 or term < 0 or pos < 0:
        raise EncodeError(f"DLedger entry: index {index}, term {term}, pos {pos} must be >= 0")
    size = ENTRY_HEADER_SIZE + len(body)
    if size > 0x7FFFFFFF:
        raise EncodeError(f"DLedger entry of {size} bytes exceeds int32")
    return _HEADER.pack(ENTRY_MAGIC, size, index, term, pos, 0, 0, 0, len(body)) + bytes(body)


def parse_entry_header(buf, at: int = 0) -> Entry:
    """The entry whose header starts at buf[at]; its `pos` field as written.  Raises
    TruncatedError (fewer than 48 bytes), BadMagicError, SizeMismatchError."""
    if len(buf) - at < ENTRY_HEADER_SIZE:
        raise TruncatedError(f"DLedger entry header at {at}: {len(buf) - at} bytes, needs {ENTRY_HEADER_SIZE}")
    magic, size, index, term, pos, _, _, _, body_size = _HEADER.unpack_from(buf, at)
    if magic != ENTRY_MAGIC:
        raise BadMagicError(f"DLedger entry at {at}: magic {magic}, expected {ENTRY_MAGIC}", magic & 0xFFFFFFFF)
    if body_size < 0 or size != ENTRY_HEADER_SIZE + body_size:
        raise SizeMismatchError(f"DLedger entry at {at}: size {size} != 48 + body size {body_size}")
    return Entry(index, term, pos, size, body_size)


def build_index_unit(pos: int, size: int, index: int, term: int) -> bytes:
    return _UNIT.pack(ENTRY_MAGIC, pos, size, index, term)


def parse_index_unit(buf, at: int = 0) -> Unit | None:
    """The unit at buf[at]; None for an empty (all-zero) unit.  Raises TruncatedError, BadMagicError."""
    if len(buf) - at < INDEX_UNIT_SIZE:
        raise TruncatedError(f"DLedger index unit at {at}: {len(buf) - at} bytes, needs {INDEX_UNIT_SIZE}")
    magic, pos, size, index, term = _UNIT.unpack_from(buf, at)
    if magic == 0 and not (pos or size or index or term):
        return None
    if magic != ENTRY_MAGIC:
        raise BadMagicError(f"DLedger index unit at {at}: magic {magic}", magic & 0xFFFFFFFF)
    return Unit(pos, size, index, term)


def iter_entries(buf, start_pos: int, file_size: int) -> Iterator[Entry | Blank]:
    """Walks the entries and fillers of `buf`, which holds data-file bytes from position
    start_pos; stops at the end of buf or at all-zero bytes.  Raises WireError at the first
    thing that is neither a whole entry nor a filler reaching its file's end (the caller
    reports where: `.args` names the position)."""
    at = 0
    while len(buf) - at >= MIN_BLANK_SIZE:
        pos = start_pos + at
        room = file_size - pos % file_size
        magic, size = _MAGIC_SIZE.unpack_from(buf, at)
        if magic == 0 and size == 0:
            return
        if magic == BLANK_MAGIC:
            if size != room:
                raise SizeMismatchError(f"filler at {pos}: size {size}, {room} bytes to the file's end")
            yield Blank(pos, size)
            at += size
            continue
        e = parse_entry_header(buf, at)
        if e.pos != pos:
            raise MalformedError(f"entry at {pos} says pos {e.pos}")
        if e.size + MIN_BLANK_SIZE > room:
            raise SizeMismatchError(f"entry at {pos} of {e.size} bytes leaves no room for a filler ({room} left)")
        if at + e.size > len(buf):
            raise TruncatedError(f"entry at {pos} of {e.size} bytes is cut at {start_pos + len(buf)}")
        yield e
        at += e.size


CRC_KEY = "crc"


def _with_crc(text: str) -> str:
    """text (whole lines) and its checksum line."""
    return f"{text}{CRC_KEY}={zlib.crc32(text.encode())}\n"


def _checked(text: str, what: str) -> str:
    """text without its checksum line, checked (see the module docstring); a file without one as it is."""
    body, _, last = text.rstrip("\n").rpartition("\n")
    if last.startswith(CRC_KEY + "="):
        body += "\n" if body else ""
        if last[len(CRC_KEY) + 1:] != str(zlib.crc32(body.encode())):
            raise MalformedError(f"{what}: damaged (its crc line does not match its content)")
        return body
    if CRC_KEY + "=" in text:          # (no value holds "=": build_currterm refuses such a vote)
        raise MalformedError(f"{what}: damaged (a crc that is not its last line)")
    return text


def _props(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        k, sep, v = line.partition("=")
        if sep and not line.lstrip().startswith(("#", "!")):
            out[k.strip()] = v.strip()
    return out


def _int(props: dict, key: str, default: int, what: str) -> int:
    raw = props.get(key, "")
    if raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise MalformedError(f"{what}: {key}={raw!r} is not an integer") from None


def parse_checkpoint(text: str) -> tuple[int, int]:
    """(endIndex, committedIndex); -1 for an absent value.  MalformedError when damaged."""
    p = _props(_checked(text, "checkpoint"))
    return _int(p, "endIndex", -1, "checkpoint"), _int(p, "committedIndex", -1, "checkpoint")


def build_checkpoint(end_index: int, committed_index: int) -> str:
    return _with_crc(f"endIndex={end_index}\ncommittedIndex={committed_index}\n")


def parse_currterm(text: str) -> tuple[int, str | None]:
    """(currTerm, voteLeader or None).  MalformedError when damaged."""
    p = _props(_checked(text, "currterm"))
    return _int(p, "currTerm", 0, "currterm"), (p.get("voteLeader") or None)


def build_currterm(term: int, vote: str | None) -> str:
    if vote is not None and ("\n" in vote or "=" in vote):
        raise EncodeError(f"currterm: voteLeader {vote!r} cannot be written")
    return _with_crc(f"currTerm={term}\nvoteLeader={vote or ''}\n")
