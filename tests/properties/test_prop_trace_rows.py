"""The perf trace's rows formatted in C (csrc/tracefmt.c, mq_format_rows, through
mq.broker.tracing.RowTraceWriter) read back as the values they were given.

What it proves: for any rows of int64 values, each field of any kind (int, thousandths, a
response code; negative, zero, the int64 edges), the text is one JSON line per row that json
reads back as {kind, constants..., field: value}: ints exactly, thousandths as float(f"{v}e-3"),
codes as their decimal string or "" when negative.  mq_fmt_i64 (csrc/internal.h), which the
send answers use for offsets too, is what writes every digit here."""
from __future__ import annotations

import json

from hypothesis import given, strategies as st

from mq.broker.tracing import RowTraceWriter
from mq.store.native import ffi
from mq.trace import FIELDS
from tests.properties.propkit import bounded

I64 = st.one_of(st.integers(-(1 << 63), (1 << 63) - 1),
                st.sampled_from([0, -1, 9, 10, 99, 100, -(1 << 63), (1 << 63) - 1, 10 ** 18, 10 ** 18 - 1]))
# one field of each kind the req row has (mq.broker.tracing.REQ_ROW), in a drawn order
KIND_FIELDS = {"int": "msgs", "float": "total_us", "str": "status"}
assert all(FIELDS[name] == kind for kind, name in KIND_FIELDS.items())


def expected(name: str, v: int):
    kind = FIELDS[name]
    if kind == "int":
        return v
    if kind == "float":
        return float(f"{v}e-3")
    return str(v) if v >= 0 else ""


@bounded(200)
@given(order=st.permutations(list(KIND_FIELDS.values())), data=st.data())
def test_rows_read_back_as_the_values_given(tmp_path_factory, order, data):
    rows = data.draw(st.lists(st.tuples(*(I64 for _ in order)), min_size=1, max_size=20))
    writer = RowTraceWriter(str(tmp_path_factory.mktemp("trace")), "req-prop", "req",
                            {"broker": "127.0.0.1:10911", "role": "io-0"}, tuple(order))
    try:
        flat = ffi.new("int64_t[]", [v for row in rows for v in row])
        lines = writer._text(flat, len(rows)).decode().splitlines()
    finally:
        writer.close()
    assert len(lines) == len(rows)
    for line, row in zip(lines, rows):
        assert json.loads(line) == {"kind": "req", "broker": "127.0.0.1:10911", "role": "io-0",
                                    **{name: expected(name, v) for name, v in zip(order, row)}}, line
