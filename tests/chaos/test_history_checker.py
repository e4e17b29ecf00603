"""The chaos history checker (mq.chaos.history) on crafted histories: a clean history passes,
and each verdict - lost, unexpected, duplicated, reordered, a refused send read anyway, a hole
instead of a lost suffix, unavailability and recovery times - fires on the history made to
break it, and only then."""
from mq.chaos.history import HistoryWriter, check, load


class H:
    """A history under construction, with a clock in microseconds."""

    def __init__(self):
        self.ops = []
        self.t = 1_000_000

    def at(self, t_s: float):
        self.t = 1_000_000 + int(t_s * 1e6)
        return self

    def op(self, process, type_, f, value, **kw):
        self.ops.append({"t_us": self.t, "process": process, "type": type_, "f": f, "value": value, **kw})
        self.t += 1
        return self

    def send(self, value, queue="q0", offset=None, outcome="ok", t_s=None, ack_t_s=None):
        if t_s is not None:
            self.at(t_s)
        self.op("p", "invoke", "send", value)
        if ack_t_s is not None:
            self.at(ack_t_s)
        if outcome == "ok":
            self.op("p", "ok", "send", value, queue=queue, offset=offset)
        elif outcome == "fail":
            self.op("p", "fail", "send", value, code=14)
        else:
            self.op("p", "info", "send", value, error="timeout")
        return self

    def read(self, value, queue="q0", offset=0):
        return self.op("c", "ok", "read", value, queue=queue, offset=offset)


def clean() -> H:
    h = H()
    for i in range(5):
        h.send(f"v{i}", offset=i, t_s=i * 0.1)
    h.send("maybe", outcome="info", t_s=0.6)
    h.send("refused", outcome="fail", t_s=0.7)
    for i in range(5):
        h.read(f"v{i}", offset=i)
    h.read("v2", offset=2)            # a consumer re-pulled the same place: not a duplicate
    return h


def test_clean_history_is_valid():
    v = check(clean().ops)
    assert v.valid, v.summary()
    assert (v.sends, v.acked, v.failed, v.unknown, v.read) == (7, 5, 1, 1, 5)
    assert v.suffix_loss and not v.lost


def test_an_unknown_send_may_or_may_not_be_there():
    h = clean().read("maybe", offset=5)
    assert check(h.ops).valid


def test_lost():
    h = clean()
    h.ops = [op for op in h.ops if not (op["f"] == "read" and op["value"] == "v3")]
    v = check(h.ops)
    assert not v.valid and v.lost == ["v3"]


def test_unexpected():
    v = check(clean().read("never-sent", offset=9).ops)
    assert not v.valid and v.unexpected == ["never-sent"]


def test_duplicated():
    v = check(clean().read("v1", queue="q1", offset=0).ops)
    assert not v.valid and v.duplicated == ["v1"]


def test_refused_send_read_anyway():
    v = check(clean().read("refused", offset=7).ops)
    assert not v.valid and v.failed_read == ["refused"]


def test_reordered():
    """a acknowledged before b was invoked, but a sits after b in the queue."""
    h = H().send("a", offset=5, t_s=0.0, ack_t_s=0.1).send("b", offset=4, t_s=0.2, ack_t_s=0.3)
    h.read("a", offset=5).read("b", offset=4)
    v = check(h.ops)
    assert not v.valid and v.reordered == [("a", "b")]
    # concurrent sends (b invoked before a was acknowledged) may land in either order
    h = H().send("a", offset=5, t_s=0.0, ack_t_s=0.3)
    h.ops.insert(1, {"t_us": 1_100_000, "process": "p2", "type": "invoke", "f": "send", "value": "b"})
    h.at(0.35).op("p2", "ok", "send", "b", queue="q0", offset=4).read("a", offset=5).read("b", offset=4)
    assert check(h.ops).valid


