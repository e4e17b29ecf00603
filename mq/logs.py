"""Logging for every process: one format, and for a broker one stream.

Every line names the process that wrote it, by role and pid:
    2026-11-21 05:00:00,000 INFO io-1[1234] mq.broker: ...
(`%(processName)s` is the role: mq.broker.launcher names each role process.)

A broker (`setup_broker_logging`) logs through multiprocessing-logging: the
supervisor's stderr handler is wrapped in a queue that the role processes
inherit when the launcher forks them, and a thread of the supervisor writes
every record, so the lines of all processes arrive in one ordered stream.
Other programs (mqnamesrv, tools, roles started on their own by tests) write
to their own stderr with the same format."""
from __future__ import annotations

import logging
import multiprocessing as mp
import os
import sys

FORMAT = "%(asctime)s %(levelname)s %(processName)s[%(process)d] %(name)s: %(message)s"


def setup_logging(role: str) -> None:
    """This process's records to its stderr, tagged `role[pid]`."""
    mp.current_process().name = role
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(FORMAT))
    root.addHandler(handler)
    root.setLevel(os.environ.get("MQ_LOG_LEVEL", "INFO"))


def setup_broker_logging() -> None:
    """The supervisor's stream, shared with the role processes it forks (through
    mq.broker.launcher).  Call first thing: it chooses the fork start method
    explicitly, and starts the receiving thread."""
    import multiprocessing_logging
    mp.set_start_method("fork", force=True)
    setup_logging("broker")
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
    """Hands every record this process queued to the broker stream before a hard
    exit (os._exit skips the queue's own flush at exit)."""
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
