"""`mqdump dledger`: lists a DLedger member's entries through mq.wire (not mq.store) and flags
damaged, torn and inconsistent ones with the right exit code."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from mq.store import control as C
from mq.store.commitlog import CommitLog

FS = 64 * 1024
IFS = 32 * 1024


def make_member(root: str, n: int) -> tuple[str, CommitLog, C.ControlBlock]:
    d = os.path.join(root, "dledger-n0")
    ctl = C.ControlBlock(root, FS, create=True)
    cl = CommitLog(os.path.join(d, "data"), ctl, FS, dledger=True, index_dir=os.path.join(d, "index"),
                   index_file_size=IFS)
    cl.dledger_set_append_term(2)
    for i in range(n):
        cl.append("DumpTopic", i % 2, b"message %d " % i + b"x" * (i % 900), b"KEYS\x01k%d" % i)
    with open(os.path.join(d, "checkpoint"), "w") as f:
        f.write("endIndex=%d\ncommittedIndex=%d\n" % (n - 1, n - 2))
    return d, cl, ctl


def mqdump(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mq.tools.mqdump", *args], capture_output=True, text=True,
                          timeout=60)


def test_lists_every_entry_with_its_record(tmp_path):
    """A clean member: every entry (index, term, pos) with the record inside and its msgId, the
    checkpoint shown, index units checked, exit 0; a store root finds its dledger-* directory."""
    d, cl, ctl = make_member(str(tmp_path), 300)
    try:
        r = mqdump("dledger", str(tmp_path), "--json")
        assert r.returncode == 0, r.stderr
        lines = [json.loads(x) for x in r.stdout.splitlines()]
        entries = [x for x in lines if x["kind"] == "entry"]
        assert [e["index"] for e in entries] == list(range(300))
        assert all(e["term"] == 2 and e["phy_offset"] == e["pos"] + 48 and e["index_unit_ok"] for e in entries)
        assert entries[5]["properties"]["KEYS"] == "k5" and entries[5]["topic"] == "DumpTopic"
        assert any(x["kind"] == "blank" for x in lines)
        assert {"kind": "checkpoint", "endIndex": 299, "committedIndex": 298} in lines
        assert lines[-1]["kind"] == "summary" and lines[-1]["entries"] == 300 and lines[-1]["problems"] == 0
        text = mqdump("dledger", d, "--limit", "2")
        assert text.returncode == 0 and "#1 term=2" in text.stdout and "stopped at --limit" in text.stdout
    finally:
        cl.close()
        ctl.close()


def test_flags_a_damaged_entry_a_torn_tail_and_a_wrong_index_unit(tmp_path):
    """Exit 1 with the position named: a flipped record byte (CRC), then a torn last entry (zero
    bytes after), then an index unit that disagrees with its entry."""
    d, cl, ctl = make_member(str(tmp_path), 40)
    try:
        pos10, _, _ = cl.dledger_entry(10)
        mv = cl.view_raw(pos10 + 48 + 100, 1)
        mv[0] ^= 0xFF
        r = mqdump("dledger", d)
        assert r.returncode == 1 and f"@{pos10}" in r.stdout and "bad_entry" in r.stdout
        mv[0] ^= 0xFF
        pos39, size39, _ = cl.dledger_entry(39)
        cl.view_raw(pos39 + 60, size39 - 60)[:] = bytes(size39 - 60)
        r = mqdump("dledger", d)
        assert r.returncode == 1 and "(torn)" in r.stdout and f"@{pos39}" in r.stdout
        ipath = os.path.join(d, "index", "%020d" % 0)
        with open(ipath, "r+b") as f:
            f.seek(7 * 32 + 4)
            f.write((12345).to_bytes(8, "big"))
        r = mqdump("dledger", d)
        assert "index_mismatch" in r.stdout and "entry 7's index unit" in r.stdout
    finally:
        cl.close()
        ctl.close()


def test_refuses_a_path_without_dledger_files(tmp_path):
    r = mqdump("dledger", str(tmp_path))
    assert r.returncode == 2 and "no DLedger data directory" in r.stderr
