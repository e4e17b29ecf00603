"""The broker's option table: RocketMQ keys and defaults, validation, -p."""
import subprocess
import sys
import os

import pytest

from mq.broker.config import ALL_OPTIONS, BrokerConfig, parse_properties


def test_defaults_follow_rocketmq():
    """Defaults are RocketMQ 4.9's for the keys operators know."""
    c = BrokerConfig()
    assert (c.listenPort, c.brokerClusterName, c.brokerRole, c.flushDiskType) == (10911, "DefaultCluster",
                                                                                   "ASYNC_MASTER", "ASYNC_FLUSH")
    assert (c.defaultTopicQueueNums, c.autoCreateTopicEnable, c.maxMessageSize) == (8, True, 4 * 1024 * 1024)
    assert (c.fast_port, c.ha_port) == (10909, 10912)
    assert c.messageDelayLevel.split()[0] == "1s" and len(c.messageDelayLevel.split()) == 18


@pytest.mark.parametrize("key,value", [("brokerRole", "LEADER"), ("listenPort", "99999"),
                                       ("flushDiskType", "sometimes"), ("autoCreateTopicEnable", "yes"),
                                       ("maxMessageSize", "-1"), ("defaultTopicQueueNums", "abc")])
def test_bad_values_are_refused_with_the_key(key, value):
    """A bad value is refused, naming the key."""
    with pytest.raises(ValueError, match=key):
        BrokerConfig({key: value})


def test_unknown_keys_are_reported_and_slaves_need_an_id():
    """Unknown keys are reported, not fatal; a SLAVE needs brokerId > 0; a master's id is forced to 0."""
    seen = []
    c = BrokerConfig({"noSuchKey": "1", "brokerRole": "SYNC_MASTER", "brokerId": "3"}, warn=seen.append)
    assert c.unknown_keys == ["noSuchKey"] and "noSuchKey" in seen[0]
    assert c.brokerId == 0
    with pytest.raises(ValueError, match="brokerId"):
        BrokerConfig({"brokerRole": "SLAVE", "brokerId": "0"})


def test_properties_parser():
    """java.util.Properties rules: key=value, key: value, comments, blank lines;
    a bare word is a key with an empty value (then reported as an unknown key)."""
    assert parse_properties("# c\n! c\n\na=1\nb : two words\n") == {"a": "1", "b": "two words"}
    assert parse_properties("just-a-word") == {"just-a-word": ""}
    seen = []
    BrokerConfig(parse_properties("just-a-word"), warn=seen.append)
    assert "just-a-word" in seen[0]


def test_mqbroker_p_prints_every_option_and_refuses_bad_files(tmp_path):
    """`mqbroker -c FILE -n ADDR -p` prints the effective config (file and -n
    applied); a bad value exits 2 with the key named."""
    conf = tmp_path / "b.conf"
    conf.write_text("brokerName=broker-z\nlistenPort=20911\n")
    exe = os.path.join(os.path.dirname(sys.executable), "mqbroker")
    out = subprocess.run([exe, "-c", str(conf), "-n", "127.0.0.1:1234", "-p"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    lines = dict(line.split("=", 1) for line in out.stdout.splitlines())
    assert set(lines) == set(ALL_OPTIONS)
    assert lines["brokerName"] == "broker-z" and lines["listenPort"] == "20911"
    assert lines["namesrvAddr"] == "127.0.0.1:1234"
    conf.write_text("flushDiskType=NEVER\n")
    bad = subprocess.run([exe, "-c", str(conf), "-p"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "flushDiskType" in bad.stderr and "Traceback" not in bad.stderr


def test_no_ignored_key_is_a_real_option():
    """A key both in the options table and among the accepted-but-ignored keys would be
    documented as doing nothing while it does something (messageIndexEnable, cleanFileForciblyEnable were)."""
    from mq.broker.config import IGNORED_KEYS
    assert not IGNORED_KEYS & set(ALL_OPTIONS)
