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

Once the writer streams, both loops run in C between looks at their flags (mq_ha_stream_for,
mq_ha_read_acks): a wake of the chain costs no interpreter round and no GIL hand-off.

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

Take-back (ours; mq.wire.ha has the frames).  A SYNC_MASTER acknowledges a send once its slave
has the bytes, with ASYNC_FLUSH flushed or not; if the master then loses power, or its disk loses
or damages a tail (recovery cuts at the first damaged record, and a record torn where no checksum
looks passes as whole), it restarts without a tail its slave holds and its clients were told is
safe.  So after a crash or a cut damaged tail the supervisor refuses writes for a while
(POS_HA_TAKE_BACK_UNTIL, haTakeBackWaitMs) and when a
slave's first report is beyond our end in that window, the reader thread asks for the surplus
instead of telling the slave to truncate: it receives the slave's frames into the CommitLog with
the slave's own C receive path (every record validated before it is published), waits until the
dispatch role has them in the ConsumeQueues, resets the queues' next offsets from there and opens
writes; only then does the writer start streaming, from the slave's end.  A first report at or
below our end opens writes at once (a kill -9 loses nothing written: only the power or the disk can).  A slave that reports
beyond our end after the window is truncated as before (logged as possible loss).

Status for other processes (the runtime info, metrics and mqadmin's per-slave detail; a send's
SLAVE_NOT_AVAILABLE is decided from the control block, mq.broker.hastatus):
<store root>/ha-status.json, replaced whole (mq.files.replace_file: no fsync, it is
not for a crash) on every connect and disconnect and every STATUS_INTERVAL_S:
    {"slaves": [{"addr", "ackOffset", "sentOffset", "since", "startOffset"}],
     "updated": ms, "listen": "host:port"}
