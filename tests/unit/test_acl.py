"""mq.acl without a broker: the signature, the accounts file, the address patterns and every
rule of the verdict, each shown both allowing and refusing (RocketMQ 4.9's PlainAccessValidator
semantics; tests/compat/test_cpp_client_acl.py runs them against the official client)."""
import base64
import hashlib
import hmac
import json
import os

import pytest

from mq.acl.plain import (DENY, PUB, SUB, AclConfig, AclConfigError, AclDenied, AclFile, AddressPattern,
                          Validator, acl_file_path, check_permission, needed_resources, parse_perm)
from mq.acl.sign import SessionCredentials, load_tools_yml, sign_request, signature, signed_content
from mq.wire.codes import RequestCode as R
from mq.wire.remoting import RemotingCommand

APP = SessionCredentials("appkey01", "appsecret01")
ADMIN = SessionCredentials("adminkey01", "adminsecret01")

ACCOUNTS = """
globalWhiteRemoteAddresses:
  - 10.10.103.*
accounts:
  - accessKey: appkey01
    secretKey: appsecret01
    whiteRemoteAddress: 192.168.7.1-20
    admin: false
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms: [TopicPub=PUB, TopicSub=SUB, TopicBoth=PUB|SUB, TopicDeny=DENY]
    groupPerms: [GroupDeny=DENY, GroupPub=PUB]
  - accessKey: adminkey01
    secretKey: adminsecret01
    admin: true
  - accessKey: adminkey02
    secretKey: adminsecret02
    admin: true
    topicPerms: [TopicPub=PUB]
"""


def validator(text: str = ACCOUNTS) -> Validator:
    return Validator(AclConfig.parse(text))


def request(code: int, ext: dict, body: bytes = b"", creds: SessionCredentials | None = APP) -> RemotingCommand:
    cmd = RemotingCommand(code=code, ext_fields=dict(ext), body=body)
    if creds is not None:
        sign_request(cmd, creds)
    return cmd


def refusal(v: Validator, cmd, ip: str = "127.0.0.1") -> str | None:
    try:
        v.check(cmd, ip)
        return None
    except AclDenied as e:
        return str(e)


def send(topic: str, group: str = "PG", creds=APP, body: bytes = b"hello") -> RemotingCommand:
    return request(R.SEND_MESSAGE_V2, {"a": group, "b": topic, "e": "1", "i": "KEYS\x01k\x02"}, body, creds)


# ---- signature ---------------------------------------------------------------------------------

def test_signature_is_hmac_sha1_of_sorted_values_then_body_in_base64():
    """The content is the values in key order (not insertion order), then the body; the
    signature is standard HMAC-SHA1 in Base64 (computed here independently)."""
    ext = {"b": "2", "a": "1", "AccessKey": "ak", "c": "3"}
    content = signed_content(ext, b"BODY")
    assert content == b"ak123BODY"
    expected = base64.b64encode(hmac.new(b"secret", b"ak123BODY", hashlib.sha1).digest()).decode()
    assert signature(content, "secret") == expected
    assert signed_content({"Signature": "x", "z": "9"}, None) == b"9", "Signature never signs itself"


def test_signed_request_passes_and_any_change_fails():
    """A request signed with the account's secret passes; a changed field, a changed body, a
    wrong secret or a dropped signature each fail the signature check."""
    v = validator()
    assert refusal(v, send("TopicPub")) is None
    tampered = send("TopicPub")
    tampered.ext_fields["e"] = "2"
    assert refusal(v, tampered) == "Check signature failed for accessKey=appkey01"
    other_body = send("TopicPub")
    other_body.body = b"hellO"
    assert refusal(v, other_body) == "Check signature failed for accessKey=appkey01"
    wrong = send("TopicPub", creds=SessionCredentials("appkey01", "not-the-secret"))
    assert refusal(v, wrong) == "Check signature failed for accessKey=appkey01"
    unsigned = send("TopicPub")
    del unsigned.ext_fields["Signature"]
    assert refusal(v, unsigned) == "Check signature failed for accessKey=appkey01"


