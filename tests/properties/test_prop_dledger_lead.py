"""A DLedger leader's steady state in C (mq_dledger_lead_take and mq_dledger_lead_progress,
dLegerFastLeadEnable) against the Raft core alone: the same frames out, commit and Progress (issue 23).

Two leader roles (mq.dledger.role.DLedgerRole, member n0 of three) over their own empty stores,
one with the C path and one without, are made leader of term 1 and then live through the same
drawn script: entries appended (the io workers' appends: the role's bell handler runs after
them), answers of the followers n1 and n2 written to their real link connections (a stream
socket pair each, where a write is readable when send returns) and read by the role's
connection code, ticks (heartbeats, probes, check-quorum), and under SYNC_FLUSH (drawn)
flushes.  The answers to each leader name its own pushes: SUCCESS for the oldest push not yet
answered, SUCCESS for an index it already had or for one past what it was sent, a rejection
with a drawn hint, a SUCCESS of the previous term, an answer to a heartbeat, a push lost
without an answer.  The property, after every step: both leaders
have sent each follower the same frames (code, header fields and body length; opaques differ
by design: C's come from LeadState.OPAQUE_BASE up), every push carries its leader's own bytes
for that range, and the Raft state is equal -- term, role, commit, the published commit, and
each follower's match, next, state, window, sent commit and activity.  Pushes are limited to
3 KiB here so that their cut (DLedgerLog.entries: the byte limit, the file end, the filler) is
exercised at every size, and the timers are short (a heartbeat every 5 ticks, check-quorum and
a window's age limit at 30) so that they matter within a script.  Checked apart: in a straight
run every push after the probes is sent by C and every SUCCESS answer to one is taken there
(the answers received in C too: mq_dledger_lead_read);
each other kind of answer placed among answers C takes, in the same read, is left to the core.

Mutations that fail this file (each tried): the property catches C filling the whole window
after the log grew (log_progress sends one push each), keeping answered pushes in the window,
not stamping the window's age on an answer or on a push into an empty window, not marking the
follower active, not recording the commit a push carried, and a count one short in the header;
the per-kind test catches C not moving next past a match beyond it; the straight run catches C
leaving out the filler when the next entry opens the next file.  (C's check that the committed
entry is of the leader's term cannot be reached: C leads only after the term's no-op committed.)"""
from __future__ import annotations

import asyncio
import fcntl
import os
import random
import shutil
import socket
import struct
import termios

import pytest
from hypothesis import given, strategies as st

from mq.dledger.net import decode_header, response_frame
from mq.dledger.role import DLedgerRole
from mq.store import MessageStore
from mq.store import control as C
from mq.store.commitlog import LeadState
from mq.store.config import StoreConfig
from mq.wire import dledger_rpc as RPC

from propkit import bounded

FS = 64 * 1024
IFS = 4096
PEERS = "n0-127.0.0.1:1;n1-127.0.0.1:2;n2-127.0.0.1:3"
FOLLOWERS = ("n1", "n2")
GROUP = "PropLead"
PUSH_BYTES = 3 * 1024
ANSWERS = ["ok"] * 24 + ["old", "ahead", "reject", "stale", "heartbeat", "lost"]
READY = [("append", 3, 0, 0), ("answer", 0, 0, 1), ("answer", 1, 0, 1), ("read", 0, 0, 0), ("read", 1, 0, 0)]


def _cfg(root: str, fast: bool, sync: bool) -> StoreConfig:
    return StoreConfig(storePathRootDir=root, flushDiskType="SYNC_FLUSH" if sync else "ASYNC_FLUSH",
                       mappedFileSizeCommitLog=FS, enableDLegerCommitLog=True, dLegerPeers=PEERS,
                       dLegerSelfId="n0", dLegerGroup=GROUP, mappedFileSizeForEntryIndex=IFS,
                       dLegerFastLeadEnable=fast, heartBeatTimeIntervalMs=50, maxHeartBeatLeak=2,
                       minVoteIntervalMs=200, maxVoteIntervalMs=300)


