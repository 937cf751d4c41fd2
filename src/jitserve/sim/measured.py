"""An engine profile fitted to step times measured on a running engine (pure).

:mod:`jitserve.bench.calibrate_engine` drives a real vLLM through two families of batch
shapes and hands the medians here; this module turns them into a :class:`Profile` of the
same form as the bundled one (``L(T) + a2*pairs + a4*context + a5*n``), so the simulator
runs the engine that was measured (``jitserve bench --profile PATH``).

- **Prefill alone**, one fresh prompt of T tokens (T up to the token budget, one chunk):
  ``p(T) = L(T) + a2*T^2/2 + a5``.
- **Decode alone**, D sequences together at mean context c:
  ``d(D, c) = L(D) + a4*D*c + a5*D``.

Subtracting the prefill at T = D from each decode leaves
``d(D, c) - p(D) = a5*(D - 1) - a2*D^2/2 + a4*D*c``: linear in (a5, a2, a4), fitted by
non-negative least squares on relative error; then ``L(T) = p(T) - a2*T^2/2 - a5`` at
each measured T. Whatever the engine spends per iteration besides the model (scheduling,
input preparation, sampling, the API server's share of the CPU) is in the measured times,
so it is in L. The two straight branches are fitted under the table as for the bundled
profile (:func:`jitserve.sim.calibrate.fit_linear_layers`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import nnls

from jitserve.sim.calibrate import fit_linear_layers
from jitserve.sim.latency import LinearTable, Profile

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
class Measurements:
    """What :mod:`jitserve.bench.calibrate_engine` measured on one engine."""

    prefill_s: Mapping[int, float]
    """Prompt tokens -> seconds of its prefill step (a fresh prompt, alone, one chunk)."""
    decodes: Sequence[DecodeShape]
    max_running: int
    chunk_token_budget: int
    max_model_len: int
    kv_capacity_tokens: int


@dataclass(frozen=True)
class Terms:
    a2: float
    a4: float
    a5: float
    relative_residuals: tuple[float, ...]
    """Of each decode shape under the fitted terms: how well the form fits this engine."""


def fit_terms(m: Measurements) -> Terms:
    """(a5, a2, a4) >= 0 from the decodes less the prefill at the same token count."""
    tokens = sorted(m.prefill_s)
    prefill = [m.prefill_s[t] for t in tokens]
    if len(tokens) < 2 or not m.decodes:
        raise ValueError("a profile needs prefills at two token counts or more and a decode")
    rows, rhs, weight = [], [], []
    for shape in m.decodes:
        d = float(shape.sequences)
        p_at_d = float(np.interp(d, tokens, prefill))
        rows.append([d - 1, -d * d / 2, d * shape.context])
        rhs.append(shape.seconds - p_at_d)
        weight.append(1 / shape.seconds)  # least squares on relative error
    w = np.array(weight)
    design, target = np.array(rows) * w[:, None], np.array(rhs) * w
    scale = np.maximum(np.abs(design).max(axis=0), 1e-30)  # columns of like size for nnls
    solution, _ = nnls(design / scale, target)
    a5, a2, a4 = (float(x) for x in solution / scale)
    fitted = np.array(rows) @ np.array([a5, a2, a4])
    residuals = (fitted - np.array(rhs)) / np.array([s.seconds for s in m.decodes])
    return Terms(a2, a4, a5, tuple(round(float(r), 4) for r in residuals))


def measured_profile(m: Measurements, name: str) -> tuple[Profile, Terms]:
    """The profile of the measured engine, and the fitted terms with their residuals."""
    terms = fit_terms(m)
    tokens = sorted(m.prefill_s)
    table = LinearTable(tokens=tuple(tokens), seconds=tuple(
        max(m.prefill_s[t] - terms.a2 * t * t / 2 - terms.a5, MIN_STEP_S) for t in tokens))
    fit = fit_linear_layers(table)
    profile = Profile.model_validate(dict(
        name=name,
        a0_s=fit.a0_s,
        a1_s_per_prefill_token=fit.a1_s_per_token,
        a2_s_per_attention_pair=terms.a2,
        a3_s_per_decode_seq=fit.a3_s_per_token,
        a4_s_per_context_token=terms.a4,
        a5_s_per_seq=terms.a5,
        a6_s_compute_intercept=fit.a6_s_compute_intercept,
        kv_capacity_tokens=m.kv_capacity_tokens,
        max_running=m.max_running,
        chunk_token_budget=m.chunk_token_budget,
        prefill_first_token_budget=max(m.max_model_len, m.chunk_token_budget),
        linear_table=table,
    ))
    return profile, terms


def profile_document(m: Measurements, name: str, engine: str) -> dict[str, Any]:
    """The profile JSON (what ``--profile PATH`` loads), with the measurements it came from."""
    profile, terms = measured_profile(m, name)
    return {
        **profile.model_dump(mode="json", exclude_none=True),
        "description": f"measured on {engine} by `jitserve calibrate --engine`",
        "sources": {
            "linear_table": "Measured: a fresh prompt of T tokens alone (vLLM's "
            "request_prefill_time), less a2*T^2/2 and a5.",
            "a2_a4_a5": "Fitted (non-negative least squares, relative error): each decode "
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
            "decode_fit_relative_residuals": list(terms.relative_residuals),
        },
    }
