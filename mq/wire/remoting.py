"""Remoting frames and RemotingCommand headers (spec 1.1-1.4): every request and response between clients,
brokers and name servers.

    frame:  TOTALLENGTH 4 | SERIALIZETYPE 1 | HEADERLENGTH 3 | HEADER (HEADERLENGTH bytes) | BODY      (TOTALLENGTH = 4 + H + B)
    ROCKETMQ header: CODE 2 | LANGUAGE 1 | VERSION 2 | OPAQUE 4 | FLAG 4 | REMARKLEN 4 | REMARK |
                     EXTLEN 4 | { KEYLEN 2 | KEY | VALLEN 4 | VALUE } ...                 (EXTLEN bytes of entries)
    JSON header:     {"code":..,"extFields":{..},"flag":..,"language":"JAVA","opaque":..,["remark":..,]
                      "serializeTypeCurrentRPC":"JSON","version":..}                          (compact, UTF-8)

Big-endian, signed ints (Java), except TOTALLENGTH and the type/length word, read unsigned. Invariants:
* TOTALLENGTH does not count itself; 4 + TOTALLENGTH <= FRAME_SIZE_MAX (16 MiB, Netty's maxFrameLength).
* HEADERLENGTH <= TOTALLENGTH - 4 (else FrameError); SERIALIZETYPE is 0 (JSON) or 1 (ROCKETMQ), else FrameError.
  The type/length word is the Java int (type << 24) | H, declared below as Int8ub + Int24ub (same bytes).
* ROCKETMQ header: every length is >= 0 and within the header (else FrameError); strings are strict UTF-8.
  REMARKLEN 0 decodes to remark None, EXTLEN 0 decodes to ext_fields None (Java does the same), so "" / {}
  do not survive a round trip through this format. Bytes after the ext block are ignored, as Java does.
  CODE and VERSION are signed 16-bit here (codes > 32767 cannot use this format; EncodeError).
* JSON header: keys in fastjson's order (alphabetical), "remark" only when not None, "extFields" only when
  not None, extFields values always JSON strings, non-ASCII written as UTF-8 (not \\u escapes).
  Decoding is lenient like fastjson: unknown keys ignored, missing keys default (language JAVA, others 0/None),
  `language` by name or ordinal (an unknown name becomes OTHER), integers also as numeric strings, and
  extFields/remark scalars stringified (true/false for booleans, JSON null values dropped).
* A response echoes the request's opaque and serialize type and has flag bit RPC_RESPONSE; RPC_ONEWAY
  requests get no response (remoting policy, stated here because the bits live here).

RocketMQHeader and Frame (construct) are the declarations; encode_frame/decode_frame_payload are `struct` fast
paths; tests/unit/test_wire.py proves them equal to encode_frame_reference/decode_frame_payload_reference,
which go through the declarations.
"""

from __future__ import annotations

import json
import math
import re
import struct
from dataclasses import dataclass

import orjson

from construct import (
    Bytes,
    ConstructError,
    Container,
    FocusedSeq,
    GreedyRange,
    Int8ub,
    Int16sb,
    Int24ub,
    Int32sb,
    Int32ub,
    ListContainer,
    PascalString,
    Prefixed,
    Rebuild,
    Struct,
    Terminated,
    len_,
    this,
)

from .errors import EncodeError, FrameError, FrameTruncatedError

__all__ = [
    "SERIALIZE_JSON",
    "SERIALIZE_ROCKETMQ",
    "SERIALIZE_TYPE_NAMES",
    "FRAME_SIZE_MAX",
    "FRAME_PREFIX_SIZE",
    "HEADER_LENGTH_MAX",
    "RPC_RESPONSE",
    "RPC_ONEWAY",
    "LANGUAGE_CODES",
    "LANGUAGE_NAMES",
    "LANGUAGE_JAVA",
    "LANGUAGE_CPP",
    "LANGUAGE_PYTHON",
    "LANGUAGE_OTHER",
    "RocketMQHeader",
    "Frame",
    "RemotingCommand",
    "encode_json_header",
    "decode_json_header",
    "encode_rocketmq_header",
    "decode_rocketmq_header",
    "encode_frame",
    "ResponseTemplate",
    "decode_frame_payload",
    "decode_frame",
    "frame_payload_size",
    "encode_frame_reference",
    "decode_frame_payload_reference",
]

