"""The C side of master/slave replication: the master streams CommitLog
ranges with sendfile in 4.x frames (8-byte offset + 4-byte size + raw bytes),
the slave receives straight into its mapped CommitLog, validates every record
before publishing it, and ends up byte-identical to the master."""
import os
import random
import socket
import struct
import threading

import pytest

from mq.cluster import wait_for
from mq.store.native import StoreIOError
from mq.wire import ha as wha
from mq.wire import commitlog as wcl

FS = 64 * 1024


def _fill(store, n, seed=3):
    rnd = random.Random(seed)
    for i in range(n):
        assert store.put(f"T{i % 3}", i % 4, b"m%06d" % i + rnd.randbytes(rnd.randint(10, 2000)),
                         b"TAGS\x01TagA").ok
    assert store.wait_dispatched()


def _recv_exact(sock, n):
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        assert chunk, "peer closed"
        buf += chunk
    return buf


def _replicate(master, slave, max_body, corrupt_at=None):
    """Streams master -> slave over a socket pair (through a relay that may flip
    one byte of the stream); returns (frames, corrupt detected)."""
    m_sock, relay_in = socket.socketpair()
    relay_out, s_sock = socket.socketpair()
    end = master.cl.write_pos
    state = {"frames": 0}

    def master_side():
        off = 0
        try:
            while off < end:
                off += master.cl.ha_send_frame(m_sock.fileno(), off, max_body)
                state["frames"] += 1
            m_sock.shutdown(socket.SHUT_WR)
        except (StoreIOError, OSError):
            state["master_cut_off"] = True     # the slave dropped the connection

    def relay():
        seen = 0
        try:
            while True:
                data = relay_in.recv(65536)
                if not data:
                    relay_out.shutdown(socket.SHUT_WR)
                    return
                if corrupt_at is not None and seen <= corrupt_at < seen + len(data):
                    b = bytearray(data)
                    b[corrupt_at - seen] ^= 0x55
                    data = bytes(b)
                seen += len(data)
                relay_out.sendall(data)
        except OSError:
            relay_in.close()                    # pass the cut on to the master

    threads = [threading.Thread(target=master_side), threading.Thread(target=relay)]
    for t in threads:
        t.start()
    expected = slave.cl.write_pos
    corrupt = False
    try:
        while True:
            head = s_sock.recv(wha.HA_FRAME_HEADER_SIZE, socket.MSG_WAITALL)
            if not head:
                break
            offset, size = struct.unpack(">qi", head)
            assert offset == expected, "frame offset is the slave's next byte"
            slave.cl.ha_recv_body(s_sock.fileno(), offset, size)
            expected += size
            published, corrupt = slave.cl.ha_publish(expected)
            if corrupt:
                break
    finally:
        s_sock.close()
        for t in threads:
            t.join(10)
        for sk in (m_sock, relay_in, relay_out):
            sk.close()
    return state["frames"], corrupt


@pytest.mark.parametrize("max_body", [wha.HA_TRANSFER_BATCH_SIZE, 700])
def test_slave_becomes_byte_identical(make_store, tmp_path, max_body):
    """Every frame ≤ max_body and inside one file; records cut by a frame end
    wait for the next frame; the slave's files equal the master's byte for byte
    and its own dispatch builds the same ConsumeQueues."""
    master = make_store(root=tmp_path / "m", mappedFileSizeCommitLog=FS)
    slave = make_store(root=tmp_path / "s", mappedFileSizeCommitLog=FS)
    _fill(master, 300)
    frames, corrupt = _replicate(master, slave, max_body)
    assert not corrupt
    assert frames >= master.cl.write_pos // max_body
    assert slave.cl.write_pos == master.cl.write_pos
    for name in sorted(os.listdir(slave.config.commitlog_dir)):
        start = int(name)
        if start >= master.cl.write_pos:
            continue
        with open(os.path.join(master.config.commitlog_dir, name), "rb") as f1, \
                open(os.path.join(slave.config.commitlog_dir, name), "rb") as f2:
            assert f1.read() == f2.read(), f"file {name} differs"
    assert slave.wait_dispatched()
    for t in range(3):
        for q in range(4):
            assert slave.max_offset(f"T{t}", q) == master.max_offset(f"T{t}", q)
            a = [bytes(v) for _, v in master.get_messages(f"T{t}", q, 0, 16)]
            b = [bytes(v) for _, v in slave.get_messages(f"T{t}", q, 0, 16)]
            assert a == b


