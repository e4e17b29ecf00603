"""Transactional messages end to end: mq.client's TransactionProducer against a real mqnamesrv and
mqbroker (mq.broker.transaction), with the check pass made quick (transactionCheckInterval 300 ms,
transactionTimeOut 1 s, transactionCheckMax 3).

What a RocketMQ user relies on, each proved below:
  * a committed transaction is delivered exactly once, a rolled-back one never, an unknown one
    after the broker asked the producer (and as the producer then said);
  * a half is never visible to consumers, and the committed message looks as RocketMQ stores it;
  * a producer that never decides: its half is asked about transactionCheckMax times, then kept
    in TRANS_CHECK_MAX_TIME_TOPIC, never delivered; the metrics count the checks and the discard;
  * END_TRANSACTION that names a half wrongly is refused with RocketMQ's remarks, and ending one
    transaction twice (the original and a checked copy, or the same twice) commits it once;
  * a broker killed with halves pending asks about them after its restart, and a DLedger group
    whose leader is killed carries on from the new leader."""
import asyncio
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from mq.client import AdminClient, LocalTransactionState, Message, TransactionProducer
from mq.client.errors import MQClientError, RemotingTimeout
from mq.wire import commitlog as wcl
from mq.wire.codes import RequestCode as R, ResponseCode as RC
from mq.wire.headers import send_v2
from mq.wire.msgid import decode_offset_msg_id
from mq.chaos.clock import SlowSync
from mq.cluster import DLedgerGroup, free_port
from tests.ha.test_broker_ha import pull_bodies
from tests.client.clientkit import NameServer, own_cluster, read_topic, route_ready, run, uniq, until

COMMIT, ROLLBACK, UNKNOW = (LocalTransactionState.COMMIT_MESSAGE, LocalTransactionState.ROLLBACK_MESSAGE,
                            LocalTransactionState.UNKNOW)
TX_OPTIONS = dict(transactionCheckInterval=300, transactionTimeOut=1000, transactionCheckMax=3)
HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
CHECK_MAX_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with own_cluster(str(tmp_path_factory.mktemp("tx")), metricsPort=free_port(), **TX_OPTIONS) as c:
        yield c


read_all = read_topic


def test_commit_rollback_and_check(cluster):
    """30 transactions: a third committed at once, a third rolled back, a third UNKNOW, which the
    broker asks about; the checker commits half of those and rolls back the rest.  Exactly the
    committed ones arrive, once each, as RocketMQ stores them; the checker is asked only about the
    unknown ones."""
    ns, _ = cluster
    topic, group = uniq("T_tx"), uniq("PG_tx")
    checked: list[int] = []

    def decide(i: int) -> LocalTransactionState:
        return (COMMIT, ROLLBACK, UNKNOW)[i % 3]

    def checker(msg):
        i = int(msg.properties["seq"])
        checked.append(i)
        assert msg.topic == topic and msg.properties.get("TRAN_MSG") == "true"
        return COMMIT if i % 6 == 2 else ROLLBACK

    async def flow():
        async with TransactionProducer(group, ns.addr, checker=checker) as prod:
            results = []
            for i in range(30):
                msg = Message(topic, f"tx-{i}".encode(), tags="T", keys=f"k{i}", properties={"seq": str(i)})
                results.append(await prod.send_in_transaction(msg, lambda m, arg: decide(arg), i))
            assert [r.local_state for r in results] == [decide(i) for i in range(30)]
            committed = {i for i in range(30) if i % 3 == 0 or i % 6 == 2}
            await until(lambda: len(set(checked)) >= 10, 20, "the broker to ask about every unknown transaction")
            got = await read_all(ns.addr, topic, len(committed), settle_s=1.5)
            return results, committed, got

    results, committed, got = run(flow())
    assert sorted(int(m.properties["seq"]) for m in got) == sorted(committed), "each committed one once, no other"
    assert set(checked) == {i for i in range(30) if i % 3 == 2}
    by_seq = {int(m.properties["seq"]): m for m in got}
    for i, m in by_seq.items():
        assert m.body == f"tx-{i}".encode() and m.tags == "T" and m.keys == f"k{i}"
        assert m.sys_flag & wcl.TRANSACTION_MASK == wcl.TRANSACTION_COMMIT
        assert not {"TRAN_MSG", "REAL_TOPIC", "REAL_QID"} & set(m.properties)
        assert m.properties["PGROUP"] == group
        assert m.msg_id == results[i].transaction_id                    # the UNIQ_KEY the producer made
        if i % 3 == 0:                                                   # committed at once: the original half
            assert m.prepared_transaction_offset == decode_offset_msg_id(results[i].send_result.offset_msg_id)[2]


