/*
 * dledger.h -- DLedger mode: the CommitLog as DLedger's data and index files, and the calls the
 * Raft role makes on them (dledger.c; Python: mq.dledger, through mq.store.commitlog).
 *
 * A CommitLog opened with opts->dledger holds DLedger's data files: each record is the body of
 * one entry (DLedger 0.3, big-endian; mq.wire.dledger declares it):
 *   magic 4 (=1) | size 4 (48 + bodySize) | index 8 | term 8 | pos 8 (entry start) |
 *   channel 4 (0) | chainCrc 4 (0) | bodyCrc 4 (0) | bodySize 4 | body = one record
 * The record's PHYSICALOFFSET is pos + 48 (what msgIds, ConsumeQueues and reads use); its
 * TOTALSIZE is bodySize.  Whenever entry size + 8 > room left, the filler  int32 -1 | int32 room
 * is written and the entry opens the next file.  Index files (opts->index_dir, files of
 * index_file_size bytes named by their 20-digit start offset): entry i's unit at byte i * 32:
 *   magic 4 (=1) | pos 8 | size 4 (entry size) | index 8 | term 8
 * Indexes start at 0 and are dense.  In this mode mq_commitlog_append_* add one entry per
 * message with index DL_NEXT_INDEX++ and term DL_APPEND_TERM (MQ_E_NOT_LEADER when it is 0;
 * MQ_E_INVAL when it is below DL_END_TERM); mq_commitlog_scan walks entries and reports the
 * records (dl_index, dl_term, dl_pos set); mq_commitlog_flush advances DL_FLUSHED_INDEX.
 *
 * Threads and locks.  The Raft role's one thread calls append_raw, truncate, set_commit and
 * recover_index; io workers append through commitlog.h while DL_APPEND_TERM is set.  Truncation
 * and append_raw refuse to run while appends are allowed (DL_APPEND_TERM != 0), so the two kinds
 * of writer never overlap.  Calling any of these on a handle not opened in DLedger mode is a
 * programmer error (asserted).
 *
 * Returns: 0 or a negative MQ_E_*.  "File errors" as in commitlog.h (they cover index files too).
 *
 * mq_dledger_append_noop  a new leader's first entry, in `term` (DL_APPEND_TERM is not
 *     consulted): a record of topic RMQ_SYS_DLEDGER_NOOP, queue 0, sysFlag TRANSACTION_ROLLBACK
 *     (no ConsumeQueue entry, here or in a Java broker), body = the term (8 bytes).  Published as
 *     mq_commitlog_append_one publishes.  MQ_E_INVAL when term <= 0 or term < DL_END_TERM;
 *     otherwise append_one's outcomes.
 * mq_dledger_entry  pos, size and term of entry `index` from its index unit, checked against the
 *     entry's header (magic, size, index, term and pos agree, inside one data file).  A unit that
 *     disagrees or is unreadable (damaged since written, its index file missing) is rebuilt from
 *     the entries: from the nearest unit below that agrees (or the first entry, at MIN) the
 *     entries are walked with their CRCs to `index`, and each disagreeing unit on the way is
 *     rewritten and counted (mq_dledger_units_repaired); a term on which only the unit and the
 *     header disagree is taken from the one between its neighbours' terms.  MQ_E_RANGE outside
 *     [DL_BEGIN_INDEX, DL_NEXT_INDEX); MQ_E_CORRUPT when the walk meets damage (an entry that
 *     fails its check, an unexpected index, terms out of order or past DL_END_TERM, an ambiguous
 *     term); file errors.  Truncate and set_commit read units the same way.
 * mq_dledger_first_damaged  the first of entries first..last (within [DL_BEGIN_INDEX,
 *     DL_NEXT_INDEX)) whose bytes fail their check with CRCs (dl_entry_check: the header, the
 *     record inside, its BODYCRC), or whose unit cannot be read or rebuilt (mq_dledger_entry's
 *     MQ_E_CORRUPT), in *bad_out; last + 1 when every one is whole.  A leader checks what it
 *     pushes to a follower it probes with it: a follower refuses a damaged entry (and drops the
 *     connection), so the leader learns which of its own entries it cannot serve.  MQ_E_RANGE
 *     outside the bounds; file errors.
 * mq_dledger_scrub  the same check as first_damaged, from `first` on, stopping after the entry
 *     that reaches bytes_max bytes checked (one entry at least), at `last`, or at the first
 *     damaged entry: *bad_out its index (UINT64_MAX: none met), *next_out the index after the
 *     last one checked (where a walk goes on).  The Raft role's background scrub, a few entries
 *     a call.  Errors as first_damaged's.
 * mq_dledger_repair_entry  entry `index` of this log, damaged (its bytes fail their checks:
 *     mq_dledger_first_damaged), rewritten from a peer's copy `buf` (the entry's bytes as the peer
 *     holds them): the copy must be one whole entry of that index (CRCs), at the position this
 *     log holds it at -- right after entry index-1 and right before entry index+1 as their units
 *     say (past a filler at a file's end), or at MIN / ending at WRITE for the first / last
 *     entry -- with a term between theirs.  Committed entries only (index < DL_COMMIT_INDEX):
 *     those are the same bytes at the same positions on every member that holds them.  The
 *     bytes are written in place and msynced, the unit rewritten, and *repaired_out set to 1;
 *     an entry whole already is left alone (*repaired_out 0).  MQ_E_RANGE outside [DL_BEGIN_INDEX,
 *     DL_COMMIT_INDEX); MQ_E_CORRUPT when the copy fails its check; MQ_E_INVAL when it does not
 *     fit this log there (or a neighbour's unit cannot be read); file errors.
 * mq_dledger_entries_repaired  entries this handle rewrote with mq_dledger_repair_entry (a getter).
 * mq_dledger_units_repaired  the index units this handle rewrote from their entries since it was
 *     opened, and (*last_index_out) the index of the last one (0 if none).  A getter.
 * mq_dledger_append_raw  a follower appends the leader's bytes: `buf` holds whole entries
 *     exactly as in the leader's files from first_pos (fillers, each reaching its file's end,
 *     may sit between or after them).  first_pos must be WRITE, or the start of the next file
 *     when the first entry does not fit in the rest of WRITE's file (the leader rolled over after
 *     we had its last entry of that file: we write the same filler from WRITE), and first_index
 *     DL_NEXT_INDEX: else MQ_E_RANGE.  MQ_E_INVAL while DL_APPEND_TERM != 0 (io workers may
 *     append).  Every entry is checked before anything is written: magic, sizes, index
 *     continuity, term nondecreasing from DL_END_TERM and <= max_term, pos, the room rule, the
 *     record inside (CRC, PHYSICALOFFSET = pos + 48, TOTALSIZE = bodySize); any fault ->
 *     MQ_E_CORRUPT, nothing published.  Then the bytes are copied, the index units written, and
 *     WRITE, DL_NEXT_INDEX, DL_END_TERM, LAST_STORE_TS, MSGS published under the lock (SEQ_WRITE
 *     wakes) -- unless WRITE, DL_NEXT_INDEX or DL_APPEND_TERM moved or a truncation ran
 *     meanwhile (MQ_E_RANGE, nothing published).  *n_out = entries appended (0 on any error).
 *     File errors.
 * mq_dledger_truncate  DL_NEXT_INDEX becomes next_index: WRITE moves back to that entry's pos,
 *     the data bytes and index units past the new end are zeroed and made durable, DL_END_TERM
 *     follows, FLUSHED and DL_FLUSHED_INDEX are clamped.  Files are never deleted or shrunk
 *     (other processes keep them mapped).  Holds the lock throughout.  MQ_OK (a no-op when
 *     next_index == DL_NEXT_INDEX); MQ_E_INVAL when next_index is past DL_NEXT_INDEX, below
 *     DL_COMMIT_INDEX or DL_BEGIN_INDEX, or appends are allowed; MQ_E_CORRUPT when the index
 *     units disagree with the positions (the new end past WRITE or below COMMITTED); file errors
 *     (positions unchanged, though bytes past the new end may already be zeroed).
 * mq_dledger_install  a follower behind the leader's first entry takes the leader's log from
 *     it on: `buf` holds whole entries from (begin_index, begin_pos) as append_raw's (checked the
 *     same way, the first one after term 0; at least one entry).  Checked and their files created
 *     first (nothing written: MQ_E_CORRUPT for a bad entry, file errors such as no space); then,
 *     holding the lock as a truncation does, the bytes are copied and msync'd, the units written,
 *     our old tail past the new end zeroed (bytes and units), the units before begin_index in its
 *     index file zeroed (they are our old log's), and in one step: MIN = COMMITTED =
 *     begin_pos, DL_BEGIN_INDEX = DL_COMMIT_INDEX = begin_index (everything below is committed
 *     history), FLUSHED and DL_FLUSHED_INDEX, DL_NEXT_INDEX, DL_END_TERM, WRITE, the store
 *     timestamps after the entries, MSGS += n; SEQ_WRITE, SEQ_FLUSH and SEQ_COMMIT wake.  A
 *     write or msync failure in that step is made sticky (mq_ctl_set_fatal).  DISPATCHED is left
 *     to the dispatcher (below MIN it rebases the ConsumeQueues).  Files below begin_pos are not
 *     touched (the caller deletes them; other processes may map them).  MQ_E_INVAL when len is 0,
 *     begin_pos is not a file start, appends are allowed, begin_pos is below MIN or COMMITTED, or
 *     begin_index below DL_COMMIT_INDEX or DL_BEGIN_INDEX (checked before and again under the
 *     lock).  *n_out = entries installed (0 on any error).
 * mq_dledger_set_commit  DL_COMMIT_INDEX to commit_next_index (monotonic: a value not past it,
 *     or not past DL_BEGIN_INDEX, is a no-op) and COMMITTED to the end of entry
 *     commit_next_index - 1; wakes SEQ_COMMIT.  MQ_E_RANGE past DL_NEXT_INDEX; the unit's
 *     MQ_E_CORRUPT and file errors.  Lock-free; contract: called only by the thread that also
 *     truncates (the Raft role's).
 * mq_dledger_set_append_term  DL_APPEND_TERM = term under the lock (no append of the old term is
 *     in progress once it returns); wakes SEQ_COMMIT.  MQ_E_INVAL when term < 0; MQ_E_IO (lock).
 * mq_dledger_recover_index  rewrites the index unit of each entry in [from_pos, end_pos)
 *     (already validated by a scan) and zeroes the units after the last one to the end of its
 *     index file; *next_index_out and *end_term_out = the next index and last term (0 and 0 when
 *     the range holds no entry).  MQ_E_CORRUPT when an entry's magic or size is wrong or it runs
 *     past end_pos; file errors.
 * mq_dledger_send  writes `head`, then body_len bytes of the data files at from_pos (sendfile(2)
 *     above MQ_DL_SENDFILE_MIN bytes, else one sendmsg from the mapping), to a socket that may be
 *     non-blocking: *done_io is the progress over head + body (in: where to resume).  MQ_OK when
 *     all is sent; MQ_E_AGAIN when the socket would block; MQ_E_RANGE when the body is not inside
 *     one file and [MIN, WRITE); MQ_E_IO on a socket error (errno in the handle); file errors.
 *
 * mq_dledger_follow_take  a follower's steady state in one call per read (the Raft role's, on a
 *     connection from the leader it follows): walks the whole remoting frames at the start of
 *     buf and takes each PUSH the Raft core would accept by appending at our end -- its header
 *     exactly the template t (the JSON the leader's role writes: this group, from the leader t
 *     names, to us, in term t->term, no install; t->req holds the literal text between the
 *     values prevIndex, prevTerm, commitIndex, firstIndex, count, firstPos, bodySize and the
 *     opaque, each value a canonical decimal), count >= 1 entries in bodySize = the body's
 *     bytes, firstIndex = prevIndex + 1, prevIndex our last entry (DL_NEXT_INDEX - 1, not below
 *     DL_BEGIN_INDEX) and prevTerm its term.  Each taken frame's entries are appended as
 *     mq_dledger_append_raw appends them (with t->term as max_term, and exactly count of them)
 *     and its SUCCESS answer, index = its last entry, is written to out: the header
 *     t->resp[0] index t->resp[1] opaque t->resp[2] after the frame prefix.  It stops at the
 *     first frame it does not take, leaving that frame and the rest to the caller: an
 *     incomplete frame (stop 0), any other frame (MQ_DL_STOP_OTHER: also a frame over
 *     t->frame_max or not JSON), out without room for one more answer (MQ_DL_STOP_OUT_FULL), or
 *     an append that failed (stop = its MQ_E_*, nothing of that frame published: the caller's
 *     own path meets the same error).  r: bytes consumed (whole frames), answer bytes written,
 *     frames and entries taken, and the highest min(commitIndex, last entry) among the taken
 *     frames (-1 if none) -- the commit the core moves to.  Always MQ_OK.
 */
