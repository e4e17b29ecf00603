"""Master and slave brokers as real processes: metadata sync, slave
read-only-ness, SYNC_MASTER without a slave."""
import json
import os
import signal
import time

from mq.wire import commitlog as wcl
from mq.cluster import Broker, NameServer, call, wait_dispatched, wait_for
from mq.wire.headers import send_v2


def pull_bodies(addr: str, topic: str, queues: int) -> list[bytes]:
    """Every message body of the topic's queues at `addr` (pulls from offset 0 to the end)."""
    return [b for q in range(queues) for b in pull_queue(addr, topic, q)]


def pull_queue(addr: str, topic: str, q: int, offset: int = 0) -> list[bytes]:
    """The message bodies of one queue at `addr`, pulled from `offset` to the end."""
    out = []
    while True:
        r = call(addr, 11, {"consumerGroup": "G", "topic": topic, "queueId": q, "queueOffset": offset,
                            "maxMsgNums": 32, "sysFlag": 4, "commitOffset": 0, "subscription": "*",
                            "subVersion": 0, "suspendTimeoutMillis": 0})
        if r.code != 0:
            return out
        pos = 0
        while pos < len(r.body):
            rec = wcl.parse_record(r.body, pos)
            out.append(rec.body)
            pos += rec.total_size
        offset = int(r.ext_fields["nextBeginOffset"])


def send(addr: str, topic: str, body: bytes, qid: int = 0):
    return call(addr, 310, send_v2(producerGroup="PG", topic=topic, defaultTopic="TBW102", defaultTopicQueueNums=4,
                                   queueId=qid, sysFlag=0, bornTimestamp=0, flag=0, properties="TAGS\x01TagA"), body)


def test_slave_syncs_topics_and_offsets_and_refuses_writes(tmp_path):
    """A topic created and an offset committed on the master appear on the
    slave within a few sync intervals; the slave answers sends with
    SERVICE_NOT_AVAILABLE (14) and topic updates with SYSTEM_ERROR."""
    ns = NameServer(str(tmp_path))
    master = Broker(str(tmp_path), ns.addr, name="broker-a")
    slave = Broker(str(tmp_path), ns.addr, name="broker-a", brokerRole="SLAVE", brokerId=1,
                   slaveMetadataSyncInterval=300)
    try:
        r = call(master.addr, 17, {"topic": "SyncedTopic", "defaultTopic": "TBW102", "readQueueNums": 3,
                                   "writeQueueNums": 3, "perm": 6, "topicFilterType": "SINGLE_TAG",
                                   "topicSysFlag": 0, "order": "false"})
        assert r.code == 0, r.remark
        assert call(master.addr, 15, {"consumerGroup": "G1", "topic": "SyncedTopic", "queueId": 2,
                                      "commitOffset": 42}).code == 0

        def synced():
            topics = json.loads(call(slave.addr, 21).body)["topicConfigTable"]
            offsets = json.loads(call(slave.addr, 43).body)["offsetTable"]
            return "SyncedTopic" in topics and offsets.get("SyncedTopic@G1", {}).get("2") == 42

        wait_for(synced, 30, 0.2, "metadata on the slave")
        assert json.loads(call(slave.addr, 21).body)["topicConfigTable"]["SyncedTopic"]["readQueueNums"] == 3
        assert send(slave.addr, "SyncedTopic", b"x").code == 14
        assert call(slave.addr, 17, {"topic": "Other", "defaultTopic": "TBW102", "readQueueNums": 1,
                                     "writeQueueNums": 1, "perm": 6}).code == 1
        route = json.loads(call(ns.addr, 105, {"topic": "SyncedTopic"}).body)
        addrs = route["brokerDatas"][0]["brokerAddrs"]
        assert addrs == {"0": master.addr, "1": slave.addr}, "the route lists the group by brokerId"
    finally:
        slave.stop()
        master.stop()
        ns.stop()


