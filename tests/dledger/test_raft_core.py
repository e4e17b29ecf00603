"""The Raft core (mq.dledger.core) on its own: a sweep of seeded simulations
with faults, and scripted scenarios for the cases Raft is known to get wrong
when a rule is missing.  Everything is deterministic: a failing seed prints
itself and the command that replays it."""
from __future__ import annotations

import multiprocessing as mp
import os

import pytest

from mq.dledger import core
from mq.dledger.core import (Append, AppendResp, Config, Heartbeat, HeartbeatResp, RaftNode, Role, TimeoutNow, VoteReq,
                             VoteResp)
from mq.dledger.sim import NOOP, SimCluster, SimFailure, SimLog, SimParams, params_for, run_seed

SEEDS = int(os.environ.get("MQ_RAFT_SEEDS", "2000"))
PAUSE_SEEDS = int(os.environ.get("MQ_RAFT_PAUSE_SEEDS", "200"))
PAUSE_SEED_BASE = 100_000          # a range of its own: these runs differ from the main sweep's anyway


def _run_range(bounds: tuple[int, int]) -> tuple[list[str], dict]:
    failures, counts = [], {}
    for seed in range(*bounds):
        try:
            c = run_seed(seed)
        except SimFailure as e:
            failures.append(str(e))
            continue
        for k, v in c.counts.items():
            counts[k] = counts.get(k, 0) + v
    return failures, counts


def _run_paused_range(bounds: tuple[int, int]) -> tuple[list[str], dict]:
    """Seeds whose faults are half pauses (pause_weight 1: as many pauses as all other faults)."""
    failures, counts = [], {}
    for seed in range(*bounds):
        params = params_for(seed)
        params.pause_weight = 1.0
        try:
            c = run_seed(seed, params)
        except SimFailure as e:
            failures.append(str(e) + f"\n(pause_weight=1.0: replay with run_seed({seed}, params) as in this test)")
            continue
        for k, v in c.counts.items():
            counts[k] = counts.get(k, 0) + v
    return failures, counts


def test_thousands_of_seeded_runs_keep_every_safety_property_and_recover():
    """Proves, over SEEDS seeded runs (3 and 5 nodes; message loss, duplication,
    delay and reordering; partitions; crashes and restarts from persisted
    state; with and without pre-vote; half of them with retention deleting
    members' oldest committed entries): at most one leader per term, a committed
    entry never lost or changed, every node's log equal to the others up to its
    commit index, every acknowledged proposal committed at its index, a member
    installed from a leader's first entry counting the proposals below it as the
    group does, and a ready leader committing a fresh proposal on all nodes once
    faults stop; a third of them with committed entries damaged under a member (a
    leader that cannot serve one hands over to a member holding it).  The counts
    prove retention ran, members were installed, entries were damaged and leaders
    handed over for them."""
    half = SEEDS // 2
    with mp.get_context("fork").Pool(2) as pool:
        parts = pool.map(_run_range, [(0, half), (half, SEEDS)])
    failures = sum((f for f, _ in parts), [])
    assert not failures, f"{len(failures)} of {SEEDS} seeds failed; the first:\n{failures[0]}"
    counts = {k: sum(c.get(k, 0) for _, c in parts) for k in parts[0][1]}
    assert counts["compactions"] >= SEEDS and counts["installs"] >= SEEDS // 10, counts
    assert counts["damages"] >= SEEDS // 5 and counts["damage_handovers"] >= SEEDS // 20, counts


def test_paused_leaders_their_stale_messages_and_liveness_over_many_seeds():
    """Proves, over PAUSE_SEEDS seeded runs where every other fault is a pause (a SIGSTOP of a
    member, mostly the leader: it misses its ticks and reads, what it had sent may arrive late,
    and on resuming it replays its ticks and sends heartbeats and appends of a term that is
    over): every safety property of the main sweep; every answer is of its request's kind and
    to its source (what the broker can send back on the request's connection); and whenever a
    majority runs and can talk over a good network for six election timeouts, one of them is a
    ready leader.  The counts prove the runs delivered stale-term heartbeats and appends and
    spent ticks under the liveness check (the test cannot pass by exercising nothing)."""
    half = PAUSE_SEED_BASE + PAUSE_SEEDS // 2
    with mp.get_context("fork").Pool(2) as pool:
        parts = pool.map(_run_paused_range, [(PAUSE_SEED_BASE, half), (half, PAUSE_SEED_BASE + PAUSE_SEEDS)])
    failures = sum((f for f, _ in parts), [])
    assert not failures, f"{len(failures)} of {PAUSE_SEEDS} seeds failed; the first:\n{failures[0]}"
    counts = {k: sum(c.get(k, 0) for _, c in parts) for k in parts[0][1]}
    assert counts["pauses"] >= PAUSE_SEEDS, counts
    assert counts["stale_heartbeats"] >= PAUSE_SEEDS and counts["stale_appends"] >= PAUSE_SEEDS // 4, counts
    assert counts["liveness_ticks"] >= 50 * PAUSE_SEEDS, counts


