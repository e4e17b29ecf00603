"""NameServer: the request processor (RocketMQ N/processor/DefaultRequestProcessor)
over a RemotingServer, the broker-expiry scan and the housekeeping on
connection close (spec sections 2.1 and 9).

Request code -> handler (one hop from the name):

    PUT_KV_CONFIG 100            put_kv_config            header namespace, key, value
    GET_KV_CONFIG 101            get_kv_config            -> header value, or QUERY_NOT_FOUND (22)
    DELETE_KV_CONFIG 102         delete_kv_config
    REGISTER_BROKER 103          register_broker          -> header masterAddr, haServerAddr; body KVTable or none
    UNREGISTER_BROKER 104        unregister_broker
    GET_ROUTEINFO_BY_TOPIC 105   get_routeinfo_by_topic   -> TopicRouteData, or TOPIC_NOT_EXIST (17)
    GET_BROKER_CLUSTER_INFO 106  get_broker_cluster_info  -> ClusterInfo
    WIPE_WRITE_PERM_OF_BROKER 205 / ADD_WRITE_PERM_OF_BROKER 327   operate_write_perm
    GET_ALL_TOPIC_LIST_FROM_NAMESERVER 206   get_all_topic_list   -> TopicList
    DELETE_TOPIC_IN_NAMESRV 216  delete_topic_in_namesrv
    GET_KVLIST_BY_NAMESPACE 219  get_kvlist_by_namespace  -> KVTable, or QUERY_NOT_FOUND
    GET_TOPICS_BY_CLUSTER 224    get_topics_by_cluster    -> TopicList
    QUERY_DATA_VERSION 322       query_data_version       -> header changed; body DataVersion
    UPDATE_NAMESRV_CONFIG 318    update_namesrv_config    body properties text (RUNTIME_KEYS only; written
                                                          back to the -c file)
    GET_NAMESRV_CONFIG 319       get_namesrv_config       -> body properties text of every option

Deviation: unknown codes get REQUEST_CODE_NOT_SUPPORTED (3) from the
RemotingServer; the Java name server sends nothing and lets the client time
out (spec 1.5).

Header fields are read leniently, like Java's decoder (values may arrive as
JSON numbers; booleans as true/false or, from the C++ client, 1/0).  A missing
required field or a body that does not parse answers SYSTEM_ERROR (1) with a
remark naming it, which is what a Java peer sees from the NPE Java hits."""
from __future__ import annotations

import asyncio
import logging
import zlib

from mq.files import rewrite_properties_file
from mq.remoting import RemotingServer, RequestCode, ResponseCode, make_response
from mq.wire.remoting import RemotingCommand

from .bodies import (NAMESPACE_ORDER_TOPIC_CONFIG, STANDARD_JSON_MIN_VERSION, BodyError, DataVersion,
                     decode_register_broker_body, fastjson_dumps)
from .config import NamesrvConfig, parse_runtime_update
from .kvconfig import KVConfigManager
from .routeinfo import RouteInfoManager

log = logging.getLogger("mq.namesrv")


# FAQUrl.suggestTodo(FAQUrl.APPLY_TOPIC_URL), appended to the TOPIC_NOT_EXIST remark
_APPLY_TOPIC_HINT = "\nSee http://rocketmq.apache.org/docs/faq/ for further details."


class HeaderError(ValueError):
    pass


def _field(cmd: RemotingCommand, name: str, required: bool = True) -> str | None:
    value = (cmd.ext_fields or {}).get(name)
    if value is None and required:
        raise HeaderError(f"the custom field <{name}> is null")
    return value


def _long(cmd: RemotingCommand, name: str, required: bool = True, default: int = 0) -> int:
    raw = _field(cmd, name, required)
    if raw is None or (raw == "" and not required):
        return default
    try:
        return int(raw)
    except ValueError:
        raise HeaderError(f"the custom field <{name}> = {raw!r} is not an integer") from None


def _bool(cmd: RemotingCommand, name: str) -> bool | None:
    raw = _field(cmd, name, required=False)
    return None if raw is None else raw.strip().lower() in ("true", "1")


