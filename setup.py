"""Build: the C core (csrc/) through CFFI API mode, and the Python packages.

`tools/` is installed as the subpackage `mq.tools`, so the operator tools
live at the top of the tree (as in LMDB) and still import as part of mq;
`perf/` likewise becomes `mq.perf` (mqperf, mqtrace, mqpeers, and mqload, whose C source
ships as package data and is compiled on first use), while pytest
and `python -m perf.X` use it in place as the package `perf`; `conf/` becomes
`mq.conf`, its config files, layouts and systemd units package data, so a
wheel carries them and `python -m mq.cli.local LAYOUT` finds them installed."""
from setuptools import find_namespace_packages, find_packages, setup

# conf/'s subdirectories (layouts, systemd/) are data, shipped by mq.conf's globs below; the
# ones named like identifiers (systemd, dledger) are listed as packages too, or setuptools
# warns that they look importable but are not in `packages`
conf_dirs = [f"mq.conf.{d}" for d in find_namespace_packages(where="conf") if d.isidentifier() and d[0] != "_"]
packages = find_packages(include=["mq", "mq.*"]) + ["mq.tools", "mq.perf", "mq.conf"] + conf_dirs

setup(
    packages=packages,
    package_dir={"mq.tools": "tools", "mq.perf": "perf", "mq.conf": "conf"},
    # every config file at any depth: a new layout directory needs no change here
    package_data={"mq.conf": ["*.conf", "*.properties", "*.yml", "**/*.conf", "**/*.properties", "systemd/*.service",
                              "grafana/*.json"],
                  "mq.perf": ["mqload.c"], "mq.chaos": ["clockshift.c", "slowsync.c", "shimfile.h"]},
    cffi_modules=["csrc/build_ffi.py:ffibuilder"],
    zip_safe=False,
)
