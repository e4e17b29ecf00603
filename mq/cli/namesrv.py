"""mqnamesrv: run a name server, as RocketMQ's `mqnamesrv` does.

    mqnamesrv [-c FILE] [-p] [-n ADDR]

  -c FILE  Java properties file (key=value, # comments) with the keys of
           mq.namesrv.config.NAMESRV_OPTIONS; unknown keys are warned about
           on stderr and ignored; a bad value exits 2 naming the key.
  -p       print the effective configuration (key=value) and exit 0.
  -n ADDR  accepted for compatibility with RocketMQ's command line; unused.

Runs until SIGTERM or SIGINT, then stops cleanly (stop accepting, finish
in-flight requests, close connections) and exits 0.  Logs go to stderr with
the pid, and with logDir set also to <logDir>/namesrv.log, rolled by size
(logFileMaxBytes, logFileBackups; mq.logs).  With $NOTIFY_SOCKET set (systemd Type=notify) it sends READY=1
once listening (STATUS carries the bound address), STOPPING=1 on the signal,
and WATCHDOG=1 every half $WATCHDOG_USEC when a watchdog is configured.

Exit codes: 0 clean stop or -p; 1 cannot listen; 2 bad command line or config."""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys

from mq import loop as mq_loop
from mq.logs import enable_stack_dumps, setup_logging
from mq.namesrv import NameServer, NamesrvConfig
from mq.namesrv.config import load_properties_file

from . import sdnotify

log = logging.getLogger("mq.cli.namesrv")


def _format(value) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def load_config(path: str | None) -> NamesrvConfig:
    """The config from `path` (defaults when None); warnings to stderr.  Raises SystemExit(2)
    with a message for an unreadable file or a bad value."""
    props = {}
    if path:
        try:
            props = load_properties_file(path)
        except (OSError, UnicodeDecodeError, ValueError) as e:
            print(f"mqnamesrv: cannot read config file {path}: {e}", file=sys.stderr)
            raise SystemExit(2) from None
    try:
        config, warnings = NamesrvConfig.from_properties(props)
    except ValueError as e:
        print(f"mqnamesrv: {path}: bad value: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    for w in warnings:
        print(f"mqnamesrv: warning: {path}: {w}", file=sys.stderr)
    return config


async def serve(config: NamesrvConfig) -> int:
    ns = NameServer(config)
    try:
        port = await ns.start()
    except OSError as e:
        log.error("cannot listen on %s:%d: %s", config.listenAddress, config.listenPort, e)
        return 1
    loop = asyncio.get_running_loop()
    stop = loop.create_future()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda s=sig: stop.done() or stop.set_result(s))
    print("The Name Server boot success. serializeType=JSON", flush=True)
    sdnotify.notify(f"READY=1\nSTATUS=listening on {config.listenAddress}:{port}\nMAINPID={os.getpid()}")
    watchdog = None
    interval_s = sdnotify.watchdog_interval_s()
    if interval_s:
        async def ping():
            while True:
                sdnotify.notify("WATCHDOG=1")
                await asyncio.sleep(interval_s)
        watchdog = asyncio.create_task(ping())
    stalls = asyncio.create_task(mq_loop.watch_stalls("name server"))
    sig = await stop
    log.info("%s received: stopping", signal.Signals(sig).name)
    sdnotify.notify("STOPPING=1")
    stalls.cancel()
    if watchdog is not None:
        watchdog.cancel()
    await ns.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mqnamesrv", description="RocketMQ 4.x compatible name server")
    parser.add_argument("-c", "--configFile", metavar="FILE", help="name server config properties file")
    parser.add_argument("-p", "--printConfigItem", action="store_true", help="print all config items and exit")
    parser.add_argument("-n", "--namesrvAddr", metavar="ADDR", help="accepted for compatibility; unused")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.configFile)
    except SystemExit as e:
        return int(e.code)
    if args.printConfigItem:
        for key, value in config.as_dict().items():
            print(f"{key}={_format(value)}")
        return 0
    if args.configFile:
        config.config_file = os.path.abspath(args.configFile)     # UPDATE_NAMESRV_CONFIG writes changes back
    log_file = None
    if config.logDir:
        from mq.logs import LogFile
        try:
            log_file = LogFile(config.logDir, "namesrv.log", config.logFileMaxBytes, config.logFileBackups)
        except OSError as e:
            print(f"mqnamesrv: logDir={config.logDir}: cannot write namesrv.log there: {e}", file=sys.stderr)
            return 2
    setup_logging("mqnamesrv", log_file)
    enable_stack_dumps()
    return mq_loop.run(serve(config))


if __name__ == "__main__":
    sys.exit(main())
