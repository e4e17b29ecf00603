"""A master/slave store restarted with enableDLegerCommitLog=true (mq.store.legacy), at the store
level: the old CommitLog is served read-only below the dividing offset, the ConsumeQueues go on
at their old ends, and recovery, damage, a queue rebuild and retention treat the two logs as one.
Real stores under tmp_path with 64 KiB CommitLog files, so the old log spans several files."""
from __future__ import annotations

import os
import shutil

import pytest

from mq.store import MessageStore, StoreConfig
from mq.store.commitlog import list_files
from mq.store.legacy import LegacyLog
from mq.store.retention import Retention
from mq.wire import commitlog as wcl

FS = 64 * 1024
CQ_FILE = 20 * 64
QUEUES = [("T", 0), ("T", 1), ("T", 2)]
OLD, NEW = 500, 150
DLEDGER = dict(enableDLegerCommitLog=True, dLegerPeers="n0-127.0.0.1:1;n1-127.0.0.1:2;n2-127.0.0.1:3",
               dLegerSelfId="n0", mappedFileSizeForEntryIndex=4096)


def _cfg(root: str, dledger: bool) -> StoreConfig:
    return StoreConfig(storePathRootDir=root, mappedFileSizeCommitLog=FS, mappedFileSizeConsumeQueue=CQ_FILE,
                       **(DLEDGER if dledger else {}))


def _body(i: int) -> bytes:
    return (b"%05d" % i) * 40


def _queue_of(i: int) -> tuple[str, int]:
    return QUEUES[i % len(QUEUES)]


def _expected(n: int) -> dict:
    out: dict = {q: [] for q in QUEUES}
    for i in range(n):
        out[_queue_of(i)].append(_body(i))
    return out


def _read_all(store: MessageStore) -> dict:
    out = {}
    for topic, qid in QUEUES:
        lo, hi = store.min_offset(topic, qid), store.max_offset(topic, qid)
        got = []
        while lo < hi:
            batch = store.get_messages(topic, qid, lo, 32)
            if not batch:
                lo += 32
                continue
            for off, view in batch:
                assert wcl.parse_record(view).queue_offset == off
                got.append(wcl.parse_record(view).body)
            lo = batch[-1][0] + 1
        out[(topic, qid)] = got
    return out


def _switched(root: str) -> MessageStore:
    """A plain store of OLD messages, then opened in DLedger mode, NEW more appended and committed."""
    plain = MessageStore.open(_cfg(root, False))
    for i in range(OLD):
        assert plain.put(*_queue_of(i), _body(i)).ok
    assert plain.wait_dispatched(10)
    plain.close()
    store = MessageStore.open(_cfg(root, True))
    store.cl.dledger_set_append_term(1)
    for i in range(OLD, OLD + NEW):
        store.cl.append(*_queue_of(i), _body(i))
    store.cl.dledger_set_commit(NEW)
    store.cl.flush(0)
    assert store.wait_dispatched(10)
    return store


def test_switch_serves_the_old_log_and_continues_every_queue(tmp_path):
    root = str(tmp_path / "s")
    store = _switched(root)
    try:
        lg = store.legacy
        assert lg is not None
        old_files = list_files(os.path.join(root, "commitlog"))
        assert len(old_files) >= 3
        assert lg.end == old_files[-1] + FS                      # the dividing offset
        assert list_files(store.config.commitlog_dir)[0] == lg.end
        assert store.cl.dledger_entry(0)[0] == lg.end              # entry 0 is stored at the dividing offset
        assert store.min_phy == 0
        assert _read_all(store) == _expected(OLD + NEW)
        # queue offsets continue: the first DLedger message of each queue follows the old ones
        for q, bodies in _expected(OLD).items():
            first_new = store.get_messages(*q, len(bodies), 1)[0]
            first_i = next(i for i in range(OLD, OLD + NEW) if _queue_of(i) == q)
            assert wcl.parse_record(first_new[1]).body == _body(first_i)
    finally:
        store.close()
    # a restart: no second switch, the same answers
    again = MessageStore.open(_cfg(root, True))
    try:
        assert again.recovery.mode == "clean"
        assert again.legacy is not None and again.legacy.end == lg_end(root)
        again.cl.dledger_set_commit(NEW)
        assert _read_all(again) == _expected(OLD + NEW)
        # an attacher (an io worker) finds the old log through its control block
        other = MessageStore.attach(_cfg(root, True), prepare_files=False)
        try:
            assert other.legacy is not None and other.legacy.end == again.legacy.end
            assert bytes(other.read_record(0)) == bytes(again.read_record(0))
        finally:
            other.close()
    finally:
        again.close()


def lg_end(root: str) -> int:
    return list_files(os.path.join(root, "commitlog"))[-1] + FS


