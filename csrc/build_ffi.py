"""CFFI (API mode) build of the store's C core into the extension mq._mqstore.

The cdef is derived from the headers themselves, so they stay the one declaration of the C
boundary: csrc/mqstore.h is read with each `#include "x.h"` replaced by that header (once, in
the order mqstore.h gives), then csrc/testhooks.h (the test-only hooks: reachable as lib.* for
the tests, which run against this one build, but not included by mqstore.h and not API).
Comments, preprocessor guards and system includes are dropped and every `#define NAME value`
becomes `#define NAME ...` (the value is taken from the compiled headers).

Sources: every csrc/*.c, found next to this file (so a copy of csrc/ builds the same way).
Symbols are hidden (-fvisibility=hidden): the module's init is the only export, calls between
the C files bind directly, and nothing outside can interpose on them."""
import glob
import os
import re

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
API_HEADER = "mqstore.h"
TEST_HEADER = "testhooks.h"


def _cdef_lines(name, seen):
    """The cdef text of header `name` (relative to HERE), its local includes inlined once."""
    if name in seen:
        return []
    seen.add(name)
    with open(os.path.join(HERE, name), encoding="utf-8") as f:
        text = f.read()
    # comments out (keeping the line count): one that starts on a #define line may run on
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    out = []
    for line in text.splitlines():
        stripped = line.strip()
        inc = re.match(r'#include\s+"([^"]+)"', stripped)
        if inc:
            out.extend(_cdef_lines(inc.group(1), seen))
            continue
        if stripped.startswith(("#include", "#ifndef", "#endif")):
            continue
        m = re.match(r"#define\s+(\w+)(\s+\S+)?", stripped)
        if m:
            if m.group(2):                    # a constant; a bare #define is an include guard
                out.append("#define %s ..." % m.group(1))
            continue
        out.append(line)
    return out


def cdef():
    seen = set()
    return "\n".join(_cdef_lines(API_HEADER, seen) + _cdef_lines(TEST_HEADER, seen))


def sources():
    return sorted(os.path.relpath(p) for p in glob.glob(os.path.join(HERE, "*.c")))


ffibuilder = FFI()
ffibuilder.cdef(cdef())
ffibuilder.set_source(
    "mq._mqstore",
    '#include "%s"\n#include "%s"' % (API_HEADER, TEST_HEADER),
    sources=sources(),
    include_dirs=[os.path.relpath(HERE)],
    depends=sorted(os.path.relpath(p) for p in glob.glob(os.path.join(HERE, "*.h"))),
    # asserts stay on in shipped builds: they guard invariants, not inputs
    extra_compile_args=["-O2", "-UNDEBUG", "-Wall", "-Wextra", "-Wno-unused-parameter", "-std=gnu11",
                        "-fvisibility=hidden"],
    libraries=["pthread"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
