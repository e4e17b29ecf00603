"""An io worker: one process serving client connections (the send and pull
roles; one TCP connection carries both, so they share a process).

Every worker binds listenPort and listenPort-2 with SO_REUSEPORT, so the
kernel spreads connections over the workers; attaches the store (same files,
same control block) for appends, reads and futex waits; and reaches the
metadata through the link (mq.broker.link).  The handler table below is the
one place that maps a request code to its handler."""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from types import CoroutineType
from time import perf_counter_ns

from mq import loop as mq_loop
from mq.acl.plain import AclDenied, AclFile, acl_file_path
from mq.ha.common import taking_back
from mq.remoting import RemotingServer, RequestCode as R, ResponseCode as RC, make_response
from mq.store import MessageStore, PutResult, PutStatus
from mq.store import control as C
from mq.store.bells import Bell, io_bell
from mq.store.native import StoreError
from mq.store.notify import CommitWaiter, PositionWaiter
from mq.store.retention import service_not_available_remark
from mq.store.stats import PUBLISH_INTERVAL_S, StatsBlock, region_of
from mq.wire.topics import PERM_READ, PERM_WRITE

from .admin import AdminProcessor
from .ops import OpsProcessor
from .query import QueryProcessor
from .iostats import IoStats
from .config import BrokerConfig
from .dledgerinfo import dledger_runtime_info
from .link import RemoteMeta
from .hastatus import HAStatus, slave_ok
from .launcher import die_with_parent
from .pull import PullProcessor
from .fastsend import FastSends
from .forward import FORWARDED_CODES, LeaderForward
from .send import BadRequest, SendGroup, SendProcessor
from .tracing import CURRENT, FLUSH_INTERVAL_S, RequestTracer, broker_label, trace_dir

log = logging.getLogger("mq.broker.worker")

ACL_POLL_INTERVAL_S = 0.5       # how soon a change of plain_acl.yml is in force
RETIRE_INTERVAL_S = 1.0         # how soon a worker lets go of the CommitLog files retention deleted
REFUSAL_LOG_INTERVAL_S = 60.0


