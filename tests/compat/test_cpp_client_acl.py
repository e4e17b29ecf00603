"""ACL against real processes: mqnamesrv, mqbroker with aclEnable=true and its accounts in
<rocketmqHome>/conf/plain_acl.yml, the official C++ client (librocketmq.so, unmodified) with
set_session_credentials, our signed RemotingClient, and mqadmin with conf/tools.yml.

Proves: the official client's signature is accepted and its produce/consume works with
credentials; a wrong secret, an unknown key or no credentials is refused and nothing is stored;
a missing permission is answered SYSTEM_ERROR with RocketMQ's reason; the file is reloaded when
it changes; the name server stays open; a broker does not start without its accounts file."""
import asyncio
import itertools
import os
import subprocess
import threading
import time

import pytest

rocketmq = pytest.importorskip("rocketmq.client", reason="pip install rocketmq==0.4.4 (make test does)")
from rocketmq.client import Message, PullConsumer  # noqa: E402

from mq.acl.sign import SessionCredentials  # noqa: E402
from mq.client.admin import AdminClient, TopicConfig  # noqa: E402
from mq.cluster import BIN, Broker, NameServer, wait_for  # noqa: E402
from mq.client.errors import MQBrokerError  # noqa: E402
from mq.remoting import RemotingClient, RequestCode as R, ResponseCode as RC  # noqa: E402
from tests.compat.cpp_producer import Producer  # noqa: E402
from tests.compat.cpp_push import ChildPushConsumer  # noqa: E402

APP = SessionCredentials("appkey01", "appsecret01")
ADMIN = SessionCredentials("adminkey01", "adminsecret01")
TOPICS = ("AclTopic", "AclPubOnly", "AclDenied", "AclLater")
ACCOUNTS = """
accounts:
  - accessKey: appkey01
    secretKey: appsecret01
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms: [AclTopic=PUB|SUB, AclPubOnly=PUB]
    groupPerms: [GroupDeny=DENY]
  - accessKey: adminkey01
    secretKey: adminsecret01
    admin: true
"""
_ids = itertools.count()


def uniq(prefix: str) -> str:
    return f"{prefix}_{int(time.time() * 1000) % 10 ** 8}_{next(_ids)}"


def run(coro):
    return asyncio.run(coro)


async def admin_call(ns_addr: str, fn, creds=ADMIN):
    a = AdminClient(ns_addr, credentials=creds)
    try:
        return await fn(a)
    finally:
        await a.close()


def stored(ns_addr: str, topic: str) -> int:
    """Messages in the topic's queues (sum of max offsets), asked with the admin account."""
    rows = run(admin_call(ns_addr, lambda a: a.topic_status(topic)))
    return sum(int(r["maxOffset"]) for r in rows)


def send_ext(topic: str) -> dict:
    return {"a": "PG", "b": topic, "c": "TBW102", "d": 4, "e": 0, "f": 0, "g": int(time.time() * 1000), "h": 0,
            "i": "", "j": 0, "k": False, "m": False}


def stored_after_sentinel(ns_addr: str, broker_addr: str, topic: str, before: int) -> int:
    """The topic's message count once one more message, sent with the admin account after the
    requests under test, is dispatched.  Dispatch follows CommitLog order, so a refused request
    that had been stored anyway would be counted too: the answer is before + 1 exactly when
    nothing else was stored."""
    r = run(invoke(broker_addr, R.SEND_MESSAGE_V2, send_ext(topic), b"sentinel", creds=ADMIN))
    assert r.code == 0, r.remark
    wait_for(lambda: stored(ns_addr, topic) > before, 10, 0.05, "the sentinel dispatched")
    return stored(ns_addr, topic)


async def invoke(addr: str, code: int, ext: dict, body: bytes = b"", creds=APP):
    c = RemotingClient(credentials=creds)
    try:
        return await c.invoke(addr, c.request(code, ext, body), 5)
    finally:
        await c.close()


