"""Training the length model: training rows, forest fitting and calibration.

Role: everything that turns records into a :class:`~jitserve.analyzer.qrf_model.LengthModel`
(pure apart from CPU). The synthetic corpus (:mod:`jitserve.analyzer.corpus`) plus observed
completions held in an :class:`ObservationBuffer` (bounded; owned by the estimator or the
service) are the training data; once an application has enough observed completions its
synthetic rows are dropped, so real data replaces the corpus app by app.
:func:`train_model` fits two ``quantile_forest.RandomForestQuantileRegressor`` forests, one
on the meta view (prompt length, app, model, SLO kind; all a simulated request has) and one
on the text view (meta + hashed n-grams, when prompts with text were seen). Each forest is
calibrated on a held-out split: for every quantile level we record the coverage it
achieved, so that asking for q = 0.95 gives ~95% coverage out of sample.
"""

from __future__ import annotations

import functools
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt
from quantile_forest import RandomForestQuantileRegressor

from jitserve.analyzer import features as F
from jitserve.analyzer.corpus import LengthRecord, length_corpus
from jitserve.analyzer.qrf_model import LEVELS, FloatArray, Forest, LengthModel, LengthQuery


@dataclass(frozen=True, slots=True)
class ForestConfig:
    n_estimators: int = 32
    min_samples_leaf: int = 10
    max_samples: float = 0.4
    """Bootstrap fraction per tree (smaller: faster training and prediction)."""
    meta_max_features: float = 1.0
    text_max_features: float = 0.4
    calibration_fraction: float = 0.15
    min_real_per_app: int = 300
    """Observed completions of an app after which its synthetic rows are dropped."""
    min_rows_per_app: int = 50
    """Apps with fewer training rows are folded into ``other``."""
    other_fraction: float = 0.15
    """Share of rows duplicated under the ``other`` app (what an unknown tag gets)."""
    max_rows: int = 20_000
    """Training rows at most (before the ``other`` copies): the newest observed
    completions first, then a sample of the corpus. Bounds retraining time."""


def _calibration(curves: FloatArray, truth: FloatArray) -> FloatArray:
    """Empirical coverage of each level, made strictly increasing."""
    covered = (truth[:, None] <= curves).mean(axis=0)
    smoothed = np.maximum.accumulate(np.clip(covered, 1e-4, 1 - 1e-4))
    result: FloatArray = smoothed + np.arange(len(LEVELS)) * 1e-7
    return result


def _fit_forest(
    x: npt.NDArray[np.float32],
    y: FloatArray,
    space: F.FeatureSpace,
    text: bool,
    config: ForestConfig,
    seed: int,
) -> Forest:
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(y))
    n_cal = max(1, int(len(y) * config.calibration_fraction))
    cal, fit = order[:n_cal], order[n_cal:]
    forest = RandomForestQuantileRegressor(
        n_estimators=config.n_estimators,
        min_samples_leaf=config.min_samples_leaf,
        max_samples=config.max_samples,
        max_features=config.text_max_features if text else config.meta_max_features,
        max_samples_leaf=None,
        n_jobs=1,
        random_state=seed,
    )
    forest.fit(x[fit], y[fit])
    provisional = Forest(forest, space, text, LEVELS.copy())
    calibration = _calibration(provisional.curves(x[cal]), y[cal])
    return Forest(forest, space, text, calibration)


@dataclass(slots=True)
class ObservationBuffer:
    """Bounded buffer of observed completions (oldest dropped first)."""

    capacity: int = 50_000
    records: deque[LengthRecord] = field(default_factory=deque)
    total: int = 0
    """Completions ever added (including those since dropped)."""

    def add(self, record: LengthRecord) -> None:
        self.records.append(record)
        self.total += 1
        while len(self.records) > self.capacity:
            self.records.popleft()

    def __len__(self) -> int:
        return len(self.records)


