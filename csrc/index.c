/*
 * index.c -- the message index (RocketMQ's IndexFile).  Contract and file layout in index.h.
 * One writer (the dispatch role), readers in any process: the writer stores an entry, then its
 * slot, then indexCount, each later store with release order; readers load with acquire.
 */
#include "internal.h"

enum { IX_BEGIN_TS = 0, IX_END_TS = 8, IX_BEGIN_PHY = 16, IX_END_PHY = 24, IX_SLOTS_USED = 32,
       IX_COUNT = MQ_INDEX_COUNT_OFFSET };

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

static inline uint8_t *ix_slot(const mq_index_map *m, int32_t key_hash) {
    return m->base + MQ_INDEX_HEADER + (uint64_t)((uint32_t)key_hash % m->slot_num) * MQ_INDEX_SLOT;
}

static inline uint8_t *ix_entry(const mq_index_map *m, uint32_t i) {
    return m->base + MQ_INDEX_HEADER + (uint64_t)m->slot_num * MQ_INDEX_SLOT + (uint64_t)i * MQ_INDEX_UNIT;
}

void mq_index_init(const mq_index_map *m, int64_t prev_end_phy, int64_t prev_end_ts) {
    assert(m && m->base);
    uint8_t *h = m->base;
    be64w(h + IX_BEGIN_TS, (uint64_t)prev_end_ts);
    be64w(h + IX_END_TS, (uint64_t)prev_end_ts);
    be64w(h + IX_BEGIN_PHY, (uint64_t)prev_end_phy);
    be64w(h + IX_END_PHY, (uint64_t)prev_end_phy);
    be32w(h + IX_SLOTS_USED, 0);
    ix_store32(h + IX_COUNT, 1);
}

/* One entry; the caller checked there is room (count < room_num). */
static void ix_put(const mq_index_map *m, const uint8_t *key, uint32_t len, int64_t phy, int64_t ts_ms) {
    uint8_t *h = m->base;
    uint32_t count = ix_load32(h + IX_COUNT);
    assert(count < m->room_num);
    int32_t kh = ix_key_hash(key, len);
    uint8_t *slot = ix_slot(m, kh);
    uint8_t *e = ix_entry(m, count);
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
    assert(cl && m && m->base && (recs || n == 0) && done_out);
    if (m->slot_num == 0 || m->index_num <= MQ_INDEX_KEYS_MAX || m->room_num > m->index_num) return MQ_E_INVAL;
    uint8_t key[MQ_INDEX_KEY_MAX];
    ix_word words[MQ_INDEX_KEYS_MAX];
    for (uint32_t i = 0; i < n; i++) {
        const mq_scan_rec *r = &recs[i];
        if (r->phy_offset < from || r->props_len == 0 || tx_no_queue(r->sys_flag)) continue;
        const uint8_t *p;
        int rc = mq_commitlog_view_raw(cl, r->phy_offset, r->size, &p);
        if (rc) { *done_out = i; return rc; }
        uint32_t tl = r->topic_len;
        if (tl + 2 > MQ_INDEX_KEY_MAX) continue;
        uint32_t k = ix_keys(p + r->props_offset, r->props_len, tl, words);
        if (k == 0) continue;
        uint32_t count = ix_load32(m->base + IX_COUNT);      /* the file's bytes: no wrap-around */
        if (count > m->room_num || k > m->room_num - count) { *done_out = i; return MQ_E_FULL; }
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
    assert(m && m->base && (key || key_len == 0) && (out || cap == 0) && n_io);
    if (m->slot_num == 0) return MQ_E_INVAL;
    const uint8_t *h = m->base;
    uint32_t count = ix_load32(h + IX_COUNT);
    if (count > m->index_num) return MQ_E_CORRUPT;
    int32_t kh = ix_key_hash(key, key_len);
    uint32_t next = ix_load32(ix_slot(m, kh));
    if ((int32_t)next <= 0 || next > count) return MQ_OK;
    int64_t begin_ts = (int64_t)be64r(h + IX_BEGIN_TS);
    while (*n_io < cap) {
        const uint8_t *e = ix_entry(m, next);
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
