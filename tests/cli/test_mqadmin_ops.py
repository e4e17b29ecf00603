"""The operators' mqadmin commands, each run as the installed console script against a live
mqnamesrv + mqbroker, each checked by its effect (not only its output): groups created and
deleted, offsets reset (with the group's consumer offline, and online: it is told and consumes
again), write permission wiped and restored at the name server, a runtime config key changed
in every io worker and in broker.conf, live producer and consumer connections listed, a message
sent and pulled back, round trips and consume stats printed."""
import asyncio
import json

import pytest

from mq.client import Producer, PushConsumer
from mq.cluster import call, wait_dispatched
from tests.cli.adminkit import committed, consumed_cluster
from tests.cli.test_mqadmin import mqadmin
from tests.client.clientkit import Collector, message, run, uniq, until


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """A cluster with one 4-queue topic holding 40 messages, fully consumed by one group (offline now)."""
    with consumed_cluster(str(tmp_path_factory.mktemp("mqadmin_ops")), "ops", 40) as cluster:
        yield cluster


def groups_at(broker) -> dict:
    return json.loads(call(broker.addr, 201).body)["subscriptionGroupTable"]


def test_update_and_delete_sub_group(live):
    ns, broker, topic, group = live
    g = uniq("CG_new")
    out = mqadmin("updateSubGroup", "-n", ns.addr, "-b", broker.addr, "-g", g, "-r", "5", "-q", "2").stdout
    assert f"create subscription group to {broker.addr} success." in out
    cfg = groups_at(broker)[g]
    assert cfg["retryMaxTimes"] == 5 and cfg["retryQueueNums"] == 2 and cfg["consumeEnable"] is True
    mqadmin("updateSubGroup", "-n", ns.addr, "-c", "TestCluster", "-g", g, "-s", "false")
    assert groups_at(broker)[g]["consumeEnable"] is False
    # deleting with -r true drops the group's offsets too
    assert call(broker.addr, 15, {"consumerGroup": g, "topic": topic, "queueId": 0, "commitOffset": 3}).code == 0
    out = mqadmin("deleteSubGroup", "-n", ns.addr, "-b", broker.addr, "-g", g, "-r", "true").stdout
    assert f"delete subscription group [{g}] from broker [{broker.addr}] success." in out
    assert g not in groups_at(broker)
    assert f"{topic}@{g}" not in json.loads(call(broker.addr, 43).body)["offsetTable"]


def test_reset_offset_by_time_with_the_group_offline(live):
    """No consumer online: the broker answers CONSUMER_NOT_ONLINE and mqadmin commits the
    offsets itself; time 0 puts every queue back at its first message, 'now' at its end."""
    ns, broker, topic, group = live
    assert committed(broker, group, topic) == [10, 10, 10, 10]
    out = mqadmin("resetOffsetByTime", "-n", ns.addr, "-g", group, "-t", topic, "-s", "0").stdout
    rows = [ln.split() for ln in out.splitlines()[2:]]
    assert sorted((r[0], int(r[1]), int(r[2])) for r in rows) == [("broker-a", q, 0) for q in range(4)]
    assert committed(broker, group, topic) == [0, 0, 0, 0]
    mqadmin("resetOffsetByTime", "-n", ns.addr, "-g", group, "-t", topic, "-s", "now")
    assert committed(broker, group, topic) == [10, 10, 10, 10]
    r = mqadmin("resetOffsetByTime", "-n", ns.addr, "-g", uniq("nobody"), "-t", topic, "-s", "0", expect=1)
    assert "not exist" in r.stderr


def test_reset_offset_by_time_tells_online_consumers(live):
    """A consumer online: RESET_CONSUMER_CLIENT_OFFSET (220) reaches it, it drops its queues,
    commits the reset offsets and consumes all 40 messages again."""
    ns, broker, topic, group = live

    async def go():
        col = Collector()
        cons = PushConsumer(group, ns.addr, listener=col)
        cons.subscribe(topic)
        await cons.start()
        try:
            await until(lambda: len([q for q in cons.assigned_queues() if q.topic == topic]) == 4, 30,
                        "queues assigned")
            await asyncio.sleep(0.5)
            assert len(col) == 0
            out = (await asyncio.to_thread(mqadmin, "resetOffsetByTime", "-n", ns.addr, "-g", group, "-t", topic,
                                           "-s", "0")).stdout
            assert "#brokerName" in out
            await until(lambda: len(col) >= 40, 30, "all 40 consumed again")
        finally:
            await cons.shutdown()
        return col
    col = run(go())
    assert len(col) == 40
    assert committed(broker, group, topic) == [10, 10, 10, 10]


