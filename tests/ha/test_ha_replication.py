"""HAMaster and HASlave over real TCP on 127.0.0.1, between two real stores
(64 KiB CommitLog files, so every test crosses files), in this process."""
import logging
import shutil
import socket
import threading
import time

import pytest

from mq.ha import HAMaster, HASlave
from mq.store import MessageStore
from mq.store import control as C
from mq.store.notify import PositionWaiter
from mq.wire import ha as W
from mq.cluster import wait_for

from hakit import (FAST, FS, SLAVE_FAST, assert_same_queues, fill, log_bytes, raw_connect,
                   read_frame, recv_exact, wait_closed, wait_same)


@pytest.fixture
def nodes():
    """Starts HAMaster / HASlave objects and stops them at teardown (before the stores close)."""
    started = []

    def master(store, **kw):
        kw = {**FAST, **kw}
        m = HAMaster(store.cl, store.ctl, "127.0.0.1", 0, **kw).start()
        started.append(m)
        return m

    def slave(store, port_or_addr, **kw):
        kw = {**SLAVE_FAST, **kw}
        addr = port_or_addr if isinstance(port_or_addr, str) else f"127.0.0.1:{port_or_addr}"
        s = HASlave.for_store(store, lambda: addr, **kw).start()
        started.append(s)
        return s

    yield master, slave
    for n in reversed(started):
        n.stop()


def test_replication_catches_up_and_stays_identical(make_store, tmp_path, nodes):
    """(a) With the master appending all the time (records cut by frame ends,
    files rolling), the slave catches up and its CommitLog is byte-identical
    to the master's from offset 0 (full copy); its own dispatch gives the same
    messages in every queue."""
    new_master, new_slave = nodes
    master = make_store(root=tmp_path / "m")
    slave = make_store(root=tmp_path / "s")
    fill(master, 60)
    m = new_master(master, ha_full_copy=True, transfer_batch_size=5000)
    s = new_slave(slave, m.port)
    stop = threading.Event()

    def writer():
        i = 0
        while not stop.is_set() and i < 400:
            fill(master, 5, seed=100 + i, tag=b"w")
            i += 1
            time.sleep(0.002)

    t = threading.Thread(target=writer)
    t.start()
    wait_for(lambda: slave.cl.write_pos > 2 * FS, 15, 0.01, "replication while appending")
    t.join()
    wait_same(master, slave)
    assert master.cl.write_pos > 5 * FS, "enough data to roll several files"
    assert slave.cl.min_pos == 0
    assert_same_queues(master, slave)
    assert s.connects == 1 and not s.divergences


def test_empty_slave_starts_at_the_masters_last_file(make_store, tmp_path, nodes):
    """(b) An empty slave (report 0) is streamed from the start of the master's
    last file, not from 0: its log starts there (older files removed, positions
    re-based), equals the master's from there, its queues give the same messages
    from there, and it recovers as such after a restart."""
    new_master, new_slave = nodes
    master = make_store(root=tmp_path / "m")
    slave = make_store(root=tmp_path / "s")
    end = fill(master, 250)
    last_file = end - end % FS
    assert last_file >= 2 * FS
    m = new_master(master)
    s = new_slave(slave, m.port)
    wait_same(master, slave)
    assert slave.cl.min_pos == last_file
    wait_for(lambda: m.slaves() and m.slaves()[0]["startOffset"] == 0, 5, 0.01, "the first report")
    assert_same_queues(master, slave, from_phy=last_file)
    s.stop()
    cfg = slave.config
    slave.close()
    again = MessageStore.open(cfg)
    try:
        assert again.cl.min_pos == last_file and again.cl.write_pos == end
        # its queues' first files begin with FILLER entries: trusted as they are (before, every queue
        # was rebuilt at every start, its first entries read as a hole)
        assert again.recovery.queues_rebuilt == []
        assert_same_queues(master, again, from_phy=last_file)
    finally:
        again.close()


def test_full_copy_starts_an_empty_slave_at_zero(make_store, tmp_path, nodes):
    """(b) With ha_full_copy an empty slave gets the whole log from offset 0."""
    new_master, new_slave = nodes
    master = make_store(root=tmp_path / "m")
    slave = make_store(root=tmp_path / "s")
    fill(master, 250)
    m = new_master(master, ha_full_copy=True)
    new_slave(slave, m.port)
    wait_same(master, slave)
    assert slave.cl.min_pos == 0
    assert_same_queues(master, slave)


