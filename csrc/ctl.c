/*
 * ctl.c -- the control block, the topic-queue table, waits and wakes.  Contract in ctl.h; the
 * layout (struct mq_ctl) in internal.h.
 */
#include "internal.h"

#include <linux/futex.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <unistd.h>

size_t mq_ctl_size(void) { return sizeof(struct mq_ctl); }

int mq_ctl_init(void *mem, size_t len, uint64_t file_size) {
    assert(mem);
    if (len < sizeof(struct mq_ctl) || file_size < 4096 || file_size > (1ull << 40)) return MQ_E_INVAL;
    mq_ctl *c = (mq_ctl *)mem;
    memset(c, 0, sizeof(*c));
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    int rc = pthread_mutex_init(&c->lock, &a);
    pthread_mutexattr_destroy(&a);
    if (rc) { errno = rc; return MQ_E_IO; }
    c->file_size = file_size;
    c->ctl_size = sizeof(*c);
    c->version = MQ_CTL_VERSION;
    __atomic_store_n(&c->magic, MQ_CTL_MAGIC, __ATOMIC_RELEASE);
    return MQ_OK;
}

int mq_ctl_check(void *mem, size_t len) {
    mq_ctl *c = (mq_ctl *)mem;
    assert(mem);
    if (len < sizeof(struct mq_ctl)) return MQ_E_BAD_CTL;
    if (__atomic_load_n(&c->magic, __ATOMIC_ACQUIRE) != MQ_CTL_MAGIC || c->version != MQ_CTL_VERSION ||
        c->ctl_size != sizeof(*c))
        return MQ_E_BAD_CTL;
    return MQ_OK;
}

/* Lock should be held. */
void ctl_repair_locked(mq_ctl *c) {
    c->stat_owner_dead++;
    if (__atomic_load_n(&c->j_valid, __ATOMIC_ACQUIRE)) {
        assert(c->j_slot < MQ_QUEUE_SLOTS);
        c->slots[c->j_slot].field[MQ_Q_NEXT_OFFSET] = c->j_next_qoff;
        c->pos[MQ_POS_LAST_STORE_TS] = (uint64_t)c->j_store_ts;
        if (c->j_dl) {
            c->pos[MQ_POS_DL_END_TERM] = (uint64_t)c->j_end_term;
            __atomic_store_n(&c->pos[MQ_POS_DL_NEXT_INDEX], c->j_next_index, __ATOMIC_RELEASE);
        }
        __atomic_store_n(&c->pos[MQ_POS_WRITE], c->j_write_pos, __ATOMIC_RELEASE);
        __atomic_store_n(&c->j_valid, 0, __ATOMIC_RELEASE);
        c->stat_replays++;
    }
}

/* ---- positions ------------------------------------------------------------------------------ */
uint64_t mq_ctl_get(void *mem, int pos) {
    mq_ctl *c = ctl_of(mem);
    assert(pos >= 0 && pos < MQ_POS_COUNT_);
    return ctl_load(c, pos);
}

int mq_ctl_set(void *mem, int pos, uint64_t value) {
    mq_ctl *c = ctl_of(mem);
    assert(pos >= 0 && pos < MQ_POS_COUNT_);
    int rc = ctl_lock(c);
    if (rc) return rc;
    __atomic_store_n(&c->pos[pos], value, __ATOMIC_RELEASE);
    ctl_unlock(c);
    return MQ_OK;
}

