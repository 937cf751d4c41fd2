"""The analyzer service's state and background work, independent of any transport.

Role: :class:`AnalyzerCore` owns the current :class:`~jitserve.analyzer.qrf_model.LengthModel`
(swapped atomically after a background retrain), the
:class:`~jitserve.analyzer.qrf_train.ObservationBuffer`, the
:class:`~jitserve.analyzer.matcher.PatternHistory`, the coverage window and the worker
thread that retrains and checkpoints (:mod:`jitserve.analyzer.state`); :class:`Metrics`
holds the Prometheus metrics it updates. It knows nothing about gRPC: the transport in
:mod:`jitserve.analyzer.service` validates and converts requests and calls it.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from jitserve.analyzer import state
from jitserve.analyzer.corpus import LengthRecord
from jitserve.analyzer.graphs import StageSummary
from jitserve.analyzer.matcher import MatchResult, PatternHistory
from jitserve.analyzer.proto import analyzer_pb2 as pb
from jitserve.analyzer.qrf_model import (
    FloatArray,
    LengthModel,
    LengthQuery,
    cap_bound,
    conditional_bound,
)
from jitserve.analyzer.qrf_train import (
    ObservationBuffer,
    pretrained_corpus,
    pretrained_model,
    train_model,
)
from jitserve.analyzer.service_config import ServiceConfig

log = logging.getLogger("jitserve.analyzer")


class NotReady(Exception):
    """The model is still loading (becomes UNAVAILABLE)."""


class Metrics:
    """The service's Prometheus metrics, in their own registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        fast = (0.0002, 0.0005, 0.001, 0.002, 0.003, 0.005, 0.007, 0.01, 0.02, 0.05, 0.1, 0.5)
        self.rpc_seconds = Histogram("jitserve_analyzer_rpc_seconds", "Server-side time per RPC.",
                                     ["rpc"], buckets=fast, registry=registry)
        self.predict_seconds = Histogram(
            "jitserve_analyzer_prediction_seconds",
            "Time to compute a batch of length bounds (PredictBound and Refine).",
            buckets=fast, registry=registry)
        self.invalid = Counter("jitserve_analyzer_invalid_requests_total",
                               "Requests refused with INVALID_ARGUMENT.", ["rpc"],
                               registry=registry)
        self.coverage = Gauge("jitserve_analyzer_coverage",
                              "Fraction of recent completions whose length was <= the bound "
                              "given at arrival.", registry=registry)
        self.overestimation = Gauge("jitserve_analyzer_overestimation_ratio",
                                    "Mean bound at arrival / true length over recent completions.",
                                    registry=registry)
        self.history_size = Gauge("jitserve_analyzer_history_size",
                                  "Pattern graphs in the history.", registry=registry)
        self.buffer_size = Gauge("jitserve_analyzer_buffer_size",
                                 "Observed completions in the training buffer.", registry=registry)
        self.retrains = Counter("jitserve_analyzer_retrains_total", "Background retrains.",
                                registry=registry)
        self.retrain_seconds = Histogram(
            "jitserve_analyzer_retrain_seconds", "Duration of a retrain.",
            buckets=(0.5, 1, 2, 5, 10, 20, 40, 80, 160), registry=registry)
        self.model_version = Gauge("jitserve_analyzer_model_version",
                                   "Version of the length model in use.", registry=registry)
        self.checkpoint_failures = Counter("jitserve_analyzer_checkpoint_failures_total",
                                           "Checkpoints that could not be written.",
                                           registry=registry)


