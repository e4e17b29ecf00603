"""Client-side message types: what producers send, what consumers receive, and the results.

    Message      topic, body, properties (TAGS, KEYS, DELAY, WAIT, UNIQ_KEY, user keys), flag
    MessageExt   a received message: a Message plus the stored record's fields (queue, offsets, hosts, times)
    MessageQueue (topic, broker_name, queue_id), ordered like Java's MessageQueue.compareTo
    SendResult   status + msg_id (UNIQ_KEY) + offset_msg_id (store host + commit-log offset) + queue + queue_offset
    PullResult   status + next_begin_offset + min/max offset + messages

Byte layouts come from mq.wire only: a PULL body is decoded with mq.wire.commitlog.iter_records, properties
with mq.wire.properties, offsetMsgId with mq.wire.msgid.

UNIQ_KEY (MessageClientIDSetter, spec 2.6), 16 bytes as 32 uppercase hex characters:

    ip 4 | pid 2 | classLoaderHash 4 | ms since the start of the current month 4 | counter 2

The "class loader hash" is a per-process random int here; the month start is fixed at import, as Java fixes
it when the class loads (the ms field then simply keeps growing).
"""
from __future__ import annotations

import enum
import itertools
import os
import random
import socket
import struct
import time
import zlib
from dataclasses import dataclass, field
from datetime import datetime

from mq.wire import commitlog as wcl
from mq.wire.consumequeue import java_string_hashcode
from mq.wire.msgid import offset_msg_id
from mq.wire.properties import PROPERTIES_SIZE_MAX, decode_properties, string_to_properties

# Property names (C/message/MessageConst.java).
PROPERTY_KEYS = "KEYS"
PROPERTY_TAGS = "TAGS"
PROPERTY_WAIT_STORE_MSG_OK = "WAIT"
PROPERTY_DELAY_TIME_LEVEL = "DELAY"
PROPERTY_RETRY_TOPIC = "RETRY_TOPIC"
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_REAL_QUEUE_ID = "REAL_QID"
PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX = "UNIQ_KEY"
PROPERTY_ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
PROPERTY_RECONSUME_TIME = "RECONSUME_TIME"
PROPERTY_MAX_RECONSUME_TIMES = "MAX_RECONSUME_TIMES"
PROPERTY_CONSUME_START_TIMESTAMP = "CONSUME_START_TIME"
PROPERTY_MIN_OFFSET = "MIN_OFFSET"
PROPERTY_MAX_OFFSET = "MAX_OFFSET"
KEY_SEPARATOR = " "

RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"
DLQ_GROUP_TOPIC_PREFIX = "%DLQ%"
MASTER_ID = 0

# sysFlag bits the client sets or reads (spec 3.3).
SYSFLAG_COMPRESSED = wcl.COMPRESSED
SYSFLAG_COMPRESSION_TYPE_MASK = wcl.COMPRESSION_TYPE_MASK
SYSFLAG_ZLIB = wcl.COMPRESSION_ZLIB
SYSFLAG_LZ4 = wcl.COMPRESSION_LZ4
SYSFLAG_ZSTD = wcl.COMPRESSION_ZSTD

MESSAGE_BODY_SIZE_MAX = 4 * 1024 * 1024          # broker maxMessageSize default; producer maxMessageSize
COMPRESS_BODY_OVER_BYTES = 4096                  # compressMsgBodyOverHowmuch
COMPRESS_LEVEL = 5                               # rocketmq.message.compressLevel
DECOMPRESSED_BODY_SIZE_MAX = 64 * 1024 * 1024    # bound on a received compressed body once inflated


def retry_topic(group: str) -> str:
    return RETRY_GROUP_TOPIC_PREFIX + group


def dlq_topic(group: str) -> str:
    return DLQ_GROUP_TOPIC_PREFIX + group


class SendStatus(str, enum.Enum):
    SEND_OK = "SEND_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"


class PullStatus(str, enum.Enum):
    FOUND = "FOUND"
    NO_NEW_MSG = "NO_NEW_MSG"
    NO_MATCHED_MSG = "NO_MATCHED_MSG"
    OFFSET_ILLEGAL = "OFFSET_ILLEGAL"


