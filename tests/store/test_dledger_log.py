"""The CommitLog in DLedger mode (csrc/dledger.h): entries around records, index
files, the follower's validated append, truncation, commit, flush and recovery of the index, the
sendfile path.  Real files under tmp_path, small files so fillers and rolls happen, the control
block of a real store root; every layout is checked through mq.wire (dledger, commitlog)."""
from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from mq.cluster import wait_for
from mq.store import control as C
from mq.store.commitlog import CommitLog, SCAN_STOP_NAMES
from mq.store.native import CorruptRecord, NotLeader, OutOfRange, lib
from mq.wire import commitlog as wcl
from mq.wire import dledger as W
from mq.wire.msgid import decode_offset_msg_id
from tests.store.storekit import flip_byte

FS = 64 * 1024
IFS = 4096 * 8                  # 1024 units per index file


class Log:
    """A control block + a DLedger-mode CommitLog handle under `root`."""

    def __init__(self, root: str, create: bool = True):
        os.makedirs(root, exist_ok=True)
        self.root = root
        self.ctl = C.ControlBlock(root, FS, create=create)
        self.cl = CommitLog(os.path.join(root, "data"), self.ctl, FS, dledger=True,
                            index_dir=os.path.join(root, "index"), index_file_size=IFS)

    def close(self):
        self.cl.close()
        self.ctl.close()

    def append(self, n: int, size: int = 100, topic: str = "T", seed: int = 0):
        rnd = random.Random(seed)
        out = []
        for i in range(n):
            out.append(self.cl.append(topic, i % 3, rnd.randbytes(rnd.randint(1, size)), b"TAGS\x01A"))
        return out

    def data(self, start: int, end: int) -> bytes:
        out = bytearray()
        pos = start
        while pos < end:
            n = min(end, pos - pos % FS + FS) - pos
            out += bytes(self.cl.view_raw(pos, n))
            pos += n
        return bytes(out)

    def index_bytes(self, next_index: int) -> bytes:
        out = bytearray()
        for i in range(next_index):
            at = i * 32
            with open(os.path.join(self.root, "index", "%020d" % (at - at % IFS)), "rb") as f:
                f.seek(at % IFS)
                out += f.read(32)
        return bytes(out)

    @property
    def next_index(self) -> int:
        return self.ctl.get(C.POS_DL_NEXT_INDEX)


@pytest.fixture
def leader(tmp_path):
    lg = Log(str(tmp_path / "leader"))
    yield lg
    lg.close()


@pytest.fixture
def follower(tmp_path):
    lg = Log(str(tmp_path / "follower"))
    yield lg
    lg.close()


def test_appends_are_refused_until_a_term_is_set(leader):
    """DL_APPEND_TERM 0 (not a ready leader): an append raises NotLeader and publishes nothing."""
    with pytest.raises(NotLeader):
        leader.cl.append("T", 0, b"x")
    assert leader.cl.write_pos == 0 and leader.next_index == 0


def test_entries_wrap_records_and_index_units_describe_them(leader):
    """In term 3 each message becomes an entry: index dense from 0, term 3, pos its start, the
    record inside with PHYSICALOFFSET = pos + 48 (also in the msgId), and a matching index unit;
    a roll writes DLedger's filler (-1, room) and the entry opens the next file."""
    leader.cl.dledger_set_append_term(3)
    results = leader.append(900, size=300)
    end = leader.cl.write_pos
    assert end > 2 * FS, "the test needs file rolls"
    buf = leader.data(0, end)
    items = list(W.iter_entries(buf, 0, FS))
    entries = [e for e in items if isinstance(e, W.Entry)]
    assert len(entries) == 900 and any(isinstance(e, W.Blank) for e in items)
    for i, (e, r) in enumerate(zip(entries, results)):
        assert (e.index, e.term) == (i, 3) and (r.dl_index(), r.dl_term()) == (i, 3)
        rec = wcl.parse_record(buf, e.body_pos)
        assert rec.physical_offset == e.body_pos == r.phy_offset() and rec.total_size == e.body_size == r.size()
        assert decode_offset_msg_id(r.msg_id())[2] == e.body_pos
        assert leader.cl.dledger_entry(i) == (e.pos, e.size, 3)
    units = leader.index_bytes(900)
    for i, e in enumerate(entries):
        assert W.parse_index_unit(units, i * 32) == W.Unit(e.pos, e.size, i, 3)
    assert leader.next_index == 900 and leader.ctl.get(C.POS_DL_END_TERM) == 3
    assert W.parse_entry_header(buf, entries[-1].pos) == entries[-1]


def test_batch_appends_and_the_noop(leader):
    """A batch becomes one entry per message; the no-op of a new term is a rollback-type record
    of topic RMQ_SYS_DLEDGER_NOOP with the term as body; a term below the log's last is refused."""
    from mq.wire import batch as wb
    leader.cl.dledger_set_append_term(1)
    r = leader.cl.append_batch("B", 0, wb.build_batch([wb.BatchItem(0, b"m%d" % i, b"") for i in range(20)]))
    assert [r.dl_index(i) for i in range(20)] == list(range(20))
    leader.cl.dledger_set_append_term(0)
    idx = leader.cl.dledger_append_noop(2)
    assert idx == 20 and leader.ctl.get(C.POS_DL_END_TERM) == 2
    pos, size, term = leader.cl.dledger_entry(20)
    rec = wcl.parse_record(leader.data(pos + 48, pos + size))
    assert rec.topic == "RMQ_SYS_DLEDGER_NOOP" and rec.sys_flag & 0xC == 0xC and rec.body == (2).to_bytes(8, "big")
    with pytest.raises(ValueError):
        leader.cl.dledger_append_noop(1)


@pytest.mark.parametrize("damage,stop", [
    ("magic", "bad magic"), ("size", "bad size"), ("index", "bad index"), ("term", "bad index"),
    ("pos", "bad offset"), ("crc", "bad crc"), ("torn", "torn")])
def test_the_scan_reports_each_kind_of_damage(leader, damage, stop):
    """The DLedger scan returns the records (dl_index/dl_term/dl_pos set) and stops at the first
    damaged entry with the kind of damage."""
    leader.cl.dledger_set_append_term(2)
    leader.append(40)
    sc = leader.cl.scanner(64)
    n, nxt, st = sc.scan(0, leader.cl.write_pos, check_crc=True, resolve_slots=0)
    assert n == 40 and SCAN_STOP_NAMES[st] == "limit"
    assert [sc.recs[i].dl_index for i in range(n)] == list(range(40))
    assert all(sc.recs[i].phy_offset == sc.recs[i].dl_pos + 48 and sc.recs[i].dl_term == 2 for i in range(n))
    victim = sc.recs[20].dl_pos
    mv = leader.cl.view_raw(victim, 64)
    if damage == "magic":
        mv[0:4] = (7).to_bytes(4, "big")
    elif damage == "size":
        mv[44:48] = (int.from_bytes(mv[44:48], "big") + 1).to_bytes(4, "big")
    elif damage == "index":
        mv[8:16] = (99).to_bytes(8, "big")
    elif damage == "term":
        mv[16:24] = (1).to_bytes(8, "big")
    elif damage == "pos":
        mv[24:32] = (victim + 8).to_bytes(8, "big")
    elif damage == "crc":
        body = leader.cl.view_raw(sc.recs[20].phy_offset + sc.recs[20].body_offset, 1)
        body[0] ^= 0xFF
    n, nxt, st = sc.scan(0, victim + 60 if damage == "torn" else leader.cl.write_pos, check_crc=True,
                         resolve_slots=0)
    assert n == 20 and nxt == victim and SCAN_STOP_NAMES[st] == stop