def test_a_failing_seed_names_itself_and_replays_identically(monkeypatch):
    """Proves the checker can fail and that a failure is replayable: with the
    election restriction removed (a voter grants whatever the candidate's log),
    some seed commits two different entries at one index; its report names the
    seed and the replay command, and running that seed again fails the same way."""
    original = RaftNode._on_vote_req

    def careless(self, m):
        m.last_term, m.last_index = 10 ** 9, 10 ** 9        # every candidate looks up to date
        original(self, m)

    monkeypatch.setitem(core._HANDLERS, core.VoteReq, careless)
    first = None
    for seed in range(200):
        try:
            run_seed(seed)
        except SimFailure as e:
            first = (seed, str(e))
            break
    assert first is not None, "no seed caught a missing election restriction"
    seed, text = first
    assert f"seed {seed}:" in text and f"--seed {seed} --verbose" in text
    with pytest.raises(SimFailure) as again:
        run_seed(seed)
    assert str(again.value) == text


# ---- scripted scenarios --------------------------------------------------------------------------
def group(n: int = 3, **params) -> SimCluster:
    """A quiet cluster (no loss, one-tick delays) whose faults the test chooses."""
    p = SimParams(nodes=n, **params)
    return SimCluster(seed=1, params=p)


def run_until(c: SimCluster, cond, ticks: int = 500) -> None:
    for _ in range(ticks):
        if cond():
            return
        c.tick()
    raise AssertionError("condition not reached")


def leader_of(c: SimCluster):
    leaders = [n for n in c.alive() if n.raft.role is Role.LEADER]
    return leaders[0] if len(leaders) == 1 else None


def test_figure_8_an_earlier_terms_entry_is_not_committed_by_counting_replicas():
    """Raft paper §5.4.2, figure 8: a leader of term 4 that replicates an entry
    of term 2 to a majority must not call it committed before an entry of its
    own term is on a majority -- else the node holding a term-3 entry at that
    index could still be elected and overwrite a 'committed' entry.  (With the
    rule removed, the simulator's commit check fails here.)"""
    c = group(5, batch_max=1)
    s1, s2, s3, s4, s5 = (c.nodes[f"n{i}"] for i in range(5))
    # index 0 (term 1) everywhere; index 1: term 2 on s1, s2 (s1 led term 2); term 3 on s5
    for n in c.nodes.values():
        n.log.items = [(1, "a")]
    s1.log.items.append((2, "b"))
    s2.log.items.append((2, "b"))
    s5.log.items.append((3, "x"))
    for n in c.nodes.values():
        n.hard = (3, None)
        n.start()
        n.raft.timeout = 10 ** 6
    # s1 wins term 4 with s2, s3, s4 (s5 is cut off: it would refuse, its log is more up to date)
    s1.raft.timeout = 1
    c.net.partition([["n0", "n1", "n2", "n3"], ["n4"]])
    run_until(c, lambda: s1.raft.role is Role.LEADER)
    assert s1.raft.term == 4 and s1.log.items[2] == (4, NOOP)
    # from now on s1 reaches s2 and s3 only; s3 gets index 1 (term 2) and s1 learns it: a majority
    # (s1, s2, s3) holds it; s1 is cut off before its no-op reaches s3
    c.net.cut |= {("n0", "n3")}
    run_until(c, lambda: s1.raft.progress["n2"].match >= 1)
    assert s3.log.items == [(1, "a"), (2, "b")]
    c.net.partition([["n0"], ["n1", "n2", "n3", "n4"]])
    # ... but it is not committed: only an entry of s1's own term could commit it
    assert s1.raft.commit < 1
    c.crash(s1)
    # s2 is cut off too: of s3, s4, s5 only s5 (last term 3) can gather a majority; it
    # overwrites index 1 on s3
    c.net.partition([["n0"], ["n1"], ["n2", "n3", "n4"]])
    s5.raft.timeout = 1
    run_until(c, lambda: leader_of(c) is s5 and s5.raft.commit >= 2, 2000)
    assert s5.log.items[:2] == [(1, "a"), (3, "x")]
    assert c.committed[1] == (3, "x")


