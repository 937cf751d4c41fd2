"""The baselines the papers beat, each one sort key over the shared keyed stages
(:mod:`.keyed`): :mod:`.keys` (FCFS, Sarathi, EDF, LSF, SJF, PLAS) and SlidingServe's
sorter (:mod:`.slidingserve`)."""

from jitserve.scheduling.baselines.keyed import KeyedPolicy, KeyInput, KeySpeeds
from jitserve.scheduling.baselines.keys import EDF, FCFS, LSF, PLAS, SJF, Sarathi, next_token_due
from jitserve.scheduling.baselines.slidingserve import SlidingServe

__all__ = [
    "EDF", "FCFS", "LSF", "PLAS", "SJF", "KeyInput", "KeySpeeds", "KeyedPolicy", "Sarathi",
    "SlidingServe", "next_token_due",
]  # fmt: skip
