"""Helpers shared by the analyzer tests (imported by module name: pytest puts this
folder on ``sys.path``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from jitserve.analyzer.qrf_model import LengthModel
from jitserve.analyzer.qrf_train import ForestConfig
from jitserve.analyzer.service import build_server
from jitserve.analyzer.service_config import ServiceConfig
from jitserve.analyzer.service_core import AnalyzerCore

SMALL_FOREST = ForestConfig(n_estimators=16)


@dataclass
class RunningAnalyzer:
    core: AnalyzerCore
    server: Any
    target: str


def start_analyzer(model: LengthModel | None, **config: Any) -> RunningAnalyzer:
    core = AnalyzerCore(ServiceConfig(**config))
    server, port, _ = build_server(core, "127.0.0.1:0")
    server.start()
    if model is not None:
        core.use_model(model)
    return RunningAnalyzer(core, server, f"127.0.0.1:{port}")
