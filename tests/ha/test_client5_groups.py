"""The official 5.x client's suite against replicated groups: what tests/gateway proves on one
broker (normal, FIFO, delay and transactional sends, a TransactionChecker resolving an open one,
SimpleConsumer receive / ack / change invisible time, redelivery with its attempt, retry to the
DLQ, PushConsumer retries, 4.x readers of the same topics) run again on a SYNC_MASTER with its
slave and on a DLedger group of three whose client dials a follower's gateway.  Then each
group's own promise: the slave holds everything the gateway wrote (the messages, the POP
checkpoints and acks, the timer's records), and a DLedger leader killed with -9 between a
consumer's acks and its unacked receives loses nothing and redelivers only what was not acked.

One scenario per group, each step a run of the official client (client5.py), so a group's
start is paid once."""
import json
import subprocess
import time

from mq.cluster import BIN, Broker, DLedgerGroup, NameServer, call, free_port, port_open, wait_for
from mq.wire.codes import RequestCode, ResponseCode
from mq.wire.headers import send_v2

from tests.gateway.helpers import run_client5, wait_messages


class Group:
    """What the suite needs of a group: its name server, the endpoint the client dials, the
    cluster name mqadmin creates topics in, and every member's remoting address."""

    def __init__(self, ns: NameServer, endpoint: str, cluster: str, members: list[str]):
        self.ns, self.endpoint, self.cluster, self.members = ns, endpoint, cluster, members


def mqadmin(*args: str) -> str:
    p = subprocess.run([f"{BIN}/mqadmin", *args], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return p.stdout


def typed_topic(g: Group, topic: str, kind: str | None) -> None:
    """The topic on the group's master (the leader), typed with RocketMQ 5's message.type, and
    routed: mqadmin retried while a just-elected leader still refuses writes as a slave."""
    attrs = ["-a", f"+message.type={kind}"] if kind else []

    def created() -> bool:
        return subprocess.run([f"{BIN}/mqadmin", "updateTopic", "-n", g.ns.addr, "-c", g.cluster, "-t", topic,
                               "-r", "4", "-w", "4", *attrs], capture_output=True, timeout=60).returncode == 0
    wait_for(created, 30, 0.5, f"{topic} created")
    wait_for(lambda: call(g.ns.addr, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}).code == ResponseCode.SUCCESS,
             30, what=f"{topic}'s route")


def receive(g: Group, group: str, topic: str, want: int, **kw) -> list[dict]:
    out = run_client5({"op": "receive", "endpoint": g.endpoint, "group": group, "topic": topic, "want": want,
                       "timeout_s": 40, **kw})
    assert not out["errors"], out["errors"]
    return out["received"]


def max_phy(addr: str) -> int:
    return int(json.loads(call(addr, RequestCode.GET_BROKER_RUNTIME_INFO).body)["table"]["commitLogMaxOffset"])


