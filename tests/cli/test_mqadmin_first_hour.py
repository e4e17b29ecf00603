"""mqadmin as an operator meets it in the first hour, run as the installed console script against
live mqnamesrv + mqbroker processes, each command checked by its effect:
  * the defects found: output to a reader that leaves (`| head`) ends quietly with exit 0;
    printMsg -b/-e prints every message stored in the window and none outside it; an unknown
    updateBrokerConfig key is named unknown; leadershipTransfer refuses a member that is down
    and reports a transfer that did not happen instead of "started" alone;
  * the commands that were missing: topicClusterList, topicList -c, getNamesrvConfig /
    updateNamesrvConfig, updateKvConfig / deleteKvConfig, updateOrderConf, updateTopicPerm,
    cloneGroupOffset, queryCq, consumerStatus, consumerProgress without -g, sendMsgStatus."""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time

import pytest

from mq.client import Message, MessageQueue, Producer, PushConsumer
from mq.cluster import DLedgerGroup, wait_dispatched, wait_for
from tests.cli.adminkit import committed, consumed_cluster
from tests.cli.test_mqadmin import MQADMIN, mqadmin
from tests.client.clientkit import Collector, run, uniq, until
from mq.cluster import call


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """A cluster with a 4-queue topic of 40 messages (10 a queue, TagA), consumed by one group
    (offline now)."""
    with consumed_cluster(str(tmp_path_factory.mktemp("first_hour")), "fh", 40) as cluster:
        yield cluster


def route(ns, topic: str) -> dict:
    return json.loads(call(ns.addr, 105, {"topic": topic}).body)


# ---- the defects ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("command", [["topicList"], ["printMsg", "-t", "{topic}"], ["clusterList"]])
def test_a_reader_that_leaves_is_no_error(live, command):
    """stdout a pipe whose reader has gone (as `mqadmin ... | head` once head has its lines):
    exit 0 and nothing on stderr (it was "Broken pipe" and exit 1); RocketMQ's Java tool is
    silent too."""
    ns, broker, topic, group = live
    args = [a.format(topic=topic) for a in command]
    p = subprocess.Popen([MQADMIN, *args, "-n", ns.addr], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env={k: v for k, v in os.environ.items() if k != "NAMESRV_ADDR"})
    p.stdout.close()                                  # the reader leaves before a byte is written
    _, err = p.communicate(timeout=60)
    assert p.returncode == 0 and err == b"", err.decode()
    shell = subprocess.run(["bash", "-o", "pipefail", "-c", f"'{MQADMIN}' {' '.join(args)} -n {ns.addr} | head -1"],
                           capture_output=True, text=True, timeout=60)
    assert shell.returncode == 0 and shell.stderr == "" and len(shell.stdout.splitlines()) == 1


def test_print_msg_prints_exactly_the_time_window(live):
    """printMsg -b B -e E prints every message stored from B through E, on every queue, and none
    stored before or after (three bursts: 12 before, 11 inside, 9 after).  It printed 3 of 11:
    the ends were the messages nearest in time, taken as exact bounds, the last excluded."""
    ns, broker, *_ = live
    topic = uniq("T_window")

    async def go():
        now_ms = lambda: int(time.time() * 1000)      # noqa: E731
        async with Producer(uniq("PG"), ns.addr) as prod:
            sent = []
            for n, burst in ((12, "before"), (11, "inside"), (9, "after")):
                edge = now_ms()
                await until(lambda: now_ms() > edge + 2, 5, "the clock past the last burst")
                start = now_ms()
                for i in range(n):
                    await prod.send_to_queue(Message(topic, f"{burst}-{i}".encode()),
                                             MessageQueue(topic, "broker-a", i % 4))
                sent.append((burst, start, now_ms()))
            return sent
    (_, _, _), (_, begin_ms, end_ms), _ = run(go())
    wait_dispatched(broker.addr)
    out = mqadmin("printMsg", "-n", ns.addr, "-t", topic, "-b", str(begin_ms), "-e", str(end_ms)).stdout
    bodies = sorted(line.rsplit("BODY: ", 1)[1] for line in out.splitlines() if line.startswith("MSGID:"))
    assert bodies == sorted(f"inside-{i}" for i in range(11))
    fmt = lambda ms: time.strftime("%Y-%m-%d#%H:%M:%S", time.localtime(ms / 1000)) + f":{ms % 1000:03d}"  # noqa
    again = mqadmin("printMsg", "-n", ns.addr, "-t", topic, "-b", fmt(begin_ms), "-e", fmt(end_ms)).stdout
    assert again.count("MSGID:") == 11
    everything = mqadmin("printMsg", "-n", ns.addr, "-t", topic).stdout
    assert everything.count("MSGID:") == 32


