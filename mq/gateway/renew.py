"""Auto-renew for push consumers: a ReceiveMessage with auto_renew gets DEFAULT_INVISIBLE_MS of
invisible time, and the gateway keeps extending it while the client holds the message, as
RocketMQ 5's proxy does (its ReceiptHandleProcessor): RENEW_AHEAD_MS before a handle expires it is
changed to RENEW_SLICE_MS more.  The client keeps the handle it received; an ack or a change from
it is made with the latest one (swap), which also ends the renewing.  Renewing ends too when the
client says goodbye (NotifyClientTermination) or its Telemetry stream closes, and after
RENEW_MAX_MS of holding (the message then becomes visible again, for another consumer).

Limits, named: HELD_MAX handles renewed at once (past it, new ones are not renewed and become
visible again after DEFAULT_INVISIBLE_MS); the loop runs every RENEW_INTERVAL_S."""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from .background import Background
from .convert import Refused
from .pop import Handle

log = logging.getLogger("mq.gateway.renew")

DEFAULT_INVISIBLE_MS = 60_000
RENEW_AHEAD_MS = 10_000
RENEW_SLICE_MS = 60_000
RENEW_MAX_MS = 3 * 3600 * 1000
RENEW_INTERVAL_S = 1.0
HELD_MAX = 100_000


@dataclass
class _Held:
    client: str
    group: str
    topic: str
    handle: str                  # the latest
    since_ms: int


class Renewer(Background):
    def __init__(self, pop):
        self.pop = pop
        self._held: dict[tuple[str, str], _Held] = {}       # (group, original handle) -> held message
        self.renewed = 0

    def hold(self, client: str, group: str, topic: str, handle: str) -> None:
        if len(self._held) < HELD_MAX:
            self._held[(group, handle)] = _Held(client, group, topic, handle, int(time.time() * 1000))

    def latest(self, group: str, handle: str, release: bool = True) -> str:
        """The handle to use for a client's ack or change of `handle` (release: stop renewing)."""
        held = self._held.pop((group, handle), None) if release else self._held.get((group, handle))
        return held.handle if held is not None else handle

    def forget_client(self, client: str) -> None:
        for key in [k for k, h in self._held.items() if h.client == client]:
            del self._held[key]

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(RENEW_INTERVAL_S)
            try:
                await self.renew_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("renewing receipt handles failed; next round")

    async def renew_once(self) -> None:
        now_ms = int(time.time() * 1000)
        for key, held in list(self._held.items()):
            if now_ms - held.since_ms >= RENEW_MAX_MS:
                del self._held[key]
                continue
            try:
                h = Handle.parse(held.handle)
            except Refused:
                del self._held[key]
                continue
            if h.deadline_ms - now_ms > RENEW_AHEAD_MS:
                continue
            try:
                held.handle = await self.pop.change_invisible(held.group, held.topic, held.handle, RENEW_SLICE_MS)
                self.renewed += 1
            except Refused as e:                 # expired already, or the broker refused: it goes visible
                log.info("receipt handle of %s not renewed: %s", held.group, e.text)
                self._held.pop(key, None)
