/*
 * dledger.c -- DLedger mode: entries and index units, the follower's raw append, truncation,
 * commit, the append term, index recovery and pushes.  Contract and layouts in dledger.h; the
 * leader's appends are the CommitLog's (commitlog.c, append_planned), which calls back here for
 * the index units, as its scan does for the entry check.
 */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

/* ---- index units, entry check (used by commitlog.c too) ------------------------------------ */
int dl_write_unit(mq_commitlog *cl, uint64_t index, uint64_t pos, uint32_t size, int64_t term) {
    const uint64_t at = index * MQ_DL_INDEX_UNIT, ifs = cl->index.file_size;
    uint8_t *base;
    int rc = tseg_get(cl, &cl->index, at / ifs, 1, &base);
    if (rc) return rc;
    uint8_t *u = base + at % ifs;
    be32w(u, MQ_DL_MAGIC);
    be64w(u + 4, pos);
    be32w(u + 12, size);
    be64w(u + 16, index);
    be64w(u + 24, (uint64_t)term);
    return MQ_OK;
}

int dl_entry_check(const uint8_t *p, uint64_t pos, uint64_t room, uint64_t avail, int check_crc,
                   mq_scan_rec *rec, int *stop) {
    uint32_t magic = be32r(p), size = be32r(p + 4);
    if (magic != MQ_DL_MAGIC) { *stop = MQ_SCAN_BAD_MAGIC; return MQ_E_CORRUPT; }
    if (size < MQ_DL_HEADER_SIZE + MQ_RECORD_SIZE_MIN || (uint64_t)size + MQ_DL_BLANK_LEN_MIN > room) {
        *stop = MQ_SCAN_BAD_SIZE;
        return MQ_E_CORRUPT;
    }
    if (size > avail) { *stop = MQ_SCAN_TORN; return MQ_E_CORRUPT; }
    if (be32r(p + 44) + MQ_DL_HEADER_SIZE != size) { *stop = MQ_SCAN_BAD_SIZE; return MQ_E_CORRUPT; }
    if (be64r(p + 24) != pos) { *stop = MQ_SCAN_BAD_OFFSET; return MQ_E_CORRUPT; }
    const uint32_t body = size - MQ_DL_HEADER_SIZE;
    if (mq_record_check(p + MQ_DL_HEADER_SIZE, body, check_crc, rec, stop) != MQ_OK) {
        if (*stop == MQ_SCAN_TORN) *stop = MQ_SCAN_BAD_SIZE;      /* the record overruns its entry */
        return MQ_E_CORRUPT;
    }
    if (rec->size != body) { *stop = MQ_SCAN_BAD_SIZE; return MQ_E_CORRUPT; }
    if (rec->phy_offset != pos + MQ_DL_HEADER_SIZE) { *stop = MQ_SCAN_BAD_OFFSET; return MQ_E_CORRUPT; }
    rec->dl_index = (int64_t)be64r(p + 8);
    rec->dl_term = (int64_t)be64r(p + 16);
    rec->dl_pos = pos;
    /* values no append writes (no checksum covers the header): indexes start at 0 at position 0 on
     * every member (an install keeps the leader's positions), each entry takes at least
     * MQ_DL_HEADER_SIZE + MQ_RECORD_SIZE_MIN bytes, so index <= pos / that; terms start at 1 */
    if (rec->dl_index < 0 || (uint64_t)rec->dl_index > pos / (MQ_DL_HEADER_SIZE + MQ_RECORD_SIZE_MIN) ||
        rec->dl_term < 1) {
        *stop = MQ_SCAN_BAD_INDEX;
        return MQ_E_CORRUPT;
    }
    return MQ_OK;
}

/* ---- the Raft role's calls ------------------------------------------------------------------- */
static const char DL_NOOP_TOPIC[] = "RMQ_SYS_DLEDGER_NOOP";

int mq_dledger_append_noop(mq_commitlog *cl, int64_t term, mq_append_out *out) {
    assert(cl->dledger && out);
    if (term <= 0) return MQ_E_INVAL;
    uint8_t body[8];
    be64w(body, (uint64_t)term);
    mq_append_req r;
    memset(&r, 0, sizeof r);
    r.topic = DL_NOOP_TOPIC;
    r.topic_len = (uint32_t)strlen(DL_NOOP_TOPIC);
    r.queue_id = 0;
    r.sys_flag = MQ_SYSFLAG_TX_ROLLBACK;     /* no ConsumeQueue entry anywhere */
    memcpy(r.born_host, cl->store_host, 4);
    r.born_host_len = 4;
    r.born_port = cl->store_port;
    r.born_ts_ms = now_ms();
    r.max_message_size = sizeof body;
    msg_plan m = {.body = body, .body_len = sizeof body};
    int rc = plan_msg(&r, &m);
    if (rc) return rc;
    m.crc = body_crc(body, sizeof body);
    return append_planned(cl, &r, &m, 1, out, term, 1);
}

/* ---- index units: read, checked against their entries, repaired -------------------------- */

/* Entry `index`'s unit as it is (no range check against the control block): MQ_E_CORRUPT when its
 * magic or index is wrong or its index file is missing. */
static int dl_unit_raw(mq_commitlog *cl, uint64_t index, uint64_t *pos, uint32_t *size, int64_t *term) {
    const uint64_t at = index * MQ_DL_INDEX_UNIT, ifs = cl->index.file_size;
    uint8_t *base;
    int rc = tseg_get(cl, &cl->index, at / ifs, 0, &base);
    if (rc == MQ_E_RANGE) return MQ_E_CORRUPT;          /* a published entry without its index file */
    if (rc) return rc;
    const uint8_t *u = base + at % ifs;
    if (be32r(u) != MQ_DL_MAGIC || be64r(u + 16) != index) return MQ_E_CORRUPT;
    *pos = be64r(u + 4);
    *size = be32r(u + 12);
    *term = (int64_t)be64r(u + 24);
    return MQ_OK;
}

/* 1 when the entry at pos says what the unit says: magic, size, index, term and its own pos, inside
 * one data file that is there.  No control-block position bounds it: a unit is published (under
 * DL_NEXT_INDEX) after its entry's bytes, but WRITE may be published after DL_NEXT_INDEX. */
static int dl_unit_agrees(mq_commitlog *cl, uint64_t index, uint64_t pos, uint32_t size, int64_t term) {
    const uint64_t fs = cl->file_size;
    if (size < MQ_DL_HEADER_SIZE + MQ_RECORD_SIZE_MIN || pos % fs + size > fs) return 0;
    uint8_t *base;
    if (seg_get(cl, pos / fs, 0, &base) != MQ_OK) return 0;
    const uint8_t *e = base + pos % fs;
    return be32r(e) == MQ_DL_MAGIC && be32r(e + 4) == size && be64r(e + 8) == index &&
           be64r(e + 16) == (uint64_t)term && be64r(e + 24) == pos;
}

/* The entry at *pos, or past the filler there at the next file's start (*pos moves): its bytes and
 * the room left in its file; MQ_E_CORRUPT for a filler that does not reach its file's end. */
static int dl_entry_bytes(mq_commitlog *cl, uint64_t *pos, const uint8_t **e, uint64_t *room) {
    const uint64_t fs = cl->file_size;
    for (int hop = 0; hop < 2; hop++) {
        uint8_t *base;
        int rc = seg_get(cl, *pos / fs, 0, &base);
        if (rc == MQ_E_RANGE) return MQ_E_CORRUPT;
        if (rc) return rc;
        *e = base + *pos % fs;
        *room = fs - *pos % fs;
        if (*room < MQ_DL_BLANK_LEN_MIN || be32r(*e) != MQ_DL_BLANK_MAGIC) return MQ_OK;
        if (be32r(*e + 4) != *room) return MQ_E_CORRUPT;
        *pos += *room;
    }
    return MQ_E_CORRUPT;                                 /* a filler filling a whole file */
}

/* Entry `index`'s unit rebuilt from the entries, for dl_read_unit when the unit disagrees with its
 * entry (or is unreadable): from the nearest unit below that agrees with its entry (or from the
 * log's first entry, at MIN), entries are walked with their CRCs (dl_entry_check; past fillers)
 * up to `index`, each index as expected and terms nondecreasing up to DL_END_TERM, and every unit
 * on the way that disagrees is rewritten from its entry and counted (units_repaired).  A term the
 * unit and the header alone disagree on (no checksum covers either) is taken from whichever lies
 * between the previous entry's term and the next one's; both or neither: MQ_E_CORRUPT, as for any
 * damage the walk meets. */