def test_update_broker_config_names_an_unknown_key(live):
    """-k noSuchKey is refused as an unknown key (not "cannot change while the broker runs"), with
    the keys that can change listed; a real key that cannot change still says so."""
    ns, broker, *_ = live
    r = mqadmin("updateBrokerConfig", "-n", ns.addr, "-b", broker.addr, "-k", "noSuchKey", "-v", "1", expect=1)
    assert "noSuchKey is not a broker config key" in r.stderr and "cannot change" not in r.stderr
    assert "slaveReadEnable" in r.stderr
    r = mqadmin("updateBrokerConfig", "-n", ns.addr, "-b", broker.addr, "-k", "listenPort", "-v", "1", expect=1)
    assert "listenPort cannot change while the broker runs" in r.stderr


def test_leadership_transfer_to_a_member_that_cannot_lead(tmp_path):
    """A member whose links are cut: the leader accepts the transfer ("started") but the member
    never leads, and leadershipTransfer says so after -w seconds (exit 1), naming the leader.  A
    member that is down: refused before anything is sent (exit 1, no "started").  A live member:
    "now leads" once it does."""
    from mq.cluster import NameServer
    ns = NameServer(str(tmp_path))
    g = None
    try:
        g = DLedgerGroup(str(tmp_path), ns.addr, proxied=True)
        leader = g.wait_leader()
        wait_for(lambda: all(g.status(i).get("leader") == leader and g.status(i).get("lastIndex", -1) >= 0
                             for i in g.ids), 40, 0.1, "every member following the leader")
        cut, dead = [i for i in g.ids if i != leader]
        g.isolate(cut)
        r = mqadmin("leadershipTransfer", "-n", ns.addr, "-b", "RaftNode00", "-t", cut, "-w", "3", expect=1)
        assert "started" in r.stdout and f"{cut} does not lead [RaftNode00] after 3s" in r.stderr
        assert g.leader() == leader
        g.heal()
        leader = g.wait_leader()
        dead = next(i for i in g.ids if i != leader)
        g.kill(dead)
        r = mqadmin("leadershipTransfer", "-n", ns.addr, "-b", "RaftNode00", "-t", dead, expect=1)
        assert "does not answer" in r.stderr and "started" not in r.stdout
        live_member = next(i for i in g.ids if i not in (leader, dead))
        wait_for(lambda: g.status(live_member).get("leader") == leader, 30, 0.1, "the live follower following")
        out = mqadmin("leadershipTransfer", "-n", ns.addr, "-b", "RaftNode00", "-t", live_member, "-w", "30").stdout
        assert f"{live_member} now leads [RaftNode00]" in out
        assert g.wait_leader() == live_member
    finally:
        if g is not None:
            g.close()
        ns.stop()


# ---- topics -----------------------------------------------------------------------------------------------------

def test_topic_cluster_list_and_topic_list_with_clusters(live):
    """topicClusterList prints the topic's cluster; topicList -c prints cluster, topic and each
    consuming group, one row each, leaving out %RETRY% and %DLQ% topics."""
    ns, broker, topic, group = live
    assert mqadmin("topicClusterList", "-n", ns.addr, "-t", topic).stdout.splitlines() == ["TestCluster"]
    out = mqadmin("topicList", "-n", ns.addr, "-c").stdout.splitlines()
    assert out[0].split() == ["#Cluster", "Name", "#Topic", "#Consumer", "Group"]
    assert ["TestCluster", topic, group] in [ln.split() for ln in out[1:]]
    assert not any("%RETRY%" in ln for ln in out)


def test_update_topic_perm(live):
    """updateTopicPerm -p 4 makes the topic read-only at the broker (the route says perm 4, a send
    is refused) and keeps its queue counts; -p 6 restores it; the same perm again is a no-op."""
    ns, broker, *_ = live
    topic = uniq("T_perm")
    mqadmin("updateTopic", "-n", ns.addr, "-b", broker.addr, "-t", topic, "-r", "3", "-w", "3")
    out = mqadmin("updateTopicPerm", "-n", ns.addr, "-b", broker.addr, "-t", topic, "-p", "4").stdout
    assert f"update topic perm from 6 to 4 in {broker.addr} success." in out
    wait_for(lambda: route(ns, topic)["queueDatas"][0]["perm"] == 4, 30, what="perm 4 at the name server")
    assert route(ns, topic)["queueDatas"][0]["readQueueNums"] == 3
    r = call(broker.addr, 310, {"a": "PG", "b": topic, "c": "TBW102", "d": 4, "e": 0, "f": 0, "g": 0, "h": 0}, b"x")
    assert r.code == 16                                                    # NO_PERMISSION
    mqadmin("updateTopicPerm", "-n", ns.addr, "-c", "TestCluster", "-t", topic, "-p", "6")
    wait_for(lambda: route(ns, topic)["queueDatas"][0]["perm"] == 6, 30, what="perm 6 again")
    assert "new perm equals to the old one" in mqadmin("updateTopicPerm", "-n", ns.addr, "-b", broker.addr,
                                                       "-t", topic, "-p", "6").stdout