def test_unique_key_query_field_is_not_signed_by_the_broker():
    """_UNIQUE_KEY_QUERY is left out of the broker's content (RocketMQ's MixAll flag), so a
    client may add it after signing."""
    cmd = request(R.QUERY_MESSAGE, {"topic": "TopicSub", "key": "k", "maxNum": "32"})
    cmd.ext_fields["_UNIQUE_KEY_QUERY"] = "true"
    assert refusal(validator(), cmd) is None


def test_credentials_repr_hides_the_secret():
    assert "appsecret01" not in repr(APP) and "appkey01" in repr(APP)


def test_tools_yml(tmp_path):
    """mqadmin's account: read from tools.yml; a missing file or a blank key means unsigned;
    a file that is not YAML is an error."""
    p = tmp_path / "tools.yml"
    assert load_tools_yml(str(p)) is None
    p.write_text("accessKey: rocketmq2\nsecretKey: 12345678\n")
    assert load_tools_yml(str(p)) == SessionCredentials("rocketmq2", "12345678")
    p.write_text("accessKey: rocketmq2\nsecretKey: ''\n")
    assert load_tools_yml(str(p)) is None
    p.write_text("accessKey: [unclosed\n")
    with pytest.raises(ValueError, match="not YAML"):
        load_tools_yml(str(p))


# ---- the verdict -------------------------------------------------------------------------------

def test_no_access_key_and_unknown_key_are_refused():
    v = validator()
    assert refusal(v, send("TopicPub", creds=None)) == "No accessKey is configured"
    assert refusal(v, RemotingCommand(code=R.SEND_MESSAGE_V2, ext_fields=None)) == "No accessKey is configured"
    stranger = send("TopicPub", creds=SessionCredentials("stranger1", "whatever1"))
    assert refusal(v, stranger) == "No acl config for stranger1"


def test_topic_permissions_listed_and_default():
    """PUB lets a send through and not a pull; SUB the reverse; DENY neither; an unlisted
    topic gets defaultTopicPerm (DENY here)."""
    v = validator()
    assert refusal(v, send("TopicPub")) is None
    assert refusal(v, send("TopicBoth")) is None
    assert refusal(v, send("TopicSub")) == "No default permission for topic:TopicSub"
    assert refusal(v, send("TopicDeny")) == "No default permission for topic:TopicDeny"
    assert refusal(v, send("Unlisted")) == "No default permission for topic:Unlisted"

    def pull(topic, group="CG"):
        return request(R.PULL_MESSAGE, {"consumerGroup": group, "topic": topic, "queueId": "0",
                                        "queueOffset": "0", "maxMsgNums": "32", "sysFlag": "0",
                                        "commitOffset": "0", "suspendTimeoutMillis": "0", "subVersion": "0"})
    assert refusal(v, pull("TopicSub")) is None
    assert refusal(v, pull("TopicBoth")) is None
    assert refusal(v, pull("TopicPub")) == "No default permission for topic:TopicPub"
    assert refusal(v, pull("TopicSub", "GroupDeny")) == "No default permission for group:GroupDeny"
    assert refusal(v, pull("TopicSub", "GroupPub")) == "No default permission for group:GroupPub"


