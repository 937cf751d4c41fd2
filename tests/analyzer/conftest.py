"""Fixtures for the analyzer tests.

- ``small_model``: a length model trained on a small synthetic corpus (session-wide; the
  acceptance figures come from ``jitserve analyzer eval`` with the full corpus);
- ``analyzer``: a real gRPC server on a loopback port serving that model in-process,
  with its :class:`AnalyzerCore` for white-box checks.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from jitserve.analyzer.corpus import length_corpus
from jitserve.analyzer.qrf_model import LengthModel
from jitserve.analyzer.qrf_train import train_model
from tests.support.analyzer import SMALL_FOREST, RunningAnalyzer, start_analyzer


@pytest.fixture(scope="session")
def small_model() -> LengthModel:
    return train_model(length_corpus(3000, 0), config=SMALL_FOREST, seed=0)


@pytest.fixture(scope="module")
def analyzer(small_model: LengthModel) -> Iterator[RunningAnalyzer]:
    running = start_analyzer(small_model, max_message_bytes=1 << 20)
    yield running
    running.server.stop(0).wait()
