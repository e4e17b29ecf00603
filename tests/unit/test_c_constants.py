"""The constants Python declares equal the C core's, name by name (STYLE.md, habits 3 and 14).

Byte layouts are declared in mq/wire (construct) and again, for the hot paths, in csrc/*.h; the
control block's positions, futex words and queue fields in csrc/ctl.h and mq/store/control.py;
the error codes in csrc/mqbase.h and their exceptions in mq/store/native.py.  Each pair is
compared here, so changing one side alone fails: the Python values are literals (or construct
sizes) in mq/wire, the C values come from the compiled module (lib.*, whose cdef
csrc/build_ffi.py derives from the headers).  Families that both sides enumerate (MQ_POS_*,
MQ_SEQ_*, MQ_Q_*, MQ_E_*, MQ_SCAN_*, the record's field positions) are compared whole, so a
member added on one side only fails too.  The last test reads the headers' text: every public
#define and enum member must reach Python with the value the header gives."""
from __future__ import annotations

import os
import re

import pytest

from mq.store import commitlog as store_cl
from mq.store import consumequeue as store_cq
from mq.store import control
from mq.store import native
from mq.store.native import ffi, lib
from mq.wire import batch as wbatch
from mq.wire import commitlog as wcl
from mq.wire import consumequeue as wcq
from mq.wire import dledger as wdl
from mq.wire import ha as wha
from mq.wire import index as windex
from mq.wire import msgid as wmsgid
from mq.wire import properties as wprops

CSRC = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "csrc")