# ---- name servers ------------------------------------------------------------------------------------------------

def test_namesrv_config(live):
    """getNamesrvConfig prints every option of each name server; updateNamesrvConfig changes a
    key the name server reads at use (brokerExpiredMillis), shown by the next get and written to
    its config file; a key fixed at start and an unknown key are refused by name."""
    ns, *_ = live
    out = mqadmin("getNamesrvConfig", "-n", ns.addr).stdout.splitlines()
    assert out[0] == f"============{ns.addr}============"
    config = {k.strip(): v.strip() for k, v in (line.split("=", 1) for line in out[1:])}
    assert config["listenPort"] == str(ns.port) and config["brokerExpiredMillis"] == "120000"
    out = mqadmin("updateNamesrvConfig", "-n", ns.addr, "-k", "brokerExpiredMillis", "-v", "90000").stdout
    assert "update name server config success!" in out
    try:
        assert "brokerExpiredMillis                               =  90000" in mqadmin(
            "getNamesrvConfig", "-n", ns.addr).stdout
        with open(ns.conf) as f:
            assert "brokerExpiredMillis=90000" in f.read().splitlines()
    finally:
        mqadmin("updateNamesrvConfig", "-n", ns.addr, "-k", "brokerExpiredMillis", "-v", "120000")
    r = mqadmin("updateNamesrvConfig", "-n", ns.addr, "-k", "listenPort", "-v", "1", expect=1)
    assert "listenPort cannot change while the name server runs" in r.stderr
    r = mqadmin("updateNamesrvConfig", "-n", ns.addr, "-k", "noSuchKey", "-v", "1", expect=1)
    assert "noSuchKey is not a name server config key" in r.stderr


def test_kv_config_and_order_conf(live):
    """updateKvConfig puts a KV item on every name server (GET_KV_CONFIG answers it),
    deleteKvConfig removes it; updateOrderConf put/get/delete the topic's ORDER_TOPIC_CONFIG item,
    which a name server with orderMessageEnable puts into the topic's route as orderTopicConf."""
    ns, broker, topic, group = live
    ns_key = uniq("k")
    assert "success" in mqadmin("updateKvConfig", "-n", ns.addr, "-s", "MY_NS", "-k", ns_key, "-v", "v1").stdout
    r = call(ns.addr, 101, {"namespace": "MY_NS", "key": ns_key})
    assert r.code == 0 and r.ext_fields["value"] == "v1"
    assert "success" in mqadmin("deleteKvConfig", "-n", ns.addr, "-s", "MY_NS", "-k", ns_key).stdout
    assert call(ns.addr, 101, {"namespace": "MY_NS", "key": ns_key}).code == 22       # QUERY_NOT_FOUND
    out = mqadmin("updateOrderConf", "-n", ns.addr, "-t", topic, "-m", "put", "-v", "broker-a:4").stdout
    assert f"update orderConf success. topic=[{topic}], orderConf=[broker-a:4]" in out
    assert "orderConf=[broker-a:4]" in mqadmin("updateOrderConf", "-n", ns.addr, "-t", topic, "-m", "get").stdout
    mqadmin("updateNamesrvConfig", "-n", ns.addr, "-k", "orderMessageEnable", "-v", "true")
    try:
        assert route(ns, topic)["orderTopicConf"] == "broker-a:4"
        mqadmin("updateOrderConf", "-n", ns.addr, "-t", topic, "-m", "delete")
        assert "orderTopicConf" not in route(ns, topic)
    finally:
        mqadmin("updateNamesrvConfig", "-n", ns.addr, "-k", "orderMessageEnable", "-v", "false")
    r = mqadmin("updateOrderConf", "-n", ns.addr, "-t", topic, "-m", "put", expect=2)
    assert "-v orderConf" in r.stderr


# ---- groups ------------------------------------------------------------------------------------------------------

