"""Python clients of the analyzer service, for the sidecar and the simulator.

Who owns what: the caller owns requests and programs; the client converts them to the
wire format, puts a deadline on every call and — when the service is unreachable, slow
or refuses — answers from a local fallback estimator instead (by default the core's
:class:`~jitserve.scheduling.estimators.QuantileEstimator`, which the client keeps warm
with every observed completion, and :class:`~jitserve.scheduling.estimators.UniformStageShare`).
Every fallback is counted in ``jitserve_analyzer_client_fallbacks_total{call,reason}``
(default Prometheus registry, so the sidecar's ``/metrics`` shows it).

A call never blocks a request: besides the deadline, after a failure the client stops
trying the service for a back-off period (1 s doubling to 30 s, reset on success) and
goes straight to the fallback. Observations and finished programs are sent
fire-and-forget.

:class:`AnalyzerClient` is blocking (simulator, threads); :class:`AsyncAnalyzerClient`
is the same over ``grpc.aio`` for asyncio code. :class:`RemoteLengthEstimator` and
:class:`RemoteStageShare` adapt a blocking client to the scheduler's estimator
interfaces.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import grpc
import grpc.aio
from prometheus_client import Counter

from jitserve.analyzer.proto import analyzer_pb2 as pb
from jitserve.analyzer.proto import analyzer_pb2_grpc as pb_grpc
from jitserve.analyzer.wire import NO_TOOL
from jitserve.requests import Program, Request, Stage
from jitserve.scheduling.estimators import (
    LengthEstimator,
    QuantileEstimator,
    StageShareEstimator,
    UniformStageShare,
)

FALLBACKS = Counter(
    "jitserve_analyzer_client_fallbacks_total",
    "Analyzer calls answered by the local fallback (service unreachable, slow or refusing).",
    ["call", "reason"],
)
CLIENT_ERRORS = Counter(
    "jitserve_analyzer_client_send_failures_total",
    "Fire-and-forget sends (observations, programs) that did not reach the analyzer.",
    ["call"],
)
def make_stub(channel: Any) -> Any:
    """The generated (untyped) stub for ``channel`` (sync or aio)."""
    return pb_grpc.AnalyzerStub(channel)  # type: ignore[no-untyped-call]


_OPTIONS = [("grpc.max_receive_message_length", 8 << 20), ("grpc.max_send_message_length", 8 << 20)]


# --- conversion (pure) ------------------------------------------------------------------


def query_pb(req: Request, generated: int = 0) -> pb.LengthQuery:
    return pb.LengthQuery(
        request_id=req.request_id, prompt_tokens=req.prompt_tokens,
        prompt_text=req.prompt_text or "", app=req.app, model=req.model,
        slo_kind=req.kind.value, generated=generated, max_tokens=req.max_tokens or 0,
    )


def stage_pb(stage: Stage, outputs_known: bool, stage_s: float = 0.0) -> pb.StageRecord:
    return pb.StageRecord(
        calls=[pb.Call(model=c.model, prompt_tokens=c.prompt_tokens,
                       output_tokens=c.output_tokens if outputs_known else 0) for c in stage.calls],
        tool=stage.tool if outputs_known else NO_TOOL,
        tool_s=stage.tool_s if outputs_known else 0.0, stage_s=stage_s,
    )


def match_pb(program: Program, stage: int) -> pb.MatchRequest:
    """What is known when ``stage`` starts: finished stages and the new stage's calls."""
    return pb.MatchRequest(
        program_id=program.program_id, app=program.app,
        done=[stage_pb(s, True) for s in program.stages[:stage]],
        current=stage_pb(program.stages[stage], False),
    )


def record_pb(program: Program, stage_seconds: Sequence[float]) -> pb.RecordRequest:
    return pb.RecordRequest(
        program_id=program.program_id, app=program.app,
        stages=[stage_pb(s, True, t) for s, t in zip(program.stages, stage_seconds, strict=True)],
    )


def _reason(err: BaseException) -> str:
    if isinstance(err, grpc.RpcError):
        code = err.code()
        return str(code.name).lower() if code is not None else "rpc_error"
    return type(err).__name__.lower()


