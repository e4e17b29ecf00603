/*
 * commitlog.c -- the CommitLog handle: files and their mappings, append (one, batch, group),
 * view and read check, scan, flush, zero tail.  Contract and record layout in commitlog.h.
 * Lock order: the control block's lock, then cl->seg_lock.
 */
#include "internal.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* ==================================================================================== */
/* Files and mappings                                                                    */
/* ==================================================================================== */

/* Opens (and with create, sizes) the file of file index fi of table t and maps it. */
static int seg_open(mq_commitlog *cl, seg_table *t, uint64_t fi, int create, uint8_t **base_out, int *fd_out) {
    char path[PATH_MAX];
    const uint64_t fsz = t->file_size;
    snprintf(path, sizeof path, "%s/%020llu", t->dir, (unsigned long long)(fi * fsz));
    int fd = open(path, O_RDWR | O_CLOEXEC | (create ? O_CREAT : 0), 0644);
    if (fd < 0) {
        if (!create && errno == ENOENT) return MQ_E_RANGE;
        return io_fail(cl, errno);
    }
    /* creators size the file under an exclusive flock, so a reader never maps a half-sized file */
    if (flock(fd, create ? LOCK_EX : LOCK_SH) != 0) { int e = errno; close(fd); return io_fail(cl, e); }
    struct stat st;
    if (fstat(fd, &st) != 0) { int e = errno; close(fd); return io_fail(cl, e); }
    if ((uint64_t)st.st_size != fsz) {
        if (!create || (uint64_t)st.st_size > fsz) { close(fd); return MQ_E_CORRUPT; }
        int e = posix_fallocate(fd, 0, (off_t)fsz);
        if (e == EOPNOTSUPP || e == EINVAL) e = ftruncate(fd, (off_t)fsz) ? errno : 0;
        if (e) {
            (void)ftruncate(fd, 0);   /* leave no half-sized file behind */
            close(fd);
            unlink(path);
            return io_fail(cl, e);
        }
    }
    flock(fd, LOCK_UN);
    void *p = mmap(NULL, fsz, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) { int e = errno; close(fd); return io_fail(cl, e); }
    *base_out = (uint8_t *)p;
    *fd_out = fd;
    return MQ_OK;
}

/* The file is opened and mapped outside seg_lock (it may block on the file system); two
 * threads racing for the same file keep the first mapping. */
int tseg_get(mq_commitlog *cl, seg_table *t, uint64_t fi, int create, uint8_t **base_out) {
    /* a retired file is below MIN: a reader that checked MIN before retention moved it must
     * not map it again (the mapping would keep the deleted file's blocks until close) */
    pthread_mutex_lock(&cl->seg_lock);
    if (t == &cl->data && fi < cl->retired_below_index) { pthread_mutex_unlock(&cl->seg_lock); return MQ_E_RANGE; }
    if (fi < t->nsegs && t->segs[fi].base) {
        *base_out = t->segs[fi].base;
        pthread_mutex_unlock(&cl->seg_lock);
        return MQ_OK;
    }
    pthread_mutex_unlock(&cl->seg_lock);

    uint8_t *base;
    int fd;
    int rc = seg_open(cl, t, fi, create, &base, &fd);
    if (rc) return rc;

    pthread_mutex_lock(&cl->seg_lock);
    if (fi >= t->nsegs) {
        uint64_t n = t->nsegs ? t->nsegs : 16;
        while (n <= fi) n *= 2;
        mq_seg *s = realloc(t->segs, n * sizeof(mq_seg));
        if (!s) { pthread_mutex_unlock(&cl->seg_lock); munmap(base, t->file_size); close(fd); return io_fail(cl, ENOMEM); }
        memset(s + t->nsegs, 0, (n - t->nsegs) * sizeof(mq_seg));
        t->segs = s;
        t->nsegs = n;
    }
    if (t == &cl->data && fi < cl->retired_below_index) {     /* retired while it was opened */
        pthread_mutex_unlock(&cl->seg_lock);
        munmap(base, t->file_size);
        close(fd);
        return MQ_E_RANGE;
    }
    if (t->segs[fi].base) {               /* another thread mapped it meanwhile */
        munmap(base, t->file_size);
        close(fd);
    } else {
        t->segs[fi].base = base;
        t->segs[fi].fd = fd;
    }
    *base_out = t->segs[fi].base;
    pthread_mutex_unlock(&cl->seg_lock);
    return MQ_OK;
}

int seg_fd(mq_commitlog *cl, uint64_t fi) {
    pthread_mutex_lock(&cl->seg_lock);
    assert(fi < cl->data.nsegs && cl->data.segs[fi].base);
    int fd = cl->data.segs[fi].fd;
    pthread_mutex_unlock(&cl->seg_lock);
    return fd;
}

int seg_fd_own(mq_commitlog *cl, uint64_t fi, int create, int *fd_out) {
    uint8_t *base;
    int rc = seg_get(cl, fi, create, &base);
    if (rc) return rc;
    pthread_mutex_lock(&cl->seg_lock);
    if (fi >= cl->data.nsegs || !cl->data.segs[fi].base) {    /* retired since seg_get */
        pthread_mutex_unlock(&cl->seg_lock);
        return MQ_E_RANGE;
    }
    const int fd = fcntl(cl->data.segs[fi].fd, F_DUPFD_CLOEXEC, 0);
    const int e = errno;
    pthread_mutex_unlock(&cl->seg_lock);
    if (fd < 0) return io_fail(cl, e);
    *fd_out = fd;
    return MQ_OK;
}

int mq_commitlog_open(const char *dir, void *ctl_mem, size_t ctl_len, const mq_commitlog_opts *opts, mq_commitlog **out) {
    assert(dir && opts && out);
    if (strlen(dir) >= sizeof(((mq_commitlog *)0)->dir)) return MQ_E_INVAL;
    int rc = mq_ctl_check(ctl_mem, ctl_len);
    if (rc) return rc;
    mq_ctl *c = (mq_ctl *)ctl_mem;
    if (opts->file_size != c->file_size) return MQ_E_BAD_CTL;
    if (opts->dledger && (!opts->index_dir || strlen(opts->index_dir) >= sizeof(((seg_table *)0)->dir) ||
                          opts->index_file_size < 4096 || opts->index_file_size % 4096 ||
                          opts->index_file_size % MQ_DL_INDEX_UNIT))
        return MQ_E_INVAL;
    mq_commitlog *cl = calloc(1, sizeof *cl);
    if (!cl) return MQ_E_IO;
    cl->ctl = c;
    snprintf(cl->dir, sizeof cl->dir, "%s", dir);
    snprintf(cl->data.dir, sizeof cl->data.dir, "%s", dir);
    cl->data.file_size = opts->file_size;
    cl->dledger = opts->dledger ? 1 : 0;
    cl->touch_page_folios = opts->touch_page_folios ? 1 : 0;
    if (cl->dledger) {
        snprintf(cl->index.dir, sizeof cl->index.dir, "%s", opts->index_dir);
        cl->index.file_size = opts->index_file_size;
    }
    cl->file_size = opts->file_size;
    memcpy(cl->store_host, opts->store_host, 4);
    cl->store_port = opts->store_port;
    cl->rx_pipe[0] = cl->rx_pipe[1] = -1;
    pthread_mutex_init(&cl->seg_lock, NULL);
    *out = cl;
    return MQ_OK;
}

