"""Request-reply (RocketMQ 4.6+): a producer's request() sends a message and waits for the answer a
consumer of it sends back.

    requester:  Producer.request(msg, timeout_s) adds CORRELATION_ID (new each time),
                REPLY_TO_CLIENT (this client's id) and TTL (the timeout in ms), sends it as any
                message, and waits for PUSH_REPLY_MESSAGE_TO_CLIENT (326) with that correlation id,
                which the broker pushes on this client's connection to it.
    replier:    create_reply(request, body) is the answer: topic <cluster>_REPLY_TOPIC (the
                request's CLUSTER property, set by the broker that stored it), MSG_TYPE=reply and
                the three properties copied; Producer.send sends it with SEND_REPLY_MESSAGE_V2
                (325) to a broker of the cluster, which pushes it to the requester.
The requester must be known to the broker the replier reaches: our producers heartbeat to every
broker of TBW102's route, as RocketMQ's do, and request() heartbeats at once when the topic is new."""
from __future__ import annotations

import asyncio
import logging
import uuid
import zlib

from mq.wire.errors import WireError
from mq.wire.properties import decode_properties
from mq.wire.topics import reply_topic

from .errors import MQClientError
from .message import SYSFLAG_COMPRESSED, Message, MessageExt, decompress_body

log = logging.getLogger("mq.client.reply")

PROPERTY_CORRELATION_ID = "CORRELATION_ID"
PROPERTY_MESSAGE_REPLY_TO_CLIENT = "REPLY_TO_CLIENT"
PROPERTY_MESSAGE_TTL = "TTL"
PROPERTY_MESSAGE_TYPE = "MSG_TYPE"
PROPERTY_CLUSTER = "CLUSTER"
PROPERTY_REPLY_MESSAGE_ARRIVE_TIME = "ARRIVE_TIME"
REPLY_MESSAGE_FLAG = "reply"


class RequestTimeout(MQClientError):
    """No reply within the request's timeout."""


def is_reply(msg: Message) -> bool:
    return msg.properties.get(PROPERTY_MESSAGE_TYPE) == REPLY_MESSAGE_FLAG


def create_reply(request: MessageExt, body: bytes | str) -> Message:
    """MessageUtil.createReplyMessage: the answer to `request` (a message a consumer received)."""
    cluster = request.properties.get(PROPERTY_CLUSTER)
    if not cluster:
        raise MQClientError("create reply message fail, requestMessage error, property[CLUSTER] is null.")
    reply = Message(reply_topic(cluster), body)
    reply.properties[PROPERTY_MESSAGE_TYPE] = REPLY_MESSAGE_FLAG
    for name in (PROPERTY_CORRELATION_ID, PROPERTY_MESSAGE_REPLY_TO_CLIENT, PROPERTY_MESSAGE_TTL):
        value = request.properties.get(name)
        if value is not None:
            reply.properties[name] = value
    return reply


class ReplyWaiters:
    """The requests of one client instance waiting for their replies, by correlation id."""

    def __init__(self):
        self.waiting: dict[str, asyncio.Future] = {}

    def new(self) -> tuple[str, asyncio.Future]:
        correlation_id = uuid.uuid4().hex
        fut = asyncio.get_running_loop().create_future()
        self.waiting[correlation_id] = fut
        return correlation_id, fut

    def drop(self, correlation_id: str) -> None:
        self.waiting.pop(correlation_id, None)

    async def on_push(self, addr: str, cmd) -> None:
        """PUSH_REPLY_MESSAGE_TO_CLIENT (326) from the broker at addr."""
        h = cmd.ext_fields or {}
        try:
            props = decode_properties(h.get("properties") or "")
            sys_flag = int(h.get("sysFlag") or 0)
            # a reply body of 4 KiB or more was compressed by the replier's producer
            body = decompress_body(cmd.body, sys_flag)
            msg = MessageExt(h.get("topic", ""), body, props, int(h.get("flag") or 0))
            msg.sys_flag = sys_flag & ~SYSFLAG_COMPRESSED
            msg.born_host = h.get("bornHost", "")
            msg.store_host = h.get("storeHost", "")
            msg.born_timestamp_ms = int(h.get("bornTimestamp") or 0)
            msg.store_timestamp_ms = int(h.get("storeTimestamp") or 0)
            msg.queue_id = int(h.get("queueId") or 0)
        except (ValueError, WireError, zlib.error) as e:
            log.warning("a reply from %s that does not decode: %s", addr, e)
            return
        correlation_id = props.get(PROPERTY_CORRELATION_ID)
        fut = self.waiting.pop(correlation_id, None) if correlation_id else None
        if fut is None or fut.done():
            log.info("a reply from %s for no waiting request (correlation id %s): dropped", addr, correlation_id)
            return
        fut.set_result(msg)


__all__ = ["create_reply", "is_reply", "RequestTimeout", "ReplyWaiters", "REPLY_MESSAGE_FLAG"]
