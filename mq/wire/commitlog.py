"""CommitLog record (RocketMQ 4.x v1, MESSAGE_MAGIC_CODE) and the end-of-file BLANK filler (spec 3.2, 3.3).

    TOTALSIZE 4 | MAGIC 4 | BODYCRC 4 | QUEUEID 4 | FLAG 4 | QUEUEOFFSET 8 | PHYSICALOFFSET 8 | SYSFLAG 4 |
    BORNTS 8 | BORNHOST 4+4 (16+4 if SYSFLAG&0x10) | STORETS 8 | STOREHOST 4+4 (16+4 if SYSFLAG&0x20) |
    RECONSUMETIMES 4 | PREPAREDTXOFFSET 8 | BODYLEN 4 | BODY | TOPICLEN 1 (signed) | TOPIC | PROPSLEN 2 (signed) | PROPS
    BLANK: REMAINING 4 | 0xCBD43194 4 | (undefined bytes up to the end of the file)

Big-endian; every int is signed (Java), except the magic, shown unsigned (0xDAA320A7 == Java -626843481).

Invariants (checked by parse_record, guaranteed by build_record):
* TOTALSIZE == record_size(BODYLEN, TOPICLEN, PROPSLEN, SYSFLAG) == 91 + B + T + P for IPv4/IPv4; every IPv6 host
  adds 12 bytes. All three lengths are >= 0 and count bytes, not characters.
* BODYCRC == zlib.crc32(BODY) & 0x7FFFFFFF over the body as stored (compressed if compressed). parse_record checks
  it only when asked (recovery does, dispatch does not).
* 0 <= TOPICLEN <= 127 (TOPIC_SIZE_MAX) and 0 <= PROPSLEN <= 32767 (PROPERTIES_SIZE_MAX).
* SYSFLAG bits 0x10 / 0x20 say whether BORNHOST / STOREHOST are IPv6. build_record derives both bits from the host
  address families (sets them for IPv6, clears them for IPv4) and ignores what the caller passed in those bits.
* A record never spans two files: when record_size + END_FILE_MIN_BLANK_LENGTH > room left in the file, the
  writer puts a BLANK (REMAINING = room left, the whole tail counts as used) and starts the next file.

Python representation (Containers from CommitLogRecord.parse and parse_record are equal):
* hosts are text: dotted quad for IPv4 ("192.168.0.10"), RFC 5952 compressed form for IPv6 ("fe80::1") as
  `str(ipaddress.ip_address(packed))`; build_record also accepts packed bytes (4/16) and ipaddress objects.
  IPv4-mapped IPv6 addresses are NOT rewritten here; callers holding socket peer addresses apply
  normalize_host() first, as Java does (it never sees "::ffff:a.b.c.d", only Inet4Address).
* topic is str (strict UTF-8); body and properties are bytes exactly as stored (properties may come raw
  from a batch body, see mq.wire.properties.decode_properties to read them).

CommitLogRecord (construct) is the declaration; parse_record/build_record are `struct`-based fast paths
proven equal to it by tests/unit/test_wire.py, with the validation the declaration cannot express cheaply.
"""

from __future__ import annotations

import functools
import ipaddress
import socket
import struct
import zlib
from collections.abc import Iterator, Mapping
from typing import NamedTuple

from construct import (
    Adapter,
    Bytes,
    Check,
    Const,
    Container,
    GreedyBytes,
    IfThenElse,
    Int8sb,
    Int16sb,
    Int32sb,
    Int32ub,
    Int64sb,
    PascalString,
    Prefixed,
    Rebuild,
    Struct,
    this,
)

from .errors import BadMagicError, CrcMismatchError, EncodeError, MalformedError, SizeMismatchError, TruncatedError
from .properties import PROPERTIES_SIZE_MAX, encode_properties

