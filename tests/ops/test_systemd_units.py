"""The shipped config files and systemd units (conf/):
  * `systemd-analyze verify` accepts both units without a single warning, once their
    ExecStart points at commands that exist (a copy with /opt/mq/.venv/bin/ replaced by
    this checkout's venv, which is where the documented layout puts the same commands);
  * the units keep the settings the broker relies on, and every directive is documented;
  * every key of conf/broker.conf is a broker option, and `mqbroker -c conf/broker.conf -p`
    prints each with the file's value (no warnings); the same for conf/namesrv.properties
    and `mqnamesrv -p`."""
from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from mq.broker.config import ALL_OPTIONS, parse_properties as parse_broker_properties
from mq.namesrv.config import NAMESRV_OPTIONS, parse_properties as parse_namesrv_properties
from mq.cluster import BIN

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONF = os.path.join(ROOT, "conf")
UNITS = {"mqbroker": os.path.join(CONF, "systemd", "mqbroker.service"),
         "mqnamesrv": os.path.join(CONF, "systemd", "mqnamesrv.service")}
INSTALLED_BIN = "/opt/mq/.venv/bin/"      # the layout the units document


def read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def directives(text: str) -> dict[str, list[str]]:
    """key -> values, over all sections (the units use each key in one section only)."""
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line and line[0] not in "#;[" and "=" in line:
            key, _, value = line.partition("=")
            out.setdefault(key.strip(), []).append(value.strip())
    return out


# ---- systemd units ------------------------------------------------------------------------------