# (what Python declares, its value, the C name)
PAIRS = [
    # the CommitLog record (mq.wire.commitlog; csrc/mqbase.h)
    ("wire.commitlog.MESSAGE_MAGIC_CODE", wcl.MESSAGE_MAGIC_CODE, "MQ_MESSAGE_MAGIC"),
    ("wire.commitlog.BLANK_MAGIC_CODE", wcl.BLANK_MAGIC_CODE, "MQ_BLANK_MAGIC"),
    ("wire.commitlog.END_FILE_MIN_BLANK_LENGTH", wcl.END_FILE_MIN_BLANK_LENGTH, "MQ_BLANK_LEN_MIN"),
    ("wire.commitlog.BlankRecord size", wcl.BlankRecord.sizeof(), "MQ_BLANK_LEN_MIN"),
    ("wire.commitlog.TOPIC_SIZE_MAX", wcl.TOPIC_SIZE_MAX, "MQ_TOPIC_LEN_MAX"),
    ("wire.commitlog.RECORD_SIZE_MIN", wcl.RECORD_SIZE_MIN, "MQ_RECORD_SIZE_MIN"),
    ("wire.commitlog._RECORD_FIXED_SIZE_NO_HOSTS", wcl._RECORD_FIXED_SIZE_NO_HOSTS, "MQ_RECORD_FIXED_NO_HOSTS"),
    ("wire.commitlog.TRANSACTION_MASK", wcl.TRANSACTION_MASK, "MQ_SYSFLAG_TX_MASK"),
    ("wire.commitlog.TRANSACTION_PREPARED", wcl.TRANSACTION_PREPARED, "MQ_SYSFLAG_TX_PREPARED"),
    ("wire.commitlog.TRANSACTION_ROLLBACK", wcl.TRANSACTION_ROLLBACK, "MQ_SYSFLAG_TX_ROLLBACK"),
    ("wire.commitlog.BORNHOST_V6", wcl.BORNHOST_V6, "MQ_SYSFLAG_BORNHOST_V6"),
    ("wire.commitlog.STOREHOST_V6", wcl.STOREHOST_V6, "MQ_SYSFLAG_STOREHOST_V6"),
    ("wire.properties.PROPERTIES_SIZE_MAX", wprops.PROPERTIES_SIZE_MAX, "MQ_PROPS_LEN_MAX"),
    ("wire.msgid.MSG_ID_V4_LENGTH", wmsgid.MSG_ID_V4_LENGTH, "MQ_MSG_ID_V4_LEN"),
    ("wire.msgid.MSG_ID_V6_LENGTH", wmsgid.MSG_ID_V6_LENGTH, "MQ_MSG_ID_V6_LEN"),
    # a SEND_BATCH_MESSAGE body (mq.wire.batch; csrc/commitlog.h)
    ("wire.batch.BATCH_RECORD_SIZE_MIN", wbatch.BATCH_RECORD_SIZE_MIN, "MQ_BATCH_RECORD_SIZE_MIN"),
    ("store.commitlog.BATCH_MSGS_MAX", store_cl.BATCH_MSGS_MAX, "MQ_BATCH_MSGS_MAX"),
    # ConsumeQueue entry (mq.wire.consumequeue, mq.store.consumequeue; csrc/dispatch.h)
    ("wire.consumequeue.CQ_ENTRY_SIZE", wcq.CQ_ENTRY_SIZE, "MQ_CQ_ENTRY_SIZE"),
    ("wire.consumequeue.ConsumeQueueEntry size", wcq.ConsumeQueueEntry.sizeof(), "MQ_CQ_ENTRY_SIZE"),
    ("store.consumequeue.ENTRY_SIZE", store_cq.ENTRY_SIZE, "MQ_CQ_ENTRY_SIZE"),
    # message index file (mq.wire.index; csrc/index.h)
    ("wire.index.INDEX_HEADER_SIZE", windex.INDEX_HEADER_SIZE, "MQ_INDEX_HEADER"),
    ("wire.index.IndexHeader size", windex.IndexHeader.sizeof(), "MQ_INDEX_HEADER"),
    ("wire.index.INDEX_SLOT_SIZE", windex.INDEX_SLOT_SIZE, "MQ_INDEX_SLOT"),
    ("wire.index.INDEX_ENTRY_SIZE", windex.INDEX_ENTRY_SIZE, "MQ_INDEX_UNIT"),
    ("wire.index.IndexEntry size", windex.IndexEntry.sizeof(), "MQ_INDEX_UNIT"),
    ("wire.index.INDEX_COUNT_OFFSET", windex.INDEX_COUNT_OFFSET, "MQ_INDEX_COUNT_OFFSET"),
    # HA frame (mq.wire.ha; csrc/ha.h)
    ("wire.ha.HA_FRAME_HEADER_SIZE", wha.HA_FRAME_HEADER_SIZE, "MQ_HA_FRAME_HEADER"),
    ("wire.ha.HaFrameHeader size", wha.HaFrameHeader.sizeof(), "MQ_HA_FRAME_HEADER"),
    # DLedger entries and index units (mq.wire.dledger; csrc/dledger.h)
    ("wire.dledger.ENTRY_MAGIC", wdl.ENTRY_MAGIC, "MQ_DL_MAGIC"),
    ("wire.dledger.BLANK_MAGIC (as uint32)", wdl.BLANK_MAGIC & 0xFFFFFFFF, "MQ_DL_BLANK_MAGIC"),
    ("wire.dledger.MIN_BLANK_SIZE", wdl.MIN_BLANK_SIZE, "MQ_DL_BLANK_LEN_MIN"),
    ("wire.dledger.Filler size", wdl.Filler.sizeof(), "MQ_DL_BLANK_LEN_MIN"),
    ("wire.dledger.ENTRY_HEADER_SIZE", wdl.ENTRY_HEADER_SIZE, "MQ_DL_HEADER_SIZE"),
    ("wire.dledger.EntryHeader size", wdl.EntryHeader.sizeof(), "MQ_DL_HEADER_SIZE"),
    ("store.commitlog.DL_HEADER_SIZE", store_cl.DL_HEADER_SIZE, "MQ_DL_HEADER_SIZE"),
    ("wire.dledger.INDEX_UNIT_SIZE", wdl.INDEX_UNIT_SIZE, "MQ_DL_INDEX_UNIT"),
    ("wire.dledger.IndexUnit size", wdl.IndexUnit.sizeof(), "MQ_DL_INDEX_UNIT"),
]


@pytest.mark.parametrize("what, value, c_name", PAIRS, ids=[p[0] for p in PAIRS])
def test_wire_constant_equals_c(what, value, c_name):
    """A layout constant mq.wire or mq.store declares is the C core's."""
    assert getattr(lib, c_name) == value, f"{what} = {value}, C {c_name} = {getattr(lib, c_name)}"


def _c_family(prefix: str) -> dict[str, int]:
    """lib's constants named prefix + X (X not ending in '_', the enums' COUNT_), by X."""
    return {n[len(prefix):]: getattr(lib, n) for n in dir(lib) if n.startswith(prefix) and not n.endswith("_")}


def _py_family(module, prefix: str) -> dict[str, int]:
    return {n[len(prefix):]: getattr(module, n) for n in dir(module)
            if n.startswith(prefix) and isinstance(getattr(module, n), int)}


def test_record_field_positions():
    """Every field position of a record mq.wire.commitlog declares (POS_*) is the C core's
    MQ_REC_POS_* of the same name and value, and neither side has one the other lacks."""
    assert _py_family(wcl, "POS_") == _c_family("MQ_REC_POS_")