static void table_close(seg_table *t) {
    for (uint64_t i = 0; i < t->nsegs; i++)
        if (t->segs[i].base) { munmap(t->segs[i].base, t->file_size); close(t->segs[i].fd); }
    free(t->segs);
    t->segs = NULL;
    t->nsegs = 0;
}

void mq_commitlog_close(mq_commitlog *cl) {
    if (!cl) return;
    table_close(&cl->data);
    table_close(&cl->index);
    for (size_t i = 0; i < cl->n_retired; i++) munmap(cl->retired[i], cl->file_size);
    free(cl->retired);
    free(cl->rx_buf);
    if (cl->rx_pipe[0] >= 0) { close(cl->rx_pipe[0]); close(cl->rx_pipe[1]); }
    pthread_mutex_destroy(&cl->seg_lock);
    free(cl);
}

int mq_commitlog_errno(mq_commitlog *cl) { return cl->last_errno; }

int mq_commitlog_prepare_file(mq_commitlog *cl, uint64_t file_index, uint64_t from_pos) {
    uint8_t *base;
    int rc = seg_get(cl, file_index, 1, &base);
    if (rc) return rc;
    const uint64_t start = file_index * cl->file_size;
    uint64_t first = from_pos > start ? (from_pos - start) & ~(uint64_t)(MQ_PAGE - 1) : 0;
    const size_t len = cl->file_size - first;
    /* touch_page_folios (SYNC_FLUSH): touched with readahead off, so that each fault caches one
     * page.  With readahead the kernel caches the file in large folios (ext4 on Linux 6.x: up to
     * 2 MiB), the touch dirties whole folios, and writeback writes whole folios: every msync of
     * a SYNC_FLUSH group rewrote the folios around it, ~0.9 MiB for a group of 32 KiB (2026-11-28,
     * kernel 6.18: 36x the sectors of the data, msync 3.2-3.7 ms against 0.54 once the disk's
     * burst was spent).  Not by default: one fault a page costs up to 5x the CPU of the touch
     * (0.52 s against 0.10-0.50 a 256 MiB file), and an ASYNC_FLUSH msync covers many folios
     * whole.  Advice only: where it fails or means nothing (tmpfs, older kernels) the touch works
     * as before.  Readers of older files keep their readahead: the advice is this range's, for
     * the touch only. */
    if (cl->touch_page_folios) (void)madvise(base + first, len, MADV_RANDOM);
    for (uint64_t off = first; off < cl->file_size; off += MQ_PAGE)
        __atomic_fetch_add((uint64_t *)(base + off), 0, __ATOMIC_RELAXED);
    if (cl->touch_page_folios) (void)madvise(base + first, len, MADV_NORMAL);
    return MQ_OK;
}

int mq_commitlog_release(mq_commitlog *cl, uint64_t below, uint64_t from_index) {
    pthread_mutex_lock(&cl->seg_lock);
    uint64_t below_index = below / cl->file_size;
    seg_table *t = &cl->data;
    for (uint64_t i = 0; i < t->nsegs; i++) {
        if ((i < below_index || i >= from_index) && t->segs[i].base) {
            munmap(t->segs[i].base, cl->file_size);
            close(t->segs[i].fd);
            t->segs[i].base = NULL;
            t->segs[i].fd = -1;
        }
    }
    pthread_mutex_unlock(&cl->seg_lock);
    return MQ_OK;
}

int mq_commitlog_retire(mq_commitlog *cl, uint64_t below) {
    pthread_mutex_lock(&cl->seg_lock);
    const uint64_t below_index = below / cl->file_size;
    seg_table *t = &cl->data;
    int rc = MQ_OK;
    if (below_index > cl->retired_below_index) cl->retired_below_index = below_index;
    for (uint64_t i = 0; i < t->nsegs && i < below_index; i++) {
        if (!t->segs[i].base) continue;
        if (cl->n_retired == cl->cap_retired) {
            size_t cap = cl->cap_retired ? cl->cap_retired * 2 : 16;
            uint8_t **r = realloc(cl->retired, cap * sizeof *r);
            if (!r) { rc = io_fail(cl, ENOMEM); break; }
            cl->retired = r;
            cl->cap_retired = cap;
        }
        /* the same addresses, now zero pages of no file: a view still held reads zeros (a record
         * there fails its checks), never a fault; the file's last reference goes */
        void *p = mmap(t->segs[i].base, cl->file_size, PROT_READ, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS |
                       MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) { rc = io_fail(cl, errno); break; }
        cl->retired[cl->n_retired++] = t->segs[i].base;
        close(t->segs[i].fd);
        t->segs[i].base = NULL;
        t->segs[i].fd = -1;
    }
    pthread_mutex_unlock(&cl->seg_lock);
    return rc;
}

/* ==================================================================================== */
/* Append                                                                                */
/* ==================================================================================== */
static inline int topic_ok(const char *t, uint32_t n) {
    if (n == 0 || n > MQ_TOPIC_LEN_MAX) return 0;
    for (uint32_t i = 0; i < n; i++) {
        char ch = t[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '%' || ch == '|' || ch == '_' || ch == '-'))
            return 0;
    }
    return 1;
}

int plan_msg(const mq_append_req *r, msg_plan *m) {
    if (m->body_len == 0 || m->body_len > r->max_message_size) return MQ_E_MSG_ILLEGAL;
    m->sep = (r->extra_props_len > 0 && m->props_len > 0 && m->props[m->props_len - 1] != 0x02) ? 1 : 0;
    uint64_t props_total = (uint64_t)m->props_len + m->sep + r->extra_props_len;
    if (props_total > MQ_PROPS_LEN_MAX) return MQ_E_PROPS_TOO_LONG;
    m->size = fixed_len(r->born_host_len, 4) + m->body_len + r->topic_len + (uint32_t)props_total;
    return MQ_OK;
}

