"""A master/slave store switched to DLedger: the old CommitLog served read-only below the
dividing offset, as RocketMQ's DLedgerCommitLog does (its "mixed" CommitLog).

A broker restarted with enableDLegerCommitLog=true over a store that has CommitLog files
(storePathCommitLog, or <storePathRootDir>/commitlog) and no DLedger data files yet switches
once (`switch`):

  1. the old store is recovered as the master/slave store it was (MessageStore.open without
     DLedger: its files validated, its ConsumeQueues checked and finished) and closed cleanly;
  2. an end-of-file filler is written at its end in its last file (RocketMQ writes the same
     BLANK there), so the old log ends exactly at the end of its last file: the dividing
     offset (RocketMQ's dividedCommitlogOffset);
  3. the first DLedger data file is created at the dividing offset: entry 0 of the Raft log
     is stored there, and every later entry after it.

From then on (every start):
  * CommitLog offsets below the dividing offset are the old files' (LegacyLog, a CommitLog
    handle with a control block of its own, segment <name>-legacy); offsets at or past it
    are the DLedger log's.  MessageStore.read_record / view route by offset; a record is
    checked whole in C on either side, so a damaged old record is refused, never served.
  * The ConsumeQueues are the old store's, continued: a queue's next offset is its old end,
    so consumers and their committed offsets read across the switch without a gap.
  * Retention deletes old files first (by fileReservedTime, as CommitLog files), DLedger
    files only once no old file is left (RocketMQ keeps DLedger files while old ones exist).
  * The old files are not replicated by DLedger: every member of the group must switch with
    the same old CommitLog (RocketMQ's upgrade guide: align the master's and the slave's
    CommitLogs, copy them to a new member).  A member whose old log ends elsewhere has its
    entry 0 at another position; it refuses the leader's pushes (mq.dledger.log: CorruptRecord
    naming both positions; the role drops the link and logs it), and the group goes on without it.

Named limit: the dividing offset is the end of the last old file; an old store whose last
file is deleted by hand loses that boundary, and its ConsumeQueue entries below the DLedger
log are dropped as deleted data (retention's rule)."""
from __future__ import annotations

import copy
import logging
import os
import struct

from mq.files import fsync_dir
from mq.wire.commitlog import BLANK_MAGIC_CODE
from mq.wire.filenames import list_offset_files, offset_file_path

from . import control as C
from .checkpoint import Checkpoint
from .commitlog import CommitLog

log = logging.getLogger("mq.store.legacy")

SUFFIX = "legacy"
_BLANK = struct.Struct(">iI")        # REMAINING, BLANK_MAGIC_CODE


def old_files(cfg) -> list[int]:
    """Start offsets of the old CommitLog's files (none outside DLedger mode)."""
    if not cfg.enableDLegerCommitLog or os.path.realpath(cfg.legacy_commitlog_dir) == os.path.realpath(cfg.commitlog_dir):
        return []
    return list_offset_files(cfg.legacy_commitlog_dir)


def needs_switch(cfg) -> bool:
    """DLedger mode over a store with old CommitLog files and no DLedger data file yet."""
    return bool(old_files(cfg)) and not list_offset_files(cfg.commitlog_dir)


def dividing_offset(cfg) -> int:
    """The end of the last old file: DLedger's first entry is stored there."""
    files = old_files(cfg)
    assert files, "no old CommitLog"
    return files[-1] + cfg.mappedFileSizeCommitLog


def switch(cfg, store_host: str, store_port: int) -> int:
    """The one-time switch (module docstring, steps 1-3); returns the dividing offset.
    Idempotent: a crash half way is finished by the next start."""
    from .store import MessageStore
    plain = copy.copy(cfg)
    plain.enableDLegerCommitLog = False
    old = MessageStore.open(plain, store_host, store_port, start_roles=False, prepare_files=False)
    try:
        end = old.cl.write_pos
        report = old.recovery
    finally:
        old.close()
    fs = cfg.mappedFileSizeCommitLog
    divided = dividing_offset(cfg)
    if end < divided and end % fs:
        # RocketMQ's needWriteMagicCode: the rest of the last file is one filler
        path = offset_file_path(cfg.legacy_commitlog_dir, end - end % fs)
        fd = os.open(path, os.O_WRONLY)
        try:
            os.pwrite(fd, _BLANK.pack(fs - end % fs, BLANK_MAGIC_CODE), end % fs)
            os.fsync(fd)
        finally:
            os.close(fd)
    first = offset_file_path(cfg.commitlog_dir, divided)
    os.makedirs(cfg.commitlog_dir, exist_ok=True)
    fd = os.open(first + ".tmp", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.posix_fallocate(fd, 0, fs)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(first + ".tmp", first)
    fsync_dir(cfg.commitlog_dir)
    ckpt = Checkpoint(os.path.join(cfg.storePathRootDir, "checkpoint"))
    try:
        ckpt.mark_clean(divided)         # the old store stopped cleanly; the log now ends here
    finally:
        ckpt.close()
    log.warning("switched to DLedger: the CommitLog in %s (%s recovery, %d records validated, ending at %d) is "
                "served read-only below %d (dividedCommitlogOffset); DLedger entries are stored from there in %s",
                cfg.legacy_commitlog_dir, report.mode, report.records_validated, end, divided, cfg.commitlog_dir)
    return divided


class LegacyLog:
    """The old CommitLog of a switched store: [min_pos, end) readable, nothing appended.
    The owner creates its control block (positions from the files); other processes attach."""

    def __init__(self, cfg, ctl: C.ControlBlock, store_host: str, store_port: int):
        self.ctl = ctl
        self.directory = cfg.legacy_commitlog_dir
        self.cl = CommitLog(self.directory, ctl, cfg.mappedFileSizeCommitLog, store_host, store_port,
                            cfg.maxMessageSize)

    @classmethod
    def create(cls, cfg, store_host: str, store_port: int) -> "LegacyLog | None":
        files = old_files(cfg)
        if not files:
            return None
        end = dividing_offset(cfg)
        ctl = C.ControlBlock(cfg.storePathRootDir, cfg.mappedFileSizeCommitLog, create=True, suffix=SUFFIX)
        for p, v in ((C.POS_MIN, files[0]), (C.POS_WRITE, end), (C.POS_FLUSHED, end), (C.POS_DISPATCHED, end),
                     (C.POS_CONFIRM, end)):
            ctl.set(p, v)
        return cls(cfg, ctl, store_host, store_port)

    @classmethod
    def attach(cls, cfg, store_host: str, store_port: int) -> "LegacyLog | None":
        if not cfg.enableDLegerCommitLog:
            return None
        try:
            ctl = C.ControlBlock(cfg.storePathRootDir, suffix=SUFFIX)
        except FileNotFoundError:
            return None
        return cls(cfg, ctl, store_host, store_port)

    @property
    def min_pos(self) -> int:
        return self.cl.min_pos

    @property
    def end(self) -> int:
        """The dividing offset: below it, offsets are this log's (its handle's write position)."""
        return self.cl.write_pos

    def files(self) -> list[int]:
        return list_offset_files(self.directory)

    def close(self) -> None:
        self.cl.close()
        self.ctl.close()
