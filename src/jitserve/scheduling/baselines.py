"""Baselines the papers beat, on the same :class:`~jitserve.scheduling.base.Policy`
interface and the same engine as GMAX. Each is one sort key (lower runs first).

- ``fcfs``: vLLM's default: first come first served, whole-prompt prefill first
  (vLLM v0 batching), no preemption except under KV pressure.
- ``sarathi``: Sarathi-Serve: FCFS with chunked prefill and decode-first batching.
- ``edf``: earliest deadline first (latency requests: due time of their next token).
- ``lsf``: least slack first: deadline minus predicted remaining work.
- ``sjf``: shortest predicted remaining output first (LTR-like; predictions from the
  engine's length estimator).
- ``plas``: Autellix's program-level least attained service, in 400-token quanta.

EDF, LSF and PLAS re-rank at every frame and preempt when a waiting request outranks a
running one, as vLLM's priority scheduling does; FCFS, Sarathi and SJF do not preempt.
"""

from __future__ import annotations

from jitserve.requests import LiveRequest
from jitserve.scheduling.base import KeyedPolicy
from jitserve.slo import LatencySLO

NOMINAL_DECODE_S = 0.03
"""Per-token time LSF assumes when it converts remaining tokens into remaining work."""


def next_token_due_s(r: LiveRequest) -> float:
    """When the request's next token is due (latency) or its deadline (others)."""
    slo = r.req.slo
    if isinstance(slo, LatencySLO) and r.program is None:
        return r.req.arrival_s + slo.ttft_s + r.generated * slo.tbt_s
    if r.program is not None:
        return r.program.deadline_abs_s
    return r.deadline_abs_s


class FCFS(KeyedPolicy):
    name = "fcfs"
    chunked_prefill = False

    def key(self, r: LiveRequest, now_s: float) -> float:
        return r.req.arrival_s


class Sarathi(FCFS):
    name = "sarathi"
    chunked_prefill = True


class EDF(KeyedPolicy):
    name = "edf"
    rekey_every_frame = True
    preemptive = True

    def key(self, r: LiveRequest, now_s: float) -> float:
        return next_token_due_s(r)


class LSF(KeyedPolicy):
    name = "lsf"
    rekey_every_frame = True
    preemptive = True

    def key(self, r: LiveRequest, now_s: float) -> float:
        remaining = max(r.bound - r.generated, 1)
        return next_token_due_s(r) - remaining * NOMINAL_DECODE_S


class SJF(KeyedPolicy):
    name = "sjf"
    rekey_every_frame = True

    def key(self, r: LiveRequest, now_s: float) -> float:
        return float(max(r.bound - r.generated, 1))


PLAS_QUANTUM_TOKENS = 400


class PLAS(KeyedPolicy):
    """Attained service is counted per program (all its calls so far)."""

    name = "plas"
    rekey_every_frame = True
    preemptive = True

    def key(self, r: LiveRequest, now_s: float) -> float:
        attained = r.generated + (r.program.attained_tokens if r.program is not None else 0)
        arrival = r.program.program.arrival_s if r.program is not None else r.req.arrival_s
        return (attained // PLAS_QUANTUM_TOKENS) * 1e7 + arrival
