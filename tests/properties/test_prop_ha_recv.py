"""The slave's receive loop (mq_ha_recv_run) against any way the master's frames can arrive.

The loop reads a frame header (after the first, with one non-blocking try: nothing there ends
the call), takes an in-order body into the log (splice through a pipe of 1 MiB), and hands a
header that is not in order back to its caller.  The property: whatever the frame sizes
(heartbeats between them, frames ending at file ends), however the stream is cut into TCP sends
and paced (a header split across reads, a body arriving in pieces), and whatever the byte budget
of one call, the slave's log ends byte for byte equal to the master's, every record published,
and a header the caller must judge comes back with nothing after it taken from the socket.  Real
TCP on 127.0.0.1 with the slave's socket settings, real stores (64 KiB files).  A loop that keeps
one byte of a header it read in pieces fails it."""
from __future__ import annotations

import os
import socket
import threading
import time

import pytest
from hypothesis import given, strategies as st

from mq.ha.common import FRAME_BODY_SIZE_MAX, configure_socket
from mq.store import MessageStore
from mq.store.config import StoreConfig
from mq.wire import ha as W

from propkit import bounded

FS = 64 * 1024
RECV_TIMEOUT_MS = 30_000           # the slave's socket bound; long enough to outlast a machine-wide stall
SENDS_MAX = 2000                   # a draw of tiny chunks still sends in at most about this many pieces