static int dl_unit_repair(mq_commitlog *cl, uint64_t index, uint64_t *pos_out, uint32_t *size_out,
                          int64_t *term_out) {
    mq_ctl *c = cl->ctl;
    const uint64_t begin = ctl_load(c, MQ_POS_DL_BEGIN_INDEX), next = ctl_load(c, MQ_POS_DL_NEXT_INDEX);
    const int64_t end_term = (int64_t)ctl_load(c, MQ_POS_DL_END_TERM);
    uint64_t k = index, at = ctl_load(c, MQ_POS_MIN), up;
    uint32_t us;
    int64_t prev_term = 1, ut;                           /* terms start at 1 */
    for (; k > begin; k--) {
        if (dl_unit_raw(cl, k - 1, &up, &us, &ut) == MQ_OK && dl_unit_agrees(cl, k - 1, up, us, ut)) {
            at = up + us;
            prev_term = ut;
            break;
        }
    }
    for (;; k++) {                                       /* entry k is at `at` (or past a filler there) */
        const uint8_t *e;
        uint64_t room;
        int rc = dl_entry_bytes(cl, &at, &e, &room);
        if (rc) return rc;
        mq_scan_rec rec;
        int stop;
        if (dl_entry_check(e, at, room, room, 1, &rec, &stop) != MQ_OK || (uint64_t)rec.dl_index != k)
            return MQ_E_CORRUPT;
        const uint32_t size = be32r(e + 4);
        int64_t term = rec.dl_term;
        const int raw = dl_unit_raw(cl, k, &up, &us, &ut);
        if (raw != MQ_OK && raw != MQ_E_CORRUPT) return raw;
        if (raw == MQ_OK && up == at && us == size && ut != term) {
            int64_t hi = end_term;                       /* the next entry's term, if its unit agrees */
            uint64_t np;
            uint32_t ns;
            int64_t nt;
            if (k + 1 < next && dl_unit_raw(cl, k + 1, &np, &ns, &nt) == MQ_OK && dl_unit_agrees(cl, k + 1, np, ns, nt))
                hi = nt;
            const int unit_fits = prev_term <= ut && ut <= hi, header_fits = prev_term <= term && term <= hi;
            if (unit_fits == header_fits) return MQ_E_CORRUPT;
            if (unit_fits) term = ut;
        }
        if (term < prev_term || term > end_term) return MQ_E_CORRUPT;
        if (raw != MQ_OK || up != at || us != size || ut != term) {
            if ((rc = dl_write_unit(cl, k, at, size, term))) return rc;
            __atomic_add_fetch(&cl->units_repaired, 1, __ATOMIC_RELAXED);
            __atomic_store_n(&cl->unit_repaired_last, k, __ATOMIC_RELAXED);
        }
        if (k == index) {
            *pos_out = at;
            *size_out = size;
            *term_out = term;
            return MQ_OK;
        }
        prev_term = term;
        at += size;
    }
}

/* Entry `index`'s unit, checked against its entry (dl_unit_agrees) and repaired from the entries
 * when it disagrees (dl_unit_repair); no range check against the control block. */
static int dl_read_unit(mq_commitlog *cl, uint64_t index, uint64_t *pos, uint32_t *size, int64_t *term) {
    int rc = dl_unit_raw(cl, index, pos, size, term);
    if (rc == MQ_OK && dl_unit_agrees(cl, index, *pos, *size, *term)) return MQ_OK;
    if (rc != MQ_OK && rc != MQ_E_CORRUPT) return rc;
    return dl_unit_repair(cl, index, pos, size, term);
}

uint64_t mq_dledger_entries_repaired(mq_commitlog *cl) {
    assert(cl->dledger);
    return __atomic_load_n(&cl->entries_repaired, __ATOMIC_RELAXED);
}

uint64_t mq_dledger_units_repaired(mq_commitlog *cl, uint64_t *last_index_out) {
    assert(cl->dledger && last_index_out);
    *last_index_out = __atomic_load_n(&cl->unit_repaired_last, __ATOMIC_RELAXED);
    return __atomic_load_n(&cl->units_repaired, __ATOMIC_RELAXED);
}

int mq_dledger_entry(mq_commitlog *cl, uint64_t index, uint64_t *pos_out, uint32_t *size_out, int64_t *term_out) {
    assert(cl->dledger && pos_out && size_out && term_out);
    mq_ctl *c = cl->ctl;
    if (index < ctl_load(c, MQ_POS_DL_BEGIN_INDEX) || index >= ctl_load(c, MQ_POS_DL_NEXT_INDEX))
        return MQ_E_RANGE;
    return dl_read_unit(cl, index, pos_out, size_out, term_out);
}

int mq_dledger_scrub(mq_commitlog *cl, uint64_t first, uint64_t last, uint64_t bytes_max, uint64_t *bad_out,
                     uint64_t *next_out) {
    assert(cl->dledger && bad_out && next_out && first <= last && bytes_max > 0);
    mq_ctl *c = cl->ctl;
    if (first < ctl_load(c, MQ_POS_DL_BEGIN_INDEX) || last >= ctl_load(c, MQ_POS_DL_NEXT_INDEX)) return MQ_E_RANGE;
    *bad_out = UINT64_MAX;
    uint64_t bytes = 0, i = first;
    for (; i <= last && bytes < bytes_max; i++) {
        uint64_t pos;
        uint32_t size;
        int64_t term;
        int rc = dl_read_unit(cl, i, &pos, &size, &term);
        if (rc == MQ_OK) {             /* the unit agrees with the entry's header: pos..pos+size is in one file */
            const uint8_t *e;
            uint64_t room;
            if ((rc = dl_entry_bytes(cl, &pos, &e, &room)) == MQ_OK) {
                mq_scan_rec rec;
                int stop;
                if (dl_entry_check(e, pos, room, room, 1, &rec, &stop) != MQ_OK) rc = MQ_E_CORRUPT;
            }
            bytes += size;
        }
        if (rc == MQ_E_CORRUPT) {
            *bad_out = i++;
            break;
        }
        if (rc) return rc;
    }
    *next_out = i;
    return MQ_OK;
}

int mq_dledger_first_damaged(mq_commitlog *cl, uint64_t first, uint64_t last, uint64_t *bad_out) {
    assert(bad_out);
    uint64_t bad, next;
    int rc = mq_dledger_scrub(cl, first, last, UINT64_MAX, &bad, &next);
    if (rc) return rc;
    *bad_out = bad == UINT64_MAX ? last + 1 : bad;
    return MQ_OK;
}

/* The entries of buf as they would sit from (first_index, first_pos) after an entry of prev_term:
 * magic, sizes, index continuity, terms nondecreasing and <= max_term, pos, the room rule, the
 * record inside; fillers reach their file's end.  Reads buf only. */
typedef struct { uint32_t n; uint64_t end_pos, end_index; int64_t last_term, last_ts; } dl_checked;

static int dl_check_entries(mq_commitlog *cl, const uint8_t *buf, size_t len, uint64_t first_index,
                            uint64_t first_pos, int64_t prev_term, int64_t max_term, dl_checked *out) {
    const uint64_t fs = cl->file_size;
    size_t at = 0;
    uint64_t pos = first_pos, index = first_index;
    uint32_t n = 0;
    int64_t last_ts = 0, term = prev_term;
    while (at < len) {
        const uint8_t *p = buf + at;
        const uint64_t room = fs - pos % fs;
        if (len - at < 8) return MQ_E_CORRUPT;
        if (be32r(p) == MQ_DL_BLANK_MAGIC) {              /* a filler: it reaches its file's end */
            if (be32r(p + 4) != room || len - at < room) return MQ_E_CORRUPT;
            at += room;
            pos += room;
            continue;
        }
        mq_scan_rec rec;
        int stop;
        if (dl_entry_check(p, pos, room, len - at, 1, &rec, &stop) != MQ_OK) return MQ_E_CORRUPT;
        if ((uint64_t)rec.dl_index != index || rec.dl_term < term || rec.dl_term > max_term) return MQ_E_CORRUPT;
        term = rec.dl_term;
        last_ts = rec.store_ts_ms;
        const uint32_t size = be32r(p + 4);
        at += size;
        pos += size;
        index++;
        n++;
    }
    out->n = n;
    out->end_pos = pos;
    out->end_index = index;
    out->last_term = term;
    out->last_ts = last_ts;
    return MQ_OK;
}

