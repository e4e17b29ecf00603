"""Hypothesis settings shared by the property tests (tests/properties/).

Every property runs in CI with a bounded example count, derandomized (the examples are a
function of the test's source, so a CI failure reproduces on any machine), no deadline (a
loaded 2-core machine is slow in bursts) and no example database (nothing is written into the
tree).  MQ_PROPERTY_SCALE=N multiplies every example count, and MQ_PROPERTY_RANDOM=1 draws
fresh random examples (the seed is printed on failure), for a longer search by hand:

    MQ_PROPERTY_RANDOM=1 MQ_PROPERTY_SCALE=20 .venv/bin/pytest -q tests/properties
"""
from __future__ import annotations

import os
import struct

from hypothesis import HealthCheck, settings

SCALE = max(1, int(os.environ.get("MQ_PROPERTY_SCALE", "1")))
RANDOM = os.environ.get("MQ_PROPERTY_RANDOM", "") not in ("", "0")


def bounded(max_examples: int, **kw) -> settings:
    """The settings of one property: at most max_examples (times MQ_PROPERTY_SCALE) examples."""
    return settings(max_examples=max_examples * SCALE, deadline=None, derandomize=not RANDOM, database=None,
                    print_blob=True, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
                    **kw)


def rocketmq_header(code: int, language: int, version: int, opaque: int, flag: int,
                    items: list[tuple[bytes, bytes]]) -> bytes:
    """A ROCKETMQ (binary) request header written by hand, not by the encoder under test: code,
    language, version, opaque, flag, no remark, then the extFields entries as given."""
    ext = b"".join(struct.pack(">h", len(k)) + k + struct.pack(">i", len(v)) + v for k, v in items)
    return struct.pack(">hBhiii", code, language & 0xFF, version, opaque, flag, 0) + struct.pack(">i", len(ext)) + ext
