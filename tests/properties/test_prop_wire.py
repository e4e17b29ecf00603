"""Byte-level integrity of the decoders that read what the network and the disk hand over,
as properties over inputs Hypothesis builds (mq.wire.remoting, mq.remoting.framing,
mq.wire.commitlog, mq.wire.batch, mq.wire.properties).

What it proves:
  * encode then decode is the identity for every RemotingCommand within the declared limits
    (int32 code/opaque/flag/version in JSON, int16 code/version in ROCKETMQ, a language byte,
    ext_fields of str -> str, any remark and body, both serialize types; the binary format's
    "" / {} -> None aside), the fast paths equal the construct declarations, and so for every
    CommitLog record build_record can make;
  * any byte string -- random, a valid frame or record mangled, a JSON header of arbitrary
    values and nesting, a binary header with arbitrary lengths -- fed to decode_frame_payload,
    decode_frame, the two header decoders, parse_record, iter_records, parse_batch or
    decode_properties either decodes or raises a mq.wire.errors.WireError subclass, never
    another exception, and allocates in proportion to the bytes given, never to a length
    they declare; the fast frame decoder and the reference agree on every such input;
  * a stream of valid frames cut at any points, read through FrameBuffer and frame_end the
    way the server and the client read (including reads that arrive while the reader is
    paused), yields the same frames, in order, exactly once; no byte is lost or held twice;
    and a length over FRAME_SIZE_MAX is refused as soon as its 4 bytes are there.
"""
from __future__ import annotations

import ipaddress
import json
import queue
import struct
import sys
import threading
import tracemalloc

from hypothesis import given, strategies as st

from mq.remoting.framing import FrameBuffer, frame_end
from mq.wire import batch as wbatch
from mq.wire import commitlog as wcl
from mq.wire import properties as wprops
from mq.wire import remoting as wr
from mq.wire.errors import FrameError, FrameTruncatedError, WireError
from tests.properties.propkit import bounded

I16 = st.integers(-(1 << 15), (1 << 15) - 1)
I32 = st.integers(-(1 << 31), (1 << 31) - 1)
I64 = st.integers(-(1 << 63), (1 << 63) - 1)
# lengths a mangled header may declare: small ones, and the edges that a decoder trusting them would
# turn into an allocation or an out-of-range slice
LENGTHS = st.one_of(st.integers(-4, 64), st.sampled_from([-(1 << 31), -1, (1 << 15) - 1, 1 << 15, (1 << 24) - 1,
                                                          1 << 24, (1 << 31) - 1]), I32)
TEXT = st.text(max_size=24)          # no lone surrogates: Hypothesis leaves category Cs out by default
ALLOC_SLACK_BYTES = 1 << 20          # what a decoder may allocate beyond 64 bytes per input byte
PRODUCTION_RECURSION_LIMIT = 1000   # CPython's default; nothing in mq/ changes it


# --------------------------------------------------------------------------------------------------
# Strategies


@st.composite
def commands(draw, serialize_type=None) -> wr.RemotingCommand:
    """A RemotingCommand within the declared limits of its serialize type."""
    stype = draw(st.sampled_from([wr.SERIALIZE_JSON, wr.SERIALIZE_ROCKETMQ])) if serialize_type is None \
        else serialize_type
    small = I16 if stype == wr.SERIALIZE_ROCKETMQ else I32
    return wr.RemotingCommand(
        code=draw(small), language=draw(st.integers(0, 255)), version=draw(small), opaque=draw(I32),
        flag=draw(I32), remark=draw(st.none() | st.text(max_size=64)),
        ext_fields=draw(st.none() | st.dictionaries(TEXT, TEXT, max_size=8)),
        body=draw(st.binary(max_size=256)), serialize_type=stype)


def normalized(cmd: wr.RemotingCommand) -> wr.RemotingCommand:
    """What a decoder gives back: the binary format writes "" and {} as absent (module docstring)."""
    if cmd.serialize_type != wr.SERIALIZE_ROCKETMQ:
        return cmd
    return wr.RemotingCommand(code=cmd.code, language=cmd.language, version=cmd.version, opaque=cmd.opaque,
                              flag=cmd.flag, remark=cmd.remark or None, ext_fields=cmd.ext_fields or None,
                              body=cmd.body, serialize_type=cmd.serialize_type)