__all__ = [
    "MESSAGE_MAGIC_CODE",
    "BLANK_MAGIC_CODE",
    "END_FILE_MIN_BLANK_LENGTH",
    "TOPIC_SIZE_MAX",
    "PROPERTIES_SIZE_MAX",
    "RECORD_SIZE_MIN",
    "COMPRESSED",
    "MULTI_TAGS",
    "TRANSACTION_NOT_TYPE",
    "TRANSACTION_PREPARED",
    "TRANSACTION_COMMIT",
    "TRANSACTION_ROLLBACK",
    "TRANSACTION_MASK",
    "NEED_UNWRAP",
    "INNER_BATCH",
    "COMPRESSION_TYPE_MASK",
    "COMPRESSION_LZ4",
    "COMPRESSION_ZSTD",
    "COMPRESSION_ZLIB",
    "BORNHOST_V6",
    "STOREHOST_V6",
    "COMMIT",
    "ROLLBACK",
    "POS_TOTAL_SIZE",
    "POS_MAGIC",
    "POS_BODY_CRC",
    "POS_QUEUE_ID",
    "POS_FLAG",
    "POS_QUEUE_OFFSET",
    "POS_PHYSICAL_OFFSET",
    "POS_SYS_FLAG",
    "POS_BORN_TIMESTAMP",
    "POS_BORN_HOST",
    "store_timestamp_pos",
    "CommitLogRecord",
    "BlankRecord",
    "RecordPrefix",
    "body_crc32",
    "record_properties",
    "record_size",
    "normalize_host",
    "peek_record",
    "parse_record",
    "build_record",
    "record_crc_ok",
    "iter_records",
    "parse_blank",
    "build_blank",
]

MESSAGE_MAGIC_CODE = 0xDAA320A7  # Java int -626843481
BLANK_MAGIC_CODE = 0xCBD43194  # Java int -875286124
END_FILE_MIN_BLANK_LENGTH = 8  # TOTALSIZE + MAGIC of the BLANK filler
TOPIC_SIZE_MAX = 127  # TOPICLEN is a signed byte

# sysFlag bits (C/sysflag/MessageSysFlag.java)
COMPRESSED = 0x1
MULTI_TAGS = 0x2
TRANSACTION_NOT_TYPE = 0x0
TRANSACTION_PREPARED = 0x4
TRANSACTION_COMMIT = 0x8
TRANSACTION_ROLLBACK = 0xC
TRANSACTION_MASK = 0xC  # sysFlag & TRANSACTION_MASK is one of the four TRANSACTION_* values
COMMIT = TRANSACTION_COMMIT
ROLLBACK = TRANSACTION_ROLLBACK
BORNHOST_V6 = 0x10
STOREHOST_V6 = 0x20
NEED_UNWRAP = 0x40              # 5.x: a batch wrapped by a proxy (listed by mqdump, never set here)
INNER_BATCH = 0x80              # 5.x: an inner batch (listed by mqdump, never set here)
COMPRESSION_TYPE_MASK = 0x700  # with COMPRESSED: which codec (MessageSysFlag.COMPRESSION_TYPE_COMPARATOR, 5.x)
COMPRESSION_LZ4 = 0x100
COMPRESSION_ZSTD = 0x200
COMPRESSION_ZLIB = 0x300

# Fixed byte positions inside a record (the same for IPv4 and IPv6 hosts up to BORNHOST).
POS_TOTAL_SIZE = 0
POS_MAGIC = 4
POS_BODY_CRC = 8
POS_QUEUE_ID = 12
POS_FLAG = 16
POS_QUEUE_OFFSET = 20
POS_PHYSICAL_OFFSET = 28
POS_SYS_FLAG = 36
POS_BORN_TIMESTAMP = 40
POS_BORN_HOST = 48