def test_sync_master_without_a_slave_is_slave_not_available(tmp_path):
    """SYNC_MASTER with no slave connected: the message is stored and the send
    answers SLAVE_NOT_AVAILABLE (11), never SEND_OK."""
    ns = NameServer(str(tmp_path))
    master = Broker(str(tmp_path), ns.addr, brokerRole="SYNC_MASTER")
    try:
        for i in range(3):
            r = send(master.addr, "SyncT", b"m%d" % i)
            assert r.code == 11, (r.code, r.remark)
            assert r.ext_fields["msgId"], "the message was stored: it has an id"
        # dispatch runs after the answer (as in RocketMQ): wait for the queue to show them
        wait_for(lambda: int(call(master.addr, 30, {"topic": "SyncT", "queueId": 0}).ext_fields["offset"]) == 3,
                 20, 0.05, "the three stored messages dispatched")
    finally:
        master.stop()
        ns.stop()


def _commitlog_bytes(broker, end):
    """The CommitLog bytes [0, end) of a broker's store (files concatenated)."""
    d = os.path.join(broker.dir, "commitlog")
    out = b""
    for name in sorted(os.listdir(d)):
        with open(os.path.join(d, name), "rb") as f:
            out += f.read()
        if len(out) >= end:
            break
    return out[:end]


def _max_phy(addr):
    return int(json.loads(call(addr, 28).body)["table"]["commitLogMaxOffset"])


def test_sync_master_replicates_before_send_ok(tmp_path):
    """SYNC_MASTER + a slave: every SEND_OK message is already on the slave
    (its max offset covers it when the answer arrives); the slave's CommitLog
    is byte-identical and its ConsumeQueues serve the same messages (the sends take the
    io worker's C path, which holds each answer until the ack passes it).  With the
    slave stopped, sends answer 11; with the slave stalled (SIGSTOP), 12."""
    ns = NameServer(str(tmp_path))
    master = Broker(str(tmp_path), ns.addr, name="broker-a", brokerRole="SYNC_MASTER", slaveTimeout=1500,
                    haSendHeartbeatInterval=500, haFullCopy="true")
    slave = Broker(str(tmp_path), ns.addr, name="broker-a", brokerRole="SLAVE", brokerId=1,
                   haSendHeartbeatInterval=500)
    try:
        wait_for(lambda: send(master.addr, "HA1", b"probe").code == 0, 40, 0.3, "the slave connected")
        for i in range(200):
            r = send(master.addr, "HA1", b"m%d" % i, qid=i % 4)
            assert r.code == 0, (r.code, r.remark)
            end = int(r.ext_fields["queueOffset"])   # present: the message was stored
            assert end >= 0
        # the io workers' C path took these sends and held each answer until the slave's ack (the
        # count is the answering worker's: each call is a connection of its own, on either worker)
        assert int(json.loads(call(master.addr, 28).body)["table"]["fastSendMsgs"]) >= 50
        end = _max_phy(master.addr)
        wait_for(lambda: _max_phy(slave.addr) >= end, 20, 0.1, "slave caught up")
        assert _commitlog_bytes(slave, end) == _commitlog_bytes(master, end), "byte-identical"
        for q in range(4):
            qmax = lambda addr: call(addr, 30, {"topic": "HA1", "queueId": q}).ext_fields["offset"]  # noqa: E731
            wait_for(lambda: qmax(slave.addr) == qmax(master.addr) != "0", 20, 0.05, "both queues dispatched")
            pull = {"consumerGroup": "G", "topic": "HA1", "queueId": q, "queueOffset": 0, "maxMsgNums": 32,
                    "sysFlag": 4, "commitOffset": 0, "subscription": "*", "subVersion": 0, "suspendTimeoutMillis": 0}
            a, b = call(master.addr, 11, pull), call(slave.addr, 11, pull)
            assert a.code == b.code == 0 and a.body == b.body
        slave.signal_all(signal.SIGSTOP)
        try:
            r = send(master.addr, "HA1", b"stalled")
            assert r.code in (12, 11), (r.code, r.remark)
            assert r.code != 0
        finally:
            slave.signal_all(signal.SIGCONT)
        slave.stop()
        wait_for(lambda: send(master.addr, "HA1", b"x").code == 11, 30, 0.3, "SLAVE_NOT_AVAILABLE without slave")
    finally:
        slave.stop()
        master.stop()
        ns.stop()


