"""Store recovery under random damage, as a property (mq.store.MessageStore, in-process).

Hypothesis draws a store (1-3 queues, 0-400 messages of varied sizes in 64 KiB CommitLog files
and 32-entry ConsumeQueue files, so both roll), a clean stop or a crash (kill -9 as
tests/store/test_recovery.py simulates it), and up to four damages applied while it is stopped:
a flipped bit or a zeroed range anywhere in a CommitLog file or inside a record, a CommitLog
file cut short, a ConsumeQueue file or a whole queue directory deleted, a ConsumeQueue file
cut.  After the reopen:

  * no damaged record is served: every record get_messages returns parses with check_crc=True,
    is of the queue and at the queue offset it was asked for, and equals byte for byte the
    record written there;
  * the intact prefix is kept: every record that lies wholly before the first CommitLog byte
    the damage changed is still served through its queue at its queue offset; with damage to
    ConsumeQueues alone, every record is (they are rebuilt from the CommitLog); but a DLedger
    member whose log's head is damaged gives up what lies before the next entry from which its
    log is whole (as retention would; its group installs it again);
  * queue offsets are dense and unique: each queue's entries from min to max point each at the
    record written at that queue offset, and min is 0 (nothing was retired);
  * the readers that hold a CommitLog offset (the message index, an offset msgId: read_filed)
    serve a record exactly where a pull serves it, byte for byte, and no other;
  * the store takes a new message on every queue and gives it the next queue offset, max,
    never one already used, and serves it;
  * DLedger mode (index files also flipped, zeroed, cut or deleted): every entry the member holds
    resolves through its index unit to the entry written at that index, or -- only when the
    log's own bytes were damaged -- is refused (check_units).
"""
from __future__ import annotations

import os
import shutil
import tempfile

import pytest
from hypothesis import given, note, strategies as st

from mq.store import CorruptRecord, MessageStore, StoreConfig, StoreError, control as C
from mq.store.commitlog import DL_HEADER_SIZE
from mq.store.consumequeue import FILLER
from mq.store.control import remove_segment
from mq.store.dledgerfiles import save_hard_state
from mq.wire import commitlog as wcl
from tests.properties.propkit import bounded
from tests.store.storekit import crash, flip_byte

FS = 64 * 1024                  # mappedFileSizeCommitLog: 400 messages fill up to ~5 files
CQ_ENTRIES = 32                 # entries per ConsumeQueue file: a queue of 400 has ~13 files
TOPIC = "Prop"
# a RAM file system for the stores when there is one: every example fsyncs its files several times,
# which on a disk other tests keep busy costs seconds (nothing here depends on durability: the crash
# simulated keeps the page cache, as kill -9 does)
RAM_DIR = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


DL_INDEX_FS = 4096              # DLedger index files of 128 units: 400 entries take 4


def _config(root: str, dledger: bool = False) -> StoreConfig:
    if dledger:                     # a DLedger member's store, the group's commits made by the test
        return StoreConfig(storePathRootDir=root, mappedFileSizeCommitLog=FS,
                           mappedFileSizeConsumeQueue=CQ_ENTRIES * 20, enableDLegerCommitLog=True,
                           dLegerPeers="n0-127.0.0.1:1;n1-127.0.0.1:2;n2-127.0.0.1:3", dLegerSelfId="n0",
                           mappedFileSizeForEntryIndex=DL_INDEX_FS)
    return StoreConfig(storePathRootDir=root, mappedFileSizeCommitLog=FS,
                       mappedFileSizeConsumeQueue=CQ_ENTRIES * 20)


# --------------------------------------------------------------------------------------------------
# Strategies: a damage is drawn as numbers, resolved against the files when it is applied (modulo
# what is there), so every drawn damage applies to any store and shrinks well.

WHERE = st.integers(0, 1 << 30)

