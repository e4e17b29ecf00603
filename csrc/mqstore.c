/*
 * mqstore.c -- see mqstore.h for the record layout, the control block
 * invariants and the error codes.  Lock order: ctl->lock, then cl->seg_lock.
 * Asserts stay on in shipped builds (setup.py undefines NDEBUG): they check
 * programmer errors only; disk and input faults are returned as MQ_E_*.
 */
#define _GNU_SOURCE
#include "mqstore.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#define MQ_CTL_MAGIC   0x4D51434Cu   /* "MQCL" */
#define MQ_CTL_VERSION 4u   /* 2: MQ_POS_MSGS; 3: DLedger positions, SEQ_COMMIT/ROLE, journal index;
                               4: MQ_POS_DISK_FULL */
#define MQ_PAGE        4096u
#define MQ_SLOTS_USABLE (MQ_QUEUE_SLOTS / 4 * 3)   /* keep linear probes short */

/* ---- big-endian helpers --------------------------------------------------- */
static inline void be16w(uint8_t *p, uint16_t v) { p[0] = v >> 8; p[1] = (uint8_t)v; }
static inline void be32w(uint8_t *p, uint32_t v) { v = __builtin_bswap32(v); memcpy(p, &v, 4); }
static inline void be64w(uint8_t *p, uint64_t v) { v = __builtin_bswap64(v); memcpy(p, &v, 8); }
static inline uint16_t be16r(const uint8_t *p) { return (uint16_t)((p[0] << 8) | p[1]); }
static inline uint32_t be32r(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return __builtin_bswap32(v); }
static inline uint64_t be64r(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return __builtin_bswap64(v); }

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ========================================================================== */
/* CRC32 (IEEE, reflected, the one zlib computes)                               */
/* ========================================================================== */
static uint32_t crc_table[8][256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;
static int crc_use_clmul;

static void crc_init(void) {
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; n++)
        for (int t = 1; t < 8; t++)
            crc_table[t][n] = (crc_table[t - 1][n] >> 8) ^ crc_table[0][crc_table[t - 1][n] & 0xFF];
#if defined(__x86_64__)
    __builtin_cpu_init();
    crc_use_clmul = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
#endif
}

/* slice-by-8 on the inverted register */
static uint32_t crc_slice8(uint32_t c, const uint8_t *p, size_t n) {
    while (n && ((uintptr_t)p & 7)) { c = crc_table[0][(c ^ *p++) & 0xFF] ^ (c >> 8); n--; }
    while (n >= 8) {
        uint32_t lo, hi;
        memcpy(&lo, p, 4); memcpy(&hi, p + 4, 4);   /* little-endian host assumed below */
        lo ^= c;
        c = crc_table[7][lo & 0xFF] ^ crc_table[6][(lo >> 8) & 0xFF] ^
            crc_table[5][(lo >> 16) & 0xFF] ^ crc_table[4][lo >> 24] ^
            crc_table[3][hi & 0xFF] ^ crc_table[2][(hi >> 8) & 0xFF] ^
            crc_table[1][(hi >> 16) & 0xFF] ^ crc_table[0][hi >> 24];
        p += 8; n -= 8;
    }
    while (n--) c = crc_table[0][(c ^ *p++) & 0xFF] ^ (c >> 8);
    return c;
}

#if defined(__x86_64__)
/* Carry-less multiply folding (Gopal et al., "Fast CRC Computation for Generic
 * Polynomials Using PCLMULQDQ", constants for the bit-reflected IEEE polynomial).
 * Takes and returns the inverted register; needs len >= 64 and a multiple of 16. */
__attribute__((target("pclmul,sse4.1")))
static uint32_t crc_clmul(uint32_t crc, const uint8_t *buf, size_t len) {
    static const uint64_t k1k2[2] __attribute__((aligned(16))) = {0x0154442bd4ull, 0x01c6e41596ull};
    static const uint64_t k3k4[2] __attribute__((aligned(16))) = {0x01751997d0ull, 0x00ccaa009eull};
    static const uint64_t k5k0[2] __attribute__((aligned(16))) = {0x0163cd6124ull, 0};
    static const uint64_t poly[2] __attribute__((aligned(16))) = {0x01db710641ull, 0x01f7011641ull};
    __m128i x0, x1, x2, x3, x4, x5, x6, x7, x8, y5, y6, y7, y8;

    x1 = _mm_loadu_si128((const __m128i *)(buf + 0x00));
    x2 = _mm_loadu_si128((const __m128i *)(buf + 0x10));
    x3 = _mm_loadu_si128((const __m128i *)(buf + 0x20));
    x4 = _mm_loadu_si128((const __m128i *)(buf + 0x30));
    x1 = _mm_xor_si128(x1, _mm_cvtsi32_si128((int)crc));
    x0 = _mm_load_si128((const __m128i *)k1k2);
    buf += 64; len -= 64;
    while (len >= 64) {
        x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
        x6 = _mm_clmulepi64_si128(x2, x0, 0x00);
        x7 = _mm_clmulepi64_si128(x3, x0, 0x00);
        x8 = _mm_clmulepi64_si128(x4, x0, 0x00);
        x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
        x2 = _mm_clmulepi64_si128(x2, x0, 0x11);
        x3 = _mm_clmulepi64_si128(x3, x0, 0x11);
        x4 = _mm_clmulepi64_si128(x4, x0, 0x11);
        y5 = _mm_loadu_si128((const __m128i *)(buf + 0x00));
        y6 = _mm_loadu_si128((const __m128i *)(buf + 0x10));
        y7 = _mm_loadu_si128((const __m128i *)(buf + 0x20));
        y8 = _mm_loadu_si128((const __m128i *)(buf + 0x30));
        x1 = _mm_xor_si128(_mm_xor_si128(x1, x5), y5);
        x2 = _mm_xor_si128(_mm_xor_si128(x2, x6), y6);
        x3 = _mm_xor_si128(_mm_xor_si128(x3, x7), y7);
        x4 = _mm_xor_si128(_mm_xor_si128(x4, x8), y8);
        buf += 64; len -= 64;
    }
    x0 = _mm_load_si128((const __m128i *)k3k4);
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x2), x5);
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x3), x5);
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x4), x5);
    while (len >= 16) {
        x2 = _mm_loadu_si128((const __m128i *)buf);
        x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
        x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
        x1 = _mm_xor_si128(_mm_xor_si128(x1, x2), x5);
        buf += 16; len -= 16;
    }
    x2 = _mm_clmulepi64_si128(x1, x0, 0x10);
    x3 = _mm_setr_epi32(~0, 0, ~0, 0);
    x1 = _mm_srli_si128(x1, 8);
    x1 = _mm_xor_si128(x1, x2);
    x0 = _mm_loadl_epi64((const __m128i *)k5k0);
    x2 = _mm_srli_si128(x1, 4);
    x1 = _mm_and_si128(x1, x3);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    x0 = _mm_load_si128((const __m128i *)poly);
    x2 = _mm_and_si128(x1, x3);
    x2 = _mm_clmulepi64_si128(x2, x0, 0x10);
    x2 = _mm_and_si128(x2, x3);
    x2 = _mm_clmulepi64_si128(x2, x0, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    return (uint32_t)_mm_extract_epi32(x1, 1);
}
#endif

uint32_t mq_crc32(uint32_t crc, const uint8_t *buf, size_t len) {
    pthread_once(&crc_once, crc_init);
    uint32_t c = ~crc;
#if defined(__x86_64__)
    if (crc_use_clmul && len >= 64) {
        size_t chunk = len & ~(size_t)15;
        c = crc_clmul(c, buf, chunk);
        buf += chunk; len -= chunk;
    }
#endif
    c = crc_slice8(c, buf, len);
    return ~c;
}

/* ========================================================================== */
/* Java String.hashCode, tags code, msgId                                      */
/* ========================================================================== */
/* Decodes UTF-8 as Java's decoder would for valid input (code points above
 * U+FFFF count as two UTF-16 units); each invalid byte counts as U+FFFD. */
