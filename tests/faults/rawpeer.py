"""A raw protocol peer for bad-input tests: one blocking TCP connection that speaks RocketMQ
remoting frames built by hand (mq.wire.remoting), so every byte a test sends is its own."""
from __future__ import annotations

import itertools
import socket

import pytest

from mq.wire.remoting import RemotingCommand, decode_frame_payload, encode_frame, frame_payload_size

IO_TIMEOUT_S = 5.0
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