/* The checks of a request every append makes first (append_one's order in commitlog.h). */
static inline int check_req(mq_commitlog *cl, const mq_append_req *r) {
    assert(cl && r && r->topic && (r->extra_props || !r->extra_props_len));
    if (!topic_ok(r->topic, r->topic_len)) return MQ_E_TOPIC_ILLEGAL;
    if (r->queue_id < 0 || (r->born_host_len != 4 && r->born_host_len != 16)) return MQ_E_INVAL;
    if (r->extra_props_len > MQ_PROPS_LEN_MAX) return MQ_E_PROPS_TOO_LONG;
    return MQ_OK;
}

/* A record of `size` bytes (in its entry, in DLedger mode) and a filler fit in an empty file. */
static inline int fits_in_file(const mq_commitlog *cl, uint32_t size) {
    if (cl->dledger) return (uint64_t)size + MQ_DL_HEADER_SIZE + MQ_DL_BLANK_LEN_MIN <= cl->file_size;
    return (uint64_t)size + MQ_BLANK_LEN_MIN <= cl->file_size;
}

static void encode_record(mq_commitlog *cl, const mq_append_req *r, const msg_plan *m, uint8_t *p,
                          int64_t qoff, uint64_t phy, int64_t ts) {
    uint8_t *start = p;
    int32_t sys_flag = (r->sys_flag & ~(MQ_SYSFLAG_BORNHOST_V6 | MQ_SYSFLAG_STOREHOST_V6)) |
                       (r->born_host_len == 16 ? MQ_SYSFLAG_BORNHOST_V6 : 0);
    be32w(p, m->size); p += 4;
    be32w(p, MQ_MESSAGE_MAGIC); p += 4;
    be32w(p, m->crc); p += 4;
    be32w(p, (uint32_t)r->queue_id); p += 4;
    be32w(p, (uint32_t)m->flag); p += 4;
    be64w(p, (uint64_t)qoff); p += 8;
    be64w(p, phy); p += 8;
    be32w(p, (uint32_t)sys_flag); p += 4;
    be64w(p, (uint64_t)r->born_ts_ms); p += 8;
    assert(p - start == MQ_REC_POS_BORN_HOST);
    memcpy(p, r->born_host, r->born_host_len); p += r->born_host_len;
    be32w(p, (uint32_t)r->born_port); p += 4;
    be64w(p, (uint64_t)ts); p += 8;
    memcpy(p, cl->store_host, 4); p += 4;
    be32w(p, (uint32_t)cl->store_port); p += 4;
    be32w(p, (uint32_t)r->reconsume_times); p += 4;
    be64w(p, (uint64_t)r->prepared_tx_offset); p += 8;
    be32w(p, m->body_len); p += 4;
    memcpy(p, m->body, m->body_len); p += m->body_len;
    *p++ = (uint8_t)r->topic_len;
    memcpy(p, r->topic, r->topic_len); p += r->topic_len;
    be16w(p, (uint16_t)(m->props_len + m->sep + r->extra_props_len)); p += 2;
    if (m->props_len) { memcpy(p, m->props, m->props_len); p += m->props_len; }
    if (m->sep) *p++ = 0x02;
    if (r->extra_props_len) { memcpy(p, r->extra_props, r->extra_props_len); p += r->extra_props_len; }
    assert((uint32_t)(p - start) == m->size);
}

/* Appends planned messages to one topic-queue.  Outcomes: MQ_OK and every message published
 * (WRITE moved, queue offsets assigned densely); or an error and nothing published (bytes
 * possibly written beyond WRITE are invisible and will be overwritten).  DLedger mode: each
 * message becomes one entry, in `forced_term` when > 0 (the leader's no-op), else in
 * DL_APPEND_TERM (MQ_E_NOT_LEADER when 0); a term below DL_END_TERM is MQ_E_INVAL. */
int append_planned(mq_commitlog *cl, const mq_append_req *r, const msg_plan *msgs, uint32_t n,
                   mq_append_out *out, int64_t forced_term, int wake) {
    mq_ctl *c = cl->ctl;
    uint32_t slot;
    int rc = mq_queue_lookup(c, r->topic, r->topic_len, r->queue_id, 1, &slot);
    if (rc) return rc;
    const int no_queue_offset = tx_no_queue(r->sys_flag);
    const uint32_t hdr = cl->dledger ? MQ_DL_HEADER_SIZE : 0;
    const uint32_t blank_min = cl->dledger ? MQ_DL_BLANK_LEN_MIN : MQ_BLANK_LEN_MIN;

    rc = ctl_lock(c);
    if (rc) return rc;
    if (__atomic_load_n(&c->fatal_err, __ATOMIC_ACQUIRE)) { ctl_unlock(c); return MQ_E_FATAL; }
    int64_t term = 0;
    uint64_t index = 0;
    if (cl->dledger) {
        term = forced_term > 0 ? forced_term : (int64_t)c->pos[MQ_POS_DL_APPEND_TERM];
        if (term <= 0) { ctl_unlock(c); return MQ_E_NOT_LEADER; }
        if (term < (int64_t)c->pos[MQ_POS_DL_END_TERM]) { ctl_unlock(c); return MQ_E_INVAL; }
        index = c->pos[MQ_POS_DL_NEXT_INDEX];
    }

    const uint64_t fs = cl->file_size;
    int64_t qoff = c->slots[slot].field[MQ_Q_NEXT_OFFSET];
    uint64_t pos = c->pos[MQ_POS_WRITE];
    int64_t ts = now_ms();
    if (ts < (int64_t)c->pos[MQ_POS_LAST_STORE_TS]) ts = (int64_t)c->pos[MQ_POS_LAST_STORE_TS];
    uint64_t cur_fi = UINT64_MAX;
    uint8_t *base = NULL;

    for (uint32_t i = 0; i < n; i++) {
        const msg_plan *m = &msgs[i];
        const uint32_t esize = m->size + hdr;
        uint64_t room = fs - pos % fs;
        assert(room >= blank_min);
        if ((uint64_t)esize + blank_min > room) {
            if (cur_fi != pos / fs) {
                rc = seg_get(cl, pos / fs, 1, &base);
                if (rc) goto fail;
                cur_fi = pos / fs;
            }
            uint8_t *p = base + pos % fs;
            if (cl->dledger) {
                dl_write_blank(p, room);
            } else {
                be32w(p, (uint32_t)room);
                be32w(p + 4, MQ_BLANK_MAGIC);
            }
            pos += room;
            assert(pos % fs == 0);
        }
        if (cur_fi != pos / fs) {
            rc = seg_get(cl, pos / fs, 1, &base);
            if (rc) goto fail;
            cur_fi = pos / fs;
        }
        int64_t this_qoff = no_queue_offset ? 0 : qoff;
        const uint64_t phy = pos + hdr;
        if (cl->dledger) {
            dl_encode_header(base + pos % fs, esize, index, term, pos);
            rc = dl_write_unit(cl, index, pos, esize, term);
            if (rc) goto fail;
        }
        encode_record(cl, r, m, base + phy % fs, this_qoff, phy, ts);
        out[i].phy_offset = phy;
        out[i].queue_offset = this_qoff;
        out[i].store_ts_ms = ts;
        out[i].size = m->size;
        out[i].dl_index = cl->dledger ? (int64_t)index : 0;
        out[i].dl_term = term;
        mq_msg_id(cl->store_host, 4, cl->store_port, phy, out[i].msg_id);
        pos += esize;
        if (cl->dledger) index++;
        if (!no_queue_offset) qoff++;
    }

    /* publish through the journal: fill, mark valid, apply, clear */
    c->j_slot = slot;
    c->j_next_qoff = qoff;
    c->j_write_pos = pos;
    c->j_store_ts = ts;
    c->j_dl = (uint32_t)cl->dledger;
    c->j_next_index = index;
    c->j_end_term = term;
    __atomic_store_n(&c->j_valid, 1, __ATOMIC_RELEASE);
    __atomic_store_n(&c->slots[slot].field[MQ_Q_NEXT_OFFSET], qoff, __ATOMIC_RELEASE);
    __atomic_store_n(&c->pos[MQ_POS_LAST_STORE_TS], (uint64_t)ts, __ATOMIC_RELEASE);
    __atomic_add_fetch(&c->pos[MQ_POS_MSGS], n, __ATOMIC_RELEASE);   /* before WRITE: a reader of both never sees bytes without their count */
    if (cl->dledger) {
        __atomic_store_n(&c->pos[MQ_POS_DL_END_TERM], (uint64_t)term, __ATOMIC_RELEASE);
        __atomic_store_n(&c->pos[MQ_POS_DL_NEXT_INDEX], index, __ATOMIC_RELEASE);
    }
    __atomic_store_n(&c->pos[MQ_POS_WRITE], pos, __ATOMIC_RELEASE);
    __atomic_store_n(&c->j_valid, 0, __ATOMIC_RELEASE);
    ctl_unlock(c);
    if (wake) mq_ctl_wake(c, MQ_SEQ_WRITE);
    return MQ_OK;
fail:
    ctl_unlock(c);
    return rc;
}

