/*
 * mqstore.h -- the C core of the store: CommitLog append/read/scan/flush, the
 * shared control block, cross-process wakeups, CRC32 and the small hashes.
 *
 * The boundary is narrow on purpose (LMDB style): opaque handles, offsets as
 * uint64_t, every function returns 0 (MQ_OK) or a negative MQ_E_* code, data
 * crosses as (pointer, length).  No callbacks into Python, no policy: when to
 * roll, flush, truncate or delete is decided by mq/store in Python.
 *
 * ---------------------------------------------------------------------------
 * CommitLog record (RocketMQ v1, big-endian, IPv4 hosts; IPv6 adds 12 bytes a host):
 *   TOTALSIZE 4 | MAGIC 4 (0xDAA320A7) | BODYCRC 4 | QUEUEID 4 | FLAG 4 |
 *   QUEUEOFFSET 8 | PHYSICALOFFSET 8 | SYSFLAG 4 | BORNTS 8 | BORNHOST 8 |
 *   STORETS 8 | STOREHOST 8 | RECONSUMETIMES 4 | PREPAREDTXOFFSET 8 |
 *   BODYLEN 4 | BODY | TOPICLEN 1 | TOPIC | PROPSLEN 2 | PROPS
 * End-of-file filler: int32 remaining | int32 0xCBD43194.  A record never
 * spans two files; whenever record_size + 8 > room left, the filler is written.
 *
 * ---------------------------------------------------------------------------
 * The control block (mq_ctl, in multiprocessing.shared_memory) holds the
 * shared state of one store; every process maps the same CommitLog files.
 * Invariants (all positions are absolute CommitLog byte offsets):
 *   min_pos <= dispatched_pos <= write_pos,  flushed_pos <= write_pos,
 *   acked_pos <= write_pos on a master,
 *   every byte in [min_pos, write_pos) is a complete, valid record or filler,
 *   per queue: next_queue_offset only grows, by exactly one per record.
 * DLedger mode adds (positions below): DL_BEGIN_INDEX <= DL_COMMIT_INDEX <=
 * DL_NEXT_INDEX, COMMITTED <= WRITE, dispatched_pos <= COMMITTED; the index unit
 * of every entry in [DL_BEGIN_INDEX, DL_NEXT_INDEX) describes it; positions move
 * back only in mq_dledger_truncate (never below DL_COMMIT_INDEX).
 * Appends are serialised by a robust process-shared mutex.  An append writes
 * its records beyond write_pos (invisible), then publishes them through a
 * one-entry redo journal: {queue slot, next queue offset, new write_pos}.  If
 * the owner dies (kill -9) while holding the lock, the next locker gets
 * EOWNERDEAD and replays the journal if it was complete, or drops the
 * unpublished bytes if it was not.  Either way no offset is lost or repeated.
 */
#ifndef MQSTORE_H
#define MQSTORE_H

#include <stddef.h>
#include <stdint.h>

/* ---- return codes (0 or negative) ---------------------------------------- */
#define MQ_OK                 0
#define MQ_E_INVAL           -1   /* programmer error: bad argument */
#define MQ_E_IO              -2   /* an I/O call failed; errno is kept in the handle */
#define MQ_E_FATAL           -3   /* the store has a sticky write/flush error and refuses writes */
#define MQ_E_MSG_ILLEGAL     -4   /* body empty or over maxMessageSize, or a malformed batch */
#define MQ_E_TOPIC_ILLEGAL   -5   /* topic empty, over 127 bytes, or outside [%|a-zA-Z0-9_-] */
#define MQ_E_PROPS_TOO_LONG  -6   /* properties over 32767 bytes */
#define MQ_E_RANGE           -7   /* offset outside the readable range [min_pos, write_pos) */
#define MQ_E_CORRUPT         -8   /* bytes at an offset are not a valid record */
#define MQ_E_TABLE_FULL      -9   /* no free topic-queue slot (MQ_QUEUE_SLOTS) */
#define MQ_E_TIMEOUT        -10   /* a wait ran out */
#define MQ_E_NOSPACE        -11   /* the file system is full (not sticky: retry once space is freed) */
#define MQ_E_BAD_CTL        -12   /* the control block has a wrong magic, version or size */
#define MQ_E_TOO_BIG        -13   /* a record does not fit in an empty CommitLog file */
#define MQ_E_NOT_LEADER     -14   /* DLedger mode: appends are refused (DL_APPEND_TERM is 0) */
#define MQ_E_AGAIN          -15   /* a non-blocking socket would block: call again when writable */
#define MQ_E_FULL           -16   /* a message index file has no room for a record's keys */

