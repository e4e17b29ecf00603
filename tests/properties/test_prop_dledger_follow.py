"""A DLedger follower's pushes taken in C (mq_dledger_follow_read: the whole read, receive to
answers; mq_dledger_follow_take where Conn's own path reads; dLegerFastFollowEnable) against
the same frames through the Raft core alone: the same answers, log and Raft state (issue 23).

Two follower roles (mq.dledger.role.DLedgerRole, member n1) over their own empty stores, one with
the C path and one without, read the same drawn stream of frames from "the leader n0", cut into
the same drawn reads, through their real connection code (a Conn on a loopback TCP connection).  The frames:
pushes that follow on from what was sent, duplicates, gaps, a wrong previous term, a stale or a
newer term, heartbeats, a push of another member, a push whose JSON header is spelled another
way (the same values), a damaged entry, drawn commit indexes and opaques.  The property: the two
roles write byte for byte the same answers, close their connection at the same frame or not at
all, and end with the same CommitLog bytes, index units, positions and Raft state (term, role,
leader, commit).  Checked apart: a straight run of pushes is taken in C, and each other kind of
frame placed inside a run C is taking is left to the core; and under SYNC_FLUSH, answers leave
only after the entries they acknowledge are flushed, on both paths (a mutation that answers
before the flush fails it).  The leader's log is built once: 120 entries over 64 KiB files
(fillers, a roll-over), in terms 1, 2 and 3.

Mutations that fail this file: C answering with the entry count instead of the last index and C
not counting the leader's commit (the property); C taking a push whose previous term does not
match (only the per-kind test: the drawn scripts did not place one where C reads it); the C read
sending the answers of the pushes before a frame it leaves to the core (the per-kind test: a
damaged entry closes the connection, and the core's path never sent them), not flushing before
it answers under SYNC_FLUSH (the SYNC_FLUSH test), not cutting what it took from its buffer
(11 of the then 13 tests); the start of a frame the C reader held not put first when the member
stopped following (the stop-following test: Conn's path then read from inside the frame)."""
from __future__ import annotations

import asyncio
import json
import os
import random
import select
import shutil
import socket

import pytest
from hypothesis import given, strategies as st

from mq.dledger.core import Heartbeat
from mq.dledger.log import DLedgerLog
from mq.dledger.net import request_frame
from mq.dledger.role import DLedgerRole
from mq.store import MessageStore
from mq.store import control as C
from mq.store.config import StoreConfig
from mq.wire import dledger_rpc as RPC

from propkit import bounded

FS = 64 * 1024
IFS = 4096
PEERS = "n0-127.0.0.1:1;n1-127.0.0.1:2;n2-127.0.0.1:3"
GROUP = "PropFollow"
ENTRIES = 120
TERM_ENDS = {1: 39, 2: 89, 3: ENTRIES - 1}      # term -> its last entry index
READ_WAIT_MS = 5000               # for a chunk sent on loopback to be readable (it is at once)
CHUNK_MAX = 60_000                # the rest of the stream after the drawn cuts goes in pieces of this
KINDS = ["next"] * 8 + ["dup", "gap", "badterm", "stale", "newer", "heartbeat", "other", "respelled", "corrupt"]


def _cfg(root: str, me: str, fast: bool = True, sync: bool = False) -> StoreConfig:
    return StoreConfig(storePathRootDir=root, mappedFileSizeCommitLog=FS, enableDLegerCommitLog=True,
                       dLegerPeers=PEERS, dLegerSelfId=me, dLegerGroup=GROUP, mappedFileSizeForEntryIndex=IFS,
                       dLegerFastFollowEnable=fast, flushDiskType="SYNC_FLUSH" if sync else "ASYNC_FLUSH")


@pytest.fixture(scope="module")
def leader(tmp_path_factory):
    """The leader's store: ENTRIES entries in terms 1..3, of 40..1500 bytes (rolls and fillers)."""
    root = str(tmp_path_factory.mktemp("leader"))
    store = MessageStore.open(_cfg(root, "n0"), start_roles=False)
    rnd = random.Random(7)
    i = 0
    for term, last in TERM_ENDS.items():
        store.cl.dledger_set_append_term(term)
        while i <= last:
            r = store.put("Follow", i % 3, rnd.randbytes(rnd.randint(40, 1500)), b"TAGS\x01T")
            assert r.ok, r
            i += 1
    store.cl.dledger_set_append_term(0)
    yield store, DLedgerLog(store.cl, False)
    store.close()


