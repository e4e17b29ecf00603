"""Tests for mqdump (tools/mqdump.py, installed as mq.tools.mqdump and the `mqdump` console script).

The store under test is written by the real C code (mq.store.MessageStore) with 64 KiB CommitLog files, so
files roll and end with BLANK fillers. mqdump decodes only through mq.wire, so these tests also cross-check
the C writer against the Python declarations. Damage is done to copies, never to the shared store.
Each test's docstring states what it proves.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import random
import shutil
import struct
import subprocess
import sys

import pytest

from mq.store import MessageStore, StoreConfig
from mq.tools.mqdump import main
from mq.wire import (
    COMPRESSED,
    TRANSACTION_PREPARED,
    build_blank,
    build_record,
    encode_properties,
    java_string_hashcode,
)

FILE_SIZE = 64 * 1024
TOPICS = (("TopicA", 4), ("TopicB", 2))
MESSAGES = 320


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A closed store with MESSAGES messages of varying sizes in two topics; returns (root, expected), where
    expected lists per message, in append order: topic, queue_id, queue_offset, phy_offset, size, msg_id,
    store timestamp, body and properties."""
    root = tmp_path_factory.mktemp("mqdump") / "s"
    cfg = StoreConfig(storePathRootDir=str(root), mappedFileSizeCommitLog=FILE_SIZE)
    s = MessageStore.open(cfg)
    rng = random.Random(20240611)
    expected = []
    try:
        for i in range(MESSAGES):
            topic, nqueues = TOPICS[i % 3 == 2]
            qid = rng.randrange(nqueues)
            body = (f"message {i} ".encode() + bytes(rng.randrange(256) for _ in range(rng.randrange(1, 1500))))
            props = {"TAGS": f"Tag{i % 3}", "KEYS": f"key-{i}"}
            if i % 7 == 0:
                props["note"] = "h\u00e9llo w\u00f6rld = spaced"
            res = s.put(topic, qid, body, encode_properties(props))
            assert res.ok, res
            r = res.result
            expected.append({
                "topic": topic, "queue_id": qid, "queue_offset": r.queue_offset(), "phy_offset": r.phy_offset(),
                "size": r.size(), "msg_id": r.msg_id(), "store_timestamp_ms": r.store_ts_ms(), "body": body,
                "properties": props,
            })
        assert s.wait_dispatched()
    finally:
        s.close()
    assert len(os.listdir(root / "commitlog")) >= 3, "the store must roll over several files"
    return root, expected


def run(capsys, *args):
    """main(args) in-process: (exit code, stdout, stderr)."""
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return code, captured.out, captured.err


def run_json(capsys, *args):
    code, out, err = run(capsys, *args, "--json")
    objs = [json.loads(line) for line in out.splitlines()]
    assert objs and objs[-1]["kind"] == "summary"
    return code, objs, err


def of_kind(objs, kind):
    return [o for o in objs if o["kind"] == kind]


def copy_store(store, tmp_path):
    root, expected = store
    dst = tmp_path / "copy"
    shutil.copytree(root, dst)
    return dst, expected


def cl_file(root, start):
    return root / "commitlog" / ("%020d" % start)


def flip_byte(path, pos, mask=0x40):
    with open(path, "r+b") as f:
        f.seek(pos)
        b = f.read(1)[0]
        f.seek(pos)
        f.write(bytes([b ^ mask]))


# ---------------------------------------------------------------------------------------------------
# A healthy store written by the C core


