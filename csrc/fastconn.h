/*
 * fastconn.h -- connections served from C: the io worker's connection loop for producers and
 * consumers.
 *
 * The C send path (fastsend.h) takes the frames of a read Python hands it.  Per request that
 * still costs the event loop's read callback, a bytes object, the Python around mq_fast_read and
 * mq_fast_run, and a Python write per connection.  A connection whose reads C takes whole (a
 * producer's) can instead be given to C: C reads it, walks its frames with mq_fast_read, appends
 * what is staged with mq_fast_run and writes the answers itself, one send(2) per connection and
 * run.  The worker's event loop watches one descriptor for all of them (an epoll set, level
 * triggered) and makes one call, mq_fast_poll, when any is readable.
 *
 * Python keeps ownership and policy: it decides which connections to give (mq_fast_adopt) and
 * takes them back when it must (mq_fast_disown).  C gives a connection back by itself -- it stops
 * reading it, and a poll event says why -- at the first frame mq_fast_read hands back, at the end
 * of the stream or a read error, at a frame longer than MQ_FAST_CONN_BUF_MAX, and when a socket
 * does not take a send's answer whole (the rest of that connection's answers of the run are then
 * left in the spans for Python, which queues them on its transport).  Its unread bytes (the frame
 * handed back and whatever follows) wait in C for mq_fast_disown.  So every byte is read once, by
 * one side, in order; and answers are written by C only while the connection's transport holds
 * nothing unsent (Python takes a connection back when a write of its own is not taken whole).
 *
 * Pulls.  A connection adopted with `pulls` is walked with pulls on (mq_fast_read answers those
 * that find data, and the offset queries, where Python turned pulls on); C sends each answer as
 * the walk reaches it, before the run's answers of the sends that came before it (as Python's
 * read path does), and keeps its mq_fast_pulled for Python (the offset commit, the stats:
 * mq_fast_conns_take_pulled; MQ_FAST_CONN_PULLED_MAX of them, then the walk stops as at a full
 * stage).  What of an answer the socket does not take is owed: copied, sent as the socket takes
 * it (the connection watched for writing), with the later answers of the connection appended to
 * it; the connection's frames wait, unread, until it is paid (the peer's backpressure, as a full
 * transport is Python's).  So a connection owes at most one pull's answer (the pull limits' bytes
 * and its header) and the answers of one run (MQ_FAST_MSGS_MAX); this is not counted in Python's
 * budget of unsent bytes (mq.remoting.server).  A pull handed back (no data: Python suspends it) gives the connection
 * back; an SQL92 pull handed back for a verdict says so in the event (sql_missed).
 *
 * C reads and writes a dup of the socket, taken by mq_fast_adopt and closed by mq_fast_disown, so
 * the worker closing its own descriptor can never leave C writing to a connection that reused the
 * number.
 *
 * Buffers: a connection's bytes are read into a buffer of its own, MQ_FAST_CONN_BUF to start,
 * doubled (before a poll walks it) while a frame needs more, up to MQ_FAST_CONN_BUF_MAX.  Sends
 * staged from it point into it until the run at the end of the same poll; it is never moved,
 * grown or freed between a walk and that run (a connection is served at most once per poll, and
 * a buffer given back is kept until the next call after mq_fast_disown).
 *
 * mq_fast_conns_open  a connection table over `f` (which must outlive it) and its epoll set.
 *     MQ_E_IO when epoll_create1 or an allocation fails (errno is in f's handle).
 * mq_fast_conns_close  closes every dup, the epoll set, frees the table (void).
 * mq_fast_conns_fd  the epoll set's descriptor, for the event loop to watch (a getter).
 * mq_fast_adopt  serves the TCP socket `fd` from now on as connection `slot` (mq_fast_read's conn:
 *     its staged sends and held answers carry it), its born host (4 or 16 bytes) and port as
 *     mq_fast_read takes them, and whether it may pull (mq_fast_read's `pulls`); *cid_out names
 *     it in the other calls and in events.  MQ_E_FULL
 *     when MQ_FAST_CONNS_MAX are served, MQ_E_INVAL for a slot served already or a bad host length,
 *     MQ_E_IO when dup or epoll_ctl fails.
 * mq_fast_disown  stops serving cid (served or given back by a poll) and hands back its unread
 *     bytes, *rest and *n_rest, and the answers it owes, *owed and *n_owed (they go to the peer
 *     before anything else), valid until the next call on `c` (copy them first).  Closes the
 *     dup.  MQ_E_INVAL for a cid not in use.
 * mq_fast_conns_owing  how many connections owe answers now (a getter).
 * mq_fast_conn_active_ms  when cid last read or wrote bytes (CLOCK_MONOTONIC ms; a getter; -1 for
 *     a cid not in use).
 * mq_fast_poll  serves the connections that are readable now (epoll_wait without waiting, at most
 *     MQ_FAST_POLL_BATCH) and those a full stage left with frames to walk: for each, the frames
 *     buffered, one recv(2), the frames it brought; then, if anything is staged (Python's sends
 *     too), one mq_fast_run(f, refuse_held, out, out_cap, spans, ...) and the answers of the
 *     connections C serves sent.  o: the run's counts as mq_fast_run gives them (n_spans, n_fails,
 *     n_ok, n_held; ran 1 when it ran), events[0, n_events) the connections given back (each at
 *     most once a poll: events_cap >= MQ_FAST_POLL_BATCH + MQ_FAST_MSGS_MAX), more 1
 *     when a full stage left connections with frames to walk (call again: their sockets may
 *     not be readable).  spans[0, n_spans) are
 *     what C did not send, in order: the answers of connections Python serves, and of those C gave
 *     back (a span C sent in part starts at what is left).  Errors: mq_fast_run's; an epoll_wait
 *     failure is MQ_E_IO.
 *     The sends a poll's run answered now (not held, not refused) are counted, with the poll's
 *     duration (its start to its answers sent) as their latency, for mq_fast_conns_take_sent.
 * mq_fast_poll_wait  mq_fast_poll, then, while a poll leaves nothing for Python (no span, fail,
 *     held answer, event or `more`), waits on the event loop's own epoll set `loop_fd` -- at most
 *     until wait_ms after the call -- and polls again when C's set is its only ready descriptor.
 *     One request at a time the loop's turn and the Python around a poll were most of the io
 *     worker's user time; this keeps them off the path while only C's connections are busy.
 *     Returns at the first poll with something for Python (o describes it, as mq_fast_poll's;
 *     n_ok, ran and polls summed over the call), when the trace rows kept need taking (past
 *     MQ_FAST_TRACE_ROWS_MAX - MQ_FAST_MSGS_MAX), at wait_ms, at a signal, or when any other
 *     descriptor of the loop is ready (it watches them level-triggered: looking leaves them
 *     ready for the loop).  The price: callbacks the loop had ready and its timers wait up to
 *     wait_ms.  Errors: mq_fast_poll's.
 * mq_fast_conns_take_pulled  moves up to cap of the pulls answered (kept in order) to out: their
 *     number (a count: EXCEPTION to the convention; nothing fails).  Each is mq_fast_read's
 *     mq_fast_pulled of it (kind, group, topic, queue, commit, msgs, bytes; frame_* point into a
 *     buffer reused since).  A poll's o->n_pulled says how many are kept; mq_fast_poll_wait
 *     returns once they are half of MQ_FAST_CONN_PULLED_MAX.
 * mq_fast_conns_take_sent  copies those counts since the last take into *out and zeroes them:
 *     out->n[k] sends whose latency in microseconds has bit length k (the last bucket: longer),
 *     out->sum_ns their latencies' sum -- the layout of a send row of the worker's stats
 *     (mq/store/stats.py), so its poll answers need no Python per poll (void).
 * mq_fast_conns_release  mq_fast_release(f, pos, term, acked, out, out_cap, spans, spans_cap, ...)
 *     (o->n_spans, and o->n_ok the answers released), then the answers of the connections C serves
 *     sent as mq_fast_poll sends them, with the same events (events_cap >= spans_cap).
 */
