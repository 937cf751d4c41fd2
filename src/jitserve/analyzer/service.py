"""The analyzer as a gRPC service: one per namespace, shared by every scheduler sidecar.

Who owns what:
- :class:`AnalyzerCore` owns the state — the current :class:`~.qrf.LengthModel` (swapped
  atomically after a background retrain), the :class:`~.qrf.ObservationBuffer`, the
  :class:`~.matcher.PatternHistory`, the coverage window — and the worker thread that
  retrains and checkpoints (:mod:`.state`). It knows nothing about gRPC.
- :func:`build_server` owns the transport: request validation (anything malformed,
  out of range or over the limits in :class:`Limits` is answered INVALID_ARGUMENT with
  a message naming the field; bytes that do not parse as the request message too),
  conversion between protobuf and the core's types, the standard ``grpc.health.v1``
  service (NOT_SERVING until the model is loaded) and per-RPC latency metrics.
- :func:`serve` (``jitserve analyzer serve``) wires both to a port, a Prometheus
  endpoint and signal handling (SIGTERM: stop taking calls, checkpoint, exit).

Messages larger than ``max_message_bytes`` are refused by gRPC itself with
RESOURCE_EXHAUSTED before any of this code runs.
"""

from __future__ import annotations

import logging
import math
import signal
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc
from google.protobuf.message import DecodeError, Message
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from jitserve.analyzer import state
from jitserve.analyzer.corpus import LengthRecord
from jitserve.analyzer.features import OTHER_APP, SLO_KINDS
from jitserve.analyzer.graphs import StageSummary
from jitserve.analyzer.matcher import MatchResult, PatternHistory
from jitserve.analyzer.proto import analyzer_pb2 as pb
from jitserve.analyzer.qrf import (
    DEFAULT_CORPUS_SIZE,
    FloatArray,
    ForestConfig,
    LengthModel,
    LengthQuery,
    ObservationBuffer,
    cap_bound,
    conditional_bound,
    pretrained_corpus,
    pretrained_model,
    train_model,
)
from jitserve.analyzer.wire import NO_TOOL

log = logging.getLogger("jitserve.analyzer")

SERVICE_NAME = "jitserve.analyzer.v1.Analyzer"


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


class InvalidArgument(Exception):
    """A request field is malformed or over a limit (becomes INVALID_ARGUMENT)."""


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


# --- validation and conversion (pure) -------------------------------------------------


def _check_name(value: str, where: str, limits: Limits) -> None:
    if len(value) > limits.max_name_chars:
        raise InvalidArgument(f"{where}: longer than {limits.max_name_chars} characters")


def _check_range(value: float, lo: float, hi: float, where: str) -> None:
    if not (math.isfinite(value) and lo <= value <= hi):
        raise InvalidArgument(f"{where}: must be in [{lo:g}, {hi:g}], got {value!r}")


def query_from_pb(q: pb.LengthQuery, where: str, limits: Limits) -> LengthQuery:
    _check_range(q.prompt_tokens, 1, limits.max_prompt_tokens, f"{where}.prompt_tokens")
    _check_range(q.generated, 0, limits.max_output_tokens, f"{where}.generated")
    _check_range(q.max_tokens, 0, limits.max_output_tokens, f"{where}.max_tokens")
    for name in ("request_id", "app", "model"):
        _check_name(getattr(q, name), f"{where}.{name}", limits)
    if q.slo_kind and q.slo_kind not in SLO_KINDS:
        raise InvalidArgument(f"{where}.slo_kind: must be one of {', '.join(SLO_KINDS)} or empty, "
                              f"got {q.slo_kind[:40]!r}")
    if len(q.prompt_text) > limits.max_text_bytes or (
            len(q.prompt_text.encode()) > limits.max_text_bytes):
        raise InvalidArgument(f"{where}.prompt_text: longer than {limits.max_text_bytes} bytes")
    return LengthQuery(
        prompt_tokens=q.prompt_tokens, app=q.app or OTHER_APP, model=q.model or "default",
        slo_kind=q.slo_kind, prompt_text=q.prompt_text or None, max_tokens=q.max_tokens or None,
    )