def test_wipe_and_add_write_perm(live):
    ns, broker, topic, group = live

    def perm():
        r = call(ns.addr, 105, {"topic": topic})
        return json.loads(r.body)["queueDatas"][0]["perm"]
    out = mqadmin("wipeWritePerm", "-n", ns.addr, "-b", "broker-a").stdout
    assert f"wipe write perm of broker[broker-a] in name server[{ns.addr}] OK" in out
    try:
        assert perm() & 2 == 0
        r = mqadmin("sendMessage", "-n", ns.addr, "-t", topic, "-p", "refused", expect=1)
        assert "error" in r.stderr
    finally:
        out = mqadmin("addWritePerm", "-n", ns.addr, "-b", "broker-a").stdout
    assert f"add write perm of broker[broker-a] in name server[{ns.addr}] OK" in out
    assert perm() & 6 == 6


def test_update_broker_config_takes_effect_everywhere(live):
    """brokerPermission=4 at run time: every io worker refuses sends (NO_PERMISSION), the name
    server learns the read-only perm, getBrokerConfig and broker.conf show it; back to 6 after.
    A key that cannot change at run time is refused with the list of those that can."""
    ns, broker, topic, group = live
    out = mqadmin("updateBrokerConfig", "-n", ns.addr, "-b", broker.addr, "-k", "brokerPermission", "-v", "4").stdout
    assert f"update broker config success, {broker.addr}" in out
    try:
        config = mqadmin("getBrokerConfig", "-n", ns.addr, "-b", broker.addr).stdout
        assert "brokerPermission                                  =  4" in config
        with open(broker.conf) as f:
            assert "brokerPermission=4" in f.read().splitlines()
        # several connections, so more than one io worker answers
        codes = {call(broker.addr, 310, {"a": "PG", "b": topic, "c": "TBW102", "d": 4, "e": 0, "f": 0, "g": 0,
                                         "h": 0}, b"x").code for _ in range(8)}
        assert codes == {16}                               # NO_PERMISSION
    finally:
        mqadmin("updateBrokerConfig", "-n", ns.addr, "-c", "TestCluster", "-k", "brokerPermission", "-v", "6")
    assert call(broker.addr, 310, {"a": "PG", "b": topic, "c": "TBW102", "d": 4, "e": 0, "f": 0, "g": 0, "h": 0},
                b"x").code == 0
    r = mqadmin("updateBrokerConfig", "-n", ns.addr, "-b", broker.addr, "-k", "listenPort", "-v", "1", expect=1)
    assert "cannot change while the broker runs" in r.stderr and "slaveReadEnable" in r.stderr


def test_producer_and_consumer_connections(live):
    ns, broker, topic, group = live
    pg, cg = uniq("PG_conn"), uniq("CG_conn")

    async def go():
        async with Producer(pg, ns.addr) as prod:
            await prod.send(message(topic, 1, "TagA"))
            cons = PushConsumer(cg, ns.addr, listener=Collector())
            cons.subscribe(topic, "TagA || TagB")
            await cons.start()
            try:
                p_out = (await asyncio.to_thread(mqadmin, "producerConnection", "-n", ns.addr, "-g", pg,
                                                 "-t", topic)).stdout
                c_out = (await asyncio.to_thread(mqadmin, "consumerConnection", "-n", ns.addr, "-g", cg)).stdout
                return p_out, c_out, prod.instance.client_id, cons.instance.client_id
            finally:
                await cons.shutdown()
    p_out, c_out, pid, cid = run(go())
    rows = p_out.splitlines()
    assert len(rows) == 1 and rows[0].split()[:2] == ["0001", pid] and "127.0.0.1:" in rows[0]
    assert c_out.splitlines()[0].split()[:2] == ["0001", cid]
    assert f"Topic: {topic}" in c_out and "SubExpression: TagA || TagB" in c_out
    assert "ConsumeType: CONSUME_PASSIVELY" in c_out and "MessageModel: CLUSTERING" in c_out
    r = mqadmin("consumerConnection", "-n", ns.addr, "-g", cg, "-b", broker.addr, expect=1)
    assert "not online" in r.stderr


