/*
 * tracefmt.h -- the perf trace's text rows, formatted in C (tracefmt.c; Python:
 * mq.broker.tracing, which writes them as JSON lines).  Pure: no handle, no lock, no I/O.
 *
 * mq_format_rows  nrows rows of nfields int64 values as text, from a template: segs holds
 *     nfields + 1 segments back to back (seg_len[i] bytes each) and a row is
 *     seg[0] v[0] seg[1] v[1] ... v[n-1] seg[n].  kinds[i] (asserted to be an mq_fmt_kind):
 *     MQ_FMT_INT writes v as a decimal; MQ_FMT_MILLI as a decimal followed by "e-3"
 *     (thousandths, which JSON reads as the float v / 1000); MQ_FMT_CODE as a quoted decimal,
 *     or "" when v is negative.  A row needs at most sum(seg_len) + nfields * MQ_FMT_VALUE_MAX
 *     bytes.  EXCEPTION to the convention: returns the bytes written (>= 0), or MQ_E_RANGE when
 *     out_cap is too small for the rows at that bound (out then holds nothing useful).
 */
#ifndef MQ_TRACEFMT_H
#define MQ_TRACEFMT_H

#include "mqbase.h"

#define MQ_FMT_VALUE_MAX       24        /* "-9223372036854775808e-3" or a quoted code */
enum mq_fmt_kind { MQ_FMT_INT = 0, MQ_FMT_MILLI = 1, MQ_FMT_CODE = 2 };

int64_t  mq_format_rows(const char *segs, const uint32_t *seg_len, const uint8_t *kinds, uint32_t nfields,
                        const int64_t *values, uint32_t nrows, char *out, size_t out_cap);

#endif
