"""RouteInfoManager and the body codecs as units: exact rules with a fake clock,
no sockets."""
from __future__ import annotations

import json
import struct
import zlib

import pytest

from mq.namesrv.bodies import (BodyError, DataVersion, RegisterBrokerBody, TopicConfig, decode_json_body,
                               decode_register_broker_body, encode_register_broker_body, fastjson_dumps)
from mq.namesrv.routeinfo import RouteInfoManager

DV1, DV2 = DataVersion(1700000000000, 1), DataVersion(1700000000000, 2)


class Clock:
    def __init__(self):
        self.ms = 1_000_000

    def __call__(self):
        return self.ms


def tc(name, read=4, write=4, perm=6, sys_flag=0):
    return TopicConfig(name, read, write, perm, sys_flag)


def reg(rim, addr="a:1", name="broker-a", bid=0, topics=(), dv=DV1, conn=None, cluster="C", ha=None):
    result = rim.register_broker(cluster, addr, name, bid, ha or addr + "-ha", dv,
                                 {t.topic_name: t for t in topics}, [], conn)
    rim.check_invariants()
    return result


def test_expiry_boundary_is_strictly_older_than_expired_ms():
    """A broker is removed only when lastUpdate + brokerExpiredMillis < now (Java's comparison):
    exactly at the limit it stays, one ms later it goes, and a registration renews it."""
    clock = Clock()
    rim = RouteInfoManager(expired_ms=1000, clock_ms=clock)
    reg(rim, topics=[tc("T")])
    clock.ms += 1000
    assert rim.scan_not_active_brokers() == []
    clock.ms += 1
    reg(rim, topics=[tc("T")])            # renewed
    clock.ms += 1000
    assert rim.scan_not_active_brokers() == []
    clock.ms += 1
    gone = rim.scan_not_active_brokers()
    assert [addr for addr, _ in gone] == ["a:1"]
    assert rim.topic_queue_table == {} and rim.broker_addr_table == {} and rim.cluster_addr_table == {}
    rim.check_invariants()


def test_same_address_new_id_replaces_old_entry():
    """A slave promoted to master re-registers its address under id 0: the old id-1 entry of that
    address is dropped so an address appears once (RocketMQ's slave -> master switch)."""
    rim = RouteInfoManager()
    reg(rim, addr="m:1", bid=0, topics=[tc("T")])
    reg(rim, addr="s:1", bid=1)
    rim.unregister_broker("C", "m:1", "broker-a", 0)
    assert rim.broker_addr_table["broker-a"].brokerAddrs == {1: "s:1"}
    reg(rim, addr="s:1", bid=0, topics=[tc("T")])
    assert rim.broker_addr_table["broker-a"].brokerAddrs == {0: "s:1"}


def test_master_death_keeps_queue_data_until_last_address_goes():
    """Dropping the master leaves the slave and the topic's QueueData (consumers read from the
    slave); dropping the slave removes the queue data, empty topics, the brokerName and its cluster,
    but not other brokers' topics."""
    rim = RouteInfoManager()
    reg(rim, addr="m:1", topics=[tc("T"), tc("Shared")])
    reg(rim, addr="s:1", bid=1)
    reg(rim, addr="b:1", name="broker-b", cluster="C", topics=[tc("Shared"), tc("OnlyB")])
    rim.on_broker_gone("m:1")
    rim.check_invariants()
    route = rim.pickup_topic_route_data("T")
    assert route["brokerDatas"][0]["brokerAddrs"] == {1: "s:1"}
    assert route["queueDatas"][0]["brokerName"] == "broker-a"
    rim.on_broker_gone("s:1")
    rim.check_invariants()
    assert rim.pickup_topic_route_data("T") is None
    assert [q["brokerName"] for q in rim.pickup_topic_route_data("Shared")["queueDatas"]] == ["broker-b"]
    assert rim.cluster_addr_table == {"C": {"broker-b"}}


