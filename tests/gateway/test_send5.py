"""The official 5.x producer against the broker's gRPC endpoint: what it sends is stored as a
4.x message a 4.x consumer reads (tag, keys, user properties, UNIQ_KEY = the 5.x message id),
at the offset its answer names."""
from tests.gateway.helpers import run_client5, wait_messages


def test_official_producer_messages_read_as_4x(gateway):
    topic = "G5Send"
    gateway.create_topic(topic)
    specs = [{"body": f"body-{i}", "tag": f"tag{i % 3}", "keys": [f"k{i}", "shared"],
              "props": {"color": "red", "n": str(i)}} for i in range(20)]
    out = run_client5({"op": "produce", "endpoint": gateway.endpoint, "topic": topic, "messages": specs})
    ids = [r.get("message_id") for r in out["sent"]]
    assert all(ids), out["sent"]
    assert len(set(ids)) == 20
    stored = {m.properties["UNIQ_KEY"]: m for m in wait_messages(gateway, topic, 20)}
    assert sorted(stored) == sorted(ids)
    for spec, mid in zip(specs, ids):
        m = stored[mid]
        assert m.body == spec["body"].encode()
        assert m.tags == spec["tag"]
        assert sorted(m.keys.split(" ")) == sorted(spec["keys"])
        assert m.properties["color"] == "red" and m.properties["n"] == spec["props"]["n"]
        assert m.properties["PGROUP"] == topic           # a 5.x producer's group is its topic
        assert m.properties["RECONSUME_TIME"] == "0"
    # round robin over the broker's four write queues
    assert {m.queue_id for m in stored.values()} == {0, 1, 2, 3}


def test_producer_to_a_missing_topic_gets_an_error_not_a_hang(gateway):
    out = run_client5({"op": "produce", "endpoint": gateway.endpoint, "topic": "G5NoSuchTopic",
                       "messages": [{"body": "x"}]})
    assert "error" in out["sent"][0], out
    assert "route" in out["sent"][0]["error"]