class ConsumeStatus(str, enum.Enum):
    CONSUME_SUCCESS = "CONSUME_SUCCESS"
    RECONSUME_LATER = "RECONSUME_LATER"


class MessageModel(str, enum.Enum):
    CLUSTERING = "CLUSTERING"
    BROADCASTING = "BROADCASTING"


class ConsumeFromWhere(str, enum.Enum):
    LAST = "CONSUME_FROM_LAST_OFFSET"
    FIRST = "CONSUME_FROM_FIRST_OFFSET"
    TIMESTAMP = "CONSUME_FROM_TIMESTAMP"


def _coerce(kind, value):
    """An enum member from a member, its value or its name ('LAST', 'CONSUME_FROM_LAST_OFFSET')."""
    if isinstance(value, kind):
        return value
    text = str(value)
    for member in kind:
        if text in (member.name, member.value):
            return member
    raise ValueError(f"{kind.__name__}: unknown value {value!r} (one of {[m.name for m in kind]})")


@dataclass(frozen=True, order=True)
class MessageQueue:
    """One queue of a topic on one broker (master and slaves share it). Ordered by topic, broker, queue id."""
    topic: str
    broker_name: str
    queue_id: int

    def __str__(self) -> str:
        return f"{self.topic}@{self.broker_name}:{self.queue_id}"

    def as_json(self) -> dict:
        return {"brokerName": self.broker_name, "queueId": self.queue_id, "topic": self.topic}


class Message:
    """A message to send. `body` is bytes (str is encoded as UTF-8). `keys` is one key or several
    (stored space-separated in KEYS); `tags` is a single tag; `properties` are user properties
    (names and values without the separators 0x01/0x02)."""

    def __init__(self, topic: str, body: bytes | str = b"", *, tags: str | None = None,
                 keys: str | list[str] | tuple[str, ...] | None = None, properties: dict | None = None,
                 flag: int = 0, delay_level: int = 0, wait_store_msg_ok: bool = True):
        self.topic = topic
        self.body = body.encode("utf-8") if isinstance(body, str) else bytes(body)
        self.flag = flag
        self.properties: dict[str, str] = {str(k): str(v) for k, v in (properties or {}).items()}
        if tags:
            self.properties[PROPERTY_TAGS] = tags
        if keys:
            self.properties[PROPERTY_KEYS] = keys if isinstance(keys, str) else KEY_SEPARATOR.join(keys)
        if delay_level > 0:
            self.properties[PROPERTY_DELAY_TIME_LEVEL] = str(delay_level)
        self.properties.setdefault(PROPERTY_WAIT_STORE_MSG_OK, "true" if wait_store_msg_ok else "false")

    @property
    def tags(self) -> str | None:
        return self.properties.get(PROPERTY_TAGS)

    @property
    def keys(self) -> str | None:
        return self.properties.get(PROPERTY_KEYS)

    @property
    def delay_level(self) -> int:
        return int(self.properties.get(PROPERTY_DELAY_TIME_LEVEL, "0") or 0)

    @property
    def wait_store_msg_ok(self) -> bool:
        return self.properties.get(PROPERTY_WAIT_STORE_MSG_OK, "true") != "false"

    def get_property(self, name: str, default: str | None = None) -> str | None:
        return self.properties.get(name, default)

    def put_property(self, name: str, value: str) -> None:
        self.properties[name] = str(value)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(topic={self.topic!r}, tags={self.tags!r}, keys={self.keys!r}, "
                f"body={len(self.body)} bytes)")


