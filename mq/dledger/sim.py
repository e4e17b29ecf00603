"""A seeded, deterministic simulation of a DLedger group: the real Raft core
(mq.dledger.core) on a fake clock, in-memory logs and a network that drops,
delays, duplicates and reorders messages and partitions nodes, with nodes
crashing and restarting from their persisted state.

One seed = one run: a fault phase (random partitions, heals, crashes,
restarts, pauses, loss and delay changes, client proposals), then a calm phase
(all healed, up and running) that must end with a ready leader and a fresh
proposal committed everywhere.

A pause is a SIGSTOP of a member's process (mostly the leader's): it neither
ticks nor reads; what is sent to it waits (TCP keeps it), and what it had sent
may be held too and arrive late.  When it resumes it replays the ticks it
missed (at most one heartbeat interval, as the broker's role does) and sends
what they made -- heartbeats and appends of a term that may be over by then --
before or after it reads what waited (the broker's event loop runs timers
first; the order is drawn per resume).

Checked all along:
  * election safety: at most one leader per term;
  * commit safety: an index, once committed anywhere, holds the same entry
    forever, on every node whose commit covers it; a node that becomes
    leader holds every entry committed so far (leader completeness);
  * acknowledged writes: a proposal the client was told is committed (the
    leader's commit covered it while the leader was still leading in the
    term it was appended in -- the broker's SEND_OK rule) is in the
    committed log at its index at the end;
  * routing: a step of a request produces at most one response, of the
    request's own kind and to its source; any other step produces none
    (mq.dledger.core.RESPONSE_TO: the broker sends a response on the
    request's connection as the answer to that request, so anything else
    could not go out);
  * liveness during the faults: whenever a majority of the members run and
    reach each other over a network good enough for Raft's timing (loss and
    delays well inside an election timeout) for liveness_timeouts election
    timeouts, one of them is a ready leader at some point in every such window;
  * liveness after the faults stop.

Damage (damage_weight; a third of params_for's seeds): a committed entry of one
member fails its checks from then on (SimLog.damage), while another member holds it
whole.  A batch sent unchecked with it is refused by a follower that would write it
(the connection drops: the leader's peer_down); a checked one ends before it, and a
leader that cannot serve it hands over (mq.dledger.core).  The driver's repair from
a holder's copy (mq.dledger.role) is not modelled: the handover alone must keep the
group live.  A talking majority none of whose members holds whole an entry one of
them needs is excused from the liveness check while that lasts.

A failing seed raises SimFailure with the seed and the last events; replay
it with `python -m mq.dledger.sim --seed N --verbose`."""
from __future__ import annotations

import argparse
import heapq
import random
import sys
from collections import deque
from dataclasses import dataclass

from .core import RESPONSE_TO, RESPONSES, Append, Config, Heartbeat, LogDamaged, RaftNode, Role

NOOP = "noop"

# What the liveness check holds the group to (Raft's timing requirement, §5.6: broadcast time much
# shorter than the election timeout): a majority that reaches itself with at most this loss and
# delays of at most this many ticks, and election timeouts spread over at least
# LIVENESS_SPREAD_PER_DELAY ticks per tick of delay -- else candidates that start within one
# round trip of each other split the vote round after round (the narrow-window seeds exist to
# produce split votes; they are held to safety and to the calm phase's liveness only).
LIVENESS_DROP_MAX = 0.05
LIVENESS_DELAY_MAX = 2
LIVENESS_SPREAD_PER_DELAY = 4


class SimFailure(AssertionError):
    pass


# ---- the in-memory log --------------------------------------------------------------------------
class SimBatch:
    """An immutable snapshot of entries first_index.. (what an Append carries).  base: how many
    proposals (entries other than no-ops) the log held below first_index -- what the broker's
    install carries as its queue offsets, checked for continuity here.  damaged: the indexes of
    entries sent damaged (an unchecked batch): the receiver refuses the batch."""
    __slots__ = ("first_index", "items", "base", "damaged")

    def __init__(self, first_index: int, items: list, base: int = 0, damaged: frozenset = frozenset()):
        self.first_index = first_index
        self.items = items
        self.base = base
        self.damaged = damaged

    @property
    def last_index(self) -> int:
        return self.first_index + len(self.items) - 1

    def term_of(self, index: int) -> int:
        return self.items[index - self.first_index][0]

    def item(self, index: int):
        return self.items[index - self.first_index]


