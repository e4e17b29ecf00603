"""DLedger's small files in dledger-<selfId>/ (layouts in mq.wire.dledger):

    currterm      currTerm, voteLeader: the Raft role's hard state
    checkpoint    endIndex, committedIndex: a hint for recovery (what is committed is also known
                  from the ConsumeQueues and, at last, from the leader)
    rebase        while an install is being applied (a follower behind the leader's first entry
                  takes the leader's log from it): beginIndex, beginPos and every queue's offset
                  at beginPos (JSON, fsynced); the dispatcher, or recovery after a crash,
                  finishes the install from it and deletes it last

Both are replaced atomically (a file renamed over the old one): currterm is fsynced, and its
directory, before the Raft role sends anything that depends on it.  Both end with a crc line
(mq.wire.dledger): a damaged currterm stops the start with one line (a forgotten vote could be
given twice), a damaged checkpoint is ignored with one (the commit is then restored from where
dispatch stopped).  The rebase file has no checksum: a digit damaged into another while an install
is pending is taken as it reads (named).

A full disk.  The new version is written into <file>.spare, a file of SPARE_BYTES whose
block was allocated beforehand (fallocate), so the write needs no new space; the spare is
then renamed over the file, and a new spare is allocated in the space the old version
freed.  So a term or vote is saved on a full disk too, and the Raft role goes on.  Without
a spare (the first save, or a disk that kept even the freed block) the save writes a fresh
file as before, and a full disk is an OSError (ENOSPC) for the caller.  A spare exists
under its name only once fully allocated (it is made as <file>.spare.tmp, then renamed);
one whose size is not SPARE_BYTES (a save cut short before its rename) is made again.

The DLedger data and index files are mapped by the C core (csrc/commitlog.c, seg_open), which
allocates every file (posix_fallocate) before mapping it."""
from __future__ import annotations

import errno
import logging
import os

from mq.files import fsync_dir, replace_file, write_atomic
from mq.wire import dledger as W
from mq.wire.errors import WireError

from .native import StoreError

log = logging.getLogger("mq.store.dledgerfiles")

CURRTERM = "currterm"
CHECKPOINT = "checkpoint"
SPARE_SUFFIX = ".spare"
SPARE_BYTES = 4096          # one block; both files' texts are a few dozen bytes


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        return ""


def load_hard_state(dledger_dir: str) -> tuple[int, str | None]:
    """(currTerm, voteLeader or None); (0, None) when the file is absent.  A damaged file (its crc
    line, mq.wire.dledger) is refused, StoreError: a member that forgot its term or vote could vote
    twice in one term, which Raft's safety rests on."""
    path = os.path.join(dledger_dir, CURRTERM)
    try:
        return W.parse_currterm(_read(path))
    except WireError as e:
        raise StoreError(f"the DLedger hard state {path} is damaged ({e}): this member's term and vote are "
                         f"unknown, and a member that forgot its vote could vote twice in one term; not "
                         f"starting (to rejoin anyway, move the file away: the member starts at term 0, "
                         f"learns its group's term and votes from there)") from None


def save_hard_state(dledger_dir: str, term: int, vote: str | None) -> None:
    """Durable when it returns (file and directory fsynced); OSError when it could not be saved."""
    _replace(os.path.join(dledger_dir, CURRTERM), W.build_currterm(term, vote), durable=True)


REBASE = "rebase"


def save_rebase(dledger_dir: str, begin_index: int, begin_pos: int, queues: list) -> None:
    """Durable when it returns.  queues: [(topic, queueId, queue offset at begin_pos)]."""
    import json
    text = json.dumps({"beginIndex": begin_index, "beginPos": begin_pos,
                       "queues": [[t, int(q), int(o)] for t, q, o in queues]})
    write_atomic(os.path.join(dledger_dir, REBASE), text)
    fsync_dir(dledger_dir)


