"""fastjson 1.2.69's text (RocketMQ 4.9.8's RemotingSerializable.encode): what Java tools and
dashboards decode from admin bodies, written byte for byte, and read back leniently.

What fastjson writes, with RocketMQ's default features (QuoteFieldNames, SkipTransientField,
WriteEnumUsingName, SortField; no MapSortField, no WriteNonStringKeyAsString):

    bean         {"a":..,"b":..}        fields in alphabetical order, null fields left out
    map          {"k":v,..}             in the Java map's iteration order (see below), null
                                        values left out
    map key      "text"                 a String key
                 12                     an Integer or Long key, bare (not standard JSON)
                 {"brokerName":"b","queueId":0,"topic":"T"}
                                        an object key (MessageQueue): the object's own JSON,
                                        bare, then ':' (not standard JSON either)
    list, set    [..]                   a HashSet in its iteration order
    double       0.0  1.5  1.0E7  9.99E-4    Java's Double.toString form (Ryu): plain between
                                        1e-3 and 1e7, else d.dddE<exp>; NaN and infinities null
    long, int    decimal
    boolean      true false
    string       "..", escaping only  \\"  \\\\  \\b \\t \\n \\f \\r, other U+0000-001F and
                                        U+007F-009F as \\u00XX, U+2028 and U+2029 as \\u2028,
                                        \\u2029 (uppercase hex); everything else as UTF-8

Map order.  Java's HashMap iterates bucket by bucket, bucket = (h ^ h>>>16) & (capacity-1) of
the key's hashCode(), and within a bucket in insertion order; the capacity starts at 16 (or the
power of two at or above the constructor's argument) and doubles when the size passes 3/4 of it,
or when a bucket reaches 9 entries in a table below 64.  `hashmap_order` replays exactly that,
so a map built here in the order the Java broker builds it iterates as Java's does.  Not
replayed: a bucket of 9+ entries in a table of 64+ (Java turns it into a tree whose iteration
order moves the root first; keys of admin bodies never collide that much).  A HashSet is a
HashMap.  ConcurrentHashMap (ConsumerConnection's subscriptionTable) iterates the same way below
its first resize (`chm_order`: 12 entries at the default capacity); a HashSet of objects
without hashCode() (Connection) iterates by identity hash, which nobody can replay: those are
written sorted.

The tests compare this encoder with fastjson 1.2.69 itself (tests/cli/test_admin_bodies.py).
`loads` reads fastjson's text, bare and object keys included, into Python values: an object
key becomes a `Key` (a sorted tuple of its fields), a bare integer key an int."""
from __future__ import annotations

import json
import re
from decimal import Decimal
from typing import Any, Callable, Iterable

from .errors import MalformedError

__all__ = ["dumps", "loads", "loads_lenient", "loads_body", "Bean", "JavaMap", "Key", "java_double", "java_string_hash", "hashmap_order",
           "chm_order", "message_queue_hash", "INT32"]

INT32 = 0xFFFFFFFF
_TREEIFY_THRESHOLD = 8
_MIN_TREEIFY_CAPACITY = 64


def _i32(v: int) -> int:
    v &= INT32
    return v - (1 << 32) if v & 0x80000000 else v


def java_string_hash(s: str) -> int:
    """String.hashCode(): 31*h + each UTF-16 code unit, in int32 arithmetic."""
    h = 0
    data = s.encode("utf-16-be", "surrogatepass")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & INT32
    return _i32(h)


def java_hash(key: Any) -> int:
    """hashCode() of a String, an Integer/Long (Long: value ^ value>>>32) or a Key that says how."""
    if isinstance(key, str):
        return java_string_hash(key)
    if isinstance(key, bool):
        return 1231 if key else 1237
    if isinstance(key, int):
        if -2 ** 31 <= key < 2 ** 31:
            return key
        u = key & 0xFFFFFFFFFFFFFFFF
        return _i32(u ^ (u >> 32))
    if isinstance(key, Key) and key.java_hash is not None:
        return key.java_hash
    raise TypeError(f"no Java hashCode for {key!r}")


def message_queue_hash(topic: str, broker_name: str, queue_id: int) -> int:
    """MessageQueue.hashCode()."""
    h = 31 + java_string_hash(broker_name)
    h = 31 * h + queue_id
    h = 31 * h + java_string_hash(topic)
    return _i32(h)


def _spread(h: int) -> int:
    u = h & INT32
    return u ^ (u >> 16)


def _table_size_for(cap: int) -> int:
    n = 1
    while n < cap:
        n <<= 1
    return max(n, 1)