def test_a_node_cut_off_and_back_does_not_disrupt_the_leader_with_pre_vote():
    """Pre-vote: a follower isolated for many election timeouts keeps its term
    (no majority would pre-vote for it), so when it returns the leader keeps
    leading in the same term and the follower follows it."""
    c = group(3, pre_vote=True)
    run_until(c, lambda: leader_of(c) is not None and leader_of(c).raft.is_ready_leader)
    lead = leader_of(c)
    term = lead.raft.term
    lonely = next(n for n in c.alive() if n is not lead)
    others = [n.id for n in c.alive() if n is not lonely]
    c.net.partition([[lonely.id], others])
    for _ in range(20 * c.params.election_ticks_max):
        c.tick()
    assert lonely.raft.term == term and lonely.raft.role is Role.CANDIDATE
    c.net.heal()
    run_until(c, lambda: lonely.raft.role is Role.FOLLOWER and lonely.raft.leader_id == lead.id)
    assert lead.raft.role is Role.LEADER and lead.raft.term == term


def test_without_pre_vote_the_returning_node_would_disrupt():
    """The contrast that shows what pre-vote buys: the same isolation without it
    raises the lonely node's term, and on its return the leader has to step down."""
    c = group(3, pre_vote=False)
    run_until(c, lambda: leader_of(c) is not None and leader_of(c).raft.is_ready_leader)
    lead = leader_of(c)
    term = lead.raft.term
    lonely = next(n for n in c.alive() if n is not lead)
    c.net.partition([[lonely.id], [n.id for n in c.alive() if n is not lonely]])
    for _ in range(20 * c.params.election_ticks_max):
        c.tick()
    assert lonely.raft.term > term
    c.net.heal()
    run_until(c, lambda: lead.raft.term > term)


def test_a_leader_cut_off_from_the_majority_steps_down_and_commits_nothing():
    """Check-quorum: the old leader, alone, steps down within two election
    timeouts and never commits what it accepted while alone; the majority side
    elects a leader that commits; after healing the old leader's uncommitted
    entries are replaced by the new leader's log."""
    c = group(3)
    run_until(c, lambda: leader_of(c) is not None and leader_of(c).raft.is_ready_leader)
    old = leader_of(c)
    commit_before = old.raft.commit
    c.net.partition([[old.id], [n.id for n in c.alive() if n is not old]])
    idx = old.log.propose(old.raft.term, "lost-on-minority")
    old.raft.log_progress()
    c._drain(old)
    run_until(c, lambda: old.raft.role is not Role.LEADER, 2 * c.params.election_ticks_max + 5)
    assert old.raft.commit == commit_before < idx
    run_until(c, lambda: leader_of(c) is not None and leader_of(c).raft.is_ready_leader)
    new = leader_of(c)
    assert new is not old
    c.net.heal()
    run_until(c, lambda: old.raft.leader_id == new.id and old.raft.commit >= new.raft.noop_index)
    assert old.log.items[idx][1] != "lost-on-minority"


def test_leadership_transfer_and_the_preferred_leader():
    """TimeoutNow: a transfer to a caught-up follower makes it leader in the
    next term at once (no election timeout; leases do not block it); a
    configured preferred leader takes the lead back by itself."""
    c = group(3)
    run_until(c, lambda: leader_of(c) is not None and leader_of(c).raft.is_ready_leader)
    lead = leader_of(c)
    target = next(n for n in c.alive() if n is not lead)
    assert lead.raft.transfer_leadership(target.id)
    run_until(c, lambda: leader_of(c) is target, 3 * c.params.election_ticks_min)
    assert target.raft.term == lead.raft.term

    p = SimParams(nodes=3)
    c2 = SimCluster(seed=2, params=p)
    for n in c2.nodes.values():
        n.raft.cfg.preferred_leader = "n2"
    run_until(c2, lambda: leader_of(c2) is c2.nodes["n2"] and c2.nodes["n2"].raft.is_ready_leader, 2000)