def test_a_transaction_never_decided_ends_in_the_check_max_topic(cluster):
    """A producer that answers UNKNOW to every check: asked transactionCheckMax (3) times, then the
    half goes to TRANS_CHECK_MAX_TIME_TOPIC; it never reaches its topic unless the producer ends
    the transaction after all."""
    ns, _ = cluster
    topic, group = uniq("T_txu"), uniq("PG_txu")
    asked: list[str] = []

    def checker(msg):
        asked.append(msg.msg_id)
        return UNKNOW

    async def flow():
        async with TransactionProducer(group, ns.addr, checker=checker) as prod:
            r = await prod.send_in_transaction(Message(topic, b"undecided", properties={"seq": "0"}),
                                               lambda m, a: UNKNOW)
            moved = await read_all_matching(ns.addr, CHECK_MAX_TOPIC, r.transaction_id, 20)
            await asyncio.sleep(1.0)               # no further check once it moved
            return r, moved

    checks_before = metric(cluster[1], "mq_transaction_checks_total")
    discarded_before = metric(cluster[1], "mq_transaction_discarded_total")
    r, moved = run(flow())
    assert asked == [r.transaction_id] * 3
    assert metric(cluster[1], "mq_transaction_checks_total") - checks_before >= 3
    assert metric(cluster[1], "mq_transaction_discarded_total") - discarded_before >= 1
    assert metric(cluster[1], "mq_transaction_half_pending") >= 0
    assert moved.body == b"undecided" and moved.properties["REAL_TOPIC"] == topic
    assert moved.properties["TRANSACTION_CHECK_TIMES"] == "3"
    assert run(read_all(ns.addr, topic, 0)) == []

    async def late_commit():
        """The producer decides after all (END_TRANSACTION for its original half): committed, as
        RocketMQ commits it, never answered SUCCESS without the message."""
        async with TransactionProducer(group, ns.addr, checker=checker) as prod:
            sr = r.send_result
            ext = {"producerGroup": group, "tranStateTableOffset": str(sr.queue_offset),
                   "commitLogOffset": str(decode_offset_msg_id(sr.offset_msg_id)[2]),
                   "commitOrRollback": str(wcl.TRANSACTION_COMMIT), "fromTransactionCheck": "false",
                   "msgId": r.transaction_id, "transactionId": r.transaction_id}
            resp = await prod.instance.invoke(cluster[1].addr, R.END_TRANSACTION, ext, timeout_s=5)
            assert resp.code == RC.SUCCESS, (resp.code, resp.remark)
            return await read_all(ns.addr, topic, 1, settle_s=0.5)
    assert [m.body for m in run(late_commit())] == [b"undecided"]


def metric(broker, name: str) -> float:
    """One sample of the broker's /metrics (the cluster and broker labels are the only ones)."""
    body = urllib.request.urlopen(f"http://127.0.0.1:{broker.options['metricsPort']}/metrics", timeout=5).read()
    for fam in text_string_to_metric_families(body.decode()):
        for sample in fam.samples:
            if sample.name == name:
                return sample.value
    raise AssertionError(f"{name} is not exposed")


async def read_all_matching(ns_addr: str, topic: str, uniq_id: str, timeout_s: float):
    async def find():
        try:
            got = await read_all(ns_addr, topic, 0)
        except MQClientError:           # no route yet: the topic is made on first use
            return None
        return next((m for m in got if m.msg_id == uniq_id), None)
    return await until(find, timeout_s, f"transaction {uniq_id} in {topic}", 0.2)