/* ---- named limits -------------------------------------------------------- */
#define MQ_TOPIC_LEN_MAX       127       /* 1-byte signed TOPICLEN */
#define MQ_PROPS_LEN_MAX       32767     /* 2-byte signed PROPSLEN */
#define MQ_BATCH_MSGS_MAX      8192      /* messages in one append call */
#define MQ_QUEUE_SLOTS         32768     /* distinct (topic, queueId) pairs per store */
#define MQ_BLANK_LEN_MIN       8         /* END_FILE_MIN_BLANK_LENGTH */
#define MQ_MESSAGE_MAGIC       0xDAA320A7u
#define MQ_BLANK_MAGIC         0xCBD43194u

/* ---- control block fields ------------------------------------------------ */
enum mq_pos {                 /* uint64 positions in the control block */
    MQ_POS_WRITE = 0,         /* end of the last published record */
    MQ_POS_FLUSHED,           /* everything below is durable (msync'd) */
    MQ_POS_DISPATCHED,        /* everything below is in the ConsumeQueues */
    MQ_POS_ACKED,             /* highest offset a slave acknowledged (HA) */
    MQ_POS_MIN,               /* lowest retained offset (retention moves it) */
    MQ_POS_LAST_STORE_TS,     /* store timestamp (ms) of the record that ends at WRITE */
    MQ_POS_FLUSHED_STORE_TS,  /* store timestamp (ms) of the record that ends at FLUSHED */
    MQ_POS_CONFIRM,           /* highest offset known to be on the master (slave side) */
    MQ_POS_MSGS,              /* messages appended (or received by a slave) since the block was made;
                                 a statistic: flush group sizes and put counts are differences of it */
    /* DLedger mode (see "DLedger mode" below); unused otherwise */
    MQ_POS_COMMITTED,         /* end of the last committed entry: dispatch and readers stop here */
    MQ_POS_DL_NEXT_INDEX,     /* ledgerEndIndex + 1 */
    MQ_POS_DL_END_TERM,       /* term of the last entry (0 when empty) */
    MQ_POS_DL_APPEND_TERM,    /* the term io workers append in; 0 = appends refused (not a ready leader) */
    MQ_POS_DL_COMMIT_INDEX,   /* committed index + 1 (0: nothing known committed) */
    MQ_POS_DL_FLUSHED_INDEX,  /* entries below this index are durable (flush role) */
    MQ_POS_DL_BEGIN_INDEX,    /* index of the first retained entry */
    MQ_POS_HA_TAKE_BACK_UNTIL,/* a SYNC_MASTER restarted after a crash refuses writes until this
                                 CLOCK_MONOTONIC ms, or until a slave gave back what it holds beyond
                                 the master's end (mq.ha.master); 0 = not waiting */
    MQ_POS_DISK_FULL,         /* 0: the disks have room; else a partition of the store is over
                                 diskSpaceWarningLevelRatio and io workers refuse sends.  Set by the
                                 supervisor's disk check; layout in mq.store.retention (pack_disk_full) */
    MQ_POS_COUNT_
};
enum mq_seq {                 /* futex words: bumped after the matching event */
    MQ_SEQ_WRITE = 0,         /* records were published */
    MQ_SEQ_FLUSH,             /* flushed_pos moved (or the store became fatal) */
    MQ_SEQ_DISPATCH,          /* ConsumeQueues grew */
    MQ_SEQ_ACK,               /* a slave acknowledged more */
    MQ_SEQ_COMMIT,            /* DLedger: COMMITTED moved, or DL_APPEND_TERM changed */
    MQ_SEQ_ROLE,              /* DLedger: the Raft role changed (the role process announces it) */
    MQ_SEQ_COUNT_
};
enum mq_qfield {              /* int64 fields of a topic-queue slot */
    MQ_Q_NEXT_OFFSET = 0,     /* next queue offset to assign (appenders) */
    MQ_Q_CQ_MAX,              /* entries present in the ConsumeQueue (dispatch) */
    MQ_Q_CQ_MIN,              /* first entry still present (retention) */
    MQ_Q_COUNT_
};

