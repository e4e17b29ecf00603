/*
 * records.h -- a reader's decode of the CommitLog records in a buffer: the body of a PULL
 * answer, as mq.client decodes it into messages (records.c; Python: mq.client.message).  Pure:
 * no handle, no lock, no I/O, no allocation.
 *
 * mq_records_decode  walks the records of buf[from..len) and, for each record it takes, writes
 *     one row of MQ_DECODE_FIELDS int64 values to rows (in this order):
 *       TOTALSIZE, BODYCRC, QUEUEID, FLAG, QUEUEOFFSET, PHYSICALOFFSET, SYSFLAG, BORNTS,
 *       BORNHOST (the IPv4 address as a number), BORNPORT, STORETS, STOREHOST, STOREPORT,
 *       RECONSUMETIMES, PREPAREDTXOFFSET, the body's start and end, the topic's start and end,
 *       the properties' start and end (offsets in buf), PAIRS, SAME_TOPIC
 *     (the 4-byte fields sign-extended as Java's ints are; SAME_TOPIC is 1 when the topic's bytes
 *     equal the previous row's), the record's offset msgId (mq_msg_id: 32 hex digits) and a 0x02
 *     at ids + 33 * row, and the properties' name/value pairs to text from *text_len on, each
 *     name and each value followed by 0x02: PAIRS is their number, kept by the rule of
 *     mq.wire.properties.string_to_properties (a segment between 0x02s holds a pair when it has a
 *     0x01 with bytes on both sides; the first 0x01 splits it).  PAIRS is -1, and nothing is
 *     written to text, when the properties hold a byte >= 0x80: the caller decodes that record's
 *     properties itself (as UTF-8 with replacement).
 *     It takes a record only when it is whole and plain: MAGIC is MESSAGE_MAGIC, both hosts are
 *     IPv4, TOTALSIZE >= MQ_RECORD_SIZE_MIN and within buf, BODYLEN, TOPICLEN and PROPSLEN
 *     non-negative and adding up to TOTALSIZE, the topic ASCII, PHYSICALOFFSET >= 0 and STOREPORT
 *     in 0..65535.  It stops before the first record that is not (*why = MQ_DECODE_OTHER: the
 *     caller decodes from *stop on, and names the error if there is one), before a record when
 *     rows_cap rows are written or text has less than 2 * PROPSLEN + 1 bytes left
 *     (MQ_DECODE_FULL: call again from *stop), or at len (MQ_DECODE_END).
 *     Returns the rows written (>= 0: an EXCEPTION to the convention, a count), or MQ_E_INVAL
 *     when from > len or len is over INT32_MAX (a pull answer is at most a frame).  text_cap of
 *     2 * MQ_PROPS_LEN_MAX + 1 always takes at least one record.
 */
#ifndef MQ_RECORDS_H
#define MQ_RECORDS_H

#include "mqbase.h"

#define MQ_DECODE_FIELDS  23
#define MQ_DECODE_ID_LEN  33           /* MQ_MSG_ID_V4_LEN hex digits and a 0x02 */
enum mq_decode_why { MQ_DECODE_END = 0, MQ_DECODE_FULL = 1, MQ_DECODE_OTHER = 2 };

int64_t  mq_records_decode(const char *buf, size_t len, size_t from, int64_t *rows, uint32_t rows_cap, char *ids,
                           char *text, size_t text_cap, size_t *text_len, size_t *stop, int *why);

#endif
