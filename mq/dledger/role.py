"""The DLedger role: in DLedger mode, the process that makes this broker a member of its Raft group
(it replaces the HA role).  It runs the Raft core (mq.dledger.core) on one event-loop thread,
against the CommitLog in DLedger mode (mq.dledger.log), with real time, real sockets and files:

    timer (TICK_S)            core.tick(): elections, heartbeats, check-quorum, transfers
    peer sockets (net)        requests in -> core.step(), replies back; core messages out.  A
                              follower's pushes that go at the end of its log are taken
                              first, in C: the whole read, receive to answers, is one call
                              (_read_pushes; _take_pushes where Conn's own path reads); the
                              core hears of them through took_appends.  A ready leader's SUCCESS
                              answers are taken in C too, and its next pushes sent from
                              there (_take_answers; the core's Progress lives in C memory:
                              mq.dledger.lead)
    SEQ_WRITE (bell)          the leader's io workers appended: replicate (core.log_progress;
                              a ready leader's in C, _lead_progress)
    SEQ_FLUSH (bell)          SYNC_FLUSH: the leader's own entries became durable (they count
                              toward the quorum only then)
The bell (mq.store.bells) is wanted only while this member leads.  Where the broker made no
bells (a role run by a test), a watcher thread per sequence wakes the loop instead.

After every step (Ready): the hard state (term, vote) is written and fsynced to
dledger-<selfId>/currterm BEFORE any message leaves; the commit index goes to the control block
(mq_dledger_set_commit: COMMITTED moves, SEQ_COMMIT wakes the io workers waiting to answer
SEND_OK, and the dispatch role builds ConsumeQueues up to it); and the role is published.

Serving writes (DL_APPEND_TERM, the term io workers append in; 0 refuses):
  * on becoming leader the core appends a no-op; once it is committed, every entry of earlier
    terms is too; the role then waits until dispatch reached the end, sets every queue's next
    offset from its ConsumeQueue (entries appended by this node in an older term may have been
    cut), and only then sets DL_APPEND_TERM to its term: the "ready" leader;
  * on any change away from that (step-down, a higher term, a leadership transfer) DL_APPEND_TERM
    goes back to 0 at once; an io worker waiting for a commit in the old term answers an error,
    never SEND_OK (mq.store.notify.CommitWaiter);
  * a follower's append or truncate fences first (DLedgerLog).

SYNC_FLUSH: a follower answers a PUSH only after the entries of that read are flushed (one msync
for all the PUSH frames of one read), and a leader counts itself only up to its flushed index, so
an acknowledged message survives the power loss of any one node.  ASYNC_FLUSH acknowledges what
is in the page cache of a majority, as DLedger does (its flush runs every 10 ms).

Files (dledger-<selfId>/): currterm (currTerm, voteLeader), checkpoint (endIndex, committedIndex;
every checkPointInterval and at stop), and <store root>/dledger-status.json (role, term, leader,
commit, the leader's view of its peers; rewritten on every change and every second) for the
supervisor, which follows role changes (SEQ_ROLE wakes it), and for mqadmin.

A clean stop of a ready leader first hands leadership to the most caught-up follower
(TimeoutNow), so a planned restart costs a heartbeat, not an election timeout.

Damage: a leader's entry a follower needs that fails its checks (the core's LogDamaged, reported
in Ready.damaged with a member holding it) is asked of that member (GET: _ask_repair, answered by
_answer_get) and rewritten from its copy (_repair_from); the core hands leadership to the holder if
it stays damaged (mq.dledger.core)."""
from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import random
import re
import threading
import time

from mq import loop as mq_loop
from mq.files import replace_file
from mq.logs import Episode
from mq.store import control as C
from mq.store.bells import DLEDGER_BELL, Bell
from mq.store.commitlog import FollowReader, FollowTemplate, LeadState
from mq.store.config import StoreConfig
from mq.store.dledgerfiles import load_hard_state, save_checkpoint, save_hard_state
from mq.store.native import CorruptRecord, StoreError, StoreIOError, check
from mq.wire import dledger_rpc as RPC
from mq.wire.errors import WireError

from .core import (RESPONSE_TO, RESPONSES, Append, AppendResp, Config, Heartbeat, HeartbeatResp, RaftNode, Role,
                   TimeoutNow, VoteReq, VoteResp)
from .lead import CProgress, lead_templates
from .log import DLedgerLog, InBatch
from .net import FRAME_IN_MAX, Conn, Link, Listener, follow_template, request_frame, response_frame

log = logging.getLogger("mq.dledger")

TICK_S = 0.01
STATUS_FILE = "dledger-status.json"
STATUS_INTERVAL_S = 1.0
OPAQUES_PER_LINK_MAX = 65536      # requests remembered per link until their response (votes may go unanswered)
STOP_TRANSFER_S = 1.0
DAMAGE_LOG_INTERVAL_S = 60.0      # a damaged entry a follower needs is logged once a minute (per entry and follower)
REPAIR_RETRY_S = 1.0              # a damaged entry's copy is asked of a holder again after this long unanswered
SCRUB_INTERVAL_S = 0.1            # the scrub reads dLegerScrubBytesPerSec / 10 bytes of entries this often
BROKER_ADDR_RE = re.compile(r"[0-9A-Za-z.:\[\]-]{1,253}:[0-9]{1,5}")   # a heartbeat's brokerAddr (host:port)
# PUSH frames in flight per follower: while they are, new entries gather into the next push, so
# under load a push carries many entries (per-push work dominates: two syscalls and a few Python
# steps on each side) while one push of a lone entry still leaves at once
PUSHES_IN_FLIGHT_MAX = 2
FOLLOW_OUT_BYTES = 256 * 1024     # a follower's answers written in C per read (~200 bytes each); more: next call
FOLLOW_MIN_BYTES = 8 + 200        # a read shorter than a PUSH's prefix and header is not worth a C call
# a follower's receive buffer for its leader's connection, read in C (_read_pushes), with
# FOLLOW_OUT_BYTES for its answers, made once a frame on it named the leader; a longer frame (a
# big push or an install) is received by Conn's own path
FOLLOW_READ_BYTES = 1024 * 1024
# a ready leader's receive buffer per link, read in C (_read_answers): a follower's answers are
# ~200 bytes each; a longer frame goes to Conn's own path
LEAD_READ_BYTES = 64 * 1024
# a peer port that cannot be bound (another process holds it) is retried, the wait doubling
# between these bounds; the failure is logged once (mq.logs.Episode), each retry at DEBUG
LISTEN_RETRY_MIN_S = 0.5
LISTEN_RETRY_MAX_S = 5.0
WATCH_IDLE_S = 0.2                # a watcher thread of a non-leader looks again at least this often


def ticks(ms: int) -> int:
    return max(1, round(ms / (TICK_S * 1000)))


def raft_config(cfg: StoreConfig) -> Config:
    peers = list(cfg.dledger_peers)
    base = cfg.heartBeatTimeIntervalMs * cfg.maxHeartBeatLeak
    return Config(cfg.dLegerSelfId, peers, heartbeat_ticks=ticks(cfg.heartBeatTimeIntervalMs),
                  election_ticks_min=ticks(base + cfg.minVoteIntervalMs),
                  election_ticks_max=ticks(base + cfg.maxVoteIntervalMs),
                  preferred_leader=cfg.preferredLeaderId or None, max_inflight=PUSHES_IN_FLIGHT_MAX,
                  install=True)