def test_clone_group_offset(live):
    """cloneGroupOffset -s G -d NEW -t T commits G's offsets of T for NEW (10 a queue); without -t
    every topic G has offsets for; the source keeps its own."""
    ns, broker, topic, group = live
    dest = uniq("CG_clone")
    out = mqadmin("cloneGroupOffset", "-n", ns.addr, "-s", group, "-d", dest, "-t", topic, "-o", "true").stdout
    assert f"clone group offset success. srcGroup[{group}], destGroup=[{dest}], topic[{topic}]" in out
    assert committed(broker, dest, topic) == [10, 10, 10, 10]
    every = uniq("CG_clone_all")
    mqadmin("cloneGroupOffset", "-n", ns.addr, "-s", group, "-d", every)
    assert committed(broker, every, topic) == [10, 10, 10, 10]
    assert committed(broker, group, topic) == [10, 10, 10, 10]


def test_query_cq(live):
    """queryCq prints the queue's bounds and -c entries from -i, each its commit-log offset, size
    and TagA's hash; -g adds the group's filter data ("not online" while nobody consumes)."""
    ns, broker, topic, group = live
    out = mqadmin("queryCq", "-n", ns.addr, "-t", topic, "-q", "2", "-i", "3", "-c", "4").stdout
    assert "Queue data: \nmax: 10, min: 0" in out
    assert [ln for ln in out.splitlines() if ln.startswith("idx: ")] == ["idx: 3", "idx: 4", "idx: 5", "idx: 6"]
    entries = [ln for ln in out.splitlines() if ln.startswith("ConsumeQueueData{")]
    assert len(entries) == 4 and all("tagsCode=2598919," in e for e in entries)
    out = mqadmin("queryCq", "-n", ns.addr, "-t", topic, "-q", "2", "-i", "0", "-c", "1", "-g", group,
                  "-b", broker.addr).stdout
    assert f"Filter data: \n{group}@{topic} is not online!" in out
    r = mqadmin("queryCq", "-n", ns.addr, "-t", topic, "-q", "2", "-i", "99", expect=1)
    assert "Index 99 of 2@" in r.stderr


def test_consumer_status_and_progress_of_every_group(live):
    """consumerStatus with one consumer online: its client id and version, the subscription, and
    every queue of the topic owned by it (AllocateMessageQueueAveragely) with no lag; -i of an
    unknown client fails.  consumerProgress without -g: one line per group with a %RETRY% topic,
    the online one PUSH/CLUSTERING with its version, the offline one OFFLINE."""
    ns, broker, topic, group = live
    cg = uniq("CG_status")

    async def go():
        cons = PushConsumer(cg, ns.addr, listener=Collector())
        cons.subscribe(topic)
        await cons.start()
        try:
            await until(lambda: len([q for q in cons.assigned_queues() if q.topic == topic]) == 4, 30,
                        "queues assigned")
            status = (await asyncio.to_thread(mqadmin, "consumerStatus", "-n", ns.addr, "-g", cg)).stdout
            bad = await asyncio.to_thread(mqadmin, "consumerStatus", "-n", ns.addr, "-g", cg, "-i", "nobody",
                                          expect=1)
            progress = (await asyncio.to_thread(mqadmin, "consumerProgress", "-n", ns.addr)).stdout
            return status, bad.stderr, progress, cons.instance.client_id
        finally:
            await cons.shutdown()
    status, bad, progress, cid = run(go())
    lines = status.splitlines()
    assert lines[0].split() == ["#Index", "#ClientId", "#Version", "#Addr", "#Language"]
    assert lines[1].split()[:3] == ["1", cid, "V4_9_8"]
    assert f"Subscription: {topic}  SubExpression: *" in status
    rows = [ln.split() for ln in lines if ln.startswith(topic + " ")]
    assert len(rows) == 4 and all(r[3] == cid for r in rows)
    assert "is not online" in bad
    head, *rest = progress.splitlines()
    assert head.split() == ["#Group", "#Count", "#Version", "#Type", "#Model", "#TPS", "#Diff", "Total"]
    by_group = {ln.split()[0]: ln.split() for ln in rest}
    assert by_group[cg][1:5] == ["1", "V4_9_8", "PUSH", "CLUSTERING"]
    assert by_group[group][1:3] == ["0", "OFFLINE"] and by_group[group][-1] == "0"


# ---- messages ------------------------------------------------------------------------------------------------------

def test_send_msg_status(live):
    """sendMsgStatus -b broker-a -c 3 sends 3 messages of -s bytes to the broker's own topic,
    one line each: the round trip and a SEND_OK result on broker-a."""
    ns, broker, *_ = live
    out = mqadmin("sendMsgStatus", "-n", ns.addr, "-b", "broker-a", "-s", "64", "-c", "3").stdout.splitlines()
    assert len(out) == 3
    for line in out:
        assert line.startswith("rt=") and "SendResult=SendResult [sendStatus=SEND_OK" in line
        assert "messageQueue=MessageQueue [topic=broker-a, brokerName=broker-a" in line
