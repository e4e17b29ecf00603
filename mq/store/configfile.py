"""JSON config files under <store>/config (topics.json, consumerOffset.json,
delayOffset.json, subscriptionGroup.json).

Writes are crash-safe: the new text goes to <file>.tmp, is fsynced, the old
file is kept as <file>.bak, and the tmp file is renamed over the original
(then the directory is fsynced), so a crash leaves the old or the new
version, never half.  Reads accept fastjson's unquoted integer map keys
({0:12}) and fall back to .bak when the main file is empty or unreadable."""
from __future__ import annotations

import json
import logging
import os
import re
import shutil

from .durable import fsync_dir

log = logging.getLogger("mq.store.configfile")

# a bare integer key after '{' or ',' (outside strings: the config texts we
# read have no strings containing '{' or ',' followed by digits and ':')
_BARE_KEY = re.compile(r'([{,]\s*)(-?\d+)(\s*:)')


def loads_lenient(text: str):
    """json.loads that also accepts fastjson's unquoted integer keys."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return json.loads(_quote_bare_keys(text))


def _quote_bare_keys(text: str) -> str:
    out = []
    # only rewrite outside string literals
    parts = re.split(r'("(?:[^"\\]|\\.)*")', text)
    for part in parts:
        if part.startswith('"') and part.endswith('"') and len(part) >= 2:
            out.append(part)
        else:
            out.append(_BARE_KEY.sub(lambda m: f'{m.group(1)}"{m.group(2)}"{m.group(3)}', part))
    return "".join(out)


def write_atomic(path: str, text: str) -> None:
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    if os.path.exists(path):
        shutil.copyfile(path, path + ".bak")
    os.replace(tmp, path)
    fsync_dir(directory)


def read_config(path: str):
    """The parsed content of path (or its .bak), or None when neither is usable."""
    for candidate in (path, path + ".bak"):
        try:
            with open(candidate, encoding="utf-8") as f:
                text = f.read()
        except FileNotFoundError:
            continue
        if not text.strip():
            continue
        try:
            return loads_lenient(text)
        except (json.JSONDecodeError, ValueError) as e:
            log.error("config file %s is unreadable (%s); trying the backup", candidate, e)
    return None


class ConfigFile:
    """One JSON config file with a dict payload."""

    def __init__(self, config_dir: str, name: str):
        self.path = os.path.join(config_dir, name)

    def load(self) -> dict:
        data = read_config(self.path)
        return data if isinstance(data, dict) else {}

    def save(self, data: dict) -> None:
        write_atomic(self.path, json.dumps(data, indent=2, sort_keys=True))