SERIALIZE_JSON = 0
SERIALIZE_ROCKETMQ = 1
SERIALIZE_TYPE_NAMES = {SERIALIZE_JSON: "JSON", SERIALIZE_ROCKETMQ: "ROCKETMQ"}
FRAME_SIZE_MAX = 16777216  # covers the 4-byte length prefix plus the payload
FRAME_PREFIX_SIZE = 4
HEADER_LENGTH_MAX = 0xFFFFFF
RPC_RESPONSE = 1  # flag bit 0: set = response
RPC_ONEWAY = 2  # flag bit 1: one-way request, no response

LANGUAGE_CODES = {
    "JAVA": 0,
    "CPP": 1,
    "DOTNET": 2,
    "PYTHON": 3,
    "DELPHI": 4,
    "ERLANG": 5,
    "RUBY": 6,
    "OTHER": 7,
    "HTTP": 8,
    "GO": 9,
    "PHP": 10,
    "OMS": 11,
    "RUST": 12,
}
LANGUAGE_NAMES = {code: name for name, code in LANGUAGE_CODES.items()}
LANGUAGE_JAVA = LANGUAGE_CODES["JAVA"]
LANGUAGE_CPP = LANGUAGE_CODES["CPP"]
LANGUAGE_PYTHON = LANGUAGE_CODES["PYTHON"]
LANGUAGE_OTHER = LANGUAGE_CODES["OTHER"]

_I16_MIN, _I16_MAX = -(1 << 15), (1 << 15) - 1
_I32_MIN, _I32_MAX = -(1 << 31), (1 << 31) - 1


@dataclass
class RemotingCommand:
    """One request or response. `language` is the LanguageCode ordinal; `ext_fields` None means absent.

    `serialize_type` is the header format of the frame this came in (decode) or goes out in (encode).
    """

    code: int = 0
    language: int = LANGUAGE_JAVA
    version: int = 0
    opaque: int = 0
    flag: int = 0
    remark: str | None = None
    ext_fields: dict[str, str] | None = None
    body: bytes = b""
    serialize_type: int = SERIALIZE_JSON

    @property
    def is_response(self) -> bool:
        return bool(self.flag & RPC_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & RPC_ONEWAY)


# --------------------------------------------------------------------------------------------------
# Declarations

_ExtEntry = Struct(
    "key" / PascalString(Int16sb, "utf8"),
    "value" / PascalString(Int32sb, "utf8"),
)

RocketMQHeader = """
ROCKETMQ (binary) header, serialize type 1 (RocketMQSerializable). remark "" means null; an empty
ext_fields list means extFields null. The ext block must hold whole entries only.
""" * Struct(
    "code" / Int16sb,
    "language" / Int8ub,
    "version" / Int16sb,
    "opaque" / Int32sb,
    "flag" / Int32sb,
    "remark" / PascalString(Int32sb, "utf8"),
    "ext_fields" / Prefixed(Int32sb, FocusedSeq("entries", "entries" / GreedyRange(_ExtEntry), Terminated)),
)

Frame = """
A whole remoting frame including its 4-byte length prefix. total_length and header_length are rebuilt.
""" * Struct(
    "total_length" / Rebuild(Int32ub, 4 + len_(this.header) + len_(this.body)),
    "serialize_type" / Int8ub,
    "header_length" / Rebuild(Int24ub, len_(this.header)),
    "header" / Bytes(this.header_length),
    "body" / Bytes(this.total_length - 4 - this.header_length),
)


# --------------------------------------------------------------------------------------------------
# Value conversions shared by both paths


