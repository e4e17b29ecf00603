"""5.x clients against replicated groups: through a SYNC_MASTER's gateway every acknowledged
send is on the slave too, and a stalled slave turns into the 5.x code for it; in a DLedger group
a client that dials a follower's gateway is routed to the leader's (each broker's own gRPC port,
asked of it), its sends are committed on the group, and its consumer receives them there."""
import signal

from mq.cluster import Broker, DLedgerGroup, NameServer, call, free_port, port_open, wait_for
from mq.wire.codes import RequestCode, ResponseCode

from tests.gateway.helpers import run_client5


def create_topic(addr: str, topic: str) -> None:
    """UPDATE_AND_CREATE_TOPIC until it is taken: a DLedger leader's status file says it leads a
    moment before its io workers hear of it and stop refusing admin requests as a slave."""
    def created() -> bool:
        return call(addr, RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": topic, "readQueueNums": 4,
                                                               "writeQueueNums": 4, "perm": 6}).code == ResponseCode.SUCCESS
    wait_for(created, 30, 0.1, f"{topic} created at {addr}")


def routed(ns: NameServer, topic: str) -> bool:
    return call(ns.addr, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}).code == ResponseCode.SUCCESS


def max_phy(addr: str) -> int:
    import json
    return int(json.loads(call(addr, RequestCode.GET_BROKER_RUNTIME_INFO).body)["table"]["commitLogMaxOffset"])


def test_sync_master_sends_are_on_the_slave_and_a_stalled_slave_is_ha_not_available(tmp_path):
    ns = NameServer(str(tmp_path))
    gport = free_port()
    master = slave = None
    try:
        master = Broker(str(tmp_path), ns.addr, name="broker-a", brokerRole="SYNC_MASTER", slaveTimeout=1500,
                        haSendHeartbeatInterval=500, grpcServerPort=gport)
        slave = Broker(str(tmp_path), ns.addr, name="broker-a", brokerRole="SLAVE", brokerId=1,
                       haSendHeartbeatInterval=500, grpcServerPort=free_port())
        wait_for(lambda: port_open(gport), 30, what="the master's gRPC port")
        for topic in ("G5Sync", "G5SyncProbe"):
            create_topic(master.addr, topic)
            wait_for(lambda: routed(ns, topic), 30, what="the route")
        ep = f"127.0.0.1:{gport}"
        # until the slave is connected a send is answered HA_NOT_AVAILABLE, yet stored on the
        # master: the probes go to a topic of their own, so the consumer below counts only s0..s19
        probe = lambda: "message_id" in run_client5({"op": "produce", "endpoint": ep, "topic": "G5SyncProbe",  # noqa: E731
                                                     "messages": [{"body": "probe"}]})["sent"][0]
        wait_for(probe, 60, 1.0, "a send the slave acknowledged")
        out = run_client5({"op": "produce", "endpoint": ep, "topic": "G5Sync",
                           "messages": [{"body": f"s{i}"} for i in range(20)]})
        assert all("message_id" in r for r in out["sent"]), out
        end = max_phy(master.addr)
        wait_for(lambda: max_phy(slave.addr) >= end, 20, what="the slave holds every acknowledged send")
        got = run_client5({"op": "receive", "endpoint": ep, "group": "G5SyncGroup", "topic": "G5Sync", "want": 20,
                           "timeout_s": 40})
        assert sorted(m["body"] for m in got["received"]) == sorted(f"s{i}" for i in range(20))
        slave.signal_all(signal.SIGSTOP)
        try:
            out = run_client5({"op": "produce", "endpoint": ep, "topic": "G5Sync", "messages": [{"body": "stalled"}]})
        finally:
            slave.signal_all(signal.SIGCONT)
        # the client retries (3 attempts), each answered SLAVE_PERSISTENCE_TIMEOUT / HA_NOT_AVAILABLE: an error
        assert "error" in out["sent"][0], out
    finally:
        for b in (slave, master):
            if b is not None:
                b.stop()
        ns.stop()


def test_dledger_routes_a_client_of_a_follower_to_the_leader(tmp_path):
    ns = NameServer(str(tmp_path))
    ports = {}
    group = None
    try:
        group = DLedgerGroup(str(tmp_path), ns.addr, n=3,
                             options_for=lambda i: {"grpcServerPort": ports.setdefault(i, free_port())})
        leader = group.wait_leader(60)
        follower = next(i for i in group.ids if i != leader)
        for i in group.ids:
            wait_for(lambda: port_open(ports[i]), 30, what=f"{i}'s gRPC port")
        create_topic(group.addr(leader), "G5Raft")
        wait_for(lambda: routed(ns, "G5Raft"), 30, what="the route")
        ep = f"127.0.0.1:{ports[follower]}"                  # the client dials a follower
        out = run_client5({"op": "produce", "endpoint": ep, "topic": "G5Raft",
                           "messages": [{"body": f"r{i}"} for i in range(10)]})
        assert all("message_id" in r for r in out["sent"]), out
        end = max_phy(group.addr(leader))
        for i in group.ids:                                     # committed: on every member
            wait_for(lambda: max_phy(group.addr(i)) >= end, 20, what=f"{i} holds the sends")
        got = run_client5({"op": "receive", "endpoint": ep, "group": "G5RaftGroup", "topic": "G5Raft", "want": 10,
                           "timeout_s": 40})
        assert sorted(m["body"] for m in got["received"]) == sorted(f"r{i}" for i in range(10))
    finally:
        if group is not None:
            group.close()
        ns.stop()
