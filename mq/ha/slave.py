"""The slave side of 4.x HA (RocketMQ's HAService.HAClient): one thread that
connects to the master, reports how far it is, and appends the master's
CommitLog bytes to its own log at the same offsets.

Per connection:
  * report the received end (initially the published write_pos) at once.
    RocketMQ waits haSendHeartbeatInterval (5 s) after connecting before its
    first report, so its first transfer starts ~5 s late; we report at once.
    Then after every run of data frames (mq_ha_recv_run: the frames that keep
    arriving, at most REPORT_EVERY_BYTES), and every report_interval_ms.  The
    steady state is one C call (mq_ha_slave_for: wait, receive, publish, confirm,
    report) per STOP_CHECK_MS; Python sees only the headers that are not the
    next frame (the rows below other than the first two), the flags and the idle limit.
    A report per run instead of per frame is what lets catch-up run at the
    speed of the bytes; an idle socket ends a run, so a lone frame (a SYNC
    master's send) is still acknowledged at once.
  * read a 12-byte header (mq.wire.ha), then act on its offset:

    | header offset vs expected           | body  | action                                         |
    | == expected                         | > 0   | receive into the mapped log, validate+publish  |
    |                                     |       | (corrupt -> log, close, reconnect: we resume   |
    |                                     |       | from our own write_pos); report                |
    | == expected                         | 0     | heartbeat                                      |
    | > 0, our log empty (write_pos 0),   | any   | re-base the log at offset (the master starts   |
    |   file-aligned                      |       | an empty slave at its last file), then as ==   |
    | < expected                          | 0     | divergence (the master is behind us): log the  |
    |                                     |       | byte count, truncate to offset, report, go on  |
    | < expected                          | -1    | take-back (the master lost our surplus in a    |
    |                                     |       | crash): send the mark and [offset, expected)   |
    |                                     |       | as frames, keep our log, go on (mq.wire.ha)    |
    | anything else                       |       | log, close, reconnect                          |

`expected` is the received end: bytes of a record cut by a frame end are
received but not yet published; a reconnect starts again from write_pos.
Reports carry the received end: every complete record below it has been
validated and published (ha_publish runs before the report), so an ack never
covers a record the slave does not have.

The master address comes from master_addr_fn() ("host:port", None = unknown)
on every connect attempt; unknown or unreachable -> retry after RETRY_FIRST_MS,
doubling up to retry_interval_ms (reset by a connection).  A connection that receives nothing for
housekeeping_interval_ms (the master heartbeats every 5 s) is closed."""
from __future__ import annotations

import logging
import socket
import threading
from typing import Callable

from mq.store import control as C
from mq.store.commitlog import CommitLog
from mq.store.native import StoreError, ffi, lib
from mq.wire import ha as W

from .common import FRAME_BODY_SIZE_MAX, JOIN_TIMEOUT_S, REPORT_EVERY_BYTES, SLAVE_RCVBUF_BYTES, STOP_CHECK_MS, \
    configure_socket, monotonic_ms, parse_addr, shutdown_quietly
from .truncate import rebase_empty, truncate_to

log = logging.getLogger("mq.ha.slave")

RETRY_FIRST_MS = 200      # the first reconnect after a failure; doubling up to retry_interval_ms


class SessionEnd(Exception):
    """Ends one connection (the reason is logged by whoever raises it)."""


