/*
 * fastsend.h -- the io worker's hot send path in C (fastsend.c; Python: mq.broker.fastsend).
 *
 * One call per read takes every complete SEND_MESSAGE (10) / SEND_MESSAGE_V2 (310) frame of
 * it that needs no decision of Python's, and stages it; one call per event-loop iteration
 * appends what was staged (mq_commitlog_append_group: one wake of the dispatch and flush
 * roles) and writes each stored send's answer frame, grouped by connection.  Python keeps the
 * sockets, every policy and every refusal: C takes a frame only when the answer Python's path
 * would give is "stored, SUCCESS" or a store error Python then answers, and hands every other
 * frame back untouched (the first one it does not take ends the walk, so a connection's
 * requests are still started in the order they came).
 *
 * A send is taken when all of these hold, else its frame is handed back (Python's send path,
 * mq.broker.send.SendProcessor.handle, then gives the same answer it always gave):
 *   - the frame: a request (flag bit 0 clear), serialize type JSON (0) or ROCKETMQ (1), code 10
 *     or 310; the ROCKETMQ header well formed with every key and value valid UTF-8; the JSON
 *     header a flat object as fastjson writes it (whitespace allowed between tokens; integers
 *     as plain JSON integers; strings with the escapes \" \\ \/ \b \f \n \r \t and \u00XX below
 *     0x80, raw UTF-8 validated; extFields values strings, integers, true/false or null; no
 *     key of interest twice, no nested object or array elsewhere, a known language name);
 *   - the header: extFields present; topic non-empty and in the topic table (Python publishes
 *     only topics whose sends it would store: legal, not %RETRY%, not protected); batch absent,
 *     "", "0" or "false"; queueId a decimal in [0, max(read, write) queues) and the topic
 *     writable (perm & 2); sysFlag, flag, reconsumeTimes int32 and bornTimestamp int64
 *     decimals (or empty: 0); a non-empty body;
 *   - the properties: none of DELAY, CLUSTER, TRAN_MSG as a substring "NAME\x01", and WAIT
 *     either absent or one entry starting the properties or after a \x02 (it is cut: the
 *     broker honours WAIT and does not store it);
 *   - the store: MQ_POS_DISK_FULL is 0, MQ_POS_HA_TAKE_BACK_UNTIL is 0 or past, in DLedger mode
 *     MQ_POS_DL_APPEND_TERM is not (Python answers those).
 * The store's own checks (body size, properties length, a full queue table, a fatal store)
 * still run in the append; such a send comes back from mq_fast_run as a failure for Python to
 * answer.  Under SYNC_FLUSH or SYNC_MASTER the answers of stored sends are held here, in
 * append order, and released by one call when the flushed or acknowledged position passes
 * them (mq_fast_set_hold); in DLedger mode until the commit passes them.  Python turns the
 * whole path off (by not calling it) where sends are checked or waited for elsewhere: a slave
 * or a follower, SYNC_FLUSH with SYNC_MASTER, ACL, brokerPermission without write.
 *
 * Answers are byte-identical to mq.wire.remoting.ResponseTemplate's for the same values:
 * code SUCCESS, no remark, extFields msgId, queueId, queueOffset, then the fixed entries
 * Python gives at open (already encoded, both forms), in the request's serialize type,
 * language, version and opaque.  A oneway send is stored and not answered.
 *
 * Returns: 0 or a negative MQ_E_*.
 * mq_fast_open   a stager appending through cl.  MQ_E_INVAL when a fixed part is over
 *     MQ_FAST_FIXED_MAX bytes or cluster_prop is empty or over MQ_PROPS_LEN_MAX; MQ_E_IO when
 *     out of memory.
 * mq_fast_close  frees it; NULL is a no-op.
 * mq_fast_topic_put  publishes a topic's queue counts and permission under id `id` (Python's
 *     index, < MQ_FAST_TOPICS_MAX, reported back with failures and counts): MQ_OK, or
 *     MQ_E_TOPIC_ILLEGAL (empty, over MQ_TOPIC_LEN_MAX), MQ_E_TABLE_FULL (id taken by
 *     another name, or no hash room), MQ_E_INVAL (id out of range).  A name published again
 *     gets the new values (its id must be the same).
 * mq_fast_topics_clear  forgets every topic (their counters too: take them first).
 * mq_fast_take_counts  for ids [0, cap): the messages and body bytes stored since the last
 *     take, into msgs[] and bytes[], zeroing them.  *n_out = the highest published id + 1
 *     (at most cap).  MQ_OK.
 * mq_fast_read   walks the complete frames of buf[0, len) and stages the sends it takes (the
 *     conn's born host, 4 or 16 bytes, and port go into their records).  Sets *consumed (the
 *     bytes of the frames taken: buf + *consumed starts a frame, or is the end) and *stop_out:
 *     MQ_FAST_END (no complete frame left), MQ_FAST_HANDBACK (the frame at *consumed is
 *     Python's; *code_out is its request code when its header was read, else -1: a caller
 *     that keeps a connection's sends in order runs the stage before Python appends that
 *     frame's message), MQ_FAST_FULL (the stage is full: run it, then call again), MQ_FAST_PULLED
 *     (a pull was answered: the frame before *consumed; see below).  pulled->sends_staged: the
 *     sends this call staged (whatever the stop).  pulls: this connection may pull.  The bytes of buf
 *     must stay unchanged and alive until the next mq_fast_run (bodies are staged by pointer).
 *     MQ_E_INVAL: born_host_len not 4 or 16.
 * mq_fast_set_hold  MQ_FAST_ANSWER_NOW: every stored send is answered by the run (ASYNC_FLUSH,
 *     ASYNC_MASTER); MQ_FAST_HOLD_WAITING: a stored send whose WAIT is not "false" is held until
 *     mq_fast_release sees a position past its end (SYNC_FLUSH: FLUSHED; SYNC_MASTER: ACKED);
 *     MQ_FAST_HOLD_ALL (DLedger): every stored send is held until COMMITTED passes it in its
 *     entry's term.  While holding, read() hands back a send when MQ_FAST_PENDING_MAX answers
 *     would be held.  MQ_E_INVAL for another value.
 * mq_fast_run    appends every staged send and empties the stage.  Answers go to out (at
 *     least MQ_FAST_ANSWER_MAX bytes per staged send: out_cap is checked, MQ_E_INVAL), as
 *     *n_spans spans (conn, offset, length), one per run of consecutive answers of one
 *     connection; a send the store refused is in fails[0, *n_fails) (its append's rc, for Python
 *     to answer); *n_ok sends were stored (oneway and held ones included), *n_held of them held.
 *     refuse_held: a send that would be held is put in fails instead, stored, with rc
 *     MQ_FAST_RC_STORED (Python answers it: SLAVE_NOT_AVAILABLE when no slave can take it).
 *     spans and fails need room for every staged send (mq_fast_staged says how many).
 * mq_fast_pending  *n_out answers held; when > 0, *head the oldest and *tail the newest.
 * mq_fast_release  writes the answers of the held sends whose end is <= pos, oldest first, into
 *     out and spans as mq_fast_run does, while out has MQ_FAST_ANSWER_MAX bytes left and spans a
 *     slot (and, tracing, room for their rows); *n_released were released (oneway ones
 *     unanswered).  Call again while it releases.
 *     acked: pos is a slave's ack or a commit (for the trace's phases), else the flush's.
 *     term >= 0 (DLedger): only answers of entries appended in that term are released (pos is
 *     COMMITTED read before the term, which is still this one: mq.store.notify.CommitWaiter).
 * mq_fast_set_trace  on: every frame taken is stamped (CLOCK_MONOTONIC ns, Python's
 *     perf_counter_ns) when read (one clock read a frame), every run around its append, and each send
 *     answered here (by a run or a release, oneway ones too) leaves one row of
 *     MQ_FAST_TRACE_FIELDS int64 values, mq.broker.tracing.REQ_ROW's (durations in ns); at most
 *     MQ_FAST_TRACE_ROWS_MAX are kept (Python takes them after every call that answers).
 *     Fails are Python's to trace.
 * mq_fast_take_trace  moves up to cap_rows kept rows, oldest first, to rows; *n_out of them.
 * mq_fast_release_expired  the oldest held sends appended before appended_before_ms
 *     (CLOCK_MONOTONIC ms, Python's time.monotonic), or with keep_term >= 0 appended in another
 *     term, into fails (rc MQ_FAST_RC_STORED), at most cap: their wait timed out, or their
 *     leader's term ended; Python answers them.
 * mq_fast_staged the number of sends staged (a getter).
 * mq_fast_trace_kept  the trace rows kept now (a getter; 0 when not tracing).
 *
 * Pulls (PULL_MESSAGE, 11) that find data are answered by mq_fast_read too, one at a time: the
 * walk stops after each one it answers (MQ_FAST_PULLED) with the answer frame in the pull buffer
 * and what Python still does for it in *pulled (the offset commit, the stats).  A pull is taken
 * when all of these hold, else its frame is handed back untouched (Python's
 * mq.broker.pull.PullProcessor.handle then gives the answer it always gave):
 *   - the caller allows pulls on this connection (`pulls`: not the fast port, which serves none)
 *     and mq_fast_set_pulls turned them on (Python's policy: a master or DLedger leader whose
 *     brokerPermission allows reads, no slaveReadEnable, no old log beside a DLedger one, no perf
 *     tracing; the same switches as the send path's otherwise);
 *   - the frame: a request, not oneway, read as a send's is (the same parsers); extFields with
 *     consumerGroup a published group (mq_fast_group_put: Python publishes a group it has read
 *     with consumeEnable) and topic a published topic with perm & 4 (read) and queueId a decimal
 *     in [0, readQueueNums); queueOffset an int64 decimal, maxMsgNums and sysFlag int32 decimals
 *     (absent or empty: 32 and 0), commitOffset, suspendTimeoutMillis and subVersion int64
 *     decimals (or absent or empty) -- Java's types, which mq.broker.pull checks the same way;
 *     sysFlag with PULL_SUBSCRIPTION (4: the expression comes with the pull),
 *     or without it a heartbeat subscription published for the group and topic
 *     (mq_fast_sub_put) that is still fresh and whose subVersion is not below the pull's (its
 *     filter is then the pull's: expressionType and subscription are not read); with bit 4:
 *     expressionType absent, empty or "TAG"; subscription absent, or printable ASCII (spaces
 *     included, at most MQ_FAST_SUB_TEXT_MAX bytes) that is "*" or empty once trimmed, or tags
 *     joined by "||" (at most MQ_FAST_CODES_MAX, at least one; each tag's Java hashCode is what the
 *     ConsumeQueue holds); or expressionType "SQL92" and subscription, unescaped UTF-8, the text
 *     of a published SQL92 filter (below) that has not been left to Python;
 *   - the queue: its slot in the control block exists and CQ_MIN <= queueOffset < CQ_MAX; its
 *     ConsumeQueue file (<cq_root>/<topic>/<queueId>/<20-digit start>) exists with its full size;
 *   - the records: one mq_commitlog_gather over the entries from queueOffset (max(16000,
 *     maxMsgNums * 20) bytes of them, within CQ_MAX and the file: RocketMQ's
 *     maxFilterMessageCount) with min(maxMsgNums, count_max) and bytes_max as its limits copies
 *     at least one record and stops at its limits (MQ_OK, or MQ_E_FULL after a record): a pull
 *     that finds nothing, or meets a record that fails its check or a deleted file, is Python's,
 *     which reports what it must.
 *   - SQL92: the records are gathered as mq.broker.pull.PullProcessor._gather does, up to
 *     MQ_FAST_SQL_CHUNK unfiltered per gather (limits: what is left of the count and bytes of the
 *     records kept), each one's properties read (mq_records_props) and kept when the filter's
 *     verdict for their values is true, until the count is reached, the entries end, a gather
 *     examines none, or MQ_FAST_SQL_SCAN_BUDGET_NS has passed since the first.  A record whose
 *     values have no published verdict hands the pull back (a miss: pulled->sql_missed is the
 *     filter's id + 1, and Python publishes the verdicts of the records it reads for it); a filter with more than MQ_FAST_SQL_MISSES_MAX misses, and more
 *     misses than pulls answered, is left to Python from then on (values that rarely repeat).
 * GET_MAX_OFFSET (30) and GET_MIN_OFFSET (31) are answered the same way (stop MQ_FAST_PULLED, kind
 * MQ_FAST_PULLED_OFFSET) where pulls are: a request, not oneway, whose extFields topic (unescaped,
 * 1 to MQ_TOPIC_LEN_MAX bytes) and queueId (an int32 decimal) name a queue the control block has:
 * make_response(request, SUCCESS, None, {"offset": CQ_MAX or CQ_MIN}), as mq.broker.admin's
 * max_offset / min_offset give it; any other is Python's (which answers 0 / -1 for a queue that
 * does not exist, INVALID_PARAMETER for a bad field).  QUERY_CONSUMER_OFFSET stays Python's: the
 * offsets are the supervisor's.
 * The answer is byte-identical to Python's make_response(request, SUCCESS, "FOUND", ext, records)
 * encoded in the request's serialize type: extFields suggestWhichBrokerId "0", nextBeginOffset
 * (queueOffset + entries examined), minOffset CQ_MIN, maxOffset CQ_MAX read before the gather.
 * ConsumeQueue files are mapped read-only here as they are first needed and stay mapped (their
 * files are never truncated, unlinked and made again while the store runs: mq.ha.truncate,
 * ConsumeQueue.rebase); at MQ_FAST_CQ_MAPS_MAX they are all unmapped, as when the topics are
 * cleared (topic ids are reused) or the pull settings change.
 * mq_fast_set_pulls  pulls on, with the store's ConsumeQueue root and file size, the broker's
 *     maxTransferCountOnMessageInMemory (count_max) and maxTransferBytesOnMessageInMemory
 *     (bytes_max), answers built in buf[0, buf_cap) (the caller's, alive while pulls are on;
 *     at least MQ_FAST_PULL_HEADER_ROOM + bytes_max); bytes_max 0: off.  MQ_E_INVAL for a file
 *     size not a positive multiple of 20, a root over PATH_MAX / 2, count_max 0, bytes_max past
 *     what a frame holds, or a short buffer (pulls are off then).
 * mq_fast_group_put  publishes consumer group `group` under id `id` (< MQ_FAST_GROUPS_MAX): as
 *     mq_fast_topic_put (MQ_E_INVAL for an id out of range or a name over MQ_FAST_GROUP_LEN_MAX).
 * mq_fast_groups_clear  forgets every group.
 * mq_fast_sql_put  publishes an SQL92 filter under id `id` (< MQ_FAST_SQL_FILTERS_MAX): `text`
 *     its subscription text as UTF-8 (1 to MQ_FAST_SUB_TEXT_MAX bytes), the properties it reads
 *     as mq_records_props takes them (names, name_lens, n_names <= MQ_FAST_SQL_NAMES_MAX, each
 *     name at most MQ_FAST_SQL_NAME_LEN_MAX bytes before its 0x01).  As
 *     mq_fast_group_put otherwise (MQ_E_INVAL for what is out of range, MQ_E_IO without memory).
 * mq_fast_sql_verdict  keeps filter `id`'s verdict (0 false, 1 true) for one combination of the
 *     values of its properties, `key`: per property in order, 0x00 when the record has none, else
 *     0x01, the value's length (uint32 big-endian) and its bytes.  At MQ_FAST_SQL_VERDICTS_MAX
 *     verdicts or MQ_FAST_SQL_KEYS_BYTES of keys the filter's verdicts are all dropped first.
 *     MQ_E_INVAL for an id not published or a key over MQ_FAST_SQL_KEY_MAX; MQ_E_IO without memory.
 * mq_fast_sql_clear  forgets every SQL92 filter and its verdicts (and every subscription).
 * mq_fast_sub_put  publishes the heartbeat subscription of group id `group_id` to topic id
 *     `topic_id` (both published) for pulls without PULL_SUBSCRIPTION: taken while
 *     CLOCK_MONOTONIC ns < fresh_until_ns, for pulls whose subVersion <= sub_version; its filter
 *     either tags (codes[0, n_codes), sorted, distinct, n_codes <= MQ_FAST_CODES_MAX; 0: every
 *     message) with sql_id -1, or the published SQL92 filter sql_id (n_codes 0).  Replaces what
 *     was published for the pair; at MQ_FAST_SUBS_MAX pairs every one is forgotten first.
 *     MQ_E_INVAL for an id not published or a count out of range.  Subscriptions are forgotten
 *     too when the groups, the topics or the SQL92 filters are cleared (their ids are reused).
 * mq_fast_subs_clear  forgets every subscription.
 */
