"""The analyzer as a gRPC service: one per namespace, shared by every scheduler sidecar.

Who owns what:
- :class:`~jitserve.analyzer.service_core.AnalyzerCore` owns the state (model, observation
  buffer, pattern history, coverage window) and the worker thread that retrains and
  checkpoints. It knows nothing about gRPC.
- :func:`build_server` owns the transport: request validation (anything malformed,
  out of range or over the limits in :class:`~jitserve.analyzer.service_config.Limits` is
  answered INVALID_ARGUMENT with a message naming the field; bytes that do not parse as
  the request message too), conversion between protobuf and the core's types, the
  standard ``grpc.health.v1`` service (NOT_SERVING until the model is loaded) and per-RPC
  latency metrics.
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
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from google.protobuf.message import DecodeError, Message
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from jitserve.analyzer.features import OTHER_APP, SLO_KINDS
from jitserve.analyzer.graphs import StageSummary
from jitserve.analyzer.proto import analyzer_pb2 as pb
from jitserve.analyzer.qrf_model import LengthQuery
from jitserve.analyzer.service_config import Limits, ServiceConfig
from jitserve.analyzer.service_core import AnalyzerCore, NotReady
from jitserve.analyzer.wire import NO_TOOL

log = logging.getLogger("jitserve.analyzer")

SERVICE_NAME = "jitserve.analyzer.v1.Analyzer"


class InvalidArgument(Exception):
    """A request field is malformed or over a limit (becomes INVALID_ARGUMENT)."""


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

    # the handlers first: a SIGTERM right after "listening" (a test, a pod deleted at
    # once) must checkpoint and exit 0, not find Python's default action still in place
    stopping = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("signal %d: shutting down", signum)
        stopping.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    core = AnalyzerCore(config)
    server, bound, health_servicer = build_server(core, f"{host}:{port}")
    server.start()
    core.start(background=True)
    if metrics_port is not None:
        start_http_server(metrics_port, addr=host, registry=core.metrics.registry)
    log.info("analyzer listening on %s:%d (metrics: %s, state: %s)", host, bound,
             metrics_port if metrics_port is not None else "off", config.state_dir or "none")
    print(f"analyzer listening on {host}:{bound}", flush=True)
    stopping.wait()
    health_servicer.enter_graceful_shutdown()
    server.stop(grace_s).wait()
    core.stop()
    log.info("analyzer stopped; state checkpointed")
    return 0