class HASlave:
    """`HASlave(...).start()`; `stop()` closes the connection and joins the thread.

    on_divergence(offset) must cut the store to `offset` (the master's end) and
    raise if it cannot; without it a divergence is logged and the connection
    closed (and it will happen again on the next connect).  for_store() wires
    truncate_to(store, offset)."""

    def __init__(self, cl: CommitLog, ctl: C.ControlBlock, master_addr_fn: Callable[[], str | None], *,
                 report_interval_ms: int = 5000, housekeeping_interval_ms: int = 20000,
                 retry_interval_ms: int = 5000, connect_timeout_ms: int = 3000,
                 on_divergence: Callable[[int], object] | None = None):
        assert report_interval_ms > 0 and housekeeping_interval_ms > 0 and retry_interval_ms > 0
        self.cl = cl
        self.ctl = ctl
        self.master_addr_fn = master_addr_fn
        self.report_interval_ms = report_interval_ms
        self.housekeeping_interval_ms = housekeeping_interval_ms
        self.retry_interval_ms = retry_interval_ms
        self.connect_timeout_ms = connect_timeout_ms
        self.on_divergence = on_divergence
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None
        # observable state (tests, runtime info)
        self.master_addr: str | None = None
        self.connected = False
        self.connects = 0
        self.received_end = cl.write_pos
        self.last_error = ""
        self.divergences: list[tuple[int, int]] = []     # (our end, master end) per divergence seen
        self.gave_back: list[tuple[int, int]] = []       # (from, to) per take-back the master asked for

    @classmethod
    def for_store(cls, store, master_addr_fn: Callable[[], str | None], **kw) -> "HASlave":
        """A slave for a MessageStore (owner or attached): divergence -> truncate_to(store, offset)."""
        kw.setdefault("on_divergence", lambda offset: truncate_to(store, offset))
        return cls(store.cl, store.ctl, master_addr_fn, **kw)

    def start(self) -> "HASlave":
        self._thread = threading.Thread(target=self._run, name="ha-slave", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        sock = self._sock
        if sock is not None:
            shutdown_quietly(sock)
        if self._thread is not None:
            self._thread.join(JOIN_TIMEOUT_S)
            self._thread = None

    # ---- connecting ------------------------------------------------------------------------------
    def _run(self) -> None:
        # reconnects start fast and back off to retry_interval_ms: a master back from a crash
        # may be refusing writes until we reconnect (mq.ha.master, take-back)
        delay_ms = RETRY_FIRST_MS
        while not self._stop.is_set():
            sock = self._connect()
            if sock is None:
                self._stop.wait(min(delay_ms, self.retry_interval_ms) / 1000)
                delay_ms = min(delay_ms * 2, self.retry_interval_ms)
                continue
            delay_ms = RETRY_FIRST_MS
            self._sock = sock
            try:
                self._session(sock)
            except SessionEnd as e:
                self.last_error = str(e)
            except (OSError, StoreError) as e:
                self.last_error = str(e)
                if not self._stop.is_set():
                    log.warning("HA connection to %s failed: %s", self.master_addr, e)
            except Exception:
                log.exception("HA slave: session with %s failed", self.master_addr)
            finally:
                self.connected = False
                self._sock = None
                shutdown_quietly(sock)
                sock.close()
            if not self._stop.is_set():
                first_ms = min(RETRY_FIRST_MS, self.retry_interval_ms)
                log.info("HA connection to %s closed; reconnecting in %d ms (then backing off to %d ms)",
                         self.master_addr, first_ms, self.retry_interval_ms)
                self._stop.wait(first_ms / 1000)

    def _connect(self) -> socket.socket | None:
        try:
            addr = self.master_addr_fn()
        except Exception as e:
            log.warning("HA slave: master address unavailable: %s", e)
            return None
        if not addr:
            return None
        try:
            host, port = parse_addr(addr)
        except ValueError as e:
            log.error("HA slave: %s", e)
            return None
        self.master_addr = addr
        try:
            sock = socket.create_connection((host, port), timeout=self.connect_timeout_ms / 1000)
        except OSError as e:
            log.warning("HA slave: connecting to master %s failed: %s; retrying in %d ms", addr, e,
                        self.retry_interval_ms)
            return None
        try:
            configure_socket(sock, self.housekeeping_interval_ms)
            # a receive buffer the master can fill while we write and check the last run
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SLAVE_RCVBUF_BYTES)
        except OSError as e:
            log.warning("HA slave: socket set-up failed: %s", e)
            sock.close()
            return None
        self.connects += 1
        self.connected = True
        log.info("HA slave connected to master %s; our end %d", addr, self.cl.write_pos)
        return sock

    # ---- one connection -----------------------------------------------------------------------------
    def _report(self, sock: socket.socket, value: int) -> None:
        sock.sendall(W.pack_slave_report(value))

    def _session(self, sock: socket.socket) -> None:
        cl, ctl = self.cl, self.ctl
        fs = cl.file_size
        expected = cl.write_pos
        self.received_end = expected
        self._report(sock, expected)
        # C receives, publishes, confirms and reports (mq_ha_slave_for), STOP_CHECK_MS a call;
        # here the flags, the idle limit and every header that is not the next frame
        rx = ffi.new("mq_ha_rx *", {"expected": expected, "budget": REPORT_EVERY_BYTES, "body_max": FRAME_BODY_SIZE_MAX,
                                    "report_interval_ms": self.report_interval_ms})
        rx.last_report_ms = rx.last_read_ms = monotonic_ms()
        fd = sock.fileno()
        while not self._stop.is_set():
            rx.expected = expected
            corrupt = cl.ha_slave_for(fd, rx, STOP_CHECK_MS)
            if corrupt:
                log.error("HA slave: the data from %s is not valid at %d (received up to %d); nothing past %d "
                          "is published; reconnecting", self.master_addr, rx.published, rx.expected, rx.published)
                raise SessionEnd("corrupt data")
            if rx.expected != expected:
                expected = self.received_end = rx.expected
            if rx.why != lib.MQ_HA_RX_OTHER:
                idle_ms = monotonic_ms() - rx.last_read_ms
                if idle_ms >= self.housekeeping_interval_ms:
                    log.warning("HA slave: nothing from master %s for %.0f ms; closing", self.master_addr, idle_ms)
                    raise SessionEnd("master silent")
                continue
            offset, size = rx.other_offset, rx.other_size
            if size == W.TAKE_BACK_SIZE & 0xFFFFFFFF:
                self._give_back(sock, offset, expected)
                rx.last_report_ms = monotonic_ms()
                continue
            if size > FRAME_BODY_SIZE_MAX:
                log.error("HA slave: bad frame header from %s (body of %d bytes, over %d); closing",
                          self.master_addr, size, FRAME_BODY_SIZE_MAX)
                raise SessionEnd("bad header")
            if size and offset % fs + size > fs:
                log.error("HA slave: frame [%d, +%d) from %s crosses a CommitLog file end; closing",
                          offset, size, self.master_addr)
                raise SessionEnd("frame crosses a file")
            if offset != expected and expected == 0 and cl.write_pos == 0 and offset % fs == 0:
                rebase_empty(cl, ctl, offset)
                expected = self.received_end = offset
            if offset == expected:
                if size:                           # the first frame after a re-base
                    cl.ha_recv_body(sock.fileno(), offset, size)
                    rx.last_read_ms = monotonic_ms()
                    published, corrupt = cl.ha_publish(offset + size)
                    if corrupt:
                        log.error("HA slave: the data from %s is not valid at %d (frame [%d, +%d)); "
                                  "nothing past %d is published; reconnecting", self.master_addr, published,
                                  offset, size, published)
                        raise SessionEnd("corrupt data")
                    expected = self._received(sock, offset + size)
                    rx.last_report_ms = monotonic_ms()
            elif offset < expected and size == 0:
                expected = self._diverged(offset, expected)
                self._report(sock, expected)
                rx.last_report_ms = monotonic_ms()
            else:
                log.error("HA slave: frame at %d (+%d) from %s, expected %d; closing",
                          offset, size, self.master_addr, expected)
                raise SessionEnd("offset mismatch")

    def _give_back(self, sock: socket.socket, offset: int, expected: int) -> None:
        """The master lost [offset, our end) in a crash and asks for it (mq.wire.ha, take-back):
        the mark, then those bytes as HA frames, with the master's own C send path.  We keep
        them: our log stays as it is."""
        end = self.cl.write_pos
        if not (self.ctl.get(C.POS_MIN) <= offset < end == expected):
            log.error("HA slave: take-back request from %s at %d, but we hold [%d, %d) (received %d); closing",
                      self.master_addr, offset, self.ctl.get(C.POS_MIN), end, expected)
            raise SessionEnd("bad take-back request")
        log.warning("HA slave: master %s restarted without [%d, %d) (%d bytes); giving them back",
                    self.master_addr, offset, end, end - offset)
        sock.sendall(W.pack_take_back_mark())
        in_flight, sent = ffi.new("uint64_t *"), ffi.new("uint64_t *")
        self.cl.ha_send_run(sock.fileno(), offset, end, W.HA_TRANSFER_BATCH_SIZE, in_flight, sent)
        self.gave_back.append((offset, end))

    def _received(self, sock: socket.socket, received: int) -> int:
        """Bytes up to `received` are in the log (complete records published): confirm, report."""
        self.ctl.advance(C.POS_CONFIRM, received)
        self.received_end = received
        self._report(sock, received)
        return received

    def _diverged(self, master_end: int, expected: int) -> int:
        """The master's end is below ours: cut back to it.  Returns the new expected offset."""
        cl = self.cl
        ours = cl.write_pos
        self.divergences.append((expected, master_end))
        if master_end >= ours:
            # only received-but-unpublished bytes lie past the master's end: nothing to cut
            log.warning("HA slave: master %s ends at %d, inside a record we had partly received; "
                        "receiving again from there", self.master_addr, master_end)
            return master_end
        log.error("HA slave: divergence: we hold %d bytes more than master %s (ours end at %d, the master's "
                  "at %d); truncating to %d", ours - master_end, self.master_addr, ours, master_end, master_end)
        if self.on_divergence is None:
            raise SessionEnd("diverged, and no on_divergence to truncate")
        self.on_divergence(master_end)
        now = cl.write_pos
        if now > master_end:
            log.error("HA slave: truncation left the log at %d, above the master's end %d; closing",
                      now, master_end)
            raise SessionEnd("truncation incomplete")
        self.received_end = now
        return now