#ifndef MQ_DLEDGER_H
#define MQ_DLEDGER_H

#include "mqbase.h"
#include "commitlog.h"

#define MQ_DL_HEADER_SIZE   48           /* DLedgerEntry.BODY_OFFSET */
#define MQ_DL_MAGIC         1            /* DLedgerMmapFileStore.MAGIC_1 */
#define MQ_DL_BLANK_MAGIC   0xFFFFFFFFu  /* MmapFileList.BLANK_MAGIC_CODE, -1 */
#define MQ_DL_BLANK_LEN_MIN 8            /* MmapFileList.MIN_BLANK_LEN: the filler's magic + room */
#define MQ_DL_INDEX_UNIT    32           /* DLedgerMmapFileStore.INDEX_NUIT_SIZE (sic) */
#define MQ_DL_SENDFILE_MIN  262144       /* mq_dledger_send: bigger bodies go out with sendfile */

int      mq_dledger_append_noop(mq_commitlog *cl, int64_t term, mq_append_out *out);
int      mq_dledger_entry(mq_commitlog *cl, uint64_t index, uint64_t *pos_out, uint32_t *size_out, int64_t *term_out);
int      mq_dledger_first_damaged(mq_commitlog *cl, uint64_t first, uint64_t last, uint64_t *bad_out);
int      mq_dledger_scrub(mq_commitlog *cl, uint64_t first, uint64_t last, uint64_t bytes_max, uint64_t *bad_out,
                          uint64_t *next_out);