#ifndef MQ_FASTSEND_H
#define MQ_FASTSEND_H

#include "mqbase.h"

#define MQ_FAST_MSGS_MAX     1024          /* sends staged between two runs */
#define MQ_FAST_ARENA_BYTES  524288        /* their unescaped properties, together (512 KiB) */
#define MQ_FAST_TOPICS_MAX   4096          /* topics published at once */
#define MQ_FAST_FIXED_MAX    512           /* bytes of an answer's fixed extFields, per form */
#define MQ_FAST_ANSWER_MAX   1024          /* bytes of one answer frame, at most (~250 + the fixed part) */
#define MQ_FAST_PENDING_MAX  16384         /* answers held for a position at once */
#define MQ_FAST_RC_STORED    1             /* a fail record of a send that was stored (held, refused) */
#define MQ_FAST_TRACE_FIELDS 11            /* a req row: mq.broker.tracing.REQ_ROW */
#define MQ_FAST_TRACE_ROWS_MAX 4096        /* rows kept between two takes */
#define MQ_FAST_GROUPS_MAX   4096          /* consumer groups published at once */
#define MQ_FAST_GROUP_LEN_MAX 255          /* bytes of a published group's name */
#define MQ_FAST_CQ_MAPS_MAX  1024          /* ConsumeQueue files mapped for pulls at once */
#define MQ_FAST_PULL_HEADER_ROOM 512       /* bytes before a pull answer's records: its frame's head */
#define MQ_FAST_CODES_MAX    64            /* tags of a subscription a pull taken here may name */
#define MQ_FAST_SUB_TEXT_MAX 1024          /* bytes of a subscription a pull taken here may carry */
#define MQ_FAST_SUBS_MAX     1024          /* heartbeat subscriptions (group, topic) published at once */
#define MQ_FAST_SQL_FILTERS_MAX 64         /* SQL92 filters published at once */
#define MQ_FAST_SQL_NAMES_MAX 16           /* properties a published SQL92 filter may read */
#define MQ_FAST_SQL_NAME_LEN_MAX 128       /* bytes of each one's name */
#define MQ_FAST_SQL_VERDICTS_MAX 4096      /* verdicts kept per filter (then all dropped) */
#define MQ_FAST_SQL_KEYS_BYTES 262144      /* bytes of those verdicts' keys, per filter (then all dropped) */
#define MQ_FAST_SQL_KEY_MAX  1024          /* bytes of one verdict's key */
#define MQ_FAST_SQL_MISSES_MAX 256         /* pulls a filter hands back for a missing verdict before it is Python's */
#define MQ_FAST_SQL_CHUNK    32            /* records an SQL92 pull gathers per call (mq.broker.pull.SQL_CHECK_EVERY) */
#define MQ_FAST_SQL_SCAN_BUDGET_NS 5000000 /* an SQL92 pull stops scanning after this (mq.broker.pull) */

