"""The DLedger role's peer connections: remoting frames (mq.wire.remoting) over non-blocking TCP
sockets driven by the event loop's add_reader/add_writer -- not asyncio transports, because a PUSH
body leaves with sendfile(2) straight from the data files (mq_dledger_send in C), which needs the
socket itself.  One event-loop thread does everything; nothing here blocks.

    Conn      one connection (accepted, or dialled by a Link): frames in, frames out.  Output is a
              queue of byte strings and file ranges (head + sendfile body); it is written as far
              as the socket takes it and resumed when the socket is writable again.
    Link      the outgoing connection to one peer: dials, redials with a backoff after a failure,
              and drops what was queued when the connection goes (the Raft core resends).
    Listener  accepts the peers' connections.

Limits: an incoming frame larger than FRAME_IN_MAX closes its connection (a PUSH carries at most
mq.wire.dledger_rpc.PUSH_BYTES_MAX of entries, an install's also its table of at most
INSTALL_TABLE_BYTES_MAX); a connection with more than OUT_QUEUE_MAX items
unsent is closed (a peer that stopped reading).  A dial gives up after DIAL_TIMEOUT_S.

What a frame can cost (a link must survive any frame a peer sends, in any state):
    bad framing (length, serialize type, header JSON)   the connection: closed, logged
    on_frame raises WireError (a malformed message)      the connection: closed, logged
    on_frame raises anything else                        that frame only: logged with the peer and
                                                         the message kind; the next frame is read
A frame is consumed -- the read position moved past it -- before on_frame sees it, so no outcome
of the handler can make the connection read it again.  Output: an item the sender cannot write
(an OSError, or any other error from the C sendfile path) closes the connection, because the
stream may hold part of it; the Link dials again and the Raft core resends."""
from __future__ import annotations

import errno
import logging
import socket
import struct
import time
from collections import deque

import orjson

from mq.wire import dledger_rpc as RPC
from mq.wire.errors import WireError
from mq.wire.remoting import (FRAME_PREFIX_SIZE, HEADER_LENGTH_MAX, RPC_RESPONSE, SERIALIZE_JSON, RemotingCommand,
                              decode_json_header)

log = logging.getLogger("mq.dledger.net")

FRAME_IN_MAX = RPC.PUSH_BYTES_MAX + RPC.INSTALL_TABLE_BYTES_MAX + 65536
OUT_QUEUE_MAX = 4096
RECV_SIZE = 256 * 1024
DIAL_TIMEOUT_S = 1.0
REDIAL_MIN_S = 0.05
REDIAL_MAX_S = 1.0

_PREFIX = struct.Struct(">II")


def frame_head(code: int, opaque: int, flag: int, ext: dict[str, str], body_len: int) -> bytes:
    """Length prefix, type/length word and JSON header of a frame whose body (body_len bytes) is
    sent separately.  The header is a RemotingCommand's JSON form (mq.wire.remoting's
    encode_json_header makes the same fields; orjson is several times faster, and these frames
    are two per batch of entries on each side): tests decode it with mq.wire.remoting."""
    header = orjson.dumps({"code": code, "extFields": ext, "flag": flag, "language": "JAVA", "opaque": opaque,
                           "serializeTypeCurrentRPC": "JSON", "version": 0})
    assert len(header) <= HEADER_LENGTH_MAX
    return _PREFIX.pack(4 + len(header) + body_len, (SERIALIZE_JSON << 24) | len(header)) + header


_MARK_OPAQUE = 1_987_654_321      # stands for the opaque while a template is cut out of a real header