class IoWorker:
    def __init__(self, config: BrokerConfig, worker_id: int, link_address: str):
        self.config = config
        self.worker_id = worker_id
        self.link_address = link_address
        self.store: MessageStore | None = None
        self.meta: RemoteMeta | None = None
        self.pull: PullProcessor | None = None
        self.servers: list[RemotingServer] = []
        self.conns: dict[int, object] = {}
        self.boot_ms = int(time.time() * 1000)
        # perfTraceEnable: one req record per request (mq.broker.tracing); None when off
        self.tracer: RequestTracer | None = None
        self._trace_flusher: asyncio.Task | None = None
        self.acl: AclFile | None = None          # aclEnable: the accounts, reloaded on change
        self._acl_poller: asyncio.Task | None = None
        self._stalls: asyncio.Task | None = None        # mq.loop.watch_stalls
        self._retirer: asyncio.Task | None = None       # _retire_deleted
        # this worker's counters in its region of the stats block (None only when the block is missing)
        self.stats: IoStats | None = None
        self._stats_block: StatsBlock | None = None
        self._stats_publisher: asyncio.Task | None = None
        self.forward: LeaderForward | None = None     # DLedger mode: writes forwarded to the leader
        self.bell: Bell | None = None                 # mq.store.bells: None where the broker made none

    async def start(self) -> None:
        cfg = self.config
        # a slave never appends: its HA role writes whole pages, which need no pre-touch
        # (pre-touching would make the kernel zero every page first: half of catch-up's CPU);
        # a DLedger member may become the leader at any time
        self.store = MessageStore.attach(cfg.store_config(), cfg.brokerIP1, cfg.listenPort,
                                         prepare_files=cfg.brokerRole != "SLAVE" or cfg.enableDLegerCommitLog)
        self.ack_waiter = PositionWaiter(self.store.ctl, C.SEQ_ACK, C.POS_ACKED)
        self.commit_waiter = CommitWaiter(self.store.ctl) if cfg.enableDLegerCommitLog else None
        self._use_bell()
        self.ha_status = HAStatus(cfg.storePathRootDir)
        self.meta = RemoteMeta(self.link_address, self.worker_id, self._notify, self._role_changed,
                               self._link_push)
        self._stats_block = StatsBlock.attach_if_present(cfg.storePathRootDir)
        if self._stats_block is not None:
            self.stats = IoStats(self._stats_block.writer(region_of("io", self.worker_id)))
            self._stats_publisher = asyncio.create_task(self._publish_stats())
        self.send = SendProcessor(self)
        self.send.group = self.send_group = SendGroup(self, self.send)
        self.send.fast = self.fast = FastSends(self, self.send.stored_template)
        self.fast.group = self.send_group
        self.meta.on_topics_cleared = self.fast.clear_topics
        self.meta.on_groups_cleared = self.fast.clear_groups
        self.pull = PullProcessor(self)
        self.admin = AdminProcessor(self)
        self.query = QueryProcessor(self)
        self.ops = OpsProcessor(self)
        handlers = {R.SEND_MESSAGE: self.send.handle, R.SEND_MESSAGE_V2: self.send.handle,
                    R.SEND_BATCH_MESSAGE: self.send.handle, R.CONSUMER_SEND_MSG_BACK: self.send.send_back,
                    R.END_TRANSACTION: self.send.end_transaction,
                    R.SEND_REPLY_MESSAGE: self.send.send_reply, R.SEND_REPLY_MESSAGE_V2: self.send.send_reply,
                    R.PULL_MESSAGE: self.pull.handle, R.CHECK_CLIENT_CONFIG: self.pull.check_client_config, **self.admin.handlers(), **self.query.handlers(),
                    **self.ops.handlers()}
        if self.commit_waiter is not None:
            # a member that is not the leader forwards the writes of clients whose route still names it
            self.forward = LeaderForward(cfg.storePathRootDir, self.store.ctl, f"{cfg.brokerIP1}:{cfg.listenPort}")
            handlers.update({code: self.forward.wrap(handlers[code]) for code in FORWARDED_CODES})
        handlers = {code: _guarded(h) for code, h in handlers.items()}
        if cfg.aclEnable:
            self.acl = AclFile(acl_file_path(cfg.rocketmqHome))
            self.acl.load()
            self._acl_poller = asyncio.create_task(self._poll_acl())
            refusals = _RefusalLog()
            handlers = {code: _acl_checked(h, self.acl, refusals) for code, h in handlers.items()}
        self.pull.start(asyncio.get_running_loop(), self.bell)
        idle_s = cfg.serverChannelMaxIdleTimeSeconds
        if cfg.perfTraceEnable:
            self.tracer = RequestTracer(trace_dir(cfg), broker_label(cfg), f"io-{self.worker_id}", offload=True)
            self._trace_flusher = asyncio.create_task(self._flush_trace())
        main = RemotingServer("broker", handlers, on_close=self._conn_closed, idle_timeout_s=idle_s,
                              tracer=self.tracer)
        # the fast (VIP) port serves everything but pulls, as RocketMQ's does
        fast = RemotingServer("broker-fast", {c: h for c, h in handlers.items() if c != R.PULL_MESSAGE},
                              on_close=self._conn_closed, idle_timeout_s=idle_s, tracer=self.tracer)
        await main.start(cfg.listenAddress, cfg.listenPort, reuse_port=True)
        await fast.start(cfg.listenAddress, cfg.fast_port, reuse_port=True)
        self.servers = [main, fast]
        self._fast_policy()
        self._stalls = asyncio.create_task(mq_loop.watch_stalls(f"io worker {self.worker_id}"))
        self._retirer = asyncio.create_task(self._retire_deleted())
        await self.meta.hello()          # "up" means serving: the supervisor waits for this
        log.info("io worker %d serving on %s:%d and :%d", self.worker_id, cfg.listenAddress, cfg.listenPort,
                 cfg.fast_port)

    async def _retire_deleted(self) -> None:
        """Lets go of the data files retention deleted, every RETIRE_INTERVAL_S: a mapping keeps a
        deleted file's blocks on disk, and this worker maps every file it appended to or read.  A
        record view still held across an await reads zeros from then on (mq_commitlog_retire); no
        other thread of this process sends from or receives into the files."""
        logs = [self.store.cl] + ([self.store.legacy.cl] if self.store.legacy is not None else [])
        failed = False
        while True:
            await asyncio.sleep(RETIRE_INTERVAL_S)
            for cl in logs:
                try:
                    cl.retire_below_min()
                except StoreError as e:
                    if not failed:
                        log.error("io worker %d: letting go of deleted CommitLog files failed (%s); they keep "
                                  "their disk space while this worker runs", self.worker_id, e)
                    failed = True

    async def _poll_acl(self) -> None:
        """Reloads the accounts file within ACL_POLL_INTERVAL_S of a change (each worker its own
        copy: a stat per interval, a parse only after a change)."""
        while True:
            await asyncio.sleep(ACL_POLL_INTERVAL_S)
            self.acl.poll()

    def _use_bell(self) -> None:
        """This worker's bell (mq.store.bells), when the broker made them: held answers are
        released, and parked pulls re-run, by the loop itself when the flushed, acknowledged,
        committed or dispatched position moves, not by a thread handing over to it.  Without
        one, the waiters and the pull hold keep their threads."""
        bell = Bell(self.store.ctl, io_bell(self.worker_id))
        if not bell.usable:
            return
        bell.attach(asyncio.get_running_loop())
        for w in (self.store.flush_waiter, self.ack_waiter, self.commit_waiter):
            if w is not None:
                w.use_bell(bell)
        self.bell = bell                  # parked pulls use it too (PullProcessor.start)

    async def stop(self) -> None:
        # parked pulls first: they are answered (PULL_NOT_FOUND) at once instead of
        # holding the servers' grace period, and never run against a closed store
        self.pull.stop()
        if self._stalls is not None:
            self._stalls.cancel()
        if self._retirer is not None:
            self._retirer.cancel()
        await self.fast.drain()
        await self.send_group.drain()
        for s in self.servers:
            await s.stop(grace_s=3.0)
        if self.tracer is not None:
            self._trace_flusher.cancel()
            self.fast.flush_trace()
            self.tracer.close()
        if self._acl_poller is not None:
            self._acl_poller.cancel()
        if self.stats is not None:
            self._stats_publisher.cancel()
            self.fast.take_counts()
            self._take_integrity()
            self.stats.publish()
            self._stats_block.close()
        if self.forward is not None:
            await self.forward.close()
        await self.meta.close()
        if self.bell is not None:
            self.bell.close()
        for w in (self.ack_waiter, self.commit_waiter):   # their threads (no bell) leave the block first
            if w is not None:
                w.close()
        self.store.close()

    async def _publish_stats(self) -> None:
        """Publishes this worker's counters every PUBLISH_INTERVAL_S (mq.store.stats)."""
        while True:
            await asyncio.sleep(PUBLISH_INTERVAL_S)
            self.fast.take_counts()
            self._take_integrity()
            self.stats.publish()

    def _take_integrity(self) -> None:
        """The read path's damage counters into this worker's stats rows."""
        self.stats.integrity(self.pull.damaged_records if self.pull is not None else 0, self.store.entries_found)

    async def _flush_trace(self) -> None:
        """Writes buffered req records at least every FLUSH_INTERVAL_S, so a quiet worker's trace is current."""
        while True:
            await asyncio.sleep(FLUSH_INTERVAL_S)
            self.fast.flush_trace()
            self.tracer.flush()

    # ---- what the processors use ---------------------------------------------------------------
    async def put_message(self, topic, queue_id, body, properties, *, wait=True, **kw):
        disk_full = self.store.ctl.get(C.POS_DISK_FULL)
        if disk_full:      # CONSUMER_SEND_MSG_BACK reaches the store here without writable()
            return PutResult(PutStatus.SERVICE_NOT_AVAILABLE, None, service_not_available_remark(disk_full))
        times = CURRENT.get() if self.tracer is not None else None
        r = await self.store.put_async(topic, queue_id, body, properties, wait=wait, trace=times, **kw)
        return await self.settle(r, wait, times)

    async def put_batch(self, topic, queue_id, batch_body, **kw):
        times = CURRENT.get() if self.tracer is not None else None
        r = await self.store.put_batch_async(topic, queue_id, batch_body, trace=times, **kw)
        return await self.settle(r, True, times)

    def writable(self) -> bool:
        """May this broker accept writes now?  DLedger mode: only a ready leader (the C append
        checks the same term under the lock; this is the early, cheap answer).  A writable
        broker whose disk is full (POS_DISK_FULL, set by the supervisor's disk check,
        mq.store.retention) raises BadRequest(SERVICE_NOT_AVAILABLE, RocketMQ's remark with the
        disk shares): the send path calls this inside its BadRequest handlers, on the fast path
        and the full path alike, so the refusal costs one shared-memory read per send."""
        ctl = self.store.ctl
        if self.commit_waiter is not None:
            ok = ctl.get(C.POS_DL_APPEND_TERM) != 0
        else:
            ok = self.config.brokerRole != "SLAVE" and not taking_back(ctl)
        disk_full = ctl.get(C.POS_DISK_FULL) if ok else 0
        if disk_full:
            raise BadRequest(RC.SERVICE_NOT_AVAILABLE, service_not_available_remark(disk_full))
        return ok

    async def committed(self, r, times=None):
        """DLedger mode: SEND_OK only once the group committed the entries, in the term they
        were appended in.  No quorum within maxWaitAckTimeMs -> SYSTEM_ERROR
        '[PC_SYNCHRONIZED]broker busy' (OS_PAGECACHE_BUSY, as RocketMQ maps
        WAIT_QUORUM_ACK_TIMEOUT); the term changed meanwhile -> SYSTEM_ERROR 'UNKNOWN_ERROR'
        (the entry may be cut, or committed by the next leader: the outcome is unknown)."""
        res = r.result
        outcome = await self.commit_waiter.wait_async(res.end_offset, res.dl_term(res.count - 1),
                                                      self.config.maxWaitAckTimeMs / 1000)
        if times is not None:
            times.acked_ns = perf_counter_ns()
        if outcome == "ok":
            return r
        if outcome == "timeout":
            return PutResult(PutStatus.OS_PAGECACHE_BUSY, None, "wait quorum ack timeout")
        return PutResult(PutStatus.UNKNOWN_ERROR, None, "the leader's term changed before the commit")

    async def settle(self, r, wait: bool, times=None):
        """The outcome of a stored append, after the store's part (MessageStore.durable gave `r`):
        the one place where a send learns whether it may be answered SEND_OK (the full path's
        put_message and put_batch, and the fast path's send groups, all settle here).
        DLedger: committed().  SYNC_MASTER (and `wait`): SEND_OK only once a slave acknowledged
        the message's end offset.  No slave, or one more than haSlaveFallbehindMax behind ->
        SLAVE_NOT_AVAILABLE at once; no ack within slaveTimeout -> FLUSH_SLAVE_TIMEOUT.  The
        message is stored either way.  A flush failure and a replication failure together
        report the replication status.  Tracing: `times` (a RequestTimes, or anything with
        flushed_ns and acked_ns; None) gets the end of the store's part and, when there was
        one, of the ack or commit wait."""
        if times is not None:
            times.flushed_ns = perf_counter_ns()
        if self.commit_waiter is not None and r.result is not None:
            return await self.committed(r, times)       # WAIT=false too: SEND_OK means committed
        if self.config.brokerRole != "SYNC_MASTER" or not wait or r.result is None:
            return r
        end = r.result.end_offset
        if not slave_ok(self.store.ctl, end, self.config.haSlaveFallbehindMax):
            return PutResult(PutStatus.SLAVE_NOT_AVAILABLE, r.result, "no slave connected, or it is too far behind")
        acked = await self.ack_waiter.wait_async(end, self.config.slaveTimeout / 1000)
        if times is not None:
            times.acked_ns = perf_counter_ns()
        if not acked:
            return PutResult(PutStatus.FLUSH_SLAVE_TIMEOUT, r.result, "the slave did not acknowledge in time")
        return r

    def conn_key(self, conn) -> tuple:
        self.conns[conn.id] = conn
        return (self.worker_id, conn.id)

    def extra_runtime_info(self) -> dict:
        info = {"ioWorker": str(self.worker_id), "ioWorkerPid": str(os.getpid()),
                # sends of this worker taken by the C path (mq.broker.fastsend), whether it is on now
                "fastSendMsgs": str(self.fast.msgs), "fastSendOn": str(self.fast.usable).lower(),
                "fastPulls": str(self.fast.pulls), "fastPullOn": str(self.fast.pulls_on).lower(),
                "fastOffsetQueries": str(self.fast.offset_queries),
                # connections served from C (csrc/fastconn.h): adopted so far, served now, owing answers, given back by C
                "fastConnAdoptions": str(self.fast.adoptions), "fastConnsServed": str(len(self.fast._owned)),
                "fastConnsOwing": str(self.fast.owing()),
                "fastConnPolls": str(self.fast.polls), "fastConnWakes": str(self.fast.wakes),
                "fastConnGivenBack": ",".join(f"{k}={v}" for k, v in self.fast.given_back.items())}
        if self.commit_waiter is not None:
            info.update(dledger_runtime_info(self.config.storePathRootDir, self.store.ctl))
            info.update(self.forward.runtime_info())
            return info
        slaves = self.ha_status.slaves()
        if self.config.brokerRole != "SLAVE":
            info["slaveCount"] = str(len(slaves))
            info["slaveAckOffset"] = str(self.store.ctl.get(C.POS_ACKED))
            write = self.store.ctl.get(C.POS_WRITE)
            info["slaves"] = ";".join(f"{s.get('addr')}:ack={s.get('ackOffset')}:lag={write - int(s.get('ackOffset') or 0)}"
                                      for s in slaves)
        return info

    def _conn_closed(self, conn) -> None:
        self.fast.forget(conn)
        if self.conns.pop(conn.id, None) is not None:
            asyncio.ensure_future(self.meta.connection_closed((self.worker_id, conn.id)))

    def _role_changed(self, broker_role: str, broker_id: int) -> None:
        """DLedger mode: the supervisor followed a role change of the Raft role."""
        self.config.brokerRole = broker_role
        self.config.brokerId = broker_id
        self._fast_policy()

    def _fast_policy(self) -> None:
        """Uses the C send path (mq.broker.fastsend) only where a send is checked by nothing but
        the send path and waits for at most one position: a master or a DLedger leader without
        ACL whose brokerPermission allows writes (fastSendEnable); under SYNC_FLUSH its answers
        are held until flushed, under SYNC_MASTER until acknowledged (not both at once), in
        DLedger mode until committed.  With perf tracing, C stamps the sends it takes and keeps
        their req rows."""
        cfg = self.config
        dledger = self.commit_waiter is not None
        sync_flush = self.store.config.flushDiskType == "SYNC_FLUSH" and not dledger
        sync_master = cfg.brokerRole == "SYNC_MASTER" and not dledger
        usable = (cfg.fastSendEnable and cfg.brokerRole in ("ASYNC_MASTER", "SYNC_MASTER")
                  and not (sync_flush and sync_master) and not cfg.aclEnable
                  and bool(cfg.brokerPermission & PERM_WRITE))
        self.fast.set_tracer(self.tracer)
        self.fast.set_policy(usable, "commit" if dledger else "flush" if sync_flush else "ack" if sync_master else None)
        # pulls that find data are answered in C where Python's fast pull path would answer them
        # from its caches alone: read permission, no read/write split, no old log beside DLedger's
        pulls = (usable and cfg.fastPullEnable and bool(cfg.brokerPermission & PERM_READ) and not cfg.slaveReadEnable
                 and self.store.legacy is None and self.tracer is None)
        self.fast.set_pulls(pulls, self.store.cq_root, self.store.config.cq_file_size,
                            cfg.maxTransferCountOnMessageInMemory, cfg.maxTransferBytesOnMessageInMemory)
        # producer connections served from C (csrc/fastconn.h)
        self.fast.set_conns(usable and cfg.fastConnEnable, cfg.fastConnWaitMs)
        for server in self.servers:
            server.taker = self.fast.take if usable else None
            server.adopter = self.fast if self.fast.conns_on else None

    def _link_push(self, msg: dict) -> None:
        """The supervisor's pushes beyond notify/role (mq.broker.link)."""
        kind = msg.get("kind")
        if kind == "reset":
            from mq.wire.offsets import encode_reset_offset_body
            table = {(t, b, int(q)): int(off) for t, b, q, off in msg["rows"]}
            for conn_id, cpp in msg["targets"]:
                conn = self.conns.get(conn_id)
                if conn is not None and not conn.closed:
                    conn.push_oneway(R.RESET_CONSUMER_CLIENT_OFFSET, msg["ext"], encode_reset_offset_body(table, cpp))
        elif kind == "config":
            for k, v in msg["values"].items():
                setattr(self.config, k, v)
            self._fast_policy()
        elif kind in ("check", "reply"):
            conn = self.conns.get(msg["conn"])
            if conn is not None and not conn.closed:
                code = R.CHECK_TRANSACTION_STATE if kind == "check" else R.PUSH_REPLY_MESSAGE_TO_CLIENT
                conn.push_oneway(code, msg["ext"], bytes.fromhex(msg["body"]))

    def _notify(self, group: str, conn_ids: list[int]) -> None:
        for cid in conn_ids:
            conn = self.conns.get(cid)
            if conn is not None and not conn.closed:
                conn.push_oneway(R.NOTIFY_CONSUMER_IDS_CHANGED, {"consumerGroup": group})


