"""The link between io workers and the supervisor, which owns the metadata.

Transport: our remoting protocol over an abstract unix socket
("\\0mq-broker-<hash of the store root>").  Calls are LINK_CALL requests
whose JSON body is {"m": method, "a": [args]} and whose response body is the
JSON result; the supervisor pushes LINK_PUSH oneway requests to workers:
  {"kind": "notify", "group": g, "conns": [connection ids]} -> the worker sends
      NOTIFY_CONSUMER_IDS_CHANGED (40) to those connections;
  {"kind": "topics"} / {"kind": "groups"} -> the worker drops its caches;
  {"kind": "role", "brokerRole": r, "brokerId": n} -> DLedger mode: the role changed;
  {"kind": "reset", ...} -> the worker sends RESET_CONSUMER_CLIENT_OFFSET (220) to consumers;
  {"kind": "config", "values": {...}} -> runtime config keys changed (UPDATE_BROKER_CONFIG);
  {"kind": "check", "conn": id, "ext": {...}, "body": hex} -> the worker sends
      CHECK_TRANSACTION_STATE (39) to that producer connection (mq.broker.transaction);
  {"kind": "reply", "conn": id, "ext": {...}, "body": hex} -> the worker sends
      PUSH_REPLY_MESSAGE_TO_CLIENT (326) to that requester's connection.

Hot-path reads are cached in the worker: topic and group configs until the
supervisor says they changed, heartbeat subscriptions for SUBSCRIPTION_CACHE_S.
Offset commits from pulls are oneway."""
from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import time

import orjson

from mq.remoting import RemotingClient, make_response, ResponseCode as RC

log = logging.getLogger("mq.broker.link")

LINK_CALL = 9000
LINK_PUSH = 9001
SUBSCRIPTION_CACHE_S = 1.0
# methods a worker may call, and whether it waits for the answer
METHODS = {
    "hello": True, "topic": True, "create_topic_on_send": True, "create_system_topic": True, "put_topic": True,
    "delete_topic": True, "group": True, "put_group": True, "commit_offset": False, "commit_offsets": False,
    "query_offset": True,
    "heartbeat": True, "unregister_client": True, "connection_closed": False, "consumer_ids": True,
    "subscription": True, "topics_wrapper": True, "groups_wrapper": True, "offsets_wrapper": True,
    "delay_wrapper": True, "lock_batch": True, "unlock_batch": True,
    "producer_connections": True, "consumer_connection": True, "delete_group": True,
    "reset_offsets_notify": True, "update_config": True, "stats_data": True, "broker_tps": True,
    "end_transaction": True, "push_reply": True,
}


COMMIT_COALESCE_S = 0.01       # a pull's offset commit waits at most this long for others to share a call


def link_address(store_root: str) -> str:
    digest = hashlib.sha1(os.path.realpath(store_root).encode()).hexdigest()[:16]
    return f"\0mq-broker-{digest}"


