"""Producer and consumer connections served from C (csrc/fastconn.h, mq.broker.fastsend,
fastConnEnable) against a real broker over raw sockets: a connection whose read the C send path
took whole is read and answered by C from then on; C gives it back to Python at the first frame
it does not take, with the bytes after it, in order; a client that reads no answers for a while
gets every one of them once it reads (C gives the connection back when the socket stops taking
them, and Python's bounds hold it); the idle closer sees the bytes C moved.  A consumer's
connection is served the same way once C answered a pull of its: its pulls are answered by C,
their commits reach the group's offsets, and answers the socket does not take are owed by C
(that connection is not read meanwhile) and reach the client whole and in order, also when C
lets go of the connection while it owes them.  The differential property
(tests/properties/test_prop_fast_send.py) covers the answers and records byte for byte, frames
cut anywhere between reads included."""
import json
import socket
import threading
import time

import pytest

from mq.cluster import Broker, NameServer, wait_for
from mq.wire import commitlog as wcl
from mq.wire.headers import PULL_COMMIT_OFFSET, PULL_SUBSCRIPTION
from tests.integration.test_send_fast_path import SEND_V2, UPDATE_TOPIC, Raw, v2

TOPIC = "FastConnTopic"
RUNTIME_INFO = 28
GET_MAX_OFFSET = 30
IDLE_S = 3                        # serverChannelMaxIdleTimeSeconds of the idle test's broker


@pytest.fixture(scope="module")
def namesrv(tmp_path_factory):
    ns = NameServer(str(tmp_path_factory.mktemp("fastconns-ns")))
    yield ns
    ns.stop()


def start_broker(workdir: str, namesrv: NameServer, **options) -> Broker:
    """A broker with TOPIC made and published to its C send path."""
    b = Broker(workdir, namesrv.addr, sendMessageThreadPoolNums=1, **options)
    raw = Raw(b.port)
    try:
        resp, _ = raw.call(UPDATE_TOPIC, {"topic": TOPIC, "readQueueNums": "4", "writeQueueNums": "4", "perm": "6",
                                          "topicFilterType": "SINGLE_TAG", "topicSysFlag": "0", "order": "false"})
        assert resp.code == 0, resp.remark
        for _ in range(2):         # the worker learns the topic, then publishes it to C
            resp, _ = raw.call(SEND_V2, v2(TOPIC, 0, ""), b"warm")
            assert resp.code == 0, resp.remark
    finally:
        raw.close()
    return b


@pytest.fixture(scope="module")
def broker(tmp_path_factory, namesrv):
    b = start_broker(str(tmp_path_factory.mktemp("fastconns")), namesrv)
    yield b
    b.stop()


def info(port: int) -> dict:
    raw = Raw(port)
    try:
        resp, _ = raw.call(RUNTIME_INFO, {})
        return json.loads(resp.body)["table"]
    finally:
        raw.close()


def given_back(port: int) -> dict:
    """Connections C gave back, by why (the runtime info's fastConnGivenBack)."""
    return {k: int(v) for k, v in (kv.split("=") for kv in info(port)["fastConnGivenBack"].split(","))}


def send_frame(raw: Raw, qid: int, body: bytes) -> tuple:
    return raw.frame(SEND_V2, v2(TOPIC, qid, ""), body)


def test_a_producer_connection_is_served_from_c_and_given_back_in_order(broker):
    """A send answered alone: C serves the connection (one more adoption, one served).  Then, in
    one write, two sends, a request C does not take (GET_BROKER_RUNTIME_INFO, which reports C
    serving none: it was given back before Python read it) and a send: four answers, the sends
    stored in the order they came (consecutive offsets of one queue).  A later send is answered
    and the connection served again."""
    before = int(info(broker.port)["fastConnAdoptions"])
    handed = given_back(broker.port)["handback"]
    raw = Raw(broker.port)
    try:
        resp, _ = raw.call(SEND_V2, v2(TOPIC, 1, ""), b"first")
        assert resp.code == 0, resp.remark
        first = int(resp.ext_fields["queueOffset"])
        now = info(broker.port)
        assert int(now["fastConnAdoptions"]) == before + 1
        assert now["fastConnsServed"] == "1"

        reqs = [send_frame(raw, 1, b"a"), send_frame(raw, 1, b"b"), raw.frame(RUNTIME_INFO, {}),
                send_frame(raw, 1, b"c")]
        raw.sock.sendall(b"".join(data for _, data in reqs))
        answers = {}
        for _ in reqs:
            resp, _ = raw.read()
            answers[resp.opaque] = resp
        sends = [answers[req.opaque] for req, _ in (reqs[0], reqs[1], reqs[3])]
        assert [r.code for r in sends] == [0, 0, 0], [r.remark for r in sends]
        assert [int(r.ext_fields["queueOffset"]) for r in sends] == [first + 1, first + 2, first + 3]
        table = json.loads(answers[reqs[2][0].opaque].body)["table"]
        assert table["fastConnsServed"] == "0"          # given back with the frame, before Python read it
        assert given_back(broker.port)["handback"] == handed + 1

        resp, _ = raw.call(SEND_V2, v2(TOPIC, 1, ""), b"again")
        assert resp.code == 0 and int(resp.ext_fields["queueOffset"]) == first + 4
        resp, _ = raw.call(SEND_V2, v2(TOPIC, 1, ""), b"and again")     # answered by C now
        assert resp.code == 0 and int(resp.ext_fields["queueOffset"]) == first + 5
        assert info(broker.port)["fastConnsServed"] == "1"
    finally:
        raw.close()
    wait_for(lambda: info(broker.port)["fastConnsServed"] == "0", 10, what="the closed connection given back")


