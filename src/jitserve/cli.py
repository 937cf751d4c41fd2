"""``jitserve`` command line: a registry of subcommands, nothing else.

Each component registers its own subcommand (``register(subparsers)``), so this module
stays a thin dispatcher and a component stays importable without the others' optional
dependencies. Tools from a higher layer that belong under a lower layer's command (the
live benchmark under ``jitserve sidecar``) add themselves there through
:data:`EXTENSIONS`, so the lower layer never imports the higher one.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Any

from jitserve import __version__
from jitserve.errors import CLIError

# (subcommand, module exposing ``register(subparsers)``, extra it needs or "")
COMPONENTS: tuple[tuple[str, str, str], ...] = (
    ("bench", "jitserve.bench.cli", ""),
    ("calibrate", "jitserve.bench.calibrate_engine", "bench"),
    ("analyzer", "jitserve.analyzer.cli", "analyzer"),
    ("sidecar", "jitserve.sidecar.cli", "sidecar"),
    ("up", "jitserve.devstack.up", "sidecar"),
    ("gateway", "jitserve.gateway.cli", "sidecar"),
    ("picker", "jitserve.gateway.picker_cli", "gateway"),
    ("operator", "jitserve.operator.cli", "operator"),
    ("crd", "jitserve.operator.crd", ""),
)
# (parent subcommand, module exposing ``register_under_<parent>(subcommands)``, extra)
EXTENSIONS: tuple[tuple[str, str, str], ...] = (
    ("sidecar", "jitserve.bench.live", "sidecar"),
    ("sidecar", "jitserve.bench.overhead", "sidecar"),
    ("sidecar", "jitserve.devstack.up", "sidecar"),
)


def _missing(parser: argparse.ArgumentParser, command: str, err: ImportError, extra: str) -> None:
    install = f"pip install 'jitserve[{extra}]'" if extra else "pip install jitserve"
    parser.set_defaults(_missing=f"jitserve {command} needs '{err.name}'; install it: {install}")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's help ends with its default, unless it has none to show (no value,
    a flag that is off, an empty list) or the help already says it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (default is None or default is False or default in ([], "") or "default" in text.lower()
                or default is argparse.SUPPRESS or not action.option_strings):
            return text
        return super()._get_help_string(action)


def _format_all(parser: argparse.ArgumentParser) -> None:
    """Give ``parser`` and every subcommand's parser the :class:`HelpFormatter`."""
    parser.formatter_class = HelpFormatter
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                _format_all(child)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="jitserve",
        description="SLO-aware LLM serving: GMAX scheduler, simulator, sidecar, analyzer,"
        " operator.",
    )
    parser.add_argument("--version", action="version", version=f"jitserve {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    children: dict[str, Any] = {}
    for name, module_name, extra in COMPONENTS:
        try:
            module = importlib.import_module(module_name)
        except ImportError as err:  # a component whose optional extra is not installed
            stub = subparsers.add_parser(name, help=f"(unavailable: {err.name} not installed)")
            _missing(stub, name, err, extra)
            continue
        children[name] = module.register(subparsers)
    for parent, module_name, _extra in EXTENSIONS:
        if children.get(parent) is None:
            continue
        try:
            module = importlib.import_module(module_name)
        except ImportError:  # its parent is there but not this tool's extra: leave it out
            continue
        getattr(module, f"register_under_{parent}")(children[parent])
    _format_all(parser)
    return parser


def _metrics_conventions() -> None:
    """No ``*_created`` series (prometheus_client writes one beside every counter and
    histogram by default): they double the series and no rule or dashboard reads them."""
    try:
        from prometheus_client import disable_created_metrics
    except ImportError:  # the bare package: no component that serves metrics
        return
    disable_created_metrics()  # type: ignore[no-untyped-call]


def main(argv: Sequence[str] | None = None) -> int:
    _metrics_conventions()
    parser = build_parser()
    args = parser.parse_args(argv)
    missing = getattr(args, "_missing", None)
    if missing:
        print(f"error: {missing}", file=sys.stderr)
        return 2
    try:
        result: int = args.handler(args)
    except CLIError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as err:  # an optional extra the command needs at run time
        extra = {name: extra for name, _, extra in COMPONENTS}.get(args.command, "")
        if not extra or err.name is None or err.name.startswith("jitserve"):
            raise
        print(f"error: jitserve {args.command} needs '{err.name}'; install it: "
              f"pip install 'jitserve[{extra}]'", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return result


if __name__ == "__main__":
    sys.exit(main())
