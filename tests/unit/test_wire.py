"""Unit tests for mq.wire: spec vectors, round trips, fast paths vs. the construct declarations, and every
malformed-input path. Each test's docstring states what it proves."""

from __future__ import annotations

import ipaddress
import json
import random
import struct
import zlib

import pytest

from mq.wire import batch as wbatch
from mq.wire import checkpoint as wcp
from mq.wire import commitlog as wcl
from mq.wire import consumequeue as wcq
from mq.wire import errors as werr
from mq.wire import ha as wha
from mq.wire import msgid as wmsgid
from mq.wire import properties as wprops
from mq.wire import remoting as wr
from mq.wire.errors import (
    BadMagicError,
    CrcMismatchError,
    EncodeError,
    FrameError,
    FrameTruncatedError,
    MalformedError,
    SizeMismatchError,
    TruncatedError,
    WireError,
)

SEED = 20240501

# Text alphabet with 1-, 2-, 3- and 4-byte UTF-8 characters, so byte lengths differ from character counts.
ALPHABET = "abcXYZ019_-%|é中😀ß"


def rand_text(rng: random.Random, low: int, high: int, alphabet: str = ALPHABET) -> str:
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(low, high)))


# ==================================================================================================
# Appendix C vectors

JSON_VECTOR_HEADER = (
    b'{"code":105,"extFields":{"topic":"TopicTest"},"flag":0,"language":"JAVA","opaque":0,'
    b'"serializeTypeCurrentRPC":"JSON","version":409}'
)
JSON_VECTOR_FRAME = bytes.fromhex("00000087" "00000083") + JSON_VECTOR_HEADER
BINARY_VECTOR_FRAME = bytes.fromhex(
    "0000002d010000290069000199000000000000000000000000000000140005746f70696300000009546f70696354657374"
)


def route_request(serialize_type: int) -> wr.RemotingCommand:
    return wr.RemotingCommand(
        code=105, language=wr.LANGUAGE_JAVA, version=409, opaque=0, flag=0,
        ext_fields={"topic": "TopicTest"}, serialize_type=serialize_type,
    )


def test_appendix_c_json_frame_exact():
    """GET_ROUTEINFO_BY_TOPIC as JSON encodes to the 139-byte vector (131-byte header) on both paths,
    and decodes back to the same command."""
    assert len(JSON_VECTOR_HEADER) == 131
    assert len(JSON_VECTOR_FRAME) == 139
    cmd = route_request(wr.SERIALIZE_JSON)
    assert wr.encode_frame(cmd) == JSON_VECTOR_FRAME
    assert wr.encode_frame_reference(cmd) == JSON_VECTOR_FRAME
    assert wr.decode_frame(JSON_VECTOR_FRAME) == cmd
    assert wr.decode_frame_payload_reference(JSON_VECTOR_FRAME[4:]) == cmd


def test_appendix_c_binary_frame_exact():
    """The same request in the ROCKETMQ binary header encodes to the 49-byte vector on both paths and
    decodes back; the construct declaration parses the header into the spec's field split."""
    assert len(BINARY_VECTOR_FRAME) == 49
    cmd = route_request(wr.SERIALIZE_ROCKETMQ)
    assert wr.encode_frame(cmd) == BINARY_VECTOR_FRAME
    assert wr.encode_frame_reference(cmd) == BINARY_VECTOR_FRAME
    assert wr.decode_frame(BINARY_VECTOR_FRAME) == cmd
    frame = wr.Frame.parse(BINARY_VECTOR_FRAME)
    assert (frame.total_length, frame.serialize_type, frame.header_length) == (45, 1, 41)
    header = wr.RocketMQHeader.parse(frame.header)
    assert (header.code, header.language, header.version, header.opaque, header.flag, header.remark) == (105, 0, 409, 0, 0, "")
    assert [(e.key, e.value) for e in header.ext_fields] == [("topic", "TopicTest")]


def test_appendix_c_body_crc():
    """BODYCRC of 'Hello RocketMQ' is 1774740973 (zlib CRC-32 with the top bit cleared)."""
    assert wcl.body_crc32(b"Hello RocketMQ") == 1774740973
    assert zlib.crc32(b"Hello RocketMQ") & 0x7FFFFFFF == 1774740973


def test_appendix_c_hashcodes():
    """Java String.hashCode of TagA/TagB is 2598919/2598920, and tagsCode equals it."""
    assert wcq.java_string_hashcode("TagA") == 2598919
    assert wcq.java_string_hashcode("TagB") == 2598920
    assert wcq.tags_code("TagA") == 2598919


def test_appendix_c_offset_msg_id():
    """offsetMsgId of 192.168.0.10:10911 at offset 123456 is C0A8000A00002A9F000000000001E240, and it
    decodes back to the same triple."""
    assert wmsgid.offset_msg_id("192.168.0.10", 10911, 123456) == "C0A8000A00002A9F000000000001E240"
    assert wmsgid.decode_offset_msg_id("C0A8000A00002A9F000000000001E240") == ("192.168.0.10", 10911, 123456)


def test_appendix_c_magic_codes():
    """The magic constants equal the spec's Java ints when read as signed 32-bit values."""
    assert struct.unpack(">i", struct.pack(">I", wcl.MESSAGE_MAGIC_CODE))[0] == -626843481
    assert struct.unpack(">i", struct.pack(">I", wcl.BLANK_MAGIC_CODE))[0] == -875286124


# ==================================================================================================
# errors


def test_error_hierarchy():
    """Every wire error is a WireError (and a ValueError); a truncated frame is both a FrameError and a
    TruncatedError, so callers can catch by kind or by place."""
    for cls in (TruncatedError, BadMagicError, SizeMismatchError, CrcMismatchError, MalformedError, FrameError, EncodeError):
        assert issubclass(cls, WireError) and issubclass(cls, ValueError)
    assert issubclass(FrameTruncatedError, FrameError) and issubclass(FrameTruncatedError, TruncatedError)
    assert set(werr.__all__) >= {"WireError", "FrameError"}


# ==================================================================================================
# commitlog

SAMPLE_FIELDS = dict(
    queue_id=3,
    flag=7,
    queue_offset=11,
    physical_offset=4096,
    sys_flag=0,
    born_timestamp_ms=1700000000000,
    born_host="10.0.0.1",
    born_port=5555,
    store_timestamp_ms=1700000000123,
    store_host="192.168.0.10",
    store_port=10911,
    reconsume_times=2,
    prepared_transaction_offset=0,
    body=b"Hello RocketMQ",
    topic="TopicTest",
    properties=b"TAGS\x01TagA",
)


def test_record_layout_matches_spec_table():
    """build_record writes the spec 3.2 table byte for byte (checked against an independent struct.pack of
    every field): fixed positions, TOTALSIZE = 91 + B + T + P, BODYCRC of the body."""
    rec = wcl.build_record(**SAMPLE_FIELDS)
    expected = (
        struct.pack(">iIiiiqqiq", 123, 0xDAA320A7, 1774740973, 3, 7, 11, 4096, 0, 1700000000000)
        + bytes([10, 0, 0, 1]) + struct.pack(">i", 5555)
        + struct.pack(">q", 1700000000123)
        + bytes([192, 168, 0, 10]) + struct.pack(">i", 10911)
        + struct.pack(">iqi", 2, 0, 14) + b"Hello RocketMQ"
        + struct.pack(">b", 9) + b"TopicTest"
        + struct.pack(">h", 9) + b"TAGS\x01TagA"
    )
    assert rec == expected
    assert len(rec) == 91 + 14 + 9 + 9 == wcl.record_size(14, 9, 9)
    assert struct.unpack_from(">q", rec, wcl.POS_QUEUE_OFFSET)[0] == 11
    assert struct.unpack_from(">q", rec, wcl.POS_PHYSICAL_OFFSET)[0] == 4096
    assert struct.unpack_from(">i", rec, wcl.POS_SYS_FLAG)[0] == 0
    assert struct.unpack_from(">q", rec, wcl.store_timestamp_pos(0))[0] == 1700000000123
    assert wcl.store_timestamp_pos(0) == 56 and wcl.store_timestamp_pos(wcl.BORNHOST_V6) == 68