int      mq_dledger_repair_entry(mq_commitlog *cl, uint64_t index, const uint8_t *buf, size_t len, int *repaired_out);
uint64_t mq_dledger_entries_repaired(mq_commitlog *cl);
uint64_t mq_dledger_units_repaired(mq_commitlog *cl, uint64_t *last_index_out);
int      mq_dledger_append_raw(mq_commitlog *cl, const uint8_t *buf, size_t len, uint64_t first_index,
                               uint64_t first_pos, int64_t max_term, uint32_t *n_out);
int      mq_dledger_truncate(mq_commitlog *cl, uint64_t next_index);
int      mq_dledger_install(mq_commitlog *cl, const uint8_t *buf, size_t len, uint64_t begin_index,
                            uint64_t begin_pos, int64_t max_term, uint32_t *n_out);
int      mq_dledger_set_commit(mq_commitlog *cl, uint64_t commit_next_index);
int      mq_dledger_set_append_term(mq_commitlog *cl, int64_t term);
int      mq_dledger_recover_index(mq_commitlog *cl, uint64_t from_pos, uint64_t end_pos,
                                  uint64_t *next_index_out, int64_t *end_term_out);
int      mq_dledger_send(mq_commitlog *cl, int sock_fd, const uint8_t *head, uint32_t head_len,
                         uint64_t from_pos, uint32_t body_len, uint64_t *done_io);

