"""Request headers whose field names are part of the wire (spec 2.x): SEND_MESSAGE_V2's one-letter
names and the pull request's sysFlag bits.

SEND_MESSAGE (10) and SEND_BATCH_MESSAGE (320) with a long-named header carry RocketMQ's
SendMessageRequestHeader; SEND_MESSAGE_V2 (310) and most SEND_BATCH_MESSAGE requests carry the same
fields under the letters of SendMessageRequestHeaderV2 (SEND_V2_LETTERS).  Invariants:
* The letters are a..n in the order of SEND_V2_FIELDS; every field is a string on the wire (ext fields).
* A header is the V2 form when it has "b" and no "topic" (what the broker's send path tests, in one place:
  is_send_v2).
"""

from __future__ import annotations

# SendMessageRequestHeaderV2 (common/protocol/header/SendMessageRequestHeaderV2.java): letter -> long name
SEND_V2_FIELDS = ("producerGroup", "topic", "defaultTopic", "defaultTopicQueueNums", "queueId", "sysFlag",
                  "bornTimestamp", "flag", "properties", "reconsumeTimes", "unitMode", "maxReconsumeTimes",
                  "batch", "brokerName")
SEND_V2_LETTERS: dict[str, str] = {chr(ord("a") + i): name for i, name in enumerate(SEND_V2_FIELDS)}
SEND_V2_LETTER_OF: dict[str, str] = {name: letter for letter, name in SEND_V2_LETTERS.items()}

# PullMessageRequestHeader.sysFlag (common/sysflag/PullSysFlag.java)
PULL_COMMIT_OFFSET = 0x1
PULL_SUSPEND = 0x2
PULL_SUBSCRIPTION = 0x4
PULL_CLASS_FILTER = 0x8


def is_send_v2(ext: dict) -> bool:
    """Whether a send header uses SEND_MESSAGE_V2's letters."""
    return "b" in ext and "topic" not in ext


def send_long_names(ext: dict) -> dict:
    """A send header with RocketMQ's long names, whichever form was sent (unknown keys kept as sent)."""
    if is_send_v2(ext):
        return {SEND_V2_LETTERS.get(k, k): v for k, v in ext.items()}
    return dict(ext)


def send_v2(**fields) -> dict:
    """A SEND_MESSAGE_V2 header from long names: send_v2(producerGroup="PG", topic="T", queueId=0, ...).
    Values are kept as given (the remoting layer stringifies them); an unknown name is a programmer
    error.  Fields left out are left out, as a client may."""
    unknown = set(fields) - SEND_V2_LETTER_OF.keys()
    assert not unknown, f"not a SendMessageRequestHeaderV2 field: {sorted(unknown)}"
    return {SEND_V2_LETTER_OF[name]: value for name, value in fields.items()}
