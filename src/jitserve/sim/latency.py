"""Batch-latency model of one engine iteration, with coefficients from profile files.

``t = L(T) + a2*sum(c*(k + c/2)) + a4*sum(k_dec) + a5*n (+ a7 when P > 0)``, where
T = P + D tokens pass through the linear layers (P prefill tokens in chunks c over cached
context k, D decoding sequences with contexts k_dec) and n sequences are in the batch; a2
is prefill attention, a4 the KV read of decode attention, a5 the per-sequence LM head, a7
an engine's extra work in a step that computes prompt tokens (0 in the A100 reference).
``L`` is the profile's measured table of the linear layers (``linear_table``),
interpolated between its points so a step in the measurements (Vidur's A100: +7 ms from
256 to 264 tokens) stays a step.
A profile without a table has two straight branches, ``max(a0 + a3*T, a6 + a1*T)``: the
memory-bound regime (weights read once) and the compute-bound one; with a table the
branches are its lower envelope, what the goodput upper bound and the speed meters' warm
start read. In a decode-only stretch D is fixed, so a step is ``L(D) + a5*D +
a4*sum(k_dec)`` with the context growing by D per step: the closed form the engine
advances decode stretches with.

Profiles are data (``sim/profiles/*.json``, fitted by :mod:`jitserve.sim.calibrate`):
adding a GPU or model is adding a file.
"""

from __future__ import annotations

import bisect
import json
from importlib import resources
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

TIME_FIELDS = (
    "a0_s", "a1_s_per_prefill_token", "a2_s_per_attention_pair", "a3_s_per_decode_seq",
    "a4_s_per_context_token", "a5_s_per_seq", "a6_s_compute_intercept", "a7_s_per_prefill_step",
)  # fmt: skip
"""The coefficients that are times (a slower engine scales them, and the table)."""
STACK_FIELDS = frozenset({"engine_queue", "engine_queue_unstarted", "request_path_s", "door"})
"""How the serving stack feeds the engine: set per run (``jitserve bench --engine-queue``,
``scripts/sim_vs_live.py``), never part of a calibrated profile file."""


