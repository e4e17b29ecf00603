/*
 * tracefmt.c -- the perf trace's rows as text, one call for many rows.  Contract in tracefmt.h.
 */
#include "internal.h"

int64_t mq_format_rows(const char *segs, const uint32_t *seg_len, const uint8_t *kinds, uint32_t nfields,
                       const int64_t *values, uint32_t nrows, char *out, size_t out_cap) {
    assert(segs && seg_len && kinds && (nrows == 0 || (values && out)));
    size_t fixed = 0;
    for (uint32_t i = 0; i <= nfields; i++) fixed += seg_len[i];
    for (uint32_t i = 0; i < nfields; i++) assert(kinds[i] <= MQ_FMT_CODE);
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
                at += mq_fmt_i64(out + at, v[i]);
                break;
            case MQ_FMT_MILLI:
                at += mq_fmt_i64(out + at, v[i]);
                memcpy(out + at, "e-3", 3);
                at += 3;
                break;
            default:                              /* MQ_FMT_CODE */
                out[at++] = '"';
                if (v[i] >= 0) at += mq_fmt_i64(out + at, v[i]);
                out[at++] = '"';
            }
        }
        memcpy(out + at, seg, seg_len[nfields]);
        at += seg_len[nfields];
    }
    return (int64_t)at;
}
