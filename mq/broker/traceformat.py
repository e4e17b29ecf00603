"""The io worker's trace formatter, a child process of its own (OffloadedRowWriter in
mq.broker.tracing starts it): `python -m mq.broker.traceformat FD`, FD one end of a
SOCK_SEQPACKET socket pair.  The first message is a JSON header (directory, prefix, kind,
constants, fields, pid: what RowTraceWriter takes, pid the io worker's); every later message is
whole rows of int64 values, formatted by RowTraceWriter (mq_format_rows) into the io worker's
file and written at once.  It ends at EOF (the io worker closed its end, or died: the rows it
had sent are written still), after writing what it has; SIGTERM and SIGINT (sent to the broker's whole process group) are ignored so that
it drains first."""
from __future__ import annotations

import json
import logging
import signal
import socket
import sys

from mq.store.native import ffi

from .launcher import set_process_name
from .tracing import OffloadedRowWriter, RowTraceWriter

log = logging.getLogger("mq.broker.traceformat")

HEADER_BYTES_MAX = 65536


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sock = socket.socket(fileno=int(argv[0]))
    head = json.loads(sock.recv(HEADER_BYTES_MAX))
    set_process_name(f"trace-{head['constants'].get('role', head['kind'])}"[:15])
    fields = tuple(head["fields"])
    writer = RowTraceWriter(head["directory"], head["prefix"], head["kind"], head["constants"], fields,
                            pid=head["pid"])
    row_bytes = 8 * len(fields)
    buf = bytearray(OffloadedRowWriter.MESSAGE_ROWS_MAX * row_bytes)
    values = ffi.from_buffer("int64_t[]", buf)
    try:
        while n := sock.recv_into(buf):
            if n % row_bytes:
                log.error("perf trace: a message of %d bytes is not whole rows of %d; stopping", n, row_bytes)
                return 1
            writer.add_flat(values, n // row_bytes)
            writer.flush()                        # written at once (nothing is added one row at a time)
            if writer.failed:
                return 1
    finally:
        writer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
