"""A DLedger peer connection (mq.dledger.net.Conn) survives any frame: a frame is consumed before
its handler runs, a handler's error costs that frame only (one log line naming the connection and
the message kind) and the connection reads on; a malformed message (WireError) closes that
connection only; an output item the sender cannot write closes the connection instead of staying
at the head of its queue.  Real loopback TCP sockets on a real event loop."""
from __future__ import annotations

import asyncio
import logging
import socket
import time

import pytest

from mq import loop as mq_loop
from mq.dledger import net
from mq.wire import dledger_rpc as RPC
from mq.wire.errors import WireError


def heartbeat(opaque: int, body: bytes = b"") -> bytes:
    ext = RPC.encode(RPC.HEART_BEAT, False, {"group": "g", "localId": "n0", "remoteId": "n1", "term": 3,
                                             "leaderId": "n0", "commitIndex": 7})
    return net.request_frame(RPC.HEART_BEAT, opaque, ext, len(body)) + body


class Harness:
    """A Conn on one end of a loopback TCP connection; the test writes the peer's bytes into the other end."""

    def __init__(self, on_frame, sender=None):
        self.loop = mq_loop.new_event_loop()
        with socket.create_server(("127.0.0.1", 0)) as srv:
            self.peer = socket.create_connection(srv.getsockname())
            self.ours, _ = srv.accept()
        self.closed: list[str] = []
        self.batches = 0

        def on_batch_end(conn):
            self.batches += 1
        self.conn = net.Conn(self.loop, self.ours, on_frame, lambda c, why: self.closed.append(why), "from test",
                             sender=sender, on_batch_end=on_batch_end)

    def feed(self, data: bytes) -> None:
        self.peer.sendall(data)

    def until(self, cond, timeout_s: float = 5.0) -> None:
        """Runs the loop until cond() holds (or fails after timeout_s)."""
        async def wait():
            deadline = time.monotonic() + timeout_s
            while not cond():
                assert time.monotonic() < deadline, "condition not reached"
                await asyncio.sleep(0.001)
        self.loop.run_until_complete(wait())

    def close(self) -> None:
        self.conn.close("test over")
        self.peer.close()
        self.loop.close()


@pytest.fixture
def harness():
    made = []

    def make(on_frame, sender=None):
        h = Harness(on_frame, sender)
        made.append(h)
        return h
    yield make
    for h in made:
        h.close()


def test_a_handler_error_costs_its_frame_only_and_the_link_reads_on(harness, caplog):
    """The handler raises on the first frame of a read: that frame is handled exactly once and
    dropped with one ERROR line naming the connection and HEART_BEAT; the next frame of the same
    read and a frame of a later read are handled; the connection stays open with nothing left
    in its buffer.  Before, the raise left the frame at the front of the buffer and every later
    read raised on it again: the link was dead for good."""
    seen = []

    def on_frame(conn, cmd, body):
        seen.append(cmd.opaque)
        if cmd.opaque == 1:
            raise AssertionError("not a request")        # what the broker raised on a stale heartbeat
    h = harness(on_frame)
    caplog.set_level(logging.ERROR, logger="mq.dledger.net")
    h.feed(heartbeat(1) + heartbeat(2))
    h.until(lambda: len(seen) >= 2)
    h.feed(heartbeat(3))
    h.until(lambda: len(seen) >= 3)
    assert seen == [1, 2, 3]
    assert not h.conn.closed and not h.closed and h.conn.rbuf == b"" and h.conn.frame_errors == 1
    assert h.batches == 2
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, [r.getMessage() for r in errors]
    text = errors[0].getMessage()
    assert "from test" in text and "HEART_BEAT" in text and "opaque 1" in text and "not a request" in text


def test_frames_split_over_reads_each_handled_once_and_a_malformed_one_closes_the_connection(harness):
    """Frames cut at every byte boundary arrive over many reads and each is handled exactly once;
    a handler's WireError (a malformed message) closes that connection, once, and what follows
    is not handled."""
    seen = []

    def on_frame(conn, cmd, body):
        seen.append((cmd.opaque, bytes(body)))
        if cmd.opaque == 9:
            raise WireError("bad field")
    h = harness(on_frame)
    data = heartbeat(1, b"abc") + heartbeat(2) + heartbeat(3, b"x" * 1000)
    for i in range(len(data)):
        h.feed(data[i:i + 1])
    h.until(lambda: len(seen) >= 3)
    assert seen == [(1, b"abc"), (2, b""), (3, b"x" * 1000)]
    h.feed(heartbeat(9) + heartbeat(10))
    h.until(lambda: h.closed)
    assert h.closed == ["bad HEART_BEAT frame: bad field"] and [o for o, _ in seen] == [1, 2, 3, 9]


def test_a_view_of_the_body_kept_by_the_handler_does_not_make_a_frame_count_twice(harness, caplog):
    """A handler that keeps a view of the frame's body (the buffer then cannot shrink in place):
    the consumed bytes still leave -- the rest moves to a new buffer -- and the next read handles
    only new frames."""
    kept = []
    seen = []

    def on_frame(conn, cmd, body):
        seen.append(cmd.opaque)
        kept.append(body[0:2])          # a view into the read buffer outliving the call
    h = harness(on_frame)
    h.feed(heartbeat(1, b"zz") + heartbeat(2, b"yy")[:10])
    h.until(lambda: seen == [1])
    h.feed(heartbeat(2, b"yy")[10:] + heartbeat(3, b"ww"))
    h.until(lambda: len(seen) >= 3)
    assert seen == [1, 2, 3] and not h.closed


def test_an_output_item_the_sender_cannot_write_closes_the_connection(harness, caplog):
    """The C sendfile path raising something other than an OSError (a StoreError, say, for a
    range no longer on disk) closes the connection with a log line instead of raising into the
    caller and staying at the head of the output queue, where every later send would retry it."""
    def sender(fd, head, pos, nbytes, done):
        raise RuntimeError("range gone")
    h = harness(lambda conn, cmd, body: None, sender=sender)
    caplog.set_level(logging.ERROR, logger="mq.dledger.net")
    h.conn.send_range(b"head", 0, 10)
    assert h.conn.closed and h.closed == ["send failed: RuntimeError('range gone')"]
    assert not h.conn.out
    assert any("sending failed" in r.getMessage() for r in caplog.records)
