"""tests/compat/cpp_push.py, the runner that keeps the C++ PushConsumer in a child process: a
client that aborts in its shutdown is reported as a warning and leaves the test's process
alive; one that died before its shutdown fails the test."""
import os
import signal

import pytest

pytest.importorskip("rocketmq.client", reason="pip install rocketmq==0.4.4 (make test does)")
from mq.cluster import wait_for  # noqa: E402
from tests.compat import cpp_push  # noqa: E402
from tests.compat.test_cpp_client import cluster, produce, uniq  # noqa: E402,F401 (cluster: a fixture)


def test_messages_reach_the_listener_and_an_abort_in_shutdown_is_a_warning(cluster, monkeypatch):
    ns, _ = cluster
    topic = uniq("T_runner")
    produce(ns.addr, topic, 20)
    got = []
    monkeypatch.setenv(cpp_push.ABORT_AFTER_SHUTDOWN_ENV, "1")
    cons = cpp_push.ChildPushConsumer(ns.addr, uniq("CG"), topic, lambda m: got.append(int(m.get_property("seq"))))
    wait_for(lambda: len(got) >= 20, 60, 0.1, "20 messages")
    with pytest.warns(UserWarning, match="aborted in PushConsumer.shutdown"):
        cons.shutdown()
    assert sorted(got) == list(range(20))


def test_a_client_that_died_before_its_shutdown_fails_the_test(cluster):
    ns, _ = cluster
    cons = cpp_push.ChildPushConsumer(ns.addr, uniq("CG"), uniq("T_runner"), lambda m: None)
    os.kill(cons.proc.pid, signal.SIGKILL)
    cons.proc.wait()
    with pytest.raises(AssertionError, match="died before its shutdown"):
        cons.shutdown()