# TOTALSIZE..BORNTS, BODYLEN, TOPICLEN, PROPSLEN, the two timestamps, ports, RECONSUMETIMES, PREPAREDTXOFFSET:
# 4+4+4+4+4+8+8+4+8 + 8 + 4+8 + 4 + 1 + 2 + 4+4 (ports) = 83, plus the two host addresses.
_RECORD_FIXED_SIZE_NO_HOSTS = 83
RECORD_SIZE_MIN = _RECORD_FIXED_SIZE_NO_HOSTS + 4 + 4  # 91: IPv4/IPv4, empty body, topic and properties

_I32_MIN, _I32_MAX = -(1 << 31), (1 << 31) - 1
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1


def store_timestamp_pos(sys_flag: int) -> int:
    """Byte position of STORETIMESTAMP: 56 with an IPv4 born host, 68 with an IPv6 one."""
    return POS_BORN_HOST + (20 if sys_flag & BORNHOST_V6 else 8)


def record_properties(buf) -> bytes:
    """The PROPERTIES bytes of one whole record whose lengths were already checked (a record the
    store's read path returned: mq_commitlog_read_record); the filter's cheap read of it, without
    parse_record's copies and checks."""
    (sys_flag,) = _I32_AT.unpack_from(buf, POS_SYS_FLAG)
    pos = POS_BORN_HOST + (16 if sys_flag & BORNHOST_V6 else 4) + 12 + (16 if sys_flag & STOREHOST_V6 else 4) + 16
    pos += 4 + _I32_AT.unpack_from(buf, pos)[0]               # BODYLEN, BODY
    pos += 1 + buf[pos]                                        # TOPICLEN, TOPIC
    (size,) = _U16_AT.unpack_from(buf, pos)
    return bytes(buf[pos + 2:pos + 2 + size])


_I32_AT = struct.Struct(">i")
_U16_AT = struct.Struct(">H")


def body_crc32(body: bytes | bytearray | memoryview) -> int:
    """BODYCRC: the zlib/IEEE CRC-32 of the body with the top bit cleared (UtilAll.crc32)."""
    return zlib.crc32(body) & 0x7FFFFFFF


def record_size(body_size: int, topic_size: int, properties_size: int, sys_flag: int = 0) -> int:
    """TOTALSIZE of a record with these byte lengths (CommitLog.calMsgLength): 91 + B + T + P for IPv4 hosts."""
    born_host_size = 16 if sys_flag & BORNHOST_V6 else 4
    store_host_size = 16 if sys_flag & STOREHOST_V6 else 4
    return _RECORD_FIXED_SIZE_NO_HOSTS + born_host_size + store_host_size + body_size + topic_size + properties_size


# --------------------------------------------------------------------------------------------------
# Host addresses


def _ip_to_text(packed: bytes) -> str:
    """Packed 4/16-byte address -> text; the one conversion both the declaration and the fast path use."""
    if len(packed) == 4:
        return socket.inet_ntoa(packed)
    return str(ipaddress.IPv6Address(packed))


def _ip_to_packed(host: object) -> bytes:
    """Text, packed bytes or an ipaddress object -> 4 or 16 bytes. Raises EncodeError."""
    if isinstance(host, (bytes, bytearray, memoryview)):
        packed = bytes(host)
        if len(packed) not in (4, 16):
            raise EncodeError(f"packed host address must be 4 or 16 bytes, got {len(packed)}")
        return packed
    if isinstance(host, (ipaddress.IPv4Address, ipaddress.IPv6Address)):
        return host.packed
    if isinstance(host, str):
        packed = _text_to_packed(host)
        if packed is None:
            raise EncodeError(f"not an IP address literal: {host!r}")
        return packed
    raise EncodeError(f"host must be str, bytes or an ipaddress object, got {type(host).__name__}")


@functools.lru_cache(maxsize=1024)
def _text_to_packed(host: str) -> bytes | None:
    """ipaddress's parse, cached: every decoded message's msgId packs its store host (~10 us a parse)."""
    try:
        return ipaddress.ip_address(host).packed
    except ValueError:
        return None


