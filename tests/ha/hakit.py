"""Helpers of the HA tests: filling a store, comparing two logs byte for byte,
comparing what two stores' ConsumeQueues deliver, raw sockets to the HA port."""
from __future__ import annotations

import os
import random
import socket
import time

from mq.store.commitlog import list_files
from mq.wire import commitlog as wcl
from mq.wire import ha as W
from mq.cluster import wait_for

FS = 64 * 1024
TOPICS = ("HA0", "HA1")
QUEUES = 3
FAST = dict(heartbeat_interval_ms=200, housekeeping_interval_ms=2000)
SLAVE_FAST = dict(report_interval_ms=200, housekeeping_interval_ms=2000, retry_interval_ms=100)


def fill(store, n: int, seed: int = 1, tag: bytes = b"m", size_max: int = 1500) -> int:
    """Appends n messages over TOPICS x QUEUES; returns the new write position."""
    rnd = random.Random(seed)
    for i in range(n):
        body = tag + b"%06d-" % i + rnd.randbytes(rnd.randint(10, size_max))
        r = store.put(TOPICS[i % len(TOPICS)], i % QUEUES, body, b"TAGS\x01TagA")
        assert r.ok, r
    return store.cl.write_pos


def log_bytes(store, start: int, end: int) -> bytes:
    """The CommitLog bytes [start, end) read from the files."""
    out = bytearray()
    fs = store.config.mappedFileSizeCommitLog
    pos = start
    while pos < end:
        n = min(end, pos - pos % fs + fs) - pos
        with open(os.path.join(store.config.commitlog_dir, "%020d" % (pos - pos % fs)), "rb") as f:
            f.seek(pos % fs)
            chunk = f.read(n)
        assert len(chunk) == n
        out += chunk
        pos += n
    return bytes(out)


def assert_same_log(master, slave, start: int | None = None) -> None:
    """The slave's log equals the master's from `start` (the slave's first
    offset by default) to the master's write position, byte for byte, and the
    slave has published exactly that much."""
    end = master.cl.write_pos
    assert slave.cl.write_pos == end
    start = slave.cl.min_pos if start is None else start
    assert log_bytes(master, start, end) == log_bytes(slave, start, end)
    files = list_files(slave.config.commitlog_dir)
    assert files and files[0] == start - start % FS, (files[:3], start)


def caught_up(master, slave):
    return lambda: slave.cl.write_pos == master.cl.write_pos


def wait_same(master, slave, timeout_s: float = 15.0) -> None:
    wait_for(caught_up(master, slave), timeout_s, 0.01, "the slave to catch up")
    assert_same_log(master, slave)


def queue_messages(store, topic: str, qid: int, from_phy: int = 0) -> list[tuple[int, bytes]]:
    """(queue offset, record bytes) of every message of the queue stored at or past from_phy, read
    from the queue's min offset (a store whose log starts past 0 starts its queues past 0 too)."""
    out = []
    qo, hi = store.min_offset(topic, qid), store.max_offset(topic, qid)
    while qo < hi:
        got = store.get_messages(topic, qid, qo, 64)
        for q, view in got:
            phy = int.from_bytes(view[wcl.POS_PHYSICAL_OFFSET:wcl.POS_PHYSICAL_OFFSET + 8], "big")
            if phy >= from_phy:
                out.append((q, bytes(view)))
        qo = got[-1][0] + 1 if got else qo + 1
    return out


def assert_same_queues(master, slave, from_phy: int = 0) -> None:
    assert slave.wait_dispatched(10) and master.wait_dispatched(10)
    total = 0
    for t in TOPICS:
        for q in range(QUEUES):
            assert slave.max_offset(t, q) == master.max_offset(t, q), (t, q)
            a, b = queue_messages(master, t, q, from_phy), queue_messages(slave, t, q, from_phy)
            assert a == b, (t, q)
            total += len(a)
    assert total > 0


def raw_connect(port: int, rcvbuf: int | None = None) -> socket.socket:
    s = socket.socket()
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.connect(("127.0.0.1", port))
    return s


def wait_closed(sock: socket.socket, timeout_s: float = 5.0) -> bool:
    """Reads (and discards) until the peer closes; True if it did within the timeout."""
    deadline = time.monotonic() + timeout_s
    sock.settimeout(0.1)
    while time.monotonic() < deadline:
        try:
            if not sock.recv(1 << 16):
                return True
        except socket.timeout:
            continue
        except ConnectionResetError:
            return True
    return False


def recv_exact(sock: socket.socket, n: int, timeout_s: float = 5.0) -> bytes:
    sock.settimeout(timeout_s)
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        assert chunk, "peer closed"
        buf += chunk
    return buf


def read_frame(sock: socket.socket) -> tuple[int, bytes]:
    h = W.unpack_ha_frame_header(recv_exact(sock, W.HA_FRAME_HEADER_SIZE))
    return h.master_phy_offset, recv_exact(sock, h.body_size) if h.body_size else b""
