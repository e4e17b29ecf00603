"""The WireError hierarchy: every malformed byte string maps to exactly one class here.

    WireError (ValueError)
      TruncatedError        the buffer ends before the structure does (read more, or it is torn)
      BadMagicError         a magic code is not the expected one (.magic holds what was read)
      SizeMismatchError     a length field is negative, runs past its container, or disagrees with
                            the recomputed size (TOTALSIZE vs. the sum of its parts)
      CrcMismatchError      BODYCRC differs from CRC32(body) & 0x7FFFFFFF (only when asked to check)
      MalformedError        lengths are fine but the content is not (bad UTF-8 in a topic, bad hex)
      FrameError            a remoting frame or header cannot be decoded; the peer closes the channel
        FrameTruncatedError   ... because the frame is shorter than its own length fields (also a TruncatedError)
      EncodeError           a value cannot be encoded (out of range, too long, forbidden separator)

Invariant: decoders in mq.wire raise only WireError subclasses for bad input (never struct.error,
IndexError, UnicodeDecodeError or construct errors); anything else escaping is a bug.
Every error names the structure, the byte position when known, and the numbers that disagreed.
"""

from __future__ import annotations

__all__ = [
    "WireError",
    "TruncatedError",
    "BadMagicError",
    "SizeMismatchError",
    "CrcMismatchError",
    "MalformedError",
    "FrameError",
    "FrameTruncatedError",
    "EncodeError",
]


class WireError(ValueError):
    """Base class: bytes do not form a valid structure, or a value cannot be encoded."""


class TruncatedError(WireError):
    """The buffer ends before the structure does (possibly a torn write, possibly just incomplete)."""


class BadMagicError(WireError):
    """A magic code is not the expected one; `magic` is the value read (unsigned 32-bit)."""

    def __init__(self, message: str, magic: int) -> None:
        super().__init__(message)
        self.magic = magic


class SizeMismatchError(WireError):
    """A length field is negative, runs past its container, or disagrees with the recomputed size."""


class CrcMismatchError(WireError):
    """BODYCRC does not match the body."""


class MalformedError(WireError):
    """Lengths are consistent but the content is invalid (bad UTF-8, bad hex, bad address)."""


class FrameError(WireError):
    """A remoting frame or its header cannot be decoded; RocketMQ peers close the channel."""


class FrameTruncatedError(FrameError, TruncatedError):
    """A remoting frame is shorter than its own length fields say."""


class EncodeError(WireError):
    """A value cannot be encoded: out of range for its field, too long, or a forbidden character."""
