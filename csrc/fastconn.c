/*
 * fastconn.c -- connections served from C (the contract is fastconn.h's): an epoll set of
 * producer and consumer connections read, walked by mq_fast_read, run by mq_fast_run and answered
 * here.
 */
#include "internal.h"
#include "fastconn.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define SLOT_HASH (2 * MQ_FAST_CONNS_MAX)        /* power of two, half full at most */
_Static_assert((SLOT_HASH & (SLOT_HASH - 1)) == 0, "the slot hash masks");
_Static_assert(MQ_FAST_CONN_BUF_MAX >= MQ_FAST_CONN_BUF && MQ_FAST_CONN_BUF >= 4, "buffer sizes");

enum { C_FREE = 0, C_SERVED, C_GIVEN_BACK };

typedef struct fast_conn {
    int state;                  /* C_FREE, C_SERVED (in the epoll set) or C_GIVEN_BACK (awaits disown) */
    int fd;                     /* our dup of the socket; -1 when free */
    uint32_t slot;
    uint32_t born_len;
    int32_t port;
    uint8_t born[16];
    uint8_t *buf;
    size_t cap, at, have;       /* [at, have): bytes read and not taken */
    uint64_t served_in;         /* the poll that served it last (served once per poll) */
    int pending;                /* a full stage left frames to walk */
    int pulls;                  /* mq_fast_read may answer its pulls */
    int64_t active_ms;
    uint8_t *owed;              /* answers the socket did not take yet: [owed_at, owed_len) of it, */
    size_t owed_at, owed_len, owed_cap;    /* sent before anything else; no frame is walked meanwhile */
} fast_conn;

struct mq_fast_conns {
    mq_fast *f;
    mq_commitlog *cl;
    int ep;
    uint64_t polls;
    uint32_t n_used;
    uint32_t n_pending;         /* connections with pending set */
    uint32_t n_owing;           /* connections that owe answers */
    uint32_t free_top;
    uint32_t free_ids[MQ_FAST_CONNS_MAX];
    uint32_t hash[SLOT_HASH];   /* cid + 1 by slot, 0: empty (linear probing) */
    uint8_t *dead_buf;          /* the buffer of the last disown: its bytes are the caller's until the next call */
    uint8_t *dead_owed;         /* ... and its owed answers */
    mq_fast_sent sent;          /* answered by polls since the last take */
    uint32_t n_pulled;
    mq_fast_pulled pulled[MQ_FAST_CONN_PULLED_MAX];    /* pulls answered since the last take */
    fast_conn conns[MQ_FAST_CONNS_MAX];
};

static uint32_t slot_home(uint32_t slot) { return (slot * 2654435761u) & (SLOT_HASH - 1); }

static int64_t cid_of(const mq_fast_conns *c, uint32_t slot) {
    for (uint32_t i = slot_home(slot);; i = (i + 1) & (SLOT_HASH - 1)) {
        uint32_t v = c->hash[i];
        if (!v) return -1;
        if (c->conns[v - 1].slot == slot) return (int64_t)(v - 1);
    }
}

static void hash_put(mq_fast_conns *c, uint32_t slot, uint32_t cid) {
    uint32_t i = slot_home(slot);
    while (c->hash[i]) i = (i + 1) & (SLOT_HASH - 1);
    c->hash[i] = cid + 1;
}

/* Removes slot's entry and moves the entries after it in the cluster back where a lookup finds them. */
static void hash_del(mq_fast_conns *c, uint32_t slot) {
    uint32_t i = slot_home(slot);
    while (c->hash[i] && c->conns[c->hash[i] - 1].slot != slot) i = (i + 1) & (SLOT_HASH - 1);
    assert(c->hash[i]);
    c->hash[i] = 0;
    for (uint32_t j = (i + 1) & (SLOT_HASH - 1); c->hash[j]; j = (j + 1) & (SLOT_HASH - 1)) {
        uint32_t v = c->hash[j];
        c->hash[j] = 0;
        hash_put(c, c->conns[v - 1].slot, v - 1);
    }
}

