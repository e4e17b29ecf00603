/*
 * commitlog.h -- the CommitLog: one process's handle on the store's mapped files, appends,
 * reads, scans, flushes (commitlog.c; Python: mq.store.commitlog).
 *
 * Record (RocketMQ v1, big-endian; IPv4 hosts shown, IPv6 adds 12 bytes a host and sets
 * SYSFLAG 0x10 / 0x20; mq.wire.commitlog declares it):
 *   TOTALSIZE 4 | MAGIC 4 (0xDAA320A7) | BODYCRC 4 | QUEUEID 4 | FLAG 4 |
 *   QUEUEOFFSET 8 | PHYSICALOFFSET 8 | SYSFLAG 4 | BORNTS 8 | BORNHOST 8 |
 *   STORETS 8 | STOREHOST 8 | RECONSUMETIMES 4 | PREPAREDTXOFFSET 8 |
 *   BODYLEN 4 | BODY | TOPICLEN 1 | TOPIC | PROPSLEN 2 | PROPS
 * BODYCRC is the CRC32 of BODY & 0x7FFFFFFF.  End-of-file filler: int32 room | int32
 * 0xCBD43194.  A record never spans two files: whenever record_size + 8 > room left, the
 * filler is written and the record opens the next file.  Files are named by their 20-digit
 * start offset and are exactly file_size bytes.  DLedger mode wraps each record in an entry
 * (dledger.h); PHYSICALOFFSET is then the entry's position + 48.
 *
 * Threads and locks.  A handle may be used by several threads of its process; each file is
 * mapped once per handle (the handle's seg_lock, process-local, guards its table of mappings)
 * and stays mapped until mq_commitlog_release or close.  Appends take the control block's
 * lock (ctl.h); lock order: the control block's lock, then seg_lock.  Views and scans take no
 * lock: they read below WRITE, which only grows -- except through recovery's mq_ctl_set, before
 * readers start, and mq_dledger_truncate, which never cuts below COMMITTED, where readers in
 * DLedger mode stop.
 *
 * Returns: 0 or a negative MQ_E_*, except mq_commitlog_errno (a getter), mq_commitlog_close
 * (void) and mq_commitlog_append_group (a count: see it).  "File errors" below, for every call
 * that maps a file: MQ_E_IO or MQ_E_NOSPACE (errno kept in the handle) when open, fallocate or
 * mmap fails; MQ_E_CORRUPT when an existing file's size is not file_size (longer, or shorter
 * when it is not being created); MQ_E_RANGE when a file a read needs does not exist.
 *
 * mq_commitlog_open   a handle on the files under `dir` for the store of control block
 *     ctl_mem: MQ_OK and *out.  Maps nothing yet.  MQ_E_INVAL when dir or opts->index_dir is
 *     longer than PATH_MAX - 33 bytes, or in DLedger mode index_dir is NULL or index_file_size
 *     is not a positive multiple of 4096 and 32; MQ_E_BAD_CTL when the block fails
 *     mq_ctl_check or was made for another file_size; MQ_E_IO when out of memory.
 * mq_commitlog_close  unmaps and closes everything; NULL is a no-op.  No other thread may be
 *     using the handle.
 * mq_commitlog_errno  the errno of this handle's last MQ_E_IO or MQ_E_NOSPACE.
 *
 * mq_commitlog_append_one  one message to req's topic-queue.  Refused with nothing written:
 *     MQ_E_TOPIC_ILLEGAL (topic empty, over 127 bytes, or outside [%|a-zA-Z0-9_-]),
 *     MQ_E_INVAL (queue_id < 0, born_host_len not 4 or 16), MQ_E_PROPS_TOO_LONG (the
 *     properties with extra_props over 32767 bytes), MQ_E_MSG_ILLEGAL (body empty or over
 *     max_message_size), MQ_E_TOO_BIG (the record, or its entry, + 8 over file_size),
 *     MQ_E_TABLE_FULL (a new topic-queue and no free slot), MQ_E_IO (the lock), then under the
 *     lock MQ_E_FATAL (the store has a sticky error), MQ_E_NOT_LEADER (DLedger: DL_APPEND_TERM
 *     is 0), file errors.  MQ_OK: *out filled and the record published -- WRITE, the queue's
 *     NEXT_OFFSET, LAST_STORE_TS and MSGS moved (DLedger: DL_NEXT_INDEX and DL_END_TERM too)
 *     through the journal, SEQ_WRITE woken.  STORETS = max(now, LAST_STORE_TS).  Prepared and
 *     rolled-back messages (SYSFLAG) get queue offset 0 and do not move NEXT_OFFSET.  The
 *     sender's BODYCRC is not trusted: the CRC is computed here.
 * mq_commitlog_append_batch  a SEND_BATCH_MESSAGE body -- per message  totalSize 4 | magic 4 |
 *     bodyCRC 4 | flag 4 | bodyLen 4 | body | propsLen 2 | props  (MessageDecoder.encodeMessages,
 *     mq.wire.batch) -- to one topic-queue: consecutive queue offsets, all published together
 *     (one journal, one wake) or none.  Returns what append_one returns, and MQ_E_MSG_ILLEGAL
 *     for batch_len 0 or over max_message_size, a malformed message, or more than
 *     min(out_cap, MQ_BATCH_MSGS_MAX) messages.  MQ_OK: *n_out messages, out[0..n) filled.
 * mq_commitlog_append_group  n single messages of any topic-queues, each appended as
 *     append_one would (its own checks, its own journal, in array order), with its outcome in
 *     rc_out[i]: MQ_OK and out[i], or that message's error (the others are unaffected).
 *     SEQ_WRITE is woken once, after the last.  EXCEPTION to the convention: returns how many
 *     were appended (>= 0), or MQ_E_INVAL with nothing appended when n > MQ_BATCH_MSGS_MAX.
 *
 * mq_commitlog_view   *ptr = the mapped bytes [offset, offset + size) when they lie inside
 *     [MIN, WRITE) and one file: MQ_OK; MQ_E_RANGE otherwise (size 0 too); file errors.  The
 *     pointer is valid until the file is released or the handle closed.
 * mq_commitlog_view_raw  the same for any bytes of an existing file, written or not (recovery,
 *     tools): MQ_E_RANGE only for size 0, a range crossing a file's end, or no such file.
 * mq_commitlog_read_record  the read path's view of one record: as mq_commitlog_view, then the
 *     record is checked whole -- magic, every length, BODYCRC, PHYSICALOFFSET == offset,
 *     TOTALSIZE == size, when queue_id >= 0 QUEUEID == queue_id and QUEUEOFFSET ==
 *     queue_offset, and when topic is not NULL TOPIC == topic[0:topic_len] (what its
 *     ConsumeQueue entry says) -- so bytes damaged on disk or in memory since they were written
 *     are never served.  MQ_E_CORRUPT when the check fails (*ptr is set, for a report).  One
 *     CRC of the body per call.  Not covered (the v1 record has no checksum for them): the
 *     properties, timestamps, hosts and flags.
 * mq_commitlog_gather  a pull's records, one call for a run of ConsumeQueue entries (`entries`:
 *     n_entries of 20 bytes, phy i64, size i32, tags hash i64, big-endian).  In order, an entry
 *     is examined (counted in res->scanned, its phy in res->last_phy) and skipped when phy <
 *     min_phy or, with n_codes > 0, its tags hash is not in codes[0..n_codes) (sorted
 *     ascending); otherwise its record is read as mq_commitlog_read_record reads it (queue id,
 *     queue offset first_queue_offset + index, topic) and copied to out.  It stops before an
 *     entry once res->n >= count_max or the record would take res->size past bytes_max (never
 *     before the first copied record, counting `have` records copied by earlier calls for the
 *     same pull); before a record that does not fit out_cap; or at an
 *     entry whose read fails: then res->stop_rc is that error (MQ_E_CORRUPT, MQ_E_RANGE, file
 *     errors; MQ_E_FULL for out_cap), the entry is not counted, and the caller deals with it and
 *     calls again after it.  Otherwise stop_rc is MQ_OK.  Returns MQ_OK, or MQ_E_INVAL for
 *     count_max 0.
 * mq_records_props  the values of named properties in n whole records one after another at
 *     buf[0, len) (a gather's output), for a filter that reads a few properties of each.
 *     names: n_names keys concatenated, each a property name followed by 0x01, name_lens[j]
 *     its length (with the 0x01).  For record i, with stride 2 * (n_names + 1):
 *     spans[i * stride] = its offset in buf, [+ 1] its TOTALSIZE; then per key j, [+ 2 + 2j] =
 *     the value's offset in buf and [+ 3 + 2j] its length, or -1, -1 when the record has no
 *     non-empty value for it.  The value is that of the name's last occurrence that starts the
 *     properties or follows a 0x02 and is non-empty (Java's decoding keeps a name's last value;
 *     an empty value is no property), up to the next 0x02 or the end.  MQ_OK; MQ_E_CORRUPT
 *     when a record is not whole and well formed in buf (records before it are filled);
 *     MQ_E_INVAL when len or a record offset is over INT32_MAX.
 * mq_record_check  the checks of a scan on a plain buffer (tools, HA): the record at buf with
 *     avail bytes readable -- magic, every length, TOPIC, QUEUEID and QUEUEOFFSET as an append
 *     writes them (MQ_SCAN_BAD_FIELD), BODYCRC when check_crc.  MQ_OK with *rec
 *     filled (slot UINT32_MAX, dl_* 0) and *stop_out MQ_SCAN_LIMIT, or MQ_E_CORRUPT with
 *     *stop_out the kind (MQ_SCAN_TORN: it runs past avail).  PHYSICALOFFSET is reported, not
 *     compared: that is the caller's.
 * mq_commitlog_scan   walks records from `from` while pos < limit, into out[0..cap).  Returns
 *     MQ_OK with *stop_out saying why it stopped (enum mq_scan_stop: a bad record is an MQ_OK
 *     with a BAD_* or TORN stop, the caller decides), or a file error (a missing file is
 *     MQ_SCAN_END, not an error), or with resolve_slots == 2 mq_queue_lookup's MQ_E_TABLE_FULL
 *     or MQ_E_IO.  Always sets *n_out (records returned) and *next_out (the first byte not
 *     returned).  Fillers are stepped over; PHYSICALOFFSET must equal the position.
 *     resolve_slots: 0 none, 1 look up, 2 look up or create each record's topic-queue slot.
 *     DLedger mode walks entries (index continuity, terms never going back) and returns the
 *     records inside them.  Lock-free (except slot creation).
 * mq_commitlog_prepare_file  creates, sizes (fallocate), maps and pre-touches file
 *     `file_index` from the page of log position `from_pos` on (0: the whole file; the pages
 *     before the write position hold records, and touching one only makes the kernel write it
 *     again), so the first append into a page takes no fault; the touch (an atomic add of 0 per
 *     page) changes no byte a concurrent appender writes.  With opts.touch_page_folios it runs
 *     with readahead off (MADV_RANDOM), so the touched pages are cached one page a folio and an
 *     msync writes the pages it covers, not the large folios around them (for SYNC_FLUSH: the
 *     touch costs up to 5x the CPU).  MQ_OK or file errors.
 * mq_commitlog_flush  makes [FLUSHED, WRITE) durable with msync(MS_SYNC), file by file.  Skips
 *     (MQ_OK, nothing done) when fewer than least_pages dirty pages are in the current file and
 *     no older file has unflushed bytes (RocketMQ's isAbleToFlush).  MQ_OK: FLUSHED and
 *     FLUSHED_STORE_TS advanced (DLedger: DL_FLUSHED_INDEX too, and nothing when a truncation
 *     ran meanwhile), SEQ_FLUSH woken.  MQ_E_FATAL: the store is already fatal.  MQ_E_IO: msync
 *     failed -- the error is made sticky (mq_ctl_set_fatal), errno kept; FLUSHED never moves
 *     past bytes not made durable.  File errors (a file deleted meanwhile is skipped).
 *     *flushed_out = FLUSHED afterwards, on every outcome.  Takes the lock twice, briefly.
 * mq_commitlog_flush_for  SYNC_FLUSH's loop (the flush role): for up to wait_ms, flushes
 *     (mq_commitlog_flush with least_pages 0) whenever WRITE is past FLUSHED and sleeps on
 *     SEQ_WRITE otherwise, with no Python between a wake and its msync.  Each flush that moved
 *     FLUSHED is recorded in recs[*n_out] (n_out counts from what the caller passed: it takes
 *     and zeroes them) -- the wall clock and POS_MSGS before it, its bytes and duration -- and
 *     the call returns once cap are kept, at wait_ms, or at a fatal store (MQ_E_FATAL; MQ_E_IO
 *     as mq_commitlog_flush's).  MQ_OK otherwise.
 * mq_commitlog_resync  the first position in [from, limit) where a whole record starts --
 *     MAGIC at +4, PHYSICALOFFSET equal to the position, and mq_record_check passes (no CRC);
 *     in DLedger mode a whole entry: MAGIC at +0, its POS equal to the position, dl_entry_check
 *     -- in *at_out, or limit when there is none (missing files are stepped over).  How a walk
 *     over damaged bytes finds the records after them: records never cross files, and a
 *     record's own position in it is a sync mark no stray bytes are likely to repeat.  Reads
 *     only.  MQ_OK; file errors.
 * mq_commitlog_zero_tail  zeroes the file holding `from`, from there to its end (writing only
 *     pages that hold non-zero bytes), and msyncs it: after recovery truncates, stale bytes
 *     past the new end can never chain into records.  MQ_OK (also when the file does not
 *     exist), MQ_E_IO / MQ_E_NOSPACE, MQ_E_CORRUPT (a file of the wrong size).
 * mq_commitlog_release  unmaps and closes this handle's files below offset `below` and from
 *     file index from_index on.  MQ_OK.  Contract: no view into them is still in use, and no
 *     other thread of this handle is inside an HA or DLedger call on them (the HA slave reads
 *     the mapping; DLedger sends use the handle's fd after letting go of seg_lock).
 * mq_commitlog_retire  lets go of this handle's data files below offset `below` (retention
 *     deleted them: a mapping or an fd keeps a deleted file's blocks on disk) where views into
 *     them may still be held: each mapping is replaced, at the same addresses, by read-only zero
 *     pages of no file (a held view reads zeros -- a record there fails its checks -- and never
 *     faults; the addresses stay reserved until close), and the fd is closed.  The handle never
 *     maps a file below `below` again (a reader that checked MIN just before retention moved it
 *     gets MQ_E_RANGE, as for a deleted file).  MQ_OK; MQ_E_IO (errno) if a replacement failed
 *     (that file stays mapped).  Contract: no other thread of this handle is inside a DLedger
 *     call on those files (it uses the handle's fd); the HA transport may be (it owns a dup).
 */
