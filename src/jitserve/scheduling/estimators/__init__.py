"""What a scheduler predicts: output lengths and compound stage shares (:mod:`.lengths`)
and step times, learned online from the engine's measured steps (:mod:`.step_model`)."""

from jitserve.scheduling.estimators.lengths import (
    DEFAULT_PRIOR_TOKENS,
    ExactEstimator,
    ExactStageShare,
    FrozenBounds,
    LengthEstimator,
    MeanEstimator,
    QuantileEstimator,
    StageShareEstimator,
    UniformStageShare,
)
from jitserve.scheduling.estimators.step_model import OnlineStepModel

__all__ = [
    "DEFAULT_PRIOR_TOKENS", "ExactEstimator", "ExactStageShare", "FrozenBounds",
    "LengthEstimator", "MeanEstimator", "OnlineStepModel", "QuantileEstimator",
    "StageShareEstimator", "UniformStageShare",
]  # fmt: skip
