"""A raw protocol peer for bad-input tests: one blocking TCP connection that speaks RocketMQ
remoting frames built by hand (mq.wire.remoting), so every byte a test sends is its own."""
from __future__ import annotations

import contextlib
import itertools
import socket
import time

import pytest

from mq.cluster import Broker, NameServer
from mq.wire.commitlog import parse_record
from mq.wire.remoting import RemotingCommand, decode_frame_payload, encode_frame, frame_payload_size

IO_TIMEOUT_S = 5.0
PULL_WAIT_S = 10.0              # how long pull_record waits for a record to be dispatched
_opaque = itertools.count(1)


def next_opaque() -> int:
    """A request id no other request of this test process used."""
    return next(_opaque)


class Peer:
    """One TCP connection speaking frames by hand (blocking, with a timeout)."""

    def __init__(self, port: int):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=IO_TIMEOUT_S)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def close(self) -> None:
        self.sock.close()

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send(self, code: int, ext: dict | None = None, body: bytes = b"", flag: int = 0,
             serialize_type: int = 0) -> int:
        opaque = next_opaque()
        self.sock.sendall(encode_frame(RemotingCommand(code=code, version=409, opaque=opaque, flag=flag,
                                                       ext_fields=ext, body=body, serialize_type=serialize_type)))
        return opaque

    def _read_exactly(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise EOFError(f"connection closed after {len(buf)} of {n} bytes")
            buf += chunk
        return bytes(buf)

    def read(self) -> RemotingCommand:
        prefix = self._read_exactly(4)
        return decode_frame_payload(self._read_exactly(frame_payload_size(prefix)))

    def call(self, code: int, ext: dict | None = None, body: bytes = b"", serialize_type: int = 0) -> RemotingCommand:
        opaque = self.send(code, ext, body, serialize_type=serialize_type)
        resp = self.read()
        assert resp.is_response and resp.opaque == opaque, resp
        assert resp.serialize_type == serialize_type, "a response uses the request's serialize type"
        return resp

    def closed_by_peer(self, timeout_s: float = IO_TIMEOUT_S) -> str:
        """Waits for EOF or a reset without sending anything; fails if bytes arrive or nothing happens."""
        self.sock.settimeout(timeout_s)
        try:
            data = self.sock.recv(65536)
        except ConnectionResetError:
            return "reset"
        except socket.timeout:
            pytest.fail(f"the server kept the connection open for {timeout_s}s")
        assert data == b"", f"the server answered garbage with {data[:64]!r}"
        return "eof"

    def still_open(self, wait_s: float) -> bool:
        """True if nothing (no bytes, no EOF) arrives within wait_s."""
        self.sock.settimeout(wait_s)
        try:
            data = self.sock.recv(1)
        except socket.timeout:
            return True
        except ConnectionResetError:
            return False
        finally:
            self.sock.settimeout(IO_TIMEOUT_S)
        assert data == b"", f"unexpected bytes {data!r}"
        return False


@contextlib.contextmanager
def raw_broker(work: str, topic: str, queues: int, **options):
    """A name server and a broker (one send thread unless options say otherwise) with `topic`
    created with `queues` queues.  On exit the broker must stop cleanly and its log must hold no
    traceback: bad input is answered, never crashes a handler."""
    ns = NameServer(work)
    try:
        b = Broker(work, ns.addr, **{"sendMessageThreadPoolNums": 1, **options})
    except BaseException:
        ns.stop()                           # a broker that did not start leaves no name server behind
        raise
    try:
        p = Peer(b.port)
        try:
            resp = p.call(17, {"topic": topic, "readQueueNums": str(queues), "writeQueueNums": str(queues),
                               "perm": "6"})
            assert resp.code == 0, (resp.code, resp.remark)
        finally:
            p.close()
        yield b
        log = b.proc.output()
        assert b.stop() == 0, log[-3000:]
        assert "Traceback" not in log, log[log.index("Traceback") - 300:][:3000]
    finally:
        b.stop()
        ns.stop()


def pull_record(peer: Peer, topic: str, queue_id: int, queue_offset: int, group: str = "RawPeerCG"):
    """The record at (topic, queue_id, queue_offset), its BODYCRC checked, waiting up to
    PULL_WAIT_S for dispatch."""
    deadline = time.monotonic() + PULL_WAIT_S
    while True:
        resp = peer.call(11, {"consumerGroup": group, "topic": topic, "queueId": str(queue_id),
                              "queueOffset": str(queue_offset), "maxMsgNums": "1", "sysFlag": "6",
                              "commitOffset": "0", "suspendTimeoutMillis": "1000", "subscription": "*",
                              "subVersion": "0"})
        if resp.code == 0:
            return parse_record(resp.body, check_crc=True)
        assert resp.code in (19, 20, 21) and time.monotonic() < deadline, (resp.code, resp.remark)