/* ---- append -------------------------------------------------------------- */
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
    char msg_id[33];               /* offset msgId, uppercase hex, NUL-terminated (IPv4 store host) */
} mq_append_out;

/* One message of a group append (mq_commitlog_append_group): single messages of any
 * topic-queues, each with the fields of an mq_append_req of its own.  The pointers are the
 * caller's and need only live through the call. */
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

/* ---- scan (dispatch, recovery, tools) ------------------------------------ */
enum mq_scan_stop {
    MQ_SCAN_LIMIT = 0,   /* reached the requested limit position */
    MQ_SCAN_FULL,        /* the output array is full; call again from *next */
    MQ_SCAN_END,         /* clean end: a zero TOTALSIZE, or no next file after a filler */
    MQ_SCAN_BAD_MAGIC,
    MQ_SCAN_BAD_SIZE,    /* TOTALSIZE does not match the recomputed length, or out of bounds */
    MQ_SCAN_BAD_CRC,
    MQ_SCAN_TORN,        /* the record runs past its file's end or the scan limit */
    MQ_SCAN_BAD_OFFSET,  /* PHYSICALOFFSET is not where the record sits (a stale record); DLedger: or pos */
    MQ_SCAN_BAD_INDEX    /* DLedger: an index that does not follow the previous one, or a term going back */
};

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

/* ---- opaque handles ------------------------------------------------------ */
typedef struct mq_ctl mq_ctl;
typedef struct mq_commitlog mq_commitlog;

typedef struct mq_commitlog_opts {
    uint64_t file_size;            /* mappedFileSizeCommitLog */
    uint8_t store_host[4];         /* brokerIP1 */
    int32_t store_port;            /* listenPort */
    int32_t dledger;               /* 1: DLedger mode (entries around records, index files) */
    const char *index_dir;         /* DLedger mode: the index files' directory */
    uint64_t index_file_size;      /* DLedger mode: bytes per index file (multiple of 32 and 4096) */
} mq_commitlog_opts;

/* control block */
size_t   mq_ctl_size(void);
int      mq_ctl_init(void *mem, size_t len, uint64_t file_size);   /* creator, before any attacher */
int      mq_ctl_check(void *mem, size_t len);                      /* attacher */
uint64_t mq_ctl_get(void *mem, int pos);
int      mq_ctl_set(void *mem, int pos, uint64_t value);           /* recovery/retention: takes the lock */
int      mq_ctl_advance(void *mem, int pos, uint64_t value);       /* monotonic max, lock-free */
uint32_t mq_ctl_seq(void *mem, int seq);
int      mq_ctl_wait(void *mem, int seq, uint32_t seen, int timeout_ms);  /* 0 or MQ_E_TIMEOUT; GIL released */
void     mq_ctl_wake(void *mem, int seq);
/* Sleeps until position `pos` >= target (0), the store turns fatal (MQ_E_FATAL) or
 * the timeout (MQ_E_TIMEOUT).  One call per wait: waiters woken for someone
 * else's target go back to sleep without returning to Python. */
int      mq_ctl_wait_pos(void *mem, int seq, int pos, uint64_t target, int timeout_ms);
int      mq_ctl_fatal(void *mem, char *msg_out, size_t msg_cap);   /* 0 if healthy, else the sticky errno */
int      mq_ctl_set_fatal(void *mem, int err, const char *msg);
uint64_t mq_ctl_stat(void *mem, int which);                        /* 0: owner-dead recoveries, 1: journal replays */
/* Fault injection for tests only: takes the append lock and returns holding it,
 * optionally with a complete journal that moves write_pos by `journal_bytes`
 * over bytes the caller already wrote (so the next locker must replay it). */
