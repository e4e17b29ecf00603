/*
 * fastsend.c -- the hot send path: frames of a read walked, sends staged, appended and
 * answered in C (the contract is fastsend.h's).  The parsers below accept a subset of what
 * Python's decoders accept (mq.wire.remoting): whatever falls outside it is handed back,
 * never guessed, so a frame taken here decodes to the same request in Python.
 */
#include "internal.h"
#include "fastsend.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#define FRAME_SIZE_MAX   16777216u     /* mq.wire.remoting.FRAME_SIZE_MAX: prefix included */
#define CODE_PULL        11
#define CODE_GET_MAX_OFFSET 30
#define CODE_GET_MIN_OFFSET 31
#define CODE_SEND        10
#define CODE_SEND_V2     310
#define RPC_RESPONSE     1
#define RPC_ONEWAY       2
#define PERM_WRITE       2
#define PERM_READ        4
#define PULL_COMMIT_OFFSET 1           /* mq.wire.headers.PULL_* (sysFlag bits) */
#define PULL_SUBSCRIPTION  4
#define CQ_ENTRY_SIZE    20
#define CQ_SCAN_BYTES_MIN 16000        /* mq.broker.pull.CQ_SCAN_BYTES_MIN (RocketMQ's maxFilterMessageCount) */
#define HASH_SLOTS       (2 * MQ_FAST_TOPICS_MAX)     /* power of two, half full at most */
#define GROUP_SLOTS      (2 * MQ_FAST_GROUPS_MAX)
#define CQ_SLOTS         (2 * MQ_FAST_CQ_MAPS_MAX)
#define SUB_SLOTS        (2 * MQ_FAST_SUBS_MAX)
#define SQL_SLOTS        (2 * MQ_FAST_SQL_VERDICTS_MAX)   /* a filter's verdict table */
#define SQL_FILTER_SLOTS (2 * MQ_FAST_SQL_FILTERS_MAX)
#define SQL_SPANS        (MQ_FAST_SQL_CHUNK * 2 * (MQ_FAST_SQL_NAMES_MAX + 1))

_Static_assert(MQ_FAST_MSGS_MAX <= MQ_BATCH_MSGS_MAX, "a run is one group append");
/* an answer's variable part: at most 250 bytes (the JSON form, 11-digit int32s, 20-digit offset) */
_Static_assert(MQ_FAST_ANSWER_MAX >= 256 + MQ_FAST_FIXED_MAX, "an answer fits its slot");

/* LanguageCode names by ordinal (mq.wire.remoting.LANGUAGE_CODES) */
static const char *const LANGUAGES[] = {"JAVA", "CPP", "DOTNET", "PYTHON", "DELPHI", "ERLANG", "RUBY",
                                        "OTHER", "HTTP", "GO", "PHP", "OMS", "RUST"};
#define LANGUAGES_N ((int)(sizeof LANGUAGES / sizeof LANGUAGES[0]))

static int64_t wall_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

typedef struct fast_topic {
    char name[MQ_TOPIC_LEN_MAX + 1];
    uint32_t len;
    int32_t write_queues, read_queues, perm;
    int used;
    uint64_t msgs, bytes;              /* stored since the last take */
} fast_topic;

typedef struct fast_group {
    char name[MQ_FAST_GROUP_LEN_MAX + 1];
    uint32_t len;
    int used;
} fast_group;

typedef struct fast_sub {              /* a heartbeat subscription of (group, topic) */
    uint32_t group_id, topic_id;
    int64_t fresh_until_ns;            /* CLOCK_MONOTONIC: taken before it */
    int64_t sub_version;
    int32_t sql_id;                    /* an SQL92 filter, or -1: the codes */
    uint32_t n_codes;
    int64_t codes[MQ_FAST_CODES_MAX];
} fast_sub;

typedef struct sql_verdict {           /* a filter's verdict for one key; verdict 0: a free slot */
    uint32_t hash, key_at, key_len;
    uint8_t verdict;                   /* 1 false, 2 true */
} sql_verdict;

typedef struct fast_sql {              /* a published SQL92 filter */
    uint8_t *text;                     /* NULL: a free id */
    uint32_t text_len;
    uint8_t names[MQ_FAST_SQL_NAMES_MAX * (MQ_FAST_SQL_NAME_LEN_MAX + 1)];
    uint32_t name_lens[MQ_FAST_SQL_NAMES_MAX];
    uint32_t n_names;
    sql_verdict *slots;                /* SQL_SLOTS of them, allocated with the first verdict */
    uint8_t *keys;                     /* MQ_FAST_SQL_KEYS_BYTES */
    uint32_t keys_used, n_verdicts;
    uint64_t hits, misses;             /* pulls answered here / handed back for a verdict */
} fast_sql;

typedef struct cq_map {                /* a ConsumeQueue file mapped for pulls; base NULL: a free slot */
    const uint8_t *base;
    uint64_t start;                    /* the file's first byte in the queue (its name) */
    uint32_t topic_id;
    int32_t queue_id;
} cq_map;

typedef struct staged {                /* what the answer needs besides the append's outcome */
    uint32_t conn, topic_id, body_len;
    int32_t opaque, version, language, serialize_type, oneway;
    int32_t wait;                      /* WAIT was not "false": under a hold the answer waits */
    int32_t code;                      /* SEND_MESSAGE or SEND_MESSAGE_V2 */
    int64_t t0_ns, t1_ns, ts_us;       /* tracing: frame read, = t0 (no parse stamp: mq_fast_read), wall clock */
    uint8_t born_host[16];
} staged;

struct mq_fast {
    mq_commitlog *cl;
    uint8_t *cluster, *json_fixed, *bin_fixed;
    uint32_t cluster_len, json_fixed_len, bin_fixed_len, max_message_size;
    fast_topic topics[MQ_FAST_TOPICS_MAX];
    uint32_t hash[HASH_SLOTS];         /* topic id + 1, 0: free */
    uint32_t ids_end;                  /* highest published id + 1 */
    uint32_t n;                        /* staged sends */
    mq_group_msg msgs[MQ_FAST_MSGS_MAX];
    staged st[MQ_FAST_MSGS_MAX];
    mq_append_out out[MQ_FAST_MSGS_MAX];
    int32_t rc[MQ_FAST_MSGS_MAX];
    size_t arena_used;
    uint8_t arena[MQ_FAST_ARENA_BYTES];
    int hold;                          /* enum mq_fast_hold */
    int trace;                         /* stamp instants and keep a req row per answered send */
    uint32_t trace_n;                  /* rows kept, MQ_FAST_TRACE_FIELDS values each */
    int64_t trace_rows[MQ_FAST_TRACE_ROWS_MAX * MQ_FAST_TRACE_FIELDS];
    uint32_t pending_head, pending_n;  /* the held answers: a ring, in append order */
    mq_fast_fail pending[MQ_FAST_PENDING_MAX];
    /* pulls (mq_fast_set_pulls); pull_buf 0: off */
    fast_group groups[MQ_FAST_GROUPS_MAX];
    uint32_t group_hash[GROUP_SLOTS];  /* group id + 1, 0: free */
    char *cq_root;
    uint32_t cq_root_len;
    uint64_t cq_file_size;
    uint32_t pull_count_max, pull_bytes_max;
    uint8_t *pull_buf;
    cq_map cq_maps[CQ_SLOTS];
    uint32_t n_cq_maps;
    fast_sql sqls[MQ_FAST_SQL_FILTERS_MAX];
    uint32_t sql_hash[SQL_FILTER_SLOTS];     /* filter id + 1, 0: free */
    int32_t sql_spans[SQL_SPANS];            /* mq_records_props' output for one gather */
    fast_sub subs[MQ_FAST_SUBS_MAX];
    uint32_t sub_hash[SUB_SLOTS];            /* index into subs + 1, 0: free */
    uint32_t n_subs;
};

static void cq_unmap_all(mq_fast *f);

/* ---- the topic table ------------------------------------------------------------------ */

static uint32_t name_hash(const char *s, uint32_t len) {
    uint32_t h = 2166136261u;          /* FNV-1a */
    for (uint32_t i = 0; i < len; i++) h = (h ^ (uint8_t)s[i]) * 16777619u;
    return h;
}

/* The lookup every name table here shares (open addressing, linear probing): `hash` has `slots`
 * entries (a power of two, at most half full, so a free one ends every probe) holding id + 1, 0
 * free; name_of gives the name published under an id.  The id of name s, or -1 with *slot_out the
 * free slot it would take. */
typedef const uint8_t *(*name_of_fn)(const mq_fast *f, uint32_t id, uint32_t *len);

static inline int64_t name_find(const mq_fast *f, const uint32_t *hash, uint32_t slots, name_of_fn name_of,
                                const uint8_t *s, uint32_t len, uint32_t *slot_out) {
    for (uint32_t i = name_hash((const char *)s, len) & (slots - 1);; i = (i + 1) & (slots - 1)) {
        uint32_t v = hash[i];
        if (!v) {
            if (slot_out) *slot_out = i;
            return -1;
        }
        uint32_t n;
        const uint8_t *name = name_of(f, v - 1, &n);
        if (n == len && memcmp(name, s, len) == 0) return v - 1;
    }
}

static const uint8_t *topic_name(const mq_fast *f, uint32_t id, uint32_t *len) {
    *len = f->topics[id].len;
    return (const uint8_t *)f->topics[id].name;
}

static int64_t topic_find(const mq_fast *f, const char *s, uint32_t len, uint32_t *slot_out) {
    return name_find(f, f->hash, HASH_SLOTS, topic_name, (const uint8_t *)s, len, slot_out);
}

int mq_fast_topic_put(mq_fast *f, uint32_t id, const char *topic, uint32_t topic_len,
                      int32_t write_queues, int32_t read_queues, int32_t perm) {
    assert(f && (topic || !topic_len));
    if (id >= MQ_FAST_TOPICS_MAX) return MQ_E_INVAL;
    if (topic_len == 0 || topic_len > MQ_TOPIC_LEN_MAX) return MQ_E_TOPIC_ILLEGAL;
    uint32_t slot = 0;
    int64_t at = topic_find(f, topic, topic_len, &slot);
    if (at >= 0 && (uint32_t)at != id) return MQ_E_TABLE_FULL;
    fast_topic *t = &f->topics[id];
    if (at < 0) {
        if (t->used) return MQ_E_TABLE_FULL;
        memcpy(t->name, topic, topic_len);
        t->len = topic_len;
        t->used = 1;
        t->msgs = t->bytes = 0;
        f->hash[slot] = id + 1;
        if (id + 1 > f->ids_end) f->ids_end = id + 1;
    }
    t->write_queues = write_queues;
    t->read_queues = read_queues;
    t->perm = perm;
    return MQ_OK;
}

int mq_fast_topics_clear(mq_fast *f) {
    assert(f && f->n == 0);            /* staged sends point at the table's names */
    memset(f->topics, 0, sizeof f->topics);
    memset(f->hash, 0, sizeof f->hash);
    f->ids_end = 0;
    cq_unmap_all(f);                   /* keyed by topic id: ids are given again */
    mq_fast_subs_clear(f);             /* so are subscriptions */
    return MQ_OK;
}