def test_kill_9_of_a_sync_master_under_load_loses_nothing_acked(tmp_path):
    """SYNC_MASTER under load is killed with SIGKILL (the whole process group):
    reading the slave finds every message that got SEND_OK."""
    import threading
    ns = NameServer(str(tmp_path))
    master = Broker(str(tmp_path), ns.addr, name="broker-a", brokerRole="SYNC_MASTER", haFullCopy="true",
                    haSendHeartbeatInterval=500)
    slave = Broker(str(tmp_path), ns.addr, name="broker-a", brokerRole="SLAVE", brokerId=1,
                   haSendHeartbeatInterval=500)
    acked, stop = [], threading.Event()
    try:
        wait_for(lambda: send(master.addr, "HAK", b"probe").code == 0, 40, 0.3, "the slave connected")

        def load():
            i = 0
            while not stop.is_set():
                try:
                    r = send(master.addr, "HAK", b"k%d" % i, qid=i % 4)
                    if r.code == 0:
                        acked.append(b"k%d" % i)
                except Exception:
                    pass
                i += 1

        t = threading.Thread(target=load)
        t.start()
        wait_for(lambda: len(acked) >= 150, 30, 0.05, "load under way")
        master.kill()
        stop.set()
        t.join(30)

        def slave_dispatched():
            t = json.loads(call(slave.addr, 28).body)["table"]
            return int(t["dispatchedOffset"]) >= int(t["commitLogMaxOffset"]) > 0
        wait_for(slave_dispatched, 30, 0.1, "the slave's queues built from what it received")
        # no wait for the metadata sync: the master may die before the slave ever learns
        # the auto-created topic, and the slave still serves the queues it holds
        got = set(pull_bodies(slave.addr, "HAK", 4))
        missing = set(acked) - got
        assert not missing, f"{len(missing)} acknowledged messages missing on the slave"
    finally:
        stop.set()
        slave.stop()
        master.proc.kill()
        ns.stop()


def test_read_write_split_suggests_the_slave_for_slow_consumers(tmp_path):
    """With slaveReadEnable, a pull reading further behind the newest data than
    accessMessageInMemoryMaxRatio% of RAM (overridden here to 100 KB) is told
    to use the slave (whichBrokerWhenConsumeSlowly = 1); a pull near the head
    stays on the master (0); without slaveReadEnable it is always 0."""
    ns = NameServer(str(tmp_path))
    split = Broker(str(tmp_path), ns.addr, name="broker-a", slaveReadEnable="true",
                   totalPhysicalMemoryOverride=100_000, accessMessageInMemoryMaxRatio=40)
    plain = Broker(str(tmp_path), ns.addr, name="broker-b", totalPhysicalMemoryOverride=100_000)
    try:
        for b in (split, plain):
            for i in range(200):
                assert send(b.addr, "Split", b"x" * 1000, qid=0).code == 0
            wait_for(lambda: int(call(b.addr, 30, {"topic": "Split", "queueId": 0}).ext_fields["offset"]) == 200,
                     20, 0.05, "dispatched")

        def suggest(addr, offset):
            r = call(addr, 11, {"consumerGroup": "G", "topic": "Split", "queueId": 0, "queueOffset": offset,
                                "maxMsgNums": 1, "sysFlag": 4, "commitOffset": 0, "subscription": "*",
                                "subVersion": 0, "suspendTimeoutMillis": 0})
            assert r.code == 0
            return int(r.ext_fields["suggestWhichBrokerId"])

        assert suggest(split.addr, 0) == 1, "200 KB behind the head > 40% of 100 KB"
        assert suggest(split.addr, 199) == 0, "at the head"
        assert suggest(plain.addr, 0) == 0, "slaveReadEnable=false: always the master"
    finally:
        split.stop()
        plain.stop()
        ns.stop()


