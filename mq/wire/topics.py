"""Topics as RocketMQ names and describes them: permission bits (PermName), the system topics
and their name prefixes (TopicValidator, MixAll), the name's charset and length, and
TopicConfig -- the one description of a topic's queues, as the broker keeps it
(config/topics.json), registers it with the name server and answers it to tools, in RocketMQ's
JSON key names.

Defaults are RocketMQ's TopicConfig class's: 16 read and 16 write queues, perm RW.  Others
that users meet and that are not this class's (so set where they apply, not here): mqadmin
updateTopic's 8/8, and a topic auto-created on its first send, which takes
min(defaultTopicQueueNums = 4, the default topic's write queues)."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from .errors import MalformedError

__all__ = ["PERM_PRIORITY", "PERM_READ", "PERM_WRITE", "PERM_INHERIT", "perm_to_string", "TOPIC_RE",
           "TOPIC_LEN_MAX", "AUTO_CREATE_TOPIC", "SCHEDULE_TOPIC", "SELF_TEST_TOPIC", "OFFSET_MOVED_EVENT",
           "RETRY_PREFIX", "DLQ_PREFIX", "SEND_PROTECTED_TOPICS", "retry_topic", "dlq_topic", "reply_topic",
           "TopicConfig", "TOPIC_ATTRIBUTES", "MESSAGE_TYPE_KEY", "apply_attributes", "attributes_text"]

# PermName
PERM_PRIORITY, PERM_READ, PERM_WRITE, PERM_INHERIT = 8, 4, 2, 1

# TopicValidator: the charset of a topic (and of a group name: Validators.checkGroup), and its length
TOPIC_RE = re.compile(r"^[%|a-zA-Z0-9_-]+$")
TOPIC_LEN_MAX = 127

AUTO_CREATE_TOPIC = "TBW102"
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
SELF_TEST_TOPIC = "SELF_TEST_TOPIC"
OFFSET_MOVED_EVENT = "OFFSET_MOVED_EVENT"
TRACE_TOPIC = "RMQ_SYS_TRACE_TOPIC"               # message trace's default topic (TopicValidator)
RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"
# producers may not send to these directly (NO_PERMISSION)
SEND_PROTECTED_TOPICS = frozenset({SCHEDULE_TOPIC, "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC",
                                   "TRANS_CHECK_MAX_TIME_TOPIC", SELF_TEST_TOPIC, OFFSET_MOVED_EVENT})


# RocketMQ 5's topic attributes (TopicAttributes) that this broker knows: name -> allowed values.
# message.type: the kinds of message a 5.x client may send to the topic (and QueryRoute's
# accept_message_types); a topic without it is NORMAL (every 4.x topic).
MESSAGE_TYPE_KEY = "message.type"
TOPIC_ATTRIBUTES = {MESSAGE_TYPE_KEY: ("NORMAL", "FIFO", "DELAY", "TRANSACTION", "MIXED")}


def apply_attributes(current: dict[str, str], text: str) -> dict[str, str]:
    """RocketMQ 5's attributes header on `current`: "+name=value" sets, "-name" removes, items
    separated by ','.  MalformedError for an unknown name, a value not allowed, or a bad item."""
    out = dict(current)
    for item in (t.strip() for t in (text or "").split(",")):
        if not item:
            continue
        if item[0] == "+" and "=" in item:
            name, value = item[1:].split("=", 1)
            allowed = TOPIC_ATTRIBUTES.get(name)
            if allowed is None:
                raise MalformedError(f"unknown topic attribute {name!r} (known: {', '.join(TOPIC_ATTRIBUTES)})")
            if value not in allowed:
                raise MalformedError(f"topic attribute {name} is {value!r}, not one of {', '.join(allowed)}")
            out[name] = value
        elif item[0] == "-" and "=" not in item:
            if item[1:] not in TOPIC_ATTRIBUTES:
                raise MalformedError(f"unknown topic attribute {item[1:]!r}")
            out.pop(item[1:], None)
        else:
            raise MalformedError(f"topic attribute item {item!r} is neither +name=value nor -name")
    return out


def attributes_text(attrs: dict[str, str]) -> str:
    """The header form of attrs (every one set): "+name=value,..."."""
    return ",".join(f"+{k}={v}" for k, v in sorted(attrs.items()))


def perm_to_string(perm: int) -> str:
    """PermName.perm2String: 'RW-' style."""
    return "".join(c if perm & bit else "-" for c, bit in (("R", PERM_READ), ("W", PERM_WRITE), ("X", PERM_INHERIT)))


def reply_topic(cluster: str) -> str:
    """MixAll.getReplyTopic: where a cluster's brokers keep request-reply answers."""
    return f"{cluster}_REPLY_TOPIC"


