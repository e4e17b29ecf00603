/*
 * mqstore.h -- the C core of the store: the one header Python's CFFI build declares (via
 * csrc/build_ffi.py, which inlines the headers included below).  Read this first, then the
 * header of the subsystem you need: each one's leading comment is its contract -- what every
 * function does, every value it returns, its side effects and the locks it takes.
 *
 * The boundary is narrow on purpose (LMDB style): opaque handles, offsets as uint64_t, data
 * crossing as (pointer, length), no callbacks into Python, no policy: when to roll, flush,
 * truncate, delete or retry is decided by mq/store in Python.  C does the per-byte work.
 *
 * The files (one .c per subsystem; internal.h is what they share and is not API):
 *   mqbase.h                return codes, named limits, record constants, the opaque handles
 *   ctl.h       ctl.c       the control block (shared positions, append lock, redo journal),
 *                           the topic-queue table, futex waits and wakes
 *   commitlog.h commitlog.c the CommitLog handle: files and mappings, append (one, batch,
 *                           group), view, read check, scan, flush, zero tail, release
 *   dispatch.h  dispatch.c  ConsumeQueue entries from scanned records
 *   index.h     index.c     the message index (IndexFile)
 *   ha.h        ha.c        master/slave replication transport (frames, sendfile, splice)
 *   dledger.h   dledger.c   DLedger mode: entries, index units, raw append, truncate, commit, send
 *   hash.h      hash.c      CRC32, Java String.hashCode, tags code, msgId
 *   tracefmt.h  tracefmt.c  perf trace rows as text
 *   records.h   records.c   a PULL answer's records decoded for a client (mq.client), many a call
 *   fastsend.h  fastsend.c  the io worker's hot send path: a read's send frames staged, appended
 *                           and answered in C, everything else handed back to Python
 *   fastconn.h  fastconn.c  producer and consumer connections read, walked, run and answered in C
 *                           (an epoll set the io worker's loop watches), given back to Python at need
 *   testhooks.h testhooks.c fault injection for tests (not API; not included here)
 *
 * Error convention.  Every function returns MQ_OK (0) or a negative MQ_E_* (mqbase.h), and
 * mq/store/native.py maps each code to one exception class.  The exceptions, each named again
 * in its header, and why:
 *   getters that cannot fail, returning the value asked for:
 *     mq_ctl_size, mq_ctl_get, mq_ctl_seq, mq_ctl_stat, mq_queue_get, mq_queue_count,
 *     mq_commitlog_errno, mq_crc32, mq_java_hash, mq_tags_code, mq_fast_staged, mq_fast_conns_fd,
 *     mq_fast_conn_active_ms (-1 for a connection not in use), mq_fast_conns_take_pulled (how many
 *     it moved), mq_fast_conns_owing
 *   mq_ctl_fatal      a getter of the sticky error: its errno (> 0), or 0 when healthy
 *   void (nothing can fail): mq_ctl_wake, mq_commitlog_close, mq_index_init, mq_msg_id,
 *     mq_fast_close, mq_fast_conns_close, mq_fast_conns_take_sent
 *   counts that are >= 0 on success and a negative MQ_E_* on failure (the sign tells them
 *   apart, as read(2)'s does; Python's check() passes a value >= 0 through):
 *     mq_commitlog_append_group (messages appended), mq_format_rows (bytes written),
 *     mq_records_decode (rows written)
 *
 * Arguments: asserted or returned.  Asserts stay on in shipped builds (-UNDEBUG).
 *   Asserted -- only a bug in mq/store can get them wrong, and carrying on would corrupt shared
 *   state or read out of bounds: a NULL handle or required pointer (a NULL buffer with length 0
 *   is allowed), an index into a C table (pos, seq, queue field, slot, stat, format kind), a
 *   DLedger call on a handle not opened in DLedger mode, a scan's resolve_slots outside 0..2,
 *   mq_ctl_set_fatal with err 0.
 *   Returned -- everything whose value comes from outside the code: configuration (file sizes,
 *   index sizes, paths), a client's request (topics, bodies, properties, batches, queue ids,
 *   host lengths), a peer (offsets, indexes, terms), bytes on disk, counts and sizes checked
 *   against a named limit, and calls the store's current state refuses.  These get the most
 *   specific MQ_E_* code, MQ_E_INVAL when none fits.  Twin functions (get/set, one/group/batch)
 *   treat the same argument the same way.
 *
 * Locks (NATS style: a function that expects a lock held says so and ends in _locked):
 *   the control block's append lock (robust, process-shared; ctl.h), then a handle's seg_lock
 *   (process-local; commitlog.h).  Never the other order.  Everything else is lock-free
 *   (acquire/release atomics on positions, CAS for monotonic advances).
 */
#ifndef MQSTORE_H
#define MQSTORE_H

#include "mqbase.h"
#include "ctl.h"
#include "hash.h"
#include "commitlog.h"
#include "dispatch.h"
#include "index.h"
#include "ha.h"
#include "dledger.h"
#include "tracefmt.h"
#include "records.h"
#include "fastsend.h"
#include "fastconn.h"

#endif
