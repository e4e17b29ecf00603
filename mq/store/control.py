"""The control block: the store's shared state in multiprocessing.shared_memory.

The C module owns its layout (mq_ctl in csrc/internal.h; contract in csrc/ctl.h);
Python only creates, attaches and reads it through the C functions.  One control block per store
root, named after the root's real path, so every process of a broker (and a
tool) finds it from the path alone.

The owner (the process that recovered the store) creates the segment with
`SharedMemory(create=True)`; every role process, and any other process that
reads a live store, attaches with `SharedMemory(name)`.

Python 3.11's resource tracker and us.  Every SharedMemory() -- create or
attach -- registers the name with the process's resource tracker, which
unlinks every name still registered when the last process using that tracker
exits.  Left alone, that would let a tool attaching to a live broker unlink
the broker's block when the tool exits, and would let the tracker of a
crashed broker unlink the block a restarted broker just created under the
same name.  So no tracker keeps the name: each create or attach unregisters
it at once (the segment's life is ours: the owner unlinks it on a clean
close, and the next owner replaces the stale segment of a crashed one).
Processes of one broker share one tracker, whose books are a set: two
attaches interleaving as register, register, unregister, unregister would
make it print a KeyError.  Each register/unregister pair is therefore done
under an flock on `<root>/ctl.lock`.

Who is alive.  Every process that creates or attaches a segment holds a shared
flock on it for as long as its handle is open, so a segment no process holds
belongs to a dead broker (kill -9 skips the owner's unlink): `sweep_dead_segments`
takes each `mq-*` segment's lock exclusively without waiting and removes those
it gets -- no pid is read, so pid reuse cannot fool it.  mqbroker sweeps at every
start, whatever its store.  Creation and the sweep serialise on one host-wide
lock file in /dev/shm, so a segment is never swept between its creation and its
creator's flock.  Named limit: a broker of a build older than this lock holds
no flock, and a sweep would take its live segments."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
from multiprocessing import resource_tracker
from multiprocessing.shared_memory import SharedMemory

from .native import BadControlBlock, ffi, lib, check

POS_WRITE = lib.MQ_POS_WRITE
POS_FLUSHED = lib.MQ_POS_FLUSHED
POS_DISPATCHED = lib.MQ_POS_DISPATCHED
POS_ACKED = lib.MQ_POS_ACKED
POS_MIN = lib.MQ_POS_MIN
POS_LAST_STORE_TS = lib.MQ_POS_LAST_STORE_TS
POS_FLUSHED_STORE_TS = lib.MQ_POS_FLUSHED_STORE_TS
POS_CONFIRM = lib.MQ_POS_CONFIRM
POS_MSGS = lib.MQ_POS_MSGS            # messages appended since the block was made (a statistic)
# DLedger mode (csrc/ctl.h, csrc/dledger.h)
POS_COMMITTED = lib.MQ_POS_COMMITTED
POS_DL_NEXT_INDEX = lib.MQ_POS_DL_NEXT_INDEX
POS_DL_END_TERM = lib.MQ_POS_DL_END_TERM
POS_DL_APPEND_TERM = lib.MQ_POS_DL_APPEND_TERM
POS_DL_COMMIT_INDEX = lib.MQ_POS_DL_COMMIT_INDEX
POS_DL_FLUSHED_INDEX = lib.MQ_POS_DL_FLUSHED_INDEX
POS_DL_BEGIN_INDEX = lib.MQ_POS_DL_BEGIN_INDEX
# master/slave: writes wait for a slave's give-back until this time.monotonic() ms (mq.ha.master)
POS_HA_TAKE_BACK_UNTIL = lib.MQ_POS_HA_TAKE_BACK_UNTIL
# 0, or the disk shares of a store over diskSpaceWarningLevelRatio: sends refused (mq.store.retention)
POS_DISK_FULL = lib.MQ_POS_DISK_FULL
# master/slave: slaves connected to the HA port now (mq.ha.master); isSlaveOK reads it live
POS_HA_SLAVES = lib.MQ_POS_HA_SLAVES
POS_VALIDATED = lib.MQ_POS_VALIDATED    # recovery's start_offset: dispatch below it goes past damage

SEQ_WRITE = lib.MQ_SEQ_WRITE
SEQ_FLUSH = lib.MQ_SEQ_FLUSH
SEQ_DISPATCH = lib.MQ_SEQ_DISPATCH
SEQ_ACK = lib.MQ_SEQ_ACK
SEQ_COMMIT = lib.MQ_SEQ_COMMIT
SEQ_ROLE = lib.MQ_SEQ_ROLE

Q_NEXT_OFFSET = lib.MQ_Q_NEXT_OFFSET
Q_CQ_MAX = lib.MQ_Q_CQ_MAX
Q_CQ_MIN = lib.MQ_Q_CQ_MIN


def segment_name(store_root: str) -> str:
    digest = hashlib.sha1(os.path.realpath(store_root).encode()).hexdigest()[:20]
    return f"mq-{digest}"


LOCK_FILE = "ctl.lock"
_RTYPE = "shared_memory"
SHM_DIR = "/dev/shm"
HOST_LOCK_FILE = os.path.join(SHM_DIR, "mq.segments.lock")   # not "mq-*": never taken for a segment
_SEGMENT_NAME = re.compile(r"mq-[0-9a-f]{20}(-[a-z]+)?")      # segment_name(), and with a suffix (stats)


@contextlib.contextmanager
def _host_lock():
    """Serialises segment creation with sweep_dead_segments() across the host."""
    fd = os.open(HOST_LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)          # drops the flock


def _hold(shm: SharedMemory) -> SharedMemory:
    """This process uses `shm`: a shared flock on its descriptor, dropped when the handle closes
    (SharedMemory.close closes it) or the process dies."""
    fcntl.flock(shm._fd, fcntl.LOCK_SH)
    return shm


def segment_in_use(name: str) -> bool:
    """Whether a live process holds segment `name` (False when there is none)."""
    try:
        fd = os.open(os.path.join(SHM_DIR, name), os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)          # drops our probe's lock, if we got it
    return False


def sweep_dead_segments() -> list[str]:
    """Removes every mq-* segment that no live process holds (see the module docstring);
    returns their names."""
    removed = []
    with _host_lock():
        try:
            names = sorted(os.listdir(SHM_DIR))
        except FileNotFoundError:
            return removed
        for name in names:
            if not _SEGMENT_NAME.fullmatch(name):
                continue
            path = os.path.join(SHM_DIR, name)
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue                      # held: its owner (or an attached process) lives
            else:
                os.unlink(path)               # shm_unlink of a POSIX segment, on Linux
                removed.append(name)
            finally:
                os.close(fd)
    return removed


@contextlib.contextmanager
def _tracker_lock(store_root: str):
    """Serialises register/unregister pairs of the processes sharing one resource tracker."""
    fd = os.open(os.path.join(store_root, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)          # drops the flock


def _untracked(name: str, create: bool = False, size: int = 0) -> SharedMemory:
    """SharedMemory with no resource tracker keeping its name (see the module docstring).
    Call under _tracker_lock."""
    shm = SharedMemory(name, create=create, size=size)
    resource_tracker.unregister(_tracked_name(shm), _RTYPE)
    return shm


def _tracked_name(shm: SharedMemory) -> str:
    """The name as SharedMemory registers it: with the leading slash that .name drops."""
    return "/" + shm.name


def _unlink(shm: SharedMemory) -> None:
    """SharedMemory.unlink() unregisters too; the name is not registered (we never keep it),
    so register it first to keep the tracker's books balanced.  Call under _tracker_lock."""
    resource_tracker.register(_tracked_name(shm), _RTYPE)
    shm.unlink()


