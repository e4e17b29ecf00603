/*
 * testhooks.c -- fault injection for tests; not API (testhooks.h says why it is in the build).
 */
#include "internal.h"
#include "testhooks.h"

int mq_ctl_debug_lock_and_hold(void *mem, uint32_t slot, uint64_t journal_bytes) {
    mq_ctl *c = ctl_of(mem);
    assert(slot < MQ_QUEUE_SLOTS);
    int rc = ctl_lock(c);
    if (rc) return rc;
    if (journal_bytes) {
        c->j_slot = slot;
        c->j_next_qoff = c->slots[slot].field[MQ_Q_NEXT_OFFSET] + 1;
        c->j_write_pos = c->pos[MQ_POS_WRITE] + journal_bytes;
        c->j_store_ts = (int64_t)c->pos[MQ_POS_LAST_STORE_TS];
        __atomic_store_n(&c->j_valid, 1, __ATOMIC_RELEASE);
    }
    return MQ_OK;   /* returns holding the lock: the caller is about to be killed */
}
