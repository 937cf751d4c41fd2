"""Building blocks of the ``SLOPolicy`` model shared by its sections (camelCase on the
wire, frozen, unknown fields refused)."""

from __future__ import annotations

from typing import Annotated, Unpack

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

Seconds = Annotated[float, Field(gt=0, le=86400)]
DNSLabel = Annotated[
    str, Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
]


class SpecModel(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


Fraction = Annotated[float, Field(ge=0, le=1)]


def cel(*rules: tuple[str, str], **config: Unpack[ConfigDict]) -> ConfigDict:
    """A model's CEL ``x-kubernetes-validations`` (rule, message): the API server checks
    them (Kubernetes >= 1.25); the Python check next to each is the same rule, for the
    webhook on older API servers and for the reconciler's ``Degraded`` condition.
    ``config``: more of the model's config (e.g. ``extra="allow"``), over SpecModel's."""
    return ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [{"rule": r, "message": m} for r, m in rules]
        },
        **config,
    )
