"""Every flag of ``jitserve sidecar serve`` is also an environment variable: flag over
variable over default, the variable named in --help and in the error for a bad value."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request

import pytest

from jitserve.cli import build_parser
from jitserve.devstack.vllm import free_port
from jitserve.envflags import env_name, from_environment
from jitserve.sidecar.cli import ENV_PREFIX


def _parser(env: dict[str, str]) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("--max-running", type=int, default=16)
    p.add_argument("--api-key", action="append", default=[])
    p.add_argument("--log-level", choices=("INFO", "DEBUG"), default="INFO")
    from_environment(p, "X_", env)
    return p


def test_flag_over_variable_over_default() -> None:
    env = {"X_MAX_RUNNING": "7", "X_API_KEY": "a=1, b=2", "X_LOG_LEVEL": "DEBUG"}
    args = _parser(env).parse_args([])
    assert (args.max_running, args.api_key, args.log_level) == (7, ["a=1", "b=2"], "DEBUG")
    assert _parser(env).parse_args(["--max-running", "3"]).max_running == 3
    assert _parser({}).parse_args([]).max_running == 16


@pytest.mark.parametrize("env", [{"X_MAX_RUNNING": "seven"}, {"X_LOG_LEVEL": "LOUD"}])
def test_a_bad_value_names_its_variable(env: dict[str, str]) -> None:
    args = _parser(env).parse_args([])
    (name,) = env
    assert name in args._missing


def test_every_sidecar_flag_has_its_variable_in_help() -> None:
    sidecar = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    serve_group = next(a for a in sidecar.choices["sidecar"]._actions
                       if isinstance(a, argparse._SubParsersAction))
    serve = serve_group.choices["serve"]
    names = [env_name(ENV_PREFIX, a) for a in serve._actions]
    flags = [n for n in names if n is not None]
    assert len(flags) >= 20 and "JITSERVE_SIDECAR_MAX_RUNNING" in flags
    for action, name in zip(serve._actions, names, strict=True):
        if name is not None:
            assert f"[env {name}]" in (action.help or ""), action.option_strings


def test_a_real_sidecar_takes_its_settings_from_the_environment() -> None:
    port = free_port()
    env = {**os.environ, "JITSERVE_SIDECAR_MAX_RUNNING": "7",
           "JITSERVE_SIDECAR_BACKEND": f"http://127.0.0.1:{free_port()}",
           "JITSERVE_SIDECAR_PORT": str(port), "JITSERVE_SIDECAR_HOST": "127.0.0.1"}
    proc = subprocess.Popen([sys.executable, "-m", "jitserve.cli", "sidecar", "serve"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/debug/scheduler",
                                            timeout=5) as resp:
                    doc = json.loads(resp.read())
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.3)
        assert doc["max_running"] == 7
    finally:
        proc.terminate()
        proc.wait(30)


def _operator_args(env: dict[str, str]) -> argparse.Namespace:
    from jitserve.operator import cli as operator_cli

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    old = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        operator_cli.register(sub)
    finally:
        os.environ.clear()
        os.environ.update(old)
    return parser.parse_args(["operator"])


def test_the_operators_flags_read_the_same_way() -> None:
    """The chart's variables keep their names; a bad one is a CLI error, not a traceback
    while the parser is built (it was ``float(os.environ[...])`` there)."""
    args = _operator_args({"JITSERVE_SIDECAR_IMAGE": "reg/sidecar:1",
                           "JITSERVE_STATUS_INTERVAL": "2.5", "JITSERVE_WEBHOOK_PORT": "9443"})
    assert (args.sidecar_image, args.status_interval, args.webhook_port) == (
        "reg/sidecar:1", 2.5, 9443)
    assert "JITSERVE_STATUS_INTERVAL" in _operator_args(
        {"JITSERVE_STATUS_INTERVAL": "soon"})._missing
    proc = subprocess.run([sys.executable, "-m", "jitserve.cli", "operator"], capture_output=True,
                          text=True, env={**os.environ, "JITSERVE_STATUS_INTERVAL": "soon"},
                          timeout=120)
    assert proc.returncode == 2 and "JITSERVE_STATUS_INTERVAL" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_operators_readme_names_each_variable_the_parser_reads() -> None:
    import re
    from pathlib import Path

    from jitserve.operator import cli as operator_cli

    parser = argparse.ArgumentParser()
    operator_cli.register(parser.add_subparsers())
    operator = parser._subparsers._group_actions[0].choices["operator"]  # type: ignore[union-attr]
    readme = (Path(__file__).resolve().parents[1] / "operator" / "README.md").read_text()
    documented = set(re.findall(r"`(JITSERVE_[A-Z_]+)`", readme))
    read = {env_name(operator_cli.ENV_PREFIX, a) for a in operator._actions} - {None}
    assert read <= documented and not (documented - read - {"JITSERVE_CACHE"})