(ackOffset = highest valid ack, or -1 before the first; since = connect time, ms)."""
from __future__ import annotations

import json
import logging
import socket
import threading
import time

from mq.logs import Episode
from mq.store import control as C
from mq.store.commitlog import CommitLog
from mq.files import replace_file
from mq.store.native import OutOfRange, StoreError, ffi, lib
from mq.wire import ha as W
from mq.wire.errors import WireError

from .common import (CONNECTIONS_MAX, FRAME_BODY_SIZE_MAX, JOIN_TIMEOUT_S, REPORT_READ_SIZE_MAX, RUN_BYTES_MAX,
                     STATUS_INTERVAL_S, STOP_CHECK_MS, TAKE_BACK_FOREVER_MS, WRITE_WAIT_MS, configure_socket,
                     monotonic_ms, readable, shutdown_quietly, taking_back)

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
        # the ack reader's state, C's once the writer streams (mq_ha_read_acks): the highest
        # valid ack (-1 before the first), a report's first bytes, the last receive's time
        self._acks = ffi.new("mq_ha_acks *", {"ack": -1})
        # end of the frame being sent (>= sent_offset), -1 before the first: a C cell, because
        # the C send loop raises it before each frame while the reader thread checks acks against it
        self._in_flight = ffi.new("uint64_t *")
        self._in_flight_valid = False
        # end of the last frame fully handed to the socket, -1 before the first (C updates it per frame)
        self._sent = ffi.new("uint64_t *")
        self._sent_valid = False
        self.closed = False
        self.close_reason = ""
        self.take_back_pending = False            # first report beyond our end while writes wait for it
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
            with self.master._lock:
                self.master._publish_count()      # a closing connection is no slave to wait for
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
    def ack_offset(self) -> int:
        return self._acks.ack

    @ack_offset.setter
    def ack_offset(self, value: int) -> None:
        self._acks.ack = value

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
                if self._in_flight_valid:      # the start is handled and the writer streams: C reads
                    self._read_acks(buf, last_read)
                    break
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
                if self.take_back_pending:
                    self.take_back_pending = False
                    with m._take_back_lock:
                        m._take_back(self, buf)
                    self.start_event.set()
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

    def _read_acks(self, buf: bytearray, last_read: float) -> None:
        """The steady state: acks read and applied in C (mq_ha_read_acks), STOP_CHECK_MS a call;
        here only the flags, the idle limit and what ends the connection.  `buf` holds less
        than one report (the start of the next)."""
        m, a = self.master, self._acks
        assert len(buf) < W.HA_SLAVE_REPORT_SIZE and self.start_offset is not None
        a.start = self.start_offset
        a.carry_n = len(buf)
        ffi.memmove(a.carry, bytes(buf), len(buf))
        a.last_read_ms = int(last_read * 1000)           # (time.monotonic: C's CLOCK_MONOTONIC)
        fd = self.sock.fileno()
        while not self.closed and not m._stopping:
            try:
                m.cl.ha_read_acks(fd, a, STOP_CHECK_MS, self._in_flight)
            except OSError as e:
                self.close(f"receive failed: {e}")
                return
            if a.why == lib.MQ_HA_ACKS_CLOSED:
                self.close("closed by the slave")
                return
            if a.why == lib.MQ_HA_ACKS_BAD:
                m.violations += 1
                if a.bad >= 1 << 63:
                    log.error("HA connection %s: bad report (negative offset %d); closing", self.addr,
                              a.bad - (1 << 64))
                    self.close("bad report")
                else:
                    log.error("HA connection %s: ack %d is beyond the %d bytes sent (protocol violation); closing",
                              self.addr, a.bad, self.in_flight_end)
                    self.close("ack beyond the sent offset")
                return
            idle_ms = monotonic_ms() - a.last_read_ms
            if idle_ms >= m.housekeeping_interval_ms:
                self.close(f"nothing received for {idle_ms:.0f} ms")

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
            m = self.master
            if m.waiting_for_take_back():
                if value > m.ctl.get(C.POS_WRITE):
                    self.take_back_pending = True      # the writer starts once it is done
                    return True
                m.nothing_to_take_back(self.addr, value)
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
                      "(slave end %d, master end %d); telling it to truncate to %d%s",
                      self.addr, start - wp, start, wp, wp,
                      " (writes were already open: if this master lost power, acknowledged messages in "
                      "those bytes are lost)" if m.gated_at_start else "")
            self.in_flight_end = wp
            m.cl.ha_send_frame(self.sock.fileno(), wp, 0)
            self.sent_offset = wp
            return wp
        if start < min_pos:
            self._behind("the slave's end", start, min_pos)
            return None
        log.info("HA connection %s: slave resumes from %d (master end %d)", self.addr, start, wp)
        return start

    def _stream(self, nxt: int) -> None:
        """Streams from nxt until the connection closes: C sends, heartbeats and sleeps on the
        log's growth (mq_ha_stream_for), WRITE_WAIT_MS a call between looks at the flags."""
        m, cl = self.master, self.master.cl
        fd = self.sock.fileno()
        stream = ffi.new("mq_ha_stream *", {"next": nxt, "last_send_ms": 0, "run_max": RUN_BYTES_MAX,
                                            "frame_max": m.transfer_batch_size,
                                            "heartbeat_ms": m.heartbeat_interval_ms})
        if not self._in_flight_valid:
            # the cell is 0 until C raises it to the first frame's end: no ack (not even a
            # repeat of the slave's start report) counts before a frame is in flight
            self._in_flight_valid = True
            self.sent_offset = nxt
        while not self.closed and not m._stopping:
            try:
                cl.ha_stream_for(fd, stream, WRITE_WAIT_MS, self._in_flight, self._sent)
            except OutOfRange:
                at, min_pos = self.sent_offset, m.ctl.get(C.POS_MIN)   # (the refused frame's offset)
                if at >= min_pos:
                    raise
                # retention deleted the file the slave needs next while it lagged (the frame being
                # sent then finished from the writer's own fd; the role retired the file since)
                self._behind("the slave's next offset", at, min_pos)
                return

    def _behind(self, what: str, at: int, min_pos: int) -> None:
        log.error("HA connection %s: %s %d is below the master's oldest retained offset %d: it cannot catch up "
                  "(rebuild it from a copy of the store); closing", self.addr, what, at, min_pos)
        self.close("slave behind the retained range")


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
        self._status_episode = Episode(log, "writing the HA status file")
        self._take_back_lock = threading.Lock()   # one give-back at a time
        self.taken_back: list[tuple[int, int]] = []   # (from, to) per completed take-back
        self.gated_at_start = ctl.get(C.POS_HA_TAKE_BACK_UNTIL) != 0
        self._lsock = socket.create_server((listen_host, ha_port), reuse_port=False, backlog=64)
        self._lsock.setblocking(True)
        self.listen_host = listen_host
        self.port = self._lsock.getsockname()[1]

    def start(self) -> "HAMaster":
        with self._lock:
            self._publish_count()      # a block kept from an HA role that died may hold its count
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
                self._publish_count()
            log.info("HA connection from %s", addr)
            conn.start()
            self.write_status()

    def _connection_ended(self, conn: SlaveConnection) -> None:
        with self._lock:
            if conn in self._conns:
                self._conns.remove(conn)
            self._publish_count()
        log.info("HA connection %s closed: %s (acked %d, sent %d)", conn.addr, conn.close_reason,
                 conn.ack_offset, conn.sent_offset)
        self.write_status()

    # ---- take-back ------------------------------------------------------------------------------
    def waiting_for_take_back(self) -> bool:
        """Do writes still wait for a slave's give-back (POS_HA_TAKE_BACK_UNTIL in the future)?"""
        return taking_back(self.ctl)

    def nothing_to_take_back(self, addr: str, slave_end: int) -> None:
        """The first slave to connect while writes wait holds nothing beyond our end (a kill -9
        loses no written byte; only a power loss does): writes open at once.  (With several
        slaves, the first to connect decides.)"""
        with self._take_back_lock:
            if taking_back(self.ctl) and self.ctl.get(C.POS_HA_TAKE_BACK_UNTIL) != TAKE_BACK_FOREVER_MS:
                self.ctl.set(C.POS_HA_TAKE_BACK_UNTIL, 0)
                log.warning("HA connection %s: the slave ends at %d, not beyond our end %d: nothing to take back; "
                            "writes open", addr, slave_end, self.ctl.get(C.POS_WRITE))

    def _take_back(self, conn: SlaveConnection, buf: bytearray) -> None:
        """On conn's reader thread: asks the slave for [our end, its end), receives it, waits for
        the dispatch, resets the next queue offsets and opens writes.  Any failure closes the
        connection (the slave reconnects; while the window lasts it is asked again)."""
        ctl, cl, sock = self.ctl, self.cl, conn.sock
        start, wp = conn.start_offset, ctl.get(C.POS_WRITE)
        if start <= wp or not self.waiting_for_take_back():      # another slave's give-back covered it
            return
        log.warning("HA connection %s: the slave holds %d bytes beyond our end (%d -> %d) and writes wait for "
                    "them (restart after a crash): taking them back", conn.addr, start - wp, wp, start)
        # the window must not close under a give-back in progress
        until = ctl.get(C.POS_HA_TAKE_BACK_UNTIL)
        ctl.set(C.POS_HA_TAKE_BACK_UNTIL, TAKE_BACK_FOREVER_MS)
        try:
            sock.sendall(W.pack_take_back_request(wp))
            if not self._read_mark(conn, buf):
                return
            expected = wp
            while expected < start and not conn.closed and not self._stopping:
                why, expected, other, published, corrupt = cl.ha_recv_run(sock.fileno(), expected, start - expected,
                                                                         FRAME_BODY_SIZE_MAX)
                if corrupt:
                    log.error("HA connection %s: the slave's bytes are not valid at %d (received up to %d); "
                              "keeping what was valid and closing", conn.addr, published, expected)
                    conn.close("corrupt give-back")
                    break
                if why == "other":
                    log.error("HA connection %s: frame %s during the give-back, expected offset %d; closing",
                              conn.addr, other, expected)
                    self.violations += 1
                    conn.close("bad give-back frame")
                    break
        except (OSError, StoreError) as e:
            log.error("HA connection %s: give-back failed: %s", conn.addr, e)
            conn.close(f"give-back failed: {e}")
        end = ctl.get(C.POS_WRITE)
        if end > wp:
            # records landed: their queue offsets first; then writes open if we have it all, and
            # otherwise the window goes on (the slave reconnects and gives back the rest)
            self._dispatch_and_reset(end)
        if not self._stopping:
            ctl.set(C.POS_HA_TAKE_BACK_UNTIL, 0 if end >= start else until)
        if end > wp:
            self.taken_back.append((wp, end))
        if end >= start:
            log.warning("HA connection %s: took back [%d, %d) (%d bytes) from the slave; writes open",
                        conn.addr, wp, end, end - wp)

    def _read_mark(self, conn: SlaveConnection, buf: bytearray) -> bool:
        """Reads 8-byte words (exactly: the frames after the mark belong to the C receive) until
        the slave's TAKE_BACK_MARK; repeats of its first report may come before it."""
        deadline = time.monotonic() + self.housekeeping_interval_ms / 1000
        while not conn.closed and not self._stopping:
            while len(buf) < W.HA_SLAVE_REPORT_SIZE:
                if time.monotonic() > deadline:
                    conn.close("no answer to the take-back request")
                    return False
                if not readable(conn.sock, STOP_CHECK_MS):
                    continue
                data = conn.sock.recv(W.HA_SLAVE_REPORT_SIZE - len(buf))
                if not data:
                    conn.close("closed by the slave during the take-back")
                    return False
                buf += data
            try:
                word = W.unpack_slave_word(buf)
            except WireError as e:
                log.error("HA connection %s: bad word before the give-back (%s); closing", conn.addr, e)
                self.violations += 1
                conn.close("bad word")
                return False
            del buf[:W.HA_SLAVE_REPORT_SIZE]
            if word == W.TAKE_BACK_MARK:
                return True
            if word != conn.start_offset:
                log.error("HA connection %s: report %d before the give-back, expected a repeat of %d; closing",
                          conn.addr, word, conn.start_offset)
                self.violations += 1
                conn.close("report during the take-back")
                return False
        return False

    def _dispatch_and_reset(self, end: int) -> None:
        """Records up to `end` were taken back: once the dispatch role has put them in the
        ConsumeQueues, the next queue offsets are reset from there (appends would otherwise
        reuse the offsets of the records taken back)."""
        ctl = self.ctl
        waited = time.monotonic()
        while not self._stopping:
            seen = ctl.seq(C.SEQ_DISPATCH)
            if ctl.get(C.POS_DISPATCHED) >= end:
                break
            if time.monotonic() - waited > 10:
                log.warning("taken-back bytes up to %d not dispatched yet (at %d); writes still wait",
                            end, ctl.get(C.POS_DISPATCHED))
                waited = time.monotonic()
            ctl.wait(C.SEQ_DISPATCH, seen, STOP_CHECK_MS)
        if not self._stopping:     # else the gate stays shut: the next start recovers from the files
            ctl.reset_next_offsets()

    # ---- status -----------------------------------------------------------------------------
    def _publish_count(self) -> None:
        """POS_HA_SLAVES = the open connections now, as slaves() lists them (called under _lock:
        the stores land in the order of the changes).  Io workers read it per send (isSlaveOK);
        the status file is too slow for that."""
        self.ctl.set(C.POS_HA_SLAVES, 0 if self._stopping else sum(not c.closed for c in self._conns))

    def slaves(self) -> list[dict]:
        """One dict per connected slave: addr, ackOffset, sentOffset, since (ms), startOffset."""
        with self._lock:
            return [c.info() for c in self._conns if not c.closed]

    def write_status(self) -> None:
        if not self.status_path:
            return
        with self._status_lock:
            # the snapshot under the lock too: files land in the order their snapshots were taken
            # (a periodic write must not put back a list older than a connect's)
            doc = {"slaves": [] if self._stopping else self.slaves(), "updated": _now_ms(),
                   "listen": f"{self.listen_host}:{self.port}"}
            self._status_at = time.monotonic()
            try:
                replace_file(self.status_path, json.dumps(doc))
            except OSError as e:
                self._status_episode.failed(e)
            else:
                self._status_episode.ok()

    def _status_loop(self) -> None:
        while not self._stopping:
            time.sleep(STATUS_INTERVAL_S / 4)
            if not self._stopping and time.monotonic() - self._status_at >= STATUS_INTERVAL_S:
                self.write_status()

    # ---- stopping ------------------------------------------------------------------------------
    def stop(self) -> None:
        if not self._stopping:          # (a second stop may come after the store closed)
            self._stopping = True
            with self._lock:
                self._publish_count()
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
