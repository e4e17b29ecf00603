"""Runs the official RocketMQ 5.x Python client (rocketmq-python-client) for a test, in the
interpreter of its own venv (.venv-client5: its top-level package `rocketmq` is also the
official 4.x C++ client's, so the two cannot share the tests' venv).

    <client5 python> client5.py '<json request>'   ->   one JSON line on stdout

Requests:
    {"op": "produce", "endpoint": "host:port", "topic": T,
     "messages": [{"body": str, "tag": str?, "keys": [str]?, "props": {k: v}?, "group": str?}]}
        -> {"sent": [{"message_id": id} | {"error": text}, ...]}

Nothing here checks anything: the test reads the answer and the broker."""
import json
import sys


def produce(req: dict) -> dict:
    from rocketmq import ClientConfiguration, Credentials, Message, Producer
    producer = Producer(ClientConfiguration(req["endpoint"], Credentials()), (req["topic"],))
    producer.startup()
    sent = []
    try:
        for spec in req["messages"]:
            m = Message()
            m.topic = req["topic"]
            m.body = spec["body"].encode()
            if spec.get("tag"):
                m.tag = spec["tag"]
            if spec.get("keys"):
                for key in spec["keys"]:          # the setter adds one key (a set: order is not kept)
                    m.keys = key
            if spec.get("group"):
                m.message_group = spec["group"]
            for k, v in (spec.get("props") or {}).items():
                m.add_property(k, v)
            try:
                receipt = producer.send(m)
                sent.append({"message_id": receipt.message_id})
            except Exception as e:            # the test decides what an error means
                sent.append({"error": f"{type(e).__name__}: {e}"})
    finally:
        producer.shutdown()
    return {"sent": sent}


if __name__ == "__main__":
    request = json.loads(sys.argv[1])
    print(json.dumps({"produce": produce}[request["op"]](request)), flush=True)
