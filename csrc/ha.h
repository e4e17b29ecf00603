/*
 * ha.h -- the HA transport: master/slave replication of the CommitLog bytes as they are on disk
 * (ha.c; Python: mq.ha, through mq.store.commitlog's ha_* methods).
 *
 * Master -> slave frame (mq.wire.ha declares it):
 *   int64 masterPhyOffset | int32 bodySize | bodySize raw CommitLog bytes   (bodySize 0 = heartbeat)
 * A body never crosses a file.  The slave checks every record it receives (mq_ha_publish) and
 * keeps the bytes as they came: disk format = replication format.
 *
 * Sockets are the caller's (blocking, with SO_RCVTIMEO / SO_SNDTIMEO where it wants a bound);
 * the calls send and receive with the GIL released.  One receiving thread per handle (it owns
 * the handle's staging buffer and pipe).  Each frame's file is used through a dup of its fd the
 * call owns, so another thread's mq_commitlog_retire may run beside these calls (a frame below
 * MIN then fails: MQ_E_RANGE); mq_commitlog_release may not (the slave reads the mapping).
 *
 * Returns: 0 or a negative MQ_E_*.  Socket errors are MQ_E_IO with errno in the handle
 * (mq_commitlog_errno): EAGAIN means stalled past SO_RCVTIMEO / SO_SNDTIMEO, ECONNRESET closed
 * by the peer, EPIPE a file shorter than it should be.  "File errors" as in commitlog.h.
 *
 * mq_ha_send_frame  sends the header, then up to max_body bytes of [offset, WRITE) from one
 *     file with sendfile(2) (no copy through user space).  *body_out = bytes of body sent (0
 *     when nothing is written yet: a heartbeat).  MQ_E_RANGE when offset is outside [MIN,
 *     WRITE]; MQ_E_IO; file errors.
 * mq_ha_send_run  the master's streaming loop, one C call for many frames (catch-up is bound
 *     by per-frame work, not by bytes: at 32 KiB frames a Python round per frame cost ~100 us
 *     against ~12 us to move the bytes; the frames are the same as one mq_ha_send_frame each):
 *     sends [from, to) as frames of at most frame_max bytes, none crossing a file.  Before each
 *     frame is sent, *in_flight_end is stored (release) as that frame's end: the ack checker
 *     reads it, so an ack can never cover bytes not yet being sent.  *sent_end_out = end of the
 *     last frame sent whole (== to on MQ_OK).  MQ_E_INVAL when frame_max is 0; MQ_E_RANGE when
 *     [from, to) is not inside [MIN, WRITE]; MQ_E_IO; file errors.
 * mq_ha_recv_body  the slave receives exactly `size` bytes from the socket into the file at
 *     `offset` (splice socket -> pipe -> file, or recv + pwrite where splice is refused;
 *     creating the file if needed).  The bytes are beyond WRITE, so nobody reads them yet.
 *     MQ_OK (size 0 is a no-op); MQ_E_RANGE when the body would cross a file or start below
 *     WRITE (never over published bytes); MQ_E_IO; file errors.
 * mq_ha_publish  validates records from WRITE up to received_end (magic, sizes, CRC,
 *     PHYSICALOFFSET) and publishes the complete ones: WRITE, LAST_STORE_TS and MSGS under the
 *     lock, SEQ_WRITE woken.  A record (or filler) cut by received_end stays pending.
 *     *published_out = WRITE afterwards.  MQ_E_CORRUPT when a record is invalid: what came
 *     before it is still published, and the caller drops the connection and receives again
 *     from WRITE.  File errors; MQ_E_IO (lock).
 * mq_ha_recv_run  the slave's streaming loop.  Reads frame headers (a header once begun is read
 *     whole, bounded by SO_RCVTIMEO) while bytes keep coming: a frame at *expected with a body
 *     of at most body_max bytes inside one file is received into the log (mq_ha_recv_body) and
 *     *expected advances; a heartbeat at *expected is consumed.  Before each header after the
 *     first, a non-blocking read: nothing ready -> it stops (*why_out = MQ_HA_RX_IDLE); at
 *     least `budget` bytes received -> it stops (MQ_HA_RX_BUDGET); any other header is consumed
 *     and handed back in *other_offset and *other_size (MQ_HA_RX_OTHER) for the caller's rules
 *     (rebase, divergence, rejection).  What was received is validated and published
 *     (mq_ha_publish) before it returns, even after a socket error: *published_out.  Returns
 *     MQ_E_CORRUPT when a received record is invalid (it wins over a socket error), else the
 *     receive's error (MQ_E_IO, MQ_E_RANGE, file errors), else a publish error, else MQ_OK.
 *
 * The steady-state loops (one C call each runs for up to wait_ms, then returns so that the
 * caller's thread looks at its own flags; between wakes no Python runs, so a wake of the chain
 * master writer -> slave -> master reader costs the kernel's wake and no interpreter round):
 * mq_ha_stream_for  the master's writer: while [s->next, WRITE) holds bytes, mq_ha_send_run of
 *     at most s->run_max bytes at a time (s->next advances, s->last_send_ms = CLOCK_MONOTONIC
 *     ms); with nothing to send, a heartbeat (header-only frame at s->next, *in_flight_end
 *     raised to s->next first) once s->heartbeat_ms passed since the last frame; else it sleeps
 *     on SEQ_WRITE until the next heartbeat or the deadline.  Errors as mq_ha_send_run and
 *     mq_ha_send_frame; MQ_E_INVAL when run_max, frame_max or heartbeat_ms is 0.
 * mq_ha_read_acks  the master's reader of the slave's 8-byte reports once the first one (the
 *     start, a->start) was handled by the caller: a report <= *in_flight_end (read per report:
 *     the writer raises it before each frame) raises a->ack, and POS_ACKED (SEQ_ACK woken once a
 *     read); a repeat of a->start while a->ack < 0 is ignored; anything else (beyond the cell,
 *     or negative as an int64) stops it: a->why = MQ_HA_ACKS_BAD, a->bad = the report, the
 *     reports after it unread (the caller closes the connection).  A report's first bytes wait
 *     in a->carry.  a->why = MQ_HA_ACKS_CLOSED when the peer closed; MQ_HA_ACKS_WAITED when
 *     wait_ms passed.  a->last_read_ms = CLOCK_MONOTONIC ms of the last bytes received.
 *     MQ_E_IO with a->err = errno (not the handle's errno: the writer's thread owns that).
 * mq_ha_slave_for  the slave's loop: a report of x->expected every x->report_interval_ms
 *     (x->last_report_ms), and while bytes arrive mq_ha_recv_run (x->budget bytes at most per
 *     run, bodies of at most x->body_max); each run that moved x->expected advances POS_CONFIRM
 *     and reports it at once.  A header that is not the next frame stops it: x->why =
 *     MQ_HA_RX_OTHER with x->other_offset and x->other_size (the caller's rules); MQ_HA_RX_IDLE
 *     when wait_ms passed.  x->published and x->last_read_ms after each run.  Returns as
 *     mq_ha_recv_run (MQ_E_CORRUPT: nothing past x->published is published, nothing confirmed);
 *     MQ_E_IO for a failed report; MQ_E_INVAL when report_interval_ms or budget is 0.
 */
