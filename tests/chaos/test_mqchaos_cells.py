"""The CI subset of the fault matrix (every mode and every nemesis at least once; `none` in the CLI
test; a cell of the transactional workload): mqchaos cells against real processes, each showing its
promise holding (RELIABILITY.md: a process fault loses no acknowledged message, and nothing is
unexpected, duplicated or reordered; a byte-level fault never gets a damaged message served, a
queue offset used twice or an acknowledgement naming another message's place) with the fault
really injected and the cluster really serving before and after it."""
import pytest

from mq.chaos.run import HOST_NEMESES, SUFFIX_LOSS_ALLOWED, main, matrix_table, run_cell
from mq.hosts import unavailable as hosts_unavailable

CELLS = [("sync", "kill", 8.0), ("async", "pause", 6.0), ("dledger", "kill", 10.0),
         ("async", "powerloss", 8.0), ("sync_master", "partition", 8.0), ("sync", "diskfull", 8.0),
         # the take-back: the power loss that used to lose an acknowledged tail
         ("sync_master", "powerloss", 8.0), ("dledger", "clock", 8.0),
         # so that every mode and every nemesis is in CI at least once
         ("async_master", "namesrv", 6.0), ("sync_master_sync_flush", "kill", 8.0),
         # byte-level: damage at rest found at the restart (a lone broker truncates; a SYNC_MASTER
         # takes its tail back from the slave), a cut file, a lost ConsumeQueue, hostile requests
         ("async", "corrupt", 8.0), ("sync_master_sync_flush", "truncate", 8.0), ("dledger", "cqloss", 8.0),
         ("sync", "hostile", 6.0)]


@pytest.mark.parametrize("mode,nemesis,seconds", CELLS, ids=[f"{m}-{n}" for m, n, _ in CELLS])
def test_cell_keeps_its_promise(tmp_path, mode, nemesis, seconds):
    r = run_cell(mode, nemesis, seconds, str(tmp_path))
    assert r["valid"], r
    assert r["damaged_served"] == r["offset_reused"] == r["wrong_ack"] == 0, r
    if nemesis == "hostile":                         # no fault: clients that must be refused, all run long
        h = r["hostile"]
        assert h["requests"] > 100 and h["accepted"] == 0 and h["refused"] >= h["requests"] - h["unanswered"], h
        assert r["acked"] > 100 and r["read"] == r["acked"] and r["lost"] == 0, r
        return
    assert r["faults"] >= 1, r
    if (mode, nemesis) in SUFFIX_LOSS_ALLOWED:       # power loss may take the unflushed tail
        assert r["acked"] > 100 and r["read"] >= r["acked"] - r["lost"], r
    else:
        # byte-level faults may cost the damaged messages (never served), and a lone broker what
        # followed them in its log; nothing else
        assert r["acked"] > 100 and r["lost"] == 0, r
        assert r["read"] >= r["acked"] - r["expired"] - r["damaged"] - r["cut"], r
        if mode not in ("async", "sync", "async_master"):
            assert r["cut"] == 0, r
    first_recovery = r["recovery_s"][0][1]
    # recovered after the first fault: a failover (dledger) or the fault's 2 s plus a restart
    assert first_recovery is not None and first_recovery < 20, r


def test_cli_prints_the_verdict_and_refuses_bad_arguments(capsys, tmp_path):
    assert main(["run", "--mode", "async", "--nemesis", "none", "--seconds", "2", "--dir", str(tmp_path),
                 "--json"]) == 0
    out = capsys.readouterr().out
    assert '"valid": true' in out and '"lost": 0' in out
    with pytest.raises(SystemExit) as e:
        main(["run", "--mode", "async", "--nemesis", "none", "--seconds", "0"])
    assert e.value.code == 2


def test_matrix_table():
    """The report's table: one row per mode that ran, a cell per nemesis (– where none ran)."""
    ok = {"valid": True, "acked": 10, "lost": 0, "duplicated": 0, "reordered": 0, "unexpected": 0,
          "max_unavailable_s": 2.04}
    table = matrix_table([{"mode": "sync", "nemesis": "kill", **ok},
                          {"mode": "sync", "nemesis": "pause", **ok, "valid": False, "duplicated": 2},
                          {"mode": "dledger", "nemesis": "kill", "valid": False, "error": "RuntimeError: boom"}], 10)
    rows = [line for line in table.splitlines() if line.startswith("| ")]
    assert rows[0] == "| mode | kill | pause |"
    assert rows[1] == "| sync | ✔ 10 / 0 / 2.0 s | ✘ 10 / 0, 2 duplicated / 2.0 s |"
    assert rows[2] == "| dledger | ✘ RuntimeError: boom | – |"


