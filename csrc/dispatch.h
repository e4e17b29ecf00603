/*
 * dispatch.h -- ConsumeQueue dispatch: the entries of scanned records written into the mapped
 * ConsumeQueue files (dispatch.c; Python: mq.store.dispatch, the dispatch role).
 *
 * ConsumeQueue entry (20 bytes, big-endian; mq.wire.consumequeue declares it):
 *   PHYSICALOFFSET 8 | SIZE 4 | TAGSCODE 8
 * Entry q of a queue sits at byte (q - first_qoff) * 20 of the file whose first entry is
 * first_qoff.  TAGSCODE is the Java hash of TAGS; for SCHEDULE_TOPIC_XXXX (delay_ms >= 0) it
 * is the delivery time, STORETS + the level's delay.
 *
 * mq_dispatch_batch  for each of recs[0..n), in order: records of prepared and rolled-back
 *     transactions are skipped; the others are written at their QUEUEOFFSET into the file
 *     maps[slot] describes (slot from a scan with resolve_slots, asserted < MQ_QUEUE_SLOTS),
 *     and the slot's CQ_MAX advanced to QUEUEOFFSET + 1 (lock-free, monotonic).  Writing at
 *     the record's own offset makes a repeated dispatch idempotent.  Returns MQ_OK with
 *     *done_out = n, or MQ_E_RANGE when a record's file is not in maps (base NULL or the offset
 *     outside it): *done_out = that record's index (the ones before it are done),
 *     *need_slot_out and *need_qoff_out say which file to map; the caller maps it and calls
 *     again from there.  maps is indexed by slot (MQ_QUEUE_SLOTS entries).  One writer per
 *     store (the dispatch role).  Readers see an entry once CQ_MAX covers it.
 */
#ifndef MQ_DISPATCH_H
#define MQ_DISPATCH_H

#include "mqbase.h"
#include "commitlog.h"

#define MQ_CQ_ENTRY_SIZE       20

typedef struct mq_cq_map {
    uint8_t *base;            /* mapped CQ file, or NULL */
    int64_t first_qoff;       /* queue offset of the file's first entry */
    int64_t entries;          /* entries per file */
    int64_t delay_ms;         /* >= 0: SCHEDULE_TOPIC level delay (tags = store ts + delay); -1 otherwise */
} mq_cq_map;

int      mq_dispatch_batch(void *mem, const mq_scan_rec *recs, uint32_t n, mq_cq_map *maps,
                           uint32_t *done_out, uint32_t *need_slot_out, int64_t *need_qoff_out);

#endif
