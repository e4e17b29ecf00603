"""The HA role as a process of its own, like the store's flush and dispatch
roles (mq.store.roles): it attaches to the running store (same files, same
control block) and runs HAMaster or HASlave until `stop` is set.

ha_options (RocketMQ's broker keys where they exist):
    haListenHost            master: address to bind (default 0.0.0.0)
    haListenPort            master: port (listenPort + 1)
    haTransferBatchSize     master: bytes per frame (32768)
    haSendHeartbeatInterval master: heartbeat; slave: report interval (5000 ms)
    haHousekeepingInterval  both: silence before a connection is dropped (20000 ms)
    haFullCopy              master: an empty slave gets the log from the oldest
                            retained offset instead of the last file (ours; false)
    haMasterAddress         slave: "host:port"; when empty the address is read
                            from <store root>/ha-master.txt on every connect
                            attempt (the supervisor writes it after registering
                            with the name server)
    haConnectRetryInterval  slave: ms between connect attempts (ours; 5000)
    perfTrace               master: None, or {"dir", "broker"}: write replication
                            lag samples once per second (mq.ha.tracing; ours)

The master publishes its slaves in <store root>/ha-status.json (mq.ha.master)."""
from __future__ import annotations

import logging
import multiprocessing as mp
import os
import signal

from mq.store.config import StoreConfig
from mq.store.native import StoreError
from mq.store.roles import PipeStop

from .common import MASTER_ADDR_FILE, STATUS_FILE

log = logging.getLogger("mq.ha.role")

ROLES = ("master", "slave")
MIN_ADDR_LEN = 6        # RocketMQ uses haMasterAddress only when it is at least this long


def read_master_addr(store_root: str, configured: str = "") -> str | None:
    """haMasterAddress when set, else the first line of <store root>/ha-master.txt, else None."""
    if configured and len(configured.strip()) >= MIN_ADDR_LEN:
        return configured.strip()
    try:
        with open(os.path.join(store_root, MASTER_ADDR_FILE), encoding="utf-8") as f:
            line = f.readline().strip()
    except OSError:
        return None
    return line or None


BIND_RETRY_FIRST_S = 0.5         # a master whose HA port is taken retries after this, doubling
BIND_RETRY_MAX_S = 5.0


def ha_role_main(role: str, store_config_values: dict, store_host: str, store_port: int, ha_options: dict,
                 stop) -> None:
    from mq.store.store import MessageStore
    from .master import HAMaster
    from .slave import HASlave
    from .tracing import LagSampler
    # stopped only through `stop`, never half-way by a SIGTERM sent to the whole process group
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from mq.logs import Episode, ensure_logging
    ensure_logging(f"ha-{role}")
    if role not in ROLES:
        raise ValueError(f"unknown HA role {role!r}")
    cfg = StoreConfig(**store_config_values)
    root = cfg.storePathRootDir
    opt = ha_options.get
    store = MessageStore.attach(cfg, store_host, store_port, cq_writable=False, prepare_files=False)
    try:
        if role == "master":
            host, port = opt("haListenHost") or "0.0.0.0", int(opt("haListenPort"))
            bind = Episode(log, f"listening on the HA port {host}:{port}")
            delay_s = BIND_RETRY_FIRST_S
            while True:
                try:
                    node = HAMaster(store.cl, store.ctl, host, port,
                                    transfer_batch_size=int(opt("haTransferBatchSize", 32768)),
                                    heartbeat_interval_ms=int(opt("haSendHeartbeatInterval", 5000)),
                                    housekeeping_interval_ms=int(opt("haHousekeepingInterval", 20000)),
                                    file_size=cfg.mappedFileSizeCommitLog,
                                    ha_full_copy=_bool(opt("haFullCopy", False)),
                                    status_path=os.path.join(root, STATUS_FILE))
                    break
                except OSError as e:
                    # the port is taken (another process, a broker left running): one line, then
                    # retries with a backoff -- slaves cannot connect meanwhile (SYNC_MASTER
                    # answers SLAVE_NOT_AVAILABLE), but the role does not die and restart in a loop
                    bind.failed(e)
                    if stop.wait(delay_s):
                        return
                    delay_s = min(delay_s * 2, BIND_RETRY_MAX_S)
            bind.ok()
        else:
            configured = str(opt("haMasterAddress") or "")
            node = HASlave.for_store(store, lambda: read_master_addr(root, configured),
                                     report_interval_ms=int(opt("haSendHeartbeatInterval", 5000)),
                                     housekeeping_interval_ms=int(opt("haHousekeepingInterval", 20000)),
                                     retry_interval_ms=int(opt("haConnectRetryInterval", 5000)))
        node.start()
        sampler = LagSampler.for_role(role, node, store.ctl, opt("perfTrace"))
        retire_failed = False
        try:
            while not stop.wait(1.0):
                # the files retention deleted go (a mapping or fd keeps their blocks on disk); the
                # connections' threads send and receive through fds of their own meanwhile
                try:
                    store.cl.retire_below_min()
                except StoreError as e:            # (as an io worker: one line, replication goes on)
                    if not retire_failed:
                        log.error("letting go of deleted CommitLog files failed (%s); they keep their disk "
                                  "space while this role runs", e)
                    retire_failed = True
                if sampler is not None:
                    sampler.sample()
        finally:
            node.stop()
            if sampler is not None:
                sampler.close()
    finally:
        store.close()


def _bool(v) -> bool:
    return v is True or str(v).strip().lower() == "true"


def start_ha_process(role: str, config: StoreConfig, store_host: str, store_port: int, ha_options: dict):
    """Starts the HA role process ("master" or "slave"); returns (process, stop)."""
    if role not in ROLES:
        raise ValueError(f"unknown HA role {role!r}")
    ctx = mp.get_context("spawn")
    r, w = ctx.Pipe(duplex=False)
    stop = PipeStop(r, w)
    p = ctx.Process(target=ha_role_main, name=f"mq-ha-{role}",
                    args=(role, config.as_dict(), store_host, store_port, dict(ha_options), stop.child_side()),
                    daemon=True)
    p.start()
    r.close()          # the child holds the read end; our copy would hide the EOF of our own death
    return p, stop
