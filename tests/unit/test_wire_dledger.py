"""mq.wire.dledger and mq.wire.dledger_rpc: the struct fast paths equal the construct
declarations; bad input maps to WireErrors; the properties files round-trip; every peer message
encodes and decodes, and a missing or mistyped field is refused."""
from __future__ import annotations

import random

import pytest

from mq.wire import dledger as W
from mq.wire import dledger_rpc as RPC
from mq.wire.errors import BadMagicError, EncodeError, MalformedError, SizeMismatchError, TruncatedError, WireError


def test_entry_header_fast_path_equals_the_declaration():
    rnd = random.Random(3)
    for _ in range(200):
        index, term, pos = rnd.randrange(1 << 40), rnd.randrange(1 << 20), rnd.randrange(1 << 50)
        body = rnd.randbytes(rnd.randint(0, 300))
        raw = W.build_entry(index, term, pos, body)
        c = W.EntryHeader.parse(raw)
        assert (c.size, c.index, c.term, c.pos, c.body_size) == (48 + len(body), index, term, pos, len(body))
        assert W.EntryHeader.build(c) == raw[:48]
        assert W.parse_entry_header(raw) == W.Entry(index, term, pos, 48 + len(body), len(body))


def test_index_unit_and_filler_fast_paths_equal_the_declarations():
    raw = W.build_index_unit(4096, 200, 77, 5)
    c = W.IndexUnit.parse(raw)
    assert (c.pos, c.size, c.index, c.term) == (4096, 200, 77, 5) and W.IndexUnit.build(c) == raw
    assert W.parse_index_unit(raw) == W.Unit(4096, 200, 77, 5)
    assert W.parse_index_unit(bytes(32)) is None
    assert W.Filler.build({"size": 100}) == (0xFFFFFFFF).to_bytes(4, "big") + (100).to_bytes(4, "big")


@pytest.mark.parametrize("mangle,error", [
    (lambda b: b[:40], TruncatedError),
    (lambda b: (2).to_bytes(4, "big") + b[4:], BadMagicError),
    (lambda b: b[:44] + (999).to_bytes(4, "big") + b[48:], SizeMismatchError)])
def test_a_bad_entry_header_is_a_wire_error(mangle, error):
    raw = W.build_entry(1, 1, 0, b"abc")
    with pytest.raises(error):
        W.parse_entry_header(mangle(raw))


def test_iter_entries_walks_entries_and_fillers_and_names_damage():
    fs = 256
    e1 = W.build_entry(0, 1, 0, b"x" * 100)
    filler = (0xFFFFFFFF).to_bytes(4, "big") + (fs - len(e1)).to_bytes(4, "big")
    filler += bytes(fs - len(e1) - 8)
    e2 = W.build_entry(1, 1, fs, b"y" * 10)
    items = list(W.iter_entries(e1 + filler + e2 + bytes(16), 0, fs))
    assert [type(i).__name__ for i in items] == ["Entry", "Blank", "Entry"]
    assert items[2].body_pos == fs + 48
    with pytest.raises(WireError):
        list(W.iter_entries(W.build_entry(0, 1, 8, b"z"), 0, fs))      # pos says 8, sits at 0


def test_the_properties_files_round_trip():
    assert W.parse_checkpoint(W.build_checkpoint(41, 40)) == (41, 40)
    assert W.parse_checkpoint("") == (-1, -1)
    assert W.parse_currterm(W.build_currterm(7, "n2")) == (7, "n2")
    assert W.parse_currterm(W.build_currterm(8, None)) == (8, None)
    with pytest.raises(EncodeError):
        W.build_currterm(1, "a\nb")
    with pytest.raises(WireError):
        W.parse_currterm("currTerm=x")
    # as Java DLedger writes them (no crc line): read as before
    assert W.parse_currterm("currTerm=5\nvoteLeader=n1\n") == (5, "n1")
    assert W.parse_checkpoint("#Sun Nov 29\nendIndex=9\ncommittedIndex=8\n") == (9, 8)


@pytest.mark.parametrize("text, parse", [(W.build_currterm(7, "n2"), W.parse_currterm),
                                         (W.build_currterm(12, None), W.parse_currterm),
                                         (W.build_checkpoint(41, 19), W.parse_checkpoint)],
                         ids=["currterm", "currterm without a vote", "checkpoint"])
def test_every_bit_flip_of_a_properties_file_is_noticed_or_changes_nothing(text, parse):
    """The crc line: each of the file's bits flipped in turn either fails the parse (MalformedError)
    or reads the same values -- never another term, vote or commit (e.g. committedIndex=19 -> 11
    is one bit, '9' ^ 0x08)."""
    want = parse(text)
    noticed = 0
    for i, ch in enumerate(text):
        for bit in range(8):
            damaged = text[:i] + chr(ord(ch) ^ (1 << bit)) + text[i + 1:]
            try:
                got = parse(damaged)
            except MalformedError:
                noticed += 1
                continue
            assert got == want, f"{damaged!r} reads as {got}"
    assert noticed > len(text) * 8 * 0.8


@pytest.mark.parametrize("key", sorted(RPC.MESSAGES, key=str))
def test_every_peer_message_round_trips(key):
    """Each declared message: sample values encode to string extFields and decode back."""
    code, response = key
    values = {}
    for name, kind, _ in RPC.MESSAGES[key]:
        values[name] = {int: 12345, bool: True, str: "n1"}[kind]
    ext = RPC.encode(code, response, values)
    assert all(isinstance(v, str) for v in ext.values())
    assert RPC.decode(code, response, ext) == values