#define MQ_DL_PUSH_VALUES     8          /* prevIndex prevTerm commitIndex firstIndex count firstPos bodySize opaque */
#define MQ_DL_STOP_OTHER      1          /* mq_dl_taken.stop: a frame the caller's path takes */
#define MQ_DL_STOP_OUT_FULL   2          /* mq_dl_taken.stop: no room in out for another answer */

typedef struct mq_dl_follow {
    const uint8_t *req[9];                       /* a PUSH header: req[0] v0 req[1] v1 ... v7 req[8] */
    uint32_t req_len[9];                         /* (9 = MQ_DL_PUSH_VALUES + 1: asserted in dledger.c) */
    const uint8_t *resp[3];                      /* an answer's header: resp[0] index resp[1] opaque resp[2] */
    uint32_t resp_len[3];
    int64_t term;                                /* ours: the leader's, the bound of the entries' terms */
    uint32_t frame_max;                          /* a longer frame is the caller's (it closes the connection) */
} mq_dl_follow;

typedef struct mq_dl_taken {
    uint64_t consumed;                           /* bytes of whole frames taken from buf */
    uint64_t out_len;                            /* answer bytes written to out */
    uint64_t entries;                            /* entries appended */
    int64_t commit;                              /* max over the taken frames of min(commitIndex, last), or -1 */
    uint32_t frames;                             /* PUSH frames taken */
    int32_t stop;                                /* why it stopped (above) */
} mq_dl_taken;

int      mq_dledger_follow_take(mq_commitlog *cl, const mq_dl_follow *t, const uint8_t *buf, size_t len,
                                uint8_t *out, size_t out_cap, mq_dl_taken *r);

