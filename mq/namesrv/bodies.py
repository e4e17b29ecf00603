"""Name server request and response bodies (spec 2.1), in the shapes fastjson
gives them.  Self-contained (json, zlib, struct) so brokers, clients and
tools can import it without the server.

    RegisterBrokerBody, JSON (compressed=false, the default):
        {"filterServerList":[..],"topicConfigSerializeWrapper":{"dataVersion":{"counter":N,"timestamp":T},
         "topicConfigTable":{"<topic>":TopicConfig,..}}}
      request version < 37 (V3_0_11): just the TopicConfigSerializeWrapper object.
    RegisterBrokerBody, compressed=true: zlib stream (BEST_COMPRESSION) of
        len 4 | DataVersion JSON | topicCount 4 | topicCount x (len 4 | "<name> <readQ> <writeQ> <perm> <filterType>")
        | len 4 | filterServerList JSON                     (big-endian signed ints, UTF-8 text)
    TopicRouteData (105):
        {"brokerDatas":[{"brokerAddrs":{0:"addr",1:"addr"},"brokerName":"b","cluster":"c"}],
         "filterServerTable":{..},["orderTopicConf":"..",]
         "queueDatas":[{"brokerName":"b","perm":6,"readQueueNums":4,"topicSysFlag":0,"writeQueueNums":4}]}
    ClusterInfo (106):
        {"brokerAddrTable":{"b":BrokerData},"clusterAddrTable":{"c":["b",..]}}
    TopicList (206, 224): {"topicList":[..]}          KVTable (219, register response): {"table":{"k":"v"}}

Invariants of the encoder (fastjson_dumps), matching fastjson 1.2 defaults:
* object keys in alphabetical order (fastjson sorts bean fields); integer map
  keys numerically; null values left out (beans and maps alike);
* integer map keys (brokerId) are written bare, `{0:"addr"}`, unless
  `standard` is set: then quoted `{"0":"addr"}` and non-ASCII escaped, as
  4.9.4+ does for version >= 401 or acceptStandardJsonOnly (route only);
* compact separators, UTF-8 output.
Decoders accept both key forms (mq.wire.fastjson.loads_body) and both
`topicSysFlag` and the pre-4.9 `topicSynFlag`.
"""
from __future__ import annotations

import json
import struct
import zlib
from dataclasses import dataclass, field
from typing import Any

from mq.wire.errors import MalformedError
from mq.wire.fastjson import loads_body
from mq.wire.topics import PERM_INHERIT, PERM_PRIORITY, PERM_READ, PERM_WRITE, TopicConfig  # noqa: F401 (re-exported)

STANDARD_JSON_MIN_VERSION = 401        # MQVersion V4_9_4: route answers in standard JSON from here on
FILTER_SERVER_BODY_MIN_VERSION = 37    # MQVersion V3_0_11: RegisterBrokerBody (else a bare wrapper)
MASTER_ID = 0                          # MixAll.MASTER_ID
NAMESPACE_ORDER_TOPIC_CONFIG = "ORDER_TOPIC_CONFIG"


REGISTER_BODY_INFLATED_MAX = 64 * 1024 * 1024   # bound on a compressed body once inflated
_I32 = struct.Struct(">i")


BodyError = MalformedError       # a body that is not what its request code says (a WireError)


# --------------------------------------------------------------------------------------------------
# fastjson-shaped encoder

def fastjson_dumps(value: Any, *, standard: bool = False) -> bytes:
    """value (dicts, lists, sets, scalars) as fastjson would write it; see the module docstring."""
    return _dump(value, standard).encode("utf-8")


def _dump(v: Any, standard: bool) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return json.dumps(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=standard)
    if isinstance(v, dict):
        parts = []
        for k in sorted(v, key=_key_order):
            item = v[k]
            if item is None:
                continue
            if isinstance(k, int) and not isinstance(k, bool):
                key = f'"{k}"' if standard else str(k)
            else:
                key = json.dumps(str(k), ensure_ascii=standard)
            parts.append(f"{key}:{_dump(item, standard)}")
        return "{" + ",".join(parts) + "}"
    if isinstance(v, (set, frozenset)):
        v = sorted(v)
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_dump(x, standard) for x in v) + "]"
    raise TypeError(f"cannot encode {type(v).__name__}")


def _key_order(k: Any) -> tuple:
    if isinstance(k, int) and not isinstance(k, bool):
        return (0, k, "")
    return (1, 0, str(k))


# --------------------------------------------------------------------------------------------------
# Values

def _int(obj: dict, key: str, default: int | None = None) -> int:
    v = obj.get(key, default)
    if v is None:
        raise BodyError(f"{key} is missing")
    if isinstance(v, bool):
        raise BodyError(f"{key}={v!r} is not an integer")
    try:
        return int(v)
    except (TypeError, ValueError):
        raise BodyError(f"{key}={v!r} is not an integer") from None


