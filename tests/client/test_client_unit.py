"""mq.client pieces that need no broker process: allocation, queue selection, ids, decoding, routes,
offset files, and (against in-process fake servers) the pull-from-slave rule of spec section 5."""
import asyncio
import json
import re
import zlib

import pytest

from mq.client import (ConsumeFromWhere, Message, MessageModel, MessageQueue, PushConsumer, allocate_averagely,
                       select_by_hash)
from mq.client.consumer import LocalOffsetStore
from mq.wire.headers import PULL_COMMIT_OFFSET, PULL_SUSPEND
from mq.client.instance import ClientInstance, parse_namesrv_addr
from mq.client.errors import MQClientError
from mq.client.message import (SYSFLAG_COMPRESSED, SYSFLAG_ZLIB, SubscriptionData, _coerce, decode_messages,
                               message_from_record, new_uniq_id)
from mq.client.producer import _PublishInfo
from mq.client.route import ClusterInfo, TopicRouteData, find_broker_addr_in_subscribe
from mq.remoting import RemotingServer, make_response
from mq.wire.codes import RequestCode as R, ResponseCode as RC
from mq.wire.commitlog import build_record, parse_record
from mq.wire.properties import encode_properties


def _queues(n, broker="b", topic="T"):
    return [MessageQueue(topic, broker, i) for i in range(n)]


def test_allocate_averagely_matches_java():
    """AllocateMessageQueueAveragely: 8 queues over 3 consumers -> 3/3/2 contiguous; fewer queues than
    consumers -> one each for the first ones, none for the rest; unknown consumer -> nothing; the union
    is every queue exactly once whatever order the inputs come in."""
    mqs = _queues(8)
    cids = ["c", "a", "b"]
    got = {c: allocate_averagely(list(reversed(mqs)), cids, c) for c in cids}
    assert [q.queue_id for q in got["a"]] == [0, 1, 2]
    assert [q.queue_id for q in got["b"]] == [3, 4, 5]
    assert [q.queue_id for q in got["c"]] == [6, 7]
    two = _queues(2)
    assert [len(allocate_averagely(two, cids, c)) for c in ("a", "b", "c")] == [1, 1, 0]
    assert allocate_averagely(mqs, cids, "zzz") == []
    for n_q in range(1, 12):
        for n_c in range(1, 6):
            ids = [f"c{i}" for i in range(n_c)]
            allq = [q for c in ids for q in allocate_averagely(_queues(n_q), ids, c)]
            assert sorted(allq) == _queues(n_q)


def test_message_queue_order_is_topic_broker_queue():
    """MessageQueue sorts like Java's compareTo: topic, then broker name, then queue id."""
    qs = [MessageQueue("T", "b", 1), MessageQueue("T", "a", 2), MessageQueue("S", "z", 0), MessageQueue("T", "a", 0)]
    assert sorted(qs) == [MessageQueue("S", "z", 0), MessageQueue("T", "a", 0), MessageQueue("T", "a", 2),
                          MessageQueue("T", "b", 1)]


def test_uniq_key_format_and_uniqueness():
    """UNIQ_KEY is 32 uppercase hex characters and never repeats within a process."""
    ids = [new_uniq_id() for _ in range(20000)]
    assert all(re.fullmatch(r"[0-9A-F]{32}", i) for i in ids)
    assert len(set(ids)) == len(ids)


def test_message_sets_java_properties():
    """A Message carries TAGS, space-joined KEYS, DELAY and WAIT=true like Java's Message constructor."""
    m = Message("T", "héllo", tags="TagA", keys=["k1", "k2"], properties={"seq": 3}, delay_level=2)
    assert m.body == "héllo".encode()
    assert m.properties == {"seq": "3", "TAGS": "TagA", "KEYS": "k1 k2", "DELAY": "2", "WAIT": "true"}
    assert Message("T", b"x", wait_store_msg_ok=False).properties["WAIT"] == "false"


