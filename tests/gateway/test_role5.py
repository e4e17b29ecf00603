"""The gateway as a role of the broker: a process of its own, restarted when it dies, gone when
the broker stops; the broker's 4.x port serves on while it is down."""
import os
import signal

from mq.cluster import call, port_open, wait_for
from mq.wire.codes import RequestCode, ResponseCode

from tests.gateway.helpers import run_client5


def test_a_killed_gateway_role_is_restarted_and_serves_again(gateway):
    gateway.create_topic("G5Role")
    (pid,) = gateway.broker.processes()["grpc"]
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: gateway.broker.processes().get("grpc", [pid]) != [pid], 30, what="a new grpc role")
    # the 4.x path never depended on it
    assert call(gateway.broker.addr, RequestCode.GET_BROKER_RUNTIME_INFO).code == ResponseCode.SUCCESS
    wait_for(lambda: port_open(gateway.grpc_port), 30, what="the gRPC port again")
    out = run_client5({"op": "produce", "endpoint": gateway.endpoint, "topic": "G5Role",
                       "messages": [{"body": "after the restart"}]})
    assert "message_id" in out["sent"][0], out


def test_the_broker_serves_once_its_grpc_endpoint_listens_and_its_stop_takes_the_role_with_it(tmp_path):
    """The broker's "serving" line (what Broker.start waits for; systemd's READY comes with it)
    comes once the gRPC port listens: a 5.x client started then is not refused (grpc would back
    off for seconds), also after a kill -9 and a restart."""
    from tests.gateway.helpers import GatewayCluster
    g = GatewayCluster(str(tmp_path))
    try:
        assert len(g.broker.processes()["grpc"]) == 1
        g.broker.kill()
        g.broker.start()
        assert port_open(g.grpc_port)
    finally:
        g.stop()
    assert not port_open(g.grpc_port)
