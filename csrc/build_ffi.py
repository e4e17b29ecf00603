"""CFFI (API mode) build of the store's C core into the extension mq._mqstore.

The cdef is derived from csrc/mqstore.h itself, so the header stays the one
declaration of the C boundary: preprocessor guards and includes are dropped
and every #define becomes `#define NAME ...` (the value is taken from the
compiled header)."""
import os
import re

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))


def _cdef_from_header(path):
    out = []
    for line in open(path, encoding="utf-8"):
        stripped = line.strip()
        if stripped.startswith(("#include", "#ifndef", "#endif", "#define MQSTORE_H")):
            continue
        m = re.match(r"#define\s+(\w+)\s+\S+", stripped)
        if m:
            out.append("#define %s ..." % m.group(1))
            continue
        out.append(line.rstrip("\n"))
    return "\n".join(out)


ffibuilder = FFI()
ffibuilder.cdef(_cdef_from_header(os.path.join(HERE, "mqstore.h")))
ffibuilder.set_source(
    "mq._mqstore",
    '#include "mqstore.h"',
    sources=[os.path.relpath(os.path.join(HERE, "mqstore.c"))],
    include_dirs=[os.path.relpath(HERE)],
    # asserts stay on in shipped builds: they guard invariants, not inputs
    extra_compile_args=["-O2", "-UNDEBUG", "-Wall", "-Wextra", "-Wno-unused-parameter", "-std=gnu11"],
    libraries=["pthread"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