CL_DAMAGE = st.one_of(
    st.tuples(st.just("cl_flip_record"), WHERE, WHERE, st.integers(0, 7)),       # record pick, byte in it, bit
    st.tuples(st.just("cl_flip"), WHERE, st.integers(0, FS - 1), st.integers(0, 7)),   # file pick, byte, bit
    st.tuples(st.just("cl_zero"), WHERE, st.integers(0, FS - 1), st.integers(1, 4096)),
    st.tuples(st.just("cl_cut"), WHERE, st.integers(0, FS - 1)),
)
CQ_DAMAGE = st.one_of(
    st.tuples(st.just("cq_delete_file"), WHERE, WHERE),                          # queue pick, file pick
    st.tuples(st.just("cq_delete_dir"), WHERE),
    st.tuples(st.just("cq_cut"), WHERE, WHERE, st.integers(0, CQ_ENTRIES * 20 - 1)),
    st.tuples(st.just("cq_flip"), WHERE, WHERE, st.integers(0, CQ_ENTRIES * 20 - 1), st.integers(0, 7)),
    st.tuples(st.just("cq_zero"), WHERE, WHERE, st.integers(0, CQ_ENTRIES * 20 - 1), st.integers(1, 200)),
)


# DLedger mode: the index files (a unit per entry) too; recovery checks the older ones by size, a
# read checks each unit against its entry (csrc/dledger.h, mq_dledger_entry)
DL_DAMAGE = st.one_of(
    st.tuples(st.just("dl_index_delete"), WHERE),
    st.tuples(st.just("dl_index_cut"), WHERE, st.integers(0, DL_INDEX_FS - 1)),
    st.tuples(st.just("dl_unit_flip"), WHERE, st.integers(0, 31), st.integers(0, 7)),     # entry pick, byte, bit
    st.tuples(st.just("dl_index_zero"), WHERE, st.integers(0, DL_INDEX_FS - 1), st.integers(1, 256)),
)


@st.composite
def scenarios(draw, dledger: bool = False) -> dict:
    damage = st.one_of(CL_DAMAGE, CQ_DAMAGE, DL_DAMAGE) if dledger else st.one_of(CL_DAMAGE, CQ_DAMAGE)
    return dict(
        queues=draw(st.integers(1, 3)),
        messages=draw(st.integers(0, 400)),
        body_size_max=draw(st.sampled_from([8, 300, 1500])),
        clean=draw(st.booleans()),
        damages=draw(st.lists(damage, max_size=4)),
    )


# --------------------------------------------------------------------------------------------------
# Writing, damaging, checking


class Written:
    """What was written: per (queue, queue offset) the record's position and bytes; where the
    CommitLog's files are (DLedger mode: its data files, entries around the records)."""

    def __init__(self, cl_dir: str):
        self.cl_dir = cl_dir
        self.at: dict[tuple[int, int], tuple[int, bytes]] = {}    # (q, qo) -> (phy, record bytes)

    def records(self) -> list[tuple[int, int, int, bytes]]:
        """(phy, q, qo, bytes), in CommitLog order."""
        return sorted((phy, q, qo, rec) for (q, qo), (phy, rec) in self.at.items())


def put(store: MessageStore, q: int, body: bytes):
    """Stores one message; a DLedger member's append is then committed, as its group would."""
    if not store.config.enableDLegerCommitLog:
        r = store.put(TOPIC, q, body)
        assert r.ok, r
        return r.result
    res = store.cl.append(TOPIC, q, body)
    store.cl.dledger_set_commit(store.ctl.get(C.POS_DL_NEXT_INDEX))
    return res


def fill(store: MessageStore, sc: dict) -> Written:
    w = Written(store.config.commitlog_dir)
    results = []
    if store.config.enableDLegerCommitLog:
        store.cl.dledger_set_append_term(1)
    for i in range(sc["messages"]):
        q = i * 7 % sc["queues"]
        body = b"m%05d-" % i + b"x" * (i * 37 % sc["body_size_max"])
        results.append((q, put(store, q, body)))
    if store.config.enableDLegerCommitLog:
        store.cl.flush(0)
        save_hard_state(store.config.dledger_dir, 1, None)      # the role saves its term first
    assert store.wait_dispatched()
    for q, res in results:
        rec = bytes(store.cl.read_record(res.phy_offset(), res.size()))
        w.at[(q, res.queue_offset())] = (res.phy_offset(), rec)
    return w


def cl_files(cl_dir: str) -> dict[int, bytes]:
    return {int(n): open(os.path.join(cl_dir, n), "rb").read() for n in sorted(os.listdir(cl_dir))}


