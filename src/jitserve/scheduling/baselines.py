"""Baselines the papers beat, on the same :class:`~jitserve.scheduling.base.Policy`
interface and the same engine as GMAX. Each is one sort key (lower runs first), per
request and, where the key is a function of the waiting table's columns, over the whole
queue as arrays.

- ``fcfs``: vLLM's default: first come first served, whole-prompt prefill first
  (vLLM v0 batching), no preemption except under KV pressure.
- ``sarathi``: Sarathi-Serve: FCFS with chunked prefill and decode-first batching.
- ``edf``: earliest deadline first (latency requests: due time of their next token).
- ``lsf``: least slack first: deadline minus predicted remaining work (prefill left and
  the estimator's expected remaining output at the measured speeds).
- ``sjf``: shortest predicted remaining output first (LTR-like; the estimator's expected
  length).
- ``plas``: Autellix's program-level least attained service, in 400-token quanta.

EDF, LSF and PLAS re-rank at every frame and preempt when a waiting request outranks a
running one, as vLLM's priority scheduling does; FCFS, Sarathi and SJF do not preempt.
A length-aware baseline (LSF, SJF) reads the bounds the lifecycle's estimator wrote, the
same estimator as the GMAX variant it is compared with (``jitserve.bench.variants``).
Stock engines have no overload control; each baseline's ``-ac`` form adds the very layer
GMAX runs in (:mod:`jitserve.scheduling.overload`).
"""

from __future__ import annotations

import numpy as np

from jitserve.requests import LiveRequest
from jitserve.scheduling.base import EngineView, FramePlan, KeyedPolicy
from jitserve.scheduling.slack import latest_start_s, next_token_due_s, typical_remaining
from jitserve.scheduling.table import Features, FloatArray

__all__ = ["EDF", "FCFS", "LSF", "PLAS", "SJF", "Sarathi", "next_token_due_s"]


class FCFS(KeyedPolicy):
    name = "fcfs"
    chunked_prefill = False

    def key(self, r: LiveRequest, now_s: float) -> float:
        return r.req.arrival_s

    def keys(self, features: Features, now_s: float) -> FloatArray:
        return features.arrival


class Sarathi(FCFS):
    name = "sarathi"
    chunked_prefill = True


class EDF(KeyedPolicy):
    name = "edf"
    rekey_every_frame = True
    preemptive = True

    def key(self, r: LiveRequest, now_s: float) -> float:
        return next_token_due_s(r)

    def keys(self, features: Features, now_s: float) -> FloatArray:
        return np.where(
            features.is_latency,
            features.due0 + features.generated * features.tbt,
            features.whole_deadline,
        )


class LSF(KeyedPolicy):
    """Least slack first: slack = latest start - now, where the latest start leaves the
    remaining prefill and the typical remaining decode at the measured speeds (the same
    :func:`~jitserve.scheduling.slack.latest_start_s` GMAX sequences its group by)."""

    name = "lsf"
    rekey_every_frame = True
    preemptive = True

    def __init__(self) -> None:
        super().__init__()
        self._prefill_s = 1e-4
        self._decode_s = 0.03

    def plan(self, view: EngineView) -> FramePlan:
        self._prefill_s = view.prefill_s_per_token
        self._decode_s = max(view.decode_step_s, 1e-3)
        return super().plan(view)

    def key(self, r: LiveRequest, now_s: float) -> float:
        return latest_start_s(r, self._prefill_s, self._decode_s)

    def keys(self, features: Features, now_s: float) -> FloatArray:
        f, pf_s = features, self._prefill_s
        latency = f.due0 + f.generated * f.tbt - (f.prefill_left + 1) * pf_s
        other = f.deadline - (f.prefill_left * pf_s + f.typical * self._decode_s)
        return np.where(f.is_latency, latency, other)


class SJF(KeyedPolicy):
    """Shortest predicted remaining output first (the estimator's expected length)."""

    name = "sjf"
    rekey_every_frame = True

    def key(self, r: LiveRequest, now_s: float) -> float:
        return typical_remaining(r)

    def keys(self, features: Features, now_s: float) -> FloatArray:
        return features.typical


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