#ifndef MQ_HA_H
#define MQ_HA_H

#include "mqbase.h"

#define MQ_HA_FRAME_HEADER 12   /* int64 offset | int32 bodySize */
#define MQ_HA_RX_IDLE   0
#define MQ_HA_RX_BUDGET 1
#define MQ_HA_RX_OTHER  2
#define MQ_HA_REPORT    8       /* the slave's report: int64 maxPhyOffset */
#define MQ_HA_ACKS_READ 4096    /* report bytes read per recv */
#define MQ_HA_ACKS_WAITED 0
#define MQ_HA_ACKS_CLOSED 1
#define MQ_HA_ACKS_BAD    2

typedef struct mq_ha_stream {
    uint64_t next;                               /* in/out: the next byte to send */
    int64_t last_send_ms;                        /* in/out: CLOCK_MONOTONIC ms of the last frame sent */
    uint64_t run_max;                            /* bytes per mq_ha_send_run */
    uint32_t frame_max;                          /* body bytes per frame */
    uint32_t heartbeat_ms;                       /* a heartbeat after this long without a frame */
} mq_ha_stream;

typedef struct mq_ha_acks {
    uint64_t start;                              /* the slave's first report */
    int64_t ack;                                 /* in/out: the highest valid report, -1 before one */
    int64_t last_read_ms;                        /* out: CLOCK_MONOTONIC ms of the last bytes received */
    uint64_t bad;                                /* out: the report that broke the rules (why BAD) */
    uint8_t carry[8];                            /* in/out: a report's first bytes (MQ_HA_REPORT) */
    uint32_t carry_n;
    int32_t why;                                 /* out: MQ_HA_ACKS_* */
    int32_t err;                                 /* out: errno with MQ_E_IO */
} mq_ha_acks;

typedef struct mq_ha_rx {
    uint64_t expected;                           /* in/out: the offset the next frame must carry */
    uint64_t published;                          /* out: WRITE after the last run */
    uint64_t other_offset;                       /* out (why OTHER): the header handed back */
    uint32_t other_size;
    int32_t why;                                 /* out: MQ_HA_RX_IDLE or MQ_HA_RX_OTHER */
    int64_t last_read_ms;                        /* in/out: CLOCK_MONOTONIC ms */
    int64_t last_report_ms;                      /* in/out: CLOCK_MONOTONIC ms */
    uint64_t budget;                             /* bytes per mq_ha_recv_run */
    uint32_t body_max;
    uint32_t report_interval_ms;
} mq_ha_rx;

int      mq_ha_send_frame(mq_commitlog *cl, int sock_fd, uint64_t offset, uint32_t max_body, uint32_t *body_out);
int      mq_ha_send_run(mq_commitlog *cl, int sock_fd, uint64_t from, uint64_t to, uint32_t frame_max,
                        uint64_t *in_flight_end, uint64_t *sent_end_out);
int      mq_ha_recv_body(mq_commitlog *cl, int sock_fd, uint64_t offset, uint32_t size);
int      mq_ha_publish(mq_commitlog *cl, uint64_t received_end, uint64_t *published_out);
int      mq_ha_recv_run(mq_commitlog *cl, int sock_fd, uint64_t *expected, uint64_t budget, uint32_t body_max,
                        int *why_out, uint64_t *other_offset, uint32_t *other_size, uint64_t *published_out);
int      mq_ha_stream_for(mq_commitlog *cl, int sock_fd, mq_ha_stream *s, uint32_t wait_ms, uint64_t *in_flight_end,
                          uint64_t *sent_end);
int      mq_ha_read_acks(mq_commitlog *cl, int sock_fd, mq_ha_acks *a, uint32_t wait_ms, const uint64_t *in_flight_end);
int      mq_ha_slave_for(mq_commitlog *cl, int sock_fd, mq_ha_rx *x, uint32_t wait_ms);

#endif
