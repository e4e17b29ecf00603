/*
 * ha.c -- the HA transport: frames out of the CommitLog with sendfile, bodies into it with
 * splice, and the slave's check-and-publish.  Contract and frame layout in ha.h.
 */
#include "internal.h"

#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <unistd.h>

static int send_all(int fd, const uint8_t *p, size_t n, int flags) {
    while (n) {
        ssize_t w = send(fd, p, n, flags | MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* One frame: header, then `body` bytes at `offset` (one file, below write_pos) with sendfile. */
static int send_one_frame(mq_commitlog *cl, int sock_fd, uint64_t offset, uint32_t body) {
    const uint64_t fs = cl->file_size;
    assert(offset % fs + body <= fs);
    uint8_t hdr[MQ_HA_FRAME_HEADER];
    be64w(hdr, offset);
    be32w(hdr + 8, body);
    int fd = -1;        /* our own: the role's main thread may retire the file meanwhile */
    if (body) {
        int rc = seg_fd_own(cl, offset / fs, 0, &fd);
        if (rc) return rc;
    }
    int rc = MQ_OK;
    if (send_all(sock_fd, hdr, sizeof hdr, body ? MSG_MORE : 0) != 0) { rc = io_fail(cl, errno); goto out; }
    off_t file_off = (off_t)(offset % fs);
    uint32_t left = body;
    while (left) {
        ssize_t w = sendfile(sock_fd, fd, &file_off, left);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) { rc = io_fail(cl, w < 0 ? errno : EPIPE); goto out; }
        left -= (uint32_t)w;
    }
out:
    if (fd >= 0) close(fd);
    return rc;
}

int mq_ha_send_frame(mq_commitlog *cl, int sock_fd, uint64_t offset, uint32_t max_body, uint32_t *body_out) {
    assert(body_out);
    const uint64_t fs = cl->file_size;
    uint64_t wp = ctl_load(cl->ctl, MQ_POS_WRITE);
    if (offset > wp || offset < ctl_load(cl->ctl, MQ_POS_MIN)) return MQ_E_RANGE;
    uint64_t avail = wp - offset;
    uint64_t to_file_end = fs - offset % fs;
    uint32_t body = (uint32_t)(avail < max_body ? avail : max_body);
    if (body > to_file_end) body = (uint32_t)to_file_end;
    int rc = send_one_frame(cl, sock_fd, offset, body);
    if (rc) return rc;
    *body_out = body;
    return MQ_OK;
}

int mq_ha_send_run(mq_commitlog *cl, int sock_fd, uint64_t from, uint64_t to, uint32_t frame_max,
                   uint64_t *in_flight_end, uint64_t *sent_end_out) {
    assert(in_flight_end && sent_end_out);
    const uint64_t fs = cl->file_size;
    *sent_end_out = from;
    if (frame_max == 0) return MQ_E_INVAL;
    if (from > to || to > ctl_load(cl->ctl, MQ_POS_WRITE) || from < ctl_load(cl->ctl, MQ_POS_MIN)) return MQ_E_RANGE;
    uint64_t pos = from;
    while (pos < to) {
        uint64_t body = to - pos;
        if (body > frame_max) body = frame_max;
        if (body > fs - pos % fs) body = fs - pos % fs;
        if (*in_flight_end < pos + body) __atomic_store_n(in_flight_end, pos + body, __ATOMIC_RELEASE);
        int rc = send_one_frame(cl, sock_fd, pos, (uint32_t)body);
        if (rc) return rc;
        pos += body;
        *sent_end_out = pos;
    }
    return MQ_OK;
}

/* Received bodies go socket -> pipe -> file with splice(2): the socket's pages
 * are moved into the pipe without a copy, and the one copy is into the page
 * cache.  Not recv() into the mapping: a recv into a page not yet in memory
 * makes the kernel zero the page and then copy over it (perf: __pi_memset was
 * catch-up's largest cost); a whole-page write needs no zeroing.  The mapping
 * sees the bytes (same page cache).  For the same reason a slave's files are
 * created (fallocate) but not pre-touched.  Where splice is refused (EINVAL:
 * a file system without splice_write) it falls back to recv + pwrite through
 * a staging buffer, which costs one more copy. */
#define MQ_HA_RX_BUF  262144u
#define MQ_HA_PIPE_SZ 1048576

static void rx_pipe_drop(mq_commitlog *cl) {
    if (cl->rx_pipe[0] >= 0) { close(cl->rx_pipe[0]); close(cl->rx_pipe[1]); }
    cl->rx_pipe[0] = cl->rx_pipe[1] = -1;
}

/* The staging buffer of the copy path, allocated on first use. */
static int rx_buf_get(mq_commitlog *cl) {
    if (!cl->rx_buf && !(cl->rx_buf = malloc(MQ_HA_RX_BUF))) return io_fail(cl, ENOMEM);
    return MQ_OK;
}

/* Writes n bytes at *off, advancing it; 0 from pwrite on a regular file is an error. */
static int pwrite_all(mq_commitlog *cl, int fd, const uint8_t *p, size_t n, off_t *off) {
    while (n) {
        ssize_t w = pwrite(fd, p, n, *off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return io_fail(cl, w < 0 ? errno : EIO);
        p += w;
        n -= (size_t)w;
        *off += w;
    }
    return MQ_OK;
}

/* Moves n bytes that sit in the pipe into the file by read + pwrite (the file side refused
 * splice after the socket side had already filled the pipe). */
static int pipe_to_file_by_copy(mq_commitlog *cl, int fd, off_t *off, size_t n) {
    int rc = rx_buf_get(cl);
    if (rc) return rc;
    while (n) {
        ssize_t r = read(cl->rx_pipe[0], cl->rx_buf, n < MQ_HA_RX_BUF ? n : MQ_HA_RX_BUF);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return io_fail(cl, r < 0 ? errno : EIO);
        rc = pwrite_all(cl, fd, cl->rx_buf, (size_t)r, off);
        if (rc) return rc;
        n -= (size_t)r;
    }
    return MQ_OK;
}

/* Receives up to `size` bytes from the socket into the file at *off by splice.  Returns
 * MQ_OK with *done = bytes received and written: all of them, or fewer when splice turned
 * out to be refused (EINVAL on either side; the pipe is empty then, and cl->rx_no_splice is
 * set so later bodies go straight to the copy path).  On an error the pipe is dropped (it
 * may hold bytes: never reuse it). */
static int recv_body_splice(mq_commitlog *cl, int sock_fd, int fd, off_t *off, size_t size, size_t *done) {
    *done = 0;
    if (cl->rx_pipe[0] < 0) {
        if (pipe2(cl->rx_pipe, O_CLOEXEC) != 0) { cl->rx_no_splice = 1; return MQ_OK; }
        (void)fcntl(cl->rx_pipe[0], F_SETPIPE_SZ, MQ_HA_PIPE_SZ);   /* best effort: 64 KiB otherwise */
    }
    while (*done < size) {
        ssize_t in = splice(sock_fd, NULL, cl->rx_pipe[1], NULL, size - *done, SPLICE_F_MOVE | SPLICE_F_MORE);
        if (in < 0) {
            if (errno == EINTR) continue;
            int e = errno;
            if (e == EINVAL) { cl->rx_no_splice = 1; return MQ_OK; }     /* the pipe is empty here */
            rx_pipe_drop(cl);
            return io_fail(cl, e);
        }
        if (in == 0) { rx_pipe_drop(cl); return io_fail(cl, ECONNRESET); }
        size_t out_left = (size_t)in;
        while (out_left) {
            ssize_t w = splice(cl->rx_pipe[0], NULL, fd, off, out_left, SPLICE_F_MOVE);
            if (w < 0 && errno == EINTR) continue;
            if (w < 0 && errno == EINVAL) {         /* this file system has no splice_write */
                int rc = pipe_to_file_by_copy(cl, fd, off, out_left);
                if (rc) { rx_pipe_drop(cl); return rc; }
                cl->rx_no_splice = 1;
                *done += (size_t)in;
                return MQ_OK;
            }
            if (w <= 0) {
                int e = w < 0 ? errno : EIO;
                rx_pipe_drop(cl);
                return io_fail(cl, e);
            }
            out_left -= (size_t)w;
        }
        *done += (size_t)in;
    }
    return MQ_OK;
}

/* `size` bytes from the socket into the file (fd) at *file_off. */
static int recv_body_into(mq_commitlog *cl, int sock_fd, int fd, off_t *file_off, uint32_t size) {
    size_t done = 0;
    int rc;
    if (!cl->rx_no_splice) {
        rc = recv_body_splice(cl, sock_fd, fd, file_off, size, &done);
        if (rc) return rc;
    }
    if (done < size && (rc = rx_buf_get(cl)) != MQ_OK) return rc;
    while (done < size) {
        size_t want = size - done < MQ_HA_RX_BUF ? size - done : MQ_HA_RX_BUF, have = 0;
        while (have < want) {
            ssize_t r = recv(sock_fd, cl->rx_buf + have, want - have, MSG_WAITALL);
            if (r < 0) {
                if (errno == EINTR) continue;
                return io_fail(cl, errno);
            }
            if (r == 0) return io_fail(cl, ECONNRESET);
            have += (size_t)r;
        }
        rc = pwrite_all(cl, fd, cl->rx_buf, have, file_off);
        if (rc) return rc;
        done += have;
    }
    return MQ_OK;
}

int mq_ha_recv_body(mq_commitlog *cl, int sock_fd, uint64_t offset, uint32_t size) {
    const uint64_t fs = cl->file_size;
    if (size == 0) return MQ_OK;
    if (offset % fs + size > fs) return MQ_E_RANGE;          /* a frame never crosses a file */
    if (offset < ctl_load(cl->ctl, MQ_POS_WRITE)) return MQ_E_RANGE;   /* never over published bytes */
    int fd;             /* our own, as in send_one_frame */
    int rc = seg_fd_own(cl, offset / fs, 1, &fd);
    if (rc) return rc;
    off_t file_off = (off_t)(offset % fs);
    rc = recv_body_into(cl, sock_fd, fd, &file_off, size);
    close(fd);
    return rc;
}

int mq_ha_publish(mq_commitlog *cl, uint64_t received_end, uint64_t *published_out) {
    assert(published_out);
    mq_ctl *c = cl->ctl;
    const uint64_t fs = cl->file_size;
    uint64_t pos = ctl_load(c, MQ_POS_WRITE);
    int64_t last_ts = (int64_t)ctl_load(c, MQ_POS_LAST_STORE_TS);
    uint64_t n_recs = 0;
    int rc = MQ_OK;
    while (pos < received_end) {
        uint8_t *base;
        rc = seg_get(cl, pos / fs, 0, &base);
        if (rc) break;
        uint64_t room = fs - pos % fs;
        uint64_t avail = received_end - pos < room ? received_end - pos : room;
        const uint8_t *p = base + pos % fs;
        if (avail < 8) break;                                   /* TOTALSIZE and MAGIC not complete yet */
        uint32_t total = be32r(p), magic = be32r(p + 4);
        if (magic == MQ_BLANK_MAGIC) {
            if (total != room) { rc = MQ_E_CORRUPT; break; }
            if (received_end < pos + room) break;               /* the master still streams the filler */
            pos += room;
            continue;
        }
        if (magic != MQ_MESSAGE_MAGIC || total < MQ_RECORD_SIZE_MIN || total > room) { rc = MQ_E_CORRUPT; break; }
        if (total > avail) break;                               /* the rest comes in the next frame */
        mq_scan_rec rec;
        int stop;
        if (mq_record_check(p, total, 1, &rec, &stop) != MQ_OK || rec.phy_offset != pos) { rc = MQ_E_CORRUPT; break; }
        last_ts = rec.store_ts_ms;
        pos += total;
        n_recs++;
    }
    uint64_t old = ctl_load(c, MQ_POS_WRITE);
    if (pos > old) {
        int lrc = ctl_lock(c);
        if (lrc) return lrc;
        __atomic_store_n(&c->pos[MQ_POS_LAST_STORE_TS], (uint64_t)last_ts, __ATOMIC_RELEASE);
        __atomic_add_fetch(&c->pos[MQ_POS_MSGS], n_recs, __ATOMIC_RELEASE);
        __atomic_store_n(&c->pos[MQ_POS_WRITE], pos, __ATOMIC_RELEASE);
        ctl_unlock(c);
        mq_ctl_wake(c, MQ_SEQ_WRITE);
    }
    *published_out = pos;
    return rc;
}

/* Reads exactly n bytes (a frame header); the socket is blocking with SO_RCVTIMEO. */
static int recv_all(mq_commitlog *cl, int fd, uint8_t *p, size_t n) {
    while (n) {
        ssize_t r = recv(fd, p, n, MSG_WAITALL);
        if (r < 0) {
            if (errno == EINTR) continue;
            return io_fail(cl, errno);
        }
        if (r == 0) return io_fail(cl, ECONNRESET);
        p += r;
        n -= (size_t)r;
    }
    return MQ_OK;
}

int mq_ha_recv_run(mq_commitlog *cl, int sock_fd, uint64_t *expected, uint64_t budget, uint32_t body_max,
                   int *why_out, uint64_t *other_offset, uint32_t *other_size, uint64_t *published_out) {
    assert(expected && why_out && other_offset && other_size && published_out);
    const uint64_t fs = cl->file_size;
    uint64_t got = 0;
    int rc = MQ_OK, first = 1;
    *why_out = MQ_HA_RX_IDLE;
    for (;;) {
        if (got >= budget) { *why_out = MQ_HA_RX_BUDGET; break; }
        uint8_t hdr[MQ_HA_FRAME_HEADER];
        size_t have = 0;
        if (!first) {
            /* one non-blocking try instead of poll + recv: nothing there -> idle */
            ssize_t r = recv(sock_fd, hdr, sizeof hdr, MSG_DONTWAIT);
            if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) break;
            if (r < 0) { rc = io_fail(cl, errno); break; }
            if (r == 0) { rc = io_fail(cl, ECONNRESET); break; }
            have = (size_t)r;
        }
        first = 0;
        rc = recv_all(cl, sock_fd, hdr + have, sizeof hdr - have);   /* a header once begun is read whole */
        if (rc) break;
        uint64_t off = be64r(hdr);
        uint32_t size = be32r(hdr + 8);
        if (off != *expected || size > body_max || off % fs + size > fs) {
            *other_offset = off;
            *other_size = size;
            *why_out = MQ_HA_RX_OTHER;
            break;
        }
        if (size == 0) continue;                                 /* heartbeat */
        rc = mq_ha_recv_body(cl, sock_fd, off, size);
        if (rc) break;
        *expected = off + size;
        got += size;
    }
    /* publish what arrived whole, even when the socket failed after it */
    uint64_t published = ctl_load(cl->ctl, MQ_POS_WRITE);
    int prc = got ? mq_ha_publish(cl, *expected, &published) : MQ_OK;
    *published_out = published;
    if (prc == MQ_E_CORRUPT) return prc;
    return rc ? rc : prc;
}

/* ---- the steady-state loops: no Python between wakes ----------------------------------------
 * Each runs for up to wait_ms and then returns, so that its Python thread looks at its flags
 * (stop, close, the idle limit) as often as before; in between, a wake costs what the kernel's
 * does and no more: no GIL taken back, no interpreter round per ack, frame or report. */

int mq_ha_stream_for(mq_commitlog *cl, int sock_fd, mq_ha_stream *s, uint32_t wait_ms, uint64_t *in_flight_end,
                     uint64_t *sent_end) {
    assert(s && in_flight_end && sent_end);
    if (s->run_max == 0 || s->frame_max == 0 || s->heartbeat_ms == 0) return MQ_E_INVAL;
    mq_ctl *c = cl->ctl;
    const int64_t deadline = mono_ms() + wait_ms;
    for (;;) {
        uint32_t seen = mq_ctl_seq(c, MQ_SEQ_WRITE);            /* before the look: a move after it wakes */
        uint64_t wp = ctl_load(c, MQ_POS_WRITE);
        int64_t now;
        if (s->next < wp) {
            uint64_t end = wp - s->next > s->run_max ? s->next + s->run_max : wp;
            int rc = mq_ha_send_run(cl, sock_fd, s->next, end, s->frame_max, in_flight_end, sent_end);
            if (rc) return rc;
            s->next = end;
            now = mono_ms();
            s->last_send_ms = now;
            if (now >= deadline) return MQ_OK;
            continue;
        }
        now = mono_ms();
        if (now - s->last_send_ms >= (int64_t)s->heartbeat_ms) {
            if (__atomic_load_n(in_flight_end, __ATOMIC_ACQUIRE) < s->next)
                __atomic_store_n(in_flight_end, s->next, __ATOMIC_RELEASE);
            uint32_t body;
            int rc = mq_ha_send_frame(cl, sock_fd, s->next, 0, &body);
            if (rc) return rc;
            *sent_end = s->next;
            s->last_send_ms = now;
        }
        if (now >= deadline) return MQ_OK;
        int64_t until = s->last_send_ms + (int64_t)s->heartbeat_ms;
        if (until > deadline) until = deadline;
        (void)mq_ctl_wait(c, MQ_SEQ_WRITE, seen, until - now > 1 ? (int)(until - now) : 1);
    }
}

_Static_assert(sizeof(((mq_ha_acks *)0)->carry) == MQ_HA_REPORT, "a report's first bytes fit the carry");

int mq_ha_read_acks(mq_commitlog *cl, int sock_fd, mq_ha_acks *a, uint32_t wait_ms, const uint64_t *in_flight_end) {
    assert(a && in_flight_end && a->carry_n < MQ_HA_REPORT);
    mq_ctl *c = cl->ctl;
    const int64_t deadline = mono_ms() + wait_ms;
    uint8_t buf[MQ_HA_REPORT + MQ_HA_ACKS_READ];
    a->why = MQ_HA_ACKS_WAITED;
    a->err = 0;
    for (;;) {
        int64_t now = mono_ms();
        if (now >= deadline) return MQ_OK;
        struct pollfd pfd = {.fd = sock_fd, .events = POLLIN};
        int pr = poll(&pfd, 1, (int)(deadline - now));
        if (pr < 0 && errno == EINTR) continue;
        if (pr < 0) { a->err = errno; return MQ_E_IO; }
        if (pr == 0) return MQ_OK;
        memcpy(buf, a->carry, a->carry_n);
        ssize_t r = recv(sock_fd, buf + a->carry_n, MQ_HA_ACKS_READ, MSG_DONTWAIT);
        if (r < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
        if (r < 0) { a->err = errno; return MQ_E_IO; }
        if (r == 0) { a->why = MQ_HA_ACKS_CLOSED; return MQ_OK; }
        a->last_read_ms = mono_ms();
        size_t n = a->carry_n + (size_t)r, at = 0;
        uint64_t acked = 0;                              /* the highest report that raised ACKED */
        for (; at + MQ_HA_REPORT <= n; at += MQ_HA_REPORT) {
            uint64_t v = be64r(buf + at);
            /* the cell is read per report: the writer raises it before each frame it sends */
            if (v >> 63 == 0 && v <= __atomic_load_n(in_flight_end, __ATOMIC_ACQUIRE)) {
                if ((int64_t)v > a->ack) a->ack = (int64_t)v;
                if (v > acked && v > ctl_load(c, MQ_POS_ACKED)) acked = v;
                continue;
            }
            if (v == a->start && a->ack < 0) continue;  /* a repeat of the first report, before our first frame */
            a->bad = v;
            a->why = MQ_HA_ACKS_BAD;
            break;
        }
        if (acked) {                                     /* one wake a read, however many reports it held */
            mq_ctl_advance(c, MQ_POS_ACKED, acked);
            mq_ctl_wake(c, MQ_SEQ_ACK);
        }
        if (a->why == MQ_HA_ACKS_BAD) return MQ_OK;
        a->carry_n = (uint32_t)(n - at);
        memcpy(a->carry, buf + at, a->carry_n);
    }
}

static int send_report(mq_commitlog *cl, int sock_fd, uint64_t value) {
    uint8_t rep[MQ_HA_REPORT];
    be64w(rep, value);
    return send_all(sock_fd, rep, sizeof rep, 0) ? io_fail(cl, errno) : MQ_OK;
}

int mq_ha_slave_for(mq_commitlog *cl, int sock_fd, mq_ha_rx *x, uint32_t wait_ms) {
    assert(x);
    if (x->report_interval_ms == 0 || x->budget == 0) return MQ_E_INVAL;
    mq_ctl *c = cl->ctl;
    const int64_t deadline = mono_ms() + wait_ms;
    x->why = MQ_HA_RX_IDLE;
    for (;;) {
        int64_t now = mono_ms();
        if (now - x->last_report_ms >= (int64_t)x->report_interval_ms) {
            int rc = send_report(cl, sock_fd, x->expected);
            if (rc) return rc;
            x->last_report_ms = now;
        }
        if (now >= deadline) return MQ_OK;
        int64_t until = x->last_report_ms + (int64_t)x->report_interval_ms;
        if (until > deadline) until = deadline;
        struct pollfd pfd = {.fd = sock_fd, .events = POLLIN};
        int pr = poll(&pfd, 1, until - now > 0 ? (int)(until - now) : 0);
        if (pr < 0 && errno == EINTR) continue;
        if (pr < 0) return io_fail(cl, errno);
        if (pr == 0) continue;
        uint64_t before = x->expected, other_offset = 0;
        uint32_t other_size = 0;
        int why;
        int rc = mq_ha_recv_run(cl, sock_fd, &x->expected, x->budget, x->body_max, &why, &other_offset, &other_size,
                                &x->published);
        x->last_read_ms = mono_ms();
        if (rc) return rc;
        if (x->expected != before) {                      /* received and published: confirm, report */
            mq_ctl_advance(c, MQ_POS_CONFIRM, x->expected);
            rc = send_report(cl, sock_fd, x->expected);
            if (rc) return rc;
            x->last_report_ms = x->last_read_ms;
        }
        if (why == MQ_HA_RX_OTHER) {
            x->other_offset = other_offset;
            x->other_size = other_size;
            x->why = MQ_HA_RX_OTHER;
            return MQ_OK;
        }
    }
}
