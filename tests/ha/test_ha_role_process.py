"""The HA role as processes of their own (start_ha_process), attached to two
stores this process owns, as the broker's supervisor runs them."""
import os

from mq.ha import MASTER_ADDR_FILE, STATUS_FILE, start_ha_process
from mq.store.configfile import read_config, write_atomic
from mq.cluster import free_port, wait_for

from hakit import assert_same_queues, fill, wait_same


def _status(store) -> dict:
    return read_config(os.path.join(store.root, STATUS_FILE)) or {}


def test_master_and_slave_role_processes_replicate(make_store, tmp_path):
    """(g) A master role process and a slave role process (master address from
    <slave root>/ha-master.txt, as the supervisor writes it) replicate the
    master's log byte-identically while it grows; the master's ha-status.json
    lists the slave with its ack reaching the master's end; a stop through the
    pipe ends both processes cleanly and leaves the status with no slaves."""
    master = make_store(root=tmp_path / "m")
    slave = make_store(root=tmp_path / "s")
    fill(master, 150)
    port = free_port()
    write_atomic(os.path.join(slave.root, MASTER_ADDR_FILE), f"127.0.0.1:{port}\n")
    procs = [
        start_ha_process("master", master.config, "127.0.0.1", 10911,
                         {"haListenHost": "127.0.0.1", "haListenPort": port, "haSendHeartbeatInterval": 200,
                          "haHousekeepingInterval": 3000, "haFullCopy": "true"}),
        start_ha_process("slave", slave.config, "127.0.0.1", 10911,
                         {"haSendHeartbeatInterval": 200, "haHousekeepingInterval": 3000,
                          "haConnectRetryInterval": 100}),
    ]
    try:
        wait_same(master, slave, timeout_s=30)
        fill(master, 150, seed=2)
        wait_same(master, slave)
        assert_same_queues(master, slave)
        end = master.cl.write_pos

        def acked():
            sl = _status(master).get("slaves", [])
            return len(sl) == 1 and sl[0]["ackOffset"] == end and sl[0]["sentOffset"] == end

        wait_for(acked, 10, 0.05, "the status file to show the slave's ack")
        assert _status(master)["listen"] == f"127.0.0.1:{port}"
    finally:
        for p, stop in procs:
            stop.set()
        for p, _ in procs:
            p.join(15)
    assert [p.exitcode for p, _ in procs] == [0, 0]
    assert _status(master)["slaves"] == []


def test_a_master_whose_ha_port_is_taken_says_so_once_and_serves_when_it_frees(tmp_path):
    """The HA port (listenPort + 1) held by another socket: the master starts and serves
    clients, the HA role logs one line and retries with a backoff (before: it raised, died and was
    restarted every 0.5 s with a traceback each time); once the port is free it listens, says so,
    and no role was restarted."""
    import socket as _socket
    from mq.cluster import Broker, NameServer, free_port, port_open, wait_for
    ns = NameServer(str(tmp_path))
    port = free_port((-2, 0, 1))
    blocker = _socket.create_server(("127.0.0.1", port + 1))
    broker = Broker(str(tmp_path), ns.addr, listenPort=port)
    try:
        wait_for(lambda: "listening on the HA port" in broker.proc.output(), 20, what="the bind failure")
        blocker.close()
        wait_for(lambda: port_open(port + 1), 30, 0.1, "the HA port listening after the retry")
        # the role's lines reach the log file through the broker's log pipeline, after the listen
        # that port_open saw: wait for the line rather than read the file at once
        wait_for(lambda: "works again" in broker.proc.output(), 10, 0.05, "the role saying it listens again")
        log = broker.proc.output()
        assert log.count("listening on the HA port") == 2, log[-3000:]     # failed once, works again
        assert "works again" in log and "Traceback" not in log, log[-3000:]
        assert "restarting" not in log.lower(), "no role died for it"
    finally:
        blocker.close()
        assert broker.stop() == 0
        ns.stop()
