"""The store: CommitLog (C core), ConsumeQueues, recovery, flush, retention.

Import direction: mq.wire <- mq.store <- mq.broker / mq.ha."""
from .config import StoreConfig, STORE_OPTIONS, Option
from .native import (StoreError, MessageIllegal, TopicIllegal, PropertiesTooLong, StoreFatal,
                     OutOfRange, CorruptRecord, NoSpace, MessageTooBig)
from .commitlog import CommitLog, AppendResult
from .store import MessageStore, PutStatus, PutResult, RecoveryReport

__all__ = ["StoreConfig", "STORE_OPTIONS", "Option", "StoreError", "MessageIllegal", "TopicIllegal",
           "PropertiesTooLong", "StoreFatal", "OutOfRange", "CorruptRecord", "NoSpace", "MessageTooBig",
           "CommitLog", "AppendResult", "MessageStore", "PutStatus", "PutResult", "RecoveryReport"]
