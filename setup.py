"""Build: the C core (csrc/) through CFFI API mode, and the Python packages.

`tools/` is installed as the subpackage `mq.tools`, so the operator tools
live at the top of the tree (as in LMDB) and still import as part of mq;
`perf/` likewise becomes `mq.perf` (mqperf, mqtrace, mqpeers), while pytest
and `python -m perf.X` use it in place as the package `perf`."""
from setuptools import find_packages, setup

packages = [p for p in find_packages(include=["mq", "mq.*"])] + ["mq.tools", "mq.perf"]

setup(
    packages=packages,
    package_dir={"mq.tools": "tools", "mq.perf": "perf"},
    cffi_modules=["csrc/build_ffi.py:ffibuilder"],
    zip_safe=False,
)