def test_record_parse_of_sample():
    """parse_record returns every field with the documented names and representations (hosts as text,
    topic str, body/properties bytes), equal to the construct declaration's parse."""
    rec = wcl.build_record(**SAMPLE_FIELDS)
    parsed = wcl.parse_record(rec)
    for key, value in SAMPLE_FIELDS.items():
        assert parsed[key] == value, key
    assert parsed.total_size == 123 and parsed.magic == wcl.MESSAGE_MAGIC_CODE and parsed.body_crc == 1774740973
    assert parsed == wcl.CommitLogRecord.parse(rec)
    assert wcl.record_crc_ok(parsed)


def test_record_size_formula():
    """record_size is 91 + B + T + P for IPv4/IPv4 and adds 12 bytes per IPv6 host, like calMsgLength."""
    assert wcl.RECORD_SIZE_MIN == 91 == wcl.record_size(0, 0, 0)
    assert wcl.record_size(10, 5, 3) == 109
    assert wcl.record_size(0, 0, 0, wcl.BORNHOST_V6) == 103
    assert wcl.record_size(0, 0, 0, wcl.STOREHOST_V6) == 103
    assert wcl.record_size(0, 0, 0, wcl.BORNHOST_V6 | wcl.STOREHOST_V6) == 115


def test_sysflag_constants():
    """The sysFlag bit values are the spec 3.3 ones."""
    assert (wcl.COMPRESSED, wcl.MULTI_TAGS, wcl.TRANSACTION_PREPARED, wcl.COMMIT, wcl.ROLLBACK) == (0x1, 0x2, 0x4, 0x8, 0xC)
    assert (wcl.BORNHOST_V6, wcl.STOREHOST_V6, wcl.END_FILE_MIN_BLANK_LENGTH) == (0x10, 0x20, 8)
    assert wcl.ROLLBACK & wcl.TRANSACTION_MASK == wcl.TRANSACTION_ROLLBACK


def random_record_fields(rng: random.Random) -> dict:
    def host() -> str:
        if rng.random() < 0.3:
            return str(ipaddress.IPv6Address(rng.getrandbits(128)))
        return ".".join(str(rng.randint(0, 255)) for _ in range(4))

    topic = rand_text(rng, 1, 30)
    while len(topic.encode()) > wcl.TOPIC_SIZE_MAX:
        topic = topic[:-1]
    props = {rand_text(rng, 1, 8, "abcKEY中"): rand_text(rng, 1, 12) for _ in range(rng.randint(0, 4))}
    return dict(
        queue_id=rng.randint(-(1 << 31), (1 << 31) - 1),
        flag=rng.randint(-(1 << 31), (1 << 31) - 1),
        queue_offset=rng.randint(0, 1 << 40),
        physical_offset=rng.randint(0, (1 << 63) - 1),
        sys_flag=rng.randint(0, 0x3FF) & ~(wcl.BORNHOST_V6 | wcl.STOREHOST_V6),
        born_timestamp_ms=rng.randint(0, 1 << 42),
        born_host=host(),
        born_port=rng.randint(0, 65535),
        store_timestamp_ms=rng.randint(0, 1 << 42),
        store_host=host(),
        store_port=rng.randint(0, 65535),
        reconsume_times=rng.randint(0, 16),
        prepared_transaction_offset=rng.randint(0, 1 << 40),
        body=rng.randbytes(rng.randint(0, 200)),
        topic=topic,
        properties=wprops.encode_properties(props),
    )


def expected_container(fields: dict) -> dict:
    sys_flag = fields["sys_flag"]
    if ":" in fields["born_host"]:
        sys_flag |= wcl.BORNHOST_V6
    if ":" in fields["store_host"]:
        sys_flag |= wcl.STOREHOST_V6
    out = dict(fields, sys_flag=sys_flag, magic=wcl.MESSAGE_MAGIC_CODE, body_crc=wcl.body_crc32(fields["body"]))
    out["total_size"] = wcl.record_size(len(fields["body"]), len(fields["topic"].encode()), len(fields["properties"]), sys_flag)
    return out


def test_record_fast_paths_equal_construct_declaration():
    """On 300 seeded random records (IPv4/IPv6 mixes, multibyte topics and properties), build_record equals
    CommitLogRecord.build, parse_record equals CommitLogRecord.parse, and parse(build(x)) == x."""
    rng = random.Random(SEED)
    for _ in range(300):
        fields = random_record_fields(rng)
        expected = expected_container(fields)
        fast = wcl.build_record(**fields)
        assert fast == wcl.CommitLogRecord.build(expected)
        assert len(fast) == expected["total_size"]
        parsed = wcl.parse_record(fast)
        assert parsed == expected
        assert parsed == wcl.CommitLogRecord.parse(fast)
        assert wcl.build_record(**parsed) == fast  # a parsed Container feeds straight back into the encoder


def test_record_ipv6_hosts_and_derived_flags():
    """IPv6 hosts take 16 bytes and set SYSFLAG 0x10/0x20; the encoder derives those bits from the host
    families, clearing bits a caller set for IPv4 hosts."""
    rec = wcl.build_record(**dict(SAMPLE_FIELDS, born_host="fe80::1", store_host="2001:db8::7"))
    parsed = wcl.parse_record(rec)
    assert parsed.sys_flag == wcl.BORNHOST_V6 | wcl.STOREHOST_V6
    assert (parsed.born_host, parsed.store_host) == ("fe80::1", "2001:db8::7")
    assert len(rec) == 123 + 24
    assert struct.unpack_from(">q", rec, wcl.store_timestamp_pos(parsed.sys_flag))[0] == 1700000000123
    rec4 = wcl.build_record(**dict(SAMPLE_FIELDS, sys_flag=wcl.BORNHOST_V6 | wcl.STOREHOST_V6 | wcl.MULTI_TAGS))
    assert wcl.parse_record(rec4).sys_flag == wcl.MULTI_TAGS and len(rec4) == 123
    packed = wcl.build_record(**dict(SAMPLE_FIELDS, born_host=bytes([10, 0, 0, 1]), store_host=ipaddress.ip_address("192.168.0.10")))
    assert packed == wcl.build_record(**SAMPLE_FIELDS)


def test_normalize_host():
    """normalize_host maps IPv4-mapped IPv6 to IPv4, drops zones and compresses IPv6 (what the broker applies
    to socket peers so records match Java's 8-byte IPv4 hosts)."""
    assert wcl.normalize_host("::ffff:10.1.2.3") == "10.1.2.3"
    assert wcl.normalize_host("fe80:0:0:0:0:0:0:1%eth0") == "fe80::1"
    assert wcl.normalize_host("127.0.0.1") == "127.0.0.1"
    with pytest.raises(EncodeError):
        wcl.normalize_host("not-an-ip")


def test_record_non_ascii_lengths_count_bytes():
    """TOPICLEN and PROPERTIESLEN count UTF-8 bytes, not characters, and multibyte text round-trips."""
    topic = "主题-ü😀"
    props = wprops.encode_properties({"键": "值", "TAGS": "标签"})
    rec = wcl.build_record(**dict(SAMPLE_FIELDS, topic=topic, properties=props))
    body_end = 84 + 4 + 14
    assert rec[body_end] == len(topic.encode("utf-8")) == 13 != len(topic)
    assert struct.unpack_from(">h", rec, body_end + 1 + 13)[0] == len(props) == 19
    parsed = wcl.parse_record(rec)
    assert parsed.topic == topic
    assert wprops.decode_properties(parsed.properties) == {"键": "值", "TAGS": "标签"}
    assert wcl.build_record(**dict(SAMPLE_FIELDS, properties={"a": "b"})) == wcl.build_record(**dict(SAMPLE_FIELDS, properties="a\x01b"))