class SimLog:
    """Entries are (term, payload); every append is durable at once (SYNC durability).  The log
    holds entries begin.. (retention -- compact() -- and installs move begin on); base counts the
    proposals below begin."""

    def __init__(self, batch_max: int = 8):
        self.items: list = []
        self.begin = 0
        self.base = 0
        self.begin_term = None     # term of entry begin-1 when known (retention keeps it; an install does not)
        self.installs = 0
        self.batch_max = batch_max
        self.damaged: set[int] = set()   # entries whose bytes were damaged after they were written

    def damage(self, index: int) -> None:
        """Entry `index`'s bytes are damaged here (its term and value still read as written: the
        damage is in what the entry's checksum covers)."""
        assert self.begin <= index <= self.last_index(), (index, self.begin, self.last_index())
        self.damaged.add(index)

    def last_index(self) -> int:
        return self.begin + len(self.items) - 1

    def last_term(self) -> int:
        return self.items[-1][0] if self.items else 0

    def first_index(self) -> int:
        return self.begin

    def term_at(self, index: int):
        if index == -1:
            return 0
        i = index - self.begin
        if 0 <= i < len(self.items):
            return self.items[i][0]
        return self.begin_term if i == -1 else None

    def item(self, index: int):
        assert index >= self.begin, (index, self.begin)
        return self.items[index - self.begin]

    def durable_index(self) -> int:
        return self.last_index()

    def entries(self, first: int, last: int, checked: bool = False) -> SimBatch:
        assert first >= self.begin, (first, self.begin)
        last = min(last, first + self.batch_max - 1)
        bad = sorted(k for k in self.damaged if first <= k <= last)
        if checked and bad:
            if bad[0] == first:
                raise LogDamaged(first, "damaged in the simulation")
            last, bad = bad[0] - 1, []
        i = first - self.begin
        # base is known (and needed: an install) for a batch from the first entry only
        return SimBatch(first, self.items[i:last - self.begin + 1], self.base if i == 0 else -1, frozenset(bad))

    def append(self, batch: SimBatch, from_index: int) -> None:
        assert from_index == self.last_index() + 1, (from_index, self.last_index())
        self.items.extend(batch.items[from_index - batch.first_index:])

    def truncate_from(self, index: int) -> None:
        assert index >= self.begin, (index, self.begin)
        del self.items[index - self.begin:]
        self.damaged = {k for k in self.damaged if k < index}

    def install(self, batch: SimBatch) -> None:
        self.items = list(batch.items)
        self.begin = batch.first_index
        self.base = batch.base
        self.begin_term = None
        self.damaged = set()
        self.installs += 1

    def compact(self, upto: int) -> None:
        """Retention: drop the entries below `upto` (committed ones; at least one entry stays)."""
        assert self.begin < upto <= self.last_index(), (self.begin, upto, self.last_index())
        cut = upto - self.begin
        self.base += sum(1 for e in self.items[:cut] if e[1] != NOOP)
        self.begin_term = self.items[cut - 1][0]
        del self.items[:cut]
        self.begin = upto
        self.damaged = {k for k in self.damaged if k >= upto}

    def append_noop(self, term: int) -> int:
        self.items.append((term, NOOP))
        return self.last_index()

    def propose(self, term: int, payload) -> int:
        self.items.append((term, payload))
        return self.last_index()