def test_offsets_do_not_go_back_when_the_master_returns(tmp_path):
    """Master down: a consumer commits on the slave.  The master comes back
    (same store): it takes the slave's newer offsets before serving, so a query
    on the master does not go backwards."""
    ns = NameServer(str(tmp_path))
    master = Broker(str(tmp_path), ns.addr, name="broker-a", haSendHeartbeatInterval=500)
    slave = Broker(str(tmp_path), ns.addr, name="broker-a", brokerRole="SLAVE", brokerId=1,
                   haSendHeartbeatInterval=500)
    try:
        assert call(master.addr, 15, {"consumerGroup": "G", "topic": "Back", "queueId": 0, "commitOffset": 5}).code == 0
        master.stop()
        assert call(slave.addr, 15, {"consumerGroup": "G", "topic": "Back", "queueId": 0, "commitOffset": 50}).code == 0
        master.start()

        def master_offset():
            r = call(master.addr, 14, {"consumerGroup": "G", "topic": "Back", "queueId": 0})
            return int(r.ext_fields["offset"]) if r.code == 0 else -1
        wait_for(lambda: master_offset() == 50, 30, 0.2, "the master took the slave's offset")
    finally:
        slave.stop()
        master.stop()
        ns.stop()


def test_our_client_consumes_from_the_slave_when_the_master_dies(tmp_path):
    """Our Python push consumer, started after the master was killed, reads
    everything from the slave."""
    import threading
    from mq.client import CONSUME_SUCCESS, FIRST, Message
    from mq.client.sync import SyncProducer, SyncPushConsumer
    ns = NameServer(str(tmp_path))
    master = Broker(str(tmp_path), ns.addr, name="broker-a", haFullCopy="true", haSendHeartbeatInterval=500)
    slave = Broker(str(tmp_path), ns.addr, name="broker-a", brokerRole="SLAVE", brokerId=1,
                   haSendHeartbeatInterval=500)
    try:
        prod = SyncProducer("PG_ours", ns.addr)
        prod.start()
        try:
            for i in range(100):
                prod.send(Message("OursHA", f"o{i}", tags="TagA"))
        finally:
            prod.shutdown()
        end = _max_phy(master.addr)
        wait_for(lambda: _max_phy(slave.addr) >= end, 30, 0.1, "slave caught up")
        wait_for(lambda: "OursHA" in json.loads(call(slave.addr, 21).body)["topicConfigTable"], 30, 0.3, "topic synced")
        master.kill()
        got, lock = set(), threading.Lock()

        def on_message(msg):
            with lock:
                got.add(msg.body.decode())
            return CONSUME_SUCCESS

        cons = SyncPushConsumer("CG_ours_ha", ns.addr, consume_from=FIRST, listener=on_message)
        cons.subscribe("OursHA", "*")
        cons.start()
        try:
            wait_for(lambda: len(got) >= 100, 60, 0.2, "consumed from the slave")
        finally:
            cons.shutdown()
        assert got == {f"o{i}" for i in range(100)}
    finally:
        slave.stop()
        master.proc.kill()
        ns.stop()


