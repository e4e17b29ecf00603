"""The store's roles as processes of their own: `flush` and `dispatch`.

A role process attaches to a running store (same files, same control block)
and runs its loop until `stop` is set.  Roles are started with the spawn
start method so they never inherit another process's threads or locks."""
from __future__ import annotations

import logging
import multiprocessing as mp
import os
import sys

from .config import StoreConfig
from .dispatch import Dispatcher
from .flush import FlushService

log = logging.getLogger("mq.store.roles")

ROLES = ("flush", "dispatch")


def role_main(role: str, config_values: dict, store_host: str, store_port: int, stop) -> None:
    from .store import MessageStore
    if not logging.getLogger().handlers:
        logging.basicConfig(stream=sys.stderr, level=os.environ.get("MQ_LOG_LEVEL", "INFO"),
                            format=f"%(asctime)s %(levelname)s {role}[%(process)d] %(name)s: %(message)s")
    cfg = StoreConfig(**config_values)
    store = MessageStore.attach(cfg, store_host, store_port, cq_writable=(role == "dispatch"),
                                prepare_files=False)
    try:
        if role == "flush":
            FlushService(store.cl, cfg, store.checkpoint).run(stop)
        elif role == "dispatch":
            Dispatcher(store.cl, store.cqs, cfg.delay_levels_ms, store.checkpoint,
                       cfg.flushIntervalConsumeQueue, cfg.flushConsumeQueueThoroughInterval).run(stop)
        else:
            raise ValueError(f"unknown store role {role!r}")
    finally:
        store.close()


def start_role_process(role: str, config: StoreConfig, store_host: str, store_port: int):
    """Starts one role process; returns (process, stop event)."""
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    p = ctx.Process(target=role_main, name=f"mq-{role}",
                    args=(role, config.as_dict(), store_host, store_port, stop), daemon=True)
    p.start()
    return p, stop