def test_group_permissions_and_retry_topics():
    """A group is checked as %RETRY%<group> with SUB: a send to a retry topic, a send-back, an
    offset commit, a consumer list, an unregister, all need SUB on the group."""
    v = validator()
    assert refusal(v, send("%RETRY%CG", group="CG")) is None, "defaultGroupPerm SUB"
    assert refusal(v, send("%RETRY%GroupDeny", group="GroupDeny")) == "No default permission for group:GroupDeny"
    back = request(R.CONSUMER_SEND_MSG_BACK, {"group": "GroupDeny", "offset": "0", "delayLevel": "0"})
    assert refusal(v, back) == "No default permission for group:GroupDeny"
    commit = request(R.UPDATE_CONSUMER_OFFSET, {"consumerGroup": "CG", "topic": "TopicSub", "queueId": "0",
                                                "commitOffset": "5"})
    assert refusal(v, commit) is None
    commit_pub = request(R.UPDATE_CONSUMER_OFFSET, {"consumerGroup": "CG", "topic": "TopicPub", "queueId": "0",
                                                    "commitOffset": "5"})
    assert refusal(v, commit_pub) == "No default permission for topic:TopicPub"
    assert refusal(v, request(R.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "GroupDeny"})) == \
        "No default permission for group:GroupDeny"
    assert refusal(v, request(R.UNREGISTER_CLIENT, {"clientID": "c", "producerGroup": "PG"})) is None
    assert refusal(v, request(R.UNREGISTER_CLIENT, {"clientID": "c", "consumerGroup": "GroupDeny"})) == \
        "No default permission for group:GroupDeny"


def test_heartbeat_needs_sub_on_each_group_and_subscribed_topic():
    v = validator()

    def hb(group, topic):
        body = json.dumps({"clientID": "c", "producerDataSet": [{"groupName": "PG"}],
                           "consumerDataSet": [{"groupName": group, "subscriptionDataSet": [
                               {"topic": topic, "subString": "*"}]}]}).encode()
        return request(R.HEART_BEAT, {}, body)
    assert refusal(v, hb("CG", "TopicSub")) is None
    assert refusal(v, hb("CG", "TopicPub")) == "No default permission for topic:TopicPub"
    assert refusal(v, hb("GroupDeny", "TopicSub")) == "No default permission for group:GroupDeny"
    assert refusal(v, request(R.HEART_BEAT, {}, b"{not json")).startswith("heartbeat body cannot be read")
    assert refusal(v, request(R.HEART_BEAT, {}, json.dumps({"clientID": "c"}).encode())) is None, "a producer's"


def test_admin_codes_need_an_admin_account():
    """UPDATE_AND_CREATE_TOPIC and the other admin codes: refused for a non-admin with
    RocketMQ's message, allowed for an admin; an admin with no listed permissions may use
    every topic, one with listed permissions is checked like anyone."""
    v = validator()
    create = {"topic": "T1", "defaultTopic": "TBW102", "readQueueNums": "4", "writeQueueNums": "4", "perm": "6"}
    assert refusal(v, request(R.UPDATE_AND_CREATE_TOPIC, create)) == \
        "Need admin permission for request code=17, but accessKey=appkey01 is not"
    for code in (25, R.DELETE_TOPIC_IN_BROKER, R.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, 207):
        assert refusal(v, request(code, {"topic": "T1", "groupName": "G"})).startswith("Need admin permission")
        assert refusal(v, request(code, {"topic": "T1", "groupName": "G"}, creds=ADMIN)) is None
    assert refusal(v, send("Anything", creds=ADMIN)) is None
    admin2 = SessionCredentials("adminkey02", "adminsecret02")
    assert refusal(v, send("TopicPub", creds=admin2)) is None
    assert refusal(v, send("Anything", creds=admin2)) == "No default permission for topic:Anything"
    assert refusal(v, request(R.UPDATE_AND_CREATE_TOPIC, create, creds=admin2)) is None, "no resource to check"


def test_codes_without_resources_need_only_a_valid_signature():
    """Route-free reads such as GET_MAX_OFFSET need a known key and a good signature, nothing more."""
    v = validator()
    assert refusal(v, request(R.GET_MAX_OFFSET, {"topic": "TopicDeny", "queueId": "0"})) is None
    assert refusal(v, request(R.GET_MAX_OFFSET, {"topic": "x", "queueId": "0"}, creds=None)) == \
        "No accessKey is configured"


def test_message_trace_topic_is_always_writable():
    assert refusal(validator(), send("RMQ_SYS_TRACE_TOPIC")) is None