def test_commitlog_lists_exactly_the_stored_messages(store, capsys):
    """On a store written by the C code, --json lists every message once, in append order, with the topic,
    queueId, queueOffset, physical offset, size, msgId, store time, body and properties the store reported;
    every CRC is ok, every file but the active one ends in a BLANK filler reaching the file end; exit 0."""
    root, expected = store
    code, objs, err = run_json(capsys, "commitlog", root)
    assert code == 0, err
    assert err == ""
    records = of_kind(objs, "record")
    assert len(records) == len(expected)
    for rec, exp in zip(records, expected):
        assert rec["topic"] == exp["topic"]
        assert rec["queue_id"] == exp["queue_id"]
        assert rec["queue_offset"] == exp["queue_offset"]
        assert rec["phy_offset"] == exp["phy_offset"]
        assert rec["size"] == exp["size"]
        assert rec["msg_id"] == exp["msg_id"]
        assert rec["store_timestamp_ms"] == exp["store_timestamp_ms"]
        assert base64.b64decode(rec["body_base64"]) == exp["body"]
        assert rec["body_length"] == len(exp["body"])
        assert rec["properties"] == exp["properties"]
        assert rec["crc"] == "ok"
        assert rec["store_host"].endswith(":10911")
        assert rec["store_time"].endswith("Z")
    assert {r["topic"] for r in records} == {"TopicA", "TopicB"}
    blanks = of_kind(objs, "blank")
    assert blanks, "64 KiB files must have rolled with BLANK fillers"
    for b in blanks:
        assert (b["phy_offset"] + b["size"]) % FILE_SIZE == 0, b
    nfiles = len(os.listdir(root / "commitlog"))
    summary = objs[-1]
    assert summary["records"] == len(expected)
    assert summary["record_bytes"] == sum(e["size"] for e in expected)
    assert summary["blanks"] == len(blanks)
    assert summary["files"] == nfiles
    assert summary["problems"] == 0
    assert summary["end_offset"] == expected[-1]["phy_offset"] + expected[-1]["size"]
    assert len(of_kind(objs, "file")) == nfiles


def test_commitlog_text_output(store, capsys):
    """The text form prints one line per record with its absolute offset, topic, queue offset, CRC verdict,
    msgId and decoded properties, a line per BLANK filler, and a summary line; exit 0 and nothing on stderr."""
    root, expected = store
    code, out, err = run(capsys, "commitlog", root)
    assert code == 0 and err == ""
    lines = out.splitlines()
    record_lines = [l for l in lines if " topic=" in l]
    assert len(record_lines) == len(expected)
    first, exp = record_lines[0], expected[0]
    assert first.startswith(f"@{exp['phy_offset']} size={exp['size']} topic={exp['topic']} qid={exp['queue_id']}")
    assert "crc=ok" in first and f"msgId={exp['msg_id']}" in first and "TAGS=Tag0" in first
    assert '"héllo wörld = spaced"' in first  # a value with spaces and '=' is quoted
    assert any("BLANK filler" in l for l in lines)
    assert lines[-1].startswith(f"summary: {len(expected)} records, ")
    assert "0 problems" in lines[-1]


def test_commitlog_dir_and_single_file_inputs(store, capsys):
    """PATH may be the commitlog directory or one file; a single file that starts at a non-zero offset
    gets absolute offsets from its name and ends with its BLANK filler."""
    root, expected = store
    code, objs, _ = run_json(capsys, "commitlog", root / "commitlog")
    assert code == 0 and len(of_kind(objs, "record")) == len(expected)

    code, objs, _ = run_json(capsys, "commitlog", cl_file(root, FILE_SIZE))
    assert code == 0
    in_file = [e for e in expected if FILE_SIZE <= e["phy_offset"] < 2 * FILE_SIZE]
    records = of_kind(objs, "record")
    assert [r["phy_offset"] for r in records] == [e["phy_offset"] for e in in_file]
    assert records[0]["phy_offset"] == FILE_SIZE
    assert len(of_kind(objs, "blank")) == 1 and objs[-1]["files"] == 1


