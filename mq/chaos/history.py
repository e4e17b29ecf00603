"""Operation histories of a chaos run, and the checker that judges them (Jepsen's way: record
what every client asked and what it was told, decide afterwards).

One JSON object a line, one file per recording process, merged by time:

    {"t_us": 1700000000123456, "process": "p1", "type": "invoke", "f": "send", "value": "p1-42"}
    {"t_us": ..., "process": "p1", "type": "ok", "f": "send", "value": "p1-42", "queue": "b@2", "offset": 17}
    {"t_us": ..., "process": "p1", "type": "fail", "f": "send", "value": "p1-43", "code": 14}
    {"t_us": ..., "process": "p1", "type": "info", "f": "send", "value": "p1-44", "error": "timeout"}
    {"t_us": ..., "process": "c1", "type": "ok", "f": "read", "value": "p1-42", "queue": "b@2", "offset": 17}
    {"t_us": ..., "process": "nemesis", "type": "info", "f": "start", "value": "kill broker-a"}   (in effect from here)
    {"t_us": ..., "process": "nemesis", "type": "info", "f": "stop", "value": "kill broker-a"}
    {"t_us": ..., "process": "drain", "type": "info", "f": "expired", "value": "b@2", "queue": "b@2", "offset": 900}
    {"t_us": ..., "process": "nemesis", "type": "info", "f": "damage", "value": "p1-40", "store": "127.0.0.1:10911",
     "phy": 81920, "how": "flip", "at": 81999}                      (a byte-level fault hit this message)
    {"t_us": ..., "process": "c5", "type": "info", "f": "receive", "value": "p1-42", "attempt": 1}
    {"t_us": ..., "process": "c5", "type": "ok", "f": "consume", "value": "p1-42"}    (its ack answered OK)
(an ack that failed is not recorded: the message may come again, or, when the ack was stored after
all, not: a delivery is what the promise asks for, a consume what redelivery is judged against)
Sends' `ok` and reads also carry "msgid" (the offset message id: store address + CommitLog
offset), and reads "intact" (the body matches its BODYCRC).

`ok` send: acknowledged (SEND_OK) at that queue and offset; `fail`: definitely not stored (a
refusal); `info`: the outcome is unknown (timeout, connection lost), so the message may or may
not be there - both are allowed.  The transactional workload (mqchaos --workload tx) records a
transaction its producer decided to commit as `ok` without queue and offset (the message takes
its place only when the broker commits it: no place or order is judged for it), and one it
decided to roll back as `fail`, whatever its half's send said: never to be read.  A `read` is a message a consumer got (the final drain reads
every queue to its end after the faults healed).  Values are unique per send.

Verdicts (check()):
  lost         acknowledged sends never read                                  (must be empty)
  expired      acknowledged sends below a queue's first retained offset at the drain: deleted by
               retention (which a disk over 85% full forces, as RocketMQ's does); not loss
  unexpected   reads of values never sent                                     (must be empty)
  duplicated   values read at two or more different (queue, offset) places     (must be empty;
               the same place read twice by a consumer that re-pulled is not a duplicate)
  reordered    per queue, a send acknowledged before another was invoked but stored after it
               (a later offset), both read - real-time order broken             (must be empty)
  failed_read  sends refused (`fail`) that were read anyway                    (must be empty)
  damaged_served  reads whose body does not match its BODYCRC                 (must be empty)
  offset_reused   (queue, offset) places at which two different values were read (must be empty)
  wrong_ack       acknowledged sends read, but at none of the places (queue, offset, msgId)
                  their acknowledgement named                                 (must be empty)
  damaged      acknowledged sends a byte-level fault hit, never read: allowed (never served)
  cut          acknowledged sends never read that lay after a damaged record in the same store's
               log (recovery truncates at the first damaged record): allowed only where the mode
               has no replica that must hold them (check(cut_allowed=True)); otherwise lost
A POP consumer's history (the grpc workload's 5.x consumer) adds, judged only when one ran:
  undelivered  acknowledged sends never delivered to it                        (must be empty;
               excused as for lost: expired, damaged, cut where allowed)
  delivered_unexpected  values delivered to it that were never sent          (must be empty)
  redelivered_acked    values delivered to it again after their ack was answered OK (must be
               empty: POP redelivers only what was not acked)
  redelivered  deliveries past the first of values not acked before: allowed (at-least-once)
  max_unavailable_s  the longest time without an acknowledged send while sends ran
  recovery_s   per fault, from its start to the acknowledgement of the first send invoked after
               it started (a failover's length, or a fault's length plus the restart), None if
               no such send was acknowledged before the run ended

A mode that does not promise survival of a fault (RELIABILITY.md) may lose acknowledged
messages: `suffix_loss` tells whether, per queue, what was lost is the tail of what was
acknowledged before a fault (an unflushed suffix), never a hole."""
from __future__ import annotations

