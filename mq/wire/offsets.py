"""ResetOffsetBody: the queue -> offset table of RESET_CONSUMER_CLIENT_OFFSET (220, broker to
consumer) and of the answer to INVOKE_BROKER_TO_RESET_OFFSET (222).

Two spellings exist, and a broker must speak the one its consumer reads:
* Java (fastjson, a Map<MessageQueue, Long> with object keys, not standard JSON):
      {"offsetTable":{{"brokerName":"b","queueId":0,"topic":"T"}:12,...}}
* the official C++ client 1.x/2.x (ResetOffsetBody::Decode reads an array):
      {"offsetTable":[{"brokerName":"b","queueId":0,"topic":"T","offset":12},...]}
decode_reset_offset_body reads both."""
from __future__ import annotations

import json
import re

from .errors import MalformedError

__all__ = ["encode_reset_offset_body", "decode_reset_offset_body"]

_OBJECT_KEY = re.compile(r"(\{[^{}]*\})\s*:\s*(-?\d+)")


def encode_reset_offset_body(table: dict[tuple[str, str, int], int], cpp: bool = False) -> bytes:
    """table: (topic, brokerName, queueId) -> offset."""
    rows = sorted(table.items())
    if cpp:
        return json.dumps({"offsetTable": [{"brokerName": b, "queueId": q, "topic": t, "offset": off}
                                           for (t, b, q), off in rows]}, separators=(",", ":")).encode()
    items = ",".join(json.dumps({"brokerName": b, "queueId": q, "topic": t}, separators=(",", ":")) + f":{off}"
                     for (t, b, q), off in rows)
    return ('{"offsetTable":{' + items + "}}").encode()


def decode_reset_offset_body(body: bytes) -> dict[tuple[str, str, int], int]:
    """Either spelling -> (topic, brokerName, queueId) -> offset.  Raises MalformedError."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedError("ResetOffsetBody is not UTF-8") from None
    out: dict[tuple[str, str, int], int] = {}
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    try:
        if isinstance(data, dict) and isinstance(data.get("offsetTable"), list):
            for row in data["offsetTable"]:
                out[(str(row["topic"]), str(row["brokerName"]), int(row["queueId"]))] = int(row["offset"])
            return out
        if isinstance(data, dict) and data.get("offsetTable") == {}:
            return out
        for key, off in _OBJECT_KEY.findall(text):
            mq = json.loads(key)
            out[(str(mq["topic"]), str(mq["brokerName"]), int(mq["queueId"]))] = int(off)
    except (KeyError, TypeError, ValueError) as e:
        raise MalformedError(f"ResetOffsetBody: {e}") from None
    if not out and "offsetTable" not in text:
        raise MalformedError("ResetOffsetBody without an offsetTable")
    return out