def test_a_vote_survives_a_restart():
    """The vote is part of the persisted hard state: a node that voted in a term
    and restarts does not vote for a second candidate in that term."""
    log = SimLog()
    rng = __import__("random").Random(0)
    cfg = Config("n0", ["n0", "n1", "n2"])
    n0 = RaftNode(cfg, log, rng)
    n0.step(core.VoteReq(1, "n1", "n0", -1, 0))
    rd = n0.ready()
    assert rd.hard_state == (1, "n1") and rd.messages[0].granted
    again = RaftNode(cfg, log, rng, term=rd.hard_state[0], vote=rd.hard_state[1])
    again.step(core.VoteReq(1, "n2", "n0", -1, 0))
    assert not again.ready().messages[0].granted


def test_a_follower_never_truncates_on_a_stale_or_duplicated_append():
    """An Append that arrives late (duplicated or reordered) and holds fewer
    entries than the follower has must not cut the follower's log."""
    log = SimLog()
    cfg = Config("n1", ["n0", "n1", "n2"])
    f = RaftNode(cfg, log, __import__("random").Random(0))
    from mq.dledger.sim import SimBatch
    big = Append(1, "n0", "n1", -1, 0, SimBatch(0, [(1, NOOP), (1, "a"), (1, "b")]), -1)
    small = Append(1, "n0", "n1", -1, 0, SimBatch(0, [(1, NOOP)]), -1)
    f.step(big)
    f.step(small)
    assert log.items == [(1, NOOP), (1, "a"), (1, "b")]
    resp = [m for m in f.ready().messages if isinstance(m, AppendResp)]
    assert [r.index for r in resp] == [2, 0] and all(r.success for r in resp)
    assert not any(isinstance(m, TimeoutNow) for m in resp)


def test_a_message_of_an_older_term_is_refused_in_its_own_response_kind():
    """A member in term 5 answers each request of term 3 with the response of that request's
    kind carrying term 5 (so the broker can send it back on the request's connection, and the
    sender steps down): Append -> AppendResp, Heartbeat -> HeartbeatResp (before: an
    AppendResp, which the broker could not send -- it asserted, and the frame wedged the peer
    link), VoteReq and pre-VoteReq -> a refusing VoteResp.  A stale TimeoutNow or response is
    dropped.  The old leader that gets the HeartbeatResp follows in term 5."""
    cfg = Config("n1", ["n0", "n1", "n2"])
    f = RaftNode(cfg, SimLog(), __import__("random").Random(0), term=5)
    cases = [(Append(3, "n0", "n1", -1, 0, None, -1), AppendResp), (Heartbeat(3, "n0", "n1", -1), HeartbeatResp),
             (VoteReq(3, "n0", "n1", 10, 3), VoteResp), (VoteReq(3, "n0", "n1", 10, 3, pre=True), VoteResp),
             (TimeoutNow(3, "n0", "n1"), None), (AppendResp(3, "n0", "n1", True, 0), None),
             (HeartbeatResp(3, "n0", "n1"), None), (VoteResp(3, "n0", "n1", True), None)]
    for m, want in cases:
        f.step(m)
        out = f.ready().messages
        assert core.RESPONSE_TO.get(type(m)) is want
        if want is None:
            assert out == [], (m, out)
            continue
        assert len(out) == 1 and type(out[0]) is want and out[0].dst == "n0" and out[0].term == 5, (m, out)
        assert not getattr(out[0], "granted", False) and not getattr(out[0], "success", False)
        assert getattr(out[0], "pre", m.__dict__.get("pre")) == m.__dict__.get("pre")
    assert f.term == 5 and f.role is Role.FOLLOWER
    old = RaftNode(Config("n0", ["n0", "n1", "n2"]), SimLog(), __import__("random").Random(0), term=3)
    old.role, old.leader_id = Role.LEADER, "n0"
    old.step(HeartbeatResp(5, "n1", "n0"))
    assert old.role is Role.FOLLOWER and old.term == 5 and old.leader_id is None


