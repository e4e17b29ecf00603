"""SQL92 message filters (RocketMQ's `MessageSelector.bySql`, enablePropertyFilter): the grammar of
RocketMQ 4.9's filter module (SelectorParser.jj, taken from ActiveMQ) and its evaluation rules,
compiled here into Python closures evaluated against a message's properties.

Grammar (keywords and identifiers case-insensitive):
    expr       := and_expr (OR and_expr)*
    and_expr   := eq_expr (AND eq_expr)*
    eq_expr    := cmp_expr ( (= | <>) cmp_expr | IS [NOT] NULL )*
    cmp_expr   := unary ( (> | >= | < | <=) unary
                        | [NOT] BETWEEN unary AND unary
                        | [NOT] IN ( 'string' [, 'string']* ) )*
    unary      := + unary | - unary | NOT unary | primary
    primary    := TRUE | FALSE | NULL | integer [L] | decimal | 'string' ('' for a quote)
                | identifier ([a-zA-Z_$][a-zA-Z0-9_$]*, a property) | ( expr )
Evaluation (ComparisonExpression with CONVERT_STRING_EXPRESSIONS, as the broker runs it):
  * a property is its string value, or NULL when the message does not have it;
  * comparing a string with a number converts the string to the number's type (an integer for
    an integer literal, a double for a decimal one), with a boolean to a boolean; a string that
    does not convert makes the whole filter fail for that message (not delivered), as RocketMQ's
    exception does; > >= < <= between two strings compare them as doubles, or fail likewise;
  * three-valued logic: a comparison with NULL is unknown (but NULL = NULL, two missing
    properties compared, is TRUE, as ActiveMQ's equality has it; negating what is not a number
    is NULL), NOT unknown is unknown, AND/OR as SQL,
    and as RocketMQ's LogicExpression evaluated left first, the right side only when the left
    does not decide (so a failing right side does not matter then); a message is delivered only
    when the filter is TRUE.
`compile_sql92(text)` raises Sql92Error (with the position) for text outside the grammar."""
from __future__ import annotations

import re
from typing import Callable

__all__ = ["Sql92Error", "Sql92Filter", "compile_sql92", "EXPRESSION_LEN_MAX"]

EXPRESSION_LEN_MAX = 4096      # longer filters are refused (a subscription rides in every heartbeat)
DEPTH_MAX = 64                 # nesting of parentheses and unary operators
OPERATORS_MAX = 256            # operators in one filter: its evaluation nests this deep (Python's stack)

_TOKEN = re.compile(r"""
    (?P<ws>\s+|--[^\n\r]*)
  | (?P<float>(?:\d+\.\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+))
  | (?P<int>(?:0|[1-9]\d*)[lL]?)
  | (?P<str>'(?:''|[^'])*')
  | (?P<id>[A-Za-z_$][A-Za-z0-9_$]*)
  | (?P<op><>|>=|<=|=|>|<|\(|\)|,|\+|-)
""", re.VERBOSE)
_KEYWORDS = {"NOT", "AND", "OR", "BETWEEN", "IN", "TRUE", "FALSE", "NULL", "IS"}
LONG_MIN, LONG_MAX = -(1 << 63), (1 << 63) - 1


class Sql92Error(ValueError):
    """The filter text is not RocketMQ SQL92."""


class _Fail(Exception):
    """Evaluation failed for this message (a string that is not a number): not delivered."""


Expr = Callable[[dict], object]        # properties -> True / False / None (unknown) / a value


def _tokens(text: str) -> list[tuple[str, object, int]]:
    out, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise Sql92Error(f"unexpected character {text[pos]!r} at {pos}")
        kind, value = m.lastgroup, m.group()
        if kind == "float":
            out.append(("lit", float(value), pos))
        elif kind == "int":
            n = int(value.rstrip("lL"))
            if n > LONG_MAX:
                raise Sql92Error(f"integer {value} at {pos} is out of range")
            out.append(("lit", n, pos))
        elif kind == "str":
            out.append(("lit", value[1:-1].replace("''", "'"), pos))
        elif kind == "id":
            word = value.upper()
            out.append(("kw", word, pos) if word in _KEYWORDS else ("id", value, pos))
        elif kind == "op":
            out.append(("op", value, pos))
        pos = m.end()
    out.append(("end", None, len(text)))
    return out


# ---- evaluation rules ---------------------------------------------------------------------------------
def _num_of(s: str, like):
    """A property string as the type of `like` (Long.valueOf / Double.valueOf / Boolean.valueOf)."""
    try:
        if like.__class__ is bool:
            return s.lower() == "true"
        if like.__class__ is int:
            n = int(s) if s.strip() == s and s[:1] not in ("_",) and "_" not in s else None
            if n is None or not LONG_MIN <= n <= LONG_MAX:
                raise ValueError(s)
            return n
        v = float(s)
        return v
    except ValueError:
        raise _Fail(f"{s!r} is not a {like.__class__.__name__}") from None


