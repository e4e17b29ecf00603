"""`python -m mq.cli.local hosts`: two name servers, two DLedger groups of three and a
SYNC_MASTER with its slave, every process on a host of its own; a client host's producer spreads
its sends over every group, and when the host of a DLedger leader is killed (every process in it)
or cut off, nothing acknowledged is lost and the producer goes on with the other groups at once
(its fault isolation), the stricken group again once it elected a leader.  Measured and
printed: how long the producer had no ack, and when the stricken group took sends again."""
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from mq import hosts as mqhosts
from mq.cluster import BIN, wait_for

from tests.hosts.layout import HOSTS_CLUSTER, Layout, in_client, masters

pytestmark = pytest.mark.skipif(mqhosts.unavailable() is not None, reason=str(mqhosts.unavailable()))

CLIENT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hostclient.py")
TOPIC = "HostsTopic"
ROUTE_REFRESH_S = 5.0          # the producer's route refresh (RocketMQ's default is 30 s)
FAULT_ISOLATION_S = 5.0        # how long it avoids a broker a send to failed
CUT_S = 8.0                    # how long a cut-off host stays cut off


def client(hosts: dict, req: dict) -> dict:
    p = in_client(hosts, [sys.executable, CLIENT, json.dumps(req)])
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("fault", ["kill", "cut"])
def test_a_killed_or_cut_off_host_loses_nothing_and_the_producer_goes_on(tmp_path, fault):
    """kill: every process of the leader's host SIGKILLed; cut: its link down for CUT_S, then up
    (the old leader, alone, must not acknowledge anything it cannot commit)."""
    layout = Layout(str(tmp_path))
    try:
        layout.wait_line("hosts cluster up", 240)
        hosts, ns = layout.hosts(), layout.namesrv()
        wait_for(lambda: set(masters(hosts, ns)) == {"RaftNode00", "RaftNode01", "broker-m"}, 90, 1.0,
                 "a master of every group registered")
        wait_for(lambda: in_client(hosts, [f"{BIN}/mqadmin", "updateTopic", "-n", ns, "-c", HOSTS_CLUSTER,
                                           "-t", TOPIC, "-r", "2", "-w", "2"]).returncode == 0, 60, 1.0, "the topic")
        leader_ip = masters(hosts, ns)["RaftNode00"].rsplit(":", 1)[0]
        victim = next(name for name, h in hosts.items() if h["ip"] == leader_ip)
        result: dict = {}
        producer = threading.Thread(target=lambda: result.update(client(hosts, {
            "op": "produce", "namesrv": ns, "topic": TOPIC, "seconds": 20, "route_refresh_s": ROUTE_REFRESH_S,
            "fault_isolation_s": FAULT_ISOLATION_S})))
        producer.start()
        time.sleep(6.0)
        killed_at = time.time()
        netns = hosts[victim]["netns"]
        if fault == "kill":
            for pid in subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True).stdout.split():
                os.kill(int(pid), signal.SIGKILL)
            layout.wait_line(f"{victim} (pid", 30)                # the launcher reports the death
        else:
            subprocess.run(["ip", "-n", netns, "link", "set", "eth0", "down"], check=True)
            time.sleep(CUT_S)
            subprocess.run(["ip", "-n", netns, "link", "set", "eth0", "up"], check=True)
        producer.join(120)
        acked = result["acked"]
        groups_before = {a[1] for a in acked if a[4] < killed_at}
        assert groups_before == {"RaftNode00", "RaftNode01", "broker-m"}, groups_before
        after = [a for a in acked if a[4] > killed_at]
        first_after_s = after[0][4] - killed_at
        # the killed group back: its first ack after the first send that failed because of the kill
        failed_at = min((f[2] for f in result["failed"] if f[2] > killed_at), default=killed_at)
        back = [a for a in after if a[1] == "RaftNode00" and a[4] > failed_at]
        back_s = back[0][4] - killed_at if back else None
        gap_s = max(b[4] - a[4] for a, b in zip(acked, acked[1:]))
        how = "killed" if fault == "kill" else f"cut off for {CUT_S:.0f} s"
        print(f"\nhost {victim} (RaftNode00's leader) {how}: first failure after {failed_at - killed_at:.3f} s, "
              f"first ack after {first_after_s:.3f} s, longest gap "
              f"{gap_s:.3f} s, RaftNode00 took sends again after {back_s if back_s is None else round(back_s, 3)} s; "
              f"{len(acked)} acked, {len(result['failed'])} failed")
        # the other groups go on at once: fault isolation, not the route refresh, moves the sends
        assert first_after_s < ROUTE_REFRESH_S and {"RaftNode01", "broker-m"} <= {a[1] for a in after}
        assert back_s is not None and back_s < 20, back_s            # the group's new leader took sends again
        read = client(hosts, {"op": "drain", "namesrv": ns, "topic": TOPIC})["read"]
        places = {}
        for value, broker, qid, offset in read:
            places.setdefault(value, set()).add((broker, qid, offset))
        lost = [a[0] for a in acked if a[0] not in places]
        assert not lost, f"{len(lost)} acknowledged sends lost: {lost[:10]}"
        assert all(len(p) == 1 for p in places.values())
        assert all((a[1], a[2], a[3]) in places[a[0]] for a in acked)
    finally:
        layout.stop()
    assert not [n for n in os.listdir("/run/netns") if "-ns1" in n and str(layout.p.pid) in n]
