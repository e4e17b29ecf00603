"""The wheel on its own (issue 9, "installable from a wheel").

Once per module: the checkout's files are copied to a temporary directory (without build/,
*.egg-info, .venv, compiled modules and caches, so nothing stale of an earlier build can slip
into the wheel, and the checkout is left untouched), `pip wheel . --no-deps` builds the wheel
there (the C core compiled from csrc/), `python -m venv` makes a fresh venv in another
temporary directory, and pip installs the wheel into it, resolving only the required
dependencies (cffi, construct, multiprocessing-logging) from the configured package index:
none of the `perf` extra.  Every command then runs with the venv's interpreter or scripts,
from a working directory outside the checkout, with PYTHONPATH and every other PYTHON*
variable cleared, and the checkout's directories taken off PATH, so nothing of the checkout
can leak in.  About 30 s here, most of it the wheel's C build."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXTRA_HINT = "pip install 'mq-broker[perf]'"
LAYOUT_BROKERS = {"2m-2s-async": 4, "2m-2s-sync": 4, "2m-noslave": 2, "dledger": 3}

# what a build of the checkout must not see: VCS, venvs, build output, compiled files, caches, run state
_SKIP_NAMES = {".git", ".venv", "venv", "build", "dist", "run", "__pycache__", ".pytest_cache", ".benchmarks",
               ".ruff_cache", ".mypy_cache", "_mqstore.c"}
_SKIP_SUFFIXES = (".egg-info", ".so", ".o", ".pyc")


def _ignore(directory: str, names: list[str]) -> set[str]:
    rel = os.path.relpath(directory, REPO)
    skip = {n for n in names if n in _SKIP_NAMES or n.endswith(_SKIP_SUFFIXES)}
    if rel == ".":
        skip.add("tmp")                                  # .gitignore's /tmp/
    if rel == os.path.join("perf", "reports"):
        skip.add("latest")                               # `make report` output
    return skip


class Installed:
    """The venv holding the wheel, and how to run things in it as a user would."""

    def __init__(self, root: str, venv: str, wheel: str):
        self.root = root
        self.venv = venv
        self.wheel = wheel
        self.bin = os.path.join(venv, "bin")
        self.python = os.path.join(self.bin, "python")
        self.cwd = os.path.join(root, "elsewhere")       # a working directory outside the checkout
        os.makedirs(self.cwd, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON") and k != "VIRTUAL_ENV"}
        path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and not _inside(p, REPO)]
        env.update(PATH=os.pathsep.join([self.bin, *path]), VIRTUAL_ENV=venv, PYTHONNOUSERSITE="1")
        self.env = env

    def run(self, args: list[str], timeout_s: float = 60, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(args, cwd=kw.pop("cwd", self.cwd), env=self.env, capture_output=True, text=True,
                              timeout=timeout_s, stdin=subprocess.DEVNULL, **kw)

    def script(self, name: str, *args: str, timeout_s: float = 60) -> subprocess.CompletedProcess:
        return self.run([os.path.join(self.bin, name), *args], timeout_s)

    def python_code(self, code: str, *args: str, timeout_s: float = 60) -> subprocess.CompletedProcess:
        path = os.path.join(self.root, "snippet.py")
        with open(path, "w") as f:
            f.write(textwrap.dedent(code))
        return self.run([self.python, path, *args], timeout_s)


def _inside(path: str, directory: str) -> bool:
    path, directory = os.path.realpath(path), os.path.realpath(directory)
    return path == directory or path.startswith(directory + os.sep)


def _ok(done: subprocess.CompletedProcess, what: str) -> None:
    assert done.returncode == 0, f"{what}: exit {done.returncode}\nstdout:\n{done.stdout[-3000:]}\n" \
                                 f"stderr:\n{done.stderr[-3000:]}"


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Installed:
    root = str(tmp_path_factory.mktemp("wheel"))
    assert not _inside(root, REPO), "the temporary directory must be outside the checkout"
    src, dist, venv = (os.path.join(root, d) for d in ("src", "dist", "venv"))
    shutil.copytree(REPO, src, ignore=_ignore, symlinks=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "-w", dist], cwd=src, env=env,
                           capture_output=True, text=True, timeout=150)
    _ok(build, "pip wheel")
    wheels = [f for f in os.listdir(dist) if f.endswith(".whl")]
    assert len(wheels) == 1, wheels
    wheel = os.path.join(dist, wheels[0])
    _ok(subprocess.run([sys.executable, "-m", "venv", venv], cwd=root, env=env, capture_output=True, text=True,
                       timeout=60), "python -m venv")
    inst = Installed(root, venv, wheel)
    _ok(inst.run([inst.python, "-m", "pip", "install", "--no-input", wheel], timeout_s=150), "pip install <wheel>")
    return inst


def test_installed_package_is_the_wheel(installed):
    """The venv's `mq` is the wheel's: mq, mq.cluster, mq.conf, mq.perf and mq.tools all live
    under the new venv's site-packages (not in the checkout), the C module (mq._mqstore) is
    there and works (its CRC32 equals zlib's), nothing named `tests` or `perf` is importable
    (the checkout does not leak), none of the `perf` extra was installed, and pip finds the
    installed distributions consistent."""
    done = installed.python_code("""
        import importlib.util, json, sys, zlib
        import mq, mq.cluster, mq.conf, mq.perf, mq.tools, mq._mqstore
        from mq.store.native import ffi, lib
        data = b"123456789" * 100
        print(json.dumps({
            "files": {m.__name__: m.__file__ for m in (mq, mq.cluster, mq.conf, mq.perf, mq.tools, mq._mqstore)},
            "crc_ok": lib.mq_crc32(0, ffi.from_buffer("uint8_t[]", data), len(data)) == zlib.crc32(data),
            "importable": {n: importlib.util.find_spec(n) is not None
                           for n in ("tests", "perf", "pyspark", "matplotlib", "redis", "nats")},
            "prefix": sys.prefix,
        }))
    """)
    _ok(done, "import check")
    info = json.loads(done.stdout)
    site = os.path.join(installed.venv, "lib")
    for name, path in info["files"].items():
        assert _inside(path, site), f"{name} comes from {path}, not from the venv"
        assert not _inside(path, REPO), f"{name} comes from the checkout: {path}"
    assert info["files"]["mq._mqstore"].endswith(".so")
    assert info["crc_ok"]
    assert info["importable"] == dict.fromkeys(info["importable"], False), info["importable"]
    assert os.path.realpath(info["prefix"]) == os.path.realpath(installed.venv)
    _ok(installed.run([installed.python, "-m", "pip", "check"]), "pip check")


SCRIPTS = [
    (["mqnamesrv", "-p"], ["listenPort=9876", "kvConfigPath="]),
    (["mqbroker", "-p"], ["brokerClusterName=", "listenPort=10911", "storePathRootDir="]),
    (["mqadmin", "--help"], ["usage: mqadmin", "clusterList", "updateTopic"]),
    (["mqdump", "--help"], ["usage: mqdump", "commitlog", "consumequeue"]),
    (["mqperf", "--help"], ["usage: mqperf", "produce,consume,e2e"]),
    (["mqtrace", "--help"], ["usage: mqtrace", "TRACE_DIR"]),
    (["mqpeers", "--help"], ["usage: mqpeers", "--only"]),
    (["mqchaos", "run", "--help"], ["usage: mqchaos run", "--nemesis"]),
]


@pytest.mark.parametrize("command, expected", SCRIPTS, ids=[" ".join(c) for c, _ in SCRIPTS])
def test_console_script(installed, command, expected):
    """Each console script of the wheel runs from the venv's bin/, outside the checkout, with
    only the required dependencies installed: exit 0, its usage or configuration on stdout,
    nothing on stderr that looks like a traceback (the perf tools import their optional
    packages only when a command really needs them)."""
    done = installed.script(*command)
    _ok(done, " ".join(command))
    for text in expected:
        assert text in done.stdout, f"{' '.join(command)}: {text!r} not in\n{done.stdout[:2000]}"
    assert "Traceback" not in done.stderr, done.stderr


def test_perf_extra_missing_is_named(installed):
    """Without the `perf` extra, commands that need it end with one line naming what is missing
    and `pip install 'mq-broker[perf]'`, exit 1, no traceback: mqtrace (pyspark, matplotlib)
    before it reads a trace, mqpeers --only nats (nats-py) before it installs or starts
    anything (it says nothing of starting servers)."""
    trace = os.path.join(installed.root, "trace")
    os.makedirs(trace, exist_ok=True)
    for command, missing in ((["mqtrace", trace], ["pyspark", "matplotlib"]),
                             (["mqpeers", "--only", "nats"], ["nats"])):
        done = installed.script(*command)
        what = " ".join(command)
        assert done.returncode == 1, f"{what}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
        assert EXTRA_HINT in done.stderr and "Traceback" not in done.stderr, f"{what}:\n{done.stderr}"
        assert all(m in done.stderr for m in missing), f"{what}:\n{done.stderr}"
        assert "starting" not in done.stderr + done.stdout, f"{what} started something:\n{done.stderr}"


def test_layouts_and_config_files_ship_in_the_wheel(installed):
    """conf/ is installed as mq.conf: broker.conf, namesrv.properties, both systemd units, the Grafana dashboard
    are files under the venv, and mq.cli.local resolves every shipped layout through the
    package (2m-2s-async and 2m-2s-sync with 4 brokers, 2m-noslave with 2; masters first), each
    broker file under the venv's mq/conf/; an unknown layout is refused with a message listing
    the real ones, from a working directory that has no conf/."""
    done = installed.python_code("""
        import json, os
        from mq import conf
        from mq.cli.local import _layout_brokers
        files = [conf.path(p) for p in ("broker.conf", "namesrv.properties")] + \\
                [conf.path("systemd", u) for u in ("mqbroker.service", "mqnamesrv.service")] + \\
                [conf.path("grafana", "rocketmq-broker.json")]
        print(json.dumps({"dir": conf.DIR, "files": {f: os.path.isfile(f) for f in files},
                          "layouts": {name: _layout_brokers(name) for name in conf.layouts()}}))
    """)
    _ok(done, "layouts")
    info = json.loads(done.stdout)
    conf_dir = info["dir"]
    assert _inside(conf_dir, os.path.join(installed.venv, "lib")) and conf_dir.endswith(os.path.join("mq", "conf"))
    assert all(info["files"].values()), info["files"]
    assert not os.path.exists(os.path.join(installed.cwd, "conf"))
    for layout, brokers in LAYOUT_BROKERS.items():
        got = info["layouts"].get(layout)
        assert got is not None and len(got) == brokers, (layout, info["layouts"].keys())
        assert all(_inside(path, conf_dir) and os.path.isfile(path) for path, *_ in got), got
        assert "-s." not in os.path.basename(got[0][0]), f"{layout}: a slave listed before the masters: {got}"
    done = installed.run([installed.python, "-m", "mq.cli.local", "no-such-layout"])
    assert done.returncode == 1 and "no layout 'no-such-layout'" in done.stderr, done.stderr
    assert all(layout in done.stderr for layout in LAYOUT_BROKERS), done.stderr


def test_cluster_from_the_installed_package(installed):
    """The installed mq.cluster starts the installed mqnamesrv and mqbroker (found next to the
    venv's interpreter) on free loopback ports with their stores in a temporary directory; the
    installed mq.client sends a message (SEND_OK) and pulls it back by its queue and offset
    (same body and tag); the broker's gRPC endpoint (grpcServerPort) answers QueryRoute for
    the topic; both servers then stop on SIGTERM with exit status 0."""
    work = os.path.join(installed.root, "cluster")
    os.makedirs(work, exist_ok=True)
    done = installed.python_code("""
        import asyncio, json, sys, time
        import mq.cluster
        from mq.client import AdminClient, Message, Producer, PullConsumer, PullStatus, SendStatus
        from mq.cluster import Broker, NameServer

        work = sys.argv[1]
        out = {"bin": mq.cluster.BIN}
        ns = NameServer(work)
        gport = mq.cluster.free_port()
        try:
            broker = Broker(work, ns.addr, grpcServerPort=gport)
        except BaseException:
            ns.stop()
            raise

        async def until(cond, what, timeout_s=30.0):
            deadline = time.monotonic() + timeout_s
            while not await cond():
                if time.monotonic() > deadline:
                    raise TimeoutError(what)
                await asyncio.sleep(0.1)

        async def flow():
            async with AdminClient(ns.addr, timeout_s=2.0) as admin:
                async def routed():
                    try:
                        return bool((await admin.topic_route("TBW102")).broker_datas)
                    except Exception:
                        return False
                await until(routed, "the broker's TBW102 route")
            async with Producer("wheel_producer", ns.addr) as producer:
                sent = await producer.send(Message("WheelTopic", b"hello from the wheel", tags="TagW"))
            out["send_status"] = sent.status.name
            async with PullConsumer("wheel_consumer", ns.addr) as consumer:
                got = []

                async def found():
                    r = await consumer.pull(sent.queue, sent.queue_offset, 32)
                    got[:] = r.messages if r.status is PullStatus.FOUND else []
                    return bool(got)
                await until(found, "the message to be pullable")
            out["received"] = [[m.body.decode(), m.tags] for m in got]
            # the gateway for 5.x clients ships and serves: QueryRoute of the topic over gRPC
            import grpc
            from mq.wire.grpc5 import SERVICE, msg
            await until(lambda: asyncio.sleep(0, mq.cluster.port_open(gport)), "the gRPC port")
            req = msg("QueryRouteRequest")()
            req.topic.name = "WheelTopic"
            with grpc.insecure_channel(f"127.0.0.1:{gport}") as ch:
                fn = ch.unary_unary(f"/{SERVICE}/QueryRoute", request_serializer=lambda m: m.SerializeToString(),
                                    response_deserializer=msg("QueryRouteResponse").FromString)
                r = await asyncio.to_thread(fn, req, metadata=(("x-mq-client-id", "wheel@1@0@x"),), timeout=10)
            out["grpc_route"] = [r.status.code, len(r.message_queues)]

        try:
            asyncio.run(asyncio.wait_for(flow(), 90))
        finally:
            out["broker_exit"] = broker.stop()
            out["namesrv_exit"] = ns.stop()
            print(json.dumps(out))
    """, work, timeout_s=150)
    _ok(done, "cluster script")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert os.path.realpath(out["bin"]) == os.path.realpath(installed.bin)
    assert out["send_status"] == "SEND_OK"
    assert out["received"] == [["hello from the wheel", "TagW"]]
    assert out["grpc_route"][0] == 20000 and out["grpc_route"][1] > 0, out      # Code.OK, the topic's queues
    assert (out["broker_exit"], out["namesrv_exit"]) == (0, 0), out


def test_mqload_source_ships_and_builds(installed):
    """perf/mqload.c ships in the wheel as mq.perf's package data: the installed
    mq.perf.mqload finds it beside itself (under the venv), builds it into $MQ_PERF_CACHE, and
    the binary runs (bad arguments: usage on stderr, exit 2)."""
    if shutil.which("gcc") is None:
        pytest.skip("no gcc on this machine")
    cache = os.path.join(installed.root, "mqload-cache")
    done = installed.python_code(f"""
        import json, os, subprocess
        os.environ["MQ_PERF_CACHE"] = {cache!r}
        from mq.perf import mqload
        binary = mqload.build()
        bad = subprocess.run([binary, "-c", "0"], capture_output=True, text=True)
        print(json.dumps({{"source": mqload.SOURCE, "binary": binary, "rc": bad.returncode, "err": bad.stderr}}))
    """, timeout_s=120)
    _ok(done, "mqload build")
    info = json.loads(done.stdout)
    assert _inside(info["source"], os.path.join(installed.venv, "lib")), info["source"]
    assert _inside(info["binary"], cache), info["binary"]
    assert info["rc"] == 2 and "usage: mqload" in info["err"], info