/* mq_dledger_follow_read  mq_dledger_follow_take on the socket itself, one call per readable
 *     event of a connection from the leader (no bytes through the interpreter): one recv(2)
 *     (non-blocking) into buf[r->have, cap) -- r->have in: the bytes an earlier call left at buf's
 *     start, an incomplete frame; none when r->have = cap -- then follow_take over buf[0, have),
 *     the taken frames cut from buf's start (r->have out: what is left; r->taken: as follow_take).
 *     Unless taken.stop != 0, the answers written to out are then sent (non-blocking) when
 *     may_send (the caller has nothing queued before them), after one flush of the CommitLog
 *     when sync_flush and FLUSHED < WRITE (an answer acknowledges only durable entries); r->sent:
 *     the bytes the socket took, and out[sent, taken.out_len) is the caller's to queue.  With
 *     taken.stop != 0 nothing is flushed or sent: the caller's path answers the frames that
 *     follow and sends these answers with its own (or drops them all if a frame closes the
 *     connection, as it would had it read every frame itself).  r->got: bytes received; r->eof: the
 *     peer closed (nothing taken then: buf held no whole frame); r->err: the errno of a failed
 *     receive or send (the caller closes the connection).  The caller's own path takes over
 *     from buf's start when taken.stop != 0 or have = cap (a frame C does not take, or longer
 *     than buf).  MQ_OK, or the flush's error (nothing sent: the caller drops the answers and
 *     closes the connection, as its own path does).
 */
typedef struct mq_dl_read {
    mq_dl_taken taken;                           /* what follow_take took of buf */
    uint64_t have;                               /* in and out: bytes at buf's start (an incomplete frame) */
    uint64_t got;                                /* bytes this call received */
    uint64_t sent;                               /* answer bytes the socket took */
    int32_t eof;                                 /* the peer closed its side */
    int32_t err;                                 /* errno of a failed recv or send, else 0 */
} mq_dl_read;

int      mq_dledger_follow_read(mq_commitlog *cl, const mq_dl_follow *t, int fd, uint8_t *buf, size_t cap,
                                uint8_t *out, size_t out_cap, int may_send, int sync_flush, mq_dl_read *r);

/* ---- the leader's steady state in C ---------------------------------------------------------
 * mq_dl_lead is the Raft core's replication state of a leader (mq.dledger.core's Progress of each
 * follower, backed by this memory through mq.dledger.role's CProgress, and the commit), shared by
 * the core's Python and the two calls below; both run on the Raft role's one thread.  They do
 * what the core does in its steady state and nothing else: while `on` (the role sets it: a ready
 * leader of `term`, no transfer in progress), for a follower in REPLICATE (replicate = 1):
 *
 * mq_dledger_lead_progress  the log grew or became more durable (RaftNode.log_progress): the
 *     commit moves (below), then each follower gets one push, if its window takes one (fill,
 *     below, stopped after one); a follower in PROBE whose probe is not out gets want = 1.
 * mq_dledger_lead_take  the answers at the start of buf (a read on the link to follower i): each
 *     whole frame that is a SUCCESS answer to a PUSH of ours -- its header exactly
 *     resp[0] index resp[1] opaque resp[2] (the text mq_dledger_follow_take writes, which the
 *     role's Python writes too), opaque in [MQ_DL_LEAD_OPAQUE_BASE, 2^31) -- is applied as
 *     RaftNode._on_append_resp applies it: recent_active; match = max(match, index); next past
 *     match; the in-flight pushes up to index leave the window (inflight_since = ticks); the
 *     commit moves; the window is filled.  It stops at the first frame it does not take (stop
 *     MQ_DL_STOP_OTHER; also when `on` is 0 or the follower is not in REPLICATE), or at an
 *     incomplete one (stop 0), leaving it and the rest to the caller; or it stops after a
 *     frame whose commit or fill met an error (stop = that MQ_E_*, below).  r: consumed (whole
 *     frames), frames, stop; the other fields 0.  Always MQ_OK.
 *
 * The commit (RaftNode._maybe_commit): n = the quorum-th highest of our own durable index
 * (DL_FLUSHED_INDEX - 1 with sync_durable, else DL_NEXT_INDEX - 1) and the followers' matches;
 * if n > commit, n is an entry we hold and its term is `term`: commit = n, published with
 * mq_dledger_set_commit.
 * Fill (RaftNode._send_append, in a loop): while fewer than max_inflight pushes are in flight and
 * next <= our last entry, and next - 1 is an entry we hold (else an install or the term of an
 * entry before our first: the caller's), the entries from next -- at most push_bytes_max bytes
 * (at least one entry), within next's data file, the filler after them when the entry after
 * them opens the next file (DLedgerLog.entries) -- go out as one PUSH: prefix, the header
 * req[0] prevIndex req[1] prevTerm ... bodySize req[7] opaque req[8] (mq_dl_follow's req), then
 * the bytes, written to fd as mq_dledger_send writes.  Its opaque is the next of opaque_next's
 * (MQ_DL_LEAD_OPAQUE_BASE + a count modulo 2^30: the role's own opaques stay below).  Then, as
 * the core does: sent_commit = commit, inflight_since = ticks if the window was empty, the push's
 * last index joins the window, next moves past it; pushes++.  When the socket would block the
 * push stays sent (the core's view: it is queued) and its head, range and progress are left in
 * blk_* with blocked = 1: the caller queues the rest on the connection and sets fd = -1 until
 * it is written; no more is sent to that follower.  want = 1 when the window could take more
 * but C did not send (fd is -1, or the entry before next is not one we hold): the caller's core
 * fills it (its path for those cases).
 * Errors (lead_progress's return, lead_take's stop): an index unit's (MQ_E_CORRUPT, file errors)
 * or the socket's (MQ_E_IO, errno in the handle).  What the call did before is kept.  An error
 * met filling a follower's window is also left in its err (lead_progress goes on with the other
 * followers and returns the first error): the caller closes that follower's connection, as a
 * failed send of its own does, and the core probes it again.
 */
