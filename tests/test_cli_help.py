"""The command line speaks to its user (issue 19): every option's help shows its default,
errors name the flag, ``--version``, one spelling per command (owner: cli)."""

from __future__ import annotations

import argparse

import pytest

from jitserve import __version__
from jitserve.cli import build_parser, main


def _parser_of(*path: str) -> argparse.ArgumentParser:
    parser = build_parser()
    for name in path:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[name]
    return parser


@pytest.mark.parametrize("path", [("sidecar", "serve"), ("up",), ("operator",), ("bench",),
                                  ("analyzer", "serve"), ("sidecar", "proxy-overhead"),
                                  ("picker",)])
def test_every_option_with_a_default_shows_it(path: tuple[str, ...]) -> None:
    parser = _parser_of(*path)
    for action in parser._actions:
        default = action.default
        if (not action.option_strings or action.help == argparse.SUPPRESS
                or default in (None, False, [], "", argparse.SUPPRESS)):
            continue
        assert action.help, f"{path}: {action.option_strings} has no help"
        help_text = parser._get_formatter()._expand_help(action)
        assert "default" in help_text.lower(), f"{path}: {action.option_strings}: {help_text}"


def test_defaults_and_units_in_the_sidecar_help() -> None:
    text = " ".join(_parser_of("sidecar", "serve").format_help().split())
    assert ("the API's TCP port (0: any free) [env JITSERVE_SIDECAR_PORT] (default: 8080)"
            in text)
    assert "--stall-timeout SECONDS" in text and "--max-body-bytes BYTES" in text


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == f"jitserve {__version__}"


@pytest.mark.parametrize(("argv", "flag"), [
    (["sidecar", "serve", "--port", "70000"], "--port:"),
    (["sidecar", "serve", "--max-running", "0"], "--max-running:"),
    (["sidecar", "serve", "--reload-interval", "0"], "--reload-interval:"),
    (["operator", "--status-interval", "-1"], "--status-interval:"),
])
def test_config_errors_name_the_flag(argv: list[str], flag: str,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {flag}") and "_s:" not in err and "seconds:" not in err


def test_the_old_spellings_say_which_to_use(capsys: pytest.CaptureFixture[str]) -> None:
    sidecar = next(a for a in _parser_of("sidecar")._actions
                   if isinstance(a, argparse._SubParsersAction))
    helps = {c.dest: c.help for c in sidecar._choices_actions}
    assert helps["bench-live"] == "deprecated alias of 'jitserve bench --live URL'"
    assert "deprecated alias of 'jitserve sidecar proxy-overhead'" in " ".join(
        a.help or "" for a in _parser_of("bench")._actions)