def test_record_truncated_at_every_byte():
    """Every proper prefix of a valid record (alone, or at a non-zero offset in a larger buffer) raises
    TruncatedError, never anything else."""
    rec = wcl.build_record(**SAMPLE_FIELDS)
    for cut in range(len(rec)):
        with pytest.raises(TruncatedError):
            wcl.parse_record(rec[:cut])
        with pytest.raises(TruncatedError):
            wcl.parse_record(b"\x00" * 5 + rec[:cut], 5)
    assert wcl.parse_record(b"\x00" * 5 + rec, 5).body == b"Hello RocketMQ"


def patched(rec: bytes, pos: int, fmt: str, value: int) -> bytes:
    out = bytearray(rec)
    struct.pack_into(fmt, out, pos, value)
    return bytes(out)


def test_record_bad_magic():
    """A wrong MAGICCODE (including BLANK's and the zeroes of a preallocated file) raises BadMagicError
    carrying the magic read."""
    rec = wcl.build_record(**SAMPLE_FIELDS)
    with pytest.raises(BadMagicError) as info:
        wcl.parse_record(patched(rec, 4, ">I", 0xDAA320AB))
    assert info.value.magic == 0xDAA320AB
    with pytest.raises(BadMagicError) as info:
        wcl.parse_record(wcl.build_blank(200) + bytes(192))
    assert info.value.magic == wcl.BLANK_MAGIC_CODE
    with pytest.raises(BadMagicError):
        wcl.parse_record(bytes(200))


def test_record_size_mismatches():
    """TOTALSIZE that disagrees with the recomputed length, or a length field that is negative or runs past
    TOTALSIZE, raises SizeMismatchError."""
    rec = wcl.build_record(**SAMPLE_FIELDS)
    body_len_pos = 84
    topic_len_pos = 84 + 4 + 14
    props_len_pos = topic_len_pos + 1 + 9
    cases = [
        patched(rec, 0, ">i", len(rec) + 1) + b"\x00",  # one byte of slack inside TOTALSIZE
        patched(rec, 0, ">i", len(rec) - 1),  # properties run past TOTALSIZE
        patched(rec, 0, ">i", 90),  # below the minimum
        patched(rec, 0, ">i", -5),
        patched(rec, body_len_pos, ">i", -1),
        patched(rec, body_len_pos, ">i", 1 << 30),
        patched(rec, body_len_pos, ">i", 13),  # shorter body: the rest no longer adds up
        patched(rec, topic_len_pos, ">b", -1),
        patched(rec, topic_len_pos, ">b", 127),
        patched(rec, props_len_pos, ">h", -1),
        patched(rec, props_len_pos, ">h", 10),
        patched(rec, props_len_pos, ">h", 8),
        patched(rec, wcl.POS_SYS_FLAG, ">i", wcl.BORNHOST_V6),  # host size changes, lengths no longer fit
    ]
    for bad in cases:
        with pytest.raises(SizeMismatchError):
            wcl.parse_record(bad)
        with pytest.raises(Exception):
            wcl.CommitLogRecord.parse(bad)  # the declaration rejects them too


def test_record_crc_and_malformed_topic():
    """A body bit flip keeps the record parseable but record_crc_ok is False and check_crc=True raises
    CrcMismatchError; a topic that is not UTF-8 raises MalformedError."""
    rec = bytearray(wcl.build_record(**SAMPLE_FIELDS))
    rec[88] ^= 0x01
    parsed = wcl.parse_record(rec)
    assert not wcl.record_crc_ok(parsed)
    with pytest.raises(CrcMismatchError):
        wcl.parse_record(rec, check_crc=True)
    assert wcl.parse_record(wcl.build_record(**SAMPLE_FIELDS), check_crc=True).topic == "TopicTest"
    bad_topic = bytearray(wcl.build_record(**SAMPLE_FIELDS))
    bad_topic[84 + 4 + 14 + 1] = 0xFF
    with pytest.raises(MalformedError):
        wcl.parse_record(bad_topic)