def test_restarted_slave_resumes_from_its_own_offset(make_store, tmp_path, nodes):
    """(c) A slave stopped and started again on the same store reports its own
    end as its first value and the master resumes there (nothing re-sent).  POS_HA_SLAVES, what
    io workers read for isSlaveOK, follows the connections: 1, 0 once the first is gone, 1."""
    new_master, new_slave = nodes
    master = make_store(root=tmp_path / "m")
    slave = make_store(root=tmp_path / "s")
    fill(master, 100)
    m = new_master(master, ha_full_copy=True)
    assert master.ctl.get(C.POS_HA_SLAVES) == 0
    s1 = new_slave(slave, m.port)
    wait_same(master, slave)
    assert master.ctl.get(C.POS_HA_SLAVES) == 1
    s1.stop()
    wait_for(lambda: not m.slaves(), 5, 0.01, "the master to drop the old connection")
    assert master.ctl.get(C.POS_HA_SLAVES) == 0
    resume_at = slave.cl.write_pos
    fill(master, 100, seed=9)
    new_slave(slave, m.port)
    wait_for(lambda: m.slaves() and m.slaves()[0]["startOffset"] is not None, 5, 0.01, "the new connection")
    assert m.slaves()[0]["startOffset"] == resume_at
    assert master.ctl.get(C.POS_HA_SLAVES) == 1
    wait_same(master, slave)
    assert_same_queues(master, slave)


def test_acks_advance_pos_acked_and_release_waiters(make_store, tmp_path, nodes):
    """(f) Each put's end offset is acknowledged by the slave: POS_ACKED (what a
    SYNC_MASTER send waits on, woken through SEQ_ACK) reaches it, never passes
    the master's write position, and ends equal to it."""
    new_master, new_slave = nodes
    master = make_store(root=tmp_path / "m")
    slave = make_store(root=tmp_path / "s")
    m = new_master(master, ha_full_copy=True)
    new_slave(slave, m.port)
    waiter = PositionWaiter(master.ctl, C.SEQ_ACK, C.POS_ACKED)
    try:
        for i in range(60):
            r = master.put("HA0", i % 3, b"sync-%d" % i + b"." * (i * 37 % 3000))
            assert r.ok
            assert waiter.wait(r.result.end_offset, 5), f"no ack for message {i}"
            assert master.ctl.get(C.POS_ACKED) <= master.cl.write_pos
    finally:
        waiter.close()
    wait_for(lambda: master.ctl.get(C.POS_ACKED) == master.cl.write_pos, 5, 0.01, "the final ack")
    wait_for(lambda: m.slaves()[0]["ackOffset"] == master.cl.write_pos, 5, 0.01, "per-slave ack state")
    # sentOffset moves when C is done with a frame's send call, and the slave may ack that frame
    # before the sending thread runs again: it catches up, it does not lead
    wait_for(lambda: m.slaves()[0]["sentOffset"] == master.cl.write_pos, 5, 0.01, "per-slave sent state")
    assert m.slaves()[0]["addr"].startswith("127.0.0.1:")


def _streaming_to_a_fake(make_store, tmp_path, nodes):
    """A master holding 200 records and streaming (frames of <= 3000 bytes) to a raw socket
    that reported 0 (an empty slave): (store, HAMaster, socket, the log's end)."""
    new_master, _ = nodes
    master = make_store(root=tmp_path / "m")
    end = fill(master, 200)
    m = new_master(master, transfer_batch_size=3000)
    fake = raw_connect(m.port)
    fake.sendall(W.pack_slave_report(0))
    return master, m, fake, end


def _read_stream(fake, start: int, end: int) -> bytes:
    """The frames' bodies from start to end, each contiguous, of <= 3000 bytes, in one file."""
    pos, got = start, bytearray()
    while pos < end:
        offset, body = read_frame(fake)
        assert offset == pos and 0 < len(body) <= 3000
        assert offset // FS == (offset + len(body) - 1) // FS, "a frame stays inside one file"
        got += body
        pos += len(body)
    return bytes(got)


