"""Fixtures for mq.client tests (helpers live in tests/client/clientkit.py)."""
import pytest

from tests.client.clientkit import start_cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """One name server and one broker for the whole module; every test uses its own topics/groups."""
    ns, broker = start_cluster(str(tmp_path_factory.mktemp("client")))
    yield ns, broker
    try:
        assert broker.stop() == 0, broker.proc.output()[-5000:]
    finally:
        ns.stop()
