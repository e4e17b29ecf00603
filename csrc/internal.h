/*
 * internal.h -- what the C files share and Python never sees: the layouts behind the opaque
 * handles, the byte helpers, and the few functions one subsystem calls in another.  Include it
 * first in every .c (it defines _GNU_SOURCE).  Not part of the API; not declared to CFFI.
 *
 * Small helpers on the hot paths (append, scan, record check, dispatch) are static inline here
 * so splitting the core into files costs no calls; the cross-file functions below are each
 * called at most once per file or per record, never per byte.
 */
#ifndef MQ_INTERNAL_H
#define MQ_INTERNAL_H

#define _GNU_SOURCE
#include "mqstore.h"

#include <assert.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <string.h>
#include <time.h>

#define MQ_CTL_MAGIC   0x4D51434Cu   /* "MQCL" */
#define MQ_CTL_VERSION 7u   /* 2: MQ_POS_MSGS; 3: DLedger positions, SEQ_COMMIT/ROLE, journal index;
                               4: MQ_POS_DISK_FULL; 5: MQ_POS_HA_SLAVES; 6: bells; 7: MQ_POS_VALIDATED */
#define MQ_PAGE        4096u
#define MQ_BELL_WORDS  ((MQ_BELLS_MAX + 63) / 64)
#define MQ_SLOTS_USABLE (MQ_QUEUE_SLOTS / 4 * 3)   /* keep linear probes short */

/* ---- big-endian helpers ------------------------------------------------------------------- */
static inline void be16w(uint8_t *p, uint16_t v) { p[0] = v >> 8; p[1] = (uint8_t)v; }
static inline void be32w(uint8_t *p, uint32_t v) { v = __builtin_bswap32(v); memcpy(p, &v, 4); }
static inline void be64w(uint8_t *p, uint64_t v) { v = __builtin_bswap64(v); memcpy(p, &v, 8); }
static inline uint16_t be16r(const uint8_t *p) { return (uint16_t)((p[0] << 8) | p[1]); }
static inline uint32_t be32r(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return __builtin_bswap32(v); }
static inline uint64_t be64r(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return __builtin_bswap64(v); }

static inline int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static inline int64_t mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static inline int64_t mono_ns(void) {   /* Python's time.perf_counter_ns: CLOCK_MONOTONIC */
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* v as a decimal at p (no NUL, at most 20 bytes); returns the length.  The hot paths' printf:
 * snprintf("%lld") cost ~4% of an io worker's CPU per answered send.  Two digits a step from a
 * table, written in place once the length is known (the perf trace formats ~50 digits a row). */
static inline size_t mq_fmt_i64(char *p, int64_t v) {
    static const char pairs[201] =
        "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
        "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
        "8081828384858687888990919293949596979899";
    size_t len = 0;
    uint64_t u = (uint64_t)v;
    if (v < 0) {
        p[len++] = '-';
        u = (uint64_t)0 - u;
    }
    size_t n = 1;
    for (uint64_t t = u; t >= 10; t /= 10) n++;
    char *q = p + len + n;
    while (u >= 100) {
        const unsigned r = (unsigned)(u % 100);
        u /= 100;
        q -= 2;
        q[0] = pairs[2 * r];
        q[1] = pairs[2 * r + 1];
    }
    if (u >= 10) {
        q[-2] = pairs[2 * u];
        q[-1] = pairs[2 * u + 1];
    } else {
        q[-1] = (char)('0' + u);
    }
    return len + n;
}

/* ---- the control block (ctl.h has the invariants) ------------------------------------------ */
typedef struct mq_queue_slot {
    uint32_t state;                  /* 0 empty, 2 ready (published with release) */
    int32_t queue_id;
    uint64_t hash;
    int64_t field[MQ_Q_COUNT_];
    uint8_t topic_len;
    char topic[MQ_TOPIC_LEN_MAX];
} mq_queue_slot;

/* The layout is versioned by MQ_CTL_VERSION and checked by size: a change here needs a new
 * version, or a block made by an older build would be misread by a newer one. */
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
    /* per seq, bit b: bell b wants it.  One atomic operation per change, so a process killed
     * anywhere leaves no half-made state (a separate count once could be left out of step) */
    uint64_t bell_wants[MQ_SEQ_COUNT_][MQ_BELL_WORDS];
    mq_queue_slot slots[MQ_QUEUE_SLOTS] __attribute__((aligned(64)));
};

