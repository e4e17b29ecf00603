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
 * the handle's staging buffer and pipe).  Files are used through their fd after seg_lock is let
 * go: see mq_commitlog_release's contract.
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
 */
#ifndef MQ_HA_H
#define MQ_HA_H

#include "mqbase.h"

#define MQ_HA_FRAME_HEADER 12   /* int64 offset | int32 bodySize */
#define MQ_HA_RX_IDLE   0
#define MQ_HA_RX_BUDGET 1
#define MQ_HA_RX_OTHER  2

int      mq_ha_send_frame(mq_commitlog *cl, int sock_fd, uint64_t offset, uint32_t max_body, uint32_t *body_out);
int      mq_ha_send_run(mq_commitlog *cl, int sock_fd, uint64_t from, uint64_t to, uint32_t frame_max,
                        uint64_t *in_flight_end, uint64_t *sent_end_out);
int      mq_ha_recv_body(mq_commitlog *cl, int sock_fd, uint64_t offset, uint32_t size);
int      mq_ha_publish(mq_commitlog *cl, uint64_t received_end, uint64_t *published_out);
int      mq_ha_recv_run(mq_commitlog *cl, int sock_fd, uint64_t *expected, uint64_t budget, uint32_t body_max,
                        int *why_out, uint64_t *other_offset, uint32_t *other_size, uint64_t *published_out);

#endif
