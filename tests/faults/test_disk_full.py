"""A full disk: refused sends, never a crash.

Real tmpfs mounts (root only, as the chaos suite's diskfull nemesis; unmounted in a finally).
The broker test puts the store's data directories (commitlog/, consumequeue/, index/, config/)
on a small tmpfs through bind mounts, so the broker's log and broker.conf stay on the big disk
and the test can read every line the broker writes while its data disk is full.

Before this code, filling the disk under a broker taking sends made the dispatch role die
with SIGBUS (a ConsumeQueue page mapped sparse) and restart every 0.5 s -- 20 restarts in 10 s
of sending, 22651 sends answered SEND_OK that no consumer could see -- and nothing refused a
send above diskSpaceWarningLevelRatio."""
from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import re
import subprocess
import time

import pytest

from mq.client import Message, Producer, PullConsumer
from mq.cluster import Broker, NameServer, wait_dispatched, wait_for
from mq.remoting import RemotingClient, RequestCode as R, ResponseCode as RC
from mq.store.checkpoint import Checkpoint
from mq.store.configfile import ConfigFile, retry_pending_writes, write_atomic
from mq.store.dledgerfiles import load_checkpoint, load_hard_state, save_checkpoint, save_hard_state
from mq.wire.batch import build_batch
from mq.wire.properties import properties_to_string
from mq.wire.headers import send_v2

TOPIC = "DiskFull"
STORED_BEFORE = 300
DATA_DIRS = ("commitlog", "consumequeue", "index", "config")
PROBE_CLIENTS_MAX = 32       # fresh connections opened to reach every io worker (the kernel spreads them)
REMARK = re.compile(r"service not available now\. It may be caused by one of the following reasons: the broker's "
                    r"disk is full \[CL: +[01]\.\d\d CQ: +[01]\.\d\d INDEX: +[01]\.\d\d\], messages are put to the "
                    r"slave, message store has been shut down, etc\.")


