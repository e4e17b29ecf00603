"""The client's decode of a pull answer (mq.client.message.decode_messages) through the C core's
record walk (csrc/records.h) gives what the pure-Python decode gives, for any body.

What it proves:
  * for bodies of one to six records with any field values build_record can write -- IPv4 and
    IPv6 hosts, ASCII and non-ASCII topics, properties as well-formed pairs, as random bytes
    over the separators (empty segments, a 0x01 at either end, values holding 0x01) or with
    bytes >= 0x80, negative physical offsets, any ports -- whole, cut short or mangled, with and
    without the pulled queue and the MIN/MAX_OFFSET extras: the same MessageExt objects (every
    attribute, the attributes' and the properties' order), or the same exception (type and
    text), as _decode_values, the Python decode C hands its leftovers to;
  * the same with the C call's room made small (1 to 3 rows, or text too small for a record's
    pairs), so the calls that stop for room, and the fallback when a record cannot fit, are walked;
  * the C function's own contract: MQ_E_INVAL for `from` past the end; *why says why it stopped.
"""
from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from mq.client import message as cm
from mq.wire import commitlog as wcl
from tests.properties.propkit import bounded

pytestmark = pytest.mark.skipif(cm._lib is None, reason="needs the compiled C core (mq._mqstore)")

I32 = st.integers(-(1 << 31), (1 << 31) - 1)
I64 = st.integers(-(1 << 63), (1 << 63) - 1)
NAMES = st.text(st.sampled_from("ABCKTUQ_\x01"), min_size=0, max_size=6)


def hosts():
    return st.one_of(st.ip_addresses(v=4).map(str), st.ip_addresses(v=4).map(str), st.ip_addresses(v=6).map(str))


def topics():
    return st.one_of(st.text(st.sampled_from("TopicAB%_-|09"), min_size=0, max_size=20),
                     st.text(min_size=1, max_size=10).filter(lambda t: len(t.encode()) <= wcl.TOPIC_SIZE_MAX))


def properties():
    pairs = st.lists(st.tuples(NAMES, st.text(st.sampled_from("xyz01\x01é"), max_size=6)), max_size=5).map(
        lambda ps: "\x02".join(n + "\x01" + v for n, v in ps).encode())
    return st.one_of(pairs, pairs.map(lambda b: b + b"\x02"),
                     st.binary(max_size=40),
                     st.lists(st.sampled_from([b"\x01", b"\x02", b"a", b"bc", b"\xc3\xa9", b"\xff"]),
                              max_size=16).map(b"".join))


@st.composite
def record_fields(draw) -> dict:
    return dict(
        queue_id=draw(I32), flag=draw(I32), queue_offset=draw(I64),
        physical_offset=draw(st.one_of(st.integers(0, 1 << 40), I64)), sys_flag=draw(I32),
        born_timestamp_ms=draw(I64), born_host=draw(hosts()), born_port=draw(st.integers(0, 65535)),
        store_timestamp_ms=draw(I64), store_host=draw(hosts()), store_port=draw(st.integers(0, 65535)),
        reconsume_times=draw(I32),
        prepared_transaction_offset=draw(I64), body=draw(st.binary(max_size=64)), topic=draw(topics()),
        properties=draw(properties()))


@st.composite
def bodies(draw) -> bytes:
    many = draw(st.lists(record_fields(), min_size=1, max_size=6))
    recs = [wcl.build_record(**f) for f in many]
    for i, f in enumerate(many):        # a port build_record refuses (born, store), where IPv4 hosts put it
        if ":" not in f["born_host"] + f["store_host"] and draw(st.integers(0, 4)) == 0:
            at = draw(st.sampled_from([52, 68]))
            recs[i] = recs[i][:at] + draw(I32).to_bytes(4, "big", signed=True) + recs[i][at + 4:]
    body = b"".join(recs)
    how = draw(st.sampled_from(["whole", "whole", "cut", "flip"]))
    if how == "cut":
        body = body[:draw(st.integers(0, len(body)))]
    elif how == "flip":
        at = draw(st.integers(0, len(body) - 1))
        body = body[:at] + bytes([body[at] ^ draw(st.integers(1, 255))]) + body[at + 1:]
    return body


