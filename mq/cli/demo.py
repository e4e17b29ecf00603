"""`make run` until the broker lands: opens a store under ./run/store with the
embedded defaults (small files so rolling shows), appends a batch and single
messages, reads them back through the ConsumeQueue, stops cleanly, reopens
(clean recovery rescans nothing), and prints what mqdump sees."""
from __future__ import annotations

import logging
import os
import sys
import time

from mq.store import MessageStore, StoreConfig
from mq.wire import batch as wbatch
from mq.wire import commitlog as wcl
from mq.wire.properties import encode_properties


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(processName)s[%(process)d] %(name)s: %(message)s")
    root = os.path.abspath(os.environ.get("MQ_DEMO_STORE", "run/store"))
    cfg = StoreConfig(storePathRootDir=root, mappedFileSizeCommitLog=1024 * 1024, flushDiskType="SYNC_FLUSH")
    store = MessageStore.open(cfg)
    print(f"store at {root}: recovered ({store.recovery.mode}) to offset {store.cl.write_pos}")
    t0 = time.perf_counter()
    items = [wbatch.BatchItem(0, b"batch message %d" % i, encode_properties({"TAGS": "TagA", "KEYS": f"k{i}"}))
             for i in range(1000)]
    res = store.put_batch("DemoTopic", 0, wbatch.build_batch(items))
    single = [store.put("DemoTopic", 1, b"single %d" % i, encode_properties({"TAGS": "TagB"})) for i in range(100)]
    dt = time.perf_counter() - t0
    print(f"appended {res.result.count} batched + {len(single)} single messages (SYNC_FLUSH) in {dt * 1000:.1f} ms; "
          f"first msgId {res.result.msg_id(0)}")
    store.wait_dispatched()
    got = store.get_messages("DemoTopic", 0, store.max_offset("DemoTopic", 0) - 3, 3)
    for qoff, view in got:
        rec = wcl.parse_record(view, check_crc=True)
        print(f"  queue 0 offset {qoff}: {rec.body!r} at {rec.physical_offset}")
    store.close()
    again = MessageStore.open(cfg)
    print(f"reopened: recovery {again.recovery.mode}, validated {again.recovery.records_validated} records, "
          f"queue 0 max offset {again.max_offset('DemoTopic', 0)}")
    again.close()
    print(f"inspect it: .venv/bin/mqdump commitlog {root} --limit 5")
    return 0


if __name__ == "__main__":
    sys.exit(main())