def open_segment(store_root: str, name: str, create: bool, size: int = 0) -> SharedMemory:
    """A segment of this store, untracked (see the module docstring): create=True makes a fresh
    one of `size` bytes, replacing the stale segment a crashed owner left under that name;
    otherwise attaches (FileNotFoundError when there is none)."""
    if not create:
        with _tracker_lock(store_root):
            return _hold(_untracked(name))
    with _host_lock(), _tracker_lock(store_root):
        try:
            return _hold(_untracked(name, create=True, size=size))
        except FileExistsError:
            stale = _untracked(name)
            stale.close()
            _unlink(stale)
            return _hold(_untracked(name, create=True, size=size))


def close_segment(store_root: str, shm: SharedMemory, unlink: bool) -> None:
    """Unmaps a segment of this store (open_segment's); its owner also unlinks it."""
    try:
        shm.close()
    except BufferError:
        pass  # a view is still exported elsewhere; the mapping goes with the process
    if unlink:
        with _tracker_lock(store_root):
            try:
                _unlink(shm)
            except FileNotFoundError:
                pass


def remove_segment(store_root: str, name: str | None = None) -> bool:
    """Unlinks the control block of `store_root` (or its segment `name`) if one exists (a killed
    owner leaves its segment behind until the next owner replaces it); True if there was one."""
    with _tracker_lock(store_root):
        try:
            shm = _untracked(name or segment_name(store_root))
        except FileNotFoundError:
            return False
        shm.close()
        _unlink(shm)
        return True