def test_a_damaged_old_record_is_refused_and_the_rest_served(tmp_path):
    root = str(tmp_path / "s")
    store = _switched(root)
    victim = store.cqs.get("T", 1).get_raw(10)[0]
    store.close()
    path = os.path.join(root, "commitlog", "%020d" % (victim - victim % FS))
    with open(path, "r+b") as f:                # one byte of the 11th body of T:1
        f.seek(victim % FS + 200)
        b = f.read(1)
        f.seek(victim % FS + 200)
        f.write(bytes([b[0] ^ 0xFF]))
    store = MessageStore.open(_cfg(root, True))
    try:
        store.cl.dledger_set_commit(NEW)
        got = _read_all(store)
        want = _expected(OLD + NEW)
        assert got[("T", 1)] == want[("T", 1)][:10] + want[("T", 1)][11:]
        assert got[("T", 0)] == want[("T", 0)] and got[("T", 2)] == want[("T", 2)]
    finally:
        store.close()


def test_a_lost_queue_is_rebuilt_from_both_logs(tmp_path):
    root = str(tmp_path / "s")
    store = _switched(root)
    store.close()
    shutil.rmtree(os.path.join(root, "consumequeue", "T", "2"))
    store = MessageStore.open(_cfg(root, True))
    try:
        assert "T:2" in store.recovery.queues_rebuilt
        store.cl.dledger_set_commit(NEW)
        assert _read_all(store) == _expected(OLD + NEW)
        assert store.max_offset("T", 2) == len(_expected(OLD + NEW)[("T", 2)])
    finally:
        store.close()


def test_retention_deletes_the_old_files_first(tmp_path):
    root = str(tmp_path / "s")
    store = _switched(root)
    try:
        store.config.fileReservedTime = 0
        old = store.legacy.files()
        dl_files = list_files(store.config.commitlog_dir)
        r = Retention(store, usage_fn=lambda p: 0.1)
        deleted = r.run_once(force=True)
        assert deleted == ["%020d" % s for s in old]             # every old file, no DLedger file
        # no DLedger file deleted (the io worker's preparer may have made the next one meanwhile)
        assert set(dl_files) <= set(list_files(store.config.commitlog_dir))
        assert store.min_phy == store.cl.min_pos == store.legacy.end
        got = _read_all(store)
        want = _expected(OLD + NEW)
        for q in QUEUES:        # the queues now start at their first DLedger message
            n_old = len(_expected(OLD)[q])
            assert store.min_offset(*q) == n_old
            assert got[q] == want[q][n_old:]
    finally:
        store.close()
    # the next start has no old log any more, and the queues still start there
    again = MessageStore.open(_cfg(root, True))
    try:
        assert again.legacy is None
        assert again.min_offset("T", 0) == len(_expected(OLD)[("T", 0)])
    finally:
        again.close()


def test_a_plain_dledger_store_has_no_old_log(tmp_path):
    store = MessageStore.open(_cfg(str(tmp_path / "s"), True))
    try:
        assert store.legacy is None
        assert LegacyLog.attach(store.config, "127.0.0.1", 10911) is None
    finally:
        store.close()


def test_the_switch_refuses_a_store_in_use(tmp_path):
    root = str(tmp_path / "s")
    plain = MessageStore.open(_cfg(root, False))
    try:
        assert plain.put("T", 0, b"x").ok
        with pytest.raises(Exception, match="in use"):
            MessageStore.open(_cfg(root, True))
    finally:
        plain.close()


def test_a_member_whose_old_log_ends_elsewhere_refuses_the_leaders_entries(tmp_path):
    """The old files are not replicated: a member must switch with the leader's old CommitLog.
    One that switched with none stores entry 0 at 0, the leader at its dividing offset; the
    leader's entries are refused (CorruptRecord: the role drops the link and logs why), and
    nothing is appended."""
    from mq.dledger.log import DLedgerLog, InBatch
    from mq.store import CorruptRecord
    leader = _switched(str(tmp_path / "leader"))
    member = MessageStore.open(_cfg(str(tmp_path / "member"), True), start_roles=False)
    try:
        pos = leader.cl.dledger_entry(0)[0]
        end = leader.cl.dledger_entry(2)[0]
        buf = bytes(leader.cl.view_raw(pos, end - pos))
        dl = DLedgerLog(member.cl, sync_durable=False)
        dl.set_term_bound(1)
        with pytest.raises(CorruptRecord, match=f"entry 0 at position {pos}, this member's log ends at 0"):
            dl.append(InBatch(buf, 0, 2, pos), 0)
        assert dl.last_index() == -1 and member.cl.write_pos == 0
    finally:
        member.close()
        leader.close()
