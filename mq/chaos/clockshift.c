/* clockshift.so: the chaos suite's wall-clock jumps for one process tree, without touching
 * the machine's clock.  LD_PRELOADed into a broker; MQ_CLOCK_SHIFT_FILE names an 8-byte file
 * holding a signed offset in milliseconds (native byte order) that the nemesis rewrites while
 * the broker runs.  Every CLOCK_REALTIME reading (clock_gettime of REALTIME and REALTIME_COARSE,
 * gettimeofday, time) gets the offset added; CLOCK_MONOTONIC and the others are left alone, so
 * this jumps exactly the clock an NTP step or an operator's `date -s` would.
 *
 * The file is mapped once, at the first reading (shimfile.h); a reading costs one atomic load
 * more.  Without the variable, or when the file cannot be mapped, the offset is 0.
 *
 * Built by mq/chaos/clock.py with the machine's gcc (gcc -shared -fPIC -O2 ... -ldl). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "shimfile.h"

typedef int (*clock_gettime_fn)(clockid_t, struct timespec *);

static clock_gettime_fn real_clock_gettime;
static struct shim_file shift_file = {"MQ_CLOCK_SHIFT_FILE", NULL, 0};

static void init(void) {
    if (!real_clock_gettime)
        real_clock_gettime = (clock_gettime_fn)dlsym(RTLD_NEXT, "clock_gettime");
}

static int64_t offset_ms(void) {
    return shim_file_value(&shift_file);
}

static void shift(struct timespec *ts) {
    const int64_t off = offset_ms();          /* read once: the nemesis may rewrite it meanwhile */
    int64_t ns = (int64_t)ts->tv_nsec + (off % 1000) * 1000000;
    int64_t s = (int64_t)ts->tv_sec + off / 1000;
    if (ns < 0) { ns += 1000000000; s -= 1; }
    if (ns >= 1000000000) { ns -= 1000000000; s += 1; }
    ts->tv_sec = (time_t)s;
    ts->tv_nsec = (long)ns;
}

int clock_gettime(clockid_t clk, struct timespec *ts) {
    init();
    int rc = real_clock_gettime(clk, ts);
    if (rc == 0 && (clk == CLOCK_REALTIME || clk == CLOCK_REALTIME_COARSE))
        shift(ts);
    return rc;
}

int gettimeofday(struct timeval *tv, void *tz) {
    (void)tz;
    struct timespec ts;
    int rc = clock_gettime(CLOCK_REALTIME, &ts);
    if (rc == 0 && tv) {
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    return rc;
}

time_t time(time_t *out) {
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0)
        return (time_t)-1;
    if (out)
        *out = ts.tv_sec;
    return ts.tv_sec;
}
