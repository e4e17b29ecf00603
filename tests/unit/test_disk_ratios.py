"""RocketMQ's disk ratios (mq.store.retention.DiskCheck, Retention.due): the keys and their
defaults, the state each usage puts the broker in, the control-block value and the refusal's
remark, and that each change of state is logged once however often the disk is checked."""
import logging
import time

import pytest

from mq.broker.config import BrokerConfig
from mq.store import StoreConfig
from mq.store import control as C
from mq.store.retention import (DiskCheck, DiskUsage, Retention, pack_disk_full, service_not_available_remark,
                                unpack_disk_full)

# deleteWhen: an hour far from now, so a pass is never due by the clock here
NOT_NOW = "%02d" % ((time.localtime().tm_hour + 12) % 24)


class FakeCtl:
    """The one control-block call DiskCheck makes (set), recorded."""

    def __init__(self):
        self.pos = {C.POS_DISK_FULL: 0}
        self.sets = 0

    def set(self, pos, value):
        self.pos[pos] = value
        self.sets += 1

    def get(self, pos):
        return self.pos[pos]


class Disk:
    """usage_fn over a table of used shares: the CommitLog and ConsumeQueue partitions apart."""

    def __init__(self, root):
        self.root = str(root)
        self.cl = self.cq = 0.5

    def __call__(self, path):
        return self.cq if "consumequeue" in path else self.cl


def _config(tmp_path, **kw):
    for d in ("commitlog", "consumequeue", "index"):
        (tmp_path / d).mkdir(exist_ok=True)
    return StoreConfig(storePathRootDir=str(tmp_path), deleteWhen=NOT_NOW, **kw)


def test_keys_defaults_and_validation():
    """The three keys exist with RocketMQ 4.x's defaults (the JVM properties' 0.90 and 0.85, and
    cleanFileForciblyEnable=true), parse from broker.conf text, and out-of-range or non-numeric
    values are refused naming the key (a ratio is a fraction: 90 is not 0.90)."""
    c = StoreConfig()
    assert (c.diskSpaceWarningLevelRatio, c.diskSpaceCleanForciblyRatio, c.cleanFileForciblyEnable) == (0.90, 0.85,
                                                                                                       True)
    b = BrokerConfig({"diskSpaceWarningLevelRatio": "0.8", "diskSpaceCleanForciblyRatio": "0.7",
                      "cleanFileForciblyEnable": "false"})
    s = b.store_config()
    assert (s.diskSpaceWarningLevelRatio, s.diskSpaceCleanForciblyRatio, s.cleanFileForciblyEnable) == (0.8, 0.7,
                                                                                                       False)
    assert "cleanFileForciblyEnable" not in b.unknown_keys
    for key, bad in (("diskSpaceWarningLevelRatio", "90"), ("diskSpaceWarningLevelRatio", "0"),
                     ("diskSpaceCleanForciblyRatio", "abc"), ("diskSpaceCleanForciblyRatio", "-0.5")):
        with pytest.raises(ValueError, match=key):
            BrokerConfig({key: bad})