/* Copies checked entries to first_pos.. (beyond WRITE: invisible until published) and writes
 * their index units. */
static int dl_copy_entries(mq_commitlog *cl, const uint8_t *buf, size_t len, uint64_t first_pos) {
    const uint64_t fs = cl->file_size;
    size_t at = 0;
    uint64_t pos = first_pos;
    int rc;
    while (at < len) {
        uint8_t *base;      /* unused: seg_get is called so the file exists at its full
                             * size and is mapped (readers use the mapping) before seg_fd */
        rc = seg_get(cl, pos / fs, 1, &base);
        if (rc) return rc;
        size_t chunk = fs - pos % fs;
        if (chunk > len - at) chunk = len - at;
        /* pwrite, not a copy into the mapping: the page cache takes whole pages without a
         * write fault each (a follower's files are not pre-touched: nothing else writes them) */
        const int fd = seg_fd(cl, pos / fs);
        size_t done = 0;
        while (done < chunk) {
            const ssize_t w = pwrite(fd, buf + at + done, chunk - done, (off_t)(pos % fs + done));
            if (w < 0) {
                if (errno == EINTR) continue;
                return io_fail(cl, errno);
            }
            done += (size_t)w;
        }
        (void)base;
        at += chunk;
        pos += chunk;
    }
    at = 0;
    pos = first_pos;
    while (at < len) {
        const uint8_t *p = buf + at;
        if (be32r(p) == MQ_DL_BLANK_MAGIC) {
            uint64_t room = fs - pos % fs;
            at += room;
            pos += room;
            continue;
        }
        const uint32_t size = be32r(p + 4);
        rc = dl_write_unit(cl, be64r(p + 8), pos, size, (int64_t)be64r(p + 16));
        if (rc) return rc;
        at += size;
        pos += size;
    }
    return MQ_OK;
}

/* append_raw, refusing (MQ_E_CORRUPT, nothing written) entries that are not exactly expect_n
 * when expect_n > 0 */
static int dl_append_raw(mq_commitlog *cl, const uint8_t *buf, size_t len, uint64_t first_index,
                         uint64_t first_pos, int64_t max_term, uint32_t expect_n, uint32_t *n_out);

int mq_dledger_append_raw(mq_commitlog *cl, const uint8_t *buf, size_t len, uint64_t first_index,
                          uint64_t first_pos, int64_t max_term, uint32_t *n_out) {
    return dl_append_raw(cl, buf, len, first_index, first_pos, max_term, 0, n_out);
}

static int dl_append_raw(mq_commitlog *cl, const uint8_t *buf, size_t len, uint64_t first_index,
                         uint64_t first_pos, int64_t max_term, uint32_t expect_n, uint32_t *n_out) {
    mq_ctl *c = cl->ctl;
    const uint64_t fs = cl->file_size;
    assert(cl->dledger && (buf || len == 0) && n_out);
    *n_out = 0;
    int rc = ctl_lock(c);
    if (rc) return rc;
    if (c->pos[MQ_POS_DL_APPEND_TERM]) { ctl_unlock(c); return MQ_E_INVAL; }   /* io workers may append */
    /* The entries start at our end, or at the start of the next file when ours ends where the
     * leader rolled over: it wrote the filler of our last file after we had taken that file's
     * last entry, and a push starts at an entry, never at a filler.  We then write the same
     * filler ourselves (the roll-over rule is deterministic; checked below against the first
     * entry's size). */
    const uint64_t w0 = c->pos[MQ_POS_WRITE];
    const int rollover = w0 != first_pos && first_pos % fs == 0 && w0 < first_pos && first_pos - w0 == fs - w0 % fs;
    if ((w0 != first_pos && !rollover) || c->pos[MQ_POS_DL_NEXT_INDEX] != first_index) {
        ctl_unlock(c);
        return MQ_E_RANGE;
    }
    int64_t prev_term = (int64_t)c->pos[MQ_POS_DL_END_TERM];
    uint64_t epoch = c->trunc_epoch;
    ctl_unlock(c);
    if (len == 0) return MQ_OK;
    if (rollover) {       /* the leader rolls only for an entry that does not fit (append_planned) */
        if (len < 8 || be32r(buf) == MQ_DL_BLANK_MAGIC || (uint64_t)be32r(buf + 4) + MQ_DL_BLANK_LEN_MIN <= fs - w0 % fs)
            return MQ_E_CORRUPT;
    }

    /* 1. validate everything before writing anything */
    dl_checked ck;
    rc = dl_check_entries(cl, buf, len, first_index, first_pos, prev_term, max_term, &ck);
    if (rc) return rc;
    if (expect_n && ck.n != expect_n) return MQ_E_CORRUPT;

    /* 2. copy the bytes (beyond WRITE: invisible until published) and write the index units */
    if (rollover) {
        uint8_t *base;
        rc = seg_get(cl, w0 / fs, 1, &base);
        if (rc) return rc;
        dl_write_blank(base + w0 % fs, fs - w0 % fs);
    }
    rc = dl_copy_entries(cl, buf, len, first_pos);
    if (rc) return rc;

    /* 3. publish, if nothing moved meanwhile (only this thread appends here: a change is a bug or a race
     *    with a truncation of this same log, which must not happen) */
    rc = ctl_lock(c);
    if (rc) return rc;
    if (c->pos[MQ_POS_WRITE] != w0 || c->pos[MQ_POS_DL_NEXT_INDEX] != first_index ||
        c->trunc_epoch != epoch || c->pos[MQ_POS_DL_APPEND_TERM]) {
        ctl_unlock(c);
        return MQ_E_RANGE;
    }
    if (ck.n) {
        __atomic_store_n(&c->pos[MQ_POS_LAST_STORE_TS], (uint64_t)ck.last_ts, __ATOMIC_RELEASE);
        __atomic_store_n(&c->pos[MQ_POS_DL_END_TERM], (uint64_t)ck.last_term, __ATOMIC_RELEASE);
    }
    __atomic_add_fetch(&c->pos[MQ_POS_MSGS], ck.n, __ATOMIC_RELEASE);
    __atomic_store_n(&c->pos[MQ_POS_DL_NEXT_INDEX], ck.end_index, __ATOMIC_RELEASE);
    __atomic_store_n(&c->pos[MQ_POS_WRITE], ck.end_pos, __ATOMIC_RELEASE);
    ctl_unlock(c);
    mq_ctl_wake(c, MQ_SEQ_WRITE);
    *n_out = ck.n;
    return MQ_OK;
}

/* Zeroes [from, to) of the data files (only pages that hold non-zero bytes are written)
 * and makes it durable. */
static int dl_zero_range(mq_commitlog *cl, uint64_t from, uint64_t to) {
    const uint64_t fs = cl->file_size;
    while (from < to) {
        uint8_t *base;
        uint64_t fend = from - from % fs + fs;
        uint64_t end = to < fend ? to : fend;
        int rc = seg_get(cl, from / fs, 0, &base);
        if (rc == MQ_E_RANGE) { from = end; continue; }
        if (rc) return rc;
        uint64_t a = from % fs, b = end - (from - from % fs);
        int dirty = 0;
        for (uint64_t i = a; i < b; i++) if (base[i]) { dirty = 1; break; }
        if (dirty) {
            memset(base + a, 0, b - a);
            uint64_t pa = a & ~(uint64_t)(MQ_PAGE - 1);
            if (msync(base + pa, b - pa, MS_SYNC) != 0) return io_fail(cl, errno);
        }
        from = end;
    }
    return MQ_OK;
}

