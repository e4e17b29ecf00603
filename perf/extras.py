"""The optional packages of the `perf` extra (pyproject.toml): pyspark and matplotlib for
mqtrace, redis-py and nats-py for the peers of mqpeers and the broker gates.  The wheel's
required dependencies do not include them, so every perf module imports them lazily, where a
command really needs them, and checks first with require(): a missing package then ends the
command with one line naming the extra to install, instead of a traceback halfway through
a run (or before anything could even print --help)."""
from __future__ import annotations

import importlib.util

INSTALL = "pip install 'mq-broker[perf]'"


class MissingExtra(ImportError):
    """A package of the `perf` extra is not installed; the message says which and how to get it."""


def missing(*modules: str) -> list[str]:
    """The top-level packages among `modules` that cannot be imported here."""
    return [m for m in modules if importlib.util.find_spec(m) is None]


def require(*modules: str, what: str) -> None:
    """Raises MissingExtra unless every one of `modules` (top-level package names) can be
    imported; `what` names the command or feature that needs them."""
    gone = missing(*modules)
    if gone:
        raise MissingExtra(f"{what} needs {' and '.join(gone)}, from the optional `perf` extra, which is not "
                           f"installed here: {INSTALL}")