def cq_dirs(root: str) -> list[str]:
    base = os.path.join(root, "consumequeue", TOPIC)
    if not os.path.isdir(base):
        return []
    return [os.path.join(base, q) for q in sorted(os.listdir(base))]


def apply_damage(root: str, written: Written, damage: tuple) -> str:
    """Applies one damage to the stopped store's files; returns what it did (for the report)."""
    kind = damage[0]
    if kind.startswith("dl_"):
        d = os.path.join(root, "dledger-n0", "index")
        names = sorted(os.listdir(d))
        if not names:
            return "no DLedger index file"
        if kind == "dl_unit_flip":          # a written entry's unit (its index file may be gone)
            if not written.at:
                return "no entry"
            index = damage[1] % len(written.at)
            at = index * 32 + damage[2]
            path = os.path.join(d, "%020d" % (at - at % DL_INDEX_FS))
            if not os.path.exists(path) or not flip_byte(path, at % DL_INDEX_FS, 1 << damage[3]):
                return f"no unit of entry {index} in {path}"
            return f"flipped bit {damage[3]} of byte {damage[2]} of entry {index}'s DLedger index unit"
        path = os.path.join(d, names[damage[1] % len(names)])
        if kind == "dl_index_delete":
            os.unlink(path)
            return f"deleted DLedger index file {path}"
        with open(path, "r+b") as f:
            if kind == "dl_index_cut":
                f.truncate(damage[2])
                return f"cut DLedger index file {path} to {damage[2]} bytes"
            pos = damage[2]
            f.seek(pos)
            old = f.read(damage[3])
            if not old:
                return f"{path} ends before {pos}"
            f.seek(pos)
            f.write(bytes(len(old)))
            return f"zeroed DLedger index {path}+{pos}..+{len(old)}"
    if kind.startswith("cl_"):
        # the files that hold records (the preparer makes the next one ahead, when it gets to it)
        last = max([phy for phy, _, _, _ in written.records()], default=0)
        files = [start for start in sorted(cl_files(written.cl_dir)) if start <= last]
        if kind == "cl_flip_record":
            recs = written.records()
            if not recs:
                return "no record"
            phy, _, _, rec = recs[damage[1] % len(recs)]
            at, bit = phy + damage[2] % len(rec), damage[3]
            path, pos = os.path.join(written.cl_dir, "%020d" % (at - at % FS)), at % FS
            kind = "cl_flip"
        else:
            start = files[damage[1] % len(files)]
            path, pos = os.path.join(written.cl_dir, "%020d" % start), damage[2]
        if not os.path.exists(path):
            return f"{path} is gone"
        with open(path, "r+b") as f:
            if kind == "cl_flip":
                bit = damage[3]
                f.seek(pos)
                b = f.read(1)
                if not b:
                    return f"{path} ends before {pos}"
                f.seek(pos)
                f.write(bytes([b[0] ^ (1 << bit)]))
                return f"flipped bit {bit} of CommitLog byte {os.path.basename(path)}+{pos}"
            if kind == "cl_zero":
                f.seek(pos)
                f.write(b"\0" * min(damage[3], FS - pos))
                return f"zeroed CommitLog {os.path.basename(path)}+{pos}..+{damage[3]}"
            f.truncate(pos)
            return f"cut CommitLog file {os.path.basename(path)} to {pos} bytes"
    dirs = cq_dirs(root)
    if not dirs:
        return "no ConsumeQueue"
    qdir = dirs[damage[1] % len(dirs)]
    if kind == "cq_delete_dir":
        shutil.rmtree(qdir)
        return f"deleted ConsumeQueue directory {qdir}"
    names = sorted(os.listdir(qdir)) if os.path.isdir(qdir) else []
    if not names:
        return f"no file in {qdir}"
    path = os.path.join(qdir, names[damage[2] % len(names)])
    if kind == "cq_delete_file":
        os.unlink(path)
        return f"deleted ConsumeQueue file {path}"
    with open(path, "r+b") as f:
        if kind == "cq_cut":
            f.truncate(damage[3])
            return f"cut ConsumeQueue file {path} to {damage[3]} bytes"
        pos = damage[3]
        f.seek(pos)
        old = f.read(1 if kind == "cq_flip" else damage[4])
        if not old:
            return f"{path} ends before {pos}"
        f.seek(pos)
        if kind == "cq_flip":
            f.write(bytes([old[0] ^ (1 << damage[4])]))
            return f"flipped bit {damage[4]} of ConsumeQueue {path}+{pos}"
        f.write(bytes(len(old)))
        return f"zeroed ConsumeQueue {path}+{pos}..+{len(old)}"