import glob
import json
import os
import threading
import time
from dataclasses import dataclass, field

TYPES = ("invoke", "ok", "fail", "info")


class HistoryWriter:
    """Appends one process's operations to `<dir>/<process>.jsonl` (thread-safe, line-buffered,
    so a killed recorder loses at most the line being written)."""

    def __init__(self, directory: str, process: str):
        os.makedirs(directory, exist_ok=True)
        self.process = process
        self._file = open(os.path.join(directory, f"{process}.jsonl"), "a", encoding="utf-8", buffering=1)
        self._lock = threading.Lock()

    def record(self, type_: str, f: str, value: str, **extra) -> None:
        assert type_ in TYPES, type_
        line = json.dumps({"t_us": time.time_ns() // 1000, "process": self.process, "type": type_, "f": f,
                           "value": value, **extra}, separators=(",", ":"))
        with self._lock:
            self._file.write(line + "\n")

    def close(self) -> None:
        with self._lock:
            self._file.close()


def load(directory: str) -> list[dict]:
    """Every recorded operation under `directory`, ordered by time.  A torn last line (a killed
    recorder) is skipped."""
    ops = []
    for path in sorted(glob.glob(os.path.join(directory, "*.jsonl"))):
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    ops.append(json.loads(line))
                except ValueError:
                    continue
    ops.sort(key=lambda op: op["t_us"])
    return ops


@dataclass
class Verdict:
    sends: int = 0
    acked: int = 0
    failed: int = 0
    unknown: int = 0
    read: int = 0
    expired: int = 0
    lost: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    reordered: list[tuple[str, str]] = field(default_factory=list)
    failed_read: list[str] = field(default_factory=list)
    damaged_served: list[str] = field(default_factory=list)
    offset_reused: list[str] = field(default_factory=list)
    wrong_ack: list[str] = field(default_factory=list)
    damaged: list[str] = field(default_factory=list)
    cut: list[str] = field(default_factory=list)
    suffix_loss: bool = True
    max_unavailable_s: float = 0.0
    recovery_s: list[tuple[str, float | None]] = field(default_factory=list)
    consumer: bool = False                  # a POP consumer's history was judged
    consumed: int = 0
    redelivered: int = 0
    undelivered: list[str] = field(default_factory=list)
    delivered_unexpected: list[str] = field(default_factory=list)
    redelivered_acked: list[str] = field(default_factory=list)

    @property
    def valid(self) -> bool:
        """No acknowledged message lost, nothing unexpected, duplicated, reordered or resurrected."""
        return not (self.lost or self.unexpected or self.duplicated or self.reordered or self.failed_read
                    or self.damaged_served or self.offset_reused or self.wrong_ack
                    or self.undelivered or self.delivered_unexpected or self.redelivered_acked)

    def summary(self) -> dict:
        pop = {"consumed": self.consumed, "undelivered": len(self.undelivered),
               "delivered_unexpected": len(self.delivered_unexpected),
               "redelivered_acked": len(self.redelivered_acked), "redelivered": self.redelivered} \
            if self.consumer else {}
        return {**pop, "sends": self.sends, "acked": self.acked, "failed": self.failed, "unknown": self.unknown,
                "read": self.read, "expired": self.expired, "lost": len(self.lost), "unexpected": len(self.unexpected),
                "duplicated": len(self.duplicated), "reordered": len(self.reordered),
                "failed_read": len(self.failed_read), "damaged_served": len(self.damaged_served),
                "offset_reused": len(self.offset_reused), "wrong_ack": len(self.wrong_ack),
                "damaged": len(self.damaged), "cut": len(self.cut), "suffix_loss": self.suffix_loss,
                "max_unavailable_s": round(self.max_unavailable_s, 3),
                "recovery_s": [(what, None if s is None else round(s, 3)) for what, s in self.recovery_s],
                "valid": self.valid}


