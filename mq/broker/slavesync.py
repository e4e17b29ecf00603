"""A slave's metadata sync from its master (RocketMQ's SlaveSynchronize).

Every slaveMetadataSyncInterval (first run after FIRST_DELAY_S), with the
master address learned from the name server registration:
  GET_ALL_TOPIC_CONFIG (21) on the master's fast port (listenPort-2) -> replace
      the topic table when its dataVersion differs;
  GET_ALL_CONSUMER_OFFSET (43) -> merge (entries are never deleted);
  GET_ALL_DELAY_OFFSET (45) -> take it as it is;
  GET_ALL_SUBSCRIPTIONGROUP_CONFIG (201) -> replace when its dataVersion differs.
Each call times out after CALL_TIMEOUT_S; a failed step is logged and the
others still run."""
from __future__ import annotations

import asyncio
import logging

from mq.remoting import RemotingError, RequestCode as R, ResponseCode as RC
from mq.wire.fastjson import loads_lenient

from .metadata import DataVersion

log = logging.getLogger("mq.broker.slavesync")

FIRST_DELAY_S = 3.0
CALL_TIMEOUT_S = 3.0


class SlaveSync:
    def __init__(self, supervisor):
        self.sup = supervisor
        self.syncs = 0

    async def run(self) -> None:
        await asyncio.sleep(FIRST_DELAY_S)
        while True:
            try:
                await self.sync_all()
            except Exception:
                log.exception("slave metadata sync failed")
            await asyncio.sleep(self.sup.config.slaveMetadataSyncInterval / 1000)

    async def _get(self, addr: str, code: int) -> dict | None:
        c = self.sup.client
        try:
            r = await c.invoke(addr, c.request(code), CALL_TIMEOUT_S)
        except RemotingError as e:
            log.warning("metadata sync: code %d from %s failed: %s", code, addr, e)
            return None
        if r.code != RC.SUCCESS:
            log.warning("metadata sync: code %d from %s answered %d %s", code, addr, r.code, r.remark)
            return None
        return loads_lenient(r.body.decode("utf-8")) if r.body else {}

    async def sync_all(self) -> bool:
        master = self.sup.master_addr
        if not master or master == self.sup.config.broker_addr:
            return False
        host, _, port = master.rpartition(":")
        fast = f"{host}:{int(port) - 2}"
        m = self.sup.metadata
        topics = await self._get(fast, R.GET_ALL_TOPIC_CONFIG)
        if topics is not None and DataVersion.from_json(topics.get("dataVersion")) != m.topics_version:
            m.replace_topics(topics)
            self.sup.link.push_all({"kind": "topics"})
        offsets = await self._get(master, R.GET_ALL_CONSUMER_OFFSET)
        if offsets is not None:
            m.merge_offsets(offsets)
        delay = await self._get(master, R.GET_ALL_DELAY_OFFSET)
        if delay is not None:
            m.delay_offsets = {int(k): int(v) for k, v in delay.get("offsetTable", {}).items()}
            m.persist_delay()
        groups = await self._get(master, R.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)
        if groups is not None and DataVersion.from_json(groups.get("dataVersion")) != m.groups_version:
            m.replace_groups(groups)
            self.sup.link.push_all({"kind": "groups"})
        self.syncs += 1
        return True


__all__ = ["SlaveSync"]