def test_select_by_hash_is_javas():
    """SelectMessageQueueByHash: abs(hashCode % n) for ints (including negatives) and strings."""
    qs = _queues(4)
    assert select_by_hash(qs, None, 7).queue_id == 3
    assert select_by_hash(qs, None, -7).queue_id == 3       # Java: -7 % 4 == -3, abs -> 3
    assert select_by_hash(qs, None, "TagA").queue_id == 2598919 % 4
    assert select_by_hash(qs, None, "order-42") == select_by_hash(qs, None, "order-42")


def test_publish_queue_selection_avoids_the_failed_broker():
    """Round robin over every writable queue; after a failure on broker a the next pick is on another
    broker, isolated brokers are skipped while others exist, and with one broker left it is still used."""
    qs = _queues(2, "a") + _queues(2, "b")
    info = _PublishInfo(qs, None, False)
    picks = [info.select(None, set()) for _ in range(8)]
    assert {q for q in picks} == set(qs)
    for _ in range(10):
        assert info.select("a", set()).broker_name == "b"
        assert info.select(None, {"b"}).broker_name == "a"
    only_a = _PublishInfo(_queues(2, "a"), None, False)
    assert only_a.select("a", {"a"}).broker_name == "a"


ROUTE_UNQUOTED = (b'{"brokerDatas":[{"brokerAddrs":{0:"10.0.0.1:10911",1:"10.0.0.2:10911"},"brokerName":"broker-a",'
                  b'"cluster":"C"},{"brokerAddrs":{1:"10.0.0.3:10911"},"brokerName":"broker-b","cluster":"C"}],'
                  b'"filterServerTable":{},"queueDatas":[{"brokerName":"broker-a","perm":6,"readQueueNums":4,'
                  b'"topicSynFlag":0,"writeQueueNums":2},{"brokerName":"broker-b","perm":6,"readQueueNums":3,'
                  b'"topicSysFlag":0,"writeQueueNums":3}]}')


def test_route_to_queues():
    """Route JSON with fastjson's unquoted keys: publish queues only on brokers with a master (write
    counts), subscribe queues on every readable broker (read counts); TBW102's route borrowed for a
    new topic caps each broker at defaultTopicQueueNums."""
    route = TopicRouteData.decode(ROUTE_UNQUOTED)
    assert route.broker("broker-a").broker_addrs == {0: "10.0.0.1:10911", 1: "10.0.0.2:10911"}
    assert route.publish_queues("T") == _queues(2, "broker-a")
    assert route.subscribe_queues("T") == _queues(4, "broker-a") + _queues(3, "broker-b")
    borrowed = route.borrowed_for_new_topic(2)
    assert [(q.read_queue_nums, q.write_queue_nums) for q in borrowed.queue_datas] == [(2, 2), (2, 2)]
    info = ClusterInfo.decode(b'{"brokerAddrTable":{"broker-a":{"brokerAddrs":{0:"x:1",1:"y:1"},'
                              b'"brokerName":"broker-a","cluster":"C"}},"clusterAddrTable":{"C":["broker-a"]}}')
    assert info.master_addrs("C") == ["x:1"] and info.all_addrs("C") == ["x:1", "y:1"]


def test_pull_address_follows_suggest_which_broker_id():
    """Spec 5: the suggested id if present; else id+1 for a slave suggestion; else the lowest id; the
    slave flag tells the consumer to drop COMMIT_OFFSET."""
    addrs = {0: "m", 1: "s1", 2: "s2"}
    assert find_broker_addr_in_subscribe(addrs, 0) == ("m", False)
    assert find_broker_addr_in_subscribe(addrs, 1) == ("s1", True)
    assert find_broker_addr_in_subscribe({0: "m", 2: "s2"}, 1) == ("s2", True)
    assert find_broker_addr_in_subscribe({0: "m"}, 1) == ("m", False)
    assert find_broker_addr_in_subscribe({1: "s1"}, 0) == ("s1", True)
    assert find_broker_addr_in_subscribe({}, 0) is None