static int append_one(mq_commitlog *cl, const mq_append_req *r, int32_t flag, const uint8_t *body,
                      uint32_t body_len, const uint8_t *props, uint32_t props_len, mq_append_out *out, int wake) {
    assert(out && (body || !body_len) && (props || !props_len));
    int rc = check_req(cl, r);
    if (rc) return rc;
    if (props_len > MQ_PROPS_LEN_MAX) return MQ_E_PROPS_TOO_LONG;
    msg_plan m = {.body = body, .props = props, .body_len = body_len, .props_len = props_len, .flag = flag};
    rc = plan_msg(r, &m);
    if (rc) return rc;
    if (!fits_in_file(cl, m.size)) return MQ_E_TOO_BIG;
    m.crc = body_crc(body, body_len);
    return append_planned(cl, r, &m, 1, out, 0, wake);
}

int mq_commitlog_append_one(mq_commitlog *cl, const mq_append_req *r, int32_t flag, const uint8_t *body,
                            uint32_t body_len, const uint8_t *props, uint32_t props_len, mq_append_out *out) {
    return append_one(cl, r, flag, body, body_len, props, props_len, out, 1);
}

int mq_commitlog_append_group(mq_commitlog *cl, const mq_group_msg *msgs, uint32_t n,
                              uint32_t max_message_size, mq_append_out *out, int32_t *rc_out) {
    assert(cl && (n == 0 || (msgs && out && rc_out)));
    if (n > MQ_BATCH_MSGS_MAX) return MQ_E_INVAL;
    int appended = 0;
    for (uint32_t i = 0; i < n; i++) {
        const mq_group_msg *g = &msgs[i];
        assert(g->born_host);
        mq_append_req r = {
            .topic = g->topic, .topic_len = g->topic_len, .queue_id = g->queue_id, .sys_flag = g->sys_flag,
            .reconsume_times = g->reconsume_times, .born_ts_ms = g->born_ts_ms, .born_port = g->born_port,
            .born_host_len = g->born_host_len, .extra_props = g->extra_props,
            .extra_props_len = g->extra_props_len, .max_message_size = max_message_size,
        };
        if (g->born_host_len != 4 && g->born_host_len != 16) {     /* check_req's answer, before the copy */
            rc_out[i] = MQ_E_INVAL;
            continue;
        }
        memcpy(r.born_host, g->born_host, g->born_host_len);
        rc_out[i] = append_one(cl, &r, g->flag, g->body, g->body_len, g->props, g->props_len, &out[i], 0);
        if (rc_out[i] == MQ_OK) appended++;
    }
    if (appended) mq_ctl_wake(cl->ctl, MQ_SEQ_WRITE);
    return appended;
}

int mq_commitlog_append_batch(mq_commitlog *cl, const mq_append_req *r, const uint8_t *batch, size_t batch_len,
                              mq_append_out *out, uint32_t out_cap, uint32_t *n_out) {
    assert(batch && out && n_out);
    int rc = check_req(cl, r);
    if (rc) return rc;
    if (batch_len == 0 || batch_len > r->max_message_size) return MQ_E_MSG_ILLEGAL;
    uint32_t cap = out_cap < MQ_BATCH_MSGS_MAX ? out_cap : MQ_BATCH_MSGS_MAX;
    msg_plan stack_plans[64];
    msg_plan *plans = stack_plans;
    uint32_t plans_cap = 64, n = 0;
    size_t at = 0;
    while (at < batch_len) {                 /* totalSize 4 | magic 4 | bodyCRC 4 | flag 4 | bodyLen 4 | body | propsLen 2 | props */
        const uint8_t *p = batch + at;
        size_t left = batch_len - at;
        if (left < MQ_BATCH_RECORD_SIZE_MIN) { rc = MQ_E_MSG_ILLEGAL; goto out; }
        uint32_t total = be32r(p), body_len = be32r(p + 16);
        if (total < MQ_BATCH_RECORD_SIZE_MIN || total > left || body_len > total - MQ_BATCH_RECORD_SIZE_MIN) {
            rc = MQ_E_MSG_ILLEGAL;
            goto out;
        }
        int16_t props_len = (int16_t)be16r(p + 20 + body_len);
        if (props_len < 0 || MQ_BATCH_RECORD_SIZE_MIN + body_len + (uint32_t)props_len != total) {
            rc = MQ_E_MSG_ILLEGAL;
            goto out;
        }
        if (n == cap) { rc = MQ_E_MSG_ILLEGAL; goto out; }
        if (n == plans_cap) {
            uint32_t nc = plans_cap * 4 < cap ? plans_cap * 4 : cap;
            msg_plan *np = malloc(nc * sizeof(msg_plan));
            if (!np) { rc = io_fail(cl, ENOMEM); goto out; }
            memcpy(np, plans, n * sizeof(msg_plan));
            if (plans != stack_plans) free(plans);
            plans = np;
            plans_cap = nc;
        }
        msg_plan *m = &plans[n];
        m->flag = (int32_t)be32r(p + 12);
        m->body = p + 20;
        m->body_len = body_len;
        m->props = p + 22 + body_len;
        m->props_len = (uint32_t)props_len;
        rc = plan_msg(r, m);
        if (rc) goto out;
        if (!fits_in_file(cl, m->size)) { rc = MQ_E_TOO_BIG; goto out; }
        m->crc = body_crc(m->body, body_len);
        n++;
        at += total;
    }
    rc = append_planned(cl, r, plans, n, out, 0, 1);
    if (rc == MQ_OK) *n_out = n;
out:
    if (plans != stack_plans) free(plans);
    return rc;
}