def test_slave_promoted_by_hand_when_the_master_is_lost_for_good(tmp_path):
    """The README's procedure: the SYNC_MASTER is gone (kill -9, never restarted); the operator
    stops the slave, sets brokerId=0 and brokerRole=ASYNC_MASTER in its broker.conf and starts
    it.  It registers as broker-a's master, serves every acknowledged message and the synced
    consumer offsets, finds them by key, and takes new sends."""
    ns = NameServer(str(tmp_path))
    master = Broker(str(tmp_path), ns.addr, name="broker-a", brokerRole="SYNC_MASTER", haFullCopy="true",
                    haSendHeartbeatInterval=500)
    slave = Broker(str(tmp_path), ns.addr, name="broker-a", brokerRole="SLAVE", brokerId=1,
                   haSendHeartbeatInterval=500, slaveMetadataSyncInterval=500)
    try:
        wait_for(lambda: send(master.addr, "Promo", b"probe").code == 0, 40, 0.3, "the slave connected")
        acked = []                  # (a probe refused while the slave connected may be stored too)
        for i in range(60):
            r = call(master.addr, 310, send_v2(producerGroup="PG", topic="Promo", defaultTopic="TBW102",
                                               defaultTopicQueueNums=4, queueId=i % 4, sysFlag=0, bornTimestamp=0,
                                               flag=0, properties=f"TAGS\x01TagA\x02KEYS\x01promo-{i}"), b"p%d" % i)
            assert r.code == 0, r.remark
            acked.append(b"p%d" % i)
        assert call(master.addr, 15, {"consumerGroup": "G", "topic": "Promo", "queueId": 1,
                                      "commitOffset": 7}).code == 0

        def synced():
            r = call(slave.addr, 14, {"consumerGroup": "G", "topic": "Promo", "queueId": 1})
            return r.code == 0 and int(r.ext_fields["offset"]) == 7
        wait_for(synced, 30, 0.2, "the slave synced the offset")
        master.kill()
        assert slave.stop() == 0
        slave.options.update(brokerId=0, brokerRole="ASYNC_MASTER")
        slave.start()

        def master_is(addr):
            r = call(ns.addr, 105, {"topic": "Promo"})
            return r.code == 0 and json.loads(r.body)["brokerDatas"][0]["brokerAddrs"].get("0") == addr
        wait_for(lambda: master_is(slave.addr), 30, 0.3, "the promoted slave registered as the master")
        assert sorted(b for b in pull_bodies(slave.addr, "Promo", 4) if b != b"probe") == sorted(acked)
        r = call(slave.addr, 14, {"consumerGroup": "G", "topic": "Promo", "queueId": 1})
        assert r.code == 0 and int(r.ext_fields["offset"]) == 7
        r = call(slave.addr, 12, {"topic": "Promo", "key": "promo-33", "maxNum": 4, "beginTimestamp": 0,
                                  "endTimestamp": 2 ** 62})
        assert r.code == 0 and wcl.parse_record(r.body).body == b"p33"
        assert send(slave.addr, "Promo", b"after").code == 0
        wait_dispatched(slave.addr)
        assert b"after" in pull_bodies(slave.addr, "Promo", 4)
    finally:
        slave.stop()
        master.proc.kill()
        ns.stop()