def test_a_flipped_byte_is_never_published(make_store, tmp_path):
    """A byte flipped in transit: the slave publishes every record before the
    damaged one and stops there; nothing corrupt becomes readable."""
    master = make_store(root=tmp_path / "m", mappedFileSizeCommitLog=FS)
    slave = make_store(root=tmp_path / "s", mappedFileSizeCommitLog=FS)
    _fill(master, 200)
    victim = master.get_messages("T1", 1, 3, 1)[0][1]
    victim_phy = wcl.parse_record(victim).physical_offset
    # stream offset of a body byte of that record: +12 per frame header before it
    frames_before = victim_phy // 700 + 1
    _, corrupt = _replicate(master, slave, 700, corrupt_at=victim_phy + 100 + 12 * frames_before)
    assert corrupt
    assert slave.cl.write_pos <= victim_phy
    assert slave.wait_dispatched()
    for t in range(3):
        for q in range(4):
            for _, v in slave.get_messages(f"T{t}", q, 0, 64):
                wcl.parse_record(v, check_crc=True)


def test_receive_never_writes_over_published_bytes(make_store, tmp_path):
    """A frame for an offset below the slave's write position is refused."""
    from mq.store import OutOfRange
    slave = make_store(root=tmp_path / "s", mappedFileSizeCommitLog=FS)
    _fill(slave, 5)
    a, b = socket.socketpair()
    try:
        with pytest.raises(OutOfRange):
            slave.cl.ha_recv_body(a.fileno(), 0, 10)
    finally:
        a.close()
        b.close()


def test_a_retire_beside_a_sending_thread_never_pulls_a_file_from_under_it(make_store):
    """mq_commitlog_retire on one thread while another streams frames of the files it retires (the
    HA role's main loop beside a connection's writer): each frame goes out whole, with the file's
    own bytes, through an fd the send owns (seg_fd_own), and the first frame after the retire is
    refused as out of range -- the handle never maps a retired file again, though here the files
    are still on disk (a reader that checked MIN just before retention moved it).  Before, the
    writer used the handle's fd after letting go of seg_lock: a retire between the two could close
    it under the sendfile, or hand the number to the next file opened."""
    from mq._mqstore import lib
    from mq.store import OutOfRange
    s = make_store(mappedFileSizeCommitLog=FS)
    _fill(s, 250)
    s.cl.flush(0)
    files = sorted(int(n) for n in os.listdir(s.config.commitlog_dir))
    assert len(files) >= 4
    below = files[2]
    on_disk = b"".join(open(os.path.join(s.config.commitlog_dir, "%020d" % f), "rb").read() for f in files[:2])
    out, into = socket.socketpair()
    got = bytearray()
    state = {}

    def drain():
        while chunk := into.recv(1 << 20):
            got.extend(chunk)

    def writer():
        off, frames = 0, 0
        try:
            while True:                        # round and round the first two files
                off = (off + s.cl.ha_send_frame(out.fileno(), off, 4096)) % below
                frames += 1
        except OutOfRange:
            state["refused_after"] = frames
        except Exception as e:                 # noqa: BLE001 -- the verdict is below
            state["error"] = e

    readers = [threading.Thread(target=drain), threading.Thread(target=writer)]
    for t in readers:
        t.start()
    wait_for(lambda: len(got) >= 4 * FS or "error" in state, 30, 0.001, "the writer streaming (every file mapped)")
    assert lib.mq_commitlog_retire(s.cl._h, below) == 0
    readers[1].join(10)
    out.shutdown(socket.SHUT_WR)
    readers[0].join(10)
    out.close()
    into.close()
    assert "error" not in state and state["refused_after"] > 0, state
    pos, frames = 0, 0
    while pos < len(got):
        offset, size = struct.unpack_from(">qi", got, pos)
        pos += wha.HA_FRAME_HEADER_SIZE
        assert got[pos:pos + size] == on_disk[offset:offset + size], (frames, offset, size)
        pos += size
        frames += 1
    assert frames == state["refused_after"]
    a, b = socket.socketpair()
    try:
        with pytest.raises(OutOfRange):
            s.cl.ha_send_frame(a.fileno(), FS, 4096)
        assert s.cl.ha_send_frame(a.fileno(), below, 4096) == 4096      # (the files above serve)
    finally:
        a.close()
        b.close()
