"""The admin bodies a broker answers, in RocketMQ 4.9.8's classes as fastjson writes them
(mq.wire.fastjson), so RocketMQ's mqadmin, rocketmq-dashboard and rocketmq-exporter decode
them; and their decoders, for our tools.  Fields in alphabetical order, as fastjson sorts them;
MQ stands for a MessageQueue key {"brokerName":..,"queueId":..,"topic":..} (object keys: not
standard JSON).

    ConsumeStats (208)            {"consumeTps":D,"offsetTable":{MQ:{"brokerOffset":L,"consumerOffset":L,
                                   "lastTimestamp":L},..}}                              HashMap
    TopicStatsTable (202)         {"offsetTable":{MQ:{"lastUpdateTimestamp":L,"maxOffset":L,"minOffset":L},..}}
    ConsumeStatsList (317)        {"brokerAddr":S,"consumeStatsList":[{group:[ConsumeStats,..]},..],"totalDiff":L}
    ConsumerConnection (203)      {"connectionSet":[Connection,..],"consumeFromWhere":E,"consumeType":E,
                                   "messageModel":E,"subscriptionTable":{topic:SubscriptionData}}
    ProducerConnection (204)      {"connectionSet":[Connection,..]}
      Connection                  {"clientAddr":S,"clientId":S,"language":E,"version":I}
      SubscriptionData            {"classFilterMode":B,"codeSet":[I],"expressionType":S,"subString":S,
                                   "subVersion":L,"tagsSet":[S],"topic":S}
    KVTable (28, 219)             {"table":{S:S,..}}
    BrokerStatsData (315)         {"statsDay":Item,"statsHour":Item,"statsMinute":Item}, Item {"avgpt":D,"sum":L,"tps":D}
    GroupList (300)               {"groupList":[S,..]}                                  HashSet
    LockBatchResponseBody (41)    {"lockOKMQSet":[MQ,..]}                               HashSet
    QueryConsumeQueueResponseBody (321)
                                  {"filterData":S,"maxQueueIndex":L,"minQueueIndex":L,"queueData":[
                                   {"eval":B,"physicOffset":L,"physicSize":I,"tagsCode":L},..],
                                   "subscriptionData":SubscriptionData}   (filterData, subscriptionData
                                   only when a consumer group was asked about)

Where a Java broker builds a HashMap or HashSet, the builders take the entries in the order the
Java broker inserts them and write them in that map's iteration order; a HashSet<Connection>
(identity hashes) is written sorted by clientId.  The decoders return plain rows (dicts) sorted
by (topic, brokerName, queueId)."""
from __future__ import annotations

from typing import Any, Iterable

from .fastjson import Bean, JavaMap, Key, dumps, hashset, java_hash, java_string_hash, loads

__all__ = ["encode_consume_stats", "consume_stats", "decode_consume_stats", "encode_topic_stats",
           "decode_topic_stats", "encode_consume_stats_list", "decode_consume_stats_list", "connection",
           "subscription_data", "encode_consumer_connection", "encode_producer_connection",
           "decode_connections", "encode_kv_table", "encode_broker_stats_data", "encode_group_list",
           "encode_lock_batch", "encode_query_consume_queue", "decode_query_consume_queue",
           "RUNTIME_INFO_CAPACITY"]

RUNTIME_INFO_CAPACITY = 64       # StoreStatsService.getRuntimeInfo's new HashMap<>(64)
_ROW_ORDER = ("topic", "brokerName", "queueId")


def _mq(row: dict) -> Key:
    return Key.message_queue(row["topic"], row["brokerName"], int(row["queueId"]))