def stage_from_pb(st: pb.StageRecord, where: str, limits: Limits,
                  outputs_known: bool = True) -> StageSummary:
    if not st.calls:
        raise InvalidArgument(f"{where}.calls: a stage needs at least one call")
    if len(st.calls) > limits.max_calls_per_stage:
        raise InvalidArgument(f"{where}.calls: more than {limits.max_calls_per_stage} calls")
    for i, call in enumerate(st.calls):
        _check_range(call.prompt_tokens, 1, limits.max_prompt_tokens,
                     f"{where}.calls[{i}].prompt_tokens")
        _check_range(call.output_tokens, 0, limits.max_output_tokens,
                     f"{where}.calls[{i}].output_tokens")
        _check_name(call.model, f"{where}.calls[{i}].model", limits)
    _check_name(st.tool, f"{where}.tool", limits)
    _check_range(st.tool_s, 0, limits.max_seconds, f"{where}.tool_s")
    _check_range(st.stage_s, 0, limits.max_seconds, f"{where}.stage_s")
    return StageSummary(
        models=tuple(sorted({c.model or "default" for c in st.calls})), calls=len(st.calls),
        input_tokens=sum(c.prompt_tokens for c in st.calls),
        output_tokens=max(c.output_tokens for c in st.calls) if outputs_known else 0,
        tool=(st.tool or NO_TOOL) if outputs_known else NO_TOOL,
        tool_s=st.tool_s if outputs_known else 0.0, stage_s=st.stage_s,
    )


def _quantile(request: pb.PredictRequest, default: float) -> float:
    q = request.quantile
    if q == 0:
        return default
    if not (math.isfinite(q) and 0 < q < 1):
        raise InvalidArgument(f"quantile: must be in (0, 1) or 0 for the default, got {q!r}")
    return q


# --- transport --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Malformed:
    reason: str


MessageT = TypeVar("MessageT", bound=Message)


def _safe_parser(cls: type[MessageT]) -> Callable[[bytes], MessageT | _Malformed]:
    def parse(data: bytes) -> MessageT | _Malformed:
        try:
            message: MessageT = cls.FromString(data)
            return message
        except (DecodeError, ValueError, RuntimeError) as err:
            return _Malformed(str(err) or type(err).__name__)

    return parse


class _Servicer:
    def __init__(self, core: AnalyzerCore) -> None:
        self.core = core
        self.limits = core.config.limits

    def _queries(self, request: pb.PredictRequest, rpc: str
                 ) -> tuple[list[LengthQuery], list[int], list[str], float]:
        n = len(request.queries)
        if n == 0:
            raise InvalidArgument("queries: empty batch")
        if n > self.limits.max_batch:
            raise InvalidArgument(f"queries: batch of {n} is over the limit of "
                                  f"{self.limits.max_batch}")
        quantile = _quantile(request, self.core.config.quantile)
        queries = [query_from_pb(q, f"queries[{i}]", self.limits)
                   for i, q in enumerate(request.queries)]
        generated = [int(q.generated) for q in request.queries]
        return queries, generated, [q.request_id for q in request.queries], quantile

    def predict(self, request: pb.PredictRequest, rpc: str) -> pb.PredictResponse:
        queries, generated, ids, quantile = self._queries(request, rpc)
        model = self.core.model
        bounds = self.core.predict(queries, generated, ids, quantile)
        return pb.PredictResponse(
            bounds=[pb.LengthBound(request_id=rid, bound=b)
                    for rid, b in zip(ids, bounds, strict=True)],
            model_version=model.version,
        )

    def observe(self, request: pb.ObserveRequest) -> pb.ObserveResponse:
        n = len(request.completions)
        if n > self.limits.max_completions:
            raise InvalidArgument(f"completions: {n} is over the limit of "
                                  f"{self.limits.max_completions}")
        items = []
        for i, c in enumerate(request.completions):
            if not c.HasField("query"):
                raise InvalidArgument(f"completions[{i}].query: missing")
            query = query_from_pb(c.query, f"completions[{i}].query", self.limits)
            _check_range(c.output_tokens, 1, self.limits.max_output_tokens,
                         f"completions[{i}].output_tokens")
            items.append((c.query.request_id, query, int(c.output_tokens)))
        buffered = self.core.observe(items)
        return pb.ObserveResponse(accepted=len(items), buffered=buffered)

    def match(self, request: pb.MatchRequest) -> pb.MatchResponse:
        _check_name(request.app, "app", self.limits)
        _check_name(request.program_id, "program_id", self.limits)
        if len(request.done) >= self.limits.max_stages:
            raise InvalidArgument(f"done: {len(request.done)} stages is over the limit of "
                                  f"{self.limits.max_stages - 1}")
        if not request.HasField("current"):
            raise InvalidArgument("current: missing (the stage that is starting)")
        done = [stage_from_pb(st, f"done[{i}]", self.limits) for i, st in enumerate(request.done)]
        current = stage_from_pb(request.current, "current", self.limits, outputs_known=False)
        result = self.core.match(request.app or OTHER_APP, done, current)
        return pb.MatchResponse(share=result.share,
                                expected_remaining_stages=result.expected_remaining_stages,
                                candidates=result.candidates, method=result.method)

    def record(self, request: pb.RecordRequest) -> pb.RecordResponse:
        _check_name(request.app, "app", self.limits)
        _check_name(request.program_id, "program_id", self.limits)
        if not request.stages:
            raise InvalidArgument("stages: a program needs at least one stage")
        if len(request.stages) > self.limits.max_stages:
            raise InvalidArgument(f"stages: {len(request.stages)} is over the limit of "
                                  f"{self.limits.max_stages}")
        stages = [stage_from_pb(st, f"stages[{i}]", self.limits)
                  for i, st in enumerate(request.stages)]
        size = self.core.record(request.app or OTHER_APP, request.program_id, stages)
        return pb.RecordResponse(history_size=size)