@st.composite
def mangled(draw, data: bytes, max_ops: int = 4) -> bytes:
    """`data` after a few random edits: a byte set or flipped, a 1/2/4-byte big-endian integer written
    (lengths, mostly), bytes inserted or deleted, the end cut."""
    buf = bytearray(data)
    for _ in range(draw(st.integers(1, max_ops))):
        op = draw(st.sampled_from(["set", "flip", "int", "insert", "delete", "cut"]))
        at = draw(st.integers(0, len(buf)))
        if op == "set" and at < len(buf):
            buf[at] = draw(st.integers(0, 255))
        elif op == "flip" and at < len(buf):
            buf[at] ^= 1 << draw(st.integers(0, 7))
        elif op == "int":
            width = draw(st.sampled_from([1, 2, 4]))
            value = draw(LENGTHS) & ((1 << (8 * width)) - 1)
            buf[at:at + width] = value.to_bytes(width, "big")
        elif op == "insert":
            buf[at:at] = draw(st.binary(min_size=1, max_size=16))
        elif op == "delete":
            del buf[at:at + draw(st.integers(1, 16))]
        elif op == "cut":
            del buf[at:]
    return bytes(buf)


def json_values(max_leaves: int = 12):
    """Any JSON value (NaN and the infinities too, which json.dumps writes and fastjson reads)."""
    leaves = st.one_of(st.none(), st.booleans(), st.integers(-(1 << 70), 1 << 70), st.floats(), st.text(max_size=12),
                       st.sampled_from(["12", "-3", "1e3", "0x10", " 7", "99999999999999999999", "JAVA", "CPP"]))
    return st.recursive(leaves, lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=6), kids,
                                                                                            max_size=4),
                        max_leaves=max_leaves)


@st.composite
def nested(draw) -> bytes:
    """A JSON header with a value nested up to 1100 levels deep in the place of one key (remark, an ext
    field, code) or as the header itself; mostly 900-1100 levels, around 1000, where the json module's and
    orjson's recursion limits lie (the edges of a decoder, like LENGTHS')."""
    depth = draw(st.sampled_from([st.integers(0, 64), st.integers(900, 1100), st.integers(900, 1100)]).flatmap(
        lambda s: s))
    open_, close = draw(st.sampled_from([("[", "]"), ('{"k":', "}")]))
    value = open_ * depth + draw(st.sampled_from(["1", '"x"', "[]", "{}"])) + close * depth
    where = draw(st.sampled_from(['{"remark":%s}', '{"extFields":{"a":%s}}', '{"code":%s}', "%s"]))
    return (where % value).encode()


@st.composite
def json_headers(draw) -> bytes:
    """A JSON header whose known keys hold arbitrary values."""
    keys = st.sampled_from(["code", "flag", "opaque", "version", "language", "remark", "extFields",
                            "serializeTypeCurrentRPC"]) | st.text(max_size=6)
    obj = draw(st.dictionaries(keys, json_values(), max_size=8))
    if draw(st.booleans()):
        obj["extFields"] = draw(st.dictionaries(st.text(max_size=6), json_values(4), max_size=4))
    data = json.dumps(obj, ensure_ascii=draw(st.booleans())).encode("utf-8", "surrogatepass")
    return draw(mangled(data, 2)) if draw(st.booleans()) else data


@st.composite
def binary_headers(draw) -> bytes:
    """A ROCKETMQ header whose remark, ext block and entry lengths are arbitrary (or honest)."""
    remark = draw(st.binary(max_size=24))
    entries = []
    for _ in range(draw(st.integers(0, 4))):
        key, value = draw(st.binary(max_size=12)), draw(st.binary(max_size=12))
        key_len = len(key) if draw(st.booleans()) else draw(LENGTHS)
        value_len = len(value) if draw(st.booleans()) else draw(LENGTHS)
        entries.append(struct.pack(">h", max(-(1 << 15), min(key_len, (1 << 15) - 1))) + key
                       + struct.pack(">i", value_len) + value)
    ext = b"".join(entries)
    remark_len = len(remark) if draw(st.booleans()) else draw(LENGTHS)
    ext_len = len(ext) if draw(st.booleans()) else draw(LENGTHS)
    head = struct.pack(">hBhii", draw(I16), draw(st.integers(0, 255)), draw(I16), draw(I32), draw(I32))
    return head + struct.pack(">i", remark_len) + remark + struct.pack(">i", ext_len) + ext \
        + draw(st.binary(max_size=4))


