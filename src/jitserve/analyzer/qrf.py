"""Quantile-regression-forest length bounds (JITServe paper section 4.1).

Data flow and who owns each stage:

1. *Training data*: the synthetic corpus (:mod:`jitserve.analyzer.corpus`) plus observed
   completions held in an :class:`ObservationBuffer` (bounded; owned by the estimator or
   the service). Once an application has enough observed completions its synthetic rows
   are dropped, so real data replaces the corpus app by app.
2. *Training* (:func:`train_model`, pure apart from CPU): two
   ``quantile_forest.RandomForestQuantileRegressor`` forests, one on the meta view
   (prompt length, app, model, SLO kind; all a simulated request has) and one on the text
   view (meta + hashed n-grams, when prompts with text were seen). Each forest is
   calibrated on a held-out split: for every quantile level we record the coverage it
   achieved, so that asking for q = 0.95 gives ~95% coverage out of sample.
3. *Prediction* (:class:`LengthModel`, immutable once built): a forest returns each
   request's whole predictive distribution as a curve over :data:`LEVELS`. The bound at
   arrival is the calibrated q-quantile. Refinement after ``g`` generated tokens is the
   q-quantile of the same distribution *conditioned on the output being longer than g*
   (:func:`conditional_bound`): the bound relaxes toward the truth as generation goes on
   and never falls to or below ``g``; beyond the curve's range a Pareto tail fitted to
   the curve's top extrapolates. The meta view is cached by (app, model, SLO kind,
   prompt-length bucket), so the simulator pays a dictionary lookup per call.
4. *Serving*: :class:`QRFEstimator` implements the scheduler's
   :class:`~jitserve.scheduling.estimators.LengthEstimator` in-process (simulator,
   sidecar fallback); :mod:`jitserve.analyzer.service` wraps a model behind gRPC.

``predict`` of quantile-forest goes through scikit-learn's joblib-parallel ``apply``,
which costs ~10 ms per call; :class:`Forest` calls each tree's ``apply`` directly and
then quantile-forest's own weighted-quantile kernel (``forest_.predict``), which gives
identical numbers (tested) in well under a millisecond.
"""

from __future__ import annotations

import functools
import math
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt
from quantile_forest import RandomForestQuantileRegressor

from jitserve.analyzer import features as F
from jitserve.analyzer.corpus import LengthRecord, length_corpus
from jitserve.requests import Request
from jitserve.scheduling.estimators import LengthEstimator

FloatArray = npt.NDArray[np.float64]

LEVELS: FloatArray = np.concatenate(
    [np.arange(1, 19) / 20.0, [0.925, 0.95, 0.975, 0.99, 0.995, 0.999]]
)
"""Quantile levels of the predictive curve a forest returns for each request."""
_LEVEL_LIST: list[float] = [float(x) for x in LEVELS]
PROMPT_BUCKETS_PER_OCTAVE = 8
MAX_BOUND = 1 << 20


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


class Forest:
    """A fitted quantile forest over one feature view, with its calibration."""

    def __init__(
        self,
        forest: RandomForestQuantileRegressor,
        space: F.FeatureSpace,
        text: bool,
        calibration: FloatArray,
    ) -> None:
        self.forest = forest
        self.space = space
        self.text = text
        self.calibration = calibration
        """Coverage achieved out of sample by each of :data:`LEVELS` (increasing)."""

    def curves(self, rows: npt.NDArray[np.float32]) -> FloatArray:
        """Predictive quantile curves, shape (n, len(LEVELS)), non-decreasing per row."""
        x = np.ascontiguousarray(rows, dtype=np.float32)
        estimators = self.forest.estimators_
        leaves = np.empty((x.shape[0], len(estimators)), dtype=np.intp)
        for t, estimator in enumerate(estimators):
            leaves[:, t] = estimator.tree_.apply(x)
        out = self.forest.forest_.predict(_LEVEL_LIST, leaves, None, b"linear", True, False, True)
        curves: FloatArray = np.maximum.accumulate(
            np.asarray(out, dtype=np.float64)[:, 0, :], axis=1
        )
        return curves


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


def _pareto_alpha(curve: FloatArray, calibration: FloatArray) -> float:
    lo = int(np.searchsorted(calibration, 0.9))
    lo = min(lo, len(curve) - 2)
    v_a, v_b = curve[lo], curve[-1]
    c_a, c_b = calibration[lo], calibration[-1]
    if v_b <= v_a * 1.0001 or c_b <= c_a:
        return 2.0
    alpha = math.log((1 - c_a) / (1 - c_b)) / math.log(v_b / v_a)
    return min(8.0, max(1.0, alpha))


