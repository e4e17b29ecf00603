"""What the store tests share: a crash as kill -9 leaves the store."""
from __future__ import annotations

import os

from mq.store import MessageStore


def crash(store: MessageStore) -> None:
    """Leaves the store as a kill -9 would: its role threads stopped, every handle dropped, no
    clean shutdown, the abort file kept (the page cache keeps what was written, as it does after
    a process dies)."""
    store._stop.set()
    for t in store._threads:
        t.join()
    store.cqs.close()
    store.cl.close()
    store.checkpoint.close()
    store.ctl.close()
    os.close(store._lock_fd)
    store._lock_fd = None