def test_a_client_that_reads_no_answers_for_a_while_gets_all_of_them(broker):
    """30,000 sends written while the client reads nothing, into a fixed receive buffer: the
    broker's answers (~7.5 MB) stop fitting (the kernel's send buffer grows to 4 MiB here), C gives
    the connection back (its transport keeps what is left, and Python's unsent caps pause reading),
    and once the client reads (only after the broker says C gave it back), every send has exactly
    one SUCCESS answer, the offsets of one queue consecutive."""
    n = 30000
    writes = given_back(broker.port)["write"]
    raw = Raw(broker.port)
    raw.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)     # fixed: no autotuning
    try:
        resp, _ = raw.call(SEND_V2, v2(TOPIC, 2, ""), b"opener")    # served from C from here on
        assert resp.code == 0
        first = int(resp.ext_fields["queueOffset"])
        frames = [send_frame(raw, 2, b"x" * 16) for _ in range(n)]
        writer = threading.Thread(target=lambda: raw.sock.sendall(b"".join(d for _, d in frames)), daemon=True)
        writer.start()
        # the answers pile up unread until the socket stops taking them and C gives the connection back
        wait_for(lambda: given_back(broker.port)["write"] > writes, 60, 0.05, "C giving back a connection it could not write")
        offsets = {}
        for _ in range(n):
            resp, _ = raw.read()
            assert resp.code == 0, resp.remark
            assert resp.opaque not in offsets, "an answer came twice"
            offsets[resp.opaque] = int(resp.ext_fields["queueOffset"])
        writer.join(30)
        assert sorted(offsets) == sorted(req.opaque for req, _ in frames)
        assert [offsets[req.opaque] for req, _ in frames] == list(range(first + 1, first + 1 + n))
    finally:
        raw.close()


def test_the_idle_closer_sees_the_bytes_c_moved(tmp_path, namesrv):
    """A connection served from C that sends every 0.2 s for twice the idle timeout stays open
    (the bytes C read count as activity); once it stops, it is closed after the timeout."""
    broker = start_broker(str(tmp_path), namesrv, serverChannelMaxIdleTimeSeconds=IDLE_S)
    raw = Raw(broker.port)
    try:
        t_end = time.monotonic() + 2 * IDLE_S + 1
        while time.monotonic() < t_end:
            resp, _ = raw.call(SEND_V2, v2(TOPIC, 3, ""), b"tick")
            assert resp.code == 0, resp.remark
            time.sleep(0.2)
        assert info(broker.port)["fastConnsServed"] == "1"
        raw.sock.settimeout(IDLE_S + 10)               # the closer's sweep runs every IDLE_S / 4
        assert raw.sock.recv(1) == b"", "the idle connection was not closed"
    finally:
        raw.close()
        broker.stop()