def retry_topic(group: str) -> str:
    return RETRY_PREFIX + group


def dlq_topic(group: str) -> str:
    return DLQ_PREFIX + group


def _int(obj: dict, key: str, default: int) -> int:
    v = obj.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, str)):
        raise MalformedError(f"TopicConfig {key} is {v!r}, not an integer")
    try:
        return int(v)
    except ValueError:
        raise MalformedError(f"TopicConfig {key} is {v!r}, not an integer") from None


@dataclass
class TopicConfig:
    """RocketMQ's TopicConfig.  to_obj()/from_obj(): its JSON (fastjson's keys, alphabetical);
    compact()/from_compact(): TopicConfig.encode(), the compressed registration's form."""
    topic_name: str
    read_queue_nums: int = 16
    write_queue_nums: int = 16
    perm: int = PERM_READ | PERM_WRITE
    topic_sys_flag: int = 0
    topic_filter_type: str = "SINGLE_TAG"
    order: bool = False
    attributes: dict = field(default_factory=dict)   # RocketMQ 5's (TOPIC_ATTRIBUTES); in the JSON only when set

    def to_obj(self) -> dict:
        obj = {"order": self.order, "perm": self.perm, "readQueueNums": self.read_queue_nums,
               "topicFilterType": self.topic_filter_type, "topicName": self.topic_name,
               "topicSysFlag": self.topic_sys_flag, "writeQueueNums": self.write_queue_nums}
        if self.attributes:
            obj = {"attributes": dict(self.attributes), **obj}
        return obj

    @classmethod
    def from_obj(cls, obj: Any, name: str | None = None) -> "TopicConfig":
        """From TopicConfig JSON; `name` (the table key) is used when topicName is absent.
        MalformedError when it is not one."""
        if not isinstance(obj, dict):
            raise MalformedError(f"topic config of {name!r} is a {type(obj).__name__}, not an object")
        topic = obj.get("topicName") or name
        if not topic:
            raise MalformedError("topic config without topicName")
        sys_flag = obj.get("topicSysFlag", obj.get("topicSynFlag", 0))     # older RocketMQ misspelled it
        return cls(topic_name=str(topic), read_queue_nums=_int(obj, "readQueueNums", 16),
                   write_queue_nums=_int(obj, "writeQueueNums", 16), perm=_int(obj, "perm", 6),
                   topic_sys_flag=_int({"f": sys_flag}, "f", 0),
                   topic_filter_type=str(obj.get("topicFilterType") or "SINGLE_TAG"),
                   order=bool(obj.get("order", False)),
                   attributes={str(k): str(v) for k, v in (obj.get("attributes") or {}).items()}
                   if isinstance(obj.get("attributes"), dict) else {})

    def compact(self) -> str:
        """TopicConfig.encode(): the compressed-register form (loses topicSysFlag and order)."""
        return f"{self.topic_name} {self.read_queue_nums} {self.write_queue_nums} {self.perm} {self.topic_filter_type}"

    @classmethod
    def from_compact(cls, text: str) -> "TopicConfig":
        parts = text.split(" ")
        if len(parts) != 5:
            raise MalformedError(f"compact topic config {text!r} does not have 5 fields")
        try:
            return cls(topic_name=parts[0], read_queue_nums=int(parts[1]), write_queue_nums=int(parts[2]),
                       perm=int(parts[3]), topic_filter_type=parts[4])
        except ValueError:
            raise MalformedError(f"compact topic config {text!r} has a non-integer count") from None

    def __str__(self) -> str:
        """TopicConfig.toString, as mqadmin prints it."""
        return (f"TopicConfig [topicName={self.topic_name}, readQueueNums={self.read_queue_nums}, "
                f"writeQueueNums={self.write_queue_nums}, perm={perm_to_string(self.perm)}, "
                f"topicFilterType={self.topic_filter_type}, topicSysFlag={self.topic_sys_flag}, "
                f"order={'true' if self.order else 'false'}"
                + (f", attributes={{{', '.join(f'{k}={v}' for k, v in sorted(self.attributes.items()))}}}"
                   if self.attributes else "") + "]")
