"""Helpers of the DLedger tests: a group of real mqbroker processes in DLedger mode on loopback
(optionally with a fault-injecting proxy on every directed peer link), their status, signals,
and byte comparisons of their logs."""
from __future__ import annotations

import asyncio
import os
import signal
import time

from mq.chaos.proxy import FaultProxy
from mq.cluster import Broker, free_port, wait_for
from mq.dledger.role import read_status
from mq.remoting import RemotingClient
from mq.store.commitlog import list_files

INDEX_FILE_SIZE = 1024 * 1024          # 32768 entries per index file: tests roll them


class DLedgerGroup:
    """`n` brokers of one DLedger group (ids n0..), name server `namesrv`.  proxied: member A
    reaches member B through proxies[(A, B)], so a test can cut any link in any direction."""

    def __init__(self, workdir: str, namesrv: str, n: int = 3, name: str = "RaftNode00", proxied: bool = False,
                 ids: list[str] | None = None, **options):
        self.workdir = workdir
        self.namesrv = namesrv
        self.name = name
        self.ids = ids or [f"n{i}" for i in range(n)]
        self.peer_port = {i: free_port() for i in self.ids}
        self.proxies: dict[tuple[str, str], FaultProxy] = {}
        if proxied:
            for a in self.ids:
                for b in self.ids:
                    if a != b:
                        self.proxies[(a, b)] = FaultProxy("127.0.0.1", self.peer_port[b])
        self.options = {"brokerClusterName": "RaftCluster", "enableDLegerCommitLog": "true",
                        "dLegerGroup": name, "mappedFileSizeForEntryIndex": INDEX_FILE_SIZE,
                        "sendMessageThreadPoolNums": 1, **options}
        self.brokers: dict[str, Broker] = {}
        try:
            for i in self.ids:
                self.brokers[i] = Broker(workdir, namesrv, name=name, dLegerSelfId=i, dLegerPeers=self._peers(i),
                                         storePathRootDir=os.path.join(workdir, f"{name}-{i}"), **self.options)
        except BaseException:
            self.close()
            raise

    def _peers(self, me: str) -> str:
        parts = []
        for i in self.ids:
            port = self.peer_port[i] if i == me or (me, i) not in self.proxies else self.proxies[(me, i)].port
            parts.append(f"{i}-127.0.0.1:{port}")
        return ";".join(parts)

    # ---- state ------------------------------------------------------------------------------------
    def status(self, i: str) -> dict:
        return read_status(self.brokers[i].dir) or {}

    def leader(self, among=None) -> str | None:
        """The member that leads and serves writes, if exactly one does."""
        found = [i for i in (among or self.ids) if self.alive(i)
                 and self.status(i).get("role") == "LEADER" and self.status(i).get("ready")]
        return found[0] if len(found) == 1 else None

    def wait_leader(self, timeout_s: float = 30.0, among=None) -> str:
        return wait_for(lambda: self.leader(among), timeout_s, 0.02, "a ready DLedger leader")

    def alive(self, i: str) -> bool:
        b = self.brokers.get(i)
        return b is not None and b.proc is not None and b.proc.p.poll() is None

    def addr(self, i: str) -> str:
        return self.brokers[i].addr

    # ---- faults -----------------------------------------------------------------------------------
    def kill(self, i: str) -> None:
        self.brokers[i].kill()

    def restart(self, i: str) -> None:
        b = self.brokers[i]
        if self.alive(i):
            b.stop()
        b.start()

    def freeze(self, i: str) -> None:
        """SIGSTOP the whole broker (supervisor, launcher and every role)."""
        os.killpg(self.brokers[i].proc.p.pid, signal.SIGSTOP)

    def thaw(self, i: str) -> None:
        os.killpg(self.brokers[i].proc.p.pid, signal.SIGCONT)

    def isolate(self, i: str, how: str = "blackhole") -> None:
        """Every link to and from member i stops carrying data (or is cut)."""
        assert self.proxies, "the group was not started with proxied=True"
        for (a, b), p in self.proxies.items():
            if i in (a, b):
                getattr(p, how)()

    def heal(self) -> None:
        for p in self.proxies.values():
            p.heal()

    # ---- the logs ---------------------------------------------------------------------------------
    def data_bytes(self, i: str, end: int) -> bytes:
        """Member i's data-file bytes [first retained file, end)."""
        d = os.path.join(self.brokers[i].dir, f"dledger-{i}", "data")
        files = list_files(d)
        fs = int(self.options.get("mappedFileSizeCommitLog", 16 * 1024 * 1024))
        out = bytearray()
        pos = files[0] if files else 0
        while pos < end:
            with open(os.path.join(d, "%020d" % (pos - pos % fs)), "rb") as f:
                f.seek(pos % fs)
                chunk = f.read(min(end, pos - pos % fs + fs) - pos)
            out += chunk
            pos += len(chunk)
        return bytes(out)

    def committed_pos(self, i: str) -> int:
        return int(self.status(i).get("committedPos", 0))

    # ---- teardown ---------------------------------------------------------------------------------
    def close(self) -> None:
        for i, b in self.brokers.items():
            if self.alive(i):
                try:
                    self.thaw(i)
                except ProcessLookupError:
                    pass
                b.stop()
        for p in self.proxies.values():
            p.close()


def call(addr: str, code: int, ext: dict | None = None, body: bytes = b"", timeout_s: float = 5.0):
    """One remoting request, answered (or raises)."""
    async def go():
        c = RemotingClient()
        try:
            return await c.invoke(addr, c.request(code, ext, body), timeout_s)
        finally:
            await c.close()
    return asyncio.run(go())


def elapsed_since(t0: float) -> float:
    return time.monotonic() - t0