def test_white_addresses_global_and_per_account():
    """A global white address needs no key at all; an account's white address skips the
    signature and the permissions for that account only."""
    v = validator()
    assert refusal(v, send("TopicDeny", creds=None), "10.10.103.77") is None
    assert refusal(v, send("TopicDeny", creds=None), "10.10.104.77") == "No accessKey is configured"
    bad_sig = send("TopicDeny", creds=SessionCredentials("appkey01", "wrong-secret"))
    assert refusal(v, bad_sig, "192.168.7.20") is None
    assert refusal(v, bad_sig, "192.168.7.21") == "Check signature failed for accessKey=appkey01"


def test_missing_required_field_is_refused():
    v = validator()
    assert refusal(v, request(R.PULL_MESSAGE, {"topic": "TopicSub"})) == \
        "request code=11 lacks the field consumerGroup"


# ---- address patterns --------------------------------------------------------------------------

@pytest.mark.parametrize("pattern, yes, no", [
    ("", [], ["127.0.0.1"]),
    ("*", ["1.2.3.4", "::1"], []),
    ("*.*.*.*", ["1.2.3.4"], []),
    ("127.0.0.1", ["127.0.0.1"], ["127.0.0.2"]),
    ("::1", ["::1"], ["127.0.0.1"]),
    ("10.0.0.1,10.0.0.3", ["10.0.0.1", "10.0.0.3"], ["10.0.0.2"]),
    ("192.168.1.{1,2}", ["192.168.1.1", "192.168.1.2"], ["192.168.1.3", "192.168.1.12"]),
    ("192.168.1.*", ["192.168.1.0", "192.168.1.255"], ["192.168.2.1"]),
    ("192.168.*.*", ["192.168.0.1", "192.168.200.9"], ["192.169.0.1"]),
    ("192.168.1.10-20", ["192.168.1.10", "192.168.1.20"], ["192.168.1.9", "192.168.1.21"]),
    ("10.5-6.*.*", ["10.5.1.1", "10.6.255.0"], ["10.7.0.0", "10.4.0.0"]),
])
def test_address_patterns(pattern, yes, no):
    p = AddressPattern(pattern)
    assert all(p.matches(ip) for ip in yes), yes
    assert not any(p.matches(ip) for ip in no), no


@pytest.mark.parametrize("pattern", ["300.1.1.1", "192.168.1.20-10", "192.168.1.-5", "1.2.3", "fe80::1-5:*",
                                     "192.168.{1,2}", "not-an-ip", "*.1.1.1"])
def test_bad_address_patterns_are_refused_at_load(pattern):
    with pytest.raises(AclConfigError):
        AddressPattern(pattern)


# ---- the file ----------------------------------------------------------------------------------

def test_permission_words():
    assert parse_perm("PUB|SUB") == PUB | SUB == parse_perm("SUB|PUB")
    assert parse_perm(None) == DENY == parse_perm("nonsense")
    assert check_permission(SUB, PUB | SUB) and not check_permission(SUB, PUB)
    assert not check_permission(PUB, DENY | PUB), "DENY wins"


@pytest.mark.parametrize("text, error", [
    ("accounts: [ {accessKey: short, secretKey: longsecret1} ]", "longer than 6"),
    ("accounts: [ {accessKey: longkey1, secretKey: 123456} ]", "longer than 6"),
    ("accounts:\n - {accessKey: longkey1, secretKey: longsecret1}\n - {accessKey: longkey1, secretKey: other1234}",
     "appears twice"),
    ("accounts: [ {accessKey: longkey1, secretKey: longsecret1, topicPerms: [t1=READ]} ]", "DENY, PUB, SUB"),
    ("accounts: [ {accessKey: longkey1, secretKey: longsecret1, topicPerms: [t1]} ]", "Resource=Perm"),
    ("accounts: [ {accessKey: longkey1, secretKey: longsecret1, whiteRemoteAddress: 1.2.3.999} ]", "not an IP"),
    ("accounts: {accessKey: x}", "not a list"),
    ("- just\n- a list", "not a mapping"),
    ("accounts: [unclosed", "not YAML"),
    ("", "no accounts data"),
    ("# only a comment\n", "no accounts data"),
])
def test_bad_accounts_files_say_what_is_wrong(text, error):
    with pytest.raises(AclConfigError, match=error):
        AclConfig.parse(text)