def first_changed(before: dict[int, bytes], after: dict[int, bytes]) -> int | None:
    """The first CommitLog byte whose content the damage changed (a file cut short reads as zeros
    past its end, as recovery extends it), or None."""
    for start, old in sorted(before.items()):
        new = after.get(start, b"")
        new = new + bytes(len(old) - len(new))
        if new != old:
            return start + next(i for i in range(len(old)) if old[i] != new[i])
    return None


# Bytes of a v1 record (IPv4 hosts) that nothing can check: no checksum covers them (BODYCRC covers the
# body only), no reader knows what they should be.  FLAG; SYSFLAG, BORNTIMESTAMP, BORNHOST, BORNPORT,
# STORETIMESTAMP, STOREHOST, STOREPORT, RECONSUMETIMES, PREPAREDTRANSACTIONOFFSET; the PROPERTIES bytes.
# Everything else is checked: TOTALSIZE, MAGIC and the lengths by the layout, the body by BODYCRC,
# PHYSICALOFFSET by its position, TOPIC, QUEUEID and QUEUEOFFSET by the queue and offset that were read.
# test_a_record_whose_flag_byte_flipped_is_never_served documents the limit (an expected failure).
def unchecked_ranges(record: bytes) -> list[tuple[int, int]]:
    body_size = int.from_bytes(record[84:88], "big")
    topic_size = record[88 + body_size]
    props_at = 88 + body_size + 1 + topic_size + 2
    return [(16, 20), (36, 84), (props_at, len(record))]


def unchecked_differences(written: bytes, served: bytes) -> list[int]:
    """Byte positions where `served` differs from `written` outside unchecked_ranges(written)."""
    if len(written) != len(served):
        return [-1]
    free = unchecked_ranges(written)
    return [i for i in range(len(written)) if written[i] != served[i] and not any(a <= i < b for a, b in free)]


QUEUE_FIELDS = ((12, 16), (20, 28))      # QUEUEID, QUEUEOFFSET


def refiled(written, damaged: dict[int, bytes], damages) -> dict[tuple[int, int], bytes]:
    """A named limit: a record whose QUEUEID or QUEUEOFFSET (and nothing else) the damage changed
    to another queue's end is filed there when no ConsumeQueue entry names it any more (its own
    queue's entry lost to ConsumeQueue damage as well): nothing tells it from a record of that
    queue.  With an entry naming it, recovery refuses it (MessageStore._misfiled).  Returns
    {(queue, offset) such a record says: its bytes as damaged}."""
    if not any(d[0].startswith("cq_") for d in damages):
        return {}
    out = {}
    for (q, qo), (phy, rec) in written.at.items():
        start = phy - phy % FS
        now = damaged.get(start, b"")[phy - start:phy - start + len(rec)]
        if len(now) != len(rec) or now == rec:
            continue
        if all(any(a <= i < b for a, b in QUEUE_FIELDS) for i in range(len(rec)) if rec[i] != now[i]):
            says = (int.from_bytes(now[12:16], "big", signed=True), int.from_bytes(now[20:28], "big", signed=True))
            if says != (q, qo):
                out[says] = now
    return out


def served(store: MessageStore, q: int, lo: int, hi: int) -> dict[int, bytes]:
    """Every record get_messages serves for queue q in [lo, hi), by queue offset."""
    out: dict[int, bytes] = {}
    qo = lo
    while qo < hi:
        got = store.get_messages(TOPIC, q, qo, 32)
        for at, view in got:
            assert at not in out, f"queue offset {at} served twice"
            out[at] = bytes(view)
        qo = max([qo + 1] + [at + 1 for at, _ in got])
    return out


# --------------------------------------------------------------------------------------------------
# The property