def test_suffix_loss_versus_hole():
    """Loss of the last acknowledged sends before a fault is a suffix; losing one in the middle
    (a later one before the same fault survived) is a hole; sends after the fault start a new piece;
    an ack racing the fault's start still belongs to the piece before it."""
    def history(lost):
        h = H()
        for i in range(4):
            h.send(f"v{i}", offset=i, t_s=i * 0.1)
        h.at(0.5).op("nemesis", "info", "start", "kill")
        h.send("racing", offset=4, t_s=0.45, ack_t_s=0.52)        # acknowledged as the kill began
        h.at(0.6).op("nemesis", "info", "stop", "kill")
        h.send("after", offset=2, t_s=0.8)
        for i in range(4):
            if f"v{i}" not in lost:
                h.read(f"v{i}", offset=i)
        if "racing" not in lost:
            h.read("racing", offset=4)
        return h.read("after", offset=2)
    v = check(history({"v2", "v3", "racing"}).ops)
    assert not v.valid and v.lost == ["racing", "v2", "v3"] and v.suffix_loss
    v = check(history({"v1"}).ops)
    assert v.lost == ["v1"] and not v.suffix_loss


def test_unavailability_and_recovery():
    h = H().send("a", offset=0, t_s=0.0)
    h.at(1.0).op("nemesis", "info", "start", "kill broker").at(1.2).op("nemesis", "info", "stop", "kill broker")
    h.send("b", offset=1, t_s=3.0, ack_t_s=3.5).read("a", offset=0).read("b", offset=1)
    v = check(h.ops)
    assert v.valid
    assert abs(v.max_unavailable_s - 3.5) < 0.01
    assert [(w, round(s, 2)) for w, s in v.recovery_s] == [("kill broker", 2.5)]
    # a send invoked before the fault and acknowledged during it is no recovery
    h2 = H().send("a", offset=0, t_s=0.0, ack_t_s=1.5).at(1.0).op("nemesis", "info", "start", "kill")
    h2.ops.sort(key=lambda op: op["t_us"])
    assert check(h2.read("a", offset=0).ops).recovery_s == [("kill", None)]        # never recovered


def test_writer_and_loader_round_trip(tmp_path):
    """Files of several processes merge by time; a torn last line (a killed recorder) is skipped."""
    w1, w2 = HistoryWriter(str(tmp_path), "p1"), HistoryWriter(str(tmp_path), "c1")
    w1.record("invoke", "send", "x")
    w1.record("ok", "send", "x", queue="b@0", offset=0)
    w2.record("ok", "read", "x", queue="b@0", offset=0)
    w1.close()
    w2.close()
    with open(tmp_path / "p1.jsonl", "a") as f:
        f.write('{"t_us": 1, "proc')
    ops = load(str(tmp_path))
    assert [op["type"] for op in ops] == ["invoke", "ok", "ok"]
    assert check(ops).valid


def test_expired_is_not_lost():
    """Acknowledged sends below the first offset retention kept are counted as expired, not lost;
    one at or above it that is missing is still lost."""
    h = H()
    for i in range(4):
        h.send(f"v{i}", offset=i, t_s=i * 0.1)
    h.op("drain", "info", "expired", "q0", queue="q0", offset=2).read("v3", offset=3)
    v = check(h.ops)
    assert (v.expired, v.lost) == (2, ["v2"])


def _msgid(phy: int, port: int = 10911) -> str:
    from mq.wire.msgid import offset_msg_id
    return offset_msg_id("127.0.0.1", port, phy)


def _acked(h: H, value: str, offset: int, phy: int, queue: str = "q0") -> H:
    h.op("p", "invoke", "send", value)
    return h.op("p", "ok", "send", value, queue=queue, offset=offset, msgid=_msgid(phy))


