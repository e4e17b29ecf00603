"""`python -m mq.cli.demo_client [NAMESRV] [--access-key AK --secret-key SK]`: send ten messages
to DemoTopic with our Python client and consume them back in a new group (try it against
`make run`).

Exit status 0 when all ten came back, 1 otherwise; a failure is one line on stderr (no name
server, a refused send -- an ACL broker without an account, a missing topic -- or a bad
address), never a traceback."""
from __future__ import annotations

import argparse
import os
import socket
import sys
import threading
import uuid

from mq.client import CONSUME_SUCCESS, FIRST, Message
from mq.client.errors import MQBrokerError, MQClientError, RemotingError
from mq.client.sync import SyncProducer, SyncPushConsumer

TOPIC = "DemoTopic"
MESSAGES = 10
CONSUME_WAIT_S = 30
CONNECT_TIMEOUT_S = 3.0


class DemoError(Exception):
    """What went wrong, as the one line to print."""


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m mq.cli.demo_client",
                                 description=f"Send {MESSAGES} messages to {TOPIC} and consume them back in a new group.")
    ap.add_argument("namesrv", nargs="?", default=os.environ.get("NAMESRV_ADDR") or "127.0.0.1:9876",
                    help="name server host:port (default: $NAMESRV_ADDR, else 127.0.0.1:9876)")
    ap.add_argument("--access-key", help="an account of the broker's plain_acl.yml (a broker with aclEnable=true)")
    ap.add_argument("--secret-key", help="that account's secret key")
    return ap


def check_namesrv(addr: str) -> None:
    """DemoError unless something accepts connections at the first name server of `addr`."""
    first = addr.split(";")[0].strip()
    host, sep, port = first.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise DemoError(f"bad name server address {first!r}: expected host:port")
    try:
        socket.create_connection((host, int(port)), CONNECT_TIMEOUT_S).close()
    except OSError as e:
        raise DemoError(f"no name server answers at {first} ({e.strerror or e}): start one with `make run`, "
                        "or give its address") from None


def explain(e: BaseException) -> str:
    """One line for a client error; a refusal by ACL says how to pass an account."""
    text = str(e)
    if "AclException" in text or (isinstance(e, MQBrokerError) and "acl" in e.remark.lower()):
        return (f"{text} (the broker checks ACL, aclEnable=true: give an account of its plain_acl.yml "
                f"that may publish and subscribe {TOPIC}: --access-key and --secret-key)")
    return text


def run(ns: str, credentials) -> int:
    producer = SyncProducer("demo_producer", ns, credentials=credentials)
    producer.start()
    try:
        for i in range(MESSAGES):
            r = producer.send(Message(TOPIC, f"hello {i}", tags="TagA", keys=f"k{i}"))
            print(f"sent hello {i}: {r.status.name} msgId={r.msg_id} queue={r.queue.queue_id} offset={r.queue_offset}")
    finally:
        producer.shutdown()
    got = []
    done = threading.Event()

    def on_message(msg):
        got.append(msg.body.decode())
        print(f"received {msg.body.decode()!r} from queue {msg.queue_id} offset {msg.queue_offset}")
        if len(got) >= MESSAGES:
            done.set()
        return CONSUME_SUCCESS

    consumer = SyncPushConsumer(f"demo_group_{uuid.uuid4().hex[:8]}", ns, consume_from=FIRST, listener=on_message,
                                credentials=credentials)
    consumer.subscribe(TOPIC, "*")
    consumer.start()
    try:
        ok = done.wait(CONSUME_WAIT_S)
    finally:
        consumer.shutdown()
    print("all ten consumed" if ok else f"only {len(got)} consumed within {CONSUME_WAIT_S} s")
    return 0 if ok else 1


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    credentials = None
    if args.access_key or args.secret_key:
        if not (args.access_key and args.secret_key):
            print("demo_client: --access-key and --secret-key go together", file=sys.stderr)
            return 2
        from mq.acl.sign import SessionCredentials
        credentials = SessionCredentials(args.access_key, args.secret_key)
    try:
        check_namesrv(args.namesrv)
        return run(args.namesrv, credentials)
    except DemoError as e:
        print(f"demo_client: {e}", file=sys.stderr)
    except (MQClientError, RemotingError, OSError) as e:
        print(f"demo_client: {explain(e)}", file=sys.stderr)
    except KeyboardInterrupt:
        return 130
    return 1


if __name__ == "__main__":
    sys.exit(main())