def _batch(leader, first: int, count: int) -> tuple[bytes, int, int, int]:
    """(bytes, first_pos, entries, prev_term) of entries first.. as the leader's role pushes them
    (at most count, within one file, the filler with them when the next entry opens the next file)."""
    store, dlog = leader
    b = dlog.entries(first, min(first + count - 1, ENTRIES - 1))
    data = bytes(store.cl.view_raw(b.pos, b.nbytes))
    prev_term = dlog.term_at(first - 1) if first > 0 else 0
    return data, b.pos, b.last_index - first + 1, prev_term


def _push(leader, src: str, term: int, first: int, count: int, commit: int, opaque: int,
          prev_term_delta: int = 0, respell: bool = False, damage: bool = False) -> bytes:
    body, pos, n, prev_term = _batch(leader, first, count)
    if damage:
        b = bytearray(body)
        b[len(b) // 2] ^= 0x5A
        body = bytes(b)
    ext = RPC.push_ext(GROUP, src, "n1", term, first - 1, prev_term + prev_term_delta, commit, first, n, pos,
                       len(body))
    if not respell:
        return request_frame(RPC.PUSH, opaque, ext, len(body)) + body
    # the same values in another spelling of the JSON header: keys reordered, spaces
    header = json.dumps({"version": 0, "opaque": opaque, "flag": 0, "code": RPC.PUSH, "language": "JAVA",
                         "extFields": dict(reversed(list(ext.items()))), "serializeTypeCurrentRPC": "JSON"},
                        indent=1).encode()
    return (len(header) + 4 + len(body)).to_bytes(4, "big") + len(header).to_bytes(4, "big") + header + body


def _heartbeat(src: str, term: int, commit: int, opaque: int) -> bytes:
    return request_frame(RPC.HEART_BEAT, opaque, RPC.encode(RPC.HEART_BEAT, False, {
        "group": GROUP, "localId": src, "remoteId": "n1", "term": term, "leaderId": src, "commitIndex": commit}))


def script(leader, steps: list[tuple]) -> bytes:
    """The frames of a drawn script, as one byte stream."""
    out = bytearray()
    sent = -1                            # the last entry index the stream has pushed in order
    term = 3
    for kind, count, commit_back, opaque in steps:
        commit = max(-1, sent - commit_back)
        nxt = sent + 1
        if kind in ("next", "badterm", "respelled", "corrupt", "stale") and nxt < ENTRIES:
            t = term - 1 if kind == "stale" else term
            out += _push(leader, "n0", t, nxt, count, commit, opaque, prev_term_delta=1 if kind == "badterm" else 0,
                         respell=kind == "respelled", damage=kind == "corrupt")
            if kind in ("next", "respelled"):
                sent = nxt - 1 + _batch(leader, nxt, count)[2]
        elif kind == "dup" and sent >= 0:
            first = max(0, sent - count + 1)
            out += _push(leader, "n0", term, first, count, commit, opaque)
        elif kind == "gap" and nxt + count < ENTRIES:
            out += _push(leader, "n0", term, nxt + count, 1, commit, opaque)
        elif kind == "newer":
            term += 1
            out += _heartbeat("n0", term, commit, opaque)
        elif kind == "heartbeat":
            out += _heartbeat("n0", term, commit, opaque)
        elif kind == "other" and nxt < ENTRIES:
            out += _push(leader, "n2", term, nxt, count, commit, opaque)
    return bytes(out)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """Where each example's two member stores go (removed with their example)."""
    return tmp_path_factory.mktemp("members")


def _readable(sock: socket.socket, wait_ms: int) -> bool:
    p = select.poll()
    p.register(sock, select.POLLIN)
    return bool(p.poll(wait_ms))


class Member:
    """A follower role over its own empty store, reading from a socket pair."""

    def __init__(self, root: str, fast: bool, loop, sync: bool = False):
        self.root = root
        self.cfg = _cfg(root, "n1", fast, sync)
        self.store = MessageStore.open(self.cfg, start_roles=False)
        self.role = DLedgerRole(self.store, self.cfg)
        self.role.loop = loop
        with socket.create_server(("127.0.0.1", 0)) as lsn:
            self.peer = socket.create_connection(lsn.getsockname())
            a, addr = lsn.accept()
        self.role._accepted(a, addr)
        (self.conn,) = self.role.conns
        self.answers = bytearray()

    def read(self, chunk: bytes) -> None:
        """One read of the connection: chunk arrives, the connection's reader runs once."""
        if self.conn.closed:
            return
        self.peer.sendall(chunk)
        wait_ms = READ_WAIT_MS
        while not self.conn.closed and _readable(self.conn.sock, wait_ms):
            self.conn._on_readable()         # normally the whole chunk at once (loopback)
            wait_ms = 0
        while _readable(self.peer, 0):
            try:
                got = self.peer.recv(1 << 20)
            except ConnectionResetError:   # the member closed with bytes of ours unread: RST
                return
            if not got:
                return
            self.answers += got

    def state(self) -> dict:
        ctl, cl, node = self.store.ctl, self.store.cl, self.role.node
        write, nxt = ctl.get(C.POS_WRITE), ctl.get(C.POS_DL_NEXT_INDEX)
        data = b"".join(bytes(cl.view_raw(p, min(write, p - p % FS + FS) - p)) for p in range(0, write, FS))
        units = []
        for i in range(nxt):
            units.append(cl.dledger_entry(i))
        return {"write": write, "next": nxt, "end_term": ctl.get(C.POS_DL_END_TERM), "data": data, "units": units,
                "term": node.term, "role": node.role, "leader": node.leader_id, "commit": node.commit,
                "vote": node.vote, "closed": self.conn.closed, "pushes_in": self.role.stats["pushes_in"]}

    def close(self) -> None:
        for c in list(self.role.conns):
            c.close("test over")
        self.peer.close()
        self.store.close()
        shutil.rmtree(self.root, ignore_errors=True)


def _run(leader, scratch, stream: bytes, cuts: list[int], read_bytes: int | None = None) -> tuple[Member, Member]:
    """The same stream, in the same reads, through a follower with the C path (its receive
    buffer read_bytes long, if given) and one without."""
    loop = asyncio.new_event_loop()
    members = []
    try:
        for name, fast in (("c", True), ("py", False)):
            root = scratch / f"{name}-{os.urandom(4).hex()}"
            members.append(Member(str(root), fast, loop))
        if read_bytes is not None:
            members[0].role.follow_read_bytes = read_bytes
        at, cuts = 0, list(cuts)
        while at < len(stream):
            end = min(len(stream), at + (cuts.pop(0) if cuts else CHUNK_MAX))
            for m in members:
                m.read(stream[at:end])
            at = end
        return members[0], members[1]
    except BaseException:
        for m in members:
            m.close()
        raise
    finally:
        loop.close()


steps_st = st.lists(st.tuples(st.sampled_from(KINDS), st.integers(1, 12), st.integers(0, 6),
                              st.integers(-(1 << 31), (1 << 31) - 1)), min_size=1, max_size=40)
cuts_st = st.lists(st.integers(1, 20000), max_size=30)
# the C reader's buffer: the product's, or shorter than many pushes (they go through Conn's own
# path, and C's reads start again after them)
read_bytes_st = st.sampled_from([None, 3000, 9000, 20000])


@bounded(60)
@given(steps=steps_st, cuts=cuts_st, read_bytes=read_bytes_st)
def test_c_and_the_raft_core_answer_and_store_alike(leader, scratch, steps, cuts, read_bytes):
    stream = script(leader, steps)
    c, py = _run(leader, scratch, stream, cuts, read_bytes)
    try:
        assert bytes(c.answers) == bytes(py.answers)
        sc, sp = c.state(), py.state()
        assert sc == sp, {k: (sc[k], sp[k]) for k in sc if sc[k] != sp[k] and k != "data"}
    finally:
        c.close()
        py.close()


def test_a_straight_run_of_pushes_is_taken_in_c(leader, scratch):
    """The first push (into an empty log: the core's) read alone, then a straight run of pushes
    read in one piece, in thirds or in 97-byte reads: every push of the run goes through C, and
    answers and logs equal the core's."""
    head = script(leader, [("heartbeat", 1, 0, 1), ("next", 3, 0, 2)])
    stream = script(leader, [("heartbeat", 1, 0, 1), ("next", 3, 0, 2)]
                    + [("next", 1 + k % 9, k % 3, 1000 + k) for k in range(40)])
    assert stream.startswith(head)
    rest = len(stream) - len(head)
    runs = [([len(head), rest], None), ([len(head)] + [rest // 3 + 1] * 3, None),
            ([len(head)] + [97] * (rest // 97 + 1), None),
            # pushes longer than the C reader's buffer (up to 9 entries of <= 1500 bytes) go
            # through Conn's own path, each taken by C from there (_take_pushes)
            ([len(head), rest], 4000), ([len(head)] + [97] * (rest // 97 + 1), 4000)]
    for cuts, read_bytes in runs:
        c, py = _run(leader, scratch, stream, cuts, read_bytes)
        try:
            assert bytes(c.answers) == bytes(py.answers)
            assert c.state() == py.state()
            assert c.state()["next"] == ENTRIES
            assert c.role.stats["pushes_in_fast"] == c.role.stats["pushes_in"] - 1 > 20, c.role.stats
            assert py.role.stats["pushes_in_fast"] == 0
        finally:
            c.close()
            py.close()


@pytest.mark.parametrize("kind", sorted(set(KINDS) - {"next"}))
def test_each_other_frame_within_a_run_that_c_takes(leader, scratch, kind):
    """A frame of each other kind between pushes C takes, in the same read: C reaches it first and
    must leave it to the core (and may take what follows) -- the same answers and logs as the core's."""
    first = [("heartbeat", 1, 0, 1), ("next", 3, 0, 2)]
    head = script(leader, first)
    stream = script(leader, first + [("next", 2, 0, 10), ("next", 2, 1, 11), (kind, 2, 1, 12), ("next", 2, 0, 13),
                                     ("next", 2, 0, 14)])
    c, py = _run(leader, scratch, stream, [len(head), len(stream) - len(head)])
    try:
        assert bytes(c.answers) == bytes(py.answers)
        assert c.state() == py.state()
        assert c.role.stats["pushes_in_fast"] >= 2, c.role.stats
    finally:
        c.close()
        py.close()


@pytest.mark.parametrize("change", ["candidate", "other-leader"])
def test_a_frame_cut_when_the_follower_stops_following_is_read_whole(leader, scratch, change):
    """The C reader holds the start of a push when the member stops following that leader (its
    election timer made it a candidate, or a frame on another connection named another
    leader): the rest arrives, Conn's own path reads it, and the frame must be read whole --
    the reader's bytes go first -- with the same answers and state as the core's member."""
    first = script(leader, [("heartbeat", 1, 0, 1), ("next", 3, 0, 2)])      # names the leader
    head = script(leader, [("heartbeat", 1, 0, 1), ("next", 3, 0, 2), ("next", 2, 0, 3)])
    stream = script(leader, [("heartbeat", 1, 0, 1), ("next", 3, 0, 2), ("next", 2, 0, 3), ("next", 4, 0, 4),
                             ("next", 2, 0, 5)])
    cut = len(head) + 300                              # inside the third push
    loop = asyncio.new_event_loop()
    members = [Member(str(scratch / f"{n}-{os.urandom(4).hex()}"), fast, loop) for n, fast in (("c", True), ("py", False))]
    try:
        for m in members:
            m.read(stream[:len(first)])
            m.read(stream[len(first):cut])
        c, py = members
        assert c.conn.reader is not None and c.conn.reader.r.have == 300, "C holds the push's start"
        for m in members:
            if change == "candidate":
                m.role.node._become_candidate()
            else:                                      # n2 leads a newer term (as its heartbeat says)
                m.role.node.step(Heartbeat(src="n2", dst="n1", term=4, commit=-1))
            m.role._after_step()
            m.read(stream[cut:])
        assert bytes(c.answers) == bytes(py.answers)
        assert c.state() == py.state()
    finally:
        for m in members:
            m.close()
        loop.close()


@pytest.mark.parametrize("fast", [True, False], ids=["c", "core"])
def test_a_sync_flush_follower_answers_only_what_it_flushed(leader, scratch, fast):
    """flushDiskType=SYNC_FLUSH: whenever answers have left, every entry written is flushed
    (FLUSHED = WRITE): the answers of a read leave after one flush of its entries, on both
    paths.  The flush is the store's msync of the range the entries were written to."""
    stream = script(leader, [("heartbeat", 1, 0, 1)] + [("next", 1 + k % 9, k % 3, 1000 + k) for k in range(30)])
    loop = asyncio.new_event_loop()
    m = Member(str(scratch / f"sync-{os.urandom(4).hex()}"), fast, loop, sync=True)
    try:
        answered = 0
        for at in range(0, len(stream), 7000):
            m.read(stream[at:at + 7000])
            if len(m.answers) > answered:
                answered = len(m.answers)
                assert m.store.ctl.get(C.POS_FLUSHED) == m.store.ctl.get(C.POS_WRITE) > 0
        assert m.state()["next"] == ENTRIES
        assert (m.role.stats["pushes_in_fast"] > 20) == fast, m.role.stats
    finally:
        m.close()
        loop.close()
