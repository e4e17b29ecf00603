"""ACL for 5.x clients (aclEnable=true): the broker's plain_acl.yml accounts, the client's
`authorization` header (HMAC-SHA1 over x-mq-date-time) checked, then the account's permissions
on the topic and group; UNAUTHORIZED and FORBIDDEN in the answer, the official client's sends
and receives going through with the right account."""
import asyncio
import hashlib
import hmac
import os
import time

import grpc
import pytest

from mq.acl.sign import SessionCredentials
from mq.cluster import wait_for
from mq.remoting import RemotingClient
from mq.wire.codes import RequestCode, ResponseCode
from mq.wire.grpc5 import METHODS, SERVICE, Code, MessageType, msg

from tests.gateway.helpers import GatewayCluster, run_client5

ACCOUNTS = """
globalWhiteRemoteAddresses: []
accounts:
  - accessKey: producer5
    secretKey: "secret-p5"
    admin: false
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms: [ A5Topic=PUB ]
  - accessKey: consumer5
    secretKey: "secret-c5"
    admin: false
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms: [ A5Topic=SUB ]
    groupPerms: [ A5Group=SUB ]
  - accessKey: admin555
    secretKey: "secret-admin"
    admin: true
"""
ADMIN = SessionCredentials("admin555", "secret-admin")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    home = tmp_path_factory.mktemp("acl5-home")
    os.makedirs(home / "conf")
    (home / "conf" / "plain_acl.yml").write_text(ACCOUNTS)
    g = GatewayCluster(str(tmp_path_factory.mktemp("acl5")), aclEnable="true", rocketmqHome=str(home))

    async def create():
        c = RemotingClient(credentials=ADMIN)
        try:
            r = await c.invoke(g.broker.addr, c.request(RequestCode.UPDATE_AND_CREATE_TOPIC, {
                "topic": "A5Topic", "readQueueNums": 4, "writeQueueNums": 4, "perm": 6}))
            assert r.code == ResponseCode.SUCCESS, r.remark
        finally:
            await c.close()
    try:
        asyncio.run(create())
        wait_for(lambda: "message_id" in run_client5({"op": "produce", "endpoint": g.endpoint, "topic": "A5Topic",
                                                      "ak": "producer5", "sk": "secret-p5",
                                                      "messages": [{"body": "probe"}]})["sent"][0],
                 30, 1.0, "the topic routed and writable")
    except BaseException:
        g.stop()
        raise
    yield g
    g.stop()


def signed(ak: str, sk: str) -> tuple:
    date = time.strftime("%Y%m%dT%H%M%SZ")
    sig = hmac.new(sk.encode(), date.encode(), hashlib.sha1).hexdigest()
    return (("x-mq-client-id", "acltest@1@0@x"), ("x-mq-date-time", date),
            ("authorization", f"MQv2-HMAC-SHA1 Credential={ak}, SignedHeaders=x-mq-date-time, Signature={sig}"))


def call(cluster, name: str, request, metadata):
    with grpc.insecure_channel(cluster.endpoint) as ch:
        fn = ch.unary_unary(f"/{SERVICE}/{name}", request_serializer=lambda m: m.SerializeToString(),
                            response_deserializer=msg(METHODS[name][1]).FromString)
        return fn(request, metadata=metadata, timeout=10)


def send_request(topic: str):
    m = msg("Message")(body=b"acl")
    m.topic.name = topic
    m.system_properties.message_id = os.urandom(8).hex().upper()
    m.system_properties.message_type = MessageType.NORMAL
    return msg("SendMessageRequest")(messages=[m])


def route_request(topic: str):
    r = msg("QueryRouteRequest")()
    r.topic.name = topic
    return r


def test_the_right_accounts_send_and_receive(cluster):
    out = run_client5({"op": "produce", "endpoint": cluster.endpoint, "topic": "A5Topic", "ak": "producer5",
                       "sk": "secret-p5", "messages": [{"body": f"a{i}"} for i in range(5)]})
    ids = [r.get("message_id") for r in out["sent"]]
    assert all(ids), out
    got = run_client5({"op": "receive", "endpoint": cluster.endpoint, "group": "A5Group", "topic": "A5Topic",
                       "ak": "consumer5", "sk": "secret-c5", "want": 6, "timeout_s": 30})
    assert not got["errors"], got["errors"]
    assert set(ids) <= {m["message_id"] for m in got["received"]}


def test_no_header_a_wrong_secret_or_an_unknown_account_is_unauthorized(cluster):
    for metadata in ((("x-mq-client-id", "acltest@1@0@x"),), signed("producer5", "not-the-secret"),
                     signed("nobody123", "secret-p5")):
        r = call(cluster, "QueryRoute", route_request("A5Topic"), metadata)
        assert r.status.code == Code.UNAUTHORIZED, r.status
    out = run_client5({"op": "produce", "endpoint": cluster.endpoint, "topic": "A5Topic", "ak": "producer5",
                       "sk": "wrong", "messages": [{"body": "x"}]})
    assert "error" in out["sent"][0]


def test_an_account_without_the_permission_is_forbidden(cluster):
    r = call(cluster, "SendMessage", send_request("A5Topic"), signed("consumer5", "secret-c5"))
    assert r.status.code == Code.FORBIDDEN and "A5Topic" in r.status.message
    assert call(cluster, "SendMessage", send_request("A5Topic"), signed("producer5", "secret-p5")).status.code \
        == Code.OK
    ack = msg("AckMessageRequest")()
    ack.group.name, ack.topic.name = "OtherGroup", "A5Topic"
    ack.entries.add(message_id="x", receipt_handle="y")
    r = call(cluster, "AckMessage", ack, signed("consumer5", "secret-c5"))
    assert r.status.code == Code.FORBIDDEN and "OtherGroup" in r.status.message