def test_record_garbage_and_bit_flips_raise_only_wire_errors():
    """Seeded random garbage and single-bit flips of valid records either parse or raise a WireError subclass;
    no struct.error, IndexError or UnicodeDecodeError escapes."""
    rng = random.Random(SEED + 1)
    for _ in range(300):
        junk = rng.randbytes(rng.randint(0, 300))
        if rng.random() < 0.5 and len(junk) >= 8:
            junk = struct.pack(">iI", rng.randint(0, 320), wcl.MESSAGE_MAGIC_CODE) + junk[8:]
        try:
            wcl.parse_record(junk, check_crc=True)
        except WireError:
            pass
    rec = wcl.build_record(**SAMPLE_FIELDS)
    for bit in range(len(rec) * 8):
        flipped = bytearray(rec)
        flipped[bit // 8] ^= 1 << (bit % 8)
        try:
            wcl.parse_record(flipped, check_crc=True)
        except WireError:
            pass


def test_record_encode_errors():
    """The encoder refuses a topic over 127 bytes, properties over 32767 bytes, out-of-range integers and
    ports, and unparsable hosts, with EncodeError."""
    with pytest.raises(EncodeError):
        wcl.build_record(**dict(SAMPLE_FIELDS, topic="中" * 43))  # 129 bytes, 43 characters
    wcl.build_record(**dict(SAMPLE_FIELDS, topic="t" * 127))
    with pytest.raises(EncodeError):
        wcl.build_record(**dict(SAMPLE_FIELDS, properties=b"x" * 32768))
    assert len(wcl.build_record(**dict(SAMPLE_FIELDS, properties=b"x" * 32767))) == 91 + 14 + 9 + 32767
    for bad in (dict(queue_id=1 << 31), dict(queue_offset=1 << 63), dict(born_port=70000), dict(store_host="nope"), dict(born_host=b"\x01\x02")):
        with pytest.raises(EncodeError):
            wcl.build_record(**dict(SAMPLE_FIELDS, **bad))
    with pytest.raises(TypeError):
        wcl.build_record(**dict(SAMPLE_FIELDS, bogus=1))


def test_iter_records_and_blank():
    """iter_records walks back-to-back records (a PULL body) and reports a torn tail as TruncatedError;
    the BLANK filler builds/parses as 8 bytes equal to the BlankRecord declaration and peek_record
    tells the three cases apart."""
    recs = [wcl.build_record(**dict(SAMPLE_FIELDS, queue_offset=i, body=bytes([i]) * i)) for i in range(3)]
    body = b"".join(recs)
    assert [r.queue_offset for r in wcl.iter_records(body)] == [0, 1, 2]
    with pytest.raises(TruncatedError):
        list(wcl.iter_records(body[:-1]))
    blank = wcl.build_blank(1000)
    assert blank == wcl.BlankRecord.build(dict(remaining_size=1000)) == struct.pack(">iI", 1000, 0xCBD43194)
    assert wcl.BlankRecord.parse(blank).remaining_size == 1000
    assert wcl.parse_blank(blank) == 1000
    assert wcl.peek_record(blank) == (1000, wcl.BLANK_MAGIC_CODE)
    assert wcl.peek_record(recs[0]).magic == wcl.MESSAGE_MAGIC_CODE
    assert wcl.peek_record(bytes(8)) == (0, 0)
    with pytest.raises(TruncatedError):
        wcl.peek_record(bytes(7))
    with pytest.raises(BadMagicError):
        wcl.parse_blank(recs[0])
    with pytest.raises(SizeMismatchError):
        wcl.parse_blank(struct.pack(">iI", 7, wcl.BLANK_MAGIC_CODE))
    with pytest.raises(EncodeError):
        wcl.build_blank(7)


# ==================================================================================================
# batch


def random_batch(rng: random.Random) -> list[tuple[int, bytes, bytes]]:
    return [
        (
            rng.randint(-(1 << 31), (1 << 31) - 1),
            rng.randbytes(rng.randint(0, 100)),
            wprops.encode_properties({rand_text(rng, 1, 5, "abK中"): rand_text(rng, 1, 8) for _ in range(rng.randint(0, 3))}),
        )
        for _ in range(rng.randint(0, 6))
    ]


def test_batch_layout():
    """A batch record is TOTALSIZE | 0 | 0 | FLAG | BODYLEN | BODY | PROPSLEN(short) | PROPS, as
    MessageDecoder.encodeMessage writes it."""
    data = wbatch.build_batch([(5, b"abc", b"TAGS\x01x")])
    assert data == struct.pack(">iiiii", 22 + 3 + 6, 0, 0, 5, 3) + b"abc" + struct.pack(">h", 6) + b"TAGS\x01x"
    assert wbatch.parse_batch(data) == [(5, b"abc", b"TAGS\x01x")]
    assert wbatch.parse_batch(b"") == []


def test_batch_fast_paths_equal_construct_declaration():
    """On 200 seeded random batches, build_batch equals Batch.build, parse_batch equals Batch.parse, and
    parse_batch(build_batch(x)) == x with sizes 22 + B + P per record."""
    rng = random.Random(SEED + 2)
    for _ in range(200):
        items = random_batch(rng)
        data = wbatch.build_batch(items)
        assert data == wbatch.Batch.build([dict(flag=f, body=b, properties=p) for f, b, p in items])
        assert len(data) == sum(22 + len(b) + len(p) for _, b, p in items)
        assert wbatch.parse_batch(data) == items
        declared = wbatch.Batch.parse(data)
        assert [(r.flag, r.body, r.properties) for r in declared] == items
        assert all(r.magic == 0 and r.body_crc == 0 for r in declared)


def test_batch_truncated_at_every_byte():
    """Cutting a 3-record batch anywhere inside a record raises TruncatedError; cutting at a record boundary
    yields the records before it."""
    items = [(1, b"one", "a\x01b"), (2, b"", ""), (3, b"three" * 3, "中\x01文")]
    data = wbatch.build_batch(items)
    bounds = {0}
    pos = 0
    for _, body, props in items:
        pos += 22 + len(body) + len(props.encode())
        bounds.add(pos)
    for cut in range(len(data)):
        if cut in bounds:
            assert len(wbatch.parse_batch(data[:cut])) == sorted(bounds).index(cut)
        else:
            with pytest.raises(TruncatedError):
                wbatch.parse_batch(data[:cut])


def test_batch_size_mismatches():
    """TOTALSIZE below 22, differing from 22 + BODYLEN + PROPSLEN, or lengths that are negative or overrun
    TOTALSIZE raise SizeMismatchError naming the record; magic/CRC values are not judged."""
    one = wbatch.build_batch([(1, b"body", b"k\x01v")])
    two = one + one
    cases = [
        patched(one, 0, ">i", len(one) + 1) + b"\x00",
        patched(one, 0, ">i", len(one) - 1) + b"\x00",
        patched(one, 0, ">i", 21),
        patched(one, 16, ">i", -1),
        patched(one, 16, ">i", 100),
        patched(one, 16, ">i", 3),
        patched(one, 24, ">h", -1),
        patched(one, 24, ">h", 4),
        one + patched(one, 16, ">i", -7),
    ]
    for bad in cases:
        with pytest.raises(SizeMismatchError):
            wbatch.parse_batch(bad)
    with pytest.raises(SizeMismatchError, match="batch record 1"):
        wbatch.parse_batch(cases[-1])
    assert wbatch.parse_batch(patched(patched(two, 4, ">i", 0x1234), 8, ">i", -9)) == [(1, b"body", b"k\x01v")] * 2


def test_batch_garbage_raises_only_wire_errors():
    """Random garbage given to parse_batch parses or raises a WireError subclass, nothing else."""
    rng = random.Random(SEED + 3)
    for _ in range(500):
        junk = rng.randbytes(rng.randint(0, 120))
        if len(junk) >= 4 and rng.random() < 0.6:
            junk = struct.pack(">i", rng.randint(0, len(junk) + 4)) + junk[4:]
        try:
            wbatch.parse_batch(junk)
        except WireError:
            pass


def test_batch_encode_errors():
    """build_batch refuses properties over 32767 bytes and flags outside int32."""
    with pytest.raises(EncodeError):
        wbatch.build_batch([(0, b"", b"x" * 32768)])
    with pytest.raises(EncodeError):
        wbatch.build_batch([(1 << 31, b"", b"")])


# ==================================================================================================
# properties


def test_properties_encode():
    """Encoding joins name 0x01 value with 0x02, in order, with no trailing separator, skipping None values."""
    assert wprops.properties_to_string({"KEYS": "k1 k2", "TAGS": "TagA", "X": None}) == "KEYS\x01k1 k2\x02TAGS\x01TagA"
    assert wprops.properties_to_string({}) == ""
    assert wprops.encode_properties({"键": "值"}) == "键\x01值".encode("utf-8") and len(wprops.encode_properties({"键": "值"})) == 7
    assert wprops.PROPERTIES_SIZE_MAX == 32767


@pytest.mark.parametrize(
    "text, expected",
    [
        ("a\x01b", {"a": "b"}),
        ("", {}),
        ("\x01b", {}),  # 0x01 first: empty name dropped
        ("a\x01", {}),  # 0x01 last: empty value dropped
        ("ab", {}),  # no separator at all
        ("a\x01b\x02", {"a": "b"}),  # a trailing 0x02 is tolerated
        ("a\x01b\x02\x02c\x01d", {"a": "b", "c": "d"}),  # empty segment skipped
        ("a\x01b\x01c", {"a": "b\x01c"}),  # the value runs to the segment end
        ("k\x01v1\x02k\x01v2", {"k": "v2"}),  # later duplicate wins
        ("ab\x02c\x01d", {"c": "d"}),  # a 0x01 found only in a later segment does not count
        ("\x01\x01x\x02y\x01z", {"y": "z"}),  # first 0x01 is first: dropped even though another follows
        ("x\x01\x01", {"x": "\x01"}),
    ],
)
def test_properties_decode_java_rules(text, expected):
    """string_to_properties follows 4.9.8 string2messageProperties exactly (the case named in the comment)."""
    assert wprops.string_to_properties(text) == expected
    assert wprops.decode_properties(text.encode("utf-8")) == expected


def test_properties_round_trip_and_errors():
    """Non-empty names/values (multibyte, values containing 0x01) round-trip; separators that cannot
    round-trip are refused with EncodeError; invalid UTF-8 bytes decode with U+FFFD like Java."""
    rng = random.Random(SEED + 4)
    for _ in range(100):
        props = {rand_text(rng, 1, 6): rand_text(rng, 1, 10, ALPHABET + "\x01 ") for _ in range(rng.randint(0, 5))}
        assert wprops.decode_properties(wprops.encode_properties(props)) == props
    for bad in ({"": "v"}, {"a\x01": "v"}, {"a\x02": "v"}, {"a": "v\x02"}, {"a": 1}):
        with pytest.raises(EncodeError):
            wprops.properties_to_string(bad)
    with pytest.raises(EncodeError):
        wprops.encode_properties({"a": "\ud800"})
    assert wprops.decode_properties(b"TAGS\x01\xffA") == {"TAGS": "\ufffdA"}


# ==================================================================================================
# consumequeue


def test_cq_entry_layout_and_declaration():
    """A CQ entry is 20 bytes (long, int, long) and pack/unpack equal the ConsumeQueueEntry declaration;
    the filler is (0, 0x7FFFFFFF, 0); file constants are 300000 x 20."""
    rng = random.Random(SEED + 5)
    for _ in range(100):
        entry = (rng.randint(0, 1 << 62), rng.randint(1, (1 << 31) - 1), rng.randint(-(1 << 63), (1 << 63) - 1))
        data = wcq.pack_cq_entry(*entry)
        assert len(data) == wcq.CQ_ENTRY_SIZE == 20
        assert data == wcq.ConsumeQueueEntry.build(dict(zip(wcq.CqEntry._fields, entry)))
        assert wcq.unpack_cq_entry(b"xx" + data, 2) == entry
        declared = wcq.ConsumeQueueEntry.parse(data)
        assert (declared.commit_log_offset, declared.size, declared.tags_code) == entry
    assert wcq.FILLER_ENTRY == (0, 0x7FFFFFFF, 0)
    assert wcq.FILLER_ENTRY_BYTES == bytes(8) + b"\x7f\xff\xff\xff" + bytes(8)
    assert (wcq.CQ_ENTRIES_PER_FILE, wcq.CQ_FILE_SIZE) == (300000, 6000000)
    with pytest.raises(TruncatedError):
        wcq.unpack_cq_entry(bytes(19))
    with pytest.raises(EncodeError):
        wcq.pack_cq_entry(0, 1 << 31, 0)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("TagA", 2598919),
        ("TagB", 2598920),
        ("", 0),
        ("hello", 99162322),
        ("Aa", 2112),
        ("BB", 2112),
        ("polygenelubricants", -2147483648),  # wraps to Integer.MIN_VALUE
        ("😀", 31 * 0xD83D + 0xDE00),  # a surrogate pair counts as two UTF-16 code units
        ("é", 0xE9),
    ],
)
def test_java_string_hashcode(text, expected):
    """java_string_hashcode matches Java's String.hashCode (int32 wrap-around, UTF-16 code units)."""
    assert wcq.java_string_hashcode(text) == expected


