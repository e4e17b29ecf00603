"""One log stream from every process of a broker: each process writes whole
records to the stderr it inherited (one write per record, well under
PIPE_BUF, so lines from different processes never interleave), tagged with
its role and pid: `2026-11-21 05:00:00,000 INFO io-1[1234] mq.broker: ...`."""
from __future__ import annotations

import logging
import os
import sys


def setup_logging(role: str) -> None:
    fmt = f"%(asctime)s %(levelname)s {role}[%(process)d] %(name)s: %(message)s"
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(fmt))
    root.addHandler(handler)
    root.setLevel(os.environ.get("MQ_LOG_LEVEL", "INFO"))
