"""The hostile client of the chaos suite's `hostile` nemesis: while the workload runs, it sends a
broker requests that are well framed but malformed -- send headers whose numbers do not fit
their fields, bodies that are empty, properties that are not UTF-8, queue ids out of range,
offsets that point nowhere, heartbeats of the wrong shapes -- pipelined between each other on one
connection so they share the broker's send groups with the workload's sends, plus, now and then,
a frame of seeded garbage (which closes that connection; it reconnects).

None of what it sends may be stored: every send of it is one a broker must refuse, and it sends
to the workload's topic, so one stored by mistake would be read by the final drain as a value
nobody sent (the checker's `unexpected`).  Its own answers are counted as they come (`stats`):
every request must get exactly one answer, a refusal; an answer of SUCCESS is counted as
`accepted`, a promise broken.  Answers lost with a connection the broker closed (a restart, a
garbage frame) are counted as `unanswered`, which a fault explains."""
from __future__ import annotations

import json
import random
import socket
import struct
import threading
import time

from mq.wire.headers import send_v2
from mq.wire.topics import AUTO_CREATE_TOPIC
from mq.wire.remoting import RemotingCommand, decode_frame_payload, encode_frame, frame_payload_size

IO_TIMEOUT_S = 5.0
BATCH_MAX = 8                 # malformed requests pipelined in one write


def _send_header(topic: str, **fields) -> dict:
    """A SEND_MESSAGE_V2 header, fields by RocketMQ's long names overriding the good defaults."""
    return send_v2(**{**dict(producerGroup="HostilePG", topic=topic, defaultTopic=AUTO_CREATE_TOPIC,
                             defaultTopicQueueNums="4", queueId="0", sysFlag="0",
                             bornTimestamp=str(int(time.time() * 1000)), flag="0", properties="",
                             reconsumeTimes="0"), **fields})


def malformed_requests(topic: str, rng: random.Random) -> list[tuple[int, dict | None, bytes]]:
    """(code, ext fields, body) of requests a broker must refuse, one of each kind, shuffled."""
    too_big = str(2 ** 31 + rng.randrange(1000))
    reqs = [
        (310, _send_header(topic, flag=too_big), b"hostile-flag"),
        (310, _send_header(topic, sysFlag=too_big), b"hostile-sysflag"),
        (310, _send_header(topic, bornTimestamp=str(2 ** 63 + 7)), b"hostile-born"),
        (310, _send_header(topic, reconsumeTimes="-" + too_big + "0"), b"hostile-reconsume"),
        (310, _send_header(topic, flag="abc"), b"hostile-nan"),
        (310, _send_header(topic, queueId=str(10 ** 6)), b"hostile-queue"),
        (310, _send_header(topic), b""),
        (33, {"offset": "-1"}, b""),
        (33, {"offset": str(10 ** 15)}, b""),
        (36, {"group": "HostileCG", "offset": "abc"}, b""),
        (34, None, json.dumps({"clientID": "h", "consumerDataSet": [{"groupName": "../x"}]}).encode()),
        (34, None, json.dumps({"clientID": 5, "producerDataSet": "x"}).encode()),
    ]
    rng.shuffle(reqs)
    return reqs


class HostileClient(threading.Thread):
    """Sends malformed requests to 127.0.0.1:`port` until stop() (see the module docstring)."""

    def __init__(self, port: int, topic: str, seed: int = 0):
        super().__init__(name=f"hostile-{port}", daemon=True)
        self.port = port
        self.topic = topic
        self.rng = random.Random(seed)
        self._halt = threading.Event()
        self.stats = {"requests": 0, "refused": 0, "accepted": 0, "unanswered": 0, "garbage": 0,
                      "connects": 0}
        self._opaque = 1

    def stop(self) -> None:
        self._halt.set()

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=IO_TIMEOUT_S) as s:
                    self.stats["connects"] += 1
                    self._session(s)
            except OSError:                   # the broker is down (a restart): try again shortly
                self._halt.wait(0.2)

    def _session(self, s: socket.socket) -> None:
        while not self._halt.is_set():
            if self.rng.random() < 0.05:      # garbage: the broker closes this connection
                s.sendall(struct.pack(">II", 12, 0x03000004) + self.rng.randbytes(8))
                self.stats["garbage"] += 1
                return
            batch = malformed_requests(self.topic, self.rng)[:self.rng.randrange(1, BATCH_MAX + 1)]
            frames, opaques = [], []
            for code, ext, body in batch:
                self._opaque += 1
                opaques.append(self._opaque)
                frames.append(encode_frame(RemotingCommand(code=code, version=409, opaque=self._opaque,
                                                           ext_fields=ext, body=body)))
            s.sendall(b"".join(frames))
            self.stats["requests"] += len(batch)
            got = set()
            for _ in batch:
                try:
                    resp = self._read(s)
                except (OSError, ValueError):
                    self.stats["unanswered"] += len(batch) - len(got)
                    return
                got.add(resp.opaque)
                self.stats["accepted" if resp.code == 0 else "refused"] += 1
            self._halt.wait(0.01)

    @staticmethod
    def _read(s: socket.socket) -> RemotingCommand:
        def exactly(n: int) -> bytes:
            buf = bytearray()
            while len(buf) < n:
                chunk = s.recv(n - len(buf))
                if not chunk:
                    raise ConnectionError("closed")
                buf += chunk
            return bytes(buf)
        prefix = exactly(4)
        return decode_frame_payload(exactly(frame_payload_size(prefix)))


__all__ = ["HostileClient", "malformed_requests"]