def hashmap_order(keys: Iterable, hash_of: Callable[[Any], int] = java_hash, initial_capacity: int = 16) -> list:
    """The keys, inserted in this order into `new HashMap(initial_capacity)`, in the order the
    map iterates them (see the module docstring).  A repeated key keeps its first place."""
    cap = _table_size_for(initial_capacity)
    buckets: list[list] = [[] for _ in range(cap)]
    seen = set()
    size = 0

    def resize():
        nonlocal cap, buckets
        old, cap = buckets, cap * 2
        buckets = [[] for _ in range(cap)]
        for j, chain in enumerate(old):       # split preserving order: lo stays at j, hi moves to j+old
            for h, k in chain:
                buckets[_spread(h) & (cap - 1)].append((h, k))

    for k in keys:
        if k in seen:
            continue
        seen.add(k)
        h = hash_of(k)
        chain = buckets[_spread(h) & (cap - 1)]
        chain.append((h, k))
        if len(chain) > _TREEIFY_THRESHOLD and cap < _MIN_TREEIFY_CAPACITY:
            resize()                          # treeifyBin on a small table resizes instead
        size += 1
        if size > cap * 3 // 4:
            resize()
    return [k for chain in buckets for _, k in chain]


def chm_order(keys: Iterable, hash_of: Callable[[Any], int] = java_hash, capacity: int = 16) -> list:
    """The iteration order of a ConcurrentHashMap of `capacity` buckets (default constructor:
    16) that has not resized: bucket by bucket, insertion order within one."""
    buckets: list[list] = [[] for _ in range(capacity)]
    seen = set()
    for k in keys:
        if k not in seen:
            seen.add(k)
            buckets[(_spread(hash_of(k)) & 0x7FFFFFFF) & (capacity - 1)].append(k)
    return [k for chain in buckets for k in chain]


class Key(tuple):
    """An object used as a map key (MessageQueue): its fields as a sorted tuple of (name, value),
    written as the object's JSON.  `java_hash` is its hashCode() when the map order matters."""
    java_hash: int | None = None

    @classmethod
    def of(cls, fields: dict, java_hash: int | None = None) -> "Key":
        k = cls(sorted(fields.items()))
        k.java_hash = java_hash
        return k

    @classmethod
    def message_queue(cls, topic: str, broker_name: str, queue_id: int) -> "Key":
        return cls.of({"brokerName": broker_name, "queueId": queue_id, "topic": topic},
                      message_queue_hash(topic, broker_name, queue_id))

    def fields(self) -> dict:
        return dict(self)

    def __repr__(self) -> str:
        return f"Key({dict(self)!r})"


class Bean(dict):
    """A Java bean: written with its fields sorted by name (fastjson's SortField), nulls left out."""


class JavaMap:
    """A Java map whose entries are written in the order given (e.g. from hashmap_order)."""
    __slots__ = ("items",)

    def __init__(self, items: Iterable[tuple]):
        self.items = list(items)

    @classmethod
    def hashmap(cls, mapping: dict, initial_capacity: int = 16, hash_of=java_hash) -> "JavaMap":
        """A HashMap filled in `mapping`'s order."""
        return cls((k, mapping[k]) for k in hashmap_order(mapping, hash_of, initial_capacity))

    @classmethod
    def chm(cls, mapping: dict, capacity: int = 16, hash_of=java_hash) -> "JavaMap":
        return cls((k, mapping[k]) for k in chm_order(mapping, hash_of, capacity))


def hashset(values: Iterable, hash_of=java_hash) -> list:
    """A HashSet filled in this order, as a list in its iteration order."""
    return hashmap_order(values, hash_of)


# ---------------------------------------------------------------------------------------------
# Writing

_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}
_NEEDS_ESCAPE = re.compile('["\\\\\x00-\x1f\x7f-\x9f\u2028\u2029]')


def _escape(m: re.Match) -> str:
    c = m.group(0)
    return _ESCAPES.get(c) or "\\u%04X" % ord(c)


def _string(s: str) -> str:
    return '"' + _NEEDS_ESCAPE.sub(_escape, s) + '"'


def java_double(v: float) -> str:
    """A double as fastjson (RyuDouble) and Double.toString write it."""
    if v != v or v in (float("inf"), float("-inf")):
        return "null"
    if v == 0:
        return "-0.0" if str(v).startswith("-") else "0.0"
    sign, digits, exp = Decimal(repr(float(v))).as_tuple()
    ds = "".join(map(str, digits)).rstrip("0") or "0"
    exp += len(digits) - len(ds)             # digits without trailing zeros: value = ds * 10^exp
    e10 = len(ds) - 1 + exp                  # scientific exponent
    out = "-" if sign else ""
    if -3 <= e10 < 7:
        if e10 >= 0:
            whole = ds[:e10 + 1].ljust(e10 + 1, "0")
            frac = ds[e10 + 1:] or "0"
        else:
            whole, frac = "0", "0" * (-e10 - 1) + ds
        return f"{out}{whole}.{frac}"
    return f"{out}{ds[0]}.{ds[1:] or '0'}E{e10}"