def test_tags_code():
    """tagsCode is 0 without a tag, else the hashCode sign-extended to int64 (so a negative hash is stored as
    0xFFFFFFFF........); tags_code_of_properties reads TAGS from stored properties bytes."""
    assert wcq.tags_code(None) == 0 and wcq.tags_code("") == 0
    assert wcq.tags_code("polygenelubricants") == -2147483648
    assert wcq.pack_cq_entry(0, 1, wcq.tags_code("polygenelubricants"))[12:] == bytes.fromhex("FFFFFFFF80000000")
    assert wcq.tags_code_of_properties(b"KEYS\x01k\x02TAGS\x01TagA") == 2598919
    assert wcq.tags_code_of_properties(b"KEYS\x01k") == 0
    assert wcq.tags_code_of_properties("TAGS\x01") == 0


# ==================================================================================================
# checkpoint


def test_checkpoint_round_trip_and_min_timestamps():
    """The checkpoint is 4096 bytes with three big-endian longs first, equal to the Checkpoint declaration;
    min_timestamp_ms = max(0, min(physic, logics) - 3000) and the index variant also takes the index time."""
    data = wcp.build_checkpoint(10_000, 7_000, 5_000)
    assert len(data) == wcp.CHECKPOINT_FILE_SIZE == 4096
    assert data[:24] == struct.pack(">qqq", 10_000, 7_000, 5_000) and data[24:] == bytes(4072)
    assert data == wcp.Checkpoint.build(dict(physic_msg_timestamp_ms=10_000, logics_msg_timestamp_ms=7_000, index_msg_timestamp_ms=5_000))
    cp = wcp.parse_checkpoint(data)
    assert cp == (10_000, 7_000, 5_000)
    declared = wcp.Checkpoint.parse(data)
    assert wcp.min_timestamp_ms(cp) == wcp.min_timestamp_ms(declared) == 4_000
    assert wcp.min_timestamp_index_ms(cp) == 4_000
    assert wcp.min_timestamp_index_ms(wcp.CheckpointValues(10_000, 7_000, 1_000)) == 1_000
    assert wcp.min_timestamp_ms(wcp.CheckpointValues(1_000, 2_000, 0)) == 0
    with pytest.raises(TruncatedError):
        wcp.parse_checkpoint(data[:4095])
    with pytest.raises(EncodeError):
        wcp.build_checkpoint(1 << 63, 0, 0)


# ==================================================================================================
# msgid


def test_offset_msg_id_ipv6_and_errors():
    """IPv6 store hosts give 56-character ids that round-trip; decoding accepts lowercase; bad lengths,
    non-hex text, bad ports and negative offsets raise the matching WireError."""
    msg_id = wmsgid.offset_msg_id("2001:db8::1", 10911, 1 << 40)
    assert len(msg_id) == 56 and msg_id == msg_id.upper()
    assert wmsgid.decode_offset_msg_id(msg_id) == ("2001:db8::1", 10911, 1 << 40)
    assert wmsgid.decode_offset_msg_id("c0a8000a00002a9f000000000001e240") == ("192.168.0.10", 10911, 123456)
    for bad in ("", "C0A8000A00002A9F000000000001E24", "Z0A8000A00002A9F000000000001E240"):
        with pytest.raises(MalformedError):
            wmsgid.decode_offset_msg_id(bad)
    for args in (("1.2.3.4", 65536, 0), ("1.2.3.4", 1, -1), ("host", 1, 0)):
        with pytest.raises(EncodeError):
            wmsgid.offset_msg_id(*args)


# ==================================================================================================
# ha


def test_ha_frames():
    """The slave report is one 8-byte long and the master header 8+4 bytes, equal to the declarations; the
    master acts on the last complete report; negative or oversized values and short buffers are errors."""
    assert wha.pack_slave_report(123456) == struct.pack(">q", 123456) == wha.HaSlaveReport.build(dict(max_phy_offset=123456))
    assert wha.unpack_slave_report(wha.pack_slave_report(7)) == 7
    header = wha.pack_ha_frame_header(1 << 30, 32768)
    assert header == struct.pack(">qi", 1 << 30, 32768) == wha.HaFrameHeader.build(dict(master_phy_offset=1 << 30, body_size=32768))
    assert wha.unpack_ha_frame_header(header) == (1 << 30, 32768)
    assert wha.HaFrameHeader.parse(header).body_size == 32768
    assert (wha.HA_SLAVE_REPORT_SIZE, wha.HA_FRAME_HEADER_SIZE, wha.HA_TRANSFER_BATCH_SIZE) == (8, 12, 32768)
    stream = wha.pack_slave_report(10) + wha.pack_slave_report(20) + b"\x00\x00\x00"
    assert wha.last_slave_report(stream) == (20, 16)
    assert wha.last_slave_report(b"\x00" * 7) == (None, 0)
    with pytest.raises(TruncatedError):
        wha.unpack_slave_report(bytes(7))
    with pytest.raises(TruncatedError):
        wha.unpack_ha_frame_header(bytes(11))
    with pytest.raises(SizeMismatchError):
        wha.unpack_slave_report(struct.pack(">q", -1))
    with pytest.raises(SizeMismatchError):
        wha.unpack_ha_frame_header(struct.pack(">qi", 0, -1))
    with pytest.raises(SizeMismatchError):
        wha.unpack_ha_frame_header(header, body_size_max=wha.HA_TRANSFER_BATCH_SIZE - 1)
    with pytest.raises(EncodeError):
        wha.pack_slave_report(-1)