/* Zeroes the index units of entries [from, to). */
static int dl_zero_units(mq_commitlog *cl, uint64_t from, uint64_t to) {
    const uint64_t ifs = cl->index.file_size;
    for (uint64_t i = from; i < to;) {
        uint64_t at = i * MQ_DL_INDEX_UNIT;
        uint64_t file_end_index = (at / ifs + 1) * ifs / MQ_DL_INDEX_UNIT;
        uint64_t stop = to < file_end_index ? to : file_end_index;
        uint8_t *base;
        int rc = tseg_get(cl, &cl->index, at / ifs, 0, &base);
        if (rc == MQ_E_RANGE) { i = stop; continue; }
        if (rc) return rc;
        memset(base + at % ifs, 0, (stop - i) * MQ_DL_INDEX_UNIT);
        i = stop;
    }
    return MQ_OK;
}

int mq_dledger_truncate(mq_commitlog *cl, uint64_t next_index) {
    mq_ctl *c = cl->ctl;
    assert(cl->dledger);
    int rc = ctl_lock(c);
    if (rc) return rc;
    const uint64_t cur_next = c->pos[MQ_POS_DL_NEXT_INDEX];
    if (next_index == cur_next) { ctl_unlock(c); return MQ_OK; }
    if (next_index > cur_next || next_index < c->pos[MQ_POS_DL_COMMIT_INDEX] ||
        next_index < c->pos[MQ_POS_DL_BEGIN_INDEX] || c->pos[MQ_POS_DL_APPEND_TERM]) {
        ctl_unlock(c);
        return MQ_E_INVAL;
    }
    uint64_t new_write;
    uint32_t size;
    int64_t term;
    rc = dl_read_unit(cl, next_index, &new_write, &size, &term);
    int64_t end_term = 0;
    if (rc == MQ_OK && next_index > c->pos[MQ_POS_DL_BEGIN_INDEX]) {
        uint64_t ppos;
        uint32_t psize;
        rc = dl_read_unit(cl, next_index - 1, &ppos, &psize, &end_term);
    }
    const uint64_t old_write = c->pos[MQ_POS_WRITE];
    if (rc == MQ_OK && (new_write > old_write || new_write < c->pos[MQ_POS_COMMITTED])) rc = MQ_E_CORRUPT;
    if (rc == MQ_OK) rc = dl_zero_range(cl, new_write, old_write);
    if (rc == MQ_OK) rc = dl_zero_units(cl, next_index, cur_next);
    if (rc) { ctl_unlock(c); return rc; }
    c->trunc_epoch++;
    __atomic_store_n(&c->pos[MQ_POS_DL_NEXT_INDEX], next_index, __ATOMIC_RELEASE);
    __atomic_store_n(&c->pos[MQ_POS_DL_END_TERM], (uint64_t)end_term, __ATOMIC_RELEASE);
    __atomic_store_n(&c->pos[MQ_POS_WRITE], new_write, __ATOMIC_RELEASE);
    /* the one place positions move back: nothing past the end stays "flushed" */
    if (c->pos[MQ_POS_FLUSHED] > new_write) __atomic_store_n(&c->pos[MQ_POS_FLUSHED], new_write, __ATOMIC_RELEASE);
    if (c->pos[MQ_POS_DL_FLUSHED_INDEX] > next_index)
        __atomic_store_n(&c->pos[MQ_POS_DL_FLUSHED_INDEX], next_index, __ATOMIC_RELEASE);
    ctl_unlock(c);
    return MQ_OK;
}

/* msyncs the data bytes [from, to) (their files are mapped). */
static int dl_sync_range(mq_commitlog *cl, uint64_t from, uint64_t to) {
    const uint64_t fs = cl->file_size;
    while (from < to) {
        uint64_t fi = from / fs, fend = (fi + 1) * fs < to ? (fi + 1) * fs : to;
        uint8_t *base;
        int rc = seg_get(cl, fi, 0, &base);
        if (rc) return rc;
        uint64_t a = (from % fs) & ~(uint64_t)(MQ_PAGE - 1);
        if (msync(base + a, fend - fi * fs - a, MS_SYNC) != 0) return io_fail(cl, errno);
        from = fend;
    }
    return MQ_OK;
}

int mq_dledger_repair_entry(mq_commitlog *cl, uint64_t index, const uint8_t *buf, size_t len, int *repaired_out) {
    assert(cl->dledger && (buf || !len) && repaired_out);
    *repaired_out = 0;
    mq_ctl *c = cl->ctl;
    const uint64_t begin = ctl_load(c, MQ_POS_DL_BEGIN_INDEX), next = ctl_load(c, MQ_POS_DL_NEXT_INDEX);
    if (index < begin || index >= next || index >= ctl_load(c, MQ_POS_DL_COMMIT_INDEX)) return MQ_E_RANGE;
    uint64_t bad;
    int rc = mq_dledger_first_damaged(cl, index, index, &bad);
    if (rc) return rc;
    if (bad != index) return MQ_OK;                      /* whole (repaired meanwhile): nothing to do */
    /* the peer's bytes: one whole entry of this index (CRCs), at the position it names */
    const uint64_t fs = cl->file_size;
    if (len < MQ_DL_HEADER_SIZE + MQ_RECORD_SIZE_MIN || be32r(buf + 4) != len) return MQ_E_INVAL;
    const uint64_t pos = be64r(buf + 24);
    if (pos % fs + len + MQ_DL_BLANK_LEN_MIN > fs) return MQ_E_INVAL;
    mq_scan_rec rec;
    int stop;
    if (dl_entry_check(buf, pos, fs - pos % fs, len, 1, &rec, &stop) != MQ_OK) return MQ_E_CORRUPT;
    if ((uint64_t)rec.dl_index != index) return MQ_E_INVAL;
    /* ...where this log holds entry `index`: the neighbours' units (checked against their own
     * entries) bound it exactly, and its term lies between theirs.  Committed entries are the same
     * bytes at the same positions on every member (log matching; installs keep positions). */
    uint64_t np;
    uint32_t ns;
    int64_t nt, lo_term = 1, hi_term = (int64_t)ctl_load(c, MQ_POS_DL_END_TERM);
    if (index > begin) {
        if ((rc = dl_read_unit(cl, index - 1, &np, &ns, &nt))) return rc == MQ_E_CORRUPT ? MQ_E_INVAL : rc;
        if (np + ns != pos && !(np + ns <= pos && pos % fs == 0 && (np + ns) / fs + 1 == pos / fs)) return MQ_E_INVAL;
        lo_term = nt;
    } else if (pos != ctl_load(c, MQ_POS_MIN) && !(pos % fs == 0 && ctl_load(c, MQ_POS_MIN) / fs + 1 == pos / fs)) {
        return MQ_E_INVAL;
    }
    if (index + 1 < next) {
        if ((rc = dl_read_unit(cl, index + 1, &np, &ns, &nt))) return rc == MQ_E_CORRUPT ? MQ_E_INVAL : rc;
        if (np != pos + len && !(np % fs == 0 && (pos + len) / fs + 1 == np / fs)) return MQ_E_INVAL;
        hi_term = nt;
    } else if (pos + len != ctl_load(c, MQ_POS_WRITE)) {
        return MQ_E_INVAL;
    }
    if (rec.dl_term < lo_term || rec.dl_term > hi_term) return MQ_E_INVAL;
    uint8_t *base;
    if ((rc = seg_get(cl, pos / fs, 0, &base))) return rc;
    memcpy(base + pos % fs, buf, len);
    if ((rc = dl_sync_range(cl, pos, pos + len))) return rc;
    if ((rc = dl_write_unit(cl, index, pos, (uint32_t)len, rec.dl_term))) return rc;
    __atomic_add_fetch(&cl->entries_repaired, 1, __ATOMIC_RELAXED);
    *repaired_out = 1;
    return MQ_OK;
}

static int dl_install_checks(mq_ctl *c, uint64_t begin_index, uint64_t begin_pos) {
    if (c->pos[MQ_POS_DL_APPEND_TERM] || begin_pos < c->pos[MQ_POS_MIN] || begin_pos < c->pos[MQ_POS_COMMITTED] ||
        begin_index < c->pos[MQ_POS_DL_COMMIT_INDEX] || begin_index < c->pos[MQ_POS_DL_BEGIN_INDEX])
        return MQ_E_INVAL;
    return MQ_OK;
}