def test_end_transaction_is_checked_and_idempotent(cluster):
    """END_TRANSACTION (answered when not one-way, as RocketMQ does) naming the half with a wrong
    producer group, table offset or CommitLog offset is refused with RocketMQ's remark and changes
    nothing; the right one commits; the same commit again, and a rollback after it, change nothing:
    the message is delivered once.  A type that is neither commit nor rollback is not answered."""
    ns, broker = cluster
    topic, group = uniq("T_txe"), uniq("PG_txe")

    async def flow():
        async with TransactionProducer(group, ns.addr, checker=lambda m: UNKNOW) as prod:
            r = await prod.send_in_transaction(Message(topic, b"once", properties={"seq": "1"}), lambda m, a: UNKNOW)
            sr = r.send_result
            phy = decode_offset_msg_id(sr.offset_msg_id)[2]
            inst = prod.instance
            addr = inst.master_addr(sr.queue.broker_name)

            async def end(kind, group_=group, table=sr.queue_offset, offset=phy):
                ext = {"producerGroup": group_, "tranStateTableOffset": str(table), "commitLogOffset": str(offset),
                       "commitOrRollback": str(kind), "fromTransactionCheck": "false", "msgId": r.transaction_id,
                       "transactionId": r.transaction_id}
                return await inst.invoke(addr, R.END_TRANSACTION, ext, timeout_s=5)

            bad = [await end(wcl.TRANSACTION_COMMIT, group_="OtherGroup"),
                   await end(wcl.TRANSACTION_COMMIT, table=sr.queue_offset + 1000),
                   await end(wcl.TRANSACTION_COMMIT, offset=phy + 1)]
            assert [(b.code, b.remark) for b in bad[:2]] == [(RC.SYSTEM_ERROR, "The producer group wrong"),
                                                              (RC.SYSTEM_ERROR, "The transaction state table offset wrong")]
            assert bad[2].code == RC.SYSTEM_ERROR and bad[2].remark == "Find prepared transaction message failed"
            assert await read_all(ns.addr, topic, 0, settle_s=0.5) == []
            ok = [await end(wcl.TRANSACTION_COMMIT), await end(wcl.TRANSACTION_COMMIT),
                  await end(wcl.TRANSACTION_ROLLBACK)]
            assert [o.code for o in ok] == [RC.SUCCESS] * 3
            with pytest.raises(RemotingTimeout):
                await inst.invoke(addr, R.END_TRANSACTION, {"producerGroup": group, "tranStateTableOffset": "0",
                                                            "commitLogOffset": str(phy), "commitOrRollback": "0"},
                                  timeout_s=1.0)
            missing = await inst.invoke(addr, R.END_TRANSACTION, {"producerGroup": group}, timeout_s=5)
            assert missing.code == RC.SYSTEM_ERROR and "tranStateTableOffset" in missing.remark
            return await read_all(ns.addr, topic, 1, settle_s=2.5)      # past a check: none comes

    got = run(flow())
    assert [m.body for m in got] == [b"once"]


def test_pending_halves_are_checked_after_a_broker_is_killed(tmp_path):
    """kill -9 of every broker process with halves pending; after the restart the broker asks the
    producer about them and each is committed once."""
    # checks go on while no producer of the group is connected (each counts, as in RocketMQ):
    # enough of them that the halves are still asked about once the producer is back
    with own_cluster(str(tmp_path), **{**TX_OPTIONS, "transactionCheckMax": 1000}) as (ns, broker):
        topic, group = uniq("T_txk"), uniq("PG_txk")
        checked: list[int] = []

        async def send_pending():
            async with TransactionProducer(group, ns.addr, checker=lambda m: UNKNOW) as prod:
                for i in range(5):
                    await prod.send_in_transaction(Message(topic, b"p%d" % i, properties={"seq": str(i)}),
                                                   lambda m, a: UNKNOW)
        run(send_pending())
        broker.kill()
        broker.start()                      # same port and store: recovery after a crash
        run(route_ready(ns.addr, "TBW102"))

        def checker(msg):
            checked.append(int(msg.properties["seq"]))
            return COMMIT

        async def after():
            async with TransactionProducer(group, ns.addr, checker=checker):
                return await read_all(ns.addr, topic, 5, settle_s=1.5)
        got = run(after())
        assert sorted(int(m.properties["seq"]) for m in got) == list(range(5))
        assert sorted(set(checked)) == list(range(5))


