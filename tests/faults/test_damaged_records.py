"""Bit rot under a live broker: bytes of a stored record change after it was written (the
CommitLog file is flipped in place, so the broker's own mapping sees it at once).  What it
proves: the read path checks every record in C before it serves it (lengths, BODYCRC,
PHYSICALOFFSET, and its TOPIC/QUEUEID/QUEUEOFFSET against the ConsumeQueue entry), so a damaged one
is never served -- not by a pull (skipped like a filtered message: the consumer moves past it
and gets every intact one), not by viewMessageById (SYSTEM_ERROR) -- and the broker logs it
once, and counts it in its metrics."""
from __future__ import annotations

import os
import urllib.request

import pytest

from mq.cluster import Broker, NameServer, free_port, wait_for
from mq.wire.commitlog import parse_record
from mq.wire.msgid import decode_offset_msg_id
from mq.wire.headers import send_v2
from tests.faults.rawpeer import Peer

TOPIC = "RotTopic"


@pytest.fixture
def broker(tmp_path):
    ns = NameServer(str(tmp_path))
    b = Broker(str(tmp_path), ns.addr, sendMessageThreadPoolNums=1, mappedFileSizeCommitLog=1024 * 1024,
               metricsPort=free_port())
    yield b
    try:
        assert b.stop() == 0
    finally:
        ns.stop()


def send(peer: Peer, body: bytes, properties: str = "") -> dict:
    resp = peer.call(310, send_v2(producerGroup="RotPG", topic=TOPIC, defaultTopic="TBW102",
                                  defaultTopicQueueNums="4", queueId="0", sysFlag="0", bornTimestamp="0", flag="0",
                                  properties=properties), body)
    assert resp.code == 0, (resp.code, resp.remark)
    return resp.ext_fields


def pull(peer: Peer, offset: int, n: int):
    return peer.call(11, {"consumerGroup": "RotCG", "topic": TOPIC, "queueId": "0", "queueOffset": str(offset),
                          "maxMsgNums": str(n), "sysFlag": "4", "commitOffset": "0", "suspendTimeoutMillis": "0",
                          "subscription": "*", "subVersion": "0"})


def records(body: bytes) -> list:
    out, at = [], 0
    while at < len(body):
        rec = parse_record(body, at, check_crc=True)
        out.append(rec)
        at += rec.total_size
    return out


def counted(broker: Broker, name: str) -> float | None:
    """The value of metric `name` (no labels but cluster and broker) at one scrape of the broker."""
    port = int(broker.options["metricsPort"])
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    for line in body.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


def flip(broker: Broker, phy: int, at: int) -> None:
    path = os.path.join(broker.dir, "commitlog", "%020d" % (phy - phy % (1024 * 1024)))
    with open(path, "r+b") as f:
        f.seek(phy % (1024 * 1024) + at)
        b = f.read(1)
        f.seek(phy % (1024 * 1024) + at)
        f.write(bytes([b[0] ^ 0x01]))