/* ==================================================================================== */
/* Read, check, scan                                                                     */
/* ==================================================================================== */
int mq_commitlog_view_raw(mq_commitlog *cl, uint64_t offset, uint32_t size, const uint8_t **ptr) {
    assert(ptr);
    const uint64_t fs = cl->file_size;
    if (size == 0 || (offset % fs) + size > fs) return MQ_E_RANGE;
    uint8_t *base;
    int rc = seg_get(cl, offset / fs, 0, &base);
    if (rc) return rc;
    *ptr = base + offset % fs;
    return MQ_OK;
}

int mq_commitlog_view(mq_commitlog *cl, uint64_t offset, uint32_t size, const uint8_t **ptr) {
    uint64_t lo = ctl_load(cl->ctl, MQ_POS_MIN), hi = ctl_load(cl->ctl, MQ_POS_WRITE);
    if (offset < lo || offset + size > hi || offset + size < offset) return MQ_E_RANGE;
    return mq_commitlog_view_raw(cl, offset, size, ptr);
}

int mq_record_check(const uint8_t *p, size_t avail, int check_crc, mq_scan_rec *rec, int *stop) {
    *stop = MQ_SCAN_LIMIT;
    if (avail < 8) { *stop = MQ_SCAN_TORN; return MQ_E_CORRUPT; }     /* TOTALSIZE and MAGIC */
    uint32_t total = be32r(p + MQ_REC_POS_TOTAL_SIZE);
    if (be32r(p + MQ_REC_POS_MAGIC) != MQ_MESSAGE_MAGIC) { *stop = MQ_SCAN_BAD_MAGIC; return MQ_E_CORRUPT; }
    if (total < MQ_RECORD_SIZE_MIN) { *stop = MQ_SCAN_BAD_SIZE; return MQ_E_CORRUPT; }
    if (total > avail) { *stop = MQ_SCAN_TORN; return MQ_E_CORRUPT; }
    int32_t sys_flag = (int32_t)be32r(p + MQ_REC_POS_SYS_FLAG);
    uint32_t bl = (sys_flag & MQ_SYSFLAG_BORNHOST_V6) ? 16 : 4, sl = (sys_flag & MQ_SYSFLAG_STOREHOST_V6) ? 16 : 4;
    uint32_t fixed = fixed_len(bl, sl);
    if (total < fixed) { *stop = MQ_SCAN_BAD_SIZE; return MQ_E_CORRUPT; }
    /* BORNHOST | BORNPORT 4 | STORETS 8 | STOREHOST | STOREPORT 4 | RECONSUMETIMES 4 | PREPAREDTXOFFSET 8 | BODYLEN 4 */
    const uint32_t store_ts_at = MQ_REC_POS_BORN_HOST + bl + 4;
    const uint32_t body_at = store_ts_at + 8 + sl + 4 + 4 + 8 + 4;   /* 88 with IPv4 hosts */
    uint32_t body_len = be32r(p + body_at - 4);
    if (body_len > total - fixed) { *stop = MQ_SCAN_BAD_SIZE; return MQ_E_CORRUPT; }
    int8_t topic_len = (int8_t)p[body_at + body_len];
    if (topic_len <= 0 || body_at + body_len + 1 + (uint32_t)topic_len + 2 > total) {
        *stop = MQ_SCAN_BAD_SIZE;
        return MQ_E_CORRUPT;
    }
    uint32_t props_at = body_at + body_len + 1 + (uint32_t)topic_len + 2;
    int16_t props_len = (int16_t)be16r(p + props_at - 2);
    if (props_len < 0 || props_at + (uint32_t)props_len != total) { *stop = MQ_SCAN_BAD_SIZE; return MQ_E_CORRUPT; }
    /* the fields the store files a record by, which no checksum covers: a value no append writes
     * (check_req) is damage.  A damaged one that stays in range is caught where it is used: the
     * read path compares all three with what was asked, dispatch the queue offset (dispatch.h). */
    if (!topic_ok((const char *)p + body_at + body_len + 1, (uint32_t)topic_len) ||
        (int32_t)be32r(p + MQ_REC_POS_QUEUE_ID) < 0 || (int64_t)be64r(p + MQ_REC_POS_QUEUE_OFFSET) < 0) {
        *stop = MQ_SCAN_BAD_FIELD;
        return MQ_E_CORRUPT;
    }
    if (check_crc && body_crc(p + body_at, body_len) != be32r(p + MQ_REC_POS_BODY_CRC)) {
        *stop = MQ_SCAN_BAD_CRC;
        return MQ_E_CORRUPT;
    }
    rec->phy_offset = be64r(p + MQ_REC_POS_PHYSICAL_OFFSET);
    rec->queue_offset = (int64_t)be64r(p + MQ_REC_POS_QUEUE_OFFSET);
    rec->born_ts_ms = (int64_t)be64r(p + MQ_REC_POS_BORN_TIMESTAMP);
    rec->store_ts_ms = (int64_t)be64r(p + store_ts_at);
    rec->size = total;
    rec->queue_id = (int32_t)be32r(p + MQ_REC_POS_QUEUE_ID);
    rec->sys_flag = sys_flag;
    rec->slot = UINT32_MAX;
    rec->body_offset = body_at;
    rec->body_len = body_len;
    rec->topic_offset = body_at + body_len + 1;
    rec->topic_len = (uint32_t)topic_len;
    rec->props_offset = props_at;
    rec->props_len = (uint32_t)props_len;
    rec->tags_code = mq_tags_code(p + props_at, (uint32_t)props_len);
    rec->dl_index = rec->dl_term = 0;
    rec->dl_pos = 0;
    return MQ_OK;
}

