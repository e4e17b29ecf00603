"""DLedger mode with real processes on loopback: three mqbroker processes of one group and a
name server.  What is proved: election and registration, the official C++ client producing
and consuming, no acknowledged message lost across a leader kill under load, a frozen leader
(or only its Raft role) and a partitioned leader never acknowledging what they appended (a
frozen leader's sends read after it stepped down are forwarded), a whole group stalled together
resuming with its leader, a restarted member ending byte-identical, a whole-group restart keeping
committed data, the preferred leader and leadership transfer, and a leader resumed after a pause
(its stale heartbeats refused) not costing the next failover."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from mq.cluster import NameServer, stop_process, wait_for

from mq.broker.forward import FORWARD_REMARK_PREFIX
from mq.wire.msgid import decode_offset_msg_id
from mq.wire.dledger import parse_index_unit
from tests.dledger.dlkit import DLedgerGroup, call, wait_dispatched
from tests.ha.test_broker_ha import pull_bodies, pull_queue
from tests.store.storekit import flip_byte

TOPIC = "DLT"
SEND, PULL, RUNTIME = 310, 11, 28


def send(addr: str, body: bytes, qid: int = 0, topic: str = TOPIC, timeout_s: float = 5.0, remark: str | None = None):
    return call(addr, SEND, {"a": "PG", "b": topic, "c": "TBW102", "d": 4, "e": qid, "f": 0, "g": 0, "h": 0,
                             "i": "TAGS\x01TagA"}, body, timeout_s, remark=remark)


def pull_all(addr: str, topic: str = TOPIC, queues: int = 4) -> list[bytes]:
    """Every committed message of the topic at `addr`, once its dispatch has caught up with its
    commit (an answered send is committed; its ConsumeQueue entry comes after)."""
    wait_dispatched(addr)
    return pull_bodies(addr, topic, queues)


def leader_end(g: DLedgerGroup, leader: str) -> int:
    """The leader's commit position, from a status it wrote after this call began, with nothing in
    flight (committedPos == writePos).  A status is rewritten once a second: one written before
    the sends just made says less, and a member compared against it looks caught up too soon (a
    restarted member 'caught up' with the leader's status from before its kill)."""
    since_ms = time.time() * 1000
    st = wait_for(lambda: (s := g.status(leader)).get("updated", 0) > since_ms and s["committedPos"] == s["writePos"]
                  and s, 10, 0.05, "a status the leader wrote after the sends")
    return st["committedPos"]


def runtime(addr: str) -> dict:
    return json.loads(call(addr, RUNTIME).body)["table"]


@pytest.fixture
def ns(tmp_path):
    n = NameServer(str(tmp_path))
    yield n
    n.stop()


@pytest.fixture
def group(tmp_path, ns):
    groups = []

    def make(**kw):
        g = DLedgerGroup(str(tmp_path), ns.addr, **kw)
        groups.append(g)
        return g
    yield make
    for g in groups:
        g.close()


def _route_master(ns_addr: str, topic: str):
    r = call(ns_addr, 105, {"topic": topic})
    if r.code != 0:
        return None
    datas = json.loads(r.body.decode())["brokerDatas"]
    return {str(k): v for k, v in datas[0]["brokerAddrs"].items()} if datas else None


def test_election_registration_and_followers_forwarding_writes(group, ns):
    """A leader is elected and serves writes; the name server routes brokerId 0 to it and the
    followers as brokerId selfId+1; a send to a follower is forwarded to the leader (a client
    whose route still names an old leader) and answered with the leader's result, stored once;
    an acknowledged message is committed on every member (logs equal up to the commit position)
    and readable from the followers too."""
    g = group()
    leader = g.wait_leader()
    assert send(g.addr(leader), b"first").code == 0
    addrs = wait_for(lambda: (_route_master(ns.addr, TOPIC) or {}).get("0") == g.addr(leader) and
                     len(_route_master(ns.addr, TOPIC)) == 3 and _route_master(ns.addr, TOPIC), 40, 0.2,
                     "leader as brokerId 0 and both followers in the route")
    for i in g.ids:
        if i != leader:
            assert addrs[str(int(i[1:]) + 1)] == g.addr(i)
            wait_for(lambda: g.status(i).get("leaderBrokerAddr") == g.addr(leader), 10, 0.02,
                     f"{i} knowing the leader's broker address (from its heartbeats)")
            r = send(g.addr(i), b"via-" + i.encode())
            assert r.code == 0, (r.code, r.remark)
            assert decode_offset_msg_id(r.ext_fields["msgId"])[1] == int(g.addr(leader).rsplit(":", 1)[1])
            # one already forwarded by another member is not forwarded again (two members that each
            # took the other for the leader cannot bounce a send): answered here, refused
            r = send(g.addr(i), b"bounced", remark=FORWARD_REMARK_PREFIX + "127.0.0.1:1")
            assert r.code == 14, (r.code, r.remark)
    end = leader_end(g, leader)
    for i in g.ids:
        wait_for(lambda: g.committed_pos(i) >= end, 10, 0.05, f"{i} committed")
    logs = {i: g.data_bytes(i, end) for i in g.ids}
    assert len(set(logs.values())) == 1
    for i in g.ids:
        wait_for(lambda: b"first" in pull_all(g.addr(i)), 20, 0.1, f"the message readable on {i}")
    for i in g.ids:
        got = pull_all(g.addr(i))
        assert all(got.count(b"via-" + j.encode()) == (j != leader) for j in g.ids) and b"bounced" not in got, got
        assert int(runtime(g.addr(i))["dLegerForwarded"]) == (i != leader)
    t = runtime(g.addr(leader))
    assert t["dLegerRole"] == "LEADER" and t["brokerId"] == "0" and t["brokerRole"] == "SYNC_MASTER"


def test_the_official_cpp_client_produces_and_consumes(group, ns):
    """The unmodified C++ client (rocketmq==0.4.4) sends to the group's leader through the name
    server with SEND_OK and a push consumer receives every message; the leader's index finds
    them by the C++ msgId (UNIQ_KEY) and by key."""
    rocketmq = pytest.importorskip("rocketmq.client", reason="pip install rocketmq==0.4.4 (make test does)")
    from tests.compat.test_cpp_client import Collector, make_producer, message, push_consumer, uniq
    g = group()
    leader = g.wait_leader()
    wait_for(lambda: (_route_master(ns.addr, "TBW102") or {}).get("0"), 40, 0.2, "TBW102 routed to the leader")
    topic, grp = uniq("T_dl"), uniq("CG_dl")
    prod = make_producer(ns.addr)
    ids = []
    try:
        for i in range(100):
            r = prod.send_sync(message(topic, i, "TagA"))
            assert r.status == 0
            ids.append(r.msg_id)
    finally:
        prod.shutdown()
    # the leader's io worker (one: DLedgerGroup's default) took these sends on its C path and
    # held each answer until the commit passed it
    assert int(json.loads(call(g.addr(leader), 28).body)["table"]["fastSendMsgs"]) >= 90
    col = Collector()
    cons = push_consumer(ns.addr, grp, topic, col)
    try:
        wait_for(lambda: len({m[3] for m in col.got}) >= 100, 60, 0.2, "all 100 consumed")
    finally:
        cons.shutdown()
    assert {int(m[3]) for m in col.got} == set(range(100))

    async def find():
        from mq.client import AdminClient
        async with AdminClient(ns.addr) as admin:
            return ([[m.msg_id for m in await admin.query_message(topic, ids[i], unique=True)] for i in (0, 50, 99)],
                    [[m.msg_id for m in await admin.query_message(topic, f"key-{i}")] for i in (0, 50, 99)])
    by_id, by_key = asyncio.run(find())
    assert by_id == by_key == [[ids[0]], [ids[50]], [ids[99]]]
    del rocketmq


def _load(g: DLedgerGroup, acked: list, stop: threading.Event, worker: int) -> None:
    """Sends to whichever member takes writes (trying each in turn on a refusal)."""
    i, target = 0, 0
    while not stop.is_set():
        body = b"w%d-%d" % (worker, i)
        addr = g.addr(g.ids[target % len(g.ids)])
        try:
            r = send(addr, body, qid=i % 4, timeout_s=4.0)
            ok = r.code == 0
        except Exception:       # noqa: BLE001 - a dead or frozen member
            ok = False
        if ok:
            acked.append(body)
            i += 1
        else:
            target += 1
            time.sleep(0.01)


def test_leader_kill_under_load_loses_no_acknowledged_message(group):
    """SIGKILL of the leader's whole process group while four producers send: a new leader
    serves writes within 3 s of the kill, and every message that got SEND_OK is consumable
    from it afterwards (duplicates allowed, holes not)."""
    g = group()
    old = g.wait_leader()
    acked: list = []
    stop = threading.Event()
    threads = [threading.Thread(target=_load, args=(g, acked, stop, w)) for w in range(4)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: len(acked) >= 300, 60, 0.05, "load under way")
        before = len(acked)
        t0 = time.monotonic()
        g.kill(old)
        new = g.wait_leader(10, among=[i for i in g.ids if i != old])
        wait_for(lambda: len(acked) > before + 50, 20, 0.02, "writes acknowledged again")
        failover_s = time.monotonic() - t0
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert failover_s < 6, f"writes resumed {failover_s:.2f}s after the kill"
    wait_for(lambda: g.committed_pos(new) > 0, 10)
    got = set(pull_all(g.addr(new)))
    missing = set(acked) - got
    assert not missing, f"{len(missing)} of {len(acked)} acknowledged messages missing after the failover"


def _stored_by(r) -> int | None:
    """The port of the broker that stored the message a SEND_OK answer names (its msgId)."""
    return decode_offset_msg_id(r.ext_fields["msgId"])[1] if r.code == 0 else None


def test_a_frozen_leader_never_acknowledges_and_steps_down_when_thawed(group):
    """SIGSTOP of the whole leader for longer than the election timeout, with sends waiting in its
    sockets: none is ever acknowledged on its own account.  When it resumes, which comes first is
    a race: its io worker appends a send in the old term (the wait ends in an error, never
    SEND_OK), or its Raft role steps down first and the io worker forwards the send to the new
    leader, which stores and answers it.  So a SEND_OK must name the new leader as the broker
    that stored it, and the message must be in the group's log.  The others elect a leader that
    serves; the old one steps down and follows."""
    g = group()
    old = g.wait_leader()
    assert send(g.addr(old), b"before").code == 0
    results: list = []

    def pending(k: int):
        try:
            r = send(g.addr(old), b"frozen-%d" % k, timeout_s=30)
            results.append((b"frozen-%d" % k, r.code, _stored_by(r)))
        except Exception as e:  # noqa: BLE001
            results.append((b"frozen-%d" % k, repr(e), None))

    g.freeze(old)
    threads = [threading.Thread(target=pending, args=(k,)) for k in range(3)]
    try:
        for t in threads:
            t.start()
        new = g.wait_leader(15, among=[i for i in g.ids if i != old])
        assert send(g.addr(new), b"after").code == 0
    finally:
        g.thaw(old)
    for t in threads:
        t.join(40)
    assert len(results) == 3, results
    new_port = int(g.addr(new).rsplit(":", 1)[1])
    acked = [body for body, code, port in results if code == 0]
    assert all(port == new_port for _, code, port in results if code == 0), (results, new_port)
    assert int(runtime(g.addr(old))["dLegerForwarded"]) >= len(acked), results
    wait_for(lambda: g.status(old).get("role") == "FOLLOWER" and g.status(old).get("leader") == new, 15, 0.05,
             "the old leader following the new one")
    got = pull_all(g.addr(new))
    assert b"before" in got and b"after" in got
    assert all(got.count(body) == 1 for body in acked), (results, got)


def test_a_leader_whose_raft_role_froze_never_acknowledges_what_it_appended(group):
    """Only the leader's DLedger role stopped (SIGSTOP); its io worker goes on taking sends and
    appends them in the old term, where nothing can commit them any more.  When the role resumes
    it learns of the new term and fences; every such send is then answered SYSTEM_ERROR
    'UNKNOWN_ERROR' (the term changed), never SEND_OK.  (maxWaitAckTimeMs is 60 s here, so the
    answers cannot come from that timeout instead.)  The others elect a leader that serves; the
    old one follows, the entries it never replicated are cut, and none of those sends is in the
    group's log, on the new leader or on the old one.  The deterministic half of the race above."""
    g = group(maxWaitAckTimeMs=60_000)
    old = g.wait_leader()
    assert send(g.addr(old), b"before").code == 0
    last = int(runtime(g.addr(old))["dLegerLastIndex"])
    (role,) = g.brokers[old].processes()["dledger"]
    stop_process(role)
    with ThreadPoolExecutor(3) as pool:
        try:
            answers = [pool.submit(send, g.addr(old), b"stale-%d" % k, timeout_s=30) for k in range(3)]
            wait_for(lambda: int(runtime(g.addr(old))["dLegerLastIndex"]) >= last + 3, 10, 0.02,
                     "the stale sends appended")
            new = g.wait_leader(15, among=[i for i in g.ids if i != old])
            assert send(g.addr(new), b"after").code == 0
            assert not any(f.done() for f in answers), [f.result().code for f in answers if f.done()]
        finally:
            os.kill(role, signal.SIGCONT)
        answers = [f.result() for f in answers]
    assert all(r.code == 1 and r.remark.startswith("UNKNOWN_ERROR") for r in answers), [(r.code, r.remark)
                                                                                          for r in answers]
    wait_for(lambda: g.status(old).get("role") == "FOLLOWER" and g.status(old).get("leader") == new, 15, 0.05,
             "the old leader following the new one")
    wait_for(lambda: g.committed_pos(old) >= g.committed_pos(new) > 0, 15, 0.05, "the old leader caught up")
    for i in (new, old):
        got = pull_all(g.addr(i))
        assert b"before" in got and b"after" in got, i
        assert not any(body.startswith(b"stale-") for body in got), (i, got)


STALL_S = 2.5       # > the election timeout (200 ms x 3 + 300..800 ms) and > the replay there was (2 s)


def test_a_group_stalled_together_resumes_with_its_leader(group):
    """Every process of all three members stopped (SIGSTOP) for longer than the election timeout,
    then resumed: a stalled machine or a paused VM.  No member counts the stall as the leader's
    silence (a role replays at most one heartbeat interval of missed ticks), so the same leader
    goes on in the same term and acknowledges the next send.  When a role replayed up to 2 s of
    ticks, the followers resumed into a campaign and the leader into a check-quorum step-down:
    a CI run saw the election, and a client the ~1 s without a master, after a 3.6 s stall of
    the whole machine."""
    g = group()
    leader = g.wait_leader()
    assert send(g.addr(leader), b"before").code == 0
    term = g.status(leader)["term"]
    for i in g.ids:
        g.freeze(i)
    try:
        time.sleep(STALL_S)
    finally:
        for i in g.ids:
            g.thaw(i)
    thawed_ms = int(time.time() * 1000)
    # an election would have run within one election timeout; each status is rewritten every second
    wait_for(lambda: all(g.status(i).get("updated", 0) > thawed_ms + 2000 for i in g.ids), 15, 0.05,
             "every member's status written 2 s after the thaw")
    states = {i: (g.status(i)["role"], g.status(i)["term"], g.status(i)["leader"]) for i in g.ids}
    assert states == {i: ("LEADER" if i == leader else "FOLLOWER", term, leader) for i in g.ids}, states
    assert send(g.addr(leader), b"after").code == 0
    got = pull_all(g.addr(leader))
    assert b"before" in got and b"after" in got


def test_a_leader_cut_off_from_both_followers_commits_nothing(group):
    """A fault-injecting proxy black-holes every link of the leader: what it accepts is never
    acknowledged (the minority commits nothing); the majority elects a leader that serves;
    after healing, the old leader's uncommitted entries are replaced and all logs agree."""
    g = group(proxied=True)
    old = g.wait_leader()
    assert send(g.addr(old), b"before").code == 0
    g.isolate(old)
    results = []
    for k in range(3):
        try:
            results.append(send(g.addr(old), b"minority-%d" % k, timeout_s=8).code)
        except Exception as e:  # noqa: BLE001
            results.append(repr(e))
    assert 0 not in results, results
    new = g.wait_leader(15, among=[i for i in g.ids if i != old])
    assert send(g.addr(new), b"majority").code == 0
    g.heal()
    wait_for(lambda: g.status(old).get("leader") == new and g.committed_pos(old) >= g.committed_pos(new), 20, 0.05,
             "the old leader caught up with the new one")
    end = g.committed_pos(new)
    assert g.data_bytes(old, end) == g.data_bytes(new, end)
    got = pull_all(g.addr(new))
    assert b"majority" in got and not any(b.startswith(b"minority") for b in got)


def test_a_killed_member_restarts_and_ends_byte_identical(group):
    """A member killed with SIGKILL misses writes, restarts (recovery validates its files and
    rejoins as a follower), catches up, and its data files equal the others' byte for byte up
    to the commit position."""
    g = group()
    leader = g.wait_leader()
    victim = next(i for i in g.ids if i != leader)
    for k in range(50):
        assert send(g.addr(leader), b"a%d" % k, qid=k % 4).code == 0
    g.kill(victim)
    for k in range(200):
        assert send(g.addr(leader), b"b%d" % k + b"x" * (k * 37 % 3000), qid=k % 4).code == 0
    end = leader_end(g, leader)
    g.restart(victim)
    wait_for(lambda: g.committed_pos(victim) >= end, 30, 0.05, "the restarted member caught up")
    ref = g.data_bytes(leader, end)
    for i in g.ids:
        assert g.data_bytes(i, end) == ref, f"{i} differs from the leader"


def _kill_a_follower_after_20(g) -> tuple[str, str]:
    """(leader, victim): once the group elected, 20 sends that the victim (a follower) holds too,
    then the victim killed (SIGKILL)."""
    leader = g.wait_leader()
    victim = next(i for i in g.ids if i != leader)
    for k in range(20):
        assert send(g.addr(leader), b"a%d" % k, qid=k % 4).code == 0
    end = leader_end(g, leader)
    wait_for(lambda: g.committed_pos(victim) >= end, 10, 0.05, "the victim has the first 20")
    g.kill(victim)
    return leader, victim


def test_a_follower_catches_up_through_index_units_damaged_under_the_leader(group):
    """A member killed misses entries; while it is down the leader's index units of the entries it
    will need are zeroed under the running leader (what it reads for each push: the previous
    entry's term, the bytes to send).  Before, every leader tick failed on them (CorruptRecord in
    term_at, ~5 a second: no status written either) and the member never caught up; now each read
    checks a unit against its entry and rewrites it from the entries: the restarted member catches
    up byte-identical, and the leader's log says so in one line."""
    g = group()
    leader, victim = _kill_a_follower_after_20(g)
    for k in range(200):
        assert send(g.addr(leader), b"b%d" % k + b"x" * (k * 37 % 3000), qid=k % 4).code == 0
    end = leader_end(g, leader)          # (a leader whose ticks fail writes no status: this would time out)
    index_file = os.path.join(g.brokers[leader].dir, f"dledger-{leader}", "index", "%020d" % 0)
    with open(index_file, "r+b") as f:                  # units of entries 10..199 (the leader maps the file)
        f.seek(10 * 32)
        f.write(bytes(190 * 32))
    g.restart(victim)
    wait_for(lambda: g.committed_pos(victim) >= end, 30, 0.05, "the restarted member caught up")
    assert g.data_bytes(victim, end) == g.data_bytes(leader, end)
    log_path = os.path.join(g.brokers[leader].dir, "broker.log")
    wait_for(lambda: "DLedger index unit(s) disagreed with their entries" in open(log_path, errors="replace").read(),
             10, 0.1, "the leader's line for the units it rewrote")
    text = open(log_path, errors="replace").read()
    assert "a tick failed" not in text and "pushing entries" not in text
    # (mq_dledger_index_units_repaired_total in the metrics)
    assert wait_for(lambda: g.status(leader).get("indexUnitsRepaired"), 5, 0.1, "the count in the status") >= 1


def test_a_leader_repairs_a_damaged_entry_a_follower_needs_from_a_member_holding_it(group):
    """A member killed misses entries; while it is down one of them is damaged in the leader's data
    file (a bit of a message body: the entry's record fails its BODYCRC).  Before, the leader
    streamed the damaged bytes, the restarted member refused them and dropped the connection, ~5
    times a second for as long as that leader led (the leader logged nothing), and never caught
    up.  Now the leader's checked probe finds the entry, asks the member that holds it for its copy
    (GET) and rewrites its own from it: the restarted member catches up, all three logs are
    byte-identical (the leader's repaired), leadership never moved, and the leader says so in one
    line each.  (Where no copy comes, leadership goes to the holder: the core's tests.)  The scrub
    is off: it would find the entry first (the next test)."""
    g = group(dLegerScrubBytesPerSec=0)
    leader, victim = _kill_a_follower_after_20(g)
    holder = next(i for i in g.ids if i not in (leader, victim))
    for k in range(200):
        assert send(g.addr(leader), b"b%d" % k + b"x" * (k * 37 % 3000), qid=k % 4).code == 0
    end = leader_end(g, leader)
    wait_for(lambda: g.committed_pos(holder) >= end, 10, 0.05, "the holder has every entry")
    _flip_entry_body(g, leader, 50, b"xxxxxxxx")     # entry 50: one the victim lacks (the leader maps the file)
    g.restart(victim)
    wait_for(lambda: g.committed_pos(victim) >= end, 30, 0.05, "the restarted member caught up")
    assert g.leader() == leader
    assert g.data_bytes(victim, end) == g.data_bytes(holder, end) == g.data_bytes(leader, end)
    text = open(os.path.join(g.brokers[leader].dir, "broker.log"), errors="replace").read()
    assert "entry 50 of our log is damaged" in text and f"asking {holder}, which holds it, for its copy" in text
    assert f"entry 50 of our log was damaged (it failed its checks); rewritten from {holder}'s copy" in text
    assert "leadership goes to" not in text
    stats = wait_for(lambda: (st := g.status(leader)["stats"]).get("entries_repaired") and st, 5, 0.1, "the count")
    assert stats["entries_repaired"] == 1 and stats["damaged_entries_found"] >= 1
    wait_for(lambda: g.status(holder)["stats"]["entries_given"] >= 1, 5, 0.1, "the holder's count of copies given")
    refused = open(os.path.join(g.brokers[victim].dir, "broker.log"), errors="replace").read().count(
        f"entries from {leader} refused")
    assert 1 <= refused <= 3, refused              # the pushes streamed unchecked before the probe found it
    assert send(g.addr(leader), b"after the repair").code == 0


def _flip_entry_body(g, member: str, index: int, body_text: bytes = b"yyyyyyyy") -> None:
    """One bit of entry `index`'s message body (where `body_text` is) in member's data file (its
    BODYCRC then fails)."""
    d = os.path.join(g.brokers[member].dir, f"dledger-{member}")
    with open(os.path.join(d, "index", "%020d" % 0), "rb") as f:
        unit = parse_index_unit(f.read(), index * 32)
    data = os.path.join(d, "data", "%020d" % 0)
    with open(data, "rb") as f:
        f.seek(unit.pos)
        entry = f.read(unit.size)
    assert flip_byte(data, unit.pos + entry.index(body_text) + 4, 0x10)


def test_the_scrub_finds_damaged_entries_nobody_asks_for_and_repairs_them(group):
    """Entries damaged where no follower needs them -- a follower's copy, the leader's copy of an
    entry every follower holds -- were served by nobody and stayed damaged (a read skipped the
    message).  The scrub (dLegerScrubBytesPerSec) reads every committed entry back with its CRCs in
    a loop: each member finds its damaged entry and rewrites it from a member's whole copy (the
    follower from the leader, the leader from a follower); the three logs end byte-identical."""
    g = group(dLegerScrubBytesPerSec=32 * 1024 * 1024)
    leader = g.wait_leader()
    follower = next(i for i in g.ids if i != leader)
    for k in range(120):
        assert send(g.addr(leader), b"s%d" % k + b"y" * 600, qid=k % 4).code == 0
    end = leader_end(g, leader)
    wait_for(lambda: all(g.committed_pos(i) >= end for i in g.ids), 10, 0.05, "every member has every entry")
    _flip_entry_body(g, follower, 30)
    _flip_entry_body(g, leader, 60)
    for member, index, source in ((follower, 30, leader), (leader, 60, None)):
        path = os.path.join(g.brokers[member].dir, "broker.log")
        line = f"entry {index} of our log was damaged (it failed its checks); rewritten from "
        text = wait_for(lambda: line in (t := open(path, errors="replace").read()) and t, 15, 0.1,
                        f"{member} repairing entry {index}")
        assert f"scrub: entry {index} of our log is damaged" in text
        if source is not None:
            assert line + f"{source}'s copy" in text
    ref = g.data_bytes(leader, end)
    assert all(g.data_bytes(i, end) == ref for i in g.ids)
    for member in (leader, follower):
        stats = wait_for(lambda: (st := g.status(member)["stats"]).get("entries_repaired") and st, 5, 0.1, "the count")
        assert stats["entries_repaired"] == 1 and stats["scrub_damaged_found"] == 1 and stats["scrub_passes"] >= 1


def test_files_retention_deleted_are_let_go_by_every_process_of_a_dledger_member(group):
    """A process's mapping keeps a deleted file's blocks on disk: every data file the flush and
    dispatch roles had touched, every one the Raft role pushed or scrubbed and every one an io
    worker appended to stayed mapped after retention deleted it, so the disk space never came
    back while they ran (seen: 5 deleted files mapped in each).  Now the flush, dispatch and Raft
    roles unmap what lies below MIN (CommitLog.release_below_min) and the io workers retire it
    (retire_below_min: views they may hold read zeros).  (The master/slave variant:
    tests/ha/test_broker_ha.py.)"""
    fs = 128 * 1024
    g = group(mappedFileSizeCommitLog=fs, cleanFileForciblyEnable="true", diskSpaceCleanForciblyRatio="0.01",
              cleanResourceInterval=200, dLegerScrubBytesPerSec=8 * 1024 * 1024,
              env_for=lambda i: {"MQ_RETENTION_FIRST_DELAY_S": "0"})
    leader = g.wait_leader()
    for k in range(600):
        assert send(g.addr(leader), b"b%04d" % k + b"x" * 1024, qid=k % 4).code == 0
    wait_for(lambda: all(g.data_files(i)[0] >= 3 * fs for i in g.ids), 20, 0.1, "retention deleted files everywhere")
    roles = ("flush", "dispatch", "dledger", "io-0")
    for i in g.ids:
        deadline = time.monotonic() + 10
        while True:
            maps = g.brokers[i].commitlog_maps()
            if all(maps.get(r, (0, 0))[1] == 0 for r in roles) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert all(maps.get(r, (0, 0))[1] == 0 for r in roles), (i, maps)
        if i == leader:          # (its roles map data files, so the check sees them; a member installed
            assert all(maps.get(r, (0, 0))[0] >= 1 for r in roles), maps    # late may map none)
    r = send(g.addr(leader), b"after", qid=0)
    assert r.code == 0
    assert pull_queue(g.addr(leader), TOPIC, 0, int(r.ext_fields["queueOffset"])) == [b"after"]


def test_single_sends_cross_file_rollovers(group):
    """One message at a time over several data-file roll-overs: every send is acknowledged and
    the members' files are byte-identical.  Each push then starts at the first entry of a new
    file, after the follower already took the old file's last entry: the follower writes the
    leader's filler itself (mq_dledger_append_raw).  Before, the group stopped committing at its
    first roll-over (found by the chaos suite's DLedger disk-full cell)."""
    g = group(mappedFileSizeCommitLog=128 * 1024)
    leader = g.wait_leader()
    for k in range(400):                                 # ~1.1 KiB entries: 3 roll-overs
        r = send(g.addr(leader), b"r%d" % k + b"x" * 1000, qid=k % 4)
        assert r.code == 0, (k, r.code, r.remark)
    end = leader_end(g, leader)
    assert end > 3 * 128 * 1024
    wait_for(lambda: all(g.committed_pos(i) >= end for i in g.ids), 30, 0.05, "every member at the end")
    ref = g.data_bytes(leader, end)
    for i in g.ids:
        assert g.data_bytes(i, end) == ref, f"{i} differs from the leader"


def test_all_members_killed_and_restarted_keep_every_committed_message(group):
    """SIGKILL of all three members at once, then all restart: a leader is elected and every
    acknowledged message is there."""
    g = group()
    leader = g.wait_leader()
    acked = []
    for k in range(120):
        body = b"c%d" % k
        assert send(g.addr(leader), body, qid=k % 4).code == 0
        acked.append(body)
    for i in g.ids:
        g.kill(i)
    for i in g.ids:
        g.brokers[i].start()
    leader = g.wait_leader(30)
    assert send(g.addr(leader), b"after-restart").code == 0
    got = set(pull_all(g.addr(leader)))
    assert set(acked) <= got and b"after-restart" in got


def test_the_preferred_leader_takes_over_again_when_it_returns(group, ns):
    """preferredLeaderId=n1: n1 ends up leading; after n1 is killed another member leads and
    serves; when n1 returns and has caught up, leadership moves back to it by itself (a
    leadership transfer, TimeoutNow) and the name server routes brokerId 0 to it."""
    g = group(preferredLeaderId="n1")
    wait_for(lambda: g.leader() == "n1", 30, 0.05, "n1 leading")
    g.kill("n1")
    other = g.wait_leader(15, among=["n0", "n2"])
    assert send(g.addr(other), b"while-n1-away").code == 0
    g.brokers["n1"].start()
    wait_for(lambda: g.leader() == "n1", 30, 0.05, "n1 leading again")
    assert g.status("n1")["term"] > g.status(other)["term"] - 1
    wait_for(lambda: (_route_master(ns.addr, TOPIC) or {}).get("0") == g.addr("n1"), 40, 0.2, "n1 routed as master")
    assert b"while-n1-away" in pull_all(g.addr("n1"))


def test_a_leader_stopped_gracefully_hands_over_and_forwards_until_its_window_ends(group):
    """SIGTERM to the leader (dLegerForwardOnStopMs 3000): it hands the lead to another member
    first, then keeps answering the sends of clients whose route still names it - forwarded,
    SEND_OK with the new leader's msgId, each stored once - until the window ends, and exits
    cleanly."""
    g = group(dLegerForwardOnStopMs=3000)
    old = g.wait_leader()
    assert send(g.addr(old), b"before").code == 0
    b = g.brokers[old]
    t0 = time.monotonic()
    b.proc.p.send_signal(signal.SIGTERM)
    new = g.wait_leader(5, among=[i for i in g.ids if i != old])
    port = int(g.addr(new).rsplit(":", 1)[1])
    answers = []
    while b.proc.p.poll() is None:
        try:
            r = send(g.addr(old), b"during-%d" % len(answers), timeout_s=2)
        except Exception:      # noqa: BLE001 - its servers closed: the window is over
            break
        answers.append((r.code, r.code == 0 and decode_offset_msg_id(r.ext_fields["msgId"])[1]))
        time.sleep(0.02)
    assert b.stop(15) == 0
    stopped_s = time.monotonic() - t0
    assert "handing the DLedger lead to" in b.proc.output() and "forwarding writes to the leader" in b.proc.output()
    assert 3 <= stopped_s < 15, stopped_s
    ok = [a for a in answers if a[0] == 0]
    assert len(ok) >= 20 and all(p == port for _, p in ok), answers
    # refused (14) only for the moment until its io worker read who leads now (LEADER_REFRESH_S),
    # and the last one may meet the servers closing: refused, never a wrong answer
    first_ok = next(k for k, a in enumerate(answers) if a[0] == 0)
    assert all(code == 14 for code, _ in answers[:first_ok]) and first_ok <= 5, answers
    assert all(code == 0 for code, _ in answers[first_ok:-1]), answers
    got = pull_all(g.addr(new))
    assert all(got.count(b"during-%d" % k) == (answers[k][0] == 0) for k in range(len(answers) - 1)), got


def test_mqadmin_leadership_transfer(group, ns, capsys):
    """`mqadmin leadershipTransfer -b RaftNode00 -t X` makes follower X the leader (in the next
    term, without waiting for an election timeout); asking for the current leader is a no-op;
    an unknown member is refused with exit code 1."""
    from mq.cli import admin
    g = group()
    old = g.wait_leader()
    wait_for(lambda: (_route_master(ns.addr, "TBW102") or {}).get("0") == g.addr(old), 40, 0.2, "the leader routed")
    target = next(i for i in g.ids if i != old)
    term = g.status(old)["term"]
    wait_for(lambda: len(_route_master(ns.addr, "TBW102") or {}) == 3, 40, 0.2, "all three routed")
    # a member registers as soon as it serves, which can be before it heard from the leader
    wait_for(lambda: all(g.status(i).get("leader") == old and g.status(i).get("lastIndex", -1) >= 0
                         for i in g.ids), 40, 0.1, "every member following the leader")
    assert admin.main(["clusterList", "-n", ns.addr]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if "RaftNode00" in line]
    assert len(rows) == 3
    assert any(f"dledger {old} LEADER term={term}" in r and " 0 " in r[40:60] for r in rows), rows
    assert sum(" FOLLOWER " in r and f"leader={old}" in r for r in rows) == 2, rows
    t0 = time.monotonic()
    assert admin.main(["leadershipTransfer", "-n", ns.addr, "-b", "RaftNode00", "-t", target]) == 0
    wait_for(lambda: g.leader() == target, 10, 0.02, f"{target} leading")
    assert time.monotonic() - t0 < 3.0 and g.status(target)["term"] == term + 1
    assert "started" in capsys.readouterr().out
    wait_for(lambda: runtime(g.addr(target)).get("dLegerRole") == "LEADER", 10, 0.05)
    assert admin.main(["leadershipTransfer", "-n", ns.addr, "-b", "RaftNode00", "-t", target]) == 0
    assert admin.main(["leadershipTransfer", "-n", ns.addr, "-b", "RaftNode00", "-t", "n9"]) == 1
    assert send(g.addr(target), b"after-transfer").code == 0
    # a client whose route still names the old leader: its send is forwarded, answered by the new one
    wait_for(lambda: g.status(old).get("leaderBrokerAddr") == g.addr(target), 10, 0.02, "the old leader following")
    r = send(g.addr(old), b"to-the-old-leader")
    assert r.code == 0 and decode_offset_msg_id(r.ext_fields["msgId"])[1] == int(g.addr(target).rsplit(":", 1)[1])
    assert os.path.exists(os.path.join(g.brokers[target].dir, f"dledger-{target}", "currterm"))


def test_members_may_be_named_as_users_like(group, ns):
    """dLegerSelfId n1..n3 (a common naming) works: a leader is elected and routed as brokerId
    0, the followers as their number + 1 (n2 -> 3, n3 -> 4), and writes go through."""
    g = group(ids=["n1", "n2", "n3"])
    leader = g.wait_leader()
    assert send(g.addr(leader), b"named").code == 0
    want = {"0": g.addr(leader), **{str(int(i[1:]) + 1): g.addr(i) for i in g.ids if i != leader}}
    wait_for(lambda: _route_master(ns.addr, TOPIC) == want, 40, 0.2, f"the route {want}")


def test_after_a_paused_leader_resumes_the_next_failover_does_not_wait_for_the_dead(group):
    """A leader paused (SIGSTOP) until another member leads, then resumed, sends heartbeats of
    its old term on its way down; the others answer them with their newer term.  (Which comes
    first on resume, its heartbeat timer or its read of the new leader's frames waiting in its
    sockets, is the event loop's race, and so is whether a push it sends on resume reaches the
    new leader first; so while it is paused and until its stale requests have been refused,
    the links into it and its link to the new leader carry nothing: it hears of the new term
    only in the third member's answers.)  When the new leader is then killed while the old one
    holds the longest log (the third member was cut off from the new leader's pushes, so only
    the old leader can win), the two survivors elect it within a few seconds, without the
    killed member.  Before, the stale heartbeat's answer hit an assertion that left the frame
    at the front of the peer connection's buffer: the old leader's link to each member was
    dead for good, and the survivors stayed CANDIDATE until the killed member came back."""
    g = group(proxied=True)
    old = g.wait_leader()
    assert send(g.addr(old), b"before").code == 0
    g.freeze(old)
    cut = [g.proxies[(i, old)] for i in g.ids if i != old]
    try:
        for p in cut:
            p.blackhole()
        new = g.wait_leader(15, among=[i for i in g.ids if i != old])
        # and the old leader's own requests to the new one: an answer there (to a push it sends on
        # resume, before any heartbeat) would tell it the new term before the third member could
        cut.append(g.proxies[(old, new)])
        cut[-1].blackhole()
    finally:
        g.thaw(old)
    other = next(i for i in g.ids if i not in (old, new))
    try:
        # the scenario: the third member refuses requests of the old leader's old term
        wait_for(lambda: g.status(other).get("stats", {}).get("stale_requests_in", 0) > 0, 10, 0.02,
                 "the third member refusing the resumed leader's stale requests")
    finally:
        for p in cut:
            p.heal()
    wait_for(lambda: g.status(old).get("role") == "FOLLOWER" and g.status(old).get("leader") == new, 15, 0.02,
             "the resumed leader following the new one")
    # the third member stops hearing the new leader: what is written now is on the new and the old only
    g.proxies[(new, other)].blackhole()
    assert send(g.addr(new), b"after").code == 0
    wait_for(lambda: g.status(old).get("lastIndex", -1) > g.status(other).get("lastIndex", -1), 10, 0.02,
             "the old leader ahead of the third member")
    t0 = time.monotonic()
    g.kill(new)
    leader = g.wait_leader(15, among=[old, other])
    failover_s = time.monotonic() - t0
    print(f"failover after the pause: {failover_s:.2f} s to a ready leader ({leader})")
    assert leader == old
    assert failover_s < 5, f"a ready leader {failover_s:.2f}s after the kill"
    assert send(g.addr(old), b"last").code == 0
    got = pull_all(g.addr(old))
    assert b"before" in got and b"after" in got and b"last" in got


def _queue_bounds(addr: str, topic: str, queues: int) -> list[tuple[int, int]]:
    out = []
    for q in range(queues):
        lo = call(addr, 31, {"topic": topic, "queueId": q})
        hi = call(addr, 30, {"topic": topic, "queueId": q})
        assert lo.code == hi.code == 0, (lo, hi)
        out.append((int(lo.ext_fields["offset"]), int(hi.ext_fields["offset"])))
    return out


def test_a_member_down_while_the_others_delete_old_files_is_installed_and_catches_up(group, ns):
    """A member down for longer than retention: while it is down the others take 600 x 1 KiB and
    delete their oldest data files (128 KiB files, cleaned forcibly); restarted, its log ends
    below the leader's first entry.  The leader installs its log from that entry, with every
    queue's offset there, and the member catches up: from the later of the two first files its
    data bytes are the leader's up to the commit, each queue's min and max are the leader's --
    also of a queue that had no message after the install point -- and it serves the leader's
    bodies.  After a leadership transfer to it, sends continue every queue's offsets (none
    handed out twice)."""
    fs = 128 * 1024
    g = group(mappedFileSizeCommitLog=fs, cleanFileForciblyEnable="true", diskSpaceCleanForciblyRatio="0.01",
              cleanResourceInterval=200, env_for=lambda i: {"MQ_RETENTION_FIRST_DELAY_S": "0"})
    leader, victim = _kill_a_follower_after_20(g)
    victim_last = g.data_files(victim)[-1]
    for k in range(30):
        assert send(g.addr(leader), b"early%d" % k, qid=0, topic="EARLY").code == 0
    for k in range(600):
        assert send(g.addr(leader), b"b%04d" % k + b"x" * 1024, qid=k % 4).code == 0
    wait_for(lambda: g.data_files(leader)[0] > victim_last + fs, 20, 0.1,
             "the leader deleted every file the victim still has and the next one")
    end = leader_end(g, leader)
    g.restart(victim)
    wait_for(lambda: g.committed_pos(victim) >= end, 30, 0.05, "the installed member caught up")
    assert g.status(victim)["stats"]["installs_in"] >= 1
    assert sum(g.status(i)["stats"]["installs_out"] for i in g.ids if i != victim) >= 1
    start = max(g.data_files(leader)[0], g.data_files(victim)[0])
    assert start > victim_last and g.data_bytes(victim, end, start) == g.data_bytes(leader, end, start)
    for topic, queues in ((TOPIC, 4), ("EARLY", 1)):
        bounds = _queue_bounds(g.addr(leader), topic, queues)
        wait_for(lambda: _queue_bounds(g.addr(victim), topic, queues) == bounds, 10, 0.05,
                 f"{topic}'s queues on the member as on the leader {bounds}")
        for q, (lo, hi) in enumerate(bounds):
            assert pull_queue(g.addr(victim), topic, q, lo) == pull_queue(g.addr(leader), topic, q, lo)
    early_max = _queue_bounds(g.addr(leader), "EARLY", 1)[0][1]
    assert early_max == 30
    # the installed member leads: every queue continues where it was
    from mq.cli import admin
    before = _queue_bounds(g.addr(leader), TOPIC, 4)
    wait_for(lambda: admin.main(["leadershipTransfer", "-n", ns.addr, "-b", "RaftNode00", "-t", victim]) == 0
             and g.leader() == victim, 20, 0.2, f"{victim} leading")
    for q in range(4):
        r = send(g.addr(victim), b"after", qid=q)
        assert r.code == 0 and int(r.ext_fields["queueOffset"]) == before[q][1], (q, r)
    r = send(g.addr(victim), b"after", qid=0, topic="EARLY")
    assert r.code == 0 and int(r.ext_fields["queueOffset"]) == early_max
