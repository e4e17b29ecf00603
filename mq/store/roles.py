"""The store's roles as processes of their own: `flush` and `dispatch`.

A role process attaches to a running store (same files, same control block)
and runs its loop until `stop` is set.  Roles are started with the spawn
start method so they never inherit another process's threads or locks.

`trace` (the broker's perfTraceEnable; None when off) is a dict: "dir" the
trace directory, "broker" the records' broker field, "msgs_base" POS_MSGS
when the supervisor started the role.  The flush role then writes its flush
records to <dir>/flush-<pid>.jsonl (mq.store.flush); dispatch writes none.

`refuse_at` (dispatch): the records this start's recovery proved misnamed that dispatch has
not reached yet, MessageStore.refusals_pending (a DLedger member's, past the commit recovery
restored; mq.store.dispatch.Refusal).

The flush role also feeds the broker's metrics when the supervisor made a stats block
(mq.store.stats): its histograms go to the block's last region."""
from __future__ import annotations

import logging
import multiprocessing as mp
import signal

from .config import StoreConfig
from .dispatch import Dispatcher, index_writer
from .flush import FlushService
from .stats import StatsBlock, region_of

log = logging.getLogger("mq.store.roles")

ROLES = ("flush", "dispatch")


def role_main(role: str, config_values: dict, store_host: str, store_port: int, stop,
              trace: dict | None = None, refuse_at: dict | None = None) -> None:
    from mq.trace import TraceWriter
    from .store import MessageStore
    # stopped only through `stop` (the supervisor's clean stop flushes through us), and
    # never half-way by a SIGTERM sent to the whole process group
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from mq.logs import ensure_logging
    ensure_logging(role)
    cfg = StoreConfig(**config_values)
    store = MessageStore.attach(cfg, store_host, store_port, cq_writable=(role == "dispatch"),
                                prepare_files=False)
    writer = TraceWriter(trace["dir"], "flush") if trace is not None and role == "flush" else None
    stats = StatsBlock.attach_if_present(cfg.storePathRootDir) if role == "flush" else None
    try:
        if role == "flush":
            FlushService(store.cl, cfg, store.checkpoint, trace=writer, broker=(trace or {}).get("broker", ""),
                         msgs_base=(trace or {}).get("msgs_base"),
                         stats=stats.writer(region_of("flush", regions=stats.regions)) if stats else None).run(stop)
        elif role == "dispatch":
            d = Dispatcher(store.cl, store.cqs, cfg.delay_levels_ms, store.checkpoint,
                           cfg.flushIntervalConsumeQueue, cfg.flushConsumeQueueThoroughInterval,
                           committed_only=cfg.enableDLegerCommitLog,
                           index=index_writer(cfg, store.checkpoint),
                           rebase=store.finish_install if cfg.enableDLegerCommitLog else None)
            d.refuse_at = dict(refuse_at or {})
            d.run(stop)
        else:
            raise ValueError(f"unknown store role {role!r}")
    finally:
        if writer is not None:
            try:
                writer.close()
            except OSError as e:
                log.error("perf trace: closing %s failed: %s", writer.path, e)
        if stats is not None:
            stats.close()
        store.close()


class PipeStop:
    """The stop signal of a role process, with Event's is_set/wait/set.

    Not multiprocessing.Event: its set() takes a lock that a role killed inside
    wait() never releases, which hangs the supervisor's stop.  A pipe cannot
    wedge: the parent writes one byte (a dead reader is ignored), and when the
    parent dies the role sees EOF, which also means stop."""

    def __init__(self, reader, writer):
        self._r = reader
        self._w = writer

    def is_set(self) -> bool:
        return self._r.poll(0)

    def wait(self, timeout_s: float | None = None) -> bool:
        return self._r.poll(timeout_s)

    def set(self) -> None:
        try:
            self._w.send_bytes(b"s")
        except (OSError, ValueError):
            pass

    def fileno(self) -> int:
        """The read end's descriptor: readable once stop is set or the parent died (for an
        event loop's add_reader)."""
        return self._r.fileno()

    def child_side(self) -> "PipeStop":
        return PipeStop(self._r, None)

    def writer_fileno(self) -> int:
        return self._w.fileno()

    def close_reader(self) -> None:
        """The parent's copy of the read end: closed once the child holds it, or our
        own death would not read as EOF there."""
        self._r.close()

    def close_writer(self) -> None:
        self._w.close()


def start_role_process(role: str, config: StoreConfig, store_host: str, store_port: int,
                       trace: dict | None = None):
    """Starts one role process; returns (process, stop).  trace: see the module docstring."""
    ctx = mp.get_context("spawn")
    r, w = ctx.Pipe(duplex=False)
    stop = PipeStop(r, w)
    p = ctx.Process(target=role_main, name=f"mq-{role}",
                    args=(role, config.as_dict(), store_host, store_port, stop.child_side(), trace), daemon=True)
    p.start()
    r.close()          # the child holds the read end; our copy would hide the EOF of our own death
    return p, stop
