"""Batch-latency model of one engine iteration, with coefficients from profile files.

``t = a0 + a1*P + a2*sum(c*(k + c/2)) + a3*D + a4*sum(k_dec) + a5*n``: P prefill tokens
in chunks c over cached context k; D decoding sequences with contexts k_dec; n sequences.
Profiles are data (``sim/profiles/*.json``): adding a GPU or model is adding a file.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field


class Profile(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    name: str
    description: str = ""
    a0_s: float = Field(ge=0)
    a1_s_per_prefill_token: float = Field(ge=0)
    a2_s_per_attention_pair: float = Field(ge=0)
    a3_s_per_decode_seq: float = Field(ge=0)
    a4_s_per_context_token: float = Field(ge=0)
    a5_s_per_seq: float = Field(ge=0)
    kv_capacity_tokens: int = Field(gt=0)
    kv_block_tokens: int = Field(16, gt=0)
    max_running: int = Field(256, gt=0)
    chunk_token_budget: int = Field(1024, gt=0)
    prefill_first_token_budget: int = Field(8192, gt=0)

    def step_s(
        self,
        prefill_tokens: int,
        attention_pairs: float,
        decoders: int,
        decode_context: int,
        sequences: int,
    ) -> float:
        return (
            self.a0_s
            + self.a1_s_per_prefill_token * prefill_tokens
            + self.a2_s_per_attention_pair * attention_pairs
            + self.a3_s_per_decode_seq * decoders
            + self.a4_s_per_context_token * decode_context
            + self.a5_s_per_seq * sequences
        )

    def prefill_s(self, tokens: int) -> float:
        """Time to (re)compute ``tokens`` of context in one go: the stall a recompute
        preemption costs when the request comes back."""
        return (
            self.a1_s_per_prefill_token * tokens
            + self.a2_s_per_attention_pair * tokens * tokens / 2
        )


DEFAULT_PROFILE = "a100-llama3-8b"


def available_profiles() -> list[str]:
    folder = resources.files("jitserve.sim") / "profiles"
    return sorted(
        p.name.removesuffix(".json") for p in folder.iterdir() if p.name.endswith(".json")
    )


def load_profile(name_or_path: str = DEFAULT_PROFILE) -> Profile:
    """A bundled profile by name, or a JSON file by path."""
    path = Path(name_or_path)
    if path.suffix == ".json" and path.exists():
        text = path.read_text()
    else:
        resource = resources.files("jitserve.sim") / "profiles" / f"{name_or_path}.json"
        if not resource.is_file():
            raise ValueError(
                f"unknown profile {name_or_path!r}; bundled: {', '.join(available_profiles())}"
            )
        text = resource.read_text()
    return Profile.model_validate(json.loads(text))
