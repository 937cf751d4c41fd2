"""GMAX's per-request values: margin goodput per unit of engine time, the latest start
that still earns the full gain, and the tenants' fair-share claims (paper section 4.2,
DESIGN.md "GMAX scheduler").

For every live request r (vectorised over all of them, O(N)):

- ``t_gen = prefill_left * prefill_s + len_rem * v_token`` with ``len_rem`` the bound;
- ``t_rem`` = time to the deadline (compound: the stage sub-deadline phi(s) * D);
  latency requests' timeline is fixed by their TBT, so their gain counts the tokens that
  can still be on time instead;
- ``gain`` = what completing r is worth under the objective, discounted softly when r is
  projected late: ``gain * min(1, t_rem / t_gen) ** penalty``; with ``objective:
  tokens`` each kind is worth the tokens the goodput metric counts for it (one value
  per goodput token), and a latency request whose first token would be late is worth
  nothing (docs/scheduling.md "The objective");
- ``priority = gain / cost`` (cost: the engine time r will take, see below) plus
  ``delta`` x median priority per frame waited (aging); members of one compound stage
  share one priority;
- ``fair``: each tenant's claim, ``share / (share + received)`` with ``received`` its
  decayed share of service: 1 for a tenant that got nothing, 1/2 at its entitlement.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from jitserve.fairshare import max_min_shares
from jitserve.policy import FairnessSettings, Objective, SLOPolicySpec
from jitserve.scheduling.scores import RowSpeeds, Scores, Speeds
from jitserve.scheduling.table import Features

FloatArray = npt.NDArray[np.float64]
MIN_TIME_S = 1e-3
DEMOTED_GAIN = 1e-3
"""A demoted request's gain per token: best effort, after everything with an SLO."""


def _at(x: float | FloatArray, rows: npt.NDArray[np.intp]) -> float | FloatArray:
    """``x`` at ``rows`` when it is per row, else the scalar itself."""
    return x[rows] if isinstance(x, np.ndarray) else x


def latency_tokens_reachable(
    first_index: FloatArray,
    count: FloatArray,
    start_s: FloatArray,
    per_token_s: float | FloatArray,
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


def normal_cdf(z: FloatArray) -> FloatArray:
    """Standard normal CDF (Abramowitz and Stegun 7.1.26, error < 1.5e-7)."""
    x = np.abs(z) / math.sqrt(2.0)
    t = 1.0 / (1.0 + 0.3275911 * x)
    poly = t * (
        0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429)))
    )
    erf = 1.0 - poly * np.exp(-x * x)
    return 0.5 * (1.0 + np.sign(z) * erf)


def normal_quantile(q: float) -> float:
    """Inverse standard normal CDF by bisection on :func:`normal_cdf` (called per config)."""
    low, high = -8.0, 8.0
    for _ in range(60):
        mid = (low + high) / 2
        if normal_cdf(np.array([mid]))[0] < q:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def p_within(
    typical: FloatArray, bound: FloatArray, tokens: FloatArray, z_q: float
) -> FloatArray:
    """P(remaining output <= ``tokens``) when the remaining output is log-normal with
    mean ``typical`` and q-quantile ``bound`` (the estimator's expected length and bound,
    both what is left after the tokens generated). Equal mean and bound (exact lengths):
    a step at ``typical``."""
    gap = np.log(np.maximum(bound, 1.0)) - np.log(np.maximum(typical, 1.0))
    disc = np.maximum(z_q * z_q - 2.0 * np.maximum(gap, 0.0), 0.0)
    sigma = np.maximum(z_q - np.sqrt(disc), 1e-3)
    mu = np.log(np.maximum(typical, 1.0)) - sigma * sigma / 2
    with np.errstate(divide="ignore"):
        z = (np.log(np.maximum(tokens, 1e-9)) - mu) / sigma
    return np.where(tokens <= 0, 0.0, normal_cdf(z))


@dataclass(frozen=True, slots=True)
class ScoreAt:
    """Where requests are scored: the clock, the engine's speeds and the settings; the
    median priority of the last frame (an arrival scored alone keeps it: the scale of
    aging); with ``rows``, each row at its own clock and speeds (one request on several
    replicas; ``now_s`` and ``speeds``' are then unused but for ``z_q``)."""

    now_s: float
    speeds: Speeds
    spec: SLOPolicySpec
    median_hint: float = 1.0
    rows: RowSpeeds | None = None


