"""`make run`: a local cluster on loopback — one name server and one broker —
from an embedded default configuration (the same values as conf/broker.conf
and conf/namesrv.properties), under ./run/.  Runs in the foreground; Ctrl-C
(or SIGTERM) stops everything cleanly, brokers first.  Ports: 9876 (name
server), 10911/10909/10912 (broker); override with MQ_NAMESRV_PORT /
MQ_BROKER_PORT.

`python -m mq.cli.local LAYOUT` starts a name server and every broker of a
shipped layout instead (conf/LAYOUT/*.properties or *.conf: 2m-2s-async,
2m-2s-sync, 2m-noslave, dledger): masters first, then slaves; the three
DLedger members elect their leader by themselves.  The layouts are
found through the installed package mq.conf, so this works the same from a
checkout and from an installed wheel; relative paths in them (stores under
./run/LAYOUT/) resolve against the working directory."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from mq.cluster import BIN, port_open, wait_for


def embedded_config(run_dir: str, ns_port: int, broker_port: int) -> tuple[str, str]:
    namesrv = (f"listenPort={ns_port}\nlistenAddress=127.0.0.1\n"
               f"kvConfigPath={run_dir}/namesrv/kvConfig.json\n")
    broker = "\n".join([
        "brokerClusterName=DefaultCluster", "brokerName=broker-a", "brokerId=0",
        "brokerRole=ASYNC_MASTER", "flushDiskType=ASYNC_FLUSH", "deleteWhen=04", "fileReservedTime=48",
        f"namesrvAddr=127.0.0.1:{ns_port}", f"listenPort={broker_port}", "brokerIP1=127.0.0.1",
        "listenAddress=127.0.0.1", f"storePathRootDir={run_dir}/store", ""])
    return namesrv, broker


def _wait_port(port: int, proc: subprocess.Popen, timeout_s: float = 60) -> bool:
    """Whether `port` accepts connections within timeout_s (False as soon as proc exits)."""
    try:
        wait_for(lambda: port_open(port) or proc.poll() is not None, timeout_s, 0.1, f"port {port}")
    except TimeoutError:
        return False
    return proc.poll() is None


def _broker_ports(cfg) -> list[int]:
    """Every port a broker listens on: the fast port and listenPort, then listenPort+1 (HA) or, in
    DLedger mode, its own DLedger peer port."""
    extra = [cfg.ha_port]
    if cfg.enableDLegerCommitLog:
        extra = [cfg.store_config().dledger_peers[cfg.dLegerSelfId][1]]
    return [cfg.fast_port, cfg.listenPort] + extra


def _layout_brokers(layout: str) -> list[tuple[str, int, list[int], str]]:
    """(broker file, listenPort, every port it uses, cluster) of a shipped layout's brokers
    (mq.conf), masters first."""
    from mq import conf
    from mq.broker.config import BrokerConfig
    from mq.store.config import load_properties_file
    files = conf.layout_files(layout)
    if not files:
        raise SystemExit(f"no layout {layout!r} in {conf.DIR} (try {', '.join(conf.layouts())})")
    out = []
    for path in files:
        cfg = BrokerConfig(load_properties_file(path))
        out.append((cfg.brokerId, path, cfg.listenPort, _broker_ports(cfg), cfg.brokerClusterName))
    return [entry[1:] for entry in sorted(out)]


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    run_dir = os.path.abspath(os.environ.get("MQ_RUN_DIR", "run"))
    ns_port = int(os.environ.get("MQ_NAMESRV_PORT", "9876"))
    broker_port = int(os.environ.get("MQ_BROKER_PORT", "10911"))
    os.makedirs(run_dir, exist_ok=True)
    ns_conf, broker_conf = embedded_config(run_dir, ns_port, broker_port)
    paths = {"namesrv": os.path.join(run_dir, "namesrv.properties"), "broker": os.path.join(run_dir, "broker.conf")}
    for name, text in (("namesrv", ns_conf), ("broker", broker_conf)):
        with open(paths[name], "w") as f:
            f.write(text)
    if argv:
        brokers = _layout_brokers(argv[0])
    else:
        brokers = [(paths["broker"], broker_port, [broker_port + d for d in (-2, 0, 1)], "DefaultCluster")]
    ports = [ns_port] + [p for _, _, used, _ in brokers for p in used]
    for port in ports:
        if port_open(port):
            print(f"port {port} on 127.0.0.1 is in use: stop what holds it, or set MQ_NAMESRV_PORT/"
                  "MQ_BROKER_PORT", file=sys.stderr)
            return 2
    procs = []
    stopping = False

    def stop(*_):
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    # own sessions: a terminal Ctrl-C reaches only this launcher, which stops them in order
    ns = subprocess.Popen([os.path.join(BIN, "mqnamesrv"), "-c", paths["namesrv"]], start_new_session=True)
    procs.append(ns)
    if not _wait_port(ns_port, ns):
        print("the name server did not start", file=sys.stderr)
        ns.terminate()
        return 1
    for conf, port, _, _ in brokers:
        broker = subprocess.Popen([os.path.join(BIN, "mqbroker"), "-c", conf], start_new_session=True)
        procs.append(broker)
        if not _wait_port(port, broker):
            print(f"the broker of {conf} did not start", file=sys.stderr)
            for p in procs:
                p.terminate()
            return 1
    names = ", ".join(f"{os.path.basename(c)}@{p}" for c, p, _, _ in brokers)
    cluster = brokers[0][3]
    # the commands as this interpreter's bin/ has them: .venv/bin under a checkout, else absolute
    bin_dir = os.path.relpath(BIN) if BIN.startswith(os.getcwd() + os.sep) else BIN
    print(f"""
local cluster up: name server 127.0.0.1:{ns_port}, brokers {names} (stores under {run_dir})
try, in another terminal:
  {bin_dir}/mqadmin clusterList -n 127.0.0.1:{ns_port}
  {bin_dir}/mqadmin updateTopic -n 127.0.0.1:{ns_port} -c {cluster} -t DemoTopic
  {bin_dir}/python -m mq.cli.demo_client 127.0.0.1:{ns_port}
Ctrl-C stops both.
""", flush=True)
    while not stopping and all(p.poll() is None for p in procs):
        time.sleep(0.2)
    code = 0
    for p in reversed(procs):          # broker first: it unregisters from the name server
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        code = code or (p.returncode or 0)
    return 0 if stopping else (code or 1)


if __name__ == "__main__":
    sys.exit(main())
