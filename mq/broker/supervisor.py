"""The broker's supervisor (the `mqbroker` process).

    supervisor: store owner (recovery, abort file, clean stop), metadata,
    |           name server registration, delayed delivery, transaction checks, persistence,
    |           the link the workers call, worker and role restarts
    +-- launcher (mq.broker.launcher): single-threaded, forks every role below
        +-- io worker x sendMessageThreadPoolNums  (mq.broker.worker, SO_REUSEPORT)
        +-- flush role, dispatch role              (mq.store.roles)
        +-- ha role                                (mq.ha.role)
        +-- grpc role, when grpcServerPort is set  (mq.gateway: RocketMQ 5.x clients)

Every role process is forked by the launcher (never from this process, which
has threads), logs into the supervisor's stream (mq.logs) and dies with
the broker.  A role that dies is restarted; the clients of a dead io worker
reconnect to the others, and its consumers are dropped from their groups at
once (their groups are notified)."""
from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import time

from mq import loop as mq_loop
from mq.logs import release_stuck_log_lock
from mq.remoting import RemotingClient, RemotingError, RemotingServer, RequestCode as R, ResponseCode as RC
from mq.store import MessageStore, PutStatus, StoreError
from mq.store import control as C
from mq.files import rewrite_properties_file, write_atomic
from mq.store.configfile import Writer as ConfigWriter, retry_pending_writes
from mq.wire.fastjson import loads_lenient
from mq.store.retention import DISK_CHECK_INTERVAL_MAX_S, DiskCheck, Retention
from mq.store.roles import role_main
from mq.store.stats import StatsBlock
from mq.ha.common import monotonic_ms, taking_back
from mq.ha.role import ha_role_main
from mq.dledger.role import dledger_role_main
from mq.gateway.role import gateway_role_main
from mq.gateway.options import GatewayOptions
from mq.store.notify import CommitWaiter
from mq.wire import commitlog as wcl
from mq.wire.properties import decode_properties, encode_properties
from mq.wire.topics import SCHEDULE_TOPIC

from .config import BrokerConfig, dledger_follower_id
from .launcher import STOP_PIPE, Launcher, RoleProcess
from .link import LINK_CALL, LinkService, link_address
from .metadata import Metadata, dumps
from .metrics import MetricsServer
from .statsdata import StatsHistory
from .slavesync import SlaveSync
from .tracing import broker_label, trace_dir
from .transaction import TransactionService, check_loop
from .worker import worker_main

log = logging.getLogger("mq.broker")

SCHEDULE_TICK_S = 0.1
SCHEDULE_BATCH_MAX = 256
CHILD_CHECK_S = 0.5
TASKS_END_TIMEOUT_S = 5.0              # a stop waits this long for its cancelled loops (one joins a thread <= 2 s)
HAND_OVER_WAIT_S = 3.0                 # a graceful stop of a DLedger leader waits this long for a new leader
HAND_OVER_NO_LEADER_S = 3.0            # ... and stops forwarding once no other member led this long (> an election)
WORKER_START_TIMEOUT_S = 60
GRPC_START_TIMEOUT_S = 30.0            # how long "serving" waits for the gRPC endpoint to listen
RETENTION_FIRST_DELAY_S = 60           # RocketMQ's; MQ_RETENTION_FIRST_DELAY_S overrides it (tests)
HA_MASTER_FILE = "ha-master.txt"