static uint8_t *dup_bytes(const uint8_t *p, uint32_t len);

/* ---- the group table (pulls) ------------------------------------------------------------ */

static const uint8_t *group_name(const mq_fast *f, uint32_t id, uint32_t *len) {
    *len = f->groups[id].len;
    return (const uint8_t *)f->groups[id].name;
}

static int64_t group_find(const mq_fast *f, const uint8_t *s, uint32_t len, uint32_t *slot_out) {
    return name_find(f, f->group_hash, GROUP_SLOTS, group_name, s, len, slot_out);
}

int mq_fast_group_put(mq_fast *f, uint32_t id, const char *group, uint32_t group_len) {
    assert(f && (group || !group_len));
    if (id >= MQ_FAST_GROUPS_MAX || group_len == 0 || group_len > MQ_FAST_GROUP_LEN_MAX) return MQ_E_INVAL;
    uint32_t slot = 0;
    int64_t at = group_find(f, (const uint8_t *)group, group_len, &slot);
    if (at >= 0) return (uint32_t)at == id ? MQ_OK : MQ_E_TABLE_FULL;
    fast_group *g = &f->groups[id];
    if (g->used) return MQ_E_TABLE_FULL;
    memcpy(g->name, group, group_len);
    g->len = group_len;
    g->used = 1;
    f->group_hash[slot] = id + 1;
    return MQ_OK;
}

int mq_fast_groups_clear(mq_fast *f) {
    assert(f);
    memset(f->groups, 0, sizeof f->groups);
    memset(f->group_hash, 0, sizeof f->group_hash);
    mq_fast_subs_clear(f);             /* keyed by group id: ids are given again */
    return MQ_OK;
}

/* ---- heartbeat subscriptions (pulls without PULL_SUBSCRIPTION) -------------------------------- */

static uint32_t sub_slot_of(uint32_t group_id, uint32_t topic_id) {
    uint64_t h = ((uint64_t)group_id * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)topic_id * 0xC2B2AE3D27D4EB4Full);
    return (uint32_t)(h >> 32) & (SUB_SLOTS - 1);
}

static fast_sub *sub_find(mq_fast *f, uint32_t group_id, uint32_t topic_id, uint32_t *slot_out) {
    for (uint32_t i = sub_slot_of(group_id, topic_id);; i = (i + 1) & (SUB_SLOTS - 1)) {
        uint32_t v = f->sub_hash[i];
        if (!v) {
            if (slot_out) *slot_out = i;
            return NULL;
        }
        fast_sub *s = &f->subs[v - 1];
        if (s->group_id == group_id && s->topic_id == topic_id) return s;
    }
}

int mq_fast_subs_clear(mq_fast *f) {
    assert(f);
    memset(f->sub_hash, 0, sizeof f->sub_hash);
    f->n_subs = 0;
    return MQ_OK;
}

int mq_fast_sub_put(mq_fast *f, uint32_t group_id, uint32_t topic_id, int64_t fresh_until_ns, int64_t sub_version,
                    const int64_t *codes, uint32_t n_codes, int32_t sql_id) {
    assert(f && (codes || !n_codes));
    if (group_id >= MQ_FAST_GROUPS_MAX || !f->groups[group_id].used || topic_id >= MQ_FAST_TOPICS_MAX
        || !f->topics[topic_id].used || n_codes > MQ_FAST_CODES_MAX
        || (sql_id >= 0 && (n_codes || sql_id >= MQ_FAST_SQL_FILTERS_MAX || !f->sqls[sql_id].text)) || sql_id < -1)
        return MQ_E_INVAL;
    for (uint32_t i = 1; i < n_codes; i++)
        if (codes[i] <= codes[i - 1]) return MQ_E_INVAL;       /* the gather's filter: sorted, distinct */
    uint32_t slot = 0;
    fast_sub *s = sub_find(f, group_id, topic_id, &slot);
    if (!s) {
        if (f->n_subs >= MQ_FAST_SUBS_MAX) {
            mq_fast_subs_clear(f);
            sub_find(f, group_id, topic_id, &slot);
        }
        s = &f->subs[f->n_subs++];
        f->sub_hash[slot] = f->n_subs;
    }
    s->group_id = group_id;
    s->topic_id = topic_id;
    s->fresh_until_ns = fresh_until_ns;
    s->sub_version = sub_version;
    s->sql_id = sql_id;
    s->n_codes = n_codes;
    if (n_codes) memcpy(s->codes, codes, n_codes * sizeof *codes);
    return MQ_OK;
}

/* ---- SQL92 filters (pulls) -------------------------------------------------------------- */

static const uint8_t *sql_text(const mq_fast *f, uint32_t id, uint32_t *len) {
    *len = f->sqls[id].text_len;
    return f->sqls[id].text;
}

static int64_t sql_find(const mq_fast *f, const uint8_t *s, uint32_t len, uint32_t *slot_out) {
    return name_find(f, f->sql_hash, SQL_FILTER_SLOTS, sql_text, s, len, slot_out);
}

int mq_fast_sql_put(mq_fast *f, uint32_t id, const uint8_t *text, uint32_t text_len, const uint8_t *names,
                    const uint32_t *name_lens, uint32_t n_names) {
    assert(f && (text || !text_len) && (names || !n_names) && (name_lens || !n_names));
    if (id >= MQ_FAST_SQL_FILTERS_MAX || text_len == 0 || text_len > MQ_FAST_SUB_TEXT_MAX
        || n_names > MQ_FAST_SQL_NAMES_MAX)
        return MQ_E_INVAL;
    size_t names_len = 0;
    for (uint32_t j = 0; j < n_names; j++) {
        if (name_lens[j] < 2 || name_lens[j] > MQ_FAST_SQL_NAME_LEN_MAX + 1) return MQ_E_INVAL;
        names_len += name_lens[j];
    }
    uint32_t slot = 0;
    int64_t at = sql_find(f, text, text_len, &slot);
    if (at >= 0) return (uint32_t)at == id ? MQ_OK : MQ_E_TABLE_FULL;
    fast_sql *q = &f->sqls[id];
    if (q->text) return MQ_E_TABLE_FULL;
    if (!(q->text = dup_bytes(text, text_len))) return MQ_E_IO;
    q->text_len = text_len;
    if (names_len) memcpy(q->names, names, names_len);
    if (n_names) memcpy(q->name_lens, name_lens, n_names * sizeof *name_lens);
    q->n_names = n_names;
    f->sql_hash[slot] = id + 1;
    return MQ_OK;
}

static void sql_drop_verdicts(fast_sql *q) {
    if (q->slots) memset(q->slots, 0, SQL_SLOTS * sizeof *q->slots);
    q->keys_used = q->n_verdicts = 0;
}

/* The verdict of filter q for key: 1 true, 0 false, -1 none kept. */
static int sql_lookup(const fast_sql *q, const uint8_t *key, uint32_t key_len) {
    if (!q->slots) return -1;
    uint32_t h = name_hash((const char *)key, key_len);
    for (uint32_t i = h & (SQL_SLOTS - 1);; i = (i + 1) & (SQL_SLOTS - 1)) {
        const sql_verdict *v = &q->slots[i];
        if (!v->verdict) return -1;
        if (v->hash == h && v->key_len == key_len && (!key_len || memcmp(q->keys + v->key_at, key, key_len) == 0))
            return v->verdict == 2;
    }
}

int mq_fast_sql_verdict(mq_fast *f, uint32_t id, const uint8_t *key, uint32_t key_len, int verdict) {
    assert(f && (key || !key_len));
    if (id >= MQ_FAST_SQL_FILTERS_MAX || !f->sqls[id].text || key_len > MQ_FAST_SQL_KEY_MAX) return MQ_E_INVAL;
    fast_sql *q = &f->sqls[id];
    if (!q->slots) {
        q->slots = calloc(SQL_SLOTS, sizeof *q->slots);
        q->keys = malloc(MQ_FAST_SQL_KEYS_BYTES);
        if (!q->slots || !q->keys) {
            free(q->slots);
            free(q->keys);
            q->slots = NULL;
            q->keys = NULL;
            return MQ_E_IO;
        }
    }
    if (sql_lookup(q, key, key_len) >= 0) return MQ_OK;         /* a verdict never changes */
    if (q->n_verdicts >= MQ_FAST_SQL_VERDICTS_MAX || key_len > MQ_FAST_SQL_KEYS_BYTES - q->keys_used)
        sql_drop_verdicts(q);
    uint32_t h = name_hash((const char *)key, key_len), i = h & (SQL_SLOTS - 1);
    while (q->slots[i].verdict) i = (i + 1) & (SQL_SLOTS - 1);  /* half full at most: a free slot */
    if (key_len) memcpy(q->keys + q->keys_used, key, key_len);
    q->slots[i] = (sql_verdict){.hash = h, .key_at = q->keys_used, .key_len = key_len,
                                .verdict = (uint8_t)(verdict ? 2 : 1)};
    q->keys_used += key_len;
    q->n_verdicts++;
    return MQ_OK;
}

int mq_fast_sql_clear(mq_fast *f) {
    assert(f);
    for (uint32_t i = 0; i < MQ_FAST_SQL_FILTERS_MAX; i++) {
        fast_sql *q = &f->sqls[i];
        free(q->text);
        free(q->slots);
        free(q->keys);
        memset(q, 0, sizeof *q);
    }
    memset(f->sql_hash, 0, sizeof f->sql_hash);
    mq_fast_subs_clear(f);             /* they name filters by id */
    return MQ_OK;
}

/* ---- ConsumeQueue files (pulls) ---------------------------------------------------------- */

static void cq_unmap_all(mq_fast *f) {
    for (uint32_t i = 0; i < CQ_SLOTS; i++)
        if (f->cq_maps[i].base) munmap((void *)f->cq_maps[i].base, f->cq_file_size);
    memset(f->cq_maps, 0, sizeof f->cq_maps);
    f->n_cq_maps = 0;
}

static uint32_t cq_slot_of(uint32_t topic_id, int32_t queue_id, uint64_t file_index) {
    uint64_t h = ((uint64_t)topic_id * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)(uint32_t)queue_id * 0xC2B2AE3D27D4EB4Full)
               ^ (file_index * 0x165667B19E3779F9ull);
    return (uint32_t)(h >> 32) & (CQ_SLOTS - 1);
}

/* The mapping of the ConsumeQueue file of (topic, queue) that starts at byte `start`, mapped
 * now if it is not yet: NULL when the file is missing or not of the queue's file size (the
 * pull is Python's then). */