def test_peer_messages_refuse_missing_and_mistyped_fields():
    good = RPC.encode(RPC.VOTE, False, {"group": "g", "localId": "n0", "remoteId": "n1", "term": 3,
                                        "ledgerEndIndex": 9, "ledgerEndTerm": 2})
    for drop in ("group", "term", "ledgerEndIndex"):
        bad = dict(good)
        del bad[drop]
        with pytest.raises(RPC.FieldError, match=drop):
            RPC.decode(RPC.VOTE, False, bad)
    with pytest.raises(RPC.FieldError):
        RPC.decode(RPC.VOTE, False, {**good, "term": "three"})
    with pytest.raises(RPC.FieldError):
        RPC.decode(RPC.VOTE, False, {**good, "preVote": "maybe"})
    with pytest.raises(EncodeError):
        RPC.encode(RPC.VOTE, False, {"group": "g"})
    with pytest.raises(EncodeError):
        RPC.encode(RPC.HEART_BEAT, True, {"term": 1, "code": 200, "surprise": 1})


def test_the_push_fast_paths_equal_the_declared_codec():
    """push_ext / push_resp_ext / push_resp_values (the hot PUSH messages) give exactly what
    encode()/decode() give; a malformed answer still raises the FieldError decode() would."""
    ext = RPC.push_ext("g", "n0", "n1", 5, 99, 4, 90, 100, 3, 4096, 777)
    assert ext == RPC.encode(RPC.PUSH, False, {
        "group": "g", "localId": "n0", "remoteId": "n1", "term": 5, "leaderId": "n0", "prevIndex": 99,
        "prevTerm": 4, "commitIndex": 90, "firstIndex": 100, "count": 3, "firstPos": 4096, "bodySize": 777})
    for ok in (True, False):
        resp = RPC.push_resp_ext(5, ok, 102, -1 if ok else 99, -1 if ok else 97)
        assert resp == RPC.encode(RPC.PUSH, True, {"term": 5, "code": 200 if ok else RPC.INCONSISTENT_STATE,
                                                    "index": 102, "rejectIndex": -1 if ok else 99,
                                                    "hintIndex": -1 if ok else 97})
        f = RPC.decode(RPC.PUSH, True, resp)
        assert RPC.push_resp_values(resp) == (f["term"], f["code"] == 200, f["index"], f["rejectIndex"],
                                              f["hintIndex"])
    with pytest.raises(RPC.FieldError, match="hintIndex"):
        RPC.push_resp_values({"term": "1", "code": "200", "index": "3", "rejectIndex": "-1"})


def test_an_install_is_a_push_with_its_table_declared_once():
    """An install (ours: a follower behind the leader's first entry) is a PUSH with install=true
    and tableSize; push_ext gives what encode() gives; the table round-trips, and a table that is
    too large, not JSON or of the wrong shape is a MalformedError naming why."""
    from mq.wire.errors import MalformedError
    ext = RPC.push_ext("g", "n0", "n1", 5, 99, 0, 120, 100, 3, 4096, 777, table_size=40)
    assert ext == RPC.encode(RPC.PUSH, False, {
        "group": "g", "localId": "n0", "remoteId": "n1", "term": 5, "leaderId": "n0", "prevIndex": 99,
        "prevTerm": 0, "commitIndex": 120, "firstIndex": 100, "count": 3, "firstPos": 4096, "bodySize": 777,
        "install": True, "tableSize": 40})
    f = RPC.decode(RPC.PUSH, False, ext)
    assert f["install"] is True and f["tableSize"] == 40
    plain = RPC.decode(RPC.PUSH, False, RPC.push_ext("g", "n0", "n1", 5, 99, 4, 90, 100, 3, 4096, 777))
    assert not plain["install"] and plain["tableSize"] is None
    rows = [("T", 0, 12), ("%RETRY%G", 3, 0), ("t" * 127, 1, 2 ** 40)]
    table = RPC.install_table(rows)
    assert RPC.parse_install_table(memoryview(table)) == rows
    for bad, why in ((b"[", "not JSON"), (b"{}", "list"), (b'[["T", -1, 0]]', "row"), (b'[["T", 0]]', "row"),
                     (b'[["", 0, 0]]', "row"), (b'[["T", 0, 1.5]]', "row"), (b'[["T", true, 0]]', "row"), (b'[["T", 2147483648, 0]]', "row"),
                     (b"\xff", "not JSON"), (b" " * (RPC.INSTALL_TABLE_BYTES_MAX + 1), "limit")):
        with pytest.raises(MalformedError, match=why):
            RPC.parse_install_table(bad)


def test_peer_frames_are_remoting_frames():
    """The DLedger role's frame heads (orjson) decode with mq.wire.remoting's declared decoder to
    the same command, and its fast decoder agrees on them."""
    from mq.dledger.net import decode_header, request_frame, response_frame
    from mq.wire.remoting import RPC_RESPONSE, decode_frame
    ext = RPC.push_ext("g", "n0", "n1", 5, 99, 4, 90, 100, 3, 4096, 3)
    frame = request_frame(RPC.PUSH, 77, ext, 3) + b"abc"
    cmd = decode_frame(frame)
    assert (cmd.code, cmd.opaque, cmd.flag, cmd.ext_fields, cmd.body) == (RPC.PUSH, 77, 0, ext, b"abc")
    hlen = int.from_bytes(frame[5:8], "big")
    fast = decode_header(frame[8:8 + hlen])
    assert (fast.code, fast.opaque, fast.flag, fast.ext_fields) == (RPC.PUSH, 77, 0, ext)
    resp = decode_frame(response_frame(78, {"code": "200"}, b"{}"))
    assert resp.is_response and resp.flag == RPC_RESPONSE and resp.opaque == 78 and resp.body == b"{}"
