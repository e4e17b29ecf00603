"""mqdump: print and check a store's CommitLog and ConsumeQueue files (the operator's 3 a.m. tool).

    mqdump commitlog    PATH [--json] [--from PHY_OFFSET] [--limit N] [--no-crc]
    mqdump consumequeue PATH [--json] [--from QUEUE_OFFSET] [--limit N]
    mqdump dledger      PATH [--json] [--limit N] [--no-crc]
    mqdump index        PATH [--json] [--limit N] [--key TOPIC#KEY] [--maxHashSlotNum N] [--maxIndexNum N]

Every byte is decoded through mq.wire (parse_record, peek_record, unpack_cq_entry, decode_properties,
offset_msg_id), never through mq.store: the tool needs neither the C core nor the store's lock or control
block, so it works on a copy, on a store whose broker is running, and on a store the broker refuses to open,
and it is an independent oracle for what the C writer produced (as LMDB's mdb_dump is for LMDB).

Read-only by construction: files are opened O_RDONLY and read with pread through a bounded window
(READ_WINDOW_BYTES), never mmapped (a file truncated under an mmap kills the reader with SIGBUS), never
locked, never written. A broker may be appending while we read, so the record at the end of the data may
be half written: a defect with nothing but zero bytes after it is reported as a "torn/incomplete tail".

CommitLog walk (spec 3.2, 3.6), per file, from its first byte (or from --from):
    record (MESSAGE_MAGIC_CODE)  -> decode, check TOTALSIZE, BODYCRC (unless --no-crc) and that
                                    PHYSICALOFFSET equals the absolute offset the record sits at
    BLANK  (BLANK_MAGIC_CODE)    -> end-of-file filler: report it, continue with the next file
    TOTALSIZE == MAGIC == 0      -> clean end of data in this file (the rest must be zero bytes)
    anything else / a bad record -> report a problem with its absolute offset; the rest of this file is
                                    unreadable; continue with the next file
DLedger walk (spec 7, mq.wire.dledger), over the data files of a dledger-<selfId> directory:
    entry  -> its index, term and pos, then the record inside as for the CommitLog (its
              PHYSICALOFFSET must be pos + 48); indexes must follow each other and terms never go
              down; each entry is compared with its unit in the index files
    filler -> (-1, room) to the end of the file; then the next file
    a bad entry -> a problem with its position (torn when nothing but zero bytes follows)
and the checkpoint (endIndex, committedIndex) and currterm (currTerm, voteLeader) files are shown.
Index walk (mq.wire.index), per file (an index file, the index directory or a store root): the header,
then every entry (key hash, physical offset, time, previous entry) checking that each chain points back
(prev < its own index), times are not negative and offsets lie within the header's begin..end, and that the
slots point at written entries and number HASHSLOTCOUNT.  The file size must match the sizes given
(RocketMQ's defaults unless --maxHashSlotNum/--maxIndexNum say otherwise).  --key walks one key's chain
in each file instead of listing every entry.
ConsumeQueue walk (spec 3.4): 20-byte entries until the first all-zero entry; runs of the filler entry
(0, 0x7FFFFFFF, 0) are reported as one line; a file whose size is not a multiple of 20 is truncated.

Output: one line per record/entry (text), or one JSON object per line with a "kind" (--json):
file, record, blank, end, problem, summary (commitlog); queue, file, entry, filler, end, problem, summary
(consumequeue). A summary line always comes last; problems are also summed up on stderr in one line.

Exit codes: 0 no problems; 1 bad or torn records/entries found; 2 usage error or unreadable input
(missing path, permission, no CommitLog/ConsumeQueue files, not a CommitLog at all).
"""

from __future__ import annotations

import argparse
import base64
import datetime
import errno
import json
import os
import re
import stat
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field

from mq.wire import dledger as dlw
from mq.wire import (
    BLANK_MAGIC_CODE,
    BORNHOST_V6,
    COMPRESSED,
    COMPRESSION_LZ4,
    COMPRESSION_TYPE_MASK,
    COMPRESSION_ZLIB,
    COMPRESSION_ZSTD,
    CQ_ENTRY_SIZE,
    FILLER_ENTRY,
    MESSAGE_MAGIC_CODE,
    INNER_BATCH,
    MULTI_TAGS,
    NEED_UNWRAP,
    RECORD_SIZE_MIN,
    STOREHOST_V6,
    TRANSACTION_COMMIT,
    TRANSACTION_MASK,
    TRANSACTION_PREPARED,
    TRANSACTION_ROLLBACK,
    SizeMismatchError,
    TruncatedError,
    WireError,
    body_crc32,
    decode_properties,
    offset_msg_id,
    parse_record,
    peek_record,
    record_crc_ok,
    unpack_cq_entry,
)

__all__ = ["main"]

EXIT_OK = 0
EXIT_PROBLEMS = 1
EXIT_FATAL = 2  # usage error or unreadable input

READ_WINDOW_BYTES = 8 * 1024 * 1024  # pread window; bounds memory whatever the file size
CQ_READ_WINDOW_BYTES = 400_000 * CQ_ENTRY_SIZE  # 8,000,000: a whole number of entries
# No 4.x record comes near this (maxMessageSize 4 MiB + 64 KiB by default); a TOTALSIZE above it is garbage,
# and refusing it keeps a corrupt length from making us read hundreds of MiB into memory.
RECORD_SIZE_PLAUSIBLE_MAX = 64 * 1024 * 1024

_FILE_NAME = re.compile(r"[0-9]{20}")
_WIRE_PREFIX = re.compile(r"^(commitlog|consumequeue) @-?\d+: ")
_ZERO_CHUNK = bytes(READ_WINDOW_BYTES)


class UsageError(Exception):
    """Bad arguments or an input that cannot be read at all: one line on stderr, exit 2."""


class _Limit(Exception):
    """--limit reached: unwinds the walk."""


# --------------------------------------------------------------------------------------------------
# Reading


