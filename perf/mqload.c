/* mqload: a small native load client for a RocketMQ 4.x broker, in the spirit of redis-benchmark.
 *
 *   mqload [-h host] [-p port] [-c conns] [-P depth] [-n total | -s seconds] [-d bytes]
 *          [-t topic] [-q queues] [-g group] [-T stall_seconds]
 *
 * One thread, epoll, non-blocking sockets, no dependency beyond libc.  It opens `-c` TCP
 * connections, waits until every one is established, then starts the clock and keeps `-P`
 * SEND_MESSAGE_V2 (310) requests in flight on each: every response sends the next request on
 * its connection until `-n` messages were sent overall (or `-s` seconds have passed), then it
 * waits for the last responses.  queueId goes round robin over 0..q-1 across all messages.
 *
 * Frames are RocketMQ remoting frames with a JSON header (serialize type 0), big-endian:
 *   TOTAL 4 (everything after itself) | TYPE 1 | HEADERLEN 3 | HEADER | BODY
 * A request is a prebuilt template (header + body); per request only the opaque, the queueId
 * and the counter half of the UNIQ_KEY property are patched in place, at fixed widths (the
 * opaque right-aligned in spaces, which JSON allows before a number; the queueId zero-padded
 * inside its string, which Java's and Python's int parsing accept).  Responses are read by a
 * tiny scanner of the header's top-level keys "code", "opaque" and "flag" (nothing nested, so
 * a remark or an extFields value cannot fool it); code 0 is SUCCESS.
 *
 * Output, one JSON line on stdout at the end:
 *   {"msgs":answered,"acked":code 0,"errors":not code 0 + lost,"seconds":..,"msgs_per_s":..,
 *    "p50_us":..,"p99_us":..,"p999_us":..,"max_us":..,"cpu_s":..,"connections":..,"depth":..,
 *    "body_bytes":..,"codes":{"<code>":count,...,"closed":lost,"timeout":lost}}
 * seconds run from the synchronized start (all connections up) to the last response; latency
 * is per request, from the write that carried it to the read that returned its response
 * (CLOCK_MONOTONIC); cpu_s is this process's user + system CPU over that span.
 *
 * Exit status: 0 every request answered SUCCESS; 1 some errors (answers other than SUCCESS,
 * requests lost to a closed connection or to a stall of -T seconds, default 30); 2 bad
 * arguments (usage on stderr); 3 cannot resolve or connect; 4 out of memory or protocol error.
 *
 * Build: gcc -O2 -Wall -Wextra -o mqload perf/mqload.c   (perf/mqload.py does it on demand) */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#define REQUEST_CODE 310           /* SEND_MESSAGE_V2 */
#define FRAME_MAX (16 * 1024 * 1024)
#define OPAQUE_WIDTH 10            /* digits of INT32_MAX */
#define MAX_CODES 64
#define READ_CHUNK (64 * 1024)
#define CONNECT_TIMEOUT_MS 5000

/* ---- options ---------------------------------------------------------------------------- */
static const char *opt_host = "127.0.0.1";
static const char *opt_port = "10911";
static long opt_conns = 1, opt_depth = 1, opt_size = 1024, opt_queues = 4;
static long long opt_total = -1;
static double opt_seconds = -1, opt_stall = 30;
static const char *opt_topic = "MqLoadTopic";
static const char *opt_group = "MqLoadProducer";

__attribute__((noreturn)) static void usage(const char *why) {
    if (why) fprintf(stderr, "mqload: %s\n", why);
    fprintf(stderr,
            "usage: mqload [-h host] [-p port] [-c connections] [-P depth] [-n total | -s seconds]\n"
            "              [-d body_bytes] [-t topic] [-q queues] [-g producer_group] [-T stall_seconds]\n"
            "  -h host         broker address (default 127.0.0.1)\n"
            "  -p port         broker port (default 10911)\n"
            "  -c connections  TCP connections (default 1)\n"
            "  -P depth        SEND_MESSAGE_V2 requests in flight per connection (default 1)\n"
            "  -n total        messages overall (default 100000 unless -s)\n"
            "  -s seconds      send for this long instead (with -n: whichever ends first)\n"
            "  -d body_bytes   message body size (default 1024)\n"
            "  -t topic        topic (default MqLoadTopic; created from TBW102 if the broker allows)\n"
            "  -q queues       queueIds used round robin, 0..q-1 (default 4)\n"
            "  -g group        producer group (default MqLoadProducer)\n"
            "  -T seconds      give up when no response came for this long (default 30)\n"
            "Prints one JSON line; exit 0 all SUCCESS, 1 errors, 2 bad arguments, 3 connect failure.\n");
    exit(2);
}