def test_wire_as_a_4x_slave_sees_it(make_store, tmp_path, nodes):
    """The bytes on the HA port, read by hand: after an 8-byte report of 0 the
    master streams contiguous frames from the start of its last file, each at
    most transfer_batch_size and inside one file, that equal its log; with
    nothing left it heartbeats (header only, at the next offset); an ack of
    exactly what was sent moves POS_ACKED there."""
    master, _, fake, end = _streaming_to_a_fake(make_store, tmp_path, nodes)
    try:
        start = end - end % FS
        got = _read_stream(fake, start, end)
        assert got == log_bytes(master, start, end)
        assert read_frame(fake) == (end, b""), "heartbeat"
        assert master.ctl.get(C.POS_ACKED) == 0
        fake.sendall(W.pack_slave_report(end))
        wait_for(lambda: master.ctl.get(C.POS_ACKED) == end, 5, 0.01, "the ack")
    finally:
        fake.close()


def test_streaming_reader_joins_split_acks_and_closes_on_a_negative_one(make_store, tmp_path, nodes, caplog):
    """(d) Once the master streams, its reader runs in C (mq_ha_read_acks): an ack sent in two
    pieces with a pause between counts as one report, and a negative report closes the
    connection as a violation with POS_ACKED where the valid ack left it."""
    master, m, fake, end = _streaming_to_a_fake(make_store, tmp_path, nodes)
    try:
        _read_stream(fake, end - end % FS, end)
        assert read_frame(fake) == (end, b""), "heartbeat"
        time.sleep(0.5)                                # past the reader's STOP_CHECK_MS: it reads in C now
        report = W.pack_slave_report(end - 1)
        fake.sendall(report[:3])
        time.sleep(0.3)
        assert master.ctl.get(C.POS_ACKED) == 0, "three bytes are no report"
        fake.sendall(report[3:])
        wait_for(lambda: master.ctl.get(C.POS_ACKED) == end - 1, 5, 0.01, "the ack sent in two pieces")
        with caplog.at_level(logging.ERROR, logger="mq.ha.master"):
            fake.sendall(b"\xff" * 8)
            assert wait_closed(fake, 10)
            wait_for(lambda: not m.slaves(), 5, 0.01, "the connection to go")
        assert m.violations == 1 and master.ctl.get(C.POS_ACKED) == end - 1
        assert any("negative offset" in r.getMessage() for r in caplog.records)
    finally:
        fake.close()


def test_forged_ack_beyond_what_was_sent_closes_the_connection(make_store, tmp_path, nodes, caplog):
    """(d) A peer that acks an offset the master has written but not yet sent to
    it (it does not read, so the master's sends stall) is a protocol violation:
    its connection is closed and POS_ACKED does not move."""
    new_master, _ = nodes
    master = make_store(root=tmp_path / "m", mappedFileSizeCommitLog=1024 * 1024)
    fill(master, 1000, size_max=3000)
    m = new_master(master, ha_full_copy=True, transfer_batch_size=4096)
    fake = raw_connect(m.port, rcvbuf=4096)
    # a sentOffset that stood still for a while is not proof the master cannot send more: on a
    # loaded machine its sender may simply not have run (a CI run saw the forged ack land on
    # bytes sent meanwhile).  What bounds it is the kernel: the peer never reads, so at most its
    # receive buffer and the master's send buffer (which grows up to tcp_wmem's maximum) more can
    # leave; the forged ack lies further than that beyond the stalled position.
    with open("/proc/sys/net/ipv4/tcp_wmem") as f:
        can_still_leave = int(f.read().split()[2]) + 256 * 1024
    try:
        fake.sendall(W.pack_slave_report(0))
        for more in range(32):
            fake.sendall(W.pack_slave_report(0))       # a report (of nothing) keeps the connection alive
            stalled = []

            def sent_stalled():
                sl = m.slaves()
                stalled.append(sl[0]["sentOffset"] if sl else None)
                return len(stalled) > 10 and stalled[-1] == stalled[-10] and stalled[-1] > 0

            wait_for(sent_stalled, 10, 0.05, "the master's sends to stall")
            sent, end = stalled[-1], master.cl.write_pos
            if sent + can_still_leave < end:
                break
            fill(master, 3000, seed=10 + more, size_max=3000)
        assert sent + can_still_leave < end, "the master has written more than it can have sent"
        before = master.ctl.get(C.POS_ACKED)
        with caplog.at_level(logging.ERROR, logger="mq.ha.master"):
            fake.sendall(W.pack_slave_report(end))
            assert wait_closed(fake, 10)
            wait_for(lambda: not m.slaves(), 5, 0.01, "the connection to go")
        assert master.ctl.get(C.POS_ACKED) == before == 0
        assert m.violations == 1
        assert any("beyond" in r.getMessage() for r in caplog.records)
    finally:
        fake.close()