int mq_fast_conns_open(mq_fast *f, mq_fast_conns **out) {
    assert(f && out);
    mq_commitlog *cl = fast_commitlog(f);
    mq_fast_conns *c = calloc(1, sizeof *c);
    if (!c) return io_fail(cl, ENOMEM);
    c->f = f;
    c->cl = cl;
    c->ep = epoll_create1(EPOLL_CLOEXEC);
    if (c->ep < 0) {
        int err = errno;
        free(c);
        return io_fail(cl, err);
    }
    for (uint32_t i = 0; i < MQ_FAST_CONNS_MAX; i++) {
        c->conns[i].fd = -1;
        c->free_ids[i] = MQ_FAST_CONNS_MAX - 1 - i;
    }
    c->free_top = MQ_FAST_CONNS_MAX;
    *out = c;
    return MQ_OK;
}

void mq_fast_conns_close(mq_fast_conns *c) {
    if (!c) return;
    for (uint32_t i = 0; i < MQ_FAST_CONNS_MAX; i++) {
        if (c->conns[i].fd >= 0) close(c->conns[i].fd);
        free(c->conns[i].buf);
        free(c->conns[i].owed);
    }
    free(c->dead_buf);
    free(c->dead_owed);
    close(c->ep);
    free(c);
}

int mq_fast_conns_fd(const mq_fast_conns *c) {
    assert(c);
    return c->ep;
}

static void drop_dead(mq_fast_conns *c) {
    free(c->dead_buf);
    free(c->dead_owed);
    c->dead_buf = c->dead_owed = NULL;
}

int mq_fast_adopt(mq_fast_conns *c, uint32_t slot, int fd, const uint8_t *born_host, uint32_t born_host_len,
                  int32_t born_port, int pulls, uint32_t *cid_out) {
    assert(c && cid_out);
    drop_dead(c);
    if (born_host_len != 4 && born_host_len != 16) return MQ_E_INVAL;
    assert(born_host);
    if (cid_of(c, slot) >= 0) return MQ_E_INVAL;
    if (!c->free_top) return MQ_E_FULL;
    uint32_t cid = c->free_ids[c->free_top - 1];
    fast_conn *k = &c->conns[cid];
    assert(k->state == C_FREE && k->fd < 0 && !k->buf);
    k->buf = malloc(MQ_FAST_CONN_BUF);
    if (!k->buf) return io_fail(c->cl, ENOMEM);
    int d = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (d < 0) {
        int err = errno;
        free(k->buf);
        k->buf = NULL;
        return io_fail(c->cl, err);
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.u32 = cid};
    if (epoll_ctl(c->ep, EPOLL_CTL_ADD, d, &ev) != 0) {
        int err = errno;
        close(d);
        free(k->buf);
        k->buf = NULL;
        return io_fail(c->cl, err);
    }
    c->free_top--;
    c->n_used++;
    k->state = C_SERVED;
    k->fd = d;
    k->slot = slot;
    k->born_len = born_host_len;
    memcpy(k->born, born_host, born_host_len);
    k->port = born_port;
    k->cap = MQ_FAST_CONN_BUF;
    k->at = k->have = 0;
    k->served_in = 0;
    k->pending = 0;
    k->pulls = pulls != 0;
    k->owed_at = k->owed_len = 0;
    k->active_ms = mono_ms();
    hash_put(c, slot, cid);
    *cid_out = cid;
    return MQ_OK;
}

/* Stops reading k (it stays in the table until disown). */
static void set_pending(mq_fast_conns *c, fast_conn *k, int on) {
    if (k->pending == on) return;
    k->pending = on;
    if (on) c->n_pending++;
    else c->n_pending--;
}

static void give_back(mq_fast_conns *c, fast_conn *k) {
    if (k->state != C_SERVED) return;
    (void)epoll_ctl(c->ep, EPOLL_CTL_DEL, k->fd, NULL);
    k->state = C_GIVEN_BACK;
    set_pending(c, k, 0);
}

