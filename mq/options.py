"""Config options and Java properties files: the machinery every config table of ours uses
(the store's and broker's in mq.store.config and mq.broker.config, the name server's in
mq.namesrv.config): an Option is a key's name, type, default, doc and check, declared once, and
the parser reads RocketMQ's .properties files as Java's Properties.load does.  Nothing here
loads the store or its C core: clients and the name server use it too."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Option:
    name: str
    kind: type | tuple           # int, float, bool, str, or a tuple of allowed strings
    default: Any
    doc: str
    check: Callable[[Any], bool] | None = None
    check_doc: str = ""

    def parse(self, raw: Any) -> Any:
        """Parses a config value (string from a properties file, or a Python value)."""
        if isinstance(self.kind, tuple):
            value = str(raw).strip()
            if value not in self.kind:
                raise ValueError(f"{self.name}={raw!r}: must be one of {', '.join(self.kind)}")
            return value
        if self.kind is bool:
            if isinstance(raw, bool):
                return raw
            s = str(raw).strip().lower()
            if s not in ("true", "false"):
                raise ValueError(f"{self.name}={raw!r}: must be true or false")
            return s == "true"
        if self.kind is int:
            try:
                value = int(str(raw).strip())
            except ValueError:
                raise ValueError(f"{self.name}={raw!r}: must be an integer") from None
        elif self.kind is float:
            try:
                value = float(str(raw).strip())
            except ValueError:
                raise ValueError(f"{self.name}={raw!r}: must be a number") from None
        else:
            value = str(raw).strip()
        if self.check and not self.check(value):
            raise ValueError(f"{self.name}={raw!r}: {self.check_doc}")
        return value


def _positive(v): return v > 0
def _non_negative(v): return v >= 0
def _fraction(v): return 0.0 < v <= 1.0


def parse_properties(text: str) -> dict[str, str]:
    """Java .properties text -> dict: '#'/'!' comments, 'k=v', 'k: v' or 'k v',
    backslash line continuations and the usual escapes (\\t \\n \\uXXXX).  Later
    keys win, as in java.util.Properties."""
    out: dict[str, str] = {}
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i].lstrip()
        i += 1
        if not line or line[0] in "#!":
            continue
        # join continuation lines: an odd number of trailing backslashes
        while _continues(line) and i < len(lines):
            line = line[:-1] + lines[i].lstrip()
            i += 1
        if _continues(line):
            line = line[:-1]
        key, value = _split_entry(line)
        out[_unescape(key)] = _unescape(value)
    return out


def _continues(line: str) -> bool:
    n = len(line) - len(line.rstrip("\\"))
    return n % 2 == 1


def _split_entry(line: str) -> tuple[str, str]:
    j = 0
    while j < len(line):
        c = line[j]
        if c == "\\":
            j += 2
            continue
        if c in "=: \t\f":
            break
        j += 1
    key, k = line[:j], j
    if k < len(line) and line[k] in " \t\f":
        while k < len(line) and line[k] in " \t\f":
            k += 1
        if k < len(line) and line[k] in "=:":
            k += 1
    elif k < len(line):
        k += 1   # the '=' or ':'
    while k < len(line) and line[k] in " \t\f":
        k += 1
    return key, line[k:]


_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def _unescape(s: str) -> str:
    if "\\" not in s:
        return s
    out, j = [], 0
    while j < len(s):
        c = s[j]
        if c != "\\" or j + 1 >= len(s):
            out.append(c)
            j += 1
            continue
        n = s[j + 1]
        if n == "u" and j + 6 <= len(s):
            try:
                out.append(chr(int(s[j + 2:j + 6], 16)))
                j += 6
                continue
            except ValueError:
                raise ValueError(f"malformed \\uxxxx escape in {s!r}") from None
        out.append(_ESCAPES.get(n, n))
        j += 2
    return "".join(out)


def load_properties_file(path: str) -> dict[str, str]:
    """parse_properties of a file (read as UTF-8; Java reads ISO-8859-1, which
    agrees for ASCII, the only thing these files hold in practice)."""
    with open(path, encoding="utf-8") as f:
        return parse_properties(f.read())


def format_value(v) -> str:
    """An option's value as a properties file writes it: Java's true/false, else str()."""
    return str(v).lower() if isinstance(v, bool) else str(v)


def format_properties(values: dict) -> str:
    """key=value lines sorted by key: what `-p` prints and GET_*_CONFIG answers."""
    return "".join(f"{k}={format_value(v)}\n" for k, v in sorted(values.items()))


def parse_runtime_update(text: str, options: dict, runtime_keys: frozenset, ignored_keys, server: str,
                         config_file: str) -> dict[str, Any]:
    """An UPDATE_*_CONFIG body (properties text) parsed and checked against a server's options
    ({name: Option}): ValueError names a key that is unknown (saying so when it is a RocketMQ key
    the server accepts in its file and ignores), one that cannot change while `server` runs, or
    a bad value."""
    raw = parse_properties(text)
    if not raw:
        raise ValueError("no key=value in the body")
    can = ", ".join(sorted(runtime_keys))
    out = {}
    for k, v in raw.items():
        if k not in options:
            ignored = f" (a RocketMQ key this {server} ignores)" if k in ignored_keys else ""
            raise ValueError(f"{k} is not a {server} config key{ignored}; keys that change while it runs: {can}")
        if k not in runtime_keys:
            raise ValueError(f"{k} cannot change while the {server} runs (set it in {config_file} and restart); "
                             f"these can: {can}")
        out[k] = options[k].parse(v)
    return out
