"""apache.rocketmq.v2.MessagingService, served for this broker: what the gateway answers.

The gateway is RocketMQ 5's proxy in "local" mode, in a role process of the broker: it speaks
gRPC to 5.x clients and 4.x remoting to its own broker (a send is a SEND_MESSAGE_V2 to the
broker's port) and to the name servers (routes).  Every policy of the 4.x path - refusals,
flush and replication waits, DLedger, disk full, permissions - is therefore the broker's own,
answered once; the gateway maps the answer to a Status code (mq.gateway.convert).

Served: QueryRoute, Telemetry (client settings both ways, and the server's transaction checks),
Heartbeat, NotifyClientTermination, SendMessage, EndTransaction, RecallMessage, POP
(mq.gateway.pop): ReceiveMessage, AckMessage, ChangeInvisibleDuration, QueryAssignment,
ForwardMessageToDeadLetterQueue, and a pull consumer's (mq.gateway.pull): PullMessage,
GetOffset, UpdateOffset, QueryOffset.  A topic takes the message types its RocketMQ 5 attribute
message.type names (NORMAL without one: every 4.x topic); FIFO messages of a group go to one
queue (the proxy's consistent hash of the group); DELAY messages are timer messages
(mq.gateway.timer: delivered at their second); TRANSACTION messages are 4.x half messages, the broker's checks relayed to a 5.x producer of the
topic on its Telemetry stream.  SyncLiteSubscription (lite topics) is not registered: grpc
answers it UNIMPLEMENTED, as the Java proxy does.

Errors: every refusal is a Status in the response body with the Code a 5.x client expects (the
Java proxy's choice); the gRPC status stays OK.  An exception in a handler (a bug) is answered
INTERNAL_SERVER_ERROR in the body and logged, never a gRPC INTERNAL.

Limits, named: ROUTE_TTL_S (for a send, a topic's route is read from the name server at most that
often, and at once when it finds no queue of this broker in it; QueryRoute always reads it afresh;
a topic's message.type from the broker likewise); ENDPOINT_TTL_S (another broker's gRPC port, asked of it); SETTINGS_MAX clients'
settings kept (the oldest dropped past it; a client re-sends its settings every 5 minutes)."""
from __future__ import annotations

import asyncio
import itertools
import logging
import random
import time
from collections import OrderedDict

import orjson

from mq import loop as mq_loop
from mq.client.route import TopicRouteData
from mq.remoting import RemotingClient, RemotingError
from mq.wire.codes import RequestCode as R, ResponseCode as RC
from mq.wire.consumequeue import java_string_hashcode
from mq.wire.grpc5 import AddressScheme, ClientType, Code, MessageType, Permission, msg
from mq.wire.headers import send_v2
from mq.wire.msgid import offset_msg_id
from mq.wire.properties import properties_to_string
from mq.wire import commitlog as wcl
from mq.wire.errors import WireError
from mq.wire.msgid import decode_offset_msg_id
from mq.wire.properties import decode_properties
from mq.wire.topics import AUTO_CREATE_TOPIC, MESSAGE_TYPE_KEY, PERM_READ, PERM_WRITE

from .convert import Refused, check_group, check_topic, message_type_of, send_code, to_message, to_properties
from .auth import GatewayAuth
from .options import GatewayOptions
from .stats import GatewayStats
from .renew import DEFAULT_INVISIBLE_MS, Renewer
from .timer import TIMER_MAX_DELAY_MS, TimerService, recall_handle
from .pop import BATCH_MAX, INVISIBLE_MAX_MS, INVISIBLE_MIN_MS, POLL_INTERVAL_S, Popped, PopService
from .pull import PullService

log = logging.getLogger("mq.gateway")

ROUTE_TTL_S = 5.0
ENDPOINT_TTL_S = 60.0
SETTINGS_MAX = 65536
NAMESRV_TIMEOUT_S = 3.0
SEND_TIMEOUT_S = 10.0
CLIENT_ID_HEADER = "x-mq-client-id"
# what a producer's settings get back (the Java proxy's: GrpcClientSettingsManager)
PRODUCER_MAX_ATTEMPTS = 3
# a consumer's retry back-off: RocketMQ's delay levels 3.. (1 s .. 2 h), max attempts 16 + 1
CONSUMER_BACKOFF_S = (1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200)
CONSUMER_MAX_ATTEMPTS = 17
RECEIVE_BATCH_SIZE = 32
LONG_POLLING_S_DEFAULT = 20
TRANSACTIONS_MAX = 65536                 # transactions remembered for EndTransaction (the oldest dropped)
RECOVERY_S_MAX = 3600                    # orphaned_transaction_recovery_duration (maxTransactionRecoverySecond)
BROKER_HEARTBEAT_S = 10.0                # the gateway's producer registrations with its broker
# a topic's message.type -> the types QueryRoute lists (RouteActivity.parseTopicMessageType)
ACCEPTED = {"NORMAL": (MessageType.NORMAL,), "FIFO": (MessageType.FIFO,), "DELAY": (MessageType.DELAY,),
            "TRANSACTION": (MessageType.TRANSACTION,),
            "MIXED": (MessageType.NORMAL, MessageType.FIFO, MessageType.DELAY, MessageType.TRANSACTION),
            None: (MessageType.MESSAGE_TYPE_UNSPECIFIED,)}


def status(code: Code, text: str = ""):
    return msg("Status")(code=int(code), message=text or code.name)


def guava_consistent_hash(h: int, buckets: int) -> int:
    """Guava's Hashing.consistentHash(long, int): the queue the Java proxy picks for a message
    group (input: the group's Java hashCode, sign-extended)."""
    state = h & 0xFFFFFFFFFFFFFFFF
    candidate = 0
    while True:
        state = (2862933555777941757 * state + 1) & 0xFFFFFFFFFFFFFFFF
        next_double = ((state >> 33) + 1) / float(1 << 31)
        nxt = int((candidate + 1) / next_double)
        if 0 <= nxt < buckets:
            candidate = nxt
        else:
            return candidate