@bounded(60)
@given(sc=scenarios())
def test_recovery_under_random_damage_serves_no_damage_and_keeps_the_intact_prefix(tmp_path_factory, sc):
    recover_damaged(tmp_path_factory, sc, dledger=False)


@bounded(30)
@given(sc=scenarios(dledger=True))
def test_dledger_recovery_under_random_damage_serves_no_damage_and_keeps_the_intact_prefix(tmp_path_factory, sc):
    """The same in DLedger mode: records inside entries, DLedger index files damaged too; after the
    reopen the group's next commit (made by the test) covers the member's whole recovered log."""
    recover_damaged(tmp_path_factory, sc, dledger=True)


def recover_damaged(tmp_path_factory, sc: dict, dledger: bool) -> None:
    root = tempfile.mkdtemp(prefix="prop-recovery-", dir=RAM_DIR) if RAM_DIR \
        else str(tmp_path_factory.mktemp("damage"))
    store = reopened = None
    try:
        store = MessageStore.open(_config(root, dledger))
        written = fill(store, sc)
        if sc["clean"]:
            store.close()
        else:
            crash(store)
        store = None
        before = cl_files(written.cl_dir)
        for damage in sc["damages"]:
            note(apply_damage(root, written, damage))
        damaged = cl_files(written.cl_dir)
        first_bad = first_changed(before, damaged)
        # entries whose bytes were changed (not cut or deleted: recovery sees those) are not rebuilt:
        # the read path finds their records, so what is served is checked, not the entries
        entries_damaged = any(d[0] in ("cq_flip", "cq_zero") for d in sc["damages"])
        note(f"first damaged CommitLog byte: {first_bad}")

        misfiled = refiled(written, damaged, sc["damages"])
        reopened = MessageStore.open(_config(root, dledger))
        note(f"recovery: {reopened.recovery}")
        # a DLedger member whose log's head is damaged gives up the entries before the next one from
        # which its log is whole, as retention gives them up (its group installs them): MIN moved
        head = reopened.ctl.get(C.POS_MIN) if any(r.startswith("DLedger log head damaged")
                                                   for r in reopened.recovery.repaired) else 0
        if dledger:
            # as a new leader does (mq.dledger.role _maybe_enable): its group commits the whole recovered
            # log, and once dispatch has reached the end the queue offsets go on from the queues
            reopened.cl.dledger_set_commit(reopened.ctl.get(C.POS_DL_NEXT_INDEX))
            assert reopened.wait_dispatched(timeout_s=3.0), "dispatch stopped"
            reopened.ctl.reset_next_offsets()
            reopened.cl.dledger_set_append_term(2)
            check_units(reopened, written, first_bad is not None)
        assert reopened.wait_dispatched(timeout_s=3.0), "dispatch stopped"
        served_all: dict[tuple[int, int], bytes] = {}
        for q in range(sc["queues"]):
            lo, hi = reopened.min_offset(TOPIC, q), reopened.max_offset(TOPIC, q)
            mine = {qo: v for (qq, qo), v in written.at.items() if qq == q}
            theirs = {qo: v for (qq, qo), v in misfiled.items() if qq == q}
            assert 0 <= lo <= hi <= max([len(mine)] + [qo + 1 for qo in theirs]), \
                f"queue {q} holds [{lo}, {hi}), {len(mine)} were written"
            got = served(reopened, q, lo, hi)
            served_all.update(((q, qo), b) for qo, b in got.items())
            # no damaged record is served (but the named limit of refiled())
            for qo, rec_bytes in got.items():
                if theirs.get(qo) == rec_bytes:
                    continue
                rec = wcl.parse_record(rec_bytes, check_crc=True)
                assert (rec.topic, rec.queue_id, rec.queue_offset) == (TOPIC, q, qo), \
                    f"queue {q} offset {qo} served a record of {rec.topic}:{rec.queue_id} offset {rec.queue_offset}"
                assert qo in mine, f"queue {q} offset {qo} was never written"
                differ = unchecked_differences(mine[qo][1], rec_bytes)
                assert not differ, f"queue {q} offset {qo}: the record served differs from the one written " \
                                   f"at bytes {differ[:16]}, which the format protects"
            # dense and unique: every entry in [lo, hi) points at the record written at that offset -- or,
            # when that record lies past the first damaged byte, is a hole's filler: a record whose queue
            # fields were damaged in range (nothing checks them but their use) is in no queue or another
            # (a queue rebuilt from a CommitLog whose first records the damage took may start after them)
            assert lo == 0 or first_bad is not None and all(
                phy + len(rec) > first_bad or phy < head for qo, (phy, rec) in mine.items() if qo < lo), \
                f"queue {q} starts at {lo}"
            cq = reopened.cqs.get(TOPIC, q)
            for qo in range(lo, hi):
                if qo in theirs and got.get(qo) == theirs[qo]:
                    continue
                entry = cq.get_raw(qo)
                phy, rec_bytes = mine[qo]
                hole_allowed = first_bad is not None and phy + len(rec_bytes) > first_bad or phy < head
                assert entries_damaged or entry is not None and (entry[:2] == (phy, len(rec_bytes)) or
                                                                 hole_allowed and entry == FILLER), \
                    f"queue {q} entry {qo} is {entry}, the record written there is at {phy}"
            # the intact prefix is kept (all of it when only ConsumeQueues were damaged)
            for qo, (phy, rec_bytes) in sorted(mine.items()):
                if (first_bad is None or phy + len(rec_bytes) <= first_bad) and phy >= head:
                    assert got.get(qo) == rec_bytes, \
                        f"queue {q} offset {qo} (at {phy}, before the first damaged byte {first_bad}) is lost"
        # the readers that hold an offset, not a queue position (the message index, an offset msgId:
        # read_filed), serve a record exactly where a pull of its queue serves it (below its queue's
        # first entry: not judged)
        by_phy = {int.from_bytes(b[wcl.POS_PHYSICAL_OFFSET:wcl.POS_PHYSICAL_OFFSET + 8], "big"): (at, b)
                  for at, b in served_all.items()}
        for phy in sorted({phy for phy, _ in written.at.values()} | set(by_phy)):
            try:
                v = bytes(reopened.read_filed(phy))
            except StoreError:
                assert phy not in by_phy, f"a pull serves the record at {phy} at {by_phy[phy][0]}, read_filed not"
                continue
            rec = wcl.parse_record(v, check_crc=True)
            if phy in by_phy:
                assert v == by_phy[phy][1], f"read_filed and a pull serve different bytes at {phy}"
            else:            # a queue not pulled above (refiled()'s limit: its queue fields, topic too, damaged)
                pulled = [(at, bytes(w)) for at, w in reopened.get_messages(rec.topic, rec.queue_id, rec.queue_offset, 1)]
                assert pulled == [(rec.queue_offset, v)] or \
                    rec.queue_offset < reopened.min_offset(rec.topic, rec.queue_id), \
                    f"read_filed serves the record at {phy} ({rec.topic}:{rec.queue_id} {rec.queue_offset}), no pull"
        # the store takes new messages and gives each the next queue offset, never one a record still in
        # the CommitLog (below the recovered end, as it was written) holds
        end = reopened.cl.write_pos

        def intact(phy: int, rec: bytes) -> bool:
            start = phy - phy % FS
            return damaged.get(start, b"")[phy - start:phy - start + len(rec)] == rec
        for q in range(sc["queues"]):
            hi = reopened.max_offset(TOPIC, q)
            held = [qo for (qq, qo), (phy, rec) in written.at.items()
                    if qq == q and phy + len(rec) <= end and intact(phy, rec)]
            r = put(reopened, q, b"after-%d" % q)
            assert r.queue_offset() == hi, f"queue {q}: new message at {r.queue_offset()}, max was {hi}"
            assert hi > max(held, default=-1), \
                f"queue {q}: new message at {hi}, but the CommitLog still holds that queue's offsets up to {max(held)}"
        assert reopened.wait_dispatched(timeout_s=3.0), "dispatch stopped"
        for q in range(sc["queues"]):
            hi = reopened.max_offset(TOPIC, q) - 1
            (at, view), = reopened.get_messages(TOPIC, q, hi, 1)
            assert wcl.parse_record(view, check_crc=True).body == b"after-%d" % q
    finally:
        # (the directory goes even when a close or the segment's removal raises: a random search left 40
        # store directories in /dev/shm once, while its examples failed in the open; cause not pinned down)
        try:
            for s in (store, reopened):
                if s is not None and s.ctl is not None and s.ctl.ptr is not None:
                    s.close()
            remove_segment(root)
        finally:
            shutil.rmtree(root, ignore_errors=True)