#ifndef MQ_COMMITLOG_H
#define MQ_COMMITLOG_H

#include "mqbase.h"

#define MQ_BATCH_RECORD_SIZE_MIN 22     /* a batch message with empty body and properties */

typedef struct mq_commitlog_opts {
    uint64_t file_size;            /* mappedFileSizeCommitLog */
    uint8_t store_host[4];         /* brokerIP1 */
    int32_t store_port;            /* listenPort */
    int32_t dledger;               /* 1: DLedger mode (entries around records, index files) */
    const char *index_dir;         /* DLedger mode: the index files' directory */
    uint64_t index_file_size;      /* DLedger mode: bytes per index file (multiple of 32 and 4096) */
    int32_t touch_page_folios;     /* 1: pre-touch with readahead off (mq_commitlog_prepare_file) */
} mq_commitlog_opts;

typedef struct mq_append_req {
    const char *topic;             /* UTF-8, not NUL-terminated */
    uint32_t topic_len;
    int32_t queue_id;
    int32_t sys_flag;              /* bits 0x10/0x20 are set by the encoder from the host lengths */
    int32_t reconsume_times;
    int64_t born_ts_ms;
    int64_t prepared_tx_offset;
    uint8_t born_host[16];         /* IPv4 in the first 4 bytes, or IPv6 */
    uint32_t born_host_len;        /* 4 or 16 */
    int32_t born_port;
    const uint8_t *extra_props;    /* appended to every message's properties (batch-level), may be NULL */
    uint32_t extra_props_len;
    uint32_t max_message_size;     /* body limit, maxMessageSize */
} mq_append_req;

