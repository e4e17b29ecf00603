"""Retention and the disk check: RocketMQ's CleanCommitLogService and
CleanConsumeQueueService.

The disk check (DiskCheck) measures the used share of the partitions the
CommitLog and the ConsumeQueues are on (statvfs: (blocks - free) / blocks, as
Java's File.getTotalSpace/getFreeSpace), and the index's for the refusal's
remark.  The supervisor runs it at start, then every cleanResourceInterval and at
most DISK_CHECK_INTERVAL_MAX_S apart (RocketMQ's isSpaceFull); retention runs it
again at each pass (isSpaceToDelete).  With u the larger of the CommitLog's and
the ConsumeQueues' shares:

  | u                                    | what the broker does                                  |
  |--------------------------------------|-------------------------------------------------------|
  | > diskMaxUsedSpaceRatio (75 %)       | a retention pass runs whatever the hour (deleteWhen)  |
  | > diskSpaceCleanForciblyRatio (0.85) | the pass ignores fileReservedTime when                |
  |                                      | cleanFileForciblyEnable (the oldest files go at once) |
  | > diskSpaceWarningLevelRatio (0.90)  | also: the disk is full; io workers refuse sends with  |
  |                                      | SERVICE_NOT_AVAILABLE (14) until u is back under it   |

The full state reaches the io workers through the control block
(POS_DISK_FULL: 0, or pack_disk_full() of the three shares, for the remark), so
a send pays one shared-memory read, never a syscall.  Each change of state is
logged once, when it happens.

A pass deletes files oldest first whose mtime + fileReservedTime hours is past
(every file, regardless of age, when cleaning forcibly), stops at the first file
still too young, never touches the newest file or one not yet flushed and
dispatched, and deletes at most FILES_PER_PASS_MAX files a pass.  min_pos moves
before the unlink, so no process starts a read into a file being deleted.  In
DLedger mode the first retained entry's index (DL_BEGIN_INDEX) moves first, and
index files wholly below it go too.  Message index files (mq.store.index) whose
last entry is below the new minimum go after the ConsumeQueue files."""
from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from dataclasses import dataclass

from mq.wire.filenames import offset_file_name, offset_file_path
from . import control as C
from .commitlog import list_files
from .consumequeue import ENTRY_SIZE, write_manifest

log = logging.getLogger("mq.store.retention")

FILES_PER_PASS_MAX = 10
DISK_CHECK_INTERVAL_MAX_S = 10.0   # RocketMQ checks for a full disk every 10 s (isSpaceFull)

# POS_DISK_FULL: FULL_FLAG | CL << 32 | CQ << 16 | INDEX, each share in 1/10000 (0..10000)
_FULL_FLAG = 1 << 48
_SHARE_UNITS = 10000
SERVICE_NOT_AVAILABLE_REMARK = (  # RocketMQ 4.9's SendMessageProcessor, with its diskUtil()
    "service not available now. It may be caused by one of the following reasons: the broker's disk is full "
    "[{}], messages are put to the slave, message store has been shut down, etc.")


def disk_usage_ratio(path: str) -> float:
    u = shutil.disk_usage(path)
    return u.used / u.total if u.total else 0.0


@dataclass(frozen=True)
class DiskUsage:
    """Used shares (0..1) of the partitions of the CommitLog, the ConsumeQueues and the index."""
    commitlog: float
    consumequeue: float
    index: float

    @property
    def worst(self) -> float:
        """The share the ratios are compared with: the CommitLog's or the ConsumeQueues', whichever is fuller."""
        return max(self.commitlog, self.consumequeue)

    def util(self) -> str:
        """RocketMQ's diskUtil(): 'CL:  0.93 CQ:  0.93 INDEX:  0.93'."""
        return "CL: %5.2f CQ: %5.2f INDEX: %5.2f" % (self.commitlog, self.consumequeue, self.index)


def pack_disk_full(usage: DiskUsage) -> int:
    """The POS_DISK_FULL value of a full disk: never 0 (the flag), the shares for the remark."""
    def units(share: float) -> int:
        return min(_SHARE_UNITS, max(0, round(share * _SHARE_UNITS)))
    v = _FULL_FLAG | units(usage.commitlog) << 32 | units(usage.consumequeue) << 16 | units(usage.index)
    assert v != 0 and v < 1 << 49
    return v


def unpack_disk_full(value: int) -> DiskUsage:
    assert value & _FULL_FLAG, value
    return DiskUsage(((value >> 32) & 0xFFFF) / _SHARE_UNITS, ((value >> 16) & 0xFFFF) / _SHARE_UNITS,
                     (value & 0xFFFF) / _SHARE_UNITS)


def service_not_available_remark(disk_full: int) -> str:
    """The remark of a send refused because POS_DISK_FULL is `disk_full` (non-zero)."""
    return SERVICE_NOT_AVAILABLE_REMARK.format(unpack_disk_full(disk_full).util())