def test_from_and_limit(store, capsys):
    """--from starts at an absolute record offset (also inside a later file) and --limit caps the number of
    records printed; together they select exactly the expected slice."""
    root, expected = store
    k = len(expected) // 2
    code, objs, _ = run_json(capsys, "commitlog", root, "--from", expected[k]["phy_offset"])
    assert code == 0
    assert [r["phy_offset"] for r in of_kind(objs, "record")] == [e["phy_offset"] for e in expected[k:]]

    code, objs, _ = run_json(capsys, "commitlog", root, "--limit", 5)
    assert code == 0
    assert [r["phy_offset"] for r in of_kind(objs, "record")] == [e["phy_offset"] for e in expected[:5]]
    assert objs[-1]["limited"] is True and objs[-1]["records"] == 5

    code, objs, _ = run_json(capsys, "commitlog", root, "--from", expected[k]["phy_offset"], "--limit", 3)
    assert [r["queue_offset"] for r in of_kind(objs, "record")] == [e["queue_offset"] for e in expected[k:k + 3]]

    code, out, _ = run(capsys, "commitlog", root, "--limit", 0)
    assert code == 0 and " topic=" not in out


def test_from_off_a_record_boundary_or_outside_the_log(store, capsys):
    """--from in the middle of a record is reported as a bad magic at that offset (exit 1), with a hint;
    --from beyond every file is a usage error (exit 2) naming the files' ranges."""
    root, expected = store
    off = expected[3]["phy_offset"] + 5
    code, objs, err = run_json(capsys, "commitlog", root, "--from", off)
    assert code == 1
    problems = of_kind(objs, "problem")
    assert problems[0]["phy_offset"] == off and problems[0]["problem"] == "bad_magic"
    assert "record boundary" in err

    code, out, err = run(capsys, "commitlog", root, "--from", 10**12)
    assert code == 2 and "is in none of the files" in err and out == ""


def test_consumequeue_entries_point_at_the_records(store, capsys):
    """`consumequeue consumequeue/TopicA/0` lists that queue's entries in order with queue offsets 0..n-1,
    each pointing (offset, size) at the CommitLog record of that queue offset, with the TAGS hashCode as
    tagsCode; it stops at the all-zero end entry; exit 0."""
    root, expected = store
    code, objs, _ = run_json(capsys, "commitlog", root)
    by_phy = {r["phy_offset"]: r for r in of_kind(objs, "record")}
    code, objs, err = run_json(capsys, "consumequeue", root / "consumequeue" / "TopicA" / "0")
    assert code == 0, err
    entries = of_kind(objs, "entry")
    exp = [e for e in expected if e["topic"] == "TopicA" and e["queue_id"] == 0]
    assert len(entries) == len(exp) > 0
    assert [e["queue_offset"] for e in entries] == list(range(len(exp)))
    for entry, e in zip(entries, exp):
        assert (entry["commitlog_offset"], entry["size"]) == (e["phy_offset"], e["size"])
        rec = by_phy[entry["commitlog_offset"]]
        assert (rec["topic"], rec["queue_id"], rec["queue_offset"]) == ("TopicA", 0, entry["queue_offset"])
        assert entry["tags_code"] == java_string_hashcode(e["properties"]["TAGS"])
    assert of_kind(objs, "end")[0]["queue_offset"] == len(exp)
    assert objs[-1]["entries"] == len(exp) and objs[-1]["problems"] == 0


def test_consumequeue_store_root_from_and_limit(store, capsys):
    """On a store root every topic/queue is listed (the entries add up to every message); --from N starts
    each queue at queue offset N; --limit caps the entries printed; the file path form works too."""
    root, expected = store
    code, objs, _ = run_json(capsys, "consumequeue", root)
    assert code == 0
    queues = {(q["topic"], q["queue_id"]) for q in of_kind(objs, "queue")}
    assert queues == {(e["topic"], e["queue_id"]) for e in expected}
    assert len(of_kind(objs, "entry")) == len(expected)

    code, objs, _ = run_json(capsys, "consumequeue", root, "--from", 10)
    entries = of_kind(objs, "entry")
    assert entries and min(e["queue_offset"] for e in entries) == 10
    assert len(entries) == sum(1 for e in expected if e["queue_offset"] >= 10)

    code, objs, _ = run_json(capsys, "consumequeue", root, "--limit", 7)
    assert code == 0 and len(of_kind(objs, "entry")) == 7 and objs[-1]["limited"] is True

    qfile = root / "consumequeue" / "TopicB" / "1" / ("%020d" % 0)
    code, out, _ = run(capsys, "consumequeue", qfile)
    n = sum(1 for e in expected if (e["topic"], e["queue_id"]) == ("TopicB", 1))
    assert code == 0 and out.count(" phy=") == n and "queue TopicB/1" in out


