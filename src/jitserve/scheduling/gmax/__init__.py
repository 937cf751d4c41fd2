"""GMAX (JITServe paper section 4.2): the policy and its stages, one package.

Read in this order: :mod:`.policy` (the profile and the arrival path), :mod:`.scoring`
and :mod:`.priorities` (what a request is worth; the tenants' claims), :mod:`.grouping`
(the group and the cutoff p), :mod:`.sequencing` (start order and feasibility),
:mod:`.preemption`, :mod:`.pacing`, :mod:`.yielding` (f > 0); :mod:`.cutoff` learns p online.
"""

from jitserve.scheduling.gmax.policy import GMAX

__all__ = ["GMAX"]
