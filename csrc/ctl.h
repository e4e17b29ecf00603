/*
 * ctl.h -- the control block: the shared state of one store, the topic-queue table, and the
 * futex words that wake waiters in any process (ctl.c; Python: mq.store.control).
 *
 * The block lives in multiprocessing.shared_memory; every process of a broker maps it and
 * passes its address (`mem`) to these calls.  Its layout is private to ctl.c (internal.h) and
 * versioned: mq_ctl_check refuses a block made by a build with another layout.
 *
 * Invariants (all positions are absolute CommitLog byte offsets):
 *   min_pos <= dispatched_pos <= write_pos,  flushed_pos <= write_pos,
 *   acked_pos <= write_pos on a master,
 *   every byte in [min_pos, write_pos) is a complete, valid record or filler,
 *   per queue: NEXT_OFFSET only grows, by exactly one per record.
 * DLedger mode adds: DL_BEGIN_INDEX <= DL_COMMIT_INDEX <= DL_NEXT_INDEX, COMMITTED <= WRITE,
 * dispatched_pos <= COMMITTED; positions move back only in mq_dledger_truncate.
 *
 * The append lock.  Appends (and mq_ctl_set, mq_queue_set, slot creation) are serialised by a
 * robust process-shared mutex in the block.  An append writes its records beyond write_pos
 * (invisible), then publishes them through a one-entry redo journal: {queue slot, next queue
 * offset, new write_pos} (DLedger: also next index and last term).  If the owner dies (kill -9)
 * holding the lock, the next locker gets EOWNERDEAD and replays the journal if it was complete,
 * or drops the unpublished bytes if it was not: no offset is lost or repeated.  Every call below
 * that "takes the lock" may do that repair first; it fails with MQ_E_IO only when
 * pthread_mutex_lock itself fails (errno is then the mutex's error, no handle keeps it).
 * Positions and queue fields are read lock-free (acquire) and advanced lock-free (CAS).
 *
 * Returns: 0 or a negative MQ_E_*, except the getters mq_ctl_size, mq_ctl_get, mq_ctl_seq,
 * mq_ctl_stat, mq_queue_get, mq_queue_count (a value: they cannot fail), mq_ctl_fatal (the
 * sticky errno, 0 when healthy) and mq_ctl_wake (void).  A pos, seq, field, slot or stat
 * outside its enum is asserted (mqstore.h, "Arguments").
 *
 * mq_ctl_size      bytes of a block of this build's layout.
 * mq_ctl_init      the creator formats `mem` (len >= mq_ctl_size()) for CommitLog files of
 *                  file_size bytes, before any other process attaches: all positions 0, no
 *                  queues, no fatal error.  MQ_E_INVAL when len is too small or file_size is
 *                  outside [4096, 2^40]; MQ_E_IO when the mutex cannot be made.
 * mq_ctl_check     an attacher's check: MQ_OK, or MQ_E_BAD_CTL when len is too small or the
 *                  block's magic, version or size is not this build's.
 * mq_ctl_get       position `pos` (acquire).
 * mq_ctl_set       position `pos` = value, under the lock (recovery, retention: may move back).
 *                  MQ_OK or MQ_E_IO (lock).
 * mq_ctl_advance   position `pos` = max(pos, value), lock-free.  MQ_OK.
 * mq_ctl_seq       futex word `seq` (read before checking a condition, then wait on it).
 * mq_ctl_wait      sleeps while seq[seq] == seen, until a wake or timeout_ms (< 0: no timeout);
 *                  the GIL is released (CFFI).  MQ_OK (woken, changed, or a spurious wake-up:
 *                  re-check the condition) or MQ_E_TIMEOUT.
 * mq_ctl_wake      bumps seq[seq] and wakes its sleepers (the syscall is skipped when none).
 * mq_ctl_wait_pos  sleeps until position `pos` >= target (MQ_OK), the store turns fatal
 *                  (MQ_E_FATAL) or timeout_ms passes (MQ_E_TIMEOUT; timeout_ms <= 0 checks once:
 *                  unlike mq_ctl_wait there is no "forever").  One call per wait: woken for
 *                  someone else's target it goes back to sleep without returning to Python.
 * mq_ctl_fatal     the sticky error's errno (0: healthy); its message is copied into msg_out
 *                  (NUL-terminated, msg_cap bytes at most) when set and msg_out is not NULL.
 * mq_ctl_set_fatal records err (!= 0) and msg as the sticky error if none is set (the first
 *                  error sticks), then wakes every seq so waiters see it.  MQ_OK.
 * mq_ctl_stat      a counter since the block was made (enum mq_stat).
 *
 * Bells: a wake that reaches an event loop without a waiter thread.  A futex can only be slept
 * on by a thread, so a loop that waits for a position (an io worker holding SYNC_FLUSH /
 * SYNC_MASTER / DLedger answers, the DLedger leader waiting for appends) needed a thread that
 * sleeps on it and hands over to the loop: two context switches and the GIL taken back per
 * wake, which on a busy 2-CPU machine waits for the loop's own thread.  A bell is an eventfd
 * the loop watches.  The broker's supervisor makes its bells before it forks anything
 * (mq.store.bells), so every role process holds the same descriptors under the same numbers;
 * mq_bells_adopt records them in this process (process-local, inherited by fork; a process
 * that adopted none never writes one).  The block says which bell wants which seq.
 * mq_bells_adopt   fds[i] becomes this process's bell i (n <= MQ_BELLS_MAX; -1: none); n = 0
 *                  drops them.  MQ_OK or MQ_E_INVAL.  Invariant: a process never closes a
 *                  descriptor it adopted while it may still wake (a reused number would take the
 *                  8-byte write silently): it drops them first, when nothing of it wakes any
 *                  more (mq.broker.launcher at the supervisor's exit).
 * mq_bell_fd       this process's descriptor of bell `bell`, -1 when it has none.
 * mq_bell_want     on: mq_ctl_wake(seq) writes to bell `bell` (in every process that adopted
 *                  the bells) until it is turned off; a bell may want several seqs.  Set the
 *                  want, then check the condition, then wait for the bell: a wake after the
 *                  check rings it (the want is one atomic bit change followed by a full fence;
 *                  the waker bumps seq, seq_cst, then reads the wants).  A block starts with
 *                  no want.
 *
 * The topic-queue table: open addressing over MQ_QUEUE_SLOTS slots, at most 3/4 of them used
 * (short probes); a slot, once made, is never removed, so a slot number is stable for the
 * block's life.  Each slot holds three int64 fields (enum mq_qfield).
 * mq_queue_lookup  the slot of (topic, queue_id): MQ_OK and *slot_out; MQ_E_TOPIC_ILLEGAL for an
 *                  empty topic or one over MQ_TOPIC_LEN_MAX bytes (characters are the appender's
 *                  check); MQ_E_RANGE when absent and !create; with create, makes it under the
 *                  lock (fields 0): MQ_E_TABLE_FULL when the table is full, MQ_E_IO (lock).
 * mq_queue_get     field of slot (acquire).
 * mq_queue_set     field = value under the lock.  MQ_OK or MQ_E_IO (lock).
 * mq_queue_advance field = max(field, value), lock-free.  MQ_OK.
 * mq_queue_count   slots in use.
 * mq_queue_info    topic (not NUL-terminated, up to MQ_TOPIC_LEN_MAX bytes into topic_out),
 *                  its length and queue id of a slot: MQ_OK, or MQ_E_RANGE for a free slot.
 * mq_queue_reset_next_offsets  every slot's NEXT_OFFSET = CQ_MAX, under the lock (a new
 *                  DLedger leader, whose log may have lost entries it once appended).  MQ_OK
 *                  or MQ_E_IO (lock).
 */