static inline mq_ctl *ctl_of(void *mem) {
    mq_ctl *c = (mq_ctl *)mem;
    assert(c && c->magic == MQ_CTL_MAGIC);
    return c;
}

static inline uint64_t ctl_load(const mq_ctl *c, int pos) {
    return __atomic_load_n(&c->pos[pos], __ATOMIC_ACQUIRE);
}

/* Replays or drops the journal of an owner that died holding the lock (ctl.c).
 * Lock should be held. */
void ctl_repair_locked(mq_ctl *c);

/* Takes the append lock, repairing after a dead owner: MQ_OK, or MQ_E_IO (errno = the
 * mutex's error). */
static inline int ctl_lock(mq_ctl *c) {
    int rc = pthread_mutex_lock(&c->lock);
    if (rc == EOWNERDEAD) {
        ctl_repair_locked(c);
        pthread_mutex_consistent(&c->lock);
        return MQ_OK;
    }
    if (rc) { errno = rc; return MQ_E_IO; }
    return MQ_OK;
}
static inline void ctl_unlock(mq_ctl *c) { pthread_mutex_unlock(&c->lock); }

/* ---- the CommitLog handle ------------------------------------------------------------------ */
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
    int touch_page_folios;           /* mq_commitlog_opts.touch_page_folios */
    pthread_mutex_t seg_lock;        /* process-local; guards both tables */
    seg_table data;                  /* data.segs / data.nsegs: the CommitLog (or DLedger data) files */
    seg_table index;                 /* DLedger mode: the index files */
    uint8_t *rx_buf;                 /* HA slave: staging for received bodies (one receiving thread) */
    int rx_pipe[2];                  /* HA slave: socket -> pipe -> file splice; -1 when not made (yet) */
    int rx_no_splice;                /* HA slave: splice was refused here; receive + pwrite instead */
    uint64_t units_repaired;         /* DLedger mode: index units rewritten from their entries (dledger.c) */
    uint64_t unit_repaired_last;     /* ... and the index of the last one */
    uint64_t entries_repaired;       /* DLedger mode: damaged entries rewritten from a peer's copy (dledger.c) */
    uint8_t **retired;               /* mq_commitlog_retire: placeholders over retired files' addresses, */
    size_t n_retired, cap_retired;   /* unmapped at close */
    uint64_t retired_below_index;    /* data files below this index were retired: never mapped again */
};

/* Keeps errno in the handle; ENOSPC and EDQUOT are MQ_E_NOSPACE, the rest MQ_E_IO. */
static inline int io_fail(mq_commitlog *cl, int err) {
    cl->last_errno = err;
    return (err == ENOSPC || err == EDQUOT) ? MQ_E_NOSPACE : MQ_E_IO;
}

/* The mapping of file fi of table t (commitlog.c), mapped on first use and, with create,
 * created and sized first: MQ_OK and *base_out, or the file errors of commitlog.h.  Takes
 * seg_lock (never while calling into the control block). */
int tseg_get(mq_commitlog *cl, seg_table *t, uint64_t fi, int create, uint8_t **base_out);
static inline int seg_get(mq_commitlog *cl, uint64_t fi, int create, uint8_t **base_out) {
    return tseg_get(cl, &cl->data, fi, create, base_out);
}
/* The handle's fd of data file fi, mapped already (commitlog.c): borrowed, for a thread that is
 * the only one releasing or retiring this handle's files (see mq_commitlog_release's contract). */
int seg_fd(mq_commitlog *cl, uint64_t fi);
/* An fd of data file fi that the caller owns and closes (a dup taken under seg_lock), the file
 * mapped first when needed: for threads that run beside another one's release or retire (the HA
 * transport), whose close of the handle's fd then cannot pull the file (or its fd number) from
 * under a send or receive.  MQ_OK and *fd_out, MQ_E_RANGE (below MIN: retired or deleted), or
 * the file errors of tseg_get. */
int seg_fd_own(mq_commitlog *cl, uint64_t fi, int create, int *fd_out);

/* ---- records -------------------------------------------------------------------------------- */
/* the public constants agree with each other (tests/unit/test_c_constants.py ties them to Python) */
_Static_assert(MQ_RECORD_SIZE_MIN == MQ_RECORD_FIXED_NO_HOSTS + 4 + 4, "record minimum: IPv4 hosts");
_Static_assert(MQ_REC_POS_BORN_HOST == MQ_REC_POS_BORN_TIMESTAMP + 8, "BORNHOST follows BORNTIMESTAMP");
_Static_assert(sizeof(((mq_append_out *)0)->msg_id) == MQ_MSG_ID_V4_LEN + 1, "msgId and its NUL");
_Static_assert(MQ_DL_HEADER_SIZE == 48 && MQ_DL_INDEX_UNIT == 32, "DLedger 0.3 layouts (dledger.h)");
_Static_assert(MQ_INDEX_COUNT_OFFSET + 4 == MQ_INDEX_HEADER, "indexCount ends the index header");

