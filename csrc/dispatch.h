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
 *     the record's own offset makes a repeated dispatch idempotent.  A record whose QUEUEOFFSET
 *     is not CQ_MAX (no checksum covers it) is checked first: below CQ_MAX it may only rewrite
 *     its own entry or a hole (zero or a filler), never another record's; above, the gap must
 *     fit in the CommitLog before it (gap entries x MQ_RECORD_SIZE_MIN bytes since the end of
 *     the queue's last entry, when this file holds it, else since 0), and the gap's entries in
 *     this file become fillers (a gap from an earlier file the caller checks and fills when
 *     it maps this file, moving CQ_MAX to the file's first entry: mq.store.dispatch).  Returns MQ_OK
 *     with *done_out = n; MQ_E_CORRUPT for a record that fails that check (its queue fields
 *     are damaged): *done_out = its index, *need_slot_out and *need_qoff_out its slot and
 *     QUEUEOFFSET, nothing written for it; the caller skips it (and says so) and calls again
 *     after it; or MQ_E_RANGE when a record's file is not in maps (base NULL or the offset
 *     outside it): *done_out = that record's index (the ones before it are done),
 *     *need_slot_out and *need_qoff_out say which file to map; the caller maps it and calls
 *     again from there.  maps is indexed by slot (MQ_QUEUE_SLOTS entries).  One writer per
 *     store (the dispatch role).  Readers see an entry once CQ_MAX covers it.
 * mq_dispatch_for  the dispatch role's steady state for up to wait_ms, no Python between wakes:
 *     scan [DISPATCHED, END) (d->end_pos: WRITE, or COMMITTED in DLedger mode) a batch of
 *     d->cap records at a time (resolve_slots 2), mq_dispatch_batch, mq_index_build into
 *     d->index (NULL: no index; records below d->index_from are skipped, and d->index_from
 *     first drops to DISPATCHED, then rises past each record indexed), DISPATCHED advanced
 *     and SEQ_DISPATCH woken per batch; with nothing to dispatch it sleeps on d->end_seq --
 *     except right after a look that dispatched up to WRITE: then it naps MQ_DISPATCH_NAP_US
 *     without being a waiter (appends pay no wake while records keep coming) and looks again.
 *     d->last_store_ts_ms and d->records (added to) follow the records dispatched.  Whatever
 *     it does not do whole stops it before DISPATCHED moves past that batch, with d->why =
 *     MQ_DISPATCH_CALLER, for the caller's own walk to take over from DISPATCHED: a CQ file
 *     not in d->maps, a record mq_dispatch_batch refuses, an index file without room, a scan
 *     stop other than LIMIT, FULL or END,
 *     and (d->rebase set) DISPATCHED below MIN.  What it did of that batch is redone by that
 *     walk: CQ entries at their own offsets (idempotent); except that before an index file
 *     without room the records indexed are dispatched (DISPATCHED moves to the first one not
 *     indexed: the caller's walk lowers the index's resume point to DISPATCHED first).
 *     MQ_DISPATCH_WAITED when wait_ms passed.  Errors of the scan, the batch and the index
 *     build other than those.
 */
#ifndef MQ_DISPATCH_H
#define MQ_DISPATCH_H

#include "mqbase.h"
#include "commitlog.h"
#include "index.h"

#define MQ_CQ_ENTRY_SIZE       20
#define MQ_CQ_FILLER_SIZE      0x7FFFFFFF  /* a hole's entry: PHYSICALOFFSET 0, this SIZE, TAGSCODE 0
                                              (RocketMQ's fillPreBlank); it points at no record */
#define MQ_DISPATCH_NAP_US     200      /* mq_dispatch_for's nap while busy: what a record may wait
                                           for dispatch beyond its append (RocketMQ's reput: 1 ms) */

typedef struct mq_cq_map {
    uint8_t *base;            /* mapped CQ file, or NULL */
    int64_t first_qoff;       /* queue offset of the file's first entry */
    int64_t entries;          /* entries per file */
    int64_t delay_ms;         /* >= 0: SCHEDULE_TOPIC level delay (tags = store ts + delay); -1 otherwise */
} mq_cq_map;

#define MQ_DISPATCH_WAITED     0
#define MQ_DISPATCH_CALLER     1

typedef struct mq_dispatch_run {
    mq_scan_rec *recs;                           /* the scan batch: cap records */
    mq_cq_map *maps;                             /* MQ_QUEUE_SLOTS, as for mq_dispatch_batch */
    const mq_index_map *index;                   /* NULL: no message index (off or paused) */
    uint64_t index_from;                         /* in/out: records from here on get index entries */
    int64_t last_store_ts_ms;                    /* in/out: STORETS of the last record dispatched */
    uint64_t records;                            /* in/out: records dispatched, added to */
    uint32_t cap;
    int32_t end_pos;                             /* MQ_POS_WRITE, or MQ_POS_COMMITTED (DLedger) */
    int32_t end_seq;                             /* MQ_SEQ_WRITE, or MQ_SEQ_COMMIT */
    int32_t rebase;                              /* DISPATCHED below MIN is the caller's (an install) */
    int32_t why;                                 /* out: MQ_DISPATCH_* */
} mq_dispatch_run;

int      mq_dispatch_for(mq_commitlog *cl, mq_dispatch_run *d, uint32_t wait_ms);
int      mq_dispatch_batch(void *mem, const mq_scan_rec *recs, uint32_t n, mq_cq_map *maps,
                           uint32_t *done_out, uint32_t *need_slot_out, int64_t *need_qoff_out);

#endif