def follow_template(group: str, leader: str, me: str, term: int) -> tuple[list[bytes], list[bytes]] | None:
    """The literal text of the PUSH headers the leader's role sends us in `term` (frame_head of
    push_ext), cut around the eight values mq_dledger_follow_take parses (csrc/dledger.h), and
    of our SUCCESS answers (response_frame of push_resp_ext) around the index and the opaque:
    (req, resp).  Cut out of headers made by the same code that makes the real ones, so the two
    cannot drift.  None when a name holds text a marker could be taken for."""
    marks = [f"@@{k}@@" for k in range(7)]
    req = frame_head(RPC.PUSH, _MARK_OPAQUE, 0, RPC.push_ext(group, leader, me, term, *marks), 0)[_PREFIX.size:]
    resp = frame_head(0, _MARK_OPAQUE, RPC_RESPONSE, RPC.push_resp_ext(term, True, "@@i@@", -1, -1), 0)[_PREFIX.size:]
    req_lits = _cut(req, [m.encode() for m in marks] + [b"%d" % _MARK_OPAQUE])
    resp_lits = _cut(resp, [b"@@i@@", b"%d" % _MARK_OPAQUE])
    return None if req_lits is None or resp_lits is None else (req_lits, resp_lits)


def _cut(text: bytes, marks: list[bytes]) -> list[bytes] | None:
    out = []
    for m in marks:
        if text.count(m) != 1:
            return None
        before, _, text = text.partition(m)
        out.append(before)
    out.append(text)
    return out


def decode_header(header: bytes) -> RemotingCommand:
    """The fields a peer frame's JSON header carries (orjson); anything else than our own frames'
    shape goes through mq.wire.remoting's lenient decoder, which raises its WireErrors."""
    try:
        d = orjson.loads(header)
        ext = d.get("extFields")
        if ext is not None and not all(type(v) is str for v in ext.values()):
            raise ValueError("non-string extFields")
        return RemotingCommand(code=int(d["code"]), opaque=int(d["opaque"]), flag=int(d.get("flag", 0)),
                               remark=d.get("remark"), ext_fields=ext)
    except (ValueError, KeyError, TypeError, AttributeError):
        return decode_json_header(header)


