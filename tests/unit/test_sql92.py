"""The SQL92 filter (mq.broker.sql92) against RocketMQ 4.9's grammar and evaluation rules: what a
consumer's `MessageSelector.bySql` expression selects, and the texts it refuses."""
import pytest
from hypothesis import given, strategies as st

from mq.broker.sql92 import EXPRESSION_LEN_MAX, Sql92Error, compile_sql92

PROPS = {"a": "5", "b": "abc", "TAGS": "TagA", "f": "1.5", "x": "true", "neg": "-3"}


@pytest.mark.parametrize("text, expected", [
    ("a > 3", True), ("a > 5", False), ("a >= 5", True), ("a < 6 AND a <= 5", True),
    ("a BETWEEN 0 AND 5", True), ("a NOT BETWEEN 0 AND 4", True), ("a between 6 and 9", False),
    ("b = 'abc'", True), ("b <> 'abc'", False), ("b IN ('x', 'abc')", True), ("b NOT IN ('abc')", False),
    ("missing IS NULL", True), ("a IS NOT NULL", True), ("missing IS NOT NULL", False),
    ("TAGS = 'TagA'", True),
    # a comparison with a missing property is unknown: neither it nor its negation selects
    ("missing = 1", False), ("NOT missing = 1", False), ("missing <> 1", False),
    ("missing = 1 OR a = 5", True), ("missing = 1 AND a = 5", False), ("NOT (missing = 1 AND a = 6)", True),
    # strings compared with numbers are converted to the number's type; one that is not a number fails
    ("b > 3", False), ("f > 1.2", True), ("f > 1", False), ("a = 5.0", True), ("neg < -2", True),
    ("x = TRUE", True), ("x = FALSE", False), ("b > 3 OR a = 5", False),
    ("(a > 3 AND TAGS = 'TagA') OR b IS NULL", True), ("a > -1", True), ("TRUE", True), ("NOT FALSE", True),
    ("a = 5 and B = 1", False), ("A = 5", False),  # property names are case-sensitive, keywords not
    ("b = 'it''s'", False), ("a = 5 -- a comment\n", True), ("a=5", True), ("a = 5L", True),
])
def test_selects_as_rocketmq(text, expected):
    assert compile_sql92(text).matches(PROPS) is expected


@pytest.mark.parametrize("text", ["", "   ", "a >", "a IN (1)", "a = ", "(a = 1", "a = 1 1", "a ~ 1",
                                  "a BETWEEN 1", "a NOT 1", "IS NULL", "a = 99999999999999999999",
                                  "x" * (EXPRESSION_LEN_MAX + 1), "(" * 100 + "a = 1" + ")" * 100])
def test_refuses_what_is_not_rocketmq_sql92(text):
    with pytest.raises(Sql92Error):
        compile_sql92(text)


@given(st.integers(-10**6, 10**6), st.integers(-10**6, 10**6), st.integers(-10**6, 10**6))
def test_numeric_comparisons_agree_with_arithmetic(a, lo, hi):
    props = {"a": str(a)}
    assert compile_sql92(f"a > {lo}").matches(props) is (a > lo)
    assert compile_sql92(f"a BETWEEN {min(lo, hi)} AND {max(lo, hi)}").matches(props) is (min(lo, hi) <= a <= max(lo, hi))
    assert compile_sql92(f"a IN ('{a}', 'z')").matches(props)


_name = st.sampled_from(["a", "b", "region", "ab", "TAGS"])
_value = st.text(alphabet=st.sampled_from(list("ab01e-u.\x01")), max_size=6)


@given(st.lists(st.tuples(_name, _value), max_size=6), st.sampled_from(
    ["a = 'x'", "region = 'eu'", "a IS NULL", "b > 0", "ab IN ('a', '1') OR a = 'a'", "region IS NOT NULL AND a <> '0'"]))
def test_reading_the_raw_properties_agrees_with_decoding_them(pairs, text):
    """The pull path's matches_raw reads only the names the filter uses from the stored bytes; it
    selects exactly what matches() does on the fully decoded properties (Java's rules: a pair is
    split at its first 0x01, a repeated name keeps its last value)."""
    from mq.wire.properties import decode_properties
    raw = b"\x02".join(f"{k}\x01{v}".encode() for k, v in pairs)
    f = compile_sql92(text)
    assert f.matches_raw(raw) is f.matches(decode_properties(raw))


@pytest.mark.parametrize("text, props, expected", [
    # RocketMQ's LogicExpression: the right side is evaluated only when the left does not decide,
    # so a right side that cannot be evaluated (a string that is not a number) does not matter then
    ("r = 'eu' OR p > 10", {"r": "eu", "p": "n/a"}, True),
    ("NOT (r = 'us' AND p > 10)", {"r": "eu", "p": "n/a"}, True),
    ("r = 'us' OR p > 10", {"r": "eu", "p": "n/a"}, False),
    ("p > 10 OR r = 'eu'", {"r": "eu", "p": "n/a"}, False),          # the left side fails first
    ("p BETWEEN 20 AND 10", {"p": "15"}, False),
])
def test_and_or_decide_from_the_left(text, props, expected):
    assert compile_sql92(text).matches(props) is expected


def test_operator_count_is_bounded_and_long_chains_evaluate():
    """Chains build nested closures: OPERATORS_MAX bounds their depth (no RecursionError on a
    pull); a chain at the bound evaluates."""
    from mq.broker.sql92 import OPERATORS_MAX
    at_bound = " OR ".join(["a = 'x'"] * (OPERATORS_MAX // 2 - 1))
    assert compile_sql92(at_bound + " OR a = 'y'").matches({"a": "y"}) is True
    with pytest.raises(Sql92Error):
        compile_sql92("a" + " = a" * (OPERATORS_MAX + 1))


@pytest.mark.parametrize("text, props, expected", [
    ("TRUE = a > 5", {"a": "7"}, True),            # = binds more loosely than > (RocketMQ's grammar)
    ("a > 5 = TRUE", {"a": "7"}, True),
    ("a IS NULL = TRUE", {}, True),
    ("x = y", {}, True),                            # two missing properties are equal
    ("x = y", {"x": "1"}, False),
    ("-b IS NULL", {"b": "abc"}, True),            # negating a string is NULL, not a failure
])
def test_precedence_and_nulls_as_rocketmq(text, props, expected):
    assert compile_sql92(text).matches(props) is expected
