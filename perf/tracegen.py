"""A deterministic synthetic trace (mq/trace.py records) for the miner's tests.

`generate(directory, seed=...)` writes the same files for the same arguments:
all four record kinds, two brokers, ~20 s, ~12 k records, laid out the way real
writers lay them out (one file per process, in subdirectories) so the miner's
recursive read is exercised.  It also contains what real traces contain:

  - three modes: produce (send -> ack), e2e (send -> ack -> consume) and consume
    (consume only; some records without send_us, so their latency is null);
  - failed sends (status ERROR:..., no ack_us) and FLUSH_DISK_TIMEOUT answers;
  - a throughput stall (seconds 12-13 carry a tenth of the load, with slow acks);
  - broker-b is an ASYNC master: its req records have no repl_wait_us at all;
  - broker-a has two slaves, broker-b one; one slave falls behind and recovers;
  - a torn last line in one file (a writer killed mid-write), which a reader
    must skip.

Usage:  python -m perf.tracegen DIR [--seed N] [--scale F]
"""
from __future__ import annotations

import argparse
import json
import os
import random

from mq.trace import FIELDS, KINDS

BASE_US = 1_700_000_000_000_000     # a fixed wall-clock start, so output is reproducible
DURATION_S = 20
STALL_S = (12, 13)                   # seconds with a tenth of the load and slow answers
BROKERS = ("broker-a", "broker-b")
SLAVES = {"broker-a": ("127.0.0.1:20912", "127.0.0.1:21912"), "broker-b": ("127.0.0.1:22912",)}
TORN_LINE = '{"kind":"msg","run":"gen","mode":"produce","send_'


def _check(rec: dict) -> dict:
    assert rec["kind"] in KINDS and all(k in FIELDS for k in rec), rec
    return rec


def _latency_us(rng: random.Random, sec: int, median_us: float) -> int:
    slow = 20.0 if STALL_S[0] <= sec <= STALL_S[1] else 1.0
    return max(1, int(rng.lognormvariate(0.0, 0.6) * median_us * slow))