static const uint8_t *cq_file(mq_fast *f, uint32_t topic_id, int32_t queue_id, uint64_t start) {
    uint32_t i = cq_slot_of(topic_id, queue_id, start / f->cq_file_size);
    for (;; i = (i + 1) & (CQ_SLOTS - 1)) {
        const cq_map *m = &f->cq_maps[i];
        if (!m->base) break;
        if (m->topic_id == topic_id && m->queue_id == queue_id && m->start == start) return m->base;
    }
    if (f->n_cq_maps >= MQ_FAST_CQ_MAPS_MAX) {
        cq_unmap_all(f);
        i = cq_slot_of(topic_id, queue_id, start / f->cq_file_size);
    }
    const fast_topic *t = &f->topics[topic_id];
    char path[PATH_MAX];
    int n = snprintf(path, sizeof path, "%.*s/%.*s/%d/%020llu", (int)f->cq_root_len, f->cq_root, (int)t->len,
                     t->name, (int)queue_id, (unsigned long long)start);
    if (n < 0 || (size_t)n >= sizeof path) return NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return NULL;
    struct stat st;
    void *p = MAP_FAILED;
    if (fstat(fd, &st) == 0 && (uint64_t)st.st_size == f->cq_file_size)
        p = mmap(NULL, f->cq_file_size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return NULL;
    f->cq_maps[i] = (cq_map){.base = p, .start = start, .topic_id = topic_id, .queue_id = queue_id};
    f->n_cq_maps++;
    return p;
}

int mq_fast_set_pulls(mq_fast *f, const char *cq_root, uint32_t cq_root_len, uint64_t cq_file_size,
                      uint32_t count_max, uint32_t bytes_max, uint8_t *buf, size_t buf_cap) {
    assert(f);
    cq_unmap_all(f);                   /* the file size or the root may change under them */
    free(f->cq_root);
    f->cq_root = NULL;
    f->pull_buf = NULL;
    if (bytes_max == 0) return MQ_OK;
    if (!cq_root || cq_root_len == 0 || cq_root_len > PATH_MAX / 2 || cq_file_size == 0
        || cq_file_size % CQ_ENTRY_SIZE || count_max == 0
        || (uint64_t)bytes_max + MQ_FAST_PULL_HEADER_ROOM > FRAME_SIZE_MAX
        || !buf || buf_cap < (size_t)bytes_max + MQ_FAST_PULL_HEADER_ROOM)
        return MQ_E_INVAL;
    if (!(f->cq_root = (char *)dup_bytes((const uint8_t *)cq_root, cq_root_len))) return MQ_E_IO;
    f->cq_root_len = cq_root_len;
    f->cq_file_size = cq_file_size;
    f->pull_count_max = count_max;
    f->pull_bytes_max = bytes_max;
    f->pull_buf = buf;
    return MQ_OK;
}

int mq_fast_take_counts(mq_fast *f, uint64_t *msgs, uint64_t *bytes, uint32_t cap, uint32_t *n_out) {
    assert(f && (cap == 0 || (msgs && bytes)) && n_out);
    uint32_t n = f->ids_end < cap ? f->ids_end : cap;
    for (uint32_t i = 0; i < n; i++) {
        msgs[i] = f->topics[i].msgs;
        bytes[i] = f->topics[i].bytes;
        f->topics[i].msgs = f->topics[i].bytes = 0;
    }
    *n_out = n;
    return MQ_OK;
}

/* ---- open / close ----------------------------------------------------------------------- */

static uint8_t *dup_bytes(const uint8_t *p, uint32_t len) {
    uint8_t *d = malloc(len ? len : 1);
    if (d && len) memcpy(d, p, len);
    return d;
}

int mq_fast_open(mq_commitlog *cl, const mq_fast_opts *o, mq_fast **out) {
    assert(cl && o && out);
    if (o->json_fixed_len > MQ_FAST_FIXED_MAX || o->bin_fixed_len > MQ_FAST_FIXED_MAX
        || o->cluster_prop_len == 0 || o->cluster_prop_len > MQ_PROPS_LEN_MAX)
        return MQ_E_INVAL;
    mq_fast *f = calloc(1, sizeof *f);
    if (!f) return MQ_E_IO;
    f->cl = cl;
    f->cluster = dup_bytes(o->cluster_prop, o->cluster_prop_len);
    f->json_fixed = dup_bytes(o->json_fixed, o->json_fixed_len);
    f->bin_fixed = dup_bytes(o->bin_fixed, o->bin_fixed_len);
    if (!f->cluster || !f->json_fixed || !f->bin_fixed) {
        mq_fast_close(f);
        return MQ_E_IO;
    }
    f->cluster_len = o->cluster_prop_len;
    f->json_fixed_len = o->json_fixed_len;
    f->bin_fixed_len = o->bin_fixed_len;
    f->max_message_size = o->max_message_size;
    *out = f;
    return MQ_OK;
}

void mq_fast_close(mq_fast *f) {
    if (!f) return;
    cq_unmap_all(f);
    mq_fast_sql_clear(f);
    free(f->cq_root);
    free(f->cluster);
    free(f->json_fixed);
    free(f->bin_fixed);
    free(f);
}

mq_commitlog *fast_commitlog(mq_fast *f) {
    assert(f);
    return f->cl;
}

const uint8_t *fast_pull_buf(const mq_fast *f) {
    assert(f && f->pull_buf);
    return f->pull_buf;
}

uint32_t mq_fast_trace_kept(const mq_fast *f) {
    assert(f);
    return f->trace_n;
}

uint32_t mq_fast_staged(mq_fast *f) {
    assert(f);
    return f->n;
}

/* ---- text ------------------------------------------------------------------------------- */

/* The length of the well-formed UTF-8 sequence at p (< end) whose lead byte is >= 0x80, or 0
 * (Python's strict decoder: no overlongs, no surrogates, nothing past U+10FFFF). */
static int utf8_seq(const uint8_t *p, const uint8_t *end) {
    uint8_t c = p[0];
    int n;
    uint8_t lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) n = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else return 0;
    if (end - p < n) return 0;
    if (p[1] < lo || p[1] > hi) return 0;
    for (int i = 2; i < n; i++)
        if (p[i] < 0x80 || p[i] > 0xBF) return 0;
    return n;
}

static int utf8_ok(const uint8_t *p, size_t len) {
    const uint8_t *end = p + len;
    while (p < end) {
        if (*p < 0x80) { p++; continue; }
        int n = utf8_seq(p, end);
        if (!n) return 0;
        p += n;
    }
    return 1;
}

/* A decimal string as Python's int() reads the plain ones: optional '-', 1 to 19 digits, in
 * [lo, hi]; an empty string is 0 (the send path's "absent").  0: not taken (hand back). */
static int parse_dec(const uint8_t *p, uint32_t len, int64_t lo, int64_t hi, int64_t *v) {
    if (len == 0) { *v = 0; return 1; }
    int neg = p[0] == '-';
    uint32_t i = neg;
    if (i == len || len - i > 19) return 0;
    uint64_t acc = 0;
    for (; i < len; i++) {
        if (p[i] < '0' || p[i] > '9') return 0;
        acc = acc * 10 + (p[i] - '0');
    }
    if (acc > (uint64_t)INT64_MAX + (uint64_t)neg) return 0;
    int64_t x = neg ? (int64_t)(0 - acc) : (int64_t)acc;
    if (x < lo || x > hi) return 0;
    *v = x;
    return 1;
}

/* ---- the fields of a send header ---------------------------------------------------------- */

/* a send's fields (F_TOPIC..F_RECONSUME), then a pull's own (topic, queueId and sysFlag shared) */
enum { F_TOPIC, F_QID, F_PROPS, F_BATCH, F_SYSFLAG, F_BORN, F_FLAG, F_RECONSUME, F_SEND_N,
       F_GROUP = F_SEND_N, F_QOFFSET, F_MAXNUMS, F_COMMIT, F_SUSPEND, F_SUBVER, F_SUB, F_EXPR, F_N };
/* the long names, and SEND_MESSAGE_V2's letters of a send's (mq.wire.headers.SEND_V2_FIELDS), per F_* */
#define LONG_NAME_LIST X("topic") X("queueId") X("properties") X("batch") X("sysFlag") X("bornTimestamp") \
    X("flag") X("reconsumeTimes") X("consumerGroup") X("queueOffset") X("maxMsgNums") X("commitOffset") \
    X("suspendTimeoutMillis") X("subVersion") X("subscription") X("expressionType")
#define X(name) name,
static const char *const LONG_NAMES[F_N] = {LONG_NAME_LIST};
#undef X
#define X(name) sizeof(name) - 1,
static const uint8_t LONG_LENS[F_N] = {LONG_NAME_LIST};
#undef X
#undef LONG_NAME_LIST
static const char LETTERS[F_SEND_N] = {'b', 'e', 'i', 'm', 'f', 'g', 'h', 'j'};

typedef struct fval {
    const uint8_t *p;                  /* the raw text (JSON: between the quotes, or the token) */
    uint32_t len;
    uint8_t seen;                      /* the key came (a second time: hand back) */
    uint8_t present;                   /* with a value (JSON null: absent, as Python drops it) */
    uint8_t escaped;                   /* JSON: the string holds escapes */
} fval;

typedef struct fields {
    fval lng[F_N], let[F_SEND_N];
    int has_ext;
} fields;

/* The field slot of key k, or NULL when it is none of ours. */
static fval *field_of(fields *fs, const uint8_t *k, uint32_t len) {
    if (len == 1) {
        for (int i = 0; i < F_SEND_N; i++)
            if (k[0] == (uint8_t)LETTERS[i]) return &fs->let[i];
        return NULL;
    }
    for (int i = 0; i < F_N; i++)
        if (LONG_LENS[i] == len && memcmp(LONG_NAMES[i], k, len) == 0) return &fs->lng[i];
    return NULL;
}

typedef struct req {
    int32_t code, opaque, version, flag, language, serialize_type;
    int64_t t0_ns, t1_ns, ts_us;       /* tracing (0 when off) */
    fields fs;
} req;

/* ---- ROCKETMQ header --------------------------------------------------------------------- */

static int parse_binary(const uint8_t *h, uint32_t size, req *r) {
    if (size < 21) return 0;
    r->code = (int16_t)be16r(h);
    r->language = h[2];
    r->version = (int16_t)be16r(h + 3);
    r->opaque = (int32_t)be32r(h + 5);
    r->flag = (int32_t)be32r(h + 9);
    int32_t remark = (int32_t)be32r(h + 13);
    uint32_t pos = 17;
    if (remark < 0 || (uint32_t)remark > size - pos - 4) return 0;
    if (!utf8_ok(h + pos, (uint32_t)remark)) return 0;
    pos += (uint32_t)remark;
    int32_t ext = (int32_t)be32r(h + pos);
    pos += 4;
    if (ext <= 0 || (uint32_t)ext > size - pos) return 0;      /* no extFields: Python's */
    uint32_t end = pos + (uint32_t)ext;
    while (pos < end) {
        if (end - pos < 2) return 0;
        int16_t klen = (int16_t)be16r(h + pos);
        pos += 2;
        if (klen < 0 || (uint32_t)klen + 4 > end - pos) return 0;
        const uint8_t *k = h + pos;
        pos += (uint32_t)klen;
        int32_t vlen = (int32_t)be32r(h + pos);
        pos += 4;
        if (vlen < 0 || (uint32_t)vlen > end - pos) return 0;
        if (!utf8_ok(k, (uint32_t)klen) || !utf8_ok(h + pos, (uint32_t)vlen)) return 0;
        fval *fv = field_of(&r->fs, k, (uint32_t)klen);
        if (fv) {
            if (fv->seen) return 0;
            *fv = (fval){.p = h + pos, .len = (uint32_t)vlen, .seen = 1, .present = 1};
        }
        pos += (uint32_t)vlen;
    }
    r->fs.has_ext = 1;
    return 1;
}

