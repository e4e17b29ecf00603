"""The official C++ client's Producer (rocketmq==0.4.4, librocketmq.so, unmodified), with one
fault of the client told apart from everything a broker can answer.

The fault (rocketmq-client-cpp #455, open): librocketmq.so looks up its connection to a broker
under a std::timed_mutex, and `try_lock_for(3 s)` in this build gives up at once when another
of its own threads holds the lock (its route task 10 ms after start and every 30 s, its
heartbeat).  Every attempt of the send then ends in the client before a byte is written, and
send_sync raises "No route info of this topic", the client's message for any failure.  Seen
once (2026-11-28): three sends stored, the fourth's three attempts failed within 2 ms, each
after "GetTransport of:127.0.0.1:<port> get timed_mutex timeout" in the client's log.

`Producer.send_sync` sends again only when the client's own log (written synchronously: a
synchronous sink with auto-flush) shows that every attempt of the failed call stopped at that
lock, so the broker never saw the request: an answer of the broker is never retried away and
nothing is stored twice.  Each such resend is a warning."""
from __future__ import annotations

import glob
import os
import warnings

from rocketmq.client import Producer as _CppProducer
from rocketmq.exceptions import ProducerSendSyncFailed

# where librocketmq.so logs: $HOME/logs/rocketmq-cpp/<pid>_rocketmq-cpp.log.<N>
LOG_DIR = os.path.join(os.path.expanduser("~"), "logs", "rocketmq-cpp")
LOCK_FAILED = "get timed_mutex timeout"
ATTEMPT_FAILED = "send failed of times:"
MAX_SENDS = 3


def _log_file() -> str | None:
    """This process's current client log (the newest of its rotated files), if any."""
    files = glob.glob(os.path.join(LOG_DIR, f"{os.getpid()}_rocketmq-cpp.log.*"))
    return max(files, key=os.path.getmtime) if files else None


def _size(path: str | None) -> int:
    try:
        return os.path.getsize(path) if path else 0
    except FileNotFoundError:
        return 0


def never_sent(log_text: str) -> bool:
    """Did every attempt logged in log_text stop at the connection lock?  True only if there
    was at least one attempt and each "send failed of times:N" line directly follows the
    lookup's "GetTransport of:<addr> get timed_mutex timeout" line."""
    lines = log_text.splitlines()
    attempts = [i for i, line in enumerate(lines) if ATTEMPT_FAILED in line]
    return bool(attempts) and all(i > 0 and "GetTransport of:" in lines[i - 1] and LOCK_FAILED in lines[i - 1]
                                  for i in attempts)


class Producer(_CppProducer):
    def send_sync(self, msg):
        for sends in range(1, MAX_SENDS + 1):
            path = _log_file()
            start = _size(path)
            try:
                return super().send_sync(msg)
            except ProducerSendSyncFailed:
                now = _log_file()
                written = ""
                if now is not None:                 # no log: nothing says it was never sent
                    with open(now, errors="replace") as f:
                        if now == path:
                            f.seek(start)
                        written = f.read()
                if sends == MAX_SENDS or not never_sent(written):
                    raise
                warnings.warn("librocketmq.so failed a send at its own connection lock without sending it "
                              "(rocketmq-client-cpp #455): sent again")
        raise AssertionError("unreachable")