def _handler(core: AnalyzerCore, rpc: str, request_cls: type[Message],
             response_cls: type[Message], fn: Callable[[Any], Message]) -> Any:
    metrics = core.metrics

    def handle(request: Any, context: Any) -> Message:
        started = time.perf_counter()
        try:
            if isinstance(request, _Malformed):
                raise InvalidArgument(f"malformed {request_cls.__name__} message: {request.reason}")
            return fn(request)
        except InvalidArgument as err:
            metrics.invalid.labels(rpc).inc()
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
            raise  # unreachable: abort raises
        except NotReady as err:
            context.abort(grpc.StatusCode.UNAVAILABLE, str(err))
            raise
        finally:
            metrics.rpc_seconds.labels(rpc).observe(time.perf_counter() - started)

    return grpc.unary_unary_rpc_method_handler(
        handle, request_deserializer=_safe_parser(request_cls),
        response_serializer=response_cls.SerializeToString,
    )


def build_server(core: AnalyzerCore, address: str) -> tuple[Any, int, health.HealthServicer]:
    """A started-ready (not yet started) gRPC server bound to ``address``; returns the
    server, the bound port (``:0`` picks a free one) and the health servicer."""
    size = core.config.max_message_bytes
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=core.config.workers,
                                   thread_name_prefix="analyzer-rpc"),
        options=[("grpc.max_receive_message_length", size),
                 ("grpc.max_send_message_length", size),
                 ("grpc.so_reuseport", 0)],
    )
    servicer = _Servicer(core)
    handlers = {
        "PredictBound": _handler(core, "PredictBound", pb.PredictRequest, pb.PredictResponse,
                                 lambda r: servicer.predict(r, "PredictBound")),
        "Refine": _handler(core, "Refine", pb.PredictRequest, pb.PredictResponse,
                           lambda r: servicer.predict(r, "Refine")),
        "ObserveCompletion": _handler(core, "ObserveCompletion", pb.ObserveRequest,
                                      pb.ObserveResponse, servicer.observe),
        "MatchProgram": _handler(core, "MatchProgram", pb.MatchRequest, pb.MatchResponse,
                                 servicer.match),
        "RecordProgram": _handler(core, "RecordProgram", pb.RecordRequest, pb.RecordResponse,
                                  servicer.record),
        "Stats": _handler(core, "Stats", pb.StatsRequest, pb.StatsResponse,
                          lambda r: core.stats()),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    not_serving = health_pb2.HealthCheckResponse.NOT_SERVING
    for name in ("", SERVICE_NAME):
        health_servicer.set(name, not_serving)

    def mark_serving() -> None:
        for name in ("", SERVICE_NAME):
            health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)

    core.on_ready.append(mark_serving)
    if core.ready.is_set():
        mark_serving()
    port = server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"could not bind the analyzer to {address}")
    return server, int(port), health_servicer


def serve(config: ServiceConfig, host: str, port: int, metrics_port: int | None,
          grace_s: float = 5.0) -> int:
    """Run until SIGTERM/SIGINT; checkpoint on the way out."""
    from prometheus_client import start_http_server

    core = AnalyzerCore(config)
    server, bound, health_servicer = build_server(core, f"{host}:{port}")
    server.start()
    core.start(background=True)
    if metrics_port is not None:
        start_http_server(metrics_port, addr=host, registry=core.metrics.registry)
    log.info("analyzer listening on %s:%d (metrics: %s, state: %s)", host, bound,
             metrics_port if metrics_port is not None else "off", config.state_dir or "none")
    print(f"analyzer listening on {host}:{bound}", flush=True)
    stopping = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("signal %d: shutting down", signum)
        stopping.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    stopping.wait()
    health_servicer.enter_graceful_shutdown()
    server.stop(grace_s).wait()
    core.stop()
    log.info("analyzer stopped; state checkpointed")
    return 0
