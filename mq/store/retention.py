"""Retention: deletes expired CommitLog files and the ConsumeQueue files
wholly below the new minimum (RocketMQ's CleanCommitLogService and
CleanConsumeQueueService).

A pass runs when the local hour is in deleteWhen, when disk use passes
diskMaxUsedSpaceRatio, or when forced.  It deletes files oldest first whose
mtime + fileReservedTime hours is past (every file, regardless of age, when
disk use is over CLEAN_FORCIBLY_RATIO), stops at the first file still too
young, never touches the newest file or one not yet flushed and dispatched,
and deletes at most FILES_PER_PASS_MAX files a pass.  min_pos moves before
the unlink, so no process starts a read into a file being deleted.  In DLedger
mode the first retained entry's index (DL_BEGIN_INDEX) moves first, and index
files wholly below it go too.  Message index files (mq.store.index) whose last
entry is below the new minimum go after the ConsumeQueue files."""
from __future__ import annotations

import logging
import os
import shutil
import time

from . import control as C
from .commitlog import list_files

log = logging.getLogger("mq.store.retention")

FILES_PER_PASS_MAX = 10
CLEAN_FORCIBLY_RATIO = 0.85      # rocketmq.broker.diskSpaceCleanForciblyRatio
DISK_FULL_RATIO = 0.90           # rocketmq.broker.diskSpaceWarningLevelRatio


def disk_usage_ratio(path: str) -> float:
    u = shutil.disk_usage(path)
    return u.used / u.total if u.total else 0.0


class Retention:
    def __init__(self, store, usage_fn=disk_usage_ratio, clock=time.time):
        self.store = store
        self.config = store.config
        self.usage_fn = usage_fn
        self.clock = clock

    def due(self) -> tuple[bool, bool]:
        """(run a pass, ignore reserve time)."""
        hours = {int(h) for h in self.config.deleteWhen.split(";") if h.strip()}
        usage = self.usage_fn(self.config.commitlog_dir)
        hour_due = time.localtime(self.clock()).tm_hour in hours
        space_due = usage > self.config.diskMaxUsedSpaceRatio / 100
        return hour_due or space_due or usage > CLEAN_FORCIBLY_RATIO, usage > CLEAN_FORCIBLY_RATIO

    def run_once(self, force: bool = False) -> list[str]:
        """One pass; returns the names of the CommitLog files deleted."""
        due, forcibly = self.due()
        if not (due or force):
            return []
        store, cfg = self.store, self.config
        fs = cfg.mappedFileSizeCommitLog
        ctl = store.ctl
        safe_end = min(ctl.get(C.POS_FLUSHED), ctl.get(C.POS_DISPATCHED))
        files = list_files(cfg.commitlog_dir)
        now = self.clock()
        doomed = []
        for start in files[:-1][:FILES_PER_PASS_MAX]:
            path = os.path.join(cfg.commitlog_dir, "%020d" % start)
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
        deleted = []
        for start in doomed:
            name = "%020d" % start
            try:
                os.unlink(os.path.join(cfg.commitlog_dir, name))
                deleted.append(name)
            except FileNotFoundError:
                pass
            if cfg.deleteCommitLogFilesInterval and start != doomed[-1]:
                time.sleep(cfg.deleteCommitLogFilesInterval / 1000)
        store.cl.release(below=new_min)
        self._clean_queues(new_min)
        if cfg.messageIndexEnable:
            from .index import delete_files_below
            gone = delete_files_below(cfg.storePathRootDir, new_min, cfg.maxHashSlotNum, cfg.maxIndexNum)
            if gone:
                log.info("retention deleted %d index file(s) %s", len(gone), gone)
        if store.dledger:
            self._clean_dledger_index(ctl.get(C.POS_DL_BEGIN_INDEX))
        log.info("retention deleted %d commitlog file(s) %s; min offset now %d", len(deleted), deleted, new_min)
        return deleted

    def _clean_dledger_index(self, begin_index: int) -> None:
        """DLedger index files wholly below the first retained entry's unit."""
        d, size = self.config.dledger_index_dir, self.config.mappedFileSizeForEntryIndex
        for start in list_files(d):
            if start + size <= begin_index * 32:
                try:
                    os.unlink(os.path.join(d, "%020d" % start))
                except FileNotFoundError:
                    pass

    def _clean_queues(self, min_phy: int) -> None:
        for topic, qid in self.store.cqs.on_disk():
            cq = self.store.cqs.get(topic, qid)
            cq.delete_files_below(min_phy)
            hi = cq.max_offset
            first = cq.first_entry_at_or_after(cq.min_offset, hi, min_phy)
            starts = cq.file_starts()
            if starts:
                first = max(first, starts[0] // 20)
            self.store.ctl.queue_advance(cq.slot, C.Q_CQ_MIN, min(first, hi))