def test_a_poll_waiting_in_c_ends_at_any_other_socket_of_the_loop(tmp_path, namesrv):
    """fastConnWaitMs=10000: once a poll answered what C read, it goes on waiting in C (up to 10 s)
    for more requests of the connections C serves.  Sends one at a time are then served by one
    call from the loop (C's polls far outnumber the loop's wakes).  A request on a connection
    Python serves (GET_BROKER_RUNTIME_INFO), and a new connection, each sent right after a send
    was answered -- while C waits -- are answered in well under the 10 s: the wait ends at any
    other socket of the loop (mq_fast_poll_wait)."""
    broker = start_broker(str(tmp_path), namesrv, fastConnWaitMs=10000)
    producer, python_side = Raw(broker.port), Raw(broker.port)
    try:
        resp, _ = python_side.call(RUNTIME_INFO, {})
        assert resp.code == 0
        resp, _ = producer.call(SEND_V2, v2(TOPIC, 0, ""), b"opener")     # served from C from here on
        assert resp.code == 0
        before = json.loads(python_side.call(RUNTIME_INFO, {})[0].body)["table"]
        for i in range(50):
            resp, _ = producer.call(SEND_V2, v2(TOPIC, 0, ""), b"one at a time %d" % i)
            assert resp.code == 0, resp.remark
        after = None
        for what in ("a request on a connection Python serves", "a new connection"):
            resp, _ = producer.call(SEND_V2, v2(TOPIC, 0, ""), b"then C waits")
            assert resp.code == 0, resp.remark
            t0 = time.monotonic()
            if after is None:
                resp, _ = python_side.call(RUNTIME_INFO, {})
                after = json.loads(resp.body)["table"]
            else:
                info(broker.port)
            took_s = time.monotonic() - t0
            assert took_s < 2.5, f"{what} waited {took_s:.2f} s for the poll waiting in C"
        polls = int(after["fastConnPolls"]) - int(before["fastConnPolls"])
        wakes = int(after["fastConnWakes"]) - int(before["fastConnWakes"])
        assert polls >= 50 and wakes * 5 <= polls, (polls, wakes)
        assert after["fastConnsServed"] == "1"
    finally:
        producer.close()
        python_side.close()
        broker.stop()


# --------------------------------------------------------------------------------------------------
# consumer connections: pulls answered by C on the connections it serves

PULL, QUERY_CONSUMER_OFFSET, UPDATE_BROKER_CONFIG = 11, 14, 25


def pull_ext(group: str, qid: int, offset: int, max_nums: int, commit: int = 0) -> dict:
    """A PULL_MESSAGE with its subscription ("*"), no suspension, committing `commit` when > 0."""
    return {"consumerGroup": group, "topic": TOPIC, "queueId": str(qid), "queueOffset": str(offset),
            "maxMsgNums": str(max_nums), "sysFlag": str(PULL_SUBSCRIPTION | (PULL_COMMIT_OFFSET if commit else 0)),
            "commitOffset": str(commit), "suspendTimeoutMillis": "0", "subscription": "*", "subVersion": "0"}


def fill(port: int, qid: int, bodies: list) -> int:
    """Sends bodies to queue qid on a connection closed afterwards (waiting until C gives it back,
    and until the queue holds them: a send is answered when appended, and dispatch makes it
    visible a moment later, as RocketMQ's reput does); returns the first one's queue offset."""
    raw = Raw(port)
    try:
        offsets = []
        for body in bodies:
            resp, _ = raw.call(SEND_V2, v2(TOPIC, qid, ""), body)
            assert resp.code == 0, resp.remark
            offsets.append(int(resp.ext_fields["queueOffset"]))
        # on the same connection: another one could be adopted and given back later
        wait_for(lambda: int(raw.call(GET_MAX_OFFSET, {"topic": TOPIC, "queueId": str(qid)})[0]
                             .ext_fields["offset"]) > offsets[-1], 10, what="the sends dispatched")
    finally:
        raw.close()
    wait_for(lambda: info(port)["fastConnsServed"] == "0", 10, what="the producer connection given back")
    assert offsets == list(range(offsets[0], offsets[0] + len(bodies)))
    return offsets[0]


def test_a_consumer_connection_is_served_from_c_with_its_commits(broker):
    """Pulls of 8 on one connection, each committing where the last ended: after the first pulls
    (Python's while the worker learns the group) C serves the connection, answers the rest
    (fastPulls grows by each), and the 40 messages come back in order; the last commit is the
    group's offset (QUERY_CONSUMER_OFFSET on another connection); nothing was given back."""
    group = "FastConnPullCG"
    bodies = [b"pulled-%d" % i for i in range(40)]
    first = fill(broker.port, 3, bodies)
    before = info(broker.port)
    back = given_back(broker.port)
    cons = Raw(broker.port)
    try:
        got, offset, commit, answers = [], first, 0, 0
        while len(got) < len(bodies):
            resp, _ = cons.call(PULL, pull_ext(group, 3, offset, 8, commit))
            assert resp.code == 0, (resp.code, resp.remark)
            answers += 1
            got += [r["body"] for r in wcl.iter_records(resp.body)]
            commit = offset = int(resp.ext_fields["nextBeginOffset"])
        assert got == bodies
        now = info(broker.port)
        assert now["fastConnsServed"] == "1" and now["fastConnsOwing"] == "0"
        assert int(now["fastConnAdoptions"]) == int(before["fastConnAdoptions"]) + 1
        assert int(now["fastPulls"]) - int(before["fastPulls"]) >= answers - 2
        resp, _ = cons.call(PULL, pull_ext(group, 3, offset, 8, commit))       # the last commit, with a
        assert resp.code == 19, (resp.code, resp.remark)                       # pull C hands back
    finally:
        cons.close()
    other = Raw(broker.port)
    try:
        resp, _ = other.call(QUERY_CONSUMER_OFFSET, {"consumerGroup": group, "topic": TOPIC, "queueId": "3"})
        assert resp.code == 0 and int(resp.ext_fields["offset"]) == first + len(bodies), (resp.code, resp.ext_fields)
    finally:
        other.close()
    assert {k: v for k, v in given_back(broker.port).items() if k != "handback"} == \
        {k: v for k, v in back.items() if k != "handback"}


