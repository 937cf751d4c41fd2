"""Workloads: what arrives, when, with which SLO.

- Lengths come from a replayed trace (``azure-conv``, ``azure-code``: Azure LLM inference
  trace 2023, bundled under ``jitserve/data/traces`` with attribution) or from
  log-normal fits to the JITServe paper's Table 2 (``synthetic``).
- Each work item is a single request (latency or deadline SLO) or a compound program,
  drawn by the mix ``L:D:C`` (default 1:1:1, paper section 6). Programs are shaped like
  deep research (plan -> fan-out of searches/reads -> synthesis) or multi-agent chains,
  with 2-5 stages and tool calls between stages; a program's LLM calls take their
  lengths from consecutive trace rows.
- Arrivals: the trace's own timestamps rescaled to the target rate (``trace``), Poisson,
  or bursty gamma inter-arrivals (CV > 1). Everything is deterministic under a seed.
- Windows: the seed also picks where in the trace the replay starts (``window_offset``,
  :func:`window_offset`), so two seeds replay different stretches of traffic, not the
  same first rows with other kinds and tenants; the window wraps at the trace's end.
- Tenants: equal demand by default, or skewed (``tenant_demand``, ``--tenant-mix
  a=3,b=1,c=1``); their fair-share weights are the SLOPolicy's, not the workload's.

Workloads are generators: requests are created lazily, so memory stays flat.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from functools import cache
from importlib import resources

import numpy as np
import numpy.typing as npt

from jitserve.goodput import goodput_if_met
from jitserve.policy import FairnessSettings, SLODefaults
from jitserve.requests import LLMCall, Program, Request, Stage, Workitem
from jitserve.slo import DeadlineSLO, LatencySLO, SLOKind

TRACES = {"azure-conv": "azure2023_conv.csv", "azure-code": "azure2023_code.csv"}
ARRIVALS = ("trace", "poisson", "gamma")
MAX_OUTPUT_TOKENS = 4096
WINDOW_STREAM = 0x57494E
"""Mixed into the seed for the window draw, apart from the kind/tenant and length streams."""


@dataclass(frozen=True)
class TraceData:
    arrival_s: npt.NDArray[np.float64]
    prompt_tokens: npt.NDArray[np.int64]
    output_tokens: npt.NDArray[np.int64]

    @property
    def rate_per_s(self) -> float:
        span = float(self.arrival_s[-1] - self.arrival_s[0])
        return (len(self.arrival_s) - 1) / span if span > 0 else math.inf


@cache
def load_trace(name: str) -> TraceData:
    if name not in TRACES:
        raise ValueError(f"unknown trace {name!r}; known: {', '.join(TRACES)}")
    with (resources.files("jitserve.data") / "traces" / TRACES[name]).open() as handle:
        rows = list(csv.DictReader(handle))
    return TraceData(
        np.array([float(r["arrived_at"]) for r in rows]),
        np.array([max(1, int(r["num_prefill_tokens"])) for r in rows], dtype=np.int64),
        np.array([max(1, int(r["num_decode_tokens"])) for r in rows], dtype=np.int64),
    )


def _pairs(text: str, flag: str, example: str) -> list[tuple[str, float]]:
    """``name=number`` pairs, names distinct, numbers finite and >= 0 (ValueError naming
    ``flag`` otherwise)."""
    pairs: list[tuple[str, float]] = []
    for part in text.split(","):
        name, _, value = part.partition("=")
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if (not name.strip() or not math.isfinite(number) or number < 0
                or name.strip() in dict(pairs)):
            raise ValueError(f"{flag} must be distinct name=number pairs, e.g. {example}; "
                             f"got {text!r}")
        pairs.append((name.strip(), number))
    return pairs


def parse_tenant_mix(text: str) -> tuple[tuple[str, ...], tuple[float, ...]]:
    """``"a=3,b=1,c=1"`` -> tenants ``("a", "b", "c")`` with demand shares (0.6, 0.2, 0.2)."""
    pairs = _pairs(text, "--tenant-mix", "a=3,b=1,c=1")
    total = sum(w for _, w in pairs)
    if total <= 0:
        raise ValueError(f"--tenant-mix needs a positive weight, got {text!r}")
    return tuple(n for n, _ in pairs), tuple(w / total for _, w in pairs)


def parse_claims(text: str) -> tuple[tuple[str, float], ...]:
    """``"a=0.25"`` -> tenant ``a`` claims its targets times 0.25 (factors > 0)."""
    pairs = _pairs(text, "--claims", "a=0.25")
    if any(factor <= 0 for _, factor in pairs):
        raise ValueError(f"--claims factors must be > 0, got {text!r}")
    return tuple(pairs)


def parse_mix(text: str) -> tuple[float, float, float]:
    """``"1:1:1"`` -> normalised (latency, deadline, compound) shares."""
    parts = text.split(":")
    try:
        values = [float(p) for p in parts]
    except ValueError:
        values = []
    if len(values) != 3 or any(v < 0 or not math.isfinite(v) for v in values) or sum(values) <= 0:
        raise ValueError(
            f"--mix must be three non-negative numbers L:D:C with a positive sum, got {text!r}"
        )
    total = sum(values)
    return (values[0] / total, values[1] / total, values[2] / total)


@dataclass(frozen=True)
class WorkloadSpec:
    trace: str = "azure-conv"
    """``azure-conv``, ``azure-code`` or ``synthetic`` (paper Table 2 fits)."""
    mix: tuple[float, float, float] = (1 / 3, 1 / 3, 1 / 3)
    arrival: str = "trace"
    rate_per_s: float | None = None
    """Target work-item rate; None keeps the trace's own (synthetic: 5/s)."""
    duration_s: float = 600.0
    seed: int = 1
    tenants: tuple[str, ...] = ("tenant-a", "tenant-b", "tenant-c")
    tenant_demand: tuple[float, ...] | None = None
    """Share of work items per tenant (normalised); None: equal demand."""
    burst_cv: float = 2.0
    slo: SLODefaults = field(default_factory=SLODefaults)
    window_offset: int | None = None
    """First trace row replayed (arrivals and lengths); None: chosen by the seed."""
    max_prompt: int | None = None
    """Prompt tokens of any request or call capped here (a CPU model is slow); None: none."""
    max_output: int | None = None
    """Output tokens capped here; None: none."""
    tool_scale: float = 1.0
    """Compound programs' tool time multiplied by this (the live bench's 0.1 with caps)."""
    claim_scale: tuple[tuple[str, float], ...] = ()
    """Tenants that claim tighter SLOs than the defaults: (tenant, factor), each target
    of its requests multiplied by the factor (0.25: four times tighter)."""

    def __post_init__(self) -> None:
        if self.trace not in (*TRACES, "synthetic"):
            raise ValueError(
                f"unknown trace {self.trace!r}; known: {', '.join((*TRACES, 'synthetic'))}"
            )
        if self.arrival not in ARRIVALS:
            raise ValueError(
                f"unknown arrival process {self.arrival!r}; known: {', '.join(ARRIVALS)}"
            )
        if self.arrival == "trace" and self.trace == "synthetic":
            raise ValueError(
                "arrival 'trace' needs a trace; use poisson or gamma with the synthetic workload"
            )
        if self.window_offset is not None and self.window_offset < 0:
            raise ValueError(f"window offset must be >= 0, got {self.window_offset}")
        if self.duration_s <= 0:
            raise ValueError(f"duration must be positive, got {self.duration_s}")
        for name in ("max_prompt", "max_output"):
            cap = getattr(self, name)
            if cap is not None and cap < 1:
                raise ValueError(f"{name} must be at least 1, got {cap}")
        if not self.tool_scale >= 0:
            raise ValueError(f"tool scale must be >= 0, got {self.tool_scale}")
        if self.rate_per_s is not None and not self.rate_per_s > 0:
            raise ValueError(f"rate must be positive, got {self.rate_per_s}")
        if self.tenant_demand is not None and (
            len(self.tenant_demand) != len(self.tenants)
            or any(w < 0 or not math.isfinite(w) for w in self.tenant_demand)
            or sum(self.tenant_demand) <= 0
        ):
            raise ValueError(
                "tenant demand needs one non-negative weight per tenant with a positive sum, "
                f"got {self.tenant_demand} for {self.tenants}"
            )


