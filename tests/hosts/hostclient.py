"""A client run inside a host (`ip netns exec <client host> python hostclient.py '<json>'`), one
JSON line on stdout.  Nothing here checks anything: the test reads the answer.

    {"op": "produce", "namesrv": "a;b", "topic": T, "seconds": S, "route_refresh_s": R,
     "fault_isolation_s": F}
        one send at a time for S seconds (no client retries: one attempt per value), then
        -> {"acked": [[value, broker name, queue id, offset, t_s], ...], "failed": [[value, error, t_s], ...]}
    {"op": "drain", "namesrv": ..., "topic": T}
        every queue of every broker of the topic read from its start
        -> {"read": [[value, broker name, queue id, offset], ...]}
Times t_s are time.time()."""
import asyncio
import json
import sys
import time

from mq.client import Message, MQClientError, Producer, PullConsumer
from mq.client.message import PullStatus


async def produce(req: dict) -> dict:
    p = Producer("hosts_producer", req["namesrv"], send_timeout_s=2.0, retry_times_when_send_failed=0,
                 route_refresh_interval_s=req["route_refresh_s"], fault_isolation_s=req["fault_isolation_s"])
    await p.start()
    acked, failed = [], []
    n = 0
    end = time.time() + req["seconds"]
    try:
        while time.time() < end:
            value = f"v{n}"
            n += 1
            try:
                r = await p.send(Message(req["topic"], value.encode()))
                acked.append([value, r.queue.broker_name, r.queue.queue_id, r.queue_offset, time.time()])
            except (MQClientError, OSError, asyncio.TimeoutError) as e:
                failed.append([value, f"{type(e).__name__}: {e}"[:200], time.time()])
                await asyncio.sleep(0.01)
    finally:
        await p.shutdown()
    return {"acked": acked, "failed": failed}


async def drain(req: dict) -> dict:
    c = PullConsumer("hosts_drain", req["namesrv"])
    await c.start()
    out = []
    try:
        for mq in await c.fetch_queues(req["topic"]):
            offset = 0
            while True:
                r = await c.pull(mq, offset, 32, timeout_s=10)
                if r.status is not PullStatus.FOUND:
                    break
                out += [[m.body.decode(), mq.broker_name, mq.queue_id, m.queue_offset] for m in r.messages]
                offset = r.next_begin_offset
    finally:
        await c.shutdown()
    return {"read": out}


if __name__ == "__main__":
    request = json.loads(sys.argv[1])
    print(json.dumps(asyncio.run({"produce": produce, "drain": drain}[request["op"]](request))), flush=True)
