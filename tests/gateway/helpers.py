"""Helpers of the gateway tier: a name server and a broker with its gRPC endpoint, the official
5.x client run from its own venv (client5.py), and a 4.x reader of what was stored."""
import json
import os
import subprocess
import tempfile

import pytest

from mq.cluster import Broker, NameServer, call, free_port, port_open, wait_for
from mq.wire.codes import RequestCode, ResponseCode

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLIENT5_PYTHON = os.environ.get("MQ_CLIENT5_PYTHON") or os.path.join(ROOT, ".venv-client5", "bin", "python")
RUNNER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "client5.py")
CLIENT5_TIMEOUT_S = 120


def run_client5(request: dict) -> dict:
    """One client5.py run; its JSON answer.  The client logs under $HOME/logs/rocketmq_python: a
    temporary home per run, whose log tail a failure shows.  A missing client venv fails the
    test, saying how to make it."""
    if not os.path.exists(CLIENT5_PYTHON):
        pytest.fail(f"the official 5.x client's venv is missing ({CLIENT5_PYTHON}): `make test` creates it "
                    f"(or: python3 -m venv .venv-client5 && .venv-client5/bin/pip install rocketmq-python-client==5.1.2)")
    with tempfile.TemporaryDirectory(prefix="client5-") as home:
        p = subprocess.run([CLIENT5_PYTHON, RUNNER, json.dumps(request)], capture_output=True, text=True,
                           timeout=CLIENT5_TIMEOUT_S, env=dict(os.environ, HOME=home))
        if p.returncode != 0:
            log = os.path.join(home, "logs", "rocketmq_python", "rocketmq_client.log")
            tail = open(log).read()[-4000:] if os.path.exists(log) else "(no client log)"
            pytest.fail(f"client5.py failed ({p.returncode}):\n{p.stderr[-4000:]}\nclient log:\n{tail}")
    return json.loads(p.stdout.strip().splitlines()[-1])


class GatewayCluster:
    def __init__(self, workdir: str, **broker_options):
        self.ns = NameServer(workdir)
        self.grpc_port = free_port()
        self.broker = None
        try:
            self.broker = Broker(workdir, self.ns.addr, grpcServerPort=self.grpc_port, **broker_options)
            assert port_open(self.grpc_port), "the broker said it serves before its gRPC endpoint listens"
        except BaseException:
            self.stop()
            raise

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def create_topic(self, topic: str, queues: int = 4) -> None:
        r = call(self.broker.addr, RequestCode.UPDATE_AND_CREATE_TOPIC,
                 {"topic": topic, "defaultTopic": "TBW102", "readQueueNums": queues, "writeQueueNums": queues,
                  "perm": 6, "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0, "order": False})
        assert r.code == ResponseCode.SUCCESS, r.remark
        def routed():
            r = call(self.ns.addr, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
            return r.code == ResponseCode.SUCCESS
        wait_for(routed, 30, what=f"{topic}'s route")

    def stop(self) -> None:
        if self.broker is not None:
            self.broker.stop()
        self.ns.stop()



def messages_of_topic(cluster: GatewayCluster, topic: str):
    """Every message of topic, as a 4.x tool reads them (pulled queue by queue, in offset order);
    none for a topic the name server does not know."""
    import asyncio
    from mq.client.admin import AdminClient

    from mq.client.errors import MQBrokerError

    async def go():
        async with AdminClient(cluster.ns.addr) as admin:
            try:
                return [m async for m in admin.messages_from(topic, offset=0)]
            except MQBrokerError as e:
                if e.code == ResponseCode.TOPIC_NOT_EXIST:
                    return []
                raise
    return asyncio.run(go())


def create_group(cluster: GatewayCluster, group: str, **config) -> None:
    """UPDATE_AND_CREATE_SUBSCRIPTIONGROUP on the broker (retryMaxTimes=... and so on)."""
    import json as _json
    body = {"groupName": group, "consumeEnable": True, "consumeFromMinEnable": True, "consumeBroadcastEnable": True,
            "retryQueueNums": 1, "retryMaxTimes": 16, "brokerId": 0, "whichBrokerWhenConsumeSlowly": 1,
            "notifyConsumerIdsChangedEnable": True, **config}
    r = call(cluster.broker.addr, RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=_json.dumps(body).encode())
    assert r.code == ResponseCode.SUCCESS, r.remark


def produce5(cluster: GatewayCluster, topic: str, specs: list[dict]) -> list[str]:
    """The official 5.x producer sends `specs` (client5.py's message form); their message ids."""
    out = run_client5({"op": "produce", "endpoint": cluster.endpoint, "topic": topic, "messages": specs})
    ids = [r.get("message_id") for r in out["sent"]]
    assert all(ids), out["sent"]
    return ids


def wait_messages(cluster: GatewayCluster, topic: str, n: int, timeout_s: float = 15.0) -> list:
    """messages_of_topic once it holds n messages (the consume queue is built by the dispatch
    role after the send's answer, as in RocketMQ: a read right after a send may miss it)."""
    found: list = []

    def enough() -> bool:
        found[:] = messages_of_topic(cluster, topic)
        return len(found) >= n
    wait_for(enough, timeout_s, what=f"{n} messages in {topic}")
    return found
