"""`python -m mq.cli.local hosts`: two name servers, two DLedger groups of three and a
SYNC_MASTER with its slave, every process on a host of its own; a client host's producer spreads
its sends over every group, and when the host of a DLedger leader is killed (every process in it)
or cut off, nothing acknowledged is lost and the producer goes on with the other groups at once
(its fault isolation), the stricken group again once it elected a leader.  Measured and printed: how long the
producer had no ack, and when the killed group took sends again."""
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time

import pytest

from mq import hosts as mqhosts
from mq.cli.local import HOSTS_CLIENT, HOSTS_CLUSTER
from mq.cluster import BIN, wait_for

pytestmark = pytest.mark.skipif(mqhosts.unavailable() is not None, reason=str(mqhosts.unavailable()))

CLIENT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hostclient.py")
TOPIC = "HostsTopic"
ROUTE_REFRESH_S = 5.0          # the producer's route refresh (RocketMQ's default is 30 s)
FAULT_ISOLATION_S = 5.0        # how long it avoids a broker a send to failed
CUT_S = 8.0                    # how long a cut-off host stays cut off


class Layout:
    """The launcher as a user runs it: its output read line by line, typed input, Ctrl-C."""

    def __init__(self, run_dir: str):
        self.p = subprocess.Popen([sys.executable, "-m", "mq.cli.local", "hosts"], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  env={**os.environ, "MQ_RUN_DIR": run_dir})
        self.lines: queue.Queue = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        self.base = os.path.join(run_dir, "hosts")

    def _read(self) -> None:
        for line in self.p.stdout:
            self.lines.put(line.rstrip("\n"))

    def wait_line(self, text: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.5)
            except queue.Empty:
                assert self.p.poll() is None, "\n".join(self.seen[-40:])
                continue
            self.seen.append(line)
            if text in line:
                return
        raise AssertionError(f"no {text!r} in {timeout_s} s:\n" + "\n".join(self.seen[-40:]))

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGINT)
            try:
                self.p.wait(15)
            except subprocess.TimeoutExpired:
                self.p.send_signal(signal.SIGINT)             # a second Ctrl-C kills what is left
                self.p.wait(30)


def in_client(hosts: dict, args: list[str], timeout_s: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", "netns", "exec", hosts[HOSTS_CLIENT]["netns"], *args], capture_output=True,
                          text=True, timeout=timeout_s)


def client(hosts: dict, req: dict) -> dict:
    p = in_client(hosts, [sys.executable, CLIENT, json.dumps(req)])
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def masters(hosts: dict, ns: str) -> dict[str, str]:
    """broker name -> its master's address, from clusterList in the client host."""
    out = in_client(hosts, [f"{BIN}/mqadmin", "clusterList", "-n", ns]).stdout
    found = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[0] == HOSTS_CLUSTER and parts[2] == "0":
            found[parts[1]] = parts[3]
    return found


@pytest.mark.parametrize("fault", ["kill", "cut"])
def test_a_killed_or_cut_off_host_loses_nothing_and_the_producer_goes_on(tmp_path, fault):
    """kill: every process of the leader's host SIGKILLed; cut: its link down for CUT_S, then up
    (the old leader, alone, must not acknowledge anything it cannot commit)."""
    layout = Layout(str(tmp_path))
    try:
        layout.wait_line("hosts cluster up", 240)
        with open(os.path.join(layout.base, "hosts.json")) as f:
            hosts = json.load(f)
        ns = ";".join(f"{hosts[n]['ip']}:9876" for n in ("ns1", "ns2"))
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