/* ---- JSON header ------------------------------------------------------------------------- */

typedef struct jcur {
    const uint8_t *p, *end;
} jcur;

static void jws(jcur *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r')) c->p++;
}

static int hexv(uint8_t c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* The first byte at or after p that a JSON string cannot pass over as it is -- a quote, a
 * backslash, a control byte (< 0x20) or the start of a multi-byte UTF-8 sequence (>= 0x80) --
 * or end.  Sixteen bytes a step with SSE2: as signed bytes, < 0x20 holds both 0x00-0x1F and
 * 0x80-0xFF, so three compares find all four kinds (a header's strings are mostly plain). */
static inline const uint8_t *jplain(const uint8_t *p, const uint8_t *end) {
#ifdef __SSE2__
    const __m128i quote = _mm_set1_epi8('"'), bslash = _mm_set1_epi8('\\'), space = _mm_set1_epi8(0x20);
    while (end - p >= 16) {
        const __m128i x = _mm_loadu_si128((const __m128i *)p);
        const __m128i hit = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(x, quote), _mm_cmpeq_epi8(x, bslash)),
                                         _mm_cmplt_epi8(x, space));
        const unsigned mask = (unsigned)_mm_movemask_epi8(hit);
        if (mask) return p + __builtin_ctz(mask);
        p += 16;
    }
#endif
    while (p < end && *p != '"' && *p != '\\' && *p >= 0x20 && *p < 0x80) p++;
    return p;
}

/* A string at c->p (its opening quote): checked, *s and *len its raw inside, *esc whether it has
 * escapes; the cursor past the closing quote.  Escapes \u beyond 0x7F are not taken. */
static int jstr(jcur *c, const uint8_t **s, uint32_t *len, uint8_t *esc) {
    if (c->p >= c->end || *c->p != '"') return 0;
    const uint8_t *p = ++c->p, *end = c->end;
    *esc = 0;
    while ((p = jplain(p, end)) < end) {
        uint8_t ch = *p;
        if (ch == '"') {
            *s = c->p;
            *len = (uint32_t)(p - c->p);
            c->p = p + 1;
            return 1;
        }
        if (ch < 0x20) return 0;
        if (ch == '\\') {
            if (end - p < 2) return 0;
            uint8_t e = p[1];
            *esc = 1;
            if (e == 'u') {
                if (end - p < 6) return 0;
                int a = hexv(p[2]), b = hexv(p[3]), cc = hexv(p[4]), d = hexv(p[5]);
                if (a < 0 || b < 0 || cc < 0 || d < 0) return 0;
                if (a || b || cc > 7) return 0;        /* beyond ASCII: Python's */
                p += 6;
            } else if (e == '"' || e == '\\' || e == '/' || e == 'b' || e == 'f' || e == 'n' || e == 'r' || e == 't') {
                p += 2;
            } else return 0;
            continue;
        }
        /* ch >= 0x80 (jplain stops at nothing else) */
        int n = utf8_seq(p, end);
        if (!n) return 0;
        p += n;
    }
    return 0;
}

/* Unescapes a string jstr checked into out (at most len bytes); returns the length. */
static uint32_t junescape(const uint8_t *s, uint32_t len, uint8_t *out) {
    uint32_t o = 0;
    for (uint32_t i = 0; i < len;) {
        const uint8_t *bs = memchr(s + i, '\\', len - i);
        const uint32_t run = bs ? (uint32_t)(bs - (s + i)) : len - i;
        memcpy(out + o, s + i, run);
        o += run;
        i += run;
        if (i == len) break;
        uint8_t e = s[i + 1];
        switch (e) {
        case 'u': out[o++] = (uint8_t)(hexv(s[i + 4]) * 16 + hexv(s[i + 5])); i += 6; continue;
        case 'b': out[o++] = '\b'; break;
        case 'f': out[o++] = '\f'; break;
        case 'n': out[o++] = '\n'; break;
        case 'r': out[o++] = '\r'; break;
        case 't': out[o++] = '\t'; break;
        default: out[o++] = e; break;  /* " \ / */
        }
        i += 2;
    }
    return o;
}

/* A JSON integer token (no fraction, no exponent, no leading zero) as text, the text Python's
 * str() of it gives: not -0 (Python reads 0), at most 19 digits (longer ones Python reads
 * differently or, past 4300 digits, refuses); 0: not taken. */
static int jint_tok(jcur *c, const uint8_t **s, uint32_t *len) {
    const uint8_t *p = c->p, *end = c->end;
    const uint8_t *start = p;
    if (p < end && *p == '-') p++;
    if (p >= end || *p < '0' || *p > '9') return 0;
    if (*p == '0' && p + 1 < end && p[1] >= '0' && p[1] <= '9') return 0;
    if (*p == '0' && p != start) return 0;            /* -0 */
    const uint8_t *digits = p;
    while (p < end && *p >= '0' && *p <= '9') p++;
    if (p - digits > 19) return 0;
    if (p < end && (*p == '.' || *p == 'e' || *p == 'E')) return 0;
    *s = start;
    *len = (uint32_t)(p - start);
    c->p = p;
    return 1;
}

static int jlit(jcur *c, const char *lit) {
    size_t n = strlen(lit);
    if ((size_t)(c->end - c->p) < n || memcmp(c->p, lit, n) != 0) return 0;
    c->p += n;
    return 1;
}

/* An int32 member value: *v (null: the default, left as is). */
static int jint32(jcur *c, int32_t *v) {
    if (jlit(c, "null")) return 1;
    const uint8_t *s;
    uint32_t len;
    int64_t x;
    if (!jint_tok(c, &s, &len) || !parse_dec(s, len, INT32_MIN, INT32_MAX, &x)) return 0;
    *v = (int32_t)x;
    return 1;
}

/* Skips a scalar value (string, number, true, false, null). */
static int jskip_scalar(jcur *c) {
    const uint8_t *s;
    uint32_t len;
    uint8_t esc;
    if (c->p >= c->end) return 0;
    if (*c->p == '"') return jstr(c, &s, &len, &esc);
    if (jlit(c, "true") || jlit(c, "false") || jlit(c, "null")) return 1;
    if (!jint_tok(c, &s, &len)) return 0;      /* a fraction or exponent: not taken */
    return 1;
}

static int jext(jcur *c, req *r) {
    if (jlit(c, "null")) return 0;             /* extFields null: Python's */
    if (c->p >= c->end || *c->p != '{') return 0;
    c->p++;
    jws(c);
    if (c->p < c->end && *c->p == '}') { c->p++; r->fs.has_ext = 1; return 1; }
    for (;;) {
        const uint8_t *k, *s;
        uint32_t klen, len;
        uint8_t kesc, esc = 0;
        jws(c);
        if (!jstr(c, &k, &klen, &kesc) || kesc) return 0;
        jws(c);
        if (c->p >= c->end || *c->p != ':') return 0;
        c->p++;
        jws(c);
        fval *fv = field_of(&r->fs, k, klen);
        int present = 1;
        if (c->p < c->end && *c->p == '"') {
            if (!jstr(c, &s, &len, &esc)) return 0;
        } else if (jlit(c, "true")) {
            s = (const uint8_t *)"true", len = 4;
        } else if (jlit(c, "false")) {
            s = (const uint8_t *)"false", len = 5;
        } else if (jlit(c, "null")) {
            s = NULL, len = 0, present = 0;
        } else if (!jint_tok(c, &s, &len)) return 0;
        if (fv) {
            if (fv->seen) return 0;
            *fv = (fval){.p = s, .len = len, .seen = 1, .present = (uint8_t)present, .escaped = esc};
        }
        jws(c);
        if (c->p >= c->end) return 0;
        if (*c->p == ',') { c->p++; continue; }
        if (*c->p == '}') { c->p++; break; }
        return 0;
    }
    r->fs.has_ext = 1;
    return 1;
}

static int parse_json(const uint8_t *h, uint32_t size, req *r) {
    jcur c = {h, h + size};
    unsigned seen = 0;                         /* bit per top-level key of ours */
    r->language = 0;                           /* JAVA when absent */
    jws(&c);
    if (c.p >= c.end || *c.p != '{') return 0;
    c.p++;
    jws(&c);
    if (c.p < c.end && *c.p == '}') return 0;  /* no code, no extFields */
    for (;;) {
        const uint8_t *k;
        uint32_t klen;
        uint8_t kesc;
        jws(&c);
        if (!jstr(&c, &k, &klen, &kesc) || kesc) return 0;
        jws(&c);
        if (c.p >= c.end || *c.p != ':') return 0;
        c.p++;
        jws(&c);
#define KEY(lit) (klen == sizeof(lit) - 1 && memcmp(k, lit, klen) == 0)
        unsigned bit = KEY("code") ? 1 : KEY("extFields") ? 2 : KEY("flag") ? 4 : KEY("language") ? 8
                     : KEY("opaque") ? 16 : KEY("version") ? 32 : KEY("remark") ? 64 : 0;
#undef KEY
        if (bit & seen) return 0;
        seen |= bit;
        int ok;
        switch (bit) {
        case 1: ok = jint32(&c, &r->code); break;
        case 2: ok = jext(&c, r); break;
        case 4: ok = jint32(&c, &r->flag); break;
        case 16: ok = jint32(&c, &r->opaque); break;
        case 32: ok = jint32(&c, &r->version); break;
        case 8: {
            const uint8_t *s;
            uint32_t len;
            uint8_t esc;
            int32_t ord = 0;
            ok = 0;
            if (c.p < c.end && *c.p == '"') {
                if (jstr(&c, &s, &len, &esc) && !esc)
                    for (int i = 0; i < LANGUAGES_N; i++)
                        if (strlen(LANGUAGES[i]) == len && memcmp(LANGUAGES[i], s, len) == 0) {
                            r->language = i;
                            ok = 1;
                        }
            } else if (jint32(&c, &ord) && ord >= 0 && ord < LANGUAGES_N) {
                r->language = ord;             /* null leaves JAVA, as Python */
                ok = 1;
            }
            break;
        }
        default: ok = jskip_scalar(&c); break; /* remark, serializeTypeCurrentRPC, others */
        }
        if (!ok) return 0;
        jws(&c);
        if (c.p >= c.end) return 0;
        if (*c.p == ',') { c.p++; continue; }
        if (*c.p == '}') { c.p++; break; }
        return 0;
    }
    jws(&c);
    return c.p == c.end && (seen & 1) && r->fs.has_ext;
}

