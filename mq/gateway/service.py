"""apache.rocketmq.v2.MessagingService, served for this broker: what the gateway answers.

The gateway is RocketMQ 5's proxy in "local" mode, in a role process of the broker: it speaks
gRPC to 5.x clients and 4.x remoting to its own broker (a send is a SEND_MESSAGE_V2 to the
broker's port) and to the name servers (routes).  Every policy of the 4.x path - refusals,
flush and replication waits, DLedger, disk full, permissions - is therefore the broker's own,
answered once; the gateway maps the answer to a Status code (mq.gateway.convert).

Served: QueryRoute, Telemetry (client settings both ways), Heartbeat, NotifyClientTermination,
SendMessage (NORMAL messages: a 4.x topic has no message type, so it takes NORMAL only, as
RocketMQ 5 treats a topic without the message.type attribute).  The other RPCs are not
registered: grpc answers them UNIMPLEMENTED, as the Java proxy does for the ones it lacks.

Errors: every refusal is a Status in the response body with the Code a 5.x client expects (the
Java proxy's choice); the gRPC status stays OK.  An exception in a handler (a bug) is answered
INTERNAL_SERVER_ERROR in the body and logged, never a gRPC INTERNAL.

Limits, named: ROUTE_TTL_S (a topic's route is read from the name server at most that often per
topic, and at once when a send finds no queue of this broker in it); SETTINGS_MAX clients'
settings kept (the oldest dropped past it; a client re-sends its settings every 5 minutes)."""
from __future__ import annotations

import asyncio
import itertools
import logging
import random
import time
from collections import OrderedDict

from mq.client.route import TopicRouteData
from mq.remoting import RemotingClient, RemotingError
from mq.wire.codes import RequestCode as R, ResponseCode as RC
from mq.wire.consumequeue import java_string_hashcode
from mq.wire.grpc5 import AddressScheme, ClientType, Code, MessageType, Permission, msg
from mq.wire.headers import send_v2
from mq.wire.msgid import offset_msg_id
from mq.wire.properties import properties_to_string
from mq.wire.topics import AUTO_CREATE_TOPIC, PERM_READ, PERM_WRITE

from .convert import Refused, check_group, check_topic, message_type_of, send_code, to_message, to_properties
from .options import GatewayOptions
from .pop import BATCH_MAX, INVISIBLE_MAX_MS, INVISIBLE_MIN_MS, POLL_INTERVAL_S, PopService

log = logging.getLogger("mq.gateway")