typedef struct mq_fast mq_fast;

enum mq_fast_hold {
    MQ_FAST_ANSWER_NOW = 0,
    MQ_FAST_HOLD_WAITING,
    MQ_FAST_HOLD_ALL
};

enum mq_fast_stop {
    MQ_FAST_END = 0,        /* every complete frame was taken */
    MQ_FAST_HANDBACK,       /* the frame at *consumed is Python's */
    MQ_FAST_FULL,           /* the stage is full */
    MQ_FAST_PULLED          /* the frame before *consumed was a pull, answered (*pulled) */
};

typedef struct mq_fast_opts {
    const uint8_t *cluster_prop;    /* "CLUSTER\x01<brokerClusterName>": every message's extra property */
    uint32_t cluster_prop_len;
    const uint8_t *json_fixed;      /* the fixed extFields as JSON, each entry preceded by ',' */
    uint32_t json_fixed_len;
    const uint8_t *bin_fixed;       /* the same entries as ROCKETMQ ext entries */
    uint32_t bin_fixed_len;
    uint32_t max_message_size;      /* maxMessageSize */
} mq_fast_opts;

typedef struct mq_fast_span {       /* answers of one connection, consecutive in out */
    uint32_t conn;
    uint32_t offset;
    uint32_t len;
} mq_fast_span;