def _training_rows(
    corpus: Sequence[LengthRecord],
    observed: Sequence[LengthRecord],
    config: ForestConfig,
    rng: np.random.Generator,
) -> list[LengthRecord]:
    real_counts: dict[str, int] = {}
    for r in observed:
        real_counts[r.app] = real_counts.get(r.app, 0) + 1
    replaced = {app for app, n in real_counts.items() if n >= config.min_real_per_app}
    real = list(observed)[-config.max_rows :]
    synthetic = [r for r in corpus if r.app not in replaced]
    room = config.max_rows - len(real)
    if len(synthetic) > room:
        keep = rng.choice(len(synthetic), size=max(0, room), replace=False)
        synthetic = [synthetic[int(i)] for i in sorted(keep)]
    rows = synthetic + real
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.app] = counts.get(r.app, 0) + 1
    rows = [
        r if counts[r.app] >= config.min_rows_per_app else replace(r, app=F.OTHER_APP) for r in rows
    ]
    n_other = int(len(rows) * config.other_fraction)
    if n_other and rows:
        picks = rng.choice(len(rows), size=n_other, replace=False)
        rows.extend(replace(rows[int(i)], app=F.OTHER_APP) for i in picks)
    return rows


def train_model(
    corpus: Sequence[LengthRecord],
    observed: Sequence[LengthRecord] = (),
    config: ForestConfig | None = None,
    seed: int = 0,
    version: int = 1,
    previous: LengthModel | None = None,
) -> LengthModel:
    """Fit a :class:`LengthModel`. The text forest is refitted only when text rows
    were observed since ``previous`` (or there is no previous model)."""
    config = config or ForestConfig()
    rng = np.random.default_rng(seed)
    rows = _training_rows(corpus, observed, config, rng)
    if len(rows) < 20:
        raise ValueError(f"need at least 20 training rows, got {len(rows)}")
    space = F.FeatureSpace.build((r.app for r in rows), (r.model for r in rows))
    y = np.array([r.output_tokens for r in rows], dtype=np.float64)
    x_meta = F.meta_matrix(
        space,
        [r.prompt_tokens for r in rows],
        [r.app for r in rows],
        [r.model for r in rows],
        [r.slo_kind for r in rows],
    )
    meta = _fit_forest(x_meta, y, space, False, config, seed)
    observed_text = any(r.prompt_text for r in observed)
    text: Forest | None
    if previous is not None and previous.text is not None and not observed_text:
        text = previous.text
    else:
        with_text = [r for r in rows if r.prompt_text]
        text = None
        if len(with_text) >= 20:
            x_text = F.text_matrix(
                space,
                [r.prompt_tokens for r in with_text],
                [r.app for r in with_text],
                [r.model for r in with_text],
                [r.slo_kind for r in with_text],
                [r.prompt_text or "" for r in with_text],
            )
            y_text = np.array([r.output_tokens for r in with_text], dtype=np.float64)
            text = _fit_forest(x_text, y_text, space, True, config, seed + 1)
    return LengthModel(meta, text, version, time.time(), len(rows), len(observed))


def record_of(query: LengthQuery, output_tokens: int) -> LengthRecord:
    return LengthRecord(
        query.prompt_text,
        query.prompt_tokens,
        output_tokens,
        query.app,
        query.model,
        query.slo_kind,
    )


_PRETRAINED: dict[tuple[int, int], LengthModel] = {}
_PRETRAINED_LOCK = threading.Lock()
DEFAULT_CORPUS_SIZE = 12_000


@functools.lru_cache(maxsize=4)
def pretrained_corpus(
    seed: int = 0,
    corpus_size: int = DEFAULT_CORPUS_SIZE,
) -> tuple[LengthRecord, ...]:
    """The synthetic corpus (memoised: records are immutable)."""
    return tuple(length_corpus(corpus_size, seed))


def pretrained_model(seed: int = 0, corpus_size: int = DEFAULT_CORPUS_SIZE) -> LengthModel:
    """A model trained on the synthetic corpus; memoised per (seed, size) in-process
    (models are immutable, so estimators can share one)."""
    key = (seed, corpus_size)
    with _PRETRAINED_LOCK:
        model = _PRETRAINED.get(key)
        if model is None:
            model = train_model(pretrained_corpus(seed, corpus_size), seed=seed)
            _PRETRAINED[key] = model
        return model