class MessageExt(Message):
    """A stored message as a consumer or an admin tool sees it.

    msg_id is the UNIQ_KEY when the producer set one, else offset_msg_id (what Java's
    MessageClientExt.getMsgId returns); offset_msg_id is store host + commit-log offset.
    For a message redelivered through %RETRY%<group>, a push consumer resets `topic` to the
    original topic (RETRY_TOPIC property); `queue` still names the queue it was pulled from."""

    def __init__(self, topic: str, body: bytes, properties: dict, flag: int = 0):
        # not Message.__init__: a received message keeps exactly the stored properties (no WAIT added)
        self.topic = topic
        self.body = body
        self.flag = flag
        self.properties = properties
        self.queue_id = 0
        self.queue_offset = 0
        self.commitlog_offset = 0
        self.store_size = 0
        self.sys_flag = 0
        self.body_crc = 0
        self.born_timestamp_ms = 0
        self.born_host = ""
        self.store_timestamp_ms = 0
        self.store_host = ""
        self.reconsume_times = 0
        self.prepared_transaction_offset = 0
        self.offset_msg_id = ""
        self.broker_name = ""
        self.queue: MessageQueue | None = None

    @property
    def msg_id(self) -> str:
        return self.properties.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX) or self.offset_msg_id

    def __repr__(self) -> str:
        return (f"MessageExt(topic={self.topic!r}, queue_id={self.queue_id}, queue_offset={self.queue_offset}, "
                f"msg_id={self.msg_id}, tags={self.tags!r}, reconsume_times={self.reconsume_times}, "
                f"body={len(self.body)} bytes)")


def decompress_body(body: bytes, sys_flag: int) -> bytes:
    """The body as sent: inflated when COMPRESSED is set (type bits 0 or ZLIB mean zlib, spec 3.3).
    LZ4/ZSTD bodies are returned as stored (no codec here). Inflation is bounded."""
    if not sys_flag & SYSFLAG_COMPRESSED:
        return body
    if sys_flag & SYSFLAG_COMPRESSION_TYPE_MASK not in (0, SYSFLAG_ZLIB):
        return body
    d = zlib.decompressobj()
    out = d.decompress(body, DECOMPRESSED_BODY_SIZE_MAX)
    if d.unconsumed_tail:
        raise ValueError(f"compressed body inflates beyond {DECOMPRESSED_BODY_SIZE_MAX} bytes")
    return out


def message_from_record(rec, broker_name: str = "") -> MessageExt:
    """A MessageExt from a parsed CommitLog record (mq.wire.commitlog.parse_record, a construct
    Container).  Fields are read with item access: the Container's attribute access costs ~0.2 us
    a field, and a pull decodes every message it returns."""
    f = rec.__getitem__
    topic, sys_flag, store_host, store_port, phy = (f("topic"), f("sys_flag"), f("store_host"), f("store_port"),
                                                    f("physical_offset"))
    m = MessageExt(topic, decompress_body(f("body"), sys_flag), decode_properties(f("properties")), f("flag"))
    m.queue_id = queue_id = f("queue_id")
    m.queue_offset = f("queue_offset")
    m.commitlog_offset = phy
    m.store_size = f("total_size")
    m.sys_flag = sys_flag
    m.body_crc = f("body_crc")
    m.born_timestamp_ms = f("born_timestamp_ms")
    m.born_host = _host_port(f("born_host"), f("born_port"))
    m.store_timestamp_ms = f("store_timestamp_ms")
    m.store_host = _host_port(store_host, store_port)
    m.reconsume_times = f("reconsume_times")
    m.prepared_transaction_offset = f("prepared_transaction_offset")
    m.offset_msg_id = offset_msg_id(store_host, store_port, phy)
    m.broker_name = broker_name
    m.queue = MessageQueue(topic, broker_name, queue_id)
    return m


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


_PORT = struct.Struct(">i")             # the port in an offset msg id (store host, port, offset: mq.wire.msgid)

try:            # the C core's walk over a pull answer's records (csrc/records.h), when it is built:
    from mq._mqstore import ffi as _ffi, lib as _lib        # the client also runs without it
except ImportError:
    _ffi = _lib = None
_DECODE_ROWS = 64                       # records a call decodes (a pull answer of 32: one call)
if _lib is not None:
    _DECODE_ROW = struct.Struct(f"={_lib.MQ_DECODE_FIELDS}q")
    _DECODE_TEXT = 2 * PROPERTIES_SIZE_MAX + 1 + 16 * 1024      # always room for one record's pairs
    _DECODE_IDS = _DECODE_ROWS * _lib.MQ_DECODE_ID_LEN
    _alloc = _ffi.new_allocator(should_clear_after_alloc=False)  # C writes what Python reads


