"""offsetMsgId: the id a broker returns for a stored message (spec 3.5, MessageDecoder.createMessageId).

    STOREHOST IP 4 (or 16) | STOREHOST PORT 4 (int) | PHYSICALOFFSET 8 (long)   -> uppercase hex

32 hex characters for an IPv4 store host, 56 for IPv6. Decoding accepts either case and uses the length to
tell the two apart (Java: 32 -> IPv4, anything else -> IPv6; here anything but 32/56 is an error).
The host is taken as given: callers pass normalize_host()'d text (an IPv4-mapped IPv6 literal would give a
56-character id where Java gives 32).
"""

from __future__ import annotations

import binascii
import struct

from .commitlog import _ip_to_packed, _ip_to_text
from .errors import EncodeError, MalformedError

__all__ = ["offset_msg_id", "decode_offset_msg_id", "MSG_ID_V4_LENGTH", "MSG_ID_V6_LENGTH"]

MSG_ID_V4_LENGTH = 32
MSG_ID_V6_LENGTH = 56

_PORT_OFFSET = struct.Struct(">iq")


def offset_msg_id(ip: str, port: int, phy_offset: int) -> str:
    """Uppercase hex of ip + port + phy_offset. Raises EncodeError for a bad ip, port or offset."""
    packed = _ip_to_packed(ip)
    if not 0 <= port <= 0xFFFF:
        raise EncodeError(f"port {port} is outside [0, 65535]")
    if not 0 <= phy_offset < (1 << 63):
        raise EncodeError(f"phy_offset {phy_offset} is not a non-negative int64")
    return (packed + _PORT_OFFSET.pack(port, phy_offset)).hex().upper()


def decode_offset_msg_id(msg_id: str) -> tuple[str, int, int]:
    """(ip text, port, phy_offset) of an offsetMsgId. Raises MalformedError for a bad length or non-hex."""
    if len(msg_id) not in (MSG_ID_V4_LENGTH, MSG_ID_V6_LENGTH):
        raise MalformedError(f"offsetMsgId {msg_id!r}: length {len(msg_id)}, expected 32 (IPv4) or 56 (IPv6)")
    try:
        raw = binascii.unhexlify(msg_id)
    except (binascii.Error, ValueError):
        raise MalformedError(f"offsetMsgId {msg_id!r} is not hex") from None
    ip_size = 4 if len(raw) == 16 else 16
    port, phy_offset = _PORT_OFFSET.unpack_from(raw, ip_size)
    return _ip_to_text(raw[:ip_size]), port, phy_offset