def suite(g: Group, p: str) -> None:
    """The scenario; p prefixes every topic and group (the two groups' runs share nothing)."""
    normal, fifo, delay, tx = f"{p}Normal", f"{p}Fifo", f"{p}Delay", f"{p}Tx"
    for topic, kind in ((normal, None), (fifo, "FIFO"), (delay, "DELAY"), (tx, "TRANSACTION")):
        typed_topic(g, topic, kind)
    mqadmin("updateSubGroup", "-n", g.ns.addr, "-c", g.cluster, "-g", f"{p}DlqGroup", "-r", "1")
    # one producer run sends every kind: normal, two FIFO message groups, a timer message, and
    # three transactions (committed, rolled back, left for the checker to commit)
    specs = ([{"body": f"n{i}", "tag": "t"} for i in range(6)]
             + [{"topic": fifo, "body": f"{mg}-{i}", "group": mg} for i in range(4) for mg in ("fa", "fb")]
             + [{"topic": delay, "body": "later", "delay_s": 3}]
             + [{"topic": tx, "body": b, "tx": b} for b in ("commit", "rollback", "leave")])
    out = run_client5({"op": "produce", "endpoint": g.endpoint, "topic": normal, "messages": specs,
                       "check_answer": "commit", "wait_checks": 1, "linger_s": 1.0, "checks_timeout_s": 60})
    ids = [r.get("message_id") for r in out["sent"]]
    assert all(ids), out["sent"]
    normal_ids, tx_left = ids[:6], ids[-1]
    assert tx_left in out["checked"], out           # the broker asked; the checker said commit

    # 4.x readers: every normal message; each FIFO group in one queue, in send order; the
    # transactions that committed (directly and by the check), never the rolled-back one
    assert sorted(m.properties["UNIQ_KEY"] for m in wait_messages(g, normal, 6, timeout_s=30)) == sorted(normal_ids)
    in_fifo = wait_messages(g, fifo, 8, timeout_s=30)
    for mg in ("fa", "fb"):
        mine = sorted((m for m in in_fifo if m.properties["__SHARDINGKEY"] == mg), key=lambda m: m.queue_offset)
        assert len({m.queue_id for m in mine}) == 1 and [m.body.decode() for m in mine] == [f"{mg}-{i}" for i in range(4)]
    assert sorted(m.body for m in wait_messages(g, tx, 2, timeout_s=30)) == [b"commit", b"leave"]

    # the timer message: delivered at its second, not before
    (later,) = receive(g, f"{p}DelayGroup", delay, 1, timeout_s=30)
    (at,) = wait_messages(g, delay, 1, timeout_s=30)
    assert later["body"] == "later" and 2.0 <= (at.store_timestamp_ms - at.born_timestamp_ms) / 1000 < 6.0

    # SimpleConsumer: every message once, acked
    got = receive(g, f"{p}AckGroup", normal, 6, then="ack")
    assert sorted(m["message_id"] for m in got) == sorted(normal_ids) and {m["attempt"] for m in got} == {1}
    # not acked (invisible time set to 1 s): back again with attempt 2
    first = receive(g, f"{p}AgainGroup", normal, 6, then="change", change_s=1)
    again = receive(g, f"{p}AgainGroup", normal, 6, then="ack")
    assert sorted(m["message_id"] for m in first) == sorted(m["message_id"] for m in again) == sorted(normal_ids)
    assert {m["attempt"] for m in again} == {2}
    # past the group's retry limit (retryMaxTimes 1: two attempts): %DLQ%<group>
    for attempt in (1, 2):
        assert {m["attempt"] for m in receive(g, f"{p}DlqGroup", normal, 6, then="change", change_s=1)} == {attempt}
    dead = wait_messages(g, f"%DLQ%{p}DlqGroup", 6, timeout_s=30)
    assert sorted(m.properties["UNIQ_KEY"] for m in dead) == sorted(normal_ids)
    # PushConsumer: the listener's first two failures are delivered again, attempt 2
    pushed = run_client5({"op": "push", "endpoint": g.endpoint, "group": f"{p}PushGroup", "topic": normal,
                          "want": 6, "fail_first": 2, "timeout_s": 60})["received"]
    assert sorted({m["message_id"] for m in pushed}) == sorted(normal_ids)
    assert sorted(m["message_id"] for m in pushed if m["attempt"] == 2) == sorted(m["message_id"] for m in pushed[:2])


def kill_between_acks_and_receives(g: Group, p: str, kill, revived) -> None:
    """Ten messages; a consumer acks five and holds five unacked; kill() (the fault), revived()
    once the group serves again; then the five unacked come back, attempt 2, and no acked one."""
    topic, group = f"{p}Kill", f"{p}KillGroup"
    typed_topic(g, topic, None)
    out = run_client5({"op": "produce", "endpoint": g.endpoint, "topic": topic,
                       "messages": [{"body": f"k{i}"} for i in range(10)]})
    ids = [r.get("message_id") for r in out["sent"]]
    assert all(ids), out
    acked = receive(g, group, topic, 5, then="ack", invisible_s=10)
    kept = receive(g, group, topic, 5, then="keep", invisible_s=10)
    assert len({m["message_id"] for m in acked + kept}) == 10
    kill()
    revived()
    back = receive(g, group, topic, 5, then="ack", timeout_s=60)
    assert sorted(m["message_id"] for m in back) == sorted(m["message_id"] for m in kept)
    assert {m["attempt"] for m in back} == {2}
    time.sleep(2.0)                                   # nothing else comes: the acked five stay acked
    assert receive(g, group, topic, 1, then="ack", timeout_s=3) == []


