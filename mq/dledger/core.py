"""Raft as a deterministic state machine: the heart of DLedger mode.

Inputs are messages (`step`), ticks of a logical clock (`tick`), and news
about the local log (`log_progress`); outputs are collected in a `Ready`:
messages to send and the hard state (term, vote) that must be durable
*before* any of those messages leaves.  Nothing here reads a clock, a
socket, a random source of its own or a file: the broker's DLedger role
(mq.dledger.role) drives it with real time and the CommitLog in DLedger mode,
and the seeded simulator (mq.dledger.sim) drives the very same code with a
fake clock, an in-memory log and a network that loses, delays, duplicates,
reorders and partitions.

Roles are DLedger's -- FOLLOWER, CANDIDATE, LEADER -- plus what Raft's
authors recommend and DLedger lacks (Ongaro's thesis, §4.2.3, §6.2, §9.6):
  * pre-vote: a node whose election timer fires first asks "would you vote
    for me?" without raising its term; only a majority of yeses starts the
    real election.  A node that was cut off and comes back cannot disrupt a
    healthy leader by bumping the term.
  * check-quorum and leases: a leader that has not heard from a majority
    within an election timeout steps down; a follower that heard from a
    leader within the minimum election timeout ignores vote requests
    (except a leadership transfer's).
  * leadership transfer (TimeoutNow): used for the preferred leader and
    for `mqadmin`.
  * a new leader appends a no-op entry of its own term at once: entries of
    earlier terms are committed only by committing one of the current term
    (§5.4.2), and the leader is "ready" (serves writes) once its no-op is
    committed.

Indexes follow DLedger: the first entry has index 0; "no entry" is index -1
with term 0.  `commit` is the highest committed index (-1: none).

Log interface the core calls synchronously (a deterministic function of the
calls made so far; see SimLog in mq.dledger.sim and DLedgerLog in
mq.dledger.log):
    last_index() -> int              -1 when empty (first_index() - 1 after an install)
    last_term() -> int               0 when empty
    first_index() -> int             index of the first entry still held; every entry
                                     below it is committed (retention deletes only those)
    term_at(index) -> int | None     term of entry `index`; 0 for -1; None when
                                     absent (beyond the end, or before the
                                     first retained entry -- the entry just before
                                     it may still be known: then a follower whose
                                     log ends there is caught up without an install)
    durable_index() -> int           highest index that is durable here (the
                                     leader counts only that toward a quorum)
    entries(first, last, checked=False) -> batch
                                     a batch of entries first.. (at most last)
                                     for an Append; may hold fewer (size limits);
                                     checked: each entry's bytes are checked first and
                                     the batch ends before the first damaged one
    append(batch, from_index)        append the batch's entries from from_index
                                     on, right after the current last entry
    truncate_from(index)             drop entries index.. (never committed ones)
    append_noop(term) -> int         append the leader's no-op; its index
    install(batch)                   only with Config.install: drop every entry and hold
                                     the batch alone; first_index() is then its first index
A batch (the Append's payload) offers: first_index, last_index, term_of(i).
term_at and entries raise LogDamaged for an entry whose bytes fail their checks
(entries only when checked, or for an entry it cannot even locate).

A leader that cannot serve an entry a follower needs (LogDamaged: its own copy was
damaged after it was written -- a follower refuses such bytes) reports it in
Ready.damaged with a holder: the follower furthest ahead that holds the entry (its
match is at or past it) and answered within the shortest election timeout.  The
driver may repair the entry from the holder's copy (mq.dledger.role does); the
follower is probed once a heartbeat, checked, and nothing damaged is sent (a probe
whose first entry is damaged checks the previous entry alone: the follower may
need entries further back first); the other followers are served as before.  If
the entry is still damaged DAMAGE_HANDOVER_TIMEOUTS of the longest election
timeouts after it was first found (and the leader has led, and gone without such
a handover, that long), leadership goes to the holder, which serves it whole.  No
holder (an entry only the leader has, or no holder answering): it keeps leading,
and the follower stays behind at that entry.  Where the holder's copy is damaged
too, leadership moves between the two at that pace (each move pauses writes for
one transfer) instead of all the time.

Retention (a member deleting its oldest, committed entries) meets replication
where a follower needs entries the leader no longer holds: its next index is at
or below the leader's first_index(), so the leader does not know the term of
the entry before.  With Config.install the leader then sends an install: an
Append flagged install, prev_index first-1, prev_term 0, entries from its first
entry on, and its commit (>= first-1).  The follower keeps its log when it holds
the leader's first entry with the same term (log matching: everything up to it
is the leader's), or when the install lies within its commit; otherwise its
entries from the leader's first index on differ from the leader's, so none of
them is committed, and the ones below are committed history the leader already
dropped: it replaces its whole log by the batch (DLedger truncates a follower
to the leader's begin index the same way).  A node's commit is never below
first_index() - 1, also right after a restart.

Messages of an older term (from a leader or candidate that was paused, cut off
or slow) are answered, when they are requests, with the response of their own
kind carrying the current term (RESPONSE_TO), so that the sender steps down;
the driver sends a response on the request's connection, so a step never
produces any other answer.  The election timer is reset by a leader heard, a
vote granted or a campaign started, never by a refused candidate's higher term.

Invariants asserted here (a violation is a bug, never input): a committed
entry is never truncated (an install drops only committed entries below the
leader's first one, as retention does); commit never moves back; at most one vote per term;
the term never moves back."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class Role(enum.Enum):
    FOLLOWER = "FOLLOWER"
    CANDIDATE = "CANDIDATE"        # also during pre-vote (a pre-candidate keeps its term)
    LEADER = "LEADER"


# ---- messages -------------------------------------------------------------------------------------
@dataclass
class Message:
    term: int
    src: str
    dst: str


@dataclass
class VoteReq(Message):
    last_index: int
    last_term: int
    pre: bool = False               # pre-vote: term is the candidate's term + 1, nothing is changed
    transfer: bool = False          # a leadership transfer's election: leases do not apply


@dataclass
class VoteResp(Message):
    granted: bool
    pre: bool = False


@dataclass
class Append(Message):
    prev_index: int
    prev_term: int
    entries: Any                    # a batch (see the module docstring), or None: nothing to append
    commit: int
    install: bool = False           # entries begin at the leader's first entry; prev_term is unknown (0)

    @property
    def count(self) -> int:
        return 0 if self.entries is None else self.entries.last_index - self.entries.first_index + 1


@dataclass
class AppendResp(Message):
    success: bool
    index: int                      # success: last index known to match the leader's log
    reject_index: int = -1          # failure: prev_index of the rejected Append
    hint_index: int = -1            # failure: where the leader may probe next (hint_index + 1)


@dataclass
class Heartbeat(Message):
    commit: int                     # min(follower's match, leader's commit): always safe to adopt


@dataclass
class HeartbeatResp(Message):
    pass


@dataclass
class TimeoutNow(Message):
    """Leadership transfer: the receiver starts an election at once."""


# a leader hands leadership over for a damaged entry (see the module docstring) only after leading,
# and going without such a handover, for this many of the longest election timeouts
DAMAGE_HANDOVER_TIMEOUTS = 1


class LogDamaged(Exception):
    """The log's entry `index` fails its checks (its bytes were damaged after they were
    written): this node cannot serve it."""

    def __init__(self, index: int, why: str = ""):
        super().__init__(f"entry {index} is damaged" + (f": {why}" if why else ""))
        self.index = index


@dataclass
class Ready:
    hard_state: tuple[int, str | None] | None     # (term, vote) to persist before sending
    messages: list[Message]
    # leader: (index of an entry of ours found damaged, the follower that needs it, a member holding
    # it that answered lately or None, the member leadership is being handed to or None) since the
    # last ready()
    damaged: list[tuple[int, str, str | None, str | None]] = field(default_factory=list)


# ---- configuration --------------------------------------------------------------------------------
@dataclass
class Config:
    node_id: str
    peers: list[str]                      # every member, this node included
    heartbeat_ticks: int = 2              # leader -> followers
    election_ticks_min: int = 10          # randomized election timeout: [min, max] ticks
    election_ticks_max: int = 20
    pre_vote: bool = True
    check_quorum: bool = True
    max_inflight: int = 64                # Append messages in flight per follower while replicating
    preferred_leader: str | None = None   # the leader hands over to it when it is caught up
    transfer_timeout_ticks: int = 0       # 0: election_ticks_max
    install: bool = False                 # catch up a follower behind our first entry (the log has install())

    def __post_init__(self) -> None:
        assert self.node_id in self.peers, (self.node_id, self.peers)
        assert len(set(self.peers)) == len(self.peers)
        assert 0 < self.heartbeat_ticks < self.election_ticks_min <= self.election_ticks_max
        assert self.preferred_leader is None or self.preferred_leader in self.peers


class Progress:
    """The leader's view of one follower (etcd's Progress, simplified).  inflight is replaced,
    never changed in place: a driver may keep these fields in its own memory (mq.dledger.role's
    CProgress, shared with C), where a list handed out is a copy."""
    PROBE, REPLICATE = "probe", "replicate"

    def __init__(self, next_index: int):
        self.match = -1
        self.next = next_index
        self.state = Progress.PROBE
        self.probe_sent = False          # probe: one Append at a time, resent on heartbeat
        self.inflight: list[int] = []    # replicate: last index of each Append not yet answered
        self.inflight_since = 0          # tick the oldest unanswered Append was sent
        self.recent_active = False       # heard from it since the last quorum check
        self.sent_commit = -1            # the commit index the last Append to it carried

    def __repr__(self) -> str:
        return f"Progress(match={self.match}, next={self.next}, {self.state}, inflight={len(self.inflight)})"


# ---- the node -------------------------------------------------------------------------------------
class RaftNode:
    def __init__(self, config: Config, log, rng, term: int = 0, vote: str | None = None, commit: int = -1,
                 new_progress=None):
        """term/vote: the persisted hard state; commit: an index known committed (e.g. from a
        checkpoint), -1 if unknown.  rng: a random.Random (the only source of randomness).
        new_progress(peer, next_index): a leader's Progress of a follower (default Progress)."""
        self._new_progress = new_progress or (lambda _peer, next_index: Progress(next_index))
        self.cfg = config
        self.id = config.node_id
        self.others = [p for p in config.peers if p != self.id]
        self.quorum = len(config.peers) // 2 + 1
        self.log = log
        self.rng = rng
        self.term = term
        self.vote = vote
        assert commit <= log.last_index(), (commit, log.last_index())
        # entries below the first one held are committed: a restarted member that retention or
        # an install moved on knows that much without a checkpoint
        self.commit = max(commit, log.first_index() - 1)
        self.role = Role.FOLLOWER
        self.leader_id: str | None = None
        self.pre_candidate = False
        self.votes: dict[str, bool] = {}
        self.progress: dict[str, Progress] = {}
        self.noop_index = -1                     # leader: index of this term's no-op
        self.led_since = 0                       # leader: the tick it became leader, or last handed over for damage
        self.heard: dict[str, int] = {}          # leader: the tick each follower last answered
        self.damage_seen: dict[int, int] = {}    # leader: damaged entries of ours found -> the tick first found
        self.transferee: str | None = None       # leader: a leadership transfer in progress
        self.transfer_elapsed = 0
        self.election_elapsed = 0
        self.heartbeat_elapsed = 0
        self.quorum_elapsed = 0
        self.ticks = 0                           # logical clock: ticks since start
        self.timeout = 0
        self._reset_timeout()
        self._msgs: list[Message] = []
        self._damaged: list[tuple[int, str, str | None, str | None]] = []
        self._persisted = (term, vote)

    # ---- outputs ----------------------------------------------------------------------------------
    def ready(self) -> Ready:
        """What to do now: persist the hard state (if it changed) and say so with saved(), then
        send the messages.  Until saved() confirms a hard state, every ready() asks for it
        again; a driver that could not persist it sends nothing (Raft survives lost messages,
        not a vote or a term that a crash forgets)."""
        hs = (self.term, self.vote)
        changed = hs if hs != self._persisted else None
        msgs, self._msgs = self._msgs, []
        damaged, self._damaged = self._damaged, []
        return Ready(changed, msgs, damaged)

    def saved(self, hard_state: tuple[int, str | None]) -> None:
        """The driver made `hard_state` (from ready()) durable."""
        self._persisted = hard_state

    @property
    def is_ready_leader(self) -> bool:
        """A leader whose no-op is committed: its log is committed to the end of the
        previous terms, so it may serve writes (after the driver's own catch-up)."""
        return self.role is Role.LEADER and self.commit >= self.noop_index >= 0 and self.transferee is None

    def status(self) -> dict:
        out = {"id": self.id, "role": self.role.value, "term": self.term, "leader": self.leader_id,
               "commit": self.commit, "lastIndex": self.log.last_index(), "lastTerm": self.log.last_term()}
        if self.role is Role.LEADER:
            out["peers"] = {p: {"match": pr.match, "next": pr.next, "state": pr.state}
                            for p, pr in self.progress.items()}
        return out

    # ---- inputs -----------------------------------------------------------------------------------
    def tick(self) -> None:
        self.ticks += 1
        if self.role is Role.LEADER:
            self._tick_leader()
            return
        self.election_elapsed += 1
        if self.election_elapsed >= self.timeout:
            self.election_elapsed = 0
            self._campaign(pre=self.cfg.pre_vote)

    def log_progress(self) -> None:
        """The local log grew (a leader's appends) or became more durable."""
        if self.role is Role.LEADER:
            self._maybe_commit()
            for p in self.others:
                self._send_append(p)

    def peer_down(self, peer: str) -> None:
        """The connection to `peer` broke: what was in flight to it is lost; probe again
        from what it acknowledged (instead of waiting an election timeout to notice)."""
        pr = self.progress.get(peer)
        if self.role is Role.LEADER and pr is not None:
            pr.state = Progress.PROBE
            pr.inflight = []
            pr.next = pr.match + 1 if pr.match >= 0 else max(0, self.log.last_index())
            pr.probe_sent = False

    def transfer_leadership(self, target: str) -> bool:
        """Leader: hand leadership to `target` (caught up first).  False if not possible."""
        if self.role is not Role.LEADER or target == self.id or target not in self.progress:
            return False
        self.transferee = target
        self.transfer_elapsed = 0
        # TimeoutNow goes on an append response (_on_append_resp), never from here: the driver
        # stops the appends of a leader in transfer after this step (is_ready_leader is False
        # now), and entries appended between this check and that fence would leave the
        # transferee behind our log -- its election would then fail.  An empty append if it
        # is caught up (one round trip).
        self._send_append(target, force_commit=True)
        return True

    def step(self, m: Message) -> None:
        if m.dst != self.id or m.src not in self.cfg.peers or m.src == self.id:
            return
        if m.term > self.term:
            if isinstance(m, VoteReq):
                if not m.transfer and self._in_lease():
                    return                  # a leader is alive: ignore (no term bump, no answer)
                if m.pre:
                    self._on_vote_req(m)    # a pre-vote never changes our term
                    return
                # the term moves on, the election timer does not: only a vote granted (below) or
                # a leader heard resets it (Raft, figure 2).  Else a candidate whose log is behind,
                # campaigning again and again, would keep resetting the timer of the member that
                # could win, and no one would ever lead (without pre-vote; found by the simulator)
                self._become_follower(m.term, None, reset_timer=False)
            elif isinstance(m, VoteResp) and m.pre and m.granted:
                pass                        # a pre-vote grant carries the term we would take
            else:
                leader = m.src if isinstance(m, (Append, Heartbeat, TimeoutNow)) else None
                self._become_follower(m.term, leader)
        elif m.term < self.term:
            self._answer_stale(m)
            return
        handler = _HANDLERS[type(m)]
        handler(self, m)

    def _answer_stale(self, m: Message) -> None:
        """A message of an older term: its sender was paused, cut off or slow while a newer term
        began.  A request is refused in the response of its own kind (RESPONSE_TO) carrying our
        term, so that the sender learns the term and steps down -- a stale Heartbeat is answered
        with a HeartbeatResp, never an AppendResp: the driver sends a response on the request's
        own connection, as the answer to that request.  A stale response or TimeoutNow is
        dropped: it answers, or asks for, something of a term that is over."""
        if isinstance(m, Append):
            self._send(AppendResp(self.term, self.id, m.src, False, -1, reject_index=-1, hint_index=-1))
        elif isinstance(m, Heartbeat):
            self._send(HeartbeatResp(self.term, self.id, m.src))
        elif isinstance(m, VoteReq):
            self._send(VoteResp(self.term, self.id, m.src, False, pre=m.pre))

    # ---- timers and elections ---------------------------------------------------------------------
    def _reset_timeout(self) -> None:
        self.timeout = self.rng.randint(self.cfg.election_ticks_min, self.cfg.election_ticks_max)

    def _in_lease(self) -> bool:
        """A leader is known to be alive: this node leads (check-quorum makes it step down
        once it lost its majority), or it heard from its leader within the minimum
        election timeout."""
        if not self.cfg.check_quorum or self.leader_id is None:
            return False
        return self.role is Role.LEADER or (self.role is Role.FOLLOWER
                                            and self.election_elapsed < self.cfg.election_ticks_min)

    def _campaign(self, pre: bool, transfer: bool = False) -> None:
        if len(self.cfg.peers) == 1:
            self._become_candidate()
            self._become_leader()
            return
        if pre:
            self.role = Role.CANDIDATE
            self.pre_candidate = True
            self.leader_id = None
            term = self.term + 1
        else:
            self._become_candidate()
            term = self.term
        self.votes = {self.id: True}
        self._reset_timeout()
        for p in self.others:
            self._send(VoteReq(term, self.id, p, self.log.last_index(), self.log.last_term(),
                               pre=pre, transfer=transfer))

    def _become_candidate(self) -> None:
        self.term += 1
        self.vote = self.id
        self.role = Role.CANDIDATE
        self.pre_candidate = False
        self.leader_id = None
        self.election_elapsed = 0

    def _become_follower(self, term: int, leader: str | None, reset_timer: bool = True) -> None:
        assert term >= self.term
        if term > self.term:
            self.term = term
            self.vote = None
        self.role = Role.FOLLOWER
        self.pre_candidate = False
        self.leader_id = leader
        self.progress = {}
        self.transferee = None
        self.noop_index = -1
        if reset_timer:
            self.election_elapsed = 0
            self._reset_timeout()

    def _become_leader(self) -> None:
        assert self.role is Role.CANDIDATE and not self.pre_candidate
        self.role = Role.LEADER
        self.leader_id = self.id
        self.heartbeat_elapsed = 0
        self.quorum_elapsed = 0
        self.transferee = None
        self.led_since = self.ticks
        self.heard = {}
        self.damage_seen = {}
        self.noop_index = self.log.append_noop(self.term)
        assert self.noop_index == self.log.last_index() and self.log.last_term() == self.term
        # the first probe carries the no-op after our last earlier entry, which most followers hold
        self.progress = {p: self._new_progress(p, self.noop_index) for p in self.others}
        self._maybe_commit()
        for p in self.others:
            self._send_append(p)

    def _on_vote_req(self, m: VoteReq) -> None:
        up_to_date = (m.last_term, m.last_index) >= (self.log.last_term(), self.log.last_index())
        if m.pre:
            grant = up_to_date and m.term > self.term
            self._send(VoteResp(m.term if grant else self.term, self.id, m.src, grant, pre=True))
            return
        grant = up_to_date and m.term == self.term and self.vote in (None, m.src)
        if grant:
            self.vote = m.src
            self.election_elapsed = 0
        self._send(VoteResp(self.term, self.id, m.src, grant))

    def _on_vote_resp(self, m: VoteResp) -> None:
        if self.role is not Role.CANDIDATE or m.pre != self.pre_candidate:
            return
        if m.pre and m.term != self.term + 1 and m.granted:
            return                          # an answer to an older pre-vote round
        if not m.pre and m.term != self.term:
            return
        self.votes[m.src] = m.granted
        yes = sum(1 for v in self.votes.values() if v)
        no = len(self.votes) - yes
        if yes >= self.quorum:
            if m.pre:
                self._campaign(pre=False)
            else:
                self._become_leader()
        elif no >= self.quorum:
            self._become_follower(self.term, None)

    def _on_timeout_now(self, m: TimeoutNow) -> None:
        if self.role is Role.LEADER:
            return
        self._campaign(pre=False, transfer=True)

    # ---- replication: follower side -----------------------------------------------------------------
    def _on_append(self, m: Append) -> None:
        self._follow(m.src)
        log = self.log
        if m.prev_index <= self.commit:
            # everything up to our commit matches any leader of this term: skip what we have
            # (a stale or duplicated install lands here and changes nothing)
            first = self.commit + 1
            if m.entries is not None and m.entries.last_index >= first:
                self._accept(m, first)
            else:
                self._send(AppendResp(self.term, self.id, m.src, True, self.commit))
            return
        if m.install:
            self._on_install(m)
            return
        prev_term = log.term_at(m.prev_index)
        if prev_term != m.prev_term:
            hint = min(m.prev_index - 1, log.last_index())
            # entries of a later term than the leader's prev entry cannot match below it
            steps = 0
            while hint > self.commit and steps < 4096:
                t = log.term_at(hint)
                if t is None or t <= m.prev_term:
                    break
                hint -= 1
                steps += 1
            self._send(AppendResp(self.term, self.id, m.src, False, -1, reject_index=m.prev_index,
                                  hint_index=max(hint, -1)))
            return
        self._accept(m, m.prev_index + 1)

    def _on_install(self, m: Append) -> None:
        """An install beyond our commit: the leader's log begins at batch.first_index (B)."""
        batch = m.entries
        b = batch.first_index
        if m.commit < m.prev_index or b != m.prev_index + 1:
            # the leader holds only committed entries below B: a commit below B-1 is a broken install
            self._send(AppendResp(self.term, self.id, m.src, False, -1, reject_index=-1, hint_index=-1))
            return
        if self.log.term_at(b) == batch.term_of(b):
            self._accept(m, b)          # we hold the leader's entry B: our log is its log up to there
            return
        self.log.install(batch)
        self.commit = max(self.commit, min(m.commit, batch.last_index))
        self._send(AppendResp(self.term, self.id, m.src, True, batch.last_index))

    def _accept(self, m: Append, first: int) -> None:
        """m's prev entry matches; append what we lack from index `first` on, cutting a
        conflicting (necessarily uncommitted) suffix first."""
        log = self.log
        batch = m.entries
        last_new = m.prev_index if batch is None else batch.last_index
        if batch is not None:
            i = first
            while i <= batch.last_index:
                t = log.term_at(i)
                if t is None:
                    break
                if t != batch.term_of(i):
                    assert i > self.commit, f"{self.id}: a conflict at committed index {i} (commit {self.commit})"
                    log.truncate_from(i)
                    break
                i += 1
            if i <= batch.last_index:
                assert log.last_index() == i - 1, (log.last_index(), i)
                log.append(batch, i)
        new_commit = min(m.commit, last_new)
        if new_commit > self.commit:
            self.commit = new_commit
        self._send(AppendResp(self.term, self.id, m.src, True, last_new))

    def took_appends(self, leader: str, commit: int) -> None:
        """The driver appended and answered, outside step(), pushes of the leader we follow in our
        term that went at the end of our log (what _on_append then _accept do for them: the
        driver checked the same conditions, mq_dledger_follow_take): the leader was heard, and
        the commit moves to `commit` (the highest min(leader's commit, last new entry)) if that
        is further."""
        assert self.role is Role.FOLLOWER and self.leader_id == leader, (self.role, self.leader_id, leader)
        self.election_elapsed = 0
        if commit > self.commit:
            self.commit = commit

    def _on_heartbeat(self, m: Heartbeat) -> None:
        self._follow(m.src)
        if m.commit > self.commit:
            self.commit = min(m.commit, self.log.last_index())
        self._send(HeartbeatResp(self.term, self.id, m.src))

    def _follow(self, leader: str) -> None:
        if self.role is not Role.FOLLOWER:
            self._become_follower(self.term, leader)
        self.leader_id = leader
        self.election_elapsed = 0

    # ---- replication: leader side -------------------------------------------------------------------
    def _tick_leader(self) -> None:
        self.heartbeat_elapsed += 1
        self.quorum_elapsed += 1
        if self.transferee is not None:
            self.transfer_elapsed += 1
            if self.transfer_elapsed >= (self.cfg.transfer_timeout_ticks or self.cfg.election_ticks_max):
                self.transferee = None       # gave up: keep leading
        if self.cfg.check_quorum and self.quorum_elapsed >= self.cfg.election_ticks_min:
            self.quorum_elapsed = 0
            active = 1 + sum(1 for pr in self.progress.values() if pr.recent_active)
            for pr in self.progress.values():
                pr.recent_active = False
            if active < self.quorum:
                self._become_follower(self.term, None)
                return
        self._notify_commit()
        if self.heartbeat_elapsed >= self.cfg.heartbeat_ticks:
            self.heartbeat_elapsed = 0
            for p, pr in self.progress.items():
                self._send(Heartbeat(self.term, self.id, p, min(pr.match, self.commit)))
                if (pr.state == Progress.REPLICATE and pr.inflight
                        and self.ticks - pr.inflight_since >= self.cfg.election_ticks_min):
                    # unanswered for an election timeout: presumed lost (a broken connection, or
                    # the simulator's loss); probe again from what the follower acknowledged
                    pr.state = Progress.PROBE
                    pr.inflight = []
                    pr.next = pr.match + 1
                    pr.probe_sent = False
                if pr.state == Progress.PROBE:
                    pr.probe_sent = False        # resend the probe with the heartbeat
                    self._send_append(p)
            self._maybe_transfer_to_preferred()

    def _maybe_transfer_to_preferred(self) -> None:
        pref = self.cfg.preferred_leader
        if pref is None or pref == self.id or self.transferee is not None or not self.is_ready_leader:
            return
        pr = self.progress.get(pref)
        if pr is not None and pr.recent_active and pr.match == self.log.last_index():
            self.transfer_leadership(pref)

    def _send_append(self, p: str, force_commit: bool = False) -> None:
        try:
            self._push(p, force_commit)
        except LogDamaged as e:
            self._cannot_serve(p, e.index)

    def _cannot_serve(self, p: str, index: int) -> None:
        """Follower p needs our entry `index`, which is damaged (see the module docstring): p is
        probed again with the next heartbeat (checked); reported with the follower holding the
        entry that is furthest ahead, if one answered lately, to which leadership goes if the
        entry stays damaged for long."""
        pr = self.progress[p]
        if pr.state == Progress.REPLICATE:       # (what was in flight is sent again, checked)
            pr.state = Progress.PROBE
            pr.inflight = []
            pr.next = pr.match + 1
        pr.probe_sent = True                     # the heartbeat clears it: one try a heartbeat
        found = self.damage_seen.setdefault(index, self.ticks)
        holder = self.holder_of(index, but=p)
        if holder is not None and self.transferee is None and \
                self.ticks - max(self.led_since, found) >= DAMAGE_HANDOVER_TIMEOUTS * self.cfg.election_ticks_max:
            self.led_since = self.ticks
            self.transfer_leadership(holder)
        self._damaged.append((index, p, holder, self.transferee))

    def holder_of(self, index: int, but: str | None = None) -> str | None:
        """Leader: the follower (other than `but`) furthest ahead whose log holds entry `index` and
        that answered within the shortest election timeout, or None."""
        lately = self.ticks - self.cfg.election_ticks_min
        holders = [(pr.match, q) for q, pr in self.progress.items()
                   if q != but and pr.match >= index and self.heard.get(q, -1) >= lately]
        return max(holders)[1] if holders else None

    def _push(self, p: str, force_commit: bool) -> None:
        pr = self.progress[p]
        last = self.log.last_index()
        if pr.state == Progress.PROBE:
            if pr.probe_sent:
                return
        elif len(pr.inflight) >= self.cfg.max_inflight:
            return
        has_new = pr.next <= last
        if not has_new and not force_commit and pr.state == Progress.REPLICATE:
            return
        prev = pr.next - 1
        first = self.log.first_index()
        prev_term = self.log.term_at(prev) if pr.next >= first else None
        if prev_term is None:
            if pr.next <= first and first > 0 and self.cfg.install:
                # the follower needs entries before our first: the term we would check is gone
                self._send_install(p, pr, first, last)
            return
        # a probe's entries are checked: a follower refuses damaged bytes (C's pushes, unchecked,
        # end in a probe when it does), and a damaged entry is never sent twice
        try:
            batch = self.log.entries(pr.next, last, checked=pr.state == Progress.PROBE) if has_new else None
        except LogDamaged:
            if pr.state != Progress.PROBE or pr.match == prev:
                raise                            # it holds prev: it needs the damaged entry
            # its log may differ further back (it then needs entries we can serve, from another
            # member's lead): the probe checks prev alone
            batch = None
        self._send(Append(self.term, self.id, p, prev, prev_term, batch, self.commit))
        pr.sent_commit = self.commit
        if pr.state == Progress.PROBE:
            pr.probe_sent = True
        elif batch is not None:
            if not pr.inflight:
                pr.inflight_since = self.ticks
            pr.inflight = pr.inflight + [batch.last_index]
            pr.next = batch.last_index + 1

    def send_append(self, p: str) -> None:
        """Leader: the next Append to follower p, if its window takes one (what log_progress
        sends each follower; a driver that did the rest of log_progress itself calls this)."""
        self._send_append(p)

    def fill(self, p: str) -> None:
        """Leader: Appends to follower p while its window takes them (a driver that sent some
        of them itself calls this for the rest)."""
        pr = self.progress[p]
        while True:
            before = pr.next
            self._send_append(p)
            if pr.next == before:
                break

    def _send_install(self, p: str, pr: Progress, first: int, last: int) -> None:
        """Our log from its first entry on, to a follower behind it; probed like a first Append
        (one at a time, resent with the heartbeat until answered)."""
        assert self.commit >= first - 1, (self.commit, first)
        pr.state = Progress.PROBE
        pr.inflight = []
        pr.next = first
        pr.probe_sent = True
        self._send(Append(self.term, self.id, p, first - 1, 0, self.log.entries(first, last, checked=True),
                          self.commit, install=True))
        pr.sent_commit = self.commit

    def _on_append_resp(self, m: AppendResp) -> None:
        if self.role is not Role.LEADER:
            return
        pr = self.progress[m.src]
        pr.recent_active = True
        self.heard[m.src] = self.ticks
        if m.success:
            if m.index > pr.match:
                pr.match = m.index
            if pr.next <= pr.match:
                pr.next = pr.match + 1
            if pr.inflight and pr.inflight[0] <= m.index:
                pr.inflight = [i for i in pr.inflight if i > m.index]
                pr.inflight_since = self.ticks
            if pr.state == Progress.PROBE:
                pr.state = Progress.REPLICATE
                pr.probe_sent = False
                pr.inflight = []
            self._maybe_commit()
            if self.transferee == m.src and pr.match == self.log.last_index():
                self._send(TimeoutNow(self.term, self.id, m.src))
            self.fill(m.src)
            return
        if m.reject_index < 0:
            return                                   # a stale-term answer (handled by the term check)
        if pr.state == Progress.REPLICATE:
            if m.reject_index <= pr.match:
                return                               # stale: that Append was overtaken
            pr.state = Progress.PROBE
            pr.inflight = []
            pr.next = pr.match + 1
        elif m.reject_index != pr.next - 1:
            return                                   # an answer to an older probe
        pr.next = max(min(m.reject_index, m.hint_index + 1), pr.match + 1)
        pr.probe_sent = False
        self._send_append(m.src)

    def _on_heartbeat_resp(self, m: HeartbeatResp) -> None:
        if self.role is not Role.LEADER:
            return
        pr = self.progress[m.src]
        pr.recent_active = True
        self.heard[m.src] = self.ticks
        if pr.match < self.log.last_index() and pr.state == Progress.REPLICATE and not pr.inflight:
            self._send_append(m.src)

    def _maybe_commit(self) -> None:
        matches = sorted([self.log.durable_index()] + [pr.match for pr in self.progress.values()], reverse=True)
        n = matches[self.quorum - 1]
        if n > self.commit and self.log.term_at(n) == self.term:
            self.commit = n

    def _notify_commit(self) -> None:
        """Followers with nothing in flight learn a newer commit (reads from followers and their
        dispatch would otherwise wait for the next heartbeat).  Once a tick: under load the
        next data Append carries the commit anyway, so this sends nothing then."""
        for p, pr in self.progress.items():
            if pr.state == Progress.REPLICATE and pr.sent_commit < self.commit and not pr.inflight \
                    and pr.next > self.log.last_index():
                self._send_append(p, force_commit=True)

    def _send(self, m: Message) -> None:
        self._msgs.append(m)


