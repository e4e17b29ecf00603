/* shimfile.h: the 8-byte control file of the chaos suite's LD_PRELOAD shims (clockshift.c,
 * slowsync.c), which a test or nemesis rewrites while the process runs (mq/chaos/clock.py,
 * ShimFile): one signed int64 in native byte order, mapped read-only once, read with one
 * atomic load.  A shim includes this and declares `static struct shim_file f = {"ENV_NAME"};`. */
#ifndef MQ_SHIMFILE_H
#define MQ_SHIMFILE_H
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

struct shim_file {
    const char *env;              /* the variable naming the file */
    const int64_t *value;         /* NULL: not mapped (yet, or at all) */
    int tried;
};

/* The file's value, 0 when the variable is unset or the file cannot be mapped (the process
 * then runs as usual).  The first call maps it; a race maps it twice at worst (both valid). */
static int64_t shim_file_value(struct shim_file *f) {
    if (!__atomic_load_n(&f->tried, __ATOMIC_ACQUIRE)) {
        const char *path = getenv(f->env);
        if (path) {
            int fd = open(path, O_RDONLY | O_CLOEXEC);
            if (fd >= 0) {
                void *p = mmap(NULL, sizeof(int64_t), PROT_READ, MAP_SHARED, fd, 0);
                close(fd);
                if (p != MAP_FAILED)
                    __atomic_store_n(&f->value, (const int64_t *)p, __ATOMIC_RELEASE);
            }
        }
        __atomic_store_n(&f->tried, 1, __ATOMIC_RELEASE);
    }
    const int64_t *p = __atomic_load_n(&f->value, __ATOMIC_ACQUIRE);
    return p ? __atomic_load_n(p, __ATOMIC_RELAXED) : 0;
}
#endif
