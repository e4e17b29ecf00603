"""A SYNC_MASTER with ASYNC_FLUSH that loses power takes back from its slave the tail the slave
acknowledged (mq.ha.master, "take-back"), as real processes: a master and a slave broker, the
master killed with SIGKILL and its unflushed bytes dropped (the chaos suite's power loss),
then restarted.  Before this, the restarted master told the slave to truncate and the
acknowledged tail was gone (the ✘ of the fault matrix)."""
import time

from mq.chaos.run import kill_with_power_loss
from mq.cluster import Broker, NameServer, call, wait_dispatched, wait_for

from test_broker_ha import pull_bodies, send

QUEUES = 4
# nothing is flushed by the flush role during the test: the whole tail is at the mercy of the power
NO_FLUSH = {"flushIntervalCommitLog": 600000, "flushCommitLogLeastPages": 100000, "flushCommitLogThoroughInterval": 600000}


def max_offsets(addr: str, topic: str) -> list[int]:
    return [int(call(addr, 30, {"topic": topic, "queueId": q}).ext_fields["offset"]) for q in range(QUEUES)]


def test_power_loss_of_a_sync_master_loses_nothing_acknowledged(tmp_path):
    """200 sends acknowledged (so on the slave), none flushed by the master; power loss drops
    them from the master.  Restarted, the master refuses writes (14, saying why) until the slave
    reconnects and gives the tail back; then every acknowledged message is readable from the
    master at its old queue offset, the next send continues the queue offsets without a gap or
    a repeat, and the slave kept its log (gave back, truncated nothing)."""
    ns = NameServer(str(tmp_path))
    master = Broker(str(tmp_path), ns.addr, name="broker-a", brokerRole="SYNC_MASTER",
                    haSendHeartbeatInterval=500, **NO_FLUSH)
    slave = Broker(str(tmp_path), ns.addr, name="broker-a", brokerRole="SLAVE", brokerId=1,
                   haSendHeartbeatInterval=500)
    try:
        wait_for(lambda: send(master.addr, "TB", b"probe").code == 0, 40, 0.3, "the slave connected")
        acked = []
        for i in range(200):
            r = send(master.addr, "TB", b"tb-%d" % i, qid=i % QUEUES)
            assert r.code == 0, (r.code, r.remark)
            acked.append(b"tb-%d" % i)
        wait_dispatched(master.addr)
        before = max_offsets(master.addr, "TB")
        flushed, dropped = kill_with_power_loss(master)
        assert dropped > 200 * 100, f"the power loss took the tail ({dropped} bytes past {flushed})"
        master.start()
        # the slave reconnects within its retry interval; until it has given back, no writes
        r = send(master.addr, "TB", b"early", qid=0)
        wait_for(lambda: "took back" in master.proc.output(), 30, 0.1, "the take-back")
        if r.code == 0:
            # the slave was quicker than our first send (it retries as soon as the HA port is
            # back): then the send came after the take-back, at the next offset of queue 0
            assert int(r.ext_fields["queueOffset"]) == before[0], r.ext_fields
            acked.append(b"early")
            before[0] += 1
        else:
            assert r.code == 14 and "taking back" in r.remark, (r.code, r.remark)
        assert "giving them back" in slave.proc.output()
        assert "truncat" not in slave.proc.output(), "the slave kept its log"
        wait_dispatched(master.addr)      # the master's queues rebuilt
        assert max_offsets(master.addr, "TB") == before
        got = pull_bodies(master.addr, "TB", QUEUES)
        # (probes that got SLAVE_NOT_AVAILABLE before the slave connected are stored too)
        assert got.count(b"probe") >= 1
        assert sorted(b for b in got if b != b"probe") == sorted(acked), \
            "every acknowledged message, once, on the master"
        r = send(master.addr, "TB", b"after", qid=0)
        assert r.code == 0 and int(r.ext_fields["queueOffset"]) == before[0], (r.code, r.ext_fields)
    finally:
        slave.stop()
        master.proc.kill()
        ns.stop()


