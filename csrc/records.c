/*
 * records.c -- a PULL answer's records decoded for a client, one call for many records.
 * Contract in records.h.
 */
#include "internal.h"

/* The pairs of an ASCII properties text to out (name 0x02 value 0x02 each): their number. */
static int64_t write_pairs(const uint8_t *p, uint32_t n, char *out, size_t *at) {
    int64_t pairs = 0;
    uint32_t s = 0;
    while (s < n) {
        const uint8_t *sep2 = memchr(p + s, 0x02, n - s);
        uint32_t e = sep2 ? (uint32_t)(sep2 - p) : n;
        const uint8_t *sep1 = memchr(p + s, 0x01, e - s);
        if (sep1) {
            uint32_t k = (uint32_t)(sep1 - p);
            if (k > s && k + 1 < e) {
                memcpy(out + *at, p + s, k - s);
                *at += k - s;
                out[(*at)++] = 0x02;
                memcpy(out + *at, p + k + 1, e - k - 1);
                *at += e - k - 1;
                out[(*at)++] = 0x02;
                pairs++;
            }
        }
        s = e + 1;
    }
    return pairs;
}

static int ascii(const uint8_t *p, uint32_t n) {
    uint8_t any = 0;
    for (uint32_t i = 0; i < n; i++) any |= p[i];
    return any < 0x80;
}

int64_t mq_records_decode(const char *buf, size_t len, size_t from, int64_t *rows, uint32_t rows_cap, char *ids,
                          char *text, size_t text_cap, size_t *text_len, size_t *stop, int *why) {
    assert((buf || len == 0) && stop && why && text_len && (rows_cap == 0 || (rows && ids && text)));
    if (from > len || len > INT32_MAX) return MQ_E_INVAL;
    const uint8_t *b = (const uint8_t *)buf;
    const uint8_t *prev_topic = NULL;
    uint32_t prev_topic_len = 0;
    size_t at = from;
    uint32_t n = 0;
    *why = MQ_DECODE_OTHER;
    for (;; n++) {
        if (at == len) { *why = MQ_DECODE_END; break; }
        const uint8_t *p = b + at;
        if (len - at < 88) break;
        int32_t total = (int32_t)be32r(p + MQ_REC_POS_TOTAL_SIZE);
        int32_t sys_flag = (int32_t)be32r(p + MQ_REC_POS_SYS_FLAG);
        int32_t body_len = (int32_t)be32r(p + 84);
        if (be32r(p + MQ_REC_POS_MAGIC) != MQ_MESSAGE_MAGIC || (sys_flag & (MQ_SYSFLAG_BORNHOST_V6 | MQ_SYSFLAG_STOREHOST_V6))
            || total < MQ_RECORD_SIZE_MIN || (size_t)total > len - at || body_len < 0 || 88 + (int64_t)body_len + 3 > total)
            break;
        uint32_t topic_at = 88 + (uint32_t)body_len + 1, topic_len = p[topic_at - 1];
        uint32_t props_at = topic_at + topic_len + 2;
        if (topic_len > MQ_TOPIC_LEN_MAX || props_at > (uint32_t)total || p[props_at - 2] > 0x7F
            || props_at + be16r(p + props_at - 2) != (uint32_t)total || !ascii(p + topic_at, topic_len))
            break;
        int64_t phy = (int64_t)be64r(p + MQ_REC_POS_PHYSICAL_OFFSET);
        int32_t store_port = (int32_t)be32r(p + 68);
        if (phy < 0 || store_port < 0 || store_port > 0xFFFF) break;
        uint32_t props_len = (uint32_t)total - props_at;
        if (n == rows_cap || text_cap - *text_len < 2 * (size_t)props_len + 1) { *why = MQ_DECODE_FULL; break; }
        int64_t *r = rows + (size_t)n * MQ_DECODE_FIELDS;
        r[0] = total;
        r[1] = (int32_t)be32r(p + MQ_REC_POS_BODY_CRC);
        r[2] = (int32_t)be32r(p + MQ_REC_POS_QUEUE_ID);
        r[3] = (int32_t)be32r(p + MQ_REC_POS_FLAG);
        r[4] = (int64_t)be64r(p + MQ_REC_POS_QUEUE_OFFSET);
        r[5] = phy;
        r[6] = sys_flag;
        r[7] = (int64_t)be64r(p + MQ_REC_POS_BORN_TIMESTAMP);
        r[8] = be32r(p + MQ_REC_POS_BORN_HOST);
        r[9] = (int32_t)be32r(p + 52);
        r[10] = (int64_t)be64r(p + 56);
        r[11] = be32r(p + 64);
        r[12] = store_port;
        r[13] = (int32_t)be32r(p + 72);
        r[14] = (int64_t)be64r(p + 76);
        r[15] = (int64_t)(at + 88);
        r[16] = (int64_t)(at + topic_at - 1);
        r[17] = (int64_t)(at + topic_at);
        r[18] = (int64_t)(at + topic_at + topic_len);
        r[19] = (int64_t)(at + props_at);
        r[20] = (int64_t)at + total;
        r[21] = ascii(p + props_at, props_len) ? write_pairs(p + props_at, props_len, text, text_len) : -1;
        r[22] = prev_topic && prev_topic_len == topic_len && memcmp(prev_topic, p + topic_at, topic_len) == 0;
        prev_topic = p + topic_at;
        prev_topic_len = topic_len;
        mq_msg_id(p + 64, 4, store_port, (uint64_t)phy, ids + (size_t)n * MQ_DECODE_ID_LEN);
        ids[(size_t)n * MQ_DECODE_ID_LEN + MQ_MSG_ID_V4_LEN] = 0x02;
        at += (uint32_t)total;
    }
    *stop = at;
    return n;
}