def test_a_paused_leader_resumes_and_the_next_failover_needs_only_the_two_left():
    """The real-process scenario of test_dledger_cluster, in the simulator: the leader pauses
    until another leads; on resuming it replays its ticks first and sends heartbeats of its old
    term, which are refused with the new term (as HeartbeatResps: the routing check would fail
    on anything else) and it follows; the third member is cut off from the new leader, which
    commits an entry with the old leader only; the new leader crashes; the old leader, holding
    the longest log, is elected by the third within a few election timeouts."""
    c = group(3)
    run_until(c, lambda: leader_of(c) is not None and leader_of(c).raft.is_ready_leader)
    old = leader_of(c)
    c.pause(old, 10 ** 6, hold_sent=True)

    def new_leader():
        return next((n for n in c.running() if n.raft.is_ready_leader), None)
    run_until(c, lambda: new_leader() is not None)
    new = new_leader()
    third = next(n for n in c.alive() if n not in (old, new))
    assert old.raft.role is Role.LEADER and old.raft.term < new.raft.term
    stale_before = c.counts["stale_heartbeats"]
    c.resume(old, timers_first=True)
    run_until(c, lambda: old.raft.role is Role.FOLLOWER and old.raft.leader_id == new.id
              and c.counts["stale_heartbeats"] > stale_before, 5)
    c.net.cut |= {(new.id, third.id), (third.id, new.id)}
    c.propose()
    idx = new.log.last_index()
    run_until(c, lambda: new.raft.commit >= idx)
    assert old.log.last_index() > third.log.last_index()
    c.crash(new)
    t0 = c.now
    run_until(c, lambda: leader_of(c) is old and old.raft.is_ready_leader, 4 * c.params.election_ticks_max)
    assert c.now - t0 <= 3 * c.params.election_ticks_max


def test_a_refused_candidate_does_not_starve_the_member_that_could_win():
    """Without pre-vote, a member whose log is behind campaigns again and again and is refused;
    its vote requests raise the others' term but must not reset their election timers (Raft,
    figure 2: only a granted vote or a leader does), else the member with the longest log never
    times out first and no one ever leads.  With the old reset the simulator's liveness check
    fails here: it proves the check can fail."""
    def scenario():
        c = group(3, pre_vote=False)
        n0, n1, n2 = (c.nodes[f"n{i}"] for i in range(3))
        n0.log.items = [(1, "a")]
        n1.log.items = [(1, "a"), (1, "b")]
        for n in (n0, n1, n2):
            n.hard = (1, None)
            n.start()
        c.crash(n2)
        n0.raft.cfg.election_ticks_max = 10            # n0 (behind) always times out first ...
        n0.raft.timeout = 10
        n1.raft.cfg.election_ticks_min = 15            # ... n1 (ahead) only after 15 ticks
        n1.raft.timeout = 15
        for _ in range(10 * c.params.election_ticks_max):
            c.tick()
            c.check_liveness()
            if leader_of(c) is n1 and n1.raft.is_ready_leader:
                return c
        raise AssertionError("no leader, and the liveness check did not fail")

    scenario()
    original = RaftNode._become_follower

    def always_reset(self, term, leader, reset_timer=True):
        original(self, term, leader)

    mp_ = pytest.MonkeyPatch()
    with mp_.context() as m:
        m.setattr(RaftNode, "_become_follower", always_reset)
        with pytest.raises(SimFailure, match="no ready leader for 120 ticks while"):
            scenario()


def test_a_hard_state_counts_as_saved_only_once_the_driver_says_so():
    """ready() asks for the same (term, vote) until saved() confirms it: a driver whose fsync
    failed sends nothing and is asked again on the next step, so no message ever depends on a
    vote or a term a crash could forget."""
    n0 = RaftNode(Config("n0", ["n0", "n1", "n2"]), SimLog(), __import__("random").Random(0))
    n0.step(core.VoteReq(1, "n1", "n0", -1, 0))
    first = n0.ready()
    assert first.hard_state == (1, "n1") and first.messages
    n0.step(core.Heartbeat(1, "n1", "n0", -1))          # the driver could not save: it sent nothing
    again = n0.ready()
    assert again.hard_state == (1, "n1"), "asked again until confirmed"
    n0.saved(again.hard_state)
    n0.step(core.Heartbeat(1, "n1", "n0", -1))
    assert n0.ready().hard_state is None


