"""Broker options: RocketMQ's BrokerConfig keys and defaults (spec section 8),
plus the store's (mq.store.config), declared once.  The table feeds
`mqbroker -p`, GET_BROKER_CONFIG, validation of `-c` files and conf/broker.conf.

Thread-pool keys map onto processes: sendMessageThreadPoolNums is the number
of io worker processes (send and pull share a connection, so they share a
process); pullMessageThreadPoolNums is accepted and only reported."""
from __future__ import annotations

import os
import socket
from typing import Any

from mq.options import Option, format_properties, load_properties_file, parse_properties  # noqa: F401 (re-exported)
from mq.store.config import STORE_OPTIONS, StoreConfig


def _port(v): return 3 <= v <= 65533


SIOCGIFADDR = 0x8915          # Linux: an interface's IPv4 address


def host_ipv4_addresses() -> list[str]:
    """The IPv4 address of each network interface of this host, by interface index, leaving out
    loopback addresses and bridges (RocketMQ's RemotingUtil skips /sys/class/net/<if>/bridge);
    [] where interfaces cannot be listed (not Linux)."""
    import fcntl
    import struct
    out = []
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return out
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for name in names:
            if os.path.exists(f"/sys/class/net/{name}/bridge"):
                continue
            try:
                res = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue                      # no IPv4 address on it
            ip = socket.inet_ntoa(res[20:24])
            if not ip.startswith("127."):
                out.append(ip)
    return out


def pick_broker_ip(addresses: list[str]) -> str:
    """RemotingUtil.getLocalAddress over IPv4: the first address not starting with 127.0 or
    192.168, else the last one; 127.0.0.1 when there is none (RocketMQ would take an IPv6
    address next; the CommitLog's store host here is IPv4)."""
    for ip in addresses:
        if not ip.startswith(("127.0", "192.168")):
            return ip
    return addresses[-1] if addresses else "127.0.0.1"


def default_broker_ip(listen_address: str) -> str:
    """brokerIP1 when broker.conf leaves it out: listenAddress when that is one address (a broker
    bound to one interface is reached there), else the host's address as RocketMQ picks it."""
    if listen_address and listen_address not in ("0.0.0.0", "::", "*"):
        return listen_address
    return pick_broker_ip(host_ipv4_addresses())


