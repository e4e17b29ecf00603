"""The source distribution carries the whole C core, and a wheel builds from it alone.

test_wheel.py builds from a copy of the checkout; a user who installs from PyPI's sdist (or
`pip install` of a tarball) gets only what MANIFEST.in and setup.py put in it.  Here: the
checkout's files are copied to a temporary directory (no VCS, venv, build output or compiled
module), setuptools' PEP 517 hook builds the sdist there, its csrc/ must hold exactly the
checkout's csrc/ (every .c, every .h, build_ffi.py), and `pip wheel` of the unpacked sdist --
with this venv's setuptools and cffi, no network -- must produce a wheel whose C module loads
and computes zlib's CRC32.  About 20 s, most of it the C build."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import textwrap
import zipfile

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_SKIP_NAMES = {".git", ".venv", "venv", "build", "dist", "run", "tmp", "__pycache__", ".pytest_cache", ".benchmarks",
               ".hypothesis", ".ruff_cache", ".mypy_cache", "_mqstore.c", "latest"}
_SKIP_SUFFIXES = (".egg-info", ".so", ".o", ".pyc")


def _ignore(directory: str, names: list[str]) -> set[str]:
    return {n for n in names if n in _SKIP_NAMES or n.endswith(_SKIP_SUFFIXES)}


def _run(args: list[str], cwd: str, timeout_s: float) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"{' '.join(args)}: exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def test_sdist_ships_the_c_core_and_builds(tmp_path):
    src, dist, unpacked, wheels = (str(tmp_path / d) for d in ("src", "dist", "unpacked", "wheels"))
    shutil.copytree(REPO, src, ignore=_ignore, symlinks=True)
    os.makedirs(dist)
    name = _run([sys.executable, "-c", f"from setuptools import build_meta; print(build_meta.build_sdist({dist!r}))"],
                src, 120).stdout.strip().splitlines()[-1]
    with tarfile.open(os.path.join(dist, name)) as tar:
        members = tar.getnames()
        tar.extractall(unpacked, filter="data")
    root = name[:-len(".tar.gz")]
    shipped = {os.path.relpath(m, root) for m in members if m.startswith(f"{root}/csrc/")} - {"csrc"}
    expected = {os.path.join("csrc", f) for f in os.listdir(os.path.join(src, "csrc"))
                if f.endswith((".c", ".h")) or f == "build_ffi.py"}
    assert len(expected) > 10, expected
    assert shipped == expected, f"missing from the sdist: {sorted(expected - shipped)}; extra: {sorted(shipped - expected)}"

    _run([sys.executable, "-m", "pip", "wheel", os.path.join(unpacked, root), "--no-deps", "--no-build-isolation",
          "--no-index", "-q", "-w", wheels], str(tmp_path), 200)
    (wheel,) = [os.path.join(wheels, f) for f in os.listdir(wheels) if f.endswith(".whl")]
    with zipfile.ZipFile(wheel) as z:
        (so,) = [n for n in z.namelist() if n.startswith("mq/_mqstore") and n.endswith(".so")]
        z.extract(so, str(tmp_path / "lib"))
    probe = textwrap.dedent(f"""
        import importlib.util, zlib
        spec = importlib.util.spec_from_file_location("probe._mqstore", {str(tmp_path / "lib" / so)!r})
        m = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(m)
        data = b"123456789" * 100
        assert m.lib.mq_crc32(0, m.ffi.from_buffer("uint8_t[]", data), len(data)) == zlib.crc32(data)
        print("ok")
    """)
    assert _run([sys.executable, "-c", probe], str(tmp_path), 60).stdout.strip() == "ok"
