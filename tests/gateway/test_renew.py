"""Auto-renew of a push consumer's messages (mq.gateway.renew).

Tier 1, the schedule alone: a held handle is renewed once it is within RENEW_AHEAD_MS of
expiring (not before), the client's later ack or change uses the latest handle and ends the
renewing, a client that leaves releases what it held, and nothing is held past RENEW_MAX_MS.
The POP service is a recorder here: what it is asked to change is the subject.
Tier 2, a real broker: a ReceiveMessage with auto_renew, acked with the handle the client got,
is acked (the swap), and nothing comes back."""
import asyncio
import time

import grpc

from mq.gateway import renew
from mq.gateway.pop import Handle
from mq.wire.grpc5 import SERVICE, Code, msg

from tests.gateway.helpers import produce5


class RecordingPop:
    def __init__(self):
        self.changes = []

    async def change_invisible(self, group, topic, handle, invisible_ms):
        self.changes.append((group, topic, handle, invisible_ms))
        h = Handle.parse(handle)
        now = int(time.time() * 1000)
        return Handle(h.offset, now, invisible_ms, h.kind, h.queue_id, h.offset, h.commitlog_offset, h.broker).text()


def handle(deadline_in_ms: int, offset: int = 7) -> str:
    now = int(time.time() * 1000)
    return Handle(offset, now, deadline_in_ms, 0, 1, offset, 100, "b").text()


def test_a_held_handle_is_renewed_near_its_expiry_and_swapped_for_the_ack():
    pop = RecordingPop()
    r = renew.Renewer(pop)
    far, near = handle(renew.RENEW_AHEAD_MS + 30_000, 1), handle(renew.RENEW_AHEAD_MS - 1_000, 2)
    r.hold("c1", "G", "T", far)
    r.hold("c1", "G", "T", near)
    asyncio.run(r.renew_once())
    assert [c[2] for c in pop.changes] == [near] and pop.changes[0][3] == renew.RENEW_SLICE_MS
    latest = r.latest("G", near)
    assert latest != near and Handle.parse(latest).offset == 2       # the renewed one, for the ack
    assert r.latest("G", near) == near                                # released: no longer swapped
    assert r.latest("G", far, release=False) == far                   # not renewed yet: the same


def test_a_client_that_leaves_and_a_hold_past_the_max_are_released():
    pop = RecordingPop()
    r = renew.Renewer(pop)
    h1, h2 = handle(1_000, 1), handle(1_000, 2)
    r.hold("gone", "G", "T", h1)
    r.hold("stays", "G", "T", h2)
    r.forget_client("gone")
    r._held[("G", h2)].since_ms -= renew.RENEW_MAX_MS
    asyncio.run(r.renew_once())
    assert pop.changes == [] and r._held == {}


def test_auto_renew_receive_acked_with_the_original_handle(gateway):
    topic, group = "G5Renew", "G5RenewGroup"
    gateway.create_topic(topic)
    produce5(gateway, topic, [{"body": "held"}])
    metadata = (("x-mq-client-id", "renew@1@0@x"),)
    with grpc.insecure_channel(gateway.endpoint) as ch:
        recv = ch.unary_stream(f"/{SERVICE}/ReceiveMessage", request_serializer=lambda m: m.SerializeToString(),
                               response_deserializer=msg("ReceiveMessageResponse").FromString)
        ack = ch.unary_unary(f"/{SERVICE}/AckMessage", request_serializer=lambda m: m.SerializeToString(),
                             response_deserializer=msg("AckMessageResponse").FromString)
        req = msg("ReceiveMessageRequest")(batch_size=8, auto_renew=True)
        req.group.name, req.message_queue.topic.name = group, topic
        req.long_polling_timeout.FromSeconds(5)
        frames = list(recv(req, metadata=metadata, timeout=15))
        got = [f.message for f in frames if f.HasField("message")]
        assert [m.body for m in got] == [b"held"]
        h = Handle.parse(got[0].system_properties.receipt_handle)
        assert h.invisible_ms == renew.DEFAULT_INVISIBLE_MS
        a = msg("AckMessageRequest")()
        a.group.name, a.topic.name = group, topic
        a.entries.add(message_id=got[0].system_properties.message_id,
                      receipt_handle=got[0].system_properties.receipt_handle)
        assert ack(a, metadata=metadata, timeout=10).status.code == Code.OK
        req.long_polling_timeout.FromSeconds(2)
        again = [f for f in recv(req, metadata=metadata, timeout=15) if f.HasField("message")]
        assert again == []
