"""Finding messages the official C++ client (rocketmq==0.4.4) sent: by the msgId its
SendResult gives (the UNIQ_KEY), by its keys, by offset msgId, and a topic's time range,
through our mqadmin (QUERY_MESSAGE 12, VIEW_MESSAGE_BY_ID 33, QUERY_TOPIC_CONSUME_BY_WHO 300,
pulls) against a live mqnamesrv + mqbroker; and the index after the broker is killed -9."""
import asyncio
import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("rocketmq.client", reason="pip install rocketmq==0.4.4 (make test does)")

from mq.client import AdminClient  # noqa: E402
from mq.cluster import Broker, NameServer, wait_dispatched, wait_for  # noqa: E402
from mq.remoting import RemotingClient  # noqa: E402
from tests.compat.test_cpp_client import (Collector, _consumer_ids, _wait_route, make_producer,  # noqa: E402
                                          message, push_consumer, uniq)

MQADMIN = os.path.join(os.path.dirname(sys.executable), "mqadmin")
N = 30


def mqadmin(*args: str, expect: int = 0) -> str:
    r = subprocess.run([MQADMIN, *args], capture_output=True, text=True, timeout=60,
                       env={k: v for k, v in os.environ.items() if k != "NAMESRV_ADDR"})
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode == expect, f"mqadmin {' '.join(args)} -> {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r.stdout + r.stderr


@pytest.fixture(scope="module")
def sent(tmp_path_factory):
    """N messages from the C++ producer (keys "key-i <shared>", tags TagA/TagB/TagC), all
    consumed by one C++ push consumer group; small index files, so several are in use."""
    work = str(tmp_path_factory.mktemp("cppq"))
    ns = NameServer(work)
    broker = Broker(work, ns.addr, maxHashSlotNum=1000, maxIndexNum=70)
    _wait_route(ns.addr, "TBW102")
    topic, shared, group = uniq("T_query"), uniq("shared"), uniq("CG_query")
    prod = make_producer(ns.addr)
    ids = []
    try:
        for i in range(N):
            m = message(topic, i, ["TagA", "TagB", "TagC"][i % 3])
            m.set_keys(f"key-{i} {shared}")
            ids.append(prod.send_sync(m).msg_id)
    finally:
        prod.shutdown()
    col = Collector()
    cons = push_consumer(ns.addr, group, topic, col)
    try:
        wait_for(lambda: len(col.got) >= N, 60, 0.2, "all consumed")
        # the C++ client commits offsets every 5 s: wait until the broker holds them all
        wait_for(lambda: _backlog(ns.addr, group, topic) == 0, 30, 0.5, "offsets committed")
    finally:
        cons.shutdown()
    try:
        yield ns, broker, topic, shared, group, ids
    finally:
        broker.stop()
        ns.stop()


def _backlog(ns_addr: str, group: str, topic: str) -> int:
    """The group's backlog (GET_CONSUME_STATS); a poll that times out is wait_for's "not yet"."""
    async def ask():
        async with AdminClient(ns_addr) as admin:
            return (await admin.consumer_progress(group, topic)).diff_total
    return asyncio.run(ask())


def _field(out: str, name: str) -> str:
    m = re.search(rf"^{re.escape(name)}:\s+(.*)$", out, re.M)
    assert m, f"no {name!r} in\n{out}"
    return m.group(1).strip()


def test_cpp_msg_id_is_found_by_unique_key(sent):
    """The msgId the C++ SendResult reports is the UNIQ_KEY: queryMsgByUniqueKey prints that
    message with its properties and store host, and says the consuming group consumed it."""
    ns, broker, topic, shared, group, ids = sent
    for i in (0, 17, N - 1):
        out = mqadmin("queryMsgByUniqueKey", "-n", ns.addr, "-t", topic, "-i", ids[i])
        assert _field(out, "Message ID") == ids[i]
        assert _field(out, "Keys") == f"[key-{i} {shared}]"
        assert _field(out, "Store Host") == broker.addr
        assert f"seq={i}" in _field(out, "Properties")
        assert f"consumerGroup={group}, trackType=CONSUMED" in out


def test_query_msg_by_id_with_offset_id_and_unique_key(sent):
    """queryMsgById reads an offset msgId where it points, and with -t falls back to the
    unique key for the C++ client's ids."""
    ns, broker, topic, shared, group, ids = sent
    out = mqadmin("queryMsgById", "-n", ns.addr, "-t", topic, "-i", ids[3])
    offset_id = _field(out, "OffsetID")
    assert _field(out, "Message ID") == ids[3]
    out2 = mqadmin("queryMsgById", "-n", ns.addr, "-i", offset_id)
    assert _field(out2, "Message ID") == ids[3] and _field(out2, "OffsetID") == offset_id
    assert f"consumerGroup={group}, trackType=CONSUMED" in out2
    # a unique key without the topic cannot be looked up: one clear line, exit 1
    err = mqadmin("queryMsgById", "-n", ns.addr, "-i", ids[3], expect=1)
    assert "give the topic" in err