def normalize_host(host: str) -> str:
    """Canonical text of an IP literal: IPv4-mapped IPv6 ("::ffff:10.0.0.1") becomes IPv4, an IPv6 zone is
    dropped, IPv6 is compressed. Apply it to socket peer addresses before they reach a record or a msgId,
    so a dual-stack listener stores 8-byte IPv4 hosts exactly as a Java broker does."""
    text = host.split("%", 1)[0]
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        raise EncodeError(f"not an IP address literal: {host!r}") from None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return str(address)


class _HostAdapter(Adapter):
    """Bytes(4|16) <-> address text (see the module docstring)."""

    def _decode(self, obj, context, path):
        return _ip_to_text(obj)

    def _encode(self, obj, context, path):
        return _ip_to_packed(obj)


def _host_field(v6_bit: int):
    return IfThenElse(this.sys_flag & v6_bit, _HostAdapter(Bytes(16)), _HostAdapter(Bytes(4)))


def _declared_size(ctx) -> int:
    return record_size(len(ctx.body), len(ctx.topic.encode("utf-8")), len(ctx.properties), ctx.sys_flag)


CommitLogRecord = """
A v1 CommitLog record (see the module docstring). Building recomputes total_size; parsing checks it.
""" * Struct(
    "total_size" / Rebuild(Int32sb, _declared_size),
    "magic" / Const(MESSAGE_MAGIC_CODE, Int32ub),
    "body_crc" / Int32sb,
    "queue_id" / Int32sb,
    "flag" / Int32sb,
    "queue_offset" / Int64sb,
    "physical_offset" / Int64sb,
    "sys_flag" / Int32sb,
    "born_timestamp_ms" / Int64sb,
    "born_host" / _host_field(BORNHOST_V6),
    "born_port" / Int32sb,
    "store_timestamp_ms" / Int64sb,
    "store_host" / _host_field(STOREHOST_V6),
    "store_port" / Int32sb,
    "reconsume_times" / Int32sb,
    "prepared_transaction_offset" / Int64sb,
    "body" / Prefixed(Int32sb, GreedyBytes),
    "topic" / PascalString(Int8sb, "utf8"),
    "properties" / Prefixed(Int16sb, GreedyBytes),
    Check(lambda ctx: ctx.total_size == _declared_size(ctx)),
)

BlankRecord = """
End-of-file filler: the room left in the file (the filler counts all of it as used) and BLANK_MAGIC_CODE.
""" * Struct(
    "remaining_size" / Int32sb,
    "magic" / Const(BLANK_MAGIC_CODE, Int32ub),
)


# --------------------------------------------------------------------------------------------------
# Fast paths

_PREFIX = struct.Struct(">iI")  # TOTALSIZE, MAGIC
_HEAD = struct.Struct(">iIiiiqqiq")  # TOTALSIZE .. BORNTIMESTAMP, 48 bytes
_PORT_TS = struct.Struct(">iq")  # BORNPORT, STORETIMESTAMP
_PORT_RT_PTO_BL = struct.Struct(">iiqi")  # STOREPORT, RECONSUMETIMES, PREPAREDTXOFFSET, BODYLEN
_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")


class RecordPrefix(NamedTuple):
    """The first 8 bytes of anything in a CommitLog file: a record, a BLANK, or zeroes past the end."""

    total_size: int
    magic: int  # unsigned


def peek_record(buf, offset: int = 0) -> RecordPrefix:
    """Read TOTALSIZE and MAGIC at `offset` without judging them. Raises TruncatedError if < 8 bytes remain.

    A walker dispatches on `.magic`: MESSAGE_MAGIC_CODE -> parse_record, BLANK_MAGIC_CODE -> next file,
    anything else (typically total_size == magic == 0 in a preallocated file) -> end of data or corruption.
    """
    available = len(buf) - offset
    if available < 8:
        raise TruncatedError(f"commitlog @{offset}: need 8 bytes for TOTALSIZE+MAGICCODE, {max(available, 0)} left")
    return RecordPrefix(*_PREFIX.unpack_from(buf, offset))


