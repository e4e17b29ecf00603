"""`python -m mq.cli.demo_client` (the README's first client) as a subprocess: it round-trips ten
messages, and -h, a missing name server, a bad address and an ACL refusal are each one line (or
argparse's usage) with a non-zero status where it failed, never a traceback."""
import os
import shutil
import socket
import subprocess
import sys

import pytest

from mq import conf
from mq.cluster import Broker, NameServer

from tests.client.clientkit import route_ready, run


def demo(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "NAMESRV_ADDR"}
    r = subprocess.run([sys.executable, "-m", "mq.cli.demo_client", *args], capture_output=True, text=True,
                       timeout=120, env=env)
    assert "Traceback" not in r.stderr + r.stdout, r.stderr
    return r


def test_help_is_usage_not_an_address():
    """-h prints the usage (the name server argument, the ACL options) and exits 0: it is not
    taken for a name server address."""
    r = demo("-h")
    assert r.returncode == 0 and "usage:" in r.stdout and "--access-key" in r.stdout, r.stdout


def test_no_name_server_is_one_line():
    """With nothing listening at the address: one line naming the address and `make run`, status 1."""
    with socket.socket() as s:           # a port certainly closed: bound, never listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        r = demo(f"127.0.0.1:{port}")
    assert r.returncode == 1, r
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and f"no name server answers at 127.0.0.1:{port}" in lines[0] and "make run" in lines[0]


def test_bad_address_is_one_line():
    r = demo("localhost")
    assert r.returncode == 1 and r.stderr.strip() == "demo_client: bad name server address 'localhost': expected host:port"


@pytest.fixture(scope="module")
def acl_cluster(tmp_path_factory):
    """A name server and a broker with aclEnable=true, its accounts a copy of conf/plain_acl.yml."""
    work = str(tmp_path_factory.mktemp("demo_acl"))
    os.makedirs(os.path.join(work, "home", "conf"))
    shutil.copyfile(conf.path("plain_acl.yml"), os.path.join(work, "home", "conf", "plain_acl.yml"))
    ns = NameServer(work)
    try:
        broker = Broker(work, ns.addr, aclEnable="true", rocketmqHome=os.path.join(work, "home"))
    except BaseException:
        ns.stop()
        raise
    try:
        run(route_ready(ns.addr, "TBW102"))
        yield ns
    finally:
        broker.stop()
        ns.stop()


def test_acl_refusal_is_one_line_and_an_account_works(acl_cluster):
    """Against an ACL broker: without an account the refusal (AclException) is one line that says
    how to give one, status 1; with conf/plain_acl.yml's admin account all ten round-trip."""
    r = demo(acl_cluster.addr)
    assert r.returncode == 1, r
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "AclException" in lines[0] and "--access-key" in lines[0], r.stderr
    r = demo(acl_cluster.addr, "--access-key", "rocketmq2", "--secret-key", "12345678")
    assert r.returncode == 0 and "all ten consumed" in r.stdout, r.stdout + r.stderr