int      mq_ctl_debug_lock_and_hold(void *mem, uint32_t slot, uint64_t journal_bytes);

/* topic-queue table */
int      mq_queue_lookup(void *mem, const char *topic, uint32_t topic_len, int32_t queue_id,
                         int create, uint32_t *slot_out);
int64_t  mq_queue_get(void *mem, uint32_t slot, int field);
int      mq_queue_set(void *mem, uint32_t slot, int field, int64_t value);   /* takes the lock */
int      mq_queue_advance(void *mem, uint32_t slot, int field, int64_t value); /* monotonic max */
uint32_t mq_queue_count(void *mem);
int      mq_queue_info(void *mem, uint32_t slot, char *topic_out, uint32_t *topic_len, int32_t *queue_id);
/* Every queue's next offset back to its ConsumeQueue's end (a new DLedger leader, whose log may
 * have lost entries it once appended): NEXT_OFFSET = CQ_MAX for each slot, under the lock. */
int      mq_queue_reset_next_offsets(void *mem);

/* commitlog handle (one per process) */
int      mq_commitlog_open(const char *dir, void *ctl_mem, size_t ctl_len,
                           const mq_commitlog_opts *opts, mq_commitlog **out);
void     mq_commitlog_close(mq_commitlog *cl);
int      mq_commitlog_errno(mq_commitlog *cl);       /* errno of the last MQ_E_IO/MQ_E_NOSPACE */
int      mq_commitlog_append_batch(mq_commitlog *cl, const mq_append_req *req,
                                   const uint8_t *batch, size_t batch_len,
                                   mq_append_out *out, uint32_t out_cap, uint32_t *n_out);
int      mq_commitlog_append_one(mq_commitlog *cl, const mq_append_req *req, int32_t flag,
                                 const uint8_t *body, uint32_t body_len,
                                 const uint8_t *props, uint32_t props_len, mq_append_out *out);
/* Group append: n single messages, each appended as mq_commitlog_append_one would append it
 * (its own checks, its own topic-queue, in array order), with its outcome in rc_out[i]: MQ_OK
 * and out[i], or that message's error (the others are unaffected).  SEQ_WRITE is woken once,
 * after the last, instead of once per message.  Returns how many were appended; n is at most
 * MQ_BATCH_MSGS_MAX (else MQ_E_INVAL and nothing appended). */
int      mq_commitlog_append_group(mq_commitlog *cl, const mq_group_msg *msgs, uint32_t n,
                                   uint32_t max_message_size, mq_append_out *out, int32_t *rc_out);
int      mq_commitlog_view(mq_commitlog *cl, uint64_t offset, uint32_t size, const uint8_t **ptr);
int      mq_commitlog_view_raw(mq_commitlog *cl, uint64_t offset, uint32_t size, const uint8_t **ptr);
/* The read path's view of one record: as mq_commitlog_view, then the record is checked whole --
 * magic, every length, BODYCRC, PHYSICALOFFSET == offset, TOTALSIZE == size, and when queue_id
 * >= 0 QUEUEID == queue_id and QUEUEOFFSET == queue_offset (what its ConsumeQueue entry says) --
 * so bytes damaged on disk or in memory since they were written are never served.  MQ_E_CORRUPT
 * when the check fails (*ptr is then set, for a report); one CRC of the body per call.  Not
 * covered (RocketMQ's v1 record has no checksum for them): the topic, properties, timestamps,
 * hosts and flags. */
int      mq_commitlog_read_record(mq_commitlog *cl, uint64_t offset, uint32_t size, int32_t queue_id,
                                  int64_t queue_offset, const uint8_t **ptr);
int      mq_commitlog_prepare_file(mq_commitlog *cl, uint64_t file_index);
int      mq_commitlog_scan(mq_commitlog *cl, uint64_t from, uint64_t limit, int check_crc,
                           int resolve_slots, mq_scan_rec *out, uint32_t cap, uint32_t *n_out,
                           uint64_t *next_out, int *stop_out);
