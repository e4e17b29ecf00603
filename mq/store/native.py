"""The compiled C core (mq._mqstore) and the one table that maps its error
codes to Python exceptions (py-lmdb style).  Nothing else in mq imports the
extension directly but mq.client.message, for one pure call that raises nothing
(mq_records_decode: a pull answer's records), and only when it is built: the
client runs without it."""
from __future__ import annotations

from mq._mqstore import ffi, lib

__all__ = ["ffi", "lib", "check", "StoreError", "MessageIllegal", "TopicIllegal",
           "PropertiesTooLong", "StoreFatal", "OutOfRange", "CorruptRecord",
           "QueueTableFull", "WaitTimeout", "NoSpace", "BadControlBlock", "MessageTooBig",
           "StoreIOError", "NotLeader", "WouldBlock", "IndexFull", "InvalidArgument"]


class StoreError(Exception):
    """Base of every store error; `code` is the C MQ_E_* value."""
    code = 0


class InvalidArgument(ValueError):
    """MQ_E_INVAL: an argument outside its documented range (a size, count or value from
    configuration, a request or a peer), or a call the store's current state refuses
    (csrc/mqstore.h, "Arguments").  A ValueError and not a StoreError: the store is fine, the
    call was not."""
    code = lib.MQ_E_INVAL


class StoreIOError(StoreError):
    code = lib.MQ_E_IO


class StoreFatal(StoreError):
    """The store had a write or flush failure; it refuses writes from then on."""
    code = lib.MQ_E_FATAL


class MessageIllegal(StoreError):
    """Body empty or over maxMessageSize, or a malformed batch (MESSAGE_ILLEGAL, 13)."""
    code = lib.MQ_E_MSG_ILLEGAL


class TopicIllegal(StoreError):
    """Topic empty, over 127 bytes, or outside ^[%|a-zA-Z0-9_-]+$."""
    code = lib.MQ_E_TOPIC_ILLEGAL


class PropertiesTooLong(StoreError):
    """Properties over 32767 bytes (MESSAGE_ILLEGAL, 13)."""
    code = lib.MQ_E_PROPS_TOO_LONG


class OutOfRange(StoreError):
    code = lib.MQ_E_RANGE


class CorruptRecord(StoreError):
    code = lib.MQ_E_CORRUPT


class QueueTableFull(StoreError):
    code = lib.MQ_E_TABLE_FULL


class WaitTimeout(StoreError):
    code = lib.MQ_E_TIMEOUT


class NoSpace(StoreError):
    """The file system is full; not sticky (SERVICE_NOT_AVAILABLE, 14)."""
    code = lib.MQ_E_NOSPACE


class BadControlBlock(StoreError):
    code = lib.MQ_E_BAD_CTL


class MessageTooBig(StoreError):
    """A record does not fit in one empty CommitLog file."""
    code = lib.MQ_E_TOO_BIG


class NotLeader(StoreError):
    """DLedger mode: appends are refused -- this member is not the group's ready leader
    (SERVICE_NOT_AVAILABLE, 14)."""
    code = lib.MQ_E_NOT_LEADER


class WouldBlock(StoreError):
    """A non-blocking socket would block (mq_dledger_send): send again when it is writable."""
    code = lib.MQ_E_AGAIN


class IndexFull(StoreError):
    """A message index file has no room for a record's keys (mq_index_build): the writer
    allocates more of it or starts the next file."""
    code = lib.MQ_E_FULL


# every MQ_E_* of csrc/mqbase.h, each to one class (tests/unit/test_c_constants.py checks both ways)
_BY_CODE = {cls.code: cls for cls in (
    InvalidArgument, StoreIOError, StoreFatal, MessageIllegal, TopicIllegal, PropertiesTooLong, OutOfRange,
    CorruptRecord, QueueTableFull, WaitTimeout, NoSpace, BadControlBlock, MessageTooBig, NotLeader,
    WouldBlock, IndexFull)}


def check(rc: int, what: str = "") -> int:
    """Returns rc when it is not an error, raises the mapped exception otherwise."""
    if rc >= 0:
        return rc
    if rc == lib.MQ_E_INVAL:
        raise InvalidArgument(f"invalid argument to the store's C core{': ' + what if what else ''}")
    raise _BY_CODE.get(rc, StoreError)(what or f"store error {rc}")