/* The offset in props of the value of `key` (name + 0x01) by mq_records_props' rule, its length
 * in *vlen; -1 when there is none. */
static int32_t prop_value(const uint8_t *props, uint32_t plen, const uint8_t *key, uint32_t klen, int32_t *vlen) {
    if (klen == 0 || klen > plen) return -1;
    for (uint32_t at = plen - klen + 1; at-- > 0;) {
        if (props[at] != key[0] || (at > 0 && props[at - 1] != 0x02) || memcmp(props + at, key, klen) != 0)
            continue;
        uint32_t start = at + klen;
        const uint8_t *end = memchr(props + start, 0x02, plen - start);
        uint32_t stop = end ? (uint32_t)(end - props) : plen;
        if (stop > start) {
            *vlen = (int32_t)(stop - start);
            return (int32_t)start;
        }
    }
    return -1;
}

int mq_records_props(const uint8_t *buf, size_t len, uint32_t n, const uint8_t *names,
                     const uint32_t *name_lens, uint32_t n_names, int32_t *spans) {
    assert((buf || len == 0) && (names || n_names == 0) && (spans || n == 0));
    if (len > INT32_MAX) return MQ_E_INVAL;
    size_t pos = 0;
    const size_t stride = 2 * ((size_t)n_names + 1);
    for (uint32_t i = 0; i < n; i++) {
        mq_scan_rec rec;
        int stop;
        if (pos >= len || mq_record_check(buf + pos, len - pos, 0, &rec, &stop) != MQ_OK) return MQ_E_CORRUPT;
        int32_t *out = spans + i * stride;
        out[0] = (int32_t)pos;
        out[1] = (int32_t)rec.size;
        const uint8_t *props = buf + pos + rec.props_offset;
        const uint8_t *key = names;
        for (uint32_t j = 0; j < n_names; j++) {
            int32_t vlen = -1;
            int32_t at = prop_value(props, rec.props_len, key, name_lens[j], &vlen);
            out[2 + 2 * j] = at < 0 ? -1 : (int32_t)(pos + rec.props_offset) + at;
            out[3 + 2 * j] = at < 0 ? -1 : vlen;
            key += name_lens[j];
        }
        pos += rec.size;
    }
    return MQ_OK;
}

int mq_commitlog_read_record(mq_commitlog *cl, uint64_t offset, uint32_t size, int32_t queue_id,
                             int64_t queue_offset, const char *topic, uint32_t topic_len, const uint8_t **ptr) {
    int rc = mq_commitlog_view(cl, offset, size, ptr);
    if (rc) return rc;
    mq_scan_rec rec;
    int stop;
    if (mq_record_check(*ptr, size, 1, &rec, &stop) != MQ_OK || rec.phy_offset != offset || rec.size != size)
        return MQ_E_CORRUPT;
    if (queue_id >= 0 && (rec.queue_id != queue_id || rec.queue_offset != queue_offset)) return MQ_E_CORRUPT;
    if (topic && (rec.topic_len != topic_len || memcmp(*ptr + rec.topic_offset, topic, topic_len) != 0))
        return MQ_E_CORRUPT;
    return MQ_OK;
}

/* Recovery: an entry is written from its record's own fields, so an entry that names a whole
 * record (position and size exact) which says another queue or queue offset proves one of the two
 * damaged -- no checksum covers either.  Finds the first such entry of n (20 bytes each, queue
 * offsets first_qoff on) naming a position at or past from_phy: *at_out = its index, n when none.
 * Entries naming no whole record (fillers, holes, positions gone or damaged) are the read path's
 * business (mq_commitlog_read_record refuses them), not this function's.  No CRC: the body does
 * not say which queue a record is in. */
int mq_commitlog_misnamed(mq_commitlog *cl, const uint8_t *entries, uint32_t n, uint64_t from_phy,
                          int32_t queue_id, int64_t first_qoff, const char *topic, uint32_t topic_len,
                          uint32_t *at_out) {
    assert(cl && (entries || n == 0) && topic && at_out);
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *e = entries + (size_t)i * 20;
        int64_t phy = (int64_t)be64r(e);
        uint32_t size = be32r(e + 8);
        const uint8_t *p;
        mq_scan_rec rec;
        int stop;
        if (phy < 0 || (uint64_t)phy < from_phy || size < MQ_RECORD_SIZE_MIN) continue;
        if (mq_commitlog_view(cl, (uint64_t)phy, size, &p) != MQ_OK) continue;
        if (mq_record_check(p, size, 0, &rec, &stop) != MQ_OK || rec.phy_offset != (uint64_t)phy || rec.size != size)
            continue;
        if (rec.queue_id != queue_id || rec.queue_offset != first_qoff + i || rec.topic_len != topic_len ||
            memcmp(p + rec.topic_offset, topic, topic_len) != 0) {
            *at_out = i;
            return MQ_OK;
        }
    }
    *at_out = n;
    return MQ_OK;
}

static int code_wanted(const int64_t *codes, uint32_t n_codes, int64_t code) {
    uint32_t lo = 0, hi = n_codes;                   /* codes sorted ascending */
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (codes[mid] < code) lo = mid + 1;
        else hi = mid;
    }
    return lo < n_codes && codes[lo] == code;
}

int mq_commitlog_gather(mq_commitlog *cl, const uint8_t *entries, uint32_t n_entries, uint64_t min_phy,
                        const int64_t *codes, uint32_t n_codes, int32_t queue_id,
                        int64_t first_queue_offset, const char *topic, uint32_t topic_len,
                        uint32_t have, uint32_t count_max, uint64_t bytes_max, uint8_t *out,
                        uint64_t out_cap, mq_gather_out *res) {
    assert(res && (entries || n_entries == 0) && (codes || n_codes == 0) && (out || out_cap == 0));
    res->scanned = 0;
    res->n = 0;
    res->size = 0;
    res->last_phy = -1;
    res->stop_rc = MQ_OK;
    if (count_max == 0) return MQ_E_INVAL;
    for (uint32_t i = 0; i < n_entries; i++) {
        const uint8_t *e = entries + (size_t)i * 20;
        int64_t phy = (int64_t)be64r(e);
        uint32_t size = be32r(e + 8);
        int64_t code = (int64_t)be64r(e + 12);
        if ((have || res->n) && (res->n >= count_max || res->size + size > bytes_max)) break;
        if (phy >= 0 && (uint64_t)phy >= min_phy && (n_codes == 0 || code_wanted(codes, n_codes, code))) {
            if (size > out_cap - res->size) { res->stop_rc = MQ_E_FULL; return MQ_OK; }
            const uint8_t *rec;
            int rc = mq_commitlog_read_record(cl, (uint64_t)phy, size, queue_id, first_queue_offset + i, topic,
                                              topic_len, &rec);
            if (rc) { res->stop_rc = rc; return MQ_OK; }
            memcpy(out + res->size, rec, size);
            res->size += size;
            res->n++;
        }
        res->scanned = i + 1;
        res->last_phy = phy;
    }
    return MQ_OK;
}