typedef struct mq_fast_fail {       /* a send Python answers (refused, or stored and held); a held answer */
    uint32_t conn;
    int32_t rc;                     /* the append's MQ_E_*, or MQ_FAST_RC_STORED */
    uint32_t topic_id;
    int32_t queue_id;
    int32_t opaque;
    int32_t version;
    int32_t language;
    int32_t serialize_type;
    int32_t oneway;
    uint32_t body_len;
    int64_t queue_offset;           /* stored: where */
    uint64_t end_offset;            /* stored: the record's end (the position that covers it) */
    int64_t t_ms;                   /* stored: when it was appended (CLOCK_MONOTONIC ms) */
    char msg_id[33];                /* stored: its offset msgId */
    int32_t code;                   /* SEND_MESSAGE or SEND_MESSAGE_V2 */
    int64_t t0_ns, t1_ns, ts_us;    /* tracing: frame read, header parsed (CLOCK_MONOTONIC), wall clock */
    int64_t store_ns, appended_ns;  /* tracing: around the group append */
    int64_t dl_term;                /* stored, DLedger mode: the term of its entry */
} mq_fast_fail;

enum mq_fast_pulled_kind {
    MQ_FAST_PULLED_PULL = 0,        /* a PULL_MESSAGE answered */
    MQ_FAST_PULLED_OFFSET           /* a GET_MAX_OFFSET / GET_MIN_OFFSET answered (only the frame is set) */
};

