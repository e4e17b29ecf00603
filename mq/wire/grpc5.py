"""The RocketMQ 5.x gRPC protocol (package apache.rocketmq.v2): its messages, enums and the
MessagingService's methods, declared here from the protocol's facts (names, field numbers,
types) and built into protobuf classes at import.

Why declared here and not the official stubs: the official 5.x Python client ships them as the
top-level package `rocketmq`, the import name of the official 4.x C++ client (`rocketmq==0.4.4`)
our compatibility tests use; both cannot live in one environment.  The declaration is a table
per message, read by `_build` into a FileDescriptorProto in a pool of its own (so nothing else
in a process that also loads the official stubs can clash with it); the wire bytes are
protobuf's, from protobuf's own runtime.

    msg("Name")          the message class (apache.rocketmq.v2.Name), e.g. msg("Status")(code=...)
    Code                 the Status codes (Code.OK == 20000, ...), as an IntEnum
    MessageType, ClientType, Permission, FilterType, Encoding, DigestType, AddressScheme,
    TransactionResolution, TransactionSource: the enums the broker reads or writes
    SERVICE, METHODS     the service's full name; method name -> (request, response, shape)

Fields a newer protocol adds and a peer sends are kept by protobuf as unknown fields and
ignored; the declaration covers every field of the protocol as of apache/rocketmq-apis 3e60073
(2.0.4 plus the lite-topic additions)."""
from __future__ import annotations

import enum

from google.protobuf import descriptor_pb2, descriptor_pool, duration_pb2, message_factory, timestamp_pb2

PACKAGE = "apache.rocketmq.v2"
SERVICE = f"{PACKAGE}.MessagingService"

