"""Logging for every process: one format, and for a broker one stream.

Every line names the process that wrote it, by role and pid:
    2026-11-21 05:00:00,000 INFO io-1[1234] mq.broker: ...
(`%(processName)s` is the role: mq.broker.launcher names each role process.)

A broker (`setup_broker_logging`) logs through multiprocessing-logging: the
supervisor's stderr handler is wrapped in a queue that the role processes
inherit when the launcher forks them, and a thread of the supervisor writes
every record, so the lines of all processes arrive in one ordered stream.
Other programs (mqnamesrv, tools, roles started on their own by tests) write
to their own stderr with the same format, through a queue and a thread of
their own (`setup_logging`): a log line never makes an event loop wait for
the disk (an append can wait seconds for a journal commit on a busy disk,
and the name server's loop answers every route query).

Log files (`LogFile`): with logDir set (broker.conf, namesrv.properties) the
same lines also go to <logDir>/broker.log or namesrv.log, as RocketMQ's
logback writes ~/logs/rocketmqlogs/broker.log, rolled by size: past
logFileMaxBytes the file becomes broker.log.1 (.1 becomes .2 ...) and
logFileBackups rolled files are kept.  A broker's file is written by the
supervisor's receiving thread only, behind the one stream (the role processes
never open it), so rolling needs no lock between processes.  stderr keeps
every line either way."""
from __future__ import annotations

import atexit
import faulthandler
import logging
import logging.handlers
import multiprocessing as mp
import os
import queue
import signal
import sys

FORMAT = "%(asctime)s %(levelname)s %(processName)s[%(process)d] %(name)s: %(message)s"
LOG_FILE_MAX_BYTES = 128 * 1024 * 1024      # RocketMQ's logback: broker.log rolls at 128 MB ...
LOG_FILE_BACKUPS = 10                       # ... and keeps broker.log.1 .. .10


class LogFile(logging.handlers.RotatingFileHandler):
    """<dir>/<name>, rolled past `max_bytes`, `backups` rolled files kept.  A write that fails
    (disk full, file removed with its directory) is reported on stderr once, not per record,
    and once more when writing works again; logging goes on on stderr meanwhile."""

    def __init__(self, directory: str, name: str, max_bytes: int = LOG_FILE_MAX_BYTES,
                 backups: int = LOG_FILE_BACKUPS):
        directory = os.path.expanduser(directory)
        os.makedirs(directory, exist_ok=True)
        super().__init__(os.path.join(directory, name), maxBytes=max_bytes, backupCount=backups,
                         encoding="utf-8")
        self.setFormatter(logging.Formatter(FORMAT))
        self.failures = 0

    def emit(self, record: logging.LogRecord) -> None:
        before = self.failures
        super().emit(record)
        if before and self.failures == before:
            sys.stderr.write(f"log file {self.baseFilename}: writing works again "
                             f"({before} record(s) not written)\n")
            self.failures = 0

    def handleError(self, record: logging.LogRecord) -> None:
        if not self.failures:
            err = sys.exc_info()[1]
            sys.stderr.write(f"log file {self.baseFilename}: write failed: {err} "
                             "(reported once until it works again; stderr has every line)\n")
        self.failures += 1


class _Fanout(logging.Handler):
    """Every record to each of `handlers` (stderr and the log file) behind one handler, so the
    broker's multiprocessing stream stays one queue and one receiving thread."""

    def __init__(self, handlers: list[logging.Handler]):
        super().__init__()
        self.handlers = handlers

    def emit(self, record: logging.LogRecord) -> None:
        for h in self.handlers:
            h.handle(record)

    def flush(self) -> None:
        for h in self.handlers:
            h.flush()

    def close(self) -> None:
        for h in self.handlers:
            h.close()
        super().close()


_listener: logging.handlers.QueueListener | None = None     # this process's log writing thread