def test_garbage_on_the_ha_port_closes_only_that_connection(make_store, tmp_path, nodes):
    """(d) An HTTP probe, a negative offset, and a partial report followed by
    silence each get their connection closed (the last after the housekeeping
    interval); POS_ACKED is unchanged by all of them, and a real slave
    connected at the same time replicates to the end."""
    new_master, new_slave = nodes
    master = make_store(root=tmp_path / "m")
    slave = make_store(root=tmp_path / "s")
    fill(master, 150)
    m = new_master(master, ha_full_copy=True, housekeeping_interval_ms=1000)
    new_slave(slave, m.port)
    wait_same(master, slave)
    # the slave has the bytes before the master has read its ack of them: wait for that too,
    # or the honest ack arriving during the probes would look like one they caused
    end = master.cl.write_pos
    wait_for(lambda: master.ctl.get(C.POS_ACKED) == end, 10, 0.01, "the slave's ack of the end")
    acked = master.ctl.get(C.POS_ACKED)
    probes = [raw_connect(m.port) for _ in range(3)]
    try:
        probes[0].sendall(b"GET / HTTP/1.0\r\n\r\n")
        probes[1].sendall(b"\xff" * 8)
        probes[2].sendall(b"abc")
        for p in probes:
            assert wait_closed(p, 8)
        assert m.violations == 2
        assert master.ctl.get(C.POS_ACKED) == acked
    finally:
        for p in probes:
            p.close()
    fill(master, 100, seed=5)
    wait_same(master, slave)
    assert len(m.slaves()) == 1
    assert_same_queues(master, slave)


class FakeMaster:
    """A listening socket the test drives by hand as the slave's master."""

    def __init__(self):
        self.lsock = socket.create_server(("127.0.0.1", 0))
        self.lsock.settimeout(10)
        self.addr = f"127.0.0.1:{self.lsock.getsockname()[1]}"

    def accept(self) -> tuple[socket.socket, int]:
        conn, _ = self.lsock.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn, W.unpack_slave_report(recv_exact(conn, 8))

    def close(self):
        self.lsock.close()


def test_slave_drops_a_master_that_sends_bad_frames(make_store, tmp_path, nodes, caplog):
    """(d) A frame at the wrong offset, then a frame whose bytes are not valid
    records: each time the slave logs it, closes the connection and reconnects
    reporting the same end; nothing it had is changed and nothing bad is
    published."""
    _, new_slave = nodes
    slave = make_store(root=tmp_path / "s")
    end = fill(slave, 50)
    assert end % FS
    before = log_bytes(slave, 0, end)
    fake = FakeMaster()
    try:
        with caplog.at_level(logging.ERROR, logger="mq.ha.slave"):
            new_slave(slave, fake.addr)
            conn, first = fake.accept()
            assert first == end
            conn.sendall(W.pack_ha_frame_header(end + 64, 10) + b"x" * 10)
            assert wait_closed(conn, 5)
            conn.close()
            assert any("expected %d" % end in r.getMessage() for r in caplog.records)

            conn, first = fake.accept()
            assert first == end
            conn.sendall(W.pack_ha_frame_header(end, 300) + b"\x00\x00\x01\x00" + b"\xab" * 296)
            assert wait_closed(conn, 5)
            conn.close()
            assert any("not valid" in r.getMessage() for r in caplog.records)

            conn, first = fake.accept()
            assert first == end
            conn.sendall(W.pack_ha_frame_header(end, FS))        # crosses the file end
            assert wait_closed(conn, 5)
            conn.close()
        assert slave.cl.write_pos == end
        assert log_bytes(slave, 0, end) == before
        assert slave.wait_dispatched(5)
        assert sum(slave.max_offset(t, q) for t in ("HA0", "HA1") for q in range(3)) == 50
    finally:
        fake.close()