def test_a_record_damaged_under_a_live_broker_is_never_served(broker):
    p = Peer(broker.port)
    try:
        sent = [send(p, b"rot-%03d-" % i + b"x" * 200) for i in range(30)]
        got = wait_for(lambda: (lambda r: r if len(records(r.body)) == 30 else None)(pull(p, 0, 30)), 10,
                       what="all 30 dispatched")
        assert got.code == 0
        victim = sent[10]
        phy = decode_offset_msg_id(victim["msgId"])[2]
        flip(broker, phy, 120)                      # a body byte: BODYCRC no longer matches
        got = pull(p, 0, 30)
        recs = records(got.body)                    # check_crc=True: whatever is served is intact
        assert got.code == 0 and [r.queue_offset for r in recs] == [i for i in range(30) if i != 10]
        assert int(got.ext_fields["nextBeginOffset"]) == 30, "the consumer moves past the damaged record"
        # a pull of one from its offset skips it like a filtered message and serves the next one
        alone = pull(p, 10, 1)
        assert alone.code == 0 and [r.queue_offset for r in records(alone.body)] == [11], (alone.code, alone.remark)
        assert int(alone.ext_fields["nextBeginOffset"]) == 12
        view = p.call(33, {"offset": str(phy)})
        assert view.code == 1 and "record at" in view.remark, (view.code, view.remark)
        # the io worker's log lines reach the broker's log through the supervisor, later: a request
        # it logs after the reads, on the same connection (so the same io worker, whose lines
        # arrive in order), marks where the reads' lines end
        assert p.call(9999, {}).code == 3                  # REQUEST_CODE_NOT_SUPPORTED, logged
        log = wait_for(lambda: (lambda text: text if "request code 9999 not supported" in text else None)(
            broker.proc.output()), 10, what="the io worker's log line of the marker request")
        assert log.count(f"CommitLog {phy} ") == 1, "reported once"
        assert "Traceback" not in log
        # each read that met it counts (two pulls; the io worker publishes every 0.1 s)
        assert wait_for(lambda: counted(broker, "mq_store_damaged_records_skipped_total") == 2, 10,
                        what="two skipped reads in the metrics")
        assert counted(broker, "mq_store_damaged_entries_found_total") == 0
        assert counted(broker, "mq_store_recovery_records_refused") == 0
    finally:
        p.close()


# v1 record: QUEUEOFFSET is bytes 20..27 (big-endian); a 6-byte body is bytes 88..93, then the
# topic's length byte, then the topic
@pytest.mark.parametrize("field,at", [("QUEUEOFFSET", 27), ("TOPIC", 88 + 6 + 1)])
def test_a_record_whose_queue_offset_or_topic_changed_is_never_served(broker, field, at):
    """A flipped byte of QUEUEOFFSET or of the TOPIC (outside the body CRC): the record no longer
    matches the ConsumeQueue entry that points at it, and a pull skips it.  The readers that hold
    only its offset skip it too, as it is not where its fields file it (its QUEUEOFFSET names
    record 3's place; the topic names no queue): viewMessageById answers SYSTEM_ERROR, and a
    query by key, whose message index kept the key from before the flip, QUERY_NOT_FOUND.
    (Before: both served the damaged record.)"""
    p = Peer(broker.port)
    try:
        sent = [send(p, b"qo-%03d" % i, f"KEYS\x01rot-key-{i}\x02") for i in range(5)]
        wait_for(lambda: len(records(pull(p, 0, 30).body)) == 5, 10, what="all five dispatched")
        wait_for(lambda: all(query(p, f"rot-key-{i}").code == 0 for i in range(5)), 10, what="all five indexed")
        phy = decode_offset_msg_id(sent[2]["msgId"])[2]
        flip(broker, phy, at)
        got = pull(p, 0, 30)
        assert [r.queue_offset for r in records(got.body)] == [0, 1, 3, 4], field
        view = p.call(33, {"offset": str(phy)})
        assert view.code == 1 and f"the record at {phy} says" in view.remark, (view.code, view.remark)
        found = query(p, "rot-key-2")
        assert found.code == 22, (found.code, found.remark, records(found.body))      # QUERY_NOT_FOUND
        for i in (0, 1, 3, 4):
            found = query(p, f"rot-key-{i}")
            assert found.code == 0 and [r.body for r in records(found.body)] == [b"qo-%03d" % i], i
            phy_i = decode_offset_msg_id(sent[i]["msgId"])[2]
            assert p.call(33, {"offset": str(phy_i)}).code == 0, i
    finally:
        p.close()


def query(peer: Peer, key: str):
    """QUERY_MESSAGE (12) by key in TOPIC, any store time."""
    return peer.call(12, {"topic": TOPIC, "key": key, "maxNum": "32", "beginTimestamp": "0",
                          "endTimestamp": str(2 ** 62)})