_v4_host_port: dict[tuple[int, int], str] = {}    # (IPv4 address as a number, port) -> "a.b.c.d:port"
_HOST_PORTS_MAX = 4096                  # a pull names a few hosts, over and over


def _host_port_v4(host: int, port: int) -> str:
    if len(_v4_host_port) >= _HOST_PORTS_MAX:
        _v4_host_port.clear()
    text = _v4_host_port[(host, port)] = f"{socket.inet_ntoa(host.to_bytes(4, 'big'))}:{port}"
    return text


def decode_messages(body: bytes, broker_name: str = "", queue: MessageQueue | None = None,
                    extra_properties: dict | None = None) -> list[MessageExt]:
    """Every message of a PULL response body (concatenated CommitLog records, spec 3.1), equal
    to message_from_record of each parsed record (tests/client/test_client_unit.py).  Raises
    mq.wire.errors.WireError for a malformed body.  A consumer's pull passes the queue it pulled
    (each message's `queue`) and the MIN_OFFSET / MAX_OFFSET properties Java's client adds to
    every message it pulls.

    The consumer's per-message cost.  With the C core built, one call walks the records
    (csrc/records.h): each record's fixed fields come back as one row of int64s, its offset msg
    id as text, and the properties of every record as one text of names and values, which
    Python splits once a pull; a message is then one tuple, a few slices and two dicts.  The
    records C leaves (an IPv6 host, a non-ASCII topic, or a malformed record, whose error
    Python names) and everything without the C core go through _decode_values, which gives the
    same messages (tests/properties/test_prop_client_decode.py)."""
    if body.__class__ is not bytes:
        body = bytes(body)
    out: list[MessageExt] = []
    start = 0 if _lib is None else _decode_rows(body, broker_name, queue, extra_properties, out)
    if start < len(body):
        _decode_values(body, start, broker_name, queue, extra_properties, out)
    return out


def _decode_rows(body: bytes, broker_name: str, queue: MessageQueue | None, extra_properties: dict | None,
                 out: list) -> int:
    """The records C decodes, from the start of body, appended to out; returns where C stopped."""
    size = len(body)
    rows = _alloc("int64_t[]", _DECODE_ROWS * _lib.MQ_DECODE_FIELDS)
    ids = _alloc("char[]", _DECODE_IDS)
    text = _alloc("char[]", _DECODE_TEXT)
    sizes = _ffi.new("size_t[2]")           # the text's length, where C stopped
    why = _ffi.new("int *")
    extra = list(extra_properties.items()) if extra_properties else []
    queues: dict = {}
    hosts = _v4_host_port
    append = out.append
    new = object.__new__
    unpack = _ffi.unpack
    pos = 0
    while pos < size:
        sizes[0] = 0
        n = _lib.mq_records_decode(body, size, pos, rows, _DECODE_ROWS, ids, text, _DECODE_TEXT, sizes, sizes + 1,
                                   why)
        if n < 0:                           # a body over INT32_MAX bytes: Python decodes it all
            return pos
        if n:
            msg_ids = unpack(ids, n * _lib.MQ_DECODE_ID_LEN - 1).decode("ascii").split("\x02")
            words = iter(unpack(text, sizes[0]).decode("ascii").split("\x02"))
            pairs = list(zip(words, words))     # every record's properties, in record order
            first = 0
            topic = None
            for (total_size, body_crc, queue_id, flag, queue_offset, phy, sys_flag, born_ts, born_host, born_port,
                 store_ts, store_host, store_port, reconsume, prep_tx, body_at, body_end, topic_at, topic_end,
                 props_at, props_end, n_pairs, same_topic), msg_id in zip(
                    _DECODE_ROW.iter_unpack(_ffi.buffer(rows, n * _DECODE_ROW.size)), msg_ids):
                if not same_topic:
                    topic = body[topic_at:topic_end].decode("ascii")
                mq = queue
                if mq is None:
                    mq = queues.get((topic, queue_id))
                    if mq is None:
                        mq = queues[(topic, queue_id)] = MessageQueue(topic, broker_name, queue_id)
                born = hosts.get((born_host, born_port)) or _host_port_v4(born_host, born_port)
                store = hosts.get((store_host, store_port)) or _host_port_v4(store_host, store_port)
                if n_pairs >= 0:
                    properties = dict(pairs[first:first + n_pairs] + extra) if extra else dict(
                        pairs[first:first + n_pairs])
                    first += n_pairs
                else:                       # a byte >= 0x80: UTF-8, decoded here
                    properties = string_to_properties(body[props_at:props_end].decode("utf-8", "replace"))
                    if extra_properties:
                        properties.update(extra_properties)
                raw_body = body[body_at:body_end]
                m = new(MessageExt)
                m.__dict__ = {
                    "topic": topic,
                    "body": decompress_body(raw_body, sys_flag) if sys_flag & SYSFLAG_COMPRESSED else raw_body,
                    "flag": flag, "properties": properties, "queue_id": queue_id, "queue_offset": queue_offset,
                    "commitlog_offset": phy, "store_size": total_size, "sys_flag": sys_flag, "body_crc": body_crc,
                    "born_timestamp_ms": born_ts, "born_host": born, "store_timestamp_ms": store_ts,
                    "store_host": store, "reconsume_times": reconsume, "prepared_transaction_offset": prep_tx,
                    "offset_msg_id": msg_id, "broker_name": broker_name, "queue": mq}
                append(m)
        pos = sizes[1]
        if why[0] != _lib.MQ_DECODE_FULL or not n:     # (no room for one record: Python takes the rest)
            break
    return pos