def _existing(path: str) -> str:
    """`path`, or its nearest existing ancestor (a directory not made yet lives on that partition)."""
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


class DiskCheck:
    """The disk ratios of one store (RocketMQ's CleanCommitLogService.isSpaceFull / isSpaceToDelete).

    check() measures, updates `full` (sends refused) and `forcibly` (retention ignores
    fileReservedTime), logs each change once, and with a control block publishes the full
    state in POS_DISK_FULL for the io workers.  Safe to call from several threads."""

    def __init__(self, config, ctl: C.ControlBlock | None = None, usage_fn=disk_usage_ratio):
        self.config = config
        self.ctl = ctl
        self.usage_fn = usage_fn
        self.full = False
        self.forcibly = False
        self.usage: DiskUsage | None = None
        self._lock = threading.Lock()
        root = config.storePathRootDir
        self.paths = (config.commitlog_dir, os.path.join(root, "consumequeue"), os.path.join(root, "index"))

    def measure(self) -> DiskUsage:
        """The three shares now (OSError when a partition cannot be asked)."""
        return DiskUsage(*(self.usage_fn(_existing(p)) for p in self.paths))

    def check(self) -> DiskUsage:
        u = self.measure()
        cfg = self.config
        warning, forcibly_ratio = cfg.diskSpaceWarningLevelRatio, cfg.diskSpaceCleanForciblyRatio
        full = u.worst > warning
        forcibly = full or u.worst > forcibly_ratio        # over the warning ratio RocketMQ cleans at once too
        with self._lock:
            if self.ctl is not None and (full or self.full):
                self.ctl.set(C.POS_DISK_FULL, pack_disk_full(u) if full else 0)
            if full and not self.full:
                log.error("disk full: %s over diskSpaceWarningLevelRatio %.2f: sends are refused with "
                          "SERVICE_NOT_AVAILABLE until it drops", u.util(), warning)
            elif self.full and not full:
                log.warning("disk no longer full: %s at or under diskSpaceWarningLevelRatio %.2f: sends are "
                            "accepted again", u.util(), warning)
            if forcibly and not self.forcibly:
                log.warning("disk use %s over diskSpaceCleanForciblyRatio %.2f: retention %s", u.util(),
                            forcibly_ratio, "deletes the oldest files whatever their age"
                            if cfg.cleanFileForciblyEnable else "would delete the oldest files whatever their "
                            "age, but cleanFileForciblyEnable=false")
            elif self.forcibly and not forcibly:
                log.info("disk use %s at or under diskSpaceCleanForciblyRatio %.2f: retention keeps files for "
                         "fileReservedTime again", u.util(), forcibly_ratio)
            self.full, self.forcibly, self.usage = full, forcibly, u
        return u


