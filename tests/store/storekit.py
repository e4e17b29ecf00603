"""What the store tests share: a crash as kill -9 leaves the store; one byte of a file damaged."""
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


def flip_byte(path: str, pos: int, mask: int) -> bool:
    """XORs byte `pos` of the file with mask (through the page cache: a store that maps the file
    sees it at once); False, nothing changed, when the file ends before pos."""
    with open(path, "r+b") as f:
        f.seek(pos)
        b = f.read(1)
        if not b:
            return False
        f.seek(pos)
        f.write(bytes([b[0] ^ mask]))
    return True