def check(ops: list[dict], cut_allowed: bool = False) -> Verdict:
    """Judges a history (see the module docstring)."""
    v = Verdict()
    invoked: dict[str, dict] = {}
    outcome: dict[str, dict] = {}
    reads: dict[str, set] = {}
    read_ids: dict[str, set] = {}            # value -> msgIds it was read with
    at_place: dict[tuple, set] = {}          # (queue, offset) -> values read there
    damage: list[dict] = []
    ok_times: list[int] = []
    sends = [op["t_us"] for op in ops if op["f"] == "send"]
    start_us, end_us = (sends[0], sends[-1]) if sends else (0, 0)     # the run: the drain comes after
    fault_names: list[tuple[str, int]] = []
    expired_below: dict[str, int] = {}       # queue -> its first offset retention kept
    first_consumed: dict[str, int] = {}      # value -> when its first ack was answered OK
    deliveries: list[tuple[str, int]] = []   # (value, t_us) of every delivery to the POP consumer
    for op in ops:
        f, kind, value = op["f"], op["type"], op.get("value")
        if f == "send":
            if kind == "invoke":
                invoked[value] = op
            else:
                outcome[value] = op
                if kind == "ok":
                    ok_times.append(op["t_us"])
        elif f == "read" and kind == "ok":
            reads.setdefault(value, set()).add((op["queue"], op["offset"]))
            at_place.setdefault((op["queue"], op["offset"]), set()).add(value)
            if "msgid" in op:
                read_ids.setdefault(value, set()).add(op["msgid"])
            if op.get("intact") is False:
                v.damaged_served.append(value)
        elif f == "receive":
            deliveries.append((value, op["t_us"]))
        elif f == "consume" and kind == "ok":
            first_consumed.setdefault(value, op["t_us"])
        elif f == "damage":
            damage.append(op)
        elif f == "expired":
            expired_below[op["queue"]] = max(expired_below.get(op["queue"], 0), op["offset"])
        elif op.get("process") == "nemesis" and f == "start":
            fault_names.append((value, op["t_us"]))
    v.sends = len(invoked)
    v.acked = sum(1 for o in outcome.values() if o["type"] == "ok")
    v.failed = sum(1 for o in outcome.values() if o["type"] == "fail")
    v.unknown = v.sends - v.acked - v.failed
    v.read = len(reads)
    unread = [(val, o) for val, o in outcome.items() if o["type"] == "ok" and val not in reads]
    v.expired = sum(1 for _, o in unread if "queue" in o and o["offset"] < expired_below.get(o["queue"], 0))
    missing = [(val, o) for val, o in unread if "queue" not in o or o["offset"] >= expired_below.get(o["queue"], 0)]
    damaged_values = {d["value"] for d in damage}
    v.damaged = sorted(val for val, _ in missing if val in damaged_values)
    v.cut = sorted(val for val, o in missing if val not in damaged_values and _after_damage(o, damage))
    excused = set(v.damaged) | (set(v.cut) if cut_allowed else set())
    v.lost = sorted(val for val, _ in missing if val not in excused)
    v.damaged_served = sorted(set(v.damaged_served))
    v.offset_reused = sorted(f"{q}@{off}: {' '.join(sorted(vals))}" for (q, off), vals in at_place.items()
                             if len(vals) > 1)
    v.wrong_ack = sorted(val for val, o in outcome.items() if o["type"] == "ok" and val in reads and "queue" in o
                         and ((o["queue"], o["offset"]) not in reads[val]
                              or ("msgid" in o and val in read_ids and o["msgid"] not in read_ids[val])))
    v.unexpected = sorted(val for val in reads if val not in invoked)
    v.duplicated = sorted(val for val, places in reads.items() if len(places) > 1)
    v.failed_read = sorted(val for val, o in outcome.items() if o["type"] == "fail" and val in reads)
    v.reordered = _reordered(invoked, outcome, reads)
    if deliveries or first_consumed:
        v.consumer = True
        v.consumed = len(first_consumed)
        expired = {val for val, o in unread if "queue" in o and o["offset"] < expired_below.get(o["queue"], 0)}
        delivered = {val for val, _ in deliveries}
        v.undelivered = sorted(val for val, o in outcome.items() if o["type"] == "ok" and val not in delivered
                               and val not in excused and val not in expired)
        v.delivered_unexpected = sorted(val for val in delivered | set(first_consumed) if val not in invoked)
        v.redelivered_acked = sorted({val for val, t in deliveries if val in first_consumed
                                      and t > first_consumed[val]})
        v.redelivered = len(deliveries) - len(delivered)
    v.suffix_loss = _suffix_only(v.lost, invoked, outcome, [t for _, t in fault_names])
    marks = [start_us] + ok_times + [end_us]
    v.max_unavailable_s = max((b - a for a, b in zip(marks, marks[1:])), default=0) / 1e6
    # per fault: the first send invoked after it started that was acknowledged, and when
    acks = sorted((invoked[val]["t_us"], o["t_us"]) for val, o in outcome.items()
                  if o["type"] == "ok" and val in invoked)
    for what, start_us in fault_names:
        later = [ack for inv, ack in acks if inv >= start_us]
        v.recovery_s.append((what, (min(later) - start_us) / 1e6 if later else None))
    return v