static long long parse_ll(const char *s, long long lo, long long hi, const char *what) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        char msg[160];
        snprintf(msg, sizeof msg, "%s must be an integer in [%lld, %lld], not '%s'", what, lo, hi, s);
        usage(msg);
    }
    return v;
}

static double parse_d(const char *s, double lo, double hi, const char *what) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) {
        char msg[160];
        snprintf(msg, sizeof msg, "%s must be a number in [%g, %g], not '%s'", what, lo, hi, s);
        usage(msg);
    }
    return v;
}

/* RocketMQ's topic / group charset, which also needs no JSON escaping */
static const char *parse_name(const char *s, const char *what) {
    size_t n = strlen(s);
    int ok = n >= 1 && n <= 127;
    for (size_t i = 0; ok && i < n; i++) {
        char ch = s[i];
        ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_' ||
             ch == '-' || ch == '%' || ch == '|';
    }
    if (!ok) {
        char msg[200];
        snprintf(msg, sizeof msg, "%s must be 1-127 characters of [A-Za-z0-9_%%|-], not '%.60s'", what, s);
        usage(msg);
    }
    return s;
}

/* ---- small helpers ---------------------------------------------------------------------- */
static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "mqload: out of memory (%zu bytes)\n", n);
        exit(4);
    }
    return p;
}

static void *xrealloc(void *old, size_t n) {
    void *p = realloc(old, n);
    if (!p) {
        fprintf(stderr, "mqload: out of memory (%zu bytes)\n", n);
        exit(4);
    }
    return p;
}

