"""5.x messages to 4.x sends and back: the checks a 5.x send must pass, the properties it is
stored with, and the Status code each 4.x answer becomes.

The rules are RocketMQ 5's proxy's (SendMessageActivity, GrpcValidator, ResponseBuilder), so a
message stored through the gateway reads the same to a 4.x consumer as one a 5.x proxy stored:
tag -> TAGS, keys -> KEYS (joined by a space), message_id -> UNIQ_KEY, message_group ->
__SHARDINGKEY, born_host -> __BORNHOST, born_timestamp -> BORN_TIMESTAMP, trace_context ->
TRACE_CONTEXT, delivery_attempt -> RECONSUME_TIME, and PGROUP = the topic (a 5.x producer has no
group: the topic stands for it, and transaction checks key on it).  User properties are stored as
they are, after the checks; a key RocketMQ reserves for itself is refused, never overwritten.

Limits, named (the proxy's defaults): USER_PROPERTIES_MAX user properties,
USER_PROPERTY_BYTES_MAX bytes of user properties + tag + keys, MESSAGE_GROUP_BYTES_MAX bytes of a
message group; the body's limit is the broker's maxMessageSize."""
from __future__ import annotations

from mq.wire.codes import ResponseCode as RC
from mq.wire.grpc5 import Code, Encoding, MessageType
from mq.wire.topics import AUTO_CREATE_TOPIC, SEND_PROTECTED_TOPICS, TOPIC_LEN_MAX, TOPIC_RE

SYSTEM_TOPIC_PREFIX = "rmq_sys_"

USER_PROPERTIES_MAX = 128
USER_PROPERTY_BYTES_MAX = 16 * 1024
MESSAGE_GROUP_BYTES_MAX = 64

# MessageConst.STRING_HASH_SET: the property names RocketMQ keeps for itself
RESERVED_KEYS = frozenset((
    "TRACE_ON", "MSG_REGION", "KEYS", "TAGS", "WAIT", "DELAY", "RETRY_TOPIC", "REAL_TOPIC", "REAL_QID", "TRAN_MSG",
    "PGROUP", "MIN_OFFSET", "MAX_OFFSET", "BUYER_ID", "ORIGIN_MESSAGE_ID", "TRANSFER_FLAG", "CORRECTION_FLAG",
    "MQ2_FLAG", "RECONSUME_TIME", "UNIQ_KEY", "MAX_RECONSUME_TIMES", "CONSUME_START_TIME", "POP_CK", "POP_CK_OFFSET",
    "1ST_POP_TIME", "TRAN_PREPARED_QUEUE_OFFSET", "DUP_INFO", "EXTEND_UNIQ_INFO", "INSTANCE_ID", "CORRELATION_ID",
    "REPLY_TO_CLIENT", "TTL", "ARRIVE_TIME", "PUSH_REPLY_TIME", "CLUSTER", "MSG_TYPE", "INNER_MULTI_QUEUE_OFFSET",
    "TIMER_DELAY_MS", "TIMER_DELAY_SEC", "TIMER_DELIVER_MS", "TIMER_ENQUEUE_MS", "TIMER_DEQUEUE_MS",
    "TIMER_ROLL_TIMES", "TIMER_OUT_MS", "TIMER_DEL_UNIQKEY", "TIMER_DEL_MS", "TIMER_DELAY_LEVEL", "__BORNHOST",
    "BORN_TIMESTAMP", "DLQ_ORIGIN_TOPIC", "DLQ_ORIGIN_MESSAGE_ID", "__CRC32#"))

SYSFLAG_COMPRESSED = 0x1


class Refused(Exception):
    """A request the gateway answers with `code` (a Code) and `text`, storing nothing."""

    def __init__(self, code: Code, text: str):
        super().__init__(text)
        self.code = code
        self.text = text


def _control(s: str) -> bool:
    """Java's Character.isISOControl over the string: U+0000-U+001F and U+007F-U+009F."""
    return any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in s)


