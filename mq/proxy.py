"""A fault-injecting TCP proxy for tests and chaos runs: put it between two nodes (an HA slave
and its master, two DLedger peers) and break the link on command.

    FaultProxy(target_host, target_port, listen_port=0)   starts accepting on 127.0.0.1
        .heal()            forward everything (the default)
        .blackhole()       keep connections open but forward nothing, either way (a partition
                           the peers only notice by silence); new connections are accepted and
                           starved too
        .cut()             close every connection and refuse new ones (a partition with RSTs)
        .delay(ms)         forward each chunk after ms milliseconds
        .drop(p)           drop each chunk with probability p (corrupts the stream: the peers
                           must detect it and reconnect)
        .stats             bytes forwarded and dropped per direction
        .close()

It runs its own event loop in a daemon thread, so a synchronous test drives it directly; all
sockets are on loopback.  Modes apply to data already in flight at the moment they change."""
from __future__ import annotations

import asyncio
import random
import threading

CHUNK = 65536


class FaultProxy:
    def __init__(self, target_host: str, target_port: int, listen_port: int = 0, seed: int = 0):
        self.target = (target_host, target_port)
        self.mode = "pass"
        self.delay_s = 0.0
        self.drop_p = 0.0
        self.rng = random.Random(seed)
        self.stats = {"up": 0, "down": 0, "dropped": 0, "connections": 0}
        self._pairs: set = set()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._listen_port = listen_port
        self._thread = threading.Thread(target=self._run, name=f"fault-proxy-{target_port}", daemon=True)
        self._thread.start()
        self._ready.wait(10)
        if self.port is None:
            raise RuntimeError(f"fault proxy could not listen: {self._error}")

    port: int | None = None
    _error: str = ""

    # ---- control (any thread) ---------------------------------------------------------------------
    def heal(self) -> None:
        self._set("pass")

    def blackhole(self) -> None:
        self._set("blackhole")

    def cut(self) -> None:
        self._set("cut")
        self._loop.call_soon_threadsafe(self._close_all)

    def delay(self, ms: float) -> None:
        self.delay_s = ms / 1000
        self._set("delay")

    def drop(self, p: float) -> None:
        self.drop_p = p
        self._set("drop")

    def _set(self, mode: str) -> None:
        self.mode = mode

    def close(self) -> None:
        if self._loop.is_closed():
            return
        self._loop.call_soon_threadsafe(self._shutdown)
        self._thread.join(10)

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    # ---- the loop ---------------------------------------------------------------------------------
    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._server = self._loop.run_until_complete(
                asyncio.start_server(self._accept, "127.0.0.1", self._listen_port))
            self.port = self._server.sockets[0].getsockname()[1]
        except OSError as e:
            self._error = str(e)
            self._ready.set()
            return
        self._ready.set()
        self._loop.run_forever()
        self._loop.close()

    def _shutdown(self) -> None:
        self._server.close()
        self._close_all()
        self._loop.stop()

    def _close_all(self) -> None:
        for w in list(self._pairs):
            w.close()
        self._pairs.clear()

    async def _accept(self, reader, writer) -> None:
        if self.mode == "cut":
            writer.close()
            return
        try:
            up_r, up_w = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self.stats["connections"] += 1
        self._pairs.update((writer, up_w))
        await asyncio.gather(self._pump(reader, up_w, "up"), self._pump(up_r, writer, "down"),
                             return_exceptions=True)
        for w in (writer, up_w):
            self._pairs.discard(w)
            w.close()

    async def _pump(self, reader, writer, direction: str) -> None:
        try:
            while True:
                data = await reader.read(CHUNK)
                if not data:
                    break
                mode = self.mode
                if mode == "cut":
                    break
                if mode == "blackhole" or (mode == "drop" and self.rng.random() < self.drop_p):
                    self.stats["dropped"] += len(data)
                    continue
                if mode == "delay":
                    await asyncio.sleep(self.delay_s)
                writer.write(data)
                await writer.drain()
                self.stats[direction] += len(data)
        finally:
            writer.close()