# ---- a member behind the leader's first entry (retention): installs --------------------------------
def _member_down_while_proposals_go_on(c: SimCluster, before: int, during: int):
    """(leader, the member crashed, the other follower): `before` proposals committed on all, then
    one follower down while `during` more are committed on the other two."""
    run_until(c, lambda: leader_of(c) is not None and leader_of(c).raft.is_ready_leader)
    lead = leader_of(c)
    victim, other = [n for n in c.alive() if n is not lead]
    for _ in range(before):
        c.propose()
        c.tick()
    run_until(c, lambda: victim.raft.commit == lead.log.last_index())
    c.crash(victim)
    for _ in range(during):
        c.propose()
        c.tick()
    run_until(c, lambda: lead.raft.commit == lead.log.last_index() == other.raft.commit)
    return lead, victim, other


def test_a_member_behind_the_leaders_first_entry_is_installed_and_catches_up():
    """A member down while the others delete the entries it lacks: restarted, the leader cannot
    probe it (the term before its first entry is gone) and installs its log from its first
    entry; the member drops its older log, catches up to the leader's commit and counts the
    proposals below its new first entry as the group does.  With install off it would never
    catch up (the leader has nothing to send it)."""
    for install in (True, False):
        c = group(3)
        if not install:
            for n in c.nodes.values():
                n.raft.cfg.install = False
        lead, victim, other = _member_down_while_proposals_go_on(c, 5, 40)
        upto = lead.raft.commit - 3
        assert victim.log.last_index() < upto - 1
        c.compact(lead, upto)
        c.compact(other, upto)
        c.restart(victim)
        if not install:
            victim.raft.cfg.install = False
            for _ in range(200):
                c.tick()
            assert victim.raft.commit < upto and victim.log.installs == 0
            continue
        run_until(c, lambda: victim.log.last_index() == lead.log.last_index() == victim.raft.commit)
        assert leader_of(c) is lead and victim.log.installs == 1
        assert victim.log.first_index() == upto and victim.log.base == lead.log.base > 0
        assert victim.log.items == lead.log.items
        c._final_checks()


def test_a_leader_hands_over_to_a_member_holding_the_entry_it_cannot_serve():
    """A follower down while the others commit; meanwhile one of those entries is damaged in the
    leader's log (its bytes fail their checks).  Restarted, the follower needs that entry: a push
    sent unchecked (the broker streams them from C) is refused and the connection drops, the
    leader's checked probe then stops before the entry, the leader reports it and hands leadership
    to the member holding it, which serves it whole; the follower catches up to the end.  Without
    the handover it would stay behind at that entry for as long as that leader leads."""
    c = group(3)
    lead, victim, other = _member_down_while_proposals_go_on(c, 5, 40)
    bad = victim.log.last_index() + 20
    assert other.log.last_index() >= bad
    lead.log.damage(bad)
    for _ in range(core.DAMAGE_HANDOVER_TIMEOUTS * c.params.election_ticks_max):
        c.tick()                                   # (a leader hands over for damage after leading this long)
    c.restart(victim)
    run_until(c, lambda: leader_of(c) is other and other.raft.is_ready_leader
              and victim.log.last_index() == other.log.last_index() == victim.raft.commit)
    assert c.counts["damage_found"] >= 1 and c.counts["damaged_refused"] >= 1
    assert victim.log.items == other.log.items
    for _ in range(5):                             # the group goes on committing under its new leader
        c.propose()
        c.tick()
    run_until(c, lambda: victim.raft.commit == other.raft.commit == other.log.last_index())
    c._final_checks()


def test_when_the_only_other_copy_is_damaged_too_the_group_keeps_committing():
    """Both members holding an entry have it damaged: nobody can serve it to the third, which stays
    behind at it (named in the README); leadership moves between the two at most once every
    DAMAGE_HANDOVER_TIMEOUTS election timeouts, and the group keeps committing in between."""
    c = group(3)
    lead, victim, other = _member_down_while_proposals_go_on(c, 5, 40)
    bad = victim.log.last_index() + 20
    lead.log.damage(bad)
    other.log.damage(bad)
    c.restart(victim)
    moves, seen = 0, lead
    window = core.DAMAGE_HANDOVER_TIMEOUTS * c.params.election_ticks_max
    for _ in range(6 * window):
        c.propose()
        c.tick()
        now = leader_of(c)
        if now is not None and now is not seen:
            moves, seen = moves + 1, now
    assert victim.log.last_index() == bad - 1
    assert 1 <= moves <= 6, moves
    top = max(lead.raft.commit, other.raft.commit)
    assert top >= bad + 100, top                   # ~2 proposals in 3 ticks went on being committed
    c._final_checks()


