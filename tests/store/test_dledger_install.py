"""A DLedger member behind the leader's first entry, installed at the store level: the rebase
file, mq_dledger_install and the dispatcher's rebase of the ConsumeQueues (MessageStore.
finish_install), and recovery of an install cut short by a crash at each step.  Real stores
under tmp_path with small data and ConsumeQueue files, so the install lands several files in
and queues cross file boundaries; the leader's table comes from its own ConsumeQueues."""
from __future__ import annotations

import os

import pytest

from mq.dledger.log import DLedgerLog, InBatch
from mq.store import MessageStore, StoreConfig
from mq.store import control as C
from mq.store.commitlog import list_files
from mq.store.consumequeue import FILLER
from mq.store.dledgerfiles import REBASE, load_rebase

from tests.store.storekit import crash

FS = 64 * 1024
CQ_FILE = 20 * 64                  # 64 entries per ConsumeQueue file
QUEUES = [("T", 0), ("T", 1), ("T", 2), ("T", 3)]
ONLY_EARLY = ("U", 0)             # a queue with messages below the install point only


def _open(root: str, start_roles: bool = True) -> MessageStore:
    cfg = StoreConfig(storePathRootDir=root, mappedFileSizeCommitLog=FS, enableDLegerCommitLog=True,
                      dLegerPeers="n0-127.0.0.1:1;n1-127.0.0.1:2;n2-127.0.0.1:3", dLegerSelfId="n0",
                      mappedFileSizeForEntryIndex=4096, mappedFileSizeConsumeQueue=CQ_FILE)
    return MessageStore.open(cfg, start_roles=start_roles)


def _bytes(store: MessageStore, start: int, end: int) -> bytes:
    out = bytearray()
    while start < end:
        n = min(end, start - start % FS + FS) - start
        out += bytes(store.cl.view_raw(start, n))
        start += n
    return bytes(out)


def _bodies(store: MessageStore, topic: str, qid: int, lo: int) -> list[bytes]:
    hi = store.max_offset(topic, qid)
    out = []
    while lo < hi:
        got = store.get_messages(topic, qid, lo, 32)
        assert got, (topic, qid, lo, hi)
        for off, view in got:
            assert off == lo
            out.append(bytes(view)[-50:])
            lo += 1
    return out


@pytest.fixture
def pair(tmp_path):
    """(leader, follower): the leader holds 700 committed entries over several files; the
    follower holds the first 100 (committed, dispatched; its roles are driven by the test).
    The install point P is the start of the leader's third file, B its first entry."""
    leader = _open(str(tmp_path / "leader"))
    follower = _open(str(tmp_path / "follower"), start_roles=False)
    leader.cl.dledger_set_append_term(1)
    for i in range(700):
        topic, qid = ONLY_EARLY if i < 100 and i % 5 == 0 else QUEUES[i % 4]
        leader.cl.append(topic, qid, (b"%05d" % i) * 60)
    leader.cl.dledger_set_commit(700)
    leader.cl.flush(0)
    assert leader.wait_dispatched(10)
    head = _bytes(leader, 0, leader.cl.dledger_entry(100)[0])
    follower.cl.dledger_append_raw(head, 0, 0, 1)
    follower.cl.dledger_set_commit(100)
    follower.cl.flush(0)
    follower.dispatcher.dispatch_once()
    assert follower.max_offset(*ONLY_EARLY) == 20
    yield leader, follower
    for s in (leader, follower):
        if s.ctl is not None and s.ctl._shm is not None:
            s.close()


def _install(leader: MessageStore, follower: MessageStore) -> tuple[int, int]:
    """The leader's install of its third file, applied by the follower's DLedgerLog; (B, P)."""
    p = 2 * FS
    b = leader.cl.dledger_entry_at(p)[0]
    assert leader.cl.dledger_entry(b)[0] == p and b > 100
    last = max(i for i in range(b, 700) if leader.cl.dledger_entry(i)[0] < p + FS)
    batch = InBatch(_bytes(leader, p, p + FS), b, last - b + 1, p, leader.queue_offsets_below(p))
    dl = DLedgerLog(follower.cl, False, dledger_dir=follower.config.dledger_dir)
    dl.set_term_bound(1)
    dl.install(batch)
    assert dl.installs == 1
    return b, p


def _catch_up(leader: MessageStore, follower: MessageStore, p: int) -> None:
    follower.cl.dledger_append_raw(_bytes(leader, p + FS, leader.cl.write_pos),
                                   follower.ctl.get(C.POS_DL_NEXT_INDEX), p + FS, 1)
    follower.cl.dledger_set_commit(700)