@st.composite
def payloads(draw) -> bytes:
    """A frame payload (the bytes after the 4-byte length): random, a valid one mangled, or a type/length
    word over a JSON, deeply nested JSON or binary header from the strategies above."""
    kind = draw(st.sampled_from(["random", "mangled", "json", "nested", "binary"]))
    if kind == "random":
        return draw(st.binary(max_size=300))
    if kind == "mangled":
        return draw(mangled(wr.encode_frame(draw(commands()))[4:]))
    header = draw({"json": json_headers, "nested": nested, "binary": binary_headers}[kind]())
    stype = wr.SERIALIZE_ROCKETMQ if kind == "binary" else wr.SERIALIZE_JSON
    header_len = len(header) if draw(st.booleans()) else draw(st.integers(0, wr.HEADER_LENGTH_MAX))
    return struct.pack(">I", (stype << 24) | header_len) + header + draw(st.binary(max_size=16))


# --------------------------------------------------------------------------------------------------
# Helpers


class _Decoder:
    """The thread `outcome` runs its calls on: one for the whole session, started on first use.

    Not a thread per call: Thread.join() returns before the thread has finished exiting, and its
    last raw frees (its thread state) ran without the GIL while this thread stopped tracemalloc --
    a race in CPython 3.11's tracemalloc (python/cpython#128679, fixed in 3.12 and 3.13) that
    crashed a CI worker with SIGSEGV once (CI 90, in test_any_batch_body_parses_or_raises_a_wire_error).
    This thread never exits; between calls it waits on a queue, which allocates nothing without
    the GIL, so tracemalloc starts and stops while it is idle."""
    _jobs: "queue.Queue | None" = None
    _done: "queue.Queue | None" = None

    @classmethod
    def call(cls, fn) -> None:
        if cls._jobs is None:
            cls._jobs, cls._done = queue.Queue(), queue.Queue()
            threading.Thread(target=cls._serve, name="decoder", daemon=True).start()
        cls._jobs.put(fn)
        cls._done.get()

    @classmethod
    def _serve(cls) -> None:
        while True:
            fn = cls._jobs.get()
            try:
                fn()
            finally:
                cls._done.put(None)


def outcome(decode, *args, **kw):
    """decode(*args): its result, or the WireError class it raised; any other exception fails the
    property (Hypothesis prints the input that caused it).

    The call runs as the broker runs it: near the base of a thread's stack (_Decoder's, which
    waits between calls with nothing on it) under CPython's default recursion limit (Hypothesis
    raises the limit by 2000 while a test runs, which would hide a decoder that recurses as deep
    as its input nests).  Also fails when the call allocated more than 64 bytes per input byte
    plus ALLOC_SLACK_BYTES at its peak: a decoder that trusted a declared length would allocate
    that length."""
    size = sum(len(a) for a in args if isinstance(a, (bytes, bytearray, memoryview)))
    box: list = []

    def run() -> None:
        try:
            box.append(decode(*args, **kw))
        except WireError as exc:
            box.append(type(exc))
        except BaseException as exc:       # re-raised below, in the test's thread
            box.append(exc)

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(PRODUCTION_RECURSION_LIMIT)
    tracemalloc.start()
    try:
        _Decoder.call(run)
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        sys.setrecursionlimit(limit)
    (result,) = box
    if isinstance(result, BaseException):
        raise AssertionError(f"{getattr(decode, '__name__', decode)} raised {type(result).__name__}, "
                             f"not a WireError: {result}") from result
    assert peak <= 64 * size + ALLOC_SLACK_BYTES, f"{decode.__name__} of {size} bytes allocated {peak} bytes"
    return result