#define MQ_DL_LEAD_PEERS_MAX     8
#define MQ_DL_INFLIGHT_MAX       16
#define MQ_DL_LEAD_OPAQUE_BASE   0x40000000
#define MQ_DL_LEAD_HEAD_MAX      1024         /* a push's prefix and header, at most (the role checks its templates) */

typedef struct mq_dl_peer {
    int64_t match, next, sent_commit, inflight_since;       /* Progress's fields (mq.dledger.core) */
    int64_t inflight[16];                        /* (MQ_DL_INFLIGHT_MAX) the window: last index of each push, oldest first */
    int32_t n_inflight, replicate, probe_sent, recent_active;
    int32_t fd;                                  /* role: the link's socket while C may write to it, else -1 */
    const uint8_t *req[9];                       /* role: the push header template to this follower */
    uint32_t req_len[9];
    int32_t want, blocked, err;                  /* out (above; err: the MQ_E_* filling met); the caller clears them */
    uint64_t blk_pos, blk_done;                  /* out: the blocked push's range and progress over head + body */
    uint32_t blk_nbytes, blk_head_len;
    uint8_t blk_head[1024];                      /* (MQ_DL_LEAD_HEAD_MAX; cffi wants literal sizes) */
    uint64_t pushes;                             /* out: pushes C sent, counted up */
} mq_dl_peer;

typedef struct mq_dl_lead {
    int64_t term, commit, ticks;                 /* role: the core's (commit also written here) */
    int32_t on, n_peers, quorum, max_inflight, sync_durable;
    uint32_t opaque_next;
    uint64_t push_bytes_max;
    const uint8_t *resp[3];                      /* role: a SUCCESS answer's header template in `term` */
    uint32_t resp_len[3];
    mq_dl_peer peer[8];                          /* (MQ_DL_LEAD_PEERS_MAX) */
} mq_dl_lead;

int      mq_dledger_lead_progress(mq_commitlog *cl, mq_dl_lead *ld);
int      mq_dledger_lead_take(mq_commitlog *cl, mq_dl_lead *ld, int32_t i, const uint8_t *buf, size_t len,
                              mq_dl_taken *r);

/* mq_dledger_lead_read  mq_dledger_lead_take on the link's socket itself, one call per readable
 *     event of the link to follower i (no byte of the answers through the interpreter), as
 *     mq_dledger_follow_read is a follower's: one recv(2) (non-blocking) into buf[r->have, cap)
 *     -- r->have in: an incomplete frame an earlier call left at buf's start; none when
 *     r->have = cap -- then lead_take over buf[0, have), the taken frames cut from buf's start
 *     (r->have out: what is left; r->taken: as lead_take's).  r->got, r->eof (nothing taken
 *     then: buf held no whole frame), r->err: as follow_read's; r->sent is 0 (the pushes the
 *     fill sends go to peer[i].fd).  The caller's own path takes over from buf's start when
 *     taken.stop != 0 or have = cap.  Always MQ_OK.
 */
int      mq_dledger_lead_read(mq_commitlog *cl, mq_dl_lead *ld, int32_t i, int fd, uint8_t *buf, size_t cap,
                              mq_dl_read *r);

#endif
