"""mq.logs.Episode: a failure that repeats while its cause lasts is logged once when it starts and
once when it ends (a full disk made the DLedger and HA status writers log every second)."""
import logging

from mq.logs import Episode


def test_an_episode_logs_its_start_and_its_end_once(caplog):
    ep = Episode(logging.getLogger("test.episode"), "writing the thing")
    with caplog.at_level(logging.WARNING, logger="test.episode"):
        ep.ok()
        for _ in range(5):
            ep.failed(OSError(28, "No space left on device"))
        ep.ok()
        ep.ok()
        ep.failed(OSError(5, "EIO"))
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["writing the thing failed: [Errno 28] No space left on device (logged once until it works again)",
                     "writing the thing works again (after 5 failure(s))",
                     "writing the thing failed: [Errno 5] EIO (logged once until it works again)"]