def check_units(store: MessageStore, written: Written, log_damaged: bool) -> None:
    """A DLedger member's entries as its index units give them (what a leader reads to catch a
    follower up): every entry it holds resolves to the entry written at that index -- position,
    size, term 1 (fill's) -- or, only when the log's bytes were damaged, is refused; never another
    entry's place.  fill() wrote one entry per record, so entry i holds the i-th record."""
    truth = [(phy - DL_HEADER_SIZE, DL_HEADER_SIZE + len(rec), 1) for phy, _, _, rec in written.records()]
    for i in range(store.ctl.get(C.POS_DL_BEGIN_INDEX), store.ctl.get(C.POS_DL_NEXT_INDEX)):
        try:
            got = store.cl.dledger_entry(i)
        except CorruptRecord:
            assert log_damaged, f"entry {i}: refused, but only index files were damaged"
            continue
        assert got == truth[i], f"entry {i}: its unit gives {got}, it was written as {truth[i]}"


def test_a_consume_queue_entry_damaged_in_the_middle_still_serves_its_message(tmp_path):
    """The ConsumeQueue half of "the intact prefix is kept": one queue of 100 messages in 32-entry
    files, a clean stop, one bit of entry 40's size flipped (the minimal example the property above
    found while it drew such damage).  Recovery checks a queue's tail entries, not every one, so the
    entry stays damaged; the read path finds its record between the records entries 39 and 41 name
    and serves it.  (Before: the message was skipped although its record was intact -- then a
    strict expected failure, and CQ_DAMAGE drew no flips or zeroed ranges.)"""
    root = str(tmp_path / "store")
    s = MessageStore.open(_config(root))
    try:
        written = fill(s, dict(queues=1, messages=100, body_size_max=8))
    finally:
        s.close()
    with open(os.path.join(root, "consumequeue", TOPIC, "0", "%020d" % (32 * 20)), "r+b") as f:
        f.seek((40 - 32) * 20 + 8 + 3)          # entry 40: phy (8 bytes), size (4, big-endian), tags code
        b = f.read(1)
        f.seek((40 - 32) * 20 + 8 + 3)
        f.write(bytes([b[0] ^ 4]))
    s = MessageStore.open(_config(root))
    try:
        assert [bytes(v) for _, v in s.get_messages(TOPIC, 0, 40, 1)] == [written.at[(0, 40)][1]]
    finally:
        s.close()