typedef struct mq_append_out {
    uint64_t phy_offset;           /* the record's (DLedger mode: entry pos + 48) */
    int64_t queue_offset;
    int64_t store_ts_ms;
    int64_t dl_index;              /* DLedger mode: the entry's index and term; 0 otherwise */
    int64_t dl_term;
    uint32_t size;                 /* the record's */
    char msg_id[33];               /* offset msgId (MQ_MSG_ID_V4_LEN hex digits), NUL-terminated */
} mq_append_out;

/* One message of a group append: the fields of an mq_append_req of its own.  The pointers are
 * the caller's and need only live through the call. */
typedef struct mq_group_msg {
    const char *topic;             /* UTF-8, not NUL-terminated */
    const uint8_t *born_host;      /* 4 (IPv4) or 16 (IPv6) bytes */
    const uint8_t *body;
    const uint8_t *props;          /* the message's own properties, may be NULL when props_len is 0 */
    const uint8_t *extra_props;    /* appended after them (the broker's CLUSTER), may be NULL */
    int64_t born_ts_ms;
    uint32_t topic_len;
    int32_t queue_id;
    int32_t sys_flag;
    int32_t flag;
    int32_t reconsume_times;
    int32_t born_port;
    uint32_t born_host_len;
    uint32_t body_len;
    uint32_t props_len;
    uint32_t extra_props_len;
} mq_group_msg;