def test_decode_pull_body_with_compressed_and_retry_records():
    """A pull body (concatenated records) decodes to MessageExt with properties, ids and hosts; a zlib
    body (COMPRESSED|ZLIB) is inflated."""
    props = encode_properties({"TAGS": "TagA", "UNIQ_KEY": "AB" * 16})
    plain = build_record(body=b"hello", topic="T", properties=props,
                         queue_id=2, queue_offset=5, physical_offset=1000, store_host="127.0.0.1", store_port=10911,
                         born_host="10.0.0.9", born_port=5555, reconsume_times=1)
    big = b"x" * 10000
    packed = build_record(body=zlib.compress(big), topic="T", sys_flag=SYSFLAG_COMPRESSED | SYSFLAG_ZLIB,
                          queue_offset=6, physical_offset=1000 + len(plain), store_host="127.0.0.1", store_port=10911)
    msgs = decode_messages(plain + packed, "broker-a")
    assert [m.queue_offset for m in msgs] == [5, 6]
    a, b = msgs
    assert (a.body, a.tags, a.msg_id, a.queue_id, a.reconsume_times) == (b"hello", "TagA", "AB" * 16, 2, 1)
    assert a.offset_msg_id == "7F00000100002A9F00000000000003E8"
    assert a.born_host == "10.0.0.9:5555" and a.store_host == "127.0.0.1:10911"
    assert a.queue == MessageQueue("T", "broker-a", 2)
    assert b.body == big and b.msg_id == b.offset_msg_id
    # the fast decode and the per-record one (mq.wire.commitlog.parse_record) agree on every field
    v6 = build_record(body=b"six", topic="T6", properties=props, store_host="fe80::1", store_port=10911,
                      born_host="::1", born_port=1, physical_offset=77)
    body = plain + packed + v6
    fast = decode_messages(body, "broker-a")
    slow, at = [], 0
    while at < len(body):
        rec = parse_record(body, at)
        slow.append(message_from_record(rec, "broker-a"))
        at += rec.total_size
    assert [vars(m) for m in fast] == [vars(m) for m in slow]


def test_subscription_data_json_and_tag_match():
    """Heartbeat subscription: split on '||', trimmed, Java hash codes; '*' matches everything; a tag
    subscription rejects untagged and other-tag messages."""
    s = SubscriptionData.build("T", " TagA || TagC ")
    j = s.as_json()
    assert j["tagsSet"] == ["TagA", "TagC"] and j["codeSet"][0] == 2598919 and j["subString"] == "TagA || TagC"
    assert s.matches(Message("T", b"x", tags="TagC")) and not s.matches(Message("T", b"x", tags="TagB"))
    assert not s.matches(Message("T", b"x"))
    star = SubscriptionData.build("T", "*")
    assert star.as_json()["tagsSet"] == [] and star.matches(Message("T", b"x"))


def test_enum_coercion_and_namesrv_parsing():
    """Options accept enum members, names and values; bad name-server strings fail clearly."""
    assert _coerce(ConsumeFromWhere, "FIRST") is ConsumeFromWhere.FIRST
    assert _coerce(ConsumeFromWhere, "CONSUME_FROM_TIMESTAMP") is ConsumeFromWhere.TIMESTAMP
    assert _coerce(MessageModel, MessageModel.BROADCASTING) is MessageModel.BROADCASTING
    with pytest.raises(ValueError):
        _coerce(MessageModel, "SIDEWAYS")
    assert parse_namesrv_addr("a:1; b:2") == ["a:1", "b:2"]
    for bad in ("", "nohost", "h:port"):
        with pytest.raises(MQClientError):
            parse_namesrv_addr(bad)


