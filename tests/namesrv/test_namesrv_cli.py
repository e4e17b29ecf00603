"""mqnamesrv as an operator runs it: the installed console script as a real
process, its config file handling, sd_notify and a clean SIGTERM stop."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
import uuid

import pytest

from mq.cli import sdnotify
from mq.namesrv.config import NamesrvConfig, parse_properties
from mq.remoting import RemotingClient, ResponseCode
from mq.wire.remoting import decode_frame

from nshelpers import register_cmd, run

MQNAMESRV = os.path.join(os.path.dirname(sys.executable), "mqnamesrv")
# spec Appendix C: GET_ROUTEINFO_BY_TOPIC, topic TopicTest, opaque 0, version 409, JSON (139 bytes)
ROUTE_VECTOR = bytes.fromhex("0000008700000083") + (
    b'{"code":105,"extFields":{"topic":"TopicTest"},"flag":0,"language":"JAVA","opaque":0,'
    b'"serializeTypeCurrentRPC":"JSON","version":409}')


def mqnamesrv(*args, **kw):
    return subprocess.run([MQNAMESRV, *args], capture_output=True, text=True, timeout=20, **kw)


def test_print_config_defaults_and_file_overrides(tmp_path):
    """`mqnamesrv -p` prints every option as key=value with RocketMQ's defaults (port 9876, 120 s
    expiry, 10 s scan) and exits 0; with -c the file's values win, Java-only keys and unknown keys
    are warned about on stderr and ignored."""
    r = mqnamesrv("-p")
    assert r.returncode == 0, r.stderr
    printed = dict(line.split("=", 1) for line in r.stdout.splitlines())
    assert list(printed) == list(NamesrvConfig.OPTIONS)
    assert printed["listenPort"] == "9876" and printed["brokerExpiredMillis"] == "120000"
    assert printed["scanNotActiveBrokerInterval"] == "10000" and printed["orderMessageEnable"] == "false"
    assert printed["kvConfigPath"].endswith(os.path.join("namesrv", "kvConfig.json"))

    conf = tmp_path / "namesrv.properties"
    conf.write_text("# comment\nlistenPort = 19876\nkvConfigPath=/tmp/x/kv.json\n"
                    "serverWorkerThreads=8\nlistenPrt=1\norderMessageEnable=true\n")
    r = mqnamesrv("-c", str(conf), "-p")
    assert r.returncode == 0, r.stderr
    printed = dict(line.split("=", 1) for line in r.stdout.splitlines())
    assert (printed["listenPort"], printed["kvConfigPath"], printed["orderMessageEnable"]) == \
        ("19876", "/tmp/x/kv.json", "true")
    assert "listenPrt: unknown key" in r.stderr
    assert "serverWorkerThreads: a RocketMQ key this name server does not use" in r.stderr


@pytest.mark.parametrize("line, key", [("listenPort=98760", "listenPort"), ("brokerExpiredMillis=soon", "brokerExpiredMillis"),
                                       ("orderMessageEnable=yes", "orderMessageEnable")])
def test_bad_config_value_exits_2_naming_the_key(tmp_path, line, key):
    """A value that does not parse or is out of range is refused: exit 2, the key on stderr, nothing
    started."""
    conf = tmp_path / "bad.properties"
    conf.write_text(line + "\n")
    r = mqnamesrv("-c", str(conf))
    assert r.returncode == 2
    assert key in r.stderr and "bad value" in r.stderr
    r = mqnamesrv("-c", str(tmp_path / "missing.properties"))
    assert r.returncode == 2 and "cannot read config file" in r.stderr


def test_properties_parser_follows_java_rules():
    """Separators '=', ':' and whitespace, '#'/'!' comments, continuation lines and escapes."""
    text = "a=1\n  b : 2\nc 3\n! note\n# note\nd=x\\\n   y\ne=\\u0041\\tz\nf=\nlast=first\nlast=second\n"
    assert parse_properties(text) == {"a": "1", "b": "2", "c": "3", "d": "xy", "e": "A\tz", "f": "",
                                      "last": "second"}


def test_sdnotify_sends_to_abstract_and_path_sockets(tmp_path):
    """notify() delivers one datagram to an @abstract name or a path; without NOTIFY_SOCKET it is a
    no-op returning False; a dead socket is a logged False, not an exception."""
    name = f"mq-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind("\0" + name)
        assert sdnotify.notify("READY=1", env={"NOTIFY_SOCKET": "@" + name})
        assert s.recv(100) == b"READY=1"
    path = str(tmp_path / "n.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind(path)
        assert sdnotify.notify("STOPPING=1", env={"NOTIFY_SOCKET": path})
        assert s.recv(100) == b"STOPPING=1"
    assert sdnotify.notify("READY=1", env={}) is False
    assert sdnotify.notify("READY=1", env={"NOTIFY_SOCKET": path}) is False   # nobody listens now
    assert sdnotify.watchdog_interval_s(env={"WATCHDOG_USEC": "2000000"}) == 1.0
    assert sdnotify.watchdog_interval_s(env={"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "1"}) is None


def test_console_script_serves_spec_vector_and_stops_on_sigterm(tmp_path):
    """The installed `mqnamesrv` on a free port (listenPort=0) sends READY=1 with its address over
    $NOTIFY_SOCKET; the spec's 105 JSON frame sent as raw bytes gets a well-formed JSON response
    (17 before any broker, the route after one registers); SIGTERM sends STOPPING=1 and exits 0
    within a few seconds; the log on stderr carries the pid."""
    conf = tmp_path / "namesrv.properties"
    conf.write_text(f"listenAddress=127.0.0.1\nlistenPort=0\nkvConfigPath={tmp_path / 'kv.json'}\n")
    name = f"mq-test-{uuid.uuid4().hex}"
    notify_sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify_sock.bind("\0" + name)
    notify_sock.settimeout(10)
    proc = subprocess.Popen([MQNAMESRV, "-c", str(conf)], env={**os.environ, "NOTIFY_SOCKET": "@" + name},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ready = notify_sock.recv(4096).decode()
        fields = dict(line.split("=", 1) for line in ready.splitlines())
        assert fields["READY"] == "1" and fields["MAINPID"] == str(proc.pid)
        addr = fields["STATUS"].rsplit(" ", 1)[1]
        assert addr.startswith("127.0.0.1:") and int(addr.split(":")[1]) > 0

        async def exchange():
            host, port = addr.split(":")
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(ROUTE_VECTOR)
            prefix = await reader.readexactly(4)
            raw = prefix + await reader.readexactly(struct.unpack(">I", prefix)[0])
            writer.close()
            return raw

        async def main():
            first = decode_frame(await exchange())
            broker = RemotingClient()
            r = await broker.invoke(addr, register_cmd(broker, topics={"TopicTest": (4, 4, 6)}), 3)
            assert r.code == ResponseCode.SUCCESS
            second_raw = await exchange()
            await broker.close()
            return first, second_raw

        first, second_raw = run(main())
        assert first.serialize_type == 0 and (first.opaque, first.flag) == (0, 1)
        assert first.code == ResponseCode.TOPIC_NOT_EXIST and "TopicTest" in first.remark
        assert second_raw[4] == 0                       # JSON, as the C++ client requires
        header_len = struct.unpack(">I", second_raw[4:8])[0] & 0xFFFFFF
        header = json.loads(second_raw[8:8 + header_len])
        assert header["code"] == 0 and header["opaque"] == 0 and header["flag"] == 1
        route = json.loads(second_raw[8 + header_len:])
        assert route["brokerDatas"][0]["brokerAddrs"] == {"0": "127.0.0.1:10911"}
        assert route["queueDatas"][0]["writeQueueNums"] == 4

        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert notify_sock.recv(4096) == b"STOPPING=1"
        out, err = proc.communicate(timeout=5)
        assert proc.returncode == 0, err
        assert time.monotonic() - t0 < 5
        assert "The Name Server boot success" in out
        assert f"mqnamesrv[{proc.pid}]" in err and "SIGTERM received" in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        notify_sock.close()