enum mq_scan_stop {
    MQ_SCAN_LIMIT = 0,   /* reached the requested limit position */
    MQ_SCAN_FULL,        /* the output array is full; call again from *next */
    MQ_SCAN_END,         /* clean end: a zero TOTALSIZE, or no next file after a filler */
    MQ_SCAN_BAD_MAGIC,
    MQ_SCAN_BAD_SIZE,    /* TOTALSIZE does not match the recomputed length, or out of bounds */
    MQ_SCAN_BAD_CRC,
    MQ_SCAN_TORN,        /* the record runs past its file's end or the scan limit */
    MQ_SCAN_BAD_OFFSET,  /* PHYSICALOFFSET is not where the record sits (a stale record); DLedger: or pos */
    MQ_SCAN_BAD_INDEX,   /* DLedger: an index that does not follow the previous one, or a term going back */
    MQ_SCAN_BAD_FIELD,   /* a field no append writes: TOPIC outside the appender's rule (1-127 bytes of
                          * [%|a-zA-Z0-9_-]), QUEUEID or QUEUEOFFSET negative.  No checksum covers them;
                          * the store files records by them, so such a record is damaged */
    MQ_SCAN_BAD_TERM     /* DLedger recovery (mq.store.store, not the scan): an entry's term above the
                          * member's saved current term, which it never was given */
};