# ---- enums -------------------------------------------------------------------------------
_ENUMS: dict[str, list[tuple[str, int]]] = {
    "TransactionResolution": [("TRANSACTION_RESOLUTION_UNSPECIFIED", 0), ("COMMIT", 1), ("ROLLBACK", 2)],
    "TransactionSource": [("SOURCE_UNSPECIFIED", 0), ("SOURCE_CLIENT", 1), ("SOURCE_SERVER_CHECK", 2)],
    "Permission": [("PERMISSION_UNSPECIFIED", 0), ("NONE", 1), ("READ", 2), ("WRITE", 3), ("READ_WRITE", 4)],
    "FilterType": [("FILTER_TYPE_UNSPECIFIED", 0), ("TAG", 1), ("SQL", 2)],
    "AddressScheme": [("ADDRESS_SCHEME_UNSPECIFIED", 0), ("IPv4", 1), ("IPv6", 2), ("DOMAIN_NAME", 3)],
    "MessageType": [("MESSAGE_TYPE_UNSPECIFIED", 0), ("NORMAL", 1), ("FIFO", 2), ("DELAY", 3), ("TRANSACTION", 4),
                    ("LITE", 5), ("PRIORITY", 6)],
    "DigestType": [("DIGEST_TYPE_UNSPECIFIED", 0), ("CRC32", 1), ("MD5", 2), ("SHA1", 3)],
    "ClientType": [("CLIENT_TYPE_UNSPECIFIED", 0), ("PRODUCER", 1), ("PUSH_CONSUMER", 2), ("SIMPLE_CONSUMER", 3),
                   ("PULL_CONSUMER", 4), ("LITE_PUSH_CONSUMER", 5), ("LITE_SIMPLE_CONSUMER", 6)],
    "Encoding": [("ENCODING_UNSPECIFIED", 0), ("IDENTITY", 1), ("GZIP", 2)],
    "Code": [("CODE_UNSPECIFIED", 0), ("OK", 20000), ("MULTIPLE_RESULTS", 30000), ("BAD_REQUEST", 40000),
             ("ILLEGAL_ACCESS_POINT", 40001), ("ILLEGAL_TOPIC", 40002), ("ILLEGAL_CONSUMER_GROUP", 40003),
             ("ILLEGAL_MESSAGE_TAG", 40004), ("ILLEGAL_MESSAGE_KEY", 40005), ("ILLEGAL_MESSAGE_GROUP", 40006),
             ("ILLEGAL_MESSAGE_PROPERTY_KEY", 40007), ("INVALID_TRANSACTION_ID", 40008),
             ("ILLEGAL_MESSAGE_ID", 40009), ("ILLEGAL_FILTER_EXPRESSION", 40010), ("ILLEGAL_INVISIBLE_TIME", 40011),
             ("ILLEGAL_DELIVERY_TIME", 40012), ("INVALID_RECEIPT_HANDLE", 40013),
             ("MESSAGE_PROPERTY_CONFLICT_WITH_TYPE", 40014), ("UNRECOGNIZED_CLIENT_TYPE", 40015),
             ("MESSAGE_CORRUPTED", 40016), ("CLIENT_ID_REQUIRED", 40017), ("ILLEGAL_POLLING_TIME", 40018),
             ("ILLEGAL_OFFSET", 40019), ("ILLEGAL_LITE_TOPIC", 40020), ("INVALID_CLIENT_PROPERTIES", 40021),
             ("UNAUTHORIZED", 40100), ("PAYMENT_REQUIRED", 40200), ("FORBIDDEN", 40300), ("NOT_FOUND", 40400),
             ("MESSAGE_NOT_FOUND", 40401), ("TOPIC_NOT_FOUND", 40402), ("CONSUMER_GROUP_NOT_FOUND", 40403),
             ("OFFSET_NOT_FOUND", 40404), ("REQUEST_TIMEOUT", 40800), ("PAYLOAD_TOO_LARGE", 41300),
             ("MESSAGE_BODY_TOO_LARGE", 41301), ("MESSAGE_BODY_EMPTY", 41302), ("PRECONDITION_FAILED", 42800),
             ("TOO_MANY_REQUESTS", 42900), ("LITE_TOPIC_QUOTA_EXCEEDED", 42901),
             ("LITE_SUBSCRIPTION_QUOTA_EXCEEDED", 42902), ("REQUEST_HEADER_FIELDS_TOO_LARGE", 43100),
             ("MESSAGE_PROPERTIES_TOO_LARGE", 43101), ("INTERNAL_ERROR", 50000), ("INTERNAL_SERVER_ERROR", 50001),
             ("HA_NOT_AVAILABLE", 50002), ("NOT_IMPLEMENTED", 50100), ("PROXY_TIMEOUT", 50400),
             ("MASTER_PERSISTENCE_TIMEOUT", 50401), ("SLAVE_PERSISTENCE_TIMEOUT", 50402), ("UNSUPPORTED", 50500),
             ("VERSION_UNSUPPORTED", 50501), ("VERIFY_FIFO_MESSAGE_UNSUPPORTED", 50502),
             ("FAILED_TO_CONSUME_MESSAGE", 60000)],
    "Language": [("LANGUAGE_UNSPECIFIED", 0), ("JAVA", 1), ("CPP", 2), ("DOT_NET", 3), ("GOLANG", 4), ("RUST", 5),
                 ("PYTHON", 6), ("PHP", 7), ("NODE_JS", 8), ("RUBY", 9), ("OBJECTIVE_C", 10), ("DART", 11),
                 ("KOTLIN", 12)],
    "QueryOffsetPolicy": [("BEGINNING", 0), ("END", 1), ("TIMESTAMP", 2)],
    "LiteSubscriptionAction": [("PARTIAL_ADD", 0), ("PARTIAL_REMOVE", 1), ("COMPLETE_ADD", 2), ("COMPLETE_REMOVE", 3)],
}