/* Fills r->slot for the record starting at rec_start (create: resolve_slots == 2).  A record
 * whose queue is absent (lookup only) keeps UINT32_MAX. */
static int resolve_slot(mq_commitlog *cl, const uint8_t *rec_start, mq_scan_rec *r, int resolve_slots) {
    uint32_t slot;
    int lr = mq_queue_lookup(cl->ctl, (const char *)rec_start + r->topic_offset, r->topic_len, r->queue_id,
                             resolve_slots == 2, &slot);
    if (lr == MQ_OK) r->slot = slot;
    else if (lr != MQ_E_RANGE && lr != MQ_E_TOPIC_ILLEGAL) return lr;
    return MQ_OK;
}

int mq_commitlog_scan(mq_commitlog *cl, uint64_t from, uint64_t limit, int check_crc, int resolve_slots,
                      mq_scan_rec *out, uint32_t cap, uint32_t *n_out, uint64_t *next_out, int *stop_out) {
    assert(resolve_slots >= 0 && resolve_slots <= 2 && (out || cap == 0) && n_out && next_out && stop_out);
    const uint64_t fs = cl->file_size;
    uint64_t pos = from;
    uint32_t n = 0;
    int stop = MQ_SCAN_LIMIT, rc = MQ_OK;
    int64_t prev_index = -1, prev_term = 0;          /* DLedger: the previous entry of this walk */
    uint64_t cur_fi = UINT64_MAX;
    uint8_t *base = NULL;
    for (;;) {
        if (pos >= limit) { stop = MQ_SCAN_LIMIT; break; }
        if (n == cap) { stop = MQ_SCAN_FULL; break; }
        uint64_t fi = pos / fs, off = pos % fs;
        if (fi != cur_fi) {
            rc = seg_get(cl, fi, 0, &base);
            if (rc == MQ_E_RANGE) { rc = MQ_OK; stop = MQ_SCAN_END; break; }
            if (rc) break;
            cur_fi = fi;
        }
        uint64_t room = fs - off;
        uint64_t avail = limit - pos < room ? limit - pos : room;
        const uint8_t *p = base + off;
        if (room < MQ_BLANK_LEN_MIN) { stop = MQ_SCAN_TORN; break; }
        uint32_t w0 = be32r(p), w1 = be32r(p + 4);
        mq_scan_rec *r = &out[n];
        const uint8_t *rec_start = p;
        uint32_t step;
        if (cl->dledger) {                               /* entry: magic, size, ...; filler: -1, room */
            if (w0 == MQ_DL_BLANK_MAGIC) {
                if (w1 != room) { stop = MQ_SCAN_BAD_SIZE; break; }
                pos += room;
                continue;
            }
            if (w0 == 0 && w1 == 0) { stop = MQ_SCAN_END; break; }
            if (dl_entry_check(p, pos, room, avail, check_crc, r, &stop) != MQ_OK) break;
            if (prev_index >= 0 && (r->dl_index != prev_index + 1 || r->dl_term < prev_term)) {
                stop = MQ_SCAN_BAD_INDEX;
                break;
            }
            prev_index = r->dl_index;
            prev_term = r->dl_term;
            rec_start = p + MQ_DL_HEADER_SIZE;
            step = w1;
        } else {                                         /* record: totalsize, magic; filler: room, blank magic */
            if (w1 == MQ_BLANK_MAGIC) {
                if (w0 != room) { stop = MQ_SCAN_BAD_SIZE; break; }
                pos += room;
                continue;
            }
            if (w0 == 0 && w1 == 0) { stop = MQ_SCAN_END; break; }
            if (mq_record_check(p, avail, check_crc, r, &stop) != MQ_OK) break;
            if (r->phy_offset != pos) { stop = MQ_SCAN_BAD_OFFSET; break; }
            step = w0;
        }
        if (resolve_slots && (rc = resolve_slot(cl, rec_start, r, resolve_slots)) != MQ_OK) break;
        n++;
        pos += step;
    }
    *n_out = n;
    *next_out = pos;
    *stop_out = stop;
    return rc;
}

/* Is there a whole record (DLedger: entry) at off of a file starting at file_start? */
static int resync_at(const mq_commitlog *cl, const uint8_t *base, uint64_t file_start, uint64_t off) {
    const uint64_t fs = cl->file_size;
    mq_scan_rec rec;
    int why;
    if (cl->dledger)
        return off + MQ_DL_HEADER_SIZE + MQ_RECORD_SIZE_MIN <= fs && be64r(base + off + 24) == file_start + off &&
               dl_entry_check(base + off, file_start + off, fs - off, fs - off, 0, &rec, &why) == MQ_OK;
    return off + MQ_RECORD_SIZE_MIN <= fs && be64r(base + off + MQ_REC_POS_PHYSICAL_OFFSET) == file_start + off &&
           mq_record_check(base + off, (size_t)(fs - off), 0, &rec, &why) == MQ_OK;
}

int mq_commitlog_resync(mq_commitlog *cl, uint64_t from, uint64_t limit, uint64_t *at_out) {
    assert(at_out);
    /* the magic that starts a record (at +4: TOTALSIZE comes first) or a DLedger entry (at +0) */
    const uint32_t mv = cl->dledger ? MQ_DL_MAGIC : MQ_MESSAGE_MAGIC;
    const uint64_t magic_at = cl->dledger ? 0 : 4;
    const uint8_t magic[4] = {(uint8_t)(mv >> 24), (uint8_t)(mv >> 16), (uint8_t)(mv >> 8), (uint8_t)mv};
    const uint64_t fs = cl->file_size;
    uint64_t pos = from;
    while (pos < limit) {
        uint64_t fi = pos / fs, file_start = fi * fs;
        uint8_t *base;
        int rc = seg_get(cl, fi, 0, &base);
        if (rc == MQ_E_RANGE) { pos = file_start + fs; continue; }
        if (rc) return rc;
        uint64_t stop = limit - file_start < fs ? limit - file_start : fs;     /* candidates start below */
        uint64_t off = pos - file_start;
        while (off < stop) {
            const uint8_t *m = off + magic_at < fs
                ? memmem(base + off + magic_at, (size_t)(fs - off - magic_at), magic, 4) : NULL;
            if (!m || (uint64_t)(m - base) - magic_at >= stop) break;
            off = (uint64_t)(m - base) - magic_at;
            if (resync_at(cl, base, file_start, off)) {
                *at_out = file_start + off;
                return MQ_OK;
            }
            off++;
        }
        pos = file_start + fs;
    }
    *at_out = limit;
    return MQ_OK;
}

