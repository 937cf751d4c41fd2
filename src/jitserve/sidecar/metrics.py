"""Prometheus metrics of the sidecar (owner: sidecar; the operator reads them).

One :class:`SidecarMetrics` per server, on its own registry (several servers can live in
one process, e.g. in tests). Names follow Prometheus conventions, units in the name:

- ``jitserve_goodput_tokens_total{tenant,kind,slo_class}``
- ``jitserve_requests_total{tenant,kind,slo_class,outcome}``, outcome in
  ``met|missed|retired|cancelled|error``
- ``jitserve_tenant_demand_tokens_total{tenant}`` (the goodput asked for), and over
  the fairness window ``jitserve_tenant_max_min_share{tenant}``,
  ``jitserve_tenant_goodput_share{tenant}``, ``jitserve_fairness_jain_index``
- ``jitserve_effective_cutoff`` (GMAX's p now), ``jitserve_fairness_weight`` (f now)
- ``jitserve_ttft_seconds``, ``jitserve_tbt_seconds``, ``jitserve_e2el_seconds``
  histograms, labelled by ``kind``
- ``jitserve_queue_depth``, ``jitserve_running_requests``
- ``jitserve_queue_time_seconds{kind,tenant}``: arrival to first dispatch to vLLM
- ``jitserve_engine_first_token_seconds{queued_in_engine}``: first dispatch to first
  token (with the queue time: the TTFT's breakdown); ``jitserve_door_margin_seconds``
- ``jitserve_preemptions_total``, ``jitserve_retirements_total{reason}``
- ``jitserve_scheduler_frame_seconds`` (policy time per frame), ``jitserve_frames_total``
- ``jitserve_analyzer_fallbacks_total``, ``jitserve_backend_up``,
  ``jitserve_config_reloads_total{result}``, ``jitserve_rejections_total{reason}``
- ``jitserve_passthrough_requests_total{tenant,route,code}``: vLLM's other routes
- ``jitserve_prompt_tokens_total{tenant,model_name}``,
  ``jitserve_generation_tokens_total{tenant,model_name}``: tokens of the requests that
  ended (finished, failed, cancelled or retired), as vLLM's ``vllm:prompt_tokens_total``
  and ``vllm:generation_tokens_total`` count them, by tenant and served model
- ``jitserve_build_info{version,policy,scheduler}``: 1; ``policy`` is the SLOPolicy
  (``--policy-name``), ``scheduler`` the policy file's (``auto`` included)
- ``jitserve_policy_in_effect{policy}``: 1 for the scheduler that runs now (with ``auto``
  the tuner's choice), ``jitserve_policy_in_effect_since_seconds`` (Unix time it started),
  ``jitserve_policy_switches_total``; the tuner's ``jitserve_tuner_comparisons_total
  {decision}`` (kept, switched) and ``jitserve_tuner_cpu_seconds_total`` (its replays'
  CPU, in their own process)

The ``tenant`` label is bounded: once the server sets :attr:`SidecarMetrics.known_tenants`
(the policy's tenants, the owners of API keys and ``default``), any other tenant (an
``x-tenant`` a client made up) is counted as ``other``, so clients cannot mint series.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from jitserve import __version__
from jitserve.requests import Request
from jitserve.sidecar.attainment import AttainmentWindow
from jitserve.sidecar.fairness_window import FairnessWindow

OUTCOMES = ("met", "missed", "retired", "cancelled", "ttl_expired", "error")

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 60.0,
                    120.0)
_TBT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
_FRAME_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1)


OTHER_TENANT = "other"


class OneSeries:
    """An info-style gauge: one labelled series at a time, valued 1; setting another
    removes the last (a scrape never shows two builds, or two schedulers in effect)."""

    def __init__(self, gauge: Gauge) -> None:
        self.gauge = gauge
        self._labels: tuple[str, ...] | None = None

    def set(self, *labels: str) -> None:
        if self._labels is not None:
            self.gauge.remove(*self._labels)
        self._labels = labels
        self.gauge.labels(*labels).set(1)


class TenantFamily:
    """A labelled family whose first label is the tenant; ``labels(tenant, ...)`` maps a
    tenant outside the known set to ``other``."""

    def __init__(self, family: Counter, metrics: SidecarMetrics) -> None:
        self.family = family
        self._metrics = metrics

    def labels(self, tenant: str, *rest: str) -> Any:
        return self.family.labels(self._metrics.tenant_label(tenant), *rest)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.family, name)


class SidecarMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = registry or CollectorRegistry()
        self.registry = r
        self.known_tenants: Collection[str] | None = None
        self.goodput_tokens = TenantFamily(Counter(
            "jitserve_goodput_tokens",
            "Tokens that counted toward goodput: a latency request's output tokens that came "
            "on time; a deadline or compound request's prompt and output tokens when it "
            "finished by its deadline.",
            ["tenant", "kind", "slo_class"], registry=r), self)
        self.attainment = AttainmentWindow()
        r.register(self.attainment)
        self.fairness = FairnessWindow(self.tenant_label)
        r.register(self.fairness)
        self.requests = TenantFamily(Counter(
            "jitserve_requests", "Finished requests by outcome.",
            ["tenant", "kind", "slo_class", "outcome"], registry=r), self)
        self.effective_cutoff = Gauge(
            "jitserve_effective_cutoff", "GMAX priority cutoff p in effect.", registry=r)
        self.fairness_weight = Gauge(
            "jitserve_fairness_weight", "Fairness weight f in effect: the configured one, 0 with "
            "mechanisms.fairness off or under a policy without fairness.", registry=r)
        self.ttft = Histogram("jitserve_ttft_seconds", "Time to first token.", ["kind"],
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.tbt = Histogram("jitserve_tbt_seconds", "Time between streamed tokens.", ["kind"],
                             buckets=_TBT_BUCKETS, registry=r)
        self.e2el = Histogram("jitserve_e2el_seconds", "End-to-end latency of finished requests.",
                              ["kind"], buckets=_LATENCY_BUCKETS, registry=r)
        self.arrivals = Counter(
            "jitserve_arrivals", "Valid requests received, by SLO kind, before admission (the "
            "demand the autoscaler sizes for; refused ones included).", ["kind"], registry=r)
        self.queue_depth = Gauge("jitserve_queue_depth", "Requests waiting in the sidecar queue.",
                                 registry=r)
        self.queue_time = Histogram(
            "jitserve_queue_time_seconds", "Time from arrival to the first dispatch to vLLM.",
            ["kind", "tenant"], buckets=_LATENCY_BUCKETS, registry=r)
        self.engine_first_token = Histogram(
            "jitserve_engine_first_token_seconds", "Time from a request's first dispatch to "
            "vLLM to its first token: vLLM's own queue (queued_in_engine=yes: dispatched "
            "beyond the B slots) plus its prefill.", ["queued_in_engine"],
            buckets=_LATENCY_BUCKETS, registry=r)
        self.door_margin = Gauge(
            "jitserve_door_margin_seconds", "What the door adds to first-token forecasts: "
            "admission.onTimeQuantile of recent actual minus forecast TTFT.", registry=r)
        self.running = Gauge("jitserve_running_requests", "Requests dispatched to vLLM now.",
                             registry=r)
        self.preemptions = Counter("jitserve_preemptions", "Requests preempted (aborted in vLLM, "
                                   "resumed later as a continuation).", registry=r)
        self.retirements = Counter("jitserve_retirements", "Requests retired by admission or "
                                   "overload control.", ["reason"], registry=r)
        self.frame_seconds = Histogram("jitserve_scheduler_frame_seconds",
                                       "Policy time per scheduling frame.",
                                       buckets=_FRAME_BUCKETS, registry=r)
        self.frames = Counter("jitserve_frames", "Scheduling frames run.", registry=r)
        self.analyzer_fallbacks = Counter(
            "jitserve_analyzer_fallbacks", "Length bounds computed locally because the analyzer "
            "failed or was not configured.", registry=r)
        self.backend_up = Gauge("jitserve_backend_up", "1 when vLLM answers its health check.",
                                registry=r)
        self.config_reloads = Counter("jitserve_config_reloads", "Policy file reloads.",
                                      ["result"], registry=r)
        self.rejections = Counter("jitserve_rejections", "Requests refused before queueing.",
                                  ["reason"], registry=r)
        self.passthrough = TenantFamily(Counter(
            "jitserve_passthrough_requests", "Requests to vLLM's other routes (responses, "
            "embeddings, pooling, score, rerank...), passed through unscheduled, by answer.",
            ["tenant", "route", "code"], registry=r), self)

        self.claims_beyond_contract = TenantFamily(Counter(
            "jitserve_slo_claims_beyond_contract", "SLO claims past the tenant's contract "
            "(fairness.tenants[].classes / tightest), by request field and what was done "
            "(clamped, refused).", ["tenant", "field", "action"], registry=r), self)
        self.prompt_tokens = TenantFamily(Counter(
            "jitserve_prompt_tokens", "Prompt tokens of the requests that ended.",
            ["tenant", "model_name"], registry=r), self)
        self.generation_tokens = TenantFamily(Counter(
            "jitserve_generation_tokens", "Tokens generated for the requests that ended.",
            ["tenant", "model_name"], registry=r), self)
        self.build_info = OneSeries(Gauge(
            "jitserve_build_info", "jitserve's version, the SLOPolicy it serves and its "
            "scheduler (always 1).", ["version", "policy", "scheduler"], registry=r))
        self.policy_in_effect = OneSeries(Gauge(
            "jitserve_policy_in_effect", "The scheduler that runs now (1): the policy file's, "
            "or with scheduler.policy auto the tuner's choice.", ["policy"], registry=r))
        self.policy_in_effect_since = Gauge(
            "jitserve_policy_in_effect_since_seconds", "When the scheduler in effect started "
            "(Unix time).", registry=r)
        self.policy_switches = Counter(
            "jitserve_policy_switches", "Changes of the scheduler in effect (policy file or "
            "tuner).", registry=r)
        self.tuner_comparisons = Counter(
            "jitserve_tuner_comparisons", "Comparisons of the candidates on the recent "
            "traffic (scheduler.policy auto), by decision.", ["decision"], registry=r)
        self.tuner_cpu = Counter(
            "jitserve_tuner_cpu_seconds", "CPU time of the tuner's replays (in a process of "
            "their own).", registry=r)

        self._by_kind: dict[tuple[str, str], Any] = {}

    def kind_child(self, family: str, kind: str) -> Any:
        """Cached ``labels(kind)`` child of the ttft/tbt/e2el histogram (hot path)."""
        key = (family, kind)
        child = self._by_kind.get(key)
        if child is None:
            child = self._by_kind[key] = getattr(self, family).labels(kind)
        return child

    def built(self, policy: str, scheduler: str) -> None:
        """Set ``jitserve_build_info`` (a reload replaces its series)."""
        self.build_info.set(__version__, policy, scheduler)

    def in_effect(self, policy: str, since_s: float) -> None:
        """``policy`` runs since ``since_s`` (a switch replaces its series)."""
        self.policy_in_effect.set(policy)
        self.policy_in_effect_since.set(since_s)

    def tenant_label(self, tenant: str) -> str:
        """``tenant``, or ``other`` when it is outside the known set."""
        known = self.known_tenants
        return OTHER_TENANT if known is not None and tenant not in known else tenant

    def queued(self, req: Request, now: float) -> None:
        """``req`` is dispatched to vLLM for the first time at ``now``."""
        self.queue_time.labels(req.kind.value, self.tenant_label(req.tenant)).observe(
            max(0.0, now - req.arrival_s))

    def render(self) -> bytes:
        return generate_latest(self.registry)
