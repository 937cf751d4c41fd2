"""Baselines the papers beat, on the same :class:`~jitserve.scheduling.base.Policy`
interface and the same engine as GMAX. Each is one sort key (lower runs first), written
once over arrays (:class:`~jitserve.scheduling.baselines.keyed.KeyedPolicy`).

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

from jitserve.scheduling.baselines.keyed import KeyedPolicy, KeyInput
from jitserve.scheduling.table import Features, FloatArray

__all__ = ["EDF", "FCFS", "LSF", "PLAS", "SJF", "Sarathi", "next_token_due"]


def next_token_due(f: Features) -> FloatArray:
    """When each request's next token is due (latency) or its deadline (others: the
    program's for a compound call)."""
    return np.where(f.is_latency, f.token_due(f.generated), f.whole_deadline)


class FCFS(KeyedPolicy):
    name = "fcfs"
    chunked_prefill = False

    def keys(self, batch: KeyInput) -> FloatArray:
        return batch.features.arrival


class Sarathi(FCFS):
    name = "sarathi"
    chunked_prefill = True


class EDF(KeyedPolicy):
    name = "edf"
    rekey_every_frame = True
    preemptive = True

    def keys(self, batch: KeyInput) -> FloatArray:
        return next_token_due(batch.features)


class LSF(KeyedPolicy):
    """Least slack first: slack = latest start - now, where the latest start leaves the
    remaining prefill and the typical remaining decode at the measured speeds (the same
    :func:`~jitserve.scheduling.slack.latest_start_s` GMAX sequences its group by)."""

    name = "lsf"
    rekey_every_frame = True
    preemptive = True

    def keys(self, batch: KeyInput) -> FloatArray:
        f, pf_s = batch.features, batch.speeds.prefill_s
        latency = f.token_due(f.generated) - (f.prefill_left + 1) * pf_s
        other = f.deadline - (f.prefill_left * pf_s + f.typical * batch.speeds.decode_s)
        return np.where(f.is_latency, latency, other)


class SJF(KeyedPolicy):
    """Shortest predicted remaining output first (the estimator's expected length)."""

    name = "sjf"
    rekey_every_frame = True

    def keys(self, batch: KeyInput) -> FloatArray:
        return batch.features.typical


PLAS_QUANTUM_TOKENS = 400


class PLAS(KeyedPolicy):
    """Attained service is counted per program (all its calls so far)."""

    name = "plas"
    rekey_every_frame = True
    preemptive = True

    def keys(self, batch: KeyInput) -> FloatArray:
        keys = []
        for r in batch.rows:
            lp = r.program
            attained = r.generated + (lp.attained_tokens if lp is not None else 0)
            arrival = lp.program.arrival_s if lp is not None else r.req.arrival_s
            keys.append((attained // PLAS_QUANTUM_TOKENS) * 1e7 + arrival)
        return np.array(keys, dtype=np.float64)
