"""The import-linter contracts in pyproject.toml cover every module of jitserve: a new
top-level module or subpackage named in no layer would escape the layering unnoticed
(lint-imports only checks the modules a contract names)."""

from __future__ import annotations

import pkgutil
import tomllib
from pathlib import Path
from typing import Any

import jitserve

ROOT = Path(__file__).resolve().parents[1]
ENGINE = "jitserve.engine"


def _contracts() -> list[dict[str, Any]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    contracts: list[dict[str, Any]] = config["tool"]["importlinter"]["contracts"]
    return contracts


def _top_level_modules() -> set[str]:
    return {f"jitserve.{m.name}" for m in pkgutil.iter_modules(jitserve.__path__)}


def _layered() -> set[str]:
    (layers,) = [c for c in _contracts() if c["type"] == "layers" and "containers" not in c]
    return {
        name.strip() for layer in layers["layers"] for name in layer.split("|")
    }


def test_the_walk_finds_the_packages_and_modules() -> None:
    modules = _top_level_modules()
    assert {"jitserve.policy", "jitserve.engine", "jitserve.sse", "jitserve.cli"} <= modules


def test_every_top_level_module_sits_in_a_layer() -> None:
    missing = sorted(_top_level_modules() - _layered())
    assert not missing, f"in no layer of pyproject.toml's layers contract: {missing}"


def test_every_layer_names_a_module_that_exists() -> None:
    stale = sorted(_layered() - _top_level_modules())
    assert not stale, f"layers name modules that do not exist: {stale}"


def test_the_in_engine_scheduler_is_forbidden_to_every_other_module() -> None:
    (contract,) = [c for c in _contracts() if c.get("forbidden_modules") == [ENGINE]]
    unguarded = sorted(_top_level_modules() - {ENGINE} - set(contract["source_modules"]))
    assert not unguarded, f"may import {ENGINE}: {unguarded}"