def test_reject_transaction_message(cluster):
    """rejectTransactionMessage (changed at run time with UPDATE_BROKER_CONFIG): a half is refused
    with NO_PERMISSION and RocketMQ's remark, plain sends still pass; set back, halves pass again."""
    ns, _ = cluster
    topic, group = uniq("T_txr"), uniq("PG_txr")

    async def flow():
        async with AdminClient(ns.addr) as admin, \
                TransactionProducer(group, ns.addr, checker=lambda m: ROLLBACK) as prod:
            await admin.update_broker_config({"rejectTransactionMessage": "true"}, cluster="TestCluster")
            try:
                with pytest.raises(MQClientError) as refused:
                    await prod.send_in_transaction(Message(topic, b"no"), lambda m, a: COMMIT)
                assert refused.value.code == RC.NO_PERMISSION
                assert "sending transaction message is forbidden" in str(refused.value)
                await prod.send(Message(topic, b"plain"))
            finally:
                await admin.update_broker_config({"rejectTransactionMessage": "false"}, cluster="TestCluster")
            r = await prod.send_in_transaction(Message(topic, b"yes"), lambda m, a: COMMIT)
            assert r.local_state is COMMIT
            return await read_all(ns.addr, topic, 2, settle_s=0.5)

    assert sorted(m.body for m in run(flow())) == [b"plain", b"yes"]


def test_dledger_new_leader_carries_on_the_checks(tmp_path):
    """A DLedger group of three: transactions committed, rolled back and left unknown, then the
    leader's whole process group is killed before any check.  The new leader asks the producer
    about the unknown ones, and afterwards exactly the committed transactions are readable, each
    once: nothing committed lost, nothing committed twice, nothing rolled back visible."""
    ns = NameServer(str(tmp_path))
    group_ = None
    try:
        # the first check comes 3 s after a half's birth: after the kill and the election
        group_ = DLedgerGroup(str(tmp_path), ns.addr, **{**TX_OPTIONS, "transactionTimeOut": 3000})
        old = group_.wait_leader()
        run(route_ready(ns.addr, "TBW102"))
        topic, pgroup = uniq("T_txd"), uniq("PG_txd")
        asked: list[int] = []

        def decide(i: int) -> LocalTransactionState:
            return (COMMIT, ROLLBACK, UNKNOW)[i % 3]

        def checker(msg):
            i = int(msg.properties["seq"])
            asked.append(i)
            return COMMIT if i % 2 == 0 else ROLLBACK

        expected = {i for i in range(18) if i % 3 == 0 or (i % 3 == 2 and i % 2 == 0)}

        async def flow():
            async with TransactionProducer(pgroup, ns.addr, checker=checker, route_refresh_interval_s=0.5,
                                           heartbeat_interval_s=0.5) as prod:
                for i in range(18):
                    await prod.send_in_transaction(Message(topic, b"d%d" % i, properties={"seq": str(i)}),
                                                   lambda m, arg: decide(arg), i)
                # the one-way END_TRANSACTIONs of the six committed at once took effect on this leader
                await read_all(ns.addr, topic, 6)
                group_.kill(old)
                new = group_.wait_leader(15, among=[i for i in group_.ids if i != old])
                await until(lambda: {i for i in range(18) if i % 3 == 2} <= set(asked), 30,
                            "the new leader to ask about every unknown transaction")
                # read from the new leader itself: it may not have learned the topic's config yet
                # (followers copy metadata every slaveMetadataSyncInterval), so the route may lag
                addr = group_.addr(new)
                async def stored():
                    return len(await asyncio.to_thread(pull_bodies, addr, topic, 16)) >= len(expected)
                await until(stored, 30, "the committed messages")
                await asyncio.sleep(2.0)
                return await asyncio.to_thread(pull_bodies, addr, topic, 16)

        got = run(flow(), timeout_s=120)
        seqs = sorted(int(b[1:]) for b in got)
        assert seqs == sorted(expected), f"committed once each: {seqs}"
        assert {i for i in asked} <= {i for i in range(18) if i % 3 == 2}, "only unknown transactions are asked about"
    finally:
        try:
            if group_ is not None:
                group_.close()
        finally:
            ns.stop()