class FileBytes:
    """Read-only random access to one file through os.pread and a window of at least READ_WINDOW_BYTES.

    `size` is taken once at open (CommitLog and ConsumeQueue files are created at full size, so a running
    broker does not change it). A file that shrinks under us gives short reads, which the walkers report
    as truncation. Raises OSError (open/read) and UsageError (not a regular file).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            st = os.fstat(self.fd)
            if not stat.S_ISREG(st.st_mode):
                raise UsageError(f"{path}: not a regular file")
        except BaseException:
            os.close(self.fd)
            raise
        self.size = st.st_size
        self._buf = b""
        self._buf_pos = 0

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> FileBytes:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _pread(self, pos: int, n: int) -> bytes:
        parts = []
        while n > 0:
            chunk = os.pread(self.fd, n, pos)
            if not chunk:
                break
            parts.append(chunk)
            pos += len(chunk)
            n -= len(chunk)
        return b"".join(parts)

    def view(self, pos: int, n: int, window: int = READ_WINDOW_BYTES) -> tuple[bytes, int]:
        """(buf, i) such that buf[i:] starts at file byte `pos` and covers at least min(n, size - pos)
        bytes (fewer only if the file shrank). buf may extend further, never past the end of the file."""
        end = min(pos + n, self.size)
        if self._buf_pos <= pos and end <= self._buf_pos + len(self._buf):
            return self._buf, pos - self._buf_pos
        want = min(max(end - pos, window), self.size - pos)
        self._buf, self._buf_pos = self._pread(pos, max(want, 0)), pos
        return self._buf, 0

    def _skip_hole(self, pos: int) -> int:
        """The start of the next data region at or after pos (holes of a sparse file read as zeros, so
        the scan can jump over them); pos itself when the filesystem cannot tell."""
        seek_data = getattr(os, "SEEK_DATA", None)
        if seek_data is None:
            return pos
        try:
            return max(pos, os.lseek(self.fd, pos, seek_data))
        except OSError as exc:
            return self.size if exc.errno == errno.ENXIO else pos

    def first_nonzero(self, pos: int, end: int | None = None) -> int | None:
        """File position of the first non-zero byte in [pos, end), or None if they are all zero."""
        end = self.size if end is None else min(end, self.size)
        while pos < end:
            pos = self._skip_hole(pos)
            if pos >= end:
                return None
            n = min(READ_WINDOW_BYTES, end - pos)
            chunk = self._pread(pos, n)
            if not chunk:
                return None
            if chunk != _ZERO_CHUNK[: len(chunk)]:
                return pos + next(i for i, b in enumerate(chunk) if b)
            pos += len(chunk)
        return None


def _file_start(name: str) -> int | None:
    """The offset a 20-digit file name stands for, or None if the name is not 20 ASCII digits."""
    return int(name) if _FILE_NAME.fullmatch(name) else None


def _numbered_files(directory: str) -> list[tuple[int, str]]:
    """(start offset, path) of the 20-digit-named regular files in `directory`, ascending."""
    out = []
    for name in os.listdir(directory):
        start = _file_start(name)
        path = os.path.join(directory, name)
        if start is not None and os.path.isfile(path):
            out.append((start, path))
    return sorted(out)


def _check_readable_dir(path: str) -> None:
    if not os.access(path, os.R_OK | os.X_OK):
        raise UsageError(f"{path}: permission denied")


def _resolve_input(path: str) -> str:
    if not os.path.lexists(path):
        raise UsageError(f"{path}: no such file or directory")
    if not os.path.exists(path):
        raise UsageError(f"{path}: dangling symbolic link")
    return path


# --------------------------------------------------------------------------------------------------
# Output


def _iso_ms(ms: int) -> str | None:
    try:
        t = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc) + datetime.timedelta(milliseconds=ms)
    except OverflowError:
        return None
    return t.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def sys_flag_names(sys_flag: int) -> list[str]:
    """Names of the sysFlag bits that are set (spec 3.3)."""
    names = []
    if sys_flag & COMPRESSED:
        names.append("COMPRESSED")
    if sys_flag & MULTI_TAGS:
        names.append("MULTI_TAGS")
    tx = sys_flag & TRANSACTION_MASK
    names += {
        TRANSACTION_PREPARED: ["TX_PREPARED"],
        TRANSACTION_COMMIT: ["TX_COMMIT"],
        TRANSACTION_ROLLBACK: ["TX_ROLLBACK"],
    }.get(tx, [])
    if sys_flag & BORNHOST_V6:
        names.append("BORNHOST_V6")
    if sys_flag & STOREHOST_V6:
        names.append("STOREHOST_V6")
    if sys_flag & NEED_UNWRAP:
        names.append("NEED_UNWRAP")
    if sys_flag & INNER_BATCH:
        names.append("INNER_BATCH")
    compression = {COMPRESSION_LZ4: "LZ4", COMPRESSION_ZSTD: "ZSTD",
                   COMPRESSION_ZLIB: "ZLIB"}.get(sys_flag & COMPRESSION_TYPE_MASK)
    if compression:
        names.append(compression)
    return names


def _text_value(s: str) -> str:
    """A property name or value as one shell-safe-looking token: quoted (JSON) if it has spaces,
    control characters or '=' in it, or is empty."""
    if s and s.isprintable() and " " not in s and "=" not in s and '"' not in s:
        return s
    return json.dumps(s, ensure_ascii=False)


@dataclass
class Problem:
    problem: str  # torn | truncated | bad_magic | bad_size | bad_crc | bad_phy_offset | malformed | ...
    file: str
    message: str
    fatal: bool = False  # makes the exit code 2


@dataclass
class Output:
    """Emits text or JSON lines on stdout and keeps the counts for the summary and the exit code."""

    as_json: bool
    limit: int | None
    items: int = 0  # records (commitlog) or entries (consumequeue) printed
    problems: list[Problem] = field(default_factory=list)
    current_file: str = ""  # for the last-resort error message

    def emit(self, obj: dict, text: str) -> None:
        if self.as_json:
            sys.stdout.write(json.dumps(obj, ensure_ascii=False) + "\n")
        else:
            sys.stdout.write(text + "\n")

    def item(self, obj: dict, text: str) -> None:
        """A record or entry; raises _Limit once --limit of them have been printed."""
        if self.limit is not None and self.items >= self.limit:
            raise _Limit()
        self.emit(obj, text)
        self.items += 1

    def check_limit(self) -> None:
        if self.limit is not None and self.items >= self.limit:
            raise _Limit()

    def problem(self, p: Problem, where: dict, extra_text: str = "") -> None:
        self.problems.append(p)
        obj = {"kind": "problem", "problem": p.problem, "file": p.file, **where, "message": p.message}
        self.emit(obj, f"!! PROBLEM ({p.problem}) {p.message}" + (f"\n   {extra_text}" if extra_text else ""))

    def exit_code(self) -> int:
        if any(p.fatal for p in self.problems):
            return EXIT_FATAL
        return EXIT_PROBLEMS if self.problems else EXIT_OK

    def stderr_summary(self) -> None:
        if self.problems:
            first = self.problems[0]
            more = f" (and {len(self.problems) - 1} more)" if len(self.problems) > 1 else ""
            _err(f"{first.file}: {first.message}{more}")


def _err(message: str) -> None:
    sys.stderr.write(f"mqdump: {message}\n")


def _wire_detail(exc: WireError) -> str:
    """The message of a mq.wire error without its buffer-relative "commitlog @N: " prefix."""
    return _WIRE_PREFIX.sub("", str(exc))


# --------------------------------------------------------------------------------------------------
# CommitLog


@dataclass
class ClFile:
    path: str
    start: int  # absolute offset of the file's first byte
    size: int = 0
    start_assumed: bool = False  # the name is not 20 digits: start 0 assumed
    _empty_head: bool | None = None

    def empty_head(self) -> bool:
        """True when the file holds no data: empty, or its first 8 bytes are zero (a preallocated file)."""
        if self._empty_head is None:
            try:
                with FileBytes(self.path) as fb:
                    buf, i = fb.view(0, 8, window=8)
                    self._empty_head = not any(buf[i:i + 8])
            except (OSError, UsageError):
                self._empty_head = False
        return self._empty_head


def resolve_commitlog(path: str) -> tuple[list[ClFile], list[str]]:
    """The CommitLog files named by PATH (a file, a commitlog directory or a store root) and notes to show.
    Raises UsageError when there is nothing to read."""
    _resolve_input(path)
    notes: list[str] = []
    if os.path.isfile(path):
        name = os.path.basename(path)
        start = _file_start(name)
        if start is None:
            notes.append(f"{path}: name {name!r} is not a 20-digit start offset; assuming start offset 0")
            return [ClFile(path, 0, start_assumed=True)], notes
        return [ClFile(path, start)], notes
    if not os.path.isdir(path):
        raise UsageError(f"{path}: not a regular file or directory")
    _check_readable_dir(path)
    directory = path
    sub = os.path.join(path, "commitlog")
    if os.path.isdir(sub):
        _check_readable_dir(sub)
        directory = sub
    files = [ClFile(p, start) for start, p in _numbered_files(directory)]
    if not files:
        raise UsageError(f"{path}: no CommitLog files (20-digit names) in {directory}")
    return files, notes


@dataclass
class ClWalk:
    out: Output
    files: list[ClFile]
    check_crc: bool
    records: int = 0
    record_bytes: int = 0
    blanks: int = 0
    files_read: int = 0
    end_offset: int | None = None  # absolute offset where the data ends (the first clean end seen)


def _record_json(rec, phy_offset: int, path: str, crc: str) -> dict:
    props = decode_properties(rec.properties)
    try:
        msg_id = offset_msg_id(rec.store_host, rec.store_port, rec.physical_offset)
    except WireError:
        msg_id = None
    try:
        body_utf8 = rec.body.decode("utf-8")
    except UnicodeDecodeError:
        body_utf8 = None
    return {
        "kind": "record",
        "file": path,
        "phy_offset": phy_offset,
        "size": rec.total_size,
        "topic": rec.topic,
        "queue_id": rec.queue_id,
        "queue_offset": rec.queue_offset,
        "sys_flag": rec.sys_flag,
        "sys_flag_names": sys_flag_names(rec.sys_flag),
        "flag": rec.flag,
        "store_timestamp_ms": rec.store_timestamp_ms,
        "store_time": _iso_ms(rec.store_timestamp_ms),
        "born_timestamp_ms": rec.born_timestamp_ms,
        "born_time": _iso_ms(rec.born_timestamp_ms),
        "born_host": _host_port(rec.born_host, rec.born_port),
        "store_host": _host_port(rec.store_host, rec.store_port),
        "reconsume_times": rec.reconsume_times,
        "prepared_transaction_offset": rec.prepared_transaction_offset,
        "body_length": len(rec.body),
        "body_crc": rec.body_crc,
        "crc": crc,
        "properties": props,
        "msg_id": msg_id,
        "body_base64": base64.b64encode(rec.body).decode("ascii"),
        "body_utf8": body_utf8,
    }


def _record_text(obj: dict) -> str:
    flags = f"0x{obj['sys_flag']:X}" + (f"({'|'.join(obj['sys_flag_names'])})" if obj["sys_flag_names"] else "")
    props = " ".join(f"{_text_value(k)}={_text_value(v)}" for k, v in obj["properties"].items())
    return (
        f"@{obj['phy_offset']} size={obj['size']} topic={_text_value(obj['topic'])} qid={obj['queue_id']} "
        f"qoff={obj['queue_offset']} sysflag={flags} stored={obj['store_timestamp_ms']} {obj['store_time']} "
        f"born={obj['born_host']} storehost={obj['store_host']} body={obj['body_length']} crc={obj['crc']} "
        f"msgId={obj['msg_id']} props[{props}]"
    )


def _walk_commitlog_file(w: ClWalk, index: int, pos: int) -> None:
    """Walk one file from file position `pos`; every outcome is emitted (see the module docstring)."""
    f = w.files[index]
    out = w.out
    from_pos = pos if pos else -1
    with FileBytes(f.path) as fb:
        size = f.size = fb.size
        out.emit(
            {"kind": "file", "file": f.path, "start_offset": f.start, "size": size, "start_assumed": f.start_assumed,
             "from_offset": f.start + pos},
            f"== {f.path} start={f.start} size={size}" + (f" from={f.start + pos}" if pos else "")
            + (" (start offset assumed 0)" if f.start_assumed else ""),
        )

        def later_files_empty() -> bool:
            return all(g.empty_head() for g in w.files[index + 1:])

        def bad(kind: str, at: int, message: str, claimed_end: int | None = None, record: dict | None = None) -> None:
            """Report the bad thing at file position `at`; the rest of the file is not walked."""
            phy = f.start + at
            tail_from = min(max(claimed_end if claimed_end is not None else at + 8, at + 8), size)
            # A BLANK is 8 bytes written at once, and garbage at offset 0 is no write at all: neither is torn.
            is_tail = (kind not in ("not_commitlog", "bad_blank")
                       and fb.first_nonzero(tail_from) is None and later_files_empty())
            cause = kind
            if is_tail:
                kind, message = "torn", f"torn/incomplete tail: {message}"
            elif kind == "torn":
                kind = "truncated"
            skipped = size - at
            message = f"@{phy}: {message}; rest of the file unreadable ({skipped} bytes, up to {f.start + size})"
            where = {"phy_offset": phy, "cause": cause, "skipped_bytes": skipped}
            if record is not None:
                where["record"] = record
            out.problem(Problem(kind, f.path, message), where, _record_text(record) if record else "")

        while True:
            out.check_limit()
            if pos >= size:
                return
            phy = f.start + pos
            left = size - pos
            buf, i = fb.view(pos, 8)
            if left < 8:
                if not any(buf[i:i + left]):
                    if w.end_offset is None:
                        w.end_offset = phy
                    out.emit({"kind": "end", "file": f.path, "phy_offset": phy, "unused_bytes": left},
                             f"@{phy} end of data ({left} zero bytes to the end of the file)")
                    return
                bad("torn", pos, f"{left} stray non-zero bytes at the end of the file, too few for a record header")
                return
            total_size, magic = peek_record(buf, i)
            if magic == BLANK_MAGIC_CODE:
                if total_size != left:
                    bad("bad_blank", pos, f"BLANK filler says it covers {total_size} bytes but {left} are left in "
                        "the file" + (" (file truncated?)" if total_size > left else ""))
                    return
                w.blanks += 1
                out.emit({"kind": "blank", "file": f.path, "phy_offset": phy, "size": total_size},
                         f"@{phy} BLANK filler, {total_size} bytes to the end of the file")
                return
            if magic == 0 and total_size == 0:
                nonzero = fb.first_nonzero(pos)
                if nonzero is None:
                    if w.end_offset is None:
                        w.end_offset = phy
                    out.emit({"kind": "end", "file": f.path, "phy_offset": phy, "unused_bytes": left},
                             f"@{phy} end of data ({left} zero bytes to the end of the file)")
                    if not later_files_empty():
                        # The writer ends every file but the active one with a BLANK, so data after a clean
                        # end is a hole: recovery stops here and drops everything after it.
                        out.problem(Problem("hole", f.path, f"@{phy}: end of data without a BLANK filler, but a "
                                            "later file holds data (recovery would stop here and drop it)"),
                                    {"phy_offset": phy})
                    return
                bad("garbage_after_end", pos,
                    f"zero TOTALSIZE and MAGICCODE (end of data) but non-zero bytes at {f.start + nonzero}",
                    claimed_end=nonzero + 1)
                return
            if magic != MESSAGE_MAGIC_CODE:
                if pos == 0:
                    bad("not_commitlog", pos,
                        f"not a CommitLog file: first 8 bytes are TOTALSIZE {total_size}, MAGICCODE 0x{magic:08X} "
                        f"(a record has 0x{MESSAGE_MAGIC_CODE:08X}, a filler 0x{BLANK_MAGIC_CODE:08X})")
                    return
                hint = " (is --from on a record boundary?)" if pos == from_pos else ""
                bad("bad_magic", pos, f"MAGICCODE 0x{magic:08X} is not MESSAGE_MAGIC_CODE 0x{MESSAGE_MAGIC_CODE:08X} "
                    f"(TOTALSIZE {total_size}){hint}")
                return
            if total_size < RECORD_SIZE_MIN or total_size > RECORD_SIZE_PLAUSIBLE_MAX:
                bad("bad_size", pos,
                    f"TOTALSIZE {total_size} is outside [{RECORD_SIZE_MIN}, {RECORD_SIZE_PLAUSIBLE_MAX}]")
                return
            if total_size > left:
                bad("torn", pos, f"record claims TOTALSIZE {total_size} but the file ends {left} bytes after its start",
                    claimed_end=size)
                return
            buf, i = fb.view(pos, total_size)
            try:
                rec = parse_record(buf, i, check_crc=False)
            except TruncatedError:
                bad("torn", pos, f"record of TOTALSIZE {total_size} could not be read whole (file shrank?)",
                    claimed_end=size)
                return
            except SizeMismatchError as exc:
                bad("bad_size", pos, _wire_detail(exc), claimed_end=pos + total_size)
                return
            except WireError as exc:  # MalformedError: e.g. a topic that is not UTF-8
                bad("malformed", pos, _wire_detail(exc), claimed_end=pos + total_size)
                return
            crc = "unchecked" if not w.check_crc else ("ok" if record_crc_ok(rec) else "BAD")
            obj = _record_json(rec, phy, f.path, crc)
            if rec.physical_offset != phy:
                hint = ""
                if rec.physical_offset - pos >= 0:
                    hint = f"; was the file renamed? its records say it starts at {rec.physical_offset - pos:020d}"
                bad("bad_phy_offset", pos,
                    f"PHYSICALOFFSET field says {rec.physical_offset} but the record sits at {phy}{hint}",
                    claimed_end=pos + total_size, record=obj)
                return
            if crc == "BAD":
                bad("bad_crc", pos, f"BODYCRC {rec.body_crc} != CRC32(body) {body_crc32(rec.body)} "
                    f"(topic {rec.topic!r}, queueId {rec.queue_id}, queueOffset {rec.queue_offset})",
                    claimed_end=pos + total_size, record=obj)
                return
            out.item(obj, _record_text(obj))
            w.records += 1
            w.record_bytes += total_size
            pos += total_size


def dump_commitlog(args: argparse.Namespace, out: Output) -> int:
    files, notes = resolve_commitlog(args.path)
    for note in notes:
        _err(f"note: {note}")
    w = ClWalk(out, files, check_crc=not args.no_crc)
    first, first_pos = 0, 0
    if args.from_offset is not None:
        first = None
        for k, f in enumerate(files):
            try:
                f.size = os.path.getsize(f.path)
            except OSError:
                continue
            if f.start <= args.from_offset < f.start + f.size:
                first, first_pos = k, args.from_offset - f.start
                break
        if first is None:
            spans = ", ".join(f"[{f.start}, {f.start + f.size})" for f in files)
            raise UsageError(f"--from {args.from_offset} is in none of the files: {spans}")
    limited = False
    expected_start = None
    try:
        for k in range(first, len(files)):
            f = files[k]
            out.current_file = f.path
            if expected_start is not None and f.start != expected_start:
                gap = "gap" if f.start > expected_start else "overlap"
                out.problem(Problem("gap", f.path, f"@{expected_start}: the previous file ends at {expected_start} "
                                    f"but the next one starts at {f.start} ({gap})"),
                            {"phy_offset": expected_start})
            try:
                w.files_read += 1
                _walk_commitlog_file(w, k, first_pos if k == first else 0)
                expected_start = f.start + f.size
            except OSError as exc:
                out.problem(Problem("unreadable", f.path, f"cannot read: {exc.strerror or exc}", fatal=True),
                            {"phy_offset": f.start})
                expected_start = None
            except UsageError as exc:
                out.problem(Problem("unreadable", f.path, str(exc), fatal=True), {"phy_offset": f.start})
                expected_start = None
    except _Limit:
        limited = True
    # Garbage at offset 0 is "not a CommitLog at all" (exit 2) when nothing in the input was one.
    if w.records == 0 and w.blanks == 0 and w.end_offset is None:
        for p in out.problems:
            if p.problem == "not_commitlog":
                p.fatal = True
    end = "" if w.end_offset is None else f", data ends at {w.end_offset}"
    out.emit(
        {"kind": "summary", "records": w.records, "record_bytes": w.record_bytes, "blanks": w.blanks,
         "files": w.files_read, "problems": len(out.problems), "end_offset": w.end_offset, "limited": limited},
        f"summary: {w.records} records, {w.record_bytes} bytes, {w.blanks} blank fillers, {w.files_read} files, "
        f"{len(out.problems)} problems{end}" + (" (stopped at --limit)" if limited else ""),
    )
    return out.exit_code()


# --------------------------------------------------------------------------------------------------
# DLedger


def resolve_dledger(path: str) -> tuple[str, str | None, list[ClFile]]:
    """(dledger dir, index dir or None, data files) named by PATH: a dledger-<selfId> directory, its
    data directory, or a store root holding exactly one dledger-* directory."""
    _resolve_input(path)
    if not os.path.isdir(path):
        raise UsageError(f"{path}: not a directory (give a dledger-<selfId> directory or a store root)")
    _check_readable_dir(path)
    d = path
    subs = [n for n in sorted(os.listdir(path)) if n.startswith("dledger-") and os.path.isdir(os.path.join(path, n))]
    if subs:
        if len(subs) > 1:
            raise UsageError(f"{path}: several DLedger directories ({', '.join(subs)}): name one")
        d = os.path.join(path, subs[0])
    elif os.path.basename(os.path.abspath(path)) == "data":
        d = os.path.dirname(os.path.abspath(path))
    data = os.path.join(d, "data")
    if not os.path.isdir(data):
        raise UsageError(f"{path}: no DLedger data directory ({data})")
    files = [ClFile(p, start) for start, p in _numbered_files(data)]
    if not files:
        raise UsageError(f"{path}: no DLedger data files (20-digit names) in {data}")
    index = os.path.join(d, "index")
    return d, index if os.path.isdir(index) else None, files


class _IndexFiles:
    """Reads index units (mq.wire.dledger) from the index files, read-only."""

    def __init__(self, directory: str | None):
        self.files = dict(_numbered_files(directory)) if directory else {}
        self.size = os.path.getsize(next(iter(self.files.values()))) if self.files else 0
        self.open: dict[int, FileBytes] = {}

    def unit(self, index: int):
        if not self.size:
            return None
        at = index * dlw.INDEX_UNIT_SIZE
        start = at - at % self.size
        if start not in self.files:
            return None
        fb = self.open.get(start) or self.open.setdefault(start, FileBytes(self.files[start]))
        buf, i = fb.view(at - start, dlw.INDEX_UNIT_SIZE)
        try:
            return dlw.parse_index_unit(buf, i)
        except WireError:
            return "bad"

    def close(self) -> None:
        for fb in self.open.values():
            fb.close()


def dump_dledger(args: argparse.Namespace, out: Output) -> int:
    d, index_dir, files = resolve_dledger(args.path)
    units = _IndexFiles(index_dir)
    for name, parse in (("checkpoint", dlw.parse_checkpoint), ("currterm", dlw.parse_currterm)):
        try:
            with open(os.path.join(d, name), encoding="utf-8") as f:
                values = parse(f.read())
        except FileNotFoundError:
            continue
        except WireError as exc:
            out.problem(Problem("malformed", os.path.join(d, name), _wire_detail(exc)), {})
            continue
        keys = ("endIndex", "committedIndex") if name == "checkpoint" else ("currTerm", "voteLeader")
        out.emit({"kind": name, **dict(zip(keys, values))}, f"{name}: " + " ".join(f"{k}={v}" for k, v in
                                                                                 zip(keys, values)))
    entries = fillers = 0
    prev = None                                   # (index, term) of the previous entry
    limited = False
    try:
        for k, f in enumerate(files):
            out.current_file = f.path
            with FileBytes(f.path) as fb:
                size = f.size = fb.size
                out.emit({"kind": "file", "file": f.path, "start_offset": f.start, "size": size},
                         f"== {f.path} start={f.start} size={size}")
                pos = 0
                while pos + 8 <= size:
                    abs_pos = f.start + pos
                    buf, i = fb.view(pos, dlw.ENTRY_HEADER_SIZE)
                    magic, esize = int.from_bytes(buf[i:i + 4], "big", signed=True), \
                        int.from_bytes(buf[i + 4:i + 8], "big", signed=True)
                    if magic == 0 and esize == 0:
                        if fb.first_nonzero(pos) is not None:
                            out.problem(Problem("garbage", f.path, f"@{abs_pos}: non-zero bytes after the end of "
                                                                   "the entries"), {"pos": abs_pos})
                        out.emit({"kind": "end", "file": f.path, "pos": abs_pos}, f"@{abs_pos} end of entries")
                        break
                    if magic == dlw.BLANK_MAGIC:
                        if esize != size - pos:
                            out.problem(Problem("bad_blank", f.path, f"@{abs_pos}: filler of {esize} bytes, "
                                                f"{size - pos} to the file's end"), {"pos": abs_pos})
                            break
                        fillers += 1
                        out.emit({"kind": "blank", "file": f.path, "pos": abs_pos, "size": esize},
                                 f"@{abs_pos} filler {esize} bytes")
                        break
                    e = None
                    try:
                        e = dlw.parse_entry_header(buf, i)
                        if e.pos != abs_pos:
                            raise SizeMismatchError(f"entry at {abs_pos} says pos {e.pos}")
                        if pos + e.size > size:
                            raise TruncatedError(f"entry at {abs_pos} of {e.size} bytes runs past the file's end")
                        if prev is not None and (e.index != prev[0] + 1 or e.term < prev[1]):
                            raise SizeMismatchError(f"entry at {abs_pos}: index {e.index} term {e.term} after "
                                                    f"index {prev[0]} term {prev[1]}")
                        body, j = fb.view(pos + dlw.ENTRY_HEADER_SIZE, e.body_size)
                        rec = parse_record(body, j)
                        if rec.total_size != e.body_size or rec.physical_offset != e.body_pos:
                            raise SizeMismatchError(f"record at {e.body_pos}: size {rec.total_size} (entry body "
                                                    f"{e.body_size}), PHYSICALOFFSET {rec.physical_offset}")
                        crc = "skipped" if args.no_crc else ("ok" if record_crc_ok(rec) else "bad")
                        if crc == "bad":
                            raise SizeMismatchError(f"record at {e.body_pos}: BODYCRC {rec.body_crc} does not match")
                    except WireError as exc:
                        # torn: nothing but zero bytes after what the entry claims (a write cut short)
                        tail_from = pos + (e.size if e is not None and e.size > 8 else 8)
                        torn = fb.first_nonzero(tail_from) is None and all(g.empty_head() for g in files[k + 1:])
                        out.problem(Problem("torn" if torn else "bad_entry", f.path, f"@{abs_pos}: "
                                            + _wire_detail(exc)), {"pos": abs_pos})
                        break
                    unit = units.unit(e.index)
                    match = unit == dlw.Unit(e.pos, e.size, e.index, e.term)
                    if not match:
                        out.problem(Problem("index_mismatch", f.path, f"@{abs_pos}: entry {e.index}'s index unit "
                                            f"is {unit}"), {"pos": abs_pos, "index": e.index})
                    obj = {**_record_json(rec, e.body_pos, f.path, crc), "kind": "entry", "index": e.index,
                           "term": e.term, "pos": e.pos, "entry_size": e.size, "index_unit_ok": match}
                    out.item(obj, f"#{e.index} term={e.term} pos={e.pos} " + _record_text(obj))
                    entries += 1
                    prev = (e.index, e.term)
                    pos += e.size
    except _Limit:
        limited = True
    finally:
        units.close()
    span = f", indexes {prev[0] - entries + 1}..{prev[0]}, last term {prev[1]}" if prev else ""
    out.emit({"kind": "summary", "entries": entries, "fillers": fillers, "files": len(files),
              "problems": len(out.problems), "last_index": prev[0] if prev else None, "limited": limited},
             f"summary: {entries} entries, {fillers} fillers, {len(files)} files, {len(out.problems)} problems"
             f"{span}" + (" (stopped at --limit)" if limited else ""))
    return out.exit_code()


# --------------------------------------------------------------------------------------------------
# ConsumeQueue


@dataclass
class CqQueue:
    topic: str | None
    queue_id: int | None
    directory: str
    files: list[tuple[int, str]]  # (logical byte offset of the first entry, path)


def _queue_ids(topic_dir: str) -> list[tuple[int, str]]:
    out = []
    for name in os.listdir(topic_dir):
        path = os.path.join(topic_dir, name)
        if name.isascii() and name.isdigit() and os.path.isdir(path):
            out.append((int(name), path))
    return sorted(out)


def _queue(topic: str | None, queue_id: int | None, directory: str) -> CqQueue:
    return CqQueue(topic, queue_id, directory, _numbered_files(directory))


def resolve_consumequeue(path: str) -> tuple[list[CqQueue], list[str]]:
    """The queues named by PATH: a CQ file, a queue directory, a topic directory, the consumequeue
    directory or a store root. Raises UsageError when there is nothing to read."""
    _resolve_input(path)
    notes: list[str] = []
    if os.path.isfile(path):
        name = os.path.basename(path)
        start = _file_start(name)
        if start is None:
            notes.append(f"{path}: name {name!r} is not a 20-digit logical offset; assuming offset 0")
            start = 0
        qdir = os.path.dirname(os.path.abspath(path))
        qname, topic = os.path.basename(qdir), os.path.basename(os.path.dirname(qdir))
        qid = int(qname) if qname.isascii() and qname.isdigit() else None
        return [CqQueue(topic if qid is not None else None, qid, qdir, [(start, path)])], notes
    if not os.path.isdir(path):
        raise UsageError(f"{path}: not a regular file or directory")
    _check_readable_dir(path)
    root = path
    if os.path.isdir(os.path.join(path, "consumequeue")):
        root = os.path.join(path, "consumequeue")
        _check_readable_dir(root)
    queues: list[CqQueue] = []
    if root == path and _numbered_files(path):  # a queue directory
        abspath = os.path.abspath(path)
        qname = os.path.basename(abspath)
        qid = int(qname) if qname.isascii() and qname.isdigit() else None
        queues.append(_queue(os.path.basename(os.path.dirname(abspath)) if qid is not None else None, qid, path))
    elif root == path and any(_numbered_files(q) for _, q in _queue_ids(path)):  # a topic directory
        topic = os.path.basename(os.path.abspath(path))
        queues += [_queue(topic, qid, q) for qid, q in _queue_ids(path)]
    else:  # the consumequeue directory: <topic>/<queueId>/files
        for topic in sorted(os.listdir(root)):
            tdir = os.path.join(root, topic)
            if os.path.isdir(tdir):
                queues += [_queue(topic, qid, q) for qid, q in _queue_ids(tdir)]
    queues = [q for q in queues if q.files]
    if not queues:
        raise UsageError(f"{path}: no ConsumeQueue files (<topic>/<queueId>/<20-digit name>) under it")
    return queues, notes


@dataclass
class CqWalk:
    out: Output
    from_queue_offset: int
    entries: int = 0
    fillers: int = 0
    files_read: int = 0


def _entries(fb: FileBytes, first_pos: int) -> Iterator[tuple[int, tuple[int, int, int]]]:
    """(file position, entry) of every whole entry from first_pos on."""
    whole_end = fb.size - fb.size % CQ_ENTRY_SIZE
    pos = first_pos
    while pos < whole_end:
        buf, i = fb.view(pos, CQ_ENTRY_SIZE, window=CQ_READ_WINDOW_BYTES)
        n = min((len(buf) - i) // CQ_ENTRY_SIZE, (whole_end - pos) // CQ_ENTRY_SIZE)
        if n <= 0:
            return  # the file shrank under us
        for k in range(n):
            yield pos + k * CQ_ENTRY_SIZE, unpack_cq_entry(buf, i + k * CQ_ENTRY_SIZE)
        pos += n * CQ_ENTRY_SIZE


def _walk_queue(w: CqWalk, q: CqQueue) -> None:
    out = w.out
    label = f"{q.topic}/{q.queue_id}" if q.topic is not None else q.directory
    base = {"topic": q.topic, "queue_id": q.queue_id}
    out.emit({"kind": "queue", **base, "directory": q.directory, "files": len(q.files)},
             f"== queue {label} ({len(q.files)} files in {q.directory})")
    filler_run: list[int] = []  # [first queue offset, count]

    def flush_fillers() -> None:
        if filler_run:
            first, count = filler_run
            out.emit({"kind": "filler", **base, "queue_offset": first, "count": count},
                     f"  qoff={first}..{first + count - 1} filler entries (0, 0x7FFFFFFF, 0) x{count}")
            filler_run.clear()

    expected_start = None
    for start, path in q.files:
        out.current_file = path
        if expected_start is not None and start != expected_start:
            flush_fillers()
            out.problem(Problem("gap", path, f"the previous file ends at logical offset {expected_start} "
                                f"but this one starts at {start}"), {**base, "logical_offset": expected_start})
        if start % CQ_ENTRY_SIZE:
            flush_fillers()
            out.problem(Problem("bad_name", path, f"file name {start} is not a multiple of {CQ_ENTRY_SIZE}"), base)
        first_index = start // CQ_ENTRY_SIZE
        try:
            with FileBytes(path) as fb:
                w.files_read += 1
                expected_start = start + fb.size
                skip = max(0, w.from_queue_offset - first_index)
                ended = False
                for pos, e in _entries(fb, skip * CQ_ENTRY_SIZE):
                    qoff = first_index + pos // CQ_ENTRY_SIZE
                    if e == (0, 0, 0):
                        flush_fillers()
                        out.emit({"kind": "end", **base, "file": path, "queue_offset": qoff},
                                 f"  qoff={qoff} end of queue (all-zero entry)")
                        ended = True
                        break
                    if tuple(e) == tuple(FILLER_ENTRY):
                        if filler_run:
                            filler_run[1] += 1
                        else:
                            filler_run[:] = [qoff, 1]
                        w.fillers += 1
                        continue
                    flush_fillers()
                    if e.commit_log_offset < 0 or e.size <= 0:
                        out.problem(Problem("bad_entry", path, f"queue offset {qoff}: entry ({e.commit_log_offset}, "
                                            f"{e.size}, {e.tags_code}) is neither a message nor a filler; "
                                            "rest of the queue unreadable"), {**base, "queue_offset": qoff})
                        ended = True
                        break
                    out.item({"kind": "entry", **base, "file": path, "queue_offset": qoff,
                              "commitlog_offset": e.commit_log_offset, "size": e.size, "tags_code": e.tags_code},
                             f"  qoff={qoff} phy={e.commit_log_offset} size={e.size} tagsCode={e.tags_code}")
                    w.entries += 1
                flush_fillers()
                if fb.size % CQ_ENTRY_SIZE:
                    torn_qoff = first_index + fb.size // CQ_ENTRY_SIZE
                    out.problem(Problem("truncated", path, f"file is {fb.size} bytes, not a multiple of "
                                        f"{CQ_ENTRY_SIZE}: a partial entry of {fb.size % CQ_ENTRY_SIZE} bytes "
                                        f"at queue offset {torn_qoff}"), {**base, "queue_offset": torn_qoff})
                if ended:
                    rest = len(q.files) - q.files.index((start, path)) - 1
                    if rest:
                        out.emit({"kind": "note", **base, "message": f"{rest} later files not read"},
                                 f"  ({rest} later files not read)")
                    return
        except OSError as exc:
            flush_fillers()
            out.problem(Problem("unreadable", path, f"cannot read: {exc.strerror or exc}", fatal=True), base)
        except UsageError as exc:
            flush_fillers()
            out.problem(Problem("unreadable", path, str(exc), fatal=True), base)
    flush_fillers()


def dump_consumequeue(args: argparse.Namespace, out: Output) -> int:
    queues, notes = resolve_consumequeue(args.path)
    for note in notes:
        _err(f"note: {note}")
    w = CqWalk(out, args.from_offset or 0)
    limited = False
    try:
        for q in queues:
            _walk_queue(w, q)
    except _Limit:
        limited = True
    out.emit(
        {"kind": "summary", "entries": w.entries, "fillers": w.fillers, "queues": len(queues),
         "files": w.files_read, "problems": len(out.problems), "limited": limited},
        f"summary: {w.entries} entries, {w.fillers} filler entries, {len(queues)} queues, {w.files_read} files, "
        f"{len(out.problems)} problems" + (" (stopped at --limit)" if limited else ""),
    )
    return out.exit_code()


# --------------------------------------------------------------------------------------------------
# Index files (mq.wire.index)

INDEX_SLOT_READ = 1 << 20          # slots read per pread while checking the slot table


def resolve_index(path: str) -> list[str]:
    from mq.wire.index import INDEX_DIR_NAME, is_index_file_name

    def names_in(d: str) -> list[str]:
        return sorted(n for n in os.listdir(d) if is_index_file_name(n)) if os.path.isdir(d) else []
    if os.path.isfile(path):
        return [path]
    if not os.path.isdir(path):
        raise UsageError(f"{path}: no such file or directory")
    d = path if names_in(path) else os.path.join(path, INDEX_DIR_NAME)
    names = names_in(d)
    if not names:
        raise UsageError(f"{path}: no index files (named yyyyMMddHHmmssSSS) here or in {INDEX_DIR_NAME}/")
    return [os.path.join(d, n) for n in names]


def _walk_index_file(out: Output, path: str, slots: int, entries: int, key: str | None) -> int:
    from mq.wire import index as iw
    out.current_file = path
    size = os.path.getsize(path)
    want = iw.index_file_size(slots, entries)
    if size != want:
        out.problem(Problem("bad_size", path, f"{size} bytes, not {want} (40 + 4 x {slots} slots + 20 x {entries} "
                                                "entries): give --maxHashSlotNum and --maxIndexNum", fatal=True), {})
        return 0
    fd = os.open(path, os.O_RDONLY)
    try:
        h = iw.parse_index_header(os.pread(fd, iw.INDEX_HEADER_SIZE, 0))
        out.emit({"kind": "file", "file": path, **h._asdict(),
                  "begin_time": _iso_ms(h.begin_timestamp_ms), "end_time": _iso_ms(h.end_timestamp_ms)},
                 f"== {path}: entries {max(h.index_count - 1, 0)}, slots used {h.hash_slot_count}, "
                 f"phy {h.begin_phy_offset}..{h.end_phy_offset}, time {_iso_ms(h.begin_timestamp_ms)}.."
                 f"{_iso_ms(h.end_timestamp_ms)}")
        count = h.index_count
        if not 1 <= count <= entries:
            out.problem(Problem("bad_count", path, f"INDEXCOUNT {count} outside 1..{entries}"), {})
            return 0
        entry_at = iw.INDEX_HEADER_SIZE + iw.INDEX_SLOT_SIZE * slots

        def entry(i: int):
            return iw.unpack_index_entry(os.pread(fd, iw.INDEX_ENTRY_SIZE, entry_at + i * iw.INDEX_ENTRY_SIZE))
        if key is not None:
            kh = iw.index_key_hash(key)
            slot = kh % slots
            i = iw.unpack_slots(os.pread(fd, iw.INDEX_SLOT_SIZE, iw.INDEX_HEADER_SIZE + iw.INDEX_SLOT_SIZE * slot))[0]
            n = 0
            while 0 < i < count:
                e = entry(i)
                if e.key_hash == kh:
                    ts = h.begin_timestamp_ms + e.time_diff_s * 1000
                    out.item({"kind": "entry", "index": i, **e._asdict(), "time": _iso_ms(ts)},
                             f"  #{i} phy {e.phy_offset} time {_iso_ms(ts)} (second)")
                    n += 1
                if e.prev_index >= i:
                    out.problem(Problem("bad_chain", path, f"entry {i} points forward to {e.prev_index}"), {})
                    break
                i = e.prev_index
            return n
        n = 0
        for i in range(1, count):
            e = entry(i)
            ts = h.begin_timestamp_ms + e.time_diff_s * 1000
            out.item({"kind": "entry", "index": i, **e._asdict(), "time": _iso_ms(ts)},
                     f"  #{i} hash {e.key_hash} phy {e.phy_offset} +{e.time_diff_s}s prev {e.prev_index}")
            n += 1
            if not 0 <= e.prev_index < i:
                out.problem(Problem("bad_chain", path, f"entry {i}: previous entry {e.prev_index} is not before it"),
                            {"index": i})
            if e.time_diff_s < 0 or e.key_hash < 0:
                out.problem(Problem("malformed", path, f"entry {i}: negative time or hash"), {"index": i})
            if not h.begin_phy_offset <= e.phy_offset <= h.end_phy_offset:
                out.problem(Problem("bad_phy_offset", path, f"entry {i}: offset {e.phy_offset} outside the "
                                                            f"header's {h.begin_phy_offset}..{h.end_phy_offset}"),
                            {"index": i})
        used = 0
        for first in range(0, slots, INDEX_SLOT_READ):
            k = min(INDEX_SLOT_READ, slots - first)
            raw = os.pread(fd, iw.INDEX_SLOT_SIZE * k, iw.INDEX_HEADER_SIZE + iw.INDEX_SLOT_SIZE * first)
            for j, v in enumerate(iw.unpack_slots(raw)):
                if v:
                    used += 1
                    if not 0 < v < count:
                        out.problem(Problem("bad_slot", path, f"slot {first + j} points at entry {v} "
                                                              f"(INDEXCOUNT {count})"), {"slot": first + j})
        if used != h.hash_slot_count:
            out.problem(Problem("bad_count", path, f"{used} slots in use, HASHSLOTCOUNT says {h.hash_slot_count}"),
                        {})
        return n
    finally:
        os.close(fd)


def dump_index(args: argparse.Namespace, out: Output) -> int:
    files = resolve_index(args.path)
    limited = False
    try:
        for path in files:
            _walk_index_file(out, path, args.maxHashSlotNum, args.maxIndexNum, args.key)
    except _Limit:
        limited = True
    total = out.items
    out.emit({"kind": "summary", "entries": total, "files": len(files), "problems": len(out.problems),
              "limited": limited},
             f"summary: {total} entries{' for ' + args.key if args.key else ''}, {len(files)} files, "
             f"{len(out.problems)} problems" + (" (stopped at --limit)" if limited else ""))
    return out.exit_code()


# --------------------------------------------------------------------------------------------------
# Command line


def _non_negative_int(text: str) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        try:
            value = int(text, 0)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0: {value}")
    return value


def _common_arguments(p: argparse.ArgumentParser, path_help: str, limit_help: str) -> None:
    p.add_argument("path", metavar="PATH", help=path_help)
    p.add_argument("--json", action="store_true", help="one JSON object per line, each with a \"kind\"")
    p.add_argument("--limit", type=_non_negative_int, metavar="N", help=limit_help)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mqdump",
        description="Print and check RocketMQ 4.x CommitLog and ConsumeQueue files (read-only; safe while a "
                    "broker runs).",
        epilog="exit status: 0 no problems, 1 bad/torn records or entries, 2 usage error or unreadable input",
    )
    sub = parser.add_subparsers(dest="command", metavar="{commitlog,consumequeue,dledger,index}")
    sub.required = True
    cl = sub.add_parser(
        "commitlog", help="list CommitLog records",
        description="List every record of a CommitLog file, a commitlog directory or a store root, checking "
                    "sizes, magic codes, BODYCRC and PHYSICALOFFSET.",
    )
    _common_arguments(cl, "a CommitLog file, a commitlog directory or a store root", "print at most N records")
    cl.add_argument("--from", dest="from_offset", type=_non_negative_int, metavar="OFFSET",
                    help="start at this absolute physical offset (a record boundary)")
    cl.add_argument("--no-crc", action="store_true", help="do not check BODYCRC")
    cq = sub.add_parser(
        "consumequeue", help="list ConsumeQueue entries",
        description="List the 20-byte entries of a ConsumeQueue file, a queue directory "
                    "(consumequeue/<topic>/<queueId>) or every queue of a store root.",
    )
    _common_arguments(cq, "a ConsumeQueue file, a queue directory or a store root", "print at most N entries in all")
    cq.add_argument("--from", dest="from_offset", type=_non_negative_int, metavar="N",
                    help="start at queue offset N (entry number) in every queue")
    dl = sub.add_parser(
        "dledger", help="list DLedger entries (DLedger mode)",
        description="List every entry of a DLedger member's data files (index, term, pos and the record "
                    "inside), checking headers, index continuity, terms, the records' CRC and offsets and the "
                    "index files; shows the checkpoint and currterm files.",
    )
    _common_arguments(dl, "a dledger-<selfId> directory (or its data directory, or a store root)",
                      "print at most N entries")
    dl.add_argument("--no-crc", action="store_true", help="do not check the records' BODYCRC")
    ix = sub.add_parser(
        "index", help="list message index entries",
        description="List and check the message index files (RocketMQ's IndexFile) of a store root, its index "
                    "directory or one file; --key follows one key's chain.",
    )
    _common_arguments(ix, "an index file, the index directory or a store root", "print at most N entries")
    ix.add_argument("--key", metavar="TOPIC#KEY", help="only the entries of this key (topic#key or topic#UNIQ_KEY)")
    ix.add_argument("--maxHashSlotNum", type=_non_negative_int, default=5000000, metavar="N",
                    help="slots per file, as the broker's maxHashSlotNum (5000000)")
    ix.add_argument("--maxIndexNum", type=_non_negative_int, default=20000000, metavar="N",
                    help="entries per file, as the broker's maxIndexNum (20000000)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run mqdump; returns the exit code (0 clean, 1 problems found, 2 usage error or unreadable input)."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # argparse has printed usage and the error
        return exc.code if isinstance(exc.code, int) else EXIT_FATAL
    out = Output(as_json=args.json, limit=args.limit)
    out.current_file = args.path
    try:
        if args.command == "commitlog":
            code = dump_commitlog(args, out)
        elif args.command == "dledger":
            code = dump_dledger(args, out)
        elif args.command == "index":
            code = dump_index(args, out)
        else:
            code = dump_consumequeue(args, out)
        sys.stdout.flush()
        out.stderr_summary()
        return code
    except UsageError as exc:
        _err(str(exc))
        return EXIT_FATAL
    except BrokenPipeError:  # `mqdump ... | head`: the reader has seen enough
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return out.exit_code()
    except KeyboardInterrupt:
        _err("interrupted")
        return 130
    except OSError as exc:
        _err(f"{exc.filename or out.current_file}: {exc.strerror or exc}")
        return EXIT_FATAL
    except Exception as exc:  # last resort: a bug or an input we did not foresee; never a traceback
        _err(f"internal error while reading {out.current_file}: {type(exc).__name__}: {exc}")
        return EXIT_FATAL


if __name__ == "__main__":
    sys.exit(main())