# ---- messages: (field, number, type, mode) ------------------------------------------------
# type: a scalar ("string", "int32", "int64", "bool", "bytes", "float"), "map" (map<string,string>),
# "Duration" / "Timestamp" (google.protobuf), or a message or enum of this package.
# mode: "" (proto3 singular), "repeated", "optional" (proto3 optional: presence kept), or
# "oneof NAME" (a member of oneof NAME).
_D, _T = "Duration", "Timestamp"
_MESSAGES: dict[str, list[tuple[str, int, str, str]]] = {
    # definition.proto
    "FilterExpression": [("type", 1, "FilterType", ""), ("expression", 2, "string", "")],
    "RetryPolicy": [("max_attempts", 1, "int32", ""),
                    ("exponential_backoff", 2, "ExponentialBackoff", "oneof strategy"),
                    ("customized_backoff", 3, "CustomizedBackoff", "oneof strategy")],
    "ExponentialBackoff": [("initial", 1, _D, ""), ("max", 2, _D, ""), ("multiplier", 3, "float", "")],
    "CustomizedBackoff": [("next", 1, _D, "repeated")],
    "Resource": [("resource_namespace", 1, "string", ""), ("name", 2, "string", "")],
    "SubscriptionEntry": [("topic", 1, "Resource", ""), ("expression", 2, "FilterExpression", "")],
    "Address": [("host", 1, "string", ""), ("port", 2, "int32", "")],
    "Endpoints": [("scheme", 1, "AddressScheme", ""), ("addresses", 2, "Address", "repeated")],
    "Broker": [("name", 1, "string", ""), ("id", 2, "int32", ""), ("endpoints", 3, "Endpoints", "")],
    "MessageQueue": [("topic", 1, "Resource", ""), ("id", 2, "int32", ""), ("permission", 3, "Permission", ""),
                     ("broker", 4, "Broker", ""), ("accept_message_types", 5, "MessageType", "repeated")],
    "Digest": [("type", 1, "DigestType", ""), ("checksum", 2, "string", "")],
    "SystemProperties": [
        ("tag", 1, "string", "optional"), ("keys", 2, "string", "repeated"), ("message_id", 3, "string", ""),
        ("body_digest", 4, "Digest", ""), ("body_encoding", 5, "Encoding", ""),
        ("message_type", 6, "MessageType", ""), ("born_timestamp", 7, _T, ""), ("born_host", 8, "string", ""),
        ("store_timestamp", 9, _T, "optional"), ("store_host", 10, "string", ""),
        ("delivery_timestamp", 11, _T, "optional"), ("receipt_handle", 12, "string", "optional"),
        ("queue_id", 13, "int32", ""), ("queue_offset", 14, "int64", "optional"),
        ("invisible_duration", 15, _D, "optional"), ("delivery_attempt", 16, "int32", "optional"),
        ("message_group", 17, "string", "optional"), ("trace_context", 18, "string", "optional"),
        ("orphaned_transaction_recovery_duration", 19, _D, "optional"),
        ("dead_letter_queue", 20, "DeadLetterQueue", "optional"), ("lite_topic", 21, "string", "optional"),
        ("priority", 22, "int32", "optional")],
    "DeadLetterQueue": [("topic", 1, "string", ""), ("message_id", 2, "string", "")],
    "Message": [("topic", 1, "Resource", ""), ("user_properties", 2, "map", ""),
                ("system_properties", 3, "SystemProperties", ""), ("body", 4, "bytes", "")],
    "Assignment": [("message_queue", 1, "MessageQueue", "")],
    "Status": [("code", 1, "Code", ""), ("message", 2, "string", "")],
    "UA": [("language", 1, "Language", ""), ("version", 2, "string", ""), ("platform", 3, "string", ""),
           ("hostname", 4, "string", "")],
    "Settings": [("client_type", 1, "ClientType", "optional"), ("access_point", 2, "Endpoints", "optional"),
                 ("backoff_policy", 3, "RetryPolicy", "optional"), ("request_timeout", 4, _D, "optional"),
                 ("publishing", 5, "Publishing", "oneof pub_sub"), ("subscription", 6, "Subscription", "oneof pub_sub"),
                 ("user_agent", 7, "UA", ""), ("metric", 8, "Metric", ""), ("client_properties", 9, "map", "")],
    "Publishing": [("topics", 1, "Resource", "repeated"), ("max_body_size", 2, "int32", ""),
                   ("validate_message_type", 3, "bool", "")],
    "Subscription": [("group", 1, "Resource", "optional"), ("subscriptions", 2, "SubscriptionEntry", "repeated"),
                     ("fifo", 3, "bool", "optional"), ("receive_batch_size", 4, "int32", "optional"),
                     ("long_polling_timeout", 5, _D, "optional"), ("lite_subscription_quota", 6, "int32", "optional"),
                     ("max_lite_topic_size", 7, "int32", "optional")],
    "Metric": [("on", 1, "bool", ""), ("endpoints", 2, "Endpoints", "optional")],
    # service.proto
    "QueryRouteRequest": [("topic", 1, "Resource", ""), ("endpoints", 2, "Endpoints", "")],
    "QueryRouteResponse": [("status", 1, "Status", ""), ("message_queues", 2, "MessageQueue", "repeated")],
    "SendMessageRequest": [("messages", 1, "Message", "repeated")],
    "SendResultEntry": [("status", 1, "Status", ""), ("message_id", 2, "string", ""),
                        ("transaction_id", 3, "string", ""), ("offset", 4, "int64", ""),
                        ("recall_handle", 5, "string", "")],
    "SendMessageResponse": [("status", 1, "Status", ""), ("entries", 2, "SendResultEntry", "repeated")],
    "QueryAssignmentRequest": [("topic", 1, "Resource", ""), ("group", 2, "Resource", ""),
                               ("endpoints", 3, "Endpoints", "")],
    "QueryAssignmentResponse": [("status", 1, "Status", ""), ("assignments", 2, "Assignment", "repeated")],
    "ReceiveMessageRequest": [("group", 1, "Resource", ""), ("message_queue", 2, "MessageQueue", ""),
                              ("filter_expression", 3, "FilterExpression", ""), ("batch_size", 4, "int32", ""),
                              ("invisible_duration", 5, _D, "optional"), ("auto_renew", 6, "bool", ""),
                              ("long_polling_timeout", 7, _D, "optional"), ("attempt_id", 8, "string", "optional")],
    "ReceiveMessageResponse": [("status", 1, "Status", "oneof content"), ("message", 2, "Message", "oneof content"),
                               ("delivery_timestamp", 3, _T, "oneof content")],
    "AckMessageEntry": [("message_id", 1, "string", ""), ("receipt_handle", 2, "string", ""),
                        ("lite_topic", 3, "string", "optional")],
    "AckMessageRequest": [("group", 1, "Resource", ""), ("topic", 2, "Resource", ""),
                          ("entries", 3, "AckMessageEntry", "repeated")],
    "AckMessageResultEntry": [("message_id", 1, "string", ""), ("receipt_handle", 2, "string", ""),
                              ("status", 3, "Status", "")],
    "AckMessageResponse": [("status", 1, "Status", ""), ("entries", 2, "AckMessageResultEntry", "repeated")],
    "ForwardMessageToDeadLetterQueueRequest": [
        ("group", 1, "Resource", ""), ("topic", 2, "Resource", ""), ("receipt_handle", 3, "string", ""),
        ("message_id", 4, "string", ""), ("delivery_attempt", 5, "int32", ""),
        ("max_delivery_attempts", 6, "int32", ""), ("lite_topic", 7, "string", "optional")],
    "ForwardMessageToDeadLetterQueueResponse": [("status", 1, "Status", "")],
    "HeartbeatRequest": [("group", 1, "Resource", "optional"), ("client_type", 2, "ClientType", "")],
    "HeartbeatResponse": [("status", 1, "Status", "")],
    "EndTransactionRequest": [("topic", 1, "Resource", ""), ("message_id", 2, "string", ""),
                              ("transaction_id", 3, "string", ""), ("resolution", 4, "TransactionResolution", ""),
                              ("source", 5, "TransactionSource", ""), ("trace_context", 6, "string", "")],
    "EndTransactionResponse": [("status", 1, "Status", "")],
    "PrintThreadStackTraceCommand": [("nonce", 1, "string", "")],
    "ReconnectEndpointsCommand": [("nonce", 1, "string", "")],
    "ThreadStackTrace": [("nonce", 1, "string", ""), ("thread_stack_trace", 2, "string", "optional")],
    "VerifyMessageCommand": [("nonce", 1, "string", ""), ("message", 2, "Message", "")],
    "VerifyMessageResult": [("nonce", 1, "string", "")],
    "RecoverOrphanedTransactionCommand": [("message", 1, "Message", ""), ("transaction_id", 2, "string", "")],
    "NotifyUnsubscribeLiteCommand": [("lite_topic", 1, "string", "")],
    "TelemetryCommand": [
        ("status", 1, "Status", "optional"), ("settings", 2, "Settings", "oneof command"),
        ("thread_stack_trace", 3, "ThreadStackTrace", "oneof command"),
        ("verify_message_result", 4, "VerifyMessageResult", "oneof command"),
        ("recover_orphaned_transaction_command", 5, "RecoverOrphanedTransactionCommand", "oneof command"),
        ("print_thread_stack_trace_command", 6, "PrintThreadStackTraceCommand", "oneof command"),
        ("verify_message_command", 7, "VerifyMessageCommand", "oneof command"),
        ("reconnect_endpoints_command", 8, "ReconnectEndpointsCommand", "oneof command"),
        ("notify_unsubscribe_lite_command", 9, "NotifyUnsubscribeLiteCommand", "oneof command")],
    "NotifyClientTerminationRequest": [("group", 1, "Resource", "optional")],
    "NotifyClientTerminationResponse": [("status", 1, "Status", "")],
    "ChangeInvisibleDurationRequest": [
        ("group", 1, "Resource", ""), ("topic", 2, "Resource", ""), ("receipt_handle", 3, "string", ""),
        ("invisible_duration", 4, _D, ""), ("message_id", 5, "string", ""), ("lite_topic", 6, "string", "optional"),
        ("suspend", 7, "bool", "optional")],
    "ChangeInvisibleDurationResponse": [("status", 1, "Status", ""), ("receipt_handle", 2, "string", "")],
    "PullMessageRequest": [("group", 1, "Resource", ""), ("message_queue", 2, "MessageQueue", ""),
                           ("offset", 3, "int64", ""), ("batch_size", 4, "int32", ""),
                           ("filter_expression", 5, "FilterExpression", ""), ("long_polling_timeout", 6, _D, "")],
    "PullMessageResponse": [("status", 1, "Status", "oneof content"), ("message", 2, "Message", "oneof content"),
                            ("next_offset", 3, "int64", "oneof content")],
    "UpdateOffsetRequest": [("group", 1, "Resource", ""), ("message_queue", 2, "MessageQueue", ""),
                            ("offset", 3, "int64", "")],
    "UpdateOffsetResponse": [("status", 1, "Status", "")],
    "GetOffsetRequest": [("group", 1, "Resource", ""), ("message_queue", 2, "MessageQueue", "")],
    "GetOffsetResponse": [("status", 1, "Status", ""), ("offset", 2, "int64", "")],
    "QueryOffsetRequest": [("message_queue", 1, "MessageQueue", ""),
                           ("query_offset_policy", 2, "QueryOffsetPolicy", ""), ("timestamp", 3, _T, "optional")],
    "QueryOffsetResponse": [("status", 1, "Status", ""), ("offset", 2, "int64", "")],
    "RecallMessageRequest": [("topic", 1, "Resource", ""), ("recall_handle", 2, "string", "")],
    "RecallMessageResponse": [("status", 1, "Status", ""), ("message_id", 2, "string", "")],
}

