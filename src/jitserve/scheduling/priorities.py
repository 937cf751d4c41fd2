"""GMAX's per-request values: margin goodput per unit of engine time, the latest start
that still earns the full gain, and the tenants' fair-share claims (paper section 4.2,
DESIGN.md "GMAX scheduler").

For every live request r (vectorised over all of them, O(N)):

- ``t_gen = prefill_left * prefill_s + len_rem * v_token`` with ``len_rem`` the bound;
- ``t_rem`` = time to the deadline (compound: the stage sub-deadline phi(s) * D);
  latency requests' timeline is fixed by their TBT, so their gain counts the tokens that
  can still be on time instead;
- ``gain`` = what completing r is worth under the objective, discounted softly when r is
  projected late: ``gain * min(1, t_rem / t_gen) ** penalty``;
- ``priority = gain / cost`` (cost: the engine time r will take, see below) plus
  ``delta`` x median priority per frame waited (aging); members of one compound stage
  share one priority;
- ``fair``: each tenant's claim, ``share / (share + received)`` with ``received`` its
  decayed share of service: 1 for a tenant that got nothing, 1/2 at its entitlement.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Set
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from jitserve.policy import FairnessSettings, Objective, SLOPolicySpec
from jitserve.requests import LiveProgram, LiveRequest
from jitserve.slo import LatencySLO

FloatArray = npt.NDArray[np.float64]
MIN_TIME_S = 1e-3
DEMOTED_GAIN = 1e-3
"""A demoted request's gain per token: best effort, after everything with an SLO."""


@dataclass(slots=True)
class Speeds:
    """The engine's measured speeds at the current load."""

    decode_s: float = 0.03
    """One decode step (v_token)."""
    prefill_s: float = 1e-4
    """Wall time per queued prompt token."""
    token_s: float = 1e-4
    """Engine time per batched token (the marginal cost of one more token)."""
    batch: int = 256


@dataclass(slots=True)
class Scores:
    priority: FloatArray
    """Goodput per unit of engine time, aged."""
    latest_start: FloatArray
    """Latest start (s) that still earns the full gain; the group's sequencing key."""
    median: float
    """Median positive priority before aging (the scale of aging and fairness)."""


def latency_tokens_reachable(
    first_index: FloatArray,
    count: FloatArray,
    start_s: FloatArray,
    per_token_s: float,
    due0_s: FloatArray,
    tbt_s: FloatArray,
) -> FloatArray:
    """How many of tokens ``first_index .. first_index+count-1`` would be on time if the
    request started producing at ``start_s`` with one token per ``per_token_s``.

    Token i is out at ``start + (i - first + 1) * v`` and due at ``due0 + i * tbt``; the
    lateness changes linearly in i, so the on-time tokens are a prefix or a suffix."""
    # lateness(i) = start + (i - first + 1) v - due0 - i tbt = c0 + i (v - tbt)
    c0 = start_s + (1 - first_index) * per_token_s - due0_s
    slope = per_token_s - tbt_s
    last = first_index + count - 1
    with np.errstate(divide="ignore", invalid="ignore"):
        crossing = np.where(slope != 0, -c0 / np.where(slope != 0, slope, 1.0), np.inf)
    # slope < 0: on time for i >= crossing; slope > 0: on time for i <= crossing
    from_suffix = np.clip(last - np.maximum(np.ceil(crossing - 1e-9), first_index) + 1, 0, count)
    from_prefix = np.clip(np.minimum(np.floor(crossing + 1e-9), last) - first_index + 1, 0, count)
    flat = np.where(c0 <= 1e-9, count, 0.0)
    return np.where(slope < 0, from_suffix, np.where(slope > 0, from_prefix, flat))


def program_groups(rs: list[LiveRequest]) -> dict[LiveProgram, npt.NDArray[np.intp]]:
    groups: dict[LiveProgram, list[int]] = defaultdict(list)
    for i, r in enumerate(rs):
        if r.program is not None:
            groups[r.program].append(i)
    return {lp: np.array(members) for lp, members in groups.items()}