def test_files_retention_deleted_are_let_go_by_every_process_of_a_master_and_its_slave(tmp_path):
    """A mapping or an open fd keeps a deleted file's blocks on disk.  The HA processes kept every
    CommitLog file they had streamed (ha-master) or received (ha-slave) after retention deleted
    it (seen: 4 each), so that space came back only when they restarted.  Now their main loop
    retires the files below MIN once a second while the connections' threads send and receive
    through fds of their own (seg_fd_own); the store's other processes let go as in DLedger mode
    (tests/dledger).  Replication goes on afterwards."""
    fs = 128 * 1024
    ns = NameServer(str(tmp_path))
    common = dict(mappedFileSizeCommitLog=fs, cleanFileForciblyEnable="true", diskSpaceCleanForciblyRatio="0.01",
                  cleanResourceInterval=200, haSendHeartbeatInterval=500)
    env = {"MQ_RETENTION_FIRST_DELAY_S": "0"}
    master = Broker(str(tmp_path), ns.addr, name="broker-a", brokerRole="SYNC_MASTER", env=env, **common)
    slave = Broker(str(tmp_path), ns.addr, name="broker-a", brokerRole="SLAVE", brokerId=1, env=env, **common)
    try:
        wait_for(lambda: send(master.addr, "HAR", b"probe").code == 0, 40, 0.3, "the slave connected")
        for k in range(600):                       # ~1.1 KiB records: 5 files, each on both stores
            r = send(master.addr, "HAR", b"b%04d" % k + b"x" * 1024, qid=k % 4)
            assert r.code == 0, (k, r.code, r.remark)

        def first_file(b):
            return min(int(n) for n in os.listdir(os.path.join(b.dir, "commitlog")))
        wait_for(lambda: first_file(master) >= 3 * fs and first_file(slave) >= 3 * fs, 20, 0.1,
                 "retention deleted files on both")
        for b, roles in ((master, ("flush", "dispatch", "io-0", "ha-master")),
                         (slave, ("flush", "dispatch", "io-0", "ha-slave"))):
            deadline = time.monotonic() + 10
            while any((maps := b.commitlog_maps()).get(r, (0, 0))[1] for r in roles) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert not any(maps.get(r, (0, 0))[1] for r in roles), (b.port, maps)
            assert all(maps.get(r, (0, 0))[0] >= 1 for r in ("flush", roles[-1])), maps  # (they map files)
        r = send(master.addr, "HAR", b"after", qid=0)
        assert r.code == 0, (r.code, r.remark)
        qoff = int(r.ext_fields["queueOffset"])
        wait_for(lambda: pull_queue(slave.addr, "HAR", 0, qoff) == [b"after"], 20, 0.1, "the slave serves it")
    finally:
        slave.stop()
        master.stop()
        ns.stop()


def test_a_slave_left_behind_by_retention_is_told_it_cannot_catch_up(tmp_path):
    """A slave stalled (SIGSTOP) while the master's retention deletes the file it needs next:
    when it runs again, the master's writer finishes the frame it was sending (from an fd of its
    own) and refuses the next one -- one line naming the offset and the master's oldest retained
    one, the connection closed -- and the slave's reconnect is refused with the same words.
    Nothing of a deleted file is sent; the slave's own store stays as it was (whole records)."""
    fs = 128 * 1024
    ns = NameServer(str(tmp_path))
    common = dict(mappedFileSizeCommitLog=fs, haSendHeartbeatInterval=500, haHousekeepingInterval=60000)
    master = Broker(str(tmp_path), ns.addr, name="broker-a", brokerRole="ASYNC_MASTER", cleanFileForciblyEnable="true",
                    diskSpaceCleanForciblyRatio="0.01", cleanResourceInterval=200,
                    env={"MQ_RETENTION_FIRST_DELAY_S": "0"}, **common)
    slave = Broker(str(tmp_path), ns.addr, name="broker-a", brokerRole="SLAVE", brokerId=1, **common)
    try:
        r = wait_for(lambda: (r := send(master.addr, "HAB", b"probe")).code == 0 and r, 40, 0.3, "master serving")
        wait_for(lambda: _max_phy(slave.addr) >= _max_phy(master.addr) > 0, 20, 0.1, "the slave caught up")
        slave.signal_all(signal.SIGSTOP)
        try:
            # far more than the loopback socket buffers hold: the writer blocks, then retention
            # deletes every file but the last few under it
            for k in range(400):
                r = send(master.addr, "HAB", b"%04d" % k + b"y" * 60000, qid=k % 4)
                assert r.code == 0, (k, r.code, r.remark)
            wait_for(lambda: min(int(n) for n in os.listdir(os.path.join(master.dir, "commitlog"))) >= 100 * fs,
                     30, 0.1, "retention deleted most of the master's files")
        finally:
            slave.signal_all(signal.SIGCONT)
        log = wait_for(lambda: (out := master.proc.output()).count("is below the master's oldest retained offset") >= 2
                       and out, 30, 0.2, "the master refused the next frame, then the reconnect")
        assert "the slave's next offset" in log and "the slave's end" in log, log[-3000:]
        assert "send failed" not in log, log[-3000:]
    finally:
        slave.stop()
        master.stop()
        ns.stop()
