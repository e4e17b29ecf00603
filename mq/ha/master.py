"""The master side of 4.x HA (RocketMQ's HAService.AcceptSocketService and
HAConnection): a listening TCP port, and per slave connection a reader of the
slave's 8-byte reports and a writer streaming the CommitLog (mq.wire.ha):

    slave -> master:  MAXPHYOFFSET 8                          first = start offset, then acks
    master -> slave:  MASTERPHYOFFSET 8 | BODYSIZE 4 | BODY   BODYSIZE 0 = heartbeat

Writer (per connection):
  1. waits for the first report (the slave's start offset);
  2. start position: 0 -> the start of the master's last file (RocketMQ), or the
     oldest retained offset with ha_full_copy; a start ahead of the master's
     write position is divergence: logged with the byte count, answered with a
     header-only frame at the master's write position (the slave truncates to
     it), and streaming continues from there; a start below the oldest retained
     offset cannot be served (logged, closed);
  3. loops: a frame of <= transfer_batch_size bytes from one file while data is
     available; otherwise waits on SEQ_WRITE up to WRITE_WAIT_MS; a heartbeat
     when nothing was sent for heartbeat_interval_ms.

Reader (per connection): reports are read in 8-byte units (a partial tail
waits for its rest).  An ack is valid only if it is <= `in_flight_end`, the
end of the frame being or already sent (set before the send, so a fast slave
can never ack ahead of it); a valid ack advances POS_ACKED (monotonic) and
wakes SEQ_ACK, which releases SYNC_MASTER senders.  Anything else is a
protocol violation: logged, the connection closed, POS_ACKED untouched.  One
exception: a repeat of the start value before the slave has seen our first
frame (a periodic report of a diverged slave) is ignored.  A connection that
sends nothing for housekeeping_interval_ms is closed; a slave that stops
reading makes the writer's send fail after the same interval (SO_SNDTIMEO).

Status for other processes (io workers decide SLAVE_NOT_AVAILABLE from it):
<store root>/ha-status.json, rewritten atomically on every connect and
disconnect and every STATUS_INTERVAL_S:
    {"slaves": [{"addr", "ackOffset", "sentOffset", "since", "startOffset"}],
     "updated": ms, "listen": "host:port"}
(ackOffset = highest valid ack, or -1 before the first; since = connect time, ms)."""
from __future__ import annotations

import json
import logging
import socket
import threading
import time

from mq.store import control as C
from mq.store.commitlog import CommitLog
from mq.store.configfile import write_atomic
from mq.store.native import StoreError, ffi
from mq.wire import ha as W
from mq.wire.errors import WireError

from .common import (CONNECTIONS_MAX, JOIN_TIMEOUT_S, REPORT_READ_SIZE_MAX, RUN_BYTES_MAX, STATUS_INTERVAL_S,
                     STOP_CHECK_MS, WRITE_WAIT_MS, configure_socket, readable, shutdown_quietly)

log = logging.getLogger("mq.ha.master")


def _now_ms() -> int:
    return int(time.time() * 1000)


