"""`python -m mq.cli.demo_client [NAMESRV]`: send ten messages to DemoTopic with
our Python client and consume them back in a new group (try it against
`make run`)."""
from __future__ import annotations

import sys
import threading
import uuid

from mq.client import CONSUME_SUCCESS, FIRST, Message
from mq.client.sync import SyncProducer, SyncPushConsumer


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ns = argv[0] if argv else "127.0.0.1:9876"
    topic = "DemoTopic"
    producer = SyncProducer("demo_producer", ns)
    producer.start()
    try:
        for i in range(10):
            r = producer.send(Message(topic, f"hello {i}", tags="TagA", keys=f"k{i}"))
            print(f"sent hello {i}: {r.status.name} msgId={r.msg_id} queue={r.queue.queue_id} offset={r.queue_offset}")
    finally:
        producer.shutdown()
    got = []
    done = threading.Event()

    def on_message(msg):
        got.append(msg.body.decode())
        print(f"received {msg.body.decode()!r} from queue {msg.queue_id} offset {msg.queue_offset}")
        if len(got) >= 10:
            done.set()
        return CONSUME_SUCCESS

    consumer = SyncPushConsumer(f"demo_group_{uuid.uuid4().hex[:8]}", ns, consume_from=FIRST, listener=on_message)
    consumer.subscribe(topic, "*")
    consumer.start()
    try:
        ok = done.wait(30)
    finally:
        consumer.shutdown()
    print("all ten consumed" if ok else f"only {len(got)} consumed within 30 s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