int mq_fast_disown(mq_fast_conns *c, uint32_t cid, const uint8_t **rest, size_t *n_rest, const uint8_t **owed,
                   size_t *n_owed) {
    assert(c && rest && n_rest && owed && n_owed);
    drop_dead(c);
    if (cid >= MQ_FAST_CONNS_MAX || c->conns[cid].state == C_FREE) return MQ_E_INVAL;
    fast_conn *k = &c->conns[cid];
    give_back(c, k);
    close(k->fd);
    hash_del(c, k->slot);
    c->dead_buf = k->buf;
    *rest = k->buf + k->at;
    *n_rest = k->have - k->at;
    c->dead_owed = k->owed;
    *owed = k->owed ? k->owed + k->owed_at : NULL;
    *n_owed = k->owed_len - k->owed_at;
    if (*n_owed) c->n_owing--;
    k->owed = NULL;
    k->owed_at = k->owed_len = k->owed_cap = 0;
    k->buf = NULL;
    k->fd = -1;
    k->state = C_FREE;
    k->cap = k->at = k->have = 0;
    c->free_ids[c->free_top++] = cid;
    c->n_used--;
    return MQ_OK;
}

uint32_t mq_fast_conns_owing(const mq_fast_conns *c) {
    assert(c);
    return c->n_owing;
}

int64_t mq_fast_conn_active_ms(const mq_fast_conns *c, uint32_t cid) {
    assert(c);
    if (cid >= MQ_FAST_CONNS_MAX || c->conns[cid].state == C_FREE) return -1;
    return c->conns[cid].active_ms;
}

static void event(mq_fast_poll_out *o, mq_fast_conn_event *events, uint32_t cap, const fast_conn *k, uint32_t cid,
                  int why, int err) {
    assert(o->n_events < cap);          /* each connection is given back once a poll; caps in fastconn.h */
    events[o->n_events++] = (mq_fast_conn_event){.slot = k->slot, .cid = cid, .why = why, .err = err};
}

/* Gives k back for a failed write or allocation (err); the socket is shut down first when the
 * answers it owes could not be kept (ENOMEM): a stream with an answer missing must not go on. */
static void give_back_failed(mq_fast_conns *c, fast_conn *k, uint32_t cid, mq_fast_poll_out *o,
                             mq_fast_conn_event *events, uint32_t events_cap, int err) {
    if (err == ENOMEM) shutdown(k->fd, SHUT_RDWR);
    give_back(c, k);
    event(o, events, events_cap, k, cid, MQ_FAST_CONN_ERROR, err);
}

/* Before k is walked in this poll: its untaken bytes at the start of its buffer, and room for the
 * frame they begin (doubling, up to MQ_FAST_CONN_BUF_MAX).  0, or why it must be given back. */
static int make_room(fast_conn *k) {
    if (k->at == k->have) {
        k->at = k->have = 0;
    } else if (k->at) {
        memmove(k->buf, k->buf + k->at, k->have - k->at);
        k->have -= k->at;
        k->at = 0;
    }
    if (k->have < 4) return 0;
    uint64_t need = (uint64_t)be32r(k->buf) + 4;
    if (need <= k->cap) return 0;
    if (need > MQ_FAST_CONN_BUF_MAX) return MQ_FAST_CONN_BIG;
    size_t cap = k->cap;
    while (cap < need) cap *= 2;
    if (cap > MQ_FAST_CONN_BUF_MAX) cap = MQ_FAST_CONN_BUF_MAX;
    uint8_t *b = realloc(k->buf, cap);
    if (!b) return MQ_FAST_CONN_ERROR;
    k->buf = b;
    k->cap = cap;
    return 0;
}

/* Sets what k's socket is watched for: reading, or (while answers are owed) writing. */
static int watch(mq_fast_conns *c, fast_conn *k, uint32_t cid, uint32_t events) {
    struct epoll_event ev = {.events = events, .data.u32 = cid};
    return epoll_ctl(c->ep, EPOLL_CTL_MOD, k->fd, &ev) == 0 ? 0 : errno;
}

/* Sends what k owes; 0 (all sent: k is watched for reading again, or some left and the socket
 * full) or an errno. */