def score(
    rs: list[LiveRequest],
    now_s: float,
    speeds: Speeds,
    spec: SLOPolicySpec,
    frames_waited: Mapping[LiveRequest, int],
    demoted: Set[LiveRequest],
    median_hint: float = 1.0,
) -> Scores:
    """Priority and latest start of each of ``rs`` (see the module docstring)."""
    n = len(rs)
    if n == 0:
        return Scores(np.zeros(0), np.zeros(0), median_hint)
    v, pf_s = speeds.decode_s, speeds.prefill_s
    generated = np.empty(n)
    remaining = np.empty(n)
    typical = np.empty(n)
    prefill_left = np.empty(n)
    prompt = np.empty(n)
    deadline = np.empty(n)
    due0 = np.empty(n)
    tbt = np.empty(n)
    is_latency = np.zeros(n, dtype=bool)
    waited = np.empty(n)
    for i, r in enumerate(rs):
        req = r.req
        g = r.generated
        generated[i] = g
        remaining[i] = max(r.bound - g, 1)
        typical[i] = max((r.expected or r.bound) - g, 1)
        prefill_left[i] = r.prefill_target - r.prefilled
        prompt[i] = req.prompt_tokens
        waited[i] = frames_waited.get(r, 0)
        slo = req.slo
        if r in demoted:
            deadline[i] = math.inf
        elif isinstance(slo, LatencySLO) and r.program is None:
            is_latency[i] = True
            due0[i] = req.arrival_s + slo.ttft_s
            tbt[i] = slo.tbt_s
        elif r.program is not None:
            deadline[i] = r.program.stage_deadline_abs_s
        else:
            deadline[i] = req.arrival_s + slo.deadline_s  # type: ignore[union-attr]
    t_gen = np.maximum(prefill_left * pf_s + remaining * v, MIN_TIME_S)
    # Cost = share of engine time r will consume: with chunked prefill every prompt and
    # output token takes one unit of the iteration's token budget (token_s each); a
    # decode token also holds one of B batch slots for a step (v / B).
    cost = prefill_left * speeds.token_s + typical * max(speeds.token_s, v / speeds.batch)
    programs = program_groups(rs)
    for idx in programs.values():
        t_gen[idx] = t_gen[idx].max()
    t_rem = np.where(is_latency, 0.0, deadline - now_s)
    penalty = spec.scheduler.soft_penalty
    feasible = np.clip(np.where(t_rem > 0, t_rem / t_gen, 0.0), 0.0, 1.0) ** penalty
    tokens_objective = spec.objective is Objective.TOKENS
    gain = (prompt + generated + typical if tokens_objective else np.ones(n)) * feasible
    latest_start = deadline - (prefill_left * pf_s + typical * v)
    if is_latency.any():
        idx = np.flatnonzero(is_latency)
        start = now_s + prefill_left[idx] * pf_s
        ontime = latency_tokens_reachable(
            generated[idx], typical[idx], start, v, due0[idx], tbt[idx]
        )
        gain[idx] = ontime if tokens_objective else (ontime >= typical[idx])
        latest_start[idx] = due0[idx] + generated[idx] * tbt[idx] - (prefill_left[idx] + 1) * pf_s
    demoted_mask = ~np.isfinite(deadline) & ~is_latency
    gain[demoted_mask] = DEMOTED_GAIN * (prompt[demoted_mask] + typical[demoted_mask])
    for idx in programs.values():
        # One priority per compound stage: the stage's gain over the stage's cost.
        gain[idx] = gain[idx].sum() / idx.size
        cost[idx] = cost[idx].sum() / idx.size
        latest_start[idx] = latest_start[idx].min()
    priority = gain / np.maximum(cost, 1e-9)
    positive = priority[priority > 0]
    median = float(np.median(positive)) if positive.size else median_hint
    if spec.scheduler.mechanisms.aging:
        priority += spec.scheduler.delta * median * waited
    return Scores(priority, latest_start, median)


def fair_claims(
    tenants: list[str], service: Mapping[str, float], fairness: FairnessSettings
) -> dict[str, float]:
    """Each tenant's claim in (0, 1]: ``share / (share + received)``, where ``share`` is
    its weight over the live tenants' weights and ``received`` its share of the decayed
    service; a tenant at its entitlement gets 1/2, one that received nothing gets 1."""
    live = set(tenants)
    weights = {t: fairness.weight_of(t) for t in live}
    weight_sum = sum(weights.values()) or 1.0
    total = sum(service.get(t, 0.0) for t in live)
    claims = {}
    for t in live:
        share = weights[t] / weight_sum
        received = service.get(t, 0.0) / total if total > 0 else share
        claims[t] = share / (share + received)
    return claims
