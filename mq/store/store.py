"""MessageStore: one store directory laid out like RocketMQ's, its recovery,
its roles, and the put/get API the broker uses.

    <storePathRootDir>/
        commitlog/00000000000000000000 ...   CommitLog files (mq.store.commitlog)
        consumequeue/<topic>/<queueId>/...   ConsumeQueues (mq.store.consumequeue)
        config/*.json                        metadata (mq.store.configfile)
        checkpoint                           flush/dispatch progress (mq.store.checkpoint)
        abort                                present while a broker runs
        lock                                 flock'd by the running owner

Two ways to hold a store:
  * the owner (`MessageStore.open`) takes the lock file, recovers, creates the
    control block and the abort file, and on `close` shuts down cleanly;
  * attachers (`MessageStore.attach`, io workers and role processes of the same
    broker) map the same files and the same control block.

Recovery decision table (RocketMQ's; every start validates, a clean one too):
  | abort file | what happens                                                            |
  | absent     | "clean" (the checkpoint's clean mark) or "normal": validate the last    |
  |            | three files that hold records, truncate at the first bad record         |
  | present    | "abnormal": validate from the checkpoint's file, truncate at the first  |
  |            | bad record, re-dispatch from there                                      |
Files cut short are extended first (the records before the cut are kept).  In every
case ConsumeQueue entries that point past the recovered end are cut, every queue is
checked against the CommitLog and config/consumequeues.json, and a queue that fails
(files gone, cut or wrong) is rebuilt from the whole CommitLog."""
from __future__ import annotations

import enum
import fcntl
import logging
import os
import shutil
import threading
import time
from time import perf_counter_ns
from dataclasses import dataclass, field

from mq.wire import commitlog as wcl
from mq.wire.dledger import INDEX_UNIT_SIZE
from mq.wire.errors import WireError

from . import control as C
from .checkpoint import Checkpoint
from .commitlog import CommitLog, list_files, SCAN_CLEAN_STOPS, SCAN_STOP_NAMES, AppendResult
from .config import StoreConfig
from .consumequeue import ConsumeQueueSet, ENTRY_SIZE, FILLER, read_manifest, write_manifest
from .dledgerfiles import clear_rebase, load_hard_state, load_rebase
from .legacy import LegacyLog, needs_switch, switch
from .dispatch import Dispatcher, Refusal, index_writer
from mq.files import fsync_dir
from mq.wire.filenames import offset_file_path
from .flush import FlushService
from .native import (StoreError, CorruptRecord, OutOfRange, MessageIllegal, TopicIllegal, PropertiesTooLong, StoreFatal,
                     NoSpace, MessageTooBig, NotLeader, lib)
from .notify import PositionWaiter

log = logging.getLogger("mq.store")

RECOVERY_SCAN_BATCH = 65536
# How far the read path looks for the record of a damaged ConsumeQueue entry: the CommitLog bytes
# between its neighbours' records, when they are at most this far apart (records of other queues
# lie between; a wider window is given up and the message skipped, as before)
ENTRY_SEARCH_BYTES_MAX = 64 << 20
ENTRY_SEARCH_BATCH = 1024
ENTRY_SEARCH_NEIGHBOURS = 64          # entries looked at on either side for one that names a record
DL_ENTRY_SIZE_MIN = lib.MQ_DL_HEADER_SIZE + lib.MQ_RECORD_SIZE_MIN   # the smallest DLedger entry
MISNAMED_CHUNK = 4096                 # ConsumeQueue entries a C call of recovery's misnamed check reads
TOTAL_PHYSICAL_MEMORY = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class Misnamed:
    """A ConsumeQueue entry (topic:queue_id at queue_offset) naming a whole record (phy, size)
    that says (topic, queue id, queue offset) `says`; the entry's own record, if it is not that
    one, lies in [after, before): after the record of the entry before, before that of the next."""
    topic: str
    queue_id: int
    queue_offset: int
    phy: int
    size: int
    says: tuple[str, int, int]
    after: int
    before: int


class PutStatus(enum.Enum):
    """RocketMQ's PutMessageStatus; the broker maps each to a response code."""
    PUT_OK = "PUT_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"
    SERVICE_NOT_AVAILABLE = "SERVICE_NOT_AVAILABLE"
    CREATE_MAPPED_FILE_FAILED = "CREATE_MAPPED_FILE_FAILED"
    MESSAGE_ILLEGAL = "MESSAGE_ILLEGAL"
    PROPERTIES_SIZE_EXCEEDED = "PROPERTIES_SIZE_EXCEEDED"
    UNKNOWN_ERROR = "UNKNOWN_ERROR"
    OS_PAGECACHE_BUSY = "OS_PAGECACHE_BUSY"      # DLedger: no quorum in time (RocketMQ's mapping)


@dataclass
class PutResult:
    status: PutStatus
    result: AppendResult | None = None
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.status is PutStatus.PUT_OK


@dataclass
class RecoveryReport:
    mode: str = "new"                 # new | clean | normal | abnormal
    start_offset: int = 0             # where validation began
    end_offset: int = 0               # the recovered write position
    records_validated: int = 0
    records_redispatched: int = 0
    dropped_bytes: int = 0            # bytes past the end that held data (estimate: to the file end)
    stop: str = ""                    # why validation stopped
    removed_files: list[str] = field(default_factory=list)
    cq_entries_truncated: int = 0
    repaired: list[str] = field(default_factory=list)   # one line per file repaired (also logged)
    queues_rebuilt: list[str] = field(default_factory=list)   # "topic:queueId" rebuilt from the CommitLog
    records_refused: int = 0          # records recovery's walks left out of every queue (damaged queue fields)
    seconds: float = 0.0


def put_error(e: StoreError) -> PutResult:
    if isinstance(e, (MessageIllegal, TopicIllegal, MessageTooBig)):
        return PutResult(PutStatus.MESSAGE_ILLEGAL, reason=str(e))
    if isinstance(e, PropertiesTooLong):
        return PutResult(PutStatus.PROPERTIES_SIZE_EXCEEDED, reason=str(e))
    if isinstance(e, (StoreFatal, NoSpace, NotLeader)):
        return PutResult(PutStatus.SERVICE_NOT_AVAILABLE, reason=str(e))
    return PutResult(PutStatus.UNKNOWN_ERROR, reason=str(e))


