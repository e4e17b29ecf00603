"""Store options: RocketMQ's MessageStoreConfig keys, defaults and meaning,
declared once (Redis style).  The broker's config table extends this one;
parsing, validation, `-p` printing and the documented conf files all read it.
Names stay RocketMQ's (camelCase) because operators know them."""
from __future__ import annotations

import os
from typing import Any

from mq.options import Option, _fraction, _non_negative, _positive, load_properties_file, parse_properties  # noqa: F401


STORE_OPTIONS: list[Option] = [
    Option("storePathRootDir", str, os.path.join(os.path.expanduser("~"), "store"),
           "root of the store: commitlog/, consumequeue/, config/, checkpoint, abort, lock"),
    Option("storePathCommitLog", str, "", "CommitLog directory; empty means <storePathRootDir>/commitlog"),
    Option("mappedFileSizeCommitLog", int, 1024 * 1024 * 1024, "bytes per CommitLog file",
           lambda v: 4096 <= v <= 1 << 40 and v % 4096 == 0, "must be a multiple of 4096 from 4 KiB to 1 TiB"),
    Option("mappedFileSizeConsumeQueue", int, 300000 * 20, "bytes per ConsumeQueue file (rounded down to 20)",
           lambda v: v >= 20 * 16, "must hold at least 16 entries"),
    Option("flushDiskType", ("ASYNC_FLUSH", "SYNC_FLUSH"), "ASYNC_FLUSH",
           "SYNC_FLUSH answers a send once its bytes are durable (group commit)"),
    Option("syncFlushTimeout", int, 5000, "ms a SYNC_FLUSH send waits before FLUSH_DISK_TIMEOUT", _positive,
           "must be > 0"),
    Option("flushIntervalCommitLog", int, 500, "ms between ASYNC_FLUSH flushes", _positive, "must be > 0"),
    Option("flushCommitLogLeastPages", int, 4, "ASYNC_FLUSH flushes once this many 4 KiB pages are dirty",
           _non_negative, "must be >= 0"),
    Option("flushCommitLogThoroughInterval", int, 10000, "ms after which ASYNC_FLUSH flushes whatever is dirty",
           _positive, "must be > 0"),
    Option("flushIntervalConsumeQueue", int, 1000, "ms between ConsumeQueue flushes", _positive, "must be > 0"),
    Option("flushConsumeQueueLeastPages", int, 2, "ConsumeQueue pages dirty before a flush", _non_negative,
           "must be >= 0"),
    Option("flushConsumeQueueThoroughInterval", int, 60000, "ms between full ConsumeQueue flushes + checkpoint",
           _positive, "must be > 0"),
    Option("fileReservedTime", int, 72, "hours a CommitLog file is kept", _positive, "must be > 0"),
    Option("deleteWhen", str, "04", "hours of the day (';'-separated) when expired files are deleted",
           lambda v: all(h.strip().isdigit() and 0 <= int(h) <= 23 for h in v.split(";")),
           "must be hours 0-23 separated by ';'"),
    Option("diskMaxUsedSpaceRatio", int, 75, "disk use (%) above which expired files go at once (10..95)",
           lambda v: 10 <= v <= 95, "must be between 10 and 95"),
    # RocketMQ 4.x reads these two as JVM system properties (rocketmq.broker.diskSpace...); here they are
    # broker.conf keys with the same fractions as defaults.  mq.store.retention.DiskCheck applies them.
    Option("diskSpaceWarningLevelRatio", float, 0.90, "disk use (fraction of the CommitLog or ConsumeQueue "
           "partition) above which sends are refused with SERVICE_NOT_AVAILABLE until it drops",
           _fraction, "must be a fraction above 0 and at most 1 (0.90 = 90%)"),
    Option("diskSpaceCleanForciblyRatio", float, 0.85, "disk use (fraction) above which retention deletes the "
           "oldest files at once, whatever fileReservedTime says (with cleanFileForciblyEnable)",
           _fraction, "must be a fraction above 0 and at most 1 (0.85 = 85%)"),
    Option("cleanFileForciblyEnable", bool, True, "over diskSpaceCleanForciblyRatio (or the warning ratio), "
           "retention ignores fileReservedTime"),
    Option("cleanResourceInterval", int, 10000, "ms between retention checks", _positive, "must be > 0"),
    Option("deleteCommitLogFilesInterval", int, 100, "ms between two file deletions in one pass",
           _non_negative, "must be >= 0"),
    Option("maxMessageSize", int, 4 * 1024 * 1024, "largest body (bytes) a message may have",
           lambda v: 1 <= v <= 64 * 1024 * 1024, "must be between 1 and 64 MiB"),
    Option("checkCRCOnRecover", bool, True, "check body CRCs when recovering the CommitLog"),
    Option("messageDelayLevel", str, "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h",
           "delay of each level, space-separated (s, m, h, d units)",
           lambda v: _delay_levels_ok(v), "must be space-separated durations like 1s 5m 2h"),
    # ---- message index (mq.store.index): RocketMQ's keys and defaults ---------------------------
    Option("messageIndexEnable", bool, True, "index every message's UNIQ_KEY and KEYS (queries by key and msgId)"),
    Option("maxHashSlotNum", int, 5000000, "hash slots per index file (4 bytes each)",
           lambda v: 1 <= v <= 100_000_000, "must be between 1 and 100000000"),
    Option("maxIndexNum", int, 20000000, "entries per index file (20 bytes each); a file holds maxIndexNum - 1",
           lambda v: 65 <= v <= 100_000_000, "must be between 65 and 100000000"),
    # ---- DLedger mode (spec §7): RocketMQ's MessageStoreConfig keys ----------------------------
    Option("enableDLegerCommitLog", bool, False, "DLedger mode: the CommitLog is Raft-replicated in a group"),
    Option("dLegerGroup", str, "", "DLedger group name (empty: brokerName)"),
    Option("dLegerPeers", str, "", "the group's members: n0-host:port;n1-host:port;... (DLedger peer ports)",
           lambda v: v == "" or _peers_ok(v), "must be id-host:port entries separated by ';'"),
    Option("dLegerSelfId", str, "", "this member's id in dLegerPeers"),
    Option("preferredLeaderId", str, "", "a member that takes the lead whenever it is caught up (empty: none)"),
    Option("enableBatchPush", bool, False, "accepted: pushes always carry batches here"),
    Option("dLegerFastFollowEnable", bool, True, "a follower appends and answers the leader's pushes that go at "
           "the end of its log in C, one call per read (ours; mq.dledger.role; every other frame is the Raft "
           "core's, in order)"),
    Option("dLegerFastLeadEnable", bool, True, "a ready leader takes its followers' SUCCESS answers and sends "
           "its next pushes in C, one call per read and per append (ours; mq.dledger.lead; every other case is "
           "the Raft core's)"),
    Option("dLegerScrubBytesPerSec", int, 1024 * 1024, "the Raft role reads its committed entries back with "
           "their CRCs at this rate, in a loop, and rewrites a damaged one from a member's whole copy (ours; "
           "mq.dledger.role; 0: off)", lambda v: 0 <= v <= 1 << 40, "must be between 0 and 2^40"),
    Option("storePathDLedgerCommitLog", str, "", "DLedger data files; empty means <storePathRootDir>/dledger-<selfId>/data"),
    # DLedgerConfig's timer keys (RocketMQ passes none of them; here they are broker.conf keys).  The
    # defaults are ours, chosen for failover in well under 3 s; DLedger's own are given in each doc.
    Option("heartBeatTimeIntervalMs", int, 200, "ms between the leader's heartbeats (DLedger: 2000)", _positive,
           "must be > 0"),
    Option("maxHeartBeatLeak", int, 3, "heartbeats a follower may miss before it campaigns (DLedger: 3)", _positive,
           "must be > 0"),
    Option("minVoteIntervalMs", int, 300, "least random wait added to the missed heartbeats before a campaign "
           "(DLedger: 300)", _non_negative, "must be >= 0"),
    Option("maxVoteIntervalMs", int, 800, "most random wait added before a campaign (DLedger: 1000)", _positive,
           "must be > 0"),
    Option("maxWaitAckTimeMs", int, 2500, "ms a send waits for its quorum commit before SYSTEM_ERROR (DLedger: 2500)",
           _positive, "must be > 0"),
    Option("checkPointInterval", int, 3000, "ms between writes of dledger-<selfId>/checkpoint (DLedger: 3000)",
           _positive, "must be > 0"),
    Option("mappedFileSizeForEntryIndex", int, 32 * 5 * 1024 * 1024, "bytes per DLedger index file (32-byte units)",
           lambda v: v >= 4096 and v % 4096 == 0, "must be a multiple of 4096"),
]


