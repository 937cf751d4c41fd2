"""Errors every command shares (a leaf: imports nothing from jitserve).

:class:`CLIError` is a user error on the command line or in a file it names: the CLI
prints it as one line and exits 2, never a traceback. It lives here, not in
``jitserve.cli``, so that ``python -m jitserve.cli`` and the console script raise and catch
the very same class.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


class CLIError(Exception):
    """A user error: printed as one line, exit code 2."""


def flag_error(errors: Iterable[Mapping[str, Any]], flags: Mapping[str, str]) -> CLIError:
    """A settings model's first validation error (pydantic's ``err.errors()``) as the
    command line spelled it: ``--port: ...`` rather than the field name ``port``."""
    first = next(iter(errors))
    path = ".".join(str(p) for p in first["loc"])
    name = flags.get(path) or flags.get(str(first["loc"][0]) if first["loc"] else "", path)
    value = first.get("input")
    shown = f" (got {value!r})" if value is not None and not isinstance(value, dict) else ""
    return CLIError(f"{name}: {first['msg']}{shown}")
