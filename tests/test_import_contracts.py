"""The import-linter contracts in pyproject.toml cover every module of jitserve: a new
top-level module or subpackage named in no layer would escape the layering unnoticed
(lint-imports only checks the modules a contract names)."""

from __future__ import annotations

import importlib
import pkgutil
import tomllib
from pathlib import Path
from typing import Any

import jitserve

ROOT = Path(__file__).resolve().parents[1]
ENGINE = "jitserve.engine"
IN_ENGINE = ["jitserve.engine.vllm_scheduler", "jitserve.engine.steps"]
"""What vLLM loads; the rest of :mod:`jitserve.engine` (its wire) jitserve may import."""


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


def _engine_modules() -> set[str]:
    engine = importlib.import_module(ENGINE)
    return {f"{ENGINE}.{m.name}" for m in pkgutil.iter_modules(engine.__path__)}


def test_the_in_engine_scheduler_is_forbidden_to_every_other_module() -> None:
    (contract,) = [c for c in _contracts() if c.get("forbidden_modules") == IN_ENGINE]
    others = (_top_level_modules() - {ENGINE}) | (_engine_modules() - set(IN_ENGINE))
    unguarded = sorted(others - set(contract["source_modules"]))
    assert not unguarded, f"may import {IN_ENGINE}: {unguarded}"


def test_the_engine_package_imports_no_in_engine_module() -> None:
    """Importing the wire runs the package's ``__init__``: it must not load vLLM."""
    init = (ROOT / "src" / "jitserve" / "engine" / "__init__.py").read_text(encoding="utf-8")
    imports = [line for line in init.splitlines()
               if line.startswith(("import ", "from ")) and "__future__" not in line]
    assert not imports, imports
