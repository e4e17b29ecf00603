/*
 * dispatch.c -- ConsumeQueue entries from scanned records.  Contract and entry layout in
 * dispatch.h.
 */
#include "internal.h"

static inline int entry_is_filler(const uint8_t *e) {
    return be64r(e) == 0 && (be32r(e + 8) == 0 || be32r(e + 8) == MQ_CQ_FILLER_SIZE);
}

/* A record whose QUEUEOFFSET q is not its queue's next entry (cur = CQ_MAX): true when it may
 * be written at q -- below cur, over its own entry (a repeated dispatch) or a hole (zero or a
 * filler); above cur, when the gap's records fit in the CommitLog before it (then the gap's
 * entries in this file become fillers).  False: its queue fields were damaged. */
static int entry_fits(const mq_cq_map *m, const uint8_t *e, int64_t q, int64_t cur, const mq_scan_rec *r) {
    if (q < cur)
        return entry_is_filler(e) || ((int64_t)be64r(e) == (int64_t)r->phy_offset && be32r(e + 8) == r->size);
    /* the entries below q end where the queue's last one does (when this file holds it and it
     * is a record), else at 0: q - cur records of at least MQ_RECORD_SIZE_MIN bytes lie between */
    uint64_t from = 0;
    if (cur > m->first_qoff) {
        const uint8_t *last = e - (uint64_t)(q - cur + 1) * MQ_CQ_ENTRY_SIZE;
        if (!entry_is_filler(last)) from = be64r(last) + be32r(last + 8);
    }
    if (r->phy_offset < from || (uint64_t)(q - cur) > (r->phy_offset - from) / MQ_RECORD_SIZE_MIN) return 0;
    for (int64_t k = cur > m->first_qoff ? cur : m->first_qoff; k < q; k++) {
        uint8_t *f = m->base + (uint64_t)(k - m->first_qoff) * MQ_CQ_ENTRY_SIZE;
        be64w(f, 0);
        be32w(f + 8, MQ_CQ_FILLER_SIZE);
        be64w(f + 12, 0);
    }
    return 1;
}

