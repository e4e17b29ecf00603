"""A leader's replication state kept in C memory, so that its steady state runs in C.

The Raft core (mq.dledger.core) keeps a Progress per follower.  A leader's role gives its core
CProgress objects instead: the same fields, stored in one mq_dl_peer each of an
mq.store.commitlog.LeadState (csrc/dledger.h, mq_dl_lead).  mq_dledger_lead_take (a follower's
SUCCESS answers to our pushes, one call per read on the link) and mq_dledger_lead_progress (our
log grew) read and write the same memory, so there is one copy of the state and nothing to
hand back and forth: the core and C take turns on the role's one thread.  C does only what the
core would do in the steady state of a ready leader (REPLICATE, no transfer); every other case
is left to the core, which finds the state as C left it."""
from __future__ import annotations

from .core import Progress
from .net import follow_template


def _number(name: str) -> property:
    return property(lambda self: getattr(self._p, name), lambda self, v: setattr(self._p, name, v))


def _flag(name: str) -> property:
    return property(lambda self: bool(getattr(self._p, name)), lambda self, v: setattr(self._p, name, int(v)))


class CProgress:
    """mq.dledger.core.Progress over an mq_dl_peer (cdata).  inflight reads as a new list and is
    written whole (the core replaces it, never changes it in place)."""

    __slots__ = ("_p",)

    def __init__(self, peer, next_index: int):
        p = self._p = peer
        p.match, p.next, p.sent_commit, p.inflight_since = -1, next_index, -1, 0
        p.n_inflight = p.replicate = p.probe_sent = p.recent_active = 0
        p.want = p.blocked = p.err = 0

    match = _number("match")
    next = _number("next")
    inflight_since = _number("inflight_since")
    sent_commit = _number("sent_commit")
    probe_sent = _flag("probe_sent")
    recent_active = _flag("recent_active")

    @property
    def state(self) -> str:
        return Progress.REPLICATE if self._p.replicate else Progress.PROBE

    @state.setter
    def state(self, v: str) -> None:
        assert v in (Progress.PROBE, Progress.REPLICATE), v
        self._p.replicate = int(v == Progress.REPLICATE)

    @property
    def inflight(self) -> list[int]:
        return list(self._p.inflight[0:self._p.n_inflight])

    @inflight.setter
    def inflight(self, v: list[int]) -> None:
        n = len(v)
        assert n <= len(self._p.inflight), n          # the core's window is at most max_inflight
        self._p.inflight[0:n] = v
        self._p.n_inflight = n

    def __repr__(self) -> str:
        return f"CProgress(match={self.match}, next={self.next}, {self.state}, inflight={len(self.inflight)})"


def lead_templates(group: str, me: str, followers: list[str],
                   term: int) -> tuple[list[list[bytes]], list[bytes]] | None:
    """The header texts C writes and reads as leader of `term`: each follower's PUSH header
    (around its eight values) and a SUCCESS answer (around the index and the opaque) -- cut by
    follow_template out of the role's own headers, as the follower cuts the same ones.  None
    when a name holds text a marker could be taken for (the core then does all of it)."""
    reqs = []
    resp = None
    for f in followers:
        cut = follow_template(group, me, f, term)
        if cut is None:
            return None
        reqs.append(cut[0])
        resp = cut[1]
    return (reqs, resp) if resp is not None else None