typedef struct mq_flush_rec {      /* one flush of mq_commitlog_flush_for */
    int64_t  ts_us;                 /* CLOCK_REALTIME when it started */
    uint64_t msgs;                  /* POS_MSGS when it started */
    uint64_t bytes;                 /* FLUSHED moved by */
    uint64_t flush_ns;              /* its duration (CLOCK_MONOTONIC) */
} mq_flush_rec;

typedef struct mq_scan_rec {
    uint64_t phy_offset;
    int64_t queue_offset;
    int64_t store_ts_ms;
    int64_t born_ts_ms;
    int64_t tags_code;             /* Java String.hashCode of TAGS, sign-extended; 0 without a tag */
    uint32_t size;
    int32_t queue_id;
    int32_t sys_flag;
    uint32_t slot;                 /* topic-queue slot (looked up or created), or UINT32_MAX */
    uint32_t body_offset, body_len;     /* relative to phy_offset */
    uint32_t topic_offset, topic_len;
    uint32_t props_offset, props_len;
    int64_t dl_index, dl_term;     /* DLedger mode: the entry around the record; 0 otherwise */
    uint64_t dl_pos;               /* DLedger mode: the entry's start (phy_offset - 48) */
} mq_scan_rec;

int      mq_commitlog_open(const char *dir, void *ctl_mem, size_t ctl_len,
                           const mq_commitlog_opts *opts, mq_commitlog **out);
