"""Every flag of a command also read from the environment (owner: core CLI).

``--max-running`` of ``jitserve sidecar serve`` is ``JITSERVE_SIDECAR_MAX_RUNNING``:
the prefix, then the flag's name in capitals with ``_`` for ``-``. A flag on the command
line wins over the variable, the variable over the default; ``--help`` names each
variable. A repeatable flag takes a comma-separated list. A value the flag's type refuses
is a CLI error naming the variable (exit 2), as a bad flag is.

Why not pydantic-settings: the settings are built from the parsed flags, so the
precedence (flag > environment > default) and the error that names the variable belong
where the flags are parsed; this is argparse's own ``default``, set from the environment.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping

from jitserve.errors import CLIError


def env_name(prefix: str, action: argparse.Action) -> str | None:
    longs = [s for s in action.option_strings if s.startswith("--")]
    if not longs or action.dest == "help":
        return None
    return prefix + longs[0][2:].upper().replace("-", "_")


def _convert(action: argparse.Action, name: str, text: str) -> object:
    def one(item: str) -> object:
        try:
            value = action.type(item) if callable(action.type) else item
        except (ValueError, TypeError, argparse.ArgumentTypeError) as err:
            raise CLIError(f"{name}={text!r}: not a valid value for {action.option_strings[0]} "
                           f"({err})") from None
        if action.choices is not None and value not in action.choices:
            raise CLIError(f"{name}={text!r}: {action.option_strings[0]} takes one of "
                           f"{', '.join(map(str, action.choices))}")
        return value

    if isinstance(action, argparse._AppendAction):
        return [one(item.strip()) for item in text.split(",") if item.strip()]
    if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
        lowered = text.strip().lower()
        if lowered not in ("1", "0", "true", "false", "yes", "no"):
            raise CLIError(f"{name}={text!r}: {action.option_strings[0]} takes true or false")
        on = lowered in ("1", "true", "yes")
        return on if isinstance(action, argparse._StoreTrueAction) else not on
    return one(text)


def from_environment(parser: argparse.ArgumentParser, prefix: str,
                     environ: Mapping[str, str] | None = None) -> None:
    """Set each flag's default from its variable, and say so in its help. A bad value is
    reported when the command runs (``jitserve.cli.main``'s ``_missing``), not while
    every command's parser is built."""
    env = os.environ if environ is None else environ
    for action in parser._actions:
        name = env_name(prefix, action)
        if name is None:
            continue
        action.help = f"{action.help or ''} [env {name}]".strip()
        if name in env:
            try:
                action.default = _convert(action, name, env[name])
            except CLIError as err:
                parser.set_defaults(_missing=str(err))
                continue
            action.required = False
