/*
 * index.h -- the message index: RocketMQ's IndexFile, keys to physical offsets (index.c;
 * Python: mq.store.index, which creates, maps, rolls and sets aside the files).
 *
 * A file is a 40-byte header, slot_num 4-byte hash slots, then index_num 20-byte entries, all
 * big-endian (mq.wire.index declares it):
 *   header: int64 beginTimestamp | int64 endTimestamp | int64 beginPhyOffset |
 *           int64 endPhyOffset | int32 hashSlotCount | int32 indexCount
 *   entry:  int32 keyHash | int64 phyOffset | int32 timeDiff (s since beginTimestamp) |
 *           int32 prevIndex (the slot's previous entry; 0 ends the chain)
 * The key is "<topic>#<key>" and keyHash is |String.hashCode| (0 for MIN_VALUE); its slot is
 * keyHash % slot_num.  Entry 0 is never used, so indexCount starts at 1 and a file is full at
 * index_num.  One writer (the dispatch role); readers in other processes see an entry only
 * once the slot and then indexCount are stored after it (release order).  No lock.
 *
 * Returns: 0 or a negative MQ_E_*, except mq_index_init (void: it cannot fail).  m->base NULL
 * is asserted; the sizes in *m come from configuration and are checked (MQ_E_INVAL).
 *
 * mq_index_init   a new file's header: begin and end are the previous file's end (0 for the
 *     first), hashSlotCount 0, indexCount 1.
 * mq_index_build  indexes each record of recs[0..n) with phy_offset >= from (earlier ones are
 *     in the index already): its UNIQ_KEY and each space-separated KEYS word (at most
 *     MQ_INDEX_KEYS_MAX keys; a key whose "<topic>#<key>" is over MQ_INDEX_KEY_MAX bytes is
 *     left out), read from the CommitLog through cl (mq_commitlog_view_raw).  Prepared and
 *     rolled-back transaction messages are skipped, as RocketMQ does.  All keys of one record
 *     go into one file.  MQ_OK with *done_out = n; MQ_E_FULL with *done_out = the record's
 *     index when its keys do not fit below room_num (the caller allocates more, or starts a
 *     new file, and calls again from there); view_raw's errors with *done_out likewise;
 *     MQ_E_INVAL when slot_num is 0, index_num <= MQ_INDEX_KEYS_MAX or room_num > index_num.
 * mq_index_query  the physical offsets of entries for `key` ("<topic>#<key>") stored within
 *     [begin_ms, end_ms], newest first, appended to out at *n_io until *n_io == cap.  Stops at
 *     a broken chain (a prevIndex not below its entry, or a negative timeDiff).  MQ_OK;
 *     MQ_E_CORRUPT when indexCount is over index_num (the file is damaged: skip it);
 *     MQ_E_INVAL when slot_num is 0.
 */
#ifndef MQ_INDEX_H
#define MQ_INDEX_H

#include "mqbase.h"
#include "commitlog.h"

#define MQ_INDEX_HEADER        40        /* bytes of the header */
#define MQ_INDEX_SLOT          4         /* bytes of a hash slot */
#define MQ_INDEX_UNIT          20        /* bytes of an entry */
#define MQ_INDEX_COUNT_OFFSET  36        /* indexCount: the header's last int32 */
#define MQ_INDEX_KEY_MAX       512       /* bytes of "<topic>#<key>"; longer keys are not indexed */
#define MQ_INDEX_KEYS_MAX      64        /* keys indexed per record (UNIQ_KEY + KEYS words) */

typedef struct mq_index_map {
    uint8_t *base;            /* the mapped file */
    uint32_t slot_num;        /* maxHashSlotNum */
    uint32_t index_num;       /* maxIndexNum */
    uint32_t room_num;        /* entries whose bytes are allocated on disk (<= index_num): writes into a
                                 hole of a sparse file on a full disk would be a SIGBUS, not an error */
} mq_index_map;

void     mq_index_init(const mq_index_map *m, int64_t prev_end_phy, int64_t prev_end_ts);
int      mq_index_build(mq_commitlog *cl, const mq_index_map *m, const mq_scan_rec *recs, uint32_t n,
                        uint64_t from, uint32_t *done_out);
int      mq_index_query(const mq_index_map *m, const uint8_t *key, uint32_t key_len, int64_t begin_ms,
                        int64_t end_ms, int64_t *out, uint32_t cap, uint32_t *n_io);

#endif
