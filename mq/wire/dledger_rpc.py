"""The DLedger peer protocol: RocketMQ remoting frames (mq.wire.remoting) between the members of a
DLedger group, with DLedger's request codes (spec §7).  Every field travels in the JSON header's
extFields (strings, like every RocketMQ header); only PUSH has a body: the leader's data-file bytes
for the entries it carries, exactly as they sit on disk (mq.wire.dledger's entry layout), sent with
sendfile(2) and validated entry by entry by the follower before it appends them.

    request                           extFields (besides group, localId = sender, remoteId = receiver, term)
    VOTE (51001)                      ledgerEndIndex, ledgerEndTerm, preVote, transfer, brokerAddr
                                      (ours, optional: the candidate's broker address, so that every
                                      member knows a new leader's before its first heartbeat)
      response                        term, voteResult (ACCEPT | REJECT), preVote
    HEART_BEAT (51002)                leaderId, commitIndex, brokerAddr (ours, optional: the leader's
                                      broker address, ip:port, where followers forward the sends
                                      their clients still make to them)
      response                        term, code
    PUSH (51004)                      leaderId, prevIndex, prevTerm, commitIndex, firstIndex, count,
                                      firstPos, bodySize;  body = `bodySize` bytes of entries (count 0 = none)
                                      an install (a follower behind the leader's first entry; ours) adds
                                      install=true and tableSize: the body then starts with `tableSize`
                                      bytes of the install table (below), then the entries
      response                        term, code, index, rejectIndex, hintIndex
    LEADERSHIP_TRANSFER (51005)       from the leader: leaderId, transfereeId (the receiver starts an
                                      election at once); from an operator (no localId, no term):
                                      transfereeId -- answered by the leader with code SUCCESS (started)
                                      or NOT_LEADER and leaderId
    METADATA (50000)                  (nothing) -- response body: the member's status as JSON
    GET (50002)                       beginIndex (ours: one entry, for a member whose own copy of
                                      that committed entry is damaged: mq.dledger.role's repair)
      response                        term, code (SUCCESS with body = the entry's bytes as this
                                      member holds them, whole; INCONSISTENT_STATE when it cannot
                                      give it whole: not held, not committed here, or damaged too)

`code` values are DLedger's DLedgerResponseCode numbers (SUCCESS 200, NOT_LEADER 404, ...).  A
response echoes the request's opaque (remoting rules).  Differences from openmessaging/dledger,
whose bodies are fastjson objects with the entries inside: one group of ours talks only to itself,
so PUSH carries raw entry bytes (zero-copy on the leader, one validation pass on the follower),
and VOTE adds preVote/transfer (pre-vote and leadership transfer, which DLedger lacks).

The install table: every queue's offset at the install's first position, so the installed member
continues each queue where the leader's does -- JSON (as RocketMQ's bodies), a list of
[topic, queueId, offset]; at most INSTALL_QUEUES_MAX rows and INSTALL_TABLE_BYTES_MAX bytes.

Each message is declared once below as a table of typed fields; encode() and decode() are the only
ways in and out, and decode() rejects a missing or malformed field with a FieldError (a WireError)
naming the code and the field."""
from __future__ import annotations

from .errors import EncodeError, MalformedError

__all__ = ["METADATA", "APPEND", "GET", "VOTE", "HEART_BEAT", "PULL", "PUSH", "LEADERSHIP_TRANSFER",
           "SUCCESS", "UNKNOWN_GROUP", "NOT_LEADER", "UNKNOWN_MEMBER", "INCONSISTENT_STATE", "DISK_FULL",
           "WAIT_QUORUM_ACK_TIMEOUT", "TERM_CHANGED", "LEADER_NOT_READY", "LEADER_TRANSFERRING",
           "ACCEPT", "REJECT", "FieldError", "MESSAGES", "encode", "decode", "PUSH_BYTES_MAX", "CODE_NAMES",
           "push_ext", "push_resp_ext", "push_resp_values", "install_table", "parse_install_table",
           "INSTALL_QUEUES_MAX", "INSTALL_TABLE_BYTES_MAX"]

# request codes (DLedgerRequestCode)
METADATA = 50000
APPEND = 50001
GET = 50002
VOTE = 51001
HEART_BEAT = 51002
PULL = 51003
PUSH = 51004
LEADERSHIP_TRANSFER = 51005
CODE_NAMES = {METADATA: "METADATA", APPEND: "APPEND", GET: "GET", VOTE: "VOTE", HEART_BEAT: "HEART_BEAT",
              PULL: "PULL", PUSH: "PUSH", LEADERSHIP_TRANSFER: "LEADERSHIP_TRANSFER"}