def test_numeric_yaml_keys_are_text():
    """secretKey: 12345678 is a YAML integer; like RocketMQ's loader it is the text 12345678."""
    v = validator("accounts: [ {accessKey: RocketMQ, secretKey: 12345678, defaultTopicPerm: PUB} ]")
    assert refusal(v, send("T", creds=SessionCredentials("RocketMQ", "12345678"))) is None


def test_shipped_example_parses():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    cfg = AclConfig.parse(open(os.path.join(root, "conf", "plain_acl.yml")).read())
    assert set(cfg.accounts) == {"RocketMQ", "rocketmq2"} and cfg.accounts["rocketmq2"].admin
    assert load_tools_yml(os.path.join(root, "conf", "tools.yml")).access_key == "rocketmq2"


def test_file_location(tmp_path, monkeypatch):
    """<rocketmqHome>/conf/plain_acl.yml; else $ROCKETMQ_HOME; else the working directory."""
    assert acl_file_path("/opt/rmq") == "/opt/rmq/conf/plain_acl.yml"
    monkeypatch.setenv("ROCKETMQ_HOME", "/srv/rmq")
    assert acl_file_path("") == "/srv/rmq/conf/plain_acl.yml"
    monkeypatch.delenv("ROCKETMQ_HOME")
    monkeypatch.chdir(tmp_path)
    assert acl_file_path("") == str(tmp_path / "conf" / "plain_acl.yml")


def test_file_reload_keeps_last_good_accounts(tmp_path):
    """A missing file refuses to load; a change is picked up by poll(); a broken edit is
    logged and the previous accounts stay in force; a later good edit is picked up again."""
    path = tmp_path / "plain_acl.yml"
    f = AclFile(str(path))
    with pytest.raises(AclConfigError, match="does not exist"):
        f.load()
    path.write_text(ACCOUNTS)
    v = f.load()
    assert f.poll() is False, "unchanged"
    assert refusal(v, send("Unlisted")) is not None
    path.write_text(ACCOUNTS.replace("defaultTopicPerm: DENY", "defaultTopicPerm: PUB"))
    os.utime(path, ns=(1, 1))                  # a new stamp even within the clock's granularity
    assert f.poll() is True and refusal(v, send("Unlisted")) is None
    path.write_text("accounts: [unclosed")
    assert f.poll() is False and refusal(v, send("Unlisted")) is None, "broken edit: old accounts"
    path.unlink()
    assert f.poll() is False and refusal(v, send("Unlisted")) is None, "deleted: old accounts"
    path.write_text(ACCOUNTS)
    assert f.poll() is True and refusal(v, send("Unlisted")) is not None


def test_a_file_caught_mid_write_does_not_take_the_accounts_away(tmp_path):
    """An editor that writes in place truncates the file first: a poll that sees it empty keeps
    the previous accounts (RocketMQ refuses an empty file too), and text that changes while it
    is being read is read again at the next poll, not judged half-written."""
    path = tmp_path / "plain_acl.yml"
    path.write_text(ACCOUNTS)
    f = AclFile(str(path))
    v = f.load()
    path.write_text("")
    assert f.poll() is False and refusal(v, send("Unlisted")) is not None, "empty: old accounts"
    opened = ACCOUNTS.replace("defaultTopicPerm: DENY", "defaultTopicPerm: PUB")
    read = f._read

    def read_while_written():
        got = read()
        path.write_text(opened)                 # the rest of the edit lands after the read
        os.utime(path, ns=(2, 2))
        return got
    path.write_text("accounts: []\n")        # valid on its own: judged, it would refuse everyone
    os.utime(path, ns=(1, 1))
    f._read = read_while_written
    assert f.poll() is False and refusal(v, send("Unlisted")) is not None, "changed while read"
    f._read = read
    assert f.poll() is True and refusal(v, send("Unlisted")) is None, "read again, whole"