int mq_dledger_install(mq_commitlog *cl, const uint8_t *buf, size_t len, uint64_t begin_index,
                       uint64_t begin_pos, int64_t max_term, uint32_t *n_out) {
    mq_ctl *c = cl->ctl;
    const uint64_t fs = cl->file_size;
    assert(cl->dledger && (buf || len == 0) && n_out);
    *n_out = 0;
    if (len == 0 || begin_pos % fs) return MQ_E_INVAL;
    int rc = ctl_lock(c);
    if (rc) return rc;
    rc = dl_install_checks(c, begin_index, begin_pos);
    ctl_unlock(c);
    if (rc) return rc;

    /* 1. check the entries and create (allocate) their files: nothing is written yet, and these are the
     *    steps that can fail for input or for space */
    dl_checked ck;                               /* the leader's first entry follows no entry: term 0 */
    rc = dl_check_entries(cl, buf, len, begin_index, begin_pos, 0, max_term, &ck);
    if (rc) return rc;
    if (ck.n == 0) return MQ_E_CORRUPT;
    for (uint64_t fi = begin_pos / fs; fi <= (ck.end_pos - 1) / fs; fi++) {
        uint8_t *base;
        rc = seg_get(cl, fi, 1, &base);
        if (rc) return rc;
    }

    /* 2. under the lock (as a truncation): copy, make durable, zero our old tail past the new end,
     *    publish.  A failure from here leaves bytes the positions do not describe: it is made sticky
     *    (the broker stops; recovery validates the files and the leader installs again) */
    rc = ctl_lock(c);
    if (rc) return rc;
    rc = dl_install_checks(c, begin_index, begin_pos);
    if (rc) { ctl_unlock(c); return rc; }
    const uint64_t w0 = c->pos[MQ_POS_WRITE], next0 = c->pos[MQ_POS_DL_NEXT_INDEX];
    rc = dl_copy_entries(cl, buf, len, begin_pos);
    if (rc == MQ_OK) rc = dl_sync_range(cl, begin_pos, ck.end_pos);
    if (rc == MQ_OK && w0 > ck.end_pos) rc = dl_zero_range(cl, ck.end_pos, w0);
    if (rc == MQ_OK && next0 > ck.end_index) rc = dl_zero_units(cl, ck.end_index, next0);
    /* the units before B in B's index file are our old log's, not the leader's: a unit there would
     * claim the term of entry B-1 (DLedgerLog.term_at reads it for the entry before the first) */
    const uint64_t ipf = cl->index.file_size / MQ_DL_INDEX_UNIT;
    if (rc == MQ_OK) rc = dl_zero_units(cl, begin_index - begin_index % ipf, begin_index);
    if (rc) {
        char msg[200];
        snprintf(msg, sizeof msg, "DLedger install at index %llu, pos %llu failed while writing: %s",
                 (unsigned long long)begin_index, (unsigned long long)begin_pos, strerror(cl->last_errno));
        mq_ctl_set_fatal(c, cl->last_errno ? cl->last_errno : EIO, msg);
        ctl_unlock(c);
        return rc;
    }
    c->trunc_epoch++;                           /* a flush in flight must not publish the old tail */
    /* MIN first: a reader that sees any of the new positions also sees that nothing below is held */
    __atomic_store_n(&c->pos[MQ_POS_MIN], begin_pos, __ATOMIC_RELEASE);
    __atomic_store_n(&c->pos[MQ_POS_DL_BEGIN_INDEX], begin_index, __ATOMIC_RELEASE);
    __atomic_store_n(&c->pos[MQ_POS_COMMITTED], begin_pos, __ATOMIC_RELEASE);
    __atomic_store_n(&c->pos[MQ_POS_DL_COMMIT_INDEX], begin_index, __ATOMIC_RELEASE);
    __atomic_store_n(&c->pos[MQ_POS_FLUSHED], ck.end_pos, __ATOMIC_RELEASE);
    __atomic_store_n(&c->pos[MQ_POS_DL_FLUSHED_INDEX], ck.end_index, __ATOMIC_RELEASE);
    __atomic_store_n(&c->pos[MQ_POS_LAST_STORE_TS], (uint64_t)ck.last_ts, __ATOMIC_RELEASE);
    __atomic_store_n(&c->pos[MQ_POS_FLUSHED_STORE_TS], (uint64_t)ck.last_ts, __ATOMIC_RELEASE);
    __atomic_store_n(&c->pos[MQ_POS_DL_END_TERM], (uint64_t)ck.last_term, __ATOMIC_RELEASE);
    __atomic_add_fetch(&c->pos[MQ_POS_MSGS], ck.n, __ATOMIC_RELEASE);
    __atomic_store_n(&c->pos[MQ_POS_DL_NEXT_INDEX], ck.end_index, __ATOMIC_RELEASE);
    __atomic_store_n(&c->pos[MQ_POS_WRITE], ck.end_pos, __ATOMIC_RELEASE);
    ctl_unlock(c);
    mq_ctl_wake(c, MQ_SEQ_WRITE);
    mq_ctl_wake(c, MQ_SEQ_FLUSH);
    mq_ctl_wake(c, MQ_SEQ_COMMIT);
    *n_out = ck.n;
    return MQ_OK;
}

/* No lock: the one caller (the Raft role's thread) is also the only one that truncates, the
 * entries below DL_NEXT_INDEX it reads are published and immutable meanwhile, and both positions
 * only move forward (advance).  Taking the lock here made every commit wait for appends. */
int mq_dledger_set_commit(mq_commitlog *cl, uint64_t commit_next_index) {
    mq_ctl *c = cl->ctl;
    assert(cl->dledger);
    if (commit_next_index > ctl_load(c, MQ_POS_DL_NEXT_INDEX)) return MQ_E_RANGE;
    if (commit_next_index <= ctl_load(c, MQ_POS_DL_COMMIT_INDEX) ||
        commit_next_index <= ctl_load(c, MQ_POS_DL_BEGIN_INDEX))
        return MQ_OK;
    uint64_t pos;
    uint32_t size;
    int64_t term;
    int rc = dl_read_unit(cl, commit_next_index - 1, &pos, &size, &term);
    if (rc) return rc;
    /* COMMITTED first: a reader that sees the new index also sees the position */
    mq_ctl_advance(c, MQ_POS_COMMITTED, pos + size);
    mq_ctl_advance(c, MQ_POS_DL_COMMIT_INDEX, commit_next_index);
    mq_ctl_wake(c, MQ_SEQ_COMMIT);
    return MQ_OK;
}

int mq_dledger_set_append_term(mq_commitlog *cl, int64_t term) {
    mq_ctl *c = cl->ctl;
    assert(cl->dledger);
    if (term < 0) return MQ_E_INVAL;
    int rc = ctl_lock(c);
    if (rc) return rc;
    __atomic_store_n(&c->pos[MQ_POS_DL_APPEND_TERM], (uint64_t)term, __ATOMIC_RELEASE);
    ctl_unlock(c);
    mq_ctl_wake(c, MQ_SEQ_COMMIT);
    return MQ_OK;
}

int mq_dledger_recover_index(mq_commitlog *cl, uint64_t from_pos, uint64_t end_pos,
                             uint64_t *next_index_out, int64_t *end_term_out) {
    assert(cl->dledger && next_index_out && end_term_out);
    const uint64_t fs = cl->file_size;
    uint64_t pos = from_pos, next = 0;
    int64_t term = 0;
    int any = 0;
    while (pos < end_pos) {
        uint8_t *base;
        int rc = seg_get(cl, pos / fs, 0, &base);
        if (rc) return rc;
        const uint8_t *p = base + pos % fs;
        uint32_t magic = be32r(p), size = be32r(p + 4);
        if (magic == MQ_DL_BLANK_MAGIC) { pos += fs - pos % fs; continue; }
        if (magic != MQ_DL_MAGIC || size < MQ_DL_HEADER_SIZE || pos + size > end_pos) return MQ_E_CORRUPT;
        uint64_t index = be64r(p + 8);
        term = (int64_t)be64r(p + 16);
        rc = dl_write_unit(cl, index, pos, size, term);
        if (rc) return rc;
        next = index + 1;
        any = 1;
        pos += size;
    }
    if (any) {
        /* units past the last entry, to the end of its index file, are zero (a later start finds no stale one) */
        const uint64_t ifs = cl->index.file_size;
        uint64_t file_end_index = (next * MQ_DL_INDEX_UNIT / ifs + 1) * ifs / MQ_DL_INDEX_UNIT;
        int rc = dl_zero_units(cl, next, file_end_index);
        if (rc) return rc;
    }
    *next_index_out = next;
    *end_term_out = term;
    return MQ_OK;
}