/* ---- taking one send ---------------------------------------------------------------------- */

/* Looks at every 0x01 (a property's name/value separator) of props once, with the text that
 * ends there: 1 when one ends "DELAY", "CLUSTER" or "TRAN_MSG" (the send is Python's), else 0
 * with *wait the start of the first "WAIT" + 0x01 (NULL: none).  The same answers as a search
 * for each name + 0x01 in turn: every match of one ends at a 0x01, and the first "WAIT" match
 * is the one at the first 0x01 with WAIT before it. */
static int props_scan(const uint8_t *p, size_t len, const uint8_t **wait) {
    const uint8_t *end = p + len, *q = p;
    *wait = NULL;
    while ((q = memchr(q, 0x01, (size_t)(end - q))) != NULL) {
        const size_t before = (size_t)(q - p);
#define ENDS(lit) (before >= sizeof(lit) - 1 && memcmp(q - (sizeof(lit) - 1), lit, sizeof(lit) - 1) == 0)
        if (ENDS("DELAY") || ENDS("CLUSTER") || ENDS("TRAN_MSG")) return 1;
        if (!*wait && ENDS("WAIT")) *wait = q - 4;
#undef ENDS
        q++;
    }
    return 0;
}

/* A field's text, unescaped into buf when it holds escapes (at most cap bytes): 0 when not taken. */
static int field_text(const fval *v, uint8_t *buf, uint32_t cap, const uint8_t **s, uint32_t *len) {
    if (!v->escaped) {
        *s = v->p;
        *len = v->len;
        return 1;
    }
    if (v->len > cap) return 0;
    *len = junescape(v->p, v->len, buf);
    *s = buf;
    return 1;
}

static int field_int(const fval *v, int64_t lo, int64_t hi, int64_t *x) {
    if (!v->present) { *x = 0; return 1; }
    uint8_t buf[64];
    const uint8_t *s;
    uint32_t len;
    return field_text(v, buf, sizeof buf, &s, &len) && parse_dec(s, len, lo, hi, x);
}

/* Stages the send of request r with body [body, body + body_len): 1 taken, 0 not (hand back),
 * -1 the stage has no room left (nothing staged). */
static int take_send(mq_fast *f, const req *r, const uint8_t *body, uint32_t body_len, uint32_t conn,
                     const uint8_t *born_host, uint32_t born_host_len, int32_t born_port) {
    const fields *fs = &r->fs;
    int v2 = fs->let[F_TOPIC].present && !fs->lng[F_TOPIC].present;     /* mq.wire.headers.is_send_v2 */
    const fval *F = v2 ? fs->let : fs->lng;
    if (!F[F_TOPIC].present || F[F_TOPIC].len == 0 || F[F_TOPIC].escaped || body_len == 0) return 0;
    if (F[F_BATCH].present) {
        const fval *b = &F[F_BATCH];
        if (b->escaped) return 0;
        if (!(b->len == 0 || (b->len == 1 && b->p[0] == '0') || (b->len == 5 && memcmp(b->p, "false", 5) == 0)))
            return 0;
    }
    int64_t id = topic_find(f, (const char *)F[F_TOPIC].p, F[F_TOPIC].len, NULL);
    if (id < 0) return 0;
    const fast_topic *t = &f->topics[id];
    int64_t qid, sys_flag, born_ts, flag, reconsume;
    if (!F[F_QID].present || !field_int(&F[F_QID], 0, INT32_MAX, &qid) || F[F_QID].len == 0) return 0;
    if (!field_int(&F[F_SYSFLAG], INT32_MIN, INT32_MAX, &sys_flag)
        || !field_int(&F[F_BORN], INT64_MIN, INT64_MAX, &born_ts)
        || !field_int(&F[F_FLAG], INT32_MIN, INT32_MAX, &flag)
        || !field_int(&F[F_RECONSUME], INT32_MIN, INT32_MAX, &reconsume))
        return 0;
    int32_t queues = t->read_queues > t->write_queues ? t->read_queues : t->write_queues;
    if (qid >= queues || !(t->perm & PERM_WRITE)) return 0;
    if (f->n >= MQ_FAST_MSGS_MAX) return -1;
    if (f->hold != MQ_FAST_ANSWER_NOW && f->n + f->pending_n >= MQ_FAST_PENDING_MAX)
        return 0;                      /* no room to hold its answer: Python's path waits for it */
    /* the properties, unescaped into the arena, WAIT cut */
    const fval *pv = &F[F_PROPS];
    uint32_t plen = 0;
    int wait = 1;
    uint8_t *props = f->arena + f->arena_used;
    if (pv->present && pv->len) {
        if (pv->len > MQ_FAST_ARENA_BYTES - f->arena_used) return f->n ? -1 : 0;
        plen = pv->escaped ? junescape(pv->p, pv->len, props) : (memcpy(props, pv->p, pv->len), pv->len);
        const uint8_t *w;
        if (props_scan(props, plen, &w)) return 0;
        if (w) {
            size_t at = (size_t)(w - props);
            if (at && props[at - 1] != 0x02) return 0;
            const uint8_t *stop = memchr(w, 0x02, plen - at);
            size_t cut_end = stop ? (size_t)(stop - props) + 1 : plen;
            size_t vlen = (stop ? (size_t)(stop - props) : plen) - at - 5;
            wait = !(vlen == 5 && memcmp(w + 5, "false", 5) == 0);
            memmove(props + at, props + cut_end, plen - cut_end);
            plen -= (uint32_t)(cut_end - at);
            const uint8_t *again;
            if (props_scan(props, plen, &again) || again) return 0;     /* (no DELAY etc. was there before) */
        }
    }
    uint32_t i = f->n;
    staged *s = &f->st[i];
    *s = (staged){.conn = conn, .topic_id = (uint32_t)id, .body_len = body_len, .opaque = r->opaque,
                  .version = r->version, .language = r->language, .serialize_type = r->serialize_type,
                  .oneway = (r->flag & RPC_ONEWAY) != 0, .wait = wait, .code = r->code, .t0_ns = r->t0_ns,
                  .t1_ns = r->t1_ns, .ts_us = r->ts_us};
    memcpy(s->born_host, born_host, born_host_len);
    f->msgs[i] = (mq_group_msg){
        .topic = t->name, .born_host = s->born_host, .body = body, .props = plen ? props : NULL,
        .extra_props = f->cluster, .born_ts_ms = born_ts, .topic_len = t->len, .queue_id = (int32_t)qid,
        .sys_flag = (int32_t)sys_flag, .flag = (int32_t)flag, .reconsume_times = (int32_t)reconsume,
        .born_port = born_port, .born_host_len = born_host_len, .body_len = body_len, .props_len = plen,
        .extra_props_len = f->cluster_len,
    };
    f->arena_used += plen;
    f->n = i + 1;
    return 1;
}

/* ---- answering one pull ------------------------------------------------------------------- */

static uint8_t *put_lit(uint8_t *p, const char *s);
static uint8_t *put_dec(uint8_t *p, int64_t v);
static uint8_t *put_bin_entry(uint8_t *p, const char *k, const uint8_t *v, uint32_t vlen);
static uint8_t *put_bin_head(uint8_t *q, int32_t language, int32_t version, int32_t opaque, const char *remark);
static uint8_t *put_json_tail(uint8_t *q, int32_t language, int32_t opaque, const char *remark, int32_t version);

/* An optional integer field as the pull path reads it (`int(v) if v else dflt`): absent or empty
 * is dflt; otherwise a plain decimal in [lo, hi].  0: not taken. */