def _coerced(lv, rv):
    """The two values made comparable as __compare does, or _Fail; None when they never compare."""
    lc, rc = lv.__class__, rv.__class__
    if lc is rc:
        return lv, rv
    if lc is str:
        return _num_of(lv, rv), rv
    if rc is str:
        return lv, _num_of(rv, lv)
    if lc is bool or rc is bool:
        return None                          # a boolean and a number: unequal, unordered
    return float(lv), float(rv)              # int and float


def _equal(lv, rv):
    if lv is None or rv is None:
        if lv is None and rv is None:
            return True
        return None if lv is None else False
    if lv.__class__ is rv.__class__:
        return lv == rv
    pair = _coerced(lv, rv)
    return False if pair is None else pair[0] == pair[1]


def _order(lv, rv, op: str):
    if lv is None or rv is None:
        return None
    if lv.__class__ is str and rv.__class__ is str:
        try:
            lv, rv = float(lv), float(rv)
        except ValueError:
            raise _Fail(f"it is illegal to compare strings by {op}: {lv!r}, {rv!r}") from None
    else:
        pair = _coerced(lv, rv)
        if pair is None or pair[0].__class__ is bool:
            return False
        lv, rv = pair
    return {">": lv > rv, ">=": lv >= rv, "<": lv < rv, "<=": lv <= rv}[op]


def _and(left: Expr, right: Expr) -> Expr:
    def both(p):
        a = _truth(left(p))
        if a is False:
            return False
        b = _truth(right(p))
        if b is False:
            return False
        return None if a is None or b is None else True
    return both


def _or(left: Expr, right: Expr) -> Expr:
    def either(p):
        a = _truth(left(p))
        if a is True:
            return True
        b = _truth(right(p))
        if b is True:
            return True
        return None if a is None or b is None else False
    return either


def _not(a):
    return None if a is None else not a


def _truth(v):
    """asBooleanExpression: a value that is not a boolean counts as FALSE (a property's string)."""
    return v if v is None or v.__class__ is bool else False


# ---- the parser -----------------------------------------------------------------------------------------
class _Parser:
    def __init__(self, text: str):
        self.toks = _tokens(text)
        self.i = 0
        self.depth = 0
        self.names: set[str] = set()           # the properties the expression reads
        self.operators = 0

    def peek(self, kind: str, value=None) -> bool:
        k, v, _ = self.toks[self.i]
        return k == kind and (value is None or v == value)

    def take(self, kind: str, value=None):
        k, v, pos = self.toks[self.i]
        if k != kind or (value is not None and v != value):
            want = value or kind
            got = "the end" if k == "end" else repr(v)
            raise Sql92Error(f"expected {want} at {pos}, found {got}")
        self.i += 1
        return v

    def _operator(self):
        self.operators += 1
        if self.operators > OPERATORS_MAX:
            raise Sql92Error(f"more than {OPERATORS_MAX} operators")

    def _deeper(self):
        self.depth += 1
        if self.depth > DEPTH_MAX:
            raise Sql92Error(f"nested deeper than {DEPTH_MAX}")

    def parse(self) -> Expr:
        e = self.or_expr()
        self.take("end")
        return e

    def or_expr(self) -> Expr:
        left = self.and_expr()
        while self.peek("kw", "OR"):
            self.i += 1
            right = self.and_expr()
            self._operator()
            left = _or(left, right)
        return left

    def and_expr(self) -> Expr:
        left = self.eq_expr()
        while self.peek("kw", "AND"):
            self.i += 1
            right = self.eq_expr()
            self._operator()
            left = _and(left, right)
        return left

    def eq_expr(self) -> Expr:
        """Equality binds more loosely than the comparisons (RocketMQ's equalityExpression)."""
        left = self.cmp_expr()
        while True:
            k, v, _ = self.toks[self.i]
            if k == "op" and v in ("=", "<>"):
                self.i += 1
                self._operator()
                right = self.cmp_expr()
                eq = (lambda a, b: lambda p: _equal(a(p), b(p)))(left, right)
                left = eq if v == "=" else (lambda e: lambda p: _not(e(p)))(eq)
            elif k == "kw" and v == "IS":
                self.i += 1
                self._operator()
                negate = self.peek("kw", "NOT")
                if negate:
                    self.i += 1
                self.take("kw", "NULL")
                left = (lambda a, n: lambda p: (a(p) is None) != n)(left, negate)
            else:
                return left

    def cmp_expr(self) -> Expr:
        left = self.unary()
        while True:
            k, v, _ = self.toks[self.i]
            if k == "op" and v in (">", ">=", "<", "<="):
                self.i += 1
                self._operator()
                right = self.unary()
                left = (lambda a, b, op: lambda p: _order(a(p), b(p), op))(left, right, v)
            elif k == "kw" and v in ("BETWEEN", "NOT", "IN"):
                negate = v == "NOT"
                if negate:
                    nk, nv, npos = self.toks[self.i + 1]
                    if not (nk == "kw" and nv in ("BETWEEN", "IN")):
                        raise Sql92Error(f"expected BETWEEN or IN after NOT at {npos}")
                    self.i += 1
                    v = nv
                self.i += 1
                self._operator()
                if v == "BETWEEN":
                    low = self.unary()
                    self.take("kw", "AND")
                    high = self.unary()
                    inside = _and((lambda a, lo: lambda p: _order(a(p), lo(p), ">="))(left, low),
                                  (lambda a, hi: lambda p: _order(a(p), hi(p), "<="))(left, high))
                    left = (lambda e: lambda p: _not(e(p)))(inside) if negate else inside
                else:
                    left = self._in_list(left, negate)
            else:
                return left

    def _in_list(self, left: Expr, negate: bool) -> Expr:
        self.take("op", "(")
        values = set()
        while True:
            k, v, pos = self.toks[self.i]
            if k != "lit" or v.__class__ is not str:
                raise Sql92Error(f"IN takes string literals only (at {pos})")
            values.add(v)
            self.i += 1
            if self.peek("op", ","):
                self.i += 1
                continue
            self.take("op", ")")
            break
        frozen = frozenset(values)

        def test(p, a=left, vs=frozen, n=negate):
            v = a(p)
            if v is None or v.__class__ is not str:
                return None
            return (v in vs) != n
        return test

    def unary(self) -> Expr:
        k, v, pos = self.toks[self.i]
        if k == "op" and v in ("+", "-"):
            self.i += 1
            self._deeper()
            inner = self.unary()
            self.depth -= 1
            if v == "+":
                return inner

            def negate(p, a=inner):
                x = a(p)
                if x is None:
                    return None
                if x.__class__ in (int, float):
                    return -x
                return None                         # UnaryExpression.createNegate: not a number -> NULL
            return negate
        if k == "kw" and v == "NOT":
            self.i += 1
            self._deeper()
            inner = self.unary()
            self.depth -= 1
            return lambda p, a=inner: _not(_truth(a(p)))
        return self.primary()

    def primary(self) -> Expr:
        k, v, pos = self.toks[self.i]
        self.i += 1
        if k == "lit":
            return lambda p, c=v: c
        if k == "kw" and v in ("TRUE", "FALSE"):
            return (lambda p: True) if v == "TRUE" else (lambda p: False)
        if k == "kw" and v == "NULL":
            return lambda p: None
        if k == "id":
            self.names.add(v)
            return lambda p, name=v: p.get(name)
        if k == "op" and v == "(":
            self._deeper()
            e = self.or_expr()
            self.depth -= 1
            self.take("op", ")")
            return e
        raise Sql92Error(f"unexpected {'the end' if k == 'end' else repr(v)} at {pos}")