def score_features(features: Features, at: ScoreAt) -> Scores:
    """Priority and latest start of requests given by their features (a waiting table's
    columns; see the module docstring)."""
    speeds, spec, median_hint, rows = at.speeds, at.spec, at.median_hint, at.rows
    n = len(features)
    if n == 0:
        empty = np.zeros(0)
        return Scores(empty, empty, median_hint, empty, empty, empty, empty)
    v: float | FloatArray
    pf_s: float | FloatArray
    token_s: float | FloatArray
    now: float | FloatArray
    if rows is None:
        v, pf_s, token_s, now = speeds.decode_s, speeds.prefill_s, speeds.token_s, at.now_s
        slot_s: float | FloatArray = v / speeds.batch if speeds.slots_bind else 0.0
    else:
        v, pf_s, token_s, now = rows.decode_s, rows.prefill_s, rows.token_s, rows.now_s
        slot_s = np.where(rows.slots_bind, rows.decode_s / rows.batch, 0.0)
    generated = features.generated
    remaining = features.remaining  # the bound: the q-quantile
    typical = features.typical
    prefill_left = features.prefill_left
    prompt = features.prompt
    waited = features.waited
    due0 = features.due0
    tbt = features.tbt
    # a demoted request has no deadline (and no latency timeline): best effort
    is_latency = features.is_latency & ~features.demoted
    deadline = np.where(features.demoted, np.inf, features.deadline)
    # Cost = share of engine time r will consume: with chunked prefill every prompt and
    # output token takes one unit of the iteration's token budget (token_s each); a
    # decode token also holds one of B batch slots for a step (v / B) while slots bind.
    cost = prefill_left * token_s + typical * np.maximum(token_s, slot_s)
    work_s = (prefill_left + typical) * token_s
    penalty = spec.scheduler.soft_penalty
    tokens_objective = spec.objective is Objective.TOKENS
    value = prompt + generated + typical if tokens_objective else np.ones(n)
    lat = np.flatnonzero(is_latency)

    def gain_if_started_in(delay_s: float) -> FloatArray:
        """Expected goodput if r started ``delay_s`` from now: the chance of finishing in
        time (decode steps left after the prefill, against the remaining length's
        distribution) x its tokens; latency: the tokens that would be on time."""
        steps = (deadline - now - delay_s - prefill_left * pf_s) / v
        gain = value * p_within(typical, remaining, steps, speeds.z_q) ** penalty
        if lat.size:
            v_lat = _at(v, lat)
            start = _at(now, lat) + delay_s + prefill_left[lat] * _at(pf_s, lat)
            ontime = latency_tokens_reachable(
                generated[lat], typical[lat], start, v_lat, due0[lat], tbt[lat]
            )
            # a late first token earns nothing: the client has judged the stream slow
            # (TTFT), whatever later tokens could still catch up
            late_start = (generated[lat] == 0) & (start + v_lat > due0[lat] + 1e-9)
            if tokens_objective:  # its on-time output tokens: what the metric counts
                gain[lat] = ontime * ~late_start
            else:
                gain[lat] = (ontime >= typical[lat]) & ~late_start
        return gain

    gain = gain_if_started_in(0.0)
    latest_start = deadline - (prefill_left * pf_s + typical * v)
    due = deadline.copy()
    if lat.size:
        latest_start[lat] = (
            features.token_due(generated)[lat] - (prefill_left[lat] + 1) * _at(pf_s, lat)
        )
        due[lat] = features.token_due(generated + typical - 1)[lat]
    demoted_mask = ~np.isfinite(deadline) & ~is_latency
    gain[demoted_mask] = DEMOTED_GAIN * (prompt[demoted_mask] + typical[demoted_mask])
    # One priority per compound stage: the stage's gain over the stage's cost, the gain
    # being the program's: what the stages done so far cost is sunk, so finishing a
    # program that is a share phi(s-1) done earns 1 / (1 - phi(s-1)) times more per unit
    # of the engine time still to spend.
    calls = np.flatnonzero(features.program >= 0)
    if calls.size:
        _, group = np.unique(features.program[calls], return_inverse=True)
        size = np.bincount(group)
        gain[calls] = (np.bincount(group, weights=gain[calls]) / size)[group] * features.sunk[
            calls
        ]
        cost[calls] = (np.bincount(group, weights=cost[calls]) / size)[group]
        earliest = np.full(size.size, np.inf)
        np.minimum.at(earliest, group, latest_start[calls])
        latest_start[calls] = earliest[group]
    cost = np.maximum(cost, 1e-9)
    priority = gain / cost
    positive = priority[priority > 0]
    # one arrival scored alone keeps the frame's median (the scale of aging)
    median = float(np.median(positive)) if n > 1 and positive.size else median_hint
    if spec.scheduler.mechanisms.aging:
        priority += spec.scheduler.delta * median * waited
    need = (deadline - now - prefill_left * pf_s) / typical
    if lat.size:
        need[lat] = tbt[lat]
    return Scores(priority, latest_start, median, work_s, due, gain, need)


def fair_claims(
    tenants: list[str],
    service: Mapping[str, float],
    fairness: FairnessSettings,
    demand: Mapping[str, float] | None = None,
) -> dict[str, float]:
    """Each tenant's claim in [0, 1]: ``share / (share + received)``, where ``received``
    is its share of the decayed service and ``share`` its max-min fair share of that
    service: its ``demand`` water-filled by weight (:func:`jitserve.fairshare.
    max_min_shares`; without demand, or before any service, its weight over the live
    tenants' weights). A tenant at its fair share gets 1/2, one that received nothing 1."""
    live = sorted(set(tenants))  # a fixed order of the float sums, not the hash seed's
    weights = {t: fairness.weight_of(t) for t in live}
    weight_sum = sum(weights.values()) or 1.0
    total = sum(service.get(t, 0.0) for t in live)
    fair: dict[str, float] | None = None
    if demand is not None and total > 0:
        wanted = {t: max(demand.get(t, 0.0), service.get(t, 0.0)) for t in live}
        if sum(wanted.values()) > 0:
            fair = max_min_shares(wanted, weights, total)
    claims = {}
    for t in live:
        share = fair[t] / total if fair is not None else weights[t] / weight_sum
        if share <= 0:  # asked for nothing in the window: no claim on the service
            claims[t] = 0.0
            continue
        received = service.get(t, 0.0) / total if total > 0 else share
        claims[t] = share / (share + received)
    return claims
