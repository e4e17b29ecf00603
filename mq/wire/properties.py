"""Message properties: the `i` header field and the PROPERTIES part of a CommitLog record (spec 2.6).

    name 0x01 value 0x02 name 0x01 value ... name 0x01 value        (UTF-8, no trailing 0x02)

Invariants and rules (RocketMQ 4.9.8 `MessageDecoder.messageProperties2String` / `string2messageProperties`):
* Encoding writes entries in mapping order, skips entries whose value is None, and drops the last 0x02.
* Decoding splits on 0x02. A segment is kept only if its first 0x01 is neither its first nor its last
  character (which also means it is at least 3 characters long), so empty names and empty values vanish.
  The value runs to the end of the segment and may itself contain 0x01. A later duplicate name wins.
* Decoding bytes uses UTF-8 with U+FFFD replacement, as Java's `new String(bytes, UTF_8)` does, so a stored
  record with odd bytes still yields its TAGS/KEYS instead of failing dispatch.
* A name may not contain 0x01 or 0x02 and a value may not contain 0x02 (they would not round-trip); the
  encoder raises EncodeError for those. Empty names are refused too.
* The stored length is a signed 16-bit field, so at most PROPERTIES_SIZE_MAX = 32767 bytes; the encoder here
  does not enforce it (the caller decides between PROPERTIES_SIZE_EXCEEDED and truncation), the record
  encoder does.
"""

from __future__ import annotations

from collections.abc import Mapping

from .errors import EncodeError

__all__ = [
    "NAME_VALUE_SEPARATOR",
    "PROPERTY_SEPARATOR",
    "PROPERTIES_SIZE_MAX",
    "properties_to_string",
    "string_to_properties",
    "encode_properties",
    "decode_properties",
]

NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"
PROPERTIES_SIZE_MAX = 32767  # PROPERTIESLEN is a signed short


def properties_to_string(props: Mapping[str, str | None]) -> str:
    """Encode a mapping as `name\\x01value\\x02...` (no trailing separator); None values are skipped.

    Raises EncodeError for an empty name, a name containing 0x01/0x02, or a value containing 0x02.
    """
    parts: list[str] = []
    for name, value in props.items():
        if value is None:
            continue
        if not isinstance(name, str) or not isinstance(value, str):
            raise EncodeError(f"property {name!r}: names and values must be str, got {type(value).__name__}")
        if not name or NAME_VALUE_SEPARATOR in name or PROPERTY_SEPARATOR in name:
            raise EncodeError(f"property name {name!r} is empty or contains a separator (0x01/0x02)")
        if PROPERTY_SEPARATOR in value:
            raise EncodeError(f"property {name!r}: value contains the separator 0x02")
        parts.append(name + NAME_VALUE_SEPARATOR + value)
    return PROPERTY_SEPARATOR.join(parts)


def string_to_properties(text: str) -> dict[str, str]:
    """Decode `name\\x01value\\x02...` with the exact 4.9.8 rules (see the module docstring)."""
    result: dict[str, str] = {}
    if not text:
        return result
    for segment in text.split(PROPERTY_SEPARATOR):
        # Java searches for 0x01 from the segment start onwards and keeps the pair only when the hit is
        # strictly inside the segment (index > start and index < end - 1): a name and a value, both
        # non-empty, around the first 0x01
        name, sep, value = segment.partition(NAME_VALUE_SEPARATOR)
        if name and value:
            result[name] = value
    return result


def encode_properties(props: Mapping[str, str | None]) -> bytes:
    """properties_to_string(props) as UTF-8 bytes (what a record's PROPERTIES field holds)."""
    try:
        return properties_to_string(props).encode("utf-8")
    except UnicodeEncodeError as exc:  # lone surrogates
        raise EncodeError(f"properties are not encodable as UTF-8: {exc}") from None


def decode_properties(data: bytes | bytearray | memoryview | str) -> dict[str, str]:
    """Decode stored properties (bytes are UTF-8 with U+FFFD replacement, as Java does)."""
    if isinstance(data, str):
        return string_to_properties(data)
    return string_to_properties(bytes(data).decode("utf-8", errors="replace"))