def _follower(entries: list, commit: int) -> RaftNode:
    log = SimLog()
    log.items = list(entries)
    return RaftNode(Config("n1", ["n0", "n1", "n2"], install=True), log, __import__("random").Random(0),
                    term=2, commit=commit)


def _install(first: int, items: list, commit: int) -> Append:
    from mq.dledger.sim import SimBatch
    return Append(2, "n0", "n1", first - 1, 0, SimBatch(first, items, base=first), commit, install=True)


def _answer(node: RaftNode) -> AppendResp:
    (resp,) = [m for m in node.ready().messages if isinstance(m, AppendResp)]
    return resp


def test_an_install_keeps_a_follower_log_holding_the_leaders_first_entry():
    """A follower whose commit lags but which holds the leader's first entry with its term keeps
    its log (log matching: up to that entry it is the leader's; dropping it could take a
    committed entry off a majority) and appends from there; one whose entry there differs has
    nothing committed from there on and is reset to the leader's log."""
    f = _follower([(1, f"v{i}") for i in range(10)], commit=2)
    f.step(_install(5, [(1, "v5"), (1, "v6")], commit=8))
    r = _answer(f)
    assert r.success and r.index == 6 and f.commit == 6
    assert f.log.first_index() == 0 and f.log.last_index() == 9 and f.log.installs == 0

    f = _follower([(1, f"v{i}") for i in range(5)] + [(2, "stale"), (2, "stale2")], commit=2)
    f.step(_install(5, [(1, "v5"), (1, "v6")], commit=8))
    r = _answer(f)
    assert r.success and r.index == 6 and f.commit == 6
    assert f.log.installs == 1 and f.log.first_index() == 5 and f.log.items == [(1, "v5"), (1, "v6")]
    assert f.log.base == 5


def test_a_stale_or_duplicated_install_does_not_cut_a_caught_up_follower():
    """An install within the follower's commit (late, duplicated, or from a leader whose first
    entry is older than ours) changes nothing: it answers success with its commit."""
    entries = [(1, f"v{i}") for i in range(10)]
    f = _follower(entries, commit=8)
    f.step(_install(5, [(1, "v5"), (1, "v6")], commit=8))
    r = _answer(f)
    assert r.success and r.index == 8 and f.log.items == entries and f.log.installs == 0


def test_an_install_whose_commit_does_not_cover_it_is_refused():
    """A leader holds only committed entries below its first one, so an install whose commit is
    below first-1 is broken: refused without touching the log (the leader resends)."""
    entries = [(1, f"v{i}") for i in range(3)]
    f = _follower(entries, commit=1)
    f.step(_install(5, [(2, "v5")], commit=3))
    r = _answer(f)
    assert not r.success and r.reject_index == -1 and f.log.items == entries and f.log.installs == 0


def test_a_restarted_member_knows_what_lies_below_its_first_entry_is_committed():
    """After retention (or an install) a member's log begins above 0; restarted with no
    checkpoint, its commit is its first index - 1, never below: the entries under it are
    committed history, and a leader's probe below them must not look like a conflict."""
    log = SimLog()
    log.items = [(1, f"v{i}") for i in range(10)]
    log.compact(6)
    n = RaftNode(Config("n1", ["n0", "n1", "n2"], install=True), log, __import__("random").Random(0), term=1)
    assert n.commit == 5
    n.step(Append(1, "n0", "n1", 2, 1, None, 9))
    r = _answer(n)
    assert r.success and r.index == 5 and log.first_index() == 6


def test_a_member_whose_log_ends_right_before_the_leaders_first_entry_is_not_installed():
    """Retention deleted exactly the entries a down member has: its log ends at the entry before
    the leader's first one, whose term the leader still knows (retention keeps it; DLedgerLog
    reads it from the index unit).  Restarted, it is caught up by plain appends, keeping its log."""
    c = group(3)
    lead, victim, other = _member_down_while_proposals_go_on(c, 5, 20)
    upto = victim.log.last_index() + 1
    c.compact(lead, upto)
    c.compact(other, upto)
    c.restart(victim)
    run_until(c, lambda: victim.log.last_index() == lead.log.last_index() == victim.raft.commit)
    assert victim.log.installs == 0 and victim.log.first_index() == 0
    c._final_checks()
