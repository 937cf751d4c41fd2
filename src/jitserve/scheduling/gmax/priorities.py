"""GMAX's per-request values (paper section 4.2, DESIGN.md "GMAX scheduler"), for every
live request at once (O(N) array operations):

- ``gain``: what r is worth under the objective (``objective: tokens``: the goodput
  tokens it would earn; docs/scheduling.md "The objective") times its chance of finishing
  in time, ``P(remaining output <= steps left) ** penalty``, steps left counted to the
  deadline (compound: the stage sub-deadline phi(s) * D); a latency request earns its
  tokens that can still be on time, nothing if its first token would be late;
- ``cost``: the engine time r will take; ``priority = gain / cost`` plus ``delta`` x the
  median priority per frame waited (aging); one compound stage shares one priority;
- ``latest_start``: the last start that still earns the full gain.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from jitserve.policy import Objective, SLOPolicySpec
from jitserve.scheduling.estimators.remaining import p_within
from jitserve.scheduling.scores import RowSpeeds, Scores, Speeds
from jitserve.scheduling.slack import latency_tokens_reachable
from jitserve.scheduling.table import Features

FloatArray = npt.NDArray[np.float64]
MIN_TIME_S = 1e-3
DEMOTED_GAIN = 1e-3
"""A demoted request's gain per token: best effort, after everything with an SLO."""


def _at(x: float | FloatArray, rows: npt.NDArray[np.intp]) -> float | FloatArray:
    """``x`` at ``rows`` when it is per row, else the scalar itself."""
    return x[rows] if isinstance(x, np.ndarray) else x


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


def score_features(f: Features, at: ScoreAt) -> Scores:
    """Priority and latest start of requests given by their features (a waiting table's
    columns; see the module docstring)."""
    speeds, spec = at.speeds, at.spec
    n = len(f)
    if n == 0:
        empty = np.zeros(0)
        return Scores(empty, empty, at.median_hint, empty, empty, empty, empty)
    v: float | FloatArray
    pf_s: float | FloatArray
    token_s: float | FloatArray
    now: float | FloatArray
    if at.rows is None:
        v, pf_s, token_s, now = speeds.decode_s, speeds.prefill_s, speeds.token_s, at.now_s
        slot_s: float | FloatArray = v / speeds.batch if speeds.slots_bind else 0.0
    else:
        rows = at.rows
        v, pf_s, token_s, now = rows.decode_s, rows.prefill_s, rows.token_s, rows.now_s
        slot_s = np.where(rows.slots_bind, rows.decode_s / rows.batch, 0.0)
    typical, prefill_left = f.typical, f.prefill_left
    # a demoted request has no deadline (and no latency timeline): best effort
    is_latency = f.is_latency & ~f.demoted
    deadline = np.where(f.demoted, np.inf, f.deadline)
    # Cost = share of engine time r will consume: with chunked prefill every prompt and
    # output token takes one unit of the iteration's token budget (token_s each); a
    # decode token also holds one of B batch slots for a step (v / B) while slots bind.
    cost = prefill_left * token_s + typical * np.maximum(token_s, slot_s)
    work_s = (prefill_left + typical) * token_s
    tokens_objective = spec.objective is Objective.TOKENS
    value = f.prompt + f.generated + typical if tokens_objective else np.ones(n)
    # the chance of finishing in time: decode steps left after the prefill, against the
    # remaining length's distribution (``remaining`` is the bound, the q-quantile)
    steps = (deadline - now - prefill_left * pf_s) / v
    gain = value * p_within(typical, f.remaining, steps, speeds.z_q) ** spec.scheduler.soft_penalty
    latest_start = deadline - (prefill_left * pf_s + typical * v)
    due = deadline.copy()
    lat = np.flatnonzero(is_latency)
    if lat.size:
        v_lat, generated = _at(v, lat), f.generated[lat]
        start = _at(now, lat) + prefill_left[lat] * _at(pf_s, lat)
        ontime = latency_tokens_reachable(
            generated, typical[lat], start, v_lat, f.due0[lat], f.tbt[lat]
        )
        # a late first token earns nothing: the client has judged the stream slow (TTFT),
        # whatever later tokens could still catch up
        late_start = (generated == 0) & (start + v_lat > f.due0[lat] + 1e-9)
        if tokens_objective:  # its on-time output tokens: what the metric counts
            gain[lat] = ontime * ~late_start
        else:
            gain[lat] = (ontime >= typical[lat]) & ~late_start
        latest_start[lat] = f.token_due(f.generated)[lat] - (prefill_left[lat] + 1) * _at(pf_s, lat)
        due[lat] = f.token_due(f.generated + typical - 1)[lat]
    demoted = ~np.isfinite(deadline) & ~is_latency
    gain[demoted] = DEMOTED_GAIN * (f.prompt[demoted] + typical[demoted])
    # One priority per compound stage: the stage's gain over the stage's cost, the gain
    # being the program's: what the stages done so far cost is sunk, so finishing a
    # program that is a share phi(s-1) done earns 1 / (1 - phi(s-1)) times more per unit
    # of the engine time still to spend.
    calls = np.flatnonzero(f.program >= 0)
    if calls.size:
        _, group = np.unique(f.program[calls], return_inverse=True)
        size = np.bincount(group)
        gain[calls] = (np.bincount(group, weights=gain[calls]) / size)[group] * f.sunk[calls]
        cost[calls] = (np.bincount(group, weights=cost[calls]) / size)[group]
        earliest = np.full(size.size, np.inf)
        np.minimum.at(earliest, group, latest_start[calls])
        latest_start[calls] = earliest[group]
    priority = gain / np.maximum(cost, 1e-9)
    positive = priority[priority > 0]
    # one arrival scored alone keeps the frame's median (the scale of aging)
    median = float(np.median(positive)) if n > 1 and positive.size else at.median_hint
    if spec.scheduler.mechanisms.aging:
        priority += spec.scheduler.delta * median * f.waited
    need = (deadline - now - prefill_left * pf_s) / typical
    need[lat] = f.tbt[lat]
    return Scores(priority, latest_start, median, work_s, due, gain, need)
