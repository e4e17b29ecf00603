"""A 5.x pull consumer's RPCs, served for this broker's queues: PullMessage, GetOffset,
UpdateOffset, QueryOffset.

apache/rocketmq-apis declares them (the "pull consumer" work of 2023: ClientType PULL_CONSUMER,
Codes ILLEGAL_OFFSET and OFFSET_NOT_FOUND); the Java proxy leaves them UNIMPLEMENTED and no
released 5.x client calls them yet (the Node.js client wraps them).  Served here because they
are the 4.x consumer's own primitives: a pull from an offset, the group's offset read and
committed - the same consumer offsets a 4.x consumer of the group uses - and a queue's bounds or
the offset of a time (SEARCH_OFFSET_BY_TIMESTAMP).

PullMessage answers a stream: a status, then the messages (no receipt handle: nothing to ack;
the consumer commits with UpdateOffset), then the next offset.  Statuses: OK with messages;
MESSAGE_NOT_FOUND when nothing new came within the long polling time (messages the filter
skipped move the next offset on); ILLEGAL_OFFSET for an offset outside the queue, with the
offset to go on from (its first or its end).  A queue id must be one of the topic's readable
queues on this broker (BAD_REQUEST otherwise).  GetOffset of a group that never committed one
is the broker's 4.x answer: 0 while the queue still begins at its first message, else
OFFSET_NOT_FOUND."""
from __future__ import annotations

import asyncio
import time

from mq.remoting import RemotingClient
from mq.wire.codes import RequestCode as R, ResponseCode as RC
from mq.wire.grpc5 import Code

from .background import BrokerCalls
from .convert import Refused
from .pop import BATCH_MAX, POLL_INTERVAL_S, Popped, popped

QUERY_BEGINNING, QUERY_END, QUERY_TIMESTAMP = 0, 1, 2        # QueryOffsetPolicy


class PullService(BrokerCalls):
    def __init__(self, remoting: RemotingClient, broker_addr: str, broker_name: str):
        self.remoting = remoting
        self.broker_addr = broker_addr
        self.broker_name = broker_name

    async def get_offset(self, group: str, topic: str, qid: int) -> int:
        offset = await self._offset(group, topic, qid)
        if offset < 0:
            raise Refused(Code.OFFSET_NOT_FOUND, f"{group} has no offset for {topic}:{qid}")
        return offset

    async def update_offset(self, group: str, topic: str, qid: int, offset: int) -> None:
        if offset < 0:
            raise Refused(Code.ILLEGAL_OFFSET, f"offset {offset} is negative")
        await self._commit(group, topic, qid, offset)

    async def query_offset(self, topic: str, qid: int, policy: int, timestamp_ms: int | None) -> int:
        if policy == QUERY_BEGINNING:
            return await self._min_offset(topic, qid)
        if policy == QUERY_END:
            return await self._max_offset(topic, qid)
        if policy == QUERY_TIMESTAMP:
            if timestamp_ms is None:
                raise Refused(Code.BAD_REQUEST, "query_offset_policy TIMESTAMP needs a timestamp")
            r = await self._call(R.SEARCH_OFFSET_BY_TIMESTAMP, {"topic": topic, "queueId": qid,
                                                                "timestamp": timestamp_ms})
            if r.code != RC.SUCCESS:
                raise Refused(Code.INTERNAL_SERVER_ERROR, f"searching the offset failed: {r.code} {r.remark}")
            return int((r.ext_fields or {}).get("offset", 0))
        raise Refused(Code.BAD_REQUEST, f"unknown query_offset_policy {policy}")

    async def pull(self, group: str, topic: str, qid: int, offset: int, batch: int, expr_type: str, expr: str,
                   poll_s: float) -> tuple[Code, int, list[Popped]]:
        """(status, next offset, messages) of a pull from `offset`, waiting up to poll_s for one."""
        if offset < 0:
            raise Refused(Code.ILLEGAL_OFFSET, f"offset {offset} is negative")
        batch = max(1, min(BATCH_MAX, batch or BATCH_MAX))
        deadline = time.monotonic() + poll_s
        while True:
            code, nxt, recs = await self._pull(group, topic, qid, offset, batch, expr_type, expr)
            if code == RC.TOPIC_NOT_EXIST:
                raise Refused(Code.TOPIC_NOT_FOUND, f"topic {topic} does not exist")
            if recs:
                return Code.OK, nxt, [popped(r) for r in recs]
            if code == RC.PULL_RETRY_IMMEDIATELY and nxt > offset:
                offset = nxt                              # a stretch the filter skipped: on at once
                continue
            if code == RC.PULL_OFFSET_MOVED or (code == RC.PULL_NOT_FOUND and nxt < offset):
                return Code.ILLEGAL_OFFSET, nxt, []      # outside the queue: where to go on from
            offset = nxt                                  # past what the filter skipped
            if time.monotonic() + POLL_INTERVAL_S > deadline:
                return Code.MESSAGE_NOT_FOUND, offset, []
            await asyncio.sleep(POLL_INTERVAL_S)