int      mq_commitlog_flush(mq_commitlog *cl, uint32_t least_pages, uint64_t *flushed_out);
int      mq_commitlog_zero_tail(mq_commitlog *cl, uint64_t from);
/* mq_commitlog_release unmaps and closes this handle's files below `below` and from
 * from_index on.  Contract: no other thread of this handle may be inside an HA send or
 * receive on those files (they use a file's fd after letting go of the segment lock). */
int      mq_commitlog_release(mq_commitlog *cl, uint64_t below, uint64_t from_index);

/* ConsumeQueue dispatch: writes the 20-byte entry of each scanned record at its
 * QUEUEOFFSET into the mapped CQ file described by maps[slot], and advances the
 * slot's CQ_MAX.  Records of prepared/rollback transactions are skipped.  When a
 * record's CQ file is not in maps, returns MQ_E_RANGE with *done_out = its index,
 * *need_slot_out / *need_qoff_out saying which file to map; the caller maps it
 * and calls again from there.  maps is indexed by slot (MQ_QUEUE_SLOTS entries). */
typedef struct mq_cq_map {
    uint8_t *base;            /* mapped CQ file, or NULL */
    int64_t first_qoff;       /* queue offset of the file's first entry */
    int64_t entries;          /* entries per file */
    int64_t delay_ms;         /* >= 0: SCHEDULE_TOPIC level delay (tags = store ts + delay); -1 otherwise */
} mq_cq_map;
int      mq_dispatch_batch(void *mem, const mq_scan_rec *recs, uint32_t n, mq_cq_map *maps,
                           uint32_t *done_out, uint32_t *need_slot_out, int64_t *need_qoff_out);

/* ---- message index (RocketMQ's IndexFile; mq.store.index) ----------------------
 * A file is a 40-byte header, slot_num 4-byte hash slots, then index_num 20-byte
 * entries, all big-endian:
 *   header: int64 beginTimestamp | int64 endTimestamp | int64 beginPhyOffset |
 *           int64 endPhyOffset | int32 hashSlotCount | int32 indexCount
 *   entry:  int32 keyHash | int64 phyOffset | int32 timeDiff (s since beginTimestamp) |
 *           int32 prevIndex (the slot's previous entry; 0 ends the chain)
 * The key is "<topic>#<key>" and keyHash is |String.hashCode| (0 for MIN_VALUE);
 * entry 0 is never used, so indexCount starts at 1 and a file is full at index_num.
 * One writer (the dispatch role); readers in other processes see an entry only
 * once the slot and then indexCount are stored after it (release order). */
#define MQ_INDEX_HEADER        40
#define MQ_INDEX_UNIT          20
#define MQ_INDEX_KEY_MAX       512       /* bytes of "<topic>#<key>"; longer keys are not indexed */
#define MQ_INDEX_KEYS_MAX      64        /* keys indexed per record (UNIQ_KEY + KEYS words) */
typedef struct mq_index_map {
    uint8_t *base;            /* the mapped file */
    uint32_t slot_num;        /* maxHashSlotNum */
    uint32_t index_num;       /* maxIndexNum */
    uint32_t room_num;        /* entries whose bytes are allocated on disk (<= index_num): writes into a
                                 hole of a sparse file on a full disk would be a SIGBUS, not an error */
} mq_index_map;
/* A new file's header: begin and end are the previous file's end (0 for the first). */
void     mq_index_init(const mq_index_map *m, int64_t prev_end_phy, int64_t prev_end_ts);
/* Indexes each record with phy_offset >= from (earlier ones are in the index already):
 * its UNIQ_KEY and each space-separated KEYS word, as "<topic>#<key>".  Prepared and
 * rolled-back transaction messages are skipped, as RocketMQ does.  All keys of one
 * record go into one file: MQ_E_FULL with *done_out = the record's index when they do
 * not fit in room_num (the caller allocates more, or starts a new file, and calls again).  view: the
 * CommitLog handle the records were scanned from. */
int      mq_index_build(mq_commitlog *cl, const mq_index_map *m, const mq_scan_rec *recs, uint32_t n,
                        uint64_t from, uint32_t *done_out);