int mq_dledger_send(mq_commitlog *cl, int sock_fd, const uint8_t *head, uint32_t head_len,
                    uint64_t from_pos, uint32_t body_len, uint64_t *done_io) {
    assert(cl->dledger && (head || head_len == 0) && done_io);
    const uint64_t fs = cl->file_size;
    if (body_len && (from_pos % fs + body_len > fs || from_pos + body_len > ctl_load(cl->ctl, MQ_POS_WRITE) ||
                     from_pos < ctl_load(cl->ctl, MQ_POS_MIN)))
        return MQ_E_RANGE;
    const uint64_t total = (uint64_t)head_len + body_len;
    uint8_t *base = NULL;
    int fd = -1;
    if (body_len) {
        int rc = seg_get(cl, from_pos / fs, 0, &base);
        if (rc) return rc;
        fd = seg_fd(cl, from_pos / fs);
    }
    while (*done_io < total) {
        ssize_t w;
        if (body_len > MQ_DL_SENDFILE_MIN) {
            if (*done_io < head_len) {
                w = send(sock_fd, head + *done_io, head_len - *done_io, MSG_NOSIGNAL | MSG_MORE);
            } else {
                off_t file_off = (off_t)(from_pos % fs + (*done_io - head_len));
                w = sendfile(sock_fd, fd, &file_off, total - *done_io);
                if (w == 0) return io_fail(cl, EPIPE);
            }
        } else {
            /* a small push: head and body (straight from the mapping) in one writev */
            struct iovec iov[2];
            int k = 0;
            if (*done_io < head_len) {
                iov[k].iov_base = (void *)(head + *done_io);
                iov[k++].iov_len = head_len - *done_io;
            }
            uint64_t body_done = *done_io > head_len ? *done_io - head_len : 0;
            if (body_done < body_len) {
                iov[k].iov_base = base + from_pos % fs + body_done;
                iov[k++].iov_len = body_len - body_done;
            }
            struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)k};
            w = sendmsg(sock_fd, &mh, MSG_NOSIGNAL);
        }
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return MQ_E_AGAIN;
            return io_fail(cl, errno);
        }
        *done_io += (uint64_t)w;
    }
    return MQ_OK;
}

/* ---- the follower's steady state: PUSH frames taken in C ----------------------------------- */
_Static_assert(sizeof(((mq_dl_follow *)0)->req) / sizeof(const uint8_t *) == MQ_DL_PUSH_VALUES + 1,
               "a literal before each value and one after the last");

/* A canonical decimal at *p, as Python's str(int) writes it (-?(0|[1-9][0-9]*), at most 19
 * digits), within [lo, hi]; the cursor moves past it.  0: not one (not taken here). */
static int dl_dec(const uint8_t **p, const uint8_t *end, int64_t lo, int64_t hi, int64_t *v) {
    const uint8_t *q = *p;
    int neg = q < end && *q == '-';
    q += neg;
    const uint8_t *d = q;
    while (q < end && *q >= '0' && *q <= '9' && q - d < 20) q++;
    const size_t n = (size_t)(q - d);
    if (n == 0 || n > 19 || (d[0] == '0' && (n > 1 || neg))) return 0;
    uint64_t u = 0;
    for (size_t i = 0; i < n; i++) u = u * 10 + (uint64_t)(d[i] - '0');     /* 19 digits fit */
    if (u > (uint64_t)INT64_MAX) return 0;                                   /* (INT64_MIN: not taken) */
    const int64_t x = neg ? -(int64_t)u : (int64_t)u;
    if (x < lo || x > hi) return 0;
    *v = x;
    *p = q;
    return 1;
}

/* The values of a PUSH header that is exactly the template's: literal, value, literal, ... */
static int dl_push_match(const mq_dl_follow *t, const uint8_t *h, const uint8_t *end, int64_t v[MQ_DL_PUSH_VALUES]) {
    static const int64_t lo[MQ_DL_PUSH_VALUES] = {-1, 0, -1, 0, 1, 0, 1, INT32_MIN};
    static const int64_t hi[MQ_DL_PUSH_VALUES] = {INT64_MAX - 1, INT64_MAX, INT64_MAX, INT64_MAX, INT32_MAX,
                                                  INT64_MAX, INT64_MAX, INT32_MAX};
    for (int i = 0; i <= MQ_DL_PUSH_VALUES; i++) {
        const uint32_t n = t->req_len[i];
        if ((size_t)(end - h) < n || memcmp(h, t->req[i], n) != 0) return 0;
        h += n;
        if (i < MQ_DL_PUSH_VALUES && !dl_dec(&h, end, lo[i], hi[i], &v[i])) return 0;
    }
    return h == end;
}

static uint8_t *dl_put(uint8_t *q, const uint8_t *s, uint32_t n) {
    memcpy(q, s, n);
    return q + n;
}

int mq_dledger_follow_take(mq_commitlog *cl, const mq_dl_follow *t, const uint8_t *buf, size_t len, uint8_t *out,
                           size_t out_cap, mq_dl_taken *r) {
    assert(cl->dledger && t && (buf || len == 0) && (out || out_cap == 0) && r);
    memset(r, 0, sizeof *r);
    r->commit = -1;
    mq_ctl *c = cl->ctl;
    const size_t answer_max = 8 + (size_t)t->resp_len[0] + t->resp_len[1] + t->resp_len[2] + 20 + 11;
    size_t at = 0, used = 0;
    while (len - at >= 8) {
        const uint8_t *f = buf + at;
        const uint32_t total = be32r(f), word = be32r(f + 4), hlen = word & 0xFFFFFFu;
        if (total < 4 || total > t->frame_max || (word >> 24) != 0 || hlen > total - 4) {
            r->stop = MQ_DL_STOP_OTHER;
            break;
        }
        if (len - at - 4 < total) break;                    /* the rest of it is still to come */
        const uint8_t *h = f + 8, *body = h + hlen;
        const uint64_t body_len = total - 4 - (uint64_t)hlen;
        int64_t v[MQ_DL_PUSH_VALUES];
        if (!dl_push_match(t, h, body, v)) {
            r->stop = MQ_DL_STOP_OTHER;
            break;
        }
        const int64_t prev_index = v[0], prev_term = v[1], commit = v[2], first_index = v[3], count = v[4],
                      first_pos = v[5], body_size = v[6];
        const int32_t opaque = (int32_t)v[7];
        /* the Raft core's accept of a push whose previous entry is our last one (mq.dledger.core,
         * _on_append then _accept): nothing to compare or cut, the entries go at our end */
        uint64_t pos;
        uint32_t size;
        int64_t last_term;
        if ((uint64_t)body_size != body_len || first_index != prev_index + 1 || prev_index < 0 ||
            (uint64_t)prev_index + 1 != ctl_load(c, MQ_POS_DL_NEXT_INDEX) ||
            (uint64_t)prev_index < ctl_load(c, MQ_POS_DL_BEGIN_INDEX) ||
            mq_dledger_entry(cl, (uint64_t)prev_index, &pos, &size, &last_term) != MQ_OK || last_term != prev_term) {
            r->stop = MQ_DL_STOP_OTHER;
            break;
        }
        if (out_cap - used < answer_max) {
            r->stop = MQ_DL_STOP_OUT_FULL;
            break;
        }
        uint32_t n;
        int rc = dl_append_raw(cl, body, body_len, (uint64_t)first_index, (uint64_t)first_pos, t->term,
                               (uint32_t)count, &n);
        if (rc) {                                           /* the frame is left to Python, which meets it again */
            r->stop = rc;
            break;
        }
        const int64_t last_new = first_index + count - 1;
        const int64_t commit_new = commit < last_new ? commit : last_new;
        if (commit_new > r->commit) r->commit = commit_new;
        /* the answer: AppendResp(term, success, last_new) as the role frames it */
        uint8_t *a = out + used, *q = a + 8;
        char num[20];
        q = dl_put(q, t->resp[0], t->resp_len[0]);
        q = dl_put(q, (const uint8_t *)num, (uint32_t)mq_fmt_i64(num, last_new));
        q = dl_put(q, t->resp[1], t->resp_len[1]);
        q = dl_put(q, (const uint8_t *)num, (uint32_t)mq_fmt_i64(num, opaque));
        q = dl_put(q, t->resp[2], t->resp_len[2]);
        const uint32_t ahlen = (uint32_t)(q - a - 8);
        be32w(a, 4 + ahlen);
        be32w(a + 4, ahlen);                                /* JSON: serialize type 0 in the top byte */
        used += (size_t)(q - a);
        r->frames++;
        r->entries += n;
        at += 4 + (size_t)total;
    }
    r->consumed = at;
    r->out_len = used;
    return MQ_OK;
}