#ifndef MQ_FASTCONN_H
#define MQ_FASTCONN_H

#include "mqbase.h"
#include "fastsend.h"

#define MQ_FAST_CONNS_MAX     4096          /* connections C serves at once */
#define MQ_FAST_CONN_BUF      262144        /* a connection's read buffer to start with (uvloop reads 256 KiB) */
#define MQ_FAST_CONN_BUF_MAX  8388608       /* ... and at most (a longer frame goes back to Python) */
#define MQ_FAST_POLL_BATCH    64            /* readable connections served per poll, at most */
#define MQ_FAST_SENT_BUCKETS  30            /* latency buckets of mq_fast_sent (= stats.HIST_BUCKETS) */
#define MQ_FAST_CONN_PULLED_MAX 256         /* pulls answered by polls kept for Python's take */

typedef struct mq_fast_conns mq_fast_conns;

enum mq_fast_conn_why {                     /* why C gave a connection back */
    MQ_FAST_CONN_HANDBACK = 1,              /* a frame mq_fast_read left to Python */
    MQ_FAST_CONN_EOF,                       /* the peer closed its side */
    MQ_FAST_CONN_ERROR,                     /* a read or write failed (err: its errno; ENOMEM: answers it
                                               owed could not be kept, and its socket is shut down) */
    MQ_FAST_CONN_WRITE,                     /* the socket did not take an answer whole */
    MQ_FAST_CONN_BIG                        /* a frame longer than MQ_FAST_CONN_BUF_MAX */
};