def _leader_bytes(lg: Log, first: int, last: int) -> tuple[bytes, int]:
    pos, _, _ = lg.cl.dledger_entry(first)
    p2, s2, _ = lg.cl.dledger_entry(last)
    return lg.data(pos, p2 + s2), pos


def test_a_follower_appends_the_leaders_bytes_and_ends_identical(leader, follower):
    """The leader's bytes, pushed in batches that end on fillers, are validated and appended by
    the follower: data and index files identical, positions published, SEQ_WRITE bumped."""
    leader.cl.dledger_set_append_term(4)
    leader.append(700, size=400)
    end = leader.cl.write_pos
    buf = leader.data(0, end)
    seq = follower.ctl.seq(C.SEQ_WRITE)
    assert follower.cl.dledger_append_raw(buf[:0], 0, 0, 4) == 0
    # in three pieces, cut at entry boundaries (a piece may end with a filler)
    cuts = [0, leader.cl.dledger_entry(250)[0], leader.cl.dledger_entry(251)[0], end]
    for a, b in zip(cuts, cuts[1:]):
        first = follower.next_index
        n = follower.cl.dledger_append_raw(buf[a:b], first, a, 4)
        assert n > 0
    assert follower.next_index == 700 and follower.cl.write_pos == end
    assert follower.data(0, end) == buf
    assert follower.index_bytes(700) == leader.index_bytes(700)
    assert follower.ctl.get(C.POS_DL_END_TERM) == 4 and follower.ctl.seq(C.SEQ_WRITE) != seq


def test_a_follower_writes_the_filler_when_a_push_starts_in_the_next_file(leader, follower):
    """The push that follows a roll-over starts at the first entry of the next file (a push
    starts at an entry); a follower that already has the last entry of the previous file writes
    the leader's filler itself and ends identical.  Before this, that push was refused (first
    pos != WRITE) over and over and the group stopped committing at its first roll-over under
    one-at-a-time sends.  A claimed roll-over the leader could not have made is refused."""
    leader.cl.dledger_set_append_term(4)
    leader.append(300, size=400)
    entries = [leader.cl.dledger_entry(i) for i in range(300)]
    k = max(i for i, (pos, _, _) in enumerate(entries) if pos < FS)      # the last entry of file 0
    assert entries[k + 1][0] == FS and entries[k][0] + entries[k][1] < FS, "the leader rolled over"
    end_k = entries[k][0] + entries[k][1]
    assert follower.cl.dledger_append_raw(leader.data(0, end_k), 0, 0, 4) == k + 1
    assert follower.cl.write_pos == end_k
    # a push from k + 1 claiming the roll-over, but its first entry would fit: refused
    small = bytearray(leader.data(FS, entries[k + 1][0] + entries[k + 1][1]))
    small[4:8] = (FS - end_k - 8 - 1).to_bytes(4, "big")
    with pytest.raises(CorruptRecord):
        follower.cl.dledger_append_raw(bytes(small), k + 1, FS, 4)
    # not the next file's start: refused as before
    with pytest.raises(OutOfRange):
        follower.cl.dledger_append_raw(leader.data(entries[k + 2][0], leader.cl.write_pos), k + 2,
                                       entries[k + 2][0], 4)
    assert follower.cl.write_pos == end_k and follower.next_index == k + 1
    n = follower.cl.dledger_append_raw(leader.data(FS, leader.cl.write_pos), k + 1, FS, 4)
    assert n == 300 - (k + 1) and follower.cl.write_pos == leader.cl.write_pos
    assert follower.data(0, leader.cl.write_pos) == leader.data(0, leader.cl.write_pos), "filler included"
    assert follower.index_bytes(300) == leader.index_bytes(300)


@pytest.mark.parametrize("fault", ["first index", "first pos", "index gap", "term too high", "term back",
                                   "record crc", "bad filler", "cut entry", "appends allowed"])
def test_a_follower_refuses_bad_input_and_publishes_nothing(leader, follower, fault):
    """Each kind of bad input is refused before anything is published."""
    leader.cl.dledger_set_append_term(5)
    leader.append(30)
    buf = bytearray(leader.data(0, leader.cl.write_pos))
    first, pos, max_term = 0, 0, 5
    e3 = leader.cl.dledger_entry(3)
    expect = CorruptRecord
    if fault == "first index":
        first, expect = 1, OutOfRange
    elif fault == "first pos":
        pos, expect = 8, OutOfRange
    elif fault == "index gap":
        buf[e3[0] + 8:e3[0] + 16] = (9).to_bytes(8, "big")
    elif fault == "term too high":
        max_term = 4
    elif fault == "term back":
        follower.cl.dledger_set_append_term(0)
        buf[e3[0] + 16:e3[0] + 24] = (4).to_bytes(8, "big")
    elif fault == "record crc":
        buf[e3[0] + 48 + 90] ^= 1
    elif fault == "bad filler":
        buf += (0xFFFFFFFF).to_bytes(4, "big") + (7).to_bytes(4, "big")
    elif fault == "cut entry":
        del buf[-5:]
    elif fault == "appends allowed":
        follower.cl.dledger_set_append_term(5)
        expect = ValueError
    with pytest.raises(expect):
        follower.cl.dledger_append_raw(bytes(buf), first, pos, max_term)
    assert follower.next_index == 0 and follower.cl.write_pos == 0


