"""The ``scheduler`` section of the ``SLOPolicy`` model: which policy (or ``auto``, and
the tuner's settings), GMAX's cutoff ``p``, frames, aging, length quantile and
refinement, preemption, and each mechanism on or off (:mod:`jitserve.policy` assembles
the sections)."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import Field, field_validator

from jitserve.policy.base import SpecModel as _Model

AUTO = "auto"
"""``scheduler.policy: auto``: the tuner picks among ``scheduler.auto.candidates``."""
AUTO_CANDIDATES = ("gmax", "fcfs-ac", "sarathi-ac", "edf-ac", "lsf-ac", "sjf-ac", "plas-ac",
                   "slidingserve-ac")
"""GMAX and every baseline with the same overload control: what the matrix compares
(:mod:`jitserve.scheduling.registry` knows the names; a test keeps these among them)."""
SchedulerName = Annotated[str, Field(pattern=r"^[a-z][a-z0-9-]*$")]


class Objective(StrEnum):
    TOKENS = "tokens"
    REQUESTS = "requests"


class BudgetRule(StrEnum):
    """How the engine sizes each iteration's token budget (:mod:`jitserve.scheduling.budget`)."""

    FIXED = "fixed"
    GREEDY = "greedy"
    SLIDING = "sliding"


class CutoffMode(StrEnum):
    FIXED = "fixed"
    AUTO = "auto"


class CutoffSettings(_Model):
    """GMAX's priority cutoff ``p``: candidates keep priority >= p x the B-th best."""

    mode: CutoffMode = Field(
        default=CutoffMode.AUTO,
        description="fixed: p = value; auto: p adapts online among candidates toward the "
        "value that maximises measured goodput.",
    )
    value: float = Field(
        default=0.95, gt=0, le=1, description="p when mode is fixed; the starting point when auto."
    )
    candidates: list[Annotated[float, Field(gt=0, le=1)]] = Field(
        default_factory=lambda: [0.5, 0.7, 0.8, 0.9, 0.95, 1.0],
        min_length=1,
        max_length=16,
        description="Values of p auto mode explores.",
    )
    epoch_frames: int = Field(
        default=20, ge=1, le=10000, description="Frames per exploration epoch in auto mode."
    )


class PreemptionSettings(_Model):
    """Preemption at frame boundaries (abort in vLLM, resume later as a continuation)."""

    enabled: bool = Field(default=True, description="Allow preempting running requests.")
    max_per_frame: int = Field(
        default=8, ge=0, le=1024, description="At most this many preemptions per frame."
    )
    cost_factor: float = Field(
        default=1.0,
        ge=0,
        le=100,
        description="Multiplier on the modelled cost (stall time x token rate).",
    )


class MechanismSettings(_Model):
    """Switches for each GMAX mechanism, all on by default: turning one off is an ablation
    (docs/scheduling.md measures each one's effect and the regime where it matters)."""

    cutoff: bool = Field(
        default=True,
        description=(
            "Keep only candidates with priority >= p x the B-th best before grouping; off ="
            " every one of the top k x B candidates may join the group (as p = 0)."
        ),
    )
    length_window: bool = Field(
        default=True,
        description=(
            "Group candidates of similar input length (sliding window of size B over"
            " candidates sorted by input length); off = the B best candidates by priority."
        ),
    )
    preemption: bool = Field(
        default=True,
        description=(
            "Swap out running requests outside the group when the gain beats the recompute"
            " cost; off (or preemption.enabled false) = never preempt."
        ),
    )
    refinement: bool = Field(
        default=True,
        description=(
            "Refine each request's length bound every refineEvery generated tokens; off ="
            " keep the bound given at arrival until the request outgrows it."
        ),
    )
    fairness: bool = Field(
        default=True,
        description=(
            "Blend each tenant's deficit against its weighted share into priority with"
            " weight f (fairness.weight); off = f is ignored."
        ),
    )
    aging: bool = Field(
        default=True,
        description="Raise priority by delta per frame waited (anti-starvation); off = no aging.",
    )
    overload_control: bool = Field(
        default=True,
        description=(
            "Retire (or demote, admission.overloadAction) requests that waited past"
            " admission.maxWaitingSeconds and are not planned soon, or whose deadline is out"
            " of reach even at full speed; off = keep everything. Baselines get the same layer"
            " under their -ac names."
        ),
    )
    prefill_pacing: bool = Field(
        default=True,
        description=(
            "Start new prompts no faster than the running requests' SLOs allow (keep the"
            " step time under their per-token need); off = start whatever fits the engine's"
            " token budget."
        ),
    )
    latest_start_sequencing: bool = Field(
        default=True,
        description=(
            "Start group members in latest-start order and drop from the group those that"
            " would start too late to meet their SLO; off = start group members by priority."
        ),
    )