class LinearTable(BaseModel):
    """Measured time of every non-attention layer (the LM head's weight read included) at
    ``tokens`` tokens in the batch; increasing token counts."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tokens: tuple[int, ...]
    seconds: tuple[float, ...]

    @model_validator(mode="after")
    def _points(self) -> LinearTable:
        if len(self.tokens) < 2 or len(self.tokens) != len(self.seconds):
            raise ValueError("linear_table: at least two points, as many seconds as tokens")
        if any(b <= a for a, b in zip(self.tokens, self.tokens[1:], strict=False)):
            raise ValueError("linear_table: tokens must increase")
        if min(self.seconds) <= 0:
            raise ValueError("linear_table: seconds must be positive")
        return self

    def at(self, batch_tokens: float) -> float:
        """Interpolated between the points; below the first, the first; past the last, the
        last segment continued, never falling (a measured table can end on noise)."""
        tokens, seconds = self.tokens, self.seconds
        i = bisect.bisect_left(tokens, batch_tokens)
        if i == 0:
            return seconds[0]
        if i == len(tokens):
            slope = (seconds[-1] - seconds[-2]) / (tokens[-1] - tokens[-2])
            return seconds[-1] + max(slope, 0.0) * (batch_tokens - tokens[-1])
        t0, t1, s0 = tokens[i - 1], tokens[i], seconds[i - 1]
        return s0 + (seconds[i] - s0) * (batch_tokens - t0) / (t1 - t0)


class Profile(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    name: str
    description: str = ""
    a0_s: float = Field(ge=0)
    """Memory-bound floor of an iteration (weights read once)."""
    a1_s_per_prefill_token: float = Field(ge=0)
    """Compute-bound slope of the linear layers, per token in the batch."""
    a2_s_per_attention_pair: float = Field(ge=0)
    a3_s_per_decode_seq: float = Field(ge=0)
    """Memory-bound slope of the linear layers, per token in the batch (a decoder is one)."""
    a4_s_per_context_token: float = Field(ge=0)
    a5_s_per_seq: float = Field(ge=0)
    a6_s_compute_intercept: float = Field(0.0, ge=0)
    """Intercept of the compute-bound branch; 0 with a3 = a1 gives one straight line."""
    a7_s_per_prefill_step: float = Field(0.0, ge=0)
    """Added to a step that computes prompt tokens (the engine's per-request work when a
    prompt is scheduled: input preparation, sampling state). Measured on a running engine
    (``jitserve calibrate --engine``); 0 in the A100 reference, which has no CPU side."""
    kv_capacity_tokens: int = Field(gt=0)
    kv_block_tokens: int = Field(16, gt=0)
    max_running: int = Field(256, gt=0)
    chunk_token_budget: int = Field(2048, gt=0)
    prefill_first_token_budget: int = Field(8192, gt=0)
    engine_queue: int = Field(0, ge=0)
    """Requests the serving stack keeps queued inside the engine beyond its slots, in
    dispatch order (the sidecar's ``--engine-queue``: :mod:`jitserve.sim.engine_queue`);
    0: the policy picks at the very step a slot frees, as an in-engine scheduler."""
    engine_queue_unstarted: bool = False
    """The engine queue bounds the dispatched requests without a token yet, not those
    beyond the slots: a dispatch rule the sidecar does not have yet (engine_queue.py)."""
    request_path_s: float = Field(0.0, ge=0)
    """The serving stack's fixed time per LLM call outside the engine (client -> sidecar ->
    vLLM, and the first token back), measured with lone requests through the stack: a
    call reaches the engine this long after it is sent; 0: the engine's time alone."""
    door: bool = False
    """The serving stack judges each latency arrival at the door, as the sidecar does
    (:mod:`jitserve.serving.forecast`, ``admission.onTimeQuantile``): refused at once when
    its first token is forecast past its target; False: as an in-engine scheduler, which
    has no door."""
    linear_table: LinearTable | None = None
    """The linear layers as measured; None: the two branches alone."""

    def envelope_s(self, batch_tokens: float) -> float:
        """The two straight branches (a lower envelope of the table, where there is one)."""
        return max(
            self.a0_s + self.a3_s_per_decode_seq * batch_tokens,
            self.a6_s_compute_intercept + self.a1_s_per_prefill_token * batch_tokens,
        )

    def linear_s(self, batch_tokens: float) -> float:
        """Time of the non-attention layers for ``batch_tokens`` tokens in the batch: the
        table (:meth:`LinearTable.at`), else the branches."""
        table = self.linear_table
        return self.envelope_s(batch_tokens) if table is None else table.at(batch_tokens)

    def scaled(self, speed: float) -> Profile:
        """This engine ``speed`` times as fast (every time divided by it)."""
        update: dict[str, object] = {f: getattr(self, f) / speed for f in TIME_FIELDS}
        if self.linear_table is not None:
            update["linear_table"] = LinearTable(
                tokens=self.linear_table.tokens,
                seconds=tuple(x / speed for x in self.linear_table.seconds))
        return Profile.model_validate({**self.model_dump(), **update})

    def step_s(
        self,
        prefill_tokens: int,
        attention_pairs: float,
        decoders: int,
        decode_context: int,
        sequences: int,
    ) -> float:
        return (
            self.linear_s(prefill_tokens + decoders)
            + self.a2_s_per_attention_pair * attention_pairs
            + self.a4_s_per_context_token * decode_context
            + self.a5_s_per_seq * sequences
            + (self.a7_s_per_prefill_step if prefill_tokens else 0.0)
        )

    def prefill_s(self, tokens: int) -> float:
        """Marginal time to (re)compute ``tokens`` of context inside full batches: the
        stall a recompute preemption costs when the request comes back."""
        return (
            self.a1_s_per_prefill_token * tokens
            + self.a2_s_per_attention_pair * tokens * tokens / 2
        )


DEFAULT_PROFILE = "a100-llama3-8b"


def available_profiles() -> list[str]:
    folder = resources.files("jitserve.sim") / "profiles"
    return sorted(
        p.name.removesuffix(".json") for p in folder.iterdir() if p.name.endswith(".json")
    )


def load_profile(name_or_path: str = DEFAULT_PROFILE) -> Profile:
    """A bundled profile by name, or a JSON file by path."""
    path = Path(name_or_path)
    if path.suffix == ".json" and path.exists():
        text = path.read_text()
    else:
        resource = resources.files("jitserve.sim") / "profiles" / f"{name_or_path}.json"
        if not resource.is_file():
            raise ValueError(
                f"unknown profile {name_or_path!r}; bundled: {', '.join(available_profiles())}"
            )
        text = resource.read_text()
    return Profile.model_validate(json.loads(text))
