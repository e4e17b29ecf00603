"""DLedger's small files in dledger-<selfId>/ (layouts in mq.wire.dledger):

    currterm      currTerm, voteLeader: the Raft role's hard state
    checkpoint    endIndex, committedIndex: a hint for recovery (what is committed is also known
                  from the ConsumeQueues and, at last, from the leader)

Both are replaced atomically (temp file, fsync, rename, directory fsync): currterm is durable
before the Raft role sends anything that depends on it."""
from __future__ import annotations

import os

from mq.store.configfile import write_atomic
from mq.wire import dledger as W

CURRTERM = "currterm"
CHECKPOINT = "checkpoint"


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        return ""


def load_hard_state(dledger_dir: str) -> tuple[int, str | None]:
    """(currTerm, voteLeader or None); (0, None) when the file is absent."""
    return W.parse_currterm(_read(os.path.join(dledger_dir, CURRTERM)))


def save_hard_state(dledger_dir: str, term: int, vote: str | None) -> None:
    write_atomic(os.path.join(dledger_dir, CURRTERM), W.build_currterm(term, vote))


def load_checkpoint(dledger_dir: str) -> tuple[int, int]:
    """(endIndex, committedIndex); (-1, -1) when the file is absent."""
    return W.parse_checkpoint(_read(os.path.join(dledger_dir, CHECKPOINT)))


def save_checkpoint(dledger_dir: str, end_index: int, committed_index: int) -> None:
    """Replaced atomically (rename) but not fsynced: it is a hint, written every few seconds by
    the Raft role's event loop, which must not stall on a disk flush."""
    path = os.path.join(dledger_dir, CHECKPOINT)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(W.build_checkpoint(end_index, committed_index))
    os.replace(tmp, path)
