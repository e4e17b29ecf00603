"""SQL92 filtering on the broker (enablePropertyFilter) with mq.client against real mqnamesrv and
mqbroker processes: pulls that name their expression (PullConsumer) and subscriptions carried by
heartbeats (PushConsumer) both get exactly the messages whose properties match, and nothing else;
text that does not parse and a broker without enablePropertyFilter are refused with RocketMQ's
codes and remarks, on PULL_MESSAGE and on CHECK_CLIENT_CONFIG (46) alike."""
import asyncio
import json

import pytest

from mq.client import Message, Producer, PullConsumer, PullStatus, PushConsumer
from mq.client.errors import MQBrokerError
from mq.wire.codes import RequestCode as R, ResponseCode as RC
from tests.client.clientkit import own_cluster, run, uniq, until

FILTER = "a >= 50 AND region = 'eu'"
N = 120


def expected() -> set[int]:
    return {i for i in range(N) if i >= 50 and i % 3 == 0}


def msg(topic: str, i: int) -> Message:
    return Message(topic, b"m%d" % i, tags="T", properties={"a": str(i), "region": "eu" if i % 3 == 0 else "us"})


@pytest.fixture(scope="module")
def filtering(tmp_path_factory):
    with own_cluster(str(tmp_path_factory.mktemp("sql")), enablePropertyFilter="true") as c:
        yield c


async def produce(ns_addr: str, topic: str) -> None:
    async with Producer(uniq("PG_sql"), ns_addr) as p:
        for i in range(N):
            await p.send(msg(topic, i))


def test_pulls_naming_an_sql92_expression(filtering):
    ns, _ = filtering
    topic = uniq("T_sql")

    async def flow():
        await produce(ns.addr, topic)
        async with PullConsumer(uniq("CG_sql"), ns.addr) as pc:
            queues = await pc.fetch_queues(topic)
            await until(lambda: total(pc, queues), 10, "dispatch")
            got = []
            for q in queues:
                offset = 0
                while True:
                    res = await pc.pull(q, offset, 32, FILTER, expression_type="SQL92")
                    if res.status is PullStatus.NO_NEW_MSG:
                        break
                    got += [int(m.properties["a"]) for m in res.messages]
                    offset = res.next_begin_offset
            with pytest.raises(MQBrokerError) as bad:
                await pc.pull(queues[0], 0, 32, "a >>> 1", expression_type="SQL92")
            return got, bad.value

    got, bad = run(flow())
    assert sorted(got) == sorted(expected())
    assert (bad.code, bad.remark) == (RC.SUBSCRIPTION_PARSE_FAILED, "parse the consumer's subscription failed")


async def total(pc, queues) -> bool:
    return sum([await pc.max_offset(q) for q in queues]) >= N


def test_push_consumer_subscribed_by_sql92(filtering):
    """The subscription rides in the heartbeats; every pull of the consumer is filtered by it."""
    ns, _ = filtering
    topic = uniq("T_sqlp")
    got: list[int] = []

    async def flow():
        await produce(ns.addr, topic)
        cons = PushConsumer(uniq("CG_sqlp"), ns.addr, consume_from="CONSUME_FROM_FIRST_OFFSET",
                            listener=lambda m: got.append(int(m.properties["a"])) or True)
        cons.subscribe(topic, FILTER, expression_type="SQL92")
        await cons.start()
        try:
            await until(lambda: len(got) >= len(expected()), 20, "the matching messages")
            await asyncio.sleep(1.0)
        finally:
            await cons.shutdown()

    run(flow())
    assert sorted(got) == sorted(expected())


def test_check_client_config(filtering):
    ns, broker = filtering

    async def flow():
        async with Producer(uniq("PG_chk"), ns.addr) as p:
            async def check(kind, text):
                body = json.dumps({"clientId": "c", "group": "g", "subscriptionData": {
                    "topic": "T", "subString": text, "expressionType": kind}}).encode()
                return await p.instance.invoke(broker.addr, R.CHECK_CLIENT_CONFIG, None, body, timeout_s=5)
            return [await check("SQL92", FILTER), await check("SQL92", "a >"), await check("TAG", "*")]

    ok, bad, tag = run(flow())
    assert ok.code == RC.SUCCESS and tag.code == RC.SUCCESS
    assert bad.code == RC.SUBSCRIPTION_PARSE_FAILED and "expected" in bad.remark


def test_a_broker_without_enable_property_filter_refuses(cluster):
    """The module-wide broker of tests/client (enablePropertyFilter off, RocketMQ's default)."""
    ns, broker = cluster
    topic = uniq("T_nosql")

    async def flow():
        async with Producer(uniq("PG_nosql"), ns.addr) as p:
            await p.send(msg(topic, 1))
            async with PullConsumer(uniq("CG_nosql"), ns.addr) as pc:
                q = (await pc.fetch_queues(topic))[0]
                with pytest.raises(MQBrokerError) as refused:
                    await pc.pull(q, 0, 32, FILTER, expression_type="SQL92")
            body = json.dumps({"clientId": "c", "group": "g", "subscriptionData": {
                "topic": topic, "subString": FILTER, "expressionType": "SQL92"}}).encode()
            check = await p.instance.invoke(broker.addr, R.CHECK_CLIENT_CONFIG, None, body, timeout_s=5)
            return refused.value, check

    refused, check = run(flow())
    remark = "The broker does not support consumer to filter message by SQL92"
    assert (refused.code, refused.remark) == (RC.SYSTEM_ERROR, remark)
    assert (check.code, check.remark) == (RC.SYSTEM_ERROR, remark)