int mq_dispatch_batch(void *mem, const mq_scan_rec *recs, uint32_t n, mq_cq_map *maps,
                      uint32_t *done_out, uint32_t *need_slot_out, int64_t *need_qoff_out) {
    mq_ctl *c = ctl_of(mem);
    assert((recs || n == 0) && maps && done_out && need_slot_out && need_qoff_out);
    for (uint32_t i = 0; i < n; i++) {
        const mq_scan_rec *r = &recs[i];
        if (tx_no_queue(r->sys_flag)) continue;
        assert(r->slot < MQ_QUEUE_SLOTS);            /* scanned with resolve_slots == 2 */
        mq_cq_map *m = &maps[r->slot];
        int64_t q = r->queue_offset;
        if (!m->base || q < m->first_qoff || q >= m->first_qoff + m->entries) {
            *done_out = i;
            *need_slot_out = r->slot;
            *need_qoff_out = q;
            return MQ_E_RANGE;
        }
        uint8_t *e = m->base + (uint64_t)(q - m->first_qoff) * MQ_CQ_ENTRY_SIZE;
        int64_t *mx = &c->slots[r->slot].field[MQ_Q_CQ_MAX];
        int64_t cur = __atomic_load_n(mx, __ATOMIC_ACQUIRE);
        if (q != cur && !entry_fits(m, e, q, cur, r)) {
            *done_out = i;
            *need_slot_out = r->slot;
            *need_qoff_out = q;
            return MQ_E_CORRUPT;
        }
        int64_t tags = m->delay_ms >= 0 ? r->store_ts_ms + m->delay_ms : r->tags_code;
        be64w(e, r->phy_offset);
        be32w(e + 8, r->size);
        be64w(e + 12, (uint64_t)tags);
        while (cur < q + 1 && !__atomic_compare_exchange_n(mx, &cur, q + 1, 1, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        }
    }
    *done_out = n;
    return MQ_OK;
}

int mq_dispatch_for(mq_commitlog *cl, mq_dispatch_run *d, uint32_t wait_ms) {
    assert(d && d->recs && d->maps && d->cap > 0);
    mq_ctl *c = cl->ctl;
    const int64_t deadline = mono_ms() + wait_ms;
    d->why = MQ_DISPATCH_WAITED;
    int busy = 0;                                               /* this look follows one that dispatched */
    for (;;) {
        uint32_t seen = mq_ctl_seq(c, d->end_seq);              /* before the look: a move after it wakes */
        uint64_t start = ctl_load(c, MQ_POS_DISPATCHED), end = ctl_load(c, d->end_pos);
        if (d->rebase && start < ctl_load(c, MQ_POS_MIN)) { d->why = MQ_DISPATCH_CALLER; return MQ_OK; }
        if (start < end) {
            if (d->index && d->index_from > start) d->index_from = start;
            uint32_t n = 0, done = 0, slot = 0;
            uint64_t next = start;
            int64_t qoff = 0;
            int stop = MQ_SCAN_LIMIT;
            int rc = mq_commitlog_scan(cl, start, end, 0, 2, d->recs, d->cap, &n, &next, &stop);
            if (rc) return rc;
            if (stop != MQ_SCAN_LIMIT && stop != MQ_SCAN_FULL && stop != MQ_SCAN_END) {
                d->why = MQ_DISPATCH_CALLER;
                return MQ_OK;
            }
            if (n) {
                rc = mq_dispatch_batch(c, d->recs, n, d->maps, &done, &slot, &qoff);
                if (rc == MQ_E_RANGE || rc == MQ_E_CORRUPT) { d->why = MQ_DISPATCH_CALLER; return MQ_OK; }
                if (rc) return rc;
                if (d->index) {
                    rc = mq_index_build(cl, d->index, d->recs, n, d->index_from, &done);
                    uint32_t upto = rc == MQ_OK ? n : done;
                    if (upto && d->index_from < d->recs[upto - 1].phy_offset + 1)
                        d->index_from = d->recs[upto - 1].phy_offset + 1;
                    if (rc == MQ_E_FULL) {
                        /* recs[0..done) are in their queues and the index: DISPATCHED moves to
                         * recs[done], so the caller's walk (which first lowers the index's resume
                         * point to DISPATCHED) neither indexes them twice nor skips one */
                        if (done) {
                            const mq_scan_rec *r = &d->recs[done];
                            d->last_store_ts_ms = d->recs[done - 1].store_ts_ms;
                            d->records += done;
                            mq_ctl_advance(c, MQ_POS_DISPATCHED, d->end_pos == MQ_POS_COMMITTED ? r->dl_pos : r->phy_offset);
                            mq_ctl_wake(c, MQ_SEQ_DISPATCH);
                        }
                        d->why = MQ_DISPATCH_CALLER;
                        return MQ_OK;
                    }
                    if (rc) return rc;
                }
                d->last_store_ts_ms = d->recs[n - 1].store_ts_ms;
                d->records += n;
                busy = d->end_seq == MQ_SEQ_WRITE;
            }
            if (next != start) {
                mq_ctl_advance(c, MQ_POS_DISPATCHED, next);
                if (n) mq_ctl_wake(c, MQ_SEQ_DISPATCH);
                if (mono_ms() >= deadline) return MQ_OK;
                continue;
            }
        }
        int64_t now = mono_ms();
        if (now >= deadline) return MQ_OK;
        if (busy) {
            /* records keep coming: nap, unannounced, and look again.  A role that is no futex
             * waiter costs an append no wake (mq_ctl_wake skips the syscall), and this role
             * takes what came meanwhile in one pass, not one wake a record.  The first look
             * after a nap that finds nothing sleeps on the futex: an idle role still wakes at
             * the first append.  Not in DLedger mode (end_seq COMMIT): commits move a
             * replication round at a time, not a record, and there the nap's timer cost more
             * than the wakes it saved (three dispatch roles, +0.1-0.3 us a message each). */
            busy = 0;
            const struct timespec nap = {0, MQ_DISPATCH_NAP_US * 1000L};
            (void)nanosleep(&nap, NULL);
            continue;
        }
        (void)mq_ctl_wait(c, d->end_seq, seen, deadline - now > 1 ? (int)(deadline - now) : 1);
    }
}