def test_query_msg_by_key(sent):
    ns, broker, topic, shared, group, ids = sent
    out = mqadmin("queryMsgByKey", "-n", ns.addr, "-t", topic, "-k", "key-7")
    rows = [line.split() for line in out.splitlines()[1:] if line.strip()]
    assert [r[0] for r in rows] == [ids[7]]
    out = mqadmin("queryMsgByKey", "-n", ns.addr, "-t", topic, "-k", shared)
    assert sorted(line.split()[0] for line in out.splitlines()[1:] if line.strip()) == sorted(ids)
    out = mqadmin("queryMsgByKey", "-n", ns.addr, "-t", topic, "-k", shared, "-c", "5")
    assert len([line for line in out.splitlines()[1:] if line.strip()]) == 5
    out = mqadmin("queryMsgByKey", "-n", ns.addr, "-t", topic, "-k", "no-such-key")
    assert out.splitlines()[1:] == []
    # a time range before the sends finds nothing
    out = mqadmin("queryMsgByKey", "-n", ns.addr, "-t", topic, "-k", "key-7", "-b", "0", "-e", "1000")
    assert out.splitlines()[1:] == []


def test_print_msg_walks_the_topic(sent):
    ns, broker, topic, shared, group, ids = sent
    out = mqadmin("printMsg", "-n", ns.addr, "-t", topic)
    got = re.findall(r"^MSGID: (\S+) .* BODY: (\S+)", out, re.M)
    assert sorted(g[0] for g in got) == sorted(ids)
    assert all(body.startswith("body-") for _, body in got)
    tag_a = mqadmin("printMsg", "-n", ns.addr, "-t", topic, "-s", "TagA", "-d", "false")
    lines = [line for line in tag_a.splitlines() if line.startswith("MSGID:")]
    assert len(lines) == N // 3 and all("NOT PRINT BODY" in line and "TAGS=TagA" in line for line in lines)


def test_query_message_bad_input_is_refused(sent):
    """QUERY_MESSAGE without a key or with a time that is no number: INVALID_PARAMETER, saying
    why; an unknown key: QUERY_NOT_FOUND (22)."""
    from mq.remoting import ResponseCode as RC
    ns, broker, topic, shared, group, ids = sent

    async def ask(ext):
        c = RemotingClient()
        try:
            return await c.invoke(broker.addr, c.request(12, ext), 5)
        finally:
            await c.close()
    r = asyncio.run(ask({"topic": topic, "maxNum": "4", "beginTimestamp": "0", "endTimestamp": "9"}))
    assert r.code == RC.INVALID_PARAMETER and "key" in r.remark
    r = asyncio.run(ask({"topic": topic, "key": "k", "maxNum": "4", "beginTimestamp": "0", "endTimestamp": "x"}))
    assert r.code == RC.INVALID_PARAMETER and "bad header" in r.remark
    r = asyncio.run(ask({"topic": topic, "key": "nothing", "maxNum": "4", "beginTimestamp": "0",
                         "endTimestamp": str(2 ** 62)}))
    assert r.code == 22 and "can not find message" in r.remark


def test_index_survives_kill_9(sent, tmp_path):
    """Messages sent right before a SIGKILL of every broker process are found by key after the
    restart (the store re-indexes from its recovery point), and new ones are indexed too."""
    work = str(tmp_path)
    ns = NameServer(work)
    broker = Broker(work, ns.addr, maxHashSlotNum=1000, maxIndexNum=500)
    try:
        _wait_route(ns.addr, "TBW102")
        topic = uniq("T_kill")
        prod = make_producer(ns.addr)
        try:
            before = [prod.send_sync(_keyed(topic, f"before-{i}")).msg_id for i in range(40)]
        finally:
            prod.shutdown()
        broker.kill()
        broker.start()
        prod = make_producer(ns.addr)
        try:
            after = [prod.send_sync(_keyed(topic, f"after-{i}")).msg_id for i in range(10)]
        finally:
            prod.shutdown()
        wait_dispatched(broker.addr)      # the index of the sends after the restart is built

        async def find_all():
            async with AdminClient(ns.addr) as admin:
                out = {}
                for i, mid in enumerate(before):
                    out[mid] = [m.msg_id for m in await admin.query_message(topic, f"before-{i}")]
                for i, mid in enumerate(after):
                    out[mid] = [m.msg_id for m in await admin.query_message(topic, f"after-{i}")]
                return out
        found = asyncio.run(find_all())
        assert found == {mid: [mid] for mid in before + after}
    finally:
        broker.stop()
        ns.stop()


def _keyed(topic: str, key: str):
    m = message(topic, 0, "TagK")
    m.set_keys(key)
    return m


def test_reset_offset_reaches_the_cpp_consumer(sent):
    """resetOffsetByTime while a C++ push consumer is online: the broker sends it
    RESET_CONSUMER_CLIENT_OFFSET in the spelling the C++ client reads (an array), and it
    consumes the topic again from the start."""
    ns, broker, topic, shared, group, ids = sent
    col = Collector()
    cons = push_consumer(ns.addr, group, topic, col)
    try:
        wait_for(lambda: _consumer_ids(broker.addr, group), 30, 0.2, "the consumer registered")
        assert len(col.got) == 0           # everything was consumed before
        out = mqadmin("resetOffsetByTime", "-n", ns.addr, "-g", group, "-t", topic, "-s", "0")
        assert "#brokerName" in out
        wait_for(lambda: len({g[3] for g in col.got}) >= N, 60, 0.2, "consumed again from the start")
    finally:
        cons.shutdown()
    assert {int(g[3]) for g in col.got} == set(range(N))