def _msgs(rng: random.Random, scale: float) -> dict[str, list[dict]]:
    """msg records per writing client (file prefix)."""
    files: dict[str, list[dict]] = {}
    per_s = {"produce": int(260 * scale), "e2e": int(80 * scale), "consume": int(30 * scale)}
    offsets: dict[tuple, int] = {}
    for mode, rate in per_s.items():
        for client_no in range(2):
            client = f"{mode}-client-{client_no}"
            recs = files.setdefault(f"run-gen/mqperf-{client}", [])
            for sec in range(DURATION_S):
                n = rate // 2 // (10 if STALL_S[0] <= sec <= STALL_S[1] else 1)
                for _ in range(n):
                    broker = rng.choice(BROKERS)
                    queue = rng.randrange(4)
                    key = (broker, queue)
                    offsets[key] = offsets.get(key, -1) + 1
                    send_us = BASE_US + sec * 1_000_000 + rng.randrange(1_000_000)
                    rec = {"kind": "msg", "run": "gen", "mode": mode, "client": client,
                           "broker": broker, "topic": "BenchTopic", "queue": queue,
                           "queue_offset": offsets[key], "size_bytes": rng.choice((128, 1024, 1024, 4096)),
                           "batch": 1}
                    if mode in ("produce", "e2e"):
                        roll = rng.random()
                        if roll < 0.004:
                            rec.update(status="ERROR:timeout", send_us=send_us)   # no answer, no ack_us
                        else:
                            ack_us = send_us + _latency_us(rng, sec, 900.0 if broker == "broker-a" else 400.0)
                            rec.update(status="FLUSH_DISK_TIMEOUT" if roll < 0.01 else "SEND_OK",
                                       send_us=send_us, ack_us=ack_us, store_ts_ms=(ack_us - 100) // 1000)
                            if mode == "e2e":
                                rec["consume_us"] = ack_us + _latency_us(rng, sec, 2_000.0)
                    else:
                        rec["status"] = "FOUND"
                        consume_us = send_us + _latency_us(rng, sec, 3_000.0)
                        rec["consume_us"] = consume_us
                        if rng.random() < 0.9:      # the rest: a consumer that never saw the send
                            rec["send_us"] = send_us
                        else:
                            del rec["queue_offset"]
                    recs.append(_check(rec))
    return files


def _broker(rng: random.Random, broker: str, scale: float) -> list[dict]:
    recs: list[dict] = []
    async_master = broker == "broker-b"
    for sec in range(DURATION_S):
        stall = STALL_S[0] <= sec <= STALL_S[1]
        for _ in range(int(80 * scale) // (10 if stall else 1)):
            ts_us = BASE_US + sec * 1_000_000 + rng.randrange(1_000_000)
            code = rng.choice((310, 310, 310, 320, 11))
            msgs = rng.randrange(1, 33) if code == 320 else (0 if code == 11 else 1)
            rec = {"kind": "req", "broker": broker, "role": f"io-{rng.randrange(2)}", "ts_us": ts_us,
                   "code": code, "msgs": msgs, "size_bytes": msgs * 1024 + 200, "status": 0,
                   "decode_us": round(rng.uniform(2, 15), 3), "encode_us": round(rng.uniform(1, 6), 3)}
            if code != 11:          # a pull neither appends nor waits: those phases are absent
                rec["append_us"] = round(rng.lognormvariate(2.5, 0.5), 3)
                rec["flush_wait_us"] = round(rng.expovariate(1 / 40), 3)
                if not async_master:
                    rec["repl_wait_us"] = round(rng.expovariate(1 / (3000 if stall else 150)), 3)
            rec["total_us"] = round(sum(rec[p] for p in
                                        ("decode_us", "append_us", "flush_wait_us", "repl_wait_us", "encode_us")
                                        if p in rec) + rng.uniform(5, 30), 3)
            recs.append(_check(rec))
        for _ in range(int(40 * scale) // (10 if stall else 1)):
            group_msgs = min(64, 1 + int(rng.expovariate(1 / (30 if stall else 6))))
            recs.append(_check({"kind": "flush", "broker": broker,
                                "ts_us": BASE_US + sec * 1_000_000 + rng.randrange(1_000_000),
                                "group_msgs": group_msgs, "group_bytes": group_msgs * rng.choice((1224, 1300)),
                                "flush_us": round(rng.lognormvariate(5.3, 0.4) * (4 if stall else 1), 3)}))
        for slave_no, slave in enumerate(SLAVES[broker]):
            for tick in range(5):                   # a sample every 200 ms
                ts_us = BASE_US + sec * 1_000_000 + tick * 200_000 + rng.randrange(1_000)
                master_offset = (sec * 5 + tick + 1) * 400_000
                behind = slave_no == 1 and 8 <= sec <= 15
                lag_bytes = rng.randrange(3_000_000, 9_000_000) if behind else rng.randrange(0, 40_000)
                recs.append(_check({"kind": "lag", "broker": broker, "ts_us": ts_us, "slave": slave,
                                    "master_offset": master_offset, "ack_offset": master_offset - lag_bytes,
                                    "lag_bytes": lag_bytes}))
    return recs


def generate(directory: str, seed: int = 1, scale: float = 1.0) -> dict[str, int]:
    """Writes the trace under `directory`; returns {kind: records written}."""
    rng = random.Random(seed)
    files = _msgs(rng, scale)
    for broker in BROKERS:
        files[f"{broker}/broker-{broker}"] = _broker(rng, broker, scale)
    counts = dict.fromkeys(KINDS, 0)
    for name, recs in sorted(files.items()):
        path = os.path.join(directory, name + ".jsonl")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            for rec in recs:
                f.write(json.dumps(rec, separators=(",", ":")) + "\n")
                counts[rec["kind"]] += 1
            if name.endswith("produce-client-1"):
                f.write(TORN_LINE)          # no newline: the writer died here
    return counts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="tracegen", description="write a synthetic mq trace")
    ap.add_argument("directory")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--scale", type=float, default=1.0, help="multiplies every record rate")
    a = ap.parse_args(argv)
    counts = generate(a.directory, a.seed, a.scale)
    print(" ".join(f"{k}={v}" for k, v in counts.items()), f"under {a.directory}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