static int pay(mq_fast_conns *c, fast_conn *k, uint32_t cid) {
    while (k->owed_at < k->owed_len) {
        ssize_t w = send(k->fd, k->owed + k->owed_at, k->owed_len - k->owed_at, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR) continue;
            return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : errno;
        }
        k->owed_at += (size_t)w;
        k->active_ms = mono_ms();
    }
    k->owed_at = k->owed_len = 0;
    c->n_owing--;
    return watch(c, k, cid, EPOLLIN);
}

/* Adds n bytes of answers to what k owes (starting to watch it for writing); 0 or an errno. */
static int owe(mq_fast_conns *c, fast_conn *k, uint32_t cid, const uint8_t *p, size_t n) {
    if (!n) return 0;
    int first = k->owed_at == k->owed_len;
    if (first) k->owed_at = k->owed_len = 0;
    if (k->owed_cap - k->owed_len < n) {
        size_t cap = k->owed_cap ? k->owed_cap : 65536;
        while (cap - k->owed_len < n) cap *= 2;
        uint8_t *b = realloc(k->owed, cap);
        if (!b) return ENOMEM;
        k->owed = b;
        k->owed_cap = cap;
    }
    memcpy(k->owed + k->owed_len, p, n);
    k->owed_len += n;
    if (!first) return 0;
    c->n_owing++;
    return watch(c, k, cid, EPOLLOUT);
}

/* Sends the answer of the pull (or offset query) mq_fast_read answered and keeps p for Python
 * (mq_fast_conns_take_pulled); what the socket does not take is owed.  0 or an errno. */
static int answer_pull(mq_fast_conns *c, fast_conn *k, uint32_t cid, const mq_fast_pulled *p) {
    assert(c->n_pulled < MQ_FAST_CONN_PULLED_MAX);
    c->pulled[c->n_pulled++] = *p;
    const uint8_t *frame = fast_pull_buf(c->f) + p->frame_offset;
    ssize_t w;
    do w = send(k->fd, frame, p->frame_len, MSG_DONTWAIT | MSG_NOSIGNAL);
    while (w < 0 && errno == EINTR);
    if (w < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK) return errno;
        w = 0;
    }
    k->active_ms = mono_ms();
    return owe(c, k, cid, frame + w, p->frame_len - (size_t)w);
}

#define WALK_FAILED 100            /* walk's stop when a pull's answer could not be sent or kept: *err */
_Static_assert(WALK_FAILED > MQ_FAST_FULL && WALK_FAILED > MQ_FAST_HANDBACK && WALK_FAILED > MQ_FAST_PULLED,
               "walk's stops");

/* Walks k's whole frames: MQ_FAST_END (all taken, the last incomplete, or answers owed: the rest
 * waits until they are sent), MQ_FAST_FULL (the stage or the pulls kept for Python are full: the
 * rest waits for the next poll), MQ_FAST_HANDBACK (given back: *sql_missed as mq_fast_read set
 * it) or WALK_FAILED (*err the errno); < 0 an error of mq_fast_read's. */
static int walk(mq_fast_conns *c, fast_conn *k, uint32_t cid, uint32_t *sql_missed, int *err) {
    size_t consumed;
    int stop;
    int32_t code;
    mq_fast_pulled pulled;
    while (k->have - k->at >= 4 && k->owed_at == k->owed_len) {
        if (k->pulls && c->n_pulled == MQ_FAST_CONN_PULLED_MAX) return MQ_FAST_FULL;
        pulled.sql_missed = 0;
        int rc = mq_fast_read(c->f, k->slot, k->born, k->born_len, k->port, k->pulls, k->buf + k->at,
                              k->have - k->at, &consumed, &stop, &code, &pulled);
        if (rc) return rc;
        k->at += consumed;
        if (stop == MQ_FAST_END) return MQ_FAST_END;
        if (stop == MQ_FAST_FULL) return MQ_FAST_FULL;
        if (stop == MQ_FAST_PULLED) {
            *err = answer_pull(c, k, cid, &pulled);
            if (*err) return WALK_FAILED;
            continue;
        }
        assert(stop == MQ_FAST_HANDBACK);
        *sql_missed = pulled.sql_missed;
        return MQ_FAST_HANDBACK;
    }
    return MQ_FAST_END;
}