def test_install_resets_a_follower_behind_the_leaders_first_entry(leader, follower, tmp_path):
    """mq_dledger_install: a follower whose log ends below the leader's first retained entry B
    (at the start of a data file P) takes the leader's log from there in one step: its stale,
    uncommitted tail from P on is replaced and zeroed past the new end, MIN/COMMITTED move to P
    and BEGIN/COMMIT index to B (below is committed history), FLUSHED past the installed entries
    (msync'd before they are published), and after appending the rest of the
    leader's bytes its data and index units from P and B on are the leader's.  It refuses while
    appends are allowed, at a position that is not a file start, below COMMITTED, and bad bytes
    (nothing published)."""
    leader.cl.dledger_set_append_term(1)
    leader.append(100, size=400)
    leader.cl.dledger_set_append_term(3)
    leader.append(600, size=400, seed=1)
    end = leader.cl.write_pos
    # the follower: the leader's first 100 entries (committed), then a tail of its own term 2
    # (an old leader's, never committed) that reaches past P
    other = Log(str(tmp_path / "other"))
    try:
        first100 = leader.data(0, leader.cl.dledger_entry(100)[0])
        other.cl.dledger_append_raw(first100, 0, 0, 1)
        other.cl.dledger_set_append_term(2)
        other.append(700, size=400, seed=2)
        follower.cl.dledger_append_raw(other.data(0, other.cl.write_pos), 0, 0, 2)
    finally:
        other.close()
    follower.cl.dledger_set_commit(100)
    stale_end = follower.cl.write_pos
    p = 2 * FS
    b = next(i for i in range(700) if leader.cl.dledger_entry(i)[0] == p)
    assert 100 < b and stale_end > p + FS
    # B's file: the entries from B to the last one in that file, with its filler (a push)
    b_last = max(i for i in range(b, 700) if leader.cl.dledger_entry(i)[0] < p + FS)
    batch = leader.data(p, p + FS)
    assert batch[:0] == b"" and len(batch) == FS

    follower.cl.dledger_set_append_term(2)
    with pytest.raises(ValueError):                        # io workers may append
        follower.cl.dledger_install(batch, b, p, 3)
    follower.cl.dledger_set_append_term(0)
    with pytest.raises(ValueError):                        # not a file start
        follower.cl.dledger_install(batch[48:], b, p + 48, 3)
    damaged = bytearray(batch)
    damaged[48 + 90] ^= 1
    with pytest.raises(CorruptRecord):
        follower.cl.dledger_install(bytes(damaged), b, p, 3)
    with pytest.raises(CorruptRecord):                     # a term above the bound
        follower.cl.dledger_install(batch, b, p, 2)
    assert follower.next_index == 800 and follower.cl.write_pos == stale_end

    seq = follower.ctl.seq(C.SEQ_COMMIT)
    assert follower.cl.dledger_install(batch, b, p, 3) == b_last - b + 1
    get = follower.ctl.get
    assert (get(C.POS_MIN), get(C.POS_COMMITTED), get(C.POS_FLUSHED)) == (p, p, p + FS)     # msync'd
    assert (get(C.POS_DL_BEGIN_INDEX), get(C.POS_DL_COMMIT_INDEX), get(C.POS_DL_FLUSHED_INDEX)) == (b, b, b_last + 1)
    assert follower.next_index == b_last + 1 and follower.cl.write_pos == p + FS
    assert get(C.POS_DL_END_TERM) == 3 and follower.ctl.seq(C.SEQ_COMMIT) != seq
    for at in range(p // FS, (stale_end - 1) // FS + 1):    # the stale tail is gone (past WRITE: the files)
        with open(os.path.join(follower.root, "data", "%020d" % (at * FS)), "rb") as f:
            data = f.read()
        assert at == p // FS or data == bytes(FS)
    with pytest.raises(OutOfRange):
        follower.cl.dledger_entry(b - 1)
    # the units before B held the follower's own (stale, term 2) entries: zeroed, so the term of
    # B-1 is not claimed from them
    from mq.dledger.log import DLedgerLog
    assert DLedgerLog(follower.cl, False, index_dir=os.path.join(follower.root, "index"),
                      index_file_size=IFS).term_at(b - 1) is None
    b1 = next(i for i in range(700) if leader.cl.dledger_entry(i)[0] == FS)
    with pytest.raises(ValueError):                        # below MIN and COMMITTED now
        follower.cl.dledger_install(leader.data(FS, 2 * FS), b1, FS, 3)

    rest = leader.data(p + FS, end)
    assert follower.cl.dledger_append_raw(rest, b_last + 1, p + FS, 3) == 700 - b_last - 1
    assert follower.cl.write_pos == end and follower.data(p, end) == leader.data(p, end)
    assert follower.index_bytes(700)[b * 32:] == leader.index_bytes(700)[b * 32:]
    follower.cl.dledger_set_commit(700)
    assert follower.ctl.get(C.POS_COMMITTED) == end


def test_truncate_then_append_again(leader):
    """Truncation cuts to an index: WRITE, NEXT_INDEX and END_TERM follow, the bytes and units
    past the cut are zero; it never cuts committed entries; appending resumes at the cut."""
    leader.cl.dledger_set_append_term(1)
    leader.append(50)
    leader.cl.dledger_set_append_term(2)
    leader.append(30)
    leader.cl.dledger_set_commit(40)
    pos45, _, _ = leader.cl.dledger_entry(45)
    old_end = leader.cl.write_pos
    with pytest.raises(ValueError):
        leader.cl.dledger_truncate(39)                     # below the commit
    with pytest.raises(ValueError):
        leader.cl.dledger_truncate(45)                     # appends still allowed
    leader.cl.dledger_set_append_term(0)
    leader.cl.dledger_truncate(45)
    assert leader.next_index == 45 and leader.cl.write_pos == pos45 and leader.ctl.get(C.POS_DL_END_TERM) == 1
    assert leader.data(pos45, old_end) == bytes(old_end - pos45)
    assert W.parse_index_unit(leader.index_bytes(60), 45 * 32) is None
    leader.cl.dledger_set_append_term(3)
    r = leader.append(3)
    assert [x.dl_index() for x in r] == [45, 46, 47] and r[0].phy_offset() == pos45 + 48
    assert leader.cl.dledger_entry(46)[2] == 3


def test_commit_and_flush_positions(leader):
    """set_commit moves COMMITTED to the end of the committed entry (never back, never past the
    log); a flush advances DL_FLUSHED_INDEX to what it made durable."""
    leader.cl.dledger_set_append_term(1)
    leader.append(10)
    pos, size, _ = leader.cl.dledger_entry(6)
    seq = leader.ctl.seq(C.SEQ_COMMIT)
    leader.cl.dledger_set_commit(7)
    assert leader.ctl.get(C.POS_COMMITTED) == pos + size and leader.ctl.get(C.POS_DL_COMMIT_INDEX) == 7
    assert leader.ctl.seq(C.SEQ_COMMIT) != seq
    leader.cl.dledger_set_commit(3)
    assert leader.ctl.get(C.POS_DL_COMMIT_INDEX) == 7
    with pytest.raises(OutOfRange):
        leader.cl.dledger_set_commit(11)
    assert leader.ctl.get(C.POS_DL_FLUSHED_INDEX) == 0
    leader.cl.flush(0)
    assert leader.ctl.get(C.POS_DL_FLUSHED_INDEX) == 10 and leader.cl.flushed_pos == leader.cl.write_pos


def test_recover_index_rebuilds_the_units(leader):
    """Zeroed (or stale) index files are rebuilt from the data files' entries."""
    leader.cl.dledger_set_append_term(1)
    leader.append(60)
    good = leader.index_bytes(60)
    for name in os.listdir(os.path.join(leader.root, "index")):
        with open(os.path.join(leader.root, "index", name), "r+b") as f:
            f.write(bytes(IFS))
    nxt, term = leader.cl.dledger_recover_index(0, leader.cl.write_pos)
    assert (nxt, term) == (60, 1) and leader.index_bytes(60) == good
    assert leader.cl.dledger_recover_index(leader.cl.write_pos, leader.cl.write_pos) == (0, 0)


@pytest.mark.parametrize("blocking", [True, False])
def test_send_streams_head_and_file_bytes(leader, blocking):
    """mq_dledger_send writes the head then the data-file bytes; on a non-blocking socket with a
    small send buffer it returns 'not finished' and resumes where it stopped."""
    leader.cl.dledger_set_append_term(1)
    leader.append(200, size=900)
    pos, _, _ = leader.cl.dledger_entry(0)
    nbytes = min(FS, leader.cl.write_pos) - pos - 8
    a, b = _tcp_pair(small=not blocking)
    try:
        if not blocking:
            a.setblocking(False)
        head = b"HEAD" * 10
        done, got, again = 0, bytearray(), 0
        while True:
            finished, done = leader.cl.dledger_send(a.fileno(), head, pos, nbytes, done)
            if finished:
                break
            again += 1
            got += b.recv(1 << 20)
        b.settimeout(2)
        while len(got) < len(head) + nbytes:
            got += b.recv(1 << 20)
        assert bytes(got) == head + leader.data(pos, pos + nbytes)
        assert blocking or again > 0
    finally:
        a.close()
        b.close()


def _tcp_pair(small: bool):
    """A connected loopback TCP pair; small: tiny buffers, so a 64 KiB send must wait."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    a = socket.socket()
    if small:
        a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    a.connect(srv.getsockname())
    b, _ = srv.accept()
    if small:
        b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
    srv.close()
    return a, b


def test_a_writer_killed_mid_append_leaves_indexes_dense(tmp_path):
    """A process appending in DLedger mode is SIGKILLed at random moments, over and over; each
    time the next locker repairs the control block, and the log stays a dense, valid sequence
    of entries whose index units agree with them."""
    root = str(tmp_path / "s")
    lg = Log(root)
    lg.cl.dledger_set_append_term(1)
    code = textwrap.dedent(f"""
        import os, sys
        from mq.store import control as C
        from mq.store.commitlog import CommitLog
        ctl = C.ControlBlock({root!r})
        cl = CommitLog(os.path.join({root!r}, "data"), ctl, {FS}, dledger=True,
                       index_dir=os.path.join({root!r}, "index"), index_file_size={IFS})
        print("go", flush=True)
        i = 0
        while True:
            cl.append("K", i % 2, b"x" * (1 + i % 700))
            i += 1
        """)
    rnd = random.Random(7)
    try:
        for _ in range(6):
            p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
            assert p.stdout.readline().strip() == "go"
            time.sleep(rnd.uniform(0.02, 0.2))
            os.kill(p.pid, signal.SIGKILL)
            p.wait(10)
            lg.cl.append("K", 0, b"after")        # takes the lock: repairs if the dead one held it
        end, nxt = lg.cl.write_pos, lg.next_index
        items = [e for e in W.iter_entries(lg.data(0, end), 0, FS) if isinstance(e, W.Entry)]
        assert [e.index for e in items] == list(range(nxt))
        units = lg.index_bytes(nxt)
        for e in items:
            assert W.parse_index_unit(units, e.index * 32) == W.Unit(e.pos, e.size, e.index, 1)
        sc = lg.cl.scanner(4096)
        total, pos = 0, 0
        while True:
            n, pos, st = sc.scan(pos, end, check_crc=True, resolve_slots=0)
            total += n
            if st != lib.MQ_SCAN_FULL:
                break
        assert total == nxt and pos == end
    finally:
        lg.close()


def _member_config(tmp_path, **kw):
    """A DLedger member's store config (no role: the tests make its commits)."""
    from mq.store import StoreConfig
    return StoreConfig(storePathRootDir=str(tmp_path / "s"), mappedFileSizeCommitLog=FS, enableDLegerCommitLog=True,
                       dLegerPeers="n0-127.0.0.1:1;n1-127.0.0.1:2;n2-127.0.0.1:3", dLegerSelfId="n0",
                       mappedFileSizeForEntryIndex=4096, **kw)


def _filled_member(cfg, bodies, queues: int = 1) -> list:
    """Opens the store, appends `bodies` in term 1 (message i to queue i % queues), commits, flushes,
    waits for dispatch and closes it cleanly; the appends' results."""
    from mq.store import MessageStore
    store = MessageStore.open(cfg)
    store.cl.dledger_set_append_term(1)
    res = [store.cl.append("R", i % queues, body) for i, body in enumerate(bodies)]
    store.cl.dledger_set_commit(store.ctl.get(C.POS_DL_NEXT_INDEX))
    store.cl.flush(0)
    assert store.wait_dispatched(10)
    store.close()
    return res


def test_retention_in_dledger_mode_moves_the_first_index(tmp_path):
    """Expired data files of a DLedger store go (only committed, flushed and dispatched ones):
    DL_BEGIN_INDEX moves to the first entry left, lookups below it are out of range, the
    index files wholly below it are deleted, and what is left still reads."""
    from mq.store import MessageStore
    from mq.store.retention import Retention
    cfg = _member_config(tmp_path, fileReservedTime=1)
    store = MessageStore.open(cfg)
    try:
        store.cl.dledger_set_append_term(1)
        for i in range(600):
            store.cl.append("R", 0, b"r" * 400)
        store.cl.dledger_set_commit(store.ctl.get(C.POS_DL_NEXT_INDEX))
        store.cl.flush(0)
        assert store.wait_dispatched(10)
        rep = Retention(store, usage_fn=lambda _: 0.99).run_once(force=True)
        assert rep, "files deleted"
        begin = store.ctl.get(C.POS_DL_BEGIN_INDEX)
        min_pos = store.ctl.get(C.POS_MIN)
        assert begin > 0 and store.cl.dledger_entry(begin)[0] == min_pos
        with pytest.raises(OutOfRange):
            store.cl.dledger_entry(begin - 1)
        idx_files = sorted(os.listdir(cfg.dledger_index_dir))
        assert int(idx_files[0]) + 4096 > begin * 32
        # the entry before the first one held: its term is still known from its unit (unless that
        # unit's file went too), so a follower whose log ends there needs no install
        from mq.dledger.log import DLedgerLog
        dl = DLedgerLog(store.cl, False, index_dir=cfg.dledger_index_dir, index_file_size=4096)
        assert dl.term_at(begin - 1) == (1 if (begin - 1) * 32 >= int(idx_files[0]) else None)
        assert dl.term_at(begin - 2) is None and dl.term_at(-1) is None
        assert store.get_messages("R", 0, store.min_offset("R", 0), 1)
    finally:
        store.close()


@pytest.mark.parametrize("damage", ["cut", "missing"])
def test_a_damaged_older_index_file_is_rewritten_at_start(tmp_path, damage):
    """An index file below the files recovery validates, cut short or deleted while the store was
    stopped: entry lookups there (what a leader reads to catch a follower up) failed for good;
    now recovery notices the file and rewrites the units from the first data file."""
    from mq.store import MessageStore
    cfg = _member_config(tmp_path)
    store = MessageStore.open(cfg)
    store.cl.dledger_set_append_term(1)
    for _ in range(1500):
        store.cl.append("R", 0, b"r" * 400)
    store.cl.dledger_set_commit(store.ctl.get(C.POS_DL_NEXT_INDEX))
    store.cl.flush(0)
    assert store.wait_dispatched(10)
    want = [store.cl.dledger_entry(i) for i in (0, 5, 100)]
    store.close()
    first = os.path.join(cfg.dledger_index_dir, "%020d" % 0)
    if damage == "cut":
        with open(first, "r+b") as f:
            f.truncate(100)
    else:
        os.unlink(first)
    store = MessageStore.open(cfg)
    try:
        assert [store.cl.dledger_entry(i) for i in (0, 5, 100)] == want
        assert os.path.getsize(first) == 4096
    finally:
        store.close()


UNIT_FIELDS = {"magic": 0, "pos": 4, "size": 12, "index": 16, "term": 24}     # csrc/dledger.h's unit


def _flip(path: str, at: int, mask: int = 0x10) -> None:
    assert flip_byte(path, at, mask), (path, at)


def _unit_path(cfg, index: int) -> tuple[str, int]:
    at = index * 32
    return os.path.join(cfg.dledger_index_dir, "%020d" % (at - at % 4096)), at % 4096


@pytest.mark.parametrize("when", ["stopped", "running"])
@pytest.mark.parametrize("field", list(UNIT_FIELDS))
def test_a_damaged_index_unit_is_rewritten_from_its_entry(tmp_path, caplog, field, when):
    """An index unit below the files recovery validates is trusted by recovery as it is, and a
    leader reads it to catch a follower up.  One bit of it damaged -- while the store was stopped,
    or under the running store -- was served as it read (another entry's position, a wrong size or
    term) or, its magic or index damaged, refused for good.  Now every read checks the unit against
    its entry's header and rewrites it from the entries, with one line."""
    from mq.store import MessageStore
    cfg = _member_config(tmp_path)
    _filled_member(cfg, [b"r" * 400] * 1500)
    path, at = _unit_path(cfg, 5)
    with open(path, "rb") as f:
        unit = f.read()[at:at + 32]
    store = MessageStore.open(cfg) if when == "running" else None
    _flip(path, at + UNIT_FIELDS[field] + (3 if field in ("magic", "size") else 7))
    store = store or MessageStore.open(cfg)
    try:
        pos, size, term = store.cl.dledger_entry(5)
        assert store.recovery.start_offset > pos, "entry 5 lies below the files recovery validates"
        assert (pos, size, term) == (5 * 540, 540, 1)        # 1500 entries of 540 bytes, each file's last filled
        assert [store.cl.dledger_entry(i)[0] for i in (4, 6)] == [pos - size, pos + size]
        with open(path, "rb") as f:
            assert f.read()[at:at + 32] == unit, "the unit was rewritten as it was written"
        assert store.cl.dledger_units_repaired() == (1, 5)
        with caplog.at_level("WARNING", logger="mq.store.commitlog"):
            store.cl.report_unit_repairs()
            store.cl.report_unit_repairs()
        assert [r.getMessage() for r in caplog.records if "DLedger index unit" in r.getMessage()] == [
            "repaired: 1 DLedger index unit(s) disagreed with their entries (damaged since written) and were "
            "rewritten from the entries; the last: entry 5"]
    finally:
        store.close()


def test_a_unit_whose_entry_is_damaged_too_is_refused(tmp_path):
    """The repair walks the entries with their CRCs: with the entry itself damaged (a body byte),
    its damaged unit is refused (CorruptRecord), never served as it reads; the entries around it
    still resolve, and a leader that needs it installs its follower instead (mq.dledger.core)."""
    from mq.store import MessageStore
    cfg = _member_config(tmp_path)
    _filled_member(cfg, [b"r" * 400] * 1500)
    store = MessageStore.open(cfg)
    try:
        pos5, size, _ = store.cl.dledger_entry(5)
        path, at = _unit_path(cfg, 5)
        _flip(path, at + 4 + 7)                                  # the unit's pos
        _flip(os.path.join(cfg.commitlog_dir, "%020d" % 0), pos5 + 48 + 300)      # a body byte of entry 5
        with pytest.raises(CorruptRecord):
            store.cl.dledger_entry(5)
        assert [store.cl.dledger_entry(i)[0] for i in (4, 6)] == [pos5 - size, pos5 + size]
        assert store.cl.dledger_units_repaired() == (0, 0)
    finally:
        store.close()


def test_a_leaders_checked_batch_ends_before_a_damaged_entry(tmp_path):
    """What a leader's probe sends (DLedgerLog.entries, checked): entries checked with their CRCs,
    the batch ending before the first damaged one, DamagedEntry (the core's LogDamaged) when that
    is the first; mq_dledger_first_damaged names it, also when its unit cannot be rebuilt either.
    Unchecked (the pushes C streams), the damaged bytes are part of the batch: a follower refuses
    them there (test_a_follower_refuses_bad_input_and_publishes_nothing)."""
    from mq.dledger.core import LogDamaged
    from mq.dledger.log import DamagedEntry, DLedgerLog
    from mq.store import MessageStore
    cfg = _member_config(tmp_path)
    _filled_member(cfg, [b"r" * 400] * 100)
    store = MessageStore.open(cfg)
    try:
        lg = DLedgerLog(store.cl, sync_durable=False)
        last = lg.last_index()
        assert store.cl.dledger_first_damaged(0, last) == last + 1
        whole = lg.entries(3, last, checked=True)
        assert (whole.first_index, whole.last_index) == (3, last)
        pos20, size, _ = store.cl.dledger_entry(20)
        _flip(os.path.join(cfg.commitlog_dir, "%020d" % 0), pos20 + 48 + 300)       # a body byte of entry 20
        assert store.cl.dledger_first_damaged(0, last) == 20
        assert store.cl.dledger_first_damaged(21, last) == last + 1
        cut = lg.entries(3, last, checked=True)
        assert (cut.first_index, cut.last_index, cut.pos + cut.nbytes) == (3, 19, pos20)
        unchecked = lg.entries(3, last)
        assert unchecked.last_index == last
        with pytest.raises(DamagedEntry) as e:
            lg.entries(20, last, checked=True)
        assert isinstance(e.value, LogDamaged) and isinstance(e.value, CorruptRecord) and e.value.index == 20
        assert lg.term_at(20) == 1                   # the header is whole: its term still reads
        path, at = _unit_path(cfg, 20)
        _flip(path, at + 4 + 7)                      # and now its unit too: it cannot be rebuilt
        assert store.cl.dledger_first_damaged(0, last) == 20
        with pytest.raises(DamagedEntry):
            lg.term_at(20)
        assert lg.entries(3, last, checked=True).last_index == 19
    finally:
        store.close()


def test_a_damaged_entry_is_rewritten_from_a_peers_copy_only_where_it_fits(tmp_path):
    """mq_dledger_repair_entry (what a leader does with a holder's copy of its damaged entry): the
    copy must be one whole entry of that index, at the position this log holds it at, of a term
    between its neighbours'; committed entries only.  A damaged copy, another entry's copy, a
    copy moved elsewhere or an uncommitted index is refused and nothing is written; a whole entry is
    left alone."""
    from mq.store import MessageStore
    from mq.store.native import InvalidArgument
    cfg = _member_config(tmp_path)
    _filled_member(cfg, [b"r" * 400] * 100)
    store = MessageStore.open(cfg)
    try:
        cl = store.cl
        last = cl.ctl.get(C.POS_DL_NEXT_INDEX) - 1
        pos20, size, _ = cl.dledger_entry(20)
        copy20 = bytes(cl.view_raw(pos20, size))
        copy21 = bytes(cl.view_raw(*cl.dledger_entry(21)[:2]))
        assert cl.dledger_repair_entry(20, copy20) is False          # whole: left alone
        _flip(os.path.join(cfg.commitlog_dir, "%020d" % 0), pos20 + 48 + 300)       # a body byte of entry 20
        assert cl.dledger_first_damaged(0, last) == 20
        damaged = bytes(cl.view_raw(pos20, size))
        bad_copy = bytearray(copy20)
        bad_copy[48 + 200] ^= 0x01
        moved = bytearray(copy20)
        moved[24:32] = (pos20 + 8).to_bytes(8, "big")                  # its POS: then its record does not sit there
        for buf, err in [(bytes(bad_copy), CorruptRecord), (copy21, InvalidArgument), (bytes(moved), CorruptRecord),
                         (copy20[:-1], InvalidArgument)]:
            with pytest.raises(err):
                cl.dledger_repair_entry(20, buf)
            assert bytes(cl.view_raw(pos20, size)) == damaged, "nothing was written"
        with pytest.raises(OutOfRange):
            cl.dledger_repair_entry(last + 1, copy20)
        assert cl.dledger_repair_entry(20, copy20) is True
        assert bytes(cl.view_raw(pos20, size)) == copy20 and cl.dledger_first_damaged(0, last) == last + 1
        assert cl.dledger_entries_repaired() == 1
        assert bytes(store.read_record(pos20 + 48, size - 48)) == copy20[48:]      # served again
        _flip(os.path.join(cfg.commitlog_dir, "%020d" % 0), pos20 + 48 + 300)       # again, for the scrub
        assert cl.dledger_scrub(0, last, 5 * size) == (None, 5)          # ~5 entries' bytes a call
        assert cl.dledger_scrub(5, last, 1) == (None, 6)                 # one entry at least
        assert cl.dledger_scrub(15, last, 100 * size) == (20, 21)        # stops at the damaged one
        assert cl.dledger_scrub(21, last, 10 ** 9) == (None, last + 1)
    finally:
        store.close()


@pytest.mark.parametrize("damaged, want", [("header", 1), ("unit", 1), ("unit at the term change", None)])
def test_a_term_only_unit_or_header_holds_is_taken_from_the_one_between_its_neighbours(tmp_path, damaged, want):
    """No checksum covers a unit or an entry's header: when they disagree on the term alone, the
    one between the previous entry's term and the next one's is right (terms never go down).  Both
    in range -- at a term change -- is not decidable: refused (CorruptRecord).  Entries 0..9 are of
    term 1, 10..19 of term 3; entry 5 (neighbours 1 and 1) or 9 (1 and 3) damaged to say 2."""
    from mq.store import MessageStore
    cfg = _member_config(tmp_path)
    store = MessageStore.open(cfg)
    try:
        store.cl.dledger_set_append_term(1)
        for i in range(20):
            if i == 10:
                store.cl.dledger_set_append_term(3)
            store.cl.append("R", 0, b"m%05d" % i)
        index = 9 if damaged.endswith("change") else 5
        pos, size, _ = store.cl.dledger_entry(index)
        if damaged == "header":
            _flip(os.path.join(cfg.commitlog_dir, "%020d" % 0), pos + 16 + 7, 0x03)     # term 1 -> 2
        else:
            path, at = _unit_path(cfg, index)
            _flip(path, at + 24 + 7, 0x03)
        if want is None:
            with pytest.raises(CorruptRecord):
                store.cl.dledger_entry(index)
        else:
            assert store.cl.dledger_entry(index) == (pos, size, want)
            assert store.cl.dledger_units_repaired() == ((1, index) if damaged == "unit" else (0, 0))
    finally:
        store.close()


def _flip_text(path: str, old: str, new: str) -> None:
    """Replaces one character sequence of a small text file (a bit flip: '1' ^ 0x08 == '9')."""
    with open(path) as f:
        text = f.read()
    assert text.count(old) == 1, text
    with open(path, "w") as f:
        f.write(text.replace(old, new))


def test_a_damaged_checkpoint_is_ignored_and_the_commit_restored_from_dispatch(tmp_path, caplog):
    """The Raft role's checkpoint (endIndex, committedIndex) is a hint recovery restores the commit
    from.  One bit of it damaged -- committedIndex=11 read as 19 -- restored a commit over entries
    the group never committed (served, and later refused to be cut: the core asserts a conflict is
    never below the commit).  Its crc line notices it: ignored with one line, the commit restored is
    where dispatch stopped (entry 11)."""
    from mq.store import MessageStore
    from mq.store.dledgerfiles import CHECKPOINT, save_checkpoint
    cfg = _member_config(tmp_path)
    store = MessageStore.open(cfg)
    store.cl.dledger_set_append_term(1)
    for i in range(20):
        store.cl.append("R", 0, b"m%05d" % i)
    store.cl.dledger_set_commit(12)                       # entries 0..11 committed, 12..19 not
    store.cl.flush(0)
    assert store.wait_dispatched(10)                      # (up to the commit: DLedger mode)
    save_checkpoint(cfg.dledger_dir, 19, 11)
    store.close()
    _flip_text(os.path.join(cfg.dledger_dir, CHECKPOINT), "committedIndex=11", "committedIndex=19")
    with caplog.at_level("WARNING", logger="mq.store.dledgerfiles"):
        store = MessageStore.open(cfg)
    try:
        assert store.ctl.get(C.POS_DL_COMMIT_INDEX) == 12 and store.ctl.get(C.POS_DL_NEXT_INDEX) == 20
        assert store.max_offset("R", 0) == 12
        assert [r.getMessage().split(" (")[0] for r in caplog.records] == [
            f"the DLedger checkpoint {os.path.join(cfg.dledger_dir, CHECKPOINT)} is damaged"]
    finally:
        store.close()


def test_a_damaged_hard_state_stops_the_open_with_one_line(tmp_path):
    """currterm holds the member's term and vote; a member that forgot its vote could vote twice in
    one term.  One bit of it damaged (currTerm=1 read as 9, or a vote for another member) passed
    as a valid file; its crc line notices it, and the open stops with one line naming the file."""
    from mq.store import MessageStore, StoreError
    from mq.store.dledgerfiles import CURRTERM, save_hard_state
    cfg = _member_config(tmp_path)
    _filled_member(cfg, [b"r" * 10] * 5)
    save_hard_state(cfg.dledger_dir, 1, "n1")
    _flip_text(os.path.join(cfg.dledger_dir, CURRTERM), "currTerm=1", "currTerm=9")
    with pytest.raises(StoreError, match=r"the DLedger hard state .*currterm is damaged .* not starting"):
        MessageStore.open(cfg)


@pytest.mark.parametrize("damage", ["entry magic", "file cut"])
def test_a_queue_rebuilt_over_a_damaged_older_entry_keeps_the_entries_after_it(tmp_path, damage):
    """The DLedger half of tests/store/test_recovery.py's rebuild over damage: a queue lost while
    the store was stopped is rebuilt from the whole log, and an entry in the first data file (not
    among the files recovery validates) whose MAGIC was changed, or the file cut inside it, costs
    the entries it covers: the walk goes on at the next whole entry (mq_commitlog_resync: MAGIC,
    POS equal to its position, dl_entry_check), the queue keeps its offsets and its end.  (Before:
    the open failed with "dispatch stopped at ...: bad magic".)"""
    from mq.store import MessageStore
    cfg = _member_config(tmp_path)
    res = _filled_member(cfg, [b"r%05d" % i + b"x" * 300 for i in range(1500)], queues=2)
    victim = res[12]                               # queue 0, offset 6, in the first data file
    entry_at = victim.phy_offset() - 48            # its entry's header
    with open(os.path.join(cfg.commitlog_dir, "%020d" % 0), "r+b") as f:
        if damage == "entry magic":
            f.seek(entry_at)
            f.write(b"\0\0\0\x07")
            lost = {12}
        else:
            f.truncate(entry_at + 10)
            lost = {i for i, r in enumerate(res) if r.phy_offset() >= entry_at and r.phy_offset() < FS}
    shutil.rmtree(os.path.join(str(tmp_path / "s"), "consumequeue", "R", "0"))
    store = MessageStore.open(cfg)
    try:
        assert store.recovery.queues_rebuilt == ["R:0"]
        assert store.max_offset("R", 0) == 750
        got = {at for qo in range(750) for at, _ in store.get_messages("R", 0, qo, 1)}
        assert got == {i // 2 for i in range(0, 1500, 2) if i not in lost}
    finally:
        store.close()


def test_an_entry_whose_term_was_damaged_upwards_is_cut_at_start(tmp_path):
    """No checksum covers an entry's header; the scan already refuses a term that goes back, and now
    recovery refuses one above the member's saved current term (the role saves a term before it
    appends or acknowledges an entry of it): the last entry's TERM with its top byte flipped
    (found by the DLedger recovery property) cuts the log there, and the log's last term is 1 again.
    (Before: the entry was kept with term 2^56 + 1, the member's log looked newer than any other
    to every vote, and a leader of term 2 could not append after it.)"""
    from mq.store import MessageStore
    from mq.store.dledgerfiles import save_hard_state
    cfg = _member_config(tmp_path)
    res = _filled_member(cfg, [b"t%03d" % i for i in range(20)])
    save_hard_state(cfg.dledger_dir, 1, None)
    last_entry = res[-1].phy_offset() - 48
    with open(os.path.join(cfg.commitlog_dir, "%020d" % 0), "r+b") as f:
        f.seek(last_entry + 16)                     # TERM, big-endian: its top byte
        f.write(b"\x01")
    store = MessageStore.open(cfg)
    try:
        rep = store.recovery
        assert (rep.stop, rep.end_offset) == ("bad term", last_entry), rep
        assert store.ctl.get(C.POS_DL_NEXT_INDEX) == 19 and store.ctl.get(C.POS_DL_END_TERM) == 1
        store.cl.dledger_set_commit(19)
        assert store.wait_dispatched(10)
        store.ctl.reset_next_offsets()
        store.cl.dledger_set_append_term(2)
        assert store.cl.append("R", 0, b"next").queue_offset() == 19
    finally:
        store.close()


def test_a_commit_restored_low_then_raised_walks_past_damage_below_the_validated_files(tmp_path):
    """A DLedger member whose only queue was lost restores its commit low (nothing was indexed, and
    no checkpoint of the role says more); its group's next commit then makes the dispatch walk the
    older data files, which this start's recovery did not validate.  An entry there with its MAGIC
    changed is skipped with one line (POS_VALIDATED: below it dispatch goes past damage), and every
    other entry is dispatched.  (Before: the steady-state walk stopped for good there --
    "dispatch stopped at ...: bad magic" -- found by the DLedger recovery property.)"""
    from mq.store import MessageStore
    cfg = _member_config(tmp_path)
    res = _filled_member(cfg, [b"r%05d" % i + b"x" * 300 for i in range(800)])
    with open(os.path.join(cfg.commitlog_dir, "%020d" % 0), "r+b") as f:
        f.seek(res[6].phy_offset() - 48)             # entry 6's MAGIC, in the first data file
        f.write(b"\0\0\0\x07")
    shutil.rmtree(os.path.join(str(tmp_path / "s"), "consumequeue", "R", "0"))
    store = MessageStore.open(cfg)
    try:
        rep = store.recovery
        assert rep.queues_rebuilt == ["R:0"] and rep.start_offset > res[6].phy_offset(), rep
        assert store.ctl.get(C.POS_VALIDATED) == rep.start_offset
        assert store.ctl.get(C.POS_COMMITTED) < rep.start_offset        # restored low
        store.cl.dledger_set_commit(store.ctl.get(C.POS_DL_NEXT_INDEX))
        assert store.wait_dispatched(10), "dispatch stopped"
        assert store.max_offset("R", 0) == 800
        got = {at for qo in range(800) for at, _ in store.get_messages("R", 0, qo, 1)}
        assert got == set(range(800)) - {6}
    finally:
        store.close()


@pytest.mark.parametrize("damage", ["first entry's index", "first file emptied"])
def test_a_damaged_head_of_the_log_moves_its_start_to_the_next_whole_entry(tmp_path, damage):
    """Recovery validates a DLedger log's last files, yet took its first entry's index as the log's
    first (DL_BEGIN_INDEX) and rewrote index units from it.  That entry's INDEX damaged (2^56 added:
    no checksum covers the header) or its file emptied (cut to 0, extended with zeros) made the
    open fail (an index file named 2^61, "no DLedger entry at 0").  Now the head moves to the next
    whole entry whose index is possible, with one line, as retention would move it; everything
    after is served.  (Found by the DLedger recovery property.)"""
    from mq.store import MessageStore
    cfg = _member_config(tmp_path)
    res = _filled_member(cfg, [b"h%05d" % i + b"x" * 300 for i in range(800)])
    path = os.path.join(cfg.commitlog_dir, "%020d" % 0)
    with open(path, "r+b") as f:
        if damage == "first entry's index":
            f.seek(8)                                     # entry 0's INDEX, big-endian: its top byte
            f.write(b"\x01")
            begin = 1
        else:
            f.truncate(0)
            begin = next(i for i, r in enumerate(res) if r.phy_offset() >= FS)
    store = MessageStore.open(cfg)
    try:
        rep = store.recovery
        assert rep.start_offset > FS and any("DLedger log head damaged" in r for r in rep.repaired), rep
        head = res[begin].phy_offset() - 48
        assert store.ctl.get(C.POS_MIN) == head and store.ctl.get(C.POS_DL_BEGIN_INDEX) == begin
        assert store.cl.dledger_entry(begin)[0] == head
        assert store.min_offset("R", 0) == begin and store.max_offset("R", 0) == 800
        got = [at for qo in range(800) for at, _ in store.get_messages("R", 0, qo, 1)]
        assert got == list(range(begin, 800))
    finally:
        store.close()


def test_an_impossible_index_in_the_first_validated_entry_is_damage(tmp_path):
    """The scan checks each entry's index against the one before; the first entry it validates has
    none.  An index no append writes -- negative, or more than its position / 139 (the smallest
    entry: every member numbers entries from 0 at position 0) -- is damage there too (stop "bad
    index").  (Before: one entry after a crash with 2^56 added to its INDEX made the open fail,
    rewriting an index unit 2^61 bytes out.)"""
    from mq.store import MessageStore
    cfg = _member_config(tmp_path)
    store = MessageStore.open(cfg)
    store.cl.dledger_set_append_term(1)
    store.cl.append("R", 0, b"only")
    store.cl.dledger_set_commit(1)
    store.cl.flush(0)
    assert store.wait_dispatched(10)
    from tests.store.storekit import crash
    crash(store)
    with open(os.path.join(cfg.commitlog_dir, "%020d" % 0), "r+b") as f:
        f.seek(8)
        f.write(b"\x01")
    store = MessageStore.open(cfg)
    try:
        assert (store.recovery.stop, store.recovery.end_offset) == ("bad index", 0), store.recovery
        assert store.ctl.get(C.POS_DL_NEXT_INDEX) == 0
        store.ctl.reset_next_offsets()
        store.cl.dledger_set_append_term(2)
        assert store.cl.append("R", 0, b"next").queue_offset() == 0
    finally:
        store.close()


def test_a_misnamed_record_past_the_restored_commit_is_refused_when_the_group_commits_it(tmp_path, caplog):
    """A DLedger member's recovery proves a record misnamed (R:0's last entry names record 38, whose
    QUEUEID was flipped to say R:1 offset 19, R:1's end), but dispatches only what is known
    committed: R:0 is rebuilt, so nothing is, and the record lies past the commit restored.  The
    refusal waits (MessageStore.refusals_pending) and the dispatch role applies it when the group
    commits the entry: the record goes into no queue, with one line, and no reader serves it.
    (Before: the steady-state walk in C filed it as R:1:19 -- found by the DLedger recovery
    property, blobs b'AEECQQFBAAABQQBBAEQO4SGXQQAA' and b'AEEBQQFBAAABQQBBAEQO4SGUQQAA'.)"""
    from mq.store import MessageStore
    cfg = _member_config(tmp_path)
    res = _filled_member(cfg, [b"m%05d" % i for i in range(39)], queues=2)
    victim = res[38]                                   # R:0 offset 19; R:1 ends at 19
    with open(os.path.join(cfg.commitlog_dir, "%020d" % 0), "r+b") as f:
        f.seek(victim.phy_offset() + wcl.POS_QUEUE_ID + 3)
        f.write(b"\x01")
    with caplog.at_level("ERROR", logger="mq.store.dispatch"):
        store = MessageStore.open(cfg)
        try:
            assert store.recovery.queues_rebuilt == ["R:0"], store.recovery
            assert store.ctl.get(C.POS_COMMITTED) <= victim.phy_offset()          # restored low
            assert list(store.refusals_pending) == [victim.phy_offset()]
            store.cl.dledger_set_commit(store.ctl.get(C.POS_DL_NEXT_INDEX))
            assert store.wait_dispatched(10), "dispatch stopped"
            assert (store.max_offset("R", 0), store.max_offset("R", 1)) == (19, 19)
            assert store.dispatcher.records_refused == 1
            served = {(q, at): bytes(wcl.parse_record(v, check_crc=True).body) for q in range(2)
                      for qo in range(19) for at, v in store.get_messages("R", q, qo, 1)}
            assert served == {(i % 2, i // 2): b"m%05d" % i for i in range(38)}
            with pytest.raises(CorruptRecord):
                store.read_filed(victim.phy_offset())
            # passed: the role's next turn drops it and walks in C again
            wait_for(lambda: not store.dispatcher.refuse_at, 5, 0.01, "the refusal dropped once passed")
        finally:
            store.close()
    lines = [r.getMessage() for r in caplog.records if "left out of every ConsumeQueue" in r.getMessage()]
    assert len(lines) == 1 and f"the record at {victim.phy_offset()} names R:1 queue offset 19" in lines[0], lines


def _served_from(store, topic="R", queue=0) -> dict[int, bytes]:
    """{queue offset: body} of every message a read of the queue serves, from its min to its max."""
    return {at: bytes(wcl.parse_record(v, check_crc=True).body) for qo in range(store.min_offset(topic, queue),
                                                                              store.max_offset(topic, queue))
            for at, v in store.get_messages(topic, queue, qo, 1)}


def test_a_log_whose_index_is_rewritten_from_a_damaged_head_starts_where_it_is_whole(tmp_path):
    """A DLedger member's first data file cut inside its second entry, and the first index file
    gone, after a clean stop: the index units below the validated files are rewritten from the
    log's head, which needs every entry from the head to the validated ones whole.  The head moves
    past the damage, to the next entry from which the log is whole (the next file's first), as
    retention would move it, with one line; every entry from there is served once the group
    commits.  (Before: the open failed, "DLedger index recovery of [0, ...)" -- the head check
    looked at the first entry only, which was whole; found by the DLedger recovery property, blob
    b'AEEBQgDiQQIBAUEDQQBCAJQBQQlBAAA='.)"""
    from mq.store import MessageStore
    cfg = _member_config(tmp_path)
    res = _filled_member(cfg, [b"m%05d" % i + b"-" * 800 for i in range(226)])
    os.truncate(os.path.join(cfg.commitlog_dir, "%020d" % 0), res[1].phy_offset() + 20)
    os.remove(os.path.join(cfg.dledger_index_dir, "%020d" % 0))
    store = MessageStore.open(cfg)
    try:
        rep = store.recovery
        assert f"DLedger log head damaged at 0: starts at {FS}" in rep.repaired, rep
        assert store.ctl.get(C.POS_MIN) == FS
        store.cl.dledger_set_commit(store.ctl.get(C.POS_DL_NEXT_INDEX))
        assert store.wait_dispatched(10), "dispatch stopped"
        kept = [i for i, r in enumerate(res) if r.phy_offset() >= FS]
        assert _served_from(store) == {i: b"m%05d" % i + b"-" * 800 for i in kept}
    finally:
        store.close()


def test_a_queue_rebuilt_after_the_log_head_was_given_up_starts_at_its_first_record_file(tmp_path):
    """A DLedger member's first data file emptied and its queue's first ConsumeQueue file deleted
    (32-entry files): the head moves to the next file, and the queue, rebuilt, has nothing until
    the group commits -- then dispatch meets its first record at an offset past its first files.
    The empty queue starts at the file holding that record (fillers before it in that file), as
    after retention, so a consumer at offset 0 is sent there.  (Before: its min stayed 0 over
    files that do not exist; found by the DLedger recovery property, blob
    b'AEEBQgDiQQIBAUEDQQBBAAFBBEEAQQAA'.)"""
    from mq.store import MessageStore
    cfg = _member_config(tmp_path, mappedFileSizeConsumeQueue=32 * 20)
    res = _filled_member(cfg, [b"m%05d" % i + b"-" * 800 for i in range(226)])
    os.truncate(os.path.join(cfg.commitlog_dir, "%020d" % 0), 0)
    os.remove(os.path.join(str(tmp_path / "s"), "consumequeue", "R", "0", "%020d" % 0))
    store = MessageStore.open(cfg)
    try:
        assert store.recovery.queues_rebuilt == ["R:0"], store.recovery
        store.cl.dledger_set_commit(store.ctl.get(C.POS_DL_NEXT_INDEX))
        assert store.wait_dispatched(10), "dispatch stopped"
        kept = [i for i, r in enumerate(res) if r.phy_offset() >= FS]
        assert (store.min_offset("R", 0), store.max_offset("R", 0)) == (kept[0] - kept[0] % 32, 226)
        assert _served_from(store) == {i: b"m%05d" % i + b"-" * 800 for i in kept}
    finally:
        store.close()


def test_an_index_file_cut_short_in_the_validated_files_is_rewritten(tmp_path):
    """The index units of the files recovery validates are rewritten from their entries after a
    crash; the rewrite makes a missing index file again, and now one cut short too (it is removed
    first, with one line) -- here the second, emptied, where damage ends the log at its first
    unit.  (Before: the open failed, "DLedger index recovery of [0, ...)"; found by the DLedger
    recovery property, blob b'AEEBQgEzQQAAAUEKQQFBAAFBAEQA2uWYQQBBAAA='.)"""
    from mq.store import MessageStore
    from tests.store.storekit import crash
    cfg = _member_config(tmp_path)
    store = MessageStore.open(cfg)
    store.cl.dledger_set_append_term(1)
    res = [store.cl.append("R", 0, b"m%05d" % i) for i in range(300)]      # one data file, 3 index files
    store.cl.dledger_set_commit(store.ctl.get(C.POS_DL_NEXT_INDEX))
    assert store.wait_dispatched(10)
    crash(store)
    os.truncate(os.path.join(cfg.dledger_index_dir, "%020d" % 4096), 0)
    with open(os.path.join(cfg.commitlog_dir, "%020d" % 0), "r+b") as f:
        f.seek(res[128].phy_offset() - 48)          # entry 128's MAGIC: the log ends at the cut file's first unit
        f.write(b"\0\0\0\x07")
    store = MessageStore.open(cfg)
    try:
        assert store.recovery.start_offset == 0 and store.ctl.get(C.POS_DL_NEXT_INDEX) == 128
        assert [store.cl.dledger_entry(i)[0] + 48 for i in range(128)] == [r.phy_offset() for r in res[:128]]
    finally:
        store.close()
