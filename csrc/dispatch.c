/*
 * dispatch.c -- ConsumeQueue entries from scanned records.  Contract and entry layout in
 * dispatch.h.
 */
#include "internal.h"

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
        int64_t tags = m->delay_ms >= 0 ? r->store_ts_ms + m->delay_ms : r->tags_code;
        be64w(e, r->phy_offset);
        be32w(e + 8, r->size);
        be64w(e + 12, (uint64_t)tags);
        int64_t *mx = &c->slots[r->slot].field[MQ_Q_CQ_MAX];
        int64_t cur = __atomic_load_n(mx, __ATOMIC_ACQUIRE);
        while (cur < q + 1 && !__atomic_compare_exchange_n(mx, &cur, q + 1, 1, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        }
    }
    *done_out = n;
    return MQ_OK;
}
