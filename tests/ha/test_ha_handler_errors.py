"""The HA links' rule for a failure inside the code that handles what a peer sent (not a protocol
violation: a bug, or a local fault such as a truncation that fails): it closes that one
connection with a log line and leaves nothing behind for the next connection -- each
connection's read buffer is its own and goes with it.  Real TCP on 127.0.0.1, real stores."""
import logging
import socket

import pytest

from mq.cluster import wait_for
from mq.ha import HAMaster, HASlave
from mq.ha.master import SlaveConnection
from mq.store import control as C
from mq.wire import ha as W

from hakit import FAST, SLAVE_FAST, fill, log_bytes, raw_connect, recv_exact, wait_closed, wait_same


@pytest.fixture
def started():
    nodes = []
    yield nodes
    for n in reversed(nodes):
        n.stop()


def test_a_master_handler_error_closes_only_that_slaves_connection(make_store, tmp_path, started, caplog,
                                                                   monkeypatch):
    """The master's report handler raises for one connection: that connection is closed with an
    ERROR line (and its traceback), POS_ACKED is untouched, it counts as no protocol violation,
    and a real slave connected at the same time goes on replicating to the end."""
    master = make_store(root=tmp_path / "m")
    slave = make_store(root=tmp_path / "s")
    fill(master, 100)
    m = HAMaster(master.cl, master.ctl, "127.0.0.1", 0, ha_full_copy=True, **FAST).start()
    started.append(m)
    started.append(HASlave.for_store(slave, lambda: f"127.0.0.1:{m.port}", **SLAVE_FAST).start())
    wait_same(master, slave)
    end = master.cl.write_pos
    wait_for(lambda: master.ctl.get(C.POS_ACKED) == end, 10, 0.01, "the slave's ack of the end")
    fake = raw_connect(m.port)
    doomed = "%s:%d" % fake.getsockname()
    original = SlaveConnection._on_report

    def failing(self, buf, at):
        if self.addr == doomed:
            raise RuntimeError("handler bug")
        return original(self, buf, at)
    monkeypatch.setattr(SlaveConnection, "_on_report", failing)
    try:
        with caplog.at_level(logging.ERROR, logger="mq.ha.master"):
            fake.sendall(W.pack_slave_report(0))
            assert wait_closed(fake, 5)
            wait_for(lambda: len(m.slaves()) == 1, 5, 0.01, "the failed connection gone")
        failed = [r for r in caplog.records if doomed in r.getMessage()]
        assert len(failed) == 1 and "reader failed" in failed[0].getMessage() and failed[0].exc_info
        assert m.violations == 0 and master.ctl.get(C.POS_ACKED) == end
    finally:
        fake.close()
    fill(master, 100, seed=7)
    wait_same(master, slave)
    wait_for(lambda: master.ctl.get(C.POS_ACKED) == master.cl.write_pos, 10, 0.01, "acks go on")


def test_a_slave_handler_error_closes_the_connection_and_it_reconnects_unchanged(make_store, tmp_path, started,
                                                                                  caplog):
    """The slave's divergence handler (the truncation) raises something unexpected: the session
    ends with an ERROR line, the slave reconnects reporting the same end, and its log is what it
    was -- nothing of the failed connection is carried into the next."""
    slave = make_store(root=tmp_path / "s")
    end = fill(slave, 50)
    before = log_bytes(slave, 0, end)
    lsock = socket.create_server(("127.0.0.1", 0))
    lsock.settimeout(10)
    addr = "127.0.0.1:%d" % lsock.getsockname()[1]

    def truncate(offset):
        raise RuntimeError("truncation bug")
    try:
        with caplog.at_level(logging.ERROR, logger="mq.ha.slave"):
            started.append(HASlave(slave.cl, slave.ctl, lambda: addr, on_divergence=truncate, **SLAVE_FAST).start())
            conn, _ = lsock.accept()
            assert W.unpack_slave_report(recv_exact(conn, 8)) == end
            conn.sendall(W.pack_ha_frame_header(end - 100, 0))      # the master ends before us: truncate
            assert wait_closed(conn, 5)
            conn.close()
            conn, _ = lsock.accept()
            assert W.unpack_slave_report(recv_exact(conn, 8)) == end
            conn.close()
        assert any("session with" in r.getMessage() and r.exc_info for r in caplog.records)
    finally:
        lsock.close()
    assert slave.cl.write_pos == end and log_bytes(slave, 0, end) == before