def test_ha_take_back_frames():
    """Take-back (ours): the master's request is a frame header with BODYSIZE -1 (what the C
    receive reads as 0xFFFFFFFF), the slave's mark an 8-byte -1; a word read while the master
    waits is a report or that mark, any other negative an error; ordinary reports still refuse -1."""
    req = wha.pack_take_back_request(4096)
    assert req == struct.pack(">qi", 4096, -1) == wha.HaFrameHeader.build(dict(master_phy_offset=4096, body_size=-1))
    assert struct.unpack(">qI", req)[1] == wha.TAKE_BACK_SIZE & 0xFFFFFFFF == 0xFFFFFFFF
    assert wha.pack_take_back_mark() == struct.pack(">q", -1)
    assert wha.unpack_slave_word(wha.pack_take_back_mark()) == wha.TAKE_BACK_MARK
    assert wha.unpack_slave_word(wha.pack_slave_report(99)) == 99
    with pytest.raises(SizeMismatchError):
        wha.unpack_slave_word(struct.pack(">q", -2))
    with pytest.raises(SizeMismatchError):
        wha.unpack_slave_report(wha.pack_take_back_mark())
    with pytest.raises(EncodeError):
        wha.pack_take_back_request(-1)


# ==================================================================================================
# remoting


def random_command(rng: random.Random) -> wr.RemotingCommand:
    serialize_type = rng.choice((wr.SERIALIZE_JSON, wr.SERIALIZE_ROCKETMQ))
    small = serialize_type == wr.SERIALIZE_ROCKETMQ
    i16 = (-(1 << 15), (1 << 15) - 1)
    i32 = (-(1 << 31), (1 << 31) - 1)
    ext = None
    if rng.random() < 0.8:
        ext = {rand_text(rng, 0 if small else 1, 10): rand_text(rng, 0, 30, ALPHABET + "\x01\x02\"\\/ \n") for _ in range(rng.randint(0, 6))}
    return wr.RemotingCommand(
        code=rng.randint(*(i16 if small else i32)),
        language=rng.choice((rng.randint(0, 12), rng.randint(0, 255))),
        version=rng.randint(*(i16 if small else i32)),
        opaque=rng.randint(*i32),
        flag=rng.randint(*i32),
        remark=None if rng.random() < 0.4 else rand_text(rng, 0, 40, ALPHABET + "\"\\\n"),
        ext_fields=ext,
        body=rng.randbytes(rng.randint(0, 64)),
        serialize_type=serialize_type,
    )


def normalized(cmd: wr.RemotingCommand) -> wr.RemotingCommand:
    """What decoding gives back: the binary format maps remark "" to None and an empty ext map to None."""
    if cmd.serialize_type != wr.SERIALIZE_ROCKETMQ:
        return cmd
    return wr.RemotingCommand(
        code=cmd.code, language=cmd.language, version=cmd.version, opaque=cmd.opaque, flag=cmd.flag,
        remark=cmd.remark or None, ext_fields=cmd.ext_fields or None, body=cmd.body, serialize_type=cmd.serialize_type,
    )


def test_remoting_fast_path_equals_construct_declaration():
    """On 400 seeded random commands (both serialize types, multibyte text, control characters, empty maps),
    encode_frame equals encode_frame_reference byte for byte, both decoders give the same command, and
    that command equals the original (after the binary format's ""/{} -> None normalisation)."""
    rng = random.Random(SEED + 6)
    for _ in range(400):
        cmd = random_command(rng)
        frame = wr.encode_frame(cmd)
        assert frame == wr.encode_frame_reference(cmd)
        assert wr.frame_payload_size(frame) == len(frame) - 4
        fast = wr.decode_frame_payload(frame[4:])
        assert fast == wr.decode_frame_payload_reference(frame[4:])
        assert fast == normalized(cmd)
        assert wr.decode_frame(frame) == fast
        parsed = wr.Frame.parse(frame)
        assert parsed.serialize_type == cmd.serialize_type and parsed.body == cmd.body


def test_remoting_mutated_frames_fast_and_reference_agree():
    """On seeded random byte mutations of valid frames, the fast decoder and the construct-based reference
    either both raise FrameError or both return the same command: the fast path adds no leniency."""
    rng = random.Random(SEED + 7)
    for _ in range(600):
        cmd = random_command(rng)
        payload = bytearray(wr.encode_frame(cmd)[4:])
        for _ in range(rng.randint(1, 3)):
            pos = rng.randrange(4, len(payload)) if len(payload) > 4 and rng.random() < 0.8 else rng.randrange(len(payload))
            payload[pos] = rng.randrange(256) if rng.random() < 0.7 else payload[pos] ^ 0x80
        if rng.random() < 0.3:
            payload = payload[: rng.randrange(len(payload) + 1)]
        outcomes = []
        for decode in (wr.decode_frame_payload, wr.decode_frame_payload_reference):
            try:
                outcomes.append(decode(bytes(payload)))
            except FrameError:
                outcomes.append(FrameError)
        assert outcomes[0] == outcomes[1], bytes(payload).hex()


def test_json_header_key_order_and_options():
    """JSON keys come in fastjson's alphabetical order, remark only when not None, extFields only when not
    None ({} stays {}), ext values always strings (ints and booleans stringified, None dropped)."""
    cmd = wr.RemotingCommand(code=1, language=wr.LANGUAGE_CPP, version=409, opaque=7, flag=1, remark="x", ext_fields={"a": "1"})
    assert wr.encode_json_header(cmd) == (
        b'{"code":1,"extFields":{"a":"1"},"flag":1,"language":"CPP","opaque":7,"remark":"x",'
        b'"serializeTypeCurrentRPC":"JSON","version":409}'
    )
    assert wr.encode_json_header(wr.RemotingCommand(code=2)) == (
        b'{"code":2,"flag":0,"language":"JAVA","opaque":0,"serializeTypeCurrentRPC":"JSON","version":0}'
    )
    assert b'"extFields":{}' in wr.encode_json_header(wr.RemotingCommand(ext_fields={}))
    typed = wr.encode_json_header(wr.RemotingCommand(ext_fields={"d": 4, "k": True, "n": None, "s": "v"}))
    assert b'"extFields":{"d":"4","k":"true","s":"v"}' in typed
    assert b'"language":200' in wr.encode_json_header(wr.RemotingCommand(language=200))


def test_non_ascii_remark_counts_bytes():
    """Multibyte remarks and ext values go out as raw UTF-8 (not \\u escapes) in JSON, the binary REMARKLEN and
    HEADERLENGTH count bytes, and both formats round-trip them."""
    remark = "失败: ü 😀"
    json_cmd = wr.RemotingCommand(code=1, remark=remark, ext_fields={"键": "值"})
    frame = wr.encode_frame(json_cmd)
    assert remark.encode("utf-8") in frame and "键".encode("utf-8") in frame
    header_length = struct.unpack_from(">I", frame, 4)[0] & 0xFFFFFF
    assert header_length == len(frame) - 8 == len(wr.encode_json_header(json_cmd))
    assert wr.decode_frame(frame) == json_cmd
    bin_cmd = wr.RemotingCommand(code=1, remark=remark, ext_fields={"键": "值"}, serialize_type=wr.SERIALIZE_ROCKETMQ)
    header = wr.encode_rocketmq_header(bin_cmd)
    assert struct.unpack_from(">i", header, 13)[0] == len(remark.encode("utf-8")) == 15 != len(remark)
    assert wr.decode_frame(wr.encode_frame(bin_cmd)) == bin_cmd