def _rows(table: Any, what: str) -> list[dict]:
    """A {MQ: fields} map (or, from an older broker of ours, a list of rows) as sorted rows."""
    if isinstance(table, list):
        rows = [dict(r) for r in table]
    elif isinstance(table, dict):
        rows = []
        for k, v in table.items():
            if not isinstance(k, Key) or not isinstance(v, dict):
                raise ValueError(f"{what}: an entry {k!r} is not a MessageQueue key with an object")
            rows.append({**k.fields(), **v})
    elif table is None:
        rows = []
    else:
        raise ValueError(f"{what}: offsetTable is a {type(table).__name__}")
    return sorted(rows, key=lambda r: (r.get("topic", ""), r.get("brokerName", ""), int(r.get("queueId", 0))))


def _object(body: bytes, what: str) -> dict:
    try:
        data = loads(body or b"{}")
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"{what} is not JSON: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{what} is not a JSON object")
    return data


# ---- ConsumeStats, TopicStatsTable, ConsumeStatsList --------------------------------------------------

def consume_stats(rows: Iterable[dict], consume_tps: float) -> Bean:
    """rows: {topic, brokerName, queueId, brokerOffset, consumerOffset, lastTimestamp} in the
    order AdminBrokerProcessor puts them (topic by topic, queue 0 up)."""
    table = {_mq(r): Bean(brokerOffset=int(r["brokerOffset"]), consumerOffset=int(r["consumerOffset"]),
                          lastTimestamp=int(r.get("lastTimestamp") or 0)) for r in rows}
    return Bean(consumeTps=float(consume_tps), offsetTable=JavaMap.hashmap(table))


def encode_consume_stats(rows: Iterable[dict], consume_tps: float) -> bytes:
    return dumps(consume_stats(rows, consume_tps))


def decode_consume_stats(body: bytes) -> tuple[list[dict], float]:
    """(rows, consumeTps); each row also gets `diff` = brokerOffset - consumerOffset (what
    ConsumeStats.computeTotalDiff sums)."""
    data = _object(body, "ConsumeStats")
    return _stats_rows(data), float(data.get("consumeTps") or 0.0)


def _stats_rows(data: dict) -> list[dict]:
    rows = _rows(data.get("offsetTable"), "ConsumeStats")
    for r in rows:
        r["diff"] = int(r.get("brokerOffset", 0)) - int(r.get("consumerOffset", 0))
    return rows


def encode_topic_stats(rows: Iterable[dict]) -> bytes:
    """rows: {topic, brokerName, queueId, minOffset, maxOffset, lastUpdateTimestamp}, queue 0 up."""
    table = {_mq(r): Bean(lastUpdateTimestamp=int(r.get("lastUpdateTimestamp") or 0),
                          maxOffset=int(r["maxOffset"]), minOffset=int(r["minOffset"])) for r in rows}
    return dumps(Bean(offsetTable=JavaMap.hashmap(table)))


def decode_topic_stats(body: bytes) -> list[dict]:
    return _rows(_object(body, "TopicStatsTable").get("offsetTable"), "TopicStatsTable")


def encode_consume_stats_list(broker_addr: str, groups: Iterable[tuple[str, list[Bean]]], total_diff: int) -> bytes:
    """groups: (group, [consume_stats(..) per topic]) in the broker's group order."""
    return dumps(Bean(brokerAddr=broker_addr, totalDiff=int(total_diff),
                      consumeStatsList=[JavaMap.hashmap({g: stats}) for g, stats in groups]))


def decode_consume_stats_list(body: bytes) -> dict:
    """{"brokerAddr", "totalDiff", "groups": [(group, [(rows, consumeTps), ..]), ..]}."""
    data = _object(body, "ConsumeStatsList")
    groups = []
    for entry in data.get("consumeStatsList") or []:
        for group, stats in (entry or {}).items():
            groups.append((group, [(_stats_rows(s), float(s.get("consumeTps") or 0.0)) for s in stats or []]))
    return {"brokerAddr": data.get("brokerAddr"), "totalDiff": int(data.get("totalDiff") or 0), "groups": groups}


# ---- connections -------------------------------------------------------------------------------------

def connection(client_id: str, client_addr: str, language: str, version: int) -> Bean:
    return Bean(clientAddr=client_addr, clientId=client_id, language=language, version=int(version))