def test_slave_response_needs_a_live_master():
    """masterAddr/haServerAddr are filled for a slave only while id 0 of its brokerName is in the
    live table; the master itself never gets them."""
    rim = RouteInfoManager()
    assert reg(rim, addr="m:1", ha="m:2").master_addr is None
    r = reg(rim, addr="s:1", bid=1)
    assert (r.master_addr, r.ha_server_addr) == ("m:1", "m:2")
    del rim.broker_live_table["m:1"]      # e.g. mid-expiry: the address is still in brokerAddrs
    r = reg(rim, addr="s:1", bid=1)
    assert (r.master_addr, r.ha_server_addr) == (None, None)


def test_connection_close_removes_only_brokers_of_that_connection():
    """on_connection_closed matches brokers by the connection they last registered on."""
    rim = RouteInfoManager()
    c1, c2 = object(), object()
    reg(rim, addr="a:1", topics=[tc("T")], conn=c1)
    reg(rim, addr="b:1", name="broker-b", topics=[tc("U")], conn=c2)
    assert rim.on_connection_closed(object()) == []
    assert rim.on_connection_closed(c1) == ["a:1"]
    rim.check_invariants()
    assert rim.pickup_topic_route_data("T") is None and rim.pickup_topic_route_data("U") is not None


def test_fastjson_encoder_shapes():
    """Bare integer keys by default, quoted in standard mode; keys sorted (ints numerically);
    nulls skipped; non-ASCII raw by default and escaped in standard mode."""
    obj = {"b": {10: "x", 2: "y"}, "a": None, "c": ["é"], "d": True}
    assert fastjson_dumps(obj) == '{"b":{2:"y",10:"x"},"c":["é"],"d":true}'.encode()
    assert fastjson_dumps(obj, standard=True) == b'{"b":{"2":"y","10":"x"},"c":["\\u00e9"],"d":true}'
    assert decode_json_body(fastjson_dumps(obj)) == {"b": {"2": "y", "10": "x"}, "c": ["é"], "d": True}


def test_register_body_forms_decode():
    """The JSON body (fastjson's own output, here with a pre-4.9 `topicSynFlag`), the pre-V3_0_11
    bare wrapper, the compressed form (our encoder and a hand-built stream agree) and an empty body
    (DataVersion 0/0, no topics) all decode; garbage raises BodyError."""
    body = json.dumps({"filterServerList": ["f:1"], "topicConfigSerializeWrapper": {
        "dataVersion": {"counter": 7, "timestamp": 5},
        "topicConfigTable": {"T": {"perm": 6, "readQueueNums": 3, "topicName": "T", "topicSynFlag": 1,
                                   "writeQueueNums": 2}}}}).encode()
    rb = decode_register_broker_body(body)
    assert rb.data_version == DataVersion(5, 7) and rb.filter_servers == ["f:1"]
    assert rb.topic_configs["T"] == TopicConfig("T", 3, 2, 6, 1)

    wrapper = json.dumps({"dataVersion": {"counter": 1, "timestamp": 2},
                          "topicConfigTable": {"W": {"topicName": "W", "perm": 7}}}).encode()
    old = decode_register_broker_body(wrapper, version=36)
    assert old.data_version == DataVersion(2, 1) and old.topic_configs["W"].perm == 7

    ours = RegisterBrokerBody(DataVersion(9, 4), {"Z": TopicConfig("Z", 8, 8, 6)}, [])
    packed = encode_register_broker_body(ours, compressed=True)
    assert decode_register_broker_body(packed, compressed=True) == ours
    dv = b'{"counter":4,"timestamp":9}'
    line = b"Z 8 8 6 SINGLE_TAG"
    by_hand = zlib.compress(struct.pack(">i", len(dv)) + dv + struct.pack(">ii", 1, len(line)) + line
                            + struct.pack(">i", 2) + b"[]")
    assert decode_register_broker_body(by_hand, compressed=True) == ours
    assert decode_register_broker_body(encode_register_broker_body(ours)) == ours

    assert decode_register_broker_body(b"") == RegisterBrokerBody()
    for bad, compressed in ((b"[1,2]", False), (b"\xff\xfe", False), (b"not zlib", True),
                            (zlib.compress(b"\x00\x00\x00\x10{}"), True)):
        with pytest.raises(BodyError):
            decode_register_broker_body(bad, compressed=compressed)
