"""Name server (spec sections 2.1 and 9): the route registry brokers register
with and clients ask for topic routes.  Name servers never talk to each other.

    config.py     NAMESRV_OPTIONS / NamesrvConfig, Java properties parsing
    bodies.py     request/response bodies in fastjson's shapes
    routeinfo.py  RouteInfoManager: the in-memory tables and their rules
    kvconfig.py   KVConfigManager: the persisted KV table (kvConfig.json)
    server.py     NameServer: request code -> handler, expiry scan, housekeeping
"""
from .config import NAMESRV_OPTIONS, NamesrvConfig
from .routeinfo import RouteInfoManager
from .kvconfig import KVConfigManager
from .server import NameServer

__all__ = ["NAMESRV_OPTIONS", "NamesrvConfig", "RouteInfoManager", "KVConfigManager", "NameServer"]
