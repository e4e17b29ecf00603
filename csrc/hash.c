/*
 * hash.c -- CRC32 (the one zlib computes), Java's String.hashCode, the tags code and the offset
 * msgId.  Contract in hash.h.  mq_crc32 is on every append and every checked read: the
 * PCLMULQDQ path does 64 bytes a step, the table path 8.
 */
#include "internal.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* ---- CRC32 (IEEE, reflected) ------------------------------------------------------------------ */
static uint32_t crc_table[8][256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;
static int crc_use_clmul;

static void crc_init(void) {
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; n++)
        for (int t = 1; t < 8; t++)
            crc_table[t][n] = (crc_table[t - 1][n] >> 8) ^ crc_table[0][crc_table[t - 1][n] & 0xFF];
#if defined(__x86_64__)
    __builtin_cpu_init();
    crc_use_clmul = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
#endif
}

/* slice-by-8 on the inverted register */
static uint32_t crc_slice8(uint32_t c, const uint8_t *p, size_t n) {
    while (n && ((uintptr_t)p & 7)) { c = crc_table[0][(c ^ *p++) & 0xFF] ^ (c >> 8); n--; }
    while (n >= 8) {
        uint32_t lo, hi;
        memcpy(&lo, p, 4); memcpy(&hi, p + 4, 4);   /* little-endian host assumed below */
        lo ^= c;
        c = crc_table[7][lo & 0xFF] ^ crc_table[6][(lo >> 8) & 0xFF] ^
            crc_table[5][(lo >> 16) & 0xFF] ^ crc_table[4][lo >> 24] ^
            crc_table[3][hi & 0xFF] ^ crc_table[2][(hi >> 8) & 0xFF] ^
            crc_table[1][(hi >> 16) & 0xFF] ^ crc_table[0][hi >> 24];
        p += 8; n -= 8;
    }
    while (n--) c = crc_table[0][(c ^ *p++) & 0xFF] ^ (c >> 8);
    return c;
}

#if defined(__x86_64__)
/* Carry-less multiply folding (Gopal et al., "Fast CRC Computation for Generic
 * Polynomials Using PCLMULQDQ", constants for the bit-reflected IEEE polynomial).
 * Takes and returns the inverted register; needs len >= 64 and a multiple of 16. */
__attribute__((target("pclmul,sse4.1")))
static uint32_t crc_clmul(uint32_t crc, const uint8_t *buf, size_t len) {
    static const uint64_t k1k2[2] __attribute__((aligned(16))) = {0x0154442bd4ull, 0x01c6e41596ull};
    static const uint64_t k3k4[2] __attribute__((aligned(16))) = {0x01751997d0ull, 0x00ccaa009eull};
    static const uint64_t k5k0[2] __attribute__((aligned(16))) = {0x0163cd6124ull, 0};
    static const uint64_t poly[2] __attribute__((aligned(16))) = {0x01db710641ull, 0x01f7011641ull};
    __m128i x0, x1, x2, x3, x4, x5, x6, x7, x8, y5, y6, y7, y8;

    x1 = _mm_loadu_si128((const __m128i *)(buf + 0x00));
    x2 = _mm_loadu_si128((const __m128i *)(buf + 0x10));
    x3 = _mm_loadu_si128((const __m128i *)(buf + 0x20));
    x4 = _mm_loadu_si128((const __m128i *)(buf + 0x30));
    x1 = _mm_xor_si128(x1, _mm_cvtsi32_si128((int)crc));
    x0 = _mm_load_si128((const __m128i *)k1k2);
    buf += 64; len -= 64;
    while (len >= 64) {
        x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
        x6 = _mm_clmulepi64_si128(x2, x0, 0x00);
        x7 = _mm_clmulepi64_si128(x3, x0, 0x00);
        x8 = _mm_clmulepi64_si128(x4, x0, 0x00);
        x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
        x2 = _mm_clmulepi64_si128(x2, x0, 0x11);
        x3 = _mm_clmulepi64_si128(x3, x0, 0x11);
        x4 = _mm_clmulepi64_si128(x4, x0, 0x11);
        y5 = _mm_loadu_si128((const __m128i *)(buf + 0x00));
        y6 = _mm_loadu_si128((const __m128i *)(buf + 0x10));
        y7 = _mm_loadu_si128((const __m128i *)(buf + 0x20));
        y8 = _mm_loadu_si128((const __m128i *)(buf + 0x30));
        x1 = _mm_xor_si128(_mm_xor_si128(x1, x5), y5);
        x2 = _mm_xor_si128(_mm_xor_si128(x2, x6), y6);
        x3 = _mm_xor_si128(_mm_xor_si128(x3, x7), y7);
        x4 = _mm_xor_si128(_mm_xor_si128(x4, x8), y8);
        buf += 64; len -= 64;
    }
    x0 = _mm_load_si128((const __m128i *)k3k4);
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x2), x5);
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x3), x5);
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x4), x5);
    while (len >= 16) {
        x2 = _mm_loadu_si128((const __m128i *)buf);
        x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
        x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
        x1 = _mm_xor_si128(_mm_xor_si128(x1, x2), x5);
        buf += 16; len -= 16;
    }
    x2 = _mm_clmulepi64_si128(x1, x0, 0x10);
    x3 = _mm_setr_epi32(~0, 0, ~0, 0);
    x1 = _mm_srli_si128(x1, 8);
    x1 = _mm_xor_si128(x1, x2);
    x0 = _mm_loadl_epi64((const __m128i *)k5k0);
    x2 = _mm_srli_si128(x1, 4);
    x1 = _mm_and_si128(x1, x3);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    x0 = _mm_load_si128((const __m128i *)poly);
    x2 = _mm_and_si128(x1, x3);
    x2 = _mm_clmulepi64_si128(x2, x0, 0x10);
    x2 = _mm_and_si128(x2, x3);
    x2 = _mm_clmulepi64_si128(x2, x0, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    return (uint32_t)_mm_extract_epi32(x1, 1);
}
#endif