typedef struct mq_fast_conn_event {
    uint32_t slot;
    uint32_t cid;
    int32_t why;                            /* enum mq_fast_conn_why */
    int32_t err;
    uint32_t sql_missed;                    /* HANDBACK of an SQL92 pull for a verdict: its filter's id + 1 */
} mq_fast_conn_event;

typedef struct mq_fast_poll_out {
    uint32_t n_spans, n_fails, n_ok, n_held;
    uint32_t n_events;
    uint32_t ran;                           /* the stage was run (Python's staged sends with the first) */
    uint32_t more;                          /* a full stage stopped the poll: call again */
    uint32_t polls;                         /* polls made: 1, more by mq_fast_poll_wait */
    uint32_t n_pulled;                      /* pulls answered and kept for mq_fast_conns_take_pulled */
} mq_fast_poll_out;

typedef struct mq_fast_sent {
    uint64_t n[30];                         /* (MQ_FAST_SENT_BUCKETS: asserted in fastconn.c) sends by the
                                               bit length of their latency in us */
    uint64_t sum_ns;
} mq_fast_sent;

int      mq_fast_conns_open(mq_fast *f, mq_fast_conns **out);
void     mq_fast_conns_close(mq_fast_conns *c);
int      mq_fast_conns_fd(const mq_fast_conns *c);
int      mq_fast_adopt(mq_fast_conns *c, uint32_t slot, int fd, const uint8_t *born_host, uint32_t born_host_len,
                       int32_t born_port, int pulls, uint32_t *cid_out);
int      mq_fast_disown(mq_fast_conns *c, uint32_t cid, const uint8_t **rest, size_t *n_rest, const uint8_t **owed,
                        size_t *n_owed);
uint32_t mq_fast_conns_take_pulled(mq_fast_conns *c, mq_fast_pulled *out, uint32_t cap);
int64_t  mq_fast_conn_active_ms(const mq_fast_conns *c, uint32_t cid);
uint32_t mq_fast_conns_owing(const mq_fast_conns *c);
int      mq_fast_poll(mq_fast_conns *c, int refuse_held, uint8_t *out, size_t out_cap, mq_fast_span *spans,
                      mq_fast_fail *fails, mq_fast_conn_event *events, uint32_t events_cap, mq_fast_poll_out *o);
void     mq_fast_conns_take_sent(mq_fast_conns *c, mq_fast_sent *out);
int      mq_fast_poll_wait(mq_fast_conns *c, int loop_fd, int wait_ms, int refuse_held, uint8_t *out, size_t out_cap,
                           mq_fast_span *spans, mq_fast_fail *fails, mq_fast_conn_event *events, uint32_t events_cap,
                           mq_fast_poll_out *o);
int      mq_fast_conns_release(mq_fast_conns *c, uint64_t pos, int64_t term, int acked, uint8_t *out, size_t out_cap,
                               mq_fast_span *spans, uint32_t spans_cap, mq_fast_conn_event *events,
                               uint32_t events_cap, mq_fast_poll_out *o);

#endif