class SlaveConnection:
    """One slave's connection: its socket, its two threads, what it was sent and acked.
    Fields written by one thread and read by others are single attribute stores
    (atomic under the GIL); `closed` only goes False -> True."""

    def __init__(self, master: "HAMaster", sock: socket.socket, addr: str):
        self.master = master
        self.sock = sock
        self.addr = addr
        self.since_ms = _now_ms()
        self.start_offset: int | None = None      # the first report
        self.start_event = threading.Event()
        self.ack_offset = -1                      # highest valid ack
        # end of the frame being sent (>= sent_offset), -1 before the first: a C cell, because
        # the C send loop raises it before each frame while the reader thread checks acks against it
        self._in_flight = ffi.new("uint64_t *")
        self._in_flight_valid = False
        # end of the last frame fully handed to the socket, -1 before the first (C updates it per frame)
        self._sent = ffi.new("uint64_t *")
        self._sent_valid = False
        self.closed = False
        self.close_reason = ""
        self.writer = threading.Thread(target=self._write_loop, name=f"ha-write-{addr}", daemon=True)
        self.reader = threading.Thread(target=self._read_loop, name=f"ha-read-{addr}", daemon=True)

    def start(self) -> None:
        self.writer.start()
        self.reader.start()

    def close(self, reason: str) -> None:
        """Ends the connection: both threads see it; the reader thread closes the fd."""
        if not self.closed:
            self.closed = True
            self.close_reason = reason
        self.start_event.set()
        shutdown_quietly(self.sock)

    @property
    def in_flight_end(self) -> int:
        return self._in_flight[0] if self._in_flight_valid else -1

    @in_flight_end.setter
    def in_flight_end(self, value: int) -> None:
        assert value >= max(0, self.in_flight_end), (value, self.in_flight_end)   # it only grows
        self._in_flight[0] = value
        self._in_flight_valid = True

    @property
    def sent_offset(self) -> int:
        return self._sent[0] if self._sent_valid else -1

    @sent_offset.setter
    def sent_offset(self, value: int) -> None:
        self._sent[0] = value
        self._sent_valid = True

    def info(self) -> dict:
        return {"addr": self.addr, "ackOffset": self.ack_offset, "sentOffset": self.sent_offset,
                "since": self.since_ms, "startOffset": self.start_offset}

    # ---- reader --------------------------------------------------------------------------
    def _read_loop(self) -> None:
        m = self.master
        buf = bytearray()
        last_read = time.monotonic()
        try:
            while not self.closed and not m._stopping:
                if not readable(self.sock, STOP_CHECK_MS):
                    idle_ms = (time.monotonic() - last_read) * 1000
                    if idle_ms >= m.housekeeping_interval_ms:
                        self.close(f"nothing received for {idle_ms:.0f} ms")
                    continue
                try:
                    data = self.sock.recv(REPORT_READ_SIZE_MAX)
                except OSError as e:
                    self.close(f"receive failed: {e}")
                    break
                if not data:
                    self.close("closed by the slave")
                    break
                last_read = time.monotonic()
                buf += data
                whole = len(buf) - len(buf) % W.HA_SLAVE_REPORT_SIZE
                for at in range(0, whole, W.HA_SLAVE_REPORT_SIZE):
                    if not self._on_report(buf, at):
                        break
                del buf[:whole]
        except Exception:
            log.exception("HA connection %s: reader failed", self.addr)
            self.close("reader failed")
        finally:
            self.close(self.close_reason or "stopped")
            self.writer.join()
            try:
                self.sock.close()
            except OSError:
                pass
            m._connection_ended(self)

    def _on_report(self, buf, at: int) -> bool:
        """Handles one 8-byte report; False when it closed the connection."""
        try:
            value = W.unpack_slave_report(buf, at)
        except WireError as e:
            log.error("HA connection %s: bad report (%s); closing", self.addr, e)
            self.master.violations += 1
            self.close("bad report")
            return False
        if self.start_offset is None:
            self.start_offset = value
            self.start_event.set()
            return True
        if value <= self.in_flight_end:
            if value > self.ack_offset:
                self.ack_offset = value
            ctl = self.master.ctl
            if value > ctl.get(C.POS_ACKED):
                ctl.advance(C.POS_ACKED, value)
                ctl.wake(C.SEQ_ACK)
            return True
        if value == self.start_offset and self.ack_offset < 0:
            return True    # a periodic repeat of the first report, before the slave took our first frame
        log.error("HA connection %s: ack %d is beyond the %d bytes sent (protocol violation); closing",
                  self.addr, value, self.in_flight_end)
        self.master.violations += 1
        self.close("ack beyond the sent offset")
        return False

    # ---- writer ------------------------------------------------------------------------------
    def _write_loop(self) -> None:
        m = self.master
        try:
            while not self.start_event.wait(STOP_CHECK_MS / 1000):
                if self.closed or m._stopping:
                    return
            if self.closed or m._stopping:
                return
            nxt = self._start_position()
            if nxt is None:
                return
            self._stream(nxt)
        except StoreError as e:
            if not self.closed:
                log.warning("HA connection %s: send failed: %s", self.addr, e)
            self.close(f"send failed: {e}")
        except Exception:
            log.exception("HA connection %s: writer failed", self.addr)
            self.close("writer failed")
        finally:
            self.close(self.close_reason or "stopped")

    def _start_position(self) -> int | None:
        m, ctl = self.master, self.master.ctl
        start, wp, min_pos = self.start_offset, ctl.get(C.POS_WRITE), ctl.get(C.POS_MIN)
        if start == 0:
            nxt = min_pos if m.ha_full_copy else wp - wp % m.file_size
            nxt = max(nxt, min_pos)
            log.info("HA connection %s: empty slave; streaming from %d (%s)", self.addr, nxt,
                     "full copy" if m.ha_full_copy else "start of the master's last file")
            return nxt
        if start > wp:
            log.error("HA connection %s: divergence: the slave holds %d bytes more than the master "
                      "(slave end %d, master end %d); telling it to truncate to %d",
                      self.addr, start - wp, start, wp, wp)
            self.in_flight_end = wp
            m.cl.ha_send_frame(self.sock.fileno(), wp, 0)
            self.sent_offset = wp
            return wp
        if start < min_pos:
            log.error("HA connection %s: the slave's end %d is below the master's oldest retained offset %d: "
                      "it cannot catch up (rebuild it from a copy of the store); closing", self.addr, start, min_pos)
            self.close("slave behind the retained range")
            return None
        log.info("HA connection %s: slave resumes from %d (master end %d)", self.addr, start, wp)
        return start

    def _stream(self, nxt: int) -> None:
        m, ctl, cl = self.master, self.master.ctl, self.master.cl
        fd = self.sock.fileno()
        last_send = 0.0
        while not self.closed and not m._stopping:
            seen = ctl.seq(C.SEQ_WRITE)
            wp = ctl.get(C.POS_WRITE)
            if nxt < wp:
                # many frames per C call (GIL released); RUN_BYTES_MAX bounds the time between
                # looks at the stop flag.  C raises in_flight_end before each frame.
                end = min(wp, nxt + RUN_BYTES_MAX)
                if not self._in_flight_valid:
                    # the cell is 0 until C raises it to the first frame's end: no ack (not even a
                    # repeat of the slave's start report) counts before a frame is in flight
                    self._in_flight_valid = True
                    self.sent_offset = nxt
                nxt = cl.ha_send_run(fd, nxt, end, m.transfer_batch_size, self._in_flight, self._sent)
                last_send = time.monotonic()
                continue
            if (time.monotonic() - last_send) * 1000 >= m.heartbeat_interval_ms:
                self.in_flight_end = max(self.in_flight_end, nxt)
                cl.ha_send_frame(fd, nxt, 0)
                self.sent_offset = nxt
                last_send = time.monotonic()
            ctl.wait(C.SEQ_WRITE, seen, WRITE_WAIT_MS)