def _routed(ns_addr: str, topic: str) -> bool:
    try:
        return bool(run(admin_call(ns_addr, lambda a: a.topic_route(topic))))
    except MQBrokerError as e:
        if e.code != RC.TOPIC_NOT_EXIST:
            raise
        return False


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    work = str(tmp_path_factory.mktemp("acl"))
    home = os.path.join(work, "home")
    os.makedirs(os.path.join(home, "conf"))
    acl_path = os.path.join(home, "conf", "plain_acl.yml")
    with open(acl_path, "w") as f:
        f.write(ACCOUNTS)
    ns = NameServer(work)
    broker = None
    try:
        broker = Broker(work, ns.addr, aclEnable="true", rocketmqHome=home)
        for t in TOPICS:
            run(admin_call(ns.addr, lambda a, t=t: a.create_topic(TopicConfig(t, 4, 4), broker_addr=broker.addr)))
        # the broker registers a new topic with the name server after it answered the creation:
        # until then a route query is answered TOPIC_NOT_EXIST (17), which is "not yet" here
        wait_for(lambda: all(_routed(ns.addr, t) for t in TOPICS), 30, 0.3, "routes of the ACL topics")
    except BaseException:
        if broker is not None:
            broker.stop()
        ns.stop()
        raise
    yield ns, broker, acl_path
    assert broker.stop() == 0, broker.proc.output()[-5000:]
    ns.stop()


def cpp_producer(ns_addr: str, creds: SessionCredentials | None) -> Producer:
    p = Producer(uniq("PG_acl"))
    p.set_namesrv_addr(ns_addr)
    if creds is not None:
        p.set_session_credentials(creds.access_key, creds.secret_key, "ALIYUN")
    p.start()
    return p


def test_cpp_client_with_credentials_produces_and_consumes(cluster):
    """The official producer signs 40 sends to a PUB|SUB topic: all SEND_OK.  A push consumer
    with the same account (its heartbeat names the group and subscription, its pulls and offset
    commits are signed) gets all 40, and a pull consumer walks them again."""
    ns, broker, _ = cluster
    before = stored(ns.addr, "AclTopic")
    prod = cpp_producer(ns.addr, APP)
    try:
        for i in range(40):
            m = Message("AclTopic")
            m.set_keys(f"k{i}")
            m.set_tags("T")
            m.set_body(f"acl-{i}")
            assert prod.send_sync(m).status == 0
    finally:
        prod.shutdown()
    wait_for(lambda: stored(ns.addr, "AclTopic") >= before + 40, 10, 0.05, "the sends dispatched")

    got, lock = set(), threading.Lock()

    def on_message(msg):
        with lock:
            got.add(msg.body.decode())

    pc = ChildPushConsumer(ns.addr, uniq("CG_acl"), "AclTopic", on_message,
                           credentials=(APP.access_key, APP.secret_key, "ALIYUN"))
    try:
        wait_for(lambda: {f"acl-{i}" for i in range(40)} <= got, 60, 0.2, "the push consumer's messages")
    finally:
        pc.shutdown()

    pull = PullConsumer(uniq("CG_acl_pull"))
    pull.set_namesrv_addr(ns.addr)
    pull.set_session_credentials(APP.access_key, APP.secret_key, "ALIYUN")
    pull.start()
    try:
        pulled = {m.body.decode() for m in pull.pull("AclTopic")}
    finally:
        pull.shutdown()
    assert {f"acl-{i}" for i in range(40)} <= pulled
    assert "ACL refused" not in broker.proc.output(), "nothing of the good account was refused"


@pytest.mark.parametrize("creds, reason", [
    (SessionCredentials("appkey01", "wrong-secret"), "Check signature failed for accessKey=appkey01"),
    (SessionCredentials("nobody01", "appsecret01"), "No acl config for nobody01"),
    (None, "No acl config for "),           # the C++ client always sends AccessKey, empty without credentials
])
def test_cpp_client_refused_and_nothing_stored(cluster, creds, reason):
    """A wrong secret, an unknown key and no credentials at all: the official producer's send
    fails, the broker logs why, and the topic holds not one message more."""
    ns, broker, _ = cluster
    before = stored(ns.addr, "AclTopic")
    prod = cpp_producer(ns.addr, creds)
    try:
        m = Message("AclTopic")
        m.set_body("must not be stored")
        with pytest.raises(Exception):
            prod.send_sync(m)
    finally:
        prod.shutdown()
    assert stored_after_sentinel(ns.addr, broker.addr, "AclTopic", before) == before + 1
    wait_for(lambda: reason in broker.proc.output(), 5, 0.1, f"the refusal logged: {reason}")


