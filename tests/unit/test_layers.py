"""The house's layers: every module of mq imports only its own package and packages of lower
layers, so imports point one way (STYLE.md, habit 1), and the client and the name server run
without the store's compiled C module.

    layer 0  mq.wire (every byte layout, code table and JSON dialect), mq.options, mq.logs,
             mq.loop, mq.trace, mq._mqstore (the C core)
    layer 1  mq.files (crash-safe files), mq.acl (signatures and accounts), mq.proxy
    layer 2  mq.store (the C core's users), mq.remoting (frames over TCP)
    layer 3  mq.ha, mq.dledger, mq.namesrv, mq.client
    layer 4  mq.gateway (gRPC for 5.x clients: a client of the broker's 4.x path)
    layer 5  mq.broker (its supervisor starts the gateway's role)
    layer 6  mq.cluster (real processes for tests and tools), mq.hosts (network namespaces as hosts)
    layer 7  mq.cli
    layer 8  mq.chaos (fault injection: it drives everything)

mq.client and mq.namesrv may not import mq.store at all (they would load the C module), and
mq.client not mq.namesrv."""
from __future__ import annotations

import ast
import os
import subprocess
import sys

import pytest

MQ = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "mq")
LAYER = {"mq.wire": 0, "mq.options": 0, "mq.logs": 0, "mq.loop": 0, "mq.trace": 0, "mq._mqstore": 0,
         "mq.files": 1, "mq.acl": 1, "mq.proxy": 1,
         "mq.store": 2, "mq.remoting": 2,
         "mq.ha": 3, "mq.dledger": 3, "mq.namesrv": 3, "mq.client": 3,
         "mq.gateway": 4,
         "mq.broker": 5, "mq.cluster": 6, "mq.hosts": 6, "mq.cli": 7, "mq.chaos": 8,
         "mq.conf": 0}       # config files shipped as data (mq.conf.systemd writes units)
FORBIDDEN = {"mq.client": {"mq.store", "mq.namesrv", "mq.broker"}, "mq.namesrv": {"mq.store", "mq.broker"}}


def _package(module: str) -> str:
    return ".".join(module.split(".")[:2])


def _imports():
    """(importing package, imported package, file, line) for every import of an mq module."""
    for dirpath, _dirs, files in os.walk(MQ):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, os.path.dirname(MQ))[:-3].split(os.sep)
            module = ".".join(rel[:-1] if rel[-1] == "__init__" else rel)
            package = _package(module)
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read(), path)
            for node in ast.walk(tree):
                targets = []
                if isinstance(node, ast.Import):
                    targets = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom):
                    if node.level:
                        base = module.split(".")
                        base = base[:len(base) - node.level + (1 if rel[-1] == "__init__" else 0)]
                        targets = [".".join(base + ([node.module] if node.module else []))]
                    elif node.module:
                        targets = [node.module]
                for t in targets:
                    if t.startswith("mq.") and _package(t) != package:
                        yield package, _package(t), os.path.relpath(path, os.path.dirname(MQ)), node.lineno


def test_every_package_has_a_layer():
    packages = {p for p, _, _, _ in _imports()} | {t for _, t, _, _ in _imports()}
    assert not packages - set(LAYER), f"packages with no layer (add them to LAYER): {packages - set(LAYER)}"


def test_imports_point_down():
    wrong = [f"{where}:{line}: {src} (layer {LAYER[src]}) imports {dst} (layer {LAYER[dst]})"
             for src, dst, where, line in _imports()
             if src in LAYER and dst in LAYER and (LAYER[dst] >= LAYER[src] or dst in FORBIDDEN.get(src, ()))]
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("modules", [["mq.client"], ["mq.namesrv", "mq.namesrv.server"], ["mq.remoting"],
                                     ["mq.wire", "mq.files", "mq.options"]])
def test_imports_without_the_compiled_module(modules):
    """In a fresh interpreter whose import of mq._mqstore fails, these import, and no mq.store
    module was loaded on the way."""
    code = f"""
import sys
class Block:
    def find_spec(self, name, path, target=None):
        if name == "mq._mqstore":
            raise ImportError("the compiled module is blocked")
sys.meta_path.insert(0, Block())
import importlib
for m in {modules!r}:
    importlib.import_module(m)
loaded = sorted(m for m in sys.modules if m.startswith("mq.store") or m == "mq._mqstore")
assert not loaded, loaded
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       cwd=os.path.dirname(MQ))
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr


def test_the_direction_check_catches_an_import_that_points_up(monkeypatch):
    """The check is not vacuous: with mq.proxy moved above mq.cluster, which imports it, it fails
    naming that import."""
    monkeypatch.setitem(LAYER, "mq.proxy", LAYER["mq.cluster"] + 1)
    with pytest.raises(AssertionError, match=r"mq/cluster\.py:\d+: mq\.cluster \(layer 6\) imports mq\.proxy"):
        test_imports_point_down()