def test_needed_resources_for_batches_too():
    """Beyond RocketMQ 4.9 (whose parse skips code 320): a batch send needs PUB like a single one."""
    cmd = send("TopicDeny")
    cmd.code = R.SEND_BATCH_MESSAGE
    assert needed_resources(cmd) == {"TopicDeny": PUB}


# ---- editing the file (ACL admin codes) ---------------------------------------------------------

def test_file_edits_create_update_and_delete_accounts(tmp_path):
    """update_account creates an account, then changes only the fields given; a change that
    would make the file unusable is refused and leaves the file as it was; delete_account
    removes one (an unknown key is an error); update_global_white replaces the list."""
    from mq.acl.plain import delete_account, update_account, update_global_white
    path = str(tmp_path / "plain_acl.yml")
    with open(path, "w") as f:
        f.write(ACCOUNTS)
    update_account(path, {"accessKey": "newkey001", "secretKey": "newsecret01", "defaultTopicPerm": "PUB",
                          "topicPerms": "TopicX=SUB, TopicY=DENY", "admin": "false"})
    v = Validator(AclConfig.parse(open(path).read()))
    new = SessionCredentials("newkey001", "newsecret01")
    assert refusal(v, send("Anything", creds=new)) is None
    assert refusal(v, send("TopicY", creds=new)) == "No default permission for topic:TopicY"
    update_account(path, {"accessKey": "newkey001", "defaultTopicPerm": "DENY"})
    v = Validator(AclConfig.parse(open(path).read()))
    assert refusal(v, send("Anything", creds=new)) == "No default permission for topic:Anything"
    assert v.config.accounts["newkey001"].secret_key == "newsecret01", "fields not given are kept"
    assert refusal(v, send("TopicPub")) is None, "the other accounts are untouched"
    before = open(path).read()
    with pytest.raises(AclConfigError, match="longer than 6"):
        update_account(path, {"accessKey": "short01", "secretKey": "123"})
    with pytest.raises(AclConfigError, match="DENY, PUB, SUB"):
        update_account(path, {"accessKey": "newkey001", "topicPerms": "TopicZ=ALL"})
    assert open(path).read() == before
    delete_account(path, "newkey001")
    assert "newkey001" not in AclConfig.parse(open(path).read()).accounts
    with pytest.raises(AclConfigError, match="no account"):
        delete_account(path, "newkey001")
    update_global_white(path, "127.0.0.1, 10.1.*.*")
    cfg = AclConfig.parse(open(path).read())
    assert [w.text for w in cfg.global_white] == ["127.0.0.1", "10.1.*.*"]
    update_global_white(path, "")
    assert AclConfig.parse(open(path).read()).global_white == []


@pytest.mark.parametrize("code", [R.SEND_MESSAGE, R.SEND_MESSAGE_V2, R.SEND_BATCH_MESSAGE])
@pytest.mark.parametrize("ext", [
    {"a": "PG", "b": "TopicPub", "topic": "TopicDeny", "e": "1"},           # letters and a long topic
    {"producerGroup": "PG", "topic": "TopicDeny", "b": "TopicPub"},
    {"a": "PG", "b": "TopicDeny", "e": "1"},
    {"producerGroup": "PG", "topic": "TopicDeny", "queueId": "1"},
    {"a": "GroupDeny", "b": "%RETRY%GroupDeny", "producerGroup": "PG", "topic": "TopicDeny"},
])
def test_a_send_is_checked_for_the_topic_the_broker_stores_to(code, ext):
    """The ACL reads a send header the way the send path does (mq.wire.headers.send_long_names): a
    header carrying both a letter "b" and a long "topic" names one topic to both, so an account
    cannot pass the check with one topic and store to another."""
    from mq.broker.send import header_fields
    cmd = request(code, ext)
    topic = header_fields(cmd)["topic"]
    assert topic == "TopicDeny"
    assert needed_resources(cmd) == {"TopicDeny": PUB}
    assert refusal(validator(), cmd) == "No default permission for topic:TopicDeny"
