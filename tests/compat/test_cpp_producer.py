"""tests/compat/cpp_producer.py resends only what librocketmq.so never sent: its reading of the
client's log, on the log lines of the two real cases (2026-11-28)."""
import pytest

pytest.importorskip("rocketmq.client", reason="pip install rocketmq==0.4.4 (make test does)")
from tests.compat.cpp_producer import never_sent  # noqa: E402

LOCK = "(error):GetTransport of:127.0.0.1:28202 get timed_mutex timeout[CreateTransport:297]"
NO_MQ = "(error):could not find property mq[selectOneMessageQueue:152]"
ROUTE = "(error):updateTopicRouteInfo: didn't get the session_credentials from any producers and consumers"
REFUSED = "(error):processSendResponse error remark:AclException: No acl config for nobody01, error code:1"
SEND_ERROR = "(error):send error[sendMessageSync:393]"


def attempt(n: int) -> str:
    return f"(error):send failed of times:{n},brokerName:broker-a[sendDefaultImpl:369]"


def test_every_attempt_stopped_at_the_lock_is_never_sent():
    log = [ROUTE, LOCK, attempt(1), NO_MQ, LOCK, attempt(3), NO_MQ, LOCK, attempt(5),
           "(error):msg: No route info of this topic: T,error:-1"]
    assert never_sent("\n".join(log))


@pytest.mark.parametrize("log", [
    [LOCK, attempt(1), NO_MQ, REFUSED, SEND_ERROR, attempt(3)],     # the second attempt reached the broker
    [REFUSED, SEND_ERROR, attempt(1)],                               # refused by the broker
    [LOCK, ROUTE, attempt(1)],                                       # not the attempt's own lookup
    [LOCK],                                                          # no attempt logged at all
    [],
], ids=["one-reached-the-broker", "refused", "another-line-between", "no-attempt", "empty"])
def test_anything_else_is_not(log):
    assert not never_sent("\n".join(log))
