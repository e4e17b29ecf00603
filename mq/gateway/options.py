"""GatewayOptions: what the gateway needs of its broker's configuration.  A module of its own,
free of grpc and protobuf, because the broker's supervisor builds it (and the launcher, which
forks the role, must not import grpc: it starts threads)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GatewayOptions:
    """What the gateway needs of its broker's configuration (the supervisor builds it)."""
    listen_address: str             # listenAddress: the gRPC port binds here
    grpc_port: int                  # grpcServerPort
    advertised_host: str            # brokerIP1: the host QueryRoute gives for this broker's endpoint
    broker_addr: str                # brokerIP1:listenPort, the broker's 4.x address
    broker_name: str
    namesrv_addr: str               # namesrvAddr, ';'-separated
    max_message_bytes: int          # maxMessageSize
    cluster: str                    # brokerClusterName (the revive topic is rmq_sys_REVIVE_LOG_<cluster>)
    store_root: str = ""            # storePathRootDir: the stats block the metrics read is found from it
    acl_enable: bool = False        # aclEnable: 5.x clients are checked against plain_acl.yml (mq.gateway.auth)
    rocketmq_home: str = ""         # rocketmqHome: where conf/plain_acl.yml and conf/tools.yml are

    @classmethod
    def of(cls, cfg) -> "GatewayOptions":
        """From a BrokerConfig."""
        return cls(cfg.listenAddress, cfg.grpcServerPort, cfg.brokerIP1, cfg.broker_addr, cfg.brokerName,
                   cfg.namesrvAddr, cfg.maxMessageSize, cfg.brokerClusterName,
                   cfg.storePathRootDir, cfg.aclEnable, cfg.rocketmqHome)