@pytest.mark.xfail(strict=True, reason="the v1 record has no checksum over FLAG, the timestamps, hosts, ports, "
                   "RECONSUMETIMES, PREPAREDTXOFFSET or the properties (BODYCRC covers the body): a flip there "
                   "passes every check recovery and the read path can make, and the record is served as it reads")
def test_a_record_whose_flag_byte_flipped_is_never_served(tmp_path):
    """The byte-for-byte half of "no damaged record is served", for a byte nothing checks: one message,
    a crash, bit 0 of its FLAG flipped (the minimal example the property above printed before its
    comparison learned unchecked_ranges).  Strict: once a checksum covers the whole record this passes,
    and the marker (and unchecked_ranges) must go."""
    root = str(tmp_path / "store")
    s = MessageStore.open(_config(root))
    try:
        res = s.put(TOPIC, 0, b"m00000-").result
        assert s.wait_dispatched()
        written = bytes(s.cl.read_record(res.phy_offset(), res.size()))
    finally:
        crash(s)
    with open(os.path.join(root, "commitlog", "%020d" % 0), "r+b") as f:
        f.seek(res.phy_offset() + wcl.POS_FLAG)
        b = f.read(1)
        f.seek(res.phy_offset() + wcl.POS_FLAG)
        f.write(bytes([b[0] ^ 1]))
    s = MessageStore.open(_config(root))
    try:
        assert [bytes(v) for _, v in s.get_messages(TOPIC, 0, 0, 1)] in ([], [written])
    finally:
        s.close()