def _peers_ok(text: str) -> bool:
    try:
        parse_dledger_peers(text)
        return True
    except ValueError:
        return False


def parse_dledger_peers(text: str) -> dict[str, tuple[str, int]]:
    """'n0-127.0.0.1:40911;n1-127.0.0.1:40912' -> {"n0": ("127.0.0.1", 40911), ...} (in order)."""
    out: dict[str, tuple[str, int]] = {}
    for item in text.split(";"):
        item = item.strip()
        if not item:
            continue
        peer_id, sep, addr = item.partition("-")
        host, colon, port = addr.rpartition(":")
        if not sep or not peer_id or not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"bad DLedger peer {item!r}: expected id-host:port")
        if peer_id in out:
            raise ValueError(f"DLedger peer id {peer_id!r} appears twice")
        out[peer_id] = (host, int(port))
    if not out:
        raise ValueError("no DLedger peers")
    return out

_UNIT_MS = {"s": 1000, "m": 60000, "h": 3600000, "d": 86400000}


def _delay_levels_ok(v: str) -> bool:
    try:
        parse_delay_levels(v)
        return True
    except ValueError:
        return False


def parse_delay_levels(text: str) -> list[int]:
    """'1s 5s 1m' -> [1000, 5000, 60000]; level L is index L-1."""
    out = []
    for item in text.split():
        unit = item[-1]
        if unit not in _UNIT_MS or not item[:-1].isdigit():
            raise ValueError(f"bad delay level {item!r}")
        out.append(int(item[:-1]) * _UNIT_MS[unit])
    if not out:
        raise ValueError("no delay levels")
    return out