def test_local_offset_store_round_trip(tmp_path):
    """BROADCASTING offsets survive in <dir>/<clientId>/<group>/offsets.json."""
    async def go():
        inst = ClientInstance("127.0.0.1:1", "DEFAULT")
        store = LocalOffsetStore(inst, "G", str(tmp_path))
        q = MessageQueue("T", "b", 1)
        assert await store.read_from_store(q) == -1
        store.update(q, 42, increase_only=True)
        store.update(q, 7, increase_only=True)       # never goes back
        await store.persist_all([q])
        again = LocalOffsetStore(inst, "G", str(tmp_path))
        assert await again.read_from_store(q) == 42
        assert (tmp_path / inst.client_id / "G" / "offsets.json").exists()
        await inst.close()
    asyncio.run(go())


# --------------------------------------------------------------------------------------------------
# A fake name server and a fake master/slave pair, in process, to watch where pulls and commits go.

class FakeBrokerPair:
    """Master answers the first pull with one message and suggestWhichBrokerId=1; the slave answers
    with the next message and suggests 0 again; later pulls find nothing (held briefly)."""

    def __init__(self):
        self.pulls: list[tuple[str, int, int]] = []      # (who, queueOffset, sysFlag) for topic T
        self.commits: list[tuple[str, int]] = []         # (who, commitOffset) of T from UPDATE_CONSUMER_OFFSET
        self.client_id = None

    def record(self, offset):
        return build_record(body=b"m%d" % offset, topic="T", queue_offset=offset, physical_offset=offset * 200,
                            store_host="127.0.0.1", store_port=1, properties=encode_properties({"TAGS": "x"}))

    def handlers(self, who):
        async def heartbeat(conn, cmd):
            self.client_id = json.loads(cmd.body)["clientID"]
            return make_response(cmd)

        async def consumer_list(conn, cmd):
            return make_response(cmd, body=json.dumps({"consumerIdList": [self.client_id]}).encode())

        async def query_offset(conn, cmd):
            return make_response(cmd, ext={"offset": 0})

        async def update_offset(conn, cmd):
            if cmd.ext_fields["topic"] == "T":
                self.commits.append((who, int(cmd.ext_fields["commitOffset"])))
            return None if cmd.is_oneway else make_response(cmd)

        async def pull(conn, cmd):
            h = cmd.ext_fields
            off, flag = int(h["queueOffset"]), int(h["sysFlag"])
            if h["topic"] == "T":
                self.pulls.append((who, off, flag))
            if h["topic"] != "T" or h["queueId"] != "0" or off >= 2:
                await asyncio.sleep(0.2)
                return make_response(cmd, RC.PULL_NOT_FOUND, ext={"suggestWhichBrokerId": 0, "nextBeginOffset": off,
                                                                   "minOffset": 0, "maxOffset": 2})
            suggest = 1 if who == "master" else 0
            return make_response(cmd, RC.SUCCESS, ext={"suggestWhichBrokerId": suggest, "nextBeginOffset": off + 1,
                                                        "minOffset": 0, "maxOffset": 2}, body=self.record(off))

        async def unregister(conn, cmd):
            return make_response(cmd)
        return {R.HEART_BEAT: heartbeat, R.GET_CONSUMER_LIST_BY_GROUP: consumer_list,
                R.QUERY_CONSUMER_OFFSET: query_offset, R.UPDATE_CONSUMER_OFFSET: update_offset,
                R.PULL_MESSAGE: pull, R.UNREGISTER_CLIENT: unregister}


