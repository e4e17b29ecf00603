"""Name server options: RocketMQ's NamesrvConfig and NettyServerConfig keys that
mean something here, plus ours, declared once (Redis style).  Parsing,
validation, `mqnamesrv -p` and the properties file all read NAMESRV_OPTIONS.

Java reads one properties file into both NamesrvConfig and NettyServerConfig
and ignores keys it does not know.  We report unknown keys (a typo should not
pass silently) and name the Java keys we accept but do not act on
(JAVA_KEYS_IGNORED) so an existing namesrv.properties loads with notes, not
errors."""
from __future__ import annotations

import os
from typing import Any

from mq.store.config import Option


def _port(v): return 0 <= v <= 65535
def _positive(v): return v > 0


def _home() -> str:
    return os.path.expanduser("~")


NAMESRV_OPTIONS: list[Option] = [
    Option("listenPort", int, 9876, "TCP port clients and brokers connect to (0 = any free port)",
           _port, "must be a port number 0..65535"),
    Option("listenAddress", str, "0.0.0.0", "address to bind (ours; Java always binds every address)"),
    Option("rocketmqHome", str, os.environ.get("ROCKETMQ_HOME", ""),
           "RocketMQ home (env ROCKETMQ_HOME); informational here"),
    Option("kvConfigPath", str, os.path.join(_home(), "namesrv", "kvConfig.json"),
           "where PUT/DELETE_KV_CONFIG persist the KV table (atomic write, .bak kept)"),
    Option("orderMessageEnable", bool, False,
           "put the ORDER_TOPIC_CONFIG KV value of a topic into its route as orderTopicConf"),
    Option("brokerExpiredMillis", int, 120000,
           "a broker silent this long is dropped (Java BROKER_CHANNEL_EXPIRED_TIME, 2 min)",
           _positive, "must be > 0"),
    Option("scanNotActiveBrokerInterval", int, 10000,
           "ms between scans for silent brokers (4.x: every 10 s; the first scan after half of it)",
           _positive, "must be > 0"),
]

# Java keys of NamesrvConfig / NettyServerConfig that load without effect.
JAVA_KEYS_IGNORED = frozenset({
    "productEnvName", "clusterTest", "configStorePath",
    "serverWorkerThreads", "serverCallbackExecutorThreads", "serverSelectorThreads",
    "serverOnewaySemaphoreValue", "serverAsyncSemaphoreValue", "serverChannelMaxIdleTimeSeconds",
    "serverSocketSndBufSize", "serverSocketRcvBufSize", "serverPooledByteBufAllocatorEnable",
    "useEpollNativeSelector", "writeBufferHighWaterMark", "writeBufferLowWaterMark",
    "serverSocketBacklog",
})


class NamesrvConfig:
    """Effective name server options; attribute names are RocketMQ's keys."""

    OPTIONS = {o.name: o for o in NAMESRV_OPTIONS}

    def __init__(self, **values: Any):
        for opt in NAMESRV_OPTIONS:
            setattr(self, opt.name, opt.default)
        for k, v in values.items():
            if k not in self.OPTIONS:
                raise ValueError(f"unknown name server option {k!r}")
            setattr(self, k, self.OPTIONS[k].parse(v))

    @classmethod
    def from_properties(cls, props: dict[str, str]) -> tuple["NamesrvConfig", list[str]]:
        """(config, warnings).  Unknown and ignored Java keys become warnings;
        a bad value raises ValueError naming the key."""
        known, warnings = {}, []
        for k, v in props.items():
            if k in cls.OPTIONS:
                known[k] = v
            elif k in JAVA_KEYS_IGNORED:
                warnings.append(f"{k}: a RocketMQ key this name server does not use; ignored")
            else:
                warnings.append(f"{k}: unknown key; ignored")
        return cls(**known), warnings

    def as_dict(self) -> dict[str, Any]:
        return {o.name: getattr(self, o.name) for o in NAMESRV_OPTIONS}


def parse_properties(text: str) -> dict[str, str]:
    """Java .properties text -> dict: '#'/'!' comments, 'k=v', 'k: v' or 'k v',
    backslash line continuations and the usual escapes (\\t \\n \\uXXXX).  Later
    keys win, as in java.util.Properties."""
    out: dict[str, str] = {}
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i].lstrip()
        i += 1
        if not line or line[0] in "#!":
            continue
        # join continuation lines: an odd number of trailing backslashes
        while _continues(line) and i < len(lines):
            line = line[:-1] + lines[i].lstrip()
            i += 1
        if _continues(line):
            line = line[:-1]
        key, value = _split_entry(line)
        out[_unescape(key)] = _unescape(value)
    return out


def _continues(line: str) -> bool:
    n = len(line) - len(line.rstrip("\\"))
    return n % 2 == 1


def _split_entry(line: str) -> tuple[str, str]:
    j = 0
    while j < len(line):
        c = line[j]
        if c == "\\":
            j += 2
            continue
        if c in "=: \t\f":
            break
        j += 1
    key, k = line[:j], j
    if k < len(line) and line[k] in " \t\f":
        while k < len(line) and line[k] in " \t\f":
            k += 1
        if k < len(line) and line[k] in "=:":
            k += 1
    elif k < len(line):
        k += 1   # the '=' or ':'
    while k < len(line) and line[k] in " \t\f":
        k += 1
    return key, line[k:]


_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def _unescape(s: str) -> str:
    if "\\" not in s:
        return s
    out, j = [], 0
    while j < len(s):
        c = s[j]
        if c != "\\" or j + 1 >= len(s):
            out.append(c)
            j += 1
            continue
        n = s[j + 1]
        if n == "u" and j + 6 <= len(s):
            try:
                out.append(chr(int(s[j + 2:j + 6], 16)))
                j += 6
                continue
            except ValueError:
                raise ValueError(f"malformed \\uxxxx escape in {s!r}") from None
        out.append(_ESCAPES.get(n, n))
        j += 2
    return "".join(out)


def load_properties_file(path: str) -> dict[str, str]:
    """parse_properties of a file (read as UTF-8; Java reads ISO-8859-1, which
    agrees for ASCII, the only thing these files hold in practice)."""
    with open(path, encoding="utf-8") as f:
        return parse_properties(f.read())