def test_a_consumer_that_reads_no_answers_for_a_while_gets_all_of_them(broker):
    """300 pulls of 32 x 1 KiB written while the client reads nothing, into a fixed receive
    buffer: the answers (~10 MB) stop fitting, and C keeps what the socket did not take (the
    broker says one connection owes answers) and reads no more of that connection meanwhile.
    Once the client reads, every pull has its answer, whole and in order; C kept serving it."""
    group = "FastConnSlowCG"
    bodies = [b"%04d" % i + b"y" * 1020 for i in range(32)]
    first = fill(broker.port, 2, bodies)
    back = given_back(broker.port)
    cons = Raw(broker.port)
    cons.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)     # fixed: no autotuning
    try:
        for _ in range(3):              # the worker learns the group; then C answers, and serves it
            resp, _ = cons.call(PULL, pull_ext(group, 2, first, 32))
            assert resp.code == 0 and len(list(wcl.iter_records(resp.body))) == 32
        want = resp.body
        frames = [cons.frame(PULL, pull_ext(group, 2, first, 32)) for _ in range(300)]
        writer = threading.Thread(target=lambda: cons.sock.sendall(b"".join(d for _, d in frames)), daemon=True)
        writer.start()
        wait_for(lambda: info(broker.port)["fastConnsOwing"] == "1", 60, 0.05, "C owing a pull's answer")
        assert info(broker.port)["fastConnsServed"] == "1"
        for req, _ in frames:
            resp, _ = cons.read()
            assert (resp.code, resp.opaque) == (0, req.opaque), resp.remark
            assert resp.body == want
        writer.join(30)
        now = info(broker.port)
        assert now["fastConnsServed"] == "1" and now["fastConnsOwing"] == "0"
    finally:
        cons.close()
    assert given_back(broker.port)["write"] == back["write"]


def test_answers_owed_when_c_lets_go_of_a_connection_come_first(broker):
    """With a pull's answer owed on a connection that reads nothing, the broker stops taking
    writes (brokerPermission 4: the C send path and its connections are off), so C hands the
    connection and what it owes back; once the client reads, every pull has its answer, whole,
    in order, the owed bytes first, and the connection still works (a send after
    brokerPermission 6 again)."""
    group = "FastConnOwedCG"
    bodies = [b"%04d" % i + b"z" * 1020 for i in range(32)]
    first = fill(broker.port, 1, bodies)
    cons = Raw(broker.port)
    cons.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    admin = Raw(broker.port)
    try:
        for _ in range(3):
            resp, _ = cons.call(PULL, pull_ext(group, 1, first, 32))
            assert resp.code == 0
        want = resp.body
        frames = [cons.frame(PULL, pull_ext(group, 1, first, 32)) for _ in range(300)]
        writer = threading.Thread(target=lambda: cons.sock.sendall(b"".join(d for _, d in frames)), daemon=True)
        writer.start()
        wait_for(lambda: info(broker.port)["fastConnsOwing"] == "1", 60, 0.05, "C owing a pull's answer")
        resp, _ = admin.call(UPDATE_BROKER_CONFIG, {}, b"brokerPermission=4\n")
        assert resp.code == 0, resp.remark
        wait_for(lambda: info(broker.port)["fastConnsServed"] == "0", 30, 0.05, "C letting go of the connection")
        for req, _ in frames:
            resp, _ = cons.read()
            assert (resp.code, resp.opaque) == (0, req.opaque), resp.remark
            assert resp.body == want
        writer.join(30)
    finally:
        resp, _ = admin.call(UPDATE_BROKER_CONFIG, {}, b"brokerPermission=6\n")
        admin.close()
        assert resp.code == 0, resp.remark
    try:
        resp, _ = cons.call(SEND_V2, v2(TOPIC, 1, ""), b"after")
        assert resp.code == 0, resp.remark
    finally:
        cons.close()