def same_outcome(a, b) -> bool:
    """Both decoded to equal values, or both raised a WireError (the class may differ: the reference
    names every failure FrameError)."""
    a_err = isinstance(a, type) and issubclass(a, WireError)
    b_err = isinstance(b, type) and issubclass(b, WireError)
    return a_err == b_err and (a_err or a == b)


def read_stream(reads: list[bytes], paused: list[bool]) -> tuple[list[wr.RemotingCommand], FrameBuffer]:
    """The server's read loop (mq.remoting.server, data_received and _resume) over these reads: a read
    that arrives while the reader is paused is kept unparsed (add); on resume, held whole frames are
    parsed (take(b"")).  Every step checks that the buffer holds exactly the bytes not yet parsed."""
    buf, out = FrameBuffer(), []
    fed = parsed = 0

    def parse(data: bytes | None) -> None:
        nonlocal parsed
        if data is None:
            return
        pos, size = 0, len(data)
        view = memoryview(data)
        while size - pos >= 4:
            end = frame_end(data, pos, size)
            if not end:
                break
            out.append(wr.decode_frame_payload(view[pos + 4:end]))
            parsed += end - pos
            pos = end
        view.release()
        if pos < size:
            buf.hold(data, pos)

    for chunk, pause in zip(reads, paused):
        fed += len(chunk)
        if pause:
            buf.add(chunk)
        else:
            if buf.ready():          # the resume of a paused reader, then the read itself
                parse(buf.take(b""))
            parse(buf.take(chunk))
        assert len(buf) == fed - parsed, "FrameBuffer holds exactly the bytes not yet parsed"
    if buf.ready():
        parse(buf.take(b""))
    return out, buf


# --------------------------------------------------------------------------------------------------
# Properties: frames and headers


@bounded(300)
@given(cmd=commands())
def test_encode_then_decode_is_the_identity(cmd):
    frame = wr.encode_frame(cmd)
    assert frame == wr.encode_frame_reference(cmd), "the fast encoder equals the declaration"
    assert wr.frame_payload_size(frame) == len(frame) - 4
    fast = wr.decode_frame_payload(frame[4:])
    assert fast == normalized(cmd)
    assert wr.decode_frame(frame) == fast
    assert wr.decode_frame_payload(memoryview(frame)[4:]) == fast, "a view decodes like bytes"
    assert wr.decode_frame_payload_reference(frame[4:]) == fast


@bounded(600)
@given(payload=payloads())
def test_any_payload_decodes_or_raises_a_wire_error(payload):
    fast = outcome(wr.decode_frame_payload, payload)
    prefix = struct.pack(">I", len(payload))
    assert same_outcome(outcome(wr.decode_frame, prefix + payload), fast)
    assert same_outcome(outcome(wr.decode_frame_payload_reference, payload), fast), \
        "the fast decoder adds no leniency and refuses nothing the reference reads"
    if not isinstance(fast, type):
        assert isinstance(fast, wr.RemotingCommand) and fast.body == payload[len(payload) - len(fast.body):]
    if len(payload) >= 4:
        header = payload[4:]
        outcome(wr.decode_json_header, header)
        outcome(wr.decode_rocketmq_header, header)


@bounded(200)
@given(prefix=st.binary(max_size=8))
def test_frame_length_prefix_is_checked_before_anything_is_buffered(prefix):
    got = outcome(wr.frame_payload_size, prefix)
    if len(prefix) < 4:
        assert got is FrameTruncatedError
        return
    total = int.from_bytes(prefix[:4], "big")
    if total + 4 > wr.FRAME_SIZE_MAX:
        assert got is FrameError
        try:
            frame_end(prefix, 0, len(prefix))
            raise AssertionError("frame_end accepted a length over FRAME_SIZE_MAX")
        except FrameError:
            pass
    else:
        assert got == total
        assert frame_end(prefix, 0, len(prefix)) == (4 + total if 4 + total <= len(prefix) else 0)