def conditional_bound(
    curve: FloatArray, calibration: FloatArray, quantile: float, generated: int
) -> int:
    """The ``quantile`` of total output length given that it exceeds ``generated``.

    ``curve[i]`` is the predicted length at calibrated CDF level ``calibration[i]``.
    The result is always > ``generated``."""
    n = len(curve)
    top = float(curve[-1])
    if generated <= 0:
        p0 = 0.0
    else:
        k = int(np.searchsorted(curve, generated, side="right"))
        if k >= n:
            p0 = 1.0
        elif k == 0:
            p0 = float(calibration[0]) * generated / max(float(curve[0]), 1e-9)
        else:
            span = float(curve[k] - curve[k - 1])
            frac = (generated - float(curve[k - 1])) / span if span > 0 else 1.0
            p0 = float(calibration[k - 1] + (calibration[k] - calibration[k - 1]) * frac)
    if p0 >= 1.0 or generated >= top:
        alpha = _pareto_alpha(curve, calibration)
        growth = min(4.0, max(1.1, (1.0 - quantile) ** (-1.0 / alpha)))
        value = max(generated, top) * growth
    else:
        tau = p0 + quantile * (1.0 - p0)
        if tau <= calibration[-1]:
            value = float(np.interp(tau, calibration, curve))
        else:
            alpha = _pareto_alpha(curve, calibration)
            value = top * ((1.0 - float(calibration[-1])) / (1.0 - tau)) ** (1.0 / alpha)
    return int(min(MAX_BOUND, max(generated + 1, math.ceil(value))))


@dataclass(frozen=True, slots=True)
class LengthQuery:
    """What the analyzer knows about a request when it bounds its length."""

    prompt_tokens: int
    app: str = "chat"
    model: str = "default"
    slo_kind: str = ""
    prompt_text: str | None = None
    max_tokens: int | None = None

    @staticmethod
    def of(req: Request) -> LengthQuery:
        return LengthQuery(
            req.prompt_tokens, req.app, req.model, req.kind.value, req.prompt_text, req.max_tokens
        )


def _bucket(prompt_tokens: int) -> int:
    return round(PROMPT_BUCKETS_PER_OCTAVE * math.log2(max(1, prompt_tokens)))


class LengthModel:
    """A trained length model: forests for the meta and text views. Immutable, except
    for its prediction cache; safe to share between threads."""

    def __init__(
        self,
        meta: Forest,
        text: Forest | None,
        version: int,
        trained_at: float,
        rows: int,
        observed_rows: int,
    ) -> None:
        self.meta = meta
        self.text = text
        self.version = version
        self.trained_at = trained_at
        self.rows = rows
        self.observed_rows = observed_rows
        self._cache: dict[tuple[int, float, str, int], FloatArray] = {}
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, object]:
        state = dict(self.__dict__)
        state["_cache"] = {}
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def _meta_key(self, q: LengthQuery) -> tuple[int, float, str, int]:
        space = self.meta.space
        return (
            space.app_index(q.app),
            space.model_code(q.model),
            q.slo_kind,
            _bucket(q.prompt_tokens),
        )

    def curves(self, queries: Sequence[LengthQuery]) -> list[tuple[FloatArray, FloatArray]]:
        """(curve, calibration) for every query; text view when the query has text."""
        result: list[tuple[FloatArray, FloatArray] | None] = [None] * len(queries)
        text_ix = [i for i, q in enumerate(queries) if q.prompt_text and self.text is not None]
        if text_ix and self.text is not None:
            space = self.text.space
            picked = [queries[i] for i in text_ix]
            rows = F.text_matrix(
                space,
                [q.prompt_tokens for q in picked],
                [q.app for q in picked],
                [q.model for q in picked],
                [q.slo_kind for q in picked],
                [q.prompt_text or "" for q in picked],
            )
            for i, curve in zip(text_ix, self.text.curves(rows), strict=True):
                result[i] = (curve, self.text.calibration)
        missing: dict[tuple[int, float, str, int], list[int]] = {}
        with self._lock:
            for i, q in enumerate(queries):
                if result[i] is not None:
                    continue
                key = self._meta_key(q)
                cached = self._cache.get(key)
                if cached is not None:
                    result[i] = (cached, self.meta.calibration)
                else:
                    missing.setdefault(key, []).append(i)
        if missing:
            space = self.meta.space
            keys = list(missing)
            reps = [queries[missing[k][0]] for k in keys]
            rows = F.meta_matrix(
                space,
                [round(2 ** (k[3] / PROMPT_BUCKETS_PER_OCTAVE)) for k in keys],
                [q.app for q in reps],
                [q.model for q in reps],
                [q.slo_kind for q in reps],
            )
            fresh = self.meta.curves(rows)
            with self._lock:
                if len(self._cache) > 200_000:
                    self._cache.clear()
                for key, curve in zip(keys, fresh, strict=True):
                    self._cache[key] = curve
                    for i in missing[key]:
                        result[i] = (curve, self.meta.calibration)
        return [r for r in result if r is not None]

    def bounds(
        self,
        queries: Sequence[LengthQuery],
        quantile: float,
        generated: Sequence[int] | None = None,
    ) -> list[int]:
        gen = generated if generated is not None else [0] * len(queries)
        out = []
        for q, g, (curve, cal) in zip(queries, gen, self.curves(queries), strict=True):
            out.append(cap_bound(conditional_bound(curve, cal, quantile, g), q.max_tokens, g))
        return out