def _lognormal(rng: np.random.Generator, median: float, mean: float, low: int, high: int) -> int:
    sigma = math.sqrt(2 * math.log(max(mean / median, 1.0001)))
    return int(np.clip(round(rng.lognormal(math.log(median), sigma)), low, high))


def window_offset(spec: WorkloadSpec) -> int:
    """The trace row the replay starts at: ``spec.window_offset``, or one drawn from the
    seed alone (its own stream, so kinds and tenants draw as before). 0 for synthetic."""
    if spec.trace == "synthetic":
        return 0
    if spec.window_offset is not None:
        return spec.window_offset
    rows = len(load_trace(spec.trace).arrival_s)
    return int(np.random.default_rng([spec.seed, WINDOW_STREAM]).integers(rows))


class _Lengths:
    """Source of (prompt, output) pairs: trace rows in order from the window's first row
    (wrapping), or Table 2 fits."""

    def __init__(self, spec: WorkloadSpec, rng: np.random.Generator) -> None:
        self.rng = rng
        self.trace = None if spec.trace == "synthetic" else load_trace(spec.trace)
        self.row = window_offset(spec)

    def single(self) -> tuple[int, int]:
        if self.trace is None:  # Table 2, Chatbot / single
            return _lognormal(self.rng, 27, 93, 1, 8192), _lognormal(
                self.rng, 225, 318, 1, MAX_OUTPUT_TOKENS
            )
        n = len(self.trace.arrival_s)
        i = self.row % n
        self.row += 1
        return int(self.trace.prompt_tokens[i]), int(self.trace.output_tokens[i])

    def call(self, calls_in_program: int) -> tuple[int, int]:
        if self.trace is None:  # Table 2, Deep Research / compound, split over its calls
            prompt = _lognormal(self.rng, 10807, 12223, 16, 64000) // calls_in_program
            output = _lognormal(self.rng, 3148, 3541, 4, 4 * MAX_OUTPUT_TOKENS) // calls_in_program
            return max(prompt, 1), max(output, 1)
        return self.single()