def _respond(request: RemotingCommand, code: int = ResponseCode.SUCCESS, remark: str | None = None,
             ext: dict | None = None, body: bytes = b"") -> RemotingCommand:
    """make_response, but with no extFields at all when the Java response has no custom header."""
    resp = make_response(request, code, remark, ext, body)
    if ext is None:
        resp.ext_fields = None
    return resp


class NameServer:
    """start() -> bound port; stop().  State: `routes` (RouteInfoManager), `kv` (KVConfigManager)."""

    def __init__(self, config: NamesrvConfig | None = None, **options):
        if config is None:
            config = NamesrvConfig(**options)
        elif options:
            config = NamesrvConfig(**{**config.as_dict(), **options})
        self.config = config
        self.routes = RouteInfoManager(expired_ms=config.brokerExpiredMillis)
        self.kv = KVConfigManager(config.kvConfigPath)
        self.handlers = {
            RequestCode.PUT_KV_CONFIG: self.put_kv_config,
            RequestCode.GET_KV_CONFIG: self.get_kv_config,
            RequestCode.DELETE_KV_CONFIG: self.delete_kv_config,
            RequestCode.REGISTER_BROKER: self.register_broker,
            RequestCode.UNREGISTER_BROKER: self.unregister_broker,
            RequestCode.GET_ROUTEINFO_BY_TOPIC: self.get_routeinfo_by_topic,
            RequestCode.GET_BROKER_CLUSTER_INFO: self.get_broker_cluster_info,
            RequestCode.WIPE_WRITE_PERM_OF_BROKER: self.operate_write_perm,
            RequestCode.ADD_WRITE_PERM_OF_BROKER: self.operate_write_perm,
            RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: self.get_all_topic_list,
            RequestCode.DELETE_TOPIC_IN_NAMESRV: self.delete_topic_in_namesrv,
            RequestCode.GET_KVLIST_BY_NAMESPACE: self.get_kvlist_by_namespace,
            RequestCode.GET_TOPICS_BY_CLUSTER: self.get_topics_by_cluster,
            RequestCode.QUERY_DATA_VERSION: self.query_data_version,
            RequestCode.UPDATE_NAMESRV_CONFIG: self.update_namesrv_config,
            RequestCode.GET_NAMESRV_CONFIG: self.get_namesrv_config,
        }
        self.server = RemotingServer("namesrv", {code: self._guarded(h) for code, h in self.handlers.items()},
                                     on_close=self._on_connection_closed)
        self.port: int | None = None
        self._scan_task: asyncio.Task | None = None

    async def start(self) -> int:
        """Loads the KV config, listens on listenAddress:listenPort, starts the expiry scan."""
        self.kv.load()
        self.port = await self.server.start(self.config.listenAddress, self.config.listenPort)
        self._scan_task = asyncio.create_task(self._scan_loop(), name="namesrv-scan")
        log.info("name server listening on %s:%d (broker expiry %d ms, scan every %d ms)",
                 self.config.listenAddress, self.port, self.config.brokerExpiredMillis,
                 self.config.scanNotActiveBrokerInterval)
        return self.port

    async def stop(self) -> None:
        """Stops the scan, stops accepting, lets in-flight requests finish, closes connections.
        Nothing to flush: KV changes are written when made; routes are not persisted."""
        if self._scan_task is not None:
            self._scan_task.cancel()
            try:
                await self._scan_task
            except asyncio.CancelledError:
                pass
            self._scan_task = None
        await self.server.stop()
        log.info("name server on port %s stopped", self.port)

    # ---------------------------------------------------------------------------------------------
    # Liveness

    async def _scan_loop(self) -> None:
        interval_s = self.config.scanNotActiveBrokerInterval / 1000
        await asyncio.sleep(interval_s / 2)     # 4.x: first scan 5 s after start, then every 10 s
        while True:
            try:
                self.scan_not_active_brokers()
            except Exception:
                log.exception("scan for silent brokers failed")
            await asyncio.sleep(interval_s)

    def scan_not_active_brokers(self) -> list[str]:
        """One scan: expired brokers leave every table and their connections are closed."""
        gone = self.routes.scan_not_active_brokers()
        for _, live in gone:
            if live.conn is not None:
                live.conn.close()
        return [addr for addr, _ in gone]

    def _on_connection_closed(self, conn) -> None:
        self.routes.on_connection_closed(conn)

    # ---------------------------------------------------------------------------------------------
    # Handlers

    def _guarded(self, handler):
        async def run(conn, cmd: RemotingCommand) -> RemotingCommand | None:
            try:
                return await handler(conn, cmd)
            except (HeaderError, BodyError) as e:
                log.warning("code %d from %s refused: %s", cmd.code, conn.peer, e)
                return _respond(cmd, ResponseCode.SYSTEM_ERROR, str(e))
        run.__name__ = handler.__name__
        return run

    async def register_broker(self, conn, cmd: RemotingCommand) -> RemotingCommand:
        cluster = _field(cmd, "clusterName")
        broker_addr = _field(cmd, "brokerAddr")
        broker_name = _field(cmd, "brokerName")
        broker_id = _long(cmd, "brokerId")
        ha_server_addr = _field(cmd, "haServerAddr", required=False)
        compressed = bool(_bool(cmd, "compressed"))
        crc = _long(cmd, "bodyCrc32", required=False, default=0)
        if crc != 0 and crc != zlib.crc32(cmd.body) & 0x7FFFFFFF:
            log.warning("register of %s refused: body crc32 %d, header says %d", broker_addr,
                        zlib.crc32(cmd.body) & 0x7FFFFFFF, crc)
            return _respond(cmd, ResponseCode.SYSTEM_ERROR, "crc32 not match")
        body = decode_register_broker_body(cmd.body, compressed, cmd.version)
        result = self.routes.register_broker(cluster, broker_addr, broker_name, broker_id, ha_server_addr,
                                             body.data_version, body.topic_configs, body.filter_servers, conn)
        order_conf = self.kv.namespace(NAMESPACE_ORDER_TOPIC_CONFIG)
        return _respond(cmd, ext={"haServerAddr": result.ha_server_addr, "masterAddr": result.master_addr},
                        body=fastjson_dumps({"table": order_conf}) if order_conf is not None else b"")

    async def unregister_broker(self, conn, cmd: RemotingCommand) -> RemotingCommand:
        self.routes.unregister_broker(_field(cmd, "clusterName"), _field(cmd, "brokerAddr"),
                                      _field(cmd, "brokerName"), _long(cmd, "brokerId"))
        return _respond(cmd)

    async def get_routeinfo_by_topic(self, conn, cmd: RemotingCommand) -> RemotingCommand:
        """Standard JSON (quoted brokerId keys) for version >= 401 or acceptStandardJsonOnly=true,
        fastjson's bare keys otherwise (spec 2.1)."""
        topic = _field(cmd, "topic")
        route = self.routes.pickup_topic_route_data(topic)
        if route is None:
            return _respond(cmd, ResponseCode.TOPIC_NOT_EXIST,
                            f"No topic route info in name server for the topic: {topic}{_APPLY_TOPIC_HINT}")
        if self.config.orderMessageEnable:
            route["orderTopicConf"] = self.kv.get(NAMESPACE_ORDER_TOPIC_CONFIG, topic)
        standard = cmd.version >= STANDARD_JSON_MIN_VERSION or bool(_bool(cmd, "acceptStandardJsonOnly"))
        return _respond(cmd, body=fastjson_dumps(route, standard=standard))

    async def get_broker_cluster_info(self, conn, cmd: RemotingCommand) -> RemotingCommand:
        """Always fastjson's bare integer keys, as 4.9.8 (no standard-JSON switch here)."""
        return _respond(cmd, body=fastjson_dumps(self.routes.cluster_info()))

    async def get_all_topic_list(self, conn, cmd: RemotingCommand) -> RemotingCommand:
        return _respond(cmd, body=fastjson_dumps({"topicList": self.routes.all_topics()}))

    async def get_topics_by_cluster(self, conn, cmd: RemotingCommand) -> RemotingCommand:
        topics = self.routes.topics_by_cluster(_field(cmd, "cluster"))
        return _respond(cmd, body=fastjson_dumps({"topicList": topics}))

    async def delete_topic_in_namesrv(self, conn, cmd: RemotingCommand) -> RemotingCommand:
        topic = _field(cmd, "topic")
        cluster = _field(cmd, "clusterName", required=False)
        self.routes.delete_topic(topic, cluster)
        log.info("topic %s deleted%s (request from %s)", topic, f" on cluster {cluster}" if cluster else "",
                 conn.peer)
        return _respond(cmd)

    async def operate_write_perm(self, conn, cmd: RemotingCommand) -> RemotingCommand:
        wipe = cmd.code == RequestCode.WIPE_WRITE_PERM_OF_BROKER
        broker_name = _field(cmd, "brokerName")
        count = self.routes.operate_write_perm(broker_name, wipe)
        log.info("%s write perm of %s on %d topics", "wiped" if wipe else "added", broker_name, count)
        return _respond(cmd, ext={"wipeTopicCount" if wipe else "addTopicCount": count})

    async def query_data_version(self, conn, cmd: RemotingCommand) -> RemotingCommand:
        broker_addr = _field(cmd, "brokerAddr")
        for name in ("brokerName", "clusterName", "brokerId"):
            _field(cmd, name)
        changed = self.routes.is_broker_topic_config_changed(broker_addr, DataVersion.decode(cmd.body))
        if not changed:
            self.routes.update_broker_info_update_timestamp(broker_addr)
        ours = self.routes.query_broker_topic_config(broker_addr)
        return _respond(cmd, ext={"changed": changed}, body=ours.encode() if ours is not None else b"")

    async def put_kv_config(self, conn, cmd: RemotingCommand) -> RemotingCommand:
        try:
            await self.kv.put(_field(cmd, "namespace"), _field(cmd, "key"), _field(cmd, "value"))
        except OSError as e:
            return _respond(cmd, ResponseCode.SYSTEM_ERROR, f"kv config not persisted to {self.kv.path}: {e}")
        return _respond(cmd)

    async def get_kv_config(self, conn, cmd: RemotingCommand) -> RemotingCommand:
        namespace, key = _field(cmd, "namespace"), _field(cmd, "key")
        value = self.kv.get(namespace, key)
        if value is None:
            return _respond(cmd, ResponseCode.QUERY_NOT_FOUND,
                            f"No config item, Namespace: {namespace} Key: {key}", ext={})
        return _respond(cmd, ext={"value": value})

    async def delete_kv_config(self, conn, cmd: RemotingCommand) -> RemotingCommand:
        try:
            await self.kv.delete(_field(cmd, "namespace"), _field(cmd, "key"))
        except OSError as e:
            return _respond(cmd, ResponseCode.SYSTEM_ERROR, f"kv config not persisted to {self.kv.path}: {e}")
        return _respond(cmd)

    async def get_namesrv_config(self, conn, cmd: RemotingCommand) -> RemotingCommand:
        return _respond(cmd, body=self.config.as_properties().encode())

    async def update_namesrv_config(self, conn, cmd: RemotingCommand) -> RemotingCommand:
        """Keys of RUNTIME_KEYS: set here at once (the expiry scan reads brokerExpiredMillis at each
        pass, routes read orderMessageEnable at each answer), and written to the config file
        the name server started with, if any.  SYSTEM_ERROR naming the key otherwise."""
        try:
            values = parse_runtime_update(bytes(cmd.body or b"").decode("utf-8", "replace"))
        except ValueError as e:
            return _respond(cmd, ResponseCode.SYSTEM_ERROR, f"update name server config failed: {e}")
        for k, v in values.items():
            setattr(self.config, k, v)
        self.routes.expired_ms = self.config.brokerExpiredMillis
        log.warning("name server config changed at run time by %s: %s", conn.peer, values)
        if self.config.config_file:
            try:
                rewrite_properties_file(self.config.config_file, values)
            except OSError as e:
                return _respond(cmd, ResponseCode.SYSTEM_ERROR,
                                f"changed, but not written to {self.config.config_file}: {e}")
        return _respond(cmd)

    async def get_kvlist_by_namespace(self, conn, cmd: RemotingCommand) -> RemotingCommand:
        namespace = _field(cmd, "namespace")
        table = self.kv.namespace(namespace)
        if table is None:
            return _respond(cmd, ResponseCode.QUERY_NOT_FOUND, f"No config item, Namespace: {namespace}")
        return _respond(cmd, body=fastjson_dumps({"table": table}))
