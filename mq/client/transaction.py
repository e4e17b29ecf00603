"""TransactionProducer (TransactionMQProducer): half messages, END_TRANSACTION, and the answers to a
broker's CHECK_TRANSACTION_STATE (the broker side is mq.broker.transaction).

    send_in_transaction(msg, execute, arg):
      1. the message goes out as a half (properties TRAN_MSG=true and PGROUP=<group>, sysFlag
         TRANSACTION_PREPARED) with the producer's usual retries; a half is never delivered;
      2. on SEND_OK, execute(msg, arg) runs the local transaction and says COMMIT_MESSAGE,
         ROLLBACK_MESSAGE or UNKNOW (an exception counts as UNKNOW); a half that was not
         stored SEND_OK is rolled back (DefaultMQProducerImpl.sendMessageInTransaction);
      3. END_TRANSACTION (37, one-way) to the broker that holds the half, naming it by its queue
         offset (tranStateTableOffset) and CommitLog offset (from the offset msgId).  UNKNOW sends
         nothing that ends it: the broker asks later.
    A broker asks about a half it has held past transactionTimeOut with CHECK_TRANSACTION_STATE
    (39) on a connection of this group; checker(msg) answers, and its answer goes back as an
    END_TRANSACTION marked fromTransactionCheck.  execute and checker may be plain functions or
    coroutine functions; a plain one runs on the event loop, so it should be quick."""
from __future__ import annotations

import enum
import inspect
import logging
from dataclasses import dataclass
from typing import Awaitable, Callable, Union

from mq.wire import commitlog as wcl
from mq.wire.codes import RequestCode as R
from mq.wire.errors import WireError
from mq.wire.msgid import decode_offset_msg_id

from .errors import MQClientError, RemotingError
from .message import Message, MessageExt, SendResult, SendStatus, decode_messages
from .producer import DEFAULT_TOPIC, Producer

log = logging.getLogger("mq.client.transaction")

PROPERTY_TRANSACTION_PREPARED = "TRAN_MSG"
PROPERTY_PRODUCER_GROUP = "PGROUP"


class LocalTransactionState(str, enum.Enum):
    COMMIT_MESSAGE = "COMMIT_MESSAGE"
    ROLLBACK_MESSAGE = "ROLLBACK_MESSAGE"
    UNKNOW = "UNKNOW"          # RocketMQ's spelling


COMMIT_OR_ROLLBACK = {LocalTransactionState.COMMIT_MESSAGE: wcl.TRANSACTION_COMMIT,
                      LocalTransactionState.ROLLBACK_MESSAGE: wcl.TRANSACTION_ROLLBACK,
                      LocalTransactionState.UNKNOW: wcl.TRANSACTION_NOT_TYPE}
StateOrAwaitable = Union[LocalTransactionState, Awaitable[LocalTransactionState]]


@dataclass
class TransactionSendResult:
    send_result: SendResult
    local_state: LocalTransactionState

    @property
    def transaction_id(self) -> str:
        return self.send_result.msg_id


async def _call(fn, *args) -> LocalTransactionState:
    state = fn(*args)
    if inspect.isawaitable(state):
        state = await state
    return LocalTransactionState(state)


class TransactionProducer(Producer):
    """A Producer whose messages can be sent in transactions (module docstring)."""

    def __init__(self, group: str, namesrv_addr: str, *,
                 checker: Callable[[MessageExt], StateOrAwaitable], **kw):
        super().__init__(group, namesrv_addr, **kw)
        self.checker = checker

    async def start(self) -> "TransactionProducer":
        """Starts, and makes itself known at once to the brokers of TBW102's route (the Java
        producer's first route update does the same): a producer restarted with transactions
        pending is asked about them before it sends anything."""
        await super().start()
        self.instance.remoting.push_handlers[R.CHECK_TRANSACTION_STATE] = self._on_check
        try:
            await self.instance.update_route(DEFAULT_TOPIC)
            await self.send_heartbeat()
        except (RemotingError, MQClientError, ValueError) as e:
            log.info("no brokers to announce this producer to yet (%s): the heartbeat loop will", e)
        return self

    async def send_in_transaction(self, msg: Message, execute: Callable[[Message, object], StateOrAwaitable],
                                  arg=None) -> TransactionSendResult:
        if msg.delay_level > 0:
            raise MQClientError("a transactional message cannot be delayed")
        msg.properties[PROPERTY_TRANSACTION_PREPARED] = "true"
        msg.properties[PROPERTY_PRODUCER_GROUP] = self.group
        result = await self.send(msg)
        state = LocalTransactionState.ROLLBACK_MESSAGE
        remark = None
        if result.status is SendStatus.SEND_OK:
            try:
                state = await _call(execute, msg, arg)
            except Exception as e:
                log.warning("local transaction of %s failed: %s", result.msg_id, e)
                state, remark = LocalTransactionState.UNKNOW, f"executeLocalTransactionBranch exception: {e}"
        # the local transaction ran: whatever happens to END_TRANSACTION now, its outcome is the
        # result (the broker asks again if the end did not arrive), never an exception that would
        # make the caller run it twice (DefaultMQProducerImpl logs and returns alike)
        try:
            addr = self._inst().master_addr(result.queue.broker_name)
            if addr is None:
                raise MQClientError(f"the broker {result.queue.broker_name} has no master address")
            _, _, phy = decode_offset_msg_id(result.offset_msg_id)
            await self._end(addr, result.queue_offset, phy, state, result.msg_id, False, remark)
        except (RemotingError, MQClientError, WireError, OSError) as e:
            log.warning("transaction %s is %s here, but END_TRANSACTION was not sent (%s): the broker will ask",
                        result.msg_id, state.value, e)
        return TransactionSendResult(result, state)

    async def _end(self, addr: str, tran_state_table_offset: int, commit_log_offset: int,
                   state: LocalTransactionState, msg_id: str, from_check: bool, remark: str | None = None) -> None:
        ext = {"producerGroup": self.group, "tranStateTableOffset": str(tran_state_table_offset),
               "commitLogOffset": str(commit_log_offset), "commitOrRollback": str(COMMIT_OR_ROLLBACK[state]),
               "fromTransactionCheck": "true" if from_check else "false", "msgId": msg_id, "transactionId": msg_id}
        cmd = self._inst().request(R.END_TRANSACTION, ext)
        cmd.remark = remark
        await self._inst().remoting.invoke_oneway(addr, cmd)

    async def _on_check(self, addr: str, cmd) -> None:
        """CHECK_TRANSACTION_STATE from the broker at addr: ask the checker, answer with END_TRANSACTION."""
        h = cmd.ext_fields or {}
        try:
            msgs = decode_messages(cmd.body)
            msg = msgs[0]
            tran_offset, phy = int(h["tranStateTableOffset"]), int(h["commitLogOffset"])
        except (WireError, IndexError, KeyError, ValueError) as e:
            log.warning("a transaction check from %s that does not decode: %s", addr, e)
            return
        try:
            state = await _call(self.checker, msg)
        except Exception as e:
            log.warning("transaction checker failed for %s: %s", msg.msg_id, e)
            state = LocalTransactionState.UNKNOW
        await self._end(addr, tran_offset, phy, state, h.get("msgId") or msg.msg_id, True)


__all__ = ["TransactionProducer", "TransactionSendResult", "LocalTransactionState"]