def setup_logging(role: str, log_file: LogFile | None = None, threaded: bool = True) -> None:
    """This process's records to its stderr, tagged `role[pid]`, and to `log_file` if given;
    written by a thread of this process (`threaded`: the caller's thread only queues them; they
    are written at exit, and by flush_logs before a hard exit) or by the caller's thread."""
    global _listener
    mp.current_process().name = role
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    if _listener is not None:
        _listener.stop()
        _listener = None
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(FORMAT))
    target = handler if log_file is None else _Fanout([handler, log_file])
    if threaded:
        q: queue.SimpleQueue = queue.SimpleQueue()
        _listener = logging.handlers.QueueListener(q, target)
        _listener.start()
        atexit.register(_stop_listener)
        root.addHandler(logging.handlers.QueueHandler(q))
    else:
        root.addHandler(target)
    root.setLevel(os.environ.get("MQ_LOG_LEVEL", "INFO"))


def enable_stack_dumps() -> None:
    """`kill -QUIT <pid>` (kill -3) writes every thread's Python stack to stderr and the process
    goes on, as kill -3 makes a JVM print its threads for the RocketMQ operator used to jstack;
    a fatal signal (SIGSEGV, SIGBUS, SIGABRT, SIGFPE, SIGILL) prints them before the process dies
    of it.  Written by the signal handler itself, past the log stream: a process whose loop or
    log thread is stuck still answers.  A broker calls it before it forks, so the launcher and
    every role inherit it."""
    faulthandler.enable(file=sys.stderr, all_threads=True)
    faulthandler.register(signal.SIGQUIT, file=sys.stderr, all_threads=True, chain=False)


def _stop_listener() -> None:
    """Writes what is queued and ends the writing thread (at exit; before a hard exit)."""
    global _listener
    if _listener is not None:
        _listener.stop()
        _listener = None


def setup_broker_logging(log_file: LogFile | None = None) -> None:
    """The supervisor's stream, shared with the role processes it forks (through
    mq.broker.launcher), written to stderr and to `log_file` if given.  Call first
    thing: it chooses the fork start method explicitly, and starts the receiving
    thread."""
    import multiprocessing_logging
    mp.set_start_method("fork", force=True)
    setup_logging("broker", log_file, threaded=False)     # the stream's receiving thread writes
    multiprocessing_logging.install_mp_handler()


def ensure_logging(role: str) -> None:
    """A role process's logging: the inherited broker stream when there is one
    (forked by the launcher), else its own stderr (started on its own)."""
    if not logging.getLogger().handlers:
        setup_logging(role)


def release_stuck_log_lock(timeout_s: float = 1.0) -> bool:
    """After a role process died by a signal: frees the broker stream's write
    lock if the dead process held it.

    multiprocessing's Queue serialises writers with a process-shared lock held
    for one pipe write of one record (microseconds).  A process killed with
    SIGKILL inside that window never releases it, and every other process --
    the supervisor included -- would then block its log forwarding forever
    while records pile up in memory.  A lock still held after `timeout_s` has
    no live owner in practice, so it is released.  True if it was stuck."""
    for h in logging.getLogger().handlers:
        lock = getattr(getattr(h, "queue", None), "_wlock", None)    # multiprocessing.Queue's writer lock
        if lock is None:
            continue
        if lock.acquire(timeout=timeout_s):
            lock.release()
            continue
        lock.release()
        logging.getLogger("mq.logs").warning(
            "the log stream's write lock was held by a killed process for over %.1f s: released", timeout_s)
        return True
    return False


def flush_logs() -> None:
    """Hands every record this process queued to the broker stream (or, in a process
    on its own, writes them) before a hard exit (os._exit skips the flush at exit)."""
    _stop_listener()
    for h in logging.getLogger().handlers:
        queue = getattr(h, "queue", None)
        if queue is not None and hasattr(queue, "join_thread"):
            queue.close()
            queue.join_thread()


class Episode:
    """A failure that repeats every few seconds while its cause lasts (a full disk, a peer that is
    down) is logged once when it starts and once when it ends, not at every retry: `failed(err)`
    at each failure, `ok()` at each success.  Not thread-safe: one per loop that retries."""

    def __init__(self, logger: logging.Logger, what: str):
        self.log = logger
        self.what = what
        self.failures = 0           # in the episode under way (0: none)

    def failed(self, err) -> None:
        if not self.failures:
            self.log.error("%s failed: %s (logged once until it works again)", self.what, err)
        self.failures += 1

    def ok(self) -> None:
        if self.failures:
            self.log.warning("%s works again (after %d failure(s))", self.what, self.failures)
            self.failures = 0