class Retention:
    """Retention passes over one store.  `disk`: the DiskCheck to consult (the supervisor's, which
    publishes the full state); by default one of its own over `usage_fn`, publishing nothing."""

    def __init__(self, store, usage_fn=disk_usage_ratio, clock=time.time, disk: DiskCheck | None = None):
        self.store = store
        self.config = store.config
        self.disk = disk if disk is not None else DiskCheck(store.config, usage_fn=usage_fn)
        self.clock = clock
        self._stuck = False             # cleaning forcibly found nothing it may delete (logged once)

    def due(self) -> tuple[bool, bool]:
        """(run a pass, ignore reserve time).  A pass is due at a deleteWhen hour, over
        diskMaxUsedSpaceRatio, or over diskSpaceCleanForciblyRatio; it ignores the files'
        age over diskSpaceCleanForciblyRatio when cleanFileForciblyEnable."""
        cfg = self.config
        hours = {int(h) for h in cfg.deleteWhen.split(";") if h.strip()}
        usage = self.disk.check()
        hour_due = time.localtime(self.clock()).tm_hour in hours
        space_due = usage.worst > cfg.diskMaxUsedSpaceRatio / 100 or self.disk.forcibly
        return hour_due or space_due, self.disk.forcibly and cfg.cleanFileForciblyEnable

    def run_once(self, force: bool = False) -> list[str]:
        """One pass; returns the names of the CommitLog files deleted."""
        due, forcibly = self.due()
        if not (due or force):
            return []
        deleted = self._delete(forcibly)
        if forcibly and not deleted and not self._stuck:
            log.warning("disk use is over diskSpaceCleanForciblyRatio but no CommitLog file can go (only the "
                        "newest is left, or the older ones are not yet flushed and dispatched)")
        self._stuck = forcibly and not deleted
        return deleted

    def _delete(self, forcibly: bool) -> list[str]:
        store, cfg = self.store, self.config
        fs = cfg.mappedFileSizeCommitLog
        if store.legacy is not None and store.legacy.files():
            return self._delete_old(forcibly)
        ctl = store.ctl
        safe_end = min(ctl.get(C.POS_FLUSHED), ctl.get(C.POS_DISPATCHED))
        files = list_files(cfg.commitlog_dir)
        now = self.clock()
        doomed = []
        for start in files[:-1][:FILES_PER_PASS_MAX]:
            path = offset_file_path(cfg.commitlog_dir, start)
            expired = os.path.getmtime(path) + cfg.fileReservedTime * 3600 <= now
            if not (expired or forcibly) or start + fs > safe_end:
                break
            doomed.append(start)
        if not doomed:
            return []
        new_min = doomed[-1] + fs
        if store.dledger:
            # entries below the first one left are gone: the Raft role must not look them up
            ctl.advance(C.POS_DL_BEGIN_INDEX, store.cl.dledger_entry_at(new_min)[0])
        ctl.advance(C.POS_MIN, new_min)
        deleted = self._unlink(cfg.commitlog_dir, doomed)
        store.cl.release(below=new_min)
        self._clean_below(new_min)
        if store.dledger:
            self._clean_dledger_index(ctl.get(C.POS_DL_BEGIN_INDEX))
        log.info("retention deleted %d commitlog file(s) %s; min offset now %d", len(deleted), deleted, new_min)
        return deleted

    def _delete_old(self, forcibly: bool) -> list[str]:
        """A store switched to DLedger (mq.store.legacy): its old CommitLog's files go first,
        oldest first, the last one too (the DLedger log holds everything newer); DLedger files
        wait until no old file is left, as in RocketMQ."""
        store, cfg = self.store, self.config
        lg, fs = store.legacy, cfg.mappedFileSizeCommitLog
        now = self.clock()
        doomed = []
        for start in lg.files()[:FILES_PER_PASS_MAX]:
            expired = os.path.getmtime(offset_file_path(lg.directory, start)) + cfg.fileReservedTime * 3600 <= now
            if not (expired or forcibly):
                break
            doomed.append(start)
        if not doomed:
            return []
        new_min = min(doomed[-1] + fs, lg.end)
        lg.ctl.advance(C.POS_MIN, new_min)        # before the unlink: no read starts into a file going
        deleted = self._unlink(lg.directory, doomed)
        lg.cl.release(below=new_min)
        self._clean_below(new_min)
        log.info("retention deleted %d file(s) of the CommitLog from before the switch to DLedger %s; "
                 "%s", len(deleted), deleted, f"its min offset now {new_min}" if new_min < lg.end else
                 "none is left: DLedger files are deleted from the next pass on")
        return deleted

    def _unlink(self, directory: str, doomed: list[int]) -> list[str]:
        """Deletes the CommitLog files starting at `doomed` (oldest first, deleteCommitLogFilesInterval
        apart); returns the names deleted."""
        interval_ms = self.config.deleteCommitLogFilesInterval
        deleted = []
        for start in doomed:
            name = offset_file_name(start)
            try:
                os.unlink(os.path.join(directory, name))
                deleted.append(name)
            except FileNotFoundError:
                pass
            if interval_ms and start != doomed[-1]:
                time.sleep(interval_ms / 1000)
        return deleted

    def _clean_below(self, new_min: int) -> None:
        """After CommitLog files below new_min went: the ConsumeQueue files and message index
        files wholly below it."""
        cfg = self.config
        self._clean_queues(new_min)
        if cfg.messageIndexEnable:
            from .index import delete_files_below
            gone = delete_files_below(cfg.storePathRootDir, new_min, cfg.maxHashSlotNum, cfg.maxIndexNum)
            if gone:
                log.info("retention deleted %d index file(s) %s", len(gone), gone)

    def _clean_dledger_index(self, begin_index: int) -> None:
        """DLedger index files wholly below the first retained entry's unit."""
        d, size = self.config.dledger_index_dir, self.config.mappedFileSizeForEntryIndex
        for start in list_files(d):
            if start + size <= begin_index * 32:
                try:
                    os.unlink(offset_file_path(d, start))
                except FileNotFoundError:
                    pass

    def _clean_queues(self, min_phy: int) -> None:
        removed = 0
        for topic, qid in self.store.cqs.on_disk():
            cq = self.store.cqs.get(topic, qid)
            removed += cq.delete_files_below(min_phy)
            hi = cq.max_offset
            first = cq.first_entry_at_or_after(cq.min_offset, hi, min_phy)
            starts = cq.file_starts()
            if starts:
                first = max(first, starts[0] // ENTRY_SIZE)
            self.store.ctl.queue_advance(cq.slot, C.Q_CQ_MIN, min(first, hi))
        if removed:
            # the next start tells files retention deleted from files that were lost by the
            # manifest's min (a crash before this line: the queues it shortened are rebuilt)
            write_manifest(self.store.config_dir, self.store.queue_bounds())
