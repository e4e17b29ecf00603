"""The gateway tier: a broker with its gRPC endpoint (grpcServerPort), driven by the official
RocketMQ 5.x Python client (run from its own venv by client5.py) and by raw gRPC calls."""
import pytest

from mq.cluster import free_port
from tests.gateway.helpers import GatewayCluster

MAX_MESSAGE_BYTES = 64 * 1024          # small, so the size refusal is cheap to reach


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    g = GatewayCluster(str(tmp_path_factory.mktemp("gateway")), maxMessageSize=MAX_MESSAGE_BYTES,
                       metricsPort=free_port(), enablePropertyFilter="true")
    yield g
    g.stop()