BROKER_OPTIONS: list[Option] = [
    Option("brokerClusterName", str, "DefaultCluster", "cluster this broker belongs to"),
    Option("brokerName", str, socket.gethostname(), "broker group name (master and slaves share it)"),
    Option("brokerId", int, 0, "0 for a master, > 0 for a slave", lambda v: v >= 0, "must be >= 0"),
    Option("brokerRole", ("ASYNC_MASTER", "SYNC_MASTER", "SLAVE"), "ASYNC_MASTER", "replication role"),
    Option("listenPort", int, 10911, "client port; the fast port is listenPort-2, HA is listenPort+1", _port,
           "must be a port between 3 and 65533"),
    Option("namesrvAddr", str, os.environ.get("NAMESRV_ADDR", ""), "name servers, host:port separated by ';'"),
    Option("brokerIP1", str, "", "address advertised to clients (empty: listenAddress when it is one address, "
           "else the host's first non-loopback IPv4 address not in 192.168/16, as RocketMQ picks it)"),
    Option("brokerIP2", str, "", "address advertised for HA (empty: brokerIP1)"),
    Option("listenAddress", str, "0.0.0.0", "address the ports bind to (ours; RocketMQ binds all)"),
    Option("defaultTopicQueueNums", int, 8, "queue count of auto-created topics (TBW102)", lambda v: 1 <= v <= 1024,
           "must be between 1 and 1024"),
    Option("autoCreateTopicEnable", bool, True, "create unknown topics on first send (TBW102 perm 7)"),
    Option("autoCreateSubscriptionGroup", bool, True, "create unknown consumer groups on first use"),
    Option("sendMessageThreadPoolNums", int, min(os.cpu_count() or 1, 4), "io worker processes",
           lambda v: 1 <= v <= 64, "must be between 1 and 64"),
    Option("pullMessageThreadPoolNums", int, 16 + 2 * (os.cpu_count() or 1), "accepted; pulls run in the io workers",
           lambda v: v >= 1, "must be >= 1"),
    Option("brokerPermission", int, 6, "PermName bits: 4 read, 2 write", lambda v: 0 <= v <= 15, "must be 0..15"),
    Option("registerNameServerPeriod", int, 30000, "ms between registrations (clamped to 10..60 s)",
           lambda v: v > 0, "must be > 0"),
    Option("registerBrokerTimeoutMills", int, 6000, "ms a registration may take", lambda v: v > 0, "must be > 0"),
    Option("longPollingEnable", bool, True, "hold pulls that find nothing until a message arrives"),
    Option("shortPollingTimeMills", int, 1000, "hold time when long polling is off", lambda v: v > 0, "must be > 0"),
    Option("slaveReadEnable", bool, False, "let consumers read from slaves"),
    Option("accessMessageInMemoryMaxRatio", int, 40, "% of RAM above which reads count as from disk",
           lambda v: 0 <= v <= 100, "must be 0..100"),
    Option("maxTransferCountOnMessageInMemory", int, 32, "messages per pull when in memory", lambda v: v > 0, "> 0"),
    Option("maxTransferBytesOnMessageInMemory", int, 262144, "bytes per pull when in memory", lambda v: v > 0, "> 0"),
    Option("maxTransferCountOnMessageInDisk", int, 8, "messages per pull when on disk", lambda v: v > 0, "> 0"),
    Option("maxTransferBytesOnMessageInDisk", int, 65536, "bytes per pull when on disk", lambda v: v > 0, "> 0"),
    Option("flushConsumerOffsetInterval", int, 5000, "ms between consumer offset persists", lambda v: v > 0, "> 0"),
    Option("flushDelayOffsetInterval", int, 10000, "ms between delay offset persists", lambda v: v > 0, "> 0"),
    Option("rejectTransactionMessage", bool, False, "refuse half messages (TRAN_MSG) with NO_PERMISSION"),
    Option("transactionTimeOut", int, 6000, "ms after its birth a half message is first checked with its producer",
           lambda v: v > 0, "> 0"),
    Option("transactionCheckMax", int, 15, "checks of a half message before it is moved to "
           "TRANS_CHECK_MAX_TIME_TOPIC", lambda v: v > 0, "> 0"),
    Option("transactionCheckInterval", int, 60000, "ms between passes of the transaction check", lambda v: v > 0,
           "> 0"),
    Option("enablePropertyFilter", bool, False, "let consumers filter by SQL92 expressions over message properties"),
    Option("storeReplyMessageEnable", bool, True, "store request-reply answers in <cluster>_REPLY_TOPIC too"),
    Option("regionId", str, "DefaultRegion", "MSG_REGION in send responses"),
    Option("traceOn", bool, True, "TRACE_ON in send responses"),
    Option("slaveTimeout", int, 3000, "ms a SYNC_MASTER send waits for the slave", lambda v: v > 0, "> 0"),
    Option("haSendHeartbeatInterval", int, 5000, "ms between HA heartbeats", lambda v: v > 0, "> 0"),
    Option("haHousekeepingInterval", int, 20000, "ms of HA silence before a connection is dropped",
           lambda v: v > 0, "> 0"),
    Option("haTransferBatchSize", int, 32768, "bytes per HA frame", lambda v: v > 0, "> 0"),
    Option("haSlaveFallbehindMax", int, 268435456, "bytes a slave may lag before SLAVE_NOT_AVAILABLE",
           lambda v: v > 0, "> 0"),
    Option("haTakeBackWaitMs", int, 10000, "a SYNC_MASTER + ASYNC_FLUSH master restarted after a crash refuses "
           "writes this long, or until a slave gave back the acknowledged tail it lost (ours; 0: never wait)",
           lambda v: v >= 0, ">= 0"),
    Option("dLegerForwardOnStopMs", int, 35000, "DLedger: a member stopped gracefully while it leads (or led "
           "within this long) hands the lead over first and keeps forwarding the writes of clients whose "
           "route still names it for this long after it last led: an official client polls the name server "
           "every 30 s, and the new leader registers within about a second (ours; 0: stop at once)",
           lambda v: v >= 0, ">= 0"),
    Option("haMasterAddress", str, "", "slave: the master's HA address (empty: learned from the name server)"),
    Option("serverChannelMaxIdleTimeSeconds", int, 120, "idle client connections are closed after this",
           lambda v: v > 0, "> 0"),
    Option("rocketmqHome", str, "", "RocketMQ home: the ACL accounts are <home>/conf/plain_acl.yml "
           "(empty: $ROCKETMQ_HOME, else the working directory)"),
    Option("aclEnable", bool, False, "check every client request against plain_acl.yml (mq.acl)"),
    Option("haFullCopy", bool, False, "an empty slave copies the master's whole CommitLog, not just its last file (ours)"),
    Option("slaveMetadataSyncInterval", int, 10000, "ms between a slave's metadata syncs from its master (ours)",
           lambda v: v > 0, "> 0"),
    Option("totalPhysicalMemoryOverride", int, 0, "RAM bytes used by the read/write split (0: the machine's; ours, for tests)",
           lambda v: v >= 0, ">= 0"),
    Option("fastSendEnable", bool, True,
           "single sends that need no decision of Python's are parsed, appended and answered in C, one call "
           "per read (ours; mq.broker.fastsend; used only where sends need no wait: ASYNC_MASTER with "
           "ASYNC_FLUSH, no ACL, no perf tracing)"),
    Option("fastConnEnable", bool, True,
           "a TCP connection whose reads the C send path takes whole (a producer's, or a consumer's whose "
           "pull C answered) is read, walked and answered by C from then on, one call per wake of the io "
           "worker for all of them, until a frame C does not take (ours; csrc/fastconn.h; where the C send "
           "path is on; pulls where fastPullEnable answers them)"),
    Option("fastConnWaitMs", int, 2,
           "ms a poll of the connections C serves may go on waiting in C for more of their requests while "
           "the io worker's event loop has nothing else ready (ours; csrc/fastconn.h mq_fast_poll_wait): "
           "the loop's ready callbacks and timers wait up to this long, its sockets not at all; 0: every "
           "poll returns to the loop", lambda v: 0 <= v <= 10000, "0..10000"),
    Option("fastPullEnable", bool, True,
           "pulls that find data (and GET_MAX_OFFSET / GET_MIN_OFFSET) are answered in C in the read that "
           "brings them (ours; mq.broker.fastsend; "
           "where the C send path is on, without slaveReadEnable or perf tracing, for a group and topic "
           "the worker has read, and a TAG or SQL92 expression sent with the pull or the group's heartbeat "
           "subscription while the worker's copy is fresh; SQL92 verdicts are Python's, looked up in C by "
           "the records' property values)"),
    # perf tracing (ours; mq.broker.tracing, schema in mq.trace).  Not RocketMQ's traceTopicEnable,
    # which is message trace (who sent and consumed what, stored in a topic): a different feature.
    Option("perfTraceEnable", bool, False,
           "write the broker's perf trace records (per request, per flush, replication lag) as JSON lines "
           "(ours; not RocketMQ's traceTopicEnable, which is message trace)"),
    Option("perfTraceDir", str, "", "directory of the perf trace files; empty means <storePathRootDir>/perftrace"),
    # Prometheus metrics (ours; mq.broker.metrics): the supervisor serves GET /metrics on this port
    Option("metricsPort", int, 0, "port of the Prometheus /metrics endpoint, bound on listenAddress "
           "(ours; 0: off, and the role processes count nothing)", lambda v: 0 <= v <= 65535, "must be 0..65535"),
    # RocketMQ 5.x clients (mq.gateway): the proxy's key; its gRPC server, in a role process of its own
    Option("grpcServerPort", int, 0, "port of the gRPC endpoint for RocketMQ 5.x clients, bound on listenAddress "
           "(RocketMQ 5's proxy key; 0: off; mq.gateway)", lambda v: 0 <= v <= 65535, "must be 0..65535"),
    # log files (ours; RocketMQ's logback writes ~/logs/rocketmqlogs/broker.log): mq.logs.  The
    # supervisor writes every process's lines there, as on stderr
    Option("logDir", str, "", "directory of broker.log, rolled by size; ~ is the user's home "
           "(ours; empty: stderr only, as under systemd, where the journal keeps them)"),
    Option("logFileMaxBytes", int, 128 * 1024 * 1024, "broker.log rolls over past this many bytes (ours)",
           lambda v: v > 0, "must be > 0"),
    Option("logFileBackups", int, 10, "rolled broker.log.1 .. .N files kept (ours)", lambda v: v >= 0, ">= 0"),
]