def test_byte_level_verdicts_fire_only_on_their_histories():
    """damaged_served (a read whose body fails its CRC), offset_reused (two values read at one
    place), wrong_ack (read elsewhere than, or with another msgId than, its acknowledgement said):
    each breaks the promise; a clean byte-level history does not."""
    clean = H()
    for i in range(3):
        _acked(clean, f"v{i}", i, 100 * i)
        clean.op("c", "ok", "read", f"v{i}", queue="q0", offset=i, msgid=_msgid(100 * i), intact=True)
    v = check(clean.ops)
    assert v.valid and not (v.damaged_served or v.offset_reused or v.wrong_ack)

    served = H()
    _acked(served, "v0", 0, 0)
    served.op("c", "ok", "read", "v0", queue="q0", offset=0, msgid=_msgid(0), intact=False)
    assert check(served.ops).damaged_served == ["v0"] and not check(served.ops).valid

    reused = H()
    _acked(reused, "a", 0, 0)
    _acked(reused, "b", 1, 100)
    reused.op("c", "ok", "read", "a", queue="q0", offset=0, msgid=_msgid(0))
    reused.op("c", "ok", "read", "b", queue="q0", offset=0, msgid=_msgid(100))
    v = check(reused.ops)
    assert v.offset_reused == ["q0@0: a b"] and v.wrong_ack == ["b"] and not v.valid

    wrong_id = H()
    _acked(wrong_id, "a", 0, 0)
    wrong_id.op("c", "ok", "read", "a", queue="q0", offset=0, msgid=_msgid(4096))
    v = check(wrong_id.ops)
    assert v.wrong_ack == ["a"] and not v.offset_reused and not v.valid


def test_damaged_and_cut_messages_are_told_from_intact_ones():
    """A damage event excuses its own message (missing, never served) everywhere, and what lay
    after it in the same store's log only where cut_allowed; what lay before it, or in another
    store's log, is lost."""
    h = H()
    for i in range(6):
        _acked(h, f"v{i}", i, 100 * i)
    h.op("nemesis", "info", "damage", "v3", store="127.0.0.1:10911", phy=300, how="flip", at=390)
    for i in (0, 1):                      # v2 before the damage is missing: really lost
        h.op("c", "ok", "read", f"v{i}", queue="q0", offset=i, msgid=_msgid(100 * i))
    v = check(h.ops)
    assert v.damaged == ["v3"] and v.cut == ["v4", "v5"] and v.lost == ["v2", "v4", "v5"] and not v.valid
    v = check(h.ops, cut_allowed=True)
    assert v.damaged == ["v3"] and v.cut == ["v4", "v5"] and v.lost == ["v2"] and not v.valid
    h.op("c", "ok", "read", "v2", queue="q0", offset=2, msgid=_msgid(200))
    assert check(h.ops, cut_allowed=True).valid
    # damage in another store (a slave's) excuses nothing after it in the master's log
    other = H()
    for i in range(3):
        _acked(other, f"v{i}", i, 100 * i)
    other.op("nemesis", "info", "damage", "v1", store="127.0.0.1:10999", phy=0, how="cut", at=10)
    other.op("c", "ok", "read", "v0", queue="q0", offset=0, msgid=_msgid(0))
    v = check(other.ops, cut_allowed=True)
    assert v.damaged == ["v1"] and v.cut == [] and v.lost == ["v2"]


def test_pop_consumer_verdicts_fire_only_on_their_histories():
    """A POP consumer's history (the grpc workload): every acknowledged send delivered, nothing
    consumed that was not sent, nothing delivered again after its ack was answered; what was
    not acked may come again (counted, allowed)."""
    def history(consume=("v0", "v1", "v2"), extra=()):
        h = H()
        for i in range(3):
            h.send(f"v{i}", offset=i, t_s=i * 0.1)
        for i in range(3):
            h.read(f"v{i}", offset=i)
        h.at(1.0)
        h.op("c5", "info", "receive", "v0", attempt=1)          # not acked: comes again, attempt 2
        for value in consume:
            h.op("c5", "info", "receive", value, attempt=2 if value == "v0" else 1)
            h.op("c5", "ok", "consume", value)
        for f, value in extra:
            h.op("c5", "info" if f == "receive" else "ok", f, value, attempt=1)
        return check(h.ops)

    v = history()
    assert v.valid and v.consumer and (v.consumed, v.redelivered) == (3, 1), v.summary()
    assert "consumed" in v.summary() and "consumed" not in check(clean().ops).summary()
    v = history(consume=("v0", "v1"))
    assert not v.valid and v.undelivered == ["v2"]
    v = history(consume=("v0", "v1"), extra=[("receive", "v2")])    # delivered, its ack failed: kept
    assert v.valid and v.consumed == 2
    v = history(extra=[("consume", "ghost")])
    assert not v.valid and v.delivered_unexpected == ["ghost"]
    v = history(extra=[("receive", "v1")])                    # delivered again after its ack
    assert not v.valid and v.redelivered_acked == ["v1"]
