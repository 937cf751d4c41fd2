"""The trained length model and its bound arithmetic (JITServe paper section 4.1).

Role: prediction from a fitted model, nothing else. A :class:`Forest` returns each
request's whole predictive distribution as a curve over :data:`LEVELS`;
:class:`LengthModel` (immutable once built) holds the meta and text forests and turns
:class:`LengthQuery` objects into curves; :func:`conditional_bound` and :func:`cap_bound`
turn a curve into the bound at arrival or after ``g`` generated tokens. Fitting lives in
:mod:`jitserve.analyzer.qrf_train`, the in-process estimator in :mod:`jitserve.analyzer.qrf`.

``predict`` of quantile-forest goes through scikit-learn's joblib-parallel ``apply``,
which costs ~10 ms per call; :class:`Forest` calls each tree's ``apply`` directly and
then quantile-forest's own weighted-quantile kernel (``forest_.predict``), which gives
identical numbers (tested) in well under a millisecond.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from quantile_forest import RandomForestQuantileRegressor

from jitserve.analyzer import features as F
from jitserve.requests import Request

FloatArray = npt.NDArray[np.float64]

LEVELS: FloatArray = np.concatenate(
    [np.arange(1, 19) / 20.0, [0.925, 0.95, 0.975, 0.99, 0.995, 0.999]]
)
"""Quantile levels of the predictive curve a forest returns for each request."""
_LEVEL_LIST: list[float] = [float(x) for x in LEVELS]
PROMPT_BUCKETS_PER_OCTAVE = 8
MAX_BOUND = 1 << 20


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