class MessageStore:
    def __init__(self, config: StoreConfig, store_host: str = "127.0.0.1", store_port: int = 10911):
        self.config = config
        self.root = config.storePathRootDir
        self.store_host = store_host
        self.store_port = store_port
        self.ctl: C.ControlBlock | None = None
        self.cl: CommitLog | None = None
        self.legacy: LegacyLog | None = None     # the old CommitLog of a store switched to DLedger
        self.entries_found = 0                    # records of damaged ConsumeQueue entries found (read_entry)
        self.cqs: ConsumeQueueSet | None = None
        self.checkpoint: Checkpoint | None = None
        self.owner = False
        self.recovery = RecoveryReport()
        self._lock_fd: int | None = None
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self.flush_waiter: PositionWaiter | None = None
        self.dispatch_waiter: PositionWaiter | None = None
        self.dispatcher: Dispatcher | None = None
        # records this start's recovery refused that dispatch has not reached (a DLedger member's, past
        # the commit it restored): the dispatch role applies them (Dispatcher.refuse_at)
        self.refusals_pending: dict[int, Refusal] = {}
        self.flusher: FlushService | None = None

    # ---- paths ---------------------------------------------------------------------
    @property
    def cq_root(self) -> str:
        return os.path.join(self.root, "consumequeue")

    @property
    def config_dir(self) -> str:
        return os.path.join(self.root, "config")

    @property
    def abort_path(self) -> str:
        return os.path.join(self.root, "abort")

    # ---- opening -------------------------------------------------------------------------
    @classmethod
    def open(cls, config: StoreConfig, store_host: str = "127.0.0.1", store_port: int = 10911,
             start_roles: bool = True, prepare_files: bool = True) -> "MessageStore":
        """Owner: lock, recover, start (roles as threads of this process unless
        start_roles is False, when the caller runs them as processes).
        prepare_files=False: this process appends rarely (a broker's supervisor);
        the processes that append keep the next file prepared."""
        s = cls(config, store_host, store_port)
        s._open_owner(prepare_files)
        if start_roles:
            s.start_role_threads()
        return s

    @classmethod
    def attach(cls, config: StoreConfig, store_host: str = "127.0.0.1", store_port: int = 10911,
               cq_writable: bool = False, prepare_files: bool = True) -> "MessageStore":
        """A process of a running store: same files, same control block."""
        s = cls(config, store_host, store_port)
        s.ctl = C.ControlBlock(s.root)
        s._open_handles(cq_writable)
        if prepare_files:
            s.cl.start_preparer()
        return s

    @property
    def dledger(self) -> bool:
        return self.config.enableDLegerCommitLog

    @property
    def visible_end_pos(self) -> int:
        """Which position ends what consumers may see: COMMITTED in DLedger mode, else WRITE."""
        return C.POS_COMMITTED if self.dledger else C.POS_WRITE

    def _open_handles(self, cq_writable: bool) -> None:
        cfg = self.config
        dl = {"dledger": True, "index_dir": cfg.dledger_index_dir,
              "index_file_size": cfg.mappedFileSizeForEntryIndex} if cfg.enableDLegerCommitLog else {}
        self.cl = CommitLog(cfg.commitlog_dir, self.ctl, cfg.mappedFileSizeCommitLog,
                            self.store_host, self.store_port, cfg.maxMessageSize,
                            touch_page_folios=cfg.flushDiskType == "SYNC_FLUSH", **dl)
        if cfg.enableDLegerCommitLog:
            self.legacy = (LegacyLog.create if self.owner else LegacyLog.attach)(cfg, self.store_host, self.store_port)
        self.cqs = ConsumeQueueSet(self.cq_root, cfg.cq_file_size, self.ctl, writable=cq_writable)
        self.checkpoint = Checkpoint(os.path.join(self.root, "checkpoint"))
        self.flush_waiter = PositionWaiter(self.ctl, C.SEQ_FLUSH, C.POS_FLUSHED)
        self.dispatch_waiter = PositionWaiter(self.ctl, C.SEQ_DISPATCH, C.POS_DISPATCHED)

    def _open_owner(self, prepare_files: bool = True) -> None:
        cfg = self.config
        cfg.check_dledger()
        if self.dledger and needs_switch(cfg):
            switch(cfg, self.store_host, self.store_port)     # a master/slave store switched (mq.store.legacy)
        dirs = [self.root, cfg.commitlog_dir, self.cq_root, self.config_dir]
        if self.dledger:
            dirs.append(cfg.dledger_index_dir)
        for d in dirs:
            os.makedirs(d, exist_ok=True)
        self._lock_fd = os.open(os.path.join(self.root, "lock"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            self._lock_fd = None
            raise StoreError(f"store {self.root} is in use by another process (lock file held)") from None
        self.owner = True
        try:
            self.ctl = C.ControlBlock(self.root, cfg.mappedFileSizeCommitLog, create=True)
            self._open_handles(cq_writable=True)
            self.dispatcher = Dispatcher(self.cl, self.cqs, cfg.delay_levels_ms, self.checkpoint,
                                         cfg.flushIntervalConsumeQueue, cfg.flushConsumeQueueThoroughInterval,
                                         committed_only=self.dledger,
                                         index=index_writer(cfg, self.checkpoint),
                                         rebase=self.finish_install if self.dledger else None)
            self.recovery = self._recover()
        except BaseException:
            self._release_handles()
            raise
        # running from here on: a crash from now leaves the abort file behind
        with open(self.abort_path, "w"):
            pass
        fsync_dir(self.root)
        self.checkpoint.clear_clean()
        # the current file from the write position on: touching the records before it would only
        # make the kernel write them again (a whole file at each restart)
        pos = self.cl.write_pos
        self.cl.prepare_file(pos // cfg.mappedFileSizeCommitLog, pos)
        if prepare_files:
            self.cl.start_preparer()

    # ---- recovery ---------------------------------------------------------------------------
    def _recover(self) -> RecoveryReport:
        t0 = time.monotonic()
        cfg = self.config
        fs = cfg.mappedFileSizeCommitLog
        rep = RecoveryReport()
        abort = os.path.exists(self.abort_path)
        install = self._pending_install() if self.dledger else None
        files = self._checked_files(rep)
        if not files:
            if self.cqs.on_disk():
                log.warning("no commitlog files: removing all consume queues")
                shutil.rmtree(self.cq_root)
                os.makedirs(self.cq_root)
            rep.mode = "new"
            write_manifest(self.config_dir, {})     # every queue from here on is born after it
            self._set_positions(0, 0, 0)
            if self.dledger:
                self._set_dledger_positions(0, 0, 0, 0)
            rep.seconds = time.monotonic() - t0
            return rep
        min_pos = files[0]
        self.ctl.set(C.POS_MIN, min_pos)
        clean_end = self.checkpoint.clean_end()

        # Every start validates, a clean one too (RocketMQ's recoverNormally re-checks the last
        # three files): a missing abort file proves the broker stopped cleanly, not that the
        # bytes are still what it wrote.  A clean stop is named in the report, nothing more.
        if abort:
            rep.mode = "abnormal"
            start = self._abnormal_start(files)
        else:
            rep.mode = "clean" if clean_end is not None else "normal"
            # the last three files; trailing files that hold no record (created ahead, or left
            # by an HA truncation) do not count, or three of them would put the start past the
            # real end and keep the zeros before it as data
            data = self._without_empty_tail(files)
            start = data[max(0, len(data) - 3)]
        rep.start_offset = start
        end, stop, last_ts = self._validate(start, rep)
        while self.dledger and end == start and start > min_pos:
            # nothing valid in the start file: the entry count must come from the file before
            start -= fs
            rep.start_offset = start
            end, stop, last_ts = self._validate(start, rep)
        self.ctl.set(C.POS_VALIDATED, start)
        if self.dledger and min_pos < start < end:
            min_pos = self._dledger_head(min_pos, start, rep)
        rep.stop = SCAN_STOP_NAMES.get(stop, str(stop))
        if stop != lib.MQ_SCAN_END and stop != lib.MQ_SCAN_LIMIT:
            rep.dropped_bytes = self._data_after(end, files)
            self.cl.zero_tail(end)
        elif rep.mode == "clean" and end != clean_end:
            log.warning("commitlog recovery: the clean stop recorded the end at %d, the files end at %d",
                        clean_end, end)
        end_file = end - end % fs
        for start_off in files:
            if start_off > end_file:
                self._remove_file(start_off, rep)
        self.cl.release(from_index=end // fs + 1)

        self._set_positions(end, min_pos, last_ts)
        if install is not None:
            self._rebase_queues(install[2])
            write_manifest(self.config_dir, self.queue_bounds())     # the queues start where the leader's do
        # the ConsumeQueues of a switched store reach into the old log (mq.store.legacy)
        lowest = min(min_pos, self.min_phy)
        # after a clean stop whose recorded end the files still reach, nothing lies past `end`: a
        # ConsumeQueue entry pointing there is damaged, not left by a crash or a cut
        redispatch_from, rebuild = self._recover_queues(end, lowest, rep,
                                                        whole_log=rep.mode == "clean" and end == clean_end)
        if rep.dropped_bytes:
            # one line that says exactly what the damage cost
            log.warning("commitlog recovery: the record at %d is damaged (%s): truncated there; %d bytes of data "
                        "after it dropped (to %d, %d later file(s) removed), %d ConsumeQueue entries cut "
                        "(messages consumers could see)", end, rep.stop, rep.dropped_bytes, end + rep.dropped_bytes,
                        len(rep.removed_files), rep.cq_entries_truncated)
        if self.dledger:
            self._recover_dledger(rep.start_offset, end, min_pos, redispatch_from)
        if rep.mode == "abnormal":
            redispatch_from = min(redispatch_from, rep.start_offset)
        redispatch_from = max(min_pos, min(redispatch_from, end))
        # records recovery's walks must not file anywhere: an entry names them, they say another queue
        # (read while the files of the queues to rebuild are still there)
        self.dispatcher.refuse_at = self._misfiled(rebuild, min_pos if rebuild else redispatch_from, min_pos, end)
        rebuild = self._drop_queues(rebuild, rep)
        t_rebuild = time.monotonic()
        walked = self._rebuild_old_queues(rebuild)
        walked += self._rebuild_queues(rebuild, min_pos, redispatch_from)
        self.ctl.set(C.POS_DISPATCHED, redispatch_from)
        n = self.dispatcher.dispatch_once(resync=True)
        # a DLedger member dispatches only what its group committed: the refusals past that are
        # applied when it commits them (by this store's dispatch role, or the one the broker starts)
        done = self.ctl.get(C.POS_DISPATCHED)
        self.refusals_pending = {phy: r for phy, r in self.dispatcher.refuse_at.items() if phy >= done}
        self.dispatcher.refuse_at = dict(self.refusals_pending)
        rep.records_redispatched = n
        rep.records_refused = self.dispatcher.records_refused
        self._rebuilt(rebuild, lowest, walked, t_rebuild)
        self._sync_next_offsets()
        write_manifest(self.config_dir, self.queue_bounds())
        self.dispatcher.flush_queues()
        if install is not None:
            clear_rebase(cfg.dledger_dir)
        if self.dispatcher.index is not None:
            self.dispatcher.index.close()       # the dispatch role writes it from here on
        rep.end_offset = end
        rep.seconds = time.monotonic() - t0
        log.info("store recovered (%s): end=%d validated=%d redispatched=%d in %.3fs",
                 rep.mode, end, rep.records_validated, n, rep.seconds)
        return rep

    # ---- DLedger install: a follower behind the leader's first entry (mq.dledger.log) --------------
    def queue_offsets_below(self, pos: int) -> list[tuple[str, int, int]]:
        """Leader: (topic, queueId, entries below CommitLog position `pos`) of every queue -- what
        an install at pos carries, so that the member installed there continues every queue's
        offsets, also those of queues with no message after pos.  Valid while DISPATCHED >= pos
        (true for the first retained file: retention deletes only dispatched files).  FILLER
        entries (phy 0) count as below: a leader that was itself installed answers right."""
        out = []
        for slot, topic, qid in self.ctl.queues():
            lo, hi = self.ctl.queue_get(slot, C.Q_CQ_MIN), self.ctl.queue_get(slot, C.Q_CQ_MAX)
            out.append((topic, qid, self.cqs.get(topic, qid).first_entry_at_or_after(lo, hi, pos)))
        return out

    def finish_install(self, begin_pos: int) -> bool:
        """Follower, once mq_dledger_install moved MIN to begin_pos (the dispatcher finds
        DISPATCHED below MIN): what lies below goes -- data files, DLedger index files, message
        index files -- and every ConsumeQueue restarts at the offset the leader's install named
        (a queue it did not name at 0: the leader holds none of it); then the manifest is
        written and the rebase file removed, last.  False (logged) when no install at begin_pos
        is pending: the queues are then left as they are."""
        cfg = self.config
        pending = load_rebase(cfg.dledger_dir)
        if pending is None or pending[1] != begin_pos:
            log.error("dispatch is below the first retained position %d, and no install there is pending "
                      "(found %s): dispatch goes on from there, the ConsumeQueues keep their entries",
                      begin_pos, pending and pending[:2])
            if pending is not None and pending[1] < begin_pos:
                clear_rebase(cfg.dledger_dir)     # an older install's, superseded (a newer one is not touched)
            return False
        begin_index, _, table = pending
        self._drop_below_install(begin_index, begin_pos)
        self._rebase_queues(table)
        write_manifest(self.config_dir, self.queue_bounds())
        clear_rebase(cfg.dledger_dir)
        log.warning("DLedger install finished: the log begins at entry %d (position %d); %d ConsumeQueue(s) "
                    "restarted at the leader's offsets", begin_index, begin_pos, len(table))
        return True

    def _pending_install(self) -> tuple[int, int, dict] | None:
        """Recovery: an install whose rebase file is still there.  Applied (the data file at
        beginPos holds entry beginIndex there): what lies below is deleted now and the queues
        are rebased before they are recovered; not applied (the crash came before the C call):
        the file goes and the old log recovers as it is (the leader installs again)."""
        cfg = self.config
        pending = load_rebase(cfg.dledger_dir)
        if pending is None:
            return None
        begin_index, begin_pos, _ = pending
        head = b""
        try:
            with open(offset_file_path(cfg.commitlog_dir, begin_pos), "rb") as f:
                head = f.read(32)
        except FileNotFoundError:
            pass
        if len(head) == 32 and int.from_bytes(head[:4], "big") == 1 and \
                int.from_bytes(head[8:16], "big") == begin_index and int.from_bytes(head[24:32], "big") == begin_pos:
            self._drop_below_install(begin_index, begin_pos)
            log.warning("recovery: finishing the DLedger install at entry %d (position %d)", begin_index, begin_pos)
            return pending
        log.warning("recovery: a DLedger install at entry %d (position %d) had not been applied: the log "
                    "recovers as it was", begin_index, begin_pos)
        clear_rebase(cfg.dledger_dir)
        return None

    def _drop_below_install(self, begin_index: int, begin_pos: int) -> None:
        cfg = self.config
        for start in list_files(cfg.commitlog_dir):
            if start < begin_pos:
                try:
                    os.unlink(offset_file_path(cfg.commitlog_dir, start))
                except FileNotFoundError:
                    pass                      # retention got there first
        if self.cl is not None:
            self.cl.release(below=begin_pos)
        isize = cfg.mappedFileSizeForEntryIndex
        for start in list_files(cfg.dledger_index_dir):
            if start + isize <= begin_index * INDEX_UNIT_SIZE:
                try:
                    os.unlink(offset_file_path(cfg.dledger_index_dir, start))
                except FileNotFoundError:
                    pass
        if cfg.messageIndexEnable:
            from .index import delete_files_below
            delete_files_below(cfg.storePathRootDir, begin_pos, cfg.maxHashSlotNum, cfg.maxIndexNum)

    def _rebase_queues(self, table: dict) -> None:
        queues = {(topic, qid) for _, topic, qid in self.ctl.queues()} | set(table) | set(self.cqs.on_disk())
        for topic, qid in sorted(queues):
            cq = self.cqs.get(topic, qid)
            off = table.get((topic, qid), 0)
            if cq.max_offset > off:
                log.error("DLedger install: ConsumeQueue %s:%d held %d entries, the leader counts %d below its "
                          "first entry; restarting it at %d", topic, qid, cq.max_offset, off, off)
            cq.rebase(off)

    def _checked_files(self, rep: RecoveryReport) -> list[int]:
        """The CommitLog's files, each of its full size.  A file cut short (a half-finished
        creation, or one truncated while the broker was stopped) is extended with zeros: the
        records before the cut stay, and validation stops where the zeros begin.  A file
        longer than mappedFileSizeCommitLog, or named off a file boundary, is refused: that is
        a configuration that changed, not damage."""
        fs = self.config.mappedFileSizeCommitLog
        files = list_files(self.config.commitlog_dir)
        for start in files:
            path = offset_file_path(self.config.commitlog_dir, start)
            size = os.path.getsize(path)
            if size > fs or start % fs:
                raise StoreError(f"commitlog file {path} has size {size}, expected {fs} "
                                 "(mappedFileSizeCommitLog changed?)")
            if size < fs:
                fd = os.open(path, os.O_RDWR)
                try:
                    os.posix_fallocate(fd, 0, fs)
                    os.fsync(fd)
                except OSError as e:
                    raise StoreError(f"commitlog file {path} is {size} bytes, cut short; extending it to {fs} "
                                     f"failed: {e}") from None
                finally:
                    os.close(fd)
                line = f"commitlog file {os.path.basename(path)} was {size} bytes, cut short: extended to {fs}"
                rep.repaired.append(line)
                log.warning("repaired: %s (the records before the cut are kept)", line)
        return files

    def _data_after(self, end: int, files: list[int]) -> int:
        """Bytes from `end` up to the last non-zero byte of the files (what a truncation at
        `end` drops), found from the end of each file backwards."""
        fs = self.config.mappedFileSizeCommitLog
        last = end
        for start in files:
            if start + fs <= end:
                continue
            path = offset_file_path(self.config.commitlog_dir, start)
            with open(path, "rb") as f:
                hi = fs
                lo = max(0, end - start)
                while hi > lo:                        # the last non-zero byte, 1 MiB at a time
                    at = max(lo, hi - (1 << 20))
                    f.seek(at)
                    chunk = f.read(hi - at).rstrip(b"\0")
                    if chunk:
                        last = max(last, start + at + len(chunk))
                        break
                    hi = at
        return last - end

    def _remove_file(self, start: int, rep: RecoveryReport) -> None:
        path = offset_file_path(self.config.commitlog_dir, start)
        try:
            os.unlink(path)
            rep.removed_files.append(os.path.basename(path))
        except FileNotFoundError:
            pass

    def _without_empty_tail(self, files: list[int]) -> list[int]:
        """`files` without the trailing ones that have no record at their start (all
        empty: appends fill files in order).  Keeps at least the first file."""
        fs = self.config.mappedFileSizeCommitLog
        sc = self.cl.scanner(1)
        n = len(files)
        while n > 1:
            _, _, stop = sc.scan(files[n - 1], files[n - 1] + fs, check_crc=False, resolve_slots=0)
            if stop != lib.MQ_SCAN_END:      # a record (or bytes that are not "nothing"): not empty
                break
            n -= 1
        return files[:n]

    def _abnormal_start(self, files: list[int]) -> int:
        """Newest file whose first record was stored at or before the checkpoint's min time."""
        min_ts = self.checkpoint.min_timestamp_ms()
        fs = self.config.mappedFileSizeCommitLog
        sc = self.cl.scanner(1)
        for start in reversed(files):
            # the limit must lie past the first record: one ending beyond it counts as torn
            n, _, _ = sc.scan(start, start + fs, check_crc=False, resolve_slots=0)
            if n and sc.recs[0].store_ts_ms != 0 and sc.recs[0].store_ts_ms <= min_ts:
                return start
        return files[0]

    def _validate(self, start: int, rep: RecoveryReport) -> tuple[int, int, int]:
        """Walks valid records from start; returns (end, stop kind, last store ts).
        DLedger mode: an entry whose term is above the member's saved current term is damage
        (MQ_SCAN_BAD_TERM) -- no checksum covers an entry's header, the scan checks that terms
        never go back, and a term damaged upwards in the last entries would make this member's
        log look newer than it is to every vote it asks for.  The role saves a term before it
        acknowledges or appends any entry of it (mq.dledger.role _after_step), so only entries
        a crash left unacknowledged can be cut that were not damaged."""
        sc = self.cl.scanner(RECOVERY_SCAN_BATCH)
        pos, last_ts = start, 0
        max_term = load_hard_state(self.config.dledger_dir)[0] if self.dledger else 0
        while True:
            n, nxt, stop = sc.scan(pos, 2 ** 63, check_crc=self.config.checkCRCOnRecover, resolve_slots=0)
            if max_term > 0 and n and sc.recs[n - 1].dl_term > max_term:
                # terms never go back within a scan: the first entry above the saved term ends it
                n = next(i for i in range(n) if sc.recs[i].dl_term > max_term)
                nxt, stop = sc.recs[n].dl_pos, lib.MQ_SCAN_BAD_TERM
                log.warning("DLedger recovery: the entry at %d has term %d, above the saved current term %d",
                            nxt, sc.recs[n].dl_term, max_term)
            rep.records_validated += n
            if n:
                last_ts = sc.recs[n - 1].store_ts_ms
            pos = nxt
            if stop != lib.MQ_SCAN_FULL:
                return pos, stop, last_ts

    def _dledger_head(self, min_pos: int, start: int, rep: RecoveryReport) -> int:
        """DLedger mode: where the log's first whole entry is, at or after min_pos.  Recovery
        validates the last files only, yet reads the first entry's index as the log's first
        (DL_BEGIN_INDEX) and rewrites index units from it.  An entry there that is not whole, or
        whose index cannot be (negative, or more entries before the validated entry at `start`
        than the bytes between can hold), is damage: the log's head moves to the next whole,
        possible entry (mq_commitlog_resync) -- its entries before it are given up as retention
        would give them up (a follower that needs them is installed by its leader), with one line.
        The validated entry at start is the last resort."""
        s_index = self.cl.dledger_entry_at(start)[0]
        at = min_pos
        while True:
            at = self.cl.resync(at, start)
            if at >= start:
                at = start
                break
            index = self.cl.dledger_entry_at(at)[0]
            if 0 <= index <= s_index and (s_index - index) * DL_ENTRY_SIZE_MIN <= start - at:
                break
            at += 1
        if at < start and self._dledger_index_damage(self.cl.dledger_entry_at(at)[0], s_index) is not None:
            # the index units below start are rewritten from the head (_recover_dledger), which needs
            # every entry from it to start whole: the head moves past the last damage before start
            at = self._whole_from(at, start)
        if at != min_pos:
            rep.repaired.append(f"DLedger log head damaged at {min_pos}: starts at {at}")
            log.warning("repaired: the DLedger log is damaged from %d (its first entry, or one before the validated "
                        "files while their index is rewritten): the log starts at the next entry from which it is "
                        "whole, at %d (index %d); the %d bytes before it are given up as retention would", min_pos,
                        at, self.cl.dledger_entry_at(at)[0], at - min_pos)
        return at

    def _whole_from(self, at: int, start: int) -> int:
        """The first entry at or after `at` from which every entry up to the validated one at
        `start` is whole (the scan with CRCs; past damage, the next whole entry: resync)."""
        scanner = self.cl.scanner(1024)
        pos = at
        while pos < start:
            _, nxt, stop = scanner.scan(pos, start, check_crc=True, resolve_slots=0)
            if nxt >= start:
                break
            if stop in SCAN_CLEAN_STOPS and stop != lib.MQ_SCAN_END and nxt > pos:
                pos = nxt                        # a full batch: go on
                continue
            at = pos = self.cl.resync(nxt + 1, start)
        return min(at, start)

    def _set_positions(self, end: int, min_pos: int, last_ts: int) -> None:
        for p, v in ((C.POS_WRITE, end), (C.POS_FLUSHED, end), (C.POS_MIN, min_pos),
                     (C.POS_LAST_STORE_TS, last_ts), (C.POS_FLUSHED_STORE_TS, last_ts),
                     (C.POS_DISPATCHED, end)):
            self.ctl.set(p, v)

    def _set_dledger_positions(self, next_index: int, end_term: int, begin_index: int, commit_next: int) -> None:
        for p, v in ((C.POS_DL_NEXT_INDEX, next_index), (C.POS_DL_END_TERM, end_term),
                     (C.POS_DL_BEGIN_INDEX, begin_index), (C.POS_DL_FLUSHED_INDEX, next_index),
                     (C.POS_DL_APPEND_TERM, 0), (C.POS_DL_COMMIT_INDEX, 0), (C.POS_COMMITTED, 0)):
            self.ctl.set(p, v)
        if commit_next:
            self.cl.dledger_set_commit(commit_next)

    def _recover_dledger(self, start: int, end: int, min_pos: int, dispatched_end: int) -> None:
        """DLedger mode after the data files were validated to `end`: the index files are
        rewritten from the validated entries, and what is known committed is restored -- the
        checkpoint's committedIndex, or what dispatch had reached (it never passes a commit),
        whichever is further, but never past the recovered end (an unflushed tail may be gone)."""
        from .dledgerfiles import load_checkpoint
        if start > min_pos and end > min_pos:
            # the units below `start` are trusted as they are: unless a file of them is gone or cut
            why = self._dledger_index_damage(self.cl.dledger_entry_at(min_pos)[0], self.cl.dledger_entry_at(start)[0])
            if why is not None:
                log.warning("repaired: the DLedger index %s: rewritten from the first data file", why)
                start = min_pos
        if end > start:
            # the rewrite makes a missing index file again, not one cut short: those go first
            first = self.cl.dledger_entry_at(start)[0]
            self._drop_cut_index_files(first, first + (end - start) // DL_ENTRY_SIZE_MIN + 1)
        next_index, end_term = self.cl.dledger_recover_index(start, end)
        begin = self.cl.dledger_entry_at(min_pos)[0] if end > min_pos else next_index
        self._set_dledger_positions(next_index, end_term, begin, 0)
        if end > min_pos:
            # the entries below the first one held are committed history (retention, an install)
            self.ctl.set(C.POS_COMMITTED, min_pos)
            self.ctl.set(C.POS_DL_COMMIT_INDEX, begin)
        _, ckpt_committed = load_checkpoint(self.config.dledger_dir)
        commit_next = ckpt_committed + 1
        if min_pos < dispatched_end <= end:
            # the entry that ends at dispatched_end: dispatch stopped on an entry boundary
            try:
                commit_next = max(commit_next, self.cl.dledger_index_ending_at(dispatched_end) + 1)
            except CorruptRecord as e:
                # the search met an index unit whose entry is damaged below the validated files (a
                # unit is checked against its entry on every read): the checkpoint's commit is kept,
                # lower but safe -- the group commits the rest again
                log.warning("DLedger recovery: the entry ending where dispatch stopped (%d) cannot be found (%s): "
                            "the commit restored is the checkpoint's, %d", dispatched_end, e, commit_next - 1)
        commit_next = max(begin, min(commit_next, next_index))
        if commit_next > begin:
            self.cl.dledger_set_commit(commit_next)
        self.cl.report_unit_repairs()
        log.info("DLedger log recovered: entries %d..%d (last term %d), committed up to %d",
                 begin, next_index - 1, end_term, commit_next - 1)

    def _index_files(self, first: int, upto: int):
        """(path, size or None when missing) of each DLedger index file holding units of entries
        [first, upto).  A file of the wrong size may be removed by the caller: recovery maps none
        before its rewrite."""
        ifs = self.config.mappedFileSizeForEntryIndex
        unit = INDEX_UNIT_SIZE
        for at in range(first * unit - first * unit % ifs, upto * unit, ifs):
            path = offset_file_path(self.config.dledger_index_dir, at)
            try:
                yield path, os.path.getsize(path)
            except FileNotFoundError:
                yield path, None

    def _dledger_index_damage(self, first: int, upto: int) -> str | None:
        """Why the DLedger index files holding the units of entries [first, upto) cannot be
        trusted (one missing or of the wrong size; a cut one is removed here, for the rewrite to
        make again), or None."""
        ifs = self.config.mappedFileSizeForEntryIndex
        for path, size in self._index_files(first, upto):
            if size is None:
                return f"file {os.path.basename(path)} is missing"
            if size != ifs:
                os.unlink(path)
                return f"file {os.path.basename(path)} has {size} bytes, not {ifs}"
        return None

    def _drop_cut_index_files(self, first: int, upto: int) -> None:
        """Removes the DLedger index files holding units of entries [first, upto) whose size is not
        the index file size (cut short), one line each, for the rewrite to make them again."""
        ifs = self.config.mappedFileSizeForEntryIndex
        for path, size in self._index_files(first, upto):
            if size is not None and size != ifs:
                os.unlink(path)
                log.warning("repaired: the DLedger index file %s has %d bytes, not %d: rewritten",
                            os.path.basename(path), size, ifs)

    def _recover_queues(self, end: int, min_pos: int, rep: RecoveryReport,
                        whole_log: bool = False) -> tuple[int, list]:
        """Loads every ConsumeQueue's bounds into the control block, cutting entries that
        point at or past `end` (whole_log: the log ends where a clean stop recorded it, so such
        an entry is damaged and its queue rebuilt instead), and checks each queue against the CommitLog (see
        ConsumeQueue.damage) and against the manifest of queues known at the last start, clean
        stop or retention pass (a queue whose files are gone, or that ends before or starts
        after where it did).  Returns (the lowest
        CommitLog offset from which dispatch must run so that every sound queue is complete,
        the queues to rebuild from the whole CommitLog, as (queue, why, lo, hi): _drop_queues
        removes their files)."""
        redispatch_from = end
        highest_indexed = min_pos
        known = read_manifest(self.config_dir)
        # the CommitLog can tell what a queue should hold: it has records, or it starts at 0 (nothing
        # was ever retired, so a queue it holds nothing of is empty at 0).  Not so when retention
        # took every record: then the queues' files are all that is left of their offsets
        can_rebuild = end > min_pos or min_pos == 0
        rebuild = []
        seen = set()
        for topic, qid in self.cqs.on_disk():
            seen.add((topic, qid))
            cq = self.cqs.get(topic, qid)
            lo, hi = cq.recover_bounds()
            # entries are in CommitLog order: binary search the first one at or past `end`
            cut = cq.tail_at_or_past(lo, hi, end)
            cut_here = cut < hi
            if cut_here and whole_log:
                rebuild.append((cq, f"entry {cut} points at or past the end {end} of a log stopped cleanly there",
                                lo, hi))
                continue
            if cut_here:
                # a crash, or damage that cut the log, leaves entries of records it took; a damaged
                # entry looks the same, unless the record of its offset is in the log after the
                # queue's last kept one (after a crash, re-dispatch from start_offset finds those
                # after it; before it, and after a clean stop up to the end, looked for here)
                after = cq.last_phy_end(cut)
                upto = rep.start_offset if rep.mode == "abnormal" else end
                if 0 < after < upto:
                    found = self._find_record(topic.encode(), qid, cut, after, upto)
                    if found is not None:
                        rebuild.append((cq, f"entry {cut} points at or past the end {end}, but its record is at "
                                            f"{found[0]}", lo, hi))
                        continue
            if cut_here:
                rep.cq_entries_truncated += hi - cut
                cq.truncate_from(cut)
                hi = cut
            why = cq.damage(lo, hi, min_pos, self._record_at)
            if why is None and known is not None and can_rebuild:
                # a queue the manifest does not know was born after it was written: it starts at 0
                was_lo, was_hi = known.get((topic, qid), (0, 0))
                if not cut_here and hi < was_hi:
                    # shorter than the manifest says: lost entries -- unless a truncated log took them
                    why = f"it ends at {hi}, it held {was_hi} at the last start or clean stop"
                elif was_lo is not None and lo > was_lo:
                    # its first files are gone: retention rewrites the manifest when it deletes any
                    why = f"it starts at {lo}, it started at {was_lo} at the last start, clean stop or retention"
            if why is not None:
                rebuild.append((cq, why, lo, hi))
                continue
            first_live = cq.first_entry_at_or_after(lo, hi, min_pos)
            self.ctl.queue_set(cq.slot, C.Q_CQ_MIN, first_live if first_live < hi else hi)
            self.ctl.queue_set(cq.slot, C.Q_CQ_MAX, hi)
            self.ctl.queue_set(cq.slot, C.Q_NEXT_OFFSET, hi)
            highest_indexed = max(highest_indexed, cq.last_phy_end(hi))
        for (topic, qid), (_, max_offset) in sorted((known or {}).items()):
            if (topic, qid) not in seen and max_offset > 0 and can_rebuild:
                rebuild.append((self.cqs.get(topic, qid), f"its files are gone (it held {max_offset} entries)", 0, 0))
        # dispatch resumes after the highest record any queue indexed (RocketMQ's
        # reputFromOffset); queues behind it get their entries from re-dispatch too
        # because dispatch writes each record at its own queue offset.
        return min(redispatch_from, highest_indexed), rebuild

    def _drop_queues(self, rebuild: list, rep: RecoveryReport) -> list:
        """Removes the files of the queues _recover_queues found untrusted and zeroes their
        bounds, one line each; returns the queues (rebuilt by recovery's walks)."""
        for cq, why, _, _ in rebuild:
            cq.remove_files()
            for field_ in (C.Q_CQ_MIN, C.Q_CQ_MAX, C.Q_NEXT_OFFSET):
                self.ctl.queue_set(cq.slot, field_, 0)
            line = f"{cq.topic}:{cq.queue_id}"
            rep.queues_rebuilt.append(line)
            log.warning("ConsumeQueue %s cannot be trusted (%s): rebuilding it from the CommitLog", line, why)
        return [cq for cq, *_ in rebuild]

    def _misnamed(self, cq, lo: int, hi: int, from_phy: int, end: int) -> list[Misnamed]:
        """The entries of cq in [lo, hi) that name a whole record at or past from_phy which says
        another queue or offset (one C call a chunk: CommitLog.misnamed)."""
        out = []
        topic = cq.topic.encode()
        q = lo
        while q < hi:
            entries = cq.get_raw_bytes(q, min(hi - q, MISNAMED_CHUNK))
            n = len(entries) // ENTRY_SIZE
            if n == 0:
                break
            at = self.cl.misnamed(entries, from_phy, cq.queue_id, q, topic)
            if at == n:
                q += n
                continue
            k = q + at
            phy, size, _ = cq.get_raw(k)
            says = self._record_at(phy, size)
            if says is not None:
                nxt = cq.get_raw(k + 1) if k + 1 < hi else None
                out.append(Misnamed(cq.topic, cq.queue_id, k, phy, size, says, cq.last_phy_end(k),
                                    nxt[0] if nxt and nxt != FILLER and nxt[0] > phy else end))
            q = k + 1
        return out

    def _misfiled(self, rebuild: list, from_phy: int, min_pos: int, end: int) -> dict[int, Refusal]:
        """The records recovery's walks (from from_phy) must leave out of every queue, with why.
        Dispatch writes an entry from its record's own fields, so a queue's entry naming a whole
        record that says another queue or offset proves one of the two damaged (no checksum covers
        either).  Dispatch's own check refuses such a record when the queue it names already has
        another record's entry at that offset; at that queue's end (its own record there cut by a
        crash, or its entry not yet flushed) nothing would stop it, and the damaged record would
        be served there.  It is the entry that is damaged, and the record left alone, when the
        queue the record names has it at that offset too (in its files as they are, the files of
        a queue to rebuild included), or when the entry's own record is found between its
        neighbours' (_find_record, up to ENTRY_SEARCH_BYTES_MAX); otherwise the record is
        refused.  Every entry at or past from_phy of every queue is checked, those of the queues
        to rebuild (rebuild: (queue, why, lo, hi), files not yet removed) from their first."""
        untrusted = {(cq.topic, cq.queue_id): (lo, hi) for cq, _, lo, hi in rebuild}
        queues = {}
        suspects = []
        for cq in self.cqs.opened():
            key = (cq.topic, cq.queue_id)
            queues[key] = cq
            if key in untrusted:
                lo, hi = untrusted[key]         # entries maybe out of order: all of them
            else:
                hi = self.ctl.queue_get(cq.slot, C.Q_CQ_MAX)
                lo = cq.first_entry_at_or_after(self.ctl.queue_get(cq.slot, C.Q_CQ_MIN), hi, from_phy)
            suspects += self._misnamed(cq, lo, hi, from_phy, end)
        refuse = {}
        for m in suspects:
            topic, qid, qoff = m.says
            other = queues.get((topic, qid))
            e = other.get_raw(qoff) if other is not None and qoff >= 0 else None
            if e is not None and e[:2] == (m.phy, m.size):
                continue                    # the record is where it says: the entry is damaged
            lo = max(m.after, min_pos)
            if self._find_record(m.topic.encode(), m.queue_id, m.queue_offset, lo, m.before) is not None:
                continue                    # the entry's own record is elsewhere: the entry is damaged
            why = f"{m.topic}:{m.queue_id}'s entry {m.queue_offset} names it, and its own record is not in " \
                  f"[{lo}, {m.before})"
            rec = wcl.parse_record(self.log_at(m.phy).view_raw(m.phy, m.size))
            refuse[m.phy] = Refusal(why, (m.size, rec.queue_id, rec.queue_offset, rec.store_timestamp_ms))
        return refuse

    def _record_at(self, phy: int, size: int) -> tuple[str, int, int] | None:
        """(topic, queueId, queue offset) of the record at phy, if a whole one of `size` starts there."""
        try:
            rec = wcl.parse_record(self.log_at(phy).view_raw(phy, size))
        except (StoreError, WireError):
            return None
        if rec.physical_offset != phy:
            return None
        return rec.topic, rec.queue_id, rec.queue_offset

    def _rebuild_queues(self, queues: list, min_pos: int, up_to: int) -> int:
        """Entries of `queues` (files removed) for every record in [min_pos, up_to): one
        dispatch walk over that range without the message index (built there already);
        dispatch is idempotent, so the other queues' entries are rewritten as they were.
        Recovery's own dispatch from up_to does the rest.  Returns the records walked."""
        if not queues or up_to <= min_pos:
            return 0
        index, self.dispatcher.index = self.dispatcher.index, None
        try:
            self.ctl.set(C.POS_DISPATCHED, min_pos)
            return self.dispatcher.dispatch_once(limit=up_to, resync=True)
        finally:
            self.dispatcher.index = index

    def _rebuild_old_queues(self, queues: list) -> int:
        """A switched store (mq.store.legacy): the entries of `queues` for the old log's records,
        before the DLedger part is walked.  The walk runs on the old log's own control block, so
        its queue slots and CQ_MAX are that block's: each rebuilt queue's bounds are then read
        back from its files into this store's block.  Returns the records walked."""
        lg = self.legacy
        if not queues or lg is None or lg.min_pos >= lg.end:
            return 0
        cfg = self.config
        cqs = ConsumeQueueSet(self.cq_root, cfg.cq_file_size, lg.ctl, writable=True)
        try:
            # the other queues' entries are written again as they are (dispatch is idempotent)
            walker = Dispatcher(lg.cl, cqs, cfg.delay_levels_ms)
            lg.ctl.set(C.POS_DISPATCHED, lg.min_pos)
            walked = walker.dispatch_once(limit=lg.end)
            cqs.sync()
        finally:
            cqs.close()
        for cq in queues:
            _, hi = cq.recover_bounds()
            for field_ in (C.Q_CQ_MAX, C.Q_NEXT_OFFSET):
                self.ctl.queue_set(cq.slot, field_, hi)
        return walked

    def _rebuilt(self, queues: list, min_pos: int, walked: int, t0: float) -> None:
        """After recovery's dispatch: the rebuilt queues' first live entries, and one line."""
        if not queues:
            return
        for cq in queues:
            lo, hi = cq.recover_bounds()
            first_live = cq.first_entry_at_or_after(lo, hi, min_pos)
            self.ctl.queue_set(cq.slot, C.Q_CQ_MIN, first_live if first_live < hi else hi)
        log.warning("rebuilt %d ConsumeQueue(s) from the CommitLog (%d more records walked) in %.3f s: %s",
                    len(queues), walked, time.monotonic() - t0,
                    ", ".join(f"{cq.topic}:{cq.queue_id} ({cq.max_offset} entries)" for cq in queues))

    def queue_bounds(self) -> dict[tuple[str, int], tuple[int, int]]:
        """Every queue the control block knows, with its ConsumeQueue's (min, max) offsets."""
        return {(topic, qid): (self.ctl.queue_get(slot, C.Q_CQ_MIN), self.ctl.queue_get(slot, C.Q_CQ_MAX))
                for slot, topic, qid in self.ctl.queues()}

    def _sync_next_offsets(self) -> None:
        """After dispatch: the next queue offset of each queue follows its CQ."""
        for cq in self.cqs.opened():
            m = self.ctl.queue_get(cq.slot, C.Q_CQ_MAX)
            self.ctl.queue_advance(cq.slot, C.Q_NEXT_OFFSET, m)

    # ---- roles -------------------------------------------------------------------------------
    def start_role_threads(self) -> None:
        """Runs flush and dispatch as threads of this process (tests, tools,
        a single-process broker).  The broker runs them as processes instead."""
        assert self.owner
        self.flusher = FlushService(self.cl, self.config, self.checkpoint)
        for name, target in (("flush", self.flusher.run), ("dispatch", self.dispatcher.run)):
            t = threading.Thread(target=target, args=(self._stop,), name=f"role-{name}", daemon=True)
            t.start()
            self._threads.append(t)

    # ---- put -----------------------------------------------------------------------------------
    def _wait_kind(self, properties: bytes) -> bool:
        """WAIT=false in the properties means: do not wait for flush/replication."""
        return b"WAIT\x01false" not in properties

    def put(self, topic: str, queue_id: int, body: bytes, properties: bytes = b"", **kw) -> PutResult:
        """Appends one message; under SYNC_FLUSH waits (blocking) for the flush."""
        try:
            res = self.cl.append(topic, queue_id, body, properties, **kw)
        except StoreError as e:
            return put_error(e)
        return self._after_put(res, self._wait_kind(properties))

    def put_batch(self, topic: str, queue_id: int, batch_body: bytes, **kw) -> PutResult:
        try:
            res = self.cl.append_batch(topic, queue_id, batch_body, **kw)
        except StoreError as e:
            return put_error(e)
        return self._after_put(res, True)

    def _waits_for_flush(self, wait: bool) -> bool:
        """Does an append's outcome wait for its flush?  Under SYNC_FLUSH, unless the message said
        WAIT=false; never in DLedger mode, where the commit decides (under SYNC_FLUSH a member
        counts itself only up to its flushed entries)."""
        return wait and self.config.flushDiskType == "SYNC_FLUSH" and not self.dledger

    def _flush_timed_out(self, res: AppendResult) -> PutResult:
        return PutResult(PutStatus.FLUSH_DISK_TIMEOUT, res, self.ctl.fatal() or "flush timed out")

    def _after_put(self, res: AppendResult, wait: bool) -> PutResult:
        """durable(), blocking (put and put_batch: tests and tools)."""
        if self._waits_for_flush(wait) and not self.flush_waiter.wait(res.end_offset,
                                                                       self.config.syncFlushTimeout / 1000):
            return self._flush_timed_out(res)
        return PutResult(PutStatus.PUT_OK, res)

    async def put_async(self, topic: str, queue_id: int, body: bytes, properties: bytes = b"", *,
                        wait: bool | None = None, trace=None, **kw) -> PutResult:
        """Like put, but waits for the flush without blocking the event loop.
        `wait` overrides the WAIT property (the broker strips WAIT before storing).
        `trace` (perf tracing, mq.broker.tracing.RequestTimes) gets store_ns and
        appended_ns (perf_counter_ns) around the append and msgs; the flush wait
        ends when this returns."""
        if trace is not None:
            trace.store_ns = perf_counter_ns()
        try:
            res = self.cl.append(topic, queue_id, body, properties, **kw)
        except StoreError as e:
            return put_error(e)
        if trace is not None:
            trace.appended_ns = perf_counter_ns()
            trace.msgs = 1
        return await self.durable(res, self._wait_kind(properties) if wait is None else wait)

    async def put_batch_async(self, topic: str, queue_id: int, batch_body: bytes, *, trace=None,
                              **kw) -> PutResult:
        """One batch in one append; `trace` as for put_async."""
        if trace is not None:
            trace.store_ns = perf_counter_ns()
        try:
            res = self.cl.append_batch(topic, queue_id, batch_body, **kw)
        except StoreError as e:
            return put_error(e)
        if trace is not None:
            trace.appended_ns = perf_counter_ns()
            trace.msgs = res.count
        return await self.durable(res, True)

    async def durable(self, res: AppendResult, wait: bool = True) -> PutResult:
        """The store's part of an append's outcome (the broker's settle() adds replication or
        the commit): once the flush passed its end when the outcome waits for it
        (_waits_for_flush), FLUSH_DISK_TIMEOUT after syncFlushTimeout (with the sticky error as
        the reason when there is one); PUT_OK at once otherwise.  Without blocking the loop."""
        if self._waits_for_flush(wait) and not await self.flush_waiter.wait_async(
                res.end_offset, self.config.syncFlushTimeout / 1000):
            return self._flush_timed_out(res)
        return PutResult(PutStatus.PUT_OK, res)

    # ---- get -----------------------------------------------------------------------------------
    def log_at(self, phy: int) -> CommitLog:
        """The CommitLog holding offset `phy`: the old one below the dividing offset of a store
        switched to DLedger (mq.store.legacy), else this store's."""
        lg = self.legacy
        return lg.cl if lg is not None and phy < lg.end else self.cl

    def read_record(self, phy: int, size: int | None = None, queue_id: int = -1, queue_offset: int = -1,
                    topic: bytes | None = None) -> memoryview:
        """CommitLog.read_record on the log holding `phy` (checked whole in C either way)."""
        return self.log_at(phy).read_record(phy, size, queue_id, queue_offset, topic)

    def read_filed(self, phy: int) -> memoryview:
        """read_record(phy) for a reader that holds an offset, not a queue position (the message
        index, an offset msgId, send-back, END_TRANSACTION): the record is served only if its
        own queue serves it too -- what the read path gives for the queue and offset its
        TOPIC/QUEUEID/QUEUEOFFSET name (read_entry, the damaged-entry search included) is this
        record.  No checksum covers those fields: a record whose QUEUEOFFSET or QUEUEID changed on
        the disk passes read_record's checks, and the message index keeps the keys it had before
        (recovery leaves such a record out of every queue, and a pull never serves it).
        Not judged, served as read_record reads them: a record dispatch has not reached yet (its
        entry is still to come), a prepared or rolled-back transaction message (no queue by
        design), and one whose queue offset is below its queue's first entry (retention took
        the entry).  Raises CorruptRecord when the record is not where its fields file it."""
        view = self.read_record(phy)
        if phy >= self.ctl.get(C.POS_DISPATCHED):
            return view
        rec = wcl.parse_record(view)
        if rec.sys_flag & wcl.TRANSACTION_MASK in (wcl.TRANSACTION_PREPARED, wcl.TRANSACTION_ROLLBACK):
            return view
        cq = self.cqs.get(rec.topic, rec.queue_id)
        if cq.slot is not None and rec.queue_offset < cq.min_offset:
            return view
        served = None
        entry = cq.entry(rec.queue_offset)
        if entry is not None:
            if entry[:2] == (phy, len(view)):
                return view
            try:
                served = self.read_entry(cq, rec.queue_offset, entry[0], entry[1], rec.topic.encode())
            except (CorruptRecord, OutOfRange):
                pass
            if served is not None and \
                    int.from_bytes(served[wcl.POS_PHYSICAL_OFFSET:wcl.POS_PHYSICAL_OFFSET + 8], "big") == phy:
                return view
        raise CorruptRecord(f"the record at {phy} says {rec.topic}:{rec.queue_id} queue offset {rec.queue_offset}, "
                            f"where that queue serves " + ("no record" if served is None else "another record")
                            + " (its queue fields were damaged)")

    @property
    def min_phy(self) -> int:
        """The lowest CommitLog offset still held: the old log's first, while it has one."""
        lg = self.legacy
        if lg is not None:
            lo = lg.min_pos
            if lo < lg.end:
                return lo
        return self.cl.min_pos

    def read_entry(self, cq, queue_offset: int, phy: int, size: int, topic: bytes) -> memoryview:
        """The record ConsumeQueue entry `queue_offset` of cq names, checked whole (read_record).
        When it names no whole record of this queue and offset there, the entry itself may be
        the damaged part (no checksum covers it): the record is looked for in the CommitLog
        between the records its neighbours name (find_entry_record) and served if it is found
        and whole.  Raises CorruptRecord (the record is damaged, or not found) or OutOfRange
        (the bytes are gone: retention, or the gap before a switched store's DLedger log)."""
        if (phy, size) == FILLER[:2]:
            raise OutOfRange(f"queue offset {queue_offset} of {cq.topic}:{cq.queue_id} is a hole")
        try:
            return self.read_record(phy, size, cq.queue_id, queue_offset, topic)
        except CorruptRecord:
            found = self.find_entry_record(cq, queue_offset, topic)
            if found is None:
                raise
            return found
        except OutOfRange:
            if self.legacy is not None or phy < self.min_phy:
                raise
            found = self.find_entry_record(cq, queue_offset, topic)
            if found is None:
                raise CorruptRecord(f"the ConsumeQueue entry {cq.topic}:{cq.queue_id} {queue_offset} ({phy}, "
                                    f"{size}) names no record, and none was found near it") from None
            return found

    def find_entry_record(self, cq, queue_offset: int, topic: bytes) -> memoryview | None:
        """The whole record of cq at queue_offset, found by a walk of the CommitLog between the
        records the nearest entries on either side name (up to ENTRY_SEARCH_NEIGHBOURS away, so
        a damaged run of entries is crossed; _find_record), served only if whole; or None.  Not
        with a switched store's old log."""
        if self.legacy is not None:
            return None

        def names_record(e) -> bool:
            return e is not None and lib.MQ_RECORD_SIZE_MIN <= e[1] != FILLER[1]
        lo = hi = None
        for k in range(queue_offset - 1, max(cq.min_offset, queue_offset - ENTRY_SEARCH_NEIGHBOURS) - 1, -1):
            e = cq.get_raw(k)
            if names_record(e):
                lo = e[0] + e[1]
                break
        for k in range(queue_offset + 1, min(cq.max_offset, queue_offset + 1 + ENTRY_SEARCH_NEIGHBOURS)):
            e = cq.get_raw(k)
            if names_record(e) and (lo is None or e[0] >= lo):
                hi = e[0]
                break
        end = self.cl.write_pos
        if hi is None:
            hi = end if lo is None else min(end, lo + ENTRY_SEARCH_BYTES_MAX)
        if lo is None:
            lo = hi - ENTRY_SEARCH_BYTES_MAX
        found = self._find_record(topic, cq.queue_id, queue_offset, lo, hi)
        if found is None:
            return None
        try:
            view = self.read_record(found[0], found[1], cq.queue_id, queue_offset, topic)
        except (CorruptRecord, OutOfRange):
            return None           # its record is damaged too
        self.entries_found += 1
        log.warning("ConsumeQueue %s:%d entry %d is damaged: its record was found at %d (%d bytes) and served",
                    cq.topic, cq.queue_id, queue_offset, found[0], found[1])
        return view

    def _find_record(self, topic: bytes, queue_id: int, queue_offset: int, lo: int, hi: int) -> tuple[int, int] | None:
        """(position, size) of the record of topic:queue_id at queue_offset in the CommitLog's
        [lo, hi) (walked from the first whole record at or after lo; at most
        ENTRY_SEARCH_BYTES_MAX, not checked for CRC), or None."""
        lo, hi = max(lo, self.cl.min_pos), min(hi, self.cl.write_pos)
        if not lo < hi or hi - lo > ENTRY_SEARCH_BYTES_MAX:
            return None
        scanner = self.cl.scanner(ENTRY_SEARCH_BATCH)
        pos = self.cl.resync(lo, hi)
        while pos < hi:
            n, after, stop = scanner.scan(pos, hi, check_crc=False, resolve_slots=0)
            for r in scanner.recs[0:n]:
                if r.queue_id == queue_id and r.queue_offset == queue_offset and \
                        bytes(self.cl.view_raw(r.phy_offset + r.topic_offset, r.topic_len)) == topic:
                    return r.phy_offset, r.size
            if stop in (lib.MQ_SCAN_LIMIT, lib.MQ_SCAN_FULL) and after > pos:
                pos = after
            else:                                   # damage (or a hole) on the way: past it
                pos = self.cl.resync(max(after, pos) + 1, hi)
        return None

    def max_offset(self, topic: str, queue_id: int) -> int:
        return self.cqs.get(topic, queue_id).max_offset

    def min_offset(self, topic: str, queue_id: int) -> int:
        return self.cqs.get(topic, queue_id).min_offset

    def get_messages(self, topic: str, queue_id: int, queue_offset: int, max_count: int) -> list[tuple[int, memoryview]]:
        """(queue offset, zero-copy record view) for up to max_count messages; a record that fails
        its check (damaged since it was written) is left out and logged."""
        cq = self.cqs.get(topic, queue_id)
        out = []
        topic_bytes = topic.encode()
        min_phy = self.min_phy
        for i, (phy, size, _tags) in enumerate(cq.get(queue_offset, max_count)):
            if phy < min_phy:
                continue
            try:
                out.append((queue_offset + i, self.read_entry(cq, queue_offset + i, phy, size, topic_bytes)))
            except OutOfRange:
                continue         # deleted (between an old log and a DLedger log that starts later)
            except CorruptRecord:
                log.error("damaged record skipped: %s:%d queue offset %d at %d", topic, queue_id, queue_offset + i,
                          phy)
        return out

    def wait_dispatched(self, timeout_s: float = 10.0) -> bool:
        """Blocks until everything written so far is in the ConsumeQueues."""
        return self.dispatch_waiter.wait(self.ctl.get(self.visible_end_pos), timeout_s)

    def search_offset_by_time(self, topic: str, queue_id: int, ts_ms: int) -> int:
        """RocketMQ's getOffsetInQueueByTime: the first message stored exactly at
        ts_ms, else the closer (in time) of the two messages around it; the last
        message when all are older, the first when all are newer, 0 when empty."""
        cq = self.cqs.get(topic, queue_id)
        first, end = cq.min_offset, cq.max_offset
        if first >= end:
            return 0

        def ts_of(q: int) -> int | None:
            e = cq.get_raw(q)
            return self._store_ts_at(e[0]) if e else None

        lo, hi = first, end
        while lo < hi:
            mid = (lo + hi) // 2
            ts = ts_of(mid)
            if ts is None or ts < ts_ms:
                lo = mid + 1
            else:
                hi = mid
        if lo == end:
            return end - 1
        right = ts_of(lo)
        if right == ts_ms or lo == first:
            return lo
        left = ts_of(lo - 1)
        return lo - 1 if left is not None and right is not None and ts_ms - left <= right - ts_ms else lo

    def in_memory(self, phy_offset: int, ratio_percent: int) -> bool:
        """RocketMQ's checkInDiskByCommitOffset, inverted: is the message at
        phy_offset within the newest ratio% of physical RAM of the log?"""
        return self.cl.write_pos - phy_offset <= TOTAL_PHYSICAL_MEMORY * ratio_percent // 100

    def _store_ts_at(self, phy: int) -> int | None:
        try:
            head = self.log_at(phy).view(phy, 64)
        except StoreError:
            return None
        born_len = 20 if int.from_bytes(head[36:40], "big") & 0x10 else 8
        return int.from_bytes(head[48 + born_len:56 + born_len], "big")

    # ---- closing -----------------------------------------------------------------------------
    def close(self) -> None:
        """Owner: clean shutdown (stop roles, flush, dispatch, checkpoint, remove
        abort).  Attacher: drop handles."""
        self._stop.set()
        self.ctl.wake(C.SEQ_WRITE)
        for t in self._threads:
            t.join()
        self._threads.clear()
        for w in (self.flush_waiter, self.dispatch_waiter):
            if w:
                w.close()
        if self.owner:
            healthy = self.ctl.fatal() is None
            if healthy:
                try:
                    self.cl.flush(0)
                except StoreError as e:
                    healthy = False
                    log.error("final flush failed: %s", e)
            self.dispatcher.dispatch_once()
            self.dispatcher.flush_queues()
            if self.dispatcher.index is not None:
                self.dispatcher.index.close()
            write_manifest(self.config_dir, self.queue_bounds())
            self.checkpoint.physic_ts_ms = self.ctl.get(C.POS_FLUSHED_STORE_TS)
            if healthy and self.ctl.get(C.POS_DISPATCHED) >= self.ctl.get(self.visible_end_pos):
                self.checkpoint.mark_clean(self.ctl.get(C.POS_WRITE))
                try:
                    os.unlink(self.abort_path)
                except FileNotFoundError:
                    pass
                fsync_dir(self.root)
            else:
                log.error("store not closed cleanly (fatal=%s); the next start recovers abnormally",
                          self.ctl.fatal())
        self._release_handles()

    def _release_handles(self) -> None:
        self.dispatcher = None   # holds a scanner array into the CommitLog handle
        for h in (self.cqs, self.cl, self.legacy, self.checkpoint, self.ctl):
            if h is not None:
                h.close()
        self.legacy = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None


__all__ = ["MessageStore", "PutStatus", "PutResult", "RecoveryReport", "ENTRY_SIZE", "put_error"]