class _Breaker:
    """Back-off after a failure so an unreachable service costs nothing per call."""

    def __init__(self, backoff_s: float, max_backoff_s: float,
                 clock: Callable[[], float]) -> None:
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.clock = clock
        self._delay = backoff_s
        self._down_until = 0.0
        self._lock = threading.Lock()

    def allow(self) -> bool:
        return self.clock() >= self._down_until

    def failure(self) -> None:
        with self._lock:
            self._down_until = self.clock() + self._delay
            self._delay = min(self.max_backoff_s, self._delay * 2)

    def success(self) -> None:
        with self._lock:
            self._delay = self.backoff_s
            self._down_until = 0.0


class _Base:
    def __init__(self, timeout_s: float, fallback: LengthEstimator | None,
                 stage_fallback: StageShareEstimator | None, quantile: float | None,
                 backoff_s: float, max_backoff_s: float, clock: Callable[[], float]) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.timeout_s = timeout_s
        self.quantile = quantile or 0.0
        self.fallback = fallback or QuantileEstimator(quantile or 0.95)
        self.stage_fallback = stage_fallback or UniformStageShare()
        self.breaker = _Breaker(backoff_s, max_backoff_s, clock)
        self._fallback_lock = threading.Lock()

    def _fallback_bounds(self, call: str, reason: str, reqs: Sequence[Request],
                         generated: Sequence[int]) -> list[int]:
        FALLBACKS.labels(call, reason).inc(len(reqs))
        with self._fallback_lock:
            return [self.fallback.bound(r, g) for r, g in zip(reqs, generated, strict=True)]

    def _fallback_share(self, reason: str, program: Program, stage: int) -> float:
        FALLBACKS.labels("match", reason).inc()
        with self._fallback_lock:
            return self.stage_fallback.stage_share(program, stage)

    def _observe_local(self, req: Request, output_tokens: int) -> None:
        with self._fallback_lock:
            self.fallback.observe(req, output_tokens)

    def _record_local(self, program: Program, stage_seconds: list[float]) -> None:
        with self._fallback_lock:
            self.stage_fallback.observe_program(program, stage_seconds)

    def _predict_request(self, reqs: Sequence[Request], generated: Sequence[int]
                         ) -> pb.PredictRequest:
        return pb.PredictRequest(
            queries=[query_pb(r, g) for r, g in zip(reqs, generated, strict=True)],
            quantile=self.quantile)