def _program_shape(rng: np.random.Generator) -> list[int]:
    """Calls per stage: deep research (1, fan-out, [fan-out], 1) or a multi-agent chain."""
    if rng.random() < 0.5:
        fanouts = [int(rng.integers(2, 5)) for _ in range(int(rng.integers(1, 3)))]
        return [1, *fanouts, 1]
    return [1] * int(rng.integers(2, 6))


def _arrival_gaps(spec: WorkloadSpec, rng: np.random.Generator, rate: float) -> Iterator[float]:
    if spec.arrival == "trace":
        trace = load_trace(spec.trace)
        gaps = np.diff(trace.arrival_s)
        start = window_offset(spec) % len(gaps)
        # Rescale so that the replayed window itself arrives at ``rate``: the trace's rate
        # varies (its first 10 minutes run 14% below its hourly mean), so scaling by the
        # whole trace's mean would under-load short runs.
        wanted = int(rate * spec.duration_s)
        span = 0.0
        if 0 < wanted < len(gaps):
            # the first item arrives at 0, so the gaps used are those after it
            span = float(gaps[(start + 1 + np.arange(wanted)) % len(gaps)].sum())
        scale = spec.duration_s / span if span > 0 else trace.rate_per_s / rate
        gaps = gaps * scale
        i = start
        while True:
            yield float(gaps[i % len(gaps)])
            i += 1
    elif spec.arrival == "poisson":
        while True:
            yield float(rng.exponential(1 / rate))
    else:
        shape = 1 / spec.burst_cv**2
        while True:
            yield float(rng.gamma(shape, 1 / (rate * shape)))


def native_rate(spec: WorkloadSpec) -> float:
    """Work items per second of the trace as recorded (or 5/s for synthetic)."""
    return 5.0 if spec.trace == "synthetic" else load_trace(spec.trace).rate_per_s


def generate(spec: WorkloadSpec) -> Iterator[Workitem]:
    """Work items in arrival order, lazily, lengths capped and tools scaled as ``spec``
    says (the same draws as without: a capped workload is the uncapped one, shortened)."""
    items = _drawn(spec)
    if spec.claim_scale:
        factors = dict(spec.claim_scale)
        items = (_claimed(item, factors.get(item.tenant, 1.0)) for item in items)
    if spec.max_prompt is None and spec.max_output is None and spec.tool_scale == 1.0:
        return items
    return (_capped(spec, item) for item in items)


def _claimed(item: Workitem, factor: float) -> Workitem:
    """``item`` claiming its SLO's targets times ``factor`` (best effort claims none)."""
    slo = item.slo
    if factor == 1.0 or (isinstance(slo, DeadlineSLO) and slo.best_effort):
        return item
    if isinstance(item, Program):
        return replace(item, slo=replace(item.slo, deadline_s=item.slo.deadline_s * factor))
    if isinstance(slo, LatencySLO):
        return replace(item, slo=LatencySLO(slo.ttft_s * factor, slo.tbt_s * factor))
    return replace(item, slo=replace(slo, deadline_s=slo.deadline_s * factor))