class AutoSettings(_Model):
    """``policy: auto``: every period the pod's last warm-up + window of traffic is replayed
    through the simulator once per candidate, and a candidate whose goodput (summed over
    the last ``memory`` comparisons) beats the scheduler in effect's by more than
    ``margin``, and beat it in each of those comparisons, takes over (docs/tuning.md)."""

    candidates: list[SchedulerName] = Field(
        default_factory=lambda: list(AUTO_CANDIDATES),
        min_length=1,
        max_length=16,
        json_schema_extra={"x-kubernetes-list-type": "set"},
        description="The schedulers compared (gmax or a baseline name; the sidecar refuses "
        "a policy naming one it does not know); the first runs until the first comparison.",
    )
    period_seconds: float = Field(
        default=30.0, gt=0, le=3600, description="Seconds between comparisons."
    )
    window_seconds: float = Field(
        default=60.0, gt=0, le=3600,
        description="Seconds of past traffic each comparison scores the candidates on.",
    )
    warmup_seconds: float = Field(
        default=30.0, ge=0, le=3600,
        description="Seconds replayed before the window and scored for nothing: the backlog "
        "each candidate carries into the window is its own.",
    )
    margin: float = Field(
        default=0.05, ge=0, le=10,
        description="A candidate takes over when it earns more than (1 + margin) x the "
        "scheduler in effect over the last memory comparisons, and more in each of them.",
    )
    memory: int = Field(
        default=3, ge=1, le=100,
        description="Comparisons whose scores are summed for a decision, each of which a "
        "candidate must win to take over (hysteresis); none takes over before that many.",
    )
    min_requests: int = Field(
        default=20, ge=1, le=1000000,
        description="Fewer requests in a window: no comparison (too few to tell apart).",
    )
    profile: str | None = Field(
        default=None, min_length=1, max_length=4096,
        description="The engine model the replays run on: a bundled profile (a100-llama3-8b, "
        "cpu-tiny-llama) or a profile file written by jitserve calibrate; unset: the "
        "sidecar's --engine-profile.",
    )

    @field_validator("candidates")
    @classmethod
    def _no_repeats(cls, names: list[str]) -> list[str]:
        if len(set(names)) != len(names):
            raise ValueError(f"candidates repeat a name: {names}")
        return names


class SchedulerSettings(_Model):
    """The GMAX scheduler's knobs."""

    policy: SchedulerName = Field(
        default="gmax",
        description="gmax, a baseline name, or auto (the tuner picks among auto.candidates).",
    )
    auto: AutoSettings = Field(
        default=AutoSettings(), description="The tuner's settings when policy is auto."
    )
    cutoff: CutoffSettings = Field(
        default=CutoffSettings(), description="GMAX's priority cutoff p (fixed or auto)."
    )
    frame_steps: int = Field(
        default=50, ge=1, le=10000, description="Decode steps per scheduling frame."
    )
    delta: float = Field(
        default=0.05,
        ge=0,
        le=1000,
        description=(
            "Anti-starvation aging: priority added per frame waited,"
            " as a fraction of the median priority."
        ),
    )
    length_quantile: float = Field(
        default=0.95, gt=0, lt=1, description="Quantile q of the output-length upper bound."
    )
    refine_every: int = Field(
        default=50, ge=1, le=100000, description="Refine the length bound every N generated tokens."
    )
    candidate_factor: int = Field(
        default=4, ge=1, le=64, description="GMAX considers the top k x B requests."
    )
    soft_penalty: float = Field(
        default=1.0, ge=0, le=16, description="Exponent of the lateness discount."
    )
    preemption: PreemptionSettings = Field(
        default=PreemptionSettings(), description="When running requests may be preempted."
    )
    budget_rule: BudgetRule = Field(
        default=BudgetRule.FIXED,
        description=(
            "Per-iteration token budget: fixed (the engine's maximum), greedy (largest chunk"
            " keeping the tightest decode within its TBT) or sliding (SlidingChunker: this"
            " and the next iteration's budgets chosen together). Inside vLLM it needs the"
            " in-engine scheduler (--scheduler-cls)."
        ),
    )
    batch_constructor: bool = Field(
        default=False,
        description=(
            "SlidingServe's BatchConstructor: when the full batch would make a prefill miss"
            " its first token, run an anchored knapsack subset of the prefills instead."
            " Simulator only (jitserve bench): the in-engine vLLM scheduler does not"
            " construct batches yet, and a live pod reports the field in its log."
        ),
    )
    mechanisms: MechanismSettings = Field(
        default=MechanismSettings(),
        description="Each GMAX mechanism on or off (ablations); all on by default.",
    )

    def running(self, auto_choice: str | None = None) -> str:
        """The scheduler that runs: ``policy``, or with ``auto`` the tuner's choice when it
        is a candidate (before any, the first candidate)."""
        if self.policy != AUTO:
            return self.policy
        candidates = self.auto.candidates
        return auto_choice if auto_choice in candidates else candidates[0]
