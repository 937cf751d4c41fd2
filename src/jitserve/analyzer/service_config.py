"""Settings of the analyzer service: the request limits and the service configuration.

Role: plain frozen dataclasses, validated on construction, shared by the service core
(:mod:`jitserve.analyzer.service_core`), the gRPC transport (:mod:`jitserve.analyzer.service`)
and the command line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from jitserve.analyzer.qrf_train import DEFAULT_CORPUS_SIZE, ForestConfig


@dataclass(frozen=True, slots=True)
class Limits:
    max_batch: int = 256
    max_completions: int = 1024
    max_text_bytes: int = 64 * 1024
    max_prompt_tokens: int = 10_000_000
    max_output_tokens: int = 10_000_000
    max_name_chars: int = 256
    max_stages: int = 64
    max_calls_per_stage: int = 512
    max_seconds: float = 7 * 86400.0


@dataclass(frozen=True, slots=True)
class ServiceConfig:
    quantile: float = 0.95
    state_dir: Path | None = None
    seed: int = 0
    corpus_size: int = DEFAULT_CORPUS_SIZE
    buffer_size: int = 50_000
    retrain_min_new: int = 500
    """Observed completions needed before a background retrain."""
    retrain_interval_s: float = 60.0
    """Minimum time between retrains."""
    checkpoint_interval_s: float = 30.0
    history_capacity: int = 2000
    coverage_window: int = 10_000
    remembered_requests: int = 100_000
    """Requests in flight whose arrival bound and predictive curve are kept."""
    limits: Limits = field(default_factory=Limits)
    max_message_bytes: int = 8 << 20
    workers: int = 8
    forest: ForestConfig = field(default_factory=ForestConfig)

    def __post_init__(self) -> None:
        if not 0 < self.quantile < 1:
            raise ValueError(f"quantile must be in (0, 1), got {self.quantile}")
        if self.corpus_size < 100:
            raise ValueError(f"corpus_size must be >= 100, got {self.corpus_size}")
        if self.retrain_min_new < 1:
            raise ValueError(f"retrain_min_new must be >= 1, got {self.retrain_min_new}")