class HAMaster:
    """The master's HA port.  `HAMaster(...).start()`; `stop()` closes every
    connection and joins every thread.  `port` is the bound port (useful with
    ha_port=0)."""

    def __init__(self, cl: CommitLog, ctl: C.ControlBlock, listen_host: str, ha_port: int, *,
                 transfer_batch_size: int = W.HA_TRANSFER_BATCH_SIZE, heartbeat_interval_ms: int = 5000,
                 housekeeping_interval_ms: int = 20000, file_size: int | None = None,
                 ha_full_copy: bool = False, status_path: str | None = None):
        assert 0 < transfer_batch_size < 1 << 31
        assert heartbeat_interval_ms > 0 and housekeeping_interval_ms > 0
        self.cl = cl
        self.ctl = ctl
        self.file_size = file_size or cl.file_size
        assert self.file_size == cl.file_size
        self.transfer_batch_size = transfer_batch_size
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.housekeeping_interval_ms = housekeeping_interval_ms
        self.ha_full_copy = ha_full_copy
        self.status_path = status_path
        self._lock = threading.Lock()             # guards _conns
        self._status_lock = threading.Lock()      # one writer of the status file at a time
        self._conns: list[SlaveConnection] = []
        self._stopping = False
        self._status_at = 0.0
        self._threads: list[threading.Thread] = []
        self.connections_total = 0
        self.violations = 0
        self._lsock = socket.create_server((listen_host, ha_port), reuse_port=False, backlog=64)
        self._lsock.setblocking(True)
        self.listen_host = listen_host
        self.port = self._lsock.getsockname()[1]

    def start(self) -> "HAMaster":
        for name, target in (("ha-accept", self._accept_loop), ("ha-status", self._status_loop)):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        log.info("HA master listening on %s:%d", self.listen_host, self.port)
        self.write_status()
        return self

    # ---- accepting --------------------------------------------------------------------------
    def _accept_loop(self) -> None:
        while not self._stopping:
            if not readable(self._lsock, STOP_CHECK_MS):
                continue
            try:
                sock, peer = self._lsock.accept()
            except OSError as e:
                if not self._stopping:
                    log.warning("HA accept failed: %s", e)
                    time.sleep(STOP_CHECK_MS / 1000)
                continue
            addr = f"{peer[0]}:{peer[1]}"
            with self._lock:
                full = len(self._conns) >= CONNECTIONS_MAX
            if full:
                log.error("HA connection from %s refused: already %d connections", addr, CONNECTIONS_MAX)
                sock.close()
                continue
            try:
                configure_socket(sock, self.housekeeping_interval_ms)
            except OSError as e:
                log.warning("HA connection from %s: socket set-up failed: %s", addr, e)
                sock.close()
                continue
            conn = SlaveConnection(self, sock, addr)
            with self._lock:
                self._conns.append(conn)
                self.connections_total += 1
            log.info("HA connection from %s", addr)
            conn.start()
            self.write_status()

    def _connection_ended(self, conn: SlaveConnection) -> None:
        with self._lock:
            if conn in self._conns:
                self._conns.remove(conn)
        log.info("HA connection %s closed: %s (acked %d, sent %d)", conn.addr, conn.close_reason,
                 conn.ack_offset, conn.sent_offset)
        self.write_status()

    # ---- status -----------------------------------------------------------------------------
    def slaves(self) -> list[dict]:
        """One dict per connected slave: addr, ackOffset, sentOffset, since (ms), startOffset."""
        with self._lock:
            return [c.info() for c in self._conns if not c.closed]

    def write_status(self) -> None:
        if not self.status_path:
            return
        doc = {"slaves": [] if self._stopping else self.slaves(), "updated": _now_ms(),
               "listen": f"{self.listen_host}:{self.port}"}
        with self._status_lock:
            self._status_at = time.monotonic()
            try:
                write_atomic(self.status_path, json.dumps(doc))
            except OSError as e:
                log.error("writing %s failed: %s", self.status_path, e)

    def _status_loop(self) -> None:
        while not self._stopping:
            time.sleep(STATUS_INTERVAL_S / 4)
            if not self._stopping and time.monotonic() - self._status_at >= STATUS_INTERVAL_S:
                self.write_status()

    # ---- stopping ------------------------------------------------------------------------------
    def stop(self) -> None:
        self._stopping = True
        for t in self._threads:          # accept first: no connection starts after this
            t.join(JOIN_TIMEOUT_S)
        self._threads.clear()
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            c.close("master stopping")
        for c in conns:
            c.reader.join(JOIN_TIMEOUT_S)
        try:
            self._lsock.close()
        except OSError:
            pass
        self.write_status()
        log.info("HA master on port %d stopped", self.port)
