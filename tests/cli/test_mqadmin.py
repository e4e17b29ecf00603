"""The installed `mqadmin` console script, run as a subprocess against a live mqnamesrv + mqbroker:
every subcommand's output, and its exit codes (0 ok, 1 failed operation, 2 usage) without tracebacks."""
import json
import os
import subprocess
import sys

import pytest

from mq.client import MessageQueue, Producer, PushConsumer
from tests.client.clientkit import Collector, message, run, start_cluster, uniq, until

MQADMIN = os.path.join(os.path.dirname(sys.executable), "mqadmin")


def mqadmin(*args: str, env: dict | None = None, expect: int | None = 0) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != "NAMESRV_ADDR"}
    r = subprocess.run([MQADMIN, *args], capture_output=True, text=True, timeout=60, env={**environ, **(env or {})})
    assert "Traceback" not in r.stderr, r.stderr
    if expect is not None:
        assert r.returncode == expect, f"mqadmin {' '.join(args)} -> {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """A cluster with one topic of 4 queues holding 40 messages (10 per queue, seq = queue*10 + n on
    queue `seq // 10`), fully consumed by one group."""
    ns, broker = start_cluster(str(tmp_path_factory.mktemp("mqadmin")))
    topic, group = uniq("T_admin"), uniq("CG")

    async def prepare():
        async with Producer(uniq("PG"), ns.addr) as prod:
            await prod.send(message(topic, 0, "TagA"))          # creates the topic, seq 0 lands somewhere
            queues = [MessageQueue(topic, "broker-a", q) for q in range(4)]
            first = {}
            for i in range(1, 40):
                r = await prod.send_to_queue(message(topic, i, "TagB"), queues[i % 4])
                first.setdefault((r.queue.queue_id, r.queue_offset), i)
        col = Collector()
        cons = PushConsumer(group, ns.addr, listener=col)
        cons.subscribe(topic)
        await cons.start()
        try:
            await until(lambda: len(col) >= 40, 30, "all 40 consumed")
        finally:
            await cons.shutdown()
        return first

    try:
        placed = run(prepare())
        yield ns, broker, topic, group, placed
    finally:
        broker.stop()
        ns.stop()


def test_cluster_list(live):
    """clusterList: a header and one row per broker with cluster, name, id, address and version."""
    ns, broker, *_ = live
    out = mqadmin("clusterList", "-n", ns.addr).stdout.splitlines()
    assert out[0].split()[:5] == ["#Cluster", "Name", "#Broker", "Name", "#BID"]
    row = out[1].split()
    assert row[:5] == ["TestCluster", "broker-a", "0", broker.addr, "V4_9_8"]


def test_topic_list_and_route(live):
    """topicList has the topic (one per line); topicRoute prints the route JSON (master address,
    4 read/write queues, perm 6); NAMESRV_ADDR stands in for -n."""
    ns, broker, topic, *_ = live
    assert topic in mqadmin("topicList", "-n", ns.addr).stdout.splitlines()
    route = json.loads(mqadmin("topicRoute", "-t", topic, env={"NAMESRV_ADDR": ns.addr}).stdout)
    assert route["brokerDatas"][0]["brokerAddrs"] == {"0": broker.addr}
    qd = route["queueDatas"][0]
    assert (qd["brokerName"], qd["readQueueNums"], qd["writeQueueNums"], qd["perm"]) == ("broker-a", 4, 4, 6)


def test_topic_status(live):
    """topicStatus: one row per queue with min and max offsets summing to what was sent."""
    ns, _, topic, *_ = live
    lines = mqadmin("topicStatus", "-n", ns.addr, "-t", topic).stdout.splitlines()
    assert lines[0].startswith("#Broker Name") and "#Max Offset" in lines[0]
    rows = [ln.split() for ln in lines[1:]]
    assert [r[:2] for r in rows] == [["broker-a", str(q)] for q in range(4)]
    assert all(r[2] == "0" for r in rows) and sum(int(r[3]) for r in rows) == 40


def test_update_and_delete_topic(live):
    """updateTopic by cluster and by broker address creates the topic with the given queue counts
    (visible in the route); deleteTopic removes it from broker and name server (topicRoute then
    fails with exit 1)."""
    ns, broker, *_ = live
    t1, t2 = uniq("T_new"), uniq("T_new")
    out = mqadmin("updateTopic", "-n", ns.addr, "-c", "TestCluster", "-t", t1, "-r", "3", "-w", "3").stdout
    assert f"create topic to {broker.addr} success." in out
    assert f"TopicConfig [topicName={t1}, readQueueNums=3, writeQueueNums=3, perm=RW-" in out
    out = mqadmin("updateTopic", "--namesrvAddr", ns.addr, "--brokerAddr", broker.addr, "--topic", t2, "-p", "4").stdout
    assert f"topicName={t2}, readQueueNums=8, writeQueueNums=8, perm=R--" in out
    route = json.loads(mqadmin("topicRoute", "-n", ns.addr, "-t", t1).stdout)
    assert route["queueDatas"][0]["writeQueueNums"] == 3
    out = mqadmin("deleteTopic", "-n", ns.addr, "-c", "TestCluster", "-t", t1).stdout
    assert f"delete topic [{t1}] from cluster [TestCluster] success." in out
    listed = mqadmin("topicList", "-n", ns.addr).stdout.splitlines()
    assert t1 not in listed and t2 in listed
    r = mqadmin("topicRoute", "-n", ns.addr, "-t", t1, expect=1)
    assert "TOPIC_NOT_EXIST" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_consumer_progress(live):
    """consumerProgress: per queue broker and consumer offsets with no lag after full consumption,
    a Diff Total line; -t keeps one topic; an unknown group fails with exit 1."""
    ns, _, topic, group, _ = live
    out = mqadmin("consumerProgress", "-n", ns.addr, "-g", group).stdout.splitlines()
    assert out[0].split()[:3] == ["#Topic", "#Broker", "Name"]
    rows = [ln.split() for ln in out[1:] if ln.startswith(topic)]
    assert len(rows) == 4 and all(r[3] == r[4] and r[6] == "0" for r in rows)
    assert sum(int(r[3]) for r in rows) == 40
    assert "Diff Total: 0" in out
    only = mqadmin("consumerProgress", "-n", ns.addr, "-g", group, "-t", topic).stdout
    assert "%RETRY%" not in only and topic in only
    r = mqadmin("consumerProgress", "-n", ns.addr, "-g", uniq("nobody"), expect=1)
    assert "no consume progress" in r.stderr


def test_broker_status(live):
    """brokerStatus by address and by cluster: the sorted runtime table."""
    ns, broker, *_ = live
    out = mqadmin("brokerStatus", "-n", ns.addr, "-b", broker.addr).stdout
    table = {k.strip(): v.strip() for k, v in (line.split(":", 1) for line in out.splitlines())}
    assert table["brokerVersionDesc"] == "V4_9_8" and int(table["commitLogMaxOffset"]) > 0
    assert "brokerVersionDesc" in mqadmin("brokerStatus", "-n", ns.addr, "-c", "TestCluster").stdout


def test_get_broker_config(live):
    """getBrokerConfig by address and by cluster: a ==addr== header, then key = value lines."""
    ns, broker, *_ = live
    for how in (["-b", broker.addr], ["-c", "TestCluster"]):
        out = mqadmin("getBrokerConfig", "-n", ns.addr, *how).stdout.splitlines()
        assert out[0] == f"============{broker.addr}============"
        config = {k.strip(): v.strip() for k, v in (line.split("=", 1) for line in out[1:])}
        assert config["brokerName"] == "broker-a" and config["listenPort"] == str(broker.port)


def test_query_msg_by_offset(live):
    """queryMsgByOffset prints the message stored at topic/broker/queue/offset (keys, tags, body,
    queue coordinates); an offset past the end fails with exit 1 naming the queue's range."""
    ns, _, topic, _, placed = live
    (qid, qoff), seq = sorted(placed.items())[3]
    out = mqadmin("queryMsgByOffset", "-n", ns.addr, "-t", topic, "-b", "broker-a", "-i", str(qid),
                  "-o", str(qoff)).stdout
    fields = {line[:20].strip(): line[21:] for line in out.splitlines()}
    assert fields["Topic:"] == topic and fields["Keys:"] == f"[key-{seq}]" and fields["Tags:"] == "[TagB]"
    assert fields["Queue ID:"] == str(qid) and fields["Queue Offset:"] == str(qoff)
    assert fields["Message Body:"] == f"body-{seq}-" + "x" * (seq % 300)
    assert f"seq={seq}" in fields["Properties:"]
    r = mqadmin("queryMsgByOffset", "-n", ns.addr, "-t", topic, "-b", "broker-a", "-i", "0", "-o", "999", expect=1)
    assert "no message at offset 999" in r.stderr


def test_failures_and_usage_errors(live):
    """Unreachable name server, unknown cluster -> exit 1 with one line on stderr; a missing required
    flag, a bad number, no name server at all, an unknown subcommand or none -> exit 2."""
    ns, *_ = live
    r = mqadmin("topicList", "-n", "127.0.0.1:1", expect=1)
    assert "cannot connect" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = mqadmin("getBrokerConfig", "-n", ns.addr, "-c", "NoSuchCluster", expect=1)
    assert "NoSuchCluster" in r.stderr
    assert "the following arguments are required: -t/--topic" in mqadmin("topicRoute", "-n", ns.addr, expect=2).stderr
    mqadmin("queryMsgByOffset", "-n", ns.addr, "-t", "T", "-b", "b", "-i", "x", "-o", "1", expect=2)
    mqadmin("updateTopic", "-n", ns.addr, "-t", "T", expect=2)                 # neither -b nor -c
    assert "no name server" in mqadmin("topicList", expect=2).stderr
    mqadmin("noSuchCommand", expect=2)
    mqadmin(expect=2)
