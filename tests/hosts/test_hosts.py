"""The host harness (mq.hosts): hosts as network namespaces on a bridge, each with its address
from 198.18.0.0/24 and no route out; a name server and a broker started in hosts of their own,
the broker advertising its host's address, a client in a third host producing and consuming
through them; a host cut off, a one-way loss, a host killed; everything removed at the end, and
what a crashed harness left behind swept by the next one."""
import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from mq import hosts as mqhosts
from mq.cluster import BIN, Broker, NameServer, wait_for

pytestmark = pytest.mark.skipif(mqhosts.unavailable() is not None, reason=str(mqhosts.unavailable()))

CONNECT = textwrap.dedent("""
    import socket, sys
    try:
        socket.create_connection((sys.argv[1], int(sys.argv[2])), float(sys.argv[3])).close()
        print("connected")
    except OSError as e:
        print(type(e).__name__)
""")


def connects(hosts, src: str, addr: str, timeout_s: float = 1.0) -> bool:
    """Does a TCP connection from host src to addr ("ip:port") open within timeout_s?"""
    ip, port = addr.rsplit(":", 1)
    out = hosts.run(src, [sys.executable, "-c", CONNECT, ip, port, str(timeout_s)]).stdout.strip()
    return out == "connected"


def mqadmin(hosts, host: str, *args: str) -> subprocess.CompletedProcess:
    return hosts.run(host, [f"{BIN}/mqadmin", *args], timeout_s=60)


@pytest.fixture
def hosts():
    with mqhosts.Hosts(["ns1", "a", "client"]) as h:
        yield h


def test_hosts_have_their_addresses_and_no_route_out(hosts):
    for i, name in enumerate(["ns1", "a", "client"]):
        host = hosts[name]
        assert host.ip == f"198.18.0.{i + 1}"
        addrs = hosts.run(name, ["ip", "-j", "addr", "show", "dev", "eth0"]).stdout
        assert [a["local"] for a in json.loads(addrs)[0]["addr_info"] if a["family"] == "inet"] == [host.ip]
        routes = json.loads(hosts.run(name, ["ip", "-j", "route", "show"]).stdout)
        assert [r["dst"] for r in routes] == ["198.18.0.0/24"]           # no default route: nothing leaves
    assert mqhosts.SUBNET.startswith("198.18.")


def test_a_broker_in_its_host_serves_a_client_in_another(hosts, tmp_path):
    ns = NameServer(str(tmp_path), host=hosts["ns1"])
    broker = Broker(str(tmp_path), ns.addr, host=hosts["a"])
    try:
        assert ns.addr == "198.18.0.1:9876" and broker.addr == "198.18.0.2:10911"
        out = mqadmin(hosts, "client", "clusterList", "-n", ns.addr)
        assert out.returncode == 0 and "198.18.0.2:10911" in out.stdout, out.stdout + out.stderr
        assert mqadmin(hosts, "client", "updateTopic", "-n", ns.addr, "-c", "TestCluster", "-t", "HostTopic",
                       "-r", "1", "-w", "1").returncode == 0
        sent = mqadmin(hosts, "client", "sendMessage", "-n", ns.addr, "-t", "HostTopic", "-p", "across")
        assert sent.returncode == 0 and "SEND_OK" in sent.stdout, sent.stdout + sent.stderr

        def consumed() -> bool:
            got = mqadmin(hosts, "client", "consumeMessage", "-n", ns.addr, "-t", "HostTopic", "-c", "1")
            return "across" in got.stdout
        wait_for(consumed, 20, 0.5, "the message read back from the client host")
        # the broker advertises its host's address: what the name server hands clients
        route = mqadmin(hosts, "client", "topicRoute", "-n", ns.addr, "-t", "HostTopic")
        assert "198.18.0.2:10911" in route.stdout and "127.0.0.1" not in route.stdout
    finally:
        broker.stop()
        ns.stop()


def test_cut_one_way_loss_and_heal(hosts, tmp_path):
    ns = NameServer(str(tmp_path), host=hosts["ns1"])
    try:
        assert connects(hosts, "client", ns.addr) and connects(hosts, "a", ns.addr)
        hosts.cut("ns1")
        assert not connects(hosts, "client", ns.addr) and not connects(hosts, "a", ns.addr)
        hosts.heal()
        assert connects(hosts, "client", ns.addr)
        # one way: what ns1 sends to the client is lost (its SYN-ACKs too), a still reaches it
        hosts.drop("ns1", "client")
        assert not connects(hosts, "client", ns.addr) and connects(hosts, "a", ns.addr)
        hosts.heal()
        hosts.split(["client"], ["ns1", "a"])
        assert not connects(hosts, "client", ns.addr) and connects(hosts, "a", ns.addr)
        hosts.heal()
        assert connects(hosts, "client", ns.addr)
    finally:
        ns.stop()


def test_a_killed_host_loses_every_process(hosts, tmp_path):
    ns = NameServer(str(tmp_path), host=hosts["ns1"])
    broker = Broker(str(tmp_path), ns.addr, host=hosts["a"])
    try:
        assert len(hosts.pids("a")) >= 3                       # the supervisor, its launcher and roles
        hosts.kill_host("a")
        assert hosts.pids("a") == [] and broker.proc.p.wait(10) == -signal.SIGKILL
        assert connects(hosts, "client", ns.addr)              # the other hosts go on
    finally:
        broker.stop()
        ns.stop()


def test_close_removes_everything_and_leftovers_of_a_crash_are_swept():
    h = mqhosts.Hosts(["x"])
    made = [n for n in os.listdir("/run/netns") if n.startswith(h.id)]
    assert sorted(made) == sorted([f"{h.id}-br", f"{h.id}-x"])
    h.close()
    assert not [n for n in os.listdir("/run/netns") if n.startswith(h.id)]
    # a harness whose process died (SIGKILL: no close) leaves its namespaces; the next one sweeps them
    child = subprocess.Popen([sys.executable, "-c", "from mq.hosts import Hosts; import sys, time; "
                              "h = Hosts(['y']); print(h.id, flush=True); time.sleep(60)"],
                             stdout=subprocess.PIPE, text=True)
    crashed_id = child.stdout.readline().strip()
    assert crashed_id and any(n.startswith(crashed_id) for n in os.listdir("/run/netns"))
    child.send_signal(signal.SIGKILL)
    child.wait(10)
    child.stdout.close()                      # reaped: its pid is gone, so its hosts are leftovers
    assert sorted(mqhosts.sweep_leftovers()) == sorted([f"{crashed_id}-br", f"{crashed_id}-y"])
    assert not [n for n in os.listdir("/run/netns") if n.startswith(crashed_id)]


def test_inside_puts_this_thread_in_a_host_and_back(hosts, tmp_path):
    """A process can be a client host itself (mqchaos is): its sockets opened inside reach the
    hosts; outside again, its thread is in its own network (told by the namespace's inode: a
    connection from here to 198.18.x would leave by this machine's own route, which a test
    must never use)."""
    import socket
    ns = NameServer(str(tmp_path), host=hosts["ns1"])
    mine = os.stat("/proc/thread-self/ns/net").st_ino
    try:
        with mqhosts.inside(hosts["client"]):
            assert os.stat("/proc/thread-self/ns/net").st_ino == os.stat(f"/run/netns/{hosts['client'].netns}").st_ino
            socket.create_connection(("198.18.0.1", 9876), 2).close()
        assert os.stat("/proc/thread-self/ns/net").st_ino == mine
    finally:
        ns.stop()