def test_send_and_consume_message(live):
    ns, broker, topic, group = live
    t = uniq("T_sendmsg")
    mqadmin("updateTopic", "-n", ns.addr, "-b", broker.addr, "-t", t, "-r", "2", "-w", "2")
    out = mqadmin("sendMessage", "-n", ns.addr, "-t", t, "-p", "hello-ops", "-k", "K1", "-c", "TagZ",
                  "-b", "broker-a", "-i", "1").stdout.splitlines()
    assert out[1].split()[:3] == ["broker-a", "1", "SEND_OK"]
    msg_id = out[1].split()[3]
    wait_dispatched(broker.addr)
    got = mqadmin("consumeMessage", "-n", ns.addr, "-t", t).stdout
    lines = [ln for ln in got.splitlines() if ln.startswith("MSGID:")]
    assert len(lines) == 1 and lines[0].startswith(f"MSGID: {msg_id} ") and lines[0].endswith("BODY: hello-ops")
    assert "KEYS=K1" in lines[0] and "TAGS=TagZ" in lines[0] and "Consume ok, 1 message(s)" in got
    one = mqadmin("consumeMessage", "-n", ns.addr, "-t", topic, "-b", "broker-a", "-i", "2", "-o", "7").stdout
    offsets = [int(ln.split("queueOffset=")[1].split(",")[0]) for ln in one.splitlines() if ln.startswith("MSGID:")]
    assert offsets[:3] == [7, 8, 9] and all(o >= 7 for o in offsets)


def test_cluster_rt_and_broker_consume_stats(live):
    ns, broker, topic, group = live
    out = mqadmin("clusterRT", "-n", ns.addr, "-a", "5", "-s", "64").stdout.splitlines()
    assert out[0].split() == ["#Cluster", "Name", "#Broker", "Name", "#RT", "#successCount", "#failCount"]
    row = out[1].split()
    assert row[:2] == ["TestCluster", "broker-a"] and float(row[2]) > 0 and row[3:] == ["5", "0"]
    out = mqadmin("brokerConsumeStats", "-n", ns.addr, "-b", broker.addr).stdout.splitlines()
    mine = [ln.split() for ln in out if ln.startswith(topic) and group in ln]
    # the group consumed the first 10 of each queue; other tests sent more since
    assert len(mine) == 4 and all(r[5] == "10" and int(r[6]) == int(r[4]) - 10 for r in mine)
    assert out[-1].startswith("Diff Total:")
    most = max(int(r[6]) for r in mine)
    lagging = mqadmin("brokerConsumeStats", "-n", ns.addr, "-b", broker.addr, "-l", str(most + 1)).stdout
    assert group not in lagging


def test_stats_all_and_broker_stats_data(live):
    """statsAll: a topic's messages in today equal what its queues hold (every one was sent since
    the broker started), its group's out count what pulls returned (at least the 40 consumed),
    the group's backlog; a topic nobody consumes says NO_CONSUMER. VIEW_BROKER_STATS_DATA
    refuses a counter it does not keep."""
    ns, broker, topic, group = live
    stored = sum(int(r.split()[3]) for r in mqadmin("topicStatus", "-n", ns.addr, "-t", topic).stdout.splitlines()[1:])
    out = mqadmin("statsAll", "-n", ns.addr, "-t", topic).stdout.splitlines()
    assert out[0].split()[:3] == ["#Topic", "#Consumer", "Group"]
    row = next(ln.split() for ln in out[1:] if ln.split()[:2] == [topic, group])
    backlog, in_tps, out_tps, in_day, out_day = int(row[2]), float(row[3]), float(row[4]), int(row[5]), int(row[6])
    assert in_day == stored and out_day >= 40 and in_tps >= 0 and out_tps >= 0
    progress = mqadmin("consumerProgress", "-n", ns.addr, "-g", group, "-t", topic).stdout
    assert f"Diff Total: {backlog}" in progress
    lonely = uniq("T_lonely")
    mqadmin("sendMessage", "-n", ns.addr, "-t", lonely, "-p", "alone")
    out = mqadmin("statsAll", "-n", ns.addr, "-t", lonely).stdout.splitlines()
    assert out[1].split()[0] == lonely and out[1].split()[-2:] == ["1", "NO_CONSUMER"]
    r = call(broker.addr, 315, {"statsName": "SNDBCK_PUT_NUMS", "statsKey": topic})
    assert r.code == 1 and "not exist" in r.remark
    status = mqadmin("brokerStatus", "-n", ns.addr, "-b", broker.addr).stdout
    put_tps = next(line.split(":", 1)[1].split() for line in status.splitlines() if line.startswith("putTps"))
    assert len(put_tps) == 3 and float(put_tps[2]) > 0          # the 10-minute window holds every send
