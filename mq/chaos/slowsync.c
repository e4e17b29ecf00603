/* slowsync.so: a slow disk for one process tree, as a disk busy with other writes looks to a
 * program: fsync, fdatasync, msync and sync_file_range return only after an extra delay.
 * LD_PRELOADed into a broker; MQ_SLOW_SYNC_FILE names an 8-byte file holding the delay in
 * milliseconds (native byte order), which a test or nemesis rewrites while the broker runs.
 * Nothing else is slowed: reads, writes and page faults go at the machine's speed, so what it
 * shows is which work of a process waits on its syncs.
 *
 * The file is mapped once, at the first sync (shimfile.h); a sync costs one atomic load more.
 * Without the variable, or when the file cannot be mapped, the delay is 0.
 *
 * Built by mq/chaos/clock.py (build_shim) with the machine's gcc. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "shimfile.h"

static struct shim_file delay_file = {"MQ_SLOW_SYNC_FILE", NULL, 0};

static void stall(void) {
    int64_t ms = shim_file_value(&delay_file);
    if (ms <= 0)
        return;
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

typedef int (*fd_fn)(int);
typedef int (*msync_fn)(void *, size_t, int);
typedef int (*range_fn)(int, off64_t, off64_t, unsigned int);

/* the next definition of `name` (libc's), looked up once */
#define REAL(name, type) static type real_##name; \
    if (!real_##name) real_##name = (type)dlsym(RTLD_NEXT, #name)

int fsync(int fd) {
    REAL(fsync, fd_fn);
    stall();
    return real_fsync(fd);
}

int fdatasync(int fd) {
    REAL(fdatasync, fd_fn);
    stall();
    return real_fdatasync(fd);
}

int msync(void *addr, size_t len, int flags) {
    REAL(msync, msync_fn);
    if (flags & MS_SYNC)
        stall();
    return real_msync(addr, len, flags);
}

int sync_file_range(int fd, off64_t off, off64_t n, unsigned int flags) {
    REAL(sync_file_range, range_fn);
    if (flags & SYNC_FILE_RANGE_WAIT_AFTER)
        stall();
    return real_sync_file_range(fd, off, n, flags);
}