# ---- the network -----------------------------------------------------------------------------------
class SimNetwork:
    def __init__(self, rng: random.Random):
        self.rng = rng
        self.queue: list = []
        self.seq = 0
        self.drop = 0.0
        self.dup = 0.0
        self.delay_max = 1          # ticks; >1 reorders
        self.cut: set = set()       # (src, dst) pairs that lose everything
        self.version = 0            # bumped by partition and heal

    def hold(self, src: str, until: int) -> int:
        """What `src` sent and is still in flight arrives at `until` or later (a paused sender
        whose bytes sat in its buffers).  Returns how many messages were held."""
        held = 0
        for i, (at, seq, m) in enumerate(self.queue):
            if m.src == src and at < until:
                self.queue[i] = (until + self.rng.randint(0, self.delay_max), seq, m)
                held += 1
        heapq.heapify(self.queue)
        return held

    def send(self, m, now: int) -> None:
        if (m.src, m.dst) in self.cut or self.rng.random() < self.drop:
            return
        copies = 2 if self.rng.random() < self.dup else 1
        for _ in range(copies):
            self.seq += 1
            heapq.heappush(self.queue, (now + self.rng.randint(1, self.delay_max), self.seq, m))

    def due(self, now: int) -> list:
        out = []
        while self.queue and self.queue[0][0] <= now:
            _, _, m = heapq.heappop(self.queue)
            if (m.src, m.dst) not in self.cut:
                out.append(m)
        return out

    def partition(self, groups: list[list[str]]) -> None:
        self.cut = {(a, b) for g in groups for h in groups if g is not h for a in g for b in h}
        self.version += 1

    def heal(self) -> None:
        self.cut = set()
        self.version += 1


# ---- the cluster ------------------------------------------------------------------------------------
@dataclass
class SimParams:
    nodes: int = 3
    fault_ticks: int = 400
    calm_ticks: int = 300          # the calm phase must reach liveness within this
    heartbeat_ticks: int = 2
    election_ticks_min: int = 10
    election_ticks_max: int = 20
    pre_vote: bool = True
    check_quorum: bool = True
    propose_every: int = 3         # ticks between client proposals (on average)
    batch_max: int = 8             # entries per Append
    pause_weight: float = 0.15     # pauses of a member (mostly the leader) per fault draw of another kind
    pause_ticks_max: int = 80      # a pause lasts election_ticks_min..this
    compact_weight: float = 0.0    # retention passes on a running member per fault draw of another kind
    damage_weight: float = 0.0     # a committed entry damaged on a running member, per fault draw of another kind
    liveness_timeouts: int = 6     # election timeouts (max) a talking majority may go without a leader


class SimNode:
    def __init__(self, cluster: "SimCluster", node_id: str):
        self.cluster = cluster
        self.id = node_id
        self.log = SimLog(cluster.params.batch_max)
        self.hard = (0, None)      # persisted (term, vote)
        self.raft: RaftNode | None = None
        self.checked_commit = -1
        self.paused_since: int | None = None     # tick the pause began; None: running (or down)
        self.resume_at = 0
        self.inbox: list = []                    # what arrived while paused, in arrival order

    @property
    def running(self) -> bool:
        return self.raft is not None and self.paused_since is None

    def start(self) -> None:
        c = self.cluster
        p = c.params
        cfg = Config(self.id, c.ids, heartbeat_ticks=p.heartbeat_ticks, election_ticks_min=p.election_ticks_min,
                     election_ticks_max=p.election_ticks_max, pre_vote=p.pre_vote, check_quorum=p.check_quorum,
                     max_inflight=4, install=True)
        self.raft = RaftNode(cfg, self.log, random.Random(c.rng.random()), term=self.hard[0], vote=self.hard[1])
        self.checked_commit = -1
        self.paused_since = None
        self.inbox = []