def outcome(decode):
    try:
        return [(list(vars(m).items()), list(m.properties.items())) for m in decode()]
    except Exception as e:           # noqa: BLE001 -- the two paths must fail alike, whatever the error
        return type(e), str(e)


def python_decode(body, *args):
    out: list = []
    cm._decode_values(body, 0, *args, out)
    return out


@bounded(400)
@given(body=bodies(), pulled=st.booleans(), extras=st.booleans())
def test_the_c_walk_decodes_as_python_does(body, pulled, extras):
    args = ("broker-a", cm.MessageQueue("T", "broker-a", 3) if pulled else None,
            {"MIN_OFFSET": "0", "MAX_OFFSET": "9", "TAGS": "x"} if extras else None)
    assert outcome(lambda: cm.decode_messages(body, *args)) == outcome(lambda: python_decode(body, *args))


@bounded(200)
@given(body=bodies(), rows=st.integers(1, 3), text=st.sampled_from([0, 1, 8, 40, 2 * 32767 + 1]))
def test_a_walk_stopped_for_room_goes_on_where_it_stopped(body, rows, text):
    saved = cm._DECODE_ROWS, cm._DECODE_TEXT
    cm._DECODE_ROWS, cm._DECODE_TEXT = rows, text
    try:
        got = outcome(lambda: cm.decode_messages(body, "b", None, None))
    finally:
        cm._DECODE_ROWS, cm._DECODE_TEXT = saved
    assert got == outcome(lambda: python_decode(body, "b", None, None))


def test_the_c_calls_own_contract():
    ffi, lib = cm._ffi, cm._lib
    rec = wcl.build_record(body=b"hi", topic="T", properties=b"A\x01b\x02\x02C\x01d\x01e", physical_offset=5,
                           store_host="10.0.0.1", store_port=9)
    body = rec * 3
    rows = ffi.new("int64_t[]", 2 * lib.MQ_DECODE_FIELDS)
    ids = ffi.new("char[]", 2 * lib.MQ_DECODE_ID_LEN)
    text = ffi.new("char[]", 100)
    sizes, why = ffi.new("size_t[2]"), ffi.new("int *")
    assert lib.mq_records_decode(body, len(body), len(body) + 1, rows, 2, ids, text, 100, sizes, sizes + 1,
                                 why) == lib.MQ_E_INVAL
    assert lib.mq_records_decode(body, len(body), 0, rows, 2, ids, text, 100, sizes, sizes + 1, why) == 2
    assert (sizes[1], why[0]) == (2 * len(rec), lib.MQ_DECODE_FULL)
    assert ffi.unpack(text, sizes[0]) == b"A\x02b\x02C\x02d\x01e\x02" * 2      # the empty segment kept nothing
    assert ffi.unpack(ids, lib.MQ_DECODE_ID_LEN) == b"0A0000010000000900000000000000" b"05\x02"
    assert list(rows[0:lib.MQ_DECODE_FIELDS])[-2:] == [2, 0] and rows[2 * lib.MQ_DECODE_FIELDS - 1] == 1
    sizes[0] = 0
    assert lib.mq_records_decode(body, len(body), 2 * len(rec), rows, 2, ids, text, 100, sizes, sizes + 1, why) == 1
    assert (sizes[1], why[0]) == (len(body), lib.MQ_DECODE_END)
    sizes[0] = 0
    assert lib.mq_records_decode(body + b"\0" * 10, len(body) + 10, 2 * len(rec), rows, 2, ids, text, 100, sizes,
                                 sizes + 1, why) == 1
    assert (sizes[1], why[0]) == (len(body), lib.MQ_DECODE_OTHER)
