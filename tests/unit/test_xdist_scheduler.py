"""The parallel run's scheduler (tests/conftest.py TierScheduling) when a worker dies in a test, as
one did when the official C++ client aborted in its shutdown: the test that killed it fails, it
runs once, the rest of its file runs on the replacement worker, and the run ends (pytest-xdist
3.8's own loadscope scheduler ran the crashing test again on every replacement, and then waited
forever for a replacement holding a one-test file)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_a_worker_that_dies_fails_its_test_once_and_the_run_ends(tmp_path):
    runs = tmp_path / "runs"
    (tmp_path / "conftest.py").write_text("from tests.conftest import pytest_xdist_make_scheduler  # noqa: F401\n")
    record = f"""
        import os, time
        def ran(name):
            with open({str(runs)!r}, "a") as f:
                f.write(name + "\\n")
            time.sleep(0.3)
        """
    (tmp_path / "test_a.py").write_text(textwrap.dedent(record + """
        import pytest

        @pytest.fixture(scope="module")
        def started():
            ran("fixture")
            yield

        def test_before(started):
            ran("before")

        def test_dies(started):
            ran("dies")
            os.abort()

        def test_after(started):
            ran("after")
        """))
    (tmp_path / "test_b.py").write_text(textwrap.dedent(record + """
        import pytest

        @pytest.mark.parametrize("i", range(8))
        def test_b(i):
            ran(f"b{i}")
        """))
    (tmp_path / "test_c.py").write_text(textwrap.dedent(record + """
        def test_c():
            ran("c")
        """))
    env = {**os.environ, "PYTHONPATH": REPO}
    for k in [k for k in env if k.startswith("PYTEST_XDIST") or k in ("MQ_PORT_RANGE", "MQ_TEST_RUN")]:
        del env[k]
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
                        "--dist", "loadscope", str(tmp_path)],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "1 failed, 11 passed" in r.stdout and "test_a.py::test_dies" in r.stdout, out
    ran = runs.read_text().split()
    assert sorted(ran) == sorted(["fixture", "before", "dies", "fixture", "after", "c"]
                                 + [f"b{i}" for i in range(8)]), ran