/* The physical offsets of entries for "<topic>#<key>" stored within [begin_ms, end_ms],
 * newest first, at most cap (appended to out at *n_io).  Stops at a broken chain. */
int      mq_index_query(const mq_index_map *m, const uint8_t *key, uint32_t key_len, int64_t begin_ms,
                        int64_t end_ms, int64_t *out, uint32_t cap, uint32_t *n_io);

/* ---- HA (master/slave replication of the CommitLog bytes) ----------------
 * Master -> slave frame: int64 masterPhyOffset | int32 bodySize | bodySize raw
 * CommitLog bytes (bodySize 0 = heartbeat).  A body never crosses a file.
 *
 * mq_ha_send_frame: sends the header, then up to max_body bytes of [offset,
 *   write_pos) from one file with sendfile(2) (no copy through user space) on a
 *   blocking socket.  *body_out = bytes of body sent (0 when nothing is written
 *   yet: a heartbeat).  MQ_E_IO with errno on a socket error.
 * mq_ha_recv_body: receives exactly `size` bytes from a blocking socket and
 *   writes them into the file at `offset` (splice socket -> pipe -> file, or
 *   recv + pwrite where splice is refused; creating the file if needed); the
 *   bytes are beyond write_pos, so nobody reads them yet.
 * mq_ha_publish: validates records from write_pos up to `received_end`
 *   (magic, size, CRC, PHYSICALOFFSET) and publishes the complete ones
 *   (write_pos, LAST_STORE_TS; SEQ_WRITE is bumped).  A record cut by the end of
 *   what was received stays pending.  MQ_E_CORRUPT when a record is invalid:
 *   the caller drops the connection and receives again from write_pos. */
int      mq_ha_send_frame(mq_commitlog *cl, int sock_fd, uint64_t offset, uint32_t max_body, uint32_t *body_out);
int      mq_ha_recv_body(mq_commitlog *cl, int sock_fd, uint64_t offset, uint32_t size);
int      mq_ha_publish(mq_commitlog *cl, uint64_t received_end, uint64_t *published_out);

/* The streaming loops, one C call for many frames (catch-up is bound by
 * per-frame work, not by bytes: at 32 KiB frames a Python round per frame cost
 * ~100 us against ~12 us to move the bytes).  The frames on the wire are the
 * same as one mq_ha_send_frame per frame.
 *
 * mq_ha_send_run: sends [from, to) as frames of at most frame_max bytes, none
 *   crossing a file (to <= write_pos).  Before each frame is sent,
 *   *in_flight_end is stored (release) as that frame's end: the ack checker
 *   reads it, so an ack can never cover bytes not yet being sent.
 *   *sent_end_out = end of the last frame sent whole (== to on MQ_OK).
 * mq_ha_recv_run: the slave's loop.  Reads frame headers (a header once begun
 *   is read whole, bounded by SO_RCVTIMEO) while bytes keep coming: a frame at
 *   *expected with a body of at most body_max bytes inside one file is received
 *   into the log and *expected advances; a heartbeat at *expected is consumed.
 *   Before each header after the first, a non-blocking read: nothing ready ->
 *   it stops (*why_out = MQ_HA_RX_IDLE); at least `budget` bytes received ->
 *   it stops (MQ_HA_RX_BUDGET); any other header is consumed and handed back in
 *   *other_offset and *other_size (MQ_HA_RX_OTHER) for the caller's rules (rebase,
 *   divergence, rejection).  What was received is validated and published
 *   (mq_ha_publish) before it returns: *published_out; MQ_E_CORRUPT when a
 *   record is invalid.  MQ_E_IO with errno on a socket error (EAGAIN: stalled
 *   past SO_RCVTIMEO; ECONNRESET: closed by the peer). */
#define MQ_HA_RX_IDLE   0
#define MQ_HA_RX_BUDGET 1
#define MQ_HA_RX_OTHER  2
int      mq_ha_send_run(mq_commitlog *cl, int sock_fd, uint64_t from, uint64_t to, uint32_t frame_max,
                        uint64_t *in_flight_end, uint64_t *sent_end_out);