int32_t mq_java_hash(const uint8_t *s, size_t n) {
    uint32_t h = 0;
    size_t i = 0;
    while (i < n) {
        uint32_t cp = 0xFFFD;
        uint8_t b = s[i];
        size_t need = 0;
        if (b < 0x80) { cp = b; need = 0; }
        else if ((b & 0xE0) == 0xC0 && b >= 0xC2) { cp = b & 0x1F; need = 1; }
        else if ((b & 0xF0) == 0xE0) { cp = b & 0x0F; need = 2; }
        else if ((b & 0xF8) == 0xF0 && b <= 0xF4) { cp = b & 0x07; need = 3; }
        else { need = (size_t)-1; }
        if (need == (size_t)-1 || i + need >= n) { h = 31 * h + 0xFFFD; i++; continue; }
        int ok = 1;
        for (size_t k = 1; k <= need; k++) {
            if ((s[i + k] & 0xC0) != 0x80) { ok = 0; break; }
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if (ok && ((need == 2 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
                   (need == 3 && (cp < 0x10000 || cp > 0x10FFFF))))
            ok = 0;
        if (!ok) { h = 31 * h + 0xFFFD; i++; continue; }
        i += need + 1;
        if (cp >= 0x10000) {
            cp -= 0x10000;
            h = 31 * h + (0xD800 + (cp >> 10));
            h = 31 * h + (0xDC00 + (cp & 0x3FF));
        } else {
            h = 31 * h + cp;
        }
    }
    return (int32_t)h;
}

/* Properties are "name\x01value\x02name\x01value"; returns the hash of TAGS. */
int64_t mq_tags_code(const uint8_t *p, size_t n) {
    size_t i = 0;
    while (i < n) {
        size_t end = i;
        while (end < n && p[end] != 0x02) end++;
        if (end - i > 5 && memcmp(p + i, "TAGS\x01", 5) == 0)
            return (int64_t)mq_java_hash(p + i + 5, end - i - 5);
        i = end + 1;
    }
    return 0;
}

void mq_msg_id(const uint8_t *host, uint32_t host_len, int32_t port, uint64_t offset, char *out) {
    static const char hex[] = "0123456789ABCDEF";
    uint8_t raw[28];
    assert(host_len == 4 || host_len == 16);
    memcpy(raw, host, host_len);
    be32w(raw + host_len, (uint32_t)port);
    be64w(raw + host_len + 4, offset);
    size_t n = host_len + 12;
    for (size_t i = 0; i < n; i++) { out[2 * i] = hex[raw[i] >> 4]; out[2 * i + 1] = hex[raw[i] & 15]; }
    out[2 * n] = 0;
}

/* ========================================================================== */
/* Control block                                                               */
/* ========================================================================== */
typedef struct mq_queue_slot {
    uint32_t state;                  /* 0 empty, 2 ready (published with release) */
    int32_t queue_id;
    uint64_t hash;
    int64_t field[MQ_Q_COUNT_];
    uint8_t topic_len;
    char topic[MQ_TOPIC_LEN_MAX];
} mq_queue_slot;

struct mq_ctl {
    uint32_t magic, version;
    uint64_t file_size;
    uint64_t ctl_size;
    pthread_mutex_t lock;            /* robust, process-shared: serialises appends */
    uint64_t pos[MQ_POS_COUNT_];
    /* redo journal of the append in progress; valid only while j_valid == 1 */
    uint32_t j_valid;
    uint32_t j_slot;
    int64_t j_next_qoff;
    uint64_t j_write_pos;
    int64_t j_store_ts;
    uint64_t trunc_epoch;            /* DLedger: bumped by every truncation (a flush in flight then
                                        does not publish: its bytes may be gone) */
    uint32_t j_dl;                   /* 1: a DLedger append: also j_next_index and j_end_term */
    uint64_t j_next_index;
    int64_t j_end_term;
    /* sticky error: once set, appends fail with MQ_E_FATAL */
    int32_t fatal_err;
    char fatal_msg[256];
    uint64_t stat_owner_dead, stat_replays;
    uint32_t queue_count;
    uint32_t seq[MQ_SEQ_COUNT_] __attribute__((aligned(64)));
    uint32_t waiters[MQ_SEQ_COUNT_];
    mq_queue_slot slots[MQ_QUEUE_SLOTS] __attribute__((aligned(64)));
};

size_t mq_ctl_size(void) { return sizeof(struct mq_ctl); }

static mq_ctl *ctl_of(void *mem) {
    mq_ctl *c = (mq_ctl *)mem;
    assert(c && c->magic == MQ_CTL_MAGIC);
    return c;
}

int mq_ctl_init(void *mem, size_t len, uint64_t file_size) {
    if (!mem || len < sizeof(struct mq_ctl) || file_size < 4096 || file_size > (1ull << 40)) return MQ_E_INVAL;
    mq_ctl *c = (mq_ctl *)mem;
    memset(c, 0, sizeof(*c));
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    int rc = pthread_mutex_init(&c->lock, &a);
    pthread_mutexattr_destroy(&a);
    if (rc) return MQ_E_IO;
    c->file_size = file_size;
    c->ctl_size = sizeof(*c);
    c->version = MQ_CTL_VERSION;
    __atomic_store_n(&c->magic, MQ_CTL_MAGIC, __ATOMIC_RELEASE);
    return MQ_OK;
}

int mq_ctl_check(void *mem, size_t len) {
    mq_ctl *c = (mq_ctl *)mem;
    if (!mem || len < sizeof(struct mq_ctl)) return MQ_E_BAD_CTL;
    if (__atomic_load_n(&c->magic, __ATOMIC_ACQUIRE) != MQ_CTL_MAGIC || c->version != MQ_CTL_VERSION ||
        c->ctl_size != sizeof(*c))
        return MQ_E_BAD_CTL;
    return MQ_OK;
}

/* Replays or drops the journal of an owner that died holding the lock.
 * Lock should be held. */
static void ctl_repair_locked(mq_ctl *c) {
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

static int ctl_lock(mq_ctl *c) {
    int rc = pthread_mutex_lock(&c->lock);
    if (rc == EOWNERDEAD) {
        ctl_repair_locked(c);
        pthread_mutex_consistent(&c->lock);
        return MQ_OK;
    }
    if (rc) { errno = rc; return MQ_E_IO; }
    return MQ_OK;
}
static void ctl_unlock(mq_ctl *c) { pthread_mutex_unlock(&c->lock); }

uint64_t mq_ctl_get(void *mem, int pos) {
    mq_ctl *c = ctl_of(mem);
    assert(pos >= 0 && pos < MQ_POS_COUNT_);
    return __atomic_load_n(&c->pos[pos], __ATOMIC_ACQUIRE);
}

int mq_ctl_set(void *mem, int pos, uint64_t value) {
    mq_ctl *c = ctl_of(mem);
    if (pos < 0 || pos >= MQ_POS_COUNT_) return MQ_E_INVAL;
    int rc = ctl_lock(c);
    if (rc) return rc;
    __atomic_store_n(&c->pos[pos], value, __ATOMIC_RELEASE);
    ctl_unlock(c);
    return MQ_OK;
}

int mq_ctl_advance(void *mem, int pos, uint64_t value) {
    mq_ctl *c = ctl_of(mem);
    if (pos < 0 || pos >= MQ_POS_COUNT_) return MQ_E_INVAL;
    uint64_t cur = __atomic_load_n(&c->pos[pos], __ATOMIC_ACQUIRE);
    while (cur < value &&
           !__atomic_compare_exchange_n(&c->pos[pos], &cur, value, 1, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
    }
    return MQ_OK;
}

uint32_t mq_ctl_seq(void *mem, int seq) {
    mq_ctl *c = ctl_of(mem);
    assert(seq >= 0 && seq < MQ_SEQ_COUNT_);
    return __atomic_load_n(&c->seq[seq], __ATOMIC_SEQ_CST);
}

/* Sleeps until seq[which] != seen, a wake, or the timeout.  The waiter count
 * lets wakers skip the syscall when nobody sleeps; both sides use seq_cst so a
 * wake between the check and the sleep is never lost (the futex re-checks). */
int mq_ctl_wait(void *mem, int seq, uint32_t seen, int timeout_ms) {
    mq_ctl *c = ctl_of(mem);
    if (seq < 0 || seq >= MQ_SEQ_COUNT_) return MQ_E_INVAL;
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

void mq_ctl_wake(void *mem, int seq) {
    mq_ctl *c = ctl_of(mem);
    assert(seq >= 0 && seq < MQ_SEQ_COUNT_);
    __atomic_add_fetch(&c->seq[seq], 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&c->waiters[seq], __ATOMIC_SEQ_CST) > 0)
        syscall(SYS_futex, &c->seq[seq], FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static int64_t mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int mq_ctl_wait_pos(void *mem, int seq, int pos, uint64_t target, int timeout_ms) {
    mq_ctl *c = ctl_of(mem);
    if (seq < 0 || seq >= MQ_SEQ_COUNT_ || pos < 0 || pos >= MQ_POS_COUNT_) return MQ_E_INVAL;
    int64_t deadline = mono_ms() + timeout_ms;
    for (;;) {
        uint32_t seen = __atomic_load_n(&c->seq[seq], __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&c->pos[pos], __ATOMIC_ACQUIRE) >= target) return MQ_OK;
        if (__atomic_load_n(&c->fatal_err, __ATOMIC_ACQUIRE)) return MQ_E_FATAL;
        int64_t left = deadline - mono_ms();
        if (left <= 0) return MQ_E_TIMEOUT;
        mq_ctl_wait(mem, seq, seen, left < 1000 ? (int)left : 1000);
    }
}

int mq_ctl_fatal(void *mem, char *msg_out, size_t msg_cap) {
    mq_ctl *c = ctl_of(mem);
    int err = __atomic_load_n(&c->fatal_err, __ATOMIC_ACQUIRE);
    if (err && msg_out && msg_cap) snprintf(msg_out, msg_cap, "%s", c->fatal_msg);
    return err;
}

int mq_ctl_set_fatal(void *mem, int err, const char *msg) {
    mq_ctl *c = ctl_of(mem);
    if (err == 0) return MQ_E_INVAL;
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
    return which == 0 ? c->stat_owner_dead : which == 1 ? c->stat_replays : 0;
}

int mq_ctl_debug_lock_and_hold(void *mem, uint32_t slot, uint64_t journal_bytes) {
    mq_ctl *c = ctl_of(mem);
    if (slot >= MQ_QUEUE_SLOTS) return MQ_E_INVAL;
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

/* ---- topic-queue table (open addressing; slots are never removed) -------- */
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
    if (!topic || topic_len == 0 || topic_len > MQ_TOPIC_LEN_MAX) return MQ_E_TOPIC_ILLEGAL;
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
    if (slot >= MQ_QUEUE_SLOTS || field < 0 || field >= MQ_Q_COUNT_) return MQ_E_INVAL;
    int rc = ctl_lock(c);
    if (rc) return rc;
    __atomic_store_n(&c->slots[slot].field[field], value, __ATOMIC_RELEASE);
    ctl_unlock(c);
    return MQ_OK;
}

int mq_queue_advance(void *mem, uint32_t slot, int field, int64_t value) {
    mq_ctl *c = ctl_of(mem);
    if (slot >= MQ_QUEUE_SLOTS || field < 0 || field >= MQ_Q_COUNT_) return MQ_E_INVAL;
    int64_t *p = &c->slots[slot].field[field];
    int64_t cur = __atomic_load_n(p, __ATOMIC_ACQUIRE);
    while (cur < value && !__atomic_compare_exchange_n(p, &cur, value, 1, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
    }
    return MQ_OK;
}

uint32_t mq_queue_count(void *mem) { return ctl_of(mem)->queue_count; }

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

int mq_queue_info(void *mem, uint32_t slot, char *topic_out, uint32_t *topic_len, int32_t *queue_id) {
    mq_ctl *c = ctl_of(mem);
    if (slot >= MQ_QUEUE_SLOTS) return MQ_E_INVAL;
    mq_queue_slot *s = &c->slots[slot];
    if (__atomic_load_n(&s->state, __ATOMIC_ACQUIRE) != 2) return MQ_E_RANGE;
    memcpy(topic_out, s->topic, s->topic_len);
    *topic_len = s->topic_len;
    *queue_id = s->queue_id;
    return MQ_OK;
}

/* ========================================================================== */
/* CommitLog segments                                                          */
/* ========================================================================== */
typedef struct mq_seg { uint8_t *base; int fd; } mq_seg;

/* the mapped files of one directory: data files, or (DLedger mode) index files */
typedef struct seg_table {
    char dir[PATH_MAX - 32];
    uint64_t file_size;
    mq_seg *segs;                    /* indexed by file index = offset / file_size */
    uint64_t nsegs;
} seg_table;

struct mq_commitlog {
    mq_ctl *ctl;
    char dir[PATH_MAX - 32];
    uint64_t file_size;
    uint8_t store_host[4];
    int32_t store_port;
    int last_errno;
    int dledger;                     /* DLedger mode: entries around records, index files */
    pthread_mutex_t seg_lock;        /* process-local; guards both tables */
    seg_table data;                  /* data.segs / data.nsegs: the CommitLog (or DLedger data) files */
    seg_table index;                 /* DLedger mode: the index files */
    uint8_t *rx_buf;                 /* HA slave: staging for received bodies (one receiving thread) */
    int rx_pipe[2];                  /* HA slave: socket -> pipe -> file splice; -1 when not made (yet) */
    int rx_no_splice;                /* HA slave: splice was refused here; receive + pwrite instead */
};

int mq_commitlog_errno(mq_commitlog *cl) { return cl->last_errno; }

static int io_fail(mq_commitlog *cl, int err) {
    cl->last_errno = err;
    return (err == ENOSPC || err == EDQUOT) ? MQ_E_NOSPACE : MQ_E_IO;
}

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

static int tseg_get(mq_commitlog *cl, seg_table *t, uint64_t fi, int create, uint8_t **base_out) {
    pthread_mutex_lock(&cl->seg_lock);
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

static int seg_get(mq_commitlog *cl, uint64_t fi, int create, uint8_t **base_out) {
    return tseg_get(cl, &cl->data, fi, create, base_out);
}

/* The fd of data file fi (mapped already).  Used after the lock is let go: segments are
 * released only by the thread that streams (mq_commitlog_release's contract). */
static int seg_fd(mq_commitlog *cl, uint64_t fi) {
    pthread_mutex_lock(&cl->seg_lock);
    int fd = cl->data.segs[fi].fd;
    pthread_mutex_unlock(&cl->seg_lock);
    return fd;
}

int mq_commitlog_open(const char *dir, void *ctl_mem, size_t ctl_len, const mq_commitlog_opts *opts, mq_commitlog **out) {
    if (!dir || !opts || !out || strlen(dir) >= sizeof(((mq_commitlog *)0)->dir)) return MQ_E_INVAL;
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
    free(cl->rx_buf);
    if (cl->rx_pipe[0] >= 0) { close(cl->rx_pipe[0]); close(cl->rx_pipe[1]); }
    pthread_mutex_destroy(&cl->seg_lock);
    free(cl);
}

/* Creates, sizes, maps and pre-touches a file so the first append into it
 * takes no page faults.  The touch is an atomic add of 0 per page: it makes
 * the page writable-mapped without changing bytes a concurrent appender may
 * be writing into the same page. */
int mq_commitlog_prepare_file(mq_commitlog *cl, uint64_t file_index) {
    uint8_t *base;
    int rc = seg_get(cl, file_index, 1, &base);
    if (rc) return rc;
    for (uint64_t off = 0; off < cl->file_size; off += MQ_PAGE)
        __atomic_fetch_add((uint64_t *)(base + off), 0, __ATOMIC_RELAXED);
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

/* ========================================================================== */
/* Append                                                                      */
/* ========================================================================== */
typedef struct msg_plan {
    const uint8_t *body, *props;
    uint32_t body_len, props_len;
    uint32_t crc, size;
    int32_t flag;
    uint8_t sep;                     /* 1 if a \x02 goes between props and extra_props */
} msg_plan;

static int topic_ok(const char *t, uint32_t n) {
    if (!t || n == 0 || n > MQ_TOPIC_LEN_MAX) return 0;
    for (uint32_t i = 0; i < n; i++) {
        char ch = t[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '%' || ch == '|' || ch == '_' || ch == '-'))
            return 0;
    }
    return 1;
}

/* Bytes of a record besides body, topic and properties: 91 with IPv4 hosts.
 * 48 (TOTALSIZE..BORNTIMESTAMP) + born(addr+4) + 8 (STORETS) + store(addr+4)
 * + 12 (RECONSUMETIMES, PREPAREDTXOFFSET) + 4 (BODYLEN) + 1 (TOPICLEN) + 2 (PROPSLEN) */
static inline uint32_t fixed_len(uint32_t born_len, uint32_t store_len) {
    return 83 + born_len + store_len;
}

static int plan_msg(const mq_append_req *r, msg_plan *m) {
    if (m->body_len == 0 || m->body_len > r->max_message_size) return MQ_E_MSG_ILLEGAL;
    m->sep = (r->extra_props_len > 0 && m->props_len > 0 && m->props[m->props_len - 1] != 0x02) ? 1 : 0;
    uint64_t props_total = (uint64_t)m->props_len + m->sep + r->extra_props_len;
    if (props_total > MQ_PROPS_LEN_MAX) return MQ_E_PROPS_TOO_LONG;
    m->size = fixed_len(r->born_host_len, 4) + m->body_len + r->topic_len + (uint32_t)props_total;
    return MQ_OK;
}

static int check_req(mq_commitlog *cl, const mq_append_req *r) {
    if (!r || !cl) return MQ_E_INVAL;
    if (!topic_ok(r->topic, r->topic_len)) return MQ_E_TOPIC_ILLEGAL;
    if (r->queue_id < 0 || (r->born_host_len != 4 && r->born_host_len != 16)) return MQ_E_INVAL;
    if (r->extra_props_len > MQ_PROPS_LEN_MAX) return MQ_E_PROPS_TOO_LONG;
    return MQ_OK;
}

static void encode_record(mq_commitlog *cl, const mq_append_req *r, const msg_plan *m, uint8_t *p,
                          int64_t qoff, uint64_t phy, int64_t ts) {
    uint8_t *start = p;
    int32_t sys_flag = (r->sys_flag & ~0x30) | (r->born_host_len == 16 ? 0x10 : 0);
    be32w(p, m->size); p += 4;
    be32w(p, MQ_MESSAGE_MAGIC); p += 4;
    be32w(p, m->crc); p += 4;
    be32w(p, (uint32_t)r->queue_id); p += 4;
    be32w(p, (uint32_t)m->flag); p += 4;
    be64w(p, (uint64_t)qoff); p += 8;
    be64w(p, phy); p += 8;
    be32w(p, (uint32_t)sys_flag); p += 4;
    be64w(p, (uint64_t)r->born_ts_ms); p += 8;
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

/* DLedger: the 48-byte entry header at p, and the 32-byte index unit of that entry. */
static void dl_encode_header(uint8_t *p, uint32_t entry_size, uint64_t index, int64_t term, uint64_t pos) {
    be32w(p, MQ_DL_MAGIC);
    be32w(p + 4, entry_size);
    be64w(p + 8, index);
    be64w(p + 16, (uint64_t)term);
    be64w(p + 24, pos);
    memset(p + 32, 0, 12);                   /* channel, chainCrc, bodyCrc: reserved, 0 as in DLedger */
    be32w(p + 44, entry_size - MQ_DL_HEADER_SIZE);
}

/* Writes entry `index`'s unit into its index file (created on demand). */
static int dl_write_unit(mq_commitlog *cl, uint64_t index, uint64_t pos, uint32_t size, int64_t term) {
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

static void dl_write_blank(uint8_t *p, uint64_t room) {
    be32w(p, 0xFFFFFFFFu);                   /* MmapFileList.BLANK_MAGIC_CODE = -1 */
    be32w(p + 4, (uint32_t)room);
}

/* Appends planned messages to one topic-queue.  Outcomes: MQ_OK and every
 * message published (write_pos moved, queue offsets assigned densely);
 * or an error and nothing published (bytes possibly written beyond write_pos
 * are invisible and will be overwritten).  DLedger mode: each message becomes
 * one entry, in `forced_term` when > 0 (the leader's no-op), else in
 * DL_APPEND_TERM (MQ_E_NOT_LEADER when 0). */
static int append_planned(mq_commitlog *cl, const mq_append_req *r, const msg_plan *msgs, uint32_t n,
                          mq_append_out *out, int64_t forced_term, int wake) {
    mq_ctl *c = cl->ctl;
    uint32_t slot;
    int rc = mq_queue_lookup(c, r->topic, r->topic_len, r->queue_id, 1, &slot);
    if (rc) return rc;
    int tx_type = r->sys_flag & 0xC;
    int no_queue_offset = (tx_type == 0x4 || tx_type == 0xC);   /* prepared / rollback */
    const uint32_t hdr = cl->dledger ? MQ_DL_HEADER_SIZE : 0;

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
        assert(room >= MQ_BLANK_LEN_MIN);
        if ((uint64_t)esize + MQ_BLANK_LEN_MIN > room) {
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
    int rc = check_req(cl, r);
    if (rc) return rc;
    if (!out || (!body && body_len)) return MQ_E_INVAL;
    if (props_len > MQ_PROPS_LEN_MAX) return MQ_E_PROPS_TOO_LONG;
    msg_plan m = {.body = body, .props = props, .body_len = body_len, .props_len = props_len, .flag = flag};
    rc = plan_msg(r, &m);
    if (rc) return rc;
    if ((uint64_t)m.size + MQ_BLANK_LEN_MIN > cl->file_size) return MQ_E_TOO_BIG;
    if (cl->dledger && (uint64_t)m.size + MQ_DL_HEADER_SIZE + MQ_BLANK_LEN_MIN > cl->file_size) return MQ_E_TOO_BIG;
    m.crc = mq_crc32(0, body, body_len) & 0x7FFFFFFFu;
    return append_planned(cl, r, &m, 1, out, 0, wake);
}

int mq_commitlog_append_one(mq_commitlog *cl, const mq_append_req *r, int32_t flag, const uint8_t *body,
                            uint32_t body_len, const uint8_t *props, uint32_t props_len, mq_append_out *out) {
    return append_one(cl, r, flag, body, body_len, props, props_len, out, 1);
}

int mq_commitlog_append_group(mq_commitlog *cl, const mq_group_msg *msgs, uint32_t n,
                              uint32_t max_message_size, mq_append_out *out, int32_t *rc_out) {
    if (!cl || (n && (!msgs || !out || !rc_out)) || n > MQ_BATCH_MSGS_MAX) return MQ_E_INVAL;
    int appended = 0;
    for (uint32_t i = 0; i < n; i++) {
        const mq_group_msg *g = &msgs[i];
        mq_append_req r = {
            .topic = g->topic, .topic_len = g->topic_len, .queue_id = g->queue_id, .sys_flag = g->sys_flag,
            .reconsume_times = g->reconsume_times, .born_ts_ms = g->born_ts_ms, .born_port = g->born_port,
            .born_host_len = g->born_host_len, .extra_props = g->extra_props,
            .extra_props_len = g->extra_props_len, .max_message_size = max_message_size,
        };
        if (!g->topic || !g->born_host || (g->born_host_len != 4 && g->born_host_len != 16) ||
            (g->extra_props_len && !g->extra_props) || (g->props_len && !g->props)) {
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

/* Batch body: per message  totalSize 4 | magic 4 | bodyCRC 4 | flag 4 |
 * bodyLen 4 | body | propsLen 2 | props  (MessageDecoder.encodeMessages). */
int mq_commitlog_append_batch(mq_commitlog *cl, const mq_append_req *r, const uint8_t *batch, size_t batch_len,
                              mq_append_out *out, uint32_t out_cap, uint32_t *n_out) {
    int rc = check_req(cl, r);
    if (rc) return rc;
    if (!batch || !out || !n_out) return MQ_E_INVAL;
    if (batch_len == 0 || batch_len > r->max_message_size) return MQ_E_MSG_ILLEGAL;
    uint32_t cap = out_cap < MQ_BATCH_MSGS_MAX ? out_cap : MQ_BATCH_MSGS_MAX;
    msg_plan stack_plans[64];
    msg_plan *plans = stack_plans;
    uint32_t plans_cap = 64, n = 0;
    size_t at = 0;
    while (at < batch_len) {
        const uint8_t *p = batch + at;
        size_t left = batch_len - at;
        if (left < 22) { rc = MQ_E_MSG_ILLEGAL; goto out; }
        uint32_t total = be32r(p), body_len = be32r(p + 16);
        if (total < 22 || total > left || body_len > total - 22) { rc = MQ_E_MSG_ILLEGAL; goto out; }
        int16_t props_len = (int16_t)be16r(p + 20 + body_len);
        if (props_len < 0 || 22u + body_len + (uint32_t)props_len != total) { rc = MQ_E_MSG_ILLEGAL; goto out; }
        if (n == cap) { rc = MQ_E_MSG_ILLEGAL; goto out; }
        if (n == plans_cap) {
            uint32_t nc = plans_cap * 4 < cap ? plans_cap * 4 : cap;
            msg_plan *np = malloc(nc * sizeof(msg_plan));
            if (!np) { rc = MQ_E_IO; goto out; }
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
        if ((uint64_t)m->size + (cl->dledger ? MQ_DL_HEADER_SIZE : 0) + MQ_BLANK_LEN_MIN > cl->file_size) {
            rc = MQ_E_TOO_BIG;
            goto out;
        }
        m->crc = mq_crc32(0, m->body, body_len) & 0x7FFFFFFFu;
        n++;
        at += total;
    }
    rc = append_planned(cl, r, plans, n, out, 0, 1);
    if (rc == MQ_OK) *n_out = n;
out:
    if (plans != stack_plans) free(plans);
    return rc;
}

/* ========================================================================== */
/* Read, scan, flush                                                           */
/* ========================================================================== */
int mq_commitlog_view_raw(mq_commitlog *cl, uint64_t offset, uint32_t size, const uint8_t **ptr) {
    const uint64_t fs = cl->file_size;
    if (size == 0 || (offset % fs) + size > fs) return MQ_E_RANGE;
    uint8_t *base;
    int rc = seg_get(cl, offset / fs, 0, &base);
    if (rc) return rc;
    *ptr = base + offset % fs;
    return MQ_OK;
}

int mq_commitlog_view(mq_commitlog *cl, uint64_t offset, uint32_t size, const uint8_t **ptr) {
    uint64_t lo = mq_ctl_get(cl->ctl, MQ_POS_MIN), hi = mq_ctl_get(cl->ctl, MQ_POS_WRITE);
    if (offset < lo || offset + size > hi || offset + size < offset) return MQ_E_RANGE;
    return mq_commitlog_view_raw(cl, offset, size, ptr);
}

int mq_commitlog_read_record(mq_commitlog *cl, uint64_t offset, uint32_t size, int32_t queue_id,
                             int64_t queue_offset, const uint8_t **ptr) {
    int rc = mq_commitlog_view(cl, offset, size, ptr);
    if (rc) return rc;
    mq_scan_rec rec;
    int stop;
    if (mq_record_check(*ptr, size, 1, &rec, &stop) != MQ_OK || rec.phy_offset != offset || rec.size != size)
        return MQ_E_CORRUPT;
    if (queue_id >= 0 && (rec.queue_id != queue_id || rec.queue_offset != queue_offset)) return MQ_E_CORRUPT;
    return MQ_OK;
}

int mq_record_check(const uint8_t *p, size_t avail, int check_crc, mq_scan_rec *rec, int *stop) {
    *stop = MQ_SCAN_LIMIT;
    if (avail < 8) { *stop = MQ_SCAN_TORN; return MQ_E_CORRUPT; }
    uint32_t total = be32r(p);
    if (be32r(p + 4) != MQ_MESSAGE_MAGIC) { *stop = MQ_SCAN_BAD_MAGIC; return MQ_E_CORRUPT; }
    if (total < fixed_len(4, 4)) { *stop = MQ_SCAN_BAD_SIZE; return MQ_E_CORRUPT; }
    if (total > avail) { *stop = MQ_SCAN_TORN; return MQ_E_CORRUPT; }
    int32_t sys_flag = (int32_t)be32r(p + 36);
    uint32_t bl = (sys_flag & 0x10) ? 16 : 4, sl = (sys_flag & 0x20) ? 16 : 4;
    uint32_t fixed = fixed_len(bl, sl);
    if (total < fixed) { *stop = MQ_SCAN_BAD_SIZE; return MQ_E_CORRUPT; }
    uint32_t body_at = 80 + bl + sl;   /* 88 with IPv4 hosts */
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
    if (check_crc && (mq_crc32(0, p + body_at, body_len) & 0x7FFFFFFFu) != be32r(p + 8)) {
        *stop = MQ_SCAN_BAD_CRC;
        return MQ_E_CORRUPT;
    }
    rec->phy_offset = be64r(p + 28);
    rec->queue_offset = (int64_t)be64r(p + 20);
    rec->born_ts_ms = (int64_t)be64r(p + 40);
    rec->store_ts_ms = (int64_t)be64r(p + 48 + bl + 4);
    rec->size = total;
    rec->queue_id = (int32_t)be32r(p + 12);
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

/* Fills r->slot for the record starting at rec_start (create: resolve_slots == 2). */
static int resolve_slot(mq_commitlog *cl, const uint8_t *rec_start, mq_scan_rec *r, int resolve_slots) {
    uint32_t slot;
    int lr = mq_queue_lookup(cl->ctl, (const char *)rec_start + r->topic_offset, r->topic_len, r->queue_id,
                             resolve_slots == 2, &slot);
    if (lr == MQ_OK) r->slot = slot;
    else if (lr != MQ_E_RANGE && lr != MQ_E_TOPIC_ILLEGAL) return lr;
    return MQ_OK;
}

/* Checks the DLedger entry at p (pos `pos`, `room` bytes to its file's end, `avail` readable):
 * header, sizes, pos, the record inside (PHYSICALOFFSET = pos + 48, TOTALSIZE = bodySize).
 * MQ_OK with rec filled (dl_* too), or MQ_E_CORRUPT with *stop the kind.  Index continuity
 * is the caller's (it knows the previous entry). */
static int dl_entry_check(const uint8_t *p, uint64_t pos, uint64_t room, uint64_t avail, int check_crc,
                          mq_scan_rec *rec, int *stop) {
    uint32_t magic = be32r(p), size = be32r(p + 4);
    if (magic != MQ_DL_MAGIC) { *stop = MQ_SCAN_BAD_MAGIC; return MQ_E_CORRUPT; }
    if (size < MQ_DL_HEADER_SIZE + fixed_len(4, 4) || (uint64_t)size + MQ_BLANK_LEN_MIN > room) {
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
    return MQ_OK;
}

/* Walks records from `from` while pos < limit.  Outcomes (in *stop_out):
 * LIMIT, FULL (out is full), END (clean end), or the first bad record's kind;
 * *next_out is where the walk stopped (the first byte not returned).
 * resolve_slots: 0 none, 1 look up, 2 look up or create the topic-queue slot.
 * DLedger mode walks entries and returns the records inside them. */
int mq_commitlog_scan(mq_commitlog *cl, uint64_t from, uint64_t limit, int check_crc, int resolve_slots,
                      mq_scan_rec *out, uint32_t cap, uint32_t *n_out, uint64_t *next_out, int *stop_out) {
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
            if (w0 == 0xFFFFFFFFu) {
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

int mq_dispatch_batch(void *mem, const mq_scan_rec *recs, uint32_t n, mq_cq_map *maps,
                      uint32_t *done_out, uint32_t *need_slot_out, int64_t *need_qoff_out) {
    mq_ctl *c = ctl_of(mem);
    for (uint32_t i = 0; i < n; i++) {
        const mq_scan_rec *r = &recs[i];
        int tx = r->sys_flag & 0xC;
        if (tx == 0x4 || tx == 0xC) continue;
        if (r->slot >= MQ_QUEUE_SLOTS) return MQ_E_INVAL;
        mq_cq_map *m = &maps[r->slot];
        int64_t q = r->queue_offset;
        if (!m->base || q < m->first_qoff || q >= m->first_qoff + m->entries) {
            *done_out = i;
            *need_slot_out = r->slot;
            *need_qoff_out = q;
            return MQ_E_RANGE;
        }
        uint8_t *e = m->base + (uint64_t)(q - m->first_qoff) * 20;
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

/* ========================================================================== */
/* Message index (RocketMQ's IndexFile; layout in mqstore.h)                   */
/* ========================================================================== */
enum { IX_BEGIN_TS = 0, IX_END_TS = 8, IX_BEGIN_PHY = 16, IX_END_PHY = 24, IX_SLOTS_USED = 32, IX_COUNT = 36 };

static inline uint32_t ix_load32(const uint8_t *p) {
    uint32_t v = __atomic_load_n((const uint32_t *)p, __ATOMIC_ACQUIRE);
    return __builtin_bswap32(v);
}
static inline void ix_store32(uint8_t *p, uint32_t v) {
    __atomic_store_n((uint32_t *)p, __builtin_bswap32(v), __ATOMIC_RELEASE);
}

/* |String.hashCode|, with Integer.MIN_VALUE (whose abs is negative in Java) as 0 */
static inline int32_t ix_key_hash(const uint8_t *key, uint32_t len) {
    int32_t h = mq_java_hash(key, len);
    return h == INT32_MIN ? 0 : (h < 0 ? -h : h);
}

void mq_index_init(const mq_index_map *m, int64_t prev_end_phy, int64_t prev_end_ts) {
    uint8_t *h = m->base;
    be64w(h + IX_BEGIN_TS, (uint64_t)prev_end_ts);
    be64w(h + IX_END_TS, (uint64_t)prev_end_ts);
    be64w(h + IX_BEGIN_PHY, (uint64_t)prev_end_phy);
    be64w(h + IX_END_PHY, (uint64_t)prev_end_phy);
    be32w(h + IX_SLOTS_USED, 0);
    ix_store32(h + IX_COUNT, 1);
}

/* One entry; the caller checked there is room (count < index_num). */
static void ix_put(const mq_index_map *m, const uint8_t *key, uint32_t len, int64_t phy, int64_t ts_ms) {
    uint8_t *h = m->base;
    uint32_t count = ix_load32(h + IX_COUNT);
    int32_t kh = ix_key_hash(key, len);
    uint8_t *slot = h + MQ_INDEX_HEADER + (uint64_t)((uint32_t)kh % m->slot_num) * 4;
    uint8_t *e = h + MQ_INDEX_HEADER + (uint64_t)m->slot_num * 4 + (uint64_t)count * MQ_INDEX_UNIT;
    uint32_t prev = be32r(slot);     /* a put cut short by a crash was counted at open (mq.store.index) */
    if ((int32_t)prev <= 0 || prev > count) prev = 0;
    if (count <= 1) {                      /* the file's first entry fixes its time base */
        be64w(h + IX_BEGIN_PHY, (uint64_t)phy);
        be64w(h + IX_BEGIN_TS, (uint64_t)ts_ms);
    }
    int64_t begin_ts = (int64_t)be64r(h + IX_BEGIN_TS);
    int64_t diff_s = begin_ts <= 0 ? 0 : (ts_ms - begin_ts) / 1000;
    if (diff_s < 0) diff_s = 0;
    if (diff_s > INT32_MAX) diff_s = INT32_MAX;
    be32w(e, (uint32_t)kh);
    be64w(e + 4, (uint64_t)phy);
    be32w(e + 12, (uint32_t)diff_s);
    be32w(e + 16, prev);
    ix_store32(slot, count);               /* readers follow the slot only to a complete entry */
    if (prev == 0) be32w(h + IX_SLOTS_USED, be32r(h + IX_SLOTS_USED) + 1);
    be64w(h + IX_END_PHY, (uint64_t)phy);
    be64w(h + IX_END_TS, (uint64_t)ts_ms);
    ix_store32(h + IX_COUNT, count + 1);
}

/* The value of property `name` (with its \x01) in props, or NULL. */
static const uint8_t *ix_prop(const uint8_t *p, uint32_t n, const char *name, uint32_t name_len, uint32_t *len_out) {
    uint32_t i = 0;
    while (i < n) {
        uint32_t end = i;
        while (end < n && p[end] != 0x02) end++;
        if (end - i >= name_len && memcmp(p + i, name, name_len) == 0) {
            *len_out = end - i - name_len;
            return p + i + name_len;
        }
        i = end + 1;
    }
    return NULL;
}

typedef struct { const uint8_t *p; uint32_t len; } ix_word;

/* The record's keys: UNIQ_KEY, then each non-empty space-separated KEYS word. */
static uint32_t ix_keys(const uint8_t *props, uint32_t props_len, uint32_t topic_len, ix_word *out) {
    uint32_t k = 0, vlen;
    const uint32_t room = MQ_INDEX_KEY_MAX - topic_len - 1;      /* bytes left for a key after "topic#" */
    const uint8_t *v = ix_prop(props, props_len, "UNIQ_KEY\x01", 9, &vlen);
    if (v && vlen > 0 && vlen <= room) out[k++] = (ix_word){v, vlen};
    v = ix_prop(props, props_len, "KEYS\x01", 5, &vlen);
    if (v) {
        uint32_t i = 0;
        while (i < vlen && k < MQ_INDEX_KEYS_MAX) {
            while (i < vlen && v[i] == ' ') i++;
            uint32_t j = i;
            while (j < vlen && v[j] != ' ') j++;
            if (j > i && j - i <= room) out[k++] = (ix_word){v + i, j - i};
            i = j;
        }
    }
    return k;
}

int mq_index_build(mq_commitlog *cl, const mq_index_map *m, const mq_scan_rec *recs, uint32_t n,
                   uint64_t from, uint32_t *done_out) {
    if (!m->base || m->slot_num == 0 || m->index_num <= MQ_INDEX_KEYS_MAX || m->room_num > m->index_num)
        return MQ_E_INVAL;
    uint8_t key[MQ_INDEX_KEY_MAX];
    ix_word words[MQ_INDEX_KEYS_MAX];
    for (uint32_t i = 0; i < n; i++) {
        const mq_scan_rec *r = &recs[i];
        int tx = r->sys_flag & 0xC;
        if (r->phy_offset < from || r->props_len == 0 || tx == 0x4 || tx == 0xC) continue;
        const uint8_t *p;
        int rc = mq_commitlog_view_raw(cl, r->phy_offset, r->size, &p);
        if (rc) { *done_out = i; return rc; }
        uint32_t tl = r->topic_len;
        if (tl + 2 > MQ_INDEX_KEY_MAX) continue;
        uint32_t k = ix_keys(p + r->props_offset, r->props_len, tl, words);
        if (k == 0) continue;
        if (ix_load32(m->base + IX_COUNT) + k > m->room_num) { *done_out = i; return MQ_E_FULL; }
        memcpy(key, p + r->topic_offset, tl);
        key[tl] = '#';
        for (uint32_t w = 0; w < k; w++) {
            memcpy(key + tl + 1, words[w].p, words[w].len);
            ix_put(m, key, tl + 1 + words[w].len, (int64_t)r->phy_offset, r->store_ts_ms);
        }
    }
    *done_out = n;
    return MQ_OK;
}

int mq_index_query(const mq_index_map *m, const uint8_t *key, uint32_t key_len, int64_t begin_ms,
                   int64_t end_ms, int64_t *out, uint32_t cap, uint32_t *n_io) {
    if (!m->base || m->slot_num == 0) return MQ_E_INVAL;
    const uint8_t *h = m->base;
    uint32_t count = ix_load32(h + IX_COUNT);
    if (count > m->index_num) return MQ_E_CORRUPT;
    int32_t kh = ix_key_hash(key, key_len);
    uint32_t next = ix_load32(h + MQ_INDEX_HEADER + (uint64_t)((uint32_t)kh % m->slot_num) * 4);
    if ((int32_t)next <= 0 || next > count) return MQ_OK;
    int64_t begin_ts = (int64_t)be64r(h + IX_BEGIN_TS);
    const uint8_t *entries = h + MQ_INDEX_HEADER + (uint64_t)m->slot_num * 4;
    while (*n_io < cap) {
        const uint8_t *e = entries + (uint64_t)next * MQ_INDEX_UNIT;
        int32_t e_hash = (int32_t)be32r(e);
        int64_t phy = (int64_t)be64r(e + 4);
        int32_t diff_s = (int32_t)be32r(e + 12);
        uint32_t prev = be32r(e + 16);
        if (diff_s < 0) break;
        int64_t ts = begin_ts + (int64_t)diff_s * 1000;
        if (e_hash == kh && ts >= begin_ms && ts <= end_ms) out[(*n_io)++] = phy;
        /* a chain runs from newer to older entries: a prev at or after this one is damage */
        if ((int32_t)prev <= 0 || prev >= next || ts < begin_ms) break;
        next = prev;
    }
    return MQ_OK;
}

/* Makes [flushed_pos, write_pos) durable with msync(MS_SYNC), file by file.
 * Skips the flush when fewer than least_pages dirty pages are in the current
 * file and no older file has unflushed bytes (RocketMQ's isAbleToFlush).
 * On failure the error sticks (mq_ctl_set_fatal) and MQ_E_IO is returned;
 * flushed_pos never moves past bytes that were not made durable. */
int mq_commitlog_flush(mq_commitlog *cl, uint32_t least_pages, uint64_t *flushed_out) {
    mq_ctl *c = cl->ctl;
    const uint64_t fs = cl->file_size;
    int rc = ctl_lock(c);
    if (rc) return rc;
    uint64_t upto = c->pos[MQ_POS_WRITE];
    uint64_t ts = c->pos[MQ_POS_LAST_STORE_TS];
    uint64_t next_index = c->pos[MQ_POS_DL_NEXT_INDEX];      /* the entries ending at `upto` */
    uint64_t epoch = c->trunc_epoch;
    ctl_unlock(c);
    uint64_t from = mq_ctl_get(c, MQ_POS_FLUSHED);
    if (__atomic_load_n(&c->fatal_err, __ATOMIC_ACQUIRE)) { *flushed_out = from; return MQ_E_FATAL; }
    if (upto <= from) { *flushed_out = from; return MQ_OK; }
    if (least_pages > 0 && from / fs == upto / fs && upto / MQ_PAGE - from / MQ_PAGE < least_pages) {
        *flushed_out = from;
        return MQ_OK;
    }
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
            *flushed_out = mq_ctl_get(c, MQ_POS_FLUSHED);
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
            *flushed_out = mq_ctl_get(c, MQ_POS_FLUSHED);
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

/* Zeroes the file holding `from`, from there to its end, touching only pages
 * that hold non-zero bytes, then makes that durable.  Used after recovery
 * truncates, so stale bytes past the new end can never chain into records. */
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

/* ========================================================================== */
/* HA                                                                          */
/* ========================================================================== */
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
    uint8_t hdr[12];
    be64w(hdr, offset);
    be32w(hdr + 8, body);
    int fd = -1;
    if (body) {
        uint8_t *base;
        int rc = seg_get(cl, offset / fs, 0, &base);
        if (rc) return rc;
        fd = seg_fd(cl, offset / fs);
    }
    if (send_all(sock_fd, hdr, sizeof hdr, body ? MSG_MORE : 0) != 0) return io_fail(cl, errno);
    off_t file_off = (off_t)(offset % fs);
    uint32_t left = body;
    while (left) {
        ssize_t w = sendfile(sock_fd, fd, &file_off, left);
        if (w < 0) {
            if (errno == EINTR) continue;
            return io_fail(cl, errno);
        }
        if (w == 0) return io_fail(cl, EPIPE);
        left -= (uint32_t)w;
    }
    return MQ_OK;
}

int mq_ha_send_frame(mq_commitlog *cl, int sock_fd, uint64_t offset, uint32_t max_body, uint32_t *body_out) {
    const uint64_t fs = cl->file_size;
    uint64_t wp = mq_ctl_get(cl->ctl, MQ_POS_WRITE);
    if (offset > wp || offset < mq_ctl_get(cl->ctl, MQ_POS_MIN)) return MQ_E_RANGE;
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
    const uint64_t fs = cl->file_size;
    *sent_end_out = from;
    if (frame_max == 0 || from > to || to > mq_ctl_get(cl->ctl, MQ_POS_WRITE) ||
        from < mq_ctl_get(cl->ctl, MQ_POS_MIN))
        return MQ_E_RANGE;
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

/* 1: spliced all `size` bytes; 0: splice unsupported here, nothing consumed; <0: error */
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

int mq_ha_recv_body(mq_commitlog *cl, int sock_fd, uint64_t offset, uint32_t size) {
    const uint64_t fs = cl->file_size;
    if (size == 0) return MQ_OK;
    if (offset % fs + size > fs) return MQ_E_RANGE;          /* a frame never crosses a file */
    if (offset < mq_ctl_get(cl->ctl, MQ_POS_WRITE)) return MQ_E_RANGE;   /* never over published bytes */
    uint8_t *base;
    int rc = seg_get(cl, offset / fs, 1, &base);
    if (rc) return rc;
    int fd = seg_fd(cl, offset / fs);
    off_t file_off = (off_t)(offset % fs);
    size_t done = 0;
    if (!cl->rx_no_splice) {
        rc = recv_body_splice(cl, sock_fd, fd, &file_off, size, &done);
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
        rc = pwrite_all(cl, fd, cl->rx_buf, have, &file_off);
        if (rc) return rc;
        done += have;
    }
    return MQ_OK;
}

int mq_ha_publish(mq_commitlog *cl, uint64_t received_end, uint64_t *published_out) {
    mq_ctl *c = cl->ctl;
    const uint64_t fs = cl->file_size;
    uint64_t pos = mq_ctl_get(c, MQ_POS_WRITE);
    int64_t last_ts = (int64_t)mq_ctl_get(c, MQ_POS_LAST_STORE_TS);
    uint64_t n_recs = 0;
    int rc = MQ_OK;
    while (pos < received_end) {
        uint8_t *base;
        rc = seg_get(cl, pos / fs, 0, &base);
        if (rc) break;
        uint64_t room = fs - pos % fs;
        uint64_t avail = received_end - pos < room ? received_end - pos : room;
        const uint8_t *p = base + pos % fs;
        if (avail < 8) break;                                   /* header not complete yet */
        uint32_t total = be32r(p), magic = be32r(p + 4);
        if (magic == MQ_BLANK_MAGIC) {
            if (total != room) { rc = MQ_E_CORRUPT; break; }
            if (received_end < pos + room) break;               /* the master still streams the filler */
            pos += room;
            continue;
        }
        if (magic != MQ_MESSAGE_MAGIC || total < fixed_len(4, 4) || total > room) { rc = MQ_E_CORRUPT; break; }
        if (total > avail) break;                               /* the rest comes in the next frame */
        mq_scan_rec rec;
        int stop;
        if (mq_record_check(p, total, 1, &rec, &stop) != MQ_OK || rec.phy_offset != pos) { rc = MQ_E_CORRUPT; break; }
        last_ts = rec.store_ts_ms;
        pos += total;
        n_recs++;
    }
    uint64_t old = mq_ctl_get(c, MQ_POS_WRITE);
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
    const uint64_t fs = cl->file_size;
    uint64_t got = 0;
    int rc = MQ_OK, first = 1;
    *why_out = MQ_HA_RX_IDLE;
    for (;;) {
        if (got >= budget) { *why_out = MQ_HA_RX_BUDGET; break; }
        uint8_t hdr[12];
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
    uint64_t published = mq_ctl_get(cl->ctl, MQ_POS_WRITE);
    int prc = got ? mq_ha_publish(cl, *expected, &published) : MQ_OK;
    *published_out = published;
    if (prc == MQ_E_CORRUPT) return prc;
    return rc ? rc : prc;
}

/* ========================================================================== */
/* DLedger mode (see mqstore.h)                                                */
/* ========================================================================== */
static const char DL_NOOP_TOPIC[] = "RMQ_SYS_DLEDGER_NOOP";
/* pushes above this go out with sendfile; smaller ones with one sendmsg of head + body from the
 * mapping: one syscall instead of two (measured: see the README's DLedger notes) */
#define MQ_DL_SENDFILE_MIN 262144u

int mq_dledger_append_noop(mq_commitlog *cl, int64_t term, mq_append_out *out) {
    if (!cl->dledger || term <= 0 || !out) return MQ_E_INVAL;
    uint8_t body[8];
    be64w(body, (uint64_t)term);
    mq_append_req r;
    memset(&r, 0, sizeof r);
    r.topic = DL_NOOP_TOPIC;
    r.topic_len = (uint32_t)strlen(DL_NOOP_TOPIC);
    r.queue_id = 0;
    r.sys_flag = 0xC;                        /* TRANSACTION_ROLLBACK_TYPE: no ConsumeQueue entry anywhere */
    memcpy(r.born_host, cl->store_host, 4);
    r.born_host_len = 4;
    r.born_port = cl->store_port;
    r.born_ts_ms = now_ms();
    r.max_message_size = sizeof body;
    msg_plan m = {.body = body, .body_len = sizeof body};
    int rc = plan_msg(&r, &m);
    if (rc) return rc;
    m.crc = mq_crc32(0, body, sizeof body) & 0x7FFFFFFFu;
    return append_planned(cl, &r, &m, 1, out, term, 1);
}

/* Reads entry `index`'s unit (no range check against the control block). */
static int dl_read_unit(mq_commitlog *cl, uint64_t index, uint64_t *pos, uint32_t *size, int64_t *term) {
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

int mq_dledger_entry(mq_commitlog *cl, uint64_t index, uint64_t *pos_out, uint32_t *size_out, int64_t *term_out) {
    if (!cl->dledger) return MQ_E_INVAL;
    mq_ctl *c = cl->ctl;
    if (index < mq_ctl_get(c, MQ_POS_DL_BEGIN_INDEX) || index >= mq_ctl_get(c, MQ_POS_DL_NEXT_INDEX))
        return MQ_E_RANGE;
    return dl_read_unit(cl, index, pos_out, size_out, term_out);
}

int mq_dledger_append_raw(mq_commitlog *cl, const uint8_t *buf, size_t len, uint64_t first_index,
                          uint64_t first_pos, int64_t max_term, uint32_t *n_out) {
    mq_ctl *c = cl->ctl;
    const uint64_t fs = cl->file_size;
    *n_out = 0;
    if (!cl->dledger || (!buf && len)) return MQ_E_INVAL;
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
        if (len < 8 || be32r(buf) == 0xFFFFFFFFu || (uint64_t)be32r(buf + 4) + MQ_BLANK_LEN_MIN <= fs - w0 % fs)
            return MQ_E_CORRUPT;
    }

    /* 1. validate everything before writing anything */
    size_t at = 0;
    uint64_t pos = first_pos, index = first_index;
    uint32_t n = 0;
    int64_t last_ts = 0, term = prev_term;
    while (at < len) {
        const uint8_t *p = buf + at;
        const uint64_t room = fs - pos % fs;
        if (len - at < 8) return MQ_E_CORRUPT;
        if (be32r(p) == 0xFFFFFFFFu) {                    /* a filler: it reaches its file's end */
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
    const uint64_t end = pos;

    /* 2. copy the bytes (beyond WRITE: invisible until published) and write the index units */
    if (rollover) {
        uint8_t *base;
        rc = seg_get(cl, w0 / fs, 1, &base);
        if (rc) return rc;
        dl_write_blank(base + w0 % fs, fs - w0 % fs);
    }
    at = 0;
    pos = first_pos;
    while (at < len) {
        uint8_t *base;
        rc = seg_get(cl, pos / fs, 1, &base);
        if (rc) return rc;
        size_t chunk = fs - pos % fs;
        if (chunk > len - at) chunk = len - at;
        memcpy(base + pos % fs, buf + at, chunk);
        at += chunk;
        pos += chunk;
    }
    at = 0;
    pos = first_pos;
    while (at < len) {
        const uint8_t *p = buf + at;
        if (be32r(p) == 0xFFFFFFFFu) {
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

    /* 3. publish, if nothing moved meanwhile (only this thread appends here: a change is a bug or a race
     *    with a truncation of this same log, which must not happen) */
    rc = ctl_lock(c);
    if (rc) return rc;
    if (c->pos[MQ_POS_WRITE] != w0 || c->pos[MQ_POS_DL_NEXT_INDEX] != first_index ||
        c->trunc_epoch != epoch || c->pos[MQ_POS_DL_APPEND_TERM]) {
        ctl_unlock(c);
        return MQ_E_RANGE;
    }
    if (n) {
        __atomic_store_n(&c->pos[MQ_POS_LAST_STORE_TS], (uint64_t)last_ts, __ATOMIC_RELEASE);
        __atomic_store_n(&c->pos[MQ_POS_DL_END_TERM], (uint64_t)term, __ATOMIC_RELEASE);
    }
    __atomic_add_fetch(&c->pos[MQ_POS_MSGS], n, __ATOMIC_RELEASE);
    __atomic_store_n(&c->pos[MQ_POS_DL_NEXT_INDEX], index, __ATOMIC_RELEASE);
    __atomic_store_n(&c->pos[MQ_POS_WRITE], end, __ATOMIC_RELEASE);
    ctl_unlock(c);
    mq_ctl_wake(c, MQ_SEQ_WRITE);
    *n_out = n;
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
    if (!cl->dledger) return MQ_E_INVAL;
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

/* No lock: the one caller (the Raft role's thread) is also the only one that truncates, the
 * entries below DL_NEXT_INDEX it reads are published and immutable meanwhile, and both positions
 * only move forward (advance).  Taking the lock here made every commit wait for appends. */
int mq_dledger_set_commit(mq_commitlog *cl, uint64_t commit_next_index) {
    mq_ctl *c = cl->ctl;
    if (!cl->dledger) return MQ_E_INVAL;
    if (commit_next_index > mq_ctl_get(c, MQ_POS_DL_NEXT_INDEX)) return MQ_E_RANGE;
    if (commit_next_index <= mq_ctl_get(c, MQ_POS_DL_COMMIT_INDEX) ||
        commit_next_index <= mq_ctl_get(c, MQ_POS_DL_BEGIN_INDEX))
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
    if (!cl->dledger || term < 0) return MQ_E_INVAL;
    int rc = ctl_lock(c);
    if (rc) return rc;
    __atomic_store_n(&c->pos[MQ_POS_DL_APPEND_TERM], (uint64_t)term, __ATOMIC_RELEASE);
    ctl_unlock(c);
    mq_ctl_wake(c, MQ_SEQ_COMMIT);
    return MQ_OK;
}

int mq_dledger_recover_index(mq_commitlog *cl, uint64_t from_pos, uint64_t end_pos,
                             uint64_t *next_index_out, int64_t *end_term_out) {
    const uint64_t fs = cl->file_size;
    if (!cl->dledger) return MQ_E_INVAL;
    uint64_t pos = from_pos, next = 0;
    int64_t term = 0;
    int any = 0;
    while (pos < end_pos) {
        uint8_t *base;
        int rc = seg_get(cl, pos / fs, 0, &base);
        if (rc) return rc;
        const uint8_t *p = base + pos % fs;
        uint32_t magic = be32r(p), size = be32r(p + 4);
        if (magic == 0xFFFFFFFFu) { pos += fs - pos % fs; continue; }
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
    const uint64_t fs = cl->file_size;
    if (body_len && (from_pos % fs + body_len > fs || from_pos + body_len > mq_ctl_get(cl->ctl, MQ_POS_WRITE) ||
                     from_pos < mq_ctl_get(cl->ctl, MQ_POS_MIN)))
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

/* ---- perf trace rows ----------------------------------------------------- */

/* v as a decimal at p (no NUL); returns the length. */
static size_t fmt_i64(char *p, int64_t v) {
    char tmp[24];
    size_t n = 0;
    uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    do { tmp[n++] = (char)('0' + u % 10); u /= 10; } while (u);
    size_t len = 0;
    if (v < 0) p[len++] = '-';
    while (n) p[len++] = tmp[--n];
    return len;
}

int64_t mq_format_rows(const char *segs, const uint32_t *seg_len, const uint8_t *kinds, uint32_t nfields,
                       const int64_t *values, uint32_t nrows, char *out, size_t out_cap) {
    if (!segs || !seg_len || !kinds || (nrows && (!values || !out))) return MQ_E_INVAL;
    size_t fixed = 0;
    for (uint32_t i = 0; i <= nfields; i++) fixed += seg_len[i];
    for (uint32_t i = 0; i < nfields; i++)
        if (kinds[i] > MQ_FMT_CODE) return MQ_E_INVAL;
    const size_t row_max = fixed + (size_t)nfields * MQ_FMT_VALUE_MAX;
    size_t at = 0;
    for (uint32_t r = 0; r < nrows; r++) {
        if (out_cap - at < row_max) return MQ_E_RANGE;
        const char *seg = segs;
        const int64_t *v = values + (size_t)r * nfields;
        for (uint32_t i = 0; i < nfields; i++) {
            memcpy(out + at, seg, seg_len[i]);
            at += seg_len[i];
            seg += seg_len[i];
            switch (kinds[i]) {
            case MQ_FMT_INT:
                at += fmt_i64(out + at, v[i]);
                break;
            case MQ_FMT_MILLI:
                at += fmt_i64(out + at, v[i]);
                memcpy(out + at, "e-3", 3);
                at += 3;
                break;
            default:                              /* MQ_FMT_CODE */
                out[at++] = '"';
                if (v[i] >= 0) at += fmt_i64(out + at, v[i]);
                out[at++] = '"';
            }
        }
        memcpy(out + at, seg, seg_len[nfields]);
        at += seg_len[nfields];
    }
    return (int64_t)at;
}