def _scheme(host: str) -> AddressScheme:
    if ":" in host:
        return AddressScheme.IPv6
    return AddressScheme.IPv4 if all(p.isdigit() for p in host.split(".")) and host.count(".") == 3 \
        else AddressScheme.DOMAIN_NAME


class MessagingService:
    def __init__(self, opts: GatewayOptions):
        self.opts = opts
        self.broker_addr = opts.broker_addr
        self.broker_name = opts.broker_name
        self.grpc_host = opts.advertised_host
        self.grpc_port = opts.grpc_port
        self.namesrvs = [a.strip() for a in opts.namesrv_addr.split(";") if a.strip()]
        self.max_body_bytes = opts.max_message_bytes
        self.remoting = RemotingClient()
        self.stats = GatewayStats(opts.store_root)
        self.auth = GatewayAuth(opts.rocketmq_home) if opts.acl_enable else None
        if self.auth is not None:
            self.remoting.credentials = self.auth.broker_credentials()
            if self.remoting.credentials is None:
                log.error("aclEnable=true and no tools.yml or admin account in %s: the gateway's requests to its "
                          "broker go unsigned and will be refused", self.auth.file.path)
        self.pop = PopService(self.remoting, opts.broker_addr, opts.broker_name, opts.cluster, self.stats)
        self.pull = PullService(self.remoting, opts.broker_addr, opts.broker_name)
        self._routes: dict[str, tuple[float, TopicRouteData | None]] = {}
        self._settings: OrderedDict[str, object] = OrderedDict()     # client id -> its Settings
        self._rr = itertools.count(random.randrange(1 << 16))
        self._types: dict[str, tuple[float, str | None]] = {}        # topic -> (read at, message.type)
        self._endpoints: dict[str, tuple[float, tuple | None]] = {}  # broker addr -> (read at, its gRPC host, port)
        self._groups: dict[str, tuple[float, dict]] = {}             # group -> (read at, its config)
        self._streams: dict[str, asyncio.Queue] = {}                 # client id -> its Telemetry's outgoing commands
        # transaction id -> (topic, commit-log offset, queue offset of the half) for EndTransaction
        self._transactions: OrderedDict[str, tuple[str, int, int]] = OrderedDict()
        self.timer = TimerService(self.remoting, opts.broker_addr, opts.broker_name, self.stats)
        self.renewer = Renewer(self.pop)
        self.remoting.push_handlers[R.CHECK_TRANSACTION_STATE] = self._on_check
        self._heartbeat_task: asyncio.Task | None = None
        self.requests = 0

    async def start(self) -> None:
        self.stats.start()
        self.pop.start()
        self.timer.start()
        self.renewer.start()
        self._heartbeat_task = asyncio.get_running_loop().create_task(self._broker_heartbeats())

    async def close(self) -> None:
        if self._heartbeat_task is not None:
            self._heartbeat_task.cancel()
        await self.pop.close()
        await self.timer.close()
        await self.renewer.close()
        await self.remoting.close()
        self.stats.close()

    async def topic_type(self, topic: str) -> str | None:
        """The topic's message.type (GET_TOPIC_CONFIG): NORMAL without one (every 4.x topic);
        asked of this broker, else of the masters of the topic's route (a member that has not
        synced the topic yet, a topic on other brokers only); None when none has it.  Cached
        ROUTE_TTL_S."""
        now = time.monotonic()
        hit = self._types.get(topic)
        if hit is not None and now - hit[0] < ROUTE_TTL_S:
            return hit[1]
        kind = await self._topic_type_at(self.broker_addr, topic)
        if kind is None:
            route = await self.route(topic)
            for bd in route.broker_datas if route is not None else ():
                master = bd.broker_addrs.get(0)
                if master is not None and master != self.broker_addr:
                    kind = await self._topic_type_at(master, topic)
                    if kind is not None:
                        break
        if len(self._types) > 4096:
            self._types.clear()
        self._types[topic] = (now, kind)
        return kind

    async def group_config(self, group: str) -> dict:
        """The group's config on this broker (GET_SUBSCRIPTIONGROUP_CONFIG): {} when it has none
        (a group is created on its first pull, with the defaults).  Cached ROUTE_TTL_S."""
        now = time.monotonic()
        hit = self._groups.get(group)
        if hit is not None and now - hit[0] < ROUTE_TTL_S:
            return hit[1]
        try:
            r = await self.remoting.invoke(self.broker_addr, self.remoting.request(
                R.GET_SUBSCRIPTIONGROUP_CONFIG, {"group": group}), NAMESRV_TIMEOUT_S)
            g = orjson.loads(r.body) if r.code == RC.SUCCESS and r.body else {}
        except (RemotingError, ValueError):
            g = {}
        if len(self._groups) > 4096:
            self._groups.clear()
        self._groups[group] = (now, g if isinstance(g, dict) else {})
        return self._groups[group][1]

    async def _topic_type_at(self, addr: str, topic: str) -> str | None:
        try:
            r = await self.remoting.invoke(addr, self.remoting.request(R.GET_TOPIC_CONFIG, {"topic": topic}),
                                           NAMESRV_TIMEOUT_S)
        except RemotingError as e:
            if addr == self.broker_addr:
                raise Refused(Code.PROXY_TIMEOUT, f"the broker did not answer: {e}") from None
            return None
        if r.code != RC.SUCCESS:
            return None
        try:
            return (orjson.loads(r.body).get("attributes") or {}).get(MESSAGE_TYPE_KEY, "NORMAL")
        except (ValueError, AttributeError):
            return "NORMAL"

    # ---- helpers ------------------------------------------------------------------------------
    @staticmethod
    def _client_id(context) -> str:
        for k, v in context.invocation_metadata() or ():
            if k == CLIENT_ID_HEADER:
                return v
        raise Refused(Code.CLIENT_ID_REQUIRED, f"the request has no {CLIENT_ID_HEADER} header")

    def _consumer(self, context, group: str, topic: str) -> str:
        """A consumer's call on group and topic: both legal, the caller allowed; its client id."""
        check_group(group)
        check_topic(topic)
        return self._check(context, topic, group)

    @staticmethod
    def _summary(entries):
        """A response's status from its entries': theirs when they agree, else MULTIPLE_RESULTS."""
        codes = {e.status.code for e in entries}
        if len(codes) == 1:
            return entries[0].status
        return status(Code.MULTIPLE_RESULTS) if codes else status(Code.BAD_REQUEST, "no entry")

    def _check(self, context, topic: str | None = None, group: str | None = None, publish: bool = False) -> str:
        """The caller's client id, once it may make this call (ACL: mq.gateway.auth); Refused."""
        cid = self._client_id(context)
        if self.auth is not None:
            self.auth.check(context, topic, group, publish)
        return cid

    async def route(self, topic: str, fresh: bool = False) -> TopicRouteData | None:
        """The topic's 4.x route from the first name server that answers (None: no such topic)."""
        now = time.monotonic()
        hit = self._routes.get(topic)
        if hit is not None and not fresh and now - hit[0] < ROUTE_TTL_S:
            return hit[1]
        if not self.namesrvs:
            raise Refused(Code.INTERNAL_SERVER_ERROR, "the broker has no name server (namesrvAddr)")
        last: Exception | None = None
        for addr in self.namesrvs:
            try:
                r = await self.remoting.invoke(addr, self.remoting.request(R.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}),
                                               NAMESRV_TIMEOUT_S)
            except RemotingError as e:
                last = e
                continue
            data = TopicRouteData.decode(r.body) if r.code == RC.SUCCESS and r.body else None
            if data is not None:           # a topic that does not exist is asked again next time
                if len(self._routes) > 4096:
                    self._routes.clear()
                self._routes[topic] = (now, data)
            return data
        raise Refused(Code.PROXY_TIMEOUT, f"no name server answered the route query: {last}")

    async def endpoints_of(self, broker_addr: str):
        """The gRPC endpoints of the broker at 4.x address broker_addr: ours exactly; another's
        brokerIP1 and grpcServerPort, asked of it (GET_BROKER_CONFIG, kept ENDPOINT_TTL_S), so
        brokers on one host may serve gRPC on ports of their own; a broker that does not answer
        or serves no gRPC: its host with our port (RocketMQ 5's local mode, which assumes one port)."""
        if broker_addr == self.broker_addr:
            host, port = self.grpc_host, self.grpc_port
        else:
            now = time.monotonic()
            hit = self._endpoints.get(broker_addr)
            if hit is None or now - hit[0] >= ENDPOINT_TTL_S:
                found = None
                try:
                    r = await self.remoting.invoke(broker_addr, self.remoting.request(R.GET_BROKER_CONFIG),
                                                   NAMESRV_TIMEOUT_S)
                    if r.code == RC.SUCCESS:
                        kv = dict(line.split("=", 1) for line in (r.body or b"").decode(errors="replace").splitlines()
                                  if "=" in line)
                        gport = int(kv.get("grpcServerPort", "0") or 0)
                        if gport > 0:
                            found = (kv.get("brokerIP1") or broker_addr.rsplit(":", 1)[0], gport)
                except (RemotingError, ValueError) as e:
                    log.debug("broker %s's gRPC port unknown: %s", broker_addr, e)
                if len(self._endpoints) > 4096:
                    self._endpoints.clear()
                hit = self._endpoints[broker_addr] = (now, found)
            host, port = hit[1] or (broker_addr.rsplit(":", 1)[0], self.grpc_port)
        ep = msg("Endpoints")(scheme=int(_scheme(host)))
        ep.addresses.add(host=host, port=port)
        return ep

    # ---- QueryRoute ---------------------------------------------------------------------------
    async def QueryRoute(self, request, context):
        Resp = msg("QueryRouteResponse")
        try:
            self._check(context)
            topic = request.topic.name
            check_topic(topic)
            # asked of the name server every time: a client asks again when its sends fail (a
            # leader that changed), and then must not get the route this gateway cached
            route = await self.route(topic, fresh=True)
        except Refused as e:
            return Resp(status=status(e.code, e.text))
        if route is None or not route.queue_datas:
            return Resp(status=status(Code.TOPIC_NOT_FOUND, f"topic {topic} does not exist"))
        try:
            accepted = [int(t) for t in ACCEPTED[await self.topic_type(topic)]]
        except Refused as e:
            return Resp(status=status(e.code, e.text))
        resp = Resp(status=status(Code.OK))
        brokers = {b.broker_name: b for b in route.broker_datas}
        for qd in route.queue_datas:
            bd = brokers.get(qd.broker_name)
            if bd is None:
                continue
            r, w, p = qd.read_queue_nums, qd.write_queue_nums, qd.perm
            if p & PERM_READ and p & PERM_WRITE:
                both = min(r, w)
                perms = [Permission.READ] * (r - both) + [Permission.WRITE] * (w - both) + [Permission.READ_WRITE] * both
            elif p & PERM_WRITE:
                perms = [Permission.WRITE] * w
            elif p & PERM_READ:
                perms = [Permission.READ] * r
            else:
                perms = [Permission.NONE] * max(1, r, w)
            for broker_id, addr in sorted(bd.broker_addrs.items()):
                ep = await self.endpoints_of(addr)
                for qid, perm in enumerate(perms):
                    q = resp.message_queues.add(id=qid, permission=int(perm))
                    q.topic.CopyFrom(request.topic)
                    q.broker.name, q.broker.id = qd.broker_name, broker_id
                    q.broker.endpoints.CopyFrom(ep)
                    q.accept_message_types.extend(accepted)
        return resp

    # ---- clients: Telemetry, Heartbeat, NotifyClientTermination ---------------------------------
    async def _merged_settings(self, s):
        """What the server answers a client's Settings with (the Java proxy's values; a
        consumer's fifo and max attempts from its group: consumeMessageOrderly, retryMaxTimes + 1)."""
        out = msg("Settings")()
        out.CopyFrom(s)
        kind = s.client_type if s.HasField("client_type") else ClientType.CLIENT_TYPE_UNSPECIFIED
        bp = out.backoff_policy
        bp.Clear()
        if kind == ClientType.PRODUCER:
            out.publishing.max_body_size = self.max_body_bytes
            out.publishing.validate_message_type = True
            bp.max_attempts = PRODUCER_MAX_ATTEMPTS
            bp.exponential_backoff.initial.FromMilliseconds(10)
            bp.exponential_backoff.max.FromMilliseconds(1000)
            bp.exponential_backoff.multiplier = 2.0
        else:
            sub = out.subscription
            g = await self.group_config(sub.group.name) if sub.group.name else {}
            sub.fifo = bool(g.get("consumeMessageOrderly", False))
            sub.receive_batch_size = RECEIVE_BATCH_SIZE
            if not sub.HasField("long_polling_timeout"):
                sub.long_polling_timeout.FromSeconds(LONG_POLLING_S_DEFAULT)
            try:
                bp.max_attempts = int(g.get("retryMaxTimes", CONSUMER_MAX_ATTEMPTS - 1)) + 1
            except (TypeError, ValueError):
                bp.max_attempts = CONSUMER_MAX_ATTEMPTS
            for s_ in CONSUMER_BACKOFF_S:
                bp.customized_backoff.next.add().FromSeconds(s_)
        return out

    def _check_settings(self, s) -> None:
        if s.HasField("publishing"):
            for t in s.publishing.topics:
                check_topic(t.name)
        elif s.HasField("subscription"):
            check_group(s.subscription.group.name)
            for e in s.subscription.subscriptions:
                check_topic(e.topic.name)
        else:
            raise Refused(Code.BAD_REQUEST, "settings without publishing or subscription")

    async def Telemetry(self, request_iterator, context):
        """The client's long-lived stream: each Settings it sends is kept (for Heartbeat, and to
        find the producers of a topic for a transaction check) and answered with the server's;
        the server's own commands (RecoverOrphanedTransactionCommand) go out on it too.  Open
        until the client ends it."""
        Cmd = msg("TelemetryCommand")
        try:
            cid = self._check(context)          # a stream's headers are signed once, when it opens
        except Refused as e:
            yield Cmd(status=status(e.code, e.text))
            return
        out: asyncio.Queue = asyncio.Queue()
        self._streams[cid] = out

        async def read() -> None:
            try:
                async for cmd in request_iterator:
                    out.put_nowait(await self._telemetry_reply(cid, cmd))
            except Exception as e:           # the client went away (cancelled stream, reset)
                log.debug("Telemetry of %s ended: %s", cid, e)
            finally:
                out.put_nowait(None)
        reader = asyncio.get_running_loop().create_task(read())
        try:
            while True:
                reply = await out.get()
                if reply is None:
                    return
                if reply is not False:
                    yield reply
        finally:
            reader.cancel()
            if self._streams.get(cid) is out:
                del self._streams[cid]
                self.renewer.forget_client(cid)       # gone: what it held becomes visible again

    async def _telemetry_reply(self, cid: str, cmd):
        """The answer to one command of a client's Telemetry stream (False: none)."""
        Cmd = msg("TelemetryCommand")
        if cmd is None:                    # not a TelemetryCommand (mq.gateway.role's decoder)
            return Cmd(status=status(Code.BAD_REQUEST, "a Telemetry frame that is not a TelemetryCommand"))
        if not cmd.HasField("settings"):
            return False                   # stack traces and verify results answer commands never sent
        try:
            self._check_settings(cmd.settings)
        except Refused as e:
            return Cmd(status=status(e.code, e.text))
        self._settings[cid] = cmd.settings
        self._settings.move_to_end(cid)
        while len(self._settings) > SETTINGS_MAX:
            self._settings.popitem(last=False)
        return Cmd(status=status(Code.OK), settings=await self._merged_settings(cmd.settings))

    async def Heartbeat(self, request, context):
        Resp = msg("HeartbeatResponse")
        try:
            cid = self._check(context)
            if cid not in self._settings:
                raise Refused(Code.UNRECOGNIZED_CLIENT_TYPE, "no settings from this client yet (Telemetry)")
            if request.client_type in (ClientType.PUSH_CONSUMER, ClientType.SIMPLE_CONSUMER):
                check_group(request.group.name)
        except Refused as e:
            return Resp(status=status(e.code, e.text))
        return Resp(status=status(Code.OK))

    async def NotifyClientTermination(self, request, context):
        Resp = msg("NotifyClientTerminationResponse")
        try:
            cid = self._check(context)
        except Refused as e:
            return Resp(status=status(e.code, e.text))
        self.renewer.forget_client(cid)
        if self._settings.pop(cid, None) is None:
            return Resp(status=status(Code.UNRECOGNIZED_CLIENT_TYPE, "no settings from this client"))
        return Resp(status=status(Code.OK))

    # ---- SendMessage ----------------------------------------------------------------------------
    async def SendMessage(self, request, context):
        Resp = msg("SendMessageResponse")
        try:
            self._client_id(context)           # ACL below, once the topic is known
            if not request.messages:
                raise Refused(Code.MESSAGE_CORRUPTED, "no message in the request")
            topic = request.messages[0].topic.name
            if any(m.topic.name != topic for m in request.messages):
                raise Refused(Code.MESSAGE_CORRUPTED, "the messages of one request must share a topic")
            check_topic(topic)
            self._check(context, topic, publish=True)
        except Refused as e:
            return Resp(status=status(e.code, e.text))
        resp = Resp()
        for m in request.messages:
            entry = resp.entries.add()
            try:
                await self._send_one(m, topic, entry)
            except Refused as e:
                entry.status.CopyFrom(status(e.code, e.text))
        self.stats.messages("sent", sum(1 for e in resp.entries if e.status.code == Code.OK))
        resp.status.CopyFrom(self._summary(resp.entries))
        return resp

    async def _write_queues(self, topic: str) -> int:
        """How many write queues this broker has for topic (0: none in the route)."""
        for fresh in (False, True):
            route = await self.route(topic, fresh=fresh)
            for qd in route.queue_datas if route is not None else ():
                if qd.broker_name == self.broker_name and qd.perm & PERM_WRITE:
                    return qd.write_queue_nums
        return 0

    async def _send_one(self, m, topic: str, entry) -> None:
        kind = message_type_of(m.system_properties)
        topic_kind = await self.topic_type(topic)
        if topic_kind != "MIXED" and (topic_kind is None or kind.name != topic_kind):
            raise Refused(Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                          f"topic {topic} takes {topic_kind or 'no'} messages here (message.type), not {kind.name}")
        props, sys_flag = to_properties(m, self.max_body_bytes)
        sp = m.system_properties
        due_ms = 0                 # a timer message's due second (mq.gateway.timer)
        if kind == MessageType.DELAY:
            if not sp.HasField("delivery_timestamp"):
                raise Refused(Code.ILLEGAL_DELIVERY_TIME, "a DELAY message needs a delivery_timestamp")
            deliver_ms = sp.delivery_timestamp.seconds * 1000 + sp.delivery_timestamp.nanos // 1_000_000
            delay_ms = deliver_ms - int(time.time() * 1000)
            if delay_ms > TIMER_MAX_DELAY_MS:
                raise Refused(Code.ILLEGAL_DELIVERY_TIME, f"delivery time {deliver_ms} is more than "
                                                          f"{TIMER_MAX_DELAY_MS} ms ahead")
            props["TIMER_DELIVER_MS"] = str(deliver_ms)
            if delay_ms > 0:       # a time passed is delivered at once (RocketMQ's rule)
                due_ms = deliver_ms // 1000 * 1000
        elif kind == MessageType.TRANSACTION:
            props["TRAN_MSG"] = "true"
            sys_flag |= wcl.TRANSACTION_PREPARED
            if sp.HasField("orphaned_transaction_recovery_duration"):
                secs = sp.orphaned_transaction_recovery_duration.seconds
                if not 0 <= secs <= RECOVERY_S_MAX:
                    raise Refused(Code.BAD_REQUEST, f"orphaned transaction recovery duration {secs} s is over "
                                                    f"{RECOVERY_S_MAX} s")
                props["CHECK_IMMUNITY_TIME_IN_SECONDS"] = str(secs)
        queues = await self._write_queues(topic)
        group = props.get("__SHARDINGKEY")
        if queues == 0:
            qid = 0          # not in the route yet: the broker creates it (autoCreateTopicEnable) or refuses
        elif group is not None:
            qid = guava_consistent_hash(java_string_hashcode(group), queues)
        else:
            qid = next(self._rr) % queues
        born_ms = (sp.born_timestamp.seconds * 1000 + sp.born_timestamp.nanos // 1_000_000
                   if sp.HasField("born_timestamp") else int(time.time() * 1000))
        fields = dict(producerGroup=topic, topic=topic, defaultTopic=AUTO_CREATE_TOPIC, defaultTopicQueueNums=4,
                      queueId=qid, sysFlag=sys_flag, bornTimestamp=born_ms, flag=0,
                      properties=properties_to_string(props), reconsumeTimes=int(props["RECONSUME_TIME"]),
                      unitMode=False, batch=False, brokerName=self.broker_name)
        if due_ms:
            r = await self.timer.store(fields, props, m.body, topic, qid, due_ms)
            entry.recall_handle = recall_handle(topic, self.broker_name, due_ms, props["UNIQ_KEY"])
        else:
            try:
                r = await self.remoting.invoke(self.broker_addr, self.remoting.request(
                    R.SEND_MESSAGE_V2, send_v2(**fields), m.body), SEND_TIMEOUT_S)
            except RemotingError as e:
                raise Refused(Code.PROXY_TIMEOUT, f"the broker did not answer the send: {e}") from None
        code = send_code(r.code)
        h = r.ext_fields or {}
        entry.status.CopyFrom(status(code, r.remark or ""))
        if r.code in (RC.SUCCESS, RC.FLUSH_DISK_TIMEOUT, RC.FLUSH_SLAVE_TIMEOUT, RC.SLAVE_NOT_AVAILABLE):
            entry.message_id = props["UNIQ_KEY"]
            entry.transaction_id = h.get("transactionId") or props["UNIQ_KEY"]
            try:
                entry.offset = int(h.get("queueOffset", -1))
            except ValueError:
                entry.offset = -1
            if kind == MessageType.TRANSACTION and r.code == RC.SUCCESS:
                try:
                    phy = decode_offset_msg_id(h.get("msgId", ""))[2]
                except (ValueError, WireError):
                    phy = -1
                self._remember(entry.transaction_id, topic, phy, entry.offset)
        if r.code != RC.SUCCESS:
            log.info("5.x send to %s answered %s by the broker (%s): %s", topic, r.code, code.name, r.remark)


    # ---- transactions: EndTransaction, and the broker's checks relayed to producers ------------------
    def _remember(self, transaction_id: str, topic: str, phy: int, queue_offset: int) -> None:
        self._transactions[transaction_id] = (topic, phy, queue_offset)
        self._transactions.move_to_end(transaction_id)
        while len(self._transactions) > TRANSACTIONS_MAX:
            self._transactions.popitem(last=False)

    async def EndTransaction(self, request, context):
        """COMMIT or ROLLBACK of a half message this gateway stored or relayed a check of: the
        4.x END_TRANSACTION (one-way, as a 4.x producer sends it) to the broker."""
        Resp = msg("EndTransactionResponse")
        try:
            topic = request.topic.name
            check_topic(topic)
            self._check(context, topic, publish=True)
            if not request.transaction_id.strip():
                raise Refused(Code.INVALID_TRANSACTION_ID, "the transaction id is blank")
            data = self._transactions.get(request.transaction_id)
            if data is None or data[1] < 0:
                raise Refused(Code.INTERNAL_SERVER_ERROR, f"cannot find transaction data of {request.transaction_id}"
                                                          f" (the broker's check will ask again)")
        except Refused as e:
            return Resp(status=status(e.code, e.text))
        _, phy, queue_offset = data
        decision = {1: 8, 2: 12}.get(request.resolution, 0)       # COMMIT 0x8, ROLLBACK 0xC, else 0 (ignored)
        ext = {"producerGroup": topic, "tranStateTableOffset": queue_offset, "commitLogOffset": phy,
               "commitOrRollback": decision, "fromTransactionCheck": request.source == 2,
               "msgId": request.message_id, "transactionId": request.transaction_id}
        try:
            await self.remoting.invoke_oneway(self.broker_addr, self.remoting.request(R.END_TRANSACTION, ext))
        except RemotingError as e:
            return Resp(status=status(Code.PROXY_TIMEOUT, f"the broker did not take the end of the transaction: {e}"))
        if decision:
            self._transactions.pop(request.transaction_id, None)
        return Resp(status=status(Code.OK))

    async def _on_check(self, addr: str, cmd) -> None:
        """CHECK_TRANSACTION_STATE from the broker (to this gateway, registered as a producer of
        the topic's group): relayed as a RecoverOrphanedTransactionCommand to a 5.x producer of
        the topic with an open Telemetry stream; none: the broker's next check asks again."""
        h = cmd.ext_fields or {}
        try:
            (rec,) = list(wcl.iter_record_values(cmd.body or b""))
            phy, queue_offset = int(h["commitLogOffset"]), int(h["tranStateTableOffset"])
        except (ValueError, KeyError, WireError) as e:
            log.warning("a transaction check from %s could not be read: %s", addr, e)
            return
        props = decode_properties(rec[17])
        topic = rec[16]
        tx = h.get("transactionId") or props.get("UNIQ_KEY", "")
        self._remember(tx, topic, phy, queue_offset)
        for cid in reversed(list(self._settings)):
            s = self._settings[cid]
            out = self._streams.get(cid)
            if out is None or not s.HasField("publishing") or topic not in {t.name for t in s.publishing.topics}:
                continue
            host, port = addr.rsplit(":", 1)
            p = Popped(topic, rec[2], rec[4], phy, bytes(rec[15]), props, rec[6], rec[7], f"{rec[8]}:{rec[9]}",
                       rec[10], f"{rec[11]}:{rec[12]}", rec[13], "")
            m = to_message(p, msg("Message"), h.get("offsetMsgId", ""))
            m.system_properties.ClearField("receipt_handle")
            c = msg("TelemetryCommand")()
            c.recover_orphaned_transaction_command.message.CopyFrom(m)
            c.recover_orphaned_transaction_command.transaction_id = tx
            out.put_nowait(c)
            return
        log.info("transaction %s of %s: no 5.x producer of the topic is connected; the broker checks again", tx,
                 topic)

    async def _broker_heartbeats(self) -> None:
        """Registers this gateway with its broker as a producer of every topic its 5.x producers
        publish (a 5.x producer's group is its topic), so the broker's transaction checks reach it."""
        cid = f"{self.grpc_host}@gateway-{self.grpc_port}"
        while True:
            topics = sorted({t.name for s in self._settings.values() if s.HasField("publishing")
                             for t in s.publishing.topics})
            if topics:
                body = orjson.dumps({"clientID": cid, "consumerDataSet": [],
                                     "producerDataSet": [{"groupName": t} for t in topics]})
                try:
                    await self.remoting.invoke(self.broker_addr, self.remoting.request(R.HEART_BEAT, None, body),
                                               NAMESRV_TIMEOUT_S)
                except RemotingError as e:
                    log.debug("heartbeat to the broker failed: %s", e)
            await asyncio.sleep(BROKER_HEARTBEAT_S)

    # ---- POP: ReceiveMessage, AckMessage, ChangeInvisibleDuration, QueryAssignment ---------------
    async def _read_queues(self, topic: str) -> int:
        route = await self.route(topic)
        if route is None:
            raise Refused(Code.TOPIC_NOT_FOUND, f"topic {topic} does not exist")
        for qd in route.queue_datas:
            if qd.broker_name == self.broker_name and qd.perm & PERM_READ:
                return qd.read_queue_nums
        raise Refused(Code.FORBIDDEN, f"topic {topic} has no readable queue on broker {self.broker_name}")

    async def ReceiveMessage(self, request, context):
        """Pops up to batch_size messages (long polling up to long_polling_timeout); frames: a
        status, the messages, and a delivery timestamp (the Java proxy's order)."""
        Resp = msg("ReceiveMessageResponse")
        now = msg("ReceiveMessageResponse")()
        try:
            if request is None:
                raise Refused(Code.BAD_REQUEST, "ReceiveMessage: the request is not a ReceiveMessage request")
            group, topic = request.group.name, request.message_queue.topic.name
            cid = self._consumer(context, group, topic)
            if request.auto_renew:
                invisible_ms = DEFAULT_INVISIBLE_MS    # renewed while the client holds it (mq.gateway.renew)
            else:
                invisible_ms = request.invisible_duration.ToMilliseconds() if request.HasField("invisible_duration") \
                    else -1
                if not INVISIBLE_MIN_MS <= invisible_ms <= INVISIBLE_MAX_MS:
                    raise Refused(Code.ILLEGAL_INVISIBLE_TIME, f"invisible duration {invisible_ms} ms is not within "
                                                               f"{INVISIBLE_MIN_MS}..{INVISIBLE_MAX_MS} ms")
            fe = request.filter_expression
            expr_type = "SQL92" if fe.type == 2 else "TAG"
            expr = fe.expression or "*"
            batch = max(1, min(BATCH_MAX, request.batch_size or BATCH_MAX))
            poll_s = request.long_polling_timeout.ToMilliseconds() / 1000 if request.HasField("long_polling_timeout") \
                else LONG_POLLING_S_DEFAULT
            poll_s = min(max(poll_s, 0.0), LONG_POLLING_S_DEFAULT)
            remaining = context.time_remaining()
            if remaining is not None:
                poll_s = min(poll_s, remaining - 1.0)
            deadline = time.monotonic() + poll_s
            queues = await self._read_queues(topic)
            try:        # the revive log read first: offsets a crash rolled back are restored
                await mq_loop.wait_for(self.pop.ready.wait(), max(0.1, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                raise Refused(Code.MESSAGE_NOT_FOUND, "no new message (the POP state is still being read)") from None
            orderly = bool((await self.group_config(group)).get("consumeMessageOrderly", False))
            while True:
                popped = await self.pop.pop(group, topic, queues, 1, expr_type, expr, batch, invisible_ms, orderly)
                if popped or time.monotonic() + POLL_INTERVAL_S > deadline:
                    break
                await asyncio.sleep(POLL_INTERVAL_S)
        except Refused as e:
            yield Resp(status=status(e.code, e.text))
            now.delivery_timestamp.GetCurrentTime()
            yield now
            return
        except Exception:
            log.exception("gRPC ReceiveMessage failed")
            yield Resp(status=status(Code.INTERNAL_SERVER_ERROR, "ReceiveMessage failed in the broker (logged)"))
            return
        if not popped:
            yield Resp(status=status(Code.MESSAGE_NOT_FOUND, "no new message"))
        else:
            yield Resp(status=status(Code.OK))
            self.stats.messages("received", len(popped))
            Message = msg("Message")
            for p in popped:
                if request.auto_renew:
                    self.renewer.hold(cid, group, topic, p.handle)
                host, port = p.store_host.rsplit(":", 1)
                yield Resp(message=to_message(p, Message, offset_msg_id(host, int(port), p.commitlog_offset)))
        now.delivery_timestamp.GetCurrentTime()
        yield now

    async def AckMessage(self, request, context):
        Resp = msg("AckMessageResponse")
        try:
            group, topic = request.group.name, request.topic.name
            self._consumer(context, group, topic)
        except Refused as e:
            return Resp(status=status(e.code, e.text))
        resp = Resp()
        outcome = await self.pop.ack(group, topic, [self.renewer.latest(group, e.receipt_handle)
                                                    for e in request.entries])
        for e, refused in zip(request.entries, outcome):
            out = resp.entries.add(message_id=e.message_id, receipt_handle=e.receipt_handle)
            if refused is None:
                out.status.CopyFrom(status(Code.OK))
            else:
                out.status.CopyFrom(status(refused.code, refused.text))
        self.stats.messages("acked", outcome.count(None))
        resp.status.CopyFrom(self._summary(resp.entries))
        return resp

    async def ChangeInvisibleDuration(self, request, context):
        Resp = msg("ChangeInvisibleDurationResponse")
        try:
            group, topic = request.group.name, request.topic.name
            self._consumer(context, group, topic)
            invisible_ms = request.invisible_duration.ToMilliseconds()
            if not 0 <= invisible_ms <= INVISIBLE_MAX_MS:
                raise Refused(Code.ILLEGAL_INVISIBLE_TIME, f"invisible duration {invisible_ms} ms is not within "
                                                           f"0..{INVISIBLE_MAX_MS} ms")
            handle = await self.pop.change_invisible(group, topic, self.renewer.latest(group, request.receipt_handle),
                                                     invisible_ms)
        except Refused as e:
            return Resp(status=status(e.code, e.text))
        return Resp(status=status(Code.OK), receipt_handle=handle)

    async def RecallMessage(self, request, context):
        """A timer message taken back before it is due (its recall handle from the send)."""
        Resp = msg("RecallMessageResponse")
        try:
            topic = request.topic.name
            check_topic(topic)
            self._check(context, topic, publish=True)
            message_id = await self.timer.recall(topic, request.recall_handle)
        except Refused as e:
            return Resp(status=status(e.code, e.text))
        return Resp(status=status(Code.OK), message_id=message_id)

    async def ForwardMessageToDeadLetterQueue(self, request, context):
        """A FIFO consumer gave up on a message: to %DLQ%<group>, then acked."""
        Resp = msg("ForwardMessageToDeadLetterQueueResponse")
        try:
            group, topic = request.group.name, request.topic.name
            self._consumer(context, group, topic)
            await self.pop.forward_to_dlq(group, topic, self.renewer.latest(group, request.receipt_handle))
        except Refused as e:
            return Resp(status=status(e.code, e.text))
        self.stats.messages("dead-lettered")
        return Resp(status=status(Code.OK))

    async def QueryAssignment(self, request, context):
        """A push consumer's queues: one assignment per broker that has readable queues (id -1:
        the broker pops from all of them), as the Java proxy answers a group that is not orderly."""
        Resp = msg("QueryAssignmentResponse")
        try:
            self._consumer(context, request.group.name, request.topic.name)
            route = await self.route(request.topic.name)
        except Refused as e:
            return Resp(status=status(e.code, e.text))
        if route is None:
            return Resp(status=status(Code.TOPIC_NOT_FOUND, f"topic {request.topic.name} does not exist"))
        resp = Resp(status=status(Code.OK))
        brokers = {b.broker_name: b for b in route.broker_datas}
        for qd in route.queue_datas:
            bd = brokers.get(qd.broker_name)
            master = bd.broker_addrs.get(0) if bd is not None else None
            if master is None or not qd.perm & PERM_READ or qd.read_queue_nums <= 0:
                continue
            a = resp.assignments.add()
            q = a.message_queue
            q.topic.CopyFrom(request.topic)
            q.id = -1
            q.permission = int(Permission.READ_WRITE if qd.perm & PERM_WRITE else Permission.READ)
            q.broker.name, q.broker.id = qd.broker_name, 0
            q.broker.endpoints.CopyFrom(await self.endpoints_of(master))
        if not resp.assignments:
            return Resp(status=status(Code.FORBIDDEN, "no readable queue"))
        return resp

    # ---- a pull consumer's: PullMessage, GetOffset, UpdateOffset, QueryOffset (mq.gateway.pull) ------
    async def _queue(self, q) -> tuple[str, int]:
        """A request's message queue, its topic already checked (by _consumer or check_topic):
        (topic, queue id), the id one of the topic's readable queues on this broker."""
        topic = q.topic.name
        queues = await self._read_queues(topic)
        if not 0 <= q.id < queues:
            raise Refused(Code.BAD_REQUEST, f"queue {q.id} of {topic} is not one of its {queues} readable queues "
                                            f"on broker {self.broker_name}")
        return topic, q.id

    async def PullMessage(self, request, context):
        """From the request's offset: a status, the messages, and the next offset."""
        Resp = msg("PullMessageResponse")
        try:
            if request is None:
                raise Refused(Code.BAD_REQUEST, "PullMessage: the request is not a PullMessage request")
            group = request.group.name
            self._consumer(context, group, request.message_queue.topic.name)
            topic, qid = await self._queue(request.message_queue)
            fe = request.filter_expression
            poll_s = min(max(request.long_polling_timeout.ToMilliseconds() / 1000, 0.0), LONG_POLLING_S_DEFAULT)
            remaining = context.time_remaining()
            if remaining is not None:
                poll_s = min(poll_s, remaining - 1.0)
            code, nxt, pulled = await self.pull.pull(group, topic, qid, request.offset, request.batch_size,
                                                     "SQL92" if fe.type == 2 else "TAG", fe.expression or "*", poll_s)
        except Refused as e:
            yield Resp(status=status(e.code, e.text))
            return
        except Exception:
            log.exception("gRPC PullMessage failed")
            yield Resp(status=status(Code.INTERNAL_SERVER_ERROR, "PullMessage failed in the broker (logged)"))
            return
        yield Resp(status=status(code))
        Message = msg("Message")
        for p in pulled:
            host, port = p.store_host.rsplit(":", 1)
            yield Resp(message=to_message(p, Message, offset_msg_id(host, int(port), p.commitlog_offset)))
        self.stats.messages("pulled", len(pulled))
        yield Resp(next_offset=nxt)

    async def GetOffset(self, request, context):
        Resp = msg("GetOffsetResponse")
        try:
            self._consumer(context, request.group.name, request.message_queue.topic.name)
            topic, qid = await self._queue(request.message_queue)
            offset = await self.pull.get_offset(request.group.name, topic, qid)
        except Refused as e:
            return Resp(status=status(e.code, e.text))
        return Resp(status=status(Code.OK), offset=offset)

    async def UpdateOffset(self, request, context):
        Resp = msg("UpdateOffsetResponse")
        try:
            self._consumer(context, request.group.name, request.message_queue.topic.name)
            topic, qid = await self._queue(request.message_queue)
            await self.pull.update_offset(request.group.name, topic, qid, request.offset)
        except Refused as e:
            return Resp(status=status(e.code, e.text))
        return Resp(status=status(Code.OK))

    async def QueryOffset(self, request, context):
        """A queue's first offset, its end, or the offset of a time (RocketMQ's search by time:
        the message stored at that millisecond, else the nearer of the two around it)."""
        Resp = msg("QueryOffsetResponse")
        try:
            check_topic(request.message_queue.topic.name)
            self._check(context, request.message_queue.topic.name)
            topic, qid = await self._queue(request.message_queue)
            ts = request.timestamp.ToMilliseconds() if request.HasField("timestamp") else None
            offset = await self.pull.query_offset(topic, qid, request.query_offset_policy, ts)
        except Refused as e:
            return Resp(status=status(e.code, e.text))
        return Resp(status=status(Code.OK), offset=offset)


METHODS_SERVED = ("QueryRoute", "Telemetry", "Heartbeat", "NotifyClientTermination", "SendMessage", "ReceiveMessage",
                  "AckMessage", "ChangeInvisibleDuration", "QueryAssignment", "EndTransaction",
                  "ForwardMessageToDeadLetterQueue", "RecallMessage", "PullMessage", "GetOffset", "UpdateOffset",
                  "QueryOffset")