def test_sync_master_group(tmp_path):
    ns = NameServer(str(tmp_path))
    gport = free_port()
    master = slave = None
    try:
        master = Broker(str(tmp_path), ns.addr, name="broker-a", brokerRole="SYNC_MASTER", grpcServerPort=gport,
                        haSendHeartbeatInterval=500, messageDelayLevel="1s 2s 3s 5s 10s",
                        transactionTimeOut=1000, transactionCheckInterval=1000)
        slave = Broker(str(tmp_path), ns.addr, name="broker-a", brokerRole="SLAVE", brokerId=1,
                       haSendHeartbeatInterval=500, grpcServerPort=free_port())
        wait_for(lambda: port_open(gport), 30, what="the master's gRPC port")
        # until the slave is connected a send is answered HA_NOT_AVAILABLE yet stored on the master
        # (the client's retries would store copies): wait for a 4.x send the slave acknowledged
        probe = send_v2(producerGroup="PG", topic="S5Probe", defaultTopic="TBW102", defaultTopicQueueNums=1,
                        queueId=0, sysFlag=0, bornTimestamp=0, flag=0, properties="")
        wait_for(lambda: call(master.addr, RequestCode.SEND_MESSAGE_V2, probe, b"probe").code == ResponseCode.SUCCESS,
                 40, 0.3, "the slave connected")
        g = Group(ns, f"127.0.0.1:{gport}", "TestCluster", [master.addr, slave.addr])
        suite(g, "S5")
        # everything the master wrote, the gateway's own records included, is on the slave
        end = max_phy(master.addr)
        wait_for(lambda: max_phy(slave.addr) >= end, 20, what="the slave holds the master's CommitLog")

        def restart():
            master.kill()
            master.start()
        kill_between_acks_and_receives(g, "S5", restart,
                                       lambda: wait_for(lambda: port_open(gport), 30, what="the gRPC port again"))
    finally:
        for b in (slave, master):
            if b is not None:
                b.stop()
        ns.stop()


def test_dledger_group_with_a_leader_failover(tmp_path):
    ns = NameServer(str(tmp_path))
    ports: dict[str, int] = {}
    group = None
    try:
        group = DLedgerGroup(str(tmp_path), ns.addr, n=3, messageDelayLevel="1s 2s 3s 5s 10s",
                             transactionTimeOut=1000, transactionCheckInterval=1000,
                             options_for=lambda i: {"grpcServerPort": ports.setdefault(i, free_port())})
        leader = group.wait_leader(60)
        for i in group.ids:
            wait_for(lambda: port_open(ports[i]), 30, what=f"{i}'s gRPC port")
        dialed = next(i for i in group.ids if i != leader)          # the client dials a follower
        g = Group(ns, f"127.0.0.1:{ports[dialed]}", "RaftCluster", [group.addr(i) for i in group.ids])
        suite(g, "R5")
        end = max_phy(group.addr(leader))
        for i in group.ids:
            wait_for(lambda: max_phy(group.addr(i)) >= end, 20, what=f"{i} holds the leader's log")

        def new_leader():
            wait_for(lambda: group.leader() not in (None, leader), 30, 0.05, "a new leader")
        # the leader dies between the consumer's acks and the invisible time of what it holds;
        # the new leader's gateway rebuilds the POP state from the replicated revive log
        kill_between_acks_and_receives(g, "R5", lambda: group.kill(leader), new_leader)
    finally:
        if group is not None:
            group.close()
        ns.stop()