def _check_int(name: str, value: object, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise EncodeError(f"{name}={value!r} is outside [{low}, {high}]")
    return value


def _to_text(value: object) -> str:
    """fastjson's stringification of a JSON value read into a String field.  A list or object nested
    deeper than the json module writes (orjson reads up to 1024 levels, json.dumps stops near the
    recursion limit, ~1000) is a FrameError, as when it is too deep to read."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    except RecursionError:
        raise FrameError("JSON header: a value is nested too deep to be read as text") from None


def _ext_items(cmd: RemotingCommand) -> list[tuple[str, str]]:
    """ext_fields as (key, text) pairs, null values dropped, scalar values stringified (encode side)."""
    if cmd.ext_fields is None:
        return []
    items = []
    for key, value in cmd.ext_fields.items():
        if value is None:
            continue
        if not isinstance(key, str):
            raise EncodeError(f"extFields key {key!r} is not str")
        if not isinstance(value, (str, bool, int, float)):
            raise EncodeError(f"extFields[{key!r}] = {value!r} is not a scalar")
        items.append((key, _to_text(value)))
    return items


def _utf8(text: str, what: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise EncodeError(f"{what} is not encodable as UTF-8") from None


# --------------------------------------------------------------------------------------------------
# JSON header


def encode_json_header(cmd: RemotingCommand) -> bytes:
    """The JSON header bytes, byte-identical to fastjson's output for the same command.  orjson writes
    the same bytes as json.dumps(separators=(",", ":"), ensure_ascii=False) for the strings and ints
    a header holds (tests/unit/test_wire.py compares them), ~5x faster."""
    obj: dict[str, object] = {"code": _check_int("code", cmd.code, _I32_MIN, _I32_MAX)}
    ext = cmd.ext_fields
    if ext is not None:
        # the common case, every value a str, skips the per-field stringification
        obj["extFields"] = ext if _all_str(ext) else dict(_ext_items(cmd))
    obj["flag"] = _check_int("flag", cmd.flag, _I32_MIN, _I32_MAX)
    obj["language"] = LANGUAGE_NAMES.get(cmd.language, cmd.language)
    obj["opaque"] = _check_int("opaque", cmd.opaque, _I32_MIN, _I32_MAX)
    if cmd.remark is not None:
        obj["remark"] = cmd.remark
    obj["serializeTypeCurrentRPC"] = "JSON"
    obj["version"] = _check_int("version", cmd.version, _I32_MIN, _I32_MAX)
    try:
        return orjson.dumps(obj)
    except TypeError as exc:       # a lone surrogate, or a key that is not a str
        if ext is not None and not all(isinstance(k, str) for k in ext):
            _ext_items(cmd)        # raises the EncodeError naming the key
        raise EncodeError(f"JSON header is not encodable as UTF-8: {exc}") from None


def _all_str(ext: dict) -> bool:
    for k, v in ext.items():
        if v.__class__ is not str or k.__class__ is not str:
            return False
    return True


_DECIMAL = re.compile(r"[+-]?[0-9]{1,19}")  # what Integer.parseInt-style readers accept, bounded


def _json_int(obj: dict, key: str, default: int) -> int:
    value = obj.get(key)
    if value is None:
        return default
    if value.__class__ is int and _I32_MIN <= value <= _I32_MAX:
        return value       # the common case
    if isinstance(value, bool):
        raise FrameError(f"JSON header: {key} is a boolean")
    if isinstance(value, float):
        if not math.isfinite(value) or value != int(value):
            raise FrameError(f"JSON header: {key}={value!r} is not an integer")
        value = int(value)
    elif isinstance(value, str):
        if not _DECIMAL.fullmatch(value):
            raise FrameError(f"JSON header: {key}={value!r} is not an integer")
        value = int(value)
    elif not isinstance(value, int):
        raise FrameError(f"JSON header: {key} has type {type(value).__name__}")
    if not _I32_MIN <= value <= _I32_MAX:
        raise FrameError(f"JSON header: {key}={value} does not fit an int32")
    return value


def _json_language(value: object) -> int:
    if value is None:
        return LANGUAGE_JAVA
    if value.__class__ is str:
        return LANGUAGE_CODES.get(value, LANGUAGE_OTHER)
    if isinstance(value, str):
        return LANGUAGE_CODES.get(value, LANGUAGE_OTHER)
    if isinstance(value, int) and not isinstance(value, bool):
        return value if 0 <= value <= 0xFF else LANGUAGE_OTHER
    raise FrameError(f"JSON header: language={value!r} is neither a name nor an ordinal")


def decode_json_header(header: bytes) -> RemotingCommand:
    """Decode a JSON header (leniently, see the module docstring); body and serialize_type left default.

    Raises FrameError for bad UTF-8, bad JSON, a non-object, extFields that is not an object or null,
    or a numeric field that is not an int32.  orjson parses; what it refuses (NaN, integers past 64
    bits, nesting past its depth limit) goes through the json module, which accepts what fastjson
    does, so the result never depends on which parser ran.
    """
    try:
        obj = orjson.loads(header)
    except orjson.JSONDecodeError:
        obj = _json_loads_lenient(header)
    if obj.__class__ is not dict:
        raise FrameError(f"JSON header is a {type(obj).__name__}, not an object")
    ext_raw = obj.get("extFields")
    if ext_raw is None:
        ext_fields = None
    elif ext_raw.__class__ is dict:
        ext_fields = ext_raw if _all_str(ext_raw) else \
            {key: _to_text(value) for key, value in ext_raw.items() if value is not None}
    else:
        raise FrameError(f"JSON header: extFields is a {type(ext_raw).__name__}, not an object")
    remark_raw = obj.get("remark")
    return RemotingCommand(
        code=_json_int(obj, "code", 0),
        language=_json_language(obj.get("language")),
        version=_json_int(obj, "version", 0),
        opaque=_json_int(obj, "opaque", 0),
        flag=_json_int(obj, "flag", 0),
        remark=None if remark_raw is None else _to_text(remark_raw),
        ext_fields=ext_fields,
    )


def _json_loads_lenient(header) -> object:
    try:
        text = bytes(header).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FrameError(f"JSON header is not valid UTF-8: {exc}") from None
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise FrameError(f"JSON header does not parse: {exc}") from None


# --------------------------------------------------------------------------------------------------
# ROCKETMQ binary header, fast path

_BIN_FIXED = struct.Struct(">hBhiii")  # code, language, version, opaque, flag, remark length: 17 bytes
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_FRAME_HEAD = struct.Struct(">II")


def encode_rocketmq_header(cmd: RemotingCommand) -> bytes:
    """The binary header bytes (RocketMQSerializable.rocketMQProtocolEncode). Raises EncodeError for a code
    or version outside int16, a language outside a byte, or a key over 32767 bytes."""
    remark = _utf8(cmd.remark, "remark") if cmd.remark else b""
    parts = []
    for key, value in _ext_items(cmd):
        key_bytes = _utf8(key, "extFields key")
        value_bytes = _utf8(value, f"extFields[{key!r}]")
        if len(key_bytes) > _I16_MAX:
            raise EncodeError(f"extFields key of {len(key_bytes)} bytes does not fit a short length")
        parts += (_I16.pack(len(key_bytes)), key_bytes, _I32.pack(len(value_bytes)), value_bytes)
    ext = b"".join(parts)
    fixed = _BIN_FIXED.pack(
        _check_int("code", cmd.code, _I16_MIN, _I16_MAX),
        _check_int("language", cmd.language, 0, 0xFF),
        _check_int("version", cmd.version, _I16_MIN, _I16_MAX),
        _check_int("opaque", cmd.opaque, _I32_MIN, _I32_MAX),
        _check_int("flag", cmd.flag, _I32_MIN, _I32_MAX),
        len(remark),
    )
    return b"".join((fixed, remark, _I32.pack(len(ext)), ext))


def _read_text(header, pos: int, size: int, what: str) -> str:
    try:
        return bytes(header[pos:pos + size]).decode("utf-8")
    except UnicodeDecodeError:
        raise FrameError(f"ROCKETMQ header: {what} is not valid UTF-8") from None


def _decode_ext_block(ext: bytes, base: int) -> dict[str, str]:
    """The ext block (key length 2, key, value length 4, value)*; `base` is its offset in the
    header, for the messages.  One copy of the block, then slices of it: this runs for every
    request (a send carries ~15 fields), so it avoids a copy and a try per field."""
    fields: dict[str, str] = {}
    end = len(ext)
    pos = 0
    unpack_i16, unpack_i32 = _I16.unpack_from, _I32.unpack_from
    try:
        while pos < end:
            if end - pos < 2:
                raise FrameError(f"ROCKETMQ header: ext entry @{base + pos} cut inside its key length")
            (key_size,) = unpack_i16(ext, pos)
            pos += 2
            if key_size < 0 or key_size > end - pos - 4:
                raise FrameError(f"ROCKETMQ header: ext key length {key_size} past the ext block")
            key = ext[pos:pos + key_size].decode("utf-8")
            pos += key_size
            (value_size,) = unpack_i32(ext, pos)
            pos += 4
            if value_size < 0 or value_size > end - pos:
                raise FrameError(f"ROCKETMQ header: ext value length {value_size} past the ext block")
            fields[key] = ext[pos:pos + value_size].decode("utf-8")
            pos += value_size
    except UnicodeDecodeError:
        raise FrameError(f"ROCKETMQ header: an ext key or value near @{base + pos} is not valid UTF-8") from None
    return fields


def decode_rocketmq_header(header) -> RemotingCommand:
    """Decode a binary header; every length is checked against what is left before it is used.

    Raises FrameError for a header shorter than its fixed part, a negative length, a length past the
    header or the ext block, or bad UTF-8.
    """
    size = len(header)
    if size < _BIN_FIXED.size + 4:
        raise FrameError(f"ROCKETMQ header: {size} bytes, the fixed part needs {_BIN_FIXED.size + 4}")
    code, language, version, opaque, flag, remark_size = _BIN_FIXED.unpack_from(header, 0)
    pos = _BIN_FIXED.size
    if remark_size < 0 or remark_size > size - pos - 4:
        raise FrameError(f"ROCKETMQ header: remark length {remark_size} past the header ({size - pos - 4} left)")
    remark = _read_text(header, pos, remark_size, "remark") if remark_size else None
    pos += remark_size
    (ext_size,) = _I32.unpack_from(header, pos)
    pos += 4
    if ext_size < 0 or ext_size > size - pos:
        raise FrameError(f"ROCKETMQ header: ext length {ext_size} past the header ({size - pos} left)")
    ext_fields = _decode_ext_block(bytes(header[pos:pos + ext_size]), pos) if ext_size else None
    return RemotingCommand(code=code, language=language, version=version, opaque=opaque, flag=flag, remark=remark, ext_fields=ext_fields)


# --------------------------------------------------------------------------------------------------
# Frames, fast path


def _encode_header(cmd: RemotingCommand) -> bytes:
    if cmd.serialize_type == SERIALIZE_JSON:
        return encode_json_header(cmd)
    if cmd.serialize_type == SERIALIZE_ROCKETMQ:
        return encode_rocketmq_header(cmd)
    raise EncodeError(f"unknown serialize type {cmd.serialize_type!r}")


def encode_frame(cmd: RemotingCommand) -> bytes:
    """The whole frame, length prefix included. Raises EncodeError if a field does not fit or the frame
    would exceed FRAME_SIZE_MAX."""
    header = _encode_header(cmd)
    body = bytes(cmd.body) if cmd.body else b""
    if len(header) > HEADER_LENGTH_MAX:
        raise EncodeError(f"header of {len(header)} bytes exceeds {HEADER_LENGTH_MAX}")
    total_length = 4 + len(header) + len(body)
    if FRAME_PREFIX_SIZE + total_length > FRAME_SIZE_MAX:
        raise EncodeError(f"frame of {FRAME_PREFIX_SIZE + total_length} bytes exceeds FRAME_SIZE_MAX {FRAME_SIZE_MAX}")
    return b"".join((_FRAME_HEAD.pack(total_length, (cmd.serialize_type << 24) | len(header)), header, body))


class ResponseTemplate:
    """The frames of responses that differ only in code, opaque and a few ext values: no remark, no
    body, ext fields `varying` (keys fixed, values per response) then `fixed` (keys and values fixed),
    in that order.  frame() gives the bytes encode_frame gives for the same RemotingCommand, in either
    serialize type, without building one (tests/unit/test_wire.py proves them equal); a send's answer
    is made this way.

    Contract (programmer errors, asserted at construction): every key is ASCII; a varying value is
    ASCII with no '"' or '\\' (numbers, hex msgIds) -- it is written into the JSON as is.  frame()
    returns None for a language the JSON header cannot name; the caller encodes such a response
    the long way."""

    def __init__(self, varying: tuple[str, ...], fixed: dict[str, str]):
        assert all(k.isascii() and '"' not in k and "\\" not in k for k in (*varying, *fixed)), (varying, fixed)
        self.varying = varying
        self.fixed = dict(fixed)
        # ROCKETMQ: each varying key's length and bytes, then the fixed entries, encoded once
        self._bin_keys = tuple(_I16.pack(len(k)) + k.encode() for k in varying)
        self._bin_tail = b"".join(_I16.pack(len(kb)) + kb + _I32.pack(len(vb)) + vb
                                  for kb, vb in ((k.encode(), v.encode()) for k, v in self.fixed.items()))
        # JSON: fastjson's key order (encode_json_header), the fixed values as orjson writes them
        fixed_json = [orjson.dumps(k) + b":" + orjson.dumps(v) for k, v in self.fixed.items()]
        ext = b",".join([b'"%b":"%%b"' % k.encode() for k in varying] + [f.replace(b"%", b"%%") for f in fixed_json])
        # the fixed entries once more, for the C send path (csrc/fastsend.h): binary, and JSON with
        # each entry preceded by ','
        self.bin_fixed = self._bin_tail
        self.json_fixed = b"".join(b"," + f for f in fixed_json)
        self._json = (b'{"code":%%d,"extFields":{%b},"flag":%d,"language":"%%b","opaque":%%d,'
                      b'"serializeTypeCurrentRPC":"JSON","version":%%d}' % (ext, RPC_RESPONSE))
        self._languages = {code: name.encode() for code, name in LANGUAGE_NAMES.items()}

    def frame(self, serialize_type: int, code: int, language: int, version: int, opaque: int,
              *values: bytes) -> bytes | None:
        assert len(values) == len(self.varying), (self.varying, values)
        if serialize_type == SERIALIZE_ROCKETMQ:
            parts = []
            for key, value in zip(self._bin_keys, values):
                parts += (key, _I32.pack(len(value)), value)
            parts.append(self._bin_tail)
            ext = b"".join(parts)
            header = _BIN_FIXED.pack(code, language, version, opaque, RPC_RESPONSE, 0) + _I32.pack(len(ext)) + ext
        elif serialize_type == SERIALIZE_JSON:
            name = self._languages.get(language)
            if name is None:
                return None
            header = self._json % (code, *values, name, opaque, version)
        else:
            return None
        return _FRAME_HEAD.pack(4 + len(header), (serialize_type << 24) | len(header)) + header


def frame_payload_size(prefix) -> int:
    """TOTALLENGTH from the first 4 bytes of a frame: how many bytes follow. What a stream reader calls
    before buffering a frame. Raises FrameTruncatedError (< 4 bytes) or FrameError (over FRAME_SIZE_MAX)."""
    if len(prefix) < FRAME_PREFIX_SIZE:
        raise FrameTruncatedError(f"frame: {len(prefix)} bytes, the length prefix needs 4")
    (total_length,) = _U32.unpack_from(prefix, 0)
    if FRAME_PREFIX_SIZE + total_length > FRAME_SIZE_MAX:
        raise FrameError(f"frame length {total_length} + 4 exceeds FRAME_SIZE_MAX {FRAME_SIZE_MAX}")
    return total_length


def decode_frame_payload(payload) -> RemotingCommand:
    """Decode a frame without its 4-byte length prefix (what a length-field decoder hands over).

    Raises FrameTruncatedError (shorter than 4, or HEADERLENGTH past the end), FrameError (over
    FRAME_SIZE_MAX, unknown serialize type, or any header error of the two decoders).
    """
    size = len(payload)
    if FRAME_PREFIX_SIZE + size > FRAME_SIZE_MAX:
        raise FrameError(f"frame payload of {size} bytes exceeds FRAME_SIZE_MAX {FRAME_SIZE_MAX}")
    if size < 4:
        raise FrameTruncatedError(f"frame payload: {size} bytes, the type/header-length word needs 4")
    (word,) = _U32.unpack_from(payload, 0)
    serialize_type = word >> 24
    header_size = word & HEADER_LENGTH_MAX
    if header_size > size - 4:
        raise FrameTruncatedError(f"frame: header length {header_size} past the end ({size - 4} bytes left)")
    header = payload[4:4 + header_size]
    if serialize_type == SERIALIZE_JSON:
        cmd = decode_json_header(header)
    elif serialize_type == SERIALIZE_ROCKETMQ:
        cmd = decode_rocketmq_header(header)
    else:
        raise FrameError(f"frame: unknown serialize type {serialize_type}")
    cmd.serialize_type = serialize_type
    cmd.body = bytes(payload[4 + header_size:])
    return cmd


def decode_frame(frame) -> RemotingCommand:
    """Decode exactly one whole frame, length prefix included. Raises FrameTruncatedError if it is shorter
    than its prefix says, FrameError if longer, or what decode_frame_payload raises."""
    total_length = frame_payload_size(frame)
    available = len(frame) - FRAME_PREFIX_SIZE
    if available < total_length:
        raise FrameTruncatedError(f"frame: length prefix says {total_length}, {available} bytes follow")
    if available > total_length:
        raise FrameError(f"frame: length prefix says {total_length}, {available} bytes follow")
    return decode_frame_payload(memoryview(frame)[FRAME_PREFIX_SIZE:])


# --------------------------------------------------------------------------------------------------
# Frames through the declarations (reference for tests and tools; not for the hot path)


def encode_frame_reference(cmd: RemotingCommand) -> bytes:
    """encode_frame through RocketMQHeader/Frame; same bytes, same EncodeErrors for range problems."""
    if cmd.serialize_type == SERIALIZE_ROCKETMQ:
        for name, value, low, high in (
            ("code", cmd.code, _I16_MIN, _I16_MAX),
            ("language", cmd.language, 0, 0xFF),
            ("version", cmd.version, _I16_MIN, _I16_MAX),
            ("opaque", cmd.opaque, _I32_MIN, _I32_MAX),
            ("flag", cmd.flag, _I32_MIN, _I32_MAX),
        ):
            _check_int(name, value, low, high)
        header = RocketMQHeader.build(
            Container(
                code=cmd.code,
                language=cmd.language,
                version=cmd.version,
                opaque=cmd.opaque,
                flag=cmd.flag,
                remark=cmd.remark or "",
                ext_fields=ListContainer(Container(key=key, value=value) for key, value in _ext_items(cmd)),
            )
        )
    else:
        header = _encode_header(cmd)
    return Frame.build(Container(serialize_type=cmd.serialize_type, header=header, body=bytes(cmd.body)))


def decode_frame_payload_reference(payload) -> RemotingCommand:
    """decode_frame_payload through Frame/RocketMQHeader; raises FrameError for anything malformed."""
    payload = bytes(payload)
    try:
        frame = Frame.parse(_U32.pack(len(payload)) + payload)
    except ConstructError as exc:
        raise FrameError(f"frame (reference decoder): {exc}") from None
    if frame.serialize_type == SERIALIZE_JSON:
        cmd = decode_json_header(frame.header)
    elif frame.serialize_type == SERIALIZE_ROCKETMQ:
        try:
            parsed = RocketMQHeader.parse(frame.header)
        except (ConstructError, UnicodeDecodeError) as exc:
            raise FrameError(f"ROCKETMQ header (reference decoder): {exc}") from None
        cmd = RemotingCommand(
            code=parsed.code,
            language=parsed.language,
            version=parsed.version,
            opaque=parsed.opaque,
            flag=parsed.flag,
            remark=parsed.remark or None,
            ext_fields={entry.key: entry.value for entry in parsed.ext_fields} if parsed.ext_fields else None,
        )
    else:
        raise FrameError(f"frame: unknown serialize type {frame.serialize_type}")
    cmd.serialize_type = frame.serialize_type
    cmd.body = frame.body
    return cmd