# method -> (request, response, shape): "unary", "server_stream" or "stream_stream"
METHODS: dict[str, tuple[str, str, str]] = {
    "QueryRoute": ("QueryRouteRequest", "QueryRouteResponse", "unary"),
    "Heartbeat": ("HeartbeatRequest", "HeartbeatResponse", "unary"),
    "SendMessage": ("SendMessageRequest", "SendMessageResponse", "unary"),
    "QueryAssignment": ("QueryAssignmentRequest", "QueryAssignmentResponse", "unary"),
    "ReceiveMessage": ("ReceiveMessageRequest", "ReceiveMessageResponse", "server_stream"),
    "AckMessage": ("AckMessageRequest", "AckMessageResponse", "unary"),
    "ForwardMessageToDeadLetterQueue": ("ForwardMessageToDeadLetterQueueRequest",
                                        "ForwardMessageToDeadLetterQueueResponse", "unary"),
    "PullMessage": ("PullMessageRequest", "PullMessageResponse", "server_stream"),
    "UpdateOffset": ("UpdateOffsetRequest", "UpdateOffsetResponse", "unary"),
    "GetOffset": ("GetOffsetRequest", "GetOffsetResponse", "unary"),
    "QueryOffset": ("QueryOffsetRequest", "QueryOffsetResponse", "unary"),
    "EndTransaction": ("EndTransactionRequest", "EndTransactionResponse", "unary"),
    "Telemetry": ("TelemetryCommand", "TelemetryCommand", "stream_stream"),
    "NotifyClientTermination": ("NotifyClientTerminationRequest", "NotifyClientTerminationResponse", "unary"),
    "ChangeInvisibleDuration": ("ChangeInvisibleDurationRequest", "ChangeInvisibleDurationResponse", "unary"),
    "RecallMessage": ("RecallMessageRequest", "RecallMessageResponse", "unary"),
}