class Supervisor:
    def __init__(self, config: BrokerConfig, launcher: Launcher):
        self.config = config
        self.launcher = launcher
        self.store: MessageStore | None = None
        self.metadata: Metadata | None = None
        self.link: LinkService | None = None
        self.client = RemotingClient()
        self.workers: dict[int, RoleProcess] = {}
        self.roles: dict[str, RoleProcess] = {}
        self._ready: dict[int, asyncio.Event] = {}
        self._tasks: list[asyncio.Task] = []
        self._register_now = asyncio.Event()
        self._registered_with: set[str] = set()      # name servers that took a registration (logged once)
        self.master_addr: str | None = None
        self.master_ha_addr: str | None = None
        self.stopping = False
        self.restarts = 0
        self.restarts_by_role: dict[str, int] = {}     # "io-0", "flush", ...: for mq_role_restarts_total
        self._led_until: float | None = None   # DLedger: monotonic s this member last led (inf: leads now)
        self.handing_over = False              # a DLedger stop's hand-over window (mq.broker.forward)
        self.stats_block: StatsBlock | None = None     # the roles' counters (mq.store.stats)
        self.stats_history: StatsHistory | None = None  # their minute/hour/day windows (VIEW_BROKER_STATS_DATA)
        self.metrics: MetricsServer | None = None
        self.commit_waiter: CommitWaiter | None = None  # DLedger mode: commits of the supervisor's own writes
        self.disk: DiskCheck | None = None             # the disk ratios (mq.store.retention), run by _disk_loop

    # ---- lifecycle -------------------------------------------------------------------------------
    async def start(self) -> None:
        cfg = self.config
        scfg = cfg.store_config()
        self.launcher.attach(asyncio.get_running_loop())
        swept = C.sweep_dead_segments()
        if swept:
            log.info("removed %d shared-memory segment(s) of brokers that died without removing them: %s",
                     len(swept), " ".join(swept))
        self.store = MessageStore.open(scfg, cfg.brokerIP1, cfg.listenPort, start_roles=False, prepare_files=False)
        rep = self.store.recovery
        # A SYNC_MASTER promises that a slave holds what it acknowledged.  After a crash (an
        # unflushed tail lost with ASYNC_FLUSH; with SYNC_FLUSH too, a tail the disk lost or a
        # record torn where no checksum looks: the v1 record's covers its body only), or after a
        # damaged record recovery truncated at, a slave may hold a tail we lack: writes wait until
        # a slave gives it back or says it holds nothing more, or the window ends (mq.ha.master,
        # "take-back").  An ASYNC_MASTER does not: it is also what a lone broker runs as, and would
        # wait for a slave it does not have.
        if (not self.dledger and cfg.haTakeBackWaitMs and cfg.brokerRole == "SYNC_MASTER"
                and (rep.mode == "abnormal" or rep.dropped_bytes > 0)):
            self.store.ctl.set(C.POS_HA_TAKE_BACK_UNTIL, monotonic_ms() + cfg.haTakeBackWaitMs)
            why = (f"recovery truncated a damaged tail ({rep.dropped_bytes} bytes at {rep.end_offset})"
                   if rep.dropped_bytes else "restarted after a crash as SYNC_MASTER")
            log.warning("%s: writes wait up to %d ms for a slave to give back what it holds beyond our end (%d)",
                        why, cfg.haTakeBackWaitMs, self.store.ctl.get(C.POS_WRITE))
        if self.dledger:
            # a DLedger member starts as a follower; the Raft role tells when it leads
            cfg.brokerRole, cfg.brokerId = "SLAVE", dledger_follower_id(scfg)
            self.commit_waiter = CommitWaiter(self.store.ctl)
        # the stats block exists before any role that counts into it starts; it is kept whatever
        # metricsPort says (RocketMQ's BrokerStatsManager always counts: statsAll reads it)
        # regions: one per io worker, the gateway's, the flush role's (mq.store.stats.region_of)
        self.stats_block = StatsBlock(cfg.storePathRootDir, regions=cfg.sendMessageThreadPoolNums + 2, create=True)
        self.stats_history = StatsHistory(self.stats_block)
        self.disk = DiskCheck(scfg, self.store.ctl)
        try:
            self.disk.check()            # before any io worker serves: a broker started on a full disk refuses at once
        except OSError as e:
            log.error("disk check failed: %s", e)
        for role in ("flush", "dispatch", "dledger" if self.dledger else "ha"):
            self._start_role(role)
        if cfg.grpcServerPort:
            self._start_role("grpc")
        # config files are written by a thread of their own: an fsync on a busy disk can take
        # seconds, and this loop answers every io worker's link calls (mq.store.configfile)
        self.config_writer = ConfigWriter()
        self._file_lock = asyncio.Lock()   # the conf file and the HA master file: one thread write at a time
        self.metadata = Metadata(cfg, self.store.config_dir, self.config_writer)
        self.metadata.on_topics_changed = self._topics_changed
        self.link = LinkService(self.metadata, self)
        # a quiet worker is still a worker: the link is never closed for idleness
        self._link_server = RemotingServer("link", {LINK_CALL: self.link.handle},
                                           on_close=self.link.worker_link_closed, idle_timeout_s=None)
        self.link_addr = link_address(cfg.storePathRootDir)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(self.link_addr)
        sock.listen(128)
        await self._link_server.start(sock=sock)
        for wid in range(cfg.sendMessageThreadPoolNums):
            self._start_worker(wid)
        await mq_loop.wait_for(asyncio.gather(*(e.wait() for e in self._ready.values())), WORKER_START_TIMEOUT_S)
        if cfg.metricsPort:
            self.metrics = MetricsServer(self, self.stats_block, self.stats_history)
            await self.metrics.start(cfg.listenAddress, cfg.metricsPort)
            log.info("Prometheus metrics on http://%s:%d/metrics", cfg.listenAddress, self.metrics.port)
        if cfg.grpcServerPort:
            await self._wait_grpc_listening()
        # registered before it says it serves (RocketMQ's BrokerController.start registers at once):
        # a client that reads the route right after finds this broker there
        await self.register_all()
        loops = [self._register_loop, self._persist_loop, self._schedule_loop, self._expire_loop,
                 self._watch_children, self._disk_loop, self._retention_loop, self.stats_history.run,
                 lambda: mq_loop.watch_stalls("supervisor")]
        self.slave_sync = SlaveSync(self)
        self.transactions = TransactionService(self)
        loops.append(lambda: check_loop(self.transactions))
        if self.dledger:
            loops.append(self._follow_dledger_role)
        elif cfg.brokerRole == "SLAVE":
            loops.append(self.slave_sync.run)
        self._tasks = [asyncio.create_task(t()) for t in loops]
        log.info("broker %s (%s, id %d) serving on %s:%d and :%d with %d io workers; name servers: %s",
                 cfg.brokerName, cfg.brokerRole, cfg.brokerId, cfg.listenAddress, cfg.listenPort, cfg.fast_port,
                 len(self.workers), cfg.namesrvAddr or "(none)")

    async def stop(self) -> None:
        """Clean stop: unregister; workers stop accepting and finish in-flight
        requests; persist metadata; the roles flush and dispatch what is left;
        the store checkpoints and removes the abort file."""
        if self.dledger and self.config.dLegerForwardOnStopMs:
            self.handing_over = True        # an io worker that exits now is not restarted
            await self._hand_over()
        self.stopping = True
        await self._unregister_all()
        for t in await mq_loop.cancel_all(self._tasks, TASKS_END_TIMEOUT_S):
            log.error("stopping: %s did not end %.0f s after its cancellation; going on without it",
                      t.get_coro().__qualname__, TASKS_END_TIMEOUT_S)
        for p in self.workers.values():
            p.terminate()
        await self._join(list(self.workers.values()), 15)
        self.metadata.persist_all()
        await asyncio.to_thread(self.config_writer.close)      # everything queued is on disk
        await self.client.close()
        for p in self.roles.values():
            p.stop()
        self.store.ctl.wake(C.SEQ_WRITE)
        await self._join(list(self.roles.values()), 15)
        await self._link_server.stop(grace_s=1)
        if self.metrics is not None:
            await self.metrics.stop()
        if self.stats_block is not None:
            self.stats_block.close()
        if self.commit_waiter is not None:
            self.commit_waiter.close()      # its thread leaves the control block before it is unmapped
        self.store.close()
        log.info("broker stopped cleanly")

    async def _join(self, procs: list[RoleProcess], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for p in procs:
            if not await p.wait(max(0.0, deadline - time.monotonic())):
                log.error("process %s (pid %s) did not stop; killing it", p.name, p.pid)
                p.kill()
                await p.wait(1)

    # ---- children ------------------------------------------------------------------------------------
    def _start_worker(self, wid: int) -> None:
        self._ready[wid] = asyncio.Event()
        self.workers[wid] = self.launcher.start(f"io-{wid}", worker_main,
                                                (wid, self.config.as_dict(), self.link_addr))

    def worker_ready(self, wid: int, pid: int) -> None:
        log.info("io worker %d (pid %d) is up", wid, pid)
        ev = self._ready.get(wid)
        if ev is not None:
            ev.set()

    @property
    def dledger(self) -> bool:
        return self.config.enableDLegerCommitLog

    def writable(self) -> bool:
        """Does this broker take writes now (master; in DLedger mode the ready leader)?"""
        if self.dledger:
            return self.store.ctl.get(C.POS_DL_APPEND_TERM) != 0
        return self.config.brokerRole != "SLAVE" and not taking_back(self.store.ctl)

    async def _wait_grpc_listening(self) -> None:
        """Serving means every endpoint listens, the gRPC one too: its role binds a moment after
        the io workers serve, and a 5.x client started on our "serving" line (or systemd's READY)
        was refused, after which grpc's channel backs off for seconds (a CI run saw a receive
        fail for that).  Waits up to GRPC_START_TIMEOUT_S, then says so and serves 4.x anyway."""
        cfg = self.config
        host = "127.0.0.1" if cfg.listenAddress in ("", "0.0.0.0") else cfg.listenAddress
        deadline = time.monotonic() + GRPC_START_TIMEOUT_S
        while True:
            try:
                _, w = await mq_loop.wait_for(asyncio.open_connection(host, cfg.grpcServerPort), 1.0)
                w.close()
                return
            except (OSError, asyncio.TimeoutError):
                if time.monotonic() > deadline:
                    log.error("the gRPC endpoint %s:%d does not listen after %.0f s (its role logs why); serving "
                              "4.x clients without it", host, cfg.grpcServerPort, GRPC_START_TIMEOUT_S)
                    return
                await asyncio.sleep(0.05)

    def _start_role(self, role: str) -> None:
        cfg = self.config
        if role == "grpc":         # RocketMQ 5.x clients (mq.gateway)
            self.roles[role] = self.launcher.start("grpc", gateway_role_main, (GatewayOptions.of(cfg), STOP_PIPE))
            return
        if role == "dledger":
            self.roles[role] = self.launcher.start("dledger", dledger_role_main, (
                cfg.store_config().as_dict(), cfg.brokerIP1, cfg.listenPort, STOP_PIPE))
            return
        # perfTraceEnable: the flush role writes flush records, a master's HA role lag samples
        trace = {"dir": trace_dir(cfg), "broker": broker_label(cfg),
                 "msgs_base": self.store.ctl.get(C.POS_MSGS)} if cfg.perfTraceEnable else None
        if role == "ha":
            # the HA role: a master streams its CommitLog to slaves on listenPort+1; a slave
            # follows the master named by haMasterAddress or by the name server (ha-master.txt)
            ha_role = "slave" if cfg.brokerRole == "SLAVE" else "master"
            self.roles[role] = self.launcher.start(f"ha-{ha_role}", ha_role_main, (
                ha_role, cfg.store_config().as_dict(), cfg.brokerIP1, cfg.listenPort, {
                    "haListenHost": cfg.listenAddress, "haListenPort": cfg.ha_port,
                    "haTransferBatchSize": cfg.haTransferBatchSize,
                    "haSendHeartbeatInterval": cfg.haSendHeartbeatInterval,
                    "haHousekeepingInterval": cfg.haHousekeepingInterval, "haFullCopy": cfg.haFullCopy,
                    "haMasterAddress": cfg.haMasterAddress, "perfTrace": trace}, STOP_PIPE))
            return
        # dispatch: the refusals of this start's recovery it has still to apply (a DLedger member's)
        refuse_at = self.store.refusals_pending if role == "dispatch" else None
        self.roles[role] = self.launcher.start(role, role_main, (
            role, cfg.store_config().as_dict(), cfg.brokerIP1, cfg.listenPort, STOP_PIPE, trace, refuse_at))

    async def _watch_children(self) -> None:
        while not self.stopping:
            await asyncio.sleep(CHILD_CHECK_S)
            killed = False
            for wid, p in list(self.workers.items()):
                if not p.is_alive() and not self.stopping and not self.handing_over:
                    self.restarts += 1
                    self.restarts_by_role[f"io-{wid}"] = self.restarts_by_role.get(f"io-{wid}", 0) + 1
                    killed |= (p.exitcode or 0) < 0
                    log.error("io worker %d (pid %s) died with exit code %s; restarting it", wid, p.pid, p.exitcode)
                    self._start_worker(wid)
            for role, p in list(self.roles.items()):
                if not p.is_alive() and not self.stopping:
                    self.restarts += 1
                    self.restarts_by_role[role] = self.restarts_by_role.get(role, 0) + 1
                    killed |= (p.exitcode or 0) < 0
                    log.error("%s role (pid %s) died with exit code %s; restarting it", role, p.pid, p.exitcode)
                    if role == "ha":
                        self.store.ctl.set(C.POS_HA_SLAVES, 0)     # its connections died with it
                    self._start_role(role)
            if killed:     # a process killed by a signal may have died holding the log stream's lock
                await asyncio.to_thread(release_stuck_log_lock)

    # ---- DLedger mode: following the Raft role ----------------------------------------------------------
    async def _follow_dledger_role(self) -> None:
        """The Raft role announces every change (SEQ_ROLE); this applies it to the broker:
        the ready leader becomes brokerId 0 (SYNC_MASTER), a follower becomes brokerId
        selfId+1 (SLAVE, syncing metadata from the leader); each change is pushed to the io
        workers and registered with every name server at once (RocketMQ's
        DLedgerRoleChangeHandler)."""
        loop = asyncio.get_running_loop()
        woken = asyncio.Event()
        ctl = self.store.ctl
        stop = False

        def watch():
            while not stop:
                seen = ctl.seq(C.SEQ_ROLE)
                loop.call_soon_threadsafe(woken.set)
                ctl.wait(C.SEQ_ROLE, seen, 1000)

        import threading
        watcher = threading.Thread(target=watch, name="dledger-role-watch", daemon=True)
        watcher.start()
        sync_task: asyncio.Task | None = None
        follower_id = dledger_follower_id(self.store.config)
        try:
            while True:
                await woken.wait()
                woken.clear()
                leader = self.writable()
                if leader:
                    self._led_until = float("inf")
                elif self._led_until == float("inf"):
                    self._led_until = time.monotonic()
                role, bid = ("SYNC_MASTER", 0) if leader else ("SLAVE", follower_id)
                if (role, bid) != (self.config.brokerRole, self.config.brokerId):
                    log.info("DLedger role change: now %s (brokerId %d)", role, bid)
                    self.config.brokerRole, self.config.brokerId = role, bid
                    self.link.push_all({"kind": "role", "brokerRole": role, "brokerId": bid})
                    if sync_task is not None:
                        sync_task.cancel()
                        sync_task = None
                    if not leader:
                        self.master_addr = None          # learned again from the next registration
                        sync_task = asyncio.create_task(self.slave_sync.run())
                    self._register_now.set()
                    if leader:
                        asyncio.create_task(self._reclaim_offsets_from_slaves())
        finally:
            stop = True
            if sync_task is not None:
                sync_task.cancel()
            # out of the control block before stop() unmaps it (a thread woken in unmapped
            # memory killed the process with SIGSEGV after "broker stopped cleanly")
            ctl.wake(C.SEQ_ROLE)
            watcher.join(2)

    async def _hand_over(self) -> None:
        """A graceful stop of a DLedger member that leads, or led within dLegerForwardOnStopMs:
        hands the lead to the most caught-up live follower first (LEADERSHIP_TRANSFER to our own
        DLedger port, as `mqadmin leadershipTransfer`), then keeps every process up, the io
        workers forwarding writes to the new leader (mq.broker.forward), until
        dLegerForwardOnStopMs after it last led: clients whose cached route names this member
        keep getting SEND_OK until their next name-server poll (30 s by default) moves them.
        The wait ends early once no other member has led for HAND_OVER_NO_LEADER_S (the whole
        group stopping: nothing to forward to) or an io worker is gone (a Ctrl-C reaches the
        whole process group).  Not for the preferredLeaderId member: the new leader would hand
        the lead straight back to it (the role's own stop hands over at the very end)."""
        from mq.dledger.role import read_status
        from mq.wire import dledger_rpc as RPC
        scfg, own, root = self.store.config, f"{self.config.brokerIP1}:{self.config.listenPort}", \
            self.config.storePathRootDir
        if scfg.preferredLeaderId and scfg.preferredLeaderId == scfg.dLegerSelfId:
            return
        st = read_status(root) or {}
        if st.get("role") == "LEADER":
            live = {p: int(v.get("match", -1)) for p, v in (st.get("peers") or {}).items()
                    if p != scfg.dLegerSelfId and isinstance(v, dict) and v.get("state") == "replicate"
                    and int(v.get("match", -1)) >= 0}
            if not live:
                return                      # nobody to hand over to: the role's stop says so
            best = max(live, key=live.get)
            host, port = scfg.dledger_peers[scfg.dLegerSelfId]
            cmd = self.client.request(RPC.LEADERSHIP_TRANSFER, RPC.encode(
                RPC.LEADERSHIP_TRANSFER, False, {"group": st.get("group") or scfg.dLegerGroup, "transfereeId": best}))
            try:
                answer = RPC.decode(RPC.LEADERSHIP_TRANSFER, True, (await self.client.invoke(
                    f"{host}:{port}", cmd, HAND_OVER_WAIT_S)).ext_fields)
            except (RemotingError, ValueError) as e:
                log.warning("stopping: the DLedger lead could not be handed to %s (%s)", best, e)
                return
            if answer.get("code") != RPC.SUCCESS:
                log.warning("stopping: the DLedger role refused to hand the lead to %s (code %s)", best,
                            answer.get("code"))
                return
            log.info("stopping: handing the DLedger lead to %s first", best)
            deadline = time.monotonic() + HAND_OVER_WAIT_S
            while time.monotonic() < deadline:
                st = read_status(root) or {}
                if st.get("role") != "LEADER" and st.get("leaderBrokerAddr") not in (None, own):
                    break
                await asyncio.sleep(0.05)
        if self._led_until is None:
            return                          # never led: no client's route names us
        led_until = min(self._led_until, time.monotonic())     # (inf: the role change is not seen yet)
        end = led_until + self.config.dLegerForwardOnStopMs / 1000
        leader = st.get("leaderBrokerAddr")
        if end <= time.monotonic() or leader in (None, own) or st.get("role") == "LEADER":
            return
        log.info("stopping: forwarding writes to the leader at %s for %.1f s more (dLegerForwardOnStopMs), "
                 "for clients whose route still names this member", leader, end - time.monotonic())
        no_leader_since = None
        while time.monotonic() < end:
            await asyncio.sleep(0.2)
            if not all(p.is_alive() for p in self.workers.values()):
                log.info("stopping: an io worker is gone; not forwarding any longer")
                break
            st = read_status(root) or {}
            if st.get("leaderBrokerAddr") not in (None, own):
                no_leader_since = None
            elif no_leader_since is None:
                no_leader_since = time.monotonic()
            elif time.monotonic() - no_leader_since >= HAND_OVER_NO_LEADER_S:
                log.info("stopping: no other member has led for %.0f s; not forwarding any longer",
                         HAND_OVER_NO_LEADER_S)
                break

    # ---- metadata events ---------------------------------------------------------------------------------
    def _topics_changed(self) -> None:
        self.link.push_all({"kind": "topics"})
        self._register_now.set()

    def notify_groups_changed(self, groups) -> None:
        for group in groups or ():
            log.info("consumer group %s is now %s", group, self.metadata.consumer_ids(group))
            g = self.metadata.groups.get(group) or {}
            if not g.get("notifyConsumerIdsChangedEnable", True):
                continue
            by_worker: dict[int, list[int]] = {}
            for wid, cid in self.metadata.consumer_conns(group):
                by_worker.setdefault(wid, []).append(cid)
            for wid, cids in by_worker.items():
                self.link.push(wid, {"kind": "notify", "group": group, "conns": cids})

    # ---- operators' changes (mq.broker.ops) ------------------------------------------------------------------
    def reset_offsets_notify(self, group: str, topic: str, ts: int, force: bool, rows: list) -> int:
        """RESET_CONSUMER_CLIENT_OFFSET (220) to every online consumer of the group, through the io
        worker holding its connection, in the body spelling its language reads; how many."""
        by_worker: dict[int, list] = {}
        members = self.metadata.consumers.get(group) or {}
        for cid, c in members.items():
            cpp = self.metadata.client_info.get(cid, {}).get("language") == "CPP"
            by_worker.setdefault(c.conn_key[0], []).append([c.conn_key[1], cpp])
        ext = {"topic": topic, "group": group, "timestamp": ts, "isForce": "true" if force else "false"}
        for wid, targets in by_worker.items():
            self.link.push(wid, {"kind": "reset", "targets": targets, "ext": ext, "rows": rows})
        log.warning("offsets of group %s on %s reset to time %d for %d consumer(s)", group, topic, ts, len(members))
        return len(members)

    # ---- transactions (mq.broker.transaction) -------------------------------------------------------------
    async def end_transaction(self, header: dict) -> list:
        """END_TRANSACTION, parsed by the io worker that took it: [response code, remark]."""
        return list(await self.transactions.end(header))

    def push_check(self, conn_key: tuple, ext: dict, body: bytes) -> None:
        """CHECK_TRANSACTION_STATE to a producer connection, through the io worker holding it."""
        wid, conn_id = conn_key
        self.link.push(wid, {"kind": "check", "conn": conn_id, "ext": ext, "body": body.hex()})

    def push_reply(self, client_id: str, ext: dict, body_hex: str) -> bool:
        """PUSH_REPLY_MESSAGE_TO_CLIENT to the requester's connection, through the io worker holding
        it; False when no producer with that client id is connected here."""
        key = self.metadata.client_conn(client_id)
        if key is None:
            return False
        wid, conn_id = key
        self.link.push(wid, {"kind": "reply", "conn": conn_id, "ext": ext, "body": body_hex})
        return True

    async def update_config(self, values: dict) -> None:
        """UPDATE_BROKER_CONFIG (keys mq.broker.ops.RUNTIME_KEYS checked): here, in every io worker,
        and in the conf file the broker started from (RocketMQ rewrites its file too).  The file is
        rewritten by a thread (its fsyncs must not stall this loop), one change after another, and
        the call returns once it is."""
        for k, v in values.items():
            setattr(self.config, k, v)
        self.link.push_all({"kind": "config", "values": values})
        if "brokerPermission" in values:
            asyncio.ensure_future(self.register_all())
        path = getattr(self.config, "config_file", None)
        if path:
            async with self._file_lock:
                try:
                    await asyncio.to_thread(rewrite_properties_file, path, values)
                except OSError as e:
                    log.error("config change not written to %s: %s", path, e)

    # ---- name server registration --------------------------------------------------------------------------
    def _register_request(self):
        cfg = self.config
        wrapper = self.metadata.topics_wrapper()
        if cfg.brokerPermission & 6 != 6:
            # a broker without write (or read) permission registers its topics so (RocketMQ's registerBrokerAll)
            wrapper = {**wrapper, "topicConfigTable": {n: {**tc, "perm": tc["perm"] & cfg.brokerPermission}
                                                       for n, tc in wrapper["topicConfigTable"].items()}}
        body = dumps({"filterServerList": [], "topicConfigSerializeWrapper": wrapper})
        return self.client.request(R.REGISTER_BROKER, {
            "brokerName": cfg.brokerName, "brokerAddr": cfg.broker_addr, "clusterName": cfg.brokerClusterName,
            "haServerAddr": cfg.ha_server_addr, "brokerId": cfg.brokerId, "compressed": False}, body)

    async def register_all(self) -> None:
        for addr in self.config.namesrv_list:
            try:
                resp = await self.client.invoke(addr, self._register_request(),
                                                self.config.registerBrokerTimeoutMills / 1000)
                if resp.code != RC.SUCCESS:
                    log.warning("name server %s refused the registration: %s %s", addr, resp.code, resp.remark)
                    continue
                if addr not in self._registered_with:
                    self._registered_with.add(addr)
                    log.info("registered with name server %s", addr)
                ext = resp.ext_fields or {}
                if ext.get("masterAddr"):
                    self.master_addr = ext["masterAddr"]
                if ext.get("haServerAddr") and ext["haServerAddr"] != self.master_ha_addr:
                    self.master_ha_addr = ext["haServerAddr"]
                    await self._publish_master_ha_addr()
            except RemotingError as e:
                log.warning("registration with name server %s failed: %s", addr, e)

    async def _reclaim_offsets_from_slaves(self) -> None:
        """A master coming back (or a new DLedger leader): while it was down, consumers read
        from its slaves and committed offsets there.  Take them (max per queue) before clients
        ask this master, so no consumer offset goes backwards.  A DLedger leader also takes the
        topics and subscription groups it lacks (created on an earlier leader while it was
        away: RocketMQ's metadata is not in the replicated log)."""
        slaves = set()
        for ns in self.config.namesrv_list:
            try:
                r = await self.client.invoke(ns, self.client.request(R.GET_BROKER_CLUSTER_INFO), 3)
                info = loads_lenient(r.body.decode()) if r.code == RC.SUCCESS and r.body else {}
            except (RemotingError, ValueError) as e:
                log.warning("cluster info from %s failed: %s", ns, e)
                continue
            addrs = info.get("brokerAddrTable", {}).get(self.config.brokerName, {}).get("brokerAddrs", {})
            slaves.update(a for bid, a in addrs.items() if int(bid) > 0 and a != self.config.broker_addr)
        for addr in sorted(slaves):
            try:
                r = await self.client.invoke(addr, self.client.request(R.GET_ALL_CONSUMER_OFFSET), 3)
            except RemotingError as e:
                log.warning("consumer offsets from slave %s failed: %s", addr, e)
                continue
            if r.code == RC.SUCCESS and r.body:
                before = json.dumps(self.metadata.offsets_wrapper(), sort_keys=True)
                self.metadata.merge_offsets(loads_lenient(r.body.decode()))
                if json.dumps(self.metadata.offsets_wrapper(), sort_keys=True) != before:
                    log.info("took newer consumer offsets from slave %s", addr)
            if self.dledger:
                await self._take_configs_from(addr)

    async def _take_configs_from(self, addr: str) -> None:
        for code, merge, what in ((R.GET_ALL_TOPIC_CONFIG, self.metadata.merge_topics, "topics"),
                                  (R.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, self.metadata.merge_groups, "groups")):
            try:
                r = await self.client.invoke(addr, self.client.request(code), 3)
            except RemotingError as e:
                log.warning("%s from %s failed: %s", what, addr, e)
                continue
            if r.code == RC.SUCCESS and r.body:
                added = merge(loads_lenient(r.body.decode()))
                if added:
                    log.info("took %d %s from %s: %s", len(added), what, addr, ", ".join(sorted(added)[:20]))
                    self.link.push_all({"kind": what})

    async def _publish_master_ha_addr(self) -> None:
        """The slave's HA role reads the master's HA address from this file on each
        connect (haMasterAddress in the config wins when set).  Written by a thread: its fsyncs
        must not stall this loop."""
        if self.config.brokerRole == "SLAVE":
            addr = self.master_ha_addr
            try:
                async with self._file_lock:
                    await asyncio.to_thread(write_atomic, os.path.join(self.config.storePathRootDir, HA_MASTER_FILE),
                                            addr + "\n")
            except OSError as e:      # a full disk must not end the registration loop; the next registration retries
                log.error("writing %s failed: %s", HA_MASTER_FILE, e)
                if self.master_ha_addr == addr:
                    self.master_ha_addr = None

    async def _unregister_all(self) -> None:
        cfg = self.config
        for addr in cfg.namesrv_list:
            try:
                await self.client.invoke(addr, self.client.request(R.UNREGISTER_BROKER, {
                    "brokerName": cfg.brokerName, "brokerAddr": cfg.broker_addr,
                    "clusterName": cfg.brokerClusterName, "brokerId": cfg.brokerId}), 3)
            except RemotingError as e:
                log.warning("unregistering from name server %s failed: %s", addr, e)

    async def _register_loop(self) -> None:
        """Registers again every registerNameServerPeriod, or at once when something changed
        (_register_now); the first registration was start()'s."""
        if self.config.brokerRole != "SLAVE" and not self.dledger:
            await self._reclaim_offsets_from_slaves()
        while True:
            try:
                await mq_loop.wait_for(self._register_now.wait(), self.config.registerNameServerPeriod / 1000)
            except asyncio.TimeoutError:
                pass
            self._register_now.clear()
            await self.register_all()

    # ---- periodic work -------------------------------------------------------------------------------------
    async def _persist_loop(self) -> None:
        interval = self.config.flushConsumerOffsetInterval / 1000
        while True:
            await asyncio.sleep(interval)
            try:
                self.metadata.persist_offsets()
                self.metadata.persist_delay()
            except OSError as e:
                log.error("persisting metadata failed: %s", e)

    async def _disk_loop(self) -> None:
        """The disk check (RocketMQ's CleanCommitLogService.isSpaceFull) from boot on, every
        cleanResourceInterval but at least every DISK_CHECK_INTERVAL_MAX_S: over
        diskSpaceWarningLevelRatio the io workers refuse sends until the disk has room again
        (mq.store.retention).  Config files a full disk kept from being written are written
        again here (mq.store.configfile).  statvfs may block on a sick disk: in a thread."""
        interval_s = min(DISK_CHECK_INTERVAL_MAX_S, self.store.config.cleanResourceInterval / 1000)
        failing = False
        while True:
            try:
                await asyncio.to_thread(self.disk.check)
                failing = False
            except OSError as e:
                if not failing:
                    log.error("disk check failed: %s (the disk state stays as it was)", e)
                failing = True
            try:
                await asyncio.to_thread(retry_pending_writes)
            except OSError as e:
                log.error("writing a config file again failed: %s", e)
            await asyncio.sleep(interval_s)

    async def _retention_loop(self) -> None:
        """Expired CommitLog and ConsumeQueue files go every cleanResourceInterval,
        the first pass RETENTION_FIRST_DELAY_S after boot (RocketMQ's schedule).
        A pass touches the disk, so it runs in a thread."""
        retention = Retention(self.store, disk=self.disk)
        await asyncio.sleep(float(os.environ.get("MQ_RETENTION_FIRST_DELAY_S", RETENTION_FIRST_DELAY_S)))
        while True:
            try:
                await asyncio.to_thread(retention.run_once)
            except OSError as e:
                log.error("retention pass failed: %s", e)
            await asyncio.sleep(self.store.config.cleanResourceInterval / 1000)

    async def _expire_loop(self) -> None:
        while True:
            await asyncio.sleep(10)
            self.notify_groups_changed(self.metadata.expire_clients())

    async def _schedule_loop(self) -> None:
        """Delivers delayed messages: SCHEDULE_TOPIC_XXXX queue L-1 holds level L;
        an entry's tags code is its delivery time.  Each due message is stored
        again under REAL_TOPIC/REAL_QID, then the level's offset moves."""
        if self.config.brokerRole == "SLAVE" and not self.dledger:
            return
        while True:
            await asyncio.sleep(SCHEDULE_TICK_S)
            if not self.writable():
                continue                 # a DLedger follower: the leader delivers
            if self.disk.full:
                continue                 # delivered once the disk has room (RocketMQ's puts fail meanwhile)
            try:
                await self._deliver_due()
            except Exception:
                log.exception("delayed delivery failed; retrying")

    async def _deliver_due(self) -> None:
        now = int(time.time() * 1000)
        levels = len(self.store.config.delay_levels_ms)
        for level in range(1, levels + 1):
            cq = self.store.cqs.get(SCHEDULE_TOPIC, level - 1)
            if cq.max_offset == 0:
                continue
            offset = max(self.metadata.delay_offsets.get(level, 0), cq.min_offset)
            for phy, size, deliver_ms in cq.get(offset, SCHEDULE_BATCH_MAX):
                if deliver_ms > now:
                    break
                try:
                    rec = wcl.parse_record(self.store.read_entry(cq, offset, phy, size, SCHEDULE_TOPIC.encode()))
                except StoreError as e:       # damaged since it was stored: skipped, never delivered
                    log.error("delayed message at %d (level %d, queue offset %d) is damaged and skipped: %s",
                              phy, level, offset, e)
                    offset += 1
                    self.metadata.delay_offsets[level] = offset
                    continue
                props = decode_properties(rec.properties)
                topic = props.pop("REAL_TOPIC", None)
                qid = int(props.pop("REAL_QID", "0"))
                props.pop("DELAY", None)
                if topic:
                    r = await self.store.put_async(topic, qid, rec.body, encode_properties(props), wait=False,
                                                   flag=rec.flag, sys_flag=rec.sys_flag,
                                                   born_ts_ms=rec.born_timestamp_ms, born_host=rec.born_host,
                                                   born_port=rec.born_port, reconsume_times=rec.reconsume_times)
                    if r.status is PutStatus.PUT_OK and self.dledger:
                        # the level's offset moves only past a committed copy: a copy lost with a
                        # leader change is delivered again by the next leader
                        res = r.result
                        outcome = await self.commit_waiter.wait_async(res.end_offset, res.dl_term(0),
                                                                      self.config.maxWaitAckTimeMs / 1000)
                        if outcome != "ok":
                            log.warning("delayed message at %d: copy not committed (%s); retrying", phy, outcome)
                            return
                    if r.status is not PutStatus.PUT_OK:
                        log.error("delayed message at %d not delivered: %s", phy, r.reason)
                        return
                offset += 1
                self.metadata.delay_offsets[level] = offset
