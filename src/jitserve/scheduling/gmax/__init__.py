"""GMAX (JITServe paper section 4.2): the policy and its stages, one package.

Read in this order: :mod:`.policy` (the profile and the arrival path), :mod:`.scoring`
and :mod:`.priorities` (what a request is worth), :mod:`.grouping` (the group and the
cutoff p), :mod:`.sequencing` (start order and feasibility), :mod:`.preemption`,
:mod:`.pacing`; :mod:`.cutoff` learns p online.
"""

from jitserve.scheduling.gmax.policy import GMAX
from jitserve.scheduling.gmax.priorities import latency_tokens_reachable

__all__ = ["GMAX", "latency_tokens_reachable"]