class AnalyzerCore:
    """Transport-independent analyzer state and logic; thread-safe."""

    def __init__(self, config: ServiceConfig | None = None,
                 registry: CollectorRegistry | None = None) -> None:
        self.config = config or ServiceConfig()
        self.metrics = Metrics(registry or CollectorRegistry())
        self.ready = threading.Event()
        self._model: LengthModel | None = None
        self._lock = threading.Lock()
        self.buffer = ObservationBuffer(self.config.buffer_size)
        self.history = self._new_history()
        self.retrains = 0
        self._new_since_train = 0
        self._last_train = 0.0
        self._arrival: OrderedDict[str, int] = OrderedDict()
        self._curves: OrderedDict[str, tuple[LengthModel, FloatArray, FloatArray]] = OrderedDict()
        """Predictive curves of requests in flight: refinements reuse them."""
        self._window: deque[tuple[bool, float]] = deque(maxlen=self.config.coverage_window)
        self._corpus: list[LengthRecord] | None = None
        self._saved_version = -1
        self._dirty = False
        self._last_checkpoint = time.monotonic()
        self._stop = threading.Event()
        self._worker: threading.Thread | None = None
        self.on_ready: list[Callable[[], None]] = []

    def _new_history(self) -> PatternHistory:
        return PatternHistory(capacity=self.config.history_capacity)

    # -- lifecycle ----------------------------------------------------------------------

    def start(self, background: bool = True) -> None:
        """Restore the checkpoint (history and buffer now, the model in the worker
        thread when ``background``) and start retraining/checkpointing."""
        state_dir = self.config.state_dir
        if state_dir is not None:
            state_dir.mkdir(parents=True, exist_ok=True)
            history = state.load_history(state_dir, self._new_history)
            if history is not None:
                self.history = history
                log.info("restored %d pattern graphs from %s", len(history), state_dir)
            buffered = state.load_buffer(state_dir)
            if buffered is not None:
                records, total = buffered
                for r in records:
                    self.buffer.add(r)
                self.buffer.total = total
                log.info("restored %d buffered completions from %s", len(records), state_dir)
        self.metrics.history_size.set(len(self.history))
        self.metrics.buffer_size.set(len(self.buffer))
        if background:
            self._worker = threading.Thread(target=self._run, name="analyzer-worker", daemon=True)
            self._worker.start()
        else:
            self._load_model()

    def _load_model(self) -> None:
        model = None
        if self.config.state_dir is not None:
            model = state.load_model(self.config.state_dir)
            if model is not None:
                log.info("restored length model v%d from %s", model.version, self.config.state_dir)
                self._saved_version = model.version
        if model is None:
            started = time.monotonic()
            model = pretrained_model(self.config.seed, self.config.corpus_size)
            log.info("trained length model on %d synthetic prompts in %.1fs",
                     self.config.corpus_size, time.monotonic() - started)
        self.use_model(model)

    def use_model(self, model: LengthModel) -> None:
        """Serve ``model`` from now on and mark the core ready."""
        self._swap(model)
        self._last_train = time.monotonic()
        self.ready.set()
        for callback in self.on_ready:
            callback()

    def _swap(self, model: LengthModel) -> None:
        with self._lock:
            self._model = model
        self.metrics.model_version.set(model.version)

    @property
    def model(self) -> LengthModel:
        model = self._model
        if model is None:
            raise NotReady("the length model is loading; retry shortly")
        return model

    def _run(self) -> None:
        try:
            self._load_model()
        except Exception:
            log.exception("could not load or train the length model")
            raise
        while not self._stop.wait(0.25):
            try:
                self.maintain()
            except Exception:  # the worker must survive anything; the next tick retries
                log.exception("analyzer maintenance failed")

    def maintain(self, now: float | None = None) -> None:
        """Retrain and checkpoint when due (called by the worker thread)."""
        now = time.monotonic() if now is None else now
        if (self._new_since_train >= self.config.retrain_min_new
                and now - self._last_train >= self.config.retrain_interval_s):
            self.retrain()
        if self._dirty and now - self._last_checkpoint >= self.config.checkpoint_interval_s:
            self.checkpoint()

    def retrain(self) -> LengthModel:
        previous = self.model
        with self._lock:
            observed = list(self.buffer.records)
            self._new_since_train = 0
        if self._corpus is None:
            self._corpus = list(pretrained_corpus(self.config.seed, self.config.corpus_size))
        started = time.monotonic()
        model = train_model(self._corpus, observed, self.config.forest,
                            seed=self.config.seed + previous.version,
                            version=previous.version + 1, previous=previous)
        elapsed = time.monotonic() - started
        self._swap(model)
        self._last_train = time.monotonic()
        self.retrains += 1
        self.metrics.retrains.inc()
        self.metrics.retrain_seconds.observe(elapsed)
        log.info("retrained length model v%d on %d rows (%d observed) in %.1fs",
                 model.version, model.rows, model.observed_rows, elapsed)
        self.checkpoint()
        return model

    def checkpoint(self) -> None:
        state_dir = self.config.state_dir
        if state_dir is None:
            return
        try:
            model = self._model
            if model is not None and model.version != self._saved_version:
                state.save_model(state_dir, model)
                self._saved_version = model.version
            with self._lock:
                records = list(self.buffer.records)
                total = self.buffer.total
                self._dirty = False
            state.save_buffer(state_dir, records, total)
            state.save_history(state_dir, self.history)
            self._last_checkpoint = time.monotonic()
        except OSError as err:
            self.metrics.checkpoint_failures.inc()
            self._dirty = True
            log.error("could not write checkpoint to %s: %s", state_dir, err)

    def stop(self) -> None:
        self._stop.set()
        if self._worker is not None:
            self._worker.join(timeout=60)
        if self.ready.is_set():
            self.checkpoint()

    # -- operations ---------------------------------------------------------------------

    def predict(self, queries: Sequence[LengthQuery], generated: Sequence[int],
                request_ids: Sequence[str], quantile: float) -> list[int]:
        started = time.perf_counter()
        model = self.model
        curves: list[tuple[FloatArray, FloatArray] | None] = [None] * len(queries)
        with self._lock:
            for i, rid in enumerate(request_ids):
                hit = self._curves.get(rid) if rid else None
                if hit is not None and hit[0] is model:
                    curves[i] = (hit[1], hit[2])
        missing = [i for i, c in enumerate(curves) if c is None]
        if missing:
            fresh = model.curves([queries[i] for i in missing])
            with self._lock:
                for i, (curve, cal) in zip(missing, fresh, strict=True):
                    curves[i] = (curve, cal)
                    if request_ids[i]:
                        self._curves[request_ids[i]] = (model, curve, cal)
                while len(self._curves) > self.config.remembered_requests:
                    self._curves.popitem(last=False)
        bounds = []
        for q, g, c in zip(queries, generated, curves, strict=True):
            assert c is not None
            bounds.append(cap_bound(conditional_bound(c[0], c[1], quantile, g), q.max_tokens, g))
        with self._lock:
            for rid, g, b in zip(request_ids, generated, bounds, strict=True):
                if rid and g == 0 and rid not in self._arrival:
                    self._arrival[rid] = b
                    if len(self._arrival) > self.config.remembered_requests:
                        self._arrival.popitem(last=False)
        self.metrics.predict_seconds.observe(time.perf_counter() - started)
        return bounds

    def observe(self, completions: Sequence[tuple[str, LengthQuery, int]]) -> int:
        with self._lock:
            for rid, query, output in completions:
                self.buffer.add(LengthRecord(state.compact_text(query.prompt_text),
                                             query.prompt_tokens, output, query.app,
                                             query.model, query.slo_kind))
                arrival = self._arrival.pop(rid, None) if rid else None
                if rid:
                    self._curves.pop(rid, None)
                if arrival is not None:
                    self._window.append((output <= arrival, arrival / max(1, output)))
            self._new_since_train += len(completions)
            self._dirty = True
            window = list(self._window)
        if window:
            self.metrics.coverage.set(sum(c for c, _ in window) / len(window))
            self.metrics.overestimation.set(sum(r for _, r in window) / len(window))
        self.metrics.buffer_size.set(len(self.buffer))
        return len(self.buffer)

    def coverage(self) -> tuple[float, float]:
        with self._lock:
            window = list(self._window)
        if not window:
            return math.nan, math.nan
        return (sum(c for c, _ in window) / len(window), sum(r for _, r in window) / len(window))

    def match(self, app: str, done: Sequence[StageSummary], current: StageSummary) -> MatchResult:
        return self.history.match(app, done, current)

    def record(self, app: str, program_id: str, stages: Sequence[StageSummary]) -> int:
        self.history.add(stages, app, program_id)
        with self._lock:
            self._dirty = True
        size = len(self.history)
        self.metrics.history_size.set(size)
        return size

    def stats(self) -> pb.StatsResponse:
        model = self._model
        coverage, over = self.coverage()
        return pb.StatsResponse(
            model_version=model.version if model else 0,
            model_trained_at=model.trained_at if model else 0.0,
            training_rows=model.rows if model else 0,
            observed_rows=model.observed_rows if model else 0,
            buffered=len(self.buffer), observed_total=self.buffer.total,
            history_size=len(self.history), retrains=self.retrains,
            coverage=coverage, mean_overestimation=over,
            default_quantile=self.config.quantile, ready=self.ready.is_set(),
        )