def test_catch_up_burst_with_a_bad_record_publishes_and_acks_only_what_precedes_it(make_store, tmp_path, nodes,
                                                                                    caplog):
    """(d') The catch-up path: a master bursts ~3 MiB of frames at once, so the slave receives
    them in runs of many frames (one C call, one validation and one report per run).  One
    record in the third MiB has a flipped body byte (its CRC no longer matches): the slave
    publishes exactly the records before it, never acks past its start, logs it and drops
    the connection."""
    _, new_slave = nodes
    master = make_store(root=tmp_path / "m")
    slave = make_store(root=tmp_path / "s")
    end = fill(master, 5000, seed=11)
    assert end > 3 * 1024 * 1024
    data = bytearray(log_bytes(master, 0, end))
    sc = master.cl.scanner(4096)
    pos, bad = 0, None
    while bad is None:
        n, pos, _ = sc.scan(pos, end, check_crc=False, resolve_slots=0)
        assert n
        # a record inside one 32 KiB frame: every ack then lands on a frame end, none inside it
        bad = next((r for r in (sc.recs[i] for i in range(n)) if r.phy_offset >= 2 * 1024 * 1024 + 12345
                    and r.phy_offset // 32768 == (r.phy_offset + r.size - 1) // 32768), None)
    data[bad.phy_offset + bad.body_offset] ^= 0xFF
    frames = b"".join(W.pack_ha_frame_header(off, min(32768, end - off)) + bytes(data[off:off + 32768])
                      for off in range(0, end, 32768))
    fake = FakeMaster()
    try:
        with caplog.at_level(logging.ERROR, logger="mq.ha.slave"):
            new_slave(slave, fake.addr)
            conn, first = fake.accept()
            assert first == 0
            threading.Thread(target=lambda: conn.sendall(frames), daemon=True).start()
            reports = bytearray()
            conn.settimeout(10)
            while True:                                   # the slave's reports, until it closes
                chunk = conn.recv(65536)
                if not chunk:
                    break
                reports += chunk
            conn.close()
        acks = [W.unpack_slave_report(reports, i) for i in range(0, len(reports) - len(reports) % 8, 8)]
        assert acks and max(acks) <= bad.phy_offset, (max(acks), bad.phy_offset)
        assert slave.cl.write_pos == bad.phy_offset
        assert log_bytes(slave, 0, bad.phy_offset) == bytes(data[:bad.phy_offset])
        assert any("not valid at %d" % bad.phy_offset in r.getMessage() for r in caplog.records)
    finally:
        fake.close()


def test_divergence_truncates_the_slave_to_the_masters_end(make_store, tmp_path, nodes, caplog):
    """(e) The master loses a tail the slave already has (the master restarts
    from a copy of its store taken before its last 60 messages, which reach a
    newer file): the master logs the divergence with the byte count and tells
    the slave its end; the slave logs the same count, truncates its log and
    ConsumeQueues to the master's end, and from then on is byte-identical, the
    lost messages gone from its queues.  The truncated slave recovers cleanly
    after a restart."""
    new_master, new_slave = nodes
    old = make_store(root=tmp_path / "m")
    slave = make_store(root=tmp_path / "s")
    fill(old, 100)
    cfg = old.config
    old.close()
    shutil.copytree(tmp_path / "m", tmp_path / "m-before-tail")
    old = make_store(root=tmp_path / "m")
    fill(old, 60, seed=77, tag=b"lost")
    m = new_master(old, ha_full_copy=True)
    s1 = new_slave(slave, m.port)
    wait_same(old, slave)
    s1.stop()
    m.stop()
    old.close()

    master = make_store(root=tmp_path / "m-before-tail")
    master_end, slave_end = master.cl.write_pos, slave.cl.write_pos
    assert slave_end // FS > master_end // FS, "the lost records reach a newer file"
    lost = slave_end - master_end
    m = new_master(master)
    with caplog.at_level(logging.ERROR, logger="mq.ha"):
        s2 = new_slave(slave, m.port)
        wait_for(lambda: s2.divergences and slave.cl.write_pos == master_end, 10, 0.01, "truncation")
    msgs = [r.getMessage() for r in caplog.records]
    assert any("holds %d bytes more" % lost in t for t in msgs), msgs
    assert any("hold %d bytes more" % lost in t for t in msgs), msgs
    fill(master, 120, seed=3)
    wait_same(master, slave)
    assert_same_queues(master, slave)
    for t in ("HA0", "HA1"):
        for q in range(3):
            assert not any(b"lost" in bytes(v) for _, v in slave.get_messages(t, q, 0, 10_000))
    s2.stop()
    cfg = slave.config
    slave.close()
    again = MessageStore.open(cfg)
    try:
        assert again.cl.write_pos == master.cl.write_pos
        assert_same_queues(master, again)
    finally:
        again.close()
