"""The official C++ client's PushConsumer (rocketmq==0.4.4, librocketmq.so, unmodified) in a
process of its own, driven by a test over a pipe.

Why: librocketmq.so can abort the process in PushConsumer.shutdown while its own timer thread
still updates a route (rocketmq-client-cpp #335, #286; seen once in ~16 CI runs).  In the test
process that abort took a pytest worker with every fixture of its module.  Here it takes this
child only: the test sees what was consumed, and `ChildPushConsumer.shutdown` tells an abort in
shutdown (the client's known fault: a warning) from a death before it (a failure).

The protocol, one JSON object per line.  Child -> test: {"started": true} once started, then per
delivered message {"n": k, "msg": {...}} and it waits for the answer; test -> child: {"n": k,
"ok": bool} (false: the listener raised, the client is told RECONSUME_LATER, as
tests/compat/test_cpp_client._subscribe does in process), or {"stop": true}: shut down, exit 0.
Message bodies, keys and tags travel as latin-1 strings (bytes preserved)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import warnings

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHUTDOWN_TIMEOUT_S = 60.0
ABORT_AFTER_SHUTDOWN_ENV = "MQ_TEST_CPP_ABORT_AFTER_SHUTDOWN"    # this runner's own tests
FIELDS = ("topic", "id", "delay_time_level", "queue_id", "reconsume_times", "store_size", "born_timestamp",
          "store_timestamp", "queue_offset", "commit_log_offset", "prepared_transaction_offset")
BYTE_FIELDS = ("body", "keys", "tags")


class CppMessage:
    """What the test's listener gets: rocketmq.client.RecvMessage's attributes, copied in the child.
    get_property answers only the names the consumer was started with (`properties`)."""

    def __init__(self, d: dict):
        for name in FIELDS:
            setattr(self, name, d[name])
        for name in BYTE_FIELDS:
            setattr(self, name, d[name].encode("latin-1"))
        self._props = {k: v.encode("latin-1") for k, v in d["props"].items()}

    def get_property(self, name: str) -> bytes:
        if name not in self._props:
            raise KeyError(f"property {name!r} was not asked of the child (push_consumer(..., properties=))")
        return self._props[name]

    def __repr__(self):
        return f"<CppMessage topic={self.topic!r} id={self.id!r} body={self.body[:40]!r}>"


class ChildPushConsumer:
    """A started C++ PushConsumer in a child process; `listener(CppMessage)` runs in this process
    (a reader thread), one message at a time, and raising means RECONSUME_LATER."""

    def __init__(self, ns_addr: str, group: str, topic: str, listener, expression: str = "*",
                 instance: str | None = None, properties: tuple[str, ...] = ("seq",),
                 credentials: tuple[str, str, str] | None = None, threads: int | None = None,
                 start_timeout_s: float = 30.0):
        spec = {"ns": ns_addr, "group": group, "topic": topic, "expression": expression, "instance": instance,
                "properties": list(properties), "credentials": credentials, "threads": threads}
        env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.compat.cpp_push", json.dumps(spec)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True, bufsize=1)
        self.listener = listener
        self.errors: list[str] = []
        self._write_lock = threading.Lock()
        self._started = threading.Event()
        self._reader = threading.Thread(target=self._read, name=f"cpp-push-{group}", daemon=True)
        self._reader.start()
        if not self._started.wait(start_timeout_s):
            self._kill()
            raise RuntimeError(f"the C++ push consumer of {group} did not start in {start_timeout_s} s "
                               f"(exit status {self.proc.poll()})")

    def _send(self, obj: dict) -> None:
        with self._write_lock:
            try:
                self.proc.stdin.write(json.dumps(obj) + "\n")
                self.proc.stdin.flush()
            except (BrokenPipeError, ValueError):
                pass                        # the child is gone; shutdown reports how

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                d = json.loads(line)
            except ValueError:
                self.errors.append(f"not a protocol line: {line[:200]!r}")
                continue
            if d.get("started"):
                self._started.set()
                continue
            try:
                self.listener(CppMessage(d["msg"]))
                ok = True
            except Exception:
                ok = False
            self._send({"n": d["n"], "ok": ok})

    def _kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def shutdown(self) -> None:
        """Shuts the client down and waits for its process.  An abort during the shutdown is
        librocketmq.so's known fault (a warning); a death before it, or a shutdown that does not
        end, fails the test."""
        died_before = self.proc.poll()
        self._send({"stop": True})
        try:
            rc = self.proc.wait(SHUTDOWN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self._kill()
            raise AssertionError(f"the C++ push consumer did not shut down in {SHUTDOWN_TIMEOUT_S} s (killed)")
        finally:
            self._reader.join(5)
            try:
                self.proc.stdin.close()
            except OSError:
                pass                        # a child that is gone: its pipe is broken
        assert not self.errors, self.errors
        if died_before is not None:
            raise AssertionError(f"the C++ push consumer's process died before its shutdown (exit status "
                                 f"{died_before})")
        if rc == -signal.SIGABRT:
            warnings.warn("librocketmq.so aborted in PushConsumer.shutdown (rocketmq-client-cpp #335); "
                          "its process was a child of the test's, what it consumed before is checked")
        elif rc != 0:
            raise AssertionError(f"the C++ push consumer's process ended with exit status {rc} in its shutdown")


def _child(spec: dict) -> int:
    # the protocol gets the stdout pipe to itself: what the library or Python prints goes to stderr
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    from rocketmq.client import PushConsumer, RecvMessage, _to_bytes, dll, ffi_check
    from rocketmq.ffi import _CConsumeStatus

    out_lock = threading.Lock()
    waiting: dict[int, list] = {}                  # n -> [Event, ok]
    counter = iter(range(1 << 62))
    stopping = threading.Event()

    def emit(obj: dict) -> None:
        with out_lock:
            proto.write(json.dumps(obj) + "\n")
            proto.flush()

    def on_message(_consumer, handle):
        m = RecvMessage(handle)
        d = {name: getattr(m, name) for name in FIELDS}
        d.update({name: (getattr(m, name) or b"").decode("latin-1") for name in BYTE_FIELDS})
        d["props"] = {p: (m.get_property(p) or b"").decode("latin-1") for p in spec["properties"]}
        slot = [threading.Event(), False]
        with out_lock:
            if stopping.is_set():                  # shutting down: not consumed
                return _CConsumeStatus.RECONSUME_LATER.value
            n = next(counter)
            waiting[n] = slot
            proto.write(json.dumps({"n": n, "msg": d}) + "\n")
            proto.flush()
        slot[0].wait()
        return (_CConsumeStatus.CONSUME_SUCCESS if slot[1] else _CConsumeStatus.RECONSUME_LATER).value

    c = PushConsumer(spec["group"])
    c.set_namesrv_addr(spec["ns"])
    if spec["instance"]:
        c.set_instance_name(spec["instance"])
    if spec["credentials"]:
        c.set_session_credentials(*spec["credentials"])
    if spec["threads"]:
        c.set_thread_count(spec["threads"])
    # PushConsumer.subscribe of the 0.4.4 binding re-raises a listener's exception inside
    # `finally`, handing the library an undefined status: register through the same calls
    ffi_check(dll.Subscribe(c._handle, _to_bytes(spec["topic"]), _to_bytes(spec["expression"])))
    c._register_callback(on_message)
    c.start()
    emit({"started": True})
    for line in sys.stdin:
        d = json.loads(line)
        if d.get("stop"):
            break
        slot = waiting.pop(d["n"])
        slot[1] = d["ok"]
        slot[0].set()
    with out_lock:
        stopping.set()
        for slot in waiting.values():              # end any delivery still waiting: not consumed
            slot[0].set()
    c.shutdown()
    if os.environ.get(ABORT_AFTER_SHUTDOWN_ENV):
        os.abort()                                 # tests of this runner: as librocketmq.so can
    return 0


if __name__ == "__main__":
    sys.exit(_child(json.loads(sys.argv[1])))