def test_a_transaction_committed_without_its_op_record_is_not_committed_again(cluster):
    """What a crash between storing a committed message and its op record leaves behind, made
    directly: a half left UNKNOW, and its committed message (transaction type COMMIT, the same
    UNIQ_KEY) in the real topic with no op record.  The check pass finds that message through the
    message index and writes the op record only: the producer is never asked (it would say
    COMMIT, and RocketMQ would commit again), and the message is there once."""
    ns, broker = cluster
    topic, group = uniq("T_txo"), uniq("PG_txo")
    asked: list[str] = []

    async def flow():
        async with TransactionProducer(group, ns.addr, checker=lambda m: asked.append(m.msg_id) or COMMIT) as prod:
            r = await prod.send_in_transaction(Message(topic, b"once", properties={"seq": "0"}), lambda m, a: UNKNOW)
            # as a commit from a checked copy stores it: naming the original half
            props = (f"UNIQ_KEY\x01{r.transaction_id}\x02PGROUP\x01{group}\x02seq\x010\x02"
                     f"TRAN_PREPARED_QUEUE_OFFSET\x01{r.send_result.queue_offset}")
            ext = send_v2(producerGroup=group, topic=topic, defaultTopic="TBW102", defaultTopicQueueNums=4,
                          queueId=r.send_result.queue.queue_id, sysFlag=wcl.TRANSACTION_COMMIT, bornTimestamp=0,
                          flag=0, properties=props)
            resp = await prod.instance.invoke(broker.addr, R.SEND_MESSAGE_V2, ext, b"once", timeout_s=5)
            assert resp.code == RC.SUCCESS, (resp.code, resp.remark)
            await asyncio.sleep(3.0)              # past transactionTimeOut (1 s): several check passes
            return r, await read_all(ns.addr, topic, 1, settle_s=0.5)

    r, got = run(flow())
    assert asked == [], "the producer was asked about a transaction whose message is stored"
    assert [m.body for m in got] == [b"once"]


def test_a_reused_message_is_two_transactions(cluster):
    """A producer that sends the same Message object in two transactions (its UNIQ_KEY kept, as
    Java's producer keeps it) gets two commits: transactions are told apart by their halves."""
    ns, _ = cluster
    topic, group = uniq("T_txr2"), uniq("PG_txr2")

    async def flow():
        async with TransactionProducer(group, ns.addr, checker=lambda m: ROLLBACK) as prod:
            msg = Message(topic, b"again", properties={"seq": "0"})
            first = await prod.send_in_transaction(msg, lambda m, a: COMMIT)
            second = await prod.send_in_transaction(msg, lambda m, a: COMMIT)
            assert first.transaction_id == second.transaction_id
            return await read_all(ns.addr, topic, 2, settle_s=2.0)

    assert [m.body for m in run(flow())] == [b"again", b"again"]


def test_concurrent_end_transactions_commit_once(tmp_path):
    """SYNC_FLUSH on a slow disk (each sync 300 ms more, the slowsync shim: a commit waits for its
    flush that long): five END_TRANSACTION commits of one half at once all answer SUCCESS, and
    the message is stored once (before, each commit that arrived while the first waited for its
    flush stored the message again)."""
    slow = SlowSync(str(tmp_path), "tx")
    with own_cluster(str(tmp_path), flushDiskType="SYNC_FLUSH", env=slow.env(), **TX_OPTIONS) as (ns, broker):
        topic, group = uniq("T_txc"), uniq("PG_txc")

        async def flow():
            async with TransactionProducer(group, ns.addr, checker=lambda m: UNKNOW) as prod:
                r = await prod.send_in_transaction(Message(topic, b"one"), lambda m, a: UNKNOW)
                slow.set(300)
                sr = r.send_result
                ext = {"producerGroup": group, "tranStateTableOffset": str(sr.queue_offset),
                       "commitLogOffset": str(decode_offset_msg_id(sr.offset_msg_id)[2]),
                       "commitOrRollback": str(wcl.TRANSACTION_COMMIT), "fromTransactionCheck": "false",
                       "msgId": r.transaction_id, "transactionId": r.transaction_id}
                answers = await asyncio.gather(*(prod.instance.invoke(broker.addr, R.END_TRANSACTION, ext,
                                                                      timeout_s=10) for _ in range(5)))
                assert [a.code for a in answers] == [RC.SUCCESS] * 5, [(a.code, a.remark) for a in answers]
                slow.set(0)
                return await read_all(ns.addr, topic, 1, settle_s=2.0)
        assert [m.body for m in run(flow())] == [b"one"]