/* Serves k once: the frames it holds, one read, the frames that brought.  Returns MQ_FAST_FULL
 * when the stage filled (k is left pending), else MQ_OK; gives k back (an event) when it must. */
static int serve(mq_fast_conns *c, fast_conn *k, uint32_t cid, mq_fast_poll_out *o, mq_fast_conn_event *events,
                 uint32_t events_cap) {
    k->served_in = c->polls;
    set_pending(c, k, 0);
    if (k->owed_at < k->owed_len) {     /* watched for writing: what it owes goes first */
        int perr = pay(c, k, cid);
        if (perr) {
            give_back_failed(c, k, cid, o, events, events_cap, perr);
            return MQ_OK;
        }
        if (k->owed_at < k->owed_len) return MQ_OK;
    }
    int why = make_room(k);
    if (why) {
        give_back(c, k);
        event(o, events, events_cap, k, cid, why, why == MQ_FAST_CONN_ERROR ? ENOMEM : 0);
        return MQ_OK;
    }
    uint32_t sql_missed = 0;
    int err = 0;
    int w = walk(c, k, cid, &sql_missed, &err);
    if (w == MQ_FAST_END && k->have < k->cap && k->owed_at == k->owed_len) {
        ssize_t r;
        do r = recv(k->fd, k->buf + k->have, k->cap - k->have, MSG_DONTWAIT);
        while (r < 0 && errno == EINTR);
        if (r == 0) {
            give_back(c, k);
            event(o, events, events_cap, k, cid, MQ_FAST_CONN_EOF, 0);
            return MQ_OK;
        }
        if (r < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) return MQ_OK;
            int rerr = errno;
            give_back(c, k);
            event(o, events, events_cap, k, cid, MQ_FAST_CONN_ERROR, rerr);
            return MQ_OK;
        }
        k->have += (size_t)r;
        k->active_ms = mono_ms();
        w = walk(c, k, cid, &sql_missed, &err);
    }
    if (w == WALK_FAILED) {
        give_back_failed(c, k, cid, o, events, events_cap, err);
        return MQ_OK;
    }
    if (w < 0) {                        /* mq_fast_read refused its arguments: Python's path decides */
        give_back(c, k);
        event(o, events, events_cap, k, cid, MQ_FAST_CONN_HANDBACK, 0);
        return MQ_OK;
    }
    if (w == MQ_FAST_HANDBACK) {
        give_back(c, k);
        event(o, events, events_cap, k, cid, MQ_FAST_CONN_HANDBACK, 0);
        events[o->n_events - 1].sql_missed = sql_missed;
        return MQ_OK;
    }
    if (w == MQ_FAST_FULL) {
        set_pending(c, k, 1);
        return MQ_FAST_FULL;
    }
    return MQ_OK;
}

/* Sends the spans of the connections C serves; a span not taken whole gives its connection back
 * and is left (what is left of it) for Python, with that connection's later spans.  A connection
 * that owes a pull's answer owes its spans too (they go after it).  The spans left for Python are
 * moved to the front, in order: returns how many. */
static uint32_t send_spans(mq_fast_conns *c, const uint8_t *out, mq_fast_span *spans, uint32_t n_spans,
                           mq_fast_poll_out *o, mq_fast_conn_event *events, uint32_t events_cap) {
    uint32_t kept = 0;
    for (uint32_t i = 0; i < n_spans; i++) {
        mq_fast_span s = spans[i];
        int64_t cid = cid_of(c, s.conn);
        fast_conn *k = cid >= 0 ? &c->conns[cid] : NULL;
        if (k && k->state == C_SERVED && k->owed_at < k->owed_len) {
            int err = owe(c, k, (uint32_t)cid, out + s.offset, s.len);
            if (!err) continue;
            give_back_failed(c, k, (uint32_t)cid, o, events, events_cap, err);
        } else if (k && k->state == C_SERVED) {
            ssize_t w;
            do w = send(k->fd, out + s.offset, s.len, MSG_DONTWAIT | MSG_NOSIGNAL);
            while (w < 0 && errno == EINTR);
            if (w == (ssize_t)s.len) {
                k->active_ms = mono_ms();
                continue;
            }
            int err = 0;
            if (w < 0) {
                if (errno != EAGAIN && errno != EWOULDBLOCK) err = errno;
                w = 0;
            }
            s.offset += (uint32_t)w;
            s.len -= (uint32_t)w;
            give_back(c, k);
            event(o, events, events_cap, k, (uint32_t)cid, err ? MQ_FAST_CONN_ERROR : MQ_FAST_CONN_WRITE, err);
        }
        spans[kept++] = s;
    }
    return kept;
}

