"""KVConfigManager: the name server's only persisted state (spec 9), a table
namespace -> {key -> value} (e.g. ORDER_TOPIC_CONFIG), in the file Java
writes:

    {"configTable":{"<namespace>":{"<key>":"<value>",..},..}}        (kvConfigPath, pretty JSON)

Every change is written at once with mq.files.write_atomic (tmp,
fsync, .bak, rename); loading falls back to the .bak.  A failed write keeps
the change in memory (as Java does) but is reported to the caller, who
answers SYSTEM_ERROR rather than claim it persisted.  The write runs in a
thread (persist awaits it): an fsync on a busy disk can take seconds, and
the name server's loop answers every route query meanwhile; writes go one
at a time, in the order of the changes."""
from __future__ import annotations

import asyncio
import json
import logging

from mq.files import read_config, write_atomic

log = logging.getLogger("mq.namesrv.kvconfig")


class KVConfigManager:
    def __init__(self, path: str):
        self.path = path
        self.table: dict[str, dict[str, str]] = {}
        self.persist_errors = 0
        self._writing = asyncio.Lock()     # one write at a time, in call order (the lock is FIFO)

    def load(self) -> None:
        """Reads the file (or its .bak); a missing file is an empty table."""
        data = read_config(self.path)
        table = data.get("configTable") if isinstance(data, dict) else None
        self.table = {}
        if isinstance(table, dict):
            for ns, kv in table.items():
                if isinstance(kv, dict):
                    self.table[str(ns)] = {str(k): str(v) for k, v in kv.items() if v is not None}
        log.info("kv config: %d namespaces loaded from %s", len(self.table), self.path)

    async def put(self, namespace: str, key: str, value: str) -> None:
        """Raises OSError if the change could not be persisted (it stays in memory)."""
        old = self.table.setdefault(namespace, {}).get(key)
        self.table[namespace][key] = value
        log.info("kv config put %s/%s: %r -> %r", namespace, key, old, value)
        await self.persist()

    def get(self, namespace: str, key: str) -> str | None:
        return self.table.get(namespace, {}).get(key)

    async def delete(self, namespace: str, key: str) -> None:
        """Raises OSError like put."""
        kv = self.table.get(namespace)
        if kv is not None and kv.pop(key, None) is not None:
            log.info("kv config delete %s/%s", namespace, key)   # an emptied namespace stays, as in Java
        await self.persist()

    def namespace(self, namespace: str) -> dict[str, str] | None:
        kv = self.table.get(namespace)
        return None if kv is None else dict(kv)

    async def persist(self) -> None:
        """The table as it is now, on disk when this returns (written in a thread)."""
        text = json.dumps({"configTable": self.table}, indent=1, sort_keys=True, ensure_ascii=False)
        try:
            async with self._writing:
                await asyncio.to_thread(write_atomic, self.path, text)
        except OSError as e:
            self.persist_errors += 1
            log.error("kv config not persisted to %s: %s", self.path, e)
            raise