class ControlBlock:
    """A handle on one store's control block.  `create=True` makes a fresh one
    (replacing a stale segment left by a crashed owner); otherwise attach."""

    def __init__(self, store_root: str, file_size: int | None = None, create: bool = False, suffix: str = ""):
        """suffix: a second block of the same store (\"legacy\": the read-only CommitLog of a
        store switched to DLedger, mq.store.legacy); its segment is named <name>-<suffix>."""
        assert suffix == "" or re.fullmatch("[a-z]+", suffix), suffix
        self.name = segment_name(store_root) + (f"-{suffix}" if suffix else "")
        self.root = store_root
        self.owner = create
        size = lib.mq_ctl_size()
        assert not create or file_size is not None
        shm = open_segment(store_root, self.name, create, size)
        self._shm = shm
        if shm.size < size:
            self._shm = None
            shm.close()
            raise BadControlBlock(f"control block {self.name} is smaller than this build's layout")
        self._buf = ffi.from_buffer(shm.buf)
        self.ptr = ffi.cast("void *", self._buf)
        self.size = size
        if create:
            check(lib.mq_ctl_init(self.ptr, size, file_size), "mq_ctl_init")
        else:
            check(lib.mq_ctl_check(self.ptr, size), f"control block {self.name}")

    # positions ------------------------------------------------------------
    def get(self, pos: int) -> int:
        return lib.mq_ctl_get(self.ptr, pos)

    def set(self, pos: int, value: int) -> None:
        check(lib.mq_ctl_set(self.ptr, pos, value))

    def advance(self, pos: int, value: int) -> None:
        lib.mq_ctl_advance(self.ptr, pos, value)

    # wakeups ---------------------------------------------------------------
    def seq(self, which: int) -> int:
        return lib.mq_ctl_seq(self.ptr, which)

    def wait(self, which: int, seen: int, timeout_ms: int) -> bool:
        """Sleeps (GIL released) until the sequence moves past `seen`; False on timeout."""
        return lib.mq_ctl_wait(self.ptr, which, seen, timeout_ms) == 0

    def wake(self, which: int) -> None:
        lib.mq_ctl_wake(self.ptr, which)

    # sticky error ------------------------------------------------------------
    def failed(self) -> bool:
        """Is the sticky error set?  (fatal() without copying its message.)"""
        return lib.mq_ctl_fatal(self.ptr, ffi.NULL, 0) != 0

    def fatal(self) -> str | None:
        msg = ffi.new("char[256]")
        err = lib.mq_ctl_fatal(self.ptr, msg, 256)
        return ffi.string(msg).decode("utf-8", "replace") if err else None

    def set_fatal(self, err: int, message: str) -> None:
        lib.mq_ctl_set_fatal(self.ptr, err, message.encode()[:255])

    def stat(self, which: int) -> int:
        return lib.mq_ctl_stat(self.ptr, which)

    # topic-queue table -----------------------------------------------------
    def queue_slot(self, topic: str, queue_id: int, create: bool = False) -> int | None:
        out = ffi.new("uint32_t *")
        t = topic.encode()
        rc = lib.mq_queue_lookup(self.ptr, t, len(t), queue_id, 1 if create else 0, out)
        if rc == lib.MQ_E_RANGE and not create:
            return None
        if rc < 0:
            check(rc, f"queue slot {topic}:{queue_id}")
        return out[0]

    def queue_get(self, slot: int, field: int) -> int:
        return lib.mq_queue_get(self.ptr, slot, field)

    def queue_set(self, slot: int, field: int, value: int) -> None:
        check(lib.mq_queue_set(self.ptr, slot, field, value))

    def queue_advance(self, slot: int, field: int, value: int) -> None:
        lib.mq_queue_advance(self.ptr, slot, field, value)

    def reset_next_offsets(self) -> None:
        """Every queue's next offset back to its ConsumeQueue's end (a new DLedger leader)."""
        check(lib.mq_queue_reset_next_offsets(self.ptr), "reset next offsets")

    def queue_info(self, slot: int) -> tuple[str, int]:
        buf = ffi.new("char[128]")
        n = ffi.new("uint32_t *")
        qid = ffi.new("int32_t *")
        check(lib.mq_queue_info(self.ptr, slot, buf, n, qid))
        return ffi.buffer(buf, n[0])[:].decode(), qid[0]

    def queues(self):
        """(slot, topic, queueId) of every queue in the table."""
        buf = ffi.new("char[128]")
        n = ffi.new("uint32_t *")
        qid = ffi.new("int32_t *")
        for slot in range(lib.MQ_QUEUE_SLOTS):
            if lib.mq_queue_info(self.ptr, slot, buf, n, qid) == 0:
                yield slot, ffi.buffer(buf, n[0])[:].decode(), qid[0]

    def close(self) -> None:
        """Unmaps this handle; the owner also unlinks the segment."""
        if self._shm is None:
            return
        shm, self._shm = self._shm, None
        self.ptr = None
        ffi.release(self._buf)          # the exported buffer must go before the mapping
        self._buf = None
        close_segment(self.root, shm, unlink=self.owner)