def parse_record(buf, offset: int = 0, *, check_crc: bool = False) -> Container:
    """Decode and validate the message record at `offset` in buf (bytes, bytearray, memoryview or mmap).

    Outcomes:
    * a Container equal to CommitLogRecord.parse(record bytes) (same field names, hosts as text);
    * TruncatedError: fewer than 8 bytes, or fewer than TOTALSIZE bytes, are left;
    * BadMagicError: MAGIC is not MESSAGE_MAGIC_CODE (a BLANK gives this too; use peek_record first);
    * SizeMismatchError: TOTALSIZE below the minimum, a negative length, a length running past TOTALSIZE,
      or TOTALSIZE != the recomputed size;
    * MalformedError: the topic is not valid UTF-8;
    * CrcMismatchError: only with check_crc=True, BODYCRC != body_crc32(body).
    """
    assert offset >= 0, offset
    total_size, magic = peek_record(buf, offset)
    if magic != MESSAGE_MAGIC_CODE:
        raise BadMagicError(f"commitlog @{offset}: magic 0x{magic:08X} is not MESSAGE_MAGIC_CODE 0x{MESSAGE_MAGIC_CODE:08X}", magic)
    if total_size < RECORD_SIZE_MIN:
        raise SizeMismatchError(f"commitlog @{offset}: TOTALSIZE {total_size} is below the minimum {RECORD_SIZE_MIN}")
    available = len(buf) - offset
    if total_size > available:
        raise TruncatedError(f"commitlog @{offset}: TOTALSIZE {total_size} but only {available} bytes left")
    end = offset + total_size

    (_, _, body_crc, queue_id, flag, queue_offset, physical_offset, sys_flag, born_ts) = _HEAD.unpack_from(buf, offset)
    fixed_size = record_size(0, 0, 0, sys_flag)
    if total_size < fixed_size:
        raise SizeMismatchError(
            f"commitlog @{offset}: TOTALSIZE {total_size} is below {fixed_size}, the minimum for SYSFLAG 0x{sys_flag:X}"
        )
    pos = offset + 48
    born_host_size = 16 if sys_flag & BORNHOST_V6 else 4
    born_host = _ip_to_text(bytes(buf[pos:pos + born_host_size]))
    pos += born_host_size
    born_port, store_ts = _PORT_TS.unpack_from(buf, pos)
    pos += 12
    store_host_size = 16 if sys_flag & STOREHOST_V6 else 4
    store_host = _ip_to_text(bytes(buf[pos:pos + store_host_size]))
    pos += store_host_size
    store_port, reconsume_times, prepared_tx_offset, body_size = _PORT_RT_PTO_BL.unpack_from(buf, pos)
    pos += 20
    # Everything so far lies inside fixed_size <= total_size. Now the three variable parts, each checked
    # against `end` before it is trusted; the 1+2 bytes of TOPICLEN/PROPSLEN must still fit after the body.
    if body_size < 0 or pos + body_size + 3 > end:
        raise SizeMismatchError(f"commitlog @{offset}: BODYLEN {body_size} does not fit in TOTALSIZE {total_size}")
    body = bytes(buf[pos:pos + body_size])
    pos += body_size
    (topic_size,) = _I8.unpack_from(buf, pos)
    pos += 1
    if topic_size < 0 or pos + topic_size + 2 > end:
        raise SizeMismatchError(f"commitlog @{offset}: TOPICLEN {topic_size} does not fit in TOTALSIZE {total_size}")
    topic_bytes = bytes(buf[pos:pos + topic_size])
    pos += topic_size
    (properties_size,) = _I16.unpack_from(buf, pos)
    pos += 2
    if properties_size < 0 or pos + properties_size > end:
        raise SizeMismatchError(f"commitlog @{offset}: PROPERTIESLEN {properties_size} does not fit in TOTALSIZE {total_size}")
    properties = bytes(buf[pos:pos + properties_size])
    pos += properties_size
    if pos != end:
        raise SizeMismatchError(
            f"commitlog @{offset}: TOTALSIZE {total_size} != recomputed {pos - offset} "
            f"(BODYLEN {body_size}, TOPICLEN {topic_size}, PROPERTIESLEN {properties_size})"
        )
    try:
        topic = topic_bytes.decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedError(f"commitlog @{offset}: topic {topic_bytes!r} is not valid UTF-8") from None
    if check_crc and body_crc32(body) != body_crc:
        raise CrcMismatchError(f"commitlog @{offset}: BODYCRC {body_crc} != CRC32(body) {body_crc32(body)}")
    return Container(
        total_size=total_size,
        magic=magic,
        body_crc=body_crc,
        queue_id=queue_id,
        flag=flag,
        queue_offset=queue_offset,
        physical_offset=physical_offset,
        sys_flag=sys_flag,
        born_timestamp_ms=born_ts,
        born_host=born_host,
        born_port=born_port,
        store_timestamp_ms=store_ts,
        store_host=store_host,
        store_port=store_port,
        reconsume_times=reconsume_times,
        prepared_transaction_offset=prepared_tx_offset,
        body=body,
        topic=topic,
        properties=properties,
    )


