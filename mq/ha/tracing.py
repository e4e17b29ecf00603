"""Replication lag samples for the broker's perf trace (perfTraceEnable; schema in mq.trace).

A master's HA role process samples once per second (its main loop in
mq.ha.role): for every connected slave that has acknowledged at least once,
one "lag" record
    broker, ts_us, slave (its HA connection's host:port),
    master_offset (POS_WRITE, the master's CommitLog end), ack_offset (the
    slave's highest valid ack), lag_bytes = master_offset - ack_offset
to <dir>/lag-<pid>.jsonl.  A slave that has not acked yet has no defined lag
and is skipped.  Kept apart from mq.ha.master so the replication code knows
nothing of tracing."""
from __future__ import annotations

import logging

from mq.store import control as C
from mq.trace import TraceWriter, now_us

log = logging.getLogger("mq.ha.tracing")


class LagSampler:
    def __init__(self, master, ctl: C.ControlBlock, directory: str, broker: str):
        """master: an HAMaster (its slaves() snapshot); ctl: the store's control block."""
        self.master = master
        self.ctl = ctl
        self.broker = broker
        self.writer = TraceWriter(directory, "lag")

    @classmethod
    def for_role(cls, role: str, node, ctl: C.ControlBlock, trace: dict | None) -> "LagSampler | None":
        """A sampler for a master's HA role with tracing on (trace: the supervisor's dict with
        "dir" and "broker"); None otherwise."""
        if role != "master" or not trace:
            return None
        return cls(node, ctl, trace["dir"], trace["broker"])

    def sample(self) -> int:
        """Writes one record per acknowledged slave; returns how many.  A write error is
        logged and ends the sampling (tracing never stops replication)."""
        if self.writer is None:
            return 0
        try:
            return self._sample()
        except OSError as e:
            log.error("perf trace: writing lag samples to %s failed (%s); no more samples", self.writer.path, e)
            self.writer = None
            return 0

    def _sample(self) -> int:
        ts_us = now_us()
        slaves = self.master.slaves()
        # read after the acks: an ack never passes what was sent, nothing is sent past POS_WRITE,
        # and POS_WRITE only grows on a master, so every ack here is <= master_offset
        master_offset = self.ctl.get(C.POS_WRITE)
        n = 0
        for s in slaves:
            ack = s.get("ackOffset")
            if ack is None or ack < 0:
                continue
            assert ack <= master_offset, (ack, master_offset)
            self.writer.write({"kind": "lag", "broker": self.broker, "ts_us": ts_us, "slave": s["addr"],
                               "master_offset": master_offset, "ack_offset": ack,
                               "lag_bytes": master_offset - ack})
            n += 1
        return n

    def close(self) -> None:
        if self.writer is not None:
            try:
                self.writer.close()
            except OSError as e:
                log.error("perf trace: closing %s failed: %s", self.writer.path, e)
