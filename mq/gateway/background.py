"""What the gateway's services that talk to their broker and run a loop of their own share:
a call to the broker with its failure as a Status, a record of their own appended to a system
topic, that topic's creation (BrokerCalls), and a loop task started and stopped with the
service (Background)."""
from __future__ import annotations

import asyncio
import time

from mq.remoting import RemotingClient, RemotingError
from mq.wire.codes import RequestCode as R, ResponseCode as RC
from mq.wire.grpc5 import Code
from mq.wire.headers import send_v2
from mq.wire.properties import properties_to_string
from mq.wire.topics import AUTO_CREATE_TOPIC

from .convert import Refused

CALL_TIMEOUT_S = 5.0


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
        recall) to queue 0 of its system topic; its queue offset.  Refused when it was not stored."""
        ext = send_v2(producerGroup=group, topic=topic, defaultTopic=AUTO_CREATE_TOPIC, defaultTopicQueueNums=1,
                      queueId=0, sysFlag=0, bornTimestamp=int(time.time() * 1000), flag=0,
                      properties=properties_to_string(props), reconsumeTimes=0, unitMode=False, batch=False,
                      brokerName=self.broker_name)
        r = await self._call(R.SEND_MESSAGE_V2, ext, body)
        if r.code != RC.SUCCESS:
            raise Refused(Code.TOO_MANY_REQUESTS if r.code == RC.SYSTEM_BUSY else Code.INTERNAL_SERVER_ERROR,
                          f"writing the {what} record failed: {r.code} {r.remark}")
        return int((r.ext_fields or {}).get("queueOffset", -1))

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