def _after_damage(ok: dict, damage: list[dict]) -> bool:
    """Did this acknowledged send lie at or after a damaged record in the same store's log (its
    offset msgId names the store and the CommitLog offset)?"""
    msgid = ok.get("msgid")
    if not msgid or not damage:
        return False
    from mq.wire.msgid import decode_offset_msg_id
    try:
        host, port, phy = decode_offset_msg_id(msgid.split(",")[0])
    except ValueError:
        return False
    return any(d["store"] == f"{host}:{port}" and phy >= d["phy"] for d in damage)


def _reordered(invoked: dict, outcome: dict, reads: dict) -> list[tuple[str, str]]:
    """Per queue: acknowledged sends a, b, both read, with ok(a) before invoke(b) but offset(a) >
    offset(b).  A lost message has no place to be out of order in (its loss is judged as loss);
    after a lost suffix, later sends take its offsets again."""
    per_queue: dict[str, list[tuple[int, int, int, str]]] = {}
    for val, o in outcome.items():
        if o["type"] == "ok" and val in invoked and val in reads and "queue" in o:
            per_queue.setdefault(o["queue"], []).append((invoked[val]["t_us"], o["t_us"], o["offset"], val))
    bad = []
    for sends in per_queue.values():
        by_ack = sorted(sends, key=lambda s: s[1])
        by_invoke = sorted(sends, key=lambda s: s[0])
        # walk the invokes in time order; every send acknowledged before this invoke must hold a
        # smaller offset than this one
        i, best = 0, None            # best: the acknowledged-before send with the largest offset
        for inv_us, _, offset, val in by_invoke:
            while i < len(by_ack) and by_ack[i][1] < inv_us:
                if best is None or by_ack[i][2] > best[2]:
                    best = by_ack[i]
                i += 1
            if best is not None and best[2] > offset:
                bad.append((best[3], val))
    return bad


def _suffix_only(lost: list[str], invoked: dict, outcome: dict, fault_starts: list[int]) -> bool:
    """Is the loss, per queue, a suffix of what was acknowledged before each fault?  The
    acknowledged sends of a queue, cut into pieces at every fault's start by the time they were
    invoked (a send invoked before the fault went to the log the fault hit, even if its ack
    raced the fault): within a piece every lost message sits at a higher queue offset than every
    surviving one (what an unflushed tail of the log looks like), never a hole below a survivor.
    Ack order is not offset order across producers, so offsets decide."""
    if not lost:
        return True
    lost_set = set(lost)
    cuts = sorted(fault_starts)
    pieces: dict[tuple[str, int], tuple[list[int], list[int]]] = {}
    for val, o in outcome.items():
        if o["type"] != "ok" or val not in invoked or "queue" not in o:
            continue
        piece = sum(1 for c in cuts if c <= invoked[val]["t_us"])
        kept, gone = pieces.setdefault((o["queue"], piece), ([], []))
        (gone if val in lost_set else kept).append(o["offset"])
    return all(not gone or not kept or min(gone) > max(kept) for kept, gone in pieces.values())


__all__ = ["HistoryWriter", "Verdict", "check", "load", "TYPES"]