@dataclass(frozen=True)
class DataVersion:
    """A broker's topic-config version; equal when timestamp and counter are (spec 3.6)."""
    timestamp: int = 0
    counter: int = 0

    def to_obj(self) -> dict:
        return {"counter": self.counter, "timestamp": self.timestamp}

    @classmethod
    def from_obj(cls, obj: Any) -> "DataVersion":
        if obj is None:
            return cls()
        if not isinstance(obj, dict):
            raise BodyError(f"dataVersion is a {type(obj).__name__}, not an object")
        return cls(timestamp=_int(obj, "timestamp", 0), counter=_int(obj, "counter", 0))

    def encode(self) -> bytes:
        return fastjson_dumps(self.to_obj())

    @classmethod
    def decode(cls, body: bytes) -> "DataVersion":
        return cls.from_obj(_loads(body, "DataVersion"))


@dataclass
class RegisterBrokerBody:
    data_version: DataVersion = field(default_factory=DataVersion)
    topic_configs: dict[str, TopicConfig] = field(default_factory=dict)
    filter_servers: list[str] = field(default_factory=list)


def _loads(body: bytes, what: str) -> Any:
    return loads_body(body, what)


def _wrapper_from_obj(obj: Any) -> tuple[DataVersion, dict[str, TopicConfig]]:
    if not isinstance(obj, dict):
        raise BodyError("topicConfigSerializeWrapper is not an object")
    table = obj.get("topicConfigTable") or {}
    if not isinstance(table, dict):
        raise BodyError("topicConfigTable is not an object")
    configs = {}
    for key, tc in table.items():
        config = TopicConfig.from_obj(tc, key)
        configs[config.topic_name] = config
    return DataVersion.from_obj(obj.get("dataVersion")), configs


def decode_register_broker_body(body: bytes, compressed: bool = False,
                                version: int = FILTER_SERVER_BODY_MIN_VERSION) -> RegisterBrokerBody:
    """The body of REGISTER_BROKER.  An empty body is an empty table at DataVersion(0, 0), as Java
    does.  Raises BodyError for anything that does not parse."""
    if not body:
        return RegisterBrokerBody()
    if version < FILTER_SERVER_BODY_MIN_VERSION:
        dv, configs = _wrapper_from_obj(_loads(body, "TopicConfigSerializeWrapper"))
        return RegisterBrokerBody(dv, configs, [])
    if compressed:
        return _decode_compressed(body)
    obj = _loads(body, "RegisterBrokerBody")
    if not isinstance(obj, dict):
        raise BodyError("RegisterBrokerBody is not an object")
    dv, configs = _wrapper_from_obj(obj.get("topicConfigSerializeWrapper") or {})
    servers = obj.get("filterServerList") or []
    if not isinstance(servers, list):
        raise BodyError("filterServerList is not a list")
    return RegisterBrokerBody(dv, configs, [str(s) for s in servers])


def _decode_compressed(body: bytes) -> RegisterBrokerBody:
    d = zlib.decompressobj()
    try:
        raw = d.decompress(bytes(body), REGISTER_BODY_INFLATED_MAX)
    except zlib.error as e:
        raise BodyError(f"compressed RegisterBrokerBody does not inflate: {e}") from None
    if d.unconsumed_tail:
        raise BodyError(f"compressed RegisterBrokerBody inflates past {REGISTER_BODY_INFLATED_MAX} bytes")
    pos = 0

    def take(n: int) -> bytes:
        nonlocal pos
        if n < 0 or pos + n > len(raw):
            raise BodyError(f"compressed RegisterBrokerBody cut short at byte {pos} (wanted {n})")
        chunk = raw[pos:pos + n]
        pos += n
        return chunk

    def take_int() -> int:
        return _I32.unpack(take(4))[0]

    dv = DataVersion.decode(take(take_int()))
    configs = {}
    for _ in range(take_int()):
        try:
            text = take(take_int()).decode("utf-8")
        except UnicodeDecodeError:
            raise BodyError("compact topic config is not UTF-8") from None
        tc = TopicConfig.from_compact(text)
        configs[tc.topic_name] = tc
    servers_raw = take(take_int())
    try:   # Java logs a bad list and carries on with an empty one
        servers = [str(s) for s in json.loads(servers_raw.decode("utf-8")) or []]
    except (ValueError, TypeError):
        servers = []
    return RegisterBrokerBody(dv, configs, servers)


def encode_register_broker_body(rb: RegisterBrokerBody, compressed: bool = False) -> bytes:
    """What a broker sends (BrokerOuterAPI): the JSON form, or the zlib form when compressed."""
    if not compressed:
        return fastjson_dumps({
            "filterServerList": list(rb.filter_servers),
            "topicConfigSerializeWrapper": {
                "dataVersion": rb.data_version.to_obj(),
                "topicConfigTable": {name: tc.to_obj() for name, tc in rb.topic_configs.items()},
            },
        })
    parts = []
    dv = rb.data_version.encode()
    parts += [_I32.pack(len(dv)), dv, _I32.pack(len(rb.topic_configs))]
    for tc in rb.topic_configs.values():
        text = tc.compact().encode("utf-8")
        parts += [_I32.pack(len(text)), text]
    servers = json.dumps(list(rb.filter_servers), separators=(",", ":")).encode()
    parts += [_I32.pack(len(servers)), servers]
    return zlib.compress(b"".join(parts), 9)


def decode_json_body(body: bytes, what: str = "body") -> Any:
    """Any name server JSON body (route, cluster info, topic list, KV table), either key form."""
    return _loads(body, what)