def test_missing_permission_answers_system_error_with_the_reason(cluster):
    """With a good signature: a send to a DENY topic, a pull from a PUB-only topic, a pull in a
    DENY group and a topic creation by a non-admin are each answered SYSTEM_ERROR (1, as
    RocketMQ 4.9's remoting layer answers its ACL hook's exception) with the reason; nothing is
    stored.  The same send with the admin account is accepted (the sentinel)."""
    ns, broker, _ = cluster
    before = stored(ns.addr, "AclDenied")
    r = run(invoke(broker.addr, R.SEND_MESSAGE_V2, send_ext("AclDenied"), b"x"))
    assert (r.code, r.remark) == (1, "AclException: No default permission for topic:AclDenied")

    pull_ext = {"consumerGroup": "CG", "topic": "AclPubOnly", "queueId": 0, "queueOffset": 0, "maxMsgNums": 32,
                "sysFlag": 0, "commitOffset": 0, "suspendTimeoutMillis": 0, "subscription": "*", "subVersion": 0}
    r = run(invoke(broker.addr, R.PULL_MESSAGE, pull_ext))
    assert (r.code, r.remark) == (1, "AclException: No default permission for topic:AclPubOnly")
    r = run(invoke(broker.addr, R.PULL_MESSAGE, {**pull_ext, "topic": "AclTopic", "consumerGroup": "GroupDeny"}))
    assert (r.code, r.remark) == (1, "AclException: No default permission for group:GroupDeny")

    create = {"topic": "AclNew", "defaultTopic": "TBW102", "readQueueNums": 4, "writeQueueNums": 4, "perm": 6,
              "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0, "order": False}
    r = run(invoke(broker.addr, R.UPDATE_AND_CREATE_TOPIC, create))
    assert (r.code, r.remark) == (1, "AclException: Need admin permission for request code=17, "
                                     "but accessKey=appkey01 is not")

    assert stored_after_sentinel(ns.addr, broker.addr, "AclDenied", before) == before + 1, \
        "the admin's send is accepted, the refused one was not stored"


def test_accounts_file_is_reloaded_when_it_changes(cluster):
    """Granting PUB on a topic in plain_acl.yml takes effect without a restart (every io
    worker polls the file); a broken edit leaves the previous accounts in force."""
    ns, broker, acl_path = cluster
    ext = send_ext("AclLater")
    assert run(invoke(broker.addr, R.SEND_MESSAGE_V2, ext, b"x")).code == 1
    original = open(acl_path).read()
    try:
        with open(acl_path + ".tmp", "w") as f:
            f.write(original.replace("AclPubOnly=PUB]", "AclPubOnly=PUB, AclLater=PUB]"))
        os.replace(acl_path + ".tmp", acl_path)
        # two io workers, each with its own copy: every connection (a new one per call) must pass
        wait_for(lambda: all(run(invoke(broker.addr, R.SEND_MESSAGE_V2, ext, b"x")).code == 0 for _ in range(6)),
                 10, 0.2, "the new permission in force")
        with open(acl_path, "w") as f:
            f.write("accounts: [unclosed")
        wait_for(lambda: broker.proc.output().count("the previous accounts stay in force") >= 1, 10, 0.2,
                 "the broken edit noticed")
        assert all(run(invoke(broker.addr, R.SEND_MESSAGE_V2, ext, b"x")).code == 0 for _ in range(6))
    finally:
        with open(acl_path, "w") as f:
            f.write(original)
    wait_for(lambda: all(run(invoke(broker.addr, R.SEND_MESSAGE_V2, ext, b"x")).code == 1 for _ in range(6)),
             10, 0.2, "the permission taken back")


def test_name_server_stays_open(cluster):
    """As in RocketMQ: the name server checks no signature (a route query without credentials)."""
    ns, _, _ = cluster
    r = run(invoke(ns.addr, R.GET_ROUTEINFO_BY_TOPIC, {"topic": "AclTopic"}, creds=None))
    assert r.code == 0 and b"brokerDatas" in r.body


def test_mqadmin_signs_with_tools_yml(cluster, tmp_path):
    """mqadmin updateTopic reads $ROCKETMQ_HOME/conf/tools.yml: with the admin account it
    creates the topic; with the application account it is refused with the reason; without
    the file it is refused for lack of a key."""
    ns, broker, _ = cluster
    home = tmp_path / "tools-home"
    (home / "conf").mkdir(parents=True)

    def mqadmin(creds):
        tools = home / "conf" / "tools.yml"
        if creds is None:
            tools.unlink(missing_ok=True)
        else:
            tools.write_text(f"accessKey: {creds.access_key}\nsecretKey: {creds.secret_key}\n")
        return subprocess.run([os.path.join(BIN, "mqadmin"), "updateTopic", "-n", ns.addr, "-b", broker.addr,
                               "-t", "AclByTool"], capture_output=True, text=True, timeout=60,
                              env={**os.environ, "ROCKETMQ_HOME": str(home)})
    p = mqadmin(APP)
    assert p.returncode == 1 and "Need admin permission" in p.stderr, p.stderr
    p = mqadmin(None)
    assert p.returncode == 1 and "No accessKey is configured" in p.stderr, p.stderr
    p = mqadmin(ADMIN)
    assert p.returncode == 0, p.stderr


def test_mqadmin_edits_the_accounts(cluster, tmp_path):
    """updateAclConfig (code 50) creates an account that can send at once; the same command
    from a non-admin account is refused; updateGlobalWhiteAddr (53) lets unsigned requests from
    127.0.0.1 through and back out; deleteAclConfig (51) removes the account.  The file is
    restored afterwards."""
    ns, broker, acl_path = cluster
    original = open(acl_path).read()
    home = tmp_path / "tools-home"
    (home / "conf").mkdir(parents=True)

    def mqadmin(creds, *args):
        (home / "conf" / "tools.yml").write_text(f"accessKey: {creds.access_key}\nsecretKey: {creds.secret_key}\n")
        return subprocess.run([os.path.join(BIN, "mqadmin"), *args, "-n", ns.addr, "-b", broker.addr],
                              capture_output=True, text=True, timeout=60, env={**os.environ, "ROCKETMQ_HOME": str(home)})
    new = SessionCredentials("newkey001", "newsecret01")

    def sends_with(creds) -> int:
        return run(invoke(broker.addr, R.SEND_MESSAGE_V2, send_ext("AclTopic"), b"x", creds=creds)).code
    try:
        p = mqadmin(APP, "updateAclConfig", "-a", "newkey001", "-s", "newsecret01", "-t", "AclTopic=PUB")
        assert p.returncode == 1 and "Need admin permission for request code=50" in p.stderr, p.stderr
        p = mqadmin(ADMIN, "updateAclConfig", "-a", "newkey001", "-s", "newsecret01", "-t", "AclTopic=PUB")
        assert p.returncode == 0 and "success" in p.stdout, p.stderr
        wait_for(lambda: all(sends_with(new) == 0 for _ in range(6)), 10, 0.2, "the new account in every worker")
        p = mqadmin(ADMIN, "updateAclConfig", "-a", "newkey001", "-s", "123")
        assert p.returncode == 1 and "longer than 6" in p.stderr, p.stderr
        assert sends_with(None) == 1
        p = mqadmin(ADMIN, "updateGlobalWhiteAddr", "-g", "127.0.0.1")
        assert p.returncode == 0, p.stderr
        wait_for(lambda: all(sends_with(None) == 0 for _ in range(6)), 10, 0.2, "127.0.0.1 white")
        assert mqadmin(ADMIN, "updateGlobalWhiteAddr", "-g", "").returncode == 0
        p = mqadmin(ADMIN, "deleteAclConfig", "-a", "newkey001")
        assert p.returncode == 0, p.stderr
        wait_for(lambda: all(sends_with(new) == 1 and sends_with(None) == 1 for _ in range(6)), 10, 0.2,
                 "the account and the white address gone")
    finally:
        with open(acl_path, "w") as f:
            f.write(original)


def test_broker_does_not_start_without_its_accounts_file(tmp_path):
    """aclEnable=true and no plain_acl.yml (or one that cannot be used): mqbroker exits 2 at
    once, naming the file, instead of serving with no accounts."""
    conf = tmp_path / "broker.conf"
    conf.write_text(f"aclEnable=true\nrocketmqHome={tmp_path}\nstorePathRootDir={tmp_path}/store\n"
                    f"listenPort=10911\nnamesrvAddr=127.0.0.1:1\n")
    p = subprocess.run([os.path.join(BIN, "mqbroker"), "-c", str(conf)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and f"{tmp_path}/conf/plain_acl.yml does not exist" in p.stderr, p.stderr
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "plain_acl.yml").write_text("accounts: [ {accessKey: short, secretKey: x} ]")
    p = subprocess.run([os.path.join(BIN, "mqbroker"), "-c", str(conf)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "longer than 6" in p.stderr, p.stderr