def test_dump_while_the_store_is_open(tmp_path, capsys):
    """mqdump reads a store whose owner process has it open (lock held, files mapped): it takes no lock,
    lists every record written so far and exits 0; the files' bytes are unchanged by the dump."""
    cfg = StoreConfig(storePathRootDir=str(tmp_path / "s"), mappedFileSizeCommitLog=FILE_SIZE)
    s = MessageStore.open(cfg)
    try:
        for i in range(150):
            assert s.put("Live", i % 2, b"x" * (100 + 7 * i), encode_properties({"TAGS": "T"})).ok
        assert s.wait_dispatched()
        digests = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in (tmp_path / "s" / "commitlog").iterdir()}
        code, objs, _ = run_json(capsys, "commitlog", tmp_path / "s")
        assert code == 0 and objs[-1]["records"] == 150
        code, objs, _ = run_json(capsys, "consumequeue", tmp_path / "s")
        assert code == 0 and objs[-1]["entries"] == 150
        assert digests == {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in digests}
    finally:
        s.close()


# ---------------------------------------------------------------------------------------------------
# Damaged and wrong inputs


def test_garbage_file(tmp_path, capsys):
    """Random bytes under a CommitLog name are 'not a CommitLog': exit 2, one clear stderr line naming the
    file, no traceback."""
    path = tmp_path / ("%020d" % 0)
    path.write_bytes(random.Random(1).randbytes(FILE_SIZE))
    code, out, err = run(capsys, "commitlog", path)
    assert code == 2
    assert len(err.splitlines()) == 1 and str(path) in err and "not a CommitLog" in err
    code, objs, _ = run_json(capsys, "commitlog", path)
    assert code == 2 and of_kind(objs, "problem")[0]["problem"] == "not_commitlog"