static inline uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static double cpu_seconds(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

static inline uint32_t be32(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static inline void put_be32(unsigned char *p, uint32_t v) {
    p[0] = v >> 24;
    p[1] = v >> 16;
    p[2] = v >> 8;
    p[3] = v;
}

/* ---- the request template --------------------------------------------------------------- */
static unsigned char *tmpl;        /* a whole frame: prefix, header, body */
static size_t tmpl_len;
static size_t off_opaque, off_queue, off_seq; /* where to patch, from the frame's start */
static int queue_width;

static void build_template(void) {
    static const char hex[] = "0123456789ABCDEF";
    char prefix[17];
    /* the first half of every UNIQ_KEY: pid and start time, so that runs do not collide */
    uint64_t salt = now_ns() ^ ((uint64_t)getpid() << 40) ^ (uint64_t)time(NULL) << 20;
    salt ^= salt >> 31;
    salt *= 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < 16; i++) prefix[i] = hex[(salt >> (60 - 4 * i)) & 15];
    prefix[16] = 0;
    queue_width = 1;
    for (long q = opt_queues - 1; q >= 10; q /= 10) queue_width++;
    long long born = (long long)time(NULL) * 1000;

    size_t cap = 1024, hl = 0;
    char *h = xmalloc(cap);
#define APPEND(...) (hl += (size_t)snprintf(h + hl, cap - hl, __VA_ARGS__))
    APPEND("{\"code\":%d,\"extFields\":{\"a\":\"%s\",\"b\":\"%s\",\"c\":\"TBW102\",\"d\":\"%ld\",\"e\":\"",
           REQUEST_CODE, opt_group, opt_topic, opt_queues);
    off_queue = hl;
    APPEND("%0*d", queue_width, 0);
    APPEND("\",\"f\":\"0\",\"g\":\"%lld\",\"h\":\"0\",\"i\":\"UNIQ_KEY\\u0001%s", born, prefix);
    off_seq = hl;
    APPEND("0000000000000000\\u0002WAIT\\u0001true\\u0002\",\"j\":\"0\",\"k\":\"false\",\"m\":\"false\"},"
           "\"flag\":0,\"language\":\"CPP\",\"opaque\":");
    off_opaque = hl;
    APPEND("%*d", OPAQUE_WIDTH, 0);
    APPEND(",\"serializeTypeCurrentRPC\":\"JSON\",\"version\":409}");
#undef APPEND
    if (hl >= cap) { /* cannot happen with names of <= 127 characters */
        fprintf(stderr, "mqload: request header too long\n");
        exit(4);
    }
    tmpl_len = 8 + hl + (size_t)opt_size;
    tmpl = xmalloc(tmpl_len);
    put_be32(tmpl, (uint32_t)(tmpl_len - 4));
    put_be32(tmpl + 4, (uint32_t)hl);            /* type 0 (JSON) in the top byte */
    memcpy(tmpl + 8, h, hl);
    for (long i = 0; i < opt_size; i++) tmpl[8 + hl + i] = "abcdefghijklmnopqrstuvwxyz0123456789"[i % 36];
    off_opaque += 8;
    off_queue += 8;
    off_seq += 8;
    free(h);
}

static inline void patch(unsigned char *frame, int32_t opaque, long queue, uint64_t seq) {
    static const char hex[] = "0123456789ABCDEF";
    unsigned char *p = frame + off_opaque + OPAQUE_WIDTH;
    uint32_t v = (uint32_t)opaque;
    do {
        *--p = '0' + v % 10;
        v /= 10;
    } while (v);
    while (p > frame + off_opaque) *--p = ' ';
    p = frame + off_queue + queue_width;
    for (int i = 0; i < queue_width; i++, queue /= 10) *--p = '0' + queue % 10;
    p = frame + off_seq;
    for (int i = 0; i < 16; i++) p[i] = hex[(seq >> (60 - 4 * i)) & 15];
}

/* ---- the response scanner: top-level "code", "opaque", "flag" -------------------------- */
static const char *skip_ws(const char *p, const char *e) {
    while (p < e && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
    return p;
}

static const char *skip_string(const char *p, const char *e) { /* p at the opening quote */
    for (p++; p < e; p++) {
        if (*p == '\\') p++;
        else if (*p == '"') return p + 1;
    }
    return NULL;
}

static const char *skip_value(const char *p, const char *e) {
    if (p >= e) return NULL;
    if (*p == '"') return skip_string(p, e);
    if (*p == '{' || *p == '[') {
        int depth = 0;
        while (p < e) {
            if (*p == '"') {
                if (!(p = skip_string(p, e))) return NULL;
                continue;
            }
            if (*p == '{' || *p == '[') depth++;
            else if ((*p == '}' || *p == ']') && --depth == 0) return p + 1;
            p++;
        }
        return NULL;
    }
    while (p < e && *p != ',' && *p != '}' && *p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') p++;
    return p;
}

static const char *scan_int(const char *p, const char *e, long long *out) { /* 12, -3 or "12" */
    int quoted = p < e && *p == '"', neg = 0, digits = 0;
    long long v = 0;
    if (quoted) p++;
    if (p < e && *p == '-') neg = 1, p++;
    while (p < e && *p >= '0' && *p <= '9' && digits < 18) v = v * 10 + (*p++ - '0'), digits++;
    if (!digits || (p < e && *p >= '0' && *p <= '9')) return NULL;
    if (quoted) {
        if (p >= e || *p != '"') return NULL;
        p++;
    }
    *out = neg ? -v : v;
    return p;
}

/* 0 with code and opaque found (flag: -1 when absent), -1 for a header it cannot read */
static int scan_header(const char *p, size_t n, long long *code, long long *opaque, long long *flag) {
    const char *e = p + n;
    int got = 0;
    *flag = -1;
    p = skip_ws(p, e);
    if (p >= e || *p != '{') return -1;
    p++;
    for (;;) {
        p = skip_ws(p, e);
        if (p < e && *p == '}') break;
        if (p >= e || *p != '"') return -1;
        const char *k = p + 1, *ke = skip_string(p, e);
        if (!ke) return -1;
        size_t kl = (size_t)(ke - 1 - k);
        p = skip_ws(ke, e);
        if (p >= e || *p != ':') return -1;
        p = skip_ws(p + 1, e);
        long long *dst = NULL;
        int bit = 0;
        if (kl == 4 && !memcmp(k, "code", 4)) dst = code, bit = 1;
        else if (kl == 6 && !memcmp(k, "opaque", 6)) dst = opaque, bit = 2;
        else if (kl == 4 && !memcmp(k, "flag", 4)) dst = flag, bit = 4;
        p = dst ? scan_int(p, e, dst) : skip_value(p, e);
        if (!p) return -1;
        got |= bit;
        p = skip_ws(p, e);
        if (p < e && *p == ',') {
            p++;
            continue;
        }
        if (p < e && *p == '}') break;
        return -1;
    }
    return (got & 3) == 3 ? 0 : -1;
}

/* ---- results ------------------------------------------------------------------------------ */
static long long answered, acked, lost_closed, lost_timeout;
static long long code_val[MAX_CODES], code_cnt[MAX_CODES];
static int ncodes;
static uint32_t *lat;              /* per answered request, in units of 100 ns (max ~429 s) */
static size_t lat_n, lat_cap;

static void count_code(long long code) {
    for (int i = 0; i < ncodes; i++)
        if (code_val[i] == code) {
            code_cnt[i]++;
            return;
        }
    if (ncodes < MAX_CODES) {
        code_val[ncodes] = code;
        code_cnt[ncodes++] = 1;
    } else {
        code_cnt[MAX_CODES - 1]++;  /* absurdly many distinct codes: lumped into the last */
    }
}

static void record_latency(uint64_t ns) {
    if (lat_n == lat_cap) {
        lat_cap = lat_cap ? lat_cap * 2 : 65536;
        lat = xrealloc(lat, lat_cap * sizeof *lat);
    }
    uint64_t t = ns / 100;
    lat[lat_n++] = t > UINT32_MAX ? UINT32_MAX : (uint32_t)t;
}

/* ---- connections --------------------------------------------------------------------------- */
typedef struct {
    int32_t opaque;                /* 0: free */
    uint64_t sent_ns;
} slot_t;

typedef struct {
    int fd, alive, want_out;
    slot_t *slots;                 /* opt_depth of them; opaque = gen * depth + slot + 1 */
    int *free_slots, nfree;
    int64_t gen;
    unsigned char *out;            /* frames not written yet: [out_off, out_len) */
    size_t out_off, out_len, out_cap;
    unsigned char *in;
    size_t in_len, in_cap;
} conn_t;

static conn_t *conns;
static int epfd;
static long long issued, budget;   /* budget: messages still to send (LLONG_MAX with -s alone) */
static int sending = 1;            /* cleared at the -s deadline */
static uint64_t t_start, t_last, deadline_ns;
static long long in_flight_total;

static void close_conn(conn_t *c, const char *why) {
    if (!c->alive) return;
    c->alive = 0;
    epoll_ctl(epfd, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    long long lost = opt_depth - c->nfree;
    if (lost) {
        fprintf(stderr, "mqload: connection closed (%s) with %lld request(s) in flight\n", why, lost);
        lost_closed += lost;
        in_flight_total -= lost;
    }
    c->nfree = (int)opt_depth;
}

/* queues as many requests as it has free slots and budget, stamped now (flush() writes them at
 * once unless the socket is full, and then the wait is part of their latency) */
static void fill(conn_t *c) {
    if (!c->nfree || budget <= 0 || !sending) return;
    uint64_t now = now_ns();
    while (c->nfree && budget > 0) {
        int s = c->free_slots[--c->nfree];
        int64_t op = c->gen++ * opt_depth + s + 1;   /* (opaque - 1) % depth is the slot */
        if (op > INT32_MAX - opt_depth) {
            c->gen = 1;
            op = s + 1;
        }
        c->slots[s].opaque = (int32_t)op;
        c->slots[s].sent_ns = now;
        if (c->out_len + tmpl_len > c->out_cap) { /* compact: at most depth frames are pending */
            memmove(c->out, c->out + c->out_off, c->out_len - c->out_off);
            c->out_len -= c->out_off;
            c->out_off = 0;
        }
        unsigned char *f = c->out + c->out_len;
        memcpy(f, tmpl, tmpl_len);
        patch(f, (int32_t)op, (long)(issued % opt_queues), (uint64_t)issued);
        c->out_len += tmpl_len;
        issued++;
        budget--;
        in_flight_total++;
    }
}

static void set_want_out(conn_t *c, int want) {
    if (c->want_out == want) return;
    struct epoll_event ev = {.events = EPOLLIN | (want ? EPOLLOUT : 0), .data.ptr = c};
    epoll_ctl(epfd, EPOLL_CTL_MOD, c->fd, &ev);
    c->want_out = want;
}

static void flush(conn_t *c) {
    while (c->out_off < c->out_len) {
        ssize_t w = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL);
        if (w > 0) {
            c->out_off += (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            set_want_out(c, 1);
            return;
        }
        close_conn(c, w < 0 ? strerror(errno) : "write returned 0");
        return;
    }
    c->out_off = c->out_len = 0;
    set_want_out(c, 0);
}

static void protocol_error(const char *what) {
    fprintf(stderr, "mqload: protocol error: %s\n", what);
    exit(4);
}

static void on_response(conn_t *c, const unsigned char *hdr, size_t hl, uint64_t now) {
    long long code, opaque, flag;
    if (scan_header((const char *)hdr, hl, &code, &opaque, &flag) < 0) protocol_error("unreadable response header");
    if (flag >= 0 && !(flag & 1)) return;   /* a request from the broker: not ours to answer */
    if (opaque <= 0 || opaque > INT32_MAX) protocol_error("response opaque out of range");
    int s = (int)((opaque - 1) % opt_depth);
    if (c->slots[s].opaque != (int32_t)opaque) protocol_error("response to no request in flight");
    record_latency(now - c->slots[s].sent_ns);
    c->slots[s].opaque = 0;
    c->free_slots[c->nfree++] = s;
    in_flight_total--;
    answered++;
    if (code == 0) acked++;
    count_code(code);
    t_last = now;
}

static void on_readable(conn_t *c) {
    if (c->in_cap - c->in_len < READ_CHUNK / 4) {
        c->in_cap *= 2;
        c->in = xrealloc(c->in, c->in_cap);
    }
    ssize_t r = read(c->fd, c->in + c->in_len, c->in_cap - c->in_len);
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    if (r <= 0) {
        close_conn(c, r < 0 ? strerror(errno) : "by the broker");
        return;
    }
    uint64_t now = now_ns();
    c->in_len += (size_t)r;
    size_t pos = 0;
    while (c->in_len - pos >= 8) {
        uint32_t total = be32(c->in + pos);
        if (total < 4 || total > FRAME_MAX - 4) protocol_error("bad frame length");
        if (c->in_len - pos < 4 + (size_t)total) {
            if (4 + (size_t)total > c->in_cap) {
                c->in_cap = 4 + (size_t)total + READ_CHUNK;
                memmove(c->in, c->in + pos, c->in_len - pos);
                c->in_len -= pos;
                pos = 0;
                c->in = xrealloc(c->in, c->in_cap);
            }
            break;
        }
        uint32_t word = be32(c->in + pos + 4), hl = word & 0xFFFFFF;
        if (word >> 24 != 0) protocol_error("response header is not JSON");
        if (hl > total - 4) protocol_error("header length beyond the frame");
        on_response(c, c->in + pos + 8, hl, now);
        pos += 4 + (size_t)total;
    }
    if (pos) {
        memmove(c->in, c->in + pos, c->in_len - pos);
        c->in_len -= pos;
    }
    if (sending && deadline_ns && now >= deadline_ns) sending = 0;
    fill(c);
    if (c->out_len > c->out_off && !c->want_out) flush(c);
}

/* ---- connecting ------------------------------------------------------------------------------ */
static int connect_one(const struct addrinfo *ai) {
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) return -errno;
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0 && errno != EINPROGRESS) {
        int e = errno;
        close(fd);
        return -e;
    }
    struct pollfd pfd = {.fd = fd, .events = POLLOUT};
    int pr;
    do pr = poll(&pfd, 1, CONNECT_TIMEOUT_MS);
    while (pr < 0 && errno == EINTR);
    int err = 0;
    socklen_t len = sizeof err;
    if (pr == 0) err = ETIMEDOUT;
    else if (pr < 0) err = errno;
    else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0) err = errno;
    if (err) {
        close(fd);
        return -err;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

static double pct_us(double q) {
    if (!lat_n) return 0;
    size_t i = (size_t)(q * (double)lat_n);
    if (i >= lat_n) i = lat_n - 1;
    return lat[i] / 10.0;
}

int main(int argc, char **argv) {
    int ch;
    opterr = 0;
    while ((ch = getopt(argc, argv, ":h:p:c:P:n:s:d:t:q:g:T:")) != -1) {
        switch (ch) {
        case 'h': opt_host = optarg; break;
        case 'p': parse_ll(optarg, 1, 65535, "-p port"); opt_port = optarg; break;
        case 'c': opt_conns = (long)parse_ll(optarg, 1, 10000, "-c connections"); break;
        case 'P': opt_depth = (long)parse_ll(optarg, 1, 65536, "-P depth"); break;
        case 'n': opt_total = parse_ll(optarg, 1, (long long)1 << 60, "-n total"); break;
        case 's': opt_seconds = parse_d(optarg, 0.001, 1e7, "-s seconds"); break;
        case 'd': opt_size = (long)parse_ll(optarg, 1, 4 * 1024 * 1024, "-d body_bytes"); break;
        case 't': opt_topic = parse_name(optarg, "-t topic"); break;
        case 'q': opt_queues = (long)parse_ll(optarg, 1, 65536, "-q queues"); break;
        case 'g': opt_group = parse_name(optarg, "-g group"); break;
        case 'T': opt_stall = parse_d(optarg, 0.01, 1e7, "-T stall_seconds"); break;
        case ':': {
            char msg[64];
            snprintf(msg, sizeof msg, "option -%c needs a value", optopt);
            usage(msg);
        }
        /* fallthrough: usage() does not return */
        default: {
            char msg[64];
            snprintf(msg, sizeof msg, "unknown option -%c", optopt ? optopt : '?');
            usage(msg);
        }
        }
    }
    if (optind < argc) {
        char msg[160];
        snprintf(msg, sizeof msg, "unexpected argument '%.100s'", argv[optind]);
        usage(msg);
    }
    if (!*opt_host) usage("-h host must not be empty");
    if (opt_total < 0 && opt_seconds < 0) opt_total = 100000;
    budget = opt_total > 0 ? opt_total : LLONG_MAX;

    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res;
    int gai = getaddrinfo(opt_host, opt_port, &hints, &res);
    if (gai) {
        fprintf(stderr, "mqload: cannot resolve %s:%s: %s\n", opt_host, opt_port, gai_strerror(gai));
        return 3;
    }
    build_template();
    epfd = epoll_create1(EPOLL_CLOEXEC);
    if (epfd < 0) {
        perror("mqload: epoll_create1");
        return 4;
    }
    conns = xmalloc((size_t)opt_conns * sizeof *conns);
    for (long i = 0; i < opt_conns; i++) {
        conn_t *c = &conns[i];
        memset(c, 0, sizeof *c);
        int fd = -ECONNREFUSED;
        for (struct addrinfo *ai = res; ai; ai = ai->ai_next)
            if ((fd = connect_one(ai)) >= 0) break;
        if (fd < 0) {
            fprintf(stderr, "mqload: cannot connect to %s:%s (connection %ld of %ld): %s\n", opt_host, opt_port,
                    i + 1, opt_conns, strerror(-fd));
            return 3;
        }
        c->fd = fd;
        c->alive = 1;
        c->slots = xmalloc((size_t)opt_depth * sizeof *c->slots);
        memset(c->slots, 0, (size_t)opt_depth * sizeof *c->slots);
        c->free_slots = xmalloc((size_t)opt_depth * sizeof *c->free_slots);
        for (long s = 0; s < opt_depth; s++) c->free_slots[s] = (int)(opt_depth - 1 - s);
        c->nfree = (int)opt_depth;
        c->out_cap = (size_t)opt_depth * tmpl_len;
        c->out = xmalloc(c->out_cap);
        c->in_cap = READ_CHUNK;
        c->in = xmalloc(c->in_cap);
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
        if (epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
            perror("mqload: epoll_ctl");
            return 4;
        }
    }
    freeaddrinfo(res);
    if (opt_total > 0) {
        size_t want = (size_t)(opt_total < 1 << 24 ? opt_total : 1 << 24);
        lat_cap = want;
        lat = xmalloc(lat_cap * sizeof *lat);
    }

    /* the synchronized start: every connection is up */
    double cpu0 = cpu_seconds();
    t_start = t_last = now_ns();
    if (opt_seconds > 0) deadline_ns = t_start + (uint64_t)(opt_seconds * 1e9);
    for (long i = 0; i < opt_conns; i++) fill(&conns[i]);
    for (long i = 0; i < opt_conns; i++) flush(&conns[i]);

    struct epoll_event evs[256];
    uint64_t stall_ns = (uint64_t)(opt_stall * 1e9), last_progress = now_ns();
    long long last_answered = 0;
    while (in_flight_total > 0) {
        int n = epoll_wait(epfd, evs, 256, 200);
        if (n < 0) {
            if (errno == EINTR) continue;
            perror("mqload: epoll_wait");
            return 4;
        }
        for (int i = 0; i < n; i++) {
            conn_t *c = evs[i].data.ptr;
            if (!c->alive) continue;
            if (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) on_readable(c);
            if (c->alive && (evs[i].events & EPOLLOUT)) flush(c);
        }
        uint64_t now = now_ns();
        if (answered != last_answered) {
            last_answered = answered;
            last_progress = now;
        } else if (now - last_progress > stall_ns) {
            fprintf(stderr, "mqload: no response for %.1f s with %lld request(s) in flight; giving up\n", opt_stall,
                    in_flight_total);
            lost_timeout = in_flight_total;
            break;
        }
        if (sending && deadline_ns && now >= deadline_ns) sending = 0;
    }
    double cpu_s = cpu_seconds() - cpu0;
    if (lost_timeout) t_last = now_ns();

    qsort(lat, lat_n, sizeof *lat, cmp_u32);
    double secs = (double)(t_last - t_start) / 1e9;
    long long errors = answered - acked + lost_closed + lost_timeout;
    printf("{\"msgs\":%lld,\"acked\":%lld,\"errors\":%lld,\"seconds\":%.6f,\"msgs_per_s\":%.1f,"
           "\"p50_us\":%.1f,\"p99_us\":%.1f,\"p999_us\":%.1f,\"max_us\":%.1f,\"cpu_s\":%.4f,"
           "\"connections\":%ld,\"depth\":%ld,\"body_bytes\":%ld,\"codes\":{",
           answered, acked, errors, secs, secs > 0 ? answered / secs : 0.0, pct_us(0.50), pct_us(0.99),
           pct_us(0.999), lat_n ? lat[lat_n - 1] / 10.0 : 0.0, cpu_s, opt_conns, opt_depth, opt_size);
    /* codes in ascending order, then the lost ones */
    int first = 1;
    for (int k = 0; k < ncodes; k++) {
        int m = k;
        for (int j = k + 1; j < ncodes; j++)
            if (code_val[j] < code_val[m]) m = j;
        long long v = code_val[m], cnt = code_cnt[m];
        code_val[m] = code_val[k], code_cnt[m] = code_cnt[k];
        code_val[k] = v, code_cnt[k] = cnt;
        printf("%s\"%lld\":%lld", first ? "" : ",", v, cnt);
        first = 0;
    }
    if (lost_closed) printf("%s\"closed\":%lld", first ? "" : ",", lost_closed), first = 0;
    if (lost_timeout) printf("%s\"timeout\":%lld", first ? "" : ",", lost_timeout), first = 0;
    printf("}}\n");
    fflush(stdout);
    return errors == 0 ? 0 : 1;
}