@bounded(300)
@given(cmds=st.lists(commands(), min_size=1, max_size=5), data=st.data())
def test_a_stream_cut_anywhere_yields_the_same_frames(cmds, data):
    stream = b"".join(wr.encode_frame(c) for c in cmds)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=12), label="cuts"))
    bounds = [0, *cuts, len(stream)]
    reads = [stream[a:b] for a, b in zip(bounds, bounds[1:])]
    paused = data.draw(st.lists(st.booleans(), min_size=len(reads), max_size=len(reads)), label="paused")
    paused[-1] = False                      # the reader resumes for the last read
    out, buf = read_stream(reads, paused)
    assert out == [normalized(c) for c in cmds]
    assert len(buf) == 0


@bounded(200)
@given(cmds=st.lists(commands(), max_size=3), total=st.integers(wr.FRAME_SIZE_MAX - 3, (1 << 32) - 1),
       data=st.data())
def test_a_length_over_the_maximum_is_refused_as_soon_as_it_is_read(cmds, total, data):
    """Frames before an oversized length are all delivered; the length itself is refused once its four
    bytes are there, however the stream is cut, and nothing after it is waited for."""
    good = b"".join(wr.encode_frame(c) for c in cmds)
    stream = good + struct.pack(">I", total) + data.draw(st.binary(max_size=32), label="after")
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=8), label="cuts"))
    bounds = [0, *cuts, len(stream)]
    reads = [stream[a:b] for a, b in zip(bounds, bounds[1:])]
    refused_at = None
    out: list = []
    buf = FrameBuffer()
    fed = 0
    for chunk in reads:
        fed += len(chunk)
        got = buf.take(chunk)
        if got is None:
            continue
        pos, size = 0, len(got)
        try:
            while size - pos >= 4:
                end = frame_end(got, pos, size)
                if not end:
                    break
                out.append(wr.decode_frame_payload(memoryview(got)[pos + 4:end]))
                pos = end
        except FrameError:
            refused_at = fed
            break
        if pos < size:
            buf.hold(got, pos)
    assert out == [normalized(c) for c in cmds]
    assert refused_at is not None and refused_at >= len(good) + 4, "refused, and not before its 4 bytes came"
    assert len(buf) <= 3 + len(good), "never more held than the frames before and a partial length"


# --------------------------------------------------------------------------------------------------
# Properties: CommitLog records, batch bodies, message properties


def hosts():
    return st.one_of(st.ip_addresses(v=4), st.ip_addresses(v=6)).map(str)


def topics():
    return st.text(min_size=1, max_size=40).filter(lambda t: len(t.encode()) <= wcl.TOPIC_SIZE_MAX)


@st.composite
def record_fields(draw) -> dict:
    return dict(
        queue_id=draw(I32), flag=draw(I32), queue_offset=draw(I64), physical_offset=draw(I64),
        sys_flag=draw(I32), born_timestamp_ms=draw(I64), born_host=draw(hosts()),
        born_port=draw(st.integers(0, 65535)), store_timestamp_ms=draw(I64), store_host=draw(hosts()),
        store_port=draw(st.integers(0, 65535)), reconsume_times=draw(I32), prepared_transaction_offset=draw(I64),
        body=draw(st.binary(max_size=300)), topic=draw(topics()), properties=draw(st.binary(max_size=100)))


@bounded(300)
@given(fields=record_fields())
def test_a_record_round_trips_and_equals_its_declaration(fields):
    rec = wcl.build_record(**fields)
    parsed = wcl.parse_record(rec, check_crc=True)
    sys_flag = fields["sys_flag"] & ~(wcl.BORNHOST_V6 | wcl.STOREHOST_V6)
    sys_flag |= (wcl.BORNHOST_V6 if ":" in fields["born_host"] else 0) \
        | (wcl.STOREHOST_V6 if ":" in fields["store_host"] else 0)
    assert parsed == dict(fields, sys_flag=sys_flag, magic=wcl.MESSAGE_MAGIC_CODE, total_size=len(rec),
                          body_crc=wcl.body_crc32(fields["body"]),
                          born_host=str(ipaddress.ip_address(fields["born_host"])),
                          store_host=str(ipaddress.ip_address(fields["store_host"])))
    assert parsed == wcl.CommitLogRecord.parse(rec)
    assert wcl.CommitLogRecord.build(parsed) == rec
    assert wcl.build_record(**parsed) == rec


