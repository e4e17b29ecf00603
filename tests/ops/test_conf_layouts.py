"""The shipped broker layouts (conf/2m-2s-async, 2m-2s-sync, 2m-noslave) load
with no unknown key, and the brokers of one layout can run on one machine."""
import glob
import os

import pytest

from mq.broker.config import BrokerConfig
from mq.store.config import load_properties_file

CONF = os.path.join(os.path.dirname(__file__), "..", "..", "conf")
LAYOUTS = ["2m-2s-async", "2m-2s-sync", "2m-noslave"]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_layout_loads_and_brokers_do_not_collide(layout):
    """Every file loads with no unknown key; ports (incl. -2 and HA +1) and store
    directories are distinct; each group has one master (id 0) and its slave ids > 0;
    the sync layout's masters are SYNC_MASTER."""
    files = sorted(glob.glob(os.path.join(CONF, layout, "*.properties")))
    assert files
    ports, stores, groups = set(), set(), {}
    for path in files:
        cfg = BrokerConfig(load_properties_file(path))
        assert not cfg.unknown_keys, (path, cfg.unknown_keys)
        for p in (cfg.fast_port, cfg.listenPort, cfg.ha_port):
            assert p not in ports, f"{path}: port {p} used twice"
            ports.add(p)
        assert cfg.storePathRootDir not in stores
        stores.add(cfg.storePathRootDir)
        groups.setdefault(cfg.brokerName, []).append((cfg.brokerId, cfg.brokerRole))
    for name, members in groups.items():
        masters = [m for m in members if m[0] == 0]
        assert len(masters) == 1, name
        assert all(bid > 0 and role == "SLAVE" for bid, role in members if bid != 0)
        if layout == "2m-2s-sync":
            assert masters[0][1] == "SYNC_MASTER"
    assert len(groups) == 2
