/*
 * testhooks.h -- fault injection for tests.  NOT part of the store's API: no module of mq/
 * calls these, mqstore.h does not include this header, and nothing here may be relied on
 * outside tests/.  build_ffi.py declares them to CFFI after the API (so a test reaches them as
 * lib.<name>) because the tests run against the one shipped build; each hook checks what it is
 * given as strictly as the API does.
 *
 * mq_ctl_debug_lock_and_hold  takes the append lock and returns holding it (MQ_OK, or MQ_E_IO
 *     when locking fails), optionally with a complete journal for `slot` that moves WRITE by
 *     journal_bytes over bytes the caller already wrote (so the next locker must replay it).
 *     The caller is about to be killed (tests/store/test_multiprocess.py: kill -9 while holding
 *     the lock).  slot < MQ_QUEUE_SLOTS is asserted.
 */
#ifndef MQ_TESTHOOKS_H
#define MQ_TESTHOOKS_H

#include "mqbase.h"

int      mq_ctl_debug_lock_and_hold(void *mem, uint32_t slot, uint64_t journal_bytes);

#endif