class SimCluster:
    def __init__(self, seed: int, params: SimParams | None = None, verbose: bool = False):
        self.seed = seed
        self.params = params or SimParams()
        self.rng = random.Random(seed)
        self.verbose = verbose
        self.ids = [f"n{i}" for i in range(self.params.nodes)]
        self.net = SimNetwork(self.rng)
        self.nodes = {i: SimNode(self, i) for i in self.ids}
        self.now = 0
        self.leaders: dict[int, str] = {}          # term -> leader
        self.committed: dict[int, tuple] = {}      # index -> (term, payload)
        self.acked: dict = {}                      # payload -> index
        self.pending: list = []                    # (node, term, index, payload) proposals awaiting commit
        self.next_value = 0
        # what a run exercised (a sweep asserts it is not vacuous)
        self.counts = {"pauses": 0, "stale_heartbeats": 0, "stale_appends": 0, "liveness_ticks": 0,
                       "compactions": 0, "installs": 0, "damages": 0, "damaged_refused": 0,
                       "damage_found": 0, "damage_handovers": 0, "damage_blocked_ticks": 0}
        self.events: deque = deque(maxlen=60)
        self._majority_cache: dict = {}
        self._talking: frozenset | None = None     # the talking majority of the liveness check
        self._talking_since = 0
        self._leader_seen = 0                      # last tick it had a ready leader
        self.note(f"{self.params}")
        for n in self.nodes.values():
            n.start()

    # ---- bookkeeping ------------------------------------------------------------------------------
    def note(self, text: str) -> None:
        line = f"t={self.now} {text}"
        self.events.append(line)
        if self.verbose:
            print(line)

    def fail(self, why: str) -> None:
        raise SimFailure(f"seed {self.seed}: {why}\nlast events:\n  " + "\n  ".join(self.events)
                         + f"\nreplay: python -m mq.dledger.sim --seed {self.seed} --verbose")

    def _drain(self, node: SimNode, request=None, was_leader: bool | None = None) -> None:
        """Applies a node's Ready: persist first, then send; then check invariants.  request: the
        message the step handled (None: a tick, a proposal); its response must be of its kind."""
        r = node.raft
        if was_leader is None:
            was_leader = r.role is Role.LEADER
        rd = r.ready()
        if rd.hard_state is not None:
            if rd.hard_state[0] < node.hard[0]:
                self.fail(f"{node.id}'s term went back from {node.hard[0]} to {rd.hard_state[0]}")
            if rd.hard_state[0] == node.hard[0] and node.hard[1] not in (None, rd.hard_state[1]):
                self.fail(f"{node.id} voted twice in term {node.hard[0]}")
            node.hard = rd.hard_state
            r.saved(rd.hard_state)
        self._check_routing(node, request, rd.messages)
        for index, follower, holder, to in rd.damaged:
            self.counts["damage_found"] += 1
            self.counts["damage_handovers"] += to is not None
            self.note(f"{node.id} cannot serve its damaged entry {index} to {follower}"
                      + (f" (held by {holder})" if holder else "") + (f": leadership to {to}" if to else ""))
        for m in rd.messages:
            self.net.send(m, self.now)
        self._check_node(node, was_leader)

    def _check_routing(self, node: SimNode, request, messages: list) -> None:
        """The broker's rule: a response leaves on the connection of the request it answers."""
        answers = [m for m in messages if isinstance(m, RESPONSES)]
        if not answers:
            return
        want = RESPONSE_TO.get(type(request)) if request is not None else None
        for m in answers:
            if want is None or not isinstance(m, want) or m.dst != request.src:
                self.fail(f"{node.id} answered {request if request is not None else 'no request'} with {m}: "
                          "the broker has no connection to send that on")
        if len(answers) > 1:
            self.fail(f"{node.id} answered {request} {len(answers)} times: {answers}")

    def _check_node(self, node: SimNode, was_leader: bool) -> None:
        r = node.raft
        if r.role is Role.LEADER:
            other = self.leaders.setdefault(r.term, node.id)
            if other != node.id:
                self.fail(f"two leaders in term {r.term}: {other} and {node.id}")
            if not was_leader:
                log = node.log
                self.note(f"{node.id} leads term {r.term} (first {log.first_index()}, last {log.last_index()})")
                if log.first_index() > len(self.committed):
                    self.fail(f"new leader {node.id} begins at {log.first_index()}, beyond the committed "
                              f"{len(self.committed)} entries")
                for i, e in self.committed.items():
                    if i >= log.first_index() and (i > log.last_index() or log.item(i) != e):
                        self.fail(f"new leader {node.id} lacks committed entry {i} {e}")
        for i in range(max(node.checked_commit + 1, node.log.first_index()), r.commit + 1):
            e = node.log.item(i)
            prev = self.committed.setdefault(i, e)
            if prev != e:
                self.fail(f"index {i} committed as {prev} and as {e} (on {node.id})")
        if r.commit < node.checked_commit:
            self.fail(f"{node.id}'s commit went back from {node.checked_commit} to {r.commit}")
        node.checked_commit = r.commit

    # ---- driving ----------------------------------------------------------------------------------
    def alive(self) -> list[SimNode]:
        return [n for n in self.nodes.values() if n.raft is not None]

    def running(self) -> list[SimNode]:
        return [n for n in self.nodes.values() if n.running]

    def tick(self) -> None:
        self.now += 1
        for n in self.nodes.values():
            if n.raft is None:
                continue
            if n.paused_since is None:
                n.raft.tick()
                self._drain(n)
            elif n.resume_at <= self.now:
                self.resume(n)               # its replay includes this tick
        for m in self.net.due(self.now):
            n = self.nodes[m.dst]
            if n.raft is None:
                continue
            if n.paused_since is not None:
                n.inbox.append(m)            # the kernel keeps it until the process reads again
                continue
            self._deliver(n, m)
        self._settle_proposals()

    def _deliver(self, n: SimNode, m) -> None:
        if m.term < n.raft.term and isinstance(m, (Heartbeat, Append)):
            self.counts["stale_heartbeats" if isinstance(m, Heartbeat) else "stale_appends"] += 1
        if isinstance(m, Append) and m.entries is not None and m.entries.damaged and self._takes_damaged(n, m):
            # the broker's follower checks every entry before it writes one: it refuses the push and
            # drops the connection, which the leader hears of (peer_down)
            self.counts["damaged_refused"] += 1
            self.note(f"{n.id} refuses {m.src}'s entries {m.entries.first_index}..{m.entries.last_index} "
                      f"(prev {m.prev_index}, install {m.install}): "
                      f"{sorted(m.entries.damaged)} damaged")
            src = self.nodes[m.src]
            if src.running and src.raft.role is Role.LEADER and src.raft.term == m.term:
                src.raft.peer_down(n.id)
                self._drain(src)
            return
        n.raft.step(m)
        self._drain(n, m)

    @staticmethod
    def _takes_damaged(n: SimNode, m: Append) -> bool:
        """Would follower n write one of m's damaged entries (the core accepts m and lacks that
        entry)?  Else it rejects or ignores m before any entry is checked."""
        log = n.log
        if m.term < n.raft.term or not (m.install or log.term_at(m.prev_index) == m.prev_term):
            return False
        b = m.entries
        return any(k > log.last_index() or k < log.first_index() or log.term_at(k) != b.term_of(k)
                   for k in b.damaged)

    def propose(self) -> str | None:
        """A client proposal to a ready leader, if there is one; its value."""
        for n in self.running():
            if n.raft.is_ready_leader:
                self.next_value += 1
                value = f"v{self.next_value}"
                idx = n.log.propose(n.raft.term, value)
                self.pending.append((n.id, n.raft.term, idx, value))
                n.raft.log_progress()
                self._drain(n)
                return value
        return None

    def _settle_proposals(self) -> None:
        """The broker's SEND_OK rule: acked once the leader's commit covers the entry while it
        still leads in the term it appended it; a changed term means 'unknown', never acked."""
        keep = []
        for nid, term, idx, value in self.pending:
            r = self.nodes[nid].raft
            if r is None or r.term != term or r.role is not Role.LEADER:
                continue                      # outcome unknown: the client gets an error
            if r.commit >= idx:
                self.acked[value] = idx
            else:
                keep.append((nid, term, idx, value))
        self.pending = keep

    def crash(self, node: SimNode) -> None:
        self.note(f"crash {node.id}")
        node.raft = None
        node.paused_since = None
        node.inbox = []

    def pause(self, node: SimNode, ticks: int, hold_sent: bool) -> None:
        """SIGSTOP for `ticks` ticks: no ticks, no reads; with hold_sent, what it sent and is
        still in flight arrives only after the pause too."""
        assert node.running, node.id
        node.paused_since = self.now
        node.resume_at = self.now + ticks
        held = self.net.hold(node.id, node.resume_at) if hold_sent else 0
        self.counts["pauses"] += 1
        self.note(f"pause {node.id} ({node.raft.role.value} t{node.raft.term}) for {ticks} ticks"
                  + (f", {held} sent messages held" if hold_sent else ""))

    def resume(self, node: SimNode, timers_first: bool | None = None) -> None:
        """SIGCONT: replay the ticks missed (at most heartbeat_ticks, then one Ready, as the role's
        timer does), and handle what waited -- after the ticks (timers first: uvloop's order) or
        before (asyncio's); drawn when not given."""
        missed = self.now - node.paused_since
        replay = min(missed, self.params.heartbeat_ticks)
        inbox, node.inbox = node.inbox, []
        node.paused_since = None
        if timers_first is None:
            timers_first = self.rng.random() < 0.75
        self.note(f"resume {node.id} ({node.raft.role.value} t{node.raft.term}): {replay} ticks replayed "
                  f"{'before' if timers_first else 'after'} {len(inbox)} waiting messages")
        if not timers_first:
            for m in inbox:
                self._deliver(node, m)
        was_leader = node.raft.role is Role.LEADER
        for _ in range(replay):
            node.raft.tick()
        self._drain(node, was_leader=was_leader)
        if timers_first:
            for m in inbox:
                self._deliver(node, m)

    def compact(self, node: SimNode, upto: int) -> None:
        """A retention pass on a running member: its entries below `upto` (committed) are deleted."""
        assert node.running and upto <= node.raft.commit, (node.id, upto)
        self.note(f"compact {node.id} below {upto} (first {node.log.first_index()}, commit {node.raft.commit})")
        node.log.compact(upto)
        self.counts["compactions"] += 1

    def restart(self, node: SimNode) -> None:
        self.note(f"restart {node.id} (term {node.hard[0]}, log {node.log.last_index()})")
        node.start()

    # ---- one run ------------------------------------------------------------------------------------
    def random_fault(self) -> None:
        rng, p = self.rng, self.params
        k = rng.random() * (1 + p.pause_weight + p.compact_weight + p.damage_weight)
        if k >= 1 + p.pause_weight + p.compact_weight:
            self.random_damage()
        elif k >= 1 + p.pause_weight:
            up = [n for n in self.running() if n.raft.commit > n.log.first_index()]
            if up:
                n = rng.choice(up)
                self.compact(n, rng.randint(n.log.first_index() + 1, n.raft.commit))
        elif k >= 1:
            up = self.running()
            leaders = [n for n in up if n.raft.role is Role.LEADER]
            if up:
                target = leaders[0] if leaders and rng.random() < 0.8 else rng.choice(up)
                self.pause(target, rng.randint(p.election_ticks_min, p.pause_ticks_max), hold_sent=rng.random() < 0.5)
        elif k < 0.25:
            ids = self.ids[:]
            rng.shuffle(ids)
            cut = rng.randint(1, len(ids) - 1)
            groups = [ids[:cut], ids[cut:]]
            self.net.partition(groups)
            self.note(f"partition {groups}")
        elif k < 0.45:
            self.net.heal()
            self.note("heal")
        elif k < 0.6:
            up = self.alive()
            if len(up) > 1:
                self.crash(rng.choice(up))
        elif k < 0.75:
            down = [n for n in self.nodes.values() if n.raft is None]
            if down:
                self.restart(rng.choice(down))
        elif k < 0.85:
            self.net.drop = rng.choice([0.0, 0.05, 0.2, 0.5])
            self.net.dup = rng.choice([0.0, 0.05, 0.2])
            self.note(f"loss {self.net.drop} dup {self.net.dup}")
        else:
            self.net.delay_max = rng.choice([1, 2, 5, 15])
            self.note(f"delay up to {self.net.delay_max}")

    def random_damage(self) -> None:
        """A committed entry of a running member damaged (its bytes fail their checks) that another
        member holds whole, while no other member has damage: the whole copies are what lets the
        group serve a member that lacks the entry.  (Damage on two members can stop one that lacks
        entries for good: one's copy of an entry damaged, the other's deleted by retention and its
        first entry, which an install starts at, damaged.  Named in the README.)"""
        up = [n for n in self.running() if n.raft.commit >= n.log.first_index()]
        if not up:
            return
        n = self.rng.choice(up)
        index = self.rng.randint(n.log.first_index(), n.raft.commit)
        e = n.log.item(index)
        others = [m for m in self.nodes.values() if m is not n]
        if any(m.log.damaged for m in others) or not any(
                m.log.first_index() <= index <= m.log.last_index() and m.log.item(index) == e for m in others):
            return
        n.log.damage(index)
        self.counts["damages"] += 1
        self.note(f"damage {n.id}'s entry {index} ({n.raft.role.value}, log {n.log.first_index()}.."
                  f"{n.log.last_index()})")

    # ---- liveness while faults go on -----------------------------------------------------------------
    def talking_majority(self) -> frozenset | None:
        """The largest set of running members that reach each other both ways, if it is a majority
        and the network and the timeouts are good enough for Raft's timing (LIVENESS_*)."""
        net, p = self.net, self.params
        if net.drop > LIVENESS_DROP_MAX or net.delay_max > LIVENESS_DELAY_MAX \
                or p.election_ticks_max - p.election_ticks_min < LIVENESS_SPREAD_PER_DELAY * net.delay_max:
            return None
        up = tuple(n.id for n in self.nodes.values() if n.running)
        key = (net.version, up)
        if key not in self._majority_cache:
            best: tuple = ()
            for mask in range(1, 1 << len(up)):
                s = tuple(x for i, x in enumerate(up) if mask >> i & 1)
                if len(s) > len(best) and all((a, b) not in net.cut for a in s for b in s if a != b):
                    best = s
            quorum = len(self.ids) // 2 + 1
            self._majority_cache[key] = frozenset(best) if len(best) >= quorum else None
        return self._majority_cache[key]

    def _damage_blocks(self, s: frozenset) -> bool:
        """Does a member of s need a committed entry that no member of s holds whole (the whole
        copies being damaged or on members outside s)?  Then s may commit nothing new: a leader
        needs that member's answers for a majority when the others are down (Raft cannot serve
        an entry nobody it reaches has), so liveness is not asked of it."""
        members = [self.nodes[i] for i in s]
        for i in set().union(*(n.log.damaged for n in members)):
            e = self.committed.get(i)
            if e is None:
                continue
            whole = any(n.log.first_index() <= i <= n.log.last_index() and i not in n.log.damaged
                        and n.log.item(i) == e for n in members)
            needs = any(i > n.log.last_index() or (i >= n.log.first_index() and n.log.item(i) != e)
                        for n in members)
            if needs and not whole:
                return True
        return False

    def check_liveness(self) -> None:
        """A majority that can talk must not go liveness_timeouts election timeouts without a
        ready leader among it."""
        s = self.talking_majority()
        if s != self._talking:
            self._talking = s
            self._talking_since = self.now
        if s is None:
            return
        if self._damage_blocks(s):
            self._talking_since = self.now        # no member of s can serve what one of s needs
            self.counts["damage_blocked_ticks"] += 1
            return
        self.counts["liveness_ticks"] += 1
        if any(self.nodes[i].raft.is_ready_leader for i in s):
            self._leader_seen = self.now
            return
        window = self.params.liveness_timeouts * self.params.election_ticks_max
        if self.now - max(self._talking_since, self._leader_seen) > window:
            self.fail(f"no ready leader for {window} ticks while {sorted(s)} could talk: "
                      + ", ".join(f"{n.id}={n.raft.role.value}/t{n.raft.term}/c{n.raft.commit}/l{n.log.last_index()}"
                                  for n in self.alive()))

    def run(self) -> None:
        p = self.params
        rng = self.rng
        while self.now < p.fault_ticks:
            if rng.random() < 0.03:
                self.random_fault()
            if rng.random() < 1 / p.propose_every:
                self.propose()
            self.tick()
            self.check_liveness()
        # calm: everything healed, up and running; a ready leader and a fresh proposal committed everywhere
        self.net.heal()
        self.net.drop = self.net.dup = 0.0
        self.net.delay_max = 1
        for n in self.nodes.values():
            if n.raft is None:
                self.restart(n)
            elif n.paused_since is not None:
                self.resume(n)
        self.note("calm")
        deadline = self.now + p.calm_ticks
        marker = None
        while self.now < deadline:
            self.tick()
            self.check_liveness()
            if marker is None:
                marker = self.propose()
            elif marker in self.acked:
                if all(n.raft.commit >= self.acked[marker] for n in self.alive()):
                    break
            elif not any(v == marker for *_, v in self.pending):
                marker = None        # its leader lost the lead first (outcome unknown): propose again
        else:
            self.fail(f"no liveness {p.calm_ticks} ticks after the faults stopped: "
                      + ", ".join(f"{n.id}={n.raft.role.value}/t{n.raft.term}/c{n.raft.commit}/l{n.log.last_index()}"
                                  for n in self.alive()))
        self.counts["installs"] = sum(n.log.installs for n in self.nodes.values())
        self._final_checks()

    def _final_checks(self) -> None:
        for value, idx in self.acked.items():
            e = self.committed.get(idx)
            if e is None or e[1] != value:
                self.fail(f"acknowledged {value} at {idx} is not committed there (found {e})")
        top = max(n.raft.commit for n in self.alive())
        proposals = 0                              # proposals in the committed log up to i
        below = {}
        for i in range(top + 1):
            below[i] = proposals
            proposals += self.committed[i][1] != NOOP
        for n in self.alive():
            log = n.log
            for i in range(log.first_index(), n.raft.commit + 1):
                if log.item(i) != self.committed[i]:
                    self.fail(f"{n.id} disagrees at committed index {i}")
            # what an install carried (the broker: queue offsets) continues the group's count
            if log.base != below.get(log.first_index(), proposals):
                self.fail(f"{n.id} counts {log.base} proposals below its first entry {log.first_index()}, "
                          f"the committed log {below.get(log.first_index(), proposals)}")
        assert top >= 0


