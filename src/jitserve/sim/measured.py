"""An engine profile fitted to step times measured on a running engine (pure).

:mod:`jitserve.bench.calibrate_engine` drives a real vLLM through two families of batch
shapes and hands the medians here; this module turns them into a :class:`Profile` of the
same form as the bundled one (``L(T) + a2*pairs + a4*context + a5*n``), so the simulator
runs the engine that was measured (``jitserve bench --profile PATH``).

- **Prefill alone**, one fresh prompt of T tokens (T up to the token budget, one chunk):
  ``p(T) = L(T) + a2*T^2/2 + a5 + a7``.
- **Prefill over a cached prefix**, c new tokens after k the prefix cache holds:
  ``p(T=c) + a2*c*k``, so ``a2`` is the extra time per (new, cached) pair. Without prefix
  caching on the engine there are none and a2 is 0: prefill attention is then in L, as
  measured for fresh prompts.
- **Decode alone**, D sequences together at mean context c:
  ``d(D, c) = L(D) + a4*D*c + a5*D``.

Subtracting the prefill at T = D (less its attention) from each decode leaves
``a5*(D - 1) + a4*D*c - a7``: linear in (a5, a4, a7), fitted by non-negative least
squares on relative error; then ``L(T) = p(T) - a2*T^2/2 - a5 - a7`` at each measured T.
a7 is what a step that schedules a prompt costs beyond a decode step of as many tokens
(on vLLM's CPU build ~2 ms beside a 6.5 ms one-token prefill: a new request's input
preparation and sampling state). Whatever else the engine spends per iteration
(scheduling, the API server's share of the CPU) is in the measured times, so it is in L.
The two straight branches are fitted under the table as for the bundled profile
(:func:`jitserve.sim.calibrate.fit_linear_layers`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import nnls

from jitserve.sim.calibrate import fit_linear_layers, profile_of
from jitserve.sim.latency import STACK_FIELDS, LinearTable, Profile

MIN_STEP_S = 1e-6
"""The floor of a table entry: a measured prefill can come out below the fitted terms."""


@dataclass(frozen=True)
class DecodeShape:
    """D sequences decoding together at a mean context of ``context`` tokens, each step
    taking ``seconds`` (median over repetitions)."""

    sequences: int
    context: float
    seconds: float


@dataclass(frozen=True)
class CachedPrefill:
    """``new`` prompt tokens computed after ``cached`` ones the prefix cache held."""

    new: int
    cached: int
    seconds: float


@dataclass(frozen=True)
class Measurements:
    """What :mod:`jitserve.bench.calibrate_engine` measured on one engine."""

    prefill_s: Mapping[int, float]
    """Prompt tokens -> seconds of its prefill step (a fresh prompt, alone, one chunk)."""
    decodes: Sequence[DecodeShape]
    max_running: int
    chunk_token_budget: int
    max_model_len: int
    kv_capacity_tokens: int
    cached_prefills: Sequence[CachedPrefill] = ()


@dataclass(frozen=True)
class Terms:
    a2: float
    a4: float
    a5: float
    a7: float
    relative_residuals: tuple[float, ...]
    """Of each decode shape under the fitted terms: how well the form fits this engine."""


def fit_terms(m: Measurements) -> Terms:
    """a2 from the cached prefills; (a5, a4, a7) >= 0 from the decodes less the prefill at
    the same token count."""
    tokens = sorted(m.prefill_s)
    prefill = [m.prefill_s[t] for t in tokens]
    if len(tokens) < 2 or not m.decodes:
        raise ValueError("a profile needs prefills at two token counts or more and a decode")

    def fresh(n: float) -> float:
        return float(np.interp(n, tokens, prefill))

    pairs = np.array([c.new * c.cached for c in m.cached_prefills], dtype=np.float64)
    extra = np.array([c.seconds - fresh(c.new) for c in m.cached_prefills])
    a2 = max(float(pairs @ extra / (pairs @ pairs)), 0.0) if pairs.size else 0.0
    rows, rhs = [], []
    for shape in m.decodes:
        d = float(shape.sequences)
        rows.append([d - 1, d * shape.context, -1.0])
        rhs.append(shape.seconds - fresh(d) + a2 * d * d / 2)
    seconds = np.array([s.seconds for s in m.decodes])
    design, target = np.array(rows) / seconds[:, None], np.array(rhs) / seconds  # relative
    scale = np.maximum(np.abs(design).max(axis=0), 1e-30)  # columns of like size for nnls
    solution, _ = nnls(design / scale, target)
    a5, a4, a7 = (float(x) for x in solution / scale)
    residuals = (np.array(rows) @ np.array([a5, a4, a7]) - np.array(rhs)) / seconds
    return Terms(a2, a4, a5, a7, tuple(round(float(r), 4) for r in residuals))


def measured_profile(m: Measurements, name: str) -> tuple[Profile, Terms]:
    """The profile of the measured engine, and the fitted terms with their residuals."""
    terms = fit_terms(m)
    tokens = sorted(m.prefill_s)
    fixed = terms.a5 + terms.a7
    table = LinearTable(tokens=tuple(tokens), seconds=tuple(
        max(m.prefill_s[t] - terms.a2 * t * t / 2 - fixed, MIN_STEP_S) for t in tokens))
    most = max(m.max_model_len, m.chunk_token_budget)  # the most tokens in one step
    fit = fit_linear_layers(table, up_to=most)
    profile = profile_of(
        fit, table, name=name, a2_s_per_attention_pair=terms.a2,
        a4_s_per_context_token=terms.a4, a5_s_per_seq=terms.a5,
        a7_s_per_prefill_step=terms.a7, kv_capacity_tokens=m.kv_capacity_tokens,
        max_running=m.max_running, chunk_token_budget=m.chunk_token_budget,
        prefill_first_token_budget=most)
    return profile, terms


def profile_document(m: Measurements, name: str, engine: str) -> dict[str, Any]:
    """The profile JSON (what ``--profile PATH`` loads), with the measurements it came from."""
    profile, terms = measured_profile(m, name)
    return {
        **profile.model_dump(mode="json", exclude=set(STACK_FIELDS), exclude_none=True),
        "description": f"measured on {engine} by `jitserve calibrate --engine`",
        "sources": {
            "linear_table": "Measured: a fresh prompt of T tokens alone (vLLM's "
            "request_prefill_time), less a2*T^2/2, a5 and a7.",
            "a2": "Measured: a prompt's prefill over a cached prefix less a fresh prompt's of "
            "as many new tokens, per (new, cached) pair; 0 without prefix caching.",
            "a4_a5_a7": "Fitted (non-negative least squares, relative error): each decode "
            "shape's step (vLLM's request_time_per_output_token) less the prefill at the "
            "same token count.",
            "branches": "Fitted under the table (its lower envelope), for the goodput bound.",
            "limits": "As given to the command (the engine's --max-num-seqs and "
            "--max-num-batched-tokens); KV capacity from vLLM's cache_config_info.",
        },
        "measured": {
            "prefill_s": {str(t): round(s, 6) for t, s in sorted(m.prefill_s.items())},
            "decodes": [{"sequences": d.sequences, "context": round(d.context, 1),
                         "seconds": round(d.seconds, 6)} for d in m.decodes],
            "cached_prefills": [{"new": c.new, "cached": c.cached, "seconds": round(c.seconds, 6)}
                                for c in m.cached_prefills],
            "decode_fit_relative_residuals": list(terms.relative_residuals),
        },
    }


def measurements_from_document(document: Mapping[str, Any]) -> Measurements:
    """The measurements a profile document keeps: fit them again without the engine."""
    measured = document["measured"]
    return Measurements(
        prefill_s={int(t): float(s) for t, s in measured["prefill_s"].items()},
        decodes=[DecodeShape(int(d["sequences"]), float(d["context"]), float(d["seconds"]))
                 for d in measured["decodes"]],
        max_running=int(document["max_running"]),
        chunk_token_budget=int(document["chunk_token_budget"]),
        max_model_len=int(document["prefill_first_token_budget"]),
        kv_capacity_tokens=int(document["kv_capacity_tokens"]),
        cached_prefills=[CachedPrefill(int(c["new"]), int(c["cached"]), float(c["seconds"]))
                         for c in measured.get("cached_prefills", [])],
    )