_Static_assert(sizeof(((mq_fast_sent *)0)->n) == MQ_FAST_SENT_BUCKETS * sizeof(uint64_t), "mq_fast_sent.n");

/* Counts the sends a run answered now: its OK answers less those held and those refused after
 * they were stored (those are in both n_ok and the fails: Python answers and counts them). */
static void count_sent(mq_fast_conns *c, const struct timespec *t0, const mq_fast_fail *fails,
                       const mq_fast_poll_out *o) {
    uint64_t n = (uint64_t)o->n_ok - o->n_held;
    for (uint32_t i = 0; i < o->n_fails; i++)
        if (fails[i].rc == MQ_FAST_RC_STORED) n--;
    if (!n) return;
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    int64_t ns = (int64_t)(t1.tv_sec - t0->tv_sec) * 1000000000 + (t1.tv_nsec - t0->tv_nsec);
    uint64_t us = ns > 0 ? (uint64_t)ns / 1000 : 0;
    uint32_t k = us ? 64u - (uint32_t)__builtin_clzll(us) : 0;      /* Python's int.bit_length() */
    c->sent.n[k < MQ_FAST_SENT_BUCKETS ? k : MQ_FAST_SENT_BUCKETS - 1] += n;
    c->sent.sum_ns += (uint64_t)(ns > 0 ? ns : 0) * n;
}

int mq_fast_poll(mq_fast_conns *c, int refuse_held, uint8_t *out, size_t out_cap, mq_fast_span *spans,
                 mq_fast_fail *fails, mq_fast_conn_event *events, uint32_t events_cap, mq_fast_poll_out *o) {
    assert(c && o && (events || !events_cap));
    memset(o, 0, sizeof *o);
    o->polls = 1;
    /* a connection is given back at most once a poll: one of the MQ_FAST_POLL_BATCH served, or one
     * with an answer of this run (at most MQ_FAST_MSGS_MAX sends are staged: those adopted since
     * the last run may have some staged by Python's reads) */
    assert(events_cap >= MQ_FAST_POLL_BATCH + MQ_FAST_MSGS_MAX);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    drop_dead(c);
    c->polls++;
    uint32_t budget = MQ_FAST_POLL_BATCH;
    int full = 0;
    /* first the connections a full stage stopped: their frames are read already */
    for (uint32_t cid = 0; cid < MQ_FAST_CONNS_MAX && c->n_pending && !full && budget; cid++) {
        fast_conn *k = &c->conns[cid];
        if (k->state != C_SERVED || !k->pending) continue;
        budget--;
        if (serve(c, k, cid, o, events, events_cap) == MQ_FAST_FULL) full = 1;
    }
    if (!full && budget) {
        struct epoll_event evs[MQ_FAST_POLL_BATCH];
        int n;
        do n = epoll_wait(c->ep, evs, (int)budget, 0);
        while (n < 0 && errno == EINTR);
        if (n < 0) return io_fail(c->cl, errno);
        for (int i = 0; i < n; i++) {
            uint32_t cid = evs[i].data.u32;
            assert(cid < MQ_FAST_CONNS_MAX);
            fast_conn *k = &c->conns[cid];
            if (k->state != C_SERVED || k->served_in == c->polls) continue;
            if (full) {                 /* the stage is full: this one is read next poll */
                set_pending(c, k, 1);
                continue;
            }
            if (serve(c, k, cid, o, events, events_cap) == MQ_FAST_FULL) full = 1;
        }
    }
    o->more = c->n_pending ? 1u : 0u;
    o->n_pulled = c->n_pulled;
    if (!mq_fast_staged(c->f)) return MQ_OK;
    int rc = mq_fast_run(c->f, refuse_held, out, out_cap, spans, &o->n_spans, fails, &o->n_fails, &o->n_ok,
                         &o->n_held);
    if (rc) return rc;
    o->ran = 1;
    o->n_spans = send_spans(c, out, spans, o->n_spans, o, events, events_cap);
    count_sent(c, &t0, fails, o);
    return MQ_OK;
}

