"""mq.broker.forward (a DLedger member that is not the leader forwards writes) against real
sockets on 127.0.0.1, in this process: the leader's answer comes back under the client's opaque
with the forwarded request marked (so it is never forwarded again); a leader that accepts and
never answers costs a forward at most FORWARD_TIMEOUT_S + 0.5 s, answered SERVICE_NOT_AVAILABLE
naming it; a closed port fails at once and the forwards after it, for FORWARD_DOWN_S, do not
even connect; the leader is read from the DLedger role's status file, never this member."""
from __future__ import annotations

import asyncio
import json
import socket
import time

from mq.broker import forward as F
from mq.dledger.role import STATUS_FILE
from mq.remoting import RemotingServer, ResponseCode as RC, make_response
from mq.wire.remoting import RemotingCommand

SEND_V2 = 310


def request(opaque: int = 77) -> RemotingCommand:
    return RemotingCommand(code=SEND_V2, opaque=opaque, ext_fields={"b": "T", "e": "0"}, body=b"hello")


def test_the_leaders_answer_comes_back_and_the_forward_is_marked(tmp_path):
    seen = []

    def handler(conn, cmd):
        seen.append((cmd.remark, cmd.ext_fields, cmd.body))
        return make_response(cmd, 0, None, {"msgId": "ABC", "queueOffset": "5"}, b"")

    async def go():
        leader = RemotingServer("leader", {SEND_V2: handler})
        port = await leader.start()
        fwd = F.LeaderForward(str(tmp_path), None, "127.0.0.1:1")
        try:
            return await fwd.forward(f"127.0.0.1:{port}", request()), fwd
        finally:
            await fwd.close()
            await leader.stop(0.1)
    r, fwd = asyncio.run(go())
    assert (r.code, r.opaque, r.ext_fields["msgId"], r.ext_fields["queueOffset"]) == (0, 77, "ABC", "5")
    assert seen == [(F.FORWARD_REMARK_PREFIX + "127.0.0.1:1", {"b": "T", "e": "0"}, b"hello")]
    assert (fwd.forwarded, fwd.failed) == (1, 0)


def test_a_silent_leader_costs_at_most_the_forward_timeout(tmp_path):
    lsock = socket.create_server(("127.0.0.1", 0))     # accepts (the kernel's backlog), never answers
    addr = f"127.0.0.1:{lsock.getsockname()[1]}"

    async def go():
        fwd = F.LeaderForward(str(tmp_path), None, "127.0.0.1:1")
        try:
            t0 = time.monotonic()
            r = await fwd.forward(addr, request())
            return r, time.monotonic() - t0
        finally:
            await fwd.close()
    try:
        r, took_s = asyncio.run(go())
    finally:
        lsock.close()
    assert r.code == RC.SERVICE_NOT_AVAILABLE and addr in r.remark and r.opaque == 77
    assert took_s < F.FORWARD_TIMEOUT_S + 1.5, took_s


def test_a_closed_port_fails_at_once_and_is_not_tried_again_for_a_moment(tmp_path):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    addr = f"127.0.0.1:{s.getsockname()[1]}"
    s.close()                                           # nothing listens there

    async def go():
        fwd = F.LeaderForward(str(tmp_path), None, "127.0.0.1:1")
        try:
            return [await fwd.forward(addr, request(k)) for k in (1, 2)], fwd
        finally:
            await fwd.close()
    (first, second), fwd = asyncio.run(go())
    assert first.code == second.code == RC.SERVICE_NOT_AVAILABLE
    assert "cannot connect" in first.remark and "failed just now" in second.remark
    assert (first.opaque, second.opaque, fwd.failed) == (1, 2, 2)


def test_the_leader_is_read_from_the_status_file_and_is_never_this_member(tmp_path):
    fwd = F.LeaderForward(str(tmp_path), None, "127.0.0.1:10911")

    def status(**st):
        (tmp_path / STATUS_FILE).write_text(json.dumps(st))
        fwd._read_at = 0.0                               # (re-read now, not after LEADER_REFRESH_S)
        return fwd.leader_addr()
    assert fwd.leader_addr() is None                     # no status file yet
    assert status(role="FOLLOWER", leaderBrokerAddr="127.0.0.1:20911") == "127.0.0.1:20911"
    assert status(role="FOLLOWER", leaderBrokerAddr="127.0.0.1:10911") is None     # ourselves
    assert status(role="LEADER", leaderBrokerAddr="127.0.0.1:20911") is None       # we lead (not ready)
    assert status(role="CANDIDATE", leaderBrokerAddr=None) is None                 # an election