#ifndef MQ_CTL_H
#define MQ_CTL_H

#include "mqbase.h"

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
    /* DLedger mode (dledger.h); unused otherwise */
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
    MQ_POS_HA_SLAVES,         /* slaves connected to this master's HA port now (mq.ha.master keeps it, under
                                 its connection lock; the supervisor zeroes it when the HA role dies):
                                 with MQ_POS_ACKED, RocketMQ's isSlaveOK, read live by every io worker */
    MQ_POS_VALIDATED,         /* where this start's recovery began validating the log (its start_offset):
                                 below it no scan at this start vouched for the bytes, so a dispatch walk
                                 there goes past damage (mq.store.dispatch) instead of stopping */
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
enum mq_stat {                /* counters of mq_ctl_stat */
    MQ_STAT_OWNER_DEAD = 0,   /* lockers that found the previous owner dead (EOWNERDEAD) */
    MQ_STAT_REPLAYS,          /* of those, the ones that replayed a complete journal */
    MQ_STAT_COUNT_
};

size_t   mq_ctl_size(void);
int      mq_ctl_init(void *mem, size_t len, uint64_t file_size);
int      mq_ctl_check(void *mem, size_t len);
uint64_t mq_ctl_get(void *mem, int pos);
int      mq_ctl_set(void *mem, int pos, uint64_t value);
int      mq_ctl_advance(void *mem, int pos, uint64_t value);
uint32_t mq_ctl_seq(void *mem, int seq);
int      mq_ctl_wait(void *mem, int seq, uint32_t seen, int timeout_ms);
void     mq_ctl_wake(void *mem, int seq);
int      mq_ctl_wait_pos(void *mem, int seq, int pos, uint64_t target, int timeout_ms);
int      mq_ctl_fatal(void *mem, char *msg_out, size_t msg_cap);
int      mq_ctl_set_fatal(void *mem, int err, const char *msg);
uint64_t mq_ctl_stat(void *mem, int which);

#define MQ_BELLS_MAX 80       /* >= 64 io workers + the DLedger role */
int      mq_bells_adopt(const int *fds, int n);
int      mq_bell_fd(int bell);
void     mq_bell_want(void *mem, int bell, int seq, int on);

int      mq_queue_lookup(void *mem, const char *topic, uint32_t topic_len, int32_t queue_id,
                         int create, uint32_t *slot_out);
int64_t  mq_queue_get(void *mem, uint32_t slot, int field);
int      mq_queue_set(void *mem, uint32_t slot, int field, int64_t value);
int      mq_queue_advance(void *mem, uint32_t slot, int field, int64_t value);
uint32_t mq_queue_count(void *mem);
int      mq_queue_info(void *mem, uint32_t slot, char *topic_out, uint32_t *topic_len, int32_t *queue_id);
int      mq_queue_reset_next_offsets(void *mem);

#endif