/* Bytes of a record besides body, topic and properties: 91 with IPv4 hosts.
 * 48 (TOTALSIZE..BORNTIMESTAMP) + born(addr+4) + 8 (STORETS) + store(addr+4)
 * + 12 (RECONSUMETIMES, PREPAREDTXOFFSET) + 4 (BODYLEN) + 1 (TOPICLEN) + 2 (PROPSLEN) */
static inline uint32_t fixed_len(uint32_t born_len, uint32_t store_len) {
    return MQ_RECORD_FIXED_NO_HOSTS + born_len + store_len;
}

/* Prepared and rolled-back transaction messages: no queue offset, ConsumeQueue or index entry. */
static inline int tx_no_queue(int32_t sys_flag) {
    int tx = sys_flag & MQ_SYSFLAG_TX_MASK;
    return tx == MQ_SYSFLAG_TX_PREPARED || tx == MQ_SYSFLAG_TX_ROLLBACK;
}

static inline uint32_t body_crc(const uint8_t *body, uint32_t len) {
    return mq_crc32(0, body, len) & 0x7FFFFFFFu;
}

/* One message of an append, checked and sized before the lock is taken. */
typedef struct msg_plan {
    const uint8_t *body, *props;
    uint32_t body_len, props_len;
    uint32_t crc, size;
    int32_t flag;
    uint8_t sep;                     /* 1 if a \x02 goes between props and extra_props */
} msg_plan;

/* commitlog.c: sizes m (MQ_E_MSG_ILLEGAL, MQ_E_PROPS_TOO_LONG), and appends planned messages
 * to one topic-queue, publishing all or none; forced_term > 0 is DLedger's no-op term. */
int plan_msg(const mq_append_req *r, msg_plan *m);
int append_planned(mq_commitlog *cl, const mq_append_req *r, const msg_plan *msgs, uint32_t n,
                   mq_append_out *out, int64_t forced_term, int wake);

/* ---- DLedger pieces the CommitLog's append and scan use (dledger.c / here) ------------------ */
/* The 48-byte entry header at p. */
static inline void dl_encode_header(uint8_t *p, uint32_t entry_size, uint64_t index, int64_t term, uint64_t pos) {
    be32w(p, MQ_DL_MAGIC);
    be32w(p + 4, entry_size);
    be64w(p + 8, index);
    be64w(p + 16, (uint64_t)term);
    be64w(p + 24, pos);
    memset(p + 32, 0, 12);                   /* channel, chainCrc, bodyCrc: reserved, 0 as in DLedger */
    be32w(p + 44, entry_size - MQ_DL_HEADER_SIZE);
}

/* The filler from p to its file's end (room bytes). */
static inline void dl_write_blank(uint8_t *p, uint64_t room) {
    be32w(p, MQ_DL_BLANK_MAGIC);
    be32w(p + 4, (uint32_t)room);
}

/* Writes entry `index`'s unit into its index file (created on demand): MQ_OK or file errors. */
int dl_write_unit(mq_commitlog *cl, uint64_t index, uint64_t pos, uint32_t size, int64_t term);

/* The CommitLog handle a send path was opened on (fastsend.c; fastconn.c keeps its errors there). */
struct mq_fast;
mq_commitlog *fast_commitlog(struct mq_fast *f);
/* The buffer a pull answered by mq_fast_read is in (its mq_fast_pulled.frame_offset is into it). */
const uint8_t *fast_pull_buf(const struct mq_fast *f);

/* Checks the DLedger entry at p (pos `pos`, `room` bytes to its file's end, `avail` readable):
 * header, sizes, pos, the record inside (PHYSICALOFFSET = pos + 48, TOTALSIZE = bodySize).
 * MQ_OK with rec filled (dl_* too), or MQ_E_CORRUPT with *stop the kind.  Index continuity
 * is the caller's (it knows the previous entry). */
int dl_entry_check(const uint8_t *p, uint64_t pos, uint64_t room, uint64_t avail, int check_crc,
                   mq_scan_rec *rec, int *stop);

#endif