def test_truncated_commitlog_file_reports_a_torn_record(store, tmp_path, capsys):
    """A CommitLog file cut in the middle of a record (here the second file, so offsets are not file
    positions) lists the records before the cut and reports a torn/incomplete tail at the absolute offset of
    the cut record; exit 1, one stderr line."""
    root, expected = store
    in_file = [e for e in expected if FILE_SIZE <= e["phy_offset"] < 2 * FILE_SIZE]
    victim = in_file[len(in_file) // 2]
    cut = victim["phy_offset"] - FILE_SIZE + victim["size"] // 2
    path = tmp_path / ("%020d" % FILE_SIZE)
    path.write_bytes(cl_file(root, FILE_SIZE).read_bytes()[:cut])
    code, objs, err = run_json(capsys, "commitlog", path)
    assert code == 1
    assert [r["phy_offset"] for r in of_kind(objs, "record")] == [
        e["phy_offset"] for e in in_file if e["phy_offset"] < victim["phy_offset"]]
    (problem,) = of_kind(objs, "problem")
    assert problem["problem"] == "torn" and problem["phy_offset"] == victim["phy_offset"]
    assert "torn/incomplete tail" in problem["message"]
    assert len(err.splitlines()) == 1 and f"@{victim['phy_offset']}" in err


def test_flipped_body_byte_is_a_crc_mismatch(store, tmp_path, capsys):
    """One flipped body byte in a record in the middle of the log is a CRC mismatch at that record's
    absolute offset (exit 1); the walk stops in that file and resumes in the next one; --no-crc accepts it."""
    root, expected = copy_store(store, tmp_path)
    victim = next(e for e in expected if e["phy_offset"] > FILE_SIZE + 1000)
    start = victim["phy_offset"] - victim["phy_offset"] % FILE_SIZE
    flip_byte(cl_file(root, start), victim["phy_offset"] - start + 88 + len(victim["body"]) // 2)
    code, objs, err = run_json(capsys, "commitlog", root)
    assert code == 1
    (problem,) = of_kind(objs, "problem")
    assert problem["problem"] == "bad_crc" and problem["phy_offset"] == victim["phy_offset"]
    assert problem["record"]["crc"] == "BAD" and problem["record"]["queue_offset"] == victim["queue_offset"]
    listed = [r["phy_offset"] for r in of_kind(objs, "record")]
    assert victim["phy_offset"] not in listed
    assert listed == [e["phy_offset"] for e in expected
                      if not start <= e["phy_offset"] < start + FILE_SIZE or e["phy_offset"] < victim["phy_offset"]]
    assert "BODYCRC" in err

    code, objs, _ = run_json(capsys, "commitlog", root, "--no-crc")
    assert code == 0 and objs[-1]["records"] == len(expected)
    assert {r["crc"] for r in of_kind(objs, "record")} == {"unchecked"}


def test_half_written_last_record_is_a_torn_tail(store, tmp_path, capsys):
    """The last record with its second half still zero (what a reader sees while the broker is writing it,
    or after a crash mid-write) in a preallocated file is reported as a torn/incomplete tail at its offset,
    exit 1; everything before it is listed."""
    root, expected = copy_store(store, tmp_path)
    last = expected[-1]
    start = last["phy_offset"] - last["phy_offset"] % FILE_SIZE
    path = cl_file(root, start)
    data = bytearray(path.read_bytes())
    pos = last["phy_offset"] - start
    data[pos + last["size"] // 2: pos + last["size"]] = bytes(last["size"] - last["size"] // 2)
    path.write_bytes(bytes(data))
    code, objs, err = run_json(capsys, "commitlog", root)
    assert code == 1
    (problem,) = of_kind(objs, "problem")
    assert problem["problem"] == "torn" and problem["phy_offset"] == last["phy_offset"]
    assert objs[-1]["records"] == len(expected) - 1


def test_renamed_file_is_a_physical_offset_mismatch(store, tmp_path, capsys):
    """A CommitLog file under the wrong 20-digit name fails the PHYSICALOFFSET check at its first record,
    and the message says which name the records imply; exit 1."""
    root, _ = store
    path = tmp_path / ("%020d" % 0)
    shutil.copy(cl_file(root, FILE_SIZE), path)
    code, objs, err = run_json(capsys, "commitlog", path)
    assert code == 1
    (problem,) = of_kind(objs, "problem")
    assert problem["problem"] == "bad_phy_offset" and problem["phy_offset"] == 0
    assert "%020d" % FILE_SIZE in problem["message"]


def test_file_name_not_an_offset_assumes_zero(store, tmp_path, capsys):
    """A file whose name is not 20 digits is read as starting at offset 0, and mqdump says so on stderr."""
    root, expected = store
    path = tmp_path / "segment.bin"
    shutil.copy(cl_file(root, 0), path)
    code, objs, err = run_json(capsys, "commitlog", path)
    assert code == 0
    assert "assuming start offset 0" in err
    assert of_kind(objs, "file")[0]["start_assumed"] is True
    assert [r["phy_offset"] for r in of_kind(objs, "record")] == [
        e["phy_offset"] for e in expected if e["phy_offset"] < FILE_SIZE]


def test_missing_blank_filler_is_a_hole(store, tmp_path, capsys):
    """A file whose BLANK filler was zeroed ends 'cleanly' while later files hold data: that is a hole
    (recovery would drop everything after it), reported at the filler's offset, exit 1."""
    root, expected = copy_store(store, tmp_path)
    code, objs, _ = run_json(capsys, "commitlog", root)
    blank = of_kind(objs, "blank")[0]
    path = cl_file(root, blank["phy_offset"] - blank["phy_offset"] % FILE_SIZE)
    with open(path, "r+b") as f:
        f.seek(blank["phy_offset"] % FILE_SIZE)
        f.write(bytes(8))
    code, objs, _ = run_json(capsys, "commitlog", root)
    assert code == 1
    (problem,) = of_kind(objs, "problem")
    assert problem["problem"] == "hole" and problem["phy_offset"] == blank["phy_offset"]
    assert objs[-1]["records"] == len(expected)


def test_empty_directory_missing_path_and_usage_errors(tmp_path, capsys):
    """An empty directory, a nonexistent path and bad arguments are exit 2 with a one-line message
    (argparse usage for the last), for both subcommands."""
    (tmp_path / "empty").mkdir()
    for cmd in ("commitlog", "consumequeue"):
        code, out, err = run(capsys, cmd, tmp_path / "empty")
        assert code == 2 and out == "" and str(tmp_path / "empty") in err and len(err.splitlines()) == 1
        code, out, err = run(capsys, cmd, tmp_path / "nope")
        assert code == 2 and "no such file or directory" in err
    code, _, err = run(capsys)
    assert code == 2 and "usage:" in err
    code, _, err = run(capsys, "commitlog", tmp_path, "--limit", "-3")
    assert code == 2 and "--limit" in err
    code, _, err = run(capsys, "frobnicate", tmp_path)
    assert code == 2


def test_consumequeue_truncated_filler_and_bad_entries(tmp_path, capsys):
    """In a hand-built queue directory: a run of filler entries (0, 0x7FFFFFFF, 0) is reported as one filler
    item with its queue offsets; a file whose size is not a multiple of 20 is 'truncated' at the queue
    offset of the partial entry (exit 1); an entry with a negative offset stops the queue as 'bad_entry'."""
    qdir = tmp_path / "consumequeue" / "T" / "3"
    qdir.mkdir(parents=True)
    filler = struct.pack(">qiq", 0, 0x7FFFFFFF, 0)
    entries = [struct.pack(">qiq", 1000 + 200 * i, 150, 7) for i in range(4)]
    (qdir / ("%020d" % 100)).write_bytes(filler * 3 + b"".join(entries) + b"\x01\x02\x03")
    code, objs, err = run_json(capsys, "consumequeue", tmp_path)
    assert code == 1
    (fill,) = of_kind(objs, "filler")
    assert (fill["queue_offset"], fill["count"]) == (5, 3)
    assert [e["queue_offset"] for e in of_kind(objs, "entry")] == [8, 9, 10, 11]
    assert [e["commitlog_offset"] for e in of_kind(objs, "entry")] == [1000, 1200, 1400, 1600]
    (problem,) = of_kind(objs, "problem")
    assert problem["problem"] == "truncated" and problem["queue_offset"] == 12
    assert "not a multiple of 20" in err

    (qdir / ("%020d" % 100)).write_bytes(entries[0] + struct.pack(">qiq", -5, 10, 0) + entries[1] + bytes(20))
    code, objs, _ = run_json(capsys, "consumequeue", qdir)
    assert code == 1
    assert [e["queue_offset"] for e in of_kind(objs, "entry")] == [5]
    assert of_kind(objs, "problem")[0]["problem"] == "bad_entry"

    (qdir / ("%020d" % 100)).write_bytes(b"".join(entries) + bytes(40))
    code, objs, _ = run_json(capsys, "consumequeue", qdir)
    assert code == 0 and of_kind(objs, "end")[0]["queue_offset"] == 9


def test_synthetic_ipv6_records_and_flag_names(tmp_path, capsys):
    """Records built by mq.wire.build_record (IPv6 born/store hosts, COMPRESSED and TX_PREPARED sysFlag bits,
    a non-UTF-8 body) followed by a BLANK are decoded: hosts print as [addr]:port, flag names are listed,
    the msgId is the 56-hex-digit IPv6 form, a binary body has no body_utf8; exit 0."""
    start = 3 * FILE_SIZE
    body = bytes(range(256))
    rec = build_record(body=body, topic="T6", properties={"TAGS": "x"}, queue_id=2, queue_offset=9,
                       physical_offset=start, sys_flag=COMPRESSED | TRANSACTION_PREPARED,
                       born_host="fe80::1", born_port=5555, store_host="2001:db8::7", store_port=10911,
                       store_timestamp_ms=1_700_000_000_123)
    data = rec + build_blank(1024 - len(rec))
    (tmp_path / ("%020d" % start)).write_bytes(data + bytes(1024 - len(data)))
    code, objs, err = run_json(capsys, "commitlog", tmp_path)
    assert code == 0, err
    (r,) = of_kind(objs, "record")
    assert r["born_host"] == "[fe80::1]:5555" and r["store_host"] == "[2001:db8::7]:10911"
    assert r["sys_flag_names"] == ["COMPRESSED", "TX_PREPARED", "BORNHOST_V6", "STOREHOST_V6"]
    assert len(r["msg_id"]) == 56 and r["body_utf8"] is None and r["crc"] == "ok"
    assert r["store_time"] == "2023-11-14T22:13:20.123Z"
    assert of_kind(objs, "blank")[0]["phy_offset"] == start + len(rec)

    (tmp_path / ("%020d" % start)).write_bytes(data)  # the BLANK now claims more than the file holds
    code, objs, err = run_json(capsys, "commitlog", tmp_path)
    assert code == 1 and of_kind(objs, "problem")[0]["problem"] == "bad_blank" and "file truncated?" in err


def test_unexpected_error_is_one_line_naming_the_file(store, monkeypatch, capsys):
    """An exception nobody foresaw (simulated inside the decoder) still ends in one stderr line that names
    the file being read and exit 2, not a traceback."""
    import mq.tools.mqdump as mqdump

    def boom(*a, **kw):
        raise RuntimeError("boom")

    monkeypatch.setattr(mqdump, "parse_record", boom)
    root, _ = store
    code, _, err = run(capsys, "commitlog", root)
    assert code == 2
    assert err.splitlines() == [f"mqdump: internal error while reading {cl_file(root, 0)}: RuntimeError: boom"]


def test_unreadable_file_is_exit_2(store, tmp_path, monkeypatch, capsys):
    """A CommitLog file that cannot be opened (permission denied; simulated, since root may open anything)
    is reported as unreadable with exit 2 and one stderr line naming it; the walk goes on to the next file."""
    import mq.tools.mqdump as mqdump

    root, expected = store
    victim = str(cl_file(root, 0))
    real_open = os.open

    def guarded_open(path, *a, **kw):
        if str(path) == victim:
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *a, **kw)

    monkeypatch.setattr(mqdump.os, "open", guarded_open)
    code, objs, err = run_json(capsys, "commitlog", root)
    assert code == 2
    (problem,) = of_kind(objs, "problem")
    assert problem["problem"] == "unreadable" and problem["file"] == victim
    assert err.splitlines() == [f"mqdump: {victim}: cannot read: Permission denied"]
    assert objs[-1]["records"] == sum(1 for e in expected if e["phy_offset"] >= FILE_SIZE)


# ---------------------------------------------------------------------------------------------------
# The installed console script


def _console_script():
    path = os.path.join(os.path.dirname(sys.executable), "mqdump")
    if not os.path.exists(path):
        pytest.fail(f"{path} missing: run `pip install -e .` so the mqdump console script is installed")
    return path


def test_console_script(store, tmp_path):
    """The installed `mqdump` console script runs as its own process: it dumps the store as JSON lines with
    exit 0, and on a garbage file exits non-zero with one stderr line and no traceback."""
    root, expected = store
    proc = subprocess.run([_console_script(), "commitlog", str(root), "--json"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    objs = [json.loads(line) for line in proc.stdout.splitlines()]
    assert objs[-1] == {**objs[-1], "kind": "summary", "records": len(expected), "problems": 0}

    proc = subprocess.run([_console_script(), "consumequeue", str(root)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout.splitlines()[-1].startswith(f"summary: {len(expected)} entries")

    garbage = tmp_path / ("%020d" % 0)
    garbage.write_bytes(b"\xde\xad\xbe\xef" * 1000)
    proc = subprocess.run([_console_script(), "commitlog", str(garbage)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode in (1, 2)
    assert "Traceback" not in proc.stderr and len(proc.stderr.splitlines()) == 1 and str(garbage) in proc.stderr

    proc = subprocess.run([_console_script(), "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "commitlog" in proc.stdout