typedef struct mq_fast_pulled {     /* what a read did besides its frames: sends staged, the pull answered */
    uint32_t sends_staged;          /* sends this call staged (before the stop) */
    uint32_t kind;                  /* MQ_FAST_PULLED: enum mq_fast_pulled_kind */
    uint32_t group_id, topic_id;    /* MQ_FAST_PULLED: the pull's group and topic (published ids) */
    int32_t queue_id;
    int32_t commit;                 /* sysFlag had PULL_COMMIT_OFFSET (1): commit_offset is the group's */
    int64_t commit_offset;
    uint32_t msgs;                  /* records in the answer */
    uint32_t body_len;              /* their bytes */
    uint32_t frame_offset;          /* the answer frame: buf[frame_offset, frame_offset + frame_len) */
    uint32_t frame_len;
    uint32_t sql_missed;            /* an SQL92 pull was handed back for a verdict: its filter's id + 1 (never cleared here) */
} mq_fast_pulled;

int      mq_fast_open(mq_commitlog *cl, const mq_fast_opts *opts, mq_fast **out);
void     mq_fast_close(mq_fast *f);
int      mq_fast_topic_put(mq_fast *f, uint32_t id, const char *topic, uint32_t topic_len,
                           int32_t write_queues, int32_t read_queues, int32_t perm);