/* follow_read's and lead_read's receive: one non-blocking recv(2) into buf[*have, cap) (none
 * when full).  0 when the caller stops there: the peer closed (r->eof; buf holds no whole frame,
 * every earlier one was taken or handed over), nothing to read, or an error (r->err). */
static int dl_recv(int fd, uint8_t *buf, size_t *have, size_t cap, mq_dl_read *r) {
    if (*have == cap) return 1;
    ssize_t n;
    do n = recv(fd, buf + *have, cap - *have, MSG_DONTWAIT);
    while (n < 0 && errno == EINTR);
    if (n == 0) {
        r->eof = 1;
        return 0;
    }
    if (n < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK) r->err = errno;
        return 0;
    }
    r->got = (uint64_t)n;
    *have += (size_t)n;
    return 1;
}

int mq_dledger_follow_read(mq_commitlog *cl, const mq_dl_follow *t, int fd, uint8_t *buf, size_t cap, uint8_t *out,
                           size_t out_cap, int may_send, int sync_flush, mq_dl_read *r) {
    assert(cl->dledger && t && buf && r->have <= cap);
    size_t have = (size_t)r->have;
    r->got = r->sent = 0;
    r->eof = r->err = 0;
    memset(&r->taken, 0, sizeof r->taken);
    r->taken.commit = -1;
    if (!dl_recv(fd, buf, &have, cap, r)) return MQ_OK;
    mq_dledger_follow_take(cl, t, buf, have, out, out_cap, &r->taken);
    const size_t used = (size_t)r->taken.consumed;
    if (used) memmove(buf, buf + used, have - used);
    r->have = have - used;
    const size_t len = (size_t)r->taken.out_len;
    if (len == 0 || r->taken.stop != 0) return MQ_OK;   /* (the caller's path sends them with its own) */
    mq_ctl *c = cl->ctl;
    if (sync_flush && ctl_load(c, MQ_POS_FLUSHED) < ctl_load(c, MQ_POS_WRITE)) {
        uint64_t flushed;
        const int rc = mq_commitlog_flush(cl, 0, &flushed);
        if (rc) return rc;
    }
    while (may_send && r->sent < len) {
        const ssize_t w = send(fd, out + r->sent, len - (size_t)r->sent, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (w >= 0) {
            r->sent += (uint64_t)w;
        } else if (errno != EINTR) {
            if (errno != EAGAIN && errno != EWOULDBLOCK) r->err = errno;
            break;
        }
    }
    return MQ_OK;
}

/* ---- the leader's steady state: answers taken and pushes sent in C ---------------------------- */
_Static_assert(sizeof(((mq_dl_peer *)0)->req) / sizeof(const uint8_t *) == MQ_DL_PUSH_VALUES + 1,
               "the push template is the follower's (mq_dl_follow.req)");
_Static_assert(sizeof(((mq_dl_peer *)0)->inflight) / sizeof(int64_t) == MQ_DL_INFLIGHT_MAX, "(cffi: literal sizes)");
_Static_assert(sizeof(((mq_dl_peer *)0)->blk_head) == MQ_DL_LEAD_HEAD_MAX, "(cffi: literal sizes)");
_Static_assert(sizeof(((mq_dl_lead *)0)->peer) / sizeof(mq_dl_peer) == MQ_DL_LEAD_PEERS_MAX, "(cffi: literal sizes)");

/* RaftNode._maybe_commit: the quorum-th highest of our durable index and the followers' matches,
 * if it is past the commit and an entry of our term, becomes the commit (published). */
static int dl_lead_commit(mq_commitlog *cl, mq_dl_lead *ld) {
    mq_ctl *c = cl->ctl;
    int64_t m[MQ_DL_LEAD_PEERS_MAX + 1];
    int n = 0;
    m[n++] = (int64_t)ctl_load(c, ld->sync_durable ? MQ_POS_DL_FLUSHED_INDEX : MQ_POS_DL_NEXT_INDEX) - 1;
    for (int i = 0; i < ld->n_peers; i++) {
        const int64_t v = ld->peer[i].match;
        int k = n++;
        for (; k > 0 && m[k - 1] < v; k--) m[k] = m[k - 1];       /* kept in descending order */
        m[k] = v;
    }
    const int64_t cand = m[ld->quorum - 1];
    if (cand <= ld->commit) return MQ_OK;
    /* the core's term_at: None (no commit) outside our entries */
    if (cand < (int64_t)ctl_load(c, MQ_POS_DL_BEGIN_INDEX) || cand >= (int64_t)ctl_load(c, MQ_POS_DL_NEXT_INDEX))
        return MQ_OK;
    uint64_t pos;
    uint32_t size;
    int64_t term;
    int rc = mq_dledger_entry(cl, (uint64_t)cand, &pos, &size, &term);
    if (rc) return rc;
    if (term != ld->term) return MQ_OK;
    ld->commit = cand;
    return mq_dledger_set_commit(cl, (uint64_t)cand + 1);
}

/* The end of entry i as a push from a data file starting at `pos` sees it: past file_end when
 * the entry is in another file. */
static int dl_end_of(mq_commitlog *cl, uint64_t i, uint64_t file_of, uint64_t file_end, uint64_t *end) {
    uint64_t p;
    uint32_t s;
    int64_t t;
    int rc = mq_dledger_entry(cl, i, &p, &s, &t);
    if (rc) return rc;
    *end = p / cl->file_size == file_of ? p + s : file_end + 1;
    return MQ_OK;
}

/* DLedgerLog.entries(first, last): entries first..*hi_out as the byte range [*pos_out, +*len_out). */
static int dl_lead_batch(mq_commitlog *cl, uint64_t first, uint64_t last, uint64_t bytes_max, uint64_t *hi_out,
                         uint64_t *pos_out, uint64_t *len_out) {
    const uint64_t fs = cl->file_size;
    uint64_t pos, end;
    uint32_t size;
    int64_t term;
    int rc = mq_dledger_entry(cl, first, &pos, &size, &term);
    if (rc) return rc;
    const uint64_t file_of = pos / fs, file_end = pos - pos % fs + fs;
    const uint64_t limit = pos + bytes_max < file_end ? pos + bytes_max : file_end;
    uint64_t hi = last;
    if ((rc = dl_end_of(cl, hi, file_of, file_end, &end))) return rc;
    if (end > limit) {
        uint64_t lo = first;                                /* its end fits: one entry always goes */
        while (lo < hi) {
            const uint64_t mid = (lo + hi + 1) / 2;
            if ((rc = dl_end_of(cl, mid, file_of, file_end, &end))) return rc;
            if (end <= limit) lo = mid;
            else hi = mid - 1;
        }
        if ((rc = dl_end_of(cl, hi, file_of, file_end, &end))) return rc;
    }
    if (hi + 1 < ctl_load(cl->ctl, MQ_POS_DL_NEXT_INDEX)) {     /* (read again, as the core reads it) */
        uint64_t nxt;
        if ((rc = mq_dledger_entry(cl, hi + 1, &nxt, &size, &term))) return rc;
        if (nxt >= file_end) end = file_end;                /* the next entry opens the next file: the filler too */
    }
    *hi_out = hi;
    *pos_out = pos;
    *len_out = end - pos;
    return MQ_OK;
}

/* RaftNode._send_append in a loop, for a follower in REPLICATE (see dledger.h, "Fill"). */
static int dl_lead_fill_(mq_commitlog *cl, mq_dl_lead *ld, mq_dl_peer *p, int pushes_max);
static int dl_lead_fill(mq_commitlog *cl, mq_dl_lead *ld, mq_dl_peer *p, int pushes_max) {
    int rc = dl_lead_fill_(cl, ld, p, pushes_max);
    if (rc) p->err = rc;
    return rc;
}

static int dl_lead_fill_(mq_commitlog *cl, mq_dl_lead *ld, mq_dl_peer *p, int pushes_max) {
    mq_ctl *c = cl->ctl;
    for (int sent = 0; sent < pushes_max && p->n_inflight < ld->max_inflight; sent++) {
        const int64_t last = (int64_t)ctl_load(c, MQ_POS_DL_NEXT_INDEX) - 1;
        if (p->next > last) return MQ_OK;
        const int64_t prev = p->next - 1;
        if (p->fd < 0 || prev < (int64_t)ctl_load(c, MQ_POS_DL_BEGIN_INDEX)) {
            p->want = 1;                                    /* the core's path: a queue, a dead link, an install */
            return MQ_OK;
        }
        uint64_t ppos, hi, pos, nbytes;
        uint32_t psize;
        int64_t prev_term;
        int rc = mq_dledger_entry(cl, (uint64_t)prev, &ppos, &psize, &prev_term);
        if (rc) return rc;
        if ((rc = dl_lead_batch(cl, (uint64_t)p->next, (uint64_t)last, ld->push_bytes_max, &hi, &pos, &nbytes)))
            return rc;
        const int32_t opaque = (int32_t)(MQ_DL_LEAD_OPAQUE_BASE + (ld->opaque_next++ & 0x3FFFFFFFu));
        const int64_t v[MQ_DL_PUSH_VALUES] = {prev, prev_term, ld->commit, p->next, (int64_t)(hi - (uint64_t)p->next + 1),
                                              (int64_t)pos, (int64_t)nbytes, opaque};
        uint8_t head[MQ_DL_LEAD_HEAD_MAX], *q = head + 8;
        char num[20];
        for (int k = 0; k < MQ_DL_PUSH_VALUES; k++) {
            q = dl_put(q, p->req[k], p->req_len[k]);
            q = dl_put(q, (const uint8_t *)num, (uint32_t)mq_fmt_i64(num, v[k]));
        }
        q = dl_put(q, p->req[MQ_DL_PUSH_VALUES], p->req_len[MQ_DL_PUSH_VALUES]);
        assert(q <= head + sizeof head);                    /* the role checks the template's length */
        const uint32_t head_len = (uint32_t)(q - head), hlen = head_len - 8;
        be32w(head, 4 + hlen + (uint32_t)nbytes);
        be32w(head + 4, hlen);                              /* JSON: serialize type 0 in the top byte */
        /* the core's bookkeeping first: the push is sent as far as it is concerned, as a push its
         * driver queued is (a failed send closes the connection, and the core probes again) */
        p->sent_commit = ld->commit;
        if (p->n_inflight == 0) p->inflight_since = ld->ticks;
        p->inflight[p->n_inflight++] = (int64_t)hi;
        p->next = (int64_t)hi + 1;
        p->pushes++;
        uint64_t done = 0;
        rc = mq_dledger_send(cl, p->fd, head, head_len, pos, (uint32_t)nbytes, &done);
        if (rc == MQ_E_AGAIN) {
            memcpy(p->blk_head, head, head_len);
            p->blk_head_len = head_len;
            p->blk_pos = pos;
            p->blk_nbytes = (uint32_t)nbytes;
            p->blk_done = done;
            p->blocked = 1;
            p->fd = -1;
            continue;                                       /* (the next turn hands the rest to the core) */
        }
        if (rc) return rc;
    }
    return MQ_OK;
}

int mq_dledger_lead_progress(mq_commitlog *cl, mq_dl_lead *ld) {
    assert(cl->dledger && ld && ld->n_peers <= MQ_DL_LEAD_PEERS_MAX && ld->max_inflight <= MQ_DL_INFLIGHT_MAX);
    if (!ld->on) return MQ_OK;
    int rc = dl_lead_commit(cl, ld);
    if (rc) return rc;
    for (int i = 0; i < ld->n_peers; i++) {
        mq_dl_peer *p = &ld->peer[i];
        if (!p->replicate) {
            p->want = !p->probe_sent;                       /* a probe: the core's */
            continue;
        }
        const int rc_p = dl_lead_fill(cl, ld, p, 1);          /* one push each, as log_progress */
        if (rc_p && !rc) rc = rc_p;
    }
    return rc;
}

/* A SUCCESS answer to one of our pushes, exactly the template's: its index. */
static int dl_answer_match(const mq_dl_lead *ld, const uint8_t *h, const uint8_t *end, int64_t *index) {
    int64_t opaque;
    for (int i = 0; i < 3; i++) {
        const uint32_t n = ld->resp_len[i];
        if ((size_t)(end - h) < n || memcmp(h, ld->resp[i], n) != 0) return 0;
        h += n;
        if (i == 0 && !dl_dec(&h, end, -1, INT64_MAX - 1, index)) return 0;
        if (i == 1 && !dl_dec(&h, end, MQ_DL_LEAD_OPAQUE_BASE, INT32_MAX, &opaque)) return 0;
    }
    return h == end;
}

int mq_dledger_lead_take(mq_commitlog *cl, mq_dl_lead *ld, int32_t i, const uint8_t *buf, size_t len,
                         mq_dl_taken *r) {
    assert(cl->dledger && ld && i >= 0 && i < ld->n_peers && (buf || len == 0) && r);
    assert(ld->max_inflight <= MQ_DL_INFLIGHT_MAX);
    memset(r, 0, sizeof *r);
    mq_dl_peer *p = &ld->peer[i];
    size_t at = 0;
    while (len - at >= 8) {
        if (!ld->on || !p->replicate) {
            r->stop = MQ_DL_STOP_OTHER;
            break;
        }
        const uint8_t *f = buf + at;
        const uint32_t total = be32r(f), word = be32r(f + 4), hlen = word & 0xFFFFFFu;
        if (total < 4 || total > MQ_DL_LEAD_HEAD_MAX || (word >> 24) != 0 || hlen != total - 4) {
            r->stop = MQ_DL_STOP_OTHER;                     /* (an answer to a push has no body) */
            break;
        }
        if (len - at - 4 < total) break;
        int64_t index;
        if (!dl_answer_match(ld, f + 8, f + 4 + total, &index)) {
            r->stop = MQ_DL_STOP_OTHER;
            break;
        }
        at += 4 + (size_t)total;
        r->frames++;
        /* RaftNode._on_append_resp, success, in REPLICATE, no transfer in progress */
        p->recent_active = 1;
        if (index > p->match) p->match = index;
        if (p->next <= p->match) p->next = p->match + 1;
        if (p->n_inflight && p->inflight[0] <= index) {
            int32_t k = 0;
            for (int32_t j = 0; j < p->n_inflight; j++)
                if (p->inflight[j] > index) p->inflight[k++] = p->inflight[j];
            p->n_inflight = k;
            p->inflight_since = ld->ticks;
        }
        int rc = dl_lead_commit(cl, ld);
        if (!rc) rc = dl_lead_fill(cl, ld, p, INT32_MAX);
        if (rc) {
            r->stop = rc;
            break;
        }
    }
    r->consumed = at;
    return MQ_OK;
}

/* One receive, then lead_take (dledger.h). */
int mq_dledger_lead_read(mq_commitlog *cl, mq_dl_lead *ld, int32_t i, int fd, uint8_t *buf, size_t cap,
                         mq_dl_read *r) {
    assert(cl->dledger && ld && buf && r && r->have <= cap);
    size_t have = (size_t)r->have;
    r->got = r->sent = 0;
    r->eof = r->err = 0;
    memset(&r->taken, 0, sizeof r->taken);
    if (!dl_recv(fd, buf, &have, cap, r)) return MQ_OK;
    mq_dledger_lead_take(cl, ld, i, buf, have, &r->taken);
    const size_t used = (size_t)r->taken.consumed;
    if (used) memmove(buf, buf + used, have - used);
    r->have = have - used;
    return MQ_OK;
}
