"""What the gateway's services that talk to their broker and run a loop of their own share:
a call to the broker with its failure as a Status, the 4.x consumer primitives (a group's
offset read and committed, a queue's bounds, a pull decoded), a record of their own appended to
a system topic, that topic's creation (BrokerCalls), and a loop task started and stopped with
the service (Background)."""
from __future__ import annotations

import asyncio
import time

from mq.remoting import RemotingClient, RemotingError
from mq.wire import commitlog as wcl
from mq.wire.codes import RequestCode as R, ResponseCode as RC
from mq.wire.errors import WireError
from mq.wire.grpc5 import Code
from mq.wire.headers import PULL_SUBSCRIPTION, send_v2
from mq.wire.properties import properties_to_string
from mq.wire.topics import AUTO_CREATE_TOPIC

from .convert import Refused

CALL_TIMEOUT_S = 5.0
# send answers that say the record is in the broker's log (_put_record)
IN_THE_LOG = frozenset({RC.SUCCESS, RC.FLUSH_DISK_TIMEOUT, RC.SLAVE_NOT_AVAILABLE, RC.FLUSH_SLAVE_TIMEOUT})


class BrokerCalls:
    remoting: RemotingClient
    broker_addr: str
    broker_name: str

    async def _call(self, code: int, ext: dict | None, body: bytes = b""):
        """One request to the broker; its answer, or Refused(PROXY_TIMEOUT) when it gave none."""
        try:
            return await self.remoting.invoke(self.broker_addr, self.remoting.request(code, ext, body),
                                              CALL_TIMEOUT_S)
        except RemotingError as e:
            raise Refused(Code.PROXY_TIMEOUT, f"the broker did not answer: {e}") from None

    async def _put_record(self, topic: str, group: str, props: dict, body: bytes, what: str) -> int:
        """Appends one of the gateway's own records (a POP checkpoint or ack, a timer checkpoint or
        recall) to queue 0 of its system topic; its queue offset.  Refused when it was not stored.

        A record a SYNC_MASTER stored but could not replicate or flush in time (FLUSH_DISK_TIMEOUT,
        SLAVE_NOT_AVAILABLE, FLUSH_SLAVE_TIMEOUT: "stored" in SEND_STATUS) counts as written: the
        gateway reads its records back from this broker's log, where it is, and the slave gets it
        when it catches up.  Refusing it instead told a consumer its ack failed while the ack
        stood (the message never came again: a chaos cell with the slave cut off found five), and
        a receive whose checkpoint stood failed, so the next receive popped the messages again
        and the first checkpoint later revived messages already acked.  A DLedger leader answers
        only committed or not (never these codes)."""
        ext = send_v2(producerGroup=group, topic=topic, defaultTopic=AUTO_CREATE_TOPIC, defaultTopicQueueNums=1,
                      queueId=0, sysFlag=0, bornTimestamp=int(time.time() * 1000), flag=0,
                      properties=properties_to_string(props), reconsumeTimes=0, unitMode=False, batch=False,
                      brokerName=self.broker_name)
        r = await self._call(R.SEND_MESSAGE_V2, ext, body)
        if r.code not in IN_THE_LOG:
            raise Refused(Code.TOO_MANY_REQUESTS if r.code == RC.SYSTEM_BUSY else Code.INTERNAL_SERVER_ERROR,
                          f"writing the {what} record failed: {r.code} {r.remark}")
        return int((r.ext_fields or {}).get("queueOffset", -1))

    async def _offset(self, group: str, topic: str, qid: int) -> int:
        r = await self._call(R.QUERY_CONSUMER_OFFSET, {"consumerGroup": group, "topic": topic, "queueId": qid})
        if r.code == RC.SUCCESS:
            return int((r.ext_fields or {}).get("offset", -1))
        return -1

    async def _commit(self, group: str, topic: str, qid: int, offset: int) -> None:
        r = await self._call(R.UPDATE_CONSUMER_OFFSET, {"consumerGroup": group, "topic": topic, "queueId": qid,
                                                        "commitOffset": offset})
        if r.code != RC.SUCCESS:
            raise Refused(Code.INTERNAL_SERVER_ERROR, f"committing the offset failed: {r.code} {r.remark}")

    async def _min_offset(self, topic: str, qid: int) -> int:
        r = await self._call(R.GET_MIN_OFFSET, {"topic": topic, "queueId": qid})
        return int((r.ext_fields or {}).get("offset", 0)) if r.code == RC.SUCCESS else 0

    async def _max_offset(self, topic: str, qid: int) -> int:
        r = await self._call(R.GET_MAX_OFFSET, {"topic": topic, "queueId": qid})
        return int((r.ext_fields or {}).get("offset", 0)) if r.code == RC.SUCCESS else 0

    async def _pull(self, group: str, topic: str, qid: int, offset: int, n: int, expr_type: str, expr: str):
        """(code, next offset, records as tuples of wcl.RECORD_VALUE_FIELDS)."""
        r = await self._call(R.PULL_MESSAGE, {
            "consumerGroup": group, "topic": topic, "queueId": qid, "queueOffset": offset, "maxMsgNums": n,
            "sysFlag": PULL_SUBSCRIPTION, "commitOffset": 0, "suspendTimeoutMillis": 0, "subscription": expr,
            "subVersion": 0, "expressionType": expr_type})
        h = r.ext_fields or {}
        nxt = int(h.get("nextBeginOffset", offset)) if r.code in (RC.SUCCESS, RC.PULL_NOT_FOUND,
                                                                  RC.PULL_RETRY_IMMEDIATELY,
                                                                  RC.PULL_OFFSET_MOVED) else offset
        recs = []
        if r.code == RC.SUCCESS and r.body:
            try:
                recs = list(wcl.iter_record_values(r.body))
            except WireError as e:
                raise Refused(Code.INTERNAL_SERVER_ERROR, f"the broker's pull answer is malformed: {e}") from None
        elif r.code == RC.SUBSCRIPTION_PARSE_FAILED or (r.code == RC.SYSTEM_ERROR and expr_type == "SQL92"):
            # a filter that does not parse, or SQL92 on a broker without enablePropertyFilter
            raise Refused(Code.ILLEGAL_FILTER_EXPRESSION, r.remark or f"filter {expr!r} does not parse")
        elif r.code == RC.SUBSCRIPTION_GROUP_NOT_EXIST:
            raise Refused(Code.CONSUMER_GROUP_NOT_FOUND, r.remark or f"group {group} does not exist")
        elif r.code not in (RC.SUCCESS, RC.PULL_NOT_FOUND, RC.PULL_RETRY_IMMEDIATELY, RC.PULL_OFFSET_MOVED,
                            RC.TOPIC_NOT_EXIST):
            raise Refused(Code.INTERNAL_SERVER_ERROR, f"pull failed: {r.code} {r.remark}")
        return r.code, nxt, recs

    async def _create_topic(self, topic: str, queues: int) -> bool:
        """Creates (or keeps) one of the gateway's system topics on its broker; False when the
        broker refuses (a slave or a DLedger follower takes no topic changes)."""
        r = await self._call(R.UPDATE_AND_CREATE_TOPIC, {
            "topic": topic, "defaultTopic": AUTO_CREATE_TOPIC, "readQueueNums": queues, "writeQueueNums": queues,
            "perm": 6, "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0, "order": False})
        return r.code == RC.SUCCESS


class Background:
    """A service whose _loop() runs as a task from start() until close()."""
    _task: asyncio.Task | None = None

    async def _loop(self) -> None:
        raise NotImplementedError

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