def held_to_contracts(items: Iterable[Workitem], fairness: FairnessSettings,
                      counted: dict[str, int]) -> Iterator[Workitem]:
    """``items`` as the sidecar admits them under each tenant's contract
    (``fairness.tenants[].tightest``, :mod:`jitserve.policy.contract`): a claim past its
    bound clamped, or dropped with ``beyondContract: refuse``; ``counted`` gets one per
    item per tenant that claimed beyond."""
    for item in items:
        stages = len(item.stages) if isinstance(item, Program) else 1
        held, beyond = fairness.hold(item.tenant, item.slo, stages)
        if not beyond:
            yield item
            continue
        counted[item.tenant] = counted.get(item.tenant, 0) + 1
        if held is not None:
            yield replace(item, slo=held)  # type: ignore[arg-type]


def _capped(spec: WorkloadSpec, item: Workitem) -> Workitem:
    prompt_cap, output_cap = spec.max_prompt or 1 << 62, spec.max_output or 1 << 62
    if isinstance(item, Request):
        return replace(item, prompt_tokens=min(item.prompt_tokens, prompt_cap),
                       output_tokens=min(item.output_tokens or 1, output_cap))
    stages = tuple(
        replace(s, tool_s=s.tool_s * spec.tool_scale,
                calls=tuple(replace(c, prompt_tokens=min(c.prompt_tokens, prompt_cap),
                                    output_tokens=min(c.output_tokens, output_cap))
                            for c in s.calls))
        for s in item.stages)
    return replace(item, stages=stages)


def _drawn(spec: WorkloadSpec) -> Iterator[Workitem]:
    rng = np.random.default_rng(spec.seed)
    lengths = _Lengths(spec, np.random.default_rng(spec.seed + 7919))
    rate = spec.rate_per_s or native_rate(spec)
    kinds = (SLOKind.LATENCY, SLOKind.DEADLINE, SLOKind.COMPOUND)
    demand = None
    if spec.tenant_demand is not None:
        demand = np.array(spec.tenant_demand) / sum(spec.tenant_demand)
    now = 0.0
    for index, gap in enumerate(_arrival_gaps(spec, rng, rate)):
        if index:
            now += gap
        if now > spec.duration_s:
            return
        kind = kinds[int(rng.choice(3, p=spec.mix))]
        tenant = spec.tenants[
            int(rng.integers(len(spec.tenants)))
            if demand is None
            else int(rng.choice(len(spec.tenants), p=demand))
        ]
        if kind is SLOKind.COMPOUND:
            yield _program(spec, rng, lengths, index, tenant, now)
            continue
        prompt, output = lengths.single()
        yield Request(
            request_id=f"r{index}",
            tenant=tenant,
            slo=spec.slo.slo_for(kind),
            prompt_tokens=prompt,
            output_tokens=output,
            arrival_s=now,
            slo_class=kind.value,
            app="chat" if kind is SLOKind.LATENCY else "batch",
        )


def _program(
    spec: WorkloadSpec,
    rng: np.random.Generator,
    lengths: _Lengths,
    index: int,
    tenant: str,
    now: float,
) -> Program:
    shape = _program_shape(rng)
    calls = sum(shape)
    stages = tuple(
        Stage(
            calls=tuple(LLMCall(*lengths.call(calls)) for _ in range(width)),
            tool_s=float(rng.lognormal(math.log(1.0), 0.6)) if s < len(shape) - 1 else 0.0,
            tool="search" if width > 1 else "code",
        )
        for s, width in enumerate(shape)
    )
    return Program(
        program_id=f"p{index}",
        tenant=tenant,
        arrival_s=now,
        slo=spec.slo.slo_for(SLOKind.COMPOUND, stages=len(stages)),  # type: ignore[arg-type]
        stages=stages,
        slo_class="compound",
    )


def offered_tokens_by_tenant(items: Iterable[Workitem]) -> dict[str, int]:
    """Each tenant's demand: the goodput every work item it sent would earn by meeting
    its SLO (:func:`jitserve.goodput.goodput_if_met`; a program: all its calls' tokens),
    served or not."""
    out: dict[str, int] = {}
    for item in items:
        tokens = (item.total_tokens if isinstance(item, Program)
                  else int(goodput_if_met(item.slo, item.prompt_tokens, item.output_tokens or 0)))
        out[item.tenant] = out.get(item.tenant, 0) + tokens
    return dict(sorted(out.items()))