@st.composite
def record_bytes(draw) -> bytes:
    """Random bytes, or one to three valid records (and a BLANK) mangled."""
    if draw(st.booleans()):
        return draw(st.binary(max_size=400))
    recs = b"".join(wcl.build_record(**draw(record_fields())) for _ in range(draw(st.integers(1, 3))))
    if draw(st.booleans()):
        recs += wcl.build_blank(draw(st.integers(8, 1 << 20)))
    return draw(mangled(recs))


@bounded(400)
@given(buf=record_bytes(), offset=st.integers(0, 64), check_crc=st.booleans())
def test_any_bytes_parse_as_a_record_or_raise_a_wire_error(buf, offset, check_crc):
    got = outcome(wcl.parse_record, buf, offset if offset <= len(buf) else 0, check_crc=check_crc)
    if not isinstance(got, type):
        at = offset if offset <= len(buf) else 0
        assert got == wcl.CommitLogRecord.parse(buf[at:at + got.total_size]), "the declaration reads it alike"
        if check_crc:
            assert wcl.record_crc_ok(got)
    outcome(lambda b: list(wcl.iter_records(b, check_crc=check_crc)), buf)
    outcome(wcl.peek_record, buf)
    outcome(wcl.parse_blank, buf)
    # the consumer's fast path: the same records, values and error kind as iter_records
    assert _values_outcome(buf) == _records_outcome(buf)


def _records_outcome(buf):
    try:
        return [tuple(r[f] for f in wcl.RECORD_VALUE_FIELDS[:-1]) for r in wcl.iter_records(buf)]
    except WireError as e:
        return type(e)


def _values_outcome(buf):
    try:
        return [v[:-1] for v in wcl.iter_record_values(buf)]
    except WireError as e:
        return type(e)


@bounded(200)
@given(many=st.lists(record_fields(), min_size=1, max_size=4), cut=st.integers(0, 3))
def test_the_consumers_fast_decode_equals_the_declared_one(many, cut):
    """A pull body of several records (IPv4 and IPv6 hosts, any lengths), whole or cut short:
    iter_record_values yields exactly what iter_records parses, and raises the same error."""
    body = b"".join(wcl.build_record(**f) for f in many)
    if cut:
        body = body[:len(body) - cut]
    assert _values_outcome(body) == _records_outcome(body)
    if not cut:
        packed = [v[-1] for v in wcl.iter_record_values(body)]
        assert [str(ipaddress.ip_address(p)) for p in packed] == [str(ipaddress.ip_address(f["store_host"]))
                                                                 for f in many]


@st.composite
def batch_bytes(draw) -> bytes:
    items = draw(st.lists(st.tuples(I32, st.binary(max_size=64), st.binary(max_size=32)), max_size=4))
    good = wbatch.build_batch(items)
    return draw(st.one_of(st.just(good), mangled(good) if good else st.binary(max_size=200),
                          st.binary(max_size=200)))


@bounded(400)
@given(buf=batch_bytes())
def test_any_batch_body_parses_or_raises_a_wire_error(buf):
    got = outcome(wbatch.parse_batch, buf)
    if not isinstance(got, type):
        assert sum(wbatch.BATCH_RECORD_SIZE_MIN + len(i.body) + len(i.properties) for i in got) == len(buf), \
            "the records parsed tile the buffer exactly"


NAMES = st.text(min_size=1, max_size=12).filter(lambda s: "\x01" not in s and "\x02" not in s)
VALUES = st.text(min_size=1, max_size=24).filter(lambda s: "\x02" not in s)


@bounded(300)
@given(props=st.dictionaries(NAMES, VALUES, max_size=8), noise=st.binary(max_size=200))
def test_properties_round_trip_and_any_bytes_decode(props, noise):
    assert wprops.decode_properties(wprops.encode_properties(props)) == props
    got = outcome(wprops.decode_properties, noise)
    assert isinstance(got, dict) or issubclass(got, WireError)
    if isinstance(got, dict):
        assert all(isinstance(k, str) and isinstance(v, str) and k and v for k, v in got.items())
