"""Blocking wrappers: the asyncio clients driven from ordinary threads.

Each wrapper owns one event loop running in a daemon thread; every coroutine method of the wrapped
client becomes a blocking call (run on that loop, result or exception handed back).  Push-consumer
listeners written as plain functions run on the consumer's thread pool, as they do in the async API.

    p = SyncProducer("PG", "127.0.0.1:9876").start()
    p.send(Message("T", b"hi", tags="TagA"))
    f = p.send_async(msg, callback)        # concurrent.futures.Future
    p.shutdown()
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Callable

from mq import loop as mq_loop
from .admin import AdminClient
from .consumer import PullConsumer, PushConsumer
from .message import Message, SendResult
from .producer import Producer


class _LoopThread:
    def __init__(self, name: str):
        self.loop = mq_loop.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()

    def run(self, coro, timeout_s: float | None = None):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def stop(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
        if not self.loop.is_running():
            self.loop.close()


class _Blocking:
    """Forwards attribute access to the wrapped async client; coroutine methods block until done."""

    def __init__(self, target, name: str):
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_lt", _LoopThread(name))

    def __getattr__(self, name):
        attr = getattr(self._target, name)
        if not callable(attr) or not asyncio.iscoroutinefunction(attr):
            return attr

        def call(*args, **kwargs):
            return self._lt.run(attr(*args, **kwargs))
        return call

    def __setattr__(self, name, value):
        setattr(self._target, name, value)

    def start(self):
        self._lt.run(self._target.start())
        return self

    def _close(self, coro) -> None:
        try:
            self._lt.run(coro)
        finally:
            self._lt.stop()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.shutdown()


class SyncProducer(_Blocking):
    def __init__(self, group: str, namesrv_addr: str, **options):
        super().__init__(Producer(group, namesrv_addr, **options), f"producer-{group}")

    def send_async(self, msg: Message, callback: Callable[[SendResult | None, BaseException | None], None] | None = None
                   ) -> concurrent.futures.Future:
        """Returns at once; the future resolves to the SendResult; `callback(result, error)` runs on the
        client's loop thread when the send completes."""
        async def go():
            return await self._target.send_async(msg, callback)
        return asyncio.run_coroutine_threadsafe(go(), self._lt.loop)

    def shutdown(self) -> None:
        self._close(self._target.shutdown())


class SyncPushConsumer(_Blocking):
    def __init__(self, group: str, namesrv_addr: str, *args, **options):
        super().__init__(PushConsumer(group, namesrv_addr, *args, **options), f"consumer-{group}")

    def subscribe(self, topic: str, expression: str = "*") -> None:
        if self._target.instance is not None:      # started: the subscription change runs on the loop
            self._lt.loop.call_soon_threadsafe(self._target.subscribe, topic, expression)
        else:
            self._target.subscribe(topic, expression)

    def shutdown(self) -> None:
        self._close(self._target.shutdown())


class SyncPullConsumer(_Blocking):
    def __init__(self, group: str, namesrv_addr: str, **options):
        super().__init__(PullConsumer(group, namesrv_addr, **options), f"pull-consumer-{group}")

    def shutdown(self) -> None:
        self._close(self._target.shutdown())


class SyncAdminClient(_Blocking):
    def __init__(self, namesrv_addr: str, **options):
        super().__init__(AdminClient(namesrv_addr, **options), "admin")

    def start(self):
        return self

    def close(self) -> None:
        self._close(self._target.close())

    shutdown = close


__all__ = ["SyncProducer", "SyncPushConsumer", "SyncPullConsumer", "SyncAdminClient"]