# response codes (DLedgerResponseCode)
SUCCESS = 200
UNKNOWN_GROUP = 403
NOT_LEADER = 404
UNKNOWN_MEMBER = 405
INCONSISTENT_STATE = 409
DISK_FULL = 415
WAIT_QUORUM_ACK_TIMEOUT = 502
TERM_CHANGED = 501
LEADER_NOT_READY = 505
LEADER_TRANSFERRING = 507

ACCEPT = "ACCEPT"
REJECT = "REJECT"

# the most bytes of entries one PUSH carries (a follower refuses a larger body before reading it)
PUSH_BYTES_MAX = 4 * 1024 * 1024
# an install's table: a row per queue of the store's topic-queue table (MQ_QUEUE_SLOTS, 3/4 usable),
# each at most a 127-character topic and two integers
INSTALL_QUEUES_MAX = 32768
INSTALL_TABLE_BYTES_MAX = INSTALL_QUEUES_MAX * 176


class FieldError(MalformedError):
    """An extFields entry of a DLedger message is missing or not of its declared type."""


_COMMON = (("group", str, True), ("localId", str, True), ("remoteId", str, True), ("term", int, True))

# (code, is_response) -> fields: (name, type, required)
MESSAGES: dict[tuple[int, bool], tuple] = {
    (VOTE, False): _COMMON + (("ledgerEndIndex", int, True), ("ledgerEndTerm", int, True),
                              ("preVote", bool, False), ("transfer", bool, False), ("brokerAddr", str, False)),
    (VOTE, True): (("term", int, True), ("voteResult", str, True), ("preVote", bool, False)),
    (HEART_BEAT, False): _COMMON + (("leaderId", str, True), ("commitIndex", int, True), ("brokerAddr", str, False)),
    (HEART_BEAT, True): (("term", int, True), ("code", int, True)),
    (PUSH, False): _COMMON + (("leaderId", str, True), ("prevIndex", int, True), ("prevTerm", int, True),
                              ("commitIndex", int, True), ("firstIndex", int, True), ("count", int, True),
                              ("firstPos", int, True), ("bodySize", int, True),
                              ("install", bool, False), ("tableSize", int, False)),
    (PUSH, True): (("term", int, True), ("code", int, True), ("index", int, True), ("rejectIndex", int, True),
                   ("hintIndex", int, True)),
    (LEADERSHIP_TRANSFER, False): (("group", str, True), ("transfereeId", str, True), ("localId", str, False),
                                   ("remoteId", str, False), ("term", int, False), ("leaderId", str, False)),
    (LEADERSHIP_TRANSFER, True): (("code", int, True), ("leaderId", str, False), ("term", int, False)),
    (GET, False): _COMMON + (("beginIndex", int, True),),
    (GET, True): (("term", int, True), ("code", int, True)),
    (METADATA, False): (("group", str, True),),
    (METADATA, True): (("code", int, True),),
}

_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_INT32_MAX = (1 << 31) - 1


def _fields(code: int, response: bool) -> tuple:
    try:
        return MESSAGES[(code, response)]
    except KeyError:
        raise FieldError(f"DLedger code {code} ({'response' if response else 'request'}) is not declared") from None


def encode(code: int, response: bool, values: dict) -> dict[str, str]:
    """extFields for a message: every declared field present in `values`, as strings.
    Raises EncodeError for a missing required field, a wrong type or an undeclared name."""
    fields = _fields(code, response)
    out: dict[str, str] = {}
    names = set()
    for name, kind, required in fields:
        names.add(name)
        if name not in values or values[name] is None:
            if required:
                raise EncodeError(f"DLedger {CODE_NAMES.get(code, code)}: field {name} is required")
            continue
        v = values[name]
        if kind is bool:
            if not isinstance(v, bool):
                raise EncodeError(f"DLedger {CODE_NAMES.get(code, code)}: {name}={v!r} is not a bool")
            out[name] = "true" if v else "false"
        elif kind is int:
            if isinstance(v, bool) or not isinstance(v, int) or not _INT64_MIN <= v <= _INT64_MAX:
                raise EncodeError(f"DLedger {CODE_NAMES.get(code, code)}: {name}={v!r} is not an int64")
            out[name] = str(v)
        else:
            out[name] = str(v)
    extra = set(values) - names
    if extra:
        raise EncodeError(f"DLedger {CODE_NAMES.get(code, code)}: undeclared fields {sorted(extra)}")
    return out