def _decode_values(body: bytes, start: int, broker_name: str, queue: MessageQueue | None,
                   extra_properties: dict | None, out: list) -> None:
    """The records of body from `start` on, decoded in Python, appended to out: each record is one
    tuple (wcl.iter_record_values), each message one dict; what the messages share is made once:
    the queue object, each "host:port" text, and the store host's part of the offset msg ids
    (the rest is the physical offset, 16 hex digits)."""
    append = out.append
    queues: dict = {}
    born_hosts: dict = {}
    stores: dict = {}                       # (packed host, port) -> (msg id head, "host:port")
    new = object.__new__
    for (total_size, body_crc, queue_id, flag, queue_offset, phy, sys_flag, born_ts, born_host, born_port, store_ts,
         store_host, store_port, reconsume, prep_tx, raw_body, topic, props, store_packed) in wcl.iter_record_values(
            body, start):
        if queue is None:
            mq = queues.get((topic, queue_id))
            if mq is None:
                mq = queues[(topic, queue_id)] = MessageQueue(topic, broker_name, queue_id)
        else:
            mq = queue
        if not 0 <= phy < 1 << 63:
            offset_msg_id(store_host, store_port, phy)      # raises the EncodeError it always did
        store = stores.get((store_packed, store_port))
        if store is None:
            if not 0 <= store_port <= 0xFFFF:
                offset_msg_id(store_host, store_port, phy)
            store = stores[(store_packed, store_port)] = ((store_packed + _PORT.pack(store_port)).hex().upper(),
                                                          _host_port(store_host, store_port))
        born = born_hosts.get((born_host, born_port))
        if born is None:
            born = born_hosts[(born_host, born_port)] = _host_port(born_host, born_port)
        properties = string_to_properties(props.decode("utf-8", "replace"))
        if extra_properties:
            properties.update(extra_properties)
        m = new(MessageExt)
        m.__dict__ = {
            "topic": topic, "body": decompress_body(raw_body, sys_flag) if sys_flag & SYSFLAG_COMPRESSED else raw_body,
            "flag": flag, "properties": properties, "queue_id": queue_id, "queue_offset": queue_offset,
            "commitlog_offset": phy, "store_size": total_size, "sys_flag": sys_flag, "body_crc": body_crc,
            "born_timestamp_ms": born_ts, "born_host": born, "store_timestamp_ms": store_ts, "store_host": store[1],
            "reconsume_times": reconsume, "prepared_transaction_offset": prep_tx,
            "offset_msg_id": store[0] + "%016X" % phy, "broker_name": broker_name, "queue": mq}
        append(m)