_F = descriptor_pb2.FieldDescriptorProto
_SCALARS = {"string": _F.TYPE_STRING, "int32": _F.TYPE_INT32, "int64": _F.TYPE_INT64, "bool": _F.TYPE_BOOL,
            "bytes": _F.TYPE_BYTES, "float": _F.TYPE_FLOAT}
_WELL_KNOWN = {_D: ".google.protobuf.Duration", _T: ".google.protobuf.Timestamp"}


def _field(m: descriptor_pb2.DescriptorProto, name: str, number: int, typ: str, mode: str,
           oneofs: dict[str, int]) -> None:
    f = m.field.add(name=name, number=number, json_name=_camel(name))
    f.label = _F.LABEL_REPEATED if mode == "repeated" else _F.LABEL_OPTIONAL
    if typ == "map":                       # map<string, string>: a repeated nested entry message
        entry = m.nested_type.add(name=_camel(name, upper=True) + "Entry")
        entry.options.map_entry = True
        entry.field.add(name="key", number=1, type=_F.TYPE_STRING, label=_F.LABEL_OPTIONAL, json_name="key")
        entry.field.add(name="value", number=2, type=_F.TYPE_STRING, label=_F.LABEL_OPTIONAL, json_name="value")
        f.label, f.type, f.type_name = _F.LABEL_REPEATED, _F.TYPE_MESSAGE, f".{PACKAGE}.{m.name}.{entry.name}"
    elif typ in _SCALARS:
        f.type = _SCALARS[typ]
    elif typ in _WELL_KNOWN:
        f.type, f.type_name = _F.TYPE_MESSAGE, _WELL_KNOWN[typ]
    elif typ in _ENUMS:
        f.type, f.type_name = _F.TYPE_ENUM, f".{PACKAGE}.{typ}"
    else:
        assert typ in _MESSAGES, typ
        f.type, f.type_name = _F.TYPE_MESSAGE, f".{PACKAGE}.{typ}"
    if mode.startswith("oneof "):
        f.oneof_index = oneofs[mode[6:]]
    elif mode == "optional":               # proto3 optional: a synthetic oneof of its own
        f.proto3_optional = True
        f.oneof_index = oneofs["_" + name]