def check_topic(name: str) -> None:
    """A topic a 5.x client may name: legal, and not a system topic (GrpcValidator)."""
    if not name or len(name.encode()) > TOPIC_LEN_MAX or TOPIC_RE.match(name) is None:
        raise Refused(Code.ILLEGAL_TOPIC, f"topic {name[:200]!r} is not a legal topic name (1-{TOPIC_LEN_MAX} "
                                          f"characters of a-z A-Z 0-9 % | _ -)")
    if name in SEND_PROTECTED_TOPICS or name == AUTO_CREATE_TOPIC or name.startswith(SYSTEM_TOPIC_PREFIX):
        raise Refused(Code.ILLEGAL_TOPIC, f"topic {name} is a system topic")


def check_group(name: str) -> None:
    if not name or len(name.encode()) > 255 or TOPIC_RE.match(name) is None:
        raise Refused(Code.ILLEGAL_CONSUMER_GROUP, f"group {name[:200]!r} is not a legal group name")


def message_type_of(sp) -> MessageType:
    """The type a message's system properties say it is (the client's own, as sent)."""
    return MessageType(sp.message_type) if sp.message_type in MessageType._value2member_map_ \
        else MessageType.MESSAGE_TYPE_UNSPECIFIED


def to_properties(m, max_body_bytes: int) -> tuple[dict[str, str], int]:
    """The 4.x properties and sysFlag one 5.x Message is stored with; Refused when it may not be."""
    sp = m.system_properties
    body = m.body
    if not body:
        raise Refused(Code.MESSAGE_BODY_EMPTY, "the message body is empty")
    if max_body_bytes > 0 and len(body) > max_body_bytes:
        raise Refused(Code.MESSAGE_BODY_TOO_LARGE, f"the message body is {len(body)} bytes, over the broker's "
                                                   f"maxMessageSize {max_body_bytes}")
    user = m.user_properties
    if len(user) > USER_PROPERTIES_MAX:
        raise Refused(Code.MESSAGE_PROPERTIES_TOO_LARGE, f"{len(user)} user properties, over {USER_PROPERTIES_MAX}")
    size = 0
    props: dict[str, str] = {}
    for k, v in user.items():
        if k in RESERVED_KEYS:
            raise Refused(Code.ILLEGAL_MESSAGE_PROPERTY_KEY, f"property {k!r} is reserved by RocketMQ")
        if not k or _control(k) or _control(v) or "\x01" in k + v or "\x02" in k + v:
            raise Refused(Code.ILLEGAL_MESSAGE_PROPERTY_KEY, f"property {k[:100]!r} has an empty name or a "
                                                             f"control character")
        size += len(k.encode()) + len(v.encode())
        props[k] = v
    if sp.HasField("tag"):
        tag = sp.tag
        if not tag.strip() or "|" in tag or _control(tag):
            raise Refused(Code.ILLEGAL_MESSAGE_TAG, f"tag {tag[:100]!r} is blank or holds '|' or a control character")
        size += len(tag.encode())
        props["TAGS"] = tag
    if sp.keys:
        for key in sp.keys:
            if not key.strip() or _control(key):
                raise Refused(Code.ILLEGAL_MESSAGE_KEY, f"key {key[:100]!r} is blank or holds a control character")
            size += len(key.encode())
        props["KEYS"] = " ".join(sp.keys)
    if size > USER_PROPERTY_BYTES_MAX:
        raise Refused(Code.MESSAGE_PROPERTIES_TOO_LARGE, f"user properties, tag and keys take {size} bytes, over "
                                                         f"{USER_PROPERTY_BYTES_MAX}")
    if not sp.message_id.strip():
        raise Refused(Code.ILLEGAL_MESSAGE_ID, "the message has no message_id")
    props["UNIQ_KEY"] = sp.message_id
    if sp.HasField("message_group"):
        group = sp.message_group
        if not group.strip() or len(group.encode()) >= MESSAGE_GROUP_BYTES_MAX or _control(group):
            raise Refused(Code.ILLEGAL_MESSAGE_GROUP, f"message group {group[:100]!r} is blank, {MESSAGE_GROUP_BYTES_MAX}"
                                                      f" bytes or longer, or holds a control character")
        props["__SHARDINGKEY"] = group
    if sp.born_host:
        props["__BORNHOST"] = sp.born_host
    if sp.HasField("born_timestamp"):
        props["BORN_TIMESTAMP"] = str(sp.born_timestamp.seconds * 1000 + sp.born_timestamp.nanos // 1_000_000)
    if sp.HasField("trace_context"):
        props["TRACE_CONTEXT"] = sp.trace_context
    props["RECONSUME_TIME"] = str(sp.delivery_attempt if sp.HasField("delivery_attempt") else 0)
    props["PGROUP"] = m.topic.name
    sys_flag = SYSFLAG_COMPRESSED if sp.body_encoding == Encoding.GZIP else 0
    return props, sys_flag


# a send's 4.x answer -> its entry's Code (ResponseBuilder and SendMessageActivity)
SEND_CODES = {
    RC.SUCCESS: Code.OK,
    RC.FLUSH_DISK_TIMEOUT: Code.MASTER_PERSISTENCE_TIMEOUT,
    RC.FLUSH_SLAVE_TIMEOUT: Code.SLAVE_PERSISTENCE_TIMEOUT,
    RC.SLAVE_NOT_AVAILABLE: Code.HA_NOT_AVAILABLE,
    RC.SYSTEM_BUSY: Code.TOO_MANY_REQUESTS,
    RC.NO_PERMISSION: Code.FORBIDDEN,
    RC.TOPIC_NOT_EXIST: Code.TOPIC_NOT_FOUND,
    RC.MESSAGE_ILLEGAL: Code.BAD_REQUEST,
    RC.REQUEST_CODE_NOT_SUPPORTED: Code.NOT_IMPLEMENTED,
}


def send_code(rc: int) -> Code:
    return SEND_CODES.get(rc, Code.INTERNAL_SERVER_ERROR)


def delivered_type(props: dict) -> MessageType:
    """The type a stored message is delivered as (GrpcConverter's rule)."""
    if props.get("TRAN_MSG", "").lower() == "true":
        return MessageType.TRANSACTION
    if "DELAY" in props or "TIMER_DELIVER_MS" in props or "TIMER_DELAY_SEC" in props:
        return MessageType.DELAY
    if "__SHARDINGKEY" in props:
        return MessageType.FIFO
    return MessageType.NORMAL


def _ts(t, ms: int) -> None:
    t.seconds, t.nanos = ms // 1000, (ms % 1000) * 1_000_000


def to_message(p, message_cls, store_host_id: str) -> object:
    """The 5.x Message a popped record (mq.gateway.pop.Popped) is delivered as.  store_host_id:
    the offset message id, for a message stored without UNIQ_KEY (a 4.x producer may not set it)."""
    import hashlib
    props = p.properties
    m = message_cls(body=p.body)
    m.topic.name = p.topic
    for k, v in props.items():
        if k not in RESERVED_KEYS:
            m.user_properties[k] = v
    sp = m.system_properties
    if props.get("TAGS"):
        sp.tag = props["TAGS"]
    if props.get("KEYS"):
        sp.keys.extend(k for k in props["KEYS"].split(" ") if k)
    sp.message_id = props.get("UNIQ_KEY") or store_host_id
    sp.body_digest.type = 2                                      # MD5, of the body as stored
    sp.body_digest.checksum = hashlib.md5(p.body).hexdigest().upper()
    sp.body_encoding = Encoding.GZIP if p.sys_flag & SYSFLAG_COMPRESSED else Encoding.IDENTITY
    sp.message_type = delivered_type(props)
    _ts(sp.born_timestamp, p.born_ms)
    sp.born_host = props.get("__BORNHOST") or p.born_host
    _ts(sp.store_timestamp, p.store_ms)
    sp.store_host = p.store_host
    if props.get("TIMER_DELIVER_MS", "").isdigit():
        _ts(sp.delivery_timestamp, int(props["TIMER_DELIVER_MS"]))
    if p.handle:                                                 # none for a PullMessage
        sp.receipt_handle = p.handle
    sp.queue_id = p.queue_id
    sp.queue_offset = p.queue_offset
    sp.delivery_attempt = p.reconsume_times + 1
    if "__SHARDINGKEY" in props:
        sp.message_group = props["__SHARDINGKEY"]
    if "TRACE_CONTEXT" in props:
        sp.trace_context = props["TRACE_CONTEXT"]
    return m