def test_push_consumer_pulls_where_the_broker_suggests_and_commits_at_the_master():
    """With suggestWhichBrokerId=1 the next pull of that queue goes to the slave's address, without
    COMMIT_OFFSET; the suggestion back to 0 returns to the master; offsets are committed only to the
    master, and on shutdown the committed offset covers both consumed messages."""
    async def go():
        pair = FakeBrokerPair()
        master, slave, ns = (RemotingServer("master", pair.handlers("master")),
                             RemotingServer("slave", pair.handlers("slave")), RemotingServer("ns"))
        mport, sport = await master.start(), await slave.start()
        route = {"brokerDatas": [{"brokerAddrs": {"0": f"127.0.0.1:{mport}", "1": f"127.0.0.1:{sport}"},
                                  "brokerName": "bk", "cluster": "C"}], "filterServerTable": {},
                 "queueDatas": [{"brokerName": "bk", "perm": 6, "readQueueNums": 1, "writeQueueNums": 1,
                                 "topicSysFlag": 0}]}

        async def get_route(conn, cmd):
            return make_response(cmd, body=json.dumps(route).encode())
        ns.register(R.GET_ROUTEINFO_BY_TOPIC, get_route)
        nport = await ns.start()
        got = []
        c = PushConsumer("G", f"127.0.0.1:{nport}", listener=lambda m: got.append(m.body) or True,
                         persist_interval_s=0.1)
        c.subscribe("T")
        await c.start()
        for _ in range(100):
            back = [p for p in pair.pulls if p[0] == "master" and p[1] == 2 and p[2] & PULL_COMMIT_OFFSET]
            if len(got) == 2 and back and pair.commits:
                break
            await asyncio.sleep(0.05)
        await c.shutdown()
        for s in (master, slave, ns):
            await s.stop(0.1)
        assert sorted(got) == [b"m0", b"m1"]
        t_pulls = pair.pulls
        first_master = next(p for p in t_pulls if p[1] == 0)
        assert first_master[0] == "master" and first_master[2] & PULL_SUSPEND
        at_slave = [p for p in t_pulls if p[0] == "slave"]
        assert at_slave and at_slave[0][1] == 1, pair.pulls
        assert all(not p[2] & PULL_COMMIT_OFFSET for p in at_slave), "COMMIT_OFFSET sent to a slave"
        assert any(p[0] == "master" and p[1] == 2 for p in t_pulls), "back to the master after suggest 0"
        assert pair.commits and all(who == "master" for who, _ in pair.commits)
        assert pair.commits[-1] == ("master", 2)
        assert [p for p in t_pulls if p[0] == "master" and p[1] == 2 and p[2] & PULL_COMMIT_OFFSET], \
            "a master pull carries COMMIT_OFFSET once an offset is known"
    asyncio.run(asyncio.wait_for(go(), 30))


