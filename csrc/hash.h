/*
 * hash.h -- the checksums and hashes RocketMQ's formats use, and the offset msgId (hash.c).
 * Pure functions of their arguments: no handle, no lock, no I/O, safe from any thread.
 *
 * Returns: these are the exceptions to "0 or a negative MQ_E_*" -- each returns its value (or
 * nothing) and cannot fail.  A NULL buffer is allowed only with length 0.
 *
 * mq_crc32     the CRC32 (IEEE, reflected) of buf, continuing from crc (0 to start): equal to
 *              zlib.crc32(buf, crc).  A record's BODYCRC is mq_crc32(0, body) & 0x7FFFFFFF.
 *              PCLMULQDQ folding where the CPU has it, slice-by-8 otherwise.
 * mq_java_hash Java's String.hashCode of the text the UTF-8 bytes decode to: code points above
 *              U+FFFF count as two UTF-16 units, each invalid byte as U+FFFD (Java's decoder).
 * mq_tags_code the hash of the TAGS property in properties ("name\x01value\x02..."), widened to
 *              int64 (a ConsumeQueue entry's TAGSCODE); 0 when there is no TAGS.
 * mq_msg_id    the offset msgId of (host, port, offset) into out: 2 * (host_len + 12) uppercase
 *              hex digits (MQ_MSG_ID_V4_LEN or MQ_MSG_ID_V6_LEN) and a NUL.  host_len is 4 or 16
 *              (asserted).
 */
#ifndef MQ_HASH_H
#define MQ_HASH_H

#include "mqbase.h"

uint32_t mq_crc32(uint32_t crc, const uint8_t *buf, size_t len);
int32_t  mq_java_hash(const uint8_t *utf8, size_t len);
int64_t  mq_tags_code(const uint8_t *props, size_t len);
void     mq_msg_id(const uint8_t *host, uint32_t host_len, int32_t port, uint64_t offset, char *out);

#endif