def _waiting(sock: socket.socket) -> int:
    """Bytes in sock's receive queue (a stream socket pair: a write is there when send returns)."""
    return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0]


class Follower:
    """The far end of a leader's link to one follower: reads its frames, writes answers."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.buf = bytearray()
        self.frames: list[tuple] = []      # (code, ext without the opaque, body length) in order
        self.pending: list[tuple] = []     # pushes not yet answered: (opaque, ext)
        self.beats: list[tuple] = []       # heartbeats not yet answered: (opaque, ext)
        self.bodies: list[tuple] = []      # (firstPos, body) of each push

    def collect(self) -> None:
        while _waiting(self.sock):
            got = self.sock.recv(1 << 20)
            if not got:
                break
            self.buf += got
        while len(self.buf) >= 8:
            total = int.from_bytes(self.buf[:4], "big")
            if len(self.buf) < 4 + total:
                break
            hlen = int.from_bytes(self.buf[4:8], "big") & 0xFFFFFF
            cmd = decode_header(bytes(self.buf[8:8 + hlen]))
            body = bytes(self.buf[8 + hlen:4 + total])
            del self.buf[:4 + total]
            ext = dict(cmd.ext_fields or {})
            self.frames.append((cmd.code, ext, len(body)))
            if cmd.code == RPC.PUSH:
                self.pending.append((cmd.opaque, ext))
                if body:                                # (a commit-only push has none)
                    self.bodies.append((int(ext["firstPos"]), body))
            elif cmd.code == RPC.HEART_BEAT:
                self.beats.append((cmd.opaque, ext))

    def answer(self, kind: str, hint: int) -> None:
        if kind == "heartbeat":
            if self.beats:
                opaque, ext = self.beats.pop(0)
                self.sock.sendall(response_frame(opaque, RPC.encode(RPC.HEART_BEAT, True, {
                    "term": int(ext["term"]), "code": RPC.SUCCESS})))
            return
        if not self.pending:
            return
        opaque, ext = self.pending.pop(0)
        term, prev, count = int(ext["term"]), int(ext["prevIndex"]), int(ext["count"])
        if kind == "lost":
            return
        if kind == "ok":
            r = RPC.push_resp_ext(term, True, prev + count, -1, -1)
        elif kind == "old":
            r = RPC.push_resp_ext(term, True, prev, -1, -1)
        elif kind == "ahead":                           # past what was sent (no follower of ours does it)
            r = RPC.push_resp_ext(term, True, prev + count + 1 + hint % 8, -1, -1)
        elif kind == "reject":
            r = RPC.push_resp_ext(term, False, -1, prev, min(prev, hint))
        else:                                           # "stale"
            r = RPC.push_resp_ext(term - 1, True, prev + count, -1, -1)
        self.sock.sendall(response_frame(opaque, r))


class Leader:
    """A leader role (n0) over its own empty store, its links to n1 and n2 on loopback sockets."""

    def __init__(self, root: str, fast: bool, loop, sync: bool):
        self.root = root
        self.store = MessageStore.open(_cfg(root, fast, sync), start_roles=False)
        role = self.role = DLedgerRole(self.store, _cfg(root, fast, sync), rng=random.Random(1))
        role.loop = loop
        role.log.push_bytes_max = PUSH_BYTES
        if role._lead is not None:
            role._lead.ld.push_bytes_max = PUSH_BYTES
        self.followers: dict[str, Follower] = {}
        for p in FOLLOWERS:
            mine, theirs = socket.socketpair()
            mine.setblocking(False)
            link = role.links[p] = role._new_link(p, ("127.0.0.1", 1))
            link.adopt(mine)
            self.followers[p] = Follower(theirs)
        self.rnd = random.Random(5)
        node = role.node
        node._become_candidate()
        node._become_leader()
        role._after_step()
        self.store.cl.dledger_set_append_term(node.term)
        self.collect()

    def collect(self) -> None:
        for f in self.followers.values():
            f.collect()

    def step(self, step: tuple) -> None:
        kind, a, b, c = step
        role = self.role
        if kind == "append":
            if role.node.role.value == "LEADER":
                for _ in range(a):
                    r = self.store.put("Lead", self.rnd.randrange(3), self.rnd.randbytes(self.rnd.randint(40, 1500)),
                                       b"TAGS\x01T")
                    assert r.ok, r
            role._log_grew()
        elif kind == "answer":
            f = self.followers[FOLLOWERS[a % 2]]
            for _ in range(c):
                f.answer(ANSWERS[b % len(ANSWERS)], b)
        elif kind == "read":
            conn = role.links[FOLLOWERS[a % 2]].conn
            while conn is not None and not conn.closed and _waiting(conn.sock):
                conn._on_readable()
        elif kind == "flush":                           # the flush role's turn (SYNC_FLUSH: its bell)
            self.store.cl.flush(0)
            role._log_grew()
        elif kind == "tick":
            for _ in range(a):
                role.node.tick()
                role._after_step()
                role._publish(tick=True)
        self.collect()

    def state(self) -> dict:
        node = self.role.node
        out = {"term": node.term, "role": node.role, "commit": node.commit,
               "published": self.store.ctl.get(C.POS_DL_COMMIT_INDEX), "last": self.role.log.last_index()}
        for p, pr in node.progress.items():
            out[p] = (pr.match, pr.next, pr.state, pr.inflight, pr.sent_commit, pr.recent_active, pr.probe_sent,
                      pr.inflight_since)
        return out

    def frames(self) -> dict:
        out = {}
        for p, f in self.followers.items():
            out[p] = f.frames
            for pos, body in f.bodies:                  # each push carries this leader's bytes there
                assert body == bytes(self.store.cl.view_raw(pos, len(body))), (p, pos)
        return out

    def close(self) -> None:
        for link in self.role.links.values():
            if link.conn is not None:
                link.conn.close("test over")
        for f in self.followers.values():
            f.sock.close()
        self.store.close()
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    return tmp_path_factory.mktemp("leaders")


def _pair(scratch, sync: bool) -> tuple[Leader, Leader, asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    made = []
    try:
        for name, fast in (("c", True), ("py", False)):
            made.append(Leader(str(scratch / f"{name}-{os.urandom(4).hex()}"), fast, loop, sync))
    except BaseException:
        for m in made:
            m.close()
        loop.close()
        raise
    return made[0], made[1], loop


def _run(scratch, steps: list[tuple], sync: bool = False) -> tuple[Leader, Leader]:
    c, py, loop = _pair(scratch, sync)
    try:
        assert c.frames() == py.frames() and c.state() == py.state()
        for i, s in enumerate(steps):
            c.step(s)
            py.step(s)
            fc, fp = c.frames(), py.frames()
            assert fc == fp, (i, s, {p: (fc[p][-3:], fp[p][-3:]) for p in fc})
            sc, sp = c.state(), py.state()
            assert sc == sp, (i, s, {k: (sc.get(k), sp.get(k)) for k in set(sc) | set(sp) if sc.get(k) != sp.get(k)})
        return c, py
    except BaseException:
        c.close()
        py.close()
        raise
    finally:
        loop.close()


append_st = st.tuples(st.just("append"), st.integers(1, 12), st.just(0), st.just(0))
answer_st = st.tuples(st.just("answer"), st.integers(0, 1), st.integers(0, 200), st.integers(1, 3))
read_st = st.tuples(st.just("read"), st.integers(0, 1), st.just(0), st.just(0))
tick_st = st.tuples(st.just("tick"), st.integers(1, 4), st.just(0), st.just(0))
flush_st = st.tuples(st.just("flush"), st.just(0), st.just(0), st.just(0))
step_st = st.one_of(append_st, answer_st, read_st, append_st, answer_st, read_st, answer_st, read_st, tick_st,
                    flush_st)


@bounded(40)
@given(sync=st.booleans(), steps=st.lists(step_st, min_size=30, max_size=90))
def test_c_and_the_raft_core_lead_alike(scratch, sync, steps):
    """Each drawn script starts from a ready leader (its probes answered: C may lead).  sync:
    SYNC_FLUSH, where the leader counts its own entries only once flushed (a flush step)."""
    c, py = _run(scratch, (READY + [("flush", 0, 0, 0)] if sync else READY) + steps, sync)
    c.close()
    py.close()


def _straight(n: int) -> list[tuple]:
    """The probes answered, then n rounds: entries appended, both followers answer SUCCESS to
    up to three pushes, the leader reads."""
    steps = list(READY)
    for k in range(n + 8):
        if k < n:
            steps.append(("append", 1 + k % 7, 0, 0))
        for f in (0, 1):                                # (the last 8 rounds answer what is left)
            steps += [("answer", f, 0, 3), ("read", f, 0, 0)]
    return steps


def test_a_straight_run_is_led_from_c(scratch):
    c, py = _run(scratch, _straight(60))
    try:
        st_c, st_py = c.role._stats(), py.role._stats()
        assert st_c["pushes_out"] == st_py["pushes_out"] > 100, (st_c, st_py)
        # the probes and the first pushes after them (answers to the core's own) are the core's
        assert st_c["pushes_out_fast"] >= st_c["pushes_out"] - 4, st_c
        assert "pushes_out_fast" not in st_py
        for p in FOLLOWERS:                             # the answers were read in C (_read_answers)
            assert c.role.links[p].conn.reader is not None and py.role.links[p].conn.reader is None
        assert c.state()["commit"] == c.role.log.last_index() > 150
        for f in c.followers.values():                  # C's own opaques
            assert all(op >= LeadState.OPAQUE_BASE for op, _ in f.pending)
    finally:
        c.close()
        py.close()


def test_a_leader_that_steps_down_leaves_c(scratch):
    """An answer of a newer term: the core steps down, C takes nothing more, and the next
    answers and appends are the core's (stale, ignored) on both."""
    steps = _straight(5)
    c, py = _run(scratch, steps)
    try:
        for m in (c, py):
            f = m.followers["n1"]
            m.step(("append", 2, 0, 0))
            opaque, ext = f.pending.pop(0)
            f.sock.sendall(response_frame(opaque, RPC.push_resp_ext(int(ext["term"]) + 1, False, -1, -1, -1)))
            m.step(("read", 0, 0, 0))
            assert m.role.node.role.value == "FOLLOWER" and m.role._lead is None or not m.role._lead.ld.on
            m.step(("answer", 1, 0, 2))
            m.step(("read", 1, 0, 0))
        assert c.state() == py.state() and c.frames() == py.frames()
    finally:
        c.close()
        py.close()


@pytest.mark.parametrize("kind", sorted(set(ANSWERS) - {"ok"}))
def test_each_other_answer_within_answers_that_c_takes(scratch, kind):
    """An answer of each other kind between SUCCESS answers C takes, in the same read, then a
    few more rounds: C must leave it to the core and may take what follows -- the same frames
    and state as the core's alone."""
    steps = _straight(4)
    tail = [("append", 12, 0, 0), ("answer", 0, 0, 1), ("read", 0, 0, 0), ("answer", 0, 0, 1)]   # (2 out now)
    # the drawn value: the kind's, with the largest hint % 8 (an "ahead" answer then jumps past next)
    b = max(range(ANSWERS.index(kind), 201, len(ANSWERS)), key=lambda v: v % 8)
    tail += [("answer", 0, b, 1), ("read", 0, 0, 0)]
    for _ in range(3):
        tail += [("append", 6, 0, 0), ("answer", 0, 0, 3), ("answer", 1, 0, 3), ("read", 0, 0, 0), ("read", 1, 0, 0),
                 ("tick", 4, 0, 0)]
    c, py = _run(scratch, steps + tail)
    try:
        assert c.role._stats()["pushes_out_fast"] >= 10, c.role._stats()
    finally:
        c.close()
        py.close()
