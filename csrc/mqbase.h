/*
 * mqbase.h -- what every part of the C core shares: the return codes, the named limits, the
 * record constants and the two opaque handles.  Included by each subsystem header; read
 * mqstore.h first (the error convention, the argument rule, the file map).
 *
 * Every number here that mq/wire or mq/store also declares is compared with its Python twin by
 * tests/unit/test_c_constants.py: change one side alone and that test fails.
 */
#ifndef MQBASE_H
#define MQBASE_H

#include <stddef.h>
#include <stdint.h>

/* ---- return codes (0 or negative; mq/store/native.py maps each to one exception) ---------- */
#define MQ_OK                 0
#define MQ_E_INVAL           -1   /* an argument outside its documented range (a size, count or value
                                     from configuration, a request or a peer), or a call the store's
                                     current state refuses; never a NULL pointer or a table index
                                     (those are asserted: see mqstore.h) */
#define MQ_E_IO              -2   /* an I/O call failed; errno is kept in the handle (mq_commitlog_errno) */
#define MQ_E_FATAL           -3   /* the store has a sticky write/flush error and refuses writes */
#define MQ_E_MSG_ILLEGAL     -4   /* body empty or over maxMessageSize, or a malformed batch */
#define MQ_E_TOPIC_ILLEGAL   -5   /* topic empty, over 127 bytes, or outside [%|a-zA-Z0-9_-] */
#define MQ_E_PROPS_TOO_LONG  -6   /* properties over 32767 bytes */
#define MQ_E_RANGE           -7   /* offset outside the readable range, or a file that does not exist */
#define MQ_E_CORRUPT         -8   /* bytes at an offset are not a valid record (or file, entry, unit) */
#define MQ_E_TABLE_FULL      -9   /* no free topic-queue slot (MQ_QUEUE_SLOTS) */
#define MQ_E_TIMEOUT        -10   /* a wait ran out */
#define MQ_E_NOSPACE        -11   /* the file system is full (not sticky: retry once space is freed) */
#define MQ_E_BAD_CTL        -12   /* the control block has a wrong magic, version or size */
#define MQ_E_TOO_BIG        -13   /* a record does not fit in an empty CommitLog file */
#define MQ_E_NOT_LEADER     -14   /* DLedger mode: appends are refused (DL_APPEND_TERM is 0) */
#define MQ_E_AGAIN          -15   /* a non-blocking socket would block: call again when writable */
#define MQ_E_FULL           -16   /* a message index file has no room for a record's keys */

/* ---- named limits ---------------------------------------------------------------------------- */
#define MQ_TOPIC_LEN_MAX       127       /* 1-byte signed TOPICLEN (mq.wire.commitlog.TOPIC_SIZE_MAX) */
#define MQ_PROPS_LEN_MAX       32767     /* 2-byte signed PROPSLEN (mq.wire.properties.PROPERTIES_SIZE_MAX) */
#define MQ_BATCH_MSGS_MAX      8192      /* messages in one append call */
#define MQ_QUEUE_SLOTS         32768     /* distinct (topic, queueId) pairs per store */

/* ---- the CommitLog record (layout in commitlog.h) -------------------------------------------- */
#define MQ_MESSAGE_MAGIC       0xDAA320A7u
#define MQ_BLANK_MAGIC         0xCBD43194u
#define MQ_BLANK_LEN_MIN       8         /* END_FILE_MIN_BLANK_LENGTH: the filler's TOTALSIZE + MAGIC */
#define MQ_RECORD_FIXED_NO_HOSTS 83      /* a record's bytes besides body, topic, properties and the
                                            two host addresses (each 4 or 16 bytes) */
#define MQ_RECORD_SIZE_MIN     91        /* IPv4 hosts, empty body, topic and properties */
/* field positions in a record (fixed up to BORNHOST; the rest follow the host lengths) */
#define MQ_REC_POS_TOTAL_SIZE      0
#define MQ_REC_POS_MAGIC           4
#define MQ_REC_POS_BODY_CRC        8
#define MQ_REC_POS_QUEUE_ID        12
#define MQ_REC_POS_FLAG            16
#define MQ_REC_POS_QUEUE_OFFSET    20
#define MQ_REC_POS_PHYSICAL_OFFSET 28
#define MQ_REC_POS_SYS_FLAG        36
#define MQ_REC_POS_BORN_TIMESTAMP  40
#define MQ_REC_POS_BORN_HOST       48
/* SYSFLAG bits the core reads or sets */
#define MQ_SYSFLAG_TX_MASK         0xC   /* sysFlag & MASK is the transaction type */
#define MQ_SYSFLAG_TX_PREPARED     0x4   /* prepared and rolled-back messages get no queue offset, */
#define MQ_SYSFLAG_TX_ROLLBACK     0xC   /* ConsumeQueue entry or index entry */
#define MQ_SYSFLAG_BORNHOST_V6     0x10
#define MQ_SYSFLAG_STOREHOST_V6    0x20
/* msgId: STOREHOST (4 or 16) | STOREPORT 4 | PHYSICALOFFSET 8, in uppercase hex */
#define MQ_MSG_ID_V4_LEN       32
#define MQ_MSG_ID_V6_LEN       56

/* ---- opaque handles -------------------------------------------------------------------------- */
typedef struct mq_ctl mq_ctl;              /* the control block (ctl.h); callers pass its memory */
typedef struct mq_commitlog mq_commitlog;  /* one process's handle on a CommitLog (commitlog.h) */

#endif