class RemoteMeta:
    """The worker's face of the supervisor's Metadata (mq.broker.metadata): its reads and
    changes as awaitable calls over the link, the reads cached until the supervisor pushes a
    change."""

    def __init__(self, address: str, worker_id: int, on_notify, on_role=None, on_other=None):
        self.address = address
        self.on_other = on_other
        self.worker_id = worker_id
        self.client = RemotingClient(connect_timeout_s=5)
        self.client.push_handlers[LINK_PUSH] = self._on_push
        self.on_notify = on_notify
        self.on_role = on_role
        # topic configs this worker has read (dropped when the supervisor says topics changed):
        # the fast paths of send and pull look here without a call; read-only outside this class
        self.cached_topics: dict[str, dict] = {}
        self.on_topics_cleared = None      # called after cached_topics is emptied (the C send path's table)
        self.on_groups_cleared = None      # called after the group cache is emptied (the C pull path's table)
        self._groups: dict[str, dict] = {}
        self._subs: dict[tuple[str, str], tuple[float, dict | None]] = {}
        self._tasks: set = set()
        self._commits: dict[tuple[str, str, int], int] = {}   # commit_offset_nowait's, not sent yet

    async def _call(self, method: str, *args):
        if self._commits:
            self.flush_commits()            # first: a later call of this worker sees them applied
        cmd = self.client.request(LINK_CALL, body=json.dumps({"m": method, "a": list(args)}).encode())
        if not METHODS[method]:
            await self.client.invoke_oneway(self.address, cmd)
            return None
        resp = await self.client.invoke(self.address, cmd, 10)
        if resp.code != RC.SUCCESS:
            raise RuntimeError(f"link call {method} failed: {resp.remark}")
        return json.loads(resp.body) if resp.body else None

    async def _on_push(self, _addr, cmd) -> None:
        msg = json.loads(cmd.body)
        kind = msg.get("kind")
        if kind == "notify":
            self.on_notify(msg["group"], msg["conns"])
        elif kind == "topics":
            self.cached_topics.clear()
            if self.on_topics_cleared is not None:
                self.on_topics_cleared()
        elif kind == "groups":
            self._groups.clear()
            if self.on_groups_cleared is not None:
                self.on_groups_cleared()
        elif kind == "role" and self.on_role is not None:
            self.on_role(msg["brokerRole"], int(msg["brokerId"]))
        elif self.on_other is not None:
            self.on_other(msg)

    async def hello(self) -> None:
        await self._call("hello", self.worker_id, os.getpid())

    # ---- cached reads ----------------------------------------------------------------------
    async def topic(self, name: str):
        tc = self.cached_topics.get(name)
        if tc is None:
            tc = await self._call("topic", name)
            if tc is not None:
                self.cached_topics[name] = tc
        return tc

    async def group(self, name: str, create: bool = True):
        g = self._groups.get(name)
        if g is None:
            g = await self._call("group", name, create)
            if g is not None:
                self._groups[name] = g
        return g

    async def subscription(self, group: str, topic: str):
        hit = self._subs.get((group, topic))
        now = time.monotonic()
        if hit is not None and now - hit[0] < SUBSCRIPTION_CACHE_S:
            return hit[1]
        sub = await self._call("subscription", group, topic)
        hit = self._subs.get((group, topic))
        if hit is None or hit[0] <= now:   # fetches that overlap may end out of order: the newest stays
            self._subs[(group, topic)] = (now, sub)
        return sub

    def commit_offset_nowait(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """A pull's commitOffset, coalesced: the last one per queue within COMMIT_COALESCE_S goes
        to the supervisor in one oneway call (commit_offsets) with the others, or earlier, before
        any other call of this worker (so its own later reads and offset updates come after it).
        One call a pull cost a push consumer's every delivered message ~25 us of the io worker
        and ~55 us of the supervisor (a process woken, a frame, a handler) on 2026-11-29."""
        if not self._commits:
            asyncio.get_running_loop().call_later(COMMIT_COALESCE_S, self.flush_commits)
        self._commits[(group, topic, queue_id)] = offset

    def flush_commits(self) -> None:
        """Sends the coalesced commits now (oneway): written at once on the open link, or sent by
        a Task when the link must first connect."""
        if not self._commits:
            return
        batch = [[g, t, q, off] for (g, t, q), off in self._commits.items()]
        self._commits.clear()
        cmd = self.client.request(LINK_CALL, body=orjson.dumps({"m": "commit_offsets", "a": [batch]}))
        if not self.client.send_oneway_nowait(self.address, cmd):
            task = asyncio.ensure_future(self.client.invoke_oneway(self.address, cmd))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    # ---- everything else goes to the supervisor --------------------------------------------
    def __getattr__(self, name):
        if name not in METHODS:
            raise AttributeError(name)

        async def call(*args):
            return await self._call(name, *[list(a) if isinstance(a, tuple) else a for a in args])
        return call

    async def close(self) -> None:
        self.flush_commits()
        await self.client.close()


class LinkService:
    """Supervisor side: answers LINK_CALLs against the Metadata and pushes to workers."""

    def __init__(self, metadata, supervisor):
        self.m = metadata
        self.sup = supervisor
        self.workers: dict[int, object] = {}       # worker id -> its link connection

    async def handle(self, conn, cmd):
        try:
            req = json.loads(cmd.body)
            method, args = req["m"], req.get("a", [])
            if method not in METHODS:
                return make_response(cmd, RC.REQUEST_CODE_NOT_SUPPORTED, f"no link method {method}")
            self.m.take_writes()                    # the supervisor loops' own writes: not this call's
            result = self._dispatch(conn, method, args)   # (the writer logs their failures)
            writes = self.m.take_writes()           # taken before any await: no other call's
            if asyncio.iscoroutine(result):         # a call that writes (end_transaction, update_config)
                result = await result
                writes += self.m.take_writes()
            if writes:                              # the change is on disk before its caller hears of it
                await asyncio.gather(*(asyncio.wrap_future(w) for w in writes))
        except Exception as e:
            log.exception("link call failed")
            return make_response(cmd, RC.SYSTEM_ERROR, f"{type(e).__name__}: {e}")
        return make_response(cmd, RC.SUCCESS, body=json.dumps(result).encode())

    def _dispatch(self, conn, method: str, args: list):
        m = self.m
        if method == "hello":
            wid, pid = args
            conn.attrs["worker"] = wid
            self.workers[wid] = conn
            self.sup.worker_ready(wid, pid)
            return None
        if method in ("heartbeat", "connection_closed"):
            body_or_key = args[0] if method == "connection_closed" else args[1]
            key = tuple(body_or_key)
            changed = m.heartbeat(args[0], key) if method == "heartbeat" else m.connection_closed(key)
            self.sup.notify_groups_changed(changed)
            return None
        if method == "unregister_client":
            self.sup.notify_groups_changed(m.unregister_client(*args))
            return None
        if method == "put_group":
            m.put_group(*args)
            self.push_all({"kind": "groups"})
            return None
        if method == "delete_group":
            existed = m.delete_group(*args)
            self.push_all({"kind": "groups"})
            return existed
        if method == "reset_offsets_notify":
            return self.sup.reset_offsets_notify(*args)
        if method == "update_config":
            return self.sup.update_config(*args)       # a coroutine: the conf file is rewritten by a thread
        if method == "stats_data":
            return self.sup.stats_history.stats_data(*args)
        if method == "broker_tps":
            return self.sup.stats_history.broker_tps()
        if method == "end_transaction":
            return self.sup.end_transaction(*args)
        if method == "push_reply":
            return self.sup.push_reply(*args)
        return getattr(m, method)(*args)

    def worker_link_closed(self, conn) -> None:
        wid = conn.attrs.get("worker")
        if wid is not None and self.workers.get(wid) is conn:
            del self.workers[wid]
            self.sup.notify_groups_changed(self.m.worker_gone(wid))

    def push(self, wid: int, msg: dict) -> None:
        conn = self.workers.get(wid)
        if conn is not None and not conn.closed:
            conn.push_oneway(LINK_PUSH, body=json.dumps(msg).encode())

    def push_all(self, msg: dict) -> None:
        for wid in list(self.workers):
            self.push(wid, msg)
