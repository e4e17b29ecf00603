"""Request-reply (RocketMQ 4.6+) end to end against a real mqnamesrv and mqbroker: mq.client's
Producer.request, a PushConsumer that answers with create_reply, the broker's SEND_REPLY_MESSAGE_V2
(325) and PUSH_REPLY_MESSAGE_TO_CLIENT (326) across its io workers.

Proved: every request gets its own reply (matched by correlation id, many in flight at once, four
requesters whose connections land on either io worker); the reply is stored in <cluster>_REPLY_TOPIC
too (storeReplyMessageEnable); a request nobody answers times out with RequestTimeout; a reply
for a requester that is not connected is refused with RocketMQ's remark (and still stored), and
one without REPLY_TO_CLIENT likewise."""
import asyncio

import pytest

from mq.client import FIRST, Message, Producer, PushConsumer, RequestTimeout, create_reply
from mq.cluster import wait_for
from mq.wire.codes import RequestCode as R, ResponseCode as RC
from mq.wire.headers import send_v2
from tests.client.clientkit import read_topic, route_ready, run, uniq

CLUSTER = "TestCluster"
REPLY_TOPIC = f"{CLUSTER}_REPLY_TOPIC"


async def replier(ns_addr: str, topic: str):
    """A consumer of `topic` that answers each request with b"re:" + its body; (consumer, producer)."""
    answer = Producer(uniq("PG_replier"), ns_addr)
    await answer.start()

    async def listener(msg):
        await answer.send(create_reply(msg, b"re:" + msg.body))
        return True
    cons = PushConsumer(uniq("CG_replier"), ns_addr, consume_from=FIRST, listener=listener)
    cons.subscribe(topic, "*")
    await cons.start()
    return cons, answer


def test_each_request_gets_its_own_reply(cluster):
    """40 requests from 4 requesters, 10 in flight each: every one answered with its own body; the
    replies are stored in the reply topic as well."""
    ns, _ = cluster
    topic = uniq("T_req")

    async def flow():
        requesters = [await Producer(uniq("PG_req"), ns.addr).start() for _ in range(4)]
        try:
            await requesters[0].send(Message(topic, b"warm-up: makes the topic"))
            await route_ready(ns.addr, topic)
            cons, answer = await replier(ns.addr, topic)
            try:
                async def one(p, i):
                    reply = await p.request(Message(topic, b"q%d" % i), timeout_s=15)
                    return i, reply
                got = await asyncio.gather(*(one(requesters[i % 4], i) for i in range(40)))
            finally:
                await cons.shutdown()
                await answer.shutdown()
            return got
        finally:
            for p in requesters:
                await p.shutdown()

    got = run(flow())
    for i, reply in got:
        assert reply.body == b"re:q%d" % i
        assert reply.topic == REPLY_TOPIC and reply.properties["MSG_TYPE"] == "reply"
        assert "PUSH_REPLY_TIME" in reply.properties
    stored_replies(ns.addr, {b"re:q%d" % i for i in range(40)})


def stored_replies(ns_addr: str, want: set) -> set:
    """The reply topic's bodies, once all of `want` are readable there (or TimeoutError): the
    broker pushes a reply to its requester before storing it, as RocketMQ does, and the dispatch
    makes it readable after that."""
    def got():
        bodies = {m.body for m in run(read_topic(ns_addr, REPLY_TOPIC))}
        return bodies if want <= bodies else None
    return wait_for(got, 20, 0.1, f"{len(want)} replies readable in {REPLY_TOPIC}")


def test_a_request_nobody_answers_times_out(cluster):
    ns, _ = cluster
    topic = uniq("T_noreq")

    async def flow():
        async with Producer(uniq("PG_req"), ns.addr) as p:
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            with pytest.raises(RequestTimeout):
                await p.request(Message(topic, b"anyone?"), timeout_s=1.0)
            return loop.time() - t0

    assert 0.9 <= run(flow()) < 5


def test_a_reply_for_no_connected_requester_is_refused(cluster):
    """SEND_REPLY_MESSAGE_V2 whose REPLY_TO_CLIENT is connected nowhere, or missing: SYSTEM_ERROR
    with RocketMQ's remark; the reply is still stored."""
    ns, broker = cluster

    async def flow():
        async with Producer(uniq("PG_rep"), ns.addr) as p:
            inst = p.instance
            await route_ready(ns.addr, REPLY_TOPIC)

            async def reply(props: str, body: bytes):
                ext = send_v2(producerGroup="PG", topic=REPLY_TOPIC, defaultTopic="TBW102", defaultTopicQueueNums=4,
                              queueId=0, sysFlag=0, bornTimestamp=0, flag=0, properties=props)
                return await inst.invoke(broker.addr, R.SEND_REPLY_MESSAGE_V2, ext, body, timeout_s=5)
            nobody = await reply("MSG_TYPE\x01reply\x02CORRELATION_ID\x01c1\x02REPLY_TO_CLIENT\x01127.0.0.1@nobody\x02",
                                 b"orphan-1")
            missing = await reply("MSG_TYPE\x01reply\x02CORRELATION_ID\x01c2\x02", b"orphan-2")
            return nobody, missing

    nobody, missing = run(flow())
    assert (nobody.code, nobody.remark) == (RC.SYSTEM_ERROR, "push reply message fail, channel of <127.0.0.1@nobody> "
                                                            "not found.")
    assert (missing.code, missing.remark) == (RC.SYSTEM_ERROR, "reply message properties[REPLY_TO_CLIENT] is null")
    stored_replies(ns.addr, {b"orphan-1", b"orphan-2"})


def test_a_large_reply_arrives_as_it_was_sent(cluster):
    """A reply of 10 KiB (the replier's producer compresses bodies of 4 KiB or more) reaches the
    requester inflated."""
    ns, _ = cluster
    topic = uniq("T_bigreq")
    big = bytes(range(256)) * 40

    async def flow():
        async with Producer(uniq("PG_req"), ns.addr) as p:
            await p.send(Message(topic, b"warm-up: makes the topic"))
            await route_ready(ns.addr, topic)
            answer = Producer(uniq("PG_replier"), ns.addr)
            await answer.start()

            async def listener(msg):
                if msg.body != b"warm-up: makes the topic":
                    await answer.send(create_reply(msg, big))
                return True
            cons = PushConsumer(uniq("CG_replier"), ns.addr, consume_from=FIRST, listener=listener)
            cons.subscribe(topic, "*")
            await cons.start()
            try:
                return await p.request(Message(topic, b"send me the big one"), timeout_s=15)
            finally:
                await cons.shutdown()
                await answer.shutdown()

    reply = run(flow())
    assert reply.body == big and not reply.sys_flag & 0x1