def params_for(seed: int) -> SimParams:
    """A seed's own shape, so that a sweep covers 3 and 5 nodes, narrow election windows
    (split votes: several candidates in one term), runs without pre-vote, half of them
    with retention deleting members' oldest entries (followers behind a leader's first
    entry are installed), and a third with entries damaged under members (a leader hands
    over an entry it cannot serve)."""
    rng = random.Random(seed * 7919 + 17)
    narrow = rng.random() < 0.3
    return SimParams(nodes=5 if rng.random() < 0.3 else 3,
                     election_ticks_min=10, election_ticks_max=11 if narrow else 20,
                     pre_vote=rng.random() < 0.75, check_quorum=rng.random() < 0.85,
                     fault_ticks=rng.choice([300, 400, 600]), batch_max=rng.choice([1, 2, 8]),
                     compact_weight=0.5 if rng.random() < 0.5 else 0.0,
                     damage_weight=0.3 if rng.random() < 0.33 else 0.0)


def run_seed(seed: int, params: SimParams | None = None, verbose: bool = False) -> SimCluster:
    c = SimCluster(seed, params or params_for(seed), verbose)
    c.run()
    return c


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mq.dledger.sim",
                                 description="seeded simulation of the DLedger Raft core")
    ap.add_argument("--seed", type=int, help="run (and print) one seed")
    ap.add_argument("--seeds", type=int, default=200, help="run seeds 0..N-1")
    ap.add_argument("--nodes", type=int, help="override the seed's node count")
    ap.add_argument("--no-pre-vote", action="store_true", help="override: no pre-vote")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args(argv)
    seeds = [args.seed] if args.seed is not None else range(args.seeds)
    failed = 0
    for s in seeds:
        params = params_for(s)
        if args.nodes:
            params.nodes = args.nodes
        if args.no_pre_vote:
            params.pre_vote = False
        try:
            c = run_seed(s, params, args.verbose)
            if args.seed is not None:
                print(f"seed {s}: ok; {len(c.committed)} committed, {len(c.acked)} acknowledged, "
                      f"{len(c.leaders)} terms with a leader; {c.counts}")
        except SimFailure as e:
            failed += 1
            print(e, file=sys.stderr)
    if args.seed is None:
        print(f"{len(seeds) - failed}/{len(seeds)} seeds passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
