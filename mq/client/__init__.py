"""mq.client: RocketMQ 4.x clients on asyncio (producer, push and pull consumers, admin), speaking the
remoting protocol through mq.remoting and decoding stored messages through mq.wire.

    producer.py  Producer          route lookup (TBW102 fallback), SEND_MESSAGE_V2 / batch, retries
    transaction.py TransactionProducer  half messages, END_TRANSACTION, answers to the broker's checks
    reply.py     create_reply      request-reply: Producer.request waits, a consumer answers with create_reply
    consumer.py  PushConsumer      rebalance, long-polling pulls, listeners, send-back, offset commits
                 PullConsumer      explicit queues and offsets
    admin.py     AdminClient       cluster/topic/consumer/broker inspection and topic management
    instance.py  ClientInstance    shared plumbing: connections, name servers, routes, heartbeats
    route.py     route and cluster-info bodies, queue lists, the pull-address rule (spec 5)
    message.py   Message, MessageExt, MessageQueue, results, enums, UNIQ_KEY
    sync.py      blocking wrappers (a loop thread per client)
"""
from .admin import AdminClient, ConsumeStats, TopicConfig
from .consumer import PullConsumer, PushConsumer, allocate_averagely
from .errors import MQBrokerError, MQClientError, RemotingConnectError, RemotingError, RemotingTimeout
from .message import (ConsumeFromWhere, ConsumeStatus, Message, MessageExt, MessageModel, MessageQueue,
                      PullResult, PullStatus, SendResult, SendStatus)
from .producer import Producer, select_by_hash
from .route import ClusterInfo, TopicRouteData
from .reply import RequestTimeout, create_reply
from .transaction import LocalTransactionState, TransactionProducer, TransactionSendResult

CLUSTERING = MessageModel.CLUSTERING
BROADCASTING = MessageModel.BROADCASTING
LAST = ConsumeFromWhere.LAST
FIRST = ConsumeFromWhere.FIRST
TIMESTAMP = ConsumeFromWhere.TIMESTAMP
CONSUME_SUCCESS = ConsumeStatus.CONSUME_SUCCESS
RECONSUME_LATER = ConsumeStatus.RECONSUME_LATER

__all__ = ["create_reply", "RequestTimeout", "Producer", "TransactionProducer", "TransactionSendResult", "LocalTransactionState", "PushConsumer", "PullConsumer", "AdminClient", "TopicConfig", "ConsumeStats",
           "Message", "MessageExt", "MessageQueue", "SendResult", "SendStatus", "PullResult", "PullStatus",
           "ConsumeStatus", "ConsumeFromWhere", "MessageModel", "ClusterInfo", "TopicRouteData",
           "MQClientError", "MQBrokerError", "RemotingError", "RemotingConnectError", "RemotingTimeout",
           "allocate_averagely", "select_by_hash", "CLUSTERING", "BROADCASTING", "LAST", "FIRST", "TIMESTAMP",
           "CONSUME_SUCCESS", "RECONSUME_LATER"]