@pytest.mark.parametrize("py_prefix, c_prefix, count", [("POS_", "MQ_POS_", "MQ_POS_COUNT_"),
                                                          ("SEQ_", "MQ_SEQ_", "MQ_SEQ_COUNT_"),
                                                          ("Q_", "MQ_Q_", "MQ_Q_COUNT_")])
def test_control_block_names(py_prefix, c_prefix, count):
    """mq.store.control declares every position, futex word and queue field of the control
    block (csrc/ctl.h) under the same name and index, and nothing else with that prefix; the C
    enum is dense (its COUNT_ is its size)."""
    py, c = _py_family(control, py_prefix), _c_family(c_prefix)
    assert py == c
    assert sorted(c.values()) == list(range(getattr(lib, count)))


def test_stats_are_dense():
    assert sorted(_c_family("MQ_STAT_").values()) == list(range(lib.MQ_STAT_COUNT_))


def test_every_error_code_has_one_exception_class():
    """mq.store.native maps every MQ_E_* of csrc/mqbase.h to exactly one exception class, whose
    `code` is that value, and check() raises it; the codes are negative and distinct, MQ_OK is 0,
    and check() passes 0 and counts through."""
    codes = {n: getattr(lib, n) for n in dir(lib) if n.startswith("MQ_E_")}
    assert lib.MQ_OK == 0
    assert all(v < 0 for v in codes.values()) and len(set(codes.values())) == len(codes), codes
    assert set(native._BY_CODE) == set(codes.values()), "a code without an exception class, or the reverse"
    classes = list(native._BY_CODE.values())
    assert len(set(classes)) == len(classes), "two codes share a class"
    for name, code in codes.items():
        cls = native._BY_CODE[code]
        assert cls.code == code, (name, cls)
        assert cls.__name__ in native.__all__, cls
        with pytest.raises(cls):
            native.check(code, name)
    assert native.check(0) == 0 and native.check(7) == 7
    # the classes callers catch: store errors are StoreErrors, a refused argument a ValueError
    assert issubclass(native.InvalidArgument, ValueError) and not issubclass(native.InvalidArgument, native.StoreError)
    assert all(issubclass(c, native.StoreError) for c in classes if c is not native.InvalidArgument)


def test_scan_stops_are_named():
    """mq.store.commitlog names every stop of a scan (csrc/commitlog.h, enum mq_scan_stop)."""
    assert set(store_cl.SCAN_STOP_NAMES) == set(_c_family("MQ_SCAN_").values())
    assert set(store_cl.SCAN_CLEAN_STOPS) == {lib.MQ_SCAN_LIMIT, lib.MQ_SCAN_FULL, lib.MQ_SCAN_END}


def test_struct_sizes():
    """The msgId field holds the v4 msgId and its NUL; offsets cross as uint64."""
    msg_id = dict(ffi.typeof("mq_append_out").fields)["msg_id"].type
    assert msg_id.length == lib.MQ_MSG_ID_V4_LEN + 1
    assert ffi.sizeof(dict(ffi.typeof("mq_scan_rec").fields)["phy_offset"].type) == 8


def _header_constants() -> dict[str, tuple[str, str]]:
    """Every `#define MQ_X value` and every `MQ_X = value` / `MQ_X,` enum member of the public
    headers (all of csrc/*.h but internal.h), by name: (header, value text; '' for an implicit
    enum value)."""
    out = {}
    for name in sorted(os.listdir(CSRC)):
        if not name.endswith(".h") or name == "internal.h":
            continue
        with open(os.path.join(CSRC, name), encoding="utf-8") as f:
            text = re.sub(r"/\*.*?\*/", "", f.read(), flags=re.S)
        for m in re.finditer(r"^#define[ \t]+(MQ_\w+)[ \t]+(\S+)", text, re.M):
            out[m.group(1)] = (name, m.group(2))
        for body in re.findall(r"enum\s+\w+\s*\{(.*?)\}", text, re.S):
            for m in re.finditer(r"(MQ_\w+)\s*(?:=\s*([^,}\s]+))?", body):
                out[m.group(1)] = (name, m.group(2) or "")
    return out


def test_every_public_header_constant_reaches_python():
    """Each public #define and enum member of csrc/*.h is in the compiled module, with the value
    its header writes (C integer literals: 0x...u, negatives), so a constant the cdef dropped, or a
    stale build, cannot pass the comparisons above unnoticed."""
    found = _header_constants()
    assert len(found) > 100, found
    for name, (header, text) in found.items():
        assert hasattr(lib, name), f"{name} ({header}) is not in mq._mqstore: rebuild, or build_ffi.py dropped it"
        if text:
            value = int(text.rstrip("uUlL"), 0)
            assert getattr(lib, name) == value, f"{name} ({header}) = {text}, module has {getattr(lib, name)}"