def _assert_like_leader(leader: MessageStore, follower: MessageStore, p: int) -> None:
    table = {(t, q): o for t, q, o in leader.queue_offsets_below(p)}
    for topic, qid in QUEUES + [ONLY_EARLY]:
        assert follower.min_offset(topic, qid) == table[(topic, qid)], (topic, qid)
        assert follower.max_offset(topic, qid) == leader.max_offset(topic, qid), (topic, qid)
        lo = table[(topic, qid)]
        assert _bodies(follower, topic, qid, lo) == _bodies(leader, topic, qid, lo)
    assert follower.max_offset(*ONLY_EARLY) == table[ONLY_EARLY] > 0         # continued though empty


def test_an_installed_follower_serves_the_leaders_queues_from_its_first_entry(pair):
    """After the install and the rest of the leader's bytes, the follower's dispatcher finds
    DISPATCHED below MIN and finishes the install: the data and DLedger index files below go,
    every queue restarts at the leader's count below P (FILLER entries before it in its file,
    files wholly below deleted) -- a queue with no message after P keeps its max -- and the
    queues then hold exactly the leader's entries from P on, with the same bodies.  A clean
    reopen recovers the same bounds without rebuilding a queue."""
    leader, follower = pair
    b, p = _install(leader, follower)
    assert load_rebase(follower.config.dledger_dir)[:2] == (b, p)
    # the units before B are the follower's old log's: zeroed, so B-1's term is not claimed
    dl = DLedgerLog(follower.cl, False, index_dir=follower.config.dledger_index_dir, index_file_size=4096)
    assert dl.term_at(b - 1) is None and dl.term_at(b) == 1
    _catch_up(leader, follower, p)
    follower.dispatcher.dispatch_once()
    assert not os.path.exists(os.path.join(follower.config.dledger_dir, REBASE))
    assert list_files(follower.config.commitlog_dir)[0] == p
    assert follower.ctl.get(C.POS_DISPATCHED) == follower.ctl.get(C.POS_COMMITTED) == leader.cl.write_pos
    _assert_like_leader(leader, follower, p)
    # a queue whose offset at P falls inside a file: fillers before it, nothing from an older file
    for topic, qid in QUEUES:
        cq = follower.cqs.get(topic, qid)
        off = follower.min_offset(topic, qid)
        starts = cq.file_starts()
        assert starts[0] == off * 20 - off * 20 % CQ_FILE
        if off % 64:
            assert cq.get_raw(off - 1) == FILLER and cq.last_phy_end(off) == 0
    bounds = follower.queue_bounds()
    root = follower.root
    follower.close()
    again = _open(root)
    try:
        assert again.recovery.queues_rebuilt == []
        assert again.queue_bounds() == bounds
        _assert_like_leader(leader, again, p)
    finally:
        again.close()


@pytest.mark.parametrize("step", ["rebase file only", "installed", "installed and caught up"])
def test_an_install_cut_short_by_a_crash_recovers_to_one_side(pair, step):
    """A crash after the rebase file was saved but before the C call: the old log recovers as
    it was (the leader installs again) and the file goes.  A crash after the C call, before the
    dispatcher finished: recovery finishes the install (files below go, queues rebased) and the
    store is the one the dispatcher would have made."""
    leader, follower = pair
    root = follower.root
    if step == "rebase file only":
        from mq.store.dledgerfiles import save_rebase
        save_rebase(follower.config.dledger_dir, 999, 2 * FS, leader.queue_offsets_below(2 * FS))
        before = follower.queue_bounds()
        crash(follower)
        again = _open(root)
        try:
            assert load_rebase(again.config.dledger_dir) is None
            assert again.ctl.get(C.POS_DL_NEXT_INDEX) == 100 and again.queue_bounds() == before
        finally:
            again.close()
        return
    b, p = _install(leader, follower)
    if step == "installed and caught up":
        _catch_up(leader, follower, p)
        follower.cl.flush(0)
    follower.dispatcher.rebase = None        # the dispatcher never gets to it
    crash(follower)
    again = _open(root)
    try:
        assert load_rebase(again.config.dledger_dir) is None
        assert list_files(again.config.commitlog_dir)[0] == p
        assert again.ctl.get(C.POS_DL_BEGIN_INDEX) == b and again.ctl.get(C.POS_MIN) == p
        if step == "installed":
            _catch_up(leader, again, p)
        else:
            # what it knows committed after the restart is its first entry: the leader tells more
            assert again.ctl.get(C.POS_COMMITTED) == p
            again.cl.dledger_set_commit(700)
        assert again.wait_dispatched(10)
        assert again.recovery.queues_rebuilt == []
        _assert_like_leader(leader, again, p)
    finally:
        again.close()