def _guarded(handler):
    """The handler, with a BadRequest it raises (at once, or from the coroutine it returned)
    answered with its code and remark."""
    def run(conn, cmd):
        try:
            res = handler(conn, cmd)
        except BadRequest as e:
            return make_response(cmd, e.code, e.remark)
        if res.__class__ is CoroutineType:
            return _guarded_wait(res, cmd)
        return res
    run.__name__ = getattr(handler, "__name__", "handler")
    return run


def _acl_checked(handler, acl: AclFile, refusals: "_RefusalLog"):
    """The handler behind the ACL check (RocketMQ's server RPC hook): a refused request is
    answered SYSTEM_ERROR with the reason and never reaches the handler."""
    def run(conn, cmd):
        try:
            acl.validator.check(cmd, conn.peer[0])
        except AclDenied as e:
            refusals.note(conn.peer[0], cmd.code, str(e))
            return make_response(cmd, RC.SYSTEM_ERROR, f"AclException: {e}")
        return handler(conn, cmd)
    run.__name__ = getattr(handler, "__name__", "handler")
    return run


class _RefusalLog:
    """Logs ACL refusals: the first of each (peer, reason) at once, repeats at most once per
    REFUSAL_LOG_INTERVAL_S with their count, so a misconfigured client cannot flood the log."""

    def __init__(self):
        self.seen: dict[tuple[str, str], list] = {}      # (peer, reason) -> [last logged s, count since]

    def note(self, peer: str, code: int, reason: str) -> None:
        now = time.monotonic()
        key = (peer, reason)
        entry = self.seen.get(key)
        if entry is None:
            if len(self.seen) >= 4096:
                self.seen.clear()
            self.seen[key] = [now, 0]
            log.warning("ACL refused request code %d from %s: %s", code, peer, reason)
        elif now - entry[0] >= REFUSAL_LOG_INTERVAL_S:
            log.warning("ACL refused request code %d from %s: %s (%d more like it in %.0f s)", code, peer,
                        reason, entry[1], now - entry[0])
            entry[0], entry[1] = now, 0
        else:
            entry[1] += 1


async def _guarded_wait(coro, cmd):
    try:
        return await coro
    except BadRequest as e:
        return make_response(cmd, e.code, e.remark)


def worker_main(worker_id: int, config_values: dict, link_address: str) -> None:
    """Entry point of an io worker process (forked by the broker's launcher)."""
    from mq.logs import ensure_logging, flush_logs
    die_with_parent()                    # a worker must not outlive its broker
    ensure_logging(f"io-{worker_id}")
    cfg = BrokerConfig(config_values)

    async def run():
        w = IoWorker(cfg, worker_id, link_address)
        await w.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        await w.stop()

    mq_loop.run(run())
    flush_logs()
    os._exit(0)
