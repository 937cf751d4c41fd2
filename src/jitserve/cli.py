"""``jitserve`` command line: one entry point, one subcommand per component.

Each component registers its own subcommand (``register(subparsers)``) so that this
module stays a thin dispatcher and components stay importable without each other's
dependencies.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# (subcommand, module exposing ``register(subparsers)``); a module under
# ``jitserve.<component>`` needs the optional extra of that name
COMPONENTS: tuple[tuple[str, str], ...] = (
    ("bench", "jitserve.sim.bench"),
    ("analyzer", "jitserve.analyzer.cli"),
    ("sidecar", "jitserve.sidecar.cli"),
    ("up", "jitserve.sidecar.up"),
    ("operator", "jitserve.operator.cli"),
    ("crd", "jitserve.operator.crd"),
)


class CLIError(Exception):
    """A user error: printed as one line, exit code 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="jitserve",
        description="SLO-aware LLM serving: GMAX scheduler, simulator, sidecar, analyzer,"
        " operator.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, module_name in COMPONENTS:
        try:
            module = importlib.import_module(module_name)
        except ImportError as err:  # a component whose optional extra is not installed
            stub = subparsers.add_parser(name, help=f"(unavailable: {err.name} not installed)")
            extra = module_name.split(".")[1]  # jitserve.<component>.*: the extra's name
            stub.set_defaults(
                _missing=f"jitserve {name} needs '{err.name}'; "
                f"install the extra: pip install 'jitserve[{extra}]'"
            )
            continue
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
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
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return result


if __name__ == "__main__":
    sys.exit(main())