uint32_t mq_crc32(uint32_t crc, const uint8_t *buf, size_t len) {
    pthread_once(&crc_once, crc_init);
    uint32_t c = ~crc;
#if defined(__x86_64__)
    if (crc_use_clmul && len >= 64) {
        size_t chunk = len & ~(size_t)15;
        c = crc_clmul(c, buf, chunk);
        buf += chunk; len -= chunk;
    }
#endif
    c = crc_slice8(c, buf, len);
    return ~c;
}

/* ---- Java String.hashCode, tags code, msgId ------------------------------------------------ */
/* Decodes UTF-8 as Java's decoder would for valid input (code points above
 * U+FFFF count as two UTF-16 units); each invalid byte counts as U+FFFD. */
int32_t mq_java_hash(const uint8_t *s, size_t n) {
    uint32_t h = 0;
    size_t i = 0;
    while (i < n) {
        uint32_t cp = 0xFFFD;
        uint8_t b = s[i];
        size_t need = 0;
        if (b < 0x80) { cp = b; need = 0; }
        else if ((b & 0xE0) == 0xC0 && b >= 0xC2) { cp = b & 0x1F; need = 1; }
        else if ((b & 0xF0) == 0xE0) { cp = b & 0x0F; need = 2; }
        else if ((b & 0xF8) == 0xF0 && b <= 0xF4) { cp = b & 0x07; need = 3; }
        else { need = (size_t)-1; }
        if (need == (size_t)-1 || i + need >= n) { h = 31 * h + 0xFFFD; i++; continue; }
        int ok = 1;
        for (size_t k = 1; k <= need; k++) {
            if ((s[i + k] & 0xC0) != 0x80) { ok = 0; break; }
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if (ok && ((need == 2 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
                   (need == 3 && (cp < 0x10000 || cp > 0x10FFFF))))
            ok = 0;
        if (!ok) { h = 31 * h + 0xFFFD; i++; continue; }
        i += need + 1;
        if (cp >= 0x10000) {
            cp -= 0x10000;
            h = 31 * h + (0xD800 + (cp >> 10));
            h = 31 * h + (0xDC00 + (cp & 0x3FF));
        } else {
            h = 31 * h + cp;
        }
    }
    return (int32_t)h;
}

/* Properties are "name\x01value\x02name\x01value"; returns the hash of TAGS. */
int64_t mq_tags_code(const uint8_t *p, size_t n) {
    size_t i = 0;
    while (i < n) {
        size_t end = i;
        while (end < n && p[end] != 0x02) end++;
        if (end - i > 5 && memcmp(p + i, "TAGS\x01", 5) == 0)
            return (int64_t)mq_java_hash(p + i + 5, end - i - 5);
        i = end + 1;
    }
    return 0;
}

void mq_msg_id(const uint8_t *host, uint32_t host_len, int32_t port, uint64_t offset, char *out) {
    static const char hex[] = "0123456789ABCDEF";
    uint8_t raw[28];
    assert(host && out && (host_len == 4 || host_len == 16));
    memcpy(raw, host, host_len);
    be32w(raw + host_len, (uint32_t)port);
    be64w(raw + host_len + 4, offset);
    size_t n = host_len + 12;
    for (size_t i = 0; i < n; i++) { out[2 * i] = hex[raw[i] >> 4]; out[2 * i + 1] = hex[raw[i] & 15]; }
    out[2 * n] = 0;
}
