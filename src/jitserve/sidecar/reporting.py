"""What the sidecar reports about its scheduling (owner: sidecar).

Dispatches, tokens, outcomes and frames as Prometheus metrics, the debug logs behind
``/debug/scheduler`` (recent dispatches and frames), the dispatch gap, the output token
rate the replica report carries, and the error a client gets when overload control
retires its request. The dispatcher decides and calls its :class:`Reporter` at each event
(a dispatch, tokens, a freed slot, an ending, a frame, a health change); this module only
tells.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from jitserve.goodput import Outcome
from jitserve.policy import AdmissionSettings, MaxWaitingRetires, SLOPolicySpec
from jitserve.requests import LiveRequest, Request
from jitserve.scheduling.base import Policy, RetireReason
from jitserve.serving.interface import FrameResult, Retired
from jitserve.serving.lifecycle import Lifecycle
from jitserve.serving.speed import SpeedMeter
from jitserve.sidecar.errors import TTL_EXPIRED, APIError, queue_full
from jitserve.sidecar.health import BackendHealth
from jitserve.sidecar.jobs import Job
from jitserve.sidecar.metrics import SidecarMetrics
from jitserve.sidecar.replica import TokenRate


def label(outcome: Outcome) -> str:
    return "met" if outcome.met else "missed"


def nan_as_null(figures: dict[str, float]) -> dict[str, float | None]:
    """``figures`` for JSON: NaN (nothing measured yet) as null."""
    return {k: None if math.isnan(v) else v for k, v in figures.items()}


def retirement_error(reason: RetireReason, retry_after_s: int, admission: AdmissionSettings,
                     streaming: bool = False) -> APIError:
    """What a retired request gets. Before its first token it was shed for load: 429 +
    ``Retry-After`` (a retry starts a new SLO clock), with the reason as the code. A
    stream already under way whose SLO can no longer be met ends with a 503 event that a
    retry of the same request cannot fix."""
    if reason is RetireReason.MAX_WAITING:
        message = f"waiting time exceeded: not scheduled within {admission.max_waiting_seconds:g} s"
        if admission.max_waiting_retires is MaxWaitingRetires.LATE:
            message += ", and started now it would miss its SLO"
        return queue_full(retry_after_s, message, code="waiting_time_exceeded",
                          dropped_reason=TTL_EXPIRED)
    if reason is RetireReason.WOULD_START_LATE:
        return queue_full(retry_after_s, "the first token would come after the TTFT target "
                          "under the current load (forecast at the door)",
                          code="would_start_late")
    message = ("the SLO of this request can no longer be met under the current load "
               "(retired by overload control)")
    if not streaming:
        return queue_full(retry_after_s, message, code="slo_unreachable")
    return APIError(503, message, type_="service_unavailable", code="slo_unreachable",
                    retry_after_s=retry_after_s)


class Reporter:
    """The dispatcher's metrics, logs and figures, updated at its events."""

    def __init__(self, metrics: SidecarMetrics) -> None:
        self.metrics = metrics
        self.token_rate = TokenRate()
        self.dispatch_log: deque[dict[str, Any]] = deque(maxlen=2000)
        self.frame_log: deque[dict[str, Any]] = deque(maxlen=200)
        self.dispatch_gap = DispatchGap()
        self.first_tokens: deque[tuple[float, float, bool]] = deque(maxlen=2000)
        """Recent first tokens: (arrival to first dispatch s, dispatch to first token s,
        dispatched beyond the B slots)."""

    def outcome(self, outcome: Outcome, status: str) -> None:
        labels = (outcome.tenant, outcome.kind.value, outcome.slo_class)
        self.metrics.requests.labels(*labels, status).inc()
        self.metrics.attainment.record(outcome.kind.value,
                                       self.metrics.tenant_label(outcome.tenant),
                                       outcome.slo_class, status)
        if outcome.goodput_tokens:
            self.metrics.goodput_tokens.labels(*labels).inc(outcome.goodput_tokens)
            self.metrics.fairness.earned(outcome.tenant, outcome.goodput_tokens)
        if status in ("met", "missed") and outcome.e2el_s is not None:
            self.metrics.e2el.labels(outcome.kind.value).observe(outcome.e2el_s)

    def ended(self, live: LiveRequest) -> None:
        """A request ended, however: its prompt and generated tokens."""
        req = live.req
        self.metrics.prompt_tokens.labels(req.tenant, req.model).inc(req.prompt_tokens)
        if live.generated:
            self.metrics.generation_tokens.labels(req.tenant, req.model).inc(live.generated)

    def dropped(self, req: Request, status: str) -> None:
        """It ended unserved: ``cancelled`` (its client left) or ``ttl_expired``."""
        self.metrics.requests.labels(req.tenant, req.kind.value, req.slo_class, status).inc()

    def tokens(self, job: Job, n: int, now: float) -> None:
        """``n`` tokens of ``job`` came at ``now``; called before they are delivered (the
        request's first token, or the one before, is still the last delivered)."""
        live = job.live
        kind = live.req.kind.value
        if live.first_token_s is None:
            self.metrics.kind_child("ttft", kind).observe(now - live.req.arrival_s)
            assert live.started_s is not None
            self.first_token(live.started_s - live.req.arrival_s, now - job.dispatched_s,
                             job.queued_in_engine)
        elif job.last_token_s is not None:
            self.metrics.kind_child("tbt", kind).observe(now - job.last_token_s)
        self.token_rate.add(n)

    def first_token(self, queue_s: float, engine_s: float, queued_in_engine: bool) -> None:
        """A request's first token: its TTFT in two parts, the sidecar's and vLLM's."""
        self.metrics.engine_first_token.labels("yes" if queued_in_engine else "no").observe(
            engine_s)
        self.first_tokens.append((queue_s, engine_s, queued_in_engine))

    def ttft_breakdown(self) -> dict[str, Any] | None:
        if not self.first_tokens:
            return None
        parts = np.array([(q, e, q + e) for q, e, _ in self.first_tokens])
        p50, p90 = np.quantile(parts, [0.5, 0.9], axis=0) * 1e3
        names = ("sidecar_queue_ms", "engine_ms", "ttft_ms")
        return {"requests": len(self.first_tokens),
                "queued_in_engine": sum(q for _, _, q in self.first_tokens),
                **{name: {"p50": round(float(a), 1), "p90": round(float(b), 1)}
                   for name, a, b in zip(names, p50, p90, strict=True)}}

    def retired(self, gone: Retired) -> None:
        self.metrics.retirements.labels(gone.reason.value).inc()
        if gone.outcome is not None:
            self.outcome(gone.outcome, "retired")

    def dispatched(self, job: Job, now: float) -> None:
        """``job`` went to vLLM at ``now`` (segment 1: its first dispatch, which ends the
        request's time in the queue)."""
        if job.segment == 1:
            self.metrics.queued(job.live.req, now)
        self.dispatch_gap.dispatched(now)
        self.dispatch_log.append({"request_id": job.request_id, "segment": job.segment,
                                  "generated": len(job.generated_ids), "t": now,
                                  "vllm_priority": job.vllm_priority})

    def slot_freed(self, now: float, queued_in_engine: int, waiting: int) -> None:
        """A request left vLLM's batch: how long its slot waits is the dispatch gap."""
        self.dispatch_gap.freed(now, queued_in_engine, waiting)

    def door_margin(self, margin_s: float) -> None:
        self.metrics.door_margin.set(margin_s)

    def backend(self, ready: bool) -> None:
        self.metrics.backend_up.set(1 if ready else 0)

    def frame(self, now: float, result: FrameResult, policy: Policy,
              live: Iterable[LiveRequest], running: int) -> None:
        if policy.waiting() == 0:
            self.dispatch_gap.idle()
        self.metrics.preemptions.inc(len(result.preempted))
        self.metrics.frames.inc()
        self.metrics.frame_seconds.observe(result.policy_s)
        figures = self.describe(policy)
        shown = [r for _, r in zip(range(50), live, strict=False)]
        self.frame_log.append({
            "t": now, "policy_s": result.policy_s, "describe": figures,
            "fairness_weight": fairness_in_effect(figures), "waiting": policy.waiting(),
            "running": running,
            "preempted": [r.req.request_id for r in result.preempted],
            "retired": [g.request.req.request_id for g in result.retired],
            "priorities": {r.req.request_id: policy.priority_of(r) for r in shown},
        })

    def describe(self, policy: Policy) -> dict[str, float]:
        """The policy's live figures, set on their gauges; returned for the frame log."""
        figures = policy.describe()
        cutoff = figures.get("cutoff")
        if cutoff is not None:
            self.metrics.effective_cutoff.set(cutoff)
        self.metrics.fairness_weight.set(fairness_in_effect(figures))
        return figures

    def gauges(self, waiting: int, running: int) -> None:
        self.metrics.queue_depth.set(waiting)
        self.metrics.running.set(running)

    def snapshot(self, lifecycle: Lifecycle, spec: SLOPolicySpec, health: BackendHealth,
                 speed: SpeedMeter, sizes: dict[str, Any]) -> dict[str, Any]:
        """The ``/debug/scheduler`` document."""
        policy = lifecycle.policy
        running = list(lifecycle.running)
        figures = policy.describe()
        return {
            "policy": policy.name,
            "describe": figures,
            "fairness_weight": fairness_in_effect(figures),
            "ready": health.ready,
            "not_ready_reason": None if health.ready else health.reason,
            "waiting": policy.waiting(),
            "running": len(running),
            **sizes,
            "decode_step_s": speed.decode_step_s,
            "prefill_s_per_token": speed.prefill_s_per_token,
            "frames": lifecycle.stats.frames,
            "policy_ms_p99": self.policy_ms_p99(),
            "dispatch_gap_ms": self.dispatch_gap.summary(),
            "ttft_breakdown": self.ttft_breakdown(),
            "door": nan_as_null(lifecycle.door.describe()),
            "attainment": nan_as_null(lifecycle.ledger.attainment()),
            "running_requests": [{"request_id": r.req.request_id, "generated": r.generated,
                                  "preemptions": r.preemptions} for r in running],
            "dispatches": list(self.dispatch_log),
            "recent_frames": list(self.frame_log)[-20:],
        }

    def policy_ms_p99(self) -> float | None:
        spent = sorted(f["policy_s"] for f in self.frame_log)
        return spent[int(0.99 * (len(spent) - 1))] * 1e3 if spent else None