int mq_ctl_advance(void *mem, int pos, uint64_t value) {
    mq_ctl *c = ctl_of(mem);
    assert(pos >= 0 && pos < MQ_POS_COUNT_);
    uint64_t cur = __atomic_load_n(&c->pos[pos], __ATOMIC_ACQUIRE);
    while (cur < value &&
           !__atomic_compare_exchange_n(&c->pos[pos], &cur, value, 1, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
    }
    return MQ_OK;
}

/* ---- waits and wakes -------------------------------------------------------------------------- */
uint32_t mq_ctl_seq(void *mem, int seq) {
    mq_ctl *c = ctl_of(mem);
    assert(seq >= 0 && seq < MQ_SEQ_COUNT_);
    return __atomic_load_n(&c->seq[seq], __ATOMIC_SEQ_CST);
}

/* The waiter count lets wakers skip the syscall when nobody sleeps; both sides use seq_cst so a
 * wake between the check and the sleep is never lost (the futex re-checks the word). */
int mq_ctl_wait(void *mem, int seq, uint32_t seen, int timeout_ms) {
    mq_ctl *c = ctl_of(mem);
    assert(seq >= 0 && seq < MQ_SEQ_COUNT_);
    __atomic_add_fetch(&c->waiters[seq], 1, __ATOMIC_SEQ_CST);
    int rc = MQ_OK;
    if (__atomic_load_n(&c->seq[seq], __ATOMIC_SEQ_CST) == seen) {
        struct timespec ts, *tsp = NULL;
        if (timeout_ms >= 0) {
            ts.tv_sec = timeout_ms / 1000;
            ts.tv_nsec = (long)(timeout_ms % 1000) * 1000000L;
            tsp = &ts;
        }
        long r = syscall(SYS_futex, &c->seq[seq], FUTEX_WAIT, seen, tsp, NULL, 0);
        if (r == -1 && errno == ETIMEDOUT) rc = MQ_E_TIMEOUT;
    }
    __atomic_sub_fetch(&c->waiters[seq], 1, __ATOMIC_SEQ_CST);
    return rc;
}

/* This process's bells (ctl.h): set by mq_bells_adopt, inherited by fork.  g_bells_n is read
 * with acquire before the table, and set to 0 first when the table changes. */
static int g_bell_fd[MQ_BELLS_MAX];
static int g_bells_n;

_Static_assert(MQ_BELL_WORDS * 64 >= MQ_BELLS_MAX, "a bit per bell");

static void ring_bells(mq_ctl *c, int seq, int n) {
    const uint64_t one = 1;
    for (int w = 0; w < MQ_BELL_WORDS; w++) {
        uint64_t m = __atomic_load_n(&c->bell_wants[seq][w], __ATOMIC_SEQ_CST);
        while (m) {
            int b = w * 64 + __builtin_ctzll(m);
            m &= m - 1;
            if (b < n && g_bell_fd[b] >= 0) {
                /* fails only when the counter would overflow (never read for 2^64 rings); the
                 * owner's loop re-checks on a slow timer anyway (mq.store.bells) */
                ssize_t r = write(g_bell_fd[b], &one, sizeof(one));
                (void)r;
            }
        }
    }
}

void mq_ctl_wake(void *mem, int seq) {
    mq_ctl *c = ctl_of(mem);
    assert(seq >= 0 && seq < MQ_SEQ_COUNT_);
    __atomic_add_fetch(&c->seq[seq], 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&c->waiters[seq], __ATOMIC_SEQ_CST) > 0)
        syscall(SYS_futex, &c->seq[seq], FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
    int n = __atomic_load_n(&g_bells_n, __ATOMIC_ACQUIRE);
    if (n) ring_bells(c, seq, n);
}

int mq_bells_adopt(const int *fds, int n) {
    if (n < 0 || n > MQ_BELLS_MAX || (n && !fds)) return MQ_E_INVAL;
    __atomic_store_n(&g_bells_n, 0, __ATOMIC_SEQ_CST);
    for (int b = 0; b < MQ_BELLS_MAX; b++) g_bell_fd[b] = b < n ? fds[b] : -1;
    __atomic_store_n(&g_bells_n, n, __ATOMIC_RELEASE);
    return MQ_OK;
}

int mq_bell_fd(int bell) {
    assert(bell >= 0 && bell < MQ_BELLS_MAX);
    return bell < __atomic_load_n(&g_bells_n, __ATOMIC_ACQUIRE) ? g_bell_fd[bell] : -1;
}

void mq_bell_want(void *mem, int bell, int seq, int on) {
    mq_ctl *c = ctl_of(mem);
    assert(bell >= 0 && bell < MQ_BELLS_MAX && seq >= 0 && seq < MQ_SEQ_COUNT_);
    uint64_t *word = &c->bell_wants[seq][bell / 64];
    const uint64_t bit = 1ull << (bell % 64);
    if (on)
        __atomic_fetch_or(word, bit, __ATOMIC_SEQ_CST);
    else
        __atomic_fetch_and(word, ~bit, __ATOMIC_SEQ_CST);
    /* the caller checks its condition next: a full fence, so that check cannot be ordered
     * before the want is visible (the waker bumps seq, seq_cst, before it reads the wants) */
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
}

int mq_ctl_wait_pos(void *mem, int seq, int pos, uint64_t target, int timeout_ms) {
    mq_ctl *c = ctl_of(mem);
    assert(seq >= 0 && seq < MQ_SEQ_COUNT_ && pos >= 0 && pos < MQ_POS_COUNT_);
    int64_t deadline = mono_ms() + timeout_ms;
    for (;;) {
        uint32_t seen = __atomic_load_n(&c->seq[seq], __ATOMIC_SEQ_CST);
        if (ctl_load(c, pos) >= target) return MQ_OK;
        if (__atomic_load_n(&c->fatal_err, __ATOMIC_ACQUIRE)) return MQ_E_FATAL;
        int64_t left = deadline - mono_ms();
        if (left <= 0) return MQ_E_TIMEOUT;
        mq_ctl_wait(mem, seq, seen, left < 1000 ? (int)left : 1000);
    }
}

/* ---- the sticky error, counters ----------------------------------------------------------------- */
int mq_ctl_fatal(void *mem, char *msg_out, size_t msg_cap) {
    mq_ctl *c = ctl_of(mem);
    int err = __atomic_load_n(&c->fatal_err, __ATOMIC_ACQUIRE);
    if (err && msg_out && msg_cap) snprintf(msg_out, msg_cap, "%s", c->fatal_msg);
    return err;
}

int mq_ctl_set_fatal(void *mem, int err, const char *msg) {
    mq_ctl *c = ctl_of(mem);
    assert(err != 0);
    int expected = 0;
    /* the first error sticks; later ones are not recorded over it */
    if (__atomic_compare_exchange_n(&c->fatal_err, &expected, -1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        snprintf(c->fatal_msg, sizeof c->fatal_msg, "%s", msg ? msg : "");
        __atomic_store_n(&c->fatal_err, err, __ATOMIC_RELEASE);
    }
    for (int s = 0; s < MQ_SEQ_COUNT_; s++) mq_ctl_wake(mem, s);
    return MQ_OK;
}

uint64_t mq_ctl_stat(void *mem, int which) {
    mq_ctl *c = ctl_of(mem);
    assert(which >= 0 && which < MQ_STAT_COUNT_);
    return which == MQ_STAT_OWNER_DEAD ? c->stat_owner_dead : c->stat_replays;
}

/* ---- topic-queue table (open addressing; slots are never removed) -------------------------------- */
static uint64_t slot_hash(const char *t, uint32_t n, int32_t qid) {
    uint64_t h = 1469598103934665603ull;
    for (uint32_t i = 0; i < n; i++) { h ^= (uint8_t)t[i]; h *= 1099511628211ull; }
    h ^= (uint32_t)qid; h *= 1099511628211ull;
    return h;
}

static int slot_find(mq_ctl *c, const char *t, uint32_t n, int32_t qid, uint64_t h, uint32_t *slot, uint32_t *empty) {
    uint32_t mask = MQ_QUEUE_SLOTS - 1;
    for (uint32_t i = 0, k = (uint32_t)h & mask; i < MQ_QUEUE_SLOTS; i++, k = (k + 1) & mask) {
        mq_queue_slot *s = &c->slots[k];
        if (__atomic_load_n(&s->state, __ATOMIC_ACQUIRE) != 2) { *empty = k; return 0; }
        if (s->hash == h && s->queue_id == qid && s->topic_len == n && memcmp(s->topic, t, n) == 0) {
            *slot = k;
            return 1;
        }
    }
    *empty = UINT32_MAX;
    return 0;
}

int mq_queue_lookup(void *mem, const char *topic, uint32_t topic_len, int32_t queue_id, int create, uint32_t *slot_out) {
    mq_ctl *c = ctl_of(mem);
    assert(topic && slot_out);
    if (topic_len == 0 || topic_len > MQ_TOPIC_LEN_MAX) return MQ_E_TOPIC_ILLEGAL;
    uint64_t h = slot_hash(topic, topic_len, queue_id);
    uint32_t empty;
    if (slot_find(c, topic, topic_len, queue_id, h, slot_out, &empty)) return MQ_OK;
    if (!create) return MQ_E_RANGE;
    int rc = ctl_lock(c);
    if (rc) return rc;
    if (slot_find(c, topic, topic_len, queue_id, h, slot_out, &empty)) { ctl_unlock(c); return MQ_OK; }
    if (empty == UINT32_MAX || c->queue_count >= MQ_SLOTS_USABLE) { ctl_unlock(c); return MQ_E_TABLE_FULL; }
    mq_queue_slot *s = &c->slots[empty];
    memset(s->field, 0, sizeof s->field);
    s->queue_id = queue_id;
    s->hash = h;
    s->topic_len = (uint8_t)topic_len;
    memcpy(s->topic, topic, topic_len);
    __atomic_store_n(&s->state, 2, __ATOMIC_RELEASE);
    c->queue_count++;
    ctl_unlock(c);
    *slot_out = empty;
    return MQ_OK;
}

int64_t mq_queue_get(void *mem, uint32_t slot, int field) {
    mq_ctl *c = ctl_of(mem);
    assert(slot < MQ_QUEUE_SLOTS && field >= 0 && field < MQ_Q_COUNT_);
    return __atomic_load_n(&c->slots[slot].field[field], __ATOMIC_ACQUIRE);
}

int mq_queue_set(void *mem, uint32_t slot, int field, int64_t value) {
    mq_ctl *c = ctl_of(mem);
    assert(slot < MQ_QUEUE_SLOTS && field >= 0 && field < MQ_Q_COUNT_);
    int rc = ctl_lock(c);
    if (rc) return rc;
    __atomic_store_n(&c->slots[slot].field[field], value, __ATOMIC_RELEASE);
    ctl_unlock(c);
    return MQ_OK;
}

int mq_queue_advance(void *mem, uint32_t slot, int field, int64_t value) {
    mq_ctl *c = ctl_of(mem);
    assert(slot < MQ_QUEUE_SLOTS && field >= 0 && field < MQ_Q_COUNT_);
    int64_t *p = &c->slots[slot].field[field];
    int64_t cur = __atomic_load_n(p, __ATOMIC_ACQUIRE);
    while (cur < value && !__atomic_compare_exchange_n(p, &cur, value, 1, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
    }
    return MQ_OK;
}

uint32_t mq_queue_count(void *mem) { return ctl_of(mem)->queue_count; }

int mq_queue_info(void *mem, uint32_t slot, char *topic_out, uint32_t *topic_len, int32_t *queue_id) {
    mq_ctl *c = ctl_of(mem);
    assert(slot < MQ_QUEUE_SLOTS && topic_out && topic_len && queue_id);
    mq_queue_slot *s = &c->slots[slot];
    if (__atomic_load_n(&s->state, __ATOMIC_ACQUIRE) != 2) return MQ_E_RANGE;
    memcpy(topic_out, s->topic, s->topic_len);
    *topic_len = s->topic_len;
    *queue_id = s->queue_id;
    return MQ_OK;
}

int mq_queue_reset_next_offsets(void *mem) {
    mq_ctl *c = ctl_of(mem);
    int rc = ctl_lock(c);
    if (rc) return rc;
    for (uint32_t k = 0; k < MQ_QUEUE_SLOTS; k++) {
        mq_queue_slot *s = &c->slots[k];
        if (__atomic_load_n(&s->state, __ATOMIC_ACQUIRE) != 2) continue;
        __atomic_store_n(&s->field[MQ_Q_NEXT_OFFSET], __atomic_load_n(&s->field[MQ_Q_CQ_MAX], __ATOMIC_ACQUIRE),
                         __ATOMIC_RELEASE);
    }
    ctl_unlock(c);
    return MQ_OK;
}
