"""Runs the official RocketMQ 5.x Python client (rocketmq-python-client) for a test, in the
interpreter of its own venv (.venv-client5: its top-level package `rocketmq` is also the
official 4.x C++ client's, so the two cannot share the tests' venv).

    <client5 python> client5.py '<json request>'   ->   one JSON line on stdout

Requests:
    {"op": "produce", "endpoint": "host:port", "topic": T,
     "messages": [{"body": str, "topic": T?, "tag": str?, "keys": [str]?, "props": {k: v}?, "group": str?,
                   "delay_s": int?, "tx": "commit" | "rollback" | "leave"?, "recall": bool?}],
     "wait_checks": N?, "check_answer": "commit" | "rollback"?, "linger_s": s?}
        -> {"sent": [{"message_id": id, "recall_handle": h} | {"error": text}, ...], "checked": [ids]}
        ("recall": the producer recalls the timer message right after sending it)
        ("topic": a message's own topic instead of the request's; the producer knows them all)
        (with a "tx" message the producer has a TransactionChecker answering check_answer; it
        waits for wait_checks checks, then linger_s)
    {"op": "receive", "endpoint", "group", "topic", "expression"?: "*", "want": N, "invisible_s": 15,
     "then": "ack" | "keep" | "change", "change_s"?: 1, "timeout_s": 60, "await_s"?: 2}
        SimpleConsumer: receives until `want` distinct messages came (or timeout_s), asking for
        no more than are still wanted; acks each, leaves it (keep), or sets its invisible time
        to change_s (change)
        -> {"received": [message...], "errors": [text...]}
    {"op": "push", "endpoint", "group", "topic", "want": N, "fail_first": K, "fail_bodies": [...],
     "timeout_s": 60}
        PushConsumer: the listener answers FAILURE for the first K deliveries and for every
        delivery of a message whose body is in fail_bodies, SUCCESS otherwise;
        runs until `want` SUCCESS answers (or timeout_s)
        -> {"received": [message... (every delivery, in order)]}
A message is {"message_id", "topic", "body", "tag", "keys", "props", "attempt", "group"}.
Every request may name an ACL account: "ak", "sk" (the client's Credentials; default none).

Nothing here checks anything: the test reads the answer and the broker."""
import json
import sys
import time


def produce(req: dict) -> dict:
    from rocketmq import (ClientConfiguration, Credentials, Message, Producer, TransactionChecker,
                          TransactionResolution)
    checked = []

    class Checker(TransactionChecker):
        def check(self, message):
            checked.append(message.message_id)
            return TransactionResolution.COMMIT if req.get("check_answer") == "commit" else TransactionResolution.ROLLBACK
    transactional = any(spec.get("tx") for spec in req["messages"])
    topics = tuple(dict.fromkeys([req["topic"]] + [spec["topic"] for spec in req["messages"] if spec.get("topic")]))
    producer = Producer(ClientConfiguration(req["endpoint"], Credentials(req.get("ak", ""), req.get("sk", ""))), topics,
                        checker=Checker() if transactional else None)
    producer.startup()
    sent = []
    try:
        for spec in req["messages"]:
            m = Message()
            m.topic = spec.get("topic") or req["topic"]
            m.body = spec["body"].encode()
            if spec.get("tag"):
                m.tag = spec["tag"]
            if spec.get("keys"):
                for key in spec["keys"]:          # the setter adds one key (a set: order is not kept)
                    m.keys = key
            if spec.get("group"):
                m.message_group = spec["group"]
            if spec.get("delay_s"):
                m.delivery_timestamp = int(time.time()) + spec["delay_s"]    # the field is whole seconds
            for k, v in (spec.get("props") or {}).items():
                m.add_property(k, v)
            try:
                if spec.get("tx"):
                    transaction = producer.begin_transaction()
                    receipt = producer.send(m, transaction)
                    if spec["tx"] == "commit":
                        transaction.commit()
                    elif spec["tx"] == "rollback":
                        transaction.rollback()
                else:
                    receipt = producer.send(m)
                sent.append({"message_id": receipt.message_id, "recall_handle": receipt.recall_handle})
                if spec.get("recall"):
                    producer.recall_message(m.topic, receipt.recall_handle)
            except Exception as e:            # the test decides what an error means
                sent.append({"error": f"{type(e).__name__}: {e}"})
        deadline = time.monotonic() + req.get("checks_timeout_s", 60)
        while len(checked) < req.get("wait_checks", 0) and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(req.get("linger_s", 0))          # the checker's EndTransaction goes out
    finally:
        producer.shutdown()
    return {"sent": sent, "checked": checked}


def _message(m) -> dict:
    return {"message_id": m.message_id, "topic": m.topic, "body": m.body.decode(errors="replace"), "tag": m.tag,
            "keys": sorted(m.keys or ()), "props": dict(m.properties or {}), "attempt": m.delivery_attempt,
            "group": m.message_group}


def receive(req: dict) -> dict:
    from rocketmq import ClientConfiguration, Credentials, FilterExpression, SimpleConsumer
    consumer = SimpleConsumer(ClientConfiguration(req["endpoint"], Credentials(req.get("ak", ""), req.get("sk", ""))), req["group"],
                              {req["topic"]: FilterExpression(req.get("expression", "*"))},
                              await_duration=req.get("await_s", 2))
    consumer.startup()
    got, seen, errors = [], set(), []
    deadline = time.monotonic() + req.get("timeout_s", 60)
    try:
        while len(seen) < req["want"] and time.monotonic() < deadline:
            try:
                msgs = consumer.receive(min(32, req["want"] - len(seen)), req.get("invisible_s", 15))
            except Exception as e:
                errors.append(f"{type(e).__name__}: {e}")
                time.sleep(0.2)
                continue
            for m in msgs or ():
                got.append(_message(m))
                seen.add(m.message_id)
                then = req.get("then", "ack")
                if then == "ack":
                    consumer.ack(m)
                elif then == "change":
                    consumer.change_invisible_duration(m, req.get("change_s", 1))
    finally:
        consumer.shutdown()
    return {"received": got, "errors": errors}


def push(req: dict) -> dict:
    import threading
    from rocketmq import ClientConfiguration, ConsumeResult, Credentials, FilterExpression, MessageListener, PushConsumer
    got, lock, done = [], threading.Lock(), threading.Event()
    fail_left = [req.get("fail_first", 0)]
    ok = [0]

    class Listener(MessageListener):
        def consume(self, message):
            with lock:
                got.append(_message(message))
                if message.body.decode(errors="replace") in req.get("fail_bodies", ()):
                    return ConsumeResult.FAILURE
                if fail_left[0] > 0:
                    fail_left[0] -= 1
                    return ConsumeResult.FAILURE
                ok[0] += 1
                if ok[0] >= req["want"]:
                    done.set()
                return ConsumeResult.SUCCESS

    consumer = PushConsumer(ClientConfiguration(req["endpoint"], Credentials(req.get("ak", ""), req.get("sk", ""))), req["group"], Listener(),
                            {req["topic"]: FilterExpression("*")})
    consumer.startup()
    try:
        done.wait(req.get("timeout_s", 60))
    finally:
        consumer.shutdown()
    with lock:
        return {"received": list(got)}


if __name__ == "__main__":
    request = json.loads(sys.argv[1])
    ops = {"produce": produce, "receive": receive, "push": push}
    print(json.dumps(ops[request["op"]](request)), flush=True)