class DispatchGap:
    """How long a vLLM batch slot freed by a finished request waits for its next request
    while the sidecar holds work: 0 when a request was already queued inside vLLM (vLLM
    refills the slot in its own next step), else the time until the sidecar dispatches
    one. p50/p99 in ms over the last 4,096 freed slots."""

    def __init__(self) -> None:
        self._freed: deque[float] = deque(maxlen=4096)
        self._gaps: deque[float] = deque(maxlen=4096)

    def freed(self, now: float, queued_in_engine: int, waiting: int) -> None:
        if queued_in_engine > 0:
            self._gaps.append(0.0)
        elif waiting > 0:
            self._freed.append(now)

    def dispatched(self, now: float) -> None:
        if self._freed:
            self._gaps.append(now - self._freed.popleft())

    def idle(self) -> None:
        """Nothing waits any more: freed slots no longer wait for a request (the work they
        waited for was served elsewhere or retired)."""
        self._freed.clear()

    def summary(self) -> dict[str, float] | None:
        if not self._gaps:
            return None
        gaps = sorted(self._gaps)
        return {"p50": gaps[len(gaps) // 2] * 1e3, "p99": gaps[int(0.99 * (len(gaps) - 1))] * 1e3,
                "count": float(len(gaps))}


def fairness_in_effect(figures: Mapping[str, float]) -> float:
    """f as the policy applies it, from its :meth:`~Policy.describe` figures: 0 with
    ``mechanisms.fairness`` off or a policy without fairness (the configured weight would
    say otherwise)."""
    return figures.get("fairness_weight", 0.0)