def cap_bound(bound: int, max_tokens: int | None, generated: int) -> int:
    """Clip to the request's ``max_tokens`` while staying above ``generated``."""
    if max_tokens is not None:
        bound = min(bound, max_tokens)
    return max(bound, generated + 1)


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


class QRFEstimator(LengthEstimator):
    """The analyzer's length bound in-process: a :class:`LengthModel` plus online
    learning. ``observe`` buffers completions and, every ``retrain_every`` of them,
    retrains synchronously (deterministic, for the simulator); 0 disables retraining."""

    name = "qrf"

    def __init__(
        self,
        model: LengthModel,
        quantile: float = 0.95,
        *,
        corpus: Sequence[LengthRecord] = (),
        retrain_every: int = 0,
        buffer_size: int = 50_000,
        config: ForestConfig | None = None,
        seed: int = 0,
        curve_cache: int = 65_536,
    ) -> None:
        if not 0 < quantile < 1:
            raise ValueError(f"quantile must be in (0, 1), got {quantile}")
        if retrain_every < 0:
            raise ValueError(f"retrain_every must be >= 0, got {retrain_every}")
        self.model = model
        self.quantile = quantile
        self.corpus = corpus
        self.retrain_every = retrain_every
        self.buffer = ObservationBuffer(buffer_size)
        self.config = config or ForestConfig()
        self.seed = seed
        self.retrains = 0
        self._since_retrain = 0
        self._text_curves: OrderedDict[str, tuple[FloatArray, FloatArray]] = OrderedDict()
        self._curve_cache = curve_cache

    @classmethod
    def pretrained(
        cls,
        quantile: float = 0.95,
        seed: int = 0,
        *,
        corpus_size: int = DEFAULT_CORPUS_SIZE,
        retrain_every: int = 4000,
    ) -> QRFEstimator:
        """Trained on the synthetic corpus (a few seconds, once per process per seed);
        learns online from ``observe``."""
        model = pretrained_model(seed, corpus_size)
        corpus = pretrained_corpus(seed, corpus_size) if retrain_every else ()
        return cls(model, quantile, corpus=corpus, retrain_every=retrain_every, seed=seed)

    def _curve(self, req: Request) -> tuple[FloatArray, FloatArray]:
        query = LengthQuery.of(req)
        if not query.prompt_text or self.model.text is None:
            return self.model.curves([query])[0]
        key = req.request_id
        hit = self._text_curves.get(key)
        if hit is None:
            hit = self.model.curves([query])[0]
            self._text_curves[key] = hit
            if len(self._text_curves) > self._curve_cache:
                self._text_curves.popitem(last=False)
        return hit

    def bound(self, req: Request, generated: int) -> int:
        curve, cal = self._curve(req)
        return cap_bound(
            conditional_bound(curve, cal, self.quantile, generated), req.max_tokens, generated
        )

    def expected(self, req: Request, generated: int) -> float:
        """Conditional mean of the same predicted distribution (midpoint rule over five
        equal-probability strata of the remaining tail)."""
        curve, cal = self._curve(req)
        strata = [conditional_bound(curve, cal, q, generated) for q in (0.1, 0.3, 0.5, 0.7, 0.9)]
        return float(cap_bound(round(sum(strata) / len(strata)), req.max_tokens, generated))

    def bounds(self, reqs: Sequence[Request], generated: Sequence[int]) -> list[int]:
        """Batch form of :meth:`bound`."""
        return self.model.bounds([LengthQuery.of(r) for r in reqs], self.quantile, generated)

    def observe(self, req: Request, output_tokens: int) -> None:
        self._text_curves.pop(req.request_id, None)
        self.buffer.add(record_of(LengthQuery.of(req), output_tokens))
        self._since_retrain += 1
        if self.retrain_every and self._since_retrain >= self.retrain_every:
            self.retrain()

    def retrain(self) -> LengthModel:
        """Retrain now on the corpus plus the buffer, and swap the model in."""
        version = self.model.version
        self.model = train_model(
            self.corpus,
            list(self.buffer.records),
            self.config,
            seed=self.seed + version,
            version=version + 1,
            previous=self.model,
        )
        self._text_curves.clear()
        self._since_retrain = 0
        self.retrains += 1
        return self.model


def observe_many(estimator: QRFEstimator, items: Iterable[tuple[Request, int]]) -> None:
    for req, n in items:
        estimator.observe(req, n)