@pytest.mark.parametrize("where", ["size", "physical offset"])
def test_a_consume_queue_entry_damaged_under_a_live_broker_still_serves_its_message(broker, where):
    """A flipped bit in a ConsumeQueue entry (no checksum covers it; recovery checks only a queue's
    tail entries): the record it names fails the read check, so the read path looks for the record
    between the ones entries 9 and 11 name, finds it whole, and serves it in its place -- pulls of
    the whole queue and of that offset alone get every message, in order.  (Before: the message
    was skipped although its record was intact.)"""
    p = Peer(broker.port)
    try:
        [send(p, b"cq-%03d-" % i + b"y" * 100) for i in range(30)]
        wait_for(lambda: len(records(pull(p, 0, 30).body)) == 30, 10, what="all 30 dispatched")
        path = os.path.join(broker.dir, "consumequeue", TOPIC, "0", "%020d" % 0)
        at = 10 * 20 + (8 + 3 if where == "size" else 6)      # PHYSICALOFFSET 8 | SIZE 4 | TAGSCODE 8
        with open(path, "r+b") as f:
            f.seek(at)
            b = f.read(1)
            f.seek(at)
            f.write(bytes([b[0] ^ 0x04]))
        got = pull(p, 0, 30)
        assert got.code == 0 and [r.queue_offset for r in records(got.body)] == list(range(30))
        assert [r.body[:7] for r in records(got.body)][10] == b"cq-010-"
        alone = pull(p, 10, 1)
        assert alone.code == 0 and [r.queue_offset for r in records(alone.body)] == [10]
        assert int(alone.ext_fields["nextBeginOffset"]) == 11
        assert p.call(9999, {}).code == 3                  # a marker line after the reads' (see above)
        log = wait_for(lambda: (lambda text: text if "request code 9999 not supported" in text else None)(
            broker.proc.output()), 10, what="the io worker's log line of the marker request")
        assert f"ConsumeQueue {TOPIC}:0 entry 10 is damaged: its record was found" in log
        assert "Traceback" not in log
        assert wait_for(lambda: counted(broker, "mq_store_damaged_entries_found_total") == 2, 10,
                        what="two found records in the metrics")
    finally:
        p.close()


def test_a_found_record_that_does_not_fit_the_pull_starts_the_next_pull(tmp_path):
    """The byte budget holds for a damaged entry's found record too: records of 226 bytes,
    maxTransferBytesOnMessageInMemory four of them and 150 more, entry 4's size flipped from 226 to
    98 (so the gather reaches it within the budget, fails its read, and the record found is too big
    for what is left): the pull from 0 ends before it (nextBeginOffset 4) and the next pull starts
    with it, so every message is delivered.  (Before: it was skipped and the consumer moved past it.)"""
    ns = NameServer(str(tmp_path))
    b = Broker(str(tmp_path), ns.addr, sendMessageThreadPoolNums=1, mappedFileSizeCommitLog=1024 * 1024,
               maxTransferBytesOnMessageInMemory=4 * 226 + 150)
    p = Peer(b.port)
    try:
        [send(p, b"fit-%03d-" % i + b"y" * 100) for i in range(10)]
        wait_for(lambda: len(records(pull(p, 4, 30).body)) >= 4, 10, what="all dispatched")
        assert {r.total_size for r in records(pull(p, 0, 30).body)} == {226}
        path = os.path.join(b.dir, "consumequeue", TOPIC, "0", "%020d" % 0)
        with open(path, "r+b") as f:
            f.seek(4 * 20 + 8 + 3)                  # SIZE's low byte: 0xE2 -> 0x62
            v = f.read(1)
            f.seek(4 * 20 + 8 + 3)
            f.write(bytes([v[0] ^ 0x80]))
        first = pull(p, 0, 30)
        assert [r.queue_offset for r in records(first.body)] == [0, 1, 2, 3]
        assert int(first.ext_fields["nextBeginOffset"]) == 4
        seen, offset = [0, 1, 2, 3], 4
        while offset < 10:
            got = pull(p, offset, 30)
            assert got.code == 0, (got.code, got.remark)
            seen += [r.queue_offset for r in records(got.body)]
            offset = int(got.ext_fields["nextBeginOffset"])
        assert seen == list(range(10))
    finally:
        p.close()
        try:
            assert b.stop() == 0
        finally:
            ns.stop()