_HANDLERS = {
    VoteReq: RaftNode._on_vote_req,
    VoteResp: RaftNode._on_vote_resp,
    Append: RaftNode._on_append,
    AppendResp: RaftNode._on_append_resp,
    Heartbeat: RaftNode._on_heartbeat,
    HeartbeatResp: RaftNode._on_heartbeat_resp,
    TimeoutNow: RaftNode._on_timeout_now,
}

# The answer to each request kind (None: not answered).  A step of a request produces at most one
# response, of this kind and to the request's source, and possibly requests to anyone; a step of a
# response, a tick or log_progress produces requests only.  The broker relies on it (a response
# leaves on the request's connection, with the request's opaque: mq.dledger.role) and the simulator
# checks it on every step.
RESPONSE_TO: dict[type, type | None] = {Append: AppendResp, Heartbeat: HeartbeatResp, VoteReq: VoteResp,
                                        TimeoutNow: None}
RESPONSES = (AppendResp, HeartbeatResp, VoteResp)

__all__ = ["Role", "Config", "RaftNode", "Ready", "LogDamaged", "Message", "VoteReq", "VoteResp", "Append",
           "AppendResp", "Heartbeat", "HeartbeatResp", "TimeoutNow", "Progress", "RESPONSE_TO", "RESPONSES"]