int      mq_ha_recv_run(mq_commitlog *cl, int sock_fd, uint64_t *expected, uint64_t budget, uint32_t body_max,
                        int *why_out, uint64_t *other_offset, uint32_t *other_size, uint64_t *published_out);

/* ---- DLedger mode ----------------------------------------------------------
 * A CommitLog opened with opts->dledger holds DLedger's data files: each record
 * is the body of one entry (DLedger 0.3, big-endian):
 *   magic 4 (=1) | size 4 (48 + bodySize) | index 8 | term 8 | pos 8 (entry start) |
 *   channel 4 (0) | chainCrc 4 (0) | bodyCrc 4 (0) | bodySize 4 | body = one record
 * The record's PHYSICALOFFSET is pos + 48 (what msgIds, ConsumeQueues and reads
 * use); its TOTALSIZE is bodySize.  Whenever entry size + 8 > room left, the
 * filler  int32 -1 | int32 room  is written and the entry opens the next file.
 * Index files (opts->index_dir, files of index_file_size bytes named by their
 * 20-digit start offset): entry i's unit at byte i * 32:
 *   magic 4 (=1) | pos 8 | size 4 (entry size) | index 8 | term 8
 * Indexes start at 0 and are dense.  mq_commitlog_append_* add one entry per
 * message with index DL_NEXT_INDEX++ and term DL_APPEND_TERM (MQ_E_NOT_LEADER
 * when it is 0); mq_commitlog_scan walks entries and reports the records
 * (dl_index, dl_term, dl_pos set); mq_commitlog_flush advances DL_FLUSHED_INDEX.
 *
 * mq_dledger_append_noop: a new leader's first entry, in `term` (>= DL_END_TERM;
 *   DL_APPEND_TERM is not consulted): a record of topic RMQ_SYS_DLEDGER_NOOP,
 *   queue 0, sysFlag TRANSACTION_ROLLBACK (no ConsumeQueue entry, here or in a
 *   Java broker), body = the term (8 bytes).
 * mq_dledger_entry: pos, size and term of entry `index` from its index unit;
 *   MQ_E_RANGE outside [DL_BEGIN_INDEX, DL_NEXT_INDEX), MQ_E_CORRUPT if the unit
 *   is not that entry's.
 * mq_dledger_append_raw: a follower appends the leader's bytes: `buf` holds
 *   whole entries exactly as in the leader's files from first_pos (fillers, each
 *   reaching its file's end, may sit between or after them).  first_pos must be
 *   WRITE, or the start of the next file when the first entry does not fit in
 *   the rest of WRITE's file (the leader rolled over after we had its last entry
 *   of that file: we write the same filler from WRITE), and first_index
 *   DL_NEXT_INDEX (MQ_E_RANGE), DL_APPEND_TERM 0
 *   (MQ_E_INVAL).  Every entry is checked before anything is written: magic,
 *   sizes, index continuity, term nondecreasing from DL_END_TERM and <= max_term,
 *   pos, the room rule, the record inside (CRC, PHYSICALOFFSET = pos + 48,
 *   TOTALSIZE = bodySize); any fault -> MQ_E_CORRUPT, nothing published.  Then
 *   the bytes are copied, the index units written, and WRITE, DL_NEXT_INDEX,
 *   DL_END_TERM, LAST_STORE_TS, MSGS published under the lock (SEQ_WRITE wakes).
 * mq_dledger_truncate: DL_NEXT_INDEX becomes next_index (<= it; never below
 *   DL_COMMIT_INDEX or DL_BEGIN_INDEX: MQ_E_INVAL): WRITE moves back to that
 *   entry's pos, the data bytes and index units past the new end are zeroed and
 *   made durable, DL_END_TERM follows, FLUSHED is clamped.  Files are never
 *   deleted or shrunk (other processes keep them mapped).
 * mq_dledger_set_commit: DL_COMMIT_INDEX to commit_next_index (monotonic,
 *   MQ_E_RANGE past DL_NEXT_INDEX) and COMMITTED to the end of entry
 *   commit_next_index - 1; wakes SEQ_COMMIT.  Lock-free; contract: called only
 *   by the thread that also truncates (the Raft role's).
 * mq_dledger_set_append_term: DL_APPEND_TERM under the lock (no append of the old
 *   term is in progress once it returns); wakes SEQ_COMMIT.
 * mq_dledger_recover_index: rewrites the index unit of each entry in
 *   [from_pos, end_pos) (already validated by a scan), zeroes the units after
 *   the last one to the end of its index file; the next index and last term
 *   (0 and 0 when the range holds no entry).
 * mq_dledger_send: writes `head`, then body_len bytes of the data files at
 *   from_pos with sendfile(2) (one file, below WRITE, else MQ_E_RANGE), to a
 *   socket that may be non-blocking: *done_io is the progress over head + body
 *   (in: where to resume).  MQ_OK when all is sent, MQ_E_AGAIN when the socket
 *   would block, MQ_E_IO on a socket error (errno in the handle). */