static int field_int_or(const fval *v, int64_t lo, int64_t hi, int64_t dflt, int64_t *x) {
    if (!v->present || v->len == 0) { *x = dflt; return 1; }
    return field_int(v, lo, hi, x);
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* The tag filter of a TAG subscription as mq.broker.pull.parse_subscription makes it: 1 with
 * *n_out codes (sorted, distinct; 0: every message), 0 when the text is not one taken here. */
static int sub_codes(const fval *v, int64_t *codes, uint32_t *n_out) {
    *n_out = 0;
    if (!v->present) return 1;                   /* None: everything */
    uint8_t buf[MQ_FAST_SUB_TEXT_MAX];
    const uint8_t *s;
    uint32_t len;
    if (!field_text(v, buf, sizeof buf, &s, &len) || len > MQ_FAST_SUB_TEXT_MAX) return 0;
    for (uint32_t i = 0; i < len; i++)
        if (s[i] < 0x20 || s[i] > 0x7E) return 0;   /* other white space, non-ASCII: Python's strip */
    uint32_t a = 0, b = len;
    while (a < b && s[a] == ' ') a++;
    while (b > a && s[b - 1] == ' ') b--;
    if (a == b || (b - a == 1 && s[a] == '*')) return 1;
    uint32_t n = 0;
    for (uint32_t i = a; i <= b;) {
        uint32_t j = i;
        while (j < b && !(s[j] == '|' && j + 1 < b && s[j + 1] == '|')) j++;   /* str.split("||") */
        uint32_t ta = i, tb = j;
        while (ta < tb && s[ta] == ' ') ta++;
        while (tb > ta && s[tb - 1] == ' ') tb--;
        if (tb > ta) {
            if (n >= MQ_FAST_CODES_MAX) return 0;
            uint32_t h = 0;                      /* Java's String.hashCode over ASCII (UTF-16 units) */
            for (uint32_t k = ta; k < tb; k++) h = 31 * h + s[k];
            codes[n++] = (int64_t)(int32_t)h;
        }
        i = j + 2;
    }
    if (!n) return 0;                            /* tags that are all empty: Python's */
    qsort(codes, n, sizeof *codes, cmp_i64);
    uint32_t u = 1;
    for (uint32_t i = 1; i < n; i++)
        if (codes[i] != codes[u - 1]) codes[u++] = codes[i];
    *n_out = u;
    return 1;
}

/* The header of a FOUND pull answer to r (make_response(r, SUCCESS, "FOUND", ext) encoded) at h;
 * returns its length (< MQ_FAST_PULL_HEADER_ROOM - 8). */
static uint32_t pull_header(const req *r, int64_t next, int64_t lo, int64_t hi, uint8_t *h) {
    uint8_t *q = h;
    if (r->serialize_type == 1) {
        uint8_t *ext_len = put_bin_head(q, r->language, r->version, r->opaque, "FOUND");
        uint8_t *e = ext_len + 4, *e0 = e;
        uint8_t num[24];
        e = put_bin_entry(e, "suggestWhichBrokerId", (const uint8_t *)"0", 1);
        e = put_bin_entry(e, "nextBeginOffset", num, (uint32_t)(put_dec(num, next) - num));
        e = put_bin_entry(e, "minOffset", num, (uint32_t)(put_dec(num, lo) - num));
        e = put_bin_entry(e, "maxOffset", num, (uint32_t)(put_dec(num, hi) - num));
        be32w(ext_len, (uint32_t)(e - e0));
        q = e;
    } else {
        q = put_lit(q, "{\"code\":0,\"extFields\":{\"suggestWhichBrokerId\":\"0\",\"nextBeginOffset\":\"");
        q = put_dec(q, next);
        q = put_lit(q, "\",\"minOffset\":\"");
        q = put_dec(q, lo);
        q = put_lit(q, "\",\"maxOffset\":\"");
        q = put_dec(q, hi);
        *q++ = '"';
        q = put_json_tail(q, r->language, r->opaque, "FOUND", r->version);
    }
    assert((size_t)(q - h) + 8 <= MQ_FAST_PULL_HEADER_ROOM);
    return (uint32_t)(q - h);
}

/* The key of a record's verdict (mq_fast_sql_verdict's layout) from its spans (mq_records_props:
 * sp[2 + 2j], sp[3 + 2j] per property) over buf: its length, or 0 past MQ_FAST_SQL_KEY_MAX
 * (no verdict is kept for it then; an empty key is 1 byte or more per property, or none at all
 * for a filter that reads none, whose key is the empty one: returned as 0 too, and looked up). */
static uint32_t sql_key(const fast_sql *q, const uint8_t *buf, const int32_t *sp, uint8_t *key) {
    uint32_t n = 0;
    for (uint32_t j = 0; j < q->n_names; j++) {
        int32_t at = sp[2 + 2 * j], len = sp[3 + 2 * j];
        if (at < 0) {
            if (n + 1 > MQ_FAST_SQL_KEY_MAX) return 0;
            key[n++] = 0;
            continue;
        }
        if ((uint64_t)n + 5 + (uint32_t)len > MQ_FAST_SQL_KEY_MAX) return 0;
        key[n] = 1;
        be32w(key + n + 1, (uint32_t)len);
        memcpy(key + n + 5, buf + at, (size_t)len);
        n += 5 + (uint32_t)len;
    }
    return n;
}

/* An SQL92 pull's records (mq.broker.pull.PullProcessor._gather's loop; fastsend.h): 1 with the
 * records kept in body[0, res->size), res->n of them, res->scanned entries examined; 0 when the
 * pull is Python's (nothing kept, a first record over the buffer, a record that fails its check or
 * a deleted file); -1 for a record whose verdict is not kept (Python's too). */
static int sql_gather(mq_fast *f, fast_sql *q, const fast_topic *t, int32_t qid, int64_t offset,
                      const uint8_t *cq, uint32_t total, uint32_t count_max, uint8_t *body, mq_gather_out *res) {
    uint64_t min_phy = ctl_load(f->cl->ctl, MQ_POS_MIN), bytes_max = f->pull_bytes_max, size = 0;
    uint32_t n = 0, scanned = 0, stride = 2 * (q->n_names + 1);
    int64_t deadline_ns = mono_ns() + MQ_FAST_SQL_SCAN_BUDGET_NS;
    uint8_t key[MQ_FAST_SQL_KEY_MAX];
    while (scanned < total) {
        uint32_t want = count_max - n < MQ_FAST_SQL_CHUNK ? count_max - n : MQ_FAST_SQL_CHUNK;
        uint8_t *at = body + size;
        mq_gather_out g;
        /* what is left of the bytes is also the room: with records kept, the byte limit stops a
         * gather before the room would; with none, both are the whole buffer, as Python's */
        if (mq_commitlog_gather(f->cl, cq + (uint64_t)scanned * CQ_ENTRY_SIZE, total - scanned, min_phy, NULL, 0,
                                qid, offset + scanned, t->name, t->len, n, want, bytes_max - size, at,
                                bytes_max - size, &g) != MQ_OK)
            return 0;
        if (g.n) {
            assert(g.n <= MQ_FAST_SQL_CHUNK);
            if (mq_records_props(at, g.size, g.n, q->names, q->name_lens, q->n_names, f->sql_spans) != MQ_OK)
                return 0;
            uint64_t kept_size = 0;
            for (uint32_t i = 0; i < g.n; i++) {
                const int32_t *sp = f->sql_spans + (size_t)i * stride;
                uint32_t klen = sql_key(q, at, sp, key);
                int v = (klen || !q->n_names) ? sql_lookup(q, key, klen) : -1;
                if (v < 0) {
                    q->misses++;
                    return -1;
                }
                if (!v) continue;
                /* kept records move down over dropped ones: never over a record not yet read */
                memmove(at + kept_size, at + sp[0], (size_t)sp[1]);
                kept_size += (uint32_t)sp[1];
                n++;
            }
            size += kept_size;
        }
        scanned += g.scanned;
        if (g.stop_rc == MQ_OK) {
            if (n >= count_max || !g.scanned || mono_ns() > deadline_ns) break;
            continue;
        }
        if (g.stop_rc == MQ_E_FULL && n) break;
        return 0;
    }
    if (!n) return 0;
    q->hits++;
    res->n = n;
    res->size = size;
    res->scanned = scanned;
    return 1;
}

/* Answers GET_MAX_OFFSET / GET_MIN_OFFSET r of a queue the control block has (fastsend.h): 1 with
 * *out filled and the answer frame at the pull buffer's start, 0 when it is Python's. */
static int take_offset(mq_fast *f, const req *r, mq_fast_pulled *out) {
    const fval *F = r->fs.lng;
    int64_t qid;
    if (!F[F_TOPIC].present || F[F_TOPIC].escaped || !F[F_TOPIC].len || F[F_TOPIC].len > MQ_TOPIC_LEN_MAX
        || !F[F_QID].present || !F[F_QID].len || !field_int(&F[F_QID], INT32_MIN, INT32_MAX, &qid))
        return 0;
    void *mem = f->cl->ctl;
    uint32_t slot;
    if (mq_queue_lookup(mem, (const char *)F[F_TOPIC].p, F[F_TOPIC].len, (int32_t)qid, 0, &slot) != MQ_OK) return 0;
    int64_t v = mq_queue_get(mem, slot, r->code == CODE_GET_MAX_OFFSET ? MQ_Q_CQ_MAX : MQ_Q_CQ_MIN);
    uint8_t *h = f->pull_buf + 8, *q = h, num[24];
    uint32_t num_len = (uint32_t)(put_dec(num, v) - num);
    if (r->serialize_type == 1) {              /* make_response(r, SUCCESS, None, {"offset": v}) */
        uint8_t *ext_len = put_bin_head(q, r->language, r->version, r->opaque, NULL), *e0 = ext_len + 4;
        q = put_bin_entry(e0, "offset", num, num_len);
        be32w(ext_len, (uint32_t)(q - e0));
    } else {
        q = put_lit(q, "{\"code\":0,\"extFields\":{\"offset\":\"");
        memcpy(q, num, num_len);
        q += num_len;
        *q++ = '"';
        q = put_json_tail(q, r->language, r->opaque, NULL, r->version);
    }
    uint32_t hlen = (uint32_t)(q - h);
    assert(hlen + 8 <= MQ_FAST_PULL_HEADER_ROOM);
    be32w(f->pull_buf, 4 + hlen);
    be32w(f->pull_buf + 4, ((uint32_t)r->serialize_type << 24) | hlen);
    *out = (mq_fast_pulled){.sends_staged = out->sends_staged, .sql_missed = out->sql_missed,
                            .kind = MQ_FAST_PULLED_OFFSET, .frame_offset = 0, .frame_len = 8 + hlen};
    return 1;
}

/* Answers pull r when it finds records (fastsend.h's list): 1 with *out filled and the answer
 * frame in the pull buffer, 0 when it is Python's (nothing done). */
static int take_pull(mq_fast *f, const req *r, mq_fast_pulled *out) {
    const fval *F = r->fs.lng;
    if (!F[F_GROUP].present || F[F_GROUP].escaped || !F[F_TOPIC].present || F[F_TOPIC].escaped) return 0;
    int64_t gid = group_find(f, F[F_GROUP].p, F[F_GROUP].len, NULL);
    int64_t tid = F[F_TOPIC].len ? topic_find(f, (const char *)F[F_TOPIC].p, F[F_TOPIC].len, NULL) : -1;
    if (gid < 0 || tid < 0) return 0;
    int64_t qid, offset, max_nums, sys_flag, commit, sub_version, unused;
    if (!F[F_QID].present || !F[F_QID].len || !field_int(&F[F_QID], INT32_MIN, INT32_MAX, &qid)) return 0;
    if (!F[F_QOFFSET].present || !F[F_QOFFSET].len || !field_int(&F[F_QOFFSET], INT64_MIN, INT64_MAX, &offset))
        return 0;
    if (!field_int_or(&F[F_MAXNUMS], INT32_MIN, INT32_MAX, 32, &max_nums)
        || !field_int_or(&F[F_SYSFLAG], INT32_MIN, INT32_MAX, 0, &sys_flag)
        || !field_int_or(&F[F_COMMIT], INT64_MIN, INT64_MAX, 0, &commit)
        || !field_int_or(&F[F_SUSPEND], INT64_MIN, INT64_MAX, 0, &unused)
        || !field_int_or(&F[F_SUBVER], INT64_MIN, INT64_MAX, 0, &sub_version))
        return 0;
    if (max_nums < 1) max_nums = 1;
    const fast_topic *t = &f->topics[tid];
    if (!(t->perm & PERM_READ) || qid < 0 || qid >= t->read_queues) return 0;
    const fval *ev = &F[F_EXPR];
    fast_sql *sql = NULL;
    int64_t codes_buf[MQ_FAST_CODES_MAX];
    const int64_t *codes = codes_buf;
    uint32_t n_codes = 0;
    if (!(sys_flag & PULL_SUBSCRIPTION)) {       /* the group's heartbeat subscription, if fresh */
        const fast_sub *hb = sub_find(f, (uint32_t)gid, (uint32_t)tid, NULL);
        if (!hb || mono_ns() >= hb->fresh_until_ns || hb->sub_version < sub_version) return 0;
        if (hb->sql_id >= 0) sql = &f->sqls[hb->sql_id];
        codes = hb->codes;
        n_codes = hb->n_codes;
    } else if (ev->present && ev->len == 5 && !ev->escaped && memcmp(ev->p, "SQL92", 5) == 0) {
        const fval *sv = &F[F_SUB];    /* Python's text: an escaped one is Python's to read */
        if (!sv->present || sv->escaped || !sv->len || sv->len > MQ_FAST_SUB_TEXT_MAX || !utf8_ok(sv->p, sv->len))
            return 0;
        int64_t id = sql_find(f, sv->p, sv->len, NULL);
        if (id < 0) return 0;
        sql = &f->sqls[id];
    } else {
        if (ev->present && ev->len && !(ev->len == 3 && !ev->escaped && memcmp(ev->p, "TAG", 3) == 0)) return 0;
        if (!sub_codes(&F[F_SUB], codes_buf, &n_codes)) return 0;
    }
    /* a filter whose pulls keep meeting values without a verdict is left to Python (fastsend.h) */
    if (sql && sql->misses > MQ_FAST_SQL_MISSES_MAX && sql->misses > sql->hits) return 0;
    uint32_t slot;
    void *mem = f->cl->ctl;
    if (mq_queue_lookup(mem, t->name, t->len, (int32_t)qid, 0, &slot) != MQ_OK) return 0;
    int64_t lo = mq_queue_get(mem, slot, MQ_Q_CQ_MIN), hi = mq_queue_get(mem, slot, MQ_Q_CQ_MAX);
    if (hi <= 0 || offset < lo || offset >= hi) return 0;
    uint64_t byte = (uint64_t)offset * CQ_ENTRY_SIZE, fs = f->cq_file_size;
    uint64_t start = byte - byte % fs, at = byte - start;
    const uint8_t *cq = cq_file(f, (uint32_t)tid, (int32_t)qid, start);
    if (!cq) return 0;
    uint64_t n_entries = (uint64_t)(max_nums * CQ_ENTRY_SIZE > CQ_SCAN_BYTES_MIN ? max_nums * CQ_ENTRY_SIZE
                                                                                 : CQ_SCAN_BYTES_MIN) / CQ_ENTRY_SIZE;
    if (n_entries > (uint64_t)(hi - offset)) n_entries = (uint64_t)(hi - offset);
    if (n_entries > (fs - at) / CQ_ENTRY_SIZE) n_entries = (fs - at) / CQ_ENTRY_SIZE;
    uint32_t count_max = max_nums < f->pull_count_max ? (uint32_t)max_nums : f->pull_count_max;
    uint8_t *body = f->pull_buf + MQ_FAST_PULL_HEADER_ROOM;
    mq_gather_out res;
    if (sql) {
        int got = sql_gather(f, sql, t, (int32_t)qid, offset, cq + at, (uint32_t)n_entries, count_max, body, &res);
        if (got < 0) out->sql_missed = (uint32_t)(sql - f->sqls) + 1;
        if (got <= 0) return 0;
    } else {
        int rc = mq_commitlog_gather(f->cl, cq + at, (uint32_t)n_entries, ctl_load(f->cl->ctl, MQ_POS_MIN),
                                     n_codes ? codes : NULL, n_codes, (int32_t)qid, offset, t->name, t->len, 0,
                                     count_max, f->pull_bytes_max, body, f->pull_bytes_max, &res);
        if (rc != MQ_OK || res.n == 0 || !(res.stop_rc == MQ_OK || res.stop_rc == MQ_E_FULL)) return 0;
    }
    uint8_t head[MQ_FAST_PULL_HEADER_ROOM];
    uint32_t hlen = pull_header(r, offset + (int64_t)res.scanned, lo, hi, head);
    uint32_t frame_at = MQ_FAST_PULL_HEADER_ROOM - 8 - hlen;
    uint8_t *p = f->pull_buf + frame_at;
    be32w(p, (uint32_t)(4 + hlen + res.size));
    be32w(p + 4, ((uint32_t)r->serialize_type << 24) | hlen);
    memcpy(p + 8, head, hlen);
    *out = (mq_fast_pulled){.sends_staged = out->sends_staged, .sql_missed = out->sql_missed,
                            .kind = MQ_FAST_PULLED_PULL, .group_id = (uint32_t)gid, .topic_id = (uint32_t)tid,
                            .queue_id = (int32_t)qid, .commit = (sys_flag & PULL_COMMIT_OFFSET) != 0,
                            .commit_offset = commit, .msgs = res.n, .body_len = (uint32_t)res.size,
                            .frame_offset = frame_at, .frame_len = 8 + hlen + (uint32_t)res.size};
    return 1;
}

int mq_fast_read(mq_fast *f, uint32_t conn, const uint8_t *born_host, uint32_t born_host_len,
                 int32_t born_port, int pulls, const uint8_t *buf, size_t len, size_t *consumed, int *stop_out,
                 int32_t *code_out, mq_fast_pulled *pulled) {
    assert(f && (buf || !len) && consumed && stop_out && code_out && pulled);
    *code_out = -1;
    pulled->sends_staged = 0;
    uint32_t staged_before = f->n;
    pulls = pulls && f->pull_buf && !f->trace;
    if (born_host_len != 4 && born_host_len != 16) return MQ_E_INVAL;
    assert(born_host);
    mq_ctl *ctl = f->cl->ctl;
    size_t pos = 0;
    int stop = MQ_FAST_END;
    uint64_t take_back_until = ctl_load(ctl, MQ_POS_HA_TAKE_BACK_UNTIL);      /* mq.ha.common.taking_back */
    if (ctl_load(ctl, MQ_POS_DISK_FULL) || (take_back_until && (int64_t)take_back_until > mono_ms())
        || (f->cl->dledger && ctl_load(ctl, MQ_POS_DL_APPEND_TERM) == 0)) {
        stop = len - pos >= 4 ? MQ_FAST_HANDBACK : MQ_FAST_END;
        goto out;
    }
    /* tracing: the wall clock is read once per call and each frame's derived from the monotonic
     * one; a frame's t0 is the end of the one before it (the first's: this call's start).  No
     * stamp after the parse: every row C keeps has a store instant, and its decode phase runs
     * from t0 to there (t1, the parse's end, serves only rows without one: Python's) */
    int64_t mono0_ns = 0, wall0_us = 0, t_ns = 0;
    if (f->trace) {
        t_ns = mono0_ns = mono_ns();
        wall0_us = wall_us();
    }
    while (len - pos >= 4) {
        uint32_t total = be32r(buf + pos);
        if ((uint64_t)total + 4 > FRAME_SIZE_MAX) { stop = MQ_FAST_HANDBACK; break; }
        if ((uint64_t)total + 4 > len - pos) break;                  /* incomplete */
        const uint8_t *payload = buf + pos + 4;
        if (total < 4) { stop = MQ_FAST_HANDBACK; break; }
        uint32_t word = be32r(payload);
        uint32_t ser = word >> 24, hlen = word & 0xFFFFFF;
        if (hlen > total - 4 || ser > 1) { stop = MQ_FAST_HANDBACK; break; }
        req r;
        memset(&r, 0, sizeof r);
        r.serialize_type = (int32_t)ser;
        r.t0_ns = t_ns;
        int ok = ser == 1 ? parse_binary(payload + 4, hlen, &r) : parse_json(payload + 4, hlen, &r);
        if (f->trace) {
            r.t1_ns = t_ns;
            r.ts_us = wall0_us + (t_ns - mono0_ns) / 1000;
        }
        if (ok) *code_out = r.code;
        if (ok && (r.code == CODE_PULL || r.code == CODE_GET_MAX_OFFSET || r.code == CODE_GET_MIN_OFFSET) && pulls
            && !(r.flag & (RPC_RESPONSE | RPC_ONEWAY))) {
            pulled->sends_staged = f->n - staged_before;
            if (!(r.code == CODE_PULL ? take_pull(f, &r, pulled) : take_offset(f, &r, pulled))) {
                stop = MQ_FAST_HANDBACK;
                break;
            }
            pos += 4 + (size_t)total;
            stop = MQ_FAST_PULLED;
            break;
        }
        if (!ok || (r.code != CODE_SEND && r.code != CODE_SEND_V2) || (r.flag & RPC_RESPONSE)) {
            stop = MQ_FAST_HANDBACK;
            break;
        }
        int took = take_send(f, &r, payload + 4 + hlen, total - 4 - hlen, conn, born_host, born_host_len,
                             born_port);
        if (took == 0) { stop = MQ_FAST_HANDBACK; break; }
        if (took < 0) { stop = MQ_FAST_FULL; break; }
        pos += 4 + (size_t)total;
        if (f->trace) t_ns = mono_ns();
    }
out:
    *consumed = pos;
    *stop_out = stop;
    pulled->sends_staged = f->n - staged_before;
    return MQ_OK;
}

/* ---- tracing ------------------------------------------------------------------------------ */

/* Keeps the req row of answered send a (mq.broker.tracing.REQ_ROW; durations in ns, written as
 * thousandths of a microsecond): decode runs from the frame's read to the group append, as the
 * Python path's does (the wait for the loop pass included). */
static void trace_row(mq_fast *f, const mq_fast_fail *a, int32_t status, int64_t flushed_ns, int64_t acked_ns,
                      int64_t done_ns) {
    if (f->trace_n >= MQ_FAST_TRACE_ROWS_MAX) return;        /* Python takes them after every call */
    int64_t *v = &f->trace_rows[(size_t)f->trace_n++ * MQ_FAST_TRACE_FIELDS];
    int64_t store = a->store_ns, appended = a->appended_ns;
    v[0] = a->ts_us;
    v[1] = a->code;
    v[2] = a->rc == MQ_OK || a->rc == MQ_FAST_RC_STORED ? 1 : 0;
    v[3] = a->body_len;
    v[4] = status;
    v[5] = store ? store - a->t0_ns : a->t1_ns - a->t0_ns;
    v[6] = store ? appended - store : 0;
    v[7] = store ? flushed_ns - appended : 0;
    v[8] = store ? acked_ns - flushed_ns : 0;
    v[9] = done_ns - (store ? acked_ns : done_ns);
    v[10] = done_ns - a->t0_ns;
}

/* The rows [first, trace_n) were kept with done_ns 0 (trace_row with a store): their answers were
 * all written by done_ns. */
static void trace_rows_done(mq_fast *f, uint32_t first, int64_t done_ns) {
    for (uint32_t i = first; i < f->trace_n; i++) {
        int64_t *v = &f->trace_rows[(size_t)i * MQ_FAST_TRACE_FIELDS];
        v[9] += done_ns;
        v[10] += done_ns;
    }
}

int mq_fast_set_trace(mq_fast *f, int on) {
    assert(f);
    f->trace = on != 0;
    return MQ_OK;
}

int mq_fast_take_trace(mq_fast *f, int64_t *rows, uint32_t cap_rows, uint32_t *n_out) {
    assert(f && (cap_rows == 0 || rows) && n_out);
    uint32_t n = f->trace_n < cap_rows ? f->trace_n : cap_rows;
    memcpy(rows, f->trace_rows, (size_t)n * MQ_FAST_TRACE_FIELDS * sizeof(int64_t));
    if (n < f->trace_n)
        memmove(f->trace_rows, f->trace_rows + (size_t)n * MQ_FAST_TRACE_FIELDS,
                (size_t)(f->trace_n - n) * MQ_FAST_TRACE_FIELDS * sizeof(int64_t));
    f->trace_n -= n;
    *n_out = n;
    return MQ_OK;
}

/* ---- answers ------------------------------------------------------------------------------ */

static uint8_t *put_lit(uint8_t *p, const char *s) {
    size_t n = strlen(s);
    memcpy(p, s, n);
    return p + n;
}

static uint8_t *put_dec(uint8_t *p, int64_t v) { return p + mq_fmt_i64((char *)p, v); }

static uint8_t *put_bin_entry(uint8_t *p, const char *k, const uint8_t *v, uint32_t vlen) {
    uint16_t klen = (uint16_t)strlen(k);
    be16w(p, klen);
    memcpy(p + 2, k, klen);
    p += 2 + klen;
    be32w(p, vlen);
    memcpy(p + 4, v, vlen);
    return p + 4 + vlen;
}

/* A SUCCESS response's ROCKETMQ header up to its extFields (code, language, version, opaque,
 * flag, remark: NULL is none) at q; returns where the extFields length (4 bytes) goes, their
 * entries after it (mq.wire.remoting.encode_rocketmq_header). */
static uint8_t *put_bin_head(uint8_t *q, int32_t language, int32_t version, int32_t opaque, const char *remark) {
    uint32_t remark_len = remark ? (uint32_t)strlen(remark) : 0;
    be16w(q, 0);                        /* SUCCESS */
    q[2] = (uint8_t)language;
    be16w(q + 3, (uint16_t)version);
    be32w(q + 5, (uint32_t)opaque);
    be32w(q + 9, RPC_RESPONSE);
    be32w(q + 13, remark_len);
    if (remark_len) memcpy(q + 17, remark, remark_len);
    return q + 17 + remark_len;
}

/* A SUCCESS response's JSON header after its last extFields entry: closes them, then flag,
 * language, opaque, remark (NULL: none), serializeTypeCurrentRPC and version, in the order and
 * spelling of mq.wire.remoting.encode_json_header. */
static uint8_t *put_json_tail(uint8_t *q, int32_t language, int32_t opaque, const char *remark, int32_t version) {
    q = put_lit(q, "},\"flag\":1,\"language\":\"");
    q = put_lit(q, LANGUAGES[language]);
    q = put_lit(q, "\",\"opaque\":");
    q = put_dec(q, opaque);
    if (remark) {
        q = put_lit(q, ",\"remark\":\"");
        q = put_lit(q, remark);
        *q++ = '"';
    }
    q = put_lit(q, ",\"serializeTypeCurrentRPC\":\"JSON\",\"version\":");
    q = put_dec(q, version);
    *q++ = '}';
    return q;
}

/* Writes the SUCCESS answer of stored send a at p; returns its length (<= MQ_FAST_ANSWER_MAX). */
static uint32_t answer(const mq_fast *f, const mq_fast_fail *a, uint8_t *p) {
    uint32_t id_len = (uint32_t)strlen(a->msg_id);
    uint8_t *h = p + 8;                 /* the header, after the length and type words */
    uint8_t *q = h;
    if (a->serialize_type == 1) {
        uint8_t *ext_len = put_bin_head(q, a->language, a->version, a->opaque, NULL);
        uint8_t *e = ext_len + 4, *e0 = e;
        uint8_t num[24];
        e = put_bin_entry(e, "msgId", (const uint8_t *)a->msg_id, id_len);
        e = put_bin_entry(e, "queueId", num, (uint32_t)(put_dec(num, a->queue_id) - num));
        e = put_bin_entry(e, "queueOffset", num, (uint32_t)(put_dec(num, a->queue_offset) - num));
        memcpy(e, f->bin_fixed, f->bin_fixed_len);
        e += f->bin_fixed_len;
        be32w(ext_len, (uint32_t)(e - e0));
        q = e;
    } else {
        q = put_lit(q, "{\"code\":0,\"extFields\":{\"msgId\":\"");
        memcpy(q, a->msg_id, id_len);
        q += id_len;
        q = put_lit(q, "\",\"queueId\":\"");
        q = put_dec(q, a->queue_id);
        q = put_lit(q, "\",\"queueOffset\":\"");
        q = put_dec(q, a->queue_offset);
        *q++ = '"';
        memcpy(q, f->json_fixed, f->json_fixed_len);
        q += f->json_fixed_len;
        q = put_json_tail(q, a->language, a->opaque, NULL, a->version);
    }
    uint32_t hlen = (uint32_t)(q - h);
    be32w(p, 4 + hlen);
    be32w(p + 4, ((uint32_t)a->serialize_type << 24) | hlen);
    assert(8 + hlen <= MQ_FAST_ANSWER_MAX);
    return 8 + hlen;
}

/* Adds an answer of `len` bytes at out + *used for conn to the spans (a connection's consecutive
 * answers share one span). */
static void add_span(mq_fast_span *spans, uint32_t *ns, uint32_t conn, size_t *used, uint32_t len) {
    if (*ns && spans[*ns - 1].conn == conn && spans[*ns - 1].offset + spans[*ns - 1].len == *used) {
        spans[*ns - 1].len += len;
    } else {
        spans[(*ns)++] = (mq_fast_span){.conn = conn, .offset = (uint32_t)*used, .len = len};
    }
    *used += len;
}

int mq_fast_set_hold(mq_fast *f, int hold) {
    assert(f);
    if (hold != MQ_FAST_ANSWER_NOW && hold != MQ_FAST_HOLD_WAITING && hold != MQ_FAST_HOLD_ALL) return MQ_E_INVAL;
    f->hold = hold;
    return MQ_OK;
}

int mq_fast_run(mq_fast *f, int refuse_held, uint8_t *out, size_t out_cap, mq_fast_span *spans,
                uint32_t *n_spans, mq_fast_fail *fails, uint32_t *n_fails, uint32_t *n_ok, uint32_t *n_held) {
    assert(f && n_spans && n_fails && n_ok && n_held);
    uint32_t n = f->n;
    *n_spans = *n_fails = *n_ok = *n_held = 0;
    if (!n) return MQ_OK;
    assert(out && spans && fails);
    if (out_cap < (size_t)n * MQ_FAST_ANSWER_MAX) return MQ_E_INVAL;
    int64_t store_ns = f->trace ? mono_ns() : 0;
    int appended = mq_commitlog_append_group(f->cl, f->msgs, n, f->max_message_size, f->out, f->rc);
    assert(appended >= 0);             /* n <= MQ_FAST_MSGS_MAX <= MQ_BATCH_MSGS_MAX */
    int64_t appended_ns = f->trace ? mono_ns() : 0;
    uint32_t first_row = f->trace_n;             /* this run's req rows: done is stamped once, after */
    int64_t t_ms = mono_ms();
    size_t used = 0;
    uint32_t ns = 0, nf = 0, ok = 0, held = 0;
    for (uint32_t i = 0; i < n; i++) {
        const staged *s = &f->st[i];
        const mq_append_out *o = &f->out[i];
        mq_fast_fail a = {.conn = s->conn, .rc = f->rc[i], .topic_id = s->topic_id,
                          .queue_id = f->msgs[i].queue_id, .opaque = s->opaque, .version = s->version,
                          .language = s->language, .serialize_type = s->serialize_type, .oneway = s->oneway,
                          .body_len = s->body_len, .code = s->code, .t0_ns = s->t0_ns, .t1_ns = s->t1_ns,
                          .ts_us = s->ts_us, .store_ns = store_ns, .appended_ns = appended_ns};
        if (a.rc != MQ_OK) {
            fails[nf++] = a;
            continue;
        }
        ok++;
        fast_topic *t = &f->topics[s->topic_id];
        t->msgs++;
        t->bytes += s->body_len;
        a.queue_offset = o->queue_offset;
        a.end_offset = o->phy_offset + o->size;
        a.t_ms = t_ms;
        a.dl_term = o->dl_term;
        memcpy(a.msg_id, o->msg_id, sizeof a.msg_id);
        if ((f->hold == MQ_FAST_HOLD_WAITING && s->wait) || f->hold == MQ_FAST_HOLD_ALL) {
            if (refuse_held) {
                a.rc = MQ_FAST_RC_STORED;
                fails[nf++] = a;
                continue;
            }
            /* read() left room: staged + pending never pass MQ_FAST_PENDING_MAX while holding */
            assert(f->pending_n < MQ_FAST_PENDING_MAX);
            f->pending[(f->pending_head + f->pending_n) % MQ_FAST_PENDING_MAX] = a;
            f->pending_n++;
            held++;
            continue;
        }
        if (!s->oneway) add_span(spans, &ns, s->conn, &used, answer(f, &a, out + used));
        if (f->trace) trace_row(f, &a, 0, appended_ns, appended_ns, 0);
    }
    if (f->trace) trace_rows_done(f, first_row, mono_ns());
    f->n = 0;
    f->arena_used = 0;
    *n_spans = ns;
    *n_fails = nf;
    *n_ok = ok;
    *n_held = held;
    return MQ_OK;
}

int mq_fast_pending(mq_fast *f, mq_fast_fail *head, mq_fast_fail *tail, uint32_t *n_out) {
    assert(f && head && tail && n_out);
    *n_out = f->pending_n;
    if (f->pending_n) {
        *head = f->pending[f->pending_head];
        *tail = f->pending[(f->pending_head + f->pending_n - 1) % MQ_FAST_PENDING_MAX];
    }
    return MQ_OK;
}

int mq_fast_release(mq_fast *f, uint64_t pos, int64_t term, int acked, uint8_t *out, size_t out_cap,
                    mq_fast_span *spans, uint32_t spans_cap, uint32_t *n_spans, uint32_t *n_released) {
    assert(f && (out_cap == 0 || out) && (spans_cap == 0 || spans) && n_spans && n_released);
    size_t used = 0;
    uint32_t ns = 0, rel = 0;
    int64_t now_ns = f->trace ? mono_ns() : 0;
    while (f->pending_n && ns < spans_cap && out_cap - used >= MQ_FAST_ANSWER_MAX
           && !(f->trace && f->trace_n >= MQ_FAST_TRACE_ROWS_MAX)) {
        const mq_fast_fail *a = &f->pending[f->pending_head];
        if (a->end_offset > pos || (term >= 0 && a->dl_term != term)) break;
        if (!a->oneway) add_span(spans, &ns, a->conn, &used, answer(f, a, out + used));
        if (f->trace)                  /* the wait ended now: a flush's, or a slave's ack */
            trace_row(f, a, 0, acked ? a->appended_ns : now_ns, now_ns, mono_ns());
        f->pending_head = (f->pending_head + 1) % MQ_FAST_PENDING_MAX;
        f->pending_n--;
        rel++;
    }
    *n_spans = ns;
    *n_released = rel;
    return MQ_OK;
}

int mq_fast_release_expired(mq_fast *f, int64_t appended_before_ms, int64_t keep_term, mq_fast_fail *fails,
                            uint32_t cap, uint32_t *n_out) {
    assert(f && (cap == 0 || fails) && n_out);
    uint32_t n = 0;
    while (f->pending_n && n < cap) {
        const mq_fast_fail *a = &f->pending[f->pending_head];
        if (a->t_ms >= appended_before_ms && (keep_term < 0 || a->dl_term == keep_term)) break;
        fails[n] = *a;
        fails[n].rc = MQ_FAST_RC_STORED;
        n++;
        f->pending_head = (f->pending_head + 1) % MQ_FAST_PENDING_MAX;
        f->pending_n--;
    }
    *n_out = n;
    return MQ_OK;
}