def _key(k: Any) -> str:
    if isinstance(k, str):
        return _string(k)
    if isinstance(k, bool):
        return "true" if k else "false"
    if isinstance(k, int):
        return str(k)
    if isinstance(k, Key):
        return _dump(Bean(k.fields()))
    raise TypeError(f"cannot write map key {k!r}")


def _dump(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return java_double(v)
    if isinstance(v, str):
        return _string(v)
    if isinstance(v, Bean):
        return "{" + ",".join(f"{_string(k)}:{_dump(v[k])}" for k in sorted(v) if v[k] is not None) + "}"
    if isinstance(v, JavaMap):
        return "{" + ",".join(f"{_key(k)}:{_dump(x)}" for k, x in v.items if x is not None) + "}"
    if isinstance(v, dict):                  # a map whose order does not matter: sorted keys
        return _dump(JavaMap(sorted(v.items(), key=lambda kv: _sort_key(kv[0]))))
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_dump(x) for x in v) + "]"
    if isinstance(v, (set, frozenset)):
        return _dump(sorted(v, key=_sort_key))
    raise TypeError(f"cannot write {type(v).__name__}")


def _sort_key(k: Any) -> tuple:
    if isinstance(k, bool) or not isinstance(k, (int, str, Key)):
        return (3, repr(k))
    if isinstance(k, int):
        return (0, k, "")
    if isinstance(k, Key):
        return (2, 0, repr(tuple(k)))
    return (1, 0, k)


def dumps(value: Any) -> bytes:
    """`value` as fastjson writes it, UTF-8 (see the module docstring for Bean, JavaMap, Key)."""
    return _dump(value).encode("utf-8")


# ---------------------------------------------------------------------------------------------
# Reading

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)
_OBJECT_KEY = re.compile(r"\{([^{}\[\]]*)\}(\s*:)")
_BARE_KEY = re.compile(r"([{,]\s*)(-?\d+)(\s*:)")
_MARK = "\ue000"          # private-use characters stand for string literals while keys are rewritten


def loads(body: bytes | str) -> Any:
    """fastjson's text (or standard JSON) -> Python values; object keys become Key, bare
    integer keys int.  ValueError for anything that is not JSON either way."""
    text = body.decode("utf-8") if isinstance(body, (bytes, bytearray, memoryview)) else body
    try:
        return json.loads(text)
    except ValueError:
        pass
    strings: list[str] = []

    def mask(m: re.Match) -> str:
        strings.append(m.group(0))
        return f'"{_MARK}{len(strings) - 1}{_MARK}"'

    masked = _STRING.sub(mask, text)
    unmask = re.compile(f'"{_MARK}(\\d+){_MARK}"')

    def restore(s: str) -> str:
        return unmask.sub(lambda m: strings[int(m.group(1))], s)

    objects: list[str] = []

    def object_key(m: re.Match) -> str:
        objects.append(restore("{" + m.group(1) + "}"))
        return f'"{_MARK}o{len(objects) - 1}"{m.group(2)}'

    masked = _OBJECT_KEY.sub(object_key, masked)
    masked = _BARE_KEY.sub(lambda m: f'{m.group(1)}"{_MARK}i{m.group(2)}"{m.group(3)}', masked)

    def pairs(items):
        out = {}
        for k, v in items:
            if k.startswith(_MARK + "o"):
                k = Key.of(json.loads(objects[int(k[2:])]))
            elif k.startswith(_MARK + "i"):
                k = int(k[2:])
            out[k] = v
        return out

    return json.loads(restore(masked), object_pairs_hook=pairs)


# fastjson's bare integer keys in otherwise standard JSON (config files and name server bodies):
# _BARE_KEY (above) after '{' or ',', rewritten outside string literals only


def loads_lenient(text: str):
    """json.loads that also accepts fastjson's unquoted integer keys."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return json.loads(_quote_bare_keys(text))


def _quote_bare_keys(text: str) -> str:
    out = []
    # only rewrite outside string literals
    parts = re.split(r'("(?:[^"\\]|\\.)*")', text)
    for part in parts:
        if part.startswith('"') and part.endswith('"') and len(part) >= 2:
            out.append(part)
        else:
            out.append(_BARE_KEY.sub(lambda m: f'{m.group(1)}"{m.group(2)}"{m.group(3)}', part))
    return "".join(out)


def loads_body(body: bytes, what: str = "body"):
    """A JSON body of RocketMQ's (a route, cluster info, a config table), standard or with
    fastjson's bare integer keys; MalformedError (a WireError) naming `what` when it is not."""
    try:
        return loads_lenient(bytes(body).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise MalformedError(f"{what} body is not JSON: {e}") from None