def _camel(name: str, upper: bool = False) -> str:
    parts = name.split("_")
    head = parts[0].capitalize() if upper else parts[0]
    return head + "".join(p.capitalize() for p in parts[1:])


def _build() -> descriptor_pool.DescriptorPool:
    pool = descriptor_pool.DescriptorPool()
    for wk in (duration_pb2, timestamp_pb2):
        fdp = descriptor_pb2.FileDescriptorProto()
        wk.DESCRIPTOR.CopyToProto(fdp)
        pool.Add(fdp)
    fd = descriptor_pb2.FileDescriptorProto(name="mq/apache_rocketmq_v2.proto", package=PACKAGE, syntax="proto3",
                                            dependency=["google/protobuf/duration.proto",
                                                        "google/protobuf/timestamp.proto"])
    for name, values in _ENUMS.items():
        e = fd.enum_type.add(name=name)
        for vname, number in values:
            e.value.add(name=vname, number=number)
    for name, fields in _MESSAGES.items():
        m = fd.message_type.add(name=name)
        oneofs: dict[str, int] = {}
        for _, _, _, mode in fields:       # real oneofs first, then the synthetic ones (protoc's order)
            if mode.startswith("oneof ") and mode[6:] not in oneofs:
                oneofs[mode[6:]] = len(oneofs)
                m.oneof_decl.add(name=mode[6:])
        for fname, _, _, mode in fields:
            if mode == "optional":
                oneofs["_" + fname] = len(oneofs)
                m.oneof_decl.add(name="_" + fname)
        for fname, number, typ, mode in fields:
            _field(m, fname, number, typ, mode, oneofs)
    pool.Add(fd)
    return pool


POOL = _build()
_classes: dict[str, type] = {name: message_factory.GetMessageClass(POOL.FindMessageTypeByName(f"{PACKAGE}.{name}"))
                             for name in _MESSAGES}


def msg(name: str) -> type:
    """The protobuf class of message `name` of the package."""
    return _classes[name]


def _int_enum(name: str) -> type[enum.IntEnum]:
    return enum.IntEnum(name, _ENUMS[name])


Code = _int_enum("Code")
MessageType = _int_enum("MessageType")
ClientType = _int_enum("ClientType")
Permission = _int_enum("Permission")
FilterType = _int_enum("FilterType")
Encoding = _int_enum("Encoding")
DigestType = _int_enum("DigestType")
AddressScheme = _int_enum("AddressScheme")
TransactionResolution = _int_enum("TransactionResolution")
TransactionSource = _int_enum("TransactionSource")
Language = _int_enum("Language")

__all__ = ["AddressScheme", "ClientType", "Code", "DigestType", "Encoding", "FilterType", "Language", "METHODS",
           "MessageType", "PACKAGE", "POOL", "Permission", "SERVICE", "TransactionResolution", "TransactionSource",
           "msg"]
