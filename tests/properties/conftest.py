"""The properties' time limit grows with MQ_PROPERTY_SCALE: a by-hand search at scale N runs N
times the examples CI runs, so the 300 s per test of pyproject.toml (pytest-timeout) would stop
a long search, not a hung test (one such sweep at scale 20 on a loaded machine was cut at 300 s in
test_prop_client_decode)."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.properties.propkit import SCALE

TIMEOUT_S = 300


HERE = Path(__file__).parent


def pytest_collection_modifyitems(items):
    """(The hook sees the whole session's items: only this directory's are given the limit.)"""
    if SCALE > 1:
        for item in items:
            if HERE in Path(item.path).parents:
                item.add_marker(pytest.mark.timeout(TIMEOUT_S * SCALE))