def read_status(store_root: str) -> dict | None:
    try:
        with open(os.path.join(store_root, STATUS_FILE), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):       # absent, being replaced, unreadable, or not JSON
        return None


def _reader_to_rbuf(conn: Conn) -> None:
    """The incomplete frame conn's C reader (FollowReader) kept, if any, to the front of conn.rbuf:
    Conn's own path reads on from there."""
    rd = conn.reader
    if rd is not None and rd.r.have:
        conn.rbuf = bytearray(memoryview(rd.buf)[:rd.r.have]) + conn.rbuf
        rd.r.have = 0


# ---- the role -------------------------------------------------------------------------------------
class DLedgerRole:
    def __init__(self, store, cfg: StoreConfig, rng: random.Random | None = None, broker_addr: str | None = None):
        cfg.check_dledger()
        self.store = store
        # our broker's remoting address (brokerIP1:listenPort): a leader's heartbeats carry it, and
        # each member keeps the one of every leader it heard, so that its io workers can forward
        # the sends of clients whose route still names it (mq.broker.forward)
        self.broker_addr = broker_addr
        self.broker_addrs: dict[str, str] = {}
        self.cfg = cfg
        self.cl = store.cl
        self.ctl = store.ctl
        self.group = cfg.dLegerGroup or "DefaultGroup"
        self.self_id = cfg.dLegerSelfId
        self.peers = cfg.dledger_peers
        self.dir = cfg.dledger_dir
        self.sync_durable = cfg.flushDiskType == "SYNC_FLUSH"
        self._status_episode = Episode(log, "writing the DLedger status file")
        self._checkpoint_episode = Episode(log, "writing the DLedger checkpoint")
        self.log = DLedgerLog(self.cl, self.sync_durable, dledger_dir=self.dir, index_dir=cfg.dledger_index_dir,
                              index_file_size=cfg.mappedFileSizeForEntryIndex)
        self._install_tables: dict[int, bytes] = {}
        self._table_job: tuple | None = None     # (pos, future) computing an install table
        self._install_wait_logged = False
        term, vote = load_hard_state(self.dir)
        commit = self.ctl.get(C.POS_DL_COMMIT_INDEX) - 1
        # a leader's steady state in C (mq.dledger.lead): the core's Progress of each follower
        # lives in _lead's memory; None with dLegerFastLeadEnable=false (or a group of more than
        # LeadState.PEERS_MAX + 1 members: the core's Progress then)
        self._lead_peers = [p for p in self.peers if p != self.self_id]
        fast_lead = cfg.dLegerFastLeadEnable and len(self._lead_peers) <= LeadState.PEERS_MAX
        self._lead_slot = {p: i for i, p in enumerate(self._lead_peers)}
        self._lead: LeadState | None = None
        self._lead_term: int | None = None      # the term _lead's templates are of
        self._lead_ok = False                   # ... and they could be made
        self.node = RaftNode(raft_config(cfg), self.log, rng or random.Random(), term=term, vote=vote,
                             commit=min(commit, self.log.last_index()),
                             new_progress=self._new_progress if fast_lead else None)
        if fast_lead:
            self._lead = LeadState(len(self._lead_peers), self.node.quorum, self.node.cfg.max_inflight,
                                   self.sync_durable, self.log.push_bytes_max)
        # our requests' opaques; C's pushes take theirs from LeadState.OPAQUE_BASE up, so that an
        # answer tells whose request it answers
        self.opaques = itertools.cycle(range(1, LeadState.OPAQUE_BASE))
        self.links: dict[str, Link] = {}
        self.waiting: dict[str, dict[int, int]] = {p: {} for p in self.peers}   # peer -> opaque -> request code
        self.conns: set[Conn] = set()
        self.enabled_term = 0                   # the term io workers append in (0: refused)
        self.published: tuple | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._grew_pending = False
        self._leading = threading.Event()       # set while leading: the bell is wanted, the watcher threads wait
        self.bell: Bell | None = None           # mq.store.bells: rung by appends while leading (else threads)
        self._bell_seqs: tuple = ()
        self._threads: list[threading.Thread] = []
        self._stopping = False
        self._next_tick = 0.0
        self._last_status = 0.0
        self._last_checkpoint = 0.0
        self.stats = {"pushes_in": 0, "pushes_out": 0, "installs_in": 0, "installs_out": 0, "elections": 0,
                      "responses_dropped": 0, "tick_errors": 0,
                      "stale_requests_in": 0,        # requests of an older term (refused with our term)
                      "pushes_in_fast": 0,           # ... of pushes_in, taken in C (_take_pushes)
                      "damaged_entries_found": 0,    # leader: tries to serve a follower a damaged entry of ours
                      "entries_repaired": 0,         # ... rewritten from a holder's copy (GET)
                      "entries_given": 0,            # copies of our entries given to a member repairing its own
                      "scrub_passes": 0,             # the scrub's walks over every committed entry, completed
                      "scrub_damaged_found": 0}      # damaged entries it found (each counted once)
        # (index, follower) -> (when logged, whether that line named a handover)
        self._damage_logged: dict[tuple[int, str], tuple[float, bool]] = {}
        self._repairs: dict[int, float] = {}         # damaged entry -> when its copy was last asked for
        self.scrub_rate = cfg.dLegerScrubBytesPerSec
        self._scrub_next = 0                          # the next entry the scrub checks
        self._last_scrub = 0.0
        self._scrub_damaged: dict[int, float] = {}   # damaged entries the scrub found, until whole -> when found
        self._repair_opaques: dict[int, int] = {}    # GET opaque -> the entry it asks for
        self._repair_failures: set[int] = set()      # entries whose failed repair was logged
        # (status() adds pushes_out_fast: of pushes_out, those C sent)
        # the follower's steady state in C: the template of (term, leader) _follow_of, None when
        # their names cannot make one; answers are written to _follow_out
        self.fast_follow = cfg.dLegerFastFollowEnable
        self._follow: FollowTemplate | None = None
        self._follow_of: tuple | None = None
        self._follow_out = bytearray(FOLLOW_OUT_BYTES)
        self.follow_read_bytes = FOLLOW_READ_BYTES   # (tests make it small: frames longer than it)

    # ---- lifecycle --------------------------------------------------------------------------------
    async def run(self, stop) -> None:
        """Serves until `stop` (an Event-like with is_set) is set."""
        self.loop = asyncio.get_running_loop()
        self._bell_seqs = (C.SEQ_WRITE, C.SEQ_FLUSH) if self.sync_durable else (C.SEQ_WRITE,)
        bell = Bell(self.ctl, DLEDGER_BELL)
        if bell.usable:
            # the io workers' appends (and SYNC_FLUSH's flushes) ring this loop while it leads;
            # attached first: it drops what a killed predecessor left wanted
            bell.attach(self.loop)
            for seq in self._bell_seqs:
                bell.add(seq, self._log_grew)
            self.bell = bell
        else:                                 # a store without bells (tests): a thread per sequence
            self._watch(C.SEQ_WRITE, "dledger-write-watch")
            if self.sync_durable:
                self._watch(C.SEQ_FLUSH, "dledger-flush-watch")
        host, port = self.peers[self.self_id]
        self.listener = await self._listen(host, port, stop)
        if self.listener is None:            # stopped before the port could be bound
            return
        for p, addr in self.peers.items():
            if p != self.self_id:
                self.links[p] = self._new_link(p, addr)
                self.links[p].dial()
        log.info("DLedger member %s of group %s on %s:%d; peers %s; term %d, log ends at %d (commit %d)",
                 self.self_id, self.group, host, port, ", ".join(p for p in self.peers if p != self.self_id),
                 self.node.term, self.log.last_index(), self.node.commit)
        self._publish(force=True)
        self._next_tick = time.monotonic() + TICK_S
        self._tick_handle = self.loop.call_at(self.loop.time() + TICK_S, self._on_tick)
        while not stop.is_set():
            await asyncio.sleep(0.05)
        await self._stop()

    def _new_link(self, peer: str, addr: tuple[str, int]) -> Link:
        """The link to `peer` (not dialled): a ready leader's reads on it go to C when it may lead."""
        fast = self._lead is not None
        return Link(self.loop, peer, addr, self._on_response, self._send_file, self._link_state,
                    take=self._take_answers if fast else None, read=self._read_answers if fast else None)

    async def _listen(self, host: str, port: int, stop) -> Listener | None:
        """The listener on this member's peer port, once it can be bound; None if `stop` is set
        first.  Until then the member takes no part in the group (it neither dials nor ticks):
        a port held by another process is one ERROR line and retries, not a crash that the
        supervisor would restart every half second with a traceback."""
        episode = Episode(log, f"DLedger {self.self_id}: listening on its peer port {host}:{port} "
                               "(dLegerPeers; it stays out of the group until then)")
        delay_s = LISTEN_RETRY_MIN_S
        while not stop.is_set():
            try:
                listener = Listener(self.loop, host, port, self._accepted)
            except OSError as e:
                episode.failed(e)
                log.debug("DLedger %s: peer port %s:%d: %s; retrying in %.1f s", self.self_id, host, port, e, delay_s)
                deadline = time.monotonic() + delay_s
                while not stop.is_set() and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                delay_s = min(delay_s * 2, LISTEN_RETRY_MAX_S)
                continue
            episode.ok()
            return listener
        return None

    async def _stop(self) -> None:
        if self.node.role is Role.LEADER and self.enabled_term and self.node.progress:   # a group of one: no one to hand to
            best = max((pr.match, p) for p, pr in self.node.progress.items())
            if best[0] >= 0 and self.node.transfer_leadership(best[1]):
                log.info("stopping: handing leadership to %s", best[1])
                self._after_step()
                deadline = time.monotonic() + STOP_TRANSFER_S
                while self.node.role is Role.LEADER and time.monotonic() < deadline:
                    await asyncio.sleep(0.02)
        self._stopping = True
        self._leading.set()                  # the watcher threads see _stopping at once
        if self.bell is not None:
            self.bell.close()
            self.bell = None
        self._tick_handle.cancel()
        self._fence()
        self.listener.close()
        for link in self.links.values():
            link.close()
        for c in list(self.conns):
            c.close("stopping")
        self._write_checkpoint()
        self._write_status()

    def _watch(self, seq: int, name: str) -> None:
        """A thread that wakes the loop (_log_grew) when `seq` moves while this member leads."""
        def run():
            while not self._stopping:
                if not self._leading.is_set():
                    # a follower's own appends and flushes move these sequences too: not news to
                    # it, and a wake for each (a thread switch and the GIL taken back) cost a
                    # follower ~20% of its CPU under load.  _publish sets the event on leading.
                    self._leading.wait(WATCH_IDLE_S)
                    continue
                seen = self.ctl.seq(seq)
                if self.node.role is Role.LEADER and not self._grew_pending:
                    self._grew_pending = True
                    self.loop.call_soon_threadsafe(self._log_grew)
                self.ctl.wait(seq, seen, 200)
        t = threading.Thread(target=run, name=name, daemon=True)
        t.start()
        self._threads.append(t)

    # ---- time -------------------------------------------------------------------------------------
    def _on_tick(self) -> None:
        """Replays the ticks due, then housekeeping.  The next tick is scheduled whatever this one
        raised: a failed tick costs that tick, never the timer (without it the node would never
        campaign again)."""
        if self._stopping:
            return
        try:
            self._tick_once()
        except Exception:
            self.stats["tick_errors"] += 1
            log.exception("DLedger %s: a tick failed", self.self_id)
        self._tick_handle = self.loop.call_at(self.loop.time() + max(0.0, self._next_tick - time.monotonic()),
                                              self._on_tick)

    def _tick_once(self) -> None:
        """A loop late by up to one heartbeat interval (load) replays the ticks it owes, so the
        timers keep real time.  A longer hold-up means this process did not run (SIGSTOP, a
        stalled machine or VM): it could not hear the heartbeats it missed, so that time does
        not count as the leader's silence -- nor, on a leader, as its followers' (check-quorum).
        Replaying it made a whole group stalled together (a VM paused for 3.6 s) resume into an
        election it did not need; etcd's ticker drops such ticks too.  A member stopped alone
        loses nothing by it: the others went on timing, and the first message of a newer term
        sets it right (mq.dledger.sim models the same cap)."""
        now = time.monotonic()
        n = 0
        catchup = self.node.cfg.heartbeat_ticks
        while self._next_tick <= now and n < catchup:
            self.node.tick()
            self._next_tick += TICK_S
            n += 1
        if self._next_tick <= now:             # held up for long: do not replay all of it
            self._next_tick = now + TICK_S
        if n:
            self._after_step()
        self._publish(tick=True)
        self._maybe_enable()
        if now - self._last_status >= STATUS_INTERVAL_S:
            self._write_status()
            self.cl.report_unit_repairs()
            self.cl.release_below_min()   # (the pushes and the scrub map what they read)
        if now - self._last_checkpoint >= self.cfg.checkPointInterval / 1000:
            self._write_checkpoint()
        if self.scrub_rate and now - self._last_scrub >= SCRUB_INTERVAL_S:
            self._scrub(now)
        for link in self.links.values():
            if not link.up:
                link.dial()

    def _log_grew(self) -> None:
        self._grew_pending = False
        if not self._stopping and self.node.role is Role.LEADER:
            if self._lead is not None and self._lead.ld.on:
                self._lead_progress()
                return
            self.node.log_progress()
            self._after_step()

    # ---- after every step ---------------------------------------------------------------------------
    def _after_step(self, request=None) -> list:
        """Persist, publish, send.  request: the core message the step handled, if it was a
        request; the response the core produced for it is returned, for the caller to send on
        the request's connection with its opaque.  Requests go out on our links.  A response
        that answers no request in hand (the core promises none: mq.dledger.core.RESPONSE_TO)
        is logged and dropped -- Raft survives a lost message, a link does not survive a raise."""
        rd = self.node.ready()
        if rd.hard_state is not None:
            try:
                save_hard_state(self.dir, *rd.hard_state)
            except OSError as e:
                # nothing that depends on it may leave: a vote or a term a crash would forget
                self.stats["hard_state_failures"] = self.stats.get("hard_state_failures", 0) + 1
                log.error("DLedger %s: term %d / vote %s not saved (%s): %d message(s) not sent; the next "
                          "step tries again", self.self_id, rd.hard_state[0], rd.hard_state[1], e,
                          len(rd.messages))
                return []
            self.node.saved(rd.hard_state)
        if rd.damaged:
            self._report_damage(rd.damaged)
        self._publish()
        want = RESPONSE_TO.get(type(request)) if request is not None else None
        replies = []
        for m in rd.messages:
            if not isinstance(m, RESPONSES):
                self._send(m)
            elif want is not None and isinstance(m, want) and m.dst == request.src and not replies:
                replies.append(m)
            else:
                self.stats["responses_dropped"] += 1
                log.error("DLedger %s: the core answered %s with %r: not a response to it; dropped", self.self_id,
                          type(request).__name__ if request is not None else "no request", m)
        return replies

    def _report_damage(self, found: list) -> None:
        """The core found entries of ours it cannot serve (mq.dledger.core, LogDamaged): counted,
        and one line per entry and follower a minute (the core retries once a heartbeat), and one
        more when a later try hands leadership over."""
        now = time.monotonic()
        for index, follower, holder, to in found:
            self.stats["damaged_entries_found"] += 1
            if holder is not None and to is None:
                self._ask_repair(index, holder, now)
            key = (index, follower)
            when, handed = self._damage_logged.get(key, (-DAMAGE_LOG_INTERVAL_S, False))
            if now - when < DAMAGE_LOG_INTERVAL_S and (handed or to is None):
                continue
            self._damage_logged[key] = (now, to is not None)
            if len(self._damage_logged) > 1024:
                self._damage_logged = {k: v for k, v in self._damage_logged.items()
                                       if now - v[0] < DAMAGE_LOG_INTERVAL_S}
            what = (f"leadership goes to {to}, which holds it" if to is not None else
                    f"asking {holder}, which holds it, for its copy" if holder is not None else
                    "no member holding it answered lately: it waits there, tried again each heartbeat")
            log.error("DLedger %s: entry %d of our log is damaged (it fails its checks; not sent) and follower %s "
                      "needs it: %s", self.self_id, index, follower, what)

    def _scrub(self, now: float) -> None:
        """The scrub: committed entries read back with their CRCs at scrub_rate, in a loop over the
        log (mq_dledger_scrub, a few entries a call); one found damaged is asked of a member that
        holds it (the leader, or as leader the follower furthest ahead) until it is whole again."""
        budget = max(1, int(self.scrub_rate * min(1.0, now - self._last_scrub)))
        self._last_scrub = now
        first, commit = self.log.first_index(), self.ctl.get(C.POS_DL_COMMIT_INDEX) - 1
        for index in list(self._scrub_damaged):          # found earlier: asked again until whole
            try:
                whole = not first <= index <= commit or self.cl.dledger_first_damaged(index, index) > index
            except StoreError:
                whole = False
            if whole:
                del self._scrub_damaged[index]
            else:
                self._ask_holder(index, now)
        if commit < first:
            return
        at = max(self._scrub_next, first)
        if at > commit:
            at = first
            self.stats["scrub_passes"] += 1
        try:
            bad, self._scrub_next = self.cl.dledger_scrub(at, commit, budget)
        except StoreError as e:                           # (retention moved the first entry meanwhile)
            log.debug("DLedger %s: scrub of entries %d..%d: %s", self.self_id, at, commit, e)
            self._scrub_next = first
            return
        if bad is not None and bad not in self._scrub_damaged and len(self._scrub_damaged) < 1024:
            self._scrub_damaged[bad] = now
            self.stats["scrub_damaged_found"] += 1
            log.error("DLedger %s: scrub: entry %d of our log is damaged (it fails its checks; never served): "
                      "asking a member that holds it for its copy", self.self_id, bad)
            self._ask_holder(bad, now)

    def _ask_holder(self, index: int, now: float) -> None:
        """_ask_repair of the member to ask for committed entry `index`: as leader the follower
        furthest ahead that holds it and answered lately, as follower the leader."""
        node = self.node
        if node.role is Role.LEADER:
            holder = node.holder_of(index)
        else:
            holder = node.leader_id if node.leader_id != self.self_id else None
        if holder is not None:
            self._ask_repair(index, holder, now)

    def _ask_repair(self, index: int, holder: str, now: float) -> None:
        """Asks `holder` for its copy of our damaged entry `index` (GET; _repair_from answers),
        at most once per REPAIR_RETRY_S an entry."""
        if now - self._repairs.get(index, -REPAIR_RETRY_S) < REPAIR_RETRY_S:
            return
        link = self.links.get(holder)
        if link is None or not link.up:
            return
        self._repairs[index] = now
        if len(self._repairs) > 1024:
            self._repairs = {i: t for i, t in self._repairs.items() if now - t < REPAIR_RETRY_S}
        opaque = next(self.opaques)
        self._remember(holder, opaque, RPC.GET)
        self._repair_opaques[opaque] = index
        if len(self._repair_opaques) > 1024:
            del self._repair_opaques[next(iter(self._repair_opaques))]
        link.send(request_frame(RPC.GET, opaque, RPC.encode(RPC.GET, False, {
            "group": self.group, "localId": self.self_id, "remoteId": holder, "term": self.node.term,
            "beginIndex": index})))

    def _repair_from(self, peer: str, opaque: int, f: dict, body) -> None:
        """A holder's answer to _ask_repair: our damaged entry rewritten from its copy, which the
        store checks whole and fitting our log there (csrc/dledger.h, mq_dledger_repair_entry);
        the core's next probe then serves it."""
        index = self._repair_opaques.pop(opaque, None)
        if index is None:
            return
        if f["code"] != RPC.SUCCESS:
            self._repair_failed(index, f"{peer} has no whole copy of it to give (code {f['code']})")
            return
        try:
            repaired = self.cl.dledger_repair_entry(index, body)
        except (StoreError, ValueError) as e:
            self._repair_failed(index, f"{peer}'s copy not taken ({type(e).__name__}: {e})")
            return
        self._repairs.pop(index, None)
        self._repair_failures.discard(index)
        self._scrub_damaged.pop(index, None)
        if repaired:
            self.stats["entries_repaired"] += 1
            log.warning("repaired: DLedger %s: entry %d of our log was damaged (it failed its checks); rewritten "
                        "from %s's copy", self.self_id, index, peer)

    def _repair_failed(self, index: int, why: str) -> None:
        """One line per damaged entry for the first failed repair (it is asked again each second)."""
        if index in self._repair_failures or len(self._repair_failures) >= 1024:
            return
        self._repair_failures.add(index)
        log.error("DLedger %s: repairing our damaged entry %d: %s; asking again", self.self_id, index, why)

    def _answer_get(self, conn: Conn, opaque: int, f: dict) -> None:
        """A member asks for our copy of one committed entry (its own is damaged: _ask_repair): the
        entry's bytes if we hold it committed and whole, else INCONSISTENT_STATE."""
        index = f["beginIndex"]
        node, lg = self.node, self.log
        code, body = RPC.INCONSISTENT_STATE, b""
        if lg.first_index() <= index <= min(node.commit, lg.last_index()):
            try:
                if self.cl.dledger_first_damaged(index, index) == index + 1:
                    pos, size, _ = self.cl.dledger_entry(index)
                    body = bytes(self.cl.view_raw(pos, size))
                    code = RPC.SUCCESS
            except StoreError:                  # (damaged, or gone to retention meanwhile)
                body = b""
        conn.replies.append(response_frame(opaque, RPC.encode(RPC.GET, True, {"term": node.term, "code": code}),
                                           body))
        self.stats["entries_given"] += code == RPC.SUCCESS

    def _publish(self, force: bool = False, tick: bool = False) -> None:
        node = self.node
        if self._lead is not None:
            self._lead_sync()
        # a leader publishes every commit at once (senders wait for it); a follower's commit only
        # serves reads from it and its dispatch, so it goes out once a tick (fewer wakeups)
        if node.role is Role.LEADER or tick or force:
            commit_next = node.commit + 1
            if commit_next > self.ctl.get(C.POS_DL_COMMIT_INDEX):
                self.cl.dledger_set_commit(commit_next)
        if self.enabled_term and not (node.is_ready_leader and node.term == self.enabled_term):
            self._fence()
        state = (node.role, node.term, node.leader_id, self.enabled_term)
        if force or state != self.published:
            leading = node.role is Role.LEADER
            if leading != self._leading.is_set():
                if leading:
                    self._leading.set()
                else:
                    self._leading.clear()
                if self.bell is not None:
                    for seq in self._bell_seqs:
                        self.bell.want(seq, leading)
                    if leading:              # appended between the last look and the want
                        self.loop.call_soon(self._log_grew)
            if self.published is None or state[:3] != self.published[:3]:
                log.info("DLedger %s: %s in term %d%s", self.self_id, node.role.value, node.term,
                         f", leader {node.leader_id}" if node.leader_id and node.leader_id != self.self_id else "")
            self.published = state
            self._write_status()
            self.ctl.wake(C.SEQ_ROLE)

    def _fence(self) -> None:
        if self.enabled_term or self.ctl.get(C.POS_DL_APPEND_TERM):
            self.cl.dledger_set_append_term(0)
            if self.enabled_term:
                log.info("DLedger %s: no longer serving writes (term %d)", self.self_id, self.enabled_term)
            self.enabled_term = 0

    def _maybe_enable(self) -> None:
        """A ready leader serves writes once dispatch reached the end and queue offsets are reset."""
        node = self.node
        if not node.is_ready_leader or self.enabled_term == node.term:
            return
        write = self.ctl.get(C.POS_WRITE)
        if self.ctl.get(C.POS_COMMITTED) < write or self.ctl.get(C.POS_DISPATCHED) < write:
            return                           # the next tick looks again
        self.ctl.reset_next_offsets()
        self.cl.dledger_set_append_term(node.term)
        self.enabled_term = node.term
        log.info("DLedger %s: leader of term %d serves writes (log ends at index %d)", self.self_id, node.term,
                 self.log.last_index())
        self._publish()

    # ---- outgoing ---------------------------------------------------------------------------------
    def _common(self, m) -> dict:
        return {"group": self.group, "localId": self.self_id, "remoteId": m.dst, "term": m.term}

    def _send(self, m) -> None:
        """A request of ours to its destination's link (responses never come here: _after_step)."""
        link = self.links.get(m.dst)
        if link is None:
            return
        opaque = next(self.opaques)
        if isinstance(m, Append):
            b = m.entries
            table = self._install_table(b.pos) if m.install else b""
            if table is None:
                return                          # not ready: the probe goes again with the next heartbeat
            ext = RPC.push_ext(self.group, m.src, m.dst, m.term, m.prev_index, m.prev_term, m.commit,
                               b.first_index if b else m.prev_index + 1, m.count, b.pos if b else -1,
                               b.nbytes if b else 0, len(table) if m.install else -1)
            code = RPC.PUSH
            if b is not None:
                self._remember(m.dst, opaque, code)
                head = request_frame(code, opaque, ext, len(table) + b.nbytes) + table
                if link.send_range(head, b.pos, b.nbytes):
                    self.stats["installs_out" if m.install else "pushes_out"] += 1
                return
            frame = request_frame(code, opaque, ext)
        elif isinstance(m, Heartbeat):
            code = RPC.HEART_BEAT
            frame = request_frame(code, opaque, RPC.encode(code, False, {
                **self._common(m), "leaderId": m.src, "commitIndex": m.commit, "brokerAddr": self.broker_addr}))
        elif isinstance(m, VoteReq):
            code = RPC.VOTE
            if not m.pre:
                self.stats["elections"] += 1
            frame = request_frame(code, opaque, RPC.encode(code, False, {
                **self._common(m), "ledgerEndIndex": m.last_index, "ledgerEndTerm": m.last_term,
                "preVote": m.pre, "transfer": m.transfer, "brokerAddr": self.broker_addr}))
        elif isinstance(m, TimeoutNow):
            code = RPC.LEADERSHIP_TRANSFER
            frame = request_frame(code, opaque, RPC.encode(code, False, {
                **self._common(m), "leaderId": m.src, "transfereeId": m.dst}))
        else:
            raise AssertionError(f"no wire form for request {m!r}")      # a message kind added to the core only
        self._remember(m.dst, opaque, code)
        link.send(frame)

    def _install_table(self, pos: int) -> bytes | None:
        """What an install at our first position carries: every queue's offset there.  Computed
        on a thread (it reads every ConsumeQueue: seconds on a cold disk, which would stall the
        heartbeats), cached per position (it moves only when retention deletes a file); None
        until it is ready."""
        cached = self._install_tables.get(pos)
        if cached is not None:
            return cached
        if self._table_job is None or self._table_job[0] != pos:
            fut = self.loop.run_in_executor(None, self._compute_table, pos)
            self._table_job = (pos, fut)

            def done(f, pos=pos):
                if self._table_job is not None and self._table_job[1] is f:
                    self._table_job = None
                if not f.cancelled() and f.exception() is None and f.result() is not None:
                    self._install_tables = {pos: f.result()}
                elif not f.cancelled() and f.exception() is not None:
                    log.error("DLedger %s: the install table at %d could not be made: %s", self.self_id, pos,
                              f.exception())
            fut.add_done_callback(done)
        return None

    def _compute_table(self, pos: int) -> bytes | None:
        """(thread) The table, or None while our ConsumeQueues do not describe `pos` yet: not
        dispatched that far, or an install of our own still being finished."""
        if self.ctl.get(C.POS_DISPATCHED) < pos or self.log.install_pending():
            return None
        return RPC.install_table(self.store.queue_offsets_below(pos))

    def _remember(self, peer: str, opaque: int, code: int) -> None:
        w = self.waiting[peer]
        if len(w) >= OPAQUES_PER_LINK_MAX:
            del w[next(iter(w))]
        w[opaque] = code

    def _send_file(self, fd: int, head: bytes, pos: int, nbytes: int, done: int):
        return self.cl.dledger_send(fd, head, pos, nbytes, done)

    def _link_state(self, peer: str, up: bool) -> None:
        if not up:
            self.waiting[peer].clear()
            self.node.peer_down(peer)

    # ---- incoming responses (on our links) ----------------------------------------------------------
    def _on_response(self, conn: Conn, cmd, body) -> None:
        peer = next((p for p, link in self.links.items() if link.conn is conn), None)
        if peer is None or not cmd.is_response:
            conn.close("a request on an outgoing link")
            return
        code = self.waiting[peer].pop(cmd.opaque, None)
        if code is None:
            if cmd.opaque < LeadState.OPAQUE_BASE:
                return                          # an answer we no longer wait for
            code = RPC.PUSH                     # to a push C sent (_take_answers: C left it to us)
        me = self.self_id
        f = RPC.decode(code, True, cmd.ext_fields) if code != RPC.PUSH else None
        if code == RPC.GET:
            self._repair_from(peer, cmd.opaque, f, body)
            return
        if code == RPC.PUSH:
            term, ok, index, reject, hint = RPC.push_resp_values(cmd.ext_fields)
            m = AppendResp(term, peer, me, ok, index, reject_index=reject, hint_index=hint)
        elif code == RPC.VOTE:
            m = VoteResp(f["term"], peer, me, f["voteResult"] == RPC.ACCEPT, pre=bool(f["preVote"]))
        elif code == RPC.HEART_BEAT:
            m = HeartbeatResp(f["term"], peer, me)
        else:
            return                              # LEADERSHIP_TRANSFER: nothing to learn
        self.node.step(m)
        self._after_step()

    # ---- incoming requests (on accepted connections) ------------------------------------------------
    def _accepted(self, sock, addr) -> None:
        conn = Conn(self.loop, sock, self._on_request, self._conn_closed, f"from {addr[0]}:{addr[1]}",
                    on_batch_end=self._end_of_batch, take=self._take_pushes if self.fast_follow else None,
                    read=self._read_pushes if self.fast_follow else None)
        self.conns.add(conn)

    def _follow_template(self) -> FollowTemplate | None:
        """The template of the pushes C may take: from the leader we follow, in its term."""
        node = self.node
        if node.role is not Role.FOLLOWER or node.leader_id is None:
            return None
        if self._follow_of != (node.term, node.leader_id):
            cut = follow_template(self.group, node.leader_id, self.self_id, node.term)
            self._follow = None if cut is None else FollowTemplate(*cut, node.term, FRAME_IN_MAX)
            self._follow_of = (node.term, node.leader_id)
        return self._follow

    def _read_pushes(self, conn: Conn) -> bool:
        """A follower's read in one C call (mq_dledger_follow_read): the receive, the pushes
        _take_pushes would take, and their answers sent (after the flush under SYNC_FLUSH), no
        byte of them through Python.  False: not a follower, or a connection not (yet) known to
        be our leader's (a frame of it handled names it): Conn reads its own way.  What C
        does not take -- a frame of another kind, or one longer than FOLLOW_READ_BYTES -- moves
        to conn.rbuf and Conn's own path goes on from there, in order; an incomplete frame Conn
        left in rbuf moves the other way first (rbuf never holds a whole frame between reads)."""
        rd = conn.reader
        t = self._follow_template()
        if t is None or conn.peer != self.node.leader_id or len(conn.rbuf) >= self.follow_read_bytes:
            # (the buffers only for our leader's connection); the start of a frame the reader
            # kept goes first: we stopped following while the rest of it was on its way
            _reader_to_rbuf(conn)
            return False
        if rd is None:
            rd = conn.reader = FollowReader(self.follow_read_bytes, FOLLOW_OUT_BYTES)
        r = rd.r
        if conn.rbuf:
            assert not r.have, "the reader and rbuf both hold bytes"    # (one of the two does)
            r.have = n = len(conn.rbuf)
            rd.buf[:n] = conn.rbuf
            conn.rbuf = bytearray()
        try:
            r = self.cl.dledger_follow_read(t, conn.fd, rd, not conn.out, self.sync_durable)
        except StoreError as e:
            log.error("DLedger %s: flushing received entries failed (%s): not acknowledging them", self.self_id, e)
            conn.close("flush failed")
            return True
        tk = r.taken
        if tk.frames:
            if tk.stop:                     # unsent: they leave with the answers of what follows
                conn.replies.append(bytes(memoryview(rd.out)[:tk.out_len]))
            elif r.sent < tk.out_len:
                conn.send(bytes(memoryview(rd.out)[r.sent:tk.out_len]))
            self._took(conn, tk)
        if r.err:
            conn.close(f"receive or send failed: {os.strerror(r.err)}")
        elif r.eof:
            conn.close("closed by the peer")
        elif tk.stop or r.have == len(rd.buf):
            conn.rbuf += memoryview(rd.buf)[:r.have]
            r.have = 0
            conn._frames(tk.frames if tk.stop else 0)
        return True

    def _took(self, conn: Conn, r) -> None:
        """C took r.frames pushes on conn (an mq_dl_taken): the core hears that its leader was heard
        and where the commit is (RaftNode.took_appends)."""
        node = self.node
        if conn.peer is None:
            conn.peer = node.leader_id
        node.took_appends(node.leader_id, r.commit)
        self.log.appended += r.entries
        self.stats["pushes_in"] += r.frames
        self.stats["pushes_in_fast"] += r.frames

    def _take_pushes(self, conn: Conn) -> int:
        """A follower's steady state in one C call per read (mq_dledger_follow_take): the PUSH
        frames at the start of the read (or after a frame _on_request handled: Conn._frames)
        that the core would append at the end of our log, from the leader it follows, in its
        term, are appended and answered there; the core then learns that its leader was heard
        and where the commit is (RaftNode.took_appends).  The first frame C does not take goes
        to _on_request, in order.  The answers wait in conn.replies for _end_of_batch (which flushes
        first under SYNC_FLUSH)."""
        t = self._follow_template() if len(conn.rbuf) >= FOLLOW_MIN_BYTES else None
        if t is None:
            return 0
        r = self.cl.dledger_follow_take(t, conn.rbuf, self._follow_out)
        if not r.frames:
            return 0
        try:
            del conn.rbuf[:r.consumed]
        except BufferError:                 # a view of it outlived its handler (as Conn._frames)
            conn.rbuf = conn.rbuf[r.consumed:]
        conn.replies.append(bytes(memoryview(self._follow_out)[:r.out_len]))
        self._took(conn, r)
        return r.frames

    # ---- a ready leader's steady state in C (mq.dledger.lead) -----------------------------------
    def _new_progress(self, peer: str, next_index: int) -> CProgress:
        return CProgress(self._lead.ld.peer[self._lead_slot[peer]], next_index)

    def _lead_sync(self) -> None:
        """After each step of the core and each tick: may C lead (a ready leader: its no-op
        committed, no transfer in progress), and the core's commit and clock, which C reads."""
        node, ld = self.node, self._lead.ld
        on = node.role is Role.LEADER and node.is_ready_leader
        if on and self._lead_term != node.term:
            cut = lead_templates(self.group, self.self_id, self._lead_peers, node.term)
            self._lead_ok = cut is not None and self._lead.set_templates(node.term, *cut)
            self._lead_term = node.term
        ld.on = int(on and self._lead_ok)
        ld.commit = node.commit
        ld.ticks = node.ticks

    def _lead_fd(self, peer: str) -> int:
        """The socket C may write pushes to: the link's, while nothing waits in its queue."""
        conn = self.links[peer].conn
        return conn.fd if conn is not None and not conn.closed and not conn.out else -1

    def _take_answers(self, peer: str, conn: Conn) -> int:
        """A ready leader's steady state in one C call per read on a link (mq_dledger_lead_take):
        the follower's SUCCESS answers to our pushes at the start of the read are applied to its
        Progress and the commit as the core would, and the next pushes go out from C; the rest
        of the read goes to _on_response in order."""
        lead = self._lead
        ld = lead.ld
        i = self._lead_slot[peer]
        if not ld.on or not ld.peer[i].replicate:
            return 0
        ld.peer[i].fd = self._lead_fd(peer)
        r = self.cl.dledger_lead_take(lead, i, conn.rbuf)
        if r.consumed:
            try:
                del conn.rbuf[:r.consumed]
            except BufferError:             # a view of it outlived its handler (as Conn._frames)
                conn.rbuf = conn.rbuf[r.consumed:]
        frames = r.frames
        self._lead_after((i,), r.stop if r.stop < 0 else 0)
        return frames

    def _read_answers(self, peer: str, conn: Conn) -> bool:
        """A ready leader's read on the link to `peer` in one C call (mq_dledger_lead_read): the
        receive and what _take_answers takes, no byte of it through Python (the leader's role
        0.4 us a message less than Conn's path with _take_answers, six pairs, 2026-11-28).
        False: C does not lead this follower now, or Conn's path
        holds the start of a frame: Conn reads its own way, and an incomplete frame the reader
        kept moves to conn.rbuf first (one of the two holds bytes).  What C does not take -- a
        frame of another kind, or one longer than LEAD_READ_BYTES -- moves to conn.rbuf and
        Conn's path goes on from there, in order."""
        rd = conn.reader
        ld = self._lead.ld
        i = self._lead_slot[peer]
        if not ld.on or not ld.peer[i].replicate or conn.rbuf:
            _reader_to_rbuf(conn)
            return False
        if rd is None:
            rd = conn.reader = FollowReader(LEAD_READ_BYTES)
        ld.peer[i].fd = self._lead_fd(peer)
        r = self.cl.dledger_lead_read(self._lead, i, conn.fd, rd)
        tk = r.taken
        if tk.frames:
            self._lead_after((i,), tk.stop if tk.stop < 0 else 0)
        if r.err:
            conn.close(f"receive failed: {os.strerror(r.err)}")
        elif r.eof:
            conn.close("closed by the peer")
        elif (tk.stop or r.have == len(rd.buf)) and not conn.closed:
            conn.rbuf += memoryview(rd.buf)[:r.have]
            r.have = 0
            conn._frames()
        return True

    def _lead_progress(self) -> None:
        """Our log grew: the commit and one push to each follower, as core.log_progress, in C."""
        ld = self._lead.ld
        for i, peer in enumerate(self._lead_peers):
            ld.peer[i].fd = self._lead_fd(peer)
        self._lead_after(range(len(self._lead_peers)), self.cl.dledger_lead_progress(self._lead), fill=False)

    def _lead_after(self, slots, rc: int, fill: bool = True) -> None:
        """What C left to us: the commit it moved (the core's), a push it could only partly
        write (queued on the connection), a follower whose connection failed (closed: the core
        probes it again), and followers whose window it could not fill (the core's path: a
        queue, a dead link, an install), which the core then serves -- filled after an answer,
        one push after the log grew (fill False), as it would have."""
        ld = self._lead.ld
        node = self.node
        node.commit = ld.commit
        wanted, errs = [], []
        for i in slots:
            pe = ld.peer[i]
            peer = self._lead_peers[i]
            conn = self.links[peer].conn
            if pe.blocked:
                pe.blocked = 0
                if conn is not None:
                    conn.queue_partial(self._lead.blocked_head(i), pe.blk_pos, pe.blk_nbytes, pe.blk_done)
            if pe.err:
                err, pe.err, pe.want = pe.err, 0, 0
                errs.append(err)
                log.error("DLedger %s: pushing entries to %s failed (%s); dropping the connection", self.self_id,
                          peer, self._rc_text(err))
                if conn is not None:
                    conn.close("a push failed")
                continue
            if pe.want:
                pe.want = 0
                wanted.append(peer)
        if rc < 0 and rc not in errs:            # the commit's: reading an index unit of ours failed
            log.error("DLedger %s: moving the commit failed (%s)", self.self_id, self._rc_text(rc))
        if wanted:
            for peer in wanted:
                if fill:
                    node.fill(peer)
                else:
                    node.send_append(peer)
            self._after_step()

    def _rc_text(self, rc: int) -> str:
        try:
            check(rc)
        except StoreError as e:
            if isinstance(e, StoreIOError):
                return f"{type(e).__name__}: {os.strerror(self.cl.errno())}"
            return type(e).__name__
        return str(rc)

    def _conn_closed(self, conn: Conn, why: str) -> None:
        self.conns.discard(conn)
        if not self._stopping:
            log.info("DLedger %s: connection %s closed: %s", self.self_id, conn.label, why)

    def _on_request(self, conn: Conn, cmd, body) -> None:
        if cmd.is_response:
            conn.close("a response on an incoming connection")
            return
        code = cmd.code
        if code == RPC.METADATA:
            status = json.dumps(self.status()).encode()
            conn.replies.append(response_frame(cmd.opaque, RPC.encode(code, True, {"code": RPC.SUCCESS}), status))
            return
        if code == RPC.LEADERSHIP_TRANSFER and not (cmd.ext_fields or {}).get("localId"):
            self._admin_transfer(conn, cmd)
            return
        if code not in (RPC.PUSH, RPC.HEART_BEAT, RPC.VOTE, RPC.LEADERSHIP_TRANSFER, RPC.GET):
            conn.close(f"request code {code} is not served on the DLedger port")
            return
        f = RPC.decode(code, False, cmd.ext_fields)
        src = f["localId"]
        if f["group"] != self.group or f["remoteId"] != self.self_id or src not in self.peers or src == self.self_id:
            log.warning("DLedger %s: a %s from %s for group %s member %s refused", self.self_id,
                        RPC.CODE_NAMES[code], src, f["group"], f["remoteId"])
            conn.close("not a member of this group")
            return
        conn.peer = src
        me = self.self_id
        # a candidate's votes and a leader's heartbeats carry its broker address: every member
        # knows a new leader's before its first heartbeat (io workers forward writes there)
        addr = f.get("brokerAddr") if code in (RPC.HEART_BEAT, RPC.VOTE) else None
        learned = bool(addr) and self.broker_addrs.get(src) != addr and BROKER_ADDR_RE.fullmatch(addr) is not None
        if learned:
            self.broker_addrs[src] = addr
        if code == RPC.GET:
            self._answer_get(conn, cmd.opaque, f)
            return
        if code == RPC.PUSH:
            count, size = f["count"], f["bodySize"]
            install, table_size = bool(f["install"]), f["tableSize"] or 0
            if size + table_size != len(body) or (count == 0) != (size == 0) or count < 0 or table_size < 0 \
                    or (count and f["firstIndex"] != f["prevIndex"] + 1) or (install and not count):
                raise WireError(f"PUSH of {count} entries says {size} + {table_size} bytes, carries {len(body)}")
            if install and self.log.install_pending():
                # the dispatcher is still finishing an earlier install: no answer (the leader resends)
                if not self._install_wait_logged:
                    self._install_wait_logged = True
                    log.info("DLedger %s: an install from %s waits for the previous one to finish", me, src)
                return
            self._install_wait_logged = False
            table = RPC.parse_install_table(body[:table_size]) if install else None
            if table_size:
                body = memoryview(body)[table_size:]
            batch = InBatch(body, f["firstIndex"], count, f["firstPos"], table) if count else None
            m = Append(f["term"], src, me, f["prevIndex"], f["prevTerm"], batch, f["commitIndex"], install=install)
            self.log.set_term_bound(f["term"])
            self.stats["installs_in" if install else "pushes_in"] += 1
        elif code == RPC.HEART_BEAT:
            m = Heartbeat(f["term"], src, me, f["commitIndex"])
        elif code == RPC.VOTE:
            m = VoteReq(f["term"], src, me, f["ledgerEndIndex"], f["ledgerEndTerm"], pre=bool(f["preVote"]),
                        transfer=bool(f["transfer"]))
        else:
            if f["term"] is None:
                raise WireError(f"LEADERSHIP_TRANSFER from member {src} without a term")
            m = TimeoutNow(f["term"], src, me)
        if m.term < self.node.term:
            self.stats["stale_requests_in"] += 1
        try:
            self.node.step(m)
        except CorruptRecord as e:
            log.error("DLedger %s: entries from %s refused (%s); dropping the connection", me, src, e)
            # the answers to this read's earlier requests (entries stored) still leave, as they
            # would have had the read ended before this one (the C reader's reads end anywhere)
            self._end_of_batch(conn)
            conn.close("corrupt entries")
            self._after_step(m)
            return
        except Exception:
            # what the step did before it raised is persisted and its requests leave now; an
            # answer it made is dropped (the peer resends), so no later request can take it for its own
            self._after_step(m)
            raise
        for r in self._after_step(m):
            conn.replies.append(self._reply_frame(cmd.opaque, r))
        if learned:
            self._write_status()

    def _reply_frame(self, opaque: int, r) -> bytes:
        """The response frame of r (of the request's kind: _after_step)."""
        if isinstance(r, AppendResp):
            ext = RPC.push_resp_ext(r.term, r.success, r.index, r.reject_index, r.hint_index)
        elif isinstance(r, VoteResp):
            ext = RPC.encode(RPC.VOTE, True, {"term": r.term, "voteResult": RPC.ACCEPT if r.granted else RPC.REJECT,
                                              "preVote": r.pre})
        else:
            assert isinstance(r, HeartbeatResp), r
            ext = RPC.encode(RPC.HEART_BEAT, True, {"term": r.term, "code": RPC.SUCCESS})
        return response_frame(opaque, ext)

    def _end_of_batch(self, conn: Conn) -> None:
        """The replies to one read's requests leave together -- under SYNC_FLUSH after one flush
        made every entry they acknowledge durable."""
        if not conn.replies:
            return
        if self.sync_durable and self.ctl.get(C.POS_FLUSHED) < self.ctl.get(C.POS_WRITE):
            try:
                self.cl.flush(0)
            except StoreError as e:
                log.error("DLedger %s: flushing received entries failed (%s): not acknowledging them",
                          self.self_id, e)
                conn.replies.clear()
                conn.close("flush failed")
                return
        data, conn.replies = b"".join(conn.replies), []
        conn.send(data)

    def _admin_transfer(self, conn: Conn, cmd) -> None:
        f = RPC.decode(RPC.LEADERSHIP_TRANSFER, False, cmd.ext_fields)
        target = f["transfereeId"]
        if self.node.role is not Role.LEADER:
            ext = {"code": RPC.NOT_LEADER, "leaderId": self.node.leader_id, "term": self.node.term}
        elif target == self.self_id:
            ext = {"code": RPC.SUCCESS, "leaderId": self.self_id, "term": self.node.term}
        elif self.node.transfer_leadership(target):
            log.info("DLedger %s: leadership transfer to %s requested by an operator", self.self_id, target)
            ext = {"code": RPC.SUCCESS, "leaderId": self.self_id, "term": self.node.term}
            self._after_step()
        else:
            ext = {"code": RPC.UNKNOWN_MEMBER, "leaderId": self.self_id, "term": self.node.term}
        conn.replies.append(response_frame(cmd.opaque, RPC.encode(RPC.LEADERSHIP_TRANSFER, True, ext)))

    # ---- status ---------------------------------------------------------------------------------------
    def status(self) -> dict:
        st = self.node.status()
        host, port = self.peers[self.self_id]
        leader = self.node.leader_id
        st.update({"group": self.group, "selfId": self.self_id, "addr": f"{host}:{port}",
                   "leaderAddr": "%s:%d" % self.peers[leader] if leader in self.peers else None,
                   "brokerAddr": self.broker_addr,
                   "leaderBrokerAddr": self.broker_addr if leader == self.self_id else self.broker_addrs.get(leader),
                   "ready": bool(self.enabled_term), "peersAddr": {p: "%s:%d" % a for p, a in self.peers.items()},
                   "committedPos": self.ctl.get(C.POS_COMMITTED), "writePos": self.ctl.get(C.POS_WRITE),
                   # index units rewritten from their entries by this process (csrc/dledger.h)
                   "indexUnitsRepaired": self.cl.dledger_units_repaired()[0],
                   "updated": int(time.time() * 1000), "stats": self._stats()})
        return st

    def _stats(self) -> dict:
        st = dict(self.stats)
        if self._lead is not None:          # pushes C sent (_take_answers, _lead_progress)
            st["pushes_out_fast"] = sum(self._lead.ld.peer[i].pushes for i in range(len(self._lead_peers)))
            st["pushes_out"] += st["pushes_out_fast"]
        return st

    def _write_status(self) -> None:
        self._last_status = time.monotonic()
        try:
            replace_file(os.path.join(self.cfg.storePathRootDir, STATUS_FILE), json.dumps(self.status()))
        except OSError as e:
            self._status_episode.failed(e)
        else:
            self._status_episode.ok()

    def _write_checkpoint(self) -> None:
        self._last_checkpoint = time.monotonic()
        try:
            save_checkpoint(self.dir, self.log.last_index(), self.node.commit)
        except OSError as e:
            self._checkpoint_episode.failed(e)
        else:
            self._checkpoint_episode.ok()


def dledger_role_main(store_config_values: dict, store_host: str, store_port: int, stop) -> None:
    """Entry point of the DLedger role process (forked by the broker's launcher)."""
    import signal
    from mq.logs import ensure_logging
    from mq.store import MessageStore
    signal.signal(signal.SIGTERM, signal.SIG_IGN)     # stopped through `stop` by the supervisor
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    ensure_logging("dledger")
    cfg = StoreConfig(**store_config_values)
    store = MessageStore.attach(cfg, store_host, store_port, cq_writable=False, prepare_files=False)
    try:
        mq_loop.run(DLedgerRole(store, cfg, broker_addr=f"{store_host}:{store_port}").run(stop))
    finally:
        store.close()


__all__ = ["DLedgerRole", "dledger_role_main", "raft_config", "read_status", "STATUS_FILE", "TICK_S"]
