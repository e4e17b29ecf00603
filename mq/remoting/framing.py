"""Splitting a byte stream into remoting frames, for the Protocol server and client.

A read hands over whatever bytes arrived: several whole frames, a frame cut anywhere (even
inside its 4-byte length), or both.  FrameBuffer keeps the bytes of an incomplete frame, as
the reads brought them, and joins them once, when the frame is whole; whole frames are never
copied before they are decoded.  frame_end() finds where the frame at a position ends, or says
it is not whole yet; a length over FRAME_SIZE_MAX is a FrameError at once (the connection is
closed before its bytes are waited for)."""
from __future__ import annotations

import struct

from mq.wire.errors import FrameError
from mq.wire.remoting import FRAME_PREFIX_SIZE, FRAME_SIZE_MAX

_U32 = struct.Struct(">I").unpack_from


def frame_end(data: bytes, pos: int, size: int) -> int:
    """The end of the frame starting at data[pos] (its 4 length bytes are there: size - pos >= 4),
    or 0 when data[:size] does not hold all of it yet.  Raises FrameError for a length over
    FRAME_SIZE_MAX."""
    total = _U32(data, pos)[0]
    if total + FRAME_PREFIX_SIZE > FRAME_SIZE_MAX:
        raise FrameError(f"frame length {total} + 4 exceeds FRAME_SIZE_MAX {FRAME_SIZE_MAX}")
    end = pos + FRAME_PREFIX_SIZE + total
    return end if end <= size else 0


class FrameBuffer:
    """The bytes of one connection between reads (see the module docstring)."""
    __slots__ = ("_chunks", "_len", "_need")

    def __init__(self):
        self._chunks: list[bytes] = []
        self._len = 0                      # bytes held
        self._need = FRAME_PREFIX_SIZE     # bytes the first held frame needs in all

    def __len__(self) -> int:
        return self._len

    def ready(self) -> bool:
        """Does what is held start with a whole frame?"""
        return self._len >= self._need

    def take(self, data: bytes) -> bytes | None:
        """`data` just read, after what is held: the bytes to parse from their start, or None
        while the first frame is still incomplete (then they are held)."""
        if not self._len:
            return data
        if data:
            self._chunks.append(data)
            self._len += len(data)
        if self._need == FRAME_PREFIX_SIZE and self._len >= FRAME_PREFIX_SIZE:
            # the length itself was cut: now that it is here, wait for the whole frame
            head = b"".join(self._chunks)
            self._chunks[:] = [head]
            total = _U32(head, 0)[0]
            if total + FRAME_PREFIX_SIZE <= FRAME_SIZE_MAX:       # else the caller's frame_end refuses it
                self._need = FRAME_PREFIX_SIZE + total
        if self._len < self._need:
            return None
        data = b"".join(self._chunks)
        self._chunks.clear()
        self._len = 0
        self._need = FRAME_PREFIX_SIZE
        return data

    def hold(self, data: bytes, pos: int = 0) -> None:
        """Keeps data[pos:] (unparsed) for the next read; nothing may be held already."""
        assert not self._len, "hold() over held bytes"
        rest = data[pos:] if pos else data
        if not rest:
            return
        self._chunks.append(rest)
        self._len = len(rest)
        self._need = FRAME_PREFIX_SIZE + _U32(rest, 0)[0] if len(rest) >= FRAME_PREFIX_SIZE else FRAME_PREFIX_SIZE

    def add(self, data: bytes) -> None:
        """Keeps `data` after what is held, unparsed (the reader is paused)."""
        if not self._len:
            self.hold(data)
        elif data:
            self._chunks.append(data)
            self._len += len(data)
