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

from mq import options
from mq.options import Option, format_properties, load_properties_file, parse_properties  # noqa: F401 (re-exported)


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
    # log files (ours; RocketMQ's logback writes ~/logs/rocketmqlogs/namesrv.log): mq.logs
    Option("logDir", str, "", "directory of namesrv.log, rotated by size (ours; empty: stderr only)"),
    Option("logFileMaxBytes", int, 128 * 1024 * 1024, "namesrv.log rolls over past this many bytes (ours)",
           _positive, "must be > 0"),
    Option("logFileBackups", int, 10, "rolled namesrv.log.1 .. .N files kept (ours)", lambda v: v >= 0,
           "must be >= 0"),
]

# what UPDATE_NAMESRV_CONFIG (318) may change: the keys read where they are used, never cached
# (RocketMQ sets any key but its black list, whether or not anything reads it again)
RUNTIME_KEYS = frozenset({"orderMessageEnable", "brokerExpiredMillis"})

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
        self.config_file: str | None = None     # the -c file: UPDATE_NAMESRV_CONFIG writes changes back
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

    def as_properties(self) -> str:
        """key=value lines, sorted: GET_NAMESRV_CONFIG's body and `mqnamesrv -p`'s output."""
        return format_properties(self.as_dict())


def parse_runtime_update(text: str) -> dict[str, Any]:
    """An UPDATE_NAMESRV_CONFIG body (properties text) parsed and checked (mq.options)."""
    return options.parse_runtime_update(text, NamesrvConfig.OPTIONS, RUNTIME_KEYS, JAVA_KEYS_IGNORED,
                                        "name server", "its config file")
