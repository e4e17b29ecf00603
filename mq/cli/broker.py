"""mqbroker -c FILE [-n NAMESRV] [-p]: run a broker (RocketMQ's command line).

Logs go to stderr, and with logDir set also to <logDir>/broker.log, rolled by size
(logFileMaxBytes, logFileBackups; mq.logs).  An unwritable logDir exits 2.

SIGTERM or SIGINT is a clean stop: unregister, stop accepting, finish
in-flight requests, flush, checkpoint, remove the abort file; one that comes
while the broker starts stops it once it has started.  Under systemd
(NOTIFY_SOCKET set) it reports READY=1 once serving, STOPPING=1 on SIGTERM,
and WATCHDOG=1 every WATCHDOG_USEC/2 when a watchdog is configured."""
from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys

from mq import loop as mq_loop
from mq.broker.launcher import Launcher
from mq.broker.supervisor import Supervisor
from mq.broker.config import BrokerConfig, load_config_file
from mq.store import StoreError


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="mqbroker", description="RocketMQ-compatible broker")
    ap.add_argument("-c", "--configFile", help="broker properties file (RocketMQ keys)")
    ap.add_argument("-n", "--namesrvAddr", help="name servers, host:port;host:port (overrides the file)")
    ap.add_argument("-p", "--printConfigItem", action="store_true", help="print the effective config and exit")
    return ap


def load(args) -> BrokerConfig:
    overrides = {"namesrvAddr": args.namesrvAddr} if args.namesrvAddr else {}
    warn = lambda m: print(f"mqbroker: warning: {m}", file=sys.stderr)  # noqa: E731
    if args.configFile:
        cfg = load_config_file(args.configFile, overrides, warn=warn)
        cfg.config_file = os.path.abspath(args.configFile)     # UPDATE_BROKER_CONFIG writes changes back
        return cfg
    return BrokerConfig(overrides, warn=warn)


async def serve(cfg: BrokerConfig, launcher: Launcher) -> int:
    from mq.cli import sdnotify
    # the handlers go in before the start: a SIGTERM while it runs (the io workers already
    # serve, the name servers are being told) is a stop once it is done, not a death by the
    # signal's default action that leaves the roles to die with us and the store unclean
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    broker = Supervisor(cfg, launcher)
    try:
        await broker.start()
    except StoreError as e:          # the store cannot be opened (in use, a file of another size): one line
        print(f"mqbroker: the store cannot be opened: {e}", file=sys.stderr)
        return 1
    sdnotify.notify("READY=1")
    interval_s = sdnotify.watchdog_interval_s()
    watchdog = asyncio.create_task(_watchdog(interval_s)) if interval_s else None
    await stop.wait()
    sdnotify.notify("STOPPING=1")
    if watchdog:
        watchdog.cancel()
    await broker.stop()
    return 0


async def _watchdog(interval_s: float) -> None:
    from mq.cli import sdnotify
    while True:
        sdnotify.notify("WATCHDOG=1")
        await asyncio.sleep(interval_s)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        cfg = load(args)
    except (ValueError, OSError) as e:
        print(f"mqbroker: {e}", file=sys.stderr)
        return 2
    if args.printConfigItem:
        sys.stdout.write(cfg.as_properties())
        return 0
    if cfg.aclEnable:                     # a broker does not start on accounts it cannot use
        from mq.acl.plain import AclConfigError, AclFile, acl_file_path
        try:
            AclFile(acl_file_path(cfg.rocketmqHome)).load()
        except AclConfigError as e:
            print(f"mqbroker: {e}", file=sys.stderr)
            return 2
    from mq.logs import LogFile, enable_stack_dumps, setup_broker_logging
    enable_stack_dumps()
    log_file = None
    if cfg.logDir:                        # a directory it cannot write is a config error, said at once
        try:
            log_file = LogFile(cfg.logDir, "broker.log", cfg.logFileMaxBytes, cfg.logFileBackups)
        except OSError as e:
            print(f"mqbroker: logDir={cfg.logDir}: cannot write broker.log there: {e}", file=sys.stderr)
            return 2
    # order matters: the log stream first (it picks the fork start method), then the
    # launcher, forked while this process has no thread but the stream's receiver
    setup_broker_logging(log_file)
    from mq.store.bells import count_for
    launcher = Launcher(n_bells=count_for(cfg.sendMessageThreadPoolNums))
    try:
        return mq_loop.run(serve(cfg, launcher))
    finally:
        launcher.close()


if __name__ == "__main__":
    sys.exit(main())