def test_each_usage_gives_its_state_and_each_change_is_logged_once(tmp_path, caplog):
    """Over diskSpaceCleanForciblyRatio: clean forcibly, sends still taken.  Over
    diskSpaceWarningLevelRatio, on the CommitLog's partition or the ConsumeQueues' alone: full,
    POS_DISK_FULL non-zero and carrying the shares (kept current while full); exactly at a ratio
    is under it (RocketMQ compares with >).  Back under: POS_DISK_FULL 0 again.  Ten checks in
    each state log one line per change of state, none for the checks between."""
    disk = Disk(tmp_path)
    ctl = FakeCtl()
    check = DiskCheck(_config(tmp_path), ctl, usage_fn=disk)
    caplog.set_level(logging.INFO, logger="mq.store.retention")

    def state(cl, cq, times=10):
        disk.cl, disk.cq = cl, cq
        for _ in range(times):
            check.check()
        return check.full, check.forcibly, ctl.get(C.POS_DISK_FULL)

    assert state(0.5, 0.5) == (False, False, 0) and ctl.sets == 0
    assert state(0.85, 0.85) == (False, False, 0)
    assert state(0.87, 0.5) == (False, True, 0)
    assert state(0.90, 0.88) == (False, True, 0)
    full, forcibly, value = state(0.5, 0.93)                    # the ConsumeQueues' partition alone
    assert full and forcibly and unpack_disk_full(value) == DiskUsage(0.5, 0.93, 0.5)
    full, _, value = state(0.96, 0.93, times=1)
    assert full and unpack_disk_full(value) == DiskUsage(0.96, 0.93, 0.96)   # (the index is on CL's here)
    assert state(0.89, 0.5) == (False, True, 0)
    assert state(0.3, 0.3) == (False, False, 0)
    lines = [r.getMessage() for r in caplog.records]
    assert [m.split(":")[0] for m in lines] == ["disk use CL", "disk full", "disk no longer full",
                                               "disk use CL"], lines
    assert "CL:  0.50 CQ:  0.93 INDEX:  0.50 over diskSpaceWarningLevelRatio 0.90" in lines[1]
    assert "at or under diskSpaceCleanForciblyRatio 0.85" in lines[3]


def test_configured_ratios_are_used(tmp_path):
    """The keys move the thresholds: with warning 0.6 and clean-forcibly 0.4, 0.5 cleans forcibly
    and 0.61 is full."""
    disk = Disk(tmp_path)
    check = DiskCheck(_config(tmp_path, diskSpaceWarningLevelRatio="0.6", diskSpaceCleanForciblyRatio="0.4"),
                      usage_fn=disk)
    disk.cl = disk.cq = 0.5
    check.check()
    assert (check.full, check.forcibly) == (False, True)
    disk.cl = 0.61
    check.check()
    assert (check.full, check.forcibly) == (True, True)


def test_refusal_remark_is_rocketmqs():
    """The value io workers read packs the three shares; the remark they answer with is RocketMQ
    4.9's SendMessageProcessor text with its diskUtil() figures (Java's %5.2f)."""
    v = pack_disk_full(DiskUsage(0.9312, 0.95, 0.0))
    assert v != 0 and unpack_disk_full(v) == DiskUsage(0.9312, 0.95, 0.0)
    assert pack_disk_full(DiskUsage(0.0, 0.0, 0.0)) != 0          # full is never 0, whatever the shares
    assert unpack_disk_full(pack_disk_full(DiskUsage(1.0, 1.0, 1.0))) == DiskUsage(1.0, 1.0, 1.0)
    assert service_not_available_remark(v) == (
        "service not available now. It may be caused by one of the following reasons: the broker's disk is full "
        "[CL:  0.93 CQ:  0.95 INDEX:  0.00], messages are put to the slave, message store has been shut down, etc.")


class _Store:
    def __init__(self, config):
        self.config = config


@pytest.mark.parametrize("usage,options,expected", [
    (0.5, {}, (False, False)),                                       # nothing due
    (0.80, {}, (True, False)),                                       # over diskMaxUsedSpaceRatio 75: a pass
    (0.80, {"diskMaxUsedSpaceRatio": 85}, (False, False)),
    (0.87, {"diskMaxUsedSpaceRatio": 95}, (True, True)),             # over 0.85: a pass, ages ignored
    (0.87, {"cleanFileForciblyEnable": "false"}, (True, False)),     # ... unless cleanFileForciblyEnable=false
    (0.70, {"diskSpaceWarningLevelRatio": "0.6"}, (True, True)),     # over the warning ratio: forcibly too
])
def test_retention_due(tmp_path, usage, options, expected):
    """When a retention pass runs and whether it ignores fileReservedTime, per usage and keys."""
    disk = Disk(tmp_path)
    disk.cl = disk.cq = usage
    assert Retention(_Store(_config(tmp_path, **options)), usage_fn=disk).due() == expected