def load_rebase(dledger_dir: str) -> tuple[int, int, dict] | None:
    """(beginIndex, beginPos, {(topic, queueId): offset}) of a pending install, or None (none, or
    a file that does not parse: logged)."""
    import json
    text = _read(os.path.join(dledger_dir, REBASE))
    if not text:
        return None
    try:
        d = json.loads(text)
        return int(d["beginIndex"]), int(d["beginPos"]), {(str(t), int(q)): int(o) for t, q, o in d["queues"]}
    except (ValueError, KeyError, TypeError) as e:
        log.error("DLedger rebase file in %s unreadable (%s): ignored", dledger_dir, e)
        return None


def clear_rebase(dledger_dir: str) -> None:
    try:
        os.unlink(os.path.join(dledger_dir, REBASE))
    except FileNotFoundError:
        return
    fsync_dir(dledger_dir)


def load_checkpoint(dledger_dir: str) -> tuple[int, int]:
    """(endIndex, committedIndex); (-1, -1) when the file is absent, or damaged (its crc line,
    mq.wire.dledger: one line; a commit restored past what was committed would have the member
    serve, and refuse to give up, entries its group may cut -- without it the commit restored is
    where dispatch stopped, lower but safe)."""
    path = os.path.join(dledger_dir, CHECKPOINT)
    try:
        return W.parse_checkpoint(_read(path))
    except WireError as e:
        log.warning("the DLedger checkpoint %s is damaged (%s): ignored, the commit is restored from where "
                    "dispatch stopped", path, e)
        return -1, -1


def save_checkpoint(dledger_dir: str, end_index: int, committed_index: int) -> None:
    """Replaced atomically (rename) but not fsynced: it is a hint, written every few seconds by
    the Raft role's event loop, which must not stall on a disk flush."""
    _replace(os.path.join(dledger_dir, CHECKPOINT), W.build_checkpoint(end_index, committed_index), durable=False)


def _replace(path: str, text: str, durable: bool) -> None:
    """`path` becomes `text`, through its spare when there is one (module docstring)."""
    data = text.encode("utf-8")
    spare = path + SPARE_SUFFIX
    fd = _open_spare(spare) if len(data) <= SPARE_BYTES else -1
    if fd < 0:
        if durable:
            write_atomic(path, text)
        else:
            replace_file(path, data)
    else:
        try:
            os.pwrite(fd, data, 0)
            os.ftruncate(fd, len(data))          # shrinking frees nothing the text uses
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(spare, path)
        if durable:
            fsync_dir(os.path.dirname(path) or ".")
    _make_spare(spare)


def _open_spare(spare: str) -> int:
    """A descriptor of the spare, or -1 when there is no usable one."""
    try:
        fd = os.open(spare, os.O_WRONLY)
    except FileNotFoundError:
        return -1
    if os.fstat(fd).st_size != SPARE_BYTES:
        os.close(fd)
        os.unlink(spare)
        return -1
    return fd


_spareless: set[str] = set()      # spares a full disk kept us from making (logged once each)


def _make_spare(spare: str) -> None:
    """Allocates a new spare if there is none (best effort: without one the next save writes
    a fresh file).  A full disk is logged once until a spare is made again; a file system
    without fallocate gets no spares, silently."""
    if os.path.exists(spare):
        return
    tmp = spare + ".tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        _no_spare(spare, e)
        return
    try:
        os.posix_fallocate(fd, 0, SPARE_BYTES)
    except OSError as e:
        os.close(fd)
        os.unlink(tmp)
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            _no_spare(spare, e)
        elif e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise
        return
    os.close(fd)
    os.replace(tmp, spare)
    if spare in _spareless:
        _spareless.discard(spare)
        log.info("%s has a spare again", spare[:-len(SPARE_SUFFIX)])


def _no_spare(spare: str, e: OSError) -> None:
    if spare not in _spareless:
        _spareless.add(spare)
        log.warning("no spare for %s (%s): until the disk has room, its saves need free space",
                    spare[:-len(SPARE_SUFFIX)], e)