class Conn:
    """A framed connection.  on_frame(conn, cmd, body) is called for each whole frame (body: a
    memoryview valid only during the call); on_close(conn, why) once."""

    def __init__(self, loop, sock: socket.socket, on_frame, on_close, name: str, sender=None, on_batch_end=None,
                 take=None, read=None):
        self.loop = loop
        self.sock = sock
        self.fd = sock.fileno()
        self.on_frame = on_frame
        self.on_close = on_close
        self.on_batch_end = on_batch_end     # after the frames of one read were handled
        self.take = take                     # take(conn) -> frames taken from the start of rbuf (their
                                             # answers queued in replies), before on_frame sees the rest;
                                             # called at each read and after each frame on_frame handled
        self.read = read                     # read(conn) -> True when it did the read itself (a follower's
                                             # pushes in C), False to leave it to the path below
        self.reader = None                   # read's own state (its buffers), made by read when it takes one
        self.replies: list[bytes] = []       # what the owner queues to send after the batch
        self.name = name
        self.peer: str | None = None    # the member id, once a frame named it (for log lines)
        self.frame_errors = 0           # frames whose handler raised (each cost that frame only)
        self.sender = sender            # callable(fd, head, pos, n, progress) -> done?  (C sendfile)
        self.rbuf = bytearray()
        self.chunk: bytearray | None = None  # what a read lands in before rbuf (made at the first)
        self.out: deque = deque()
        self.out_done = 0               # bytes of out[0] already written
        self.closed = False
        self.writing = False
        sock.setblocking(False)
        if sock.family != socket.AF_UNIX:   # (tests drive a Conn over a socket pair)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        loop.add_reader(self.fd, self._on_readable)

    @property
    def label(self) -> str:
        return self.name if self.peer is None else f"{self.name} (member {self.peer})"

    # ---- output -------------------------------------------------------------------------------------
    def send(self, data: bytes) -> None:
        self._queue(data)

    def send_range(self, head: bytes, pos: int, nbytes: int) -> None:
        """head, then nbytes of the data files at pos (sendfile)."""
        assert self.sender is not None
        self._queue((head, pos, nbytes))

    def queue_partial(self, head: bytes, pos: int, nbytes: int, done: int) -> None:
        """A frame (head, then nbytes at pos) of which `done` bytes were written by another
        writer (C, mq_dledger_lead_progress) while nothing was queued: the rest goes first."""
        assert not self.out and self.sender is not None
        if self.closed:
            return
        self.out.append((head, pos, nbytes))
        self.out_done = done
        if not self.writing:
            self.writing = True
            self.loop.add_writer(self.fd, self._pump)

    def _queue(self, item) -> None:
        if self.closed:
            return
        if len(self.out) >= OUT_QUEUE_MAX:
            self.close(f"{OUT_QUEUE_MAX} frames unsent: the peer does not read")
            return
        self.out.append(item)
        if not self.writing:
            self._pump()

    def _pump(self) -> None:
        while self.out and not self.closed:
            item = self.out[0]
            try:
                if isinstance(item, (bytes, bytearray)):
                    n = self.sock.send(memoryview(item)[self.out_done:])
                    self.out_done += n
                    done = self.out_done >= len(item)
                else:
                    head, pos, nbytes = item
                    done, self.out_done = self.sender(self.fd, head, pos, nbytes, self.out_done)
            except (BlockingIOError, InterruptedError):
                done = False
            except OSError as e:
                self.close(f"send failed: {e}")
                return
            except Exception as e:          # the C send path (StoreError) or a bug: part of the item may be out
                log.exception("peer connection %s: sending failed", self.label)
                self.close(f"send failed: {e!r}")
                return
            if not done:
                if not self.writing:
                    self.writing = True
                    self.loop.add_writer(self.fd, self._pump)
                return
            self.out.popleft()
            self.out_done = 0
        if self.writing:
            self.writing = False
            self.loop.remove_writer(self.fd)

    # ---- input --------------------------------------------------------------------------------------
    def _on_readable(self) -> None:
        if self.read is not None and self.read(self):
            return
        # Into a buffer of the connection's own, not sock.recv(RECV_SIZE): that makes a fresh bytes
        # object a read, which glibc maps (mmap), shrinks to the bytes read (mremap) and unmaps
        # when it dies -- with its page faults, 22 % of a DLedger leader's role CPU at 64
        # producers (perf, 2026-11-28), whose reads are a follower's few small answers.
        chunk = self.chunk
        if chunk is None:
            chunk = self.chunk = bytearray(RECV_SIZE)
        try:
            n = self.sock.recv_into(chunk)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            self.close(f"receive failed: {e}")
            return
        if not n:
            self.close("closed by the peer")
            return
        self.rbuf += memoryview(chunk)[:n]
        self._frames(self.take(self) if self.take is not None else 0)

    def _frames(self, taken: int = 0) -> None:
        """Hands every whole frame in rbuf to on_frame, then calls on_batch_end once (also when
        `taken` frames were taken before: their answers wait in replies).  `at` is the read
        position: it moves past a frame before the frame is handed over, and the bytes before it
        leave rbuf in `finally`, so a frame is handled at most once whatever happens."""
        buf = self.rbuf
        at = 0
        handled = taken
        try:
            while not self.closed and len(buf) - at >= FRAME_PREFIX_SIZE + 4:
                total, word = _PREFIX.unpack_from(buf, at)
                if total > FRAME_IN_MAX or total < 4:
                    self.close(f"frame of {total} bytes (limit {FRAME_IN_MAX})")
                    return
                if len(buf) - at < FRAME_PREFIX_SIZE + total:
                    break
                hlen = word & HEADER_LENGTH_MAX
                if (word >> 24) != SERIALIZE_JSON or hlen > total - 4:
                    self.close("not a JSON remoting frame")
                    return
                h0 = at + FRAME_PREFIX_SIZE + 4
                body_at, body_end = h0 + hlen, at + FRAME_PREFIX_SIZE + total
                try:
                    cmd = decode_header(bytes(buf[h0:h0 + hlen]))
                except WireError as e:
                    self.close(f"bad frame header: {e}")
                    return
                at = body_end                   # consumed: from here on it costs itself at most
                handled += 1
                with memoryview(buf) as mv, mv[body_at:body_end] as body:
                    try:
                        self.on_frame(self, cmd, body)
                    except WireError as e:
                        self.close(f"bad {self._kind(cmd)} frame: {e}")
                        return
                    except Exception as e:      # noqa: BLE001 - a handler's failure costs its frame only
                        self._frame_failed(cmd, e)
                if self.take is not None and not self.closed and len(buf) - at >= FRAME_PREFIX_SIZE + 4:
                    # what follows a frame of the handler's may be C's again (a follower's pushes
                    # after a heartbeat, a leader's answers after one to the core's own request)
                    try:
                        del buf[:at]
                    except BufferError:
                        self.rbuf = buf[at:]
                    at = 0
                    handled += self.take(self)
                    buf = self.rbuf
        finally:
            if at:
                try:
                    del buf[:at]
                except BufferError:         # a view of it outlived its handler: leave the old buffer to it
                    self.rbuf = buf[at:]
        if handled and self.on_batch_end is not None and not self.closed:
            try:
                self.on_batch_end(self)
            except Exception:
                self.frame_errors += 1
                log.exception("peer connection %s: answering the frames of one read failed; %d answers dropped, "
                              "the connection goes on", self.label, len(self.replies))
                self.replies.clear()

    @staticmethod
    def _kind(cmd) -> str:
        name = RPC.CODE_NAMES.get(cmd.code, str(cmd.code))
        return f"{name} response" if cmd.is_response else name

    def _frame_failed(self, cmd, e: Exception) -> None:
        """A handler raised: one log line for that frame (the traceback with the first of the
        connection), and the connection reads on."""
        self.frame_errors += 1
        log.error("peer connection %s: a %s frame (opaque %d) failed: %r; that frame is dropped, the connection "
                  "goes on (%d failed on it)", self.label, self._kind(cmd), cmd.opaque, e, self.frame_errors,
                  exc_info=e if self.frame_errors == 1 else None)

    # ---- closing ------------------------------------------------------------------------------------
    def close(self, why: str) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self.loop.remove_reader(self.fd)
            if self.writing:
                self.loop.remove_writer(self.fd)
        except (ValueError, OSError):
            pass
        try:
            self.sock.close()
        except OSError:
            pass
        self.out.clear()
        self.on_close(self, why)