def fill(store, n: int, size_max: int) -> int:
    """n messages of 10..size_max bytes; returns the write position."""
    for i in range(n):
        r = store.put("HaRecv", i % 3, b"%06d" % i * (10 + i * 7919 % size_max // 6), b"TAGS\x01T")
        assert r.ok, r
    return store.cl.write_pos


def log_bytes(store, end: int) -> bytes:
    """The CommitLog bytes [0, end), read from its files."""
    fs = store.config.mappedFileSizeCommitLog
    out = bytearray()
    for start in range(0, end, fs):
        with open(os.path.join(store.config.commitlog_dir, "%020d" % start), "rb") as f:
            out += f.read(min(fs, end - start))
    assert len(out) == end
    return bytes(out)


@pytest.fixture(scope="module")
def master(tmp_path_factory):
    cfg = StoreConfig(storePathRootDir=str(tmp_path_factory.mktemp("master")), mappedFileSizeCommitLog=FS)
    store = MessageStore.open(cfg, start_roles=False)
    end = fill(store, 250, size_max=2000)                 # ~0.25 MiB over 4 files
    yield store, log_bytes(store, end)
    store.close()


def tcp_pair() -> tuple[socket.socket, socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as ls:
        a = socket.create_connection(ls.getsockname())
        b, _ = ls.accept()
    configure_socket(b, RECV_TIMEOUT_MS)   # as the slave's: blocking, SO_RCVTIMEO (a receive that waits forever fails)
    return a, b


def frames_of(data: bytes, cuts: list[int], heartbeats: list[bool]) -> bytes:
    """data as HA frames at offsets from 0: bodies of the drawn sizes (cut at file ends), with a
    heartbeat at the current offset before the frames the draw marks."""
    out, pos, i = bytearray(), 0, 0
    while pos < len(data):
        if heartbeats[i % len(heartbeats)]:
            out += W.pack_ha_frame_header(pos, 0)
        size = min(cuts[i % len(cuts)], FS - pos % FS, len(data) - pos)
        out += W.pack_ha_frame_header(pos, size) + data[pos:pos + size]
        pos += size
        i += 1
    return bytes(out)



def send_paced(sock: socket.socket, stream: bytes, chunks: list[int], pauses: list[bool]) -> None:
    pos, i = 0, 0
    least = len(stream) // SENDS_MAX
    while pos < len(stream):
        n = max(chunks[i % len(chunks)], least)
        sock.sendall(stream[pos:pos + n])
        if pauses[i % len(pauses)]:
            time.sleep(0.0005)
        pos += n
        i += 1


def receive(slave, sock: socket.socket, end: int, budget: int, want_other: bool) -> tuple[int, tuple | None, int]:
    """Calls ha_recv_run until the received end reaches `end` and, want_other, until the header
    after it is handed back.  Returns (expected, other, published)."""
    expected, other, published = 0, None, 0
    deadline = time.monotonic() + 2 * RECV_TIMEOUT_MS / 1000
    while time.monotonic() < deadline:
        why, expected, other, published, corrupt = slave.cl.ha_recv_run(sock.fileno(), expected, budget,
                                                                         FRAME_BODY_SIZE_MAX)
        assert not corrupt, (expected, published)
        if why == "other":
            return expected, other, published
        if expected == end and published == end and not want_other:
            return expected, None, published
    raise AssertionError(f"stuck at {expected} of {end}")


@bounded(40)
@given(cuts=st.lists(st.one_of(st.integers(64, 300), st.integers(300, FS)), min_size=1, max_size=12),
       heartbeats=st.lists(st.booleans(), min_size=1, max_size=5),
       chunks=st.lists(st.one_of(st.integers(1, 20), st.integers(20, 5000), st.integers(5000, 300_000)),
                       min_size=1, max_size=8),
       pauses=st.lists(st.booleans(), min_size=1, max_size=4),
       budget=st.sampled_from([1, 4096, 65536, 1 << 20]),
       other=st.sampled_from([None, "ahead", "behind", "too_big"]))
def test_any_arrival_of_the_frames_yields_the_masters_log(master, tmp_path_factory, cuts, heartbeats, chunks,
                                                           pauses, budget, other):
    _, data = master
    end = len(data)
    stream = frames_of(data, cuts, heartbeats)
    trailer = b""
    if other is not None:
        off, size = {"ahead": (end + 1, 0), "behind": (end - 100, 0), "too_big": (end, FRAME_BODY_SIZE_MAX + 1)}[other]
        header = W.pack_ha_frame_header(off, size)
        trailer = b"the bytes after it are the caller's"
        stream += header + trailer
    cfg = StoreConfig(storePathRootDir=str(tmp_path_factory.mktemp("slave")), mappedFileSizeCommitLog=FS)
    slave = MessageStore.open(cfg, start_roles=False)
    a, b = tcp_pair()
    sender = threading.Thread(target=send_paced, args=(a, stream, chunks, pauses), daemon=True)
    try:
        sender.start()
        expected, got_other, published = receive(slave, b, end, budget, other is not None)
        assert expected == end and published == end and slave.cl.write_pos == end
        assert log_bytes(slave, end) == data
        if other is None:
            assert got_other is None
        else:
            assert got_other == (off, size)
            got = b""
            while len(got) < len(trailer):
                chunk = b.recv(len(trailer) - len(got))
                assert chunk, "the connection closed before the trailer"
                got += chunk
            assert got == trailer          # nothing past the header was taken
        sender.join(10)
    finally:
        a.close()
        b.close()
        slave.close()


def test_frames_larger_than_the_splice_pipe_are_received_whole(tmp_path):
    """Frames of 1.5 MiB (4 MiB files), larger than the 1 MiB pipe a body is spliced through,
    alternating with small ones, arriving in 256 KiB sends."""
    fs = 4 * 1024 * 1024
    m = MessageStore.open(StoreConfig(storePathRootDir=str(tmp_path / "m"), mappedFileSizeCommitLog=fs),
                          start_roles=False)
    s = MessageStore.open(StoreConfig(storePathRootDir=str(tmp_path / "s"), mappedFileSizeCommitLog=fs),
                          start_roles=False)
    a, b = tcp_pair()
    try:
        end = fill(m, 3500, size_max=2000)
        assert end > 3 * 1024 * 1024
        data = log_bytes(m, end)
        stream, pos, big = bytearray(), 0, True
        while pos < end:
            size = min(1536 * 1024 if big else 3000, end - pos)
            stream += W.pack_ha_frame_header(pos, size) + data[pos:pos + size]
            pos += size
            big = not big
        threading.Thread(target=send_paced, args=(a, bytes(stream), [256 * 1024], [True]), daemon=True).start()
        expected, other, published = receive(s, b, end, 1 << 20, False)
        assert (expected, other, published) == (end, None, end)
        assert log_bytes(s, end) == data
    finally:
        a.close()
        b.close()
        s.close()
        m.close()