def test_writes_open_when_no_slave_comes_back_in_time(tmp_path):
    """The wait is bounded: with its slave stopped, a master restarted after a crash refuses
    writes for haTakeBackWaitMs and then accepts them (what the slave held beyond its end is
    truncated when it returns, logged as possible loss)."""
    ns = NameServer(str(tmp_path))
    master = Broker(str(tmp_path), ns.addr, name="broker-a", brokerRole="SYNC_MASTER", haTakeBackWaitMs=1500,
                    slaveTimeout=500, **NO_FLUSH)
    try:
        assert send(master.addr, "TW", b"x").code in (0, 11)     # stored; SLAVE_NOT_AVAILABLE without a slave
        kill_with_power_loss(master)
        master.start()
        assert "writes wait up to 1500 ms" in master.proc.output()
        wait_for(lambda: send(master.addr, "TW", b"y").code in (0, 11), 10, 0.1, "writes open")
    finally:
        master.proc.kill()
        ns.stop()


def test_kill_without_power_loss_opens_writes_as_soon_as_the_slave_is_back(tmp_path):
    """kill -9 alone loses nothing written (the page cache survives): the restarted master's
    slave reconnects (its first retry comes 200 ms after the break) with nothing beyond the
    master's end, and writes open then - long before the window (30 s here) would end."""
    ns = NameServer(str(tmp_path))
    master = Broker(str(tmp_path), ns.addr, name="broker-a", brokerRole="SYNC_MASTER", haTakeBackWaitMs=30000,
                    haSendHeartbeatInterval=500, **NO_FLUSH)
    slave = Broker(str(tmp_path), ns.addr, name="broker-a", brokerRole="SLAVE", brokerId=1,
                   haSendHeartbeatInterval=500)
    try:
        wait_for(lambda: send(master.addr, "TK", b"probe").code == 0, 40, 0.3, "the slave connected")
        for i in range(50):
            assert send(master.addr, "TK", b"tk-%d" % i, qid=i % QUEUES).code == 0
        master.kill()
        master.start()
        assert "writes wait up to 30000 ms" in master.proc.output()
        t0 = time.monotonic()
        wait_for(lambda: send(master.addr, "TK", b"after").code == 0, 20, 0.05, "writes open")
        assert time.monotonic() - t0 < 10, "opened by the slave's report, not by the window"
        assert "nothing to take back" in master.proc.output()
    finally:
        slave.stop()
        master.proc.kill()
        ns.stop()


def test_a_master_whose_last_file_was_damaged_takes_the_tail_back_from_its_slave(tmp_path):
    """Bit rot on a SYNC_MASTER's disk while it was stopped: a body byte flipped in the middle of
    its last CommitLog file.  The restart's validation truncates at the damaged record, which
    would cost every acknowledged message after it; instead the master waits for its slave,
    which holds them intact, takes them back (validated like any replication), and serves every
    acknowledged message again, the damaged one included, from the slave's good copy."""
    ns = NameServer(str(tmp_path))
    master = Broker(str(tmp_path), ns.addr, name="broker-a", brokerRole="SYNC_MASTER", haSendHeartbeatInterval=500)
    slave = Broker(str(tmp_path), ns.addr, name="broker-a", brokerRole="SLAVE", brokerId=1,
                   haSendHeartbeatInterval=500)
    try:
        wait_for(lambda: send(master.addr, "TD", b"probe").code == 0, 40, 0.3, "the slave connected")
        acked = []
        for i in range(200):
            r = send(master.addr, "TD", b"td-%03d" % i, qid=i % QUEUES)
            assert r.code == 0, (r.code, r.remark)
            acked.append((b"td-%03d" % i, r.ext_fields["msgId"]))
        wait_dispatched(master.addr)
        before = max_offsets(master.addr, "TD")
        assert master.stop() == 0
        from mq.wire.msgid import decode_offset_msg_id
        phy = decode_offset_msg_id(acked[100][1])[2]
        fs = 16 * 1024 * 1024
        with open(f"{master.dir}/commitlog/{phy - phy % fs:020d}", "r+b") as f:
            f.seek(phy % fs + 90)                    # inside the body (it starts at 88)
            b = f.read(1)
            f.seek(phy % fs + 90)
            f.write(bytes([b[0] ^ 0x20]))
        master.start()
        wait_for(lambda: "took back" in master.proc.output(), 30, 0.1, "the take-back")
        log = master.proc.output()
        assert "recovery truncated a damaged tail" in log and "is damaged (bad crc)" in log, log[-3000:]
        wait_dispatched(master.addr)      # the master's queues rebuilt
        assert max_offsets(master.addr, "TD") == before
        got = pull_bodies(master.addr, "TD", QUEUES)
        assert sorted(b for b in got if b != b"probe") == sorted(b for b, _ in acked)
    finally:
        slave.stop()
        master.proc.kill()
        ns.stop()