ALL_OPTIONS = {o.name: o for o in STORE_OPTIONS + BROKER_OPTIONS}
# keys RocketMQ knows that we accept and ignore (they change nothing here)
IGNORED_KEYS = {"messageIndexSafe", "transientStorePoolEnable", "transferMsgByHeap",
                "offsetCheckInSlave", "serverWorkerThreads", "serverSelectorThreads",
                "forceRegister", "compressedRegister", "haListenPort",
                "brokerFastFailureEnable", "waitTimeMillsInSendQueue", "useReentrantLockWhenPutMessage"}


class BrokerConfig:
    """The effective broker configuration; attribute names are RocketMQ's keys."""

    def __init__(self, values: dict[str, Any] | None = None, warn=None):
        for o in ALL_OPTIONS.values():
            setattr(self, o.name, o.default)
        self.unknown_keys: list[str] = []
        for k, v in (values or {}).items():
            if k in ALL_OPTIONS:
                setattr(self, k, ALL_OPTIONS[k].parse(v))
            elif k not in IGNORED_KEYS:
                self.unknown_keys.append(k)
                if warn:
                    warn(f"unknown config key {k!r} ignored")
        if not self.brokerIP1:
            self.brokerIP1 = default_broker_ip(self.listenAddress)
        if self.brokerRole != "SLAVE":
            self.brokerId = 0
        elif self.brokerId <= 0:
            raise ValueError("brokerId must be > 0 when brokerRole=SLAVE")
        self.registerNameServerPeriod = max(10000, min(60000, self.registerNameServerPeriod))

    @property
    def fast_port(self) -> int:
        return self.listenPort - 2

    @property
    def ha_port(self) -> int:
        return self.listenPort + 1

    @property
    def broker_addr(self) -> str:
        return f"{self.brokerIP1}:{self.listenPort}"

    @property
    def ha_server_addr(self) -> str:
        return f"{self.brokerIP2 or self.brokerIP1}:{self.ha_port}"

    @property
    def namesrv_list(self) -> list[str]:
        return [a.strip() for a in self.namesrvAddr.split(";") if a.strip()]

    def store_config(self) -> StoreConfig:
        return StoreConfig(**{o.name: getattr(self, o.name) for o in STORE_OPTIONS})

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in ALL_OPTIONS}

    def as_properties(self) -> str:
        return format_properties(self.as_dict())


def dledger_follower_id(store_config) -> int:
    """A DLedger follower's brokerId: the numeric part of its selfId + 1 (n0 -> 1, n2 -> 3;
    RocketMQ's DLedgerRoleChangeHandler), or its place in dLegerPeers + 1 without digits."""
    self_id = store_config.dLegerSelfId
    digits = "".join(ch for ch in self_id if ch.isdigit())
    if digits:
        return int(digits) + 1
    return list(store_config.dledger_peers).index(self_id) + 1


def load_config_file(path: str, overrides: dict[str, Any] | None = None, warn=None) -> BrokerConfig:
    values: dict[str, Any] = load_properties_file(path)
    values.update(overrides or {})
    return BrokerConfig(values, warn=warn)