# one transactional cell in CI (~17 s: a DLedger failover with halves pending); sync_master
# powerloss, dledger pause and partition, async and sync_master kill held when run by hand
TX_CELLS = [("dledger", "kill", 10.0)]


@pytest.mark.parametrize("mode,nemesis,seconds", TX_CELLS, ids=[f"{m}-{n}-tx" for m, n, _ in TX_CELLS])
def test_transactional_cell_keeps_its_promise(tmp_path, mode, nemesis, seconds):
    """The tx workload (mq/chaos/run.py): every message in a transaction, committed, rolled back
    or left to the broker's check, with the leader killed (a DLedger failover with halves
    pending): nothing committed lost, nothing rolled back read, nothing committed twice."""
    r = run_cell(mode, nemesis, seconds, str(tmp_path), workload="tx")
    assert r["valid"], r
    assert r["workload"] == "tx" and r["faults"] >= 1, r
    assert r["acked"] > 100 and r["lost"] == 0 and r["duplicated"] == 0 and r["failed_read"] == 0, r
    assert r["failed"] > 100, r                     # the rolled-back third and half of the checked third
    assert r["read"] >= r["acked"], r


# the 5.x gRPC path under faults: DLedger with the leader killed (the producers find the new
# leader's endpoint through any gateway that answers), and SYNC_MASTER with the slave cut off
GRPC_CELLS = [("dledger", "kill", 10.0), ("sync_master", "partition", 8.0)]


@pytest.mark.parametrize("mode,nemesis,seconds", GRPC_CELLS, ids=[f"{m}-{n}-grpc" for m, n, _ in GRPC_CELLS])
def test_grpc_cell_keeps_its_promise(tmp_path, mode, nemesis, seconds):
    """The grpc workload (mq/chaos/run.py): every send a 5.x SendMessage through the brokers'
    gateways; what was answered OK is read after the faults, nothing twice, nothing unexpected;
    a 5.x POP consumer running through the faults gets every acknowledged send, and nothing again
    once its ack was answered."""
    r = run_cell(mode, nemesis, seconds, str(tmp_path), workload="grpc")
    assert r["valid"], r
    assert r["workload"] == "grpc" and r["faults"] >= 1, r
    assert r["acked"] > 50 and r["lost"] == 0 and r["duplicated"] == 0 and r["unexpected"] == 0, r
    assert r["read"] >= r["acked"], r
    assert r["undelivered"] == 0 and r["redelivered_acked"] == 0 and r["consumed"] > 50, r


# real networks (mq.hosts): every process on a host of its own, the kernel dropping the packets;
# every such nemesis for DLedger, and a SYNC_MASTER and its slave split (its host cut off and one-way
# loss are `make chaos` cells: sync_master-partition cuts the same link through the fault proxy)
HOST_CELLS = [("dledger", n) for n in HOST_NEMESES] + [("sync_master", "split")]


@pytest.mark.skipif(hosts_unavailable() is not None, reason=str(hosts_unavailable()))
@pytest.mark.parametrize("mode,nemesis", HOST_CELLS, ids=[f"{m}-{n}" for m, n in HOST_CELLS])
def test_real_network_cell_keeps_its_promise(tmp_path, mode, nemesis):
    """A host cut off, one-way loss, a majority/minority split, a bridge and a ring of
    overlapping majorities (Jepsen's DLedger nemeses), on namespaces: nothing acknowledged lost,
    nothing duplicated or reordered, and the cluster serving again after each fault."""
    r = run_cell(mode, nemesis, 8.0, str(tmp_path))
    assert r["valid"], r
    assert r["faults"] >= 1 and r["acked"] > 100 and r["lost"] == 0, r
    assert all(s is not None for _, s in r["recovery_s"]), r          # sends acknowledged after every fault