@dataclass
class SendResult:
    status: SendStatus
    msg_id: str                 # UNIQ_KEY (comma-joined for a batch)
    offset_msg_id: str          # from the broker: store host + commit-log offset (comma-joined for a batch)
    queue: MessageQueue
    queue_offset: int           # consume-queue offset of the (first) message
    region_id: str = ""
    trace_on: bool = True


@dataclass
class PullResult:
    status: PullStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    messages: list[MessageExt] = field(default_factory=list)
    suggest_which_broker_id: int = MASTER_ID


# --------------------------------------------------------------------------------------------------
# Subscriptions

@dataclass
class SubscriptionData:
    """A subscription as heartbeats carry it (spec 2.3, HEART_BEAT): a TAG expression (`*` means every
    tag) or, with expression_type "SQL92", a filter the broker evaluates (enablePropertyFilter)."""
    topic: str
    sub_string: str
    tags: tuple[str, ...]
    sub_version: int
    expression_type: str = "TAG"

    @classmethod
    def build(cls, topic: str, expression: str | None, expression_type: str = "TAG") -> "SubscriptionData":
        expression_type = expression_type.upper()
        if expression_type == "SQL92":
            if not (expression or "").strip():
                raise ValueError("an SQL92 subscription needs an expression")
            return cls(topic, expression, (), int(time.time() * 1000), "SQL92")
        if expression_type != "TAG":
            raise ValueError(f"expression type {expression_type!r} is neither TAG nor SQL92")
        expr = (expression or "").strip()
        if expr in ("", "*"):
            return cls(topic, "*", (), int(time.time() * 1000))
        tags = tuple(dict.fromkeys(t.strip() for t in expr.split("||") if t.strip()))
        if not tags:
            raise ValueError(f"subscription expression {expression!r} names no tag")
        return cls(topic, expr, tags, int(time.time() * 1000))

    def matches(self, msg: Message) -> bool:
        """The client-side re-check by tag string (the broker filtered by hash codes only)."""
        return not self.tags or (msg.tags is not None and msg.tags in self.tags)

    def as_json(self) -> dict:
        return {"classFilterMode": False, "codeSet": [java_string_hashcode(t) for t in self.tags],
                "expressionType": self.expression_type, "subString": self.sub_string, "subVersion": self.sub_version,
                "tagsSet": list(self.tags), "topic": self.topic}


# --------------------------------------------------------------------------------------------------
# Client ids and UNIQ_KEY

def local_ip() -> str:
    """This host's outward IPv4 address (no packet is sent), else 127.0.0.1."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))
            return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"


def _month_start_ms() -> int:
    now = datetime.now()
    return int(datetime(now.year, now.month, 1).timestamp() * 1000)


_ID_TAIL = struct.Struct(">iH")


class _UniqIdGenerator:
    """The process's UNIQ_KEYs: a prefix fixed per process (ip, pid, random), then the
    milliseconds since this month began and a 16-bit counter.  itertools.count's next() is
    atomic under the GIL, so no lock; a forked child gets a prefix of its own (os.register_at_fork)."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        try:
            ip = socket.inet_aton(local_ip())
        except OSError:
            ip = bytes(4)
        self.pid = os.getpid()
        self.prefix = ip + struct.pack(">hi", self.pid & 0x7FFF, random.getrandbits(31))
        self.prefix_hex = self.prefix.hex().upper()
        self.month_start_ms = _month_start_ms()
        self.counter = itertools.count(random.getrandbits(15))

    def next(self) -> str:
        elapsed = int(time.time() * 1000) - self.month_start_ms
        return self.prefix_hex + _ID_TAIL.pack(elapsed & 0x7FFFFFFF, next(self.counter) & 0xFFFF).hex().upper()


_uniq = _UniqIdGenerator()
os.register_at_fork(after_in_child=_uniq.reset)


def new_uniq_id() -> str:
    """A fresh UNIQ_KEY: 32 uppercase hex characters (IPv4 layout, see the module docstring)."""
    return _uniq.next()