void     mq_commitlog_close(mq_commitlog *cl);
int      mq_commitlog_errno(mq_commitlog *cl);

int      mq_commitlog_append_one(mq_commitlog *cl, const mq_append_req *req, int32_t flag,
                                 const uint8_t *body, uint32_t body_len,
                                 const uint8_t *props, uint32_t props_len, mq_append_out *out);
int      mq_commitlog_append_batch(mq_commitlog *cl, const mq_append_req *req,
                                   const uint8_t *batch, size_t batch_len,
                                   mq_append_out *out, uint32_t out_cap, uint32_t *n_out);
int      mq_commitlog_append_group(mq_commitlog *cl, const mq_group_msg *msgs, uint32_t n,
                                   uint32_t max_message_size, mq_append_out *out, int32_t *rc_out);

int      mq_commitlog_view(mq_commitlog *cl, uint64_t offset, uint32_t size, const uint8_t **ptr);
int      mq_commitlog_view_raw(mq_commitlog *cl, uint64_t offset, uint32_t size, const uint8_t **ptr);
typedef struct mq_gather_out {
    uint32_t scanned;              /* entries examined (the failing one of stop_rc not counted) */
    uint32_t n;                    /* records copied to out */
    uint64_t size;                 /* bytes copied to out */
    int64_t last_phy;              /* phy of the last entry examined, -1 when none */
    int32_t stop_rc;               /* MQ_OK, or the error of entry `scanned` */
} mq_gather_out;

int      mq_commitlog_gather(mq_commitlog *cl, const uint8_t *entries, uint32_t n_entries, uint64_t min_phy,
                             const int64_t *codes, uint32_t n_codes, int32_t queue_id,
                             int64_t first_queue_offset, const char *topic, uint32_t topic_len,
                             uint32_t have, uint32_t count_max, uint64_t bytes_max, uint8_t *out,
                             uint64_t out_cap, mq_gather_out *res);
int      mq_commitlog_read_record(mq_commitlog *cl, uint64_t offset, uint32_t size, int32_t queue_id,
                                  int64_t queue_offset, const char *topic, uint32_t topic_len,
                                  const uint8_t **ptr);
int      mq_commitlog_misnamed(mq_commitlog *cl, const uint8_t *entries, uint32_t n, uint64_t from_phy,
                               int32_t queue_id, int64_t first_qoff, const char *topic, uint32_t topic_len,
                               uint32_t *at_out);
int      mq_record_check(const uint8_t *buf, size_t avail, int check_crc, mq_scan_rec *rec, int *stop_out);
int      mq_records_props(const uint8_t *buf, size_t len, uint32_t n, const uint8_t *names,
                          const uint32_t *name_lens, uint32_t n_names, int32_t *spans);
int      mq_commitlog_scan(mq_commitlog *cl, uint64_t from, uint64_t limit, int check_crc,
                           int resolve_slots, mq_scan_rec *out, uint32_t cap, uint32_t *n_out,
                           uint64_t *next_out, int *stop_out);

int      mq_commitlog_prepare_file(mq_commitlog *cl, uint64_t file_index, uint64_t from_pos);
int      mq_commitlog_flush(mq_commitlog *cl, uint32_t least_pages, uint64_t *flushed_out);
int      mq_commitlog_flush_for(mq_commitlog *cl, uint32_t wait_ms, mq_flush_rec *recs, uint32_t cap,
                                uint32_t *n_out);
int      mq_commitlog_resync(mq_commitlog *cl, uint64_t from, uint64_t limit, uint64_t *at_out);
int      mq_commitlog_zero_tail(mq_commitlog *cl, uint64_t from);
int      mq_commitlog_release(mq_commitlog *cl, uint64_t below, uint64_t from_index);
int      mq_commitlog_retire(mq_commitlog *cl, uint64_t below);

#endif
