"""The capacity model checked on the hosts layout (`python -m mq.cli.local hosts`: two DLedger
groups of three and a SYNC_MASTER with its slave, every process on a host of its own): what each
group takes alone, from a native load client (perf/mqload.c) in the client host against its
master, and what the three take at once.  The model (perf/CAPACITY.md) says N groups on N sets of
machines take N times one group; on this one 2-CPU machine every group's processes share the same
two CPUs, so the sum of the groups alone over-predicts: the printed ratio is where the model stops
holding here.  Full run only (about a minute and a half)."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from mq import hosts as mqhosts
from mq.cluster import BIN, wait_for
from tests.hosts.layout import HOSTS_CLIENT, HOSTS_CLUSTER, Layout, in_client, masters as group_masters

from .mqload import build
from .test_store_bench import judge

pytestmark = pytest.mark.skipif(mqhosts.unavailable() is not None, reason=str(mqhosts.unavailable()))

GROUPS = ("RaftNode00", "RaftNode01", "broker-m")
LOAD_S = 8
CONNS = 32
TOPIC = "CapacityTopic"
TOGETHER_FLOOR = 0.15      # all three at once over the best group alone: a collapse, not the model


def _machine_cpu() -> tuple[float, float, int]:
    """(busy, total) CPU seconds of the whole machine so far, and its context switches, from
    /proc/stat."""
    with open("/proc/stat") as f:
        lines = f.read().splitlines()
    v = [int(x) for x in lines[0].split()[1:]]
    ctxt = next(int(line.split()[1]) for line in lines if line.startswith("ctxt "))
    hz = os.sysconf("SC_CLK_TCK")
    idle = v[3] + v[4]                                   # idle + iowait
    return (sum(v[:8]) - idle) / hz, sum(v[:8]) / hz, ctxt


def _load(hosts: dict, mqload: str, addrs: list[str]) -> list[dict]:
    """mqload against each address at once (one process each, CONNS connections, LOAD_S); each
    result gets the machine's busy share of its CPUs over the run, its busy CPU seconds and its
    context switches ("machine_busy", "machine_cpu_s", "machine_ctxt")."""
    busy0, total0, ctxt0 = _machine_cpu()
    procs = [subprocess.Popen(["ip", "netns", "exec", hosts[HOSTS_CLIENT]["netns"], mqload, "-h",
                               addr.rsplit(":", 1)[0], "-p", addr.rsplit(":", 1)[1], "-c", str(CONNS), "-s",
                               str(LOAD_S), "-t", TOPIC, "-q", "4"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for addr in addrs]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=LOAD_S + 60)
        assert stdout.strip(), stderr
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    busy1, total1, ctxt1 = _machine_cpu()
    for r in out:
        r["machine_busy"] = (busy1 - busy0) / max(1e-9, total1 - total0)
        r["machine_cpu_s"] = busy1 - busy0
        r["machine_ctxt"] = ctxt1 - ctxt0
    return out


def test_groups_alone_and_together_on_the_hosts_layout(tmp_path):
    mqload = build()
    layout = Layout(str(tmp_path))        # its output is read all along: the launcher never blocks on it
    try:
        layout.wait_line("hosts cluster up", 240)
        hosts, ns = layout.hosts(), layout.namesrv()
        wait_for(lambda: set(group_masters(hosts, ns)) == set(GROUPS), 120, 1.0, "a master of every group")
        wait_for(lambda: in_client(hosts, [f"{BIN}/mqadmin", "updateTopic", "-n", ns, "-c", HOSTS_CLUSTER, "-t",
                                           TOPIC, "-r", "4", "-w", "4"]).returncode == 0, 60, 1.0, "the topic")
        masters = group_masters(hosts, ns)
        _load(hosts, mqload, [masters[g] for g in GROUPS])          # warm-up: files touched, connections made
        alone = {g: _load(hosts, mqload, [masters[g]])[0] for g in GROUPS}
        together = dict(zip(GROUPS, _load(hosts, mqload, [masters[g] for g in GROUPS])))
    finally:
        layout.stop()
    predicted = sum(r["msgs_per_s"] for r in alone.values())
    measured = sum(r["msgs_per_s"] for r in together.values())
    print(f"\ncapacity on the hosts layout ({CONNS} connections a group, {LOAD_S} s, 1 KiB, one 2-CPU machine):")
    for g in GROUPS:
        a, t = alone[g], together[g]
        print(f"  {g:<11} alone {a['msgs_per_s']:>9.0f} msgs/s (p99 {a['p99_us'] / 1000:.1f} ms)   with the others "
              f"{t['msgs_per_s']:>9.0f} msgs/s (p99 {t['p99_us'] / 1000:.1f} ms)")
    print(f"  the model (each group on machines of its own): {predicted:.0f} msgs/s; measured together here: "
          f"{measured:.0f} msgs/s = {measured / predicted:.2f} of it")
    for g in GROUPS:
        a = alone[g]
        n = a["msgs_per_s"] * a["seconds"]
        print(f"  {g:<11} alone: machine {a['machine_busy']:.0%} busy, {a['machine_cpu_s'] / n * 1e6:.0f} us of "
              f"machine CPU and {a['machine_ctxt'] / n:.1f} context switches a message")
    t = together[GROUPS[0]]
    n = sum(r["msgs_per_s"] * r["seconds"] for r in together.values())
    print(f"  together:   machine {t['machine_busy']:.0%} busy, {t['machine_cpu_s'] / n * 1e6:.0f} us of machine CPU "
          f"and {t['machine_ctxt'] / n:.1f} context switches a message")
    for r in list(alone.values()) + list(together.values()):
        assert r["acked"] > 0 and r["errors"] == 0, r
    judge("capacity: three groups together over the best group alone (one machine)",
          measured / max(r["msgs_per_s"] for r in alone.values()), None, TOGETHER_FLOOR)