/* Waits up to ms for the loop's epoll set to have a ready descriptor: 1 when C's set is the only
 * one (C serves it itself), 0 otherwise (time out, a signal, a descriptor of Python's).  The loop
 * watches its descriptors level-triggered, so looking leaves their readiness for the loop to see. */
static int only_mine_ready(const mq_fast_conns *c, int loop_fd, int ms) {
    struct epoll_event evs[2];          /* C's set is one entry: a second is somebody else's */
    int n = epoll_wait(loop_fd, evs, 2, ms);
    return n == 1 && evs[0].data.fd == c->ep;
}

int mq_fast_poll_wait(mq_fast_conns *c, int loop_fd, int wait_ms, int refuse_held, uint8_t *out, size_t out_cap,
                      mq_fast_span *spans, mq_fast_fail *fails, mq_fast_conn_event *events, uint32_t events_cap,
                      mq_fast_poll_out *o) {
    assert(c && o && loop_fd >= 0 && wait_ms >= 0);
    int64_t until_ms = mono_ms() + wait_ms;
    uint32_t polls = 0, runs = 0, n_ok = 0;
    for (;;) {
        int rc = mq_fast_poll(c, refuse_held, out, out_cap, spans, fails, events, events_cap, o);
        polls++;
        runs += o->ran;
        n_ok += o->n_ok;
        if (rc) return rc;
        if (o->n_spans || o->n_fails || o->n_held || o->n_events || o->more) break;
        if (c->n_pulled >= MQ_FAST_CONN_PULLED_MAX / 2) break;     /* their stats and commits wait no longer */
        /* tracing: Python takes the rows past this many, before a run (<= MQ_FAST_MSGS_MAX rows)
         * could find no room (mq.broker.fastsend TRACE_FLUSH_ROWS) */
        if (mq_fast_trace_kept(c->f) >= MQ_FAST_TRACE_ROWS_MAX - MQ_FAST_MSGS_MAX) break;
        int64_t left_ms = until_ms - mono_ms();
        if (left_ms <= 0 || !only_mine_ready(c, loop_fd, (int)left_ms)) break;
    }
    o->polls = polls;
    o->ran = runs;
    o->n_ok = n_ok;
    o->n_pulled = c->n_pulled;
    return MQ_OK;
}

uint32_t mq_fast_conns_take_pulled(mq_fast_conns *c, mq_fast_pulled *out, uint32_t cap) {
    assert(c && (out || !cap));
    uint32_t n = c->n_pulled < cap ? c->n_pulled : cap;
    if (!n) return 0;
    memcpy(out, c->pulled, n * sizeof *out);
    memmove(c->pulled, c->pulled + n, (c->n_pulled - n) * sizeof *out);
    c->n_pulled -= n;
    return n;
}

void mq_fast_conns_take_sent(mq_fast_conns *c, mq_fast_sent *out) {
    assert(c && out);
    *out = c->sent;
    memset(&c->sent, 0, sizeof c->sent);
}

int mq_fast_conns_release(mq_fast_conns *c, uint64_t pos, int64_t term, int acked, uint8_t *out, size_t out_cap,
                          mq_fast_span *spans, uint32_t spans_cap, mq_fast_conn_event *events, uint32_t events_cap,
                          mq_fast_poll_out *o) {
    assert(c && o && (events || !events_cap));
    memset(o, 0, sizeof *o);
    assert(events_cap >= spans_cap);    /* a connection is given back at most once, for a span of its own */
    int rc = mq_fast_release(c->f, pos, term, acked, out, out_cap, spans, spans_cap, &o->n_spans, &o->n_ok);
    if (rc) return rc;
    o->n_spans = send_spans(c, out, spans, o->n_spans, o, events, events_cap);
    return MQ_OK;
}
