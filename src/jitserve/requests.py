"""Requests, compound programs and their live state.

Who owns what:
- :class:`Request` is what a tenant asked for (immutable). In simulation it also carries
  the true output length, which only the engine and the oracle estimator may read.
- :class:`Program` is a compound request: stages of LLM calls, each stage depending on
  all calls of the previous one, with tool-call time between stages.
- :class:`LiveRequest` / :class:`LiveProgram` are the mutable state of a request in
  flight. Only the request lifecycle (:mod:`jitserve.serving`) writes them, one method per
  state change; scheduling policies read them and keep their own values (priority, frames
  waited, demotion) to themselves.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from jitserve.slo import SLO, CompoundSLO, LatencySLO, SLOError, SLOKind


@dataclass(frozen=True, slots=True)
class Request:
    request_id: str
    tenant: str
    slo: SLO
    prompt_tokens: int
    arrival_s: float
    output_tokens: int | None = None
    """True output length; known in simulation only (engine and oracle)."""
    max_tokens: int | None = None
    slo_class: str = "default"
    app: str = "chat"
    """Application / endpoint tag (a length-predictor feature)."""
    model: str = "default"
    prompt_text: str | None = None
    """The prompt, when known (the sidecar has it; simulated workloads do not)."""
    program_id: str | None = None
    stage: int = 0
    preemptible: bool = True
    """False: a frame plan never preempts it (the sidecar's forwarded requests: their
    structured-output, tool or logprobs state cannot be resumed as a continuation)."""

    def __post_init__(self) -> None:
        if self.prompt_tokens < 1:
            raise SLOError("prompt_tokens", f"must be >= 1, got {self.prompt_tokens}")
        if self.output_tokens is not None and self.output_tokens < 1:
            raise SLOError("output_tokens", f"must be >= 1, got {self.output_tokens}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise SLOError("max_tokens", f"must be >= 1, got {self.max_tokens}")
        if not self.tenant:
            raise SLOError("tenant", "must not be empty")

    @property
    def kind(self) -> SLOKind:
        return self.slo.kind


@dataclass(frozen=True, slots=True)
class LLMCall:
    prompt_tokens: int
    output_tokens: int
    model: str = "default"


@dataclass(frozen=True, slots=True)
class Stage:
    calls: tuple[LLMCall, ...]
    tool_s: float = 0.0
    """Wall time of the tool call that runs after this stage, before the next one."""
    tool: str = "search"


@dataclass(frozen=True, slots=True)
class Program:
    program_id: str
    tenant: str
    arrival_s: float
    slo: CompoundSLO
    stages: tuple[Stage, ...]
    slo_class: str = "default"
    app: str = "research"

    def __post_init__(self) -> None:
        if not self.stages or any(not s.calls for s in self.stages):
            raise SLOError("stages", "a compound program needs at least one stage with calls")
        if any(s.tool_s < 0 for s in self.stages):
            raise SLOError("tool_s", "tool-call time must be >= 0")

    @property
    def input_tokens(self) -> int:
        return sum(c.prompt_tokens for s in self.stages for c in s.calls)

    @property
    def output_tokens(self) -> int:
        return sum(c.output_tokens for s in self.stages for c in s.calls)

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def stage_requests(self, stage: int, now_s: float) -> list[Request]:
        """The sub-requests of ``stage``, arriving at ``now_s``."""
        return [
            Request(
                request_id=f"{self.program_id}/{stage}/{i}",
                tenant=self.tenant,
                slo=self.slo,
                prompt_tokens=call.prompt_tokens,
                output_tokens=call.output_tokens,
                arrival_s=now_s,
                slo_class=self.slo_class,
                app=self.app,
                program_id=self.program_id,
                stage=stage,
            )
            for i, call in enumerate(self.stages[stage].calls)
        ]


Workitem = Request | Program
"""What a workload emits: a single request or a whole compound program."""


class Phase(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    RETIRED = "retired"
    WITHDRAWN = "withdrawn"
    """A copy that left one replica's queue unstarted, without an outcome (late binding:
    :meth:`jitserve.serving.lifecycle.Lifecycle.withdraw`)."""


@dataclass(slots=True, eq=False)
class LiveProgram:
    program: Program
    stage: int = 0
    stage_started_s: float = 0.0
    open_members: int = 0
    stage_share: float = 1.0
    """phi(s): share of the program's time budget used up by the end of this stage."""
    prev_stage_share: float = 0.0
    """phi(s-1): the share used up when this stage started (0 for the first stage)."""
    retired: bool = False
    attained_tokens: int = 0
    """Output tokens of the program's finished calls so far."""
    prompt_tokens: int = 0
    """Prompt tokens of the program's calls so far."""
    final_stage: bool = True
    """Whether the current stage is the program's last (known upfront in simulation; the
    sidecar learns it from the client's ``final`` flag)."""
    ended: bool = False
    """The program's outcome has been given (finished, retired or expired)."""

    @property
    def deadline_abs_s(self) -> float:
        return self.program.arrival_s + self.program.slo.deadline_s

    @property
    def stage_deadline_abs_s(self) -> float:
        return self.program.arrival_s + self.stage_share * self.program.slo.deadline_s


@dataclass(slots=True, eq=False)
class LiveRequest:
    """Mutable state of one request inside an engine. Identity-hashed."""

    req: Request
    program: LiveProgram | None = None
    phase: Phase = Phase.WAITING
    generated: int = 0
    prefilled: int = 0
    """Tokens of the current prefill target already computed."""
    prefill_target: int = 0
    """Prompt tokens, or prompt + generated when resuming after a recompute preemption."""
    first_token_s: float | None = None
    started_s: float | None = None
    """When the request was first admitted (None: never scheduled)."""
    preemptions: int = 0
    bound: int = 0
    """Current upper bound on total output tokens (refined as tokens are generated)."""
    expected: float = 0.0
    """Typical total output tokens (expected gain and cost), refined with the bound."""
    bound_refined_at: int = -1

    def __post_init__(self) -> None:
        if self.prefill_target == 0:
            self.prefill_target = self.req.prompt_tokens

    @property
    def context_tokens(self) -> int:
        return self.req.prompt_tokens + self.generated

    @property
    def deadline_abs_s(self) -> float:
        """Absolute time by which this request must finish to earn its goodput.

        Latency requests have no single deadline; this returns the due time of the
        last token under the current length bound."""
        if self.program is not None:
            return self.program.stage_deadline_abs_s
        slo = self.req.slo
        if isinstance(slo, LatencySLO):
            last = max(self.bound, self.generated + 1) - 1
            return slo.due_s(self.req.arrival_s, last)
        return self.req.arrival_s + slo.deadline_s
