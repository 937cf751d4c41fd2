"""When a request must start, or produce its next token, to still meet its SLO.

Pure functions of a request's state and the engine's measured speeds, shared by every
policy and by overload control so that "too late" means the same thing everywhere:

- ``next_token_due_s``: when the next token is due (latency) or the deadline (others);
- ``deadline_s``: the deadline a scheduler works toward (compound: the current stage's
  sub-deadline ``phi(s) * D``; latency: none);
- ``latest_start_s``: the latest moment the request can start its (re)prefill and still
  earn its full gain, given its typical remaining length;
- ``latency_tokens_reachable``: how many of a latency request's tokens would be on time
  from a given start (vectorised);
- ``late_to_start``: past the latest start at the given (loaded) speeds, judged by the
  deadline the request is judged by (compound: the program's);
- ``out_of_reach``: the deadline (latency: the first token's due time) cannot be met
  even if the request ran alone at unloaded speed from now (its remaining prefill and
  one decode step): provably lost.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from jitserve.requests import LiveRequest
from jitserve.slo import LatencySLO

FloatArray = npt.NDArray[np.float64]


def is_latency(r: LiveRequest) -> bool:
    """A single latency request (a compound program's calls count toward its deadline)."""
    return isinstance(r.req.slo, LatencySLO) and r.program is None


def next_token_due_s(r: LiveRequest) -> float:
    """When the request's next token is due (latency) or its deadline (others)."""
    slo = r.req.slo
    if isinstance(slo, LatencySLO) and r.program is None:
        return slo.due_s(r.req.arrival_s, r.generated)
    return judged_deadline_s(r)


def deadline_s(r: LiveRequest) -> float:
    """The deadline a scheduler plans toward: the stage sub-deadline for a compound call,
    the request's deadline otherwise, infinity for latency requests (a timeline)."""
    if r.program is not None:
        return r.program.stage_deadline_abs_s
    if is_latency(r):
        return math.inf
    return r.deadline_abs_s


def judged_deadline_s(r: LiveRequest) -> float:
    """The deadline a non-latency request's SLO is judged by: a compound call's program's
    (its stage sub-deadline is a plan, not the SLO), the request's own otherwise (the
    ``whole_deadline`` column of :mod:`jitserve.scheduling.table`)."""
    return r.program.deadline_abs_s if r.program is not None else r.deadline_abs_s


def typical_remaining(r: LiveRequest) -> float:
    """Typical output tokens still to come (the estimator's expected length, else bound)."""
    return max((r.expected or r.bound) - r.generated, 1)


def latest_start_s(r: LiveRequest, prefill_s: float, decode_s: float) -> float:
    """Latest start of the (re)prefill that still earns the full gain: the first token
    due time less the prefill (latency), or the deadline less prefill and typical decode."""
    prefill_left = r.prefill_target - r.prefilled
    if is_latency(r):
        slo = r.req.slo
        assert isinstance(slo, LatencySLO)
        due = slo.due_s(r.req.arrival_s, r.generated)
        return due - (prefill_left + 1) * prefill_s
    return deadline_s(r) - (prefill_left * prefill_s + typical_remaining(r) * decode_s)


def late_to_start(r: LiveRequest, now_s: float, prefill_s: float, decode_s: float) -> bool:
    """Started now at these speeds, ``r`` would miss its SLO: past
    :func:`latest_start_s` for a latency request; otherwise its prefill and typical decode
    would end past :func:`judged_deadline_s`."""
    if is_latency(r):
        return now_s > latest_start_s(r, prefill_s, decode_s)
    work = (r.prefill_target - r.prefilled) * prefill_s + typical_remaining(r) * decode_s
    return now_s > judged_deadline_s(r) - work


def out_of_reach(r: LiveRequest, now_s: float, prefill_s: float, decode_s: float) -> bool:
    """The SLO cannot be met even if ``r`` ran alone at full speed from now: its
    remaining prefill plus one decode step past the deadline, or (a latency request that
    has no first token yet) past its first token's due time. ``prefill_s`` and
    ``decode_s`` are the engine's *unloaded* speeds, so queueing never makes a request
    look lost. A latency stream that has begun is never cut: its later tokens can still
    be on time. A latency request whose first token cannot be on time is lost under
    either objective: its tokens would only count late or by catching up on a stream
    the client already judged slow (docs/scheduling.md "The objective")."""
    fastest = (r.prefill_target - r.prefilled) * prefill_s + decode_s
    if is_latency(r):
        if r.first_token_s is not None:
            return False
        return now_s + fastest > next_token_due_s(r)
    return now_s + fastest > judged_deadline_s(r)


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