class StoreConfig:
    """Effective store options; attribute names are RocketMQ's keys."""

    OPTIONS = {o.name: o for o in STORE_OPTIONS}

    def __init__(self, **values: Any):
        for opt in STORE_OPTIONS:
            setattr(self, opt.name, opt.default)
        for k, v in values.items():
            if k not in self.OPTIONS:
                raise ValueError(f"unknown store option {k!r}")
            setattr(self, k, self.OPTIONS[k].parse(v))
        # an index file is mapped with a Java int size: 40 + 4 * slots + 20 * entries < 2 GiB
        if self.messageIndexEnable and 40 + 4 * self.maxHashSlotNum + 20 * self.maxIndexNum > 2 ** 31 - 1:
            raise ValueError(f"maxHashSlotNum={self.maxHashSlotNum} and maxIndexNum={self.maxIndexNum} make an "
                             "index file over 2 GiB - 1 bytes")

    @property
    def commitlog_dir(self) -> str:
        """Where the CommitLog files are: DLedger's data files in DLedger mode."""
        if self.enableDLegerCommitLog:
            return self.storePathDLedgerCommitLog or os.path.join(self.dledger_dir, "data")
        return self.storePathCommitLog or os.path.join(self.storePathRootDir, "commitlog")

    @property
    def legacy_commitlog_dir(self) -> str:
        """DLedger mode: the CommitLog of the master/slave store this one was switched from
        (storePathCommitLog, as before the switch), served read-only below the dividing offset
        (mq.store.legacy)."""
        return self.storePathCommitLog or os.path.join(self.storePathRootDir, "commitlog")

    @property
    def dledger_dir(self) -> str:
        """<storePathRootDir>/dledger-<selfId>: index/, checkpoint, currterm (and data/ by default)."""
        return os.path.join(self.storePathRootDir, f"dledger-{self.dLegerSelfId}")

    @property
    def dledger_index_dir(self) -> str:
        return os.path.join(self.dledger_dir, "index")

    @property
    def dledger_peers(self) -> dict[str, tuple[str, int]]:
        return parse_dledger_peers(self.dLegerPeers)

    def check_dledger(self) -> None:
        """DLedger mode's keys are consistent, else ValueError saying which."""
        if not self.enableDLegerCommitLog:
            return
        peers = self.dledger_peers if self.dLegerPeers else {}
        if not peers:
            raise ValueError("enableDLegerCommitLog=true needs dLegerPeers")
        if self.dLegerSelfId not in peers:
            raise ValueError(f"dLegerSelfId={self.dLegerSelfId!r} is not one of dLegerPeers ({', '.join(peers)})")
        if self.preferredLeaderId and self.preferredLeaderId not in peers:
            raise ValueError(f"preferredLeaderId={self.preferredLeaderId!r} is not one of dLegerPeers")
        if self.maxVoteIntervalMs < self.minVoteIntervalMs:
            raise ValueError("maxVoteIntervalMs must be >= minVoteIntervalMs")

    @property
    def cq_file_size(self) -> int:
        return self.mappedFileSizeConsumeQueue // 20 * 20

    @property
    def delay_levels_ms(self) -> list[int]:
        return parse_delay_levels(self.messageDelayLevel)

    def as_dict(self) -> dict[str, Any]:
        return {o.name: getattr(self, o.name) for o in STORE_OPTIONS}


# ---- Java .properties files (broker.conf, namesrv.properties) -------------------------------