int      mq_fast_topics_clear(mq_fast *f);
int      mq_fast_take_counts(mq_fast *f, uint64_t *msgs, uint64_t *bytes, uint32_t cap, uint32_t *n_out);
int      mq_fast_set_pulls(mq_fast *f, const char *cq_root, uint32_t cq_root_len, uint64_t cq_file_size,
                           uint32_t count_max, uint32_t bytes_max, uint8_t *buf, size_t buf_cap);
int      mq_fast_group_put(mq_fast *f, uint32_t id, const char *group, uint32_t group_len);
int      mq_fast_groups_clear(mq_fast *f);
int      mq_fast_sql_put(mq_fast *f, uint32_t id, const uint8_t *text, uint32_t text_len, const uint8_t *names,
                         const uint32_t *name_lens, uint32_t n_names);
int      mq_fast_sql_verdict(mq_fast *f, uint32_t id, const uint8_t *key, uint32_t key_len, int verdict);
int      mq_fast_sql_clear(mq_fast *f);
int      mq_fast_sub_put(mq_fast *f, uint32_t group_id, uint32_t topic_id, int64_t fresh_until_ns,
                         int64_t sub_version, const int64_t *codes, uint32_t n_codes, int32_t sql_id);
int      mq_fast_subs_clear(mq_fast *f);
int      mq_fast_read(mq_fast *f, uint32_t conn, const uint8_t *born_host, uint32_t born_host_len,
                      int32_t born_port, int pulls, const uint8_t *buf, size_t len, size_t *consumed,
                      int *stop_out, int32_t *code_out, mq_fast_pulled *pulled);
int      mq_fast_set_hold(mq_fast *f, int hold);
int      mq_fast_run(mq_fast *f, int refuse_held, uint8_t *out, size_t out_cap, mq_fast_span *spans,
                     uint32_t *n_spans, mq_fast_fail *fails, uint32_t *n_fails, uint32_t *n_ok, uint32_t *n_held);
int      mq_fast_pending(mq_fast *f, mq_fast_fail *head, mq_fast_fail *tail, uint32_t *n_out);
int      mq_fast_release(mq_fast *f, uint64_t pos, int64_t term, int acked, uint8_t *out, size_t out_cap,
                         mq_fast_span *spans, uint32_t spans_cap, uint32_t *n_spans, uint32_t *n_released);
int      mq_fast_set_trace(mq_fast *f, int on);
int      mq_fast_take_trace(mq_fast *f, int64_t *rows, uint32_t cap_rows, uint32_t *n_out);
int      mq_fast_release_expired(mq_fast *f, int64_t appended_before_ms, int64_t keep_term, mq_fast_fail *fails,
                                 uint32_t cap, uint32_t *n_out);
uint32_t mq_fast_staged(mq_fast *f);
uint32_t mq_fast_trace_kept(const mq_fast *f);

#endif
