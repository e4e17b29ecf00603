"""The clock nemesis's shim really moves a broker's wall clock (CLOCK_REALTIME, which the C
append reads for store timestamps), and the broker keeps serving through jumps both ways.

Store timestamps never go back in our CommitLog (the C append stores max(now, the last one), so
the log stays sorted by time for SEARCH_OFFSET_BY_TIMESTAMP): a message stored with the clock
10 minutes ahead carries that time, and one stored after the clock jumped back carries the same
highest time until the clock catches up; with the clock 10 minutes behind, likewise the last
time.  RocketMQ stores the clock's reading as it is, backwards included."""
import asyncio
import time

from mq.chaos.clock import ClockShift
from mq.cluster import Broker, NameServer
from mq.remoting import RemotingClient
from mq.wire import commitlog as wcl
from mq.wire.headers import send_v2

JUMP_MS = 600_000


def _send_and_read_store_ts(addr: str, body: bytes, queue_offset: int) -> int:
    async def go():
        c = RemotingClient()
        try:
            r = await c.invoke(addr, c.request(310, send_v2(producerGroup="PG", topic="ClockT", defaultTopic="TBW102",
                                                            defaultTopicQueueNums=1, queueId=0, sysFlag=0,
                                                            bornTimestamp=int(time.time() * 1000), flag=0,
                                                            properties="", reconsumeTimes=0), body), 5)
            assert r.code == 0, r.remark
            assert int(r.ext_fields["queueOffset"]) == queue_offset
            for _ in range(100):
                p = await c.invoke(addr, c.request(11, {"consumerGroup": "G", "topic": "ClockT", "queueId": 0,
                                                        "queueOffset": queue_offset, "maxMsgNums": 1, "sysFlag": 4,
                                                        "commitOffset": 0, "suspendTimeoutMillis": 0,
                                                        "subscription": "*", "subVersion": 0}), 5)
                if p.code == 0:
                    rec = wcl.parse_record(p.body, 0)
                    assert rec.body == body
                    return rec.store_timestamp_ms
                await asyncio.sleep(0.05)
            raise AssertionError(f"the message never became readable: {p.code} {p.remark}")
        finally:
            await c.close()
    return asyncio.run(go())


def test_shim_shifts_the_brokers_wall_clock_only(tmp_path):
    ns = NameServer(str(tmp_path))
    shift = ClockShift(str(tmp_path), "b")
    broker = Broker(str(tmp_path), ns.addr, env=shift.env())
    try:
        before = _send_and_read_store_ts(broker.addr, b"before", 0)
        assert abs(before - time.time() * 1000) < 5000
        shift.set(-JUMP_MS)
        behind = _send_and_read_store_ts(broker.addr, b"behind", 1)
        assert before <= behind < before + 5000, "10 minutes behind: held at the last store time"
        shift.set(JUMP_MS)
        ahead = _send_and_read_store_ts(broker.addr, b"ahead", 2)
        assert abs(ahead - (time.time() * 1000 + JUMP_MS)) < 5000, (ahead, time.time())
        shift.set(0)
        after = _send_and_read_store_ts(broker.addr, b"after", 3)
        assert ahead <= after < ahead + 5000, "back to the real time: held at the highest store time"
    finally:
        assert broker.stop() == 0, broker.proc.output()[-3000:]
        ns.stop()
        shift.close()