#define MQ_DL_HEADER_SIZE   48
#define MQ_DL_MAGIC         1
#define MQ_DL_INDEX_UNIT    32
int      mq_dledger_append_noop(mq_commitlog *cl, int64_t term, mq_append_out *out);
int      mq_dledger_entry(mq_commitlog *cl, uint64_t index, uint64_t *pos_out, uint32_t *size_out, int64_t *term_out);
int      mq_dledger_append_raw(mq_commitlog *cl, const uint8_t *buf, size_t len, uint64_t first_index,
                               uint64_t first_pos, int64_t max_term, uint32_t *n_out);
int      mq_dledger_truncate(mq_commitlog *cl, uint64_t next_index);
int      mq_dledger_set_commit(mq_commitlog *cl, uint64_t commit_next_index);
int      mq_dledger_set_append_term(mq_commitlog *cl, int64_t term);
int      mq_dledger_recover_index(mq_commitlog *cl, uint64_t from_pos, uint64_t end_pos,
                                  uint64_t *next_index_out, int64_t *end_term_out);
int      mq_dledger_send(mq_commitlog *cl, int sock_fd, const uint8_t *head, uint32_t head_len,
                         uint64_t from_pos, uint32_t body_len, uint64_t *done_io);

/* scanning a plain buffer (tools, HA receive checks) */
int      mq_record_check(const uint8_t *buf, size_t avail, int check_crc, mq_scan_rec *rec, int *stop_out);

/* hashes */
uint32_t mq_crc32(uint32_t crc, const uint8_t *buf, size_t len);   /* equal to zlib.crc32 */
int32_t  mq_java_hash(const uint8_t *utf8, size_t len);           /* String.hashCode of the decoded text */
int64_t  mq_tags_code(const uint8_t *props, size_t len);          /* of the TAGS property, 0 if none */
void     mq_msg_id(const uint8_t *host, uint32_t host_len, int32_t port, uint64_t offset, char *out);

/* ---- perf trace rows (mq.broker.tracing) ----------------------------------
 * nrows rows of nfields int64 values as text lines, formatted from a template: segs holds
 * nfields + 1 segments back to back (seg_len[i] bytes each) and a row is
 * seg[0] v[0] seg[1] v[1] ... v[n-1] seg[n].  kinds[i]: MQ_FMT_INT writes v as a decimal;
 * MQ_FMT_MILLI as a decimal followed by "e-3" (thousandths, which JSON reads as the float
 * v / 1000); MQ_FMT_CODE as a quoted decimal, or "" when v is negative.  Returns the bytes
 * written, MQ_E_RANGE when out_cap is too small (then out holds nothing useful), MQ_E_INVAL for a
 * bad kind.  A row needs at most sum(seg_len) + nfields * MQ_FMT_VALUE_MAX bytes. */
#define MQ_FMT_VALUE_MAX       24        /* "-9223372036854775808e-3" or a quoted code */
enum mq_fmt_kind { MQ_FMT_INT = 0, MQ_FMT_MILLI = 1, MQ_FMT_CODE = 2 };
int64_t  mq_format_rows(const char *segs, const uint32_t *seg_len, const uint8_t *kinds, uint32_t nfields,
                        const int64_t *values, uint32_t nrows, char *out, size_t out_cap);

#endif