class AnalyzerClient(_Base):
    """Blocking client with deadlines, fallback and back-off."""

    def __init__(self, target: str, *, timeout_s: float = 0.1,
                 fallback: LengthEstimator | None = None,
                 stage_fallback: StageShareEstimator | None = None,
                 quantile: float | None = None, backoff_s: float = 1.0,
                 max_backoff_s: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(timeout_s, fallback, stage_fallback, quantile, backoff_s, max_backoff_s,
                         clock)
        self.target = target
        self._channel = grpc.insecure_channel(target, options=_OPTIONS)
        self._stub = make_stub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> AnalyzerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def bounds(self, reqs: Sequence[Request], generated: Sequence[int] | None = None) -> list[int]:
        """Length bounds for a batch (``generated`` > 0: refinement)."""
        gen = list(generated) if generated is not None else [0] * len(reqs)
        call = "refine" if any(gen) else "predict"
        if not reqs:
            return []
        if not self.breaker.allow():
            return self._fallback_bounds(call, "backoff", reqs, gen)
        method = self._stub.Refine if call == "refine" else self._stub.PredictBound
        try:
            response = method(self._predict_request(reqs, gen), timeout=self.timeout_s)
        except grpc.RpcError as err:
            self.breaker.failure()
            return self._fallback_bounds(call, _reason(err), reqs, gen)
        self.breaker.success()
        return [int(b.bound) for b in response.bounds]

    def _send(self, call: str, method: Any, message: Any) -> None:
        if not self.breaker.allow():
            CLIENT_ERRORS.labels(call).inc()
            return
        future = method.future(message, timeout=max(self.timeout_s, 1.0))

        def done(f: Any) -> None:
            if f.exception() is not None:
                CLIENT_ERRORS.labels(call).inc()

        future.add_done_callback(done)

    def observe(self, req: Request, output_tokens: int) -> None:
        """Feed the local fallback and send the completion (fire-and-forget)."""
        self._observe_local(req, output_tokens)
        self._send("observe", self._stub.ObserveCompletion, pb.ObserveRequest(
            completions=[pb.Completion(query=query_pb(req), output_tokens=output_tokens)]))

    def stage_share(self, program: Program, stage: int) -> float:
        if not self.breaker.allow():
            return self._fallback_share("backoff", program, stage)
        try:
            response = self._stub.MatchProgram(match_pb(program, stage), timeout=self.timeout_s)
        except grpc.RpcError as err:
            self.breaker.failure()
            return self._fallback_share(_reason(err), program, stage)
        self.breaker.success()
        return float(response.share)

    def record_program(self, program: Program, stage_seconds: list[float]) -> None:
        self._record_local(program, stage_seconds)
        self._send("record", self._stub.RecordProgram, record_pb(program, stage_seconds))

    def stats(self) -> pb.StatsResponse | None:
        try:
            response: pb.StatsResponse = self._stub.Stats(pb.StatsRequest(), timeout=self.timeout_s)
            return response
        except grpc.RpcError:
            return None


class AsyncAnalyzerClient(_Base):
    """The same over ``grpc.aio``; create it inside the event loop that uses it."""

    def __init__(self, target: str, *, timeout_s: float = 0.1,
                 fallback: LengthEstimator | None = None,
                 stage_fallback: StageShareEstimator | None = None,
                 quantile: float | None = None, backoff_s: float = 1.0,
                 max_backoff_s: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(timeout_s, fallback, stage_fallback, quantile, backoff_s, max_backoff_s,
                         clock)
        self.target = target
        self._channel = grpc.aio.insecure_channel(target, options=_OPTIONS)
        self._stub = make_stub(self._channel)

    async def close(self) -> None:
        await self._channel.close()

    async def bounds(self, reqs: Sequence[Request], generated: Sequence[int] | None = None
                     ) -> list[int]:
        gen = list(generated) if generated is not None else [0] * len(reqs)
        call = "refine" if any(gen) else "predict"
        if not reqs:
            return []
        if not self.breaker.allow():
            return self._fallback_bounds(call, "backoff", reqs, gen)
        method = self._stub.Refine if call == "refine" else self._stub.PredictBound
        try:
            response = await method(self._predict_request(reqs, gen), timeout=self.timeout_s)
        except grpc.RpcError as err:
            self.breaker.failure()
            return self._fallback_bounds(call, _reason(err), reqs, gen)
        self.breaker.success()
        return [int(b.bound) for b in response.bounds]

    async def observe(self, req: Request, output_tokens: int) -> None:
        self._observe_local(req, output_tokens)
        if not self.breaker.allow():
            CLIENT_ERRORS.labels("observe").inc()
            return
        try:
            await self._stub.ObserveCompletion(pb.ObserveRequest(
                completions=[pb.Completion(query=query_pb(req), output_tokens=output_tokens)]),
                timeout=self.timeout_s)
        except grpc.RpcError:
            CLIENT_ERRORS.labels("observe").inc()
            self.breaker.failure()

    async def stage_share(self, program: Program, stage: int) -> float:
        if not self.breaker.allow():
            return self._fallback_share("backoff", program, stage)
        try:
            response = await self._stub.MatchProgram(match_pb(program, stage),
                                                     timeout=self.timeout_s)
        except grpc.RpcError as err:
            self.breaker.failure()
            return self._fallback_share(_reason(err), program, stage)
        self.breaker.success()
        return float(response.share)

    async def record_program(self, program: Program, stage_seconds: list[float]) -> None:
        self._record_local(program, stage_seconds)
        if not self.breaker.allow():
            CLIENT_ERRORS.labels("record").inc()
            return
        try:
            await self._stub.RecordProgram(record_pb(program, stage_seconds),
                                           timeout=self.timeout_s)
        except grpc.RpcError:
            CLIENT_ERRORS.labels("record").inc()
            self.breaker.failure()


class RemoteLengthEstimator(LengthEstimator):
    """:class:`LengthEstimator` backed by the analyzer service (with its fallback)."""

    name = "analyzer"

    def __init__(self, client: AnalyzerClient) -> None:
        self.client = client

    def bound(self, req: Request, generated: int) -> int:
        return self.client.bounds([req], [generated])[0]

    def observe(self, req: Request, output_tokens: int) -> None:
        self.client.observe(req, output_tokens)


class RemoteStageShare(StageShareEstimator):
    """:class:`StageShareEstimator` backed by the analyzer service (with its fallback)."""

    name = "analyzer"

    def __init__(self, client: AnalyzerClient) -> None:
        self.client = client

    def stage_share(self, program: Program, stage: int) -> float:
        return self.client.stage_share(program, stage)

    def observe_program(self, program: Program, stage_seconds: list[float]) -> None:
        self.client.record_program(program, stage_seconds)