def test_units_verify_without_warnings(tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (Debian package 'systemd'; make test installs it)")
    paths = []
    for name, src in UNITS.items():
        text = read(src)
        assert text.count(INSTALLED_BIN + name) == 1, f"{name}.service: ExecStart is not {INSTALLED_BIN}{name}"
        local_bin = os.path.join(BIN, "")
        assert os.access(os.path.join(local_bin, name), os.X_OK), f"{name} is not installed in {local_bin}"
        dst = tmp_path / f"{name}.service"
        dst.write_text(text.replace(INSTALLED_BIN, local_bin), encoding="utf-8")
        paths.append(str(dst))
    env = {**os.environ, "SYSTEMD_LOG_COLOR": "0", "SYSTEMD_PAGER": "", "LC_ALL": "C"}
    r = subprocess.run([analyze, "verify", "--man=no", *paths], capture_output=True, text=True, timeout=60,
                       env=env)
    assert r.returncode == 0 and r.stdout == "" and r.stderr == "", \
        f"systemd-analyze verify exit {r.returncode}:\n{r.stdout}{r.stderr}"


@pytest.mark.parametrize("name", sorted(UNITS))
def test_unit_settings(name):
    d = directives(read(UNITS[name]))
    one = {k: v[0] for k, v in d.items() if len(v) == 1}
    assert one["Type"] == "notify"
    assert one["NotifyAccess"] == "main"
    assert one["ExecStart"].split()[0] == INSTALLED_BIN + name
    assert one["KillSignal"] == "SIGTERM"
    assert one["KillMode"] == "mixed"            # SIGTERM to the main process only; it stops its children
    assert int(one["TimeoutStopSec"]) >= 30
    assert one["Restart"] == "on-failure"
    assert one["RestartPreventExitStatus"] == "2"
    assert int(one["LimitNOFILE"]) >= 65536
    assert one["WatchdogSec"] == "30"
    # /dev/shm must stay usable: strict keeps /dev writable, PrivateDevices bind-mounts /dev/shm
    assert one.get("ProtectSystem") in (None, "strict", "full", "yes", "true")
    assert "InaccessiblePaths" not in one and "TemporaryFileSystem" not in one
    assert "AF_UNIX" in one["RestrictAddressFamilies"].split()    # sd_notify and the worker link
    assert "MemoryDenyWriteExecute" not in one


@pytest.mark.parametrize("name", sorted(UNITS))
def test_every_unit_directive_is_documented(name):
    """Each block of directives starts right after a comment line."""
    previous = ""
    for lineno, line in enumerate(read(UNITS[name]).splitlines(), 1):
        if line and line[0] not in "#;[":
            assert previous.startswith("#") or (previous and previous[0] not in "#;["), \
                f"{name}.service:{lineno}: {line!r} has no comment above it"
        previous = line


# ---- config files -------------------------------------------------------------------------------

BROKER_CONF_EXPECTED = {
    "brokerClusterName": "DefaultCluster", "brokerName": "broker-a", "brokerId": "0", "deleteWhen": "04",
    "fileReservedTime": "48", "brokerRole": "ASYNC_MASTER", "flushDiskType": "ASYNC_FLUSH",
    "namesrvAddr": "127.0.0.1:9876", "listenPort": "10911", "brokerIP1": "127.0.0.1",
    "listenAddress": "127.0.0.1", "storePathRootDir": "./run/store",
}


def _print_config(command: str, conf: str) -> dict[str, str]:
    r = subprocess.run([os.path.join(BIN, command), "-c", conf, "-p"], capture_output=True, text=True,
                       timeout=60, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert r.stderr == "", f"{command} warned about {conf}:\n{r.stderr}"
    printed = {}
    for line in r.stdout.splitlines():
        key, sep, value = line.partition("=")
        assert sep, f"{command} -p printed {line!r}"
        printed[key] = value
    return printed


def test_broker_conf_keys_are_options_and_print_as_written():
    path = os.path.join(CONF, "broker.conf")
    values = parse_broker_properties(read(path))
    assert values == BROKER_CONF_EXPECTED
    unknown = sorted(set(values) - set(ALL_OPTIONS))
    assert not unknown, f"conf/broker.conf has keys that are not broker options: {unknown}"
    printed = _print_config("mqbroker", path)
    assert set(printed) == set(ALL_OPTIONS)
    for key, value in values.items():
        assert printed[key] == value, (key, printed[key], value)


def test_broker_conf_documents_every_key():
    """Like RocketMQ's shipped file, but each key has a comment saying what it does."""
    lines = read(os.path.join(CONF, "broker.conf")).splitlines()
    for i, line in enumerate(lines):
        if line and not line.startswith("#"):
            assert i > 0 and lines[i - 1].startswith("#"), f"broker.conf:{i + 1}: {line!r} has no comment"


def test_namesrv_properties_print_as_written():
    path = os.path.join(CONF, "namesrv.properties")
    values = parse_namesrv_properties(read(path))
    assert values == {"listenPort": "9876", "listenAddress": "127.0.0.1",
                      "kvConfigPath": "./run/namesrv/kvConfig.json"}
    assert set(values) <= {o.name for o in NAMESRV_OPTIONS}
    printed = _print_config("mqnamesrv", path)
    assert set(printed) == {o.name for o in NAMESRV_OPTIONS}
    for key, value in values.items():
        assert printed[key] == value, (key, printed[key], value)


def test_conf_files_use_no_absolute_paths():
    """The embedded defaults stay relative, so a checkout and /var/lib/mq both work."""
    for name in ("broker.conf", "namesrv.properties"):
        for line in read(os.path.join(CONF, name)).splitlines():
            if line and not line.startswith("#"):
                assert not re.search(r"=\s*/", line), f"{name}: {line!r}"


def test_make_run_embeds_the_same_values():
    """mq.cli.local (make run) embeds its config rather than reading conf/; every value of the
    conf files must be what it embeds (with its run directory as ./run)."""
    from mq.cli.local import embedded_config
    ns_text, broker_text = embedded_config("./run", 9876, 10911)
    embedded_broker = parse_broker_properties(broker_text)
    for key, value in parse_broker_properties(read(os.path.join(CONF, "broker.conf"))).items():
        assert embedded_broker.get(key) == value, (key, embedded_broker.get(key), value)
    embedded_ns = parse_namesrv_properties(ns_text)
    for key, value in parse_namesrv_properties(read(os.path.join(CONF, "namesrv.properties"))).items():
        assert embedded_ns.get(key) == value, (key, embedded_ns.get(key), value)
