"""Quantile-regression-forest length bounds in-process (JITServe paper section 4.1).

Data flow and who owns each stage:

1. *Training data* and *training* (:mod:`jitserve.analyzer.qrf_train`): the synthetic
   corpus plus observed completions in an ``ObservationBuffer``; ``train_model`` fits and
   calibrates the meta and text forests.
2. *Prediction* (:mod:`jitserve.analyzer.qrf_model`, immutable once built): a forest
   returns each request's whole predictive distribution as a curve over ``LEVELS``. The
   bound at arrival is the calibrated q-quantile. Refinement after ``g`` generated tokens
   is the q-quantile of the same distribution *conditioned on the output being longer than
   g* (``conditional_bound``): the bound relaxes toward the truth as generation goes on
   and never falls to or below ``g``; beyond the curve's range a Pareto tail fitted to
   the curve's top extrapolates. The meta view is cached by (app, model, SLO kind,
   prompt-length bucket), so the simulator pays a dictionary lookup per call.
3. *Serving* (this module): :class:`QRFEstimator` implements the scheduler's
   :class:`~jitserve.scheduling.estimators.LengthEstimator` in-process (simulator,
   sidecar fallback); :mod:`jitserve.analyzer.service` wraps a model behind gRPC.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

from jitserve.analyzer.corpus import LengthRecord
from jitserve.analyzer.qrf_model import FloatArray, LengthQuery, cap_bound, conditional_bound

# model.pkl checkpoints written before the model moved to qrf_model pickled these classes
# as jitserve.analyzer.qrf.*; unpickling such a checkpoint looks them up here.
from jitserve.analyzer.qrf_model import Forest as Forest
from jitserve.analyzer.qrf_model import LengthModel as LengthModel
from jitserve.analyzer.qrf_train import (
    DEFAULT_CORPUS_SIZE,
    ForestConfig,
    ObservationBuffer,
    pretrained_corpus,
    pretrained_model,
    record_of,
    train_model,
)
from jitserve.requests import Request
from jitserve.scheduling.estimators import LengthEstimator


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
