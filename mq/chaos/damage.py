"""Byte-level faults for the chaos suite: a broker's files damaged as a failing disk, a careless
operator or a cut-short copy damages them.  Each works on a store directory, stopped or live (a
live broker's mapping sees a write to its file at once: bit rot under a running broker), and
says exactly what it damaged, so the checker can tell a damaged message (allowed to be missing,
never to be served) from an intact one (never to be lost).

    flip_body_byte(root, topic, rng)     one byte of a record's body, in the last data file
    cut_mid_record(root, topic, rng)     the last data file cut short in the middle of a record
    drop_consume_queue(root, topic, rng) one queue's ConsumeQueue directory removed

Only records of `topic` (the workload's) are chosen, in the newest data file (where a restart's
validation looks, and where a live broker's recent messages are).  The CommitLog's v1 record has
a checksum for its body only: the body is what is flipped, as the read check and recovery can
see it (mq.store.commitlog.read_record names what they cannot)."""
from __future__ import annotations

import glob
import os
import random
import shutil
from dataclasses import dataclass

from mq.store.commitlog import list_files
from mq.wire import commitlog as wcl
from mq.wire import dledger as wdl
from mq.wire.errors import WireError
from mq.wire.filenames import offset_file_path


@dataclass
class Damage:
    what: str            # "flip" / "cut"
    phy: int             # the damaged record's PHYSICALOFFSET
    value: str           # its body (the workload's values are unique)
    at: int              # the byte flipped, or where the file now ends (a log position)


def data_dir(root: str) -> tuple[str, bool]:
    """The directory of the log's data files, and whether it is DLedger's."""
    dledger = sorted(glob.glob(os.path.join(root, "dledger-*", "data")))
    return (dledger[0], True) if dledger else (os.path.join(root, "commitlog"), False)


def _last_data_file(directory: str) -> tuple[str, int] | None:
    """(path, start) of the newest file that holds anything."""
    for start in reversed(list_files(directory)):
        path = offset_file_path(directory, start)
        with open(path, "rb") as f:
            if any(f.read(8)):
                return path, start
    return None


def records_in_last_file(root: str, topic: str) -> list[tuple[int, int, "wcl.Container"]]:
    """(log position of the record, its file offset, the parsed record) for every whole record
    of `topic` in the newest data file, in log order."""
    directory, dledger = data_dir(root)
    found = _last_data_file(directory)
    if found is None:
        return []
    path, start = found
    with open(path, "rb") as f:
        buf = f.read()
    out = []
    if dledger:
        for e in wdl.iter_entries(buf, start, len(buf)):
            if isinstance(e, wdl.Entry):
                at = e.pos - start + wdl.ENTRY_HEADER_SIZE
                _collect(out, buf, at, start + at, topic)
        return out
    at = 0
    while at + 8 <= len(buf):
        total = int.from_bytes(buf[at:at + 4], "big")
        magic = int.from_bytes(buf[at + 4:at + 8], "big")
        if total == 0 or magic != wcl.MESSAGE_MAGIC_CODE:
            break
        _collect(out, buf, at, start + at, topic)
        at += total
    return out


def _collect(out: list, buf: bytes, at: int, pos: int, topic: str) -> None:
    try:
        rec = wcl.parse_record(buf, at)
    except WireError:
        return
    if rec.topic == topic:
        out.append((pos, at, rec))


def flip_body_byte(root: str, topic: str, rng: random.Random) -> Damage | None:
    """Flips one byte of the body of a random record of `topic` in the newest data file; None
    when there is none."""
    recs = records_in_last_file(root, topic)
    if not recs:
        return None
    pos, at, rec = rng.choice(recs)
    directory, _ = data_dir(root)
    start = pos - at
    body_at = at + rec.total_size - _tail_len(rec) - len(rec.body)
    flip_at = body_at + rng.randrange(len(rec.body))
    with open(offset_file_path(directory, start), "r+b") as f:
        f.seek(flip_at)
        b = f.read(1)
        f.seek(flip_at)
        f.write(bytes([b[0] ^ (1 << rng.randrange(8))]))
    return Damage("flip", rec.physical_offset, bytes(rec.body).decode("utf-8", "replace"), start + flip_at)


def _tail_len(rec) -> int:
    """Bytes after the body: TOPICLEN 1 + topic + PROPERTIESLEN 2 + properties."""
    return 1 + len(rec.topic.encode()) + 2 + len(rec.properties)


def cut_mid_record(root: str, topic: str, rng: random.Random) -> Damage | None:
    """Cuts the newest data file short inside a random record of `topic` among its last 64
    (what a copy or a filesystem that lost its tail leaves); later files are removed.  The
    store must be stopped.  None when there is no such record."""
    recs = records_in_last_file(root, topic)[-64:]
    if not recs:
        return None
    pos, at, rec = rng.choice(recs)
    directory, _ = data_dir(root)
    start = pos - at
    cut = at + 1 + rng.randrange(rec.total_size - 1)
    with open(offset_file_path(directory, start), "r+b") as f:
        f.truncate(cut)
    for later in list_files(directory):
        if later > start:
            os.remove(offset_file_path(directory, later))
    return Damage("cut", rec.physical_offset, bytes(rec.body).decode("utf-8", "replace"), start + cut)


def drop_consume_queue(root: str, topic: str, rng: random.Random) -> str | None:
    """Removes the ConsumeQueue directory of a random queue of `topic` (the store must be
    stopped); returns "topic:queueId", or None when the topic has none."""
    tdir = os.path.join(root, "consumequeue", topic)
    try:
        queues = sorted(d for d in os.listdir(tdir) if d.isdigit())
    except FileNotFoundError:
        return None
    if not queues:
        return None
    q = rng.choice(queues)
    shutil.rmtree(os.path.join(tdir, q))
    return f"{topic}:{q}"


__all__ = ["Damage", "data_dir", "records_in_last_file", "flip_body_byte", "cut_mid_record", "drop_consume_queue"]