class Link:
    """The outgoing connection to one peer (requests out, responses in)."""

    def __init__(self, loop, peer_id: str, addr: tuple[str, int], on_frame, sender, on_state=None, take=None,
                 read=None):
        self.loop = loop
        # take(peer_id, conn) -> frames taken from the start of a read before on_frame sees the rest
        self.take = (lambda conn: take(peer_id, conn)) if take is not None else None
        # read(peer_id, conn) -> True when it did the read itself (Conn's read)
        self.read = (lambda conn: read(peer_id, conn)) if read is not None else None
        self.peer_id = peer_id
        self.addr = addr
        self.on_frame = on_frame
        self.sender = sender
        self.on_state = on_state        # callable(peer_id, up: bool)
        self.conn: Conn | None = None
        self.dialing: socket.socket | None = None
        self.backoff_s = REDIAL_MIN_S
        self.next_dial = 0.0
        self.stopped = False
        self.failures = 0

    @property
    def up(self) -> bool:
        return self.conn is not None and not self.conn.closed

    def send(self, data: bytes) -> bool:
        if not self.up:
            self.dial()
            return False
        self.conn.send(data)
        return True

    def send_range(self, head: bytes, pos: int, nbytes: int) -> bool:
        if not self.up:
            self.dial()
            return False
        self.conn.send_range(head, pos, nbytes)
        return True

    def dial(self) -> None:
        if self.stopped or self.up or self.dialing is not None or time.monotonic() < self.next_dial:
            return
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            rc = s.connect_ex(self.addr)
        except OSError as e:
            s.close()
            self._failed(str(e))
            return
        if rc not in (0, errno.EINPROGRESS):
            s.close()
            self._failed(errno.errorcode.get(rc, str(rc)))
            return
        self.dialing = s
        self.loop.add_writer(s.fileno(), self._dialled)
        self._dial_timer = self.loop.call_later(DIAL_TIMEOUT_S, self._dial_timeout)

    def _dial_timeout(self) -> None:
        if self.dialing is not None:
            s, self.dialing = self.dialing, None
            self.loop.remove_writer(s.fileno())
            s.close()
            self._failed("timed out")

    def _dialled(self) -> None:
        s, self.dialing = self.dialing, None
        if s is None:
            return
        self._dial_timer.cancel()
        self.loop.remove_writer(s.fileno())
        err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if err:
            s.close()
            self._failed(errno.errorcode.get(err, str(err)))
            return
        self.backoff_s = REDIAL_MIN_S
        if self.failures:
            log.info("connected to peer %s at %s:%d", self.peer_id, *self.addr)
        self.failures = 0
        self.adopt(s)

    def adopt(self, sock: socket.socket) -> None:
        """The link's connection from now on: sock, connected (a dial's; a test's socket pair)."""
        self.conn = Conn(self.loop, sock, self.on_frame, self._closed, f"to {self.peer_id}", sender=self.sender,
                         take=self.take, read=self.read)
        if self.on_state:
            self.on_state(self.peer_id, True)

    def _failed(self, why: str) -> None:
        self.failures += 1
        if self.failures == 1:
            log.info("peer %s at %s:%d unreachable (%s); retrying", self.peer_id, *self.addr, why)
        self.next_dial = time.monotonic() + self.backoff_s
        self.backoff_s = min(REDIAL_MAX_S, self.backoff_s * 2)

    def _closed(self, conn: Conn, why: str) -> None:
        if conn is self.conn:
            self.conn = None
            log.info("connection to peer %s closed: %s", self.peer_id, why)
            self.next_dial = time.monotonic() + REDIAL_MIN_S
            if self.on_state:
                self.on_state(self.peer_id, False)

    def close(self) -> None:
        self.stopped = True
        if self.dialing is not None:
            self._dial_timeout()
        if self.conn is not None:
            self.conn.close("stopping")


class Listener:
    def __init__(self, loop, host: str, port: int, on_conn):
        self.loop = loop
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.sock.bind((host, port))
            self.sock.listen(64)
        except OSError:
            self.sock.close()               # the caller retries: no socket left behind per try
            raise
        self.sock.setblocking(False)
        self.on_conn = on_conn
        loop.add_reader(self.sock.fileno(), self._accept)

    def _accept(self) -> None:
        for _ in range(16):
            try:
                s, addr = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                log.error("accept failed: %s", e)
                return
            self.on_conn(s, addr)

    def close(self) -> None:
        try:
            self.loop.remove_reader(self.sock.fileno())
        except (ValueError, OSError):
            pass
        self.sock.close()


def response_frame(opaque: int, ext: dict[str, str], body: bytes = b"") -> bytes:
    """A whole response frame (remoting code 0; DLedger's own code travels in ext)."""
    return frame_head(0, opaque, RPC_RESPONSE, ext, len(body)) + body


def request_frame(code: int, opaque: int, ext: dict[str, str], body_len: int = 0) -> bytes:
    """The head of a request frame (the whole frame when body_len is 0)."""
    return frame_head(code, opaque, 0, ext, body_len)