@pytest.mark.parametrize(
    "header, expected",
    [
        # The C++ client sends numbers for int header fields; booleans become 'true'/'false'; nulls are dropped.
        (
            b'{"code":310,"extFields":{"a":"g","d":4,"e":0,"k":false,"m":true,"x":1.5,"n":null},"flag":0,"language":"CPP","opaque":1,"version":333}',
            wr.RemotingCommand(code=310, language=wr.LANGUAGE_CPP, version=333, opaque=1,
                               ext_fields={"a": "g", "d": "4", "e": "0", "k": "false", "m": "true", "x": "1.5"}),
        ),
        # language as an ordinal, unknown keys ignored, serializeTypeCurrentRPC ignored.
        (
            b'{"code":10,"language":3,"opaque":-5,"flag":2,"version":1,"zzz":[1,2],"serializeTypeCurrentRPC":"ROCKETMQ"}',
            wr.RemotingCommand(code=10, language=wr.LANGUAGE_PYTHON, version=1, opaque=-5, flag=2),
        ),
        # everything missing: defaults (language JAVA).
        (b"{}", wr.RemotingCommand()),
        # an unknown language name maps to OTHER; numeric strings for ints; remark as a number is stringified.
        (
            b'{"code":"105","language":"COBOL","remark":42,"extFields":null}',
            wr.RemotingCommand(code=105, language=wr.LANGUAGE_OTHER, remark="42"),
        ),
        # extra whitespace, an explicit null remark, integral floats, an empty extFields object.
        (
            b' { "code" : 1.0 , "remark" : null , "extFields" : { } } ',
            wr.RemotingCommand(code=1, ext_fields={}),
        ),
        # nested extFields values are kept as compact JSON text.
        (b'{"extFields":{"o":{"a":[1,"b"]}}}', wr.RemotingCommand(ext_fields={"o": '{"a":[1,"b"]}'})),
    ],
)
def test_json_header_lenient_decode(header, expected):
    """JSON headers are decoded as leniently as fastjson does (the case named in the comment)."""
    assert wr.decode_json_header(header) == expected
    payload = struct.pack(">I", len(header)) + header
    assert wr.decode_frame_payload(payload) == expected
    assert wr.decode_frame_payload_reference(payload) == expected


@pytest.mark.parametrize(
    "header",
    [
        b"\xff\xfe{}",  # not UTF-8
        b'{"code":1',  # truncated JSON
        b"not json",
        b"[1,2]",  # not an object
        b"1",
        b'"text"',
        b"null",
        b"",
        b'{"extFields":[1]}',
        b'{"extFields":"a=b"}',
        b'{"code":true}',
        b'{"code":"abc"}',
        b'{"code":2147483648}',
        b'{"opaque":1.5}',
        b'{"flag":{"a":1}}',
        b'{"language":[1]}',
        b"[" * 100000 + b"]" * 100000,  # nesting deep enough to exhaust the recursion limit
    ],
)
def test_json_header_malformed(header):
    """Malformed JSON headers raise FrameError (bad UTF-8, bad JSON, non-object, bad field types)."""
    with pytest.raises(FrameError):
        wr.decode_frame_payload(struct.pack(">I", len(header)) + header)


def test_frame_truncated_at_every_byte():
    """Every proper prefix of a whole frame (JSON and binary, with a body) raises FrameTruncatedError from
    decode_frame; every payload cut inside the header raises FrameTruncatedError from decode_frame_payload."""
    for serialize_type in (wr.SERIALIZE_JSON, wr.SERIALIZE_ROCKETMQ):
        cmd = wr.RemotingCommand(code=11, remark="r", ext_fields={"k": "v"}, body=b"BODY", serialize_type=serialize_type)
        frame = wr.encode_frame(cmd)
        for cut in range(len(frame)):
            with pytest.raises(FrameTruncatedError):
                wr.decode_frame(frame[:cut])
        payload = frame[4:]
        header_end = 4 + (struct.unpack_from(">I", payload)[0] & 0xFFFFFF)
        for cut in range(header_end):
            with pytest.raises(FrameTruncatedError):
                wr.decode_frame_payload(payload[:cut])
            with pytest.raises(FrameError):
                wr.decode_frame_payload_reference(payload[:cut])
        for cut in range(header_end, len(payload) + 1):  # a shorter body is still a well-formed payload
            assert wr.decode_frame_payload(payload[:cut]).body == b"BODY"[: cut - header_end]
        with pytest.raises(FrameError):
            wr.decode_frame(frame + b"x")  # longer than its prefix says


def test_frame_header_errors():
    """Header length past the end, unknown serialize types and oversize frames raise FrameError."""
    with pytest.raises(FrameTruncatedError):
        wr.decode_frame_payload(struct.pack(">I", 5) + b"{}")
    for serialize_type in (2, 0x7F, 0xFF):
        with pytest.raises(FrameError, match="serialize type"):
            wr.decode_frame_payload(struct.pack(">I", (serialize_type << 24) | 2) + b"{}")
        with pytest.raises(FrameError):
            wr.decode_frame_payload_reference(struct.pack(">I", (serialize_type << 24) | 2) + b"{}")
    assert wr.frame_payload_size(struct.pack(">I", wr.FRAME_SIZE_MAX - 4)) == wr.FRAME_SIZE_MAX - 4
    with pytest.raises(FrameError):
        wr.frame_payload_size(struct.pack(">I", wr.FRAME_SIZE_MAX - 3))
    with pytest.raises(FrameError):
        wr.frame_payload_size(b"\xff\xff\xff\xff")
    with pytest.raises(FrameTruncatedError):
        wr.frame_payload_size(b"\x00\x00")
    with pytest.raises(FrameError):
        wr.decode_frame_payload(bytes(wr.FRAME_SIZE_MAX - 3))


def binary_header(remark: bytes = b"", ext: bytes = b"", *, remark_len: int | None = None, ext_len: int | None = None) -> bytes:
    fixed = struct.pack(">hBhii", 105, 0, 409, 0, 0)
    return (
        fixed
        + struct.pack(">i", len(remark) if remark_len is None else remark_len) + remark
        + struct.pack(">i", len(ext) if ext_len is None else ext_len) + ext
    )


def entry(key: bytes, value: bytes, *, key_len: int | None = None, value_len: int | None = None) -> bytes:
    return (
        struct.pack(">h", len(key) if key_len is None else key_len) + key
        + struct.pack(">i", len(value) if value_len is None else value_len) + value
    )


@pytest.mark.parametrize(
    "header",
    [
        binary_header()[:20],  # shorter than the fixed part
        binary_header(b"abc", remark_len=100),  # remark past the header
        binary_header(b"abc", remark_len=-1),
        binary_header(b"abc", remark_len=4),  # remark eats the ext length
        binary_header(ext=entry(b"k", b"v"), ext_len=100),  # ext block past the header
        binary_header(ext=entry(b"k", b"v"), ext_len=-1),
        binary_header(ext=entry(b"k", b"v") + b"\x00"),  # a partial entry at the end of the block
        binary_header(ext=entry(b"k", b"v", key_len=50)),
        binary_header(ext=entry(b"k", b"v", key_len=-2)),
        binary_header(ext=entry(b"k", b"v", value_len=50)),
        binary_header(ext=entry(b"k", b"v", value_len=-1)),
        binary_header(ext=entry(b"k", b"vv"), ext_len=8),  # ext block ends inside a value
        binary_header(b"\xc3\x28"),  # bad UTF-8 in remark
        binary_header(ext=entry(b"\xff", b"v")),
        binary_header(ext=entry(b"k", b"\xed\xa0\x80")),  # an encoded surrogate is not UTF-8
    ],
)
def test_binary_header_malformed(header):
    """Every binary header length is checked before use: negative lengths or lengths past the header or the
    ext block, and bad UTF-8, raise FrameError on the fast path and the reference alike."""
    payload = struct.pack(">I", (1 << 24) | len(header)) + header
    with pytest.raises(FrameError):
        wr.decode_frame_payload(payload)
    with pytest.raises(FrameError):
        wr.decode_frame_payload_reference(payload)