def _mount(args: list[str]) -> None:
    done = subprocess.run(["mount", *args], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        pytest.skip(f"cannot mount ({' '.join(args)}): {done.stderr.strip()}")


@contextlib.contextmanager
def tmpfs(path, size: str, binds: dict | None = None):
    """A tmpfs of `size` at `path`; binds: {subdirectory: where} bind-mounts its subdirectories
    elsewhere too.  Everything is unmounted on the way out."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    os.makedirs(path, exist_ok=True)
    _mount(["-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)])
    mounted = [str(path)]
    try:
        for sub, where in (binds or {}).items():
            os.makedirs(os.path.join(path, sub), exist_ok=True)
            os.makedirs(where, exist_ok=True)
            _mount(["--bind", os.path.join(path, sub), str(where)])
            mounted.append(str(where))
        yield str(path)
    finally:
        for m in reversed(mounted):
            subprocess.run(["umount", "-l", m], capture_output=True, timeout=30)


def fill(disk: str) -> str:
    """Takes every free byte of `disk` with one file; returns its path."""
    path = os.path.join(disk, "filler")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for chunk in (bytes(1 << 20), bytes(4096)):
            try:
                while os.write(fd, chunk):
                    pass
            except OSError as e:
                assert e.errno == errno.ENOSPC, e
    finally:
        os.close(fd)
    assert os.statvfs(disk).f_bavail == 0
    return path


# ---- the small files, on a 1 MiB disk ---------------------------------------------------------------------
def test_small_files_on_a_full_disk(tmp_path, caplog):
    """Proves every small file the broker maps or rewrites copes with a full disk: the checkpoint
    made while there was room still opens and takes writes through its map (its block was
    allocated before it was mapped), and a new one fails with ENOSPC when opened, never with a
    SIGBUS at its first write (this process would die); DLedger's currterm and checkpoint are
    saved again and again on the full disk (through their preallocated spares); write_atomic
    raises ENOSPC leaving the old version and no tmp file; a config file's save returns, keeps
    the old version on disk, logs once, and is written by retry_pending_writes() once there is
    room (logged once)."""
    caplog.set_level(logging.INFO, logger="mq.store")
    with tmpfs(tmp_path / "disk", "1m") as disk:
        ck_path = os.path.join(disk, "checkpoint")
        ck = Checkpoint(ck_path)
        ck.physic_ts_ms = 1
        ck.close()
        dl = os.path.join(disk, "dledger-n0")
        os.makedirs(dl)
        save_hard_state(dl, 1, "n0")
        save_checkpoint(dl, 10, 9)
        offsets = ConfigFile(os.path.join(disk, "config"), "consumerOffset.json")
        offsets.save({"offsetTable": {"T@g": {"0": 1}}})
        filler = fill(disk)

        ck = Checkpoint(ck_path)
        ck.physic_ts_ms, ck.logics_ts_ms = 2, 3
        ck.mark_clean(4096)
        ck.close()
        ck = Checkpoint(ck_path)
        assert (ck.physic_ts_ms, ck.logics_ts_ms, ck.clean_end()) == (2, 3, 4096)
        ck.close()
        with pytest.raises(OSError) as refused:
            Checkpoint(os.path.join(disk, "checkpoint-new"))
        assert refused.value.errno == errno.ENOSPC

        for term in range(2, 7):
            save_hard_state(dl, term, "n1")
            assert load_hard_state(dl) == (term, "n1")
            save_checkpoint(dl, 10 + term, 9 + term)
            assert load_checkpoint(dl) == (10 + term, 9 + term)
        assert os.statvfs(disk).f_bavail == 0, "the spares took no space of their own"

        for n in (2, 3):
            offsets.save({"offsetTable": {"T@g": {"0": n}}})
        assert offsets.load() == {"offsetTable": {"T@g": {"0": 1}}}
        assert not os.path.exists(offsets.path + ".tmp")
        assert retry_pending_writes() == 1
        with pytest.raises(OSError) as refused:
            write_atomic(os.path.join(disk, "big.json"), "x" * 200_000)
        assert refused.value.errno == errno.ENOSPC and not os.path.exists(os.path.join(disk, "big.json.tmp"))

        os.remove(filler)
        assert retry_pending_writes() == 0
        assert offsets.load() == {"offsetTable": {"T@g": {"0": 3}}}
        assert retry_pending_writes() == 0
    lines = [r.getMessage() for r in caplog.records if r.name == "mq.store.configfile"]
    assert len([m for m in lines if "not written" in m]) == 1, lines
    assert len([m for m in lines if "disk has room again" in m]) == 1, lines


# ---- a broker on a disk that fills up -----------------------------------------------------------------------
def _v2_header(topic: str, props: str = "", batch: bool = False) -> dict:
    return send_v2(producerGroup="PG_probe", topic=topic, defaultTopic="TBW102", defaultTopicQueueNums=4, queueId=0,
                   sysFlag=0, bornTimestamp=int(time.time() * 1000), flag=0, properties=props, reconsumeTimes=0,
                   unitMode=False, batch=batch)


async def _probe(addr: str, tag: str) -> tuple[str, dict]:
    """Over one fresh connection: the io worker serving it, and the answers (code, remark) to a
    single send (the fast path), a delayed send and a batch (both the full path)."""
    c = RemotingClient()
    try:
        info = await c.invoke(addr, c.request(R.GET_BROKER_RUNTIME_INFO), 5)
        worker = json.loads(info.body)["table"]["ioWorker"]
        answers = {}
        for path, code, ext, body in (
                ("single", R.SEND_MESSAGE_V2, _v2_header(TOPIC), f"{tag}-single".encode()),
                ("delayed", R.SEND_MESSAGE_V2, _v2_header(TOPIC, properties_to_string({"DELAY": "1"})),
                 f"{tag}-delayed".encode()),
                ("batch", R.SEND_BATCH_MESSAGE, _v2_header(TOPIC, batch=True),
                 build_batch([(0, f"{tag}-batch".encode(), "")]))):
            r = await c.invoke(addr, c.request(code, ext, body), 5)
            answers[path] = (r.code, r.remark)
        return worker, answers
    finally:
        await c.close()


async def _probe_every_worker(addr: str, workers: int, tag: str) -> tuple[dict, int]:
    """({io worker id: its answers}, probes made): fresh connections until every worker has
    answered one (the kernel spreads connections, so two may land on one worker: each probe
    sends its three messages, and the caller counts them all)."""
    seen: dict[str, dict] = {}
    for i in range(PROBE_CLIENTS_MAX):
        worker, answers = await _probe(addr, f"{tag}-{i}")
        seen.setdefault(worker, answers)
        if len(seen) == workers:
            return seen, i + 1
    raise AssertionError(f"{PROBE_CLIENTS_MAX} connections reached only io workers {sorted(seen)}")


async def _read_all(cons: PullConsumer) -> list:
    """Every message of TOPIC, queue by queue."""
    msgs = []
    for q in await cons.fetch_queues(TOPIC):
        offset, end = 0, await cons.max_offset(q)
        while offset < end:
            r = await cons.pull(q, offset, 32)
            assert r.messages, (q, offset, end, r.status)
            msgs += r.messages
            offset = r.next_begin_offset
    return msgs


async def _send_back(addr: str, group: str, msg) -> tuple[int, str]:
    c = RemotingClient()
    try:
        r = await c.invoke(addr, c.request(R.CONSUMER_SEND_MSG_BACK, {
            "offset": msg.commitlog_offset, "group": group, "delayLevel": 0, "originMsgId": msg.msg_id,
            "originTopic": TOPIC, "unitMode": False, "maxReconsumeTimes": 16}), 5)
        return r.code, r.remark
    finally:
        await c.close()


def test_broker_refuses_sends_on_a_full_disk_and_resumes_by_itself(tmp_path):
    """Proves, with real processes on a 32 MiB tmpfs filled to the last byte under a running
    broker with two io workers: every io worker answers SERVICE_NOT_AVAILABLE (14) with
    RocketMQ's remark on the fast path (a single send) and the full path (a delayed send, a
    batch), and a send-back gets RocketMQ's SYSTEM_ERROR; a consumer still reads every message
    stored before; the consumer offset committed
    meanwhile is kept and written once there is room; no role process dies or is restarted (the
    same pids by role, no restart in the log: before this change the dispatch role died with
    SIGBUS and was restarted every 0.5 s); once the filler is removed the broker takes every
    kind of send again without a restart, and the delayed message is delivered; each change of
    the disk's state is logged once although the disk is checked every 0.5 s."""
    root = tmp_path / "store"
    binds = {d: root / d for d in DATA_DIRS}
    with tmpfs(tmp_path / "disk", "32m", binds) as disk:
        ns = NameServer(str(tmp_path))
        broker = None
        try:
            broker = Broker(str(tmp_path), ns.addr, storePathRootDir=str(root), sendMessageThreadPoolNums=2,
                            mappedFileSizeCommitLog=4 << 20, mappedFileSizeConsumeQueue=20 * 4096,
                            maxHashSlotNum=65536, maxIndexNum=262144, cleanResourceInterval=500,
                            flushConsumerOffsetInterval=500)
            log = broker.proc.output

            async def flow():
                async with Producer("PG_full", ns.addr, retry_times_when_send_failed=0) as prod, \
                        PullConsumer("CG_full", ns.addr) as cons:
                    stored = [b"before-%04d" % i for i in range(STORED_BEFORE)]
                    for body in stored:
                        assert (await prod.send(Message(TOPIC, body))).status.name == "SEND_OK"
                    pids = broker.processes()
                    queue = (await cons.fetch_queues(TOPIC))[0]
                    await asyncio.to_thread(wait_dispatched, broker.addr)

                    filler = fill(disk)
                    await asyncio.to_thread(wait_for, lambda: "disk full: " in log(), 10, what="the disk check")
                    refused, _ = await _probe_every_worker(broker.addr, 2, "full")
                    for worker, answers in refused.items():
                        for path, (code, remark) in answers.items():
                            assert code == RC.SERVICE_NOT_AVAILABLE, (worker, path, code, remark)
                            assert REMARK.fullmatch(remark), (worker, path, remark)
                    read = await _read_all(cons)
                    assert sorted(m.body for m in read) == stored
                    # a send-back (a consumer's failed message) is refused as RocketMQ does (SYSTEM_ERROR)
                    assert await _send_back(broker.addr, "CG_full", read[0]) == (RC.SYSTEM_ERROR,
                                                                                 "SERVICE_NOT_AVAILABLE")
                    await cons.update_offset(queue, 7)
                    await asyncio.to_thread(wait_for, lambda: "consumerOffset.json not written" in log(), 10,
                                            what="the offsets' write refused")
                    assert broker.processes() == pids

                    os.remove(filler)
                    await asyncio.to_thread(wait_for, lambda: "disk no longer full" in log(), 10,
                                            what="the disk check seeing room")
                    taken, room_probes = await _probe_every_worker(broker.addr, 2, "room")
                    for worker, answers in taken.items():
                        assert {path: code for path, (code, _) in answers.items()} == \
                            {"single": RC.SUCCESS, "delayed": RC.SUCCESS, "batch": RC.SUCCESS}, (worker, answers)
                    assert await cons.query_offset(queue) == 7
                    return pids, room_probes

            async def delayed_delivered() -> int:
                async with PullConsumer("CG_delayed", ns.addr) as cons:
                    return sum(m.body.endswith(b"-delayed") for m in await _read_all(cons))

            pids, room_probes = asyncio.run(asyncio.wait_for(flow(), 120))
            # one delayed message per probe, sent once there was room: each delivered once (1 s levels)
            wait_for(lambda: asyncio.run(delayed_delivered()) == room_probes, 15, 0.2,
                     what="the delayed messages delivered")
            assert broker.processes() == pids
            wait_for(lambda: "consumerOffset.json written" in log(), 10, what="the offsets written again")
            offsets = json.load(open(root / "config" / "consumerOffset.json"))
            assert offsets["offsetTable"][f"{TOPIC}@CG_full"]["0"] == 7
            text = log()
            assert "died with exit code" not in text and "restarting it" not in text
            assert text.count("disk full: ") == 1 and text.count("disk no longer full") == 1
            assert text.count("over diskSpaceCleanForciblyRatio") == 1
            assert text.count("consumerOffset.json not written") == 1
        finally:
            if broker is not None:
                assert broker.stop() == 0
            ns.stop()