ROUTE_TTL_S = 5.0
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
        self.pop = PopService(self.remoting, opts.broker_addr, opts.broker_name, opts.cluster)
        self._routes: dict[str, tuple[float, TopicRouteData | None]] = {}
        self._settings: OrderedDict[str, object] = OrderedDict()     # client id -> its Settings
        self._rr = itertools.count(random.randrange(1 << 16))
        self.requests = 0

    async def start(self) -> None:
        await self.pop.start()

    async def close(self) -> None:
        await self.pop.close()
        await self.remoting.close()

    # ---- helpers ------------------------------------------------------------------------------
    @staticmethod
    def _client_id(context) -> str:
        for k, v in context.invocation_metadata() or ():
            if k == CLIENT_ID_HEADER:
                return v
        raise Refused(Code.CLIENT_ID_REQUIRED, f"the request has no {CLIENT_ID_HEADER} header")

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

    def endpoints_of(self, broker_addr: str):
        """The gRPC endpoints of the broker at 4.x address broker_addr: ours exactly; another's
        host with our grpcServerPort (RocketMQ 5's local mode: every broker serves gRPC on the same port)."""
        if broker_addr == self.broker_addr:
            host, port = self.grpc_host, self.grpc_port
        else:
            host, port = broker_addr.rsplit(":", 1)[0], self.grpc_port
        ep = msg("Endpoints")(scheme=int(_scheme(host)))
        ep.addresses.add(host=host, port=port)
        return ep

    # ---- QueryRoute ---------------------------------------------------------------------------
    async def QueryRoute(self, request, context):
        Resp = msg("QueryRouteResponse")
        try:
            self._client_id(context)
            topic = request.topic.name
            check_topic(topic)
            route = await self.route(topic)
        except Refused as e:
            return Resp(status=status(e.code, e.text))
        if route is None or not route.queue_datas:
            return Resp(status=status(Code.TOPIC_NOT_FOUND, f"topic {topic} does not exist"))
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
                ep = self.endpoints_of(addr)
                for qid, perm in enumerate(perms):
                    q = resp.message_queues.add(id=qid, permission=int(perm))
                    q.topic.CopyFrom(request.topic)
                    q.broker.name, q.broker.id = qd.broker_name, broker_id
                    q.broker.endpoints.CopyFrom(ep)
                    q.accept_message_types.append(int(MessageType.NORMAL))
        return resp

    # ---- clients: Telemetry, Heartbeat, NotifyClientTermination ---------------------------------
    def _merged_settings(self, s):
        """What the server answers a client's Settings with (the Java proxy's values)."""
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
            sub.fifo = False
            sub.receive_batch_size = RECEIVE_BATCH_SIZE
            if not sub.HasField("long_polling_timeout"):
                sub.long_polling_timeout.FromSeconds(LONG_POLLING_S_DEFAULT)
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
        """The client's long-lived stream: each Settings it sends is kept (for Heartbeat and what
        comes later) and answered with the server's; the stream stays open until the client ends it."""
        Cmd = msg("TelemetryCommand")
        try:
            cid = self._client_id(context)
        except Refused as e:
            yield Cmd(status=status(e.code, e.text))
            return
        async for cmd in request_iterator:
            if cmd is None:                # not a TelemetryCommand (mq.gateway.role's decoder)
                yield Cmd(status=status(Code.BAD_REQUEST, "a Telemetry frame that is not a TelemetryCommand"))
                continue
            if cmd.HasField("settings"):
                try:
                    self._check_settings(cmd.settings)
                except Refused as e:
                    yield Cmd(status=status(e.code, e.text))
                    continue
                self._settings[cid] = cmd.settings
                self._settings.move_to_end(cid)
                while len(self._settings) > SETTINGS_MAX:
                    self._settings.popitem(last=False)
                yield Cmd(status=status(Code.OK), settings=self._merged_settings(cmd.settings))
            # thread stack traces and verify results answer commands this server never sends

    async def Heartbeat(self, request, context):
        Resp = msg("HeartbeatResponse")
        try:
            cid = self._client_id(context)
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
            cid = self._client_id(context)
        except Refused as e:
            return Resp(status=status(e.code, e.text))
        if self._settings.pop(cid, None) is None:
            return Resp(status=status(Code.UNRECOGNIZED_CLIENT_TYPE, "no settings from this client"))
        return Resp(status=status(Code.OK))

    # ---- SendMessage ----------------------------------------------------------------------------
    async def SendMessage(self, request, context):
        Resp = msg("SendMessageResponse")
        try:
            self._client_id(context)
            if not request.messages:
                raise Refused(Code.MESSAGE_CORRUPTED, "no message in the request")
            topic = request.messages[0].topic.name
            if any(m.topic.name != topic for m in request.messages):
                raise Refused(Code.MESSAGE_CORRUPTED, "the messages of one request must share a topic")
            check_topic(topic)
        except Refused as e:
            return Resp(status=status(e.code, e.text))
        resp = Resp()
        for m in request.messages:
            entry = resp.entries.add()
            try:
                await self._send_one(m, topic, entry)
            except Refused as e:
                entry.status.CopyFrom(status(e.code, e.text))
        codes = {e.status.code for e in resp.entries}
        resp.status.CopyFrom(status(Code(codes.pop())) if len(codes) == 1 else status(Code.MULTIPLE_RESULTS))
        if resp.status.code != Code.MULTIPLE_RESULTS:
            resp.status.message = resp.entries[0].status.message
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
        if kind != MessageType.NORMAL:
            raise Refused(Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                          f"topic {topic} takes NORMAL messages (a 4.x topic has no message type), not {kind.name}")
        props, sys_flag = to_properties(m, self.max_body_bytes)
        queues = await self._write_queues(topic)
        group = props.get("__SHARDINGKEY")
        if queues == 0:
            qid = 0          # not in the route yet: the broker creates it (autoCreateTopicEnable) or refuses
        elif group is not None:
            qid = guava_consistent_hash(java_string_hashcode(group), queues)
        else:
            qid = next(self._rr) % queues
        sp = m.system_properties
        born_ms = (sp.born_timestamp.seconds * 1000 + sp.born_timestamp.nanos // 1_000_000
                   if sp.HasField("born_timestamp") else int(time.time() * 1000))
        ext = send_v2(producerGroup=topic, topic=topic, defaultTopic=AUTO_CREATE_TOPIC, defaultTopicQueueNums=4,
                      queueId=qid, sysFlag=sys_flag, bornTimestamp=born_ms, flag=0,
                      properties=properties_to_string(props), reconsumeTimes=int(props["RECONSUME_TIME"]),
                      unitMode=False, batch=False, brokerName=self.broker_name)
        try:
            r = await self.remoting.invoke(self.broker_addr, self.remoting.request(R.SEND_MESSAGE_V2, ext, m.body),
                                           SEND_TIMEOUT_S)
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
        if r.code != RC.SUCCESS:
            log.info("5.x send to %s answered %s by the broker (%s): %s", topic, r.code, code.name, r.remark)


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
            self._client_id(context)
            group, topic = request.group.name, request.message_queue.topic.name
            check_group(group)
            check_topic(topic)
            if request.auto_renew:
                invisible_ms = 60_000          # the proxy's default; it renews, we do not (yet): ack within it
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
                await asyncio.wait_for(self.pop.ready.wait(), max(0.1, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                raise Refused(Code.MESSAGE_NOT_FOUND, "no new message (the POP state is still being read)") from None
            while True:
                popped = await self.pop.pop(group, topic, queues, 1, expr_type, expr, batch, invisible_ms)
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
            Message = msg("Message")
            for p in popped:
                host, port = p.store_host.rsplit(":", 1)
                yield Resp(message=to_message(p, Message, offset_msg_id(host, int(port), p.commitlog_offset)))
        now.delivery_timestamp.GetCurrentTime()
        yield now

    async def AckMessage(self, request, context):
        Resp = msg("AckMessageResponse")
        try:
            self._client_id(context)
            group, topic = request.group.name, request.topic.name
            check_group(group)
            check_topic(topic)
        except Refused as e:
            return Resp(status=status(e.code, e.text))
        resp = Resp()
        for e in request.entries:
            out = resp.entries.add(message_id=e.message_id, receipt_handle=e.receipt_handle)
            try:
                await self.pop.ack(group, topic, e.receipt_handle)
                out.status.CopyFrom(status(Code.OK))
            except Refused as r:
                out.status.CopyFrom(status(r.code, r.text))
        codes = {e.status.code for e in resp.entries}
        if len(codes) == 1:
            resp.status.CopyFrom(resp.entries[0].status)
        else:
            resp.status.CopyFrom(status(Code.MULTIPLE_RESULTS if codes else Code.BAD_REQUEST,
                                        "" if codes else "no entry to ack"))
        return resp

    async def ChangeInvisibleDuration(self, request, context):
        Resp = msg("ChangeInvisibleDurationResponse")
        try:
            self._client_id(context)
            group, topic = request.group.name, request.topic.name
            check_group(group)
            check_topic(topic)
            invisible_ms = request.invisible_duration.ToMilliseconds()
            if not 0 <= invisible_ms <= INVISIBLE_MAX_MS:
                raise Refused(Code.ILLEGAL_INVISIBLE_TIME, f"invisible duration {invisible_ms} ms is not within "
                                                           f"0..{INVISIBLE_MAX_MS} ms")
            handle = await self.pop.change_invisible(group, topic, request.receipt_handle, invisible_ms)
        except Refused as e:
            return Resp(status=status(e.code, e.text))
        return Resp(status=status(Code.OK), receipt_handle=handle)

    async def QueryAssignment(self, request, context):
        """A push consumer's queues: one assignment per broker that has readable queues (id -1:
        the broker pops from all of them), as the Java proxy answers a group that is not orderly."""
        Resp = msg("QueryAssignmentResponse")
        try:
            self._client_id(context)
            check_topic(request.topic.name)
            check_group(request.group.name)
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
            q.broker.endpoints.CopyFrom(self.endpoints_of(master))
        if not resp.assignments:
            return Resp(status=status(Code.FORBIDDEN, "no readable queue"))
        return resp


METHODS_SERVED = ("QueryRoute", "Telemetry", "Heartbeat", "NotifyClientTermination", "SendMessage", "ReceiveMessage",
                  "AckMessage", "ChangeInvisibleDuration", "QueryAssignment")