class ScriptedBroker:
    """A fake name server + master on loopback for push-consumer paths a real broker rarely takes.
    Topic T has one queue holding one message at queue offset 0 (pull answers it once per offset 0
    request); every other pull is held briefly and answered PULL_NOT_FOUND."""

    def __init__(self, query_code=RC.SUCCESS, send_back_code=RC.SUCCESS):
        self.query_code = query_code
        self.send_back_code = send_back_code
        self.client_id = None
        self.commits: list[int] = []              # commitOffset of T, in arrival order
        self.send_backs: list[dict] = []
        self.searched: list[int] = []
        self.first_pull: dict[str, int] = {}     # topic -> queueOffset of its first pull
        self.record = build_record(body=b"payload", topic="T", queue_offset=0, physical_offset=4242,
                                   store_host="127.0.0.1", store_port=1,
                                   properties=encode_properties({"UNIQ_KEY": "CD" * 16}))

    async def start(self):
        async def heartbeat(conn, cmd):
            self.client_id = json.loads(cmd.body)["clientID"]
            return make_response(cmd)

        async def consumer_list(conn, cmd):
            return make_response(cmd, body=json.dumps({"consumerIdList": [self.client_id]}).encode())

        async def query_offset(conn, cmd):
            if self.query_code == RC.SUCCESS:
                return make_response(cmd, ext={"offset": 0})
            return make_response(cmd, self.query_code, "Not found")

        async def update_offset(conn, cmd):
            if cmd.ext_fields["topic"] == "T":
                self.commits.append(int(cmd.ext_fields["commitOffset"]))
            return None if cmd.is_oneway else make_response(cmd)

        async def offset_of(value):
            async def answer(conn, cmd):
                if cmd.code == R.SEARCH_OFFSET_BY_TIMESTAMP:
                    self.searched.append(int(cmd.ext_fields["timestamp"]))
                return make_response(cmd, ext={"offset": value})
            return answer

        async def pull(conn, cmd):
            h = cmd.ext_fields
            off = int(h["queueOffset"])
            self.first_pull.setdefault(h["topic"], off)
            if h["topic"] == "T" and off == 0:
                return make_response(cmd, ext={"suggestWhichBrokerId": 0, "nextBeginOffset": 1, "minOffset": 0,
                                               "maxOffset": 1}, body=self.record)
            await asyncio.sleep(0.1)
            return make_response(cmd, RC.PULL_NOT_FOUND, ext={"suggestWhichBrokerId": 0, "nextBeginOffset": off,
                                                               "minOffset": 0, "maxOffset": off})

        async def send_back(conn, cmd):
            self.send_backs.append(dict(cmd.ext_fields))
            return make_response(cmd, self.send_back_code, "refused by the script")

        async def ok(conn, cmd):
            return make_response(cmd)
        self.broker = RemotingServer("broker", {
            R.HEART_BEAT: heartbeat, R.GET_CONSUMER_LIST_BY_GROUP: consumer_list, R.QUERY_CONSUMER_OFFSET: query_offset,
            R.UPDATE_CONSUMER_OFFSET: update_offset, R.GET_MAX_OFFSET: await offset_of(7),
            R.SEARCH_OFFSET_BY_TIMESTAMP: await offset_of(3), R.PULL_MESSAGE: pull,
            R.CONSUMER_SEND_MSG_BACK: send_back, R.UNREGISTER_CLIENT: ok})
        port = await self.broker.start()
        route = {"brokerDatas": [{"brokerAddrs": {"0": f"127.0.0.1:{port}"}, "brokerName": "bk", "cluster": "C"}],
                 "filterServerTable": {}, "queueDatas": [{"brokerName": "bk", "perm": 6, "readQueueNums": 1,
                                                          "writeQueueNums": 1, "topicSysFlag": 0}]}

        async def get_route(conn, cmd):
            return make_response(cmd, body=json.dumps(route).encode())
        self.ns = RemotingServer("ns", {R.GET_ROUTEINFO_BY_TOPIC: get_route})
        self.ns_addr = f"127.0.0.1:{await self.ns.start()}"
        return self

    async def stop(self):
        await self.broker.stop(0.1)
        await self.ns.stop(0.1)


def test_failed_send_back_retries_locally_and_holds_the_offset():
    """When the broker refuses CONSUMER_SEND_MSG_BACK (header: commit-log offset, group, delayLevel 0,
    originMsgId = UNIQ_KEY, originTopic, maxReconsumeTimes 16) the message is consumed again locally
    with reconsume_times + 1, and the queue's committed offset stays at 0 until that succeeds."""
    async def go():
        fake = await ScriptedBroker(send_back_code=RC.SYSTEM_ERROR).start()
        calls = []

        def listener(m):
            calls.append((m.reconsume_times, max(fake.commits, default=0)))
            return len(calls) > 1
        c = PushConsumer("G", fake.ns_addr, listener=listener, persist_interval_s=0.05, local_retry_delay_s=0.3)
        c.subscribe("T")
        await c.start()
        for _ in range(100):
            if len(calls) >= 2 and 1 in fake.commits:
                break
            await asyncio.sleep(0.05)
        await c.shutdown()
        await fake.stop()
        assert [rt for rt, _ in calls] == [0, 1]
        assert calls[1][1] == 0, "the offset moved past a message that was neither consumed nor sent back"
        assert fake.commits[-1] == 1
        sb = fake.send_backs[0]
        assert (sb["offset"], sb["group"], sb["delayLevel"], sb["originMsgId"], sb["originTopic"],
                sb["maxReconsumeTimes"]) == ("4242", "G", "0", "CD" * 16, "T", "16")
    asyncio.run(asyncio.wait_for(go(), 30))