def subscription_data(topic: str, sub_string: str, tags: Iterable[str], sub_version: int,
                      expression_type: str = "TAG", class_filter_mode: bool = False) -> Bean:
    """SubscriptionData as the broker holds it from a heartbeat: tagsSet and codeSet (each tag's
    String.hashCode(), what the client sends) are HashSets."""
    tags = [str(t) for t in tags]
    return Bean(classFilterMode=bool(class_filter_mode), codeSet=hashset(java_string_hash(t) for t in tags),
                expressionType=expression_type, subString=sub_string, subVersion=int(sub_version),
                tagsSet=hashset(tags), topic=topic)


def encode_consumer_connection(conns: Iterable[Bean], subscriptions: dict[str, Bean], consume_type: str,
                               message_model: str, consume_from_where: str) -> bytes:
    """subscriptions: topic -> subscription_data(..), in the group's order (a ConcurrentHashMap)."""
    return dumps(Bean(connectionSet=sorted(conns, key=lambda c: c["clientId"]), consumeFromWhere=consume_from_where,
                      consumeType=consume_type, messageModel=message_model,
                      subscriptionTable=JavaMap.chm(subscriptions)))


def encode_producer_connection(conns: Iterable[Bean]) -> bytes:
    return dumps(Bean(connectionSet=sorted(conns, key=lambda c: c["clientId"])))


def decode_connections(body: bytes) -> dict:
    """ConsumerConnection or ProducerConnection as plain values (connectionSet sorted by clientId)."""
    data = _object(body, "connection list")
    data["connectionSet"] = sorted(data.get("connectionSet") or [], key=lambda c: str(c.get("clientId", "")))
    return data


# ---- small ones --------------------------------------------------------------------------------------

def encode_kv_table(table: dict[str, str], initial_capacity: int = 16) -> bytes:
    """KVTable of a HashMap(initial_capacity) filled in `table`'s order; values as strings."""
    return dumps(Bean(table=JavaMap.hashmap({str(k): str(v) for k, v in table.items()}, initial_capacity)))


def encode_broker_stats_data(data: dict) -> bytes:
    """data: {"statsMinute"|"statsHour"|"statsDay": {"sum", "tps", "avgpt"}}."""
    def item(d: dict) -> Bean:
        return Bean(avgpt=float(d.get("avgpt") or 0.0), sum=int(d.get("sum") or 0), tps=float(d.get("tps") or 0.0))
    return dumps(Bean(**{k: item(v) for k, v in data.items()}))


def encode_group_list(groups: Iterable[str]) -> bytes:
    """GroupList: the groups in HashSet order (inserted as given)."""
    return dumps(Bean(groupList=hashset(groups)))


def encode_lock_batch(mqs: Iterable[dict]) -> bytes:
    """LockBatchResponseBody: the locked queues, a HashSet<MessageQueue>."""
    keys = [Key.message_queue(str(m.get("topic")), str(m.get("brokerName")), int(m.get("queueId", 0))) for m in mqs]
    return dumps(Bean(lockOKMQSet=[Bean(k.fields()) for k in hashset(keys, java_hash)]))


def encode_query_consume_queue(min_index: int, max_index: int, entries: Iterable[tuple[int, int, int]] | None,
                               subscription: Bean | None = None, filter_data: str | None = None) -> bytes:
    """entries: (physicOffset, physicSize, tagsCode) from the asked index on (None: the index is
    not there, no queueData)."""
    queue_data = None if entries is None else [
        Bean(eval=False, physicOffset=int(p), physicSize=int(s), tagsCode=int(t)) for p, s, t in entries]
    return dumps(Bean(filterData=filter_data, maxQueueIndex=int(max_index), minQueueIndex=int(min_index),
                      queueData=queue_data, subscriptionData=subscription))


def decode_query_consume_queue(body: bytes) -> dict:
    return _object(body, "QueryConsumeQueueResponseBody")