def test_binary_header_java_decode_quirks():
    """As in Java: REMARKLEN 0 gives remark None, EXTLEN 0 gives ext_fields None, empty keys and values stay
    empty strings inside a non-empty block, and bytes after the ext block are ignored."""
    decoded = wr.decode_rocketmq_header(binary_header())
    assert decoded.remark is None and decoded.ext_fields is None
    decoded = wr.decode_rocketmq_header(binary_header(ext=entry(b"", b"")) + b"trailing")
    assert decoded.ext_fields == {"": ""}
    payload = struct.pack(">I", (1 << 24) | len(binary_header()) + 3) + binary_header() + b"xyz"
    assert wr.decode_frame_payload(payload) == wr.decode_frame_payload_reference(payload)


def test_garbage_payloads_raise_only_frame_errors():
    """Seeded random payloads (with the type byte forced to JSON or ROCKETMQ half the time) decode or raise
    FrameError; no other exception escapes either decoder."""
    rng = random.Random(SEED + 8)
    for _ in range(1000):
        junk = bytearray(rng.randbytes(rng.randint(0, 80)))
        if len(junk) >= 4 and rng.random() < 0.5:
            struct.pack_into(">I", junk, 0, (rng.randint(0, 1) << 24) | rng.randint(0, len(junk)))
        for decode in (wr.decode_frame_payload, wr.decode_frame_payload_reference):
            try:
                decode(bytes(junk))
            except FrameError:
                pass


def test_encode_errors():
    """Values that do not fit the chosen format raise EncodeError: a code over 32767 in a binary header, an
    unknown serialize type, a language over 255, an oversize frame, a lone surrogate."""
    with pytest.raises(EncodeError):
        wr.encode_frame(wr.RemotingCommand(code=40000, serialize_type=wr.SERIALIZE_ROCKETMQ))
    assert wr.decode_frame(wr.encode_frame(wr.RemotingCommand(code=40000))).code == 40000  # fine in JSON
    with pytest.raises(EncodeError):
        wr.encode_frame(wr.RemotingCommand(serialize_type=2))
    with pytest.raises(EncodeError):
        wr.encode_frame(wr.RemotingCommand(language=256, serialize_type=wr.SERIALIZE_ROCKETMQ))
    with pytest.raises(EncodeError):
        wr.encode_frame(wr.RemotingCommand(body=bytes(wr.FRAME_SIZE_MAX)))
    with pytest.raises(EncodeError):
        wr.encode_frame(wr.RemotingCommand(remark="\ud800"))
    with pytest.raises(EncodeError):
        wr.encode_frame(wr.RemotingCommand(opaque=1 << 31))
    with pytest.raises(EncodeError):
        wr.encode_frame(wr.RemotingCommand(ext_fields={"k": [1]}))


def test_command_flags_and_tables():
    """RPC flag bits, serialize types, the language table and the frame limit have the spec's values."""
    assert (wr.RPC_RESPONSE, wr.RPC_ONEWAY, wr.SERIALIZE_JSON, wr.SERIALIZE_ROCKETMQ) == (1, 2, 0, 1)
    assert wr.FRAME_SIZE_MAX == 16777216
    assert wr.LANGUAGE_CODES["JAVA"] == 0 and wr.LANGUAGE_CODES["RUST"] == 12 and len(wr.LANGUAGE_CODES) == 13
    assert wr.LANGUAGE_NAMES[9] == "GO"
    cmd = wr.RemotingCommand(flag=wr.RPC_RESPONSE | wr.RPC_ONEWAY)
    assert cmd.is_response and cmd.is_oneway
    assert not wr.RemotingCommand().is_response


def test_package_reexports():
    """mq.wire re-exports the main names of every module, and each listed name exists."""
    import mq.wire as wire

    for name in wire.__all__:
        assert hasattr(wire, name), name
    for name in ("parse_record", "build_record", "CommitLogRecord", "parse_batch", "encode_frame", "decode_frame_payload",
                 "RemotingCommand", "tags_code", "offset_msg_id", "Checkpoint", "HaFrameHeader", "WireError"):
        assert name in wire.__all__
    assert json.loads(JSON_VECTOR_HEADER)["code"] == 105


def test_json_header_orjson_equals_json_module():
    """The JSON header encoder (orjson) writes exactly what json.dumps(separators=(",", ":"),
    ensure_ascii=False) writes for headers of random text (control characters, quotes,
    backslashes, non-ASCII, astral planes), and the decoder reads it back; text orjson refuses
    (a lone surrogate) is an EncodeError as before."""
    rnd = random.Random(11)
    alphabet = [chr(c) for c in range(0, 0x80)] + ["é", "键", "\u2028", "\U0001F600", "\ufffd", "\x7f"]
    for _ in range(300):
        text = "".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, 30)))
        cmd = wr.RemotingCommand(code=rnd.randint(-5, 400), opaque=rnd.randint(-2**31, 2**31 - 1), remark=text or None,
                                 ext_fields={text or "k": text, "n": str(rnd.randint(0, 10**12))},
                                 language=rnd.choice([0, 1, 3, 200]))
        expected = {"code": cmd.code, "extFields": cmd.ext_fields, "flag": 0,
                    "language": wr.LANGUAGE_NAMES.get(cmd.language, cmd.language), "opaque": cmd.opaque}
        if cmd.remark is not None:
            expected["remark"] = cmd.remark
        expected.update({"serializeTypeCurrentRPC": "JSON", "version": 0})
        header = wr.encode_json_header(cmd)
        assert header == json.dumps(expected, separators=(",", ":"), ensure_ascii=False).encode()
        assert wr.decode_json_header(header) == cmd
    with pytest.raises(EncodeError):
        wr.encode_json_header(wr.RemotingCommand(remark="\ud800"))
    with pytest.raises(EncodeError):
        wr.encode_json_header(wr.RemotingCommand(ext_fields={"k": "\udfff"}))


def test_response_template_equals_encode_frame():
    """ResponseTemplate (a send's answer) gives encode_frame's bytes for the same response, in both
    serialize types, for random codes, opaques, versions, languages and values, and fixed values with
    quotes, '%', non-ASCII; a language JSON cannot name gives None (the caller takes the long way)."""
    rnd = random.Random(5)
    for fixed in ({"MSG_REGION": "DefaultRegion", "TRACE_ON": "true"}, {"R": 'a"%d\\é键', "E": ""}, {}):
        tpl = wr.ResponseTemplate(("msgId", "queueId", "queueOffset"), fixed)
        for _ in range(200):
            values = ("%032X" % rnd.getrandbits(128), str(rnd.randint(0, 1023)), str(rnd.randint(0, 2**63 - 1)))
            serialize_type = rnd.choice([wr.SERIALIZE_JSON, wr.SERIALIZE_ROCKETMQ])
            language = rnd.choice([0, 1, 3, 12])
            cmd = wr.RemotingCommand(code=rnd.choice([0, 10, 11, 12]), language=language,
                                     version=rnd.randint(-2**15, 2**15 - 1), opaque=rnd.randint(-2**31, 2**31 - 1),
                                     flag=wr.RPC_RESPONSE, ext_fields=dict(zip(tpl.varying, values), **fixed),
                                     serialize_type=serialize_type)
            got = tpl.frame(serialize_type, cmd.code, language, cmd.version, cmd.opaque,
                            *(v.encode() for v in values))
            assert got == wr.encode_frame(cmd)
    assert tpl.frame(wr.SERIALIZE_JSON, 0, 200, 0, 1, b"a", b"1", b"2") is None
    assert tpl.frame(wr.SERIALIZE_ROCKETMQ, 0, 200, 0, 1, b"a", b"1", b"2") is not None