def _check_int(name: str, value: int, low: int, high: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise EncodeError(f"{name}={value!r} is outside [{low}, {high}]")


def build_record(
    *,
    body: bytes,
    topic: str,
    properties: bytes | str | Mapping[str, str | None] = b"",
    queue_id: int = 0,
    flag: int = 0,
    queue_offset: int = 0,
    physical_offset: int = 0,
    sys_flag: int = 0,
    born_timestamp_ms: int = 0,
    born_host: object = "127.0.0.1",
    born_port: int = 0,
    store_timestamp_ms: int = 0,
    store_host: object = "127.0.0.1",
    store_port: int = 0,
    reconsume_times: int = 0,
    prepared_transaction_offset: int = 0,
    body_crc: int | None = None,
    **ignored: object,
) -> bytes:
    """The reference encoder: the exact bytes a broker stores for these fields.

    * total_size is computed (any `total_size`/`magic` keyword, e.g. from `**parse_record(...)`, is ignored);
    * body_crc defaults to body_crc32(body); pass it only to write a deliberately wrong CRC;
    * SYSFLAG bits 0x10/0x20 are derived from the host families;
    * properties may be bytes (stored as is), str (UTF-8) or a mapping (mq.wire.properties encoding).
    Raises EncodeError: topic over 127 bytes or not UTF-8-encodable, properties over 32767 bytes, any integer
    outside its Java type, a port outside [0, 65535], an unparsable host.
    """
    unknown = set(ignored) - {"total_size", "magic", "_io"}
    if unknown:
        raise TypeError(f"build_record: unexpected fields {sorted(unknown)}")
    if isinstance(properties, Mapping):
        properties_bytes = encode_properties(properties)
    elif isinstance(properties, str):
        properties_bytes = properties.encode("utf-8")
    else:
        properties_bytes = bytes(properties)
    try:
        topic_bytes = topic.encode("utf-8")
    except (UnicodeEncodeError, AttributeError):
        raise EncodeError(f"topic {topic!r} is not encodable as UTF-8 text") from None
    body = bytes(body)
    if len(topic_bytes) > TOPIC_SIZE_MAX:
        raise EncodeError(f"topic is {len(topic_bytes)} bytes, the limit is {TOPIC_SIZE_MAX}")
    if len(properties_bytes) > PROPERTIES_SIZE_MAX:
        raise EncodeError(f"properties are {len(properties_bytes)} bytes, the limit is {PROPERTIES_SIZE_MAX}")
    born_packed = _ip_to_packed(born_host)
    store_packed = _ip_to_packed(store_host)
    _check_int("sys_flag", sys_flag, _I32_MIN, _I32_MAX)
    sys_flag &= ~(BORNHOST_V6 | STOREHOST_V6)
    if len(born_packed) == 16:
        sys_flag |= BORNHOST_V6
    if len(store_packed) == 16:
        sys_flag |= STOREHOST_V6
    if body_crc is None:
        body_crc = body_crc32(body)
    for name, value in (("queue_id", queue_id), ("flag", flag), ("reconsume_times", reconsume_times), ("body_crc", body_crc)):
        _check_int(name, value, _I32_MIN, _I32_MAX)
    for name, value in (
        ("queue_offset", queue_offset),
        ("physical_offset", physical_offset),
        ("born_timestamp_ms", born_timestamp_ms),
        ("store_timestamp_ms", store_timestamp_ms),
        ("prepared_transaction_offset", prepared_transaction_offset),
    ):
        _check_int(name, value, _I64_MIN, _I64_MAX)
    _check_int("born_port", born_port, 0, 0xFFFF)
    _check_int("store_port", store_port, 0, 0xFFFF)
    total_size = record_size(len(body), len(topic_bytes), len(properties_bytes), sys_flag)
    _check_int("total_size", total_size, RECORD_SIZE_MIN, _I32_MAX)
    parts = (
        _HEAD.pack(total_size, MESSAGE_MAGIC_CODE, body_crc, queue_id, flag, queue_offset, physical_offset, sys_flag, born_timestamp_ms),
        born_packed,
        _PORT_TS.pack(born_port, store_timestamp_ms),
        store_packed,
        _PORT_RT_PTO_BL.pack(store_port, reconsume_times, prepared_transaction_offset, len(body)),
        body,
        _I8.pack(len(topic_bytes)),
        topic_bytes,
        _I16.pack(len(properties_bytes)),
        properties_bytes,
    )
    record = b"".join(parts)
    assert len(record) == total_size, (len(record), total_size)
    return record


def record_crc_ok(rec: Mapping) -> bool:
    """True when the record's body_crc matches its body (the recovery check under checkCRCOnRecover)."""
    return body_crc32(rec["body"]) == rec["body_crc"]


def iter_records(buf, offset: int = 0, *, check_crc: bool = False) -> Iterator[Container]:
    """Parse back-to-back records until buf ends exactly (a PULL response body, spec 3.1).

    Raises what parse_record raises; a partial record at the end is a TruncatedError.
    """
    end = len(buf)
    while offset < end:
        rec = parse_record(buf, offset, check_crc=check_crc)
        offset += rec.total_size
        yield rec


# iter_record_values: a record's fields as one tuple, in this order (a consumer decodes every record
# of every pull: a Container per record and its item reads were most of the client's decode)
RECORD_VALUE_FIELDS = ("total_size", "body_crc", "queue_id", "flag", "queue_offset", "physical_offset", "sys_flag",
                       "born_timestamp_ms", "born_host", "born_port", "store_timestamp_ms", "store_host", "store_port",
                       "reconsume_times", "prepared_transaction_offset", "body", "topic", "properties",
                       "store_host_packed")
# IPv4 born and store hosts: every fixed field up to BODYLEN in one unpack (88 bytes)
_V4_FIXED = struct.Struct(">iIiiiqqiq4siq4siiqi")
_HOSTS_V6 = BORNHOST_V6 | STOREHOST_V6
_host_text: dict[bytes, str] = {}          # packed IPv4 -> dotted quad (a pull names a few hosts, over and over)
_HOST_TEXT_MAX = 4096


def _v4_text(packed: bytes) -> str:
    text = _host_text.get(packed)
    if text is None:
        if len(_host_text) >= _HOST_TEXT_MAX:
            _host_text.clear()
        text = _host_text[packed] = socket.inet_ntoa(packed)
    return text


def iter_record_values(buf, start: int = 0) -> Iterator[tuple]:
    """iter_records as tuples of RECORD_VALUE_FIELDS (plus the packed store host, for msg ids): the
    same records, the same values and the same errors as parse_record (proven equal by
    tests/properties/test_prop_wire.py); a record with an IPv6 host goes through parse_record.
    The records from `start` on (an offset in buf; errors name offsets in buf).
    The fast read is a consumer's per-message cost: buf becomes bytes once (its slices are then
    the values, with no copy of a copy), hosts are read from the cache inline, and a record's
    checks are in the order they fail cheapest."""
    if buf.__class__ is not bytes:
        buf = bytes(buf)
    end_all = len(buf)
    offset = start
    unpack = _V4_FIXED.unpack_from
    hosts = _host_text
    while offset < end_all:
        if end_all - offset < 88:
            rec = parse_record(buf, offset)          # too short for the fast read: its exact error, or a record
        else:
            (total_size, magic, body_crc, queue_id, flag, queue_offset, phy, sys_flag, born_ts, born_host, born_port,
             store_ts, store_host, store_port, reconsume, prep_tx, body_size) = unpack(buf, offset)
            end = offset + total_size
            pos = offset + 88 + body_size
            if (magic != MESSAGE_MAGIC_CODE or sys_flag & _HOSTS_V6 or total_size < RECORD_SIZE_MIN
                    or end > end_all or body_size < 0 or pos + 3 > end):
                rec = parse_record(buf, offset)      # an IPv6 host, or the error parse_record names
            else:
                body_end = pos
                topic_size = buf[pos]
                t0 = pos + 1
                pos = t0 + topic_size
                if topic_size > 127 or pos + 2 > end or pos + 2 + ((buf[pos] << 8) | buf[pos + 1]) != end \
                        or buf[pos] > 0x7F:          # PROPERTIES_LENGTH is a Java short: 32767 at most
                    rec = parse_record(buf, offset)
                else:
                    try:
                        topic = buf[t0:pos].decode("utf-8")
                    except UnicodeDecodeError:
                        raise MalformedError(f"commitlog @{offset}: topic {buf[t0:pos]!r} "
                                             "is not valid UTF-8") from None
                    yield (total_size, body_crc, queue_id, flag, queue_offset, phy, sys_flag, born_ts,
                           hosts.get(born_host) or _v4_text(born_host), born_port, store_ts,
                           hosts.get(store_host) or _v4_text(store_host), store_port, reconsume,
                           prep_tx, buf[offset + 88:body_end], topic, buf[pos + 2:end], store_host)
                    offset = end
                    continue
        yield tuple(rec[f] for f in RECORD_VALUE_FIELDS[:-1]) + (_ip_to_packed(rec["store_host"]),)
        offset += rec["total_size"]


def parse_blank(buf, offset: int = 0) -> int:
    """Decode a BLANK filler at `offset`; returns its remaining_size.

    Raises TruncatedError (< 8 bytes), BadMagicError (not BLANK_MAGIC_CODE), SizeMismatchError
    (remaining_size < END_FILE_MIN_BLANK_LENGTH; the bytes it covers need not be present in buf).
    """
    remaining_size, magic = peek_record(buf, offset)
    if magic != BLANK_MAGIC_CODE:
        raise BadMagicError(f"commitlog @{offset}: magic 0x{magic:08X} is not BLANK_MAGIC_CODE 0x{BLANK_MAGIC_CODE:08X}", magic)
    if remaining_size < END_FILE_MIN_BLANK_LENGTH:
        raise SizeMismatchError(f"commitlog @{offset}: BLANK covers {remaining_size} bytes, less than its own 8")
    return remaining_size


def build_blank(remaining_size: int) -> bytes:
    """The 8-byte BLANK filler for a file with `remaining_size` bytes left (>= 8)."""
    _check_int("remaining_size", remaining_size, END_FILE_MIN_BLANK_LENGTH, _I32_MAX)
    return _PREFIX.pack(remaining_size, BLANK_MAGIC_CODE)