/* ==================================================================================== */
/* Flush, zero tail                                                                      */
/* ==================================================================================== */
int mq_commitlog_flush(mq_commitlog *cl, uint32_t least_pages, uint64_t *flushed_out) {
    mq_ctl *c = cl->ctl;
    const uint64_t fs = cl->file_size;
    *flushed_out = ctl_load(c, MQ_POS_FLUSHED);
    int rc = ctl_lock(c);
    if (rc) return rc;
    uint64_t upto = c->pos[MQ_POS_WRITE];
    uint64_t ts = c->pos[MQ_POS_LAST_STORE_TS];
    uint64_t next_index = c->pos[MQ_POS_DL_NEXT_INDEX];      /* the entries ending at `upto` */
    uint64_t epoch = c->trunc_epoch;
    ctl_unlock(c);
    uint64_t from = ctl_load(c, MQ_POS_FLUSHED);
    *flushed_out = from;
    if (__atomic_load_n(&c->fatal_err, __ATOMIC_ACQUIRE)) return MQ_E_FATAL;
    if (upto <= from) return MQ_OK;
    if (least_pages > 0 && from / fs == upto / fs && upto / MQ_PAGE - from / MQ_PAGE < least_pages) return MQ_OK;
    uint64_t pos = from;
    while (pos < upto) {
        uint64_t fi = pos / fs;
        uint64_t end = (fi + 1) * fs < upto ? (fi + 1) * fs : upto;
        uint8_t *base;
        rc = seg_get(cl, fi, 0, &base);
        if (rc == MQ_E_RANGE) { pos = end; continue; }   /* deleted by retention meanwhile */
        if (rc) return rc;
        uint64_t a = (pos % fs) & ~(uint64_t)(MQ_PAGE - 1);
        uint64_t b = end - fi * fs;
        if (msync(base + a, b - a, MS_SYNC) != 0) {
            int e = errno;
            char msg[200];
            snprintf(msg, sizeof msg, "msync of commitlog file %020llu failed: %s",
                     (unsigned long long)(fi * fs), strerror(e));
            mq_ctl_set_fatal(c, e, msg);
            cl->last_errno = e;
            *flushed_out = ctl_load(c, MQ_POS_FLUSHED);
            return MQ_E_IO;
        }
        pos = end;
    }
    if (cl->dledger) {
        /* publish only if no truncation happened meanwhile (it may have replaced bytes we did not sync) */
        rc = ctl_lock(c);
        if (rc) return rc;
        if (c->trunc_epoch != epoch) {
            ctl_unlock(c);
            *flushed_out = ctl_load(c, MQ_POS_FLUSHED);
            return MQ_OK;
        }
        mq_ctl_advance(c, MQ_POS_DL_FLUSHED_INDEX, next_index);
        mq_ctl_advance(c, MQ_POS_FLUSHED_STORE_TS, ts);
        mq_ctl_advance(c, MQ_POS_FLUSHED, upto);
        ctl_unlock(c);
    } else {
        mq_ctl_advance(c, MQ_POS_FLUSHED_STORE_TS, ts);
        mq_ctl_advance(c, MQ_POS_FLUSHED, upto);
    }
    mq_ctl_wake(c, MQ_SEQ_FLUSH);
    *flushed_out = upto;
    return MQ_OK;
}

int mq_commitlog_flush_for(mq_commitlog *cl, uint32_t wait_ms, mq_flush_rec *recs, uint32_t cap, uint32_t *n_out) {
    assert(recs && n_out && *n_out < cap);
    mq_ctl *c = cl->ctl;
    const int64_t deadline = mono_ms() + wait_ms;
    for (;;) {
        uint32_t seen = mq_ctl_seq(c, MQ_SEQ_WRITE);            /* before the look: a move after it wakes */
        if (__atomic_load_n(&c->fatal_err, __ATOMIC_ACQUIRE)) return MQ_E_FATAL;
        const uint64_t before = ctl_load(c, MQ_POS_FLUSHED);
        if (ctl_load(c, MQ_POS_WRITE) > before) {
            struct timespec wall;
            clock_gettime(CLOCK_REALTIME, &wall);
            const uint64_t msgs = ctl_load(c, MQ_POS_MSGS);
            const int64_t t0 = mono_ns();
            uint64_t after;
            int rc = mq_commitlog_flush(cl, 0, &after);
            if (rc) return rc;
            if (after > before) {
                mq_flush_rec *r = &recs[(*n_out)++];
                r->ts_us = (int64_t)wall.tv_sec * 1000000 + wall.tv_nsec / 1000;
                r->msgs = msgs;
                r->bytes = after - before;
                r->flush_ns = (uint64_t)(mono_ns() - t0);
                if (*n_out == cap) return MQ_OK;
            }
            if (mono_ms() >= deadline) return MQ_OK;
            continue;
        }
        const int64_t left = deadline - mono_ms();
        if (left <= 0) return MQ_OK;
        (void)mq_ctl_wait(c, MQ_SEQ_WRITE, seen, (int)left);
    }
}

int mq_commitlog_zero_tail(mq_commitlog *cl, uint64_t from) {
    const uint64_t fs = cl->file_size;
    uint8_t *base;
    int rc = seg_get(cl, from / fs, 0, &base);
    if (rc == MQ_E_RANGE) return MQ_OK;
    if (rc) return rc;
    uint64_t off = from % fs;
    uint64_t first_dirty = UINT64_MAX;
    while (off < fs) {
        uint64_t page_end = (off & ~(uint64_t)(MQ_PAGE - 1)) + MQ_PAGE;
        if (page_end > fs) page_end = fs;
        const uint8_t *p = base + off;
        size_t len = page_end - off;
        int nonzero = 0;
        for (size_t i = 0; i < len; i++) if (p[i]) { nonzero = 1; break; }
        if (nonzero) {
            memset(base + off, 0, len);
            if (first_dirty == UINT64_MAX) first_dirty = off;
        }
        off = page_end;
    }
    if (first_dirty != UINT64_MAX) {
        uint64_t a = first_dirty & ~(uint64_t)(MQ_PAGE - 1);
        if (msync(base + a, fs - a, MS_SYNC) != 0) return io_fail(cl, errno);
    }
    return MQ_OK;
}