def test_consume_from_applies_only_when_the_broker_has_no_offset():
    """QUERY_CONSUMER_OFFSET answering QUERY_NOT_FOUND (22): LAST starts at GET_MAX_OFFSET (7) and the
    retry queue at 0; FIRST at 0; TIMESTAMP at SEARCH_OFFSET_BY_TIMESTAMP of consume_timestamp_ms (3)
    and the retry queue at max.  A stored offset (0 here) wins over all of them."""
    async def start_at(consume_from, query_code):
        fake = await ScriptedBroker(query_code=query_code).start()
        c = PushConsumer("G", fake.ns_addr, consume_from=consume_from, consume_timestamp_ms=1234,
                         listener=lambda m: True)
        c.subscribe("T")
        await c.start()
        for _ in range(100):
            if len(fake.first_pull) == 2:
                break
            await asyncio.sleep(0.02)
        await c.shutdown()
        await fake.stop()
        return fake.first_pull, fake.searched

    async def go():
        assert (await start_at(ConsumeFromWhere.LAST, RC.QUERY_NOT_FOUND))[0] == {"T": 7, "%RETRY%G": 0}
        assert (await start_at("FIRST", RC.QUERY_NOT_FOUND))[0] == {"T": 0, "%RETRY%G": 0}
        got, searched = await start_at("TIMESTAMP", RC.QUERY_NOT_FOUND)
        assert got == {"T": 3, "%RETRY%G": 7} and searched == [1234]
        assert (await start_at(ConsumeFromWhere.LAST, RC.SUCCESS))[0] == {"T": 0, "%RETRY%G": 0}
    asyncio.run(asyncio.wait_for(go(), 30))


def test_a_plain_send_header_from_the_queue_template_is_the_one_built_field_by_field():
    """Producer._send_kernel builds a plain single send's SEND_MESSAGE_V2 header from a template
    per queue (bornTimestamp, properties and flag filled in); Producer._request builds every
    other send field by field.  Proves the two give the same keys in the same order with the
    same values, so the frame is byte-identical (encode_frame), for odd queue ids, broker and
    group names, flags and properties."""
    import types
    from hypothesis import given, settings, strategies as st
    from mq.client.producer import Producer
    from mq.remoting.client import RemotingClient
    from mq.wire.remoting import encode_frame
    from mq.wire.properties import properties_to_string

    names = st.text(st.sampled_from("abcXYZ09_-%|"), min_size=1, max_size=20)
    values = st.text(st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)), max_size=12)

    @settings(max_examples=200, deadline=None)
    @given(group=names, topic=names, broker=names, qid=st.integers(0, 1 << 20), qnums=st.integers(1, 64),
           flag=st.integers(-(1 << 31), (1 << 31) - 1), props=st.dictionaries(names, values, max_size=4))
    def check(group, topic, broker, qid, qnums, flag, props):
        client = RemotingClient()
        p = Producer(group, "127.0.0.1:9876", default_topic_queue_nums=qnums)
        p._inst = lambda: types.SimpleNamespace(request=client.request)
        msg = Message(topic, b"body", flag=flag, properties=props)
        q = MessageQueue(topic, broker, qid)
        slow = p._request(msg, q, False)
        fast = dict(p._queue_header(q))
        fast["g"], fast["i"] = slow.ext_fields["g"], properties_to_string(msg.properties)
        if msg.flag:
            fast["h"] = str(msg.flag)
        assert list(fast.items()) == list(slow.ext_fields.items())
        cmd = client.request_str(slow.code, fast, msg.body)
        cmd.opaque = slow.opaque = 7
        assert encode_frame(cmd) == encode_frame(slow)
    check()
