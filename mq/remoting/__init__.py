"""Remoting: RocketMQ's RPC over TCP (frame codec in mq.wire.remoting)."""
from mq.wire.codes import RequestCode, ResponseCode
from .server import RemotingServer, Connection, make_response
from .client import RemotingClient, RemotingError, RemotingTimeout, RemotingConnectError

__all__ = ["RequestCode", "ResponseCode", "RemotingServer", "Connection", "make_response",
           "RemotingClient", "RemotingError", "RemotingTimeout", "RemotingConnectError"]