def decode(code: int, response: bool, ext: dict | None) -> dict:
    """Typed values of a message's declared fields (absent optional ones are None).
    Raises FieldError for a missing required field or a value that does not parse."""
    fields = _fields(code, response)
    ext = ext or {}
    out: dict = {}
    for name, kind, required in fields:
        raw = ext.get(name)
        if raw is None:
            if required:
                raise FieldError(f"DLedger {CODE_NAMES.get(code, code)}: field {name} is missing")
            out[name] = None
            continue
        if kind is int:
            try:
                v = int(raw)
            except (TypeError, ValueError):
                raise FieldError(f"DLedger {CODE_NAMES.get(code, code)}: {name}={raw!r} is not an integer") from None
            if not _INT64_MIN <= v <= _INT64_MAX:
                raise FieldError(f"DLedger {CODE_NAMES.get(code, code)}: {name}={raw!r} is outside int64")
            out[name] = v
        elif kind is bool:
            s = str(raw).strip().lower()
            if s not in ("true", "false"):
                raise FieldError(f"DLedger {CODE_NAMES.get(code, code)}: {name}={raw!r} is not true/false")
            out[name] = s == "true"
        else:
            out[name] = str(raw)
    return out


# ---- fast paths for the hot messages (one PUSH and one answer per batch of entries); tests prove
# them equal to encode/decode above -------------------------------------------------------------
def push_ext(group: str, leader: str, remote: str, term: int, prev_index: int, prev_term: int, commit: int,
             first_index: int, count: int, first_pos: int, body_size: int, table_size: int = -1) -> dict[str, str]:
    """encode(PUSH, False, ...) for the leader's values (trusted: they come from its own state);
    table_size >= 0: an install."""
    ext = {"group": group, "localId": leader, "remoteId": remote, "term": str(term), "leaderId": leader,
           "prevIndex": str(prev_index), "prevTerm": str(prev_term), "commitIndex": str(commit),
           "firstIndex": str(first_index), "count": str(count), "firstPos": str(first_pos),
           "bodySize": str(body_size)}
    if table_size >= 0:
        ext["install"] = "true"
        ext["tableSize"] = str(table_size)
    return ext


def install_table(queues: list) -> bytes:
    """The install table of [(topic, queueId, offset)]."""
    assert len(queues) <= INSTALL_QUEUES_MAX
    import json
    return json.dumps([[t, int(q), int(o)] for t, q, o in queues], separators=(",", ":")).encode()


def parse_install_table(raw: bytes) -> list[tuple[str, int, int]]:
    """install_table's rows; MalformedError for anything else (size, shape, types, ranges)."""
    import json
    raw = bytes(raw)                          # a view into the frame's buffer
    if len(raw) > INSTALL_TABLE_BYTES_MAX:
        raise MalformedError(f"install table of {len(raw)} bytes (limit {INSTALL_TABLE_BYTES_MAX})")
    try:
        rows = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as e:
        raise MalformedError(f"install table is not JSON: {e}") from None
    if not isinstance(rows, list) or len(rows) > INSTALL_QUEUES_MAX:
        raise MalformedError("install table is not a list of at most %d rows" % INSTALL_QUEUES_MAX)
    out = []
    for row in rows:
        if not (isinstance(row, list) and len(row) == 3 and isinstance(row[0], str) and 0 < len(row[0]) <= 127
                and type(row[1]) is int and 0 <= row[1] <= _INT32_MAX
                and type(row[2]) is int and 0 <= row[2] <= _INT64_MAX):
            raise MalformedError(f"install table row {row!r} is not [topic, 0 <= queueId < 2^31, offset >= 0]")
        out.append((row[0], row[1], row[2]))
    return out


def push_resp_ext(term: int, success: bool, index: int, reject_index: int, hint_index: int) -> dict[str, str]:
    """encode(PUSH, True, ...) of a follower's answer."""
    return {"term": str(term), "code": "200" if success else str(INCONSISTENT_STATE), "index": str(index),
            "rejectIndex": str(reject_index), "hintIndex": str(hint_index)}


def push_resp_values(ext: dict | None) -> tuple[int, bool, int, int, int]:
    """(term, success, index, reject_index, hint_index) of a PUSH answer; FieldError as decode()."""
    try:
        return (int(ext["term"]), ext["code"] == "200", int(ext["index"]), int(ext["rejectIndex"]),
                int(ext["hintIndex"]))
    except (KeyError, TypeError, ValueError):
        f = decode(PUSH, True, ext)          # raises the precise FieldError
        return f["term"], f["code"] == SUCCESS, f["index"], f["rejectIndex"], f["hintIndex"]