class Sql92Filter:
    """A compiled filter: matches(properties) is True only when the expression is TRUE for them;
    matches_raw(stored properties bytes) the same, reading only the properties the expression names
    (the pull path's: a message's whole properties are not decoded for a filter that names one)."""
    __slots__ = ("text", "_expr", "_names")

    def __init__(self, text: str, expr: Expr, names: frozenset[str]):
        self.text = text
        self._expr = expr
        self._names = tuple((n, n.encode() + b"\x01") for n in sorted(names))

    def matches(self, properties: dict) -> bool:
        try:
            return self._expr(properties) is True
        except (_Fail, RecursionError):          # RecursionError: OPERATORS_MAX keeps it away; never a crash
            return False

    @property
    def property_names(self) -> tuple[str, ...]:
        """The properties the expression reads, sorted: matches() needs no others."""
        return tuple(name for name, _ in self._names)

    def matches_raw(self, raw: bytes) -> bool:
        """matches() of the properties `raw` encodes (name 0x01 value 0x02 ...; a name given twice
        counts with its last value, as Java's decoding keeps the last)."""
        props = {}
        for name, key in self._names:
            limit = len(raw)
            while True:
                at = raw.rfind(key, 0, limit)
                if at < 0:
                    break
                limit = at + len(key) - 1               # next: an occurrence starting before this one
                if at > 0 and raw[at - 1] != 2:         # inside a value or a longer name
                    continue
                start = at + len(key)
                end = raw.find(b"\x02", start)
                value = raw[start:end if end >= 0 else len(raw)]
                if value:                               # an empty value is no property (Java's decoding)
                    props[name] = value.decode("utf-8", "replace")
                    break
        return self.matches(props)

    def __repr__(self) -> str:
        return f"Sql92Filter({self.text!r})"


def compile_sql92(text: str | None) -> Sql92Filter:
    if text is None or not text.strip():
        raise Sql92Error("the expression is empty")
    if len(text) > EXPRESSION_LEN_MAX:
        raise Sql92Error(f"the expression is longer than {EXPRESSION_LEN_MAX} characters")
    parser = _Parser(text)
    expr = parser.parse()
    return Sql92Filter(text, expr, frozenset(parser.names))
