"""Fits the engine profile to Vidur's A100 Llama-3-8B profiling.

Run it as ``python -m jitserve.sim.calibrate [--write PATH]``.

The *reference* time of an iteration is built from measurements where they exist and
from stated physics where they do not:

- non-attention layers: Vidur's measured per-layer operator medians (embedding once; per
  layer: two norms, QKV and output projections, RoPE, MLP up/act/down, two residual adds)
  x 32 layers, linearly interpolated in the number of tokens in the batch
  (``profiles/vidur/a100-llama3-8b-mlp.csv``, MIT, see the README there);
- LM head (not in Vidur's table): its weights read once per iteration (1.05 GB over HBM)
  plus 2 x hidden x vocab FLOP per sequence that samples;
- prefill attention (Vidur's attention profiles are not available here): 4 x layers x
  hidden FLOP per query-key pair at half of the A100's 312 TFLOP/s bf16 peak;
- decode attention: every context token's K and V (128 KiB for this model) read from HBM
  at ~2 TB/s.

The fit keeps the attention, KV-read and LM-head coefficients at their physical values
and fits the two straight branches of the linear layers (:meth:`Profile.linear_s`) by
least squares on relative error, trying every Vidur token count between 64 and 1024 as
the split between the memory-bound and the compute-bound shapes and keeping the split
with the smallest worst-case error. The error table compares :meth:`Profile.step_s` of
the fitted profile with the reference on a grid of decode-only, prefill-only and mixed
(chunked-prefill) iterations at budgets 512, 2048 and 8192.

Batch limits are vLLM v1's defaults for the OpenAI server on an A100
(``vllm/engine/arg_utils.py``: 2048 batched tokens and 256 sequences when the device is
an A100 or has < 70 GiB; 8192 / 1024 otherwise), and KV capacity follows vLLM's memory
accounting (90% of the GPU's memory, minus weights and an activation reserve).

``--write PATH`` writes the profile JSON; the bundled ``profiles/a100-llama3-8b.json`` is
this module's output, and a test fails when the two drift apart.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

import numpy as np
import numpy.typing as npt

from jitserve.sim.latency import Profile

GIB = 1024**3
VIDUR_TABLE = "a100-llama3-8b-mlp.csv"
LAYER_OPS = (
    "input_layernorm",
    "attn_pre_proj",
    "attn_rope",
    "attn_post_proj",
    "post_attention_layernorm",
    "mlp_up_proj",
    "mlp_act",
    "mlp_down_proj",
    "add",
    "add",  # two residual adds per layer
)
SHAPE_KINDS = ("decode-only", "prefill-only", "mixed")


@dataclass(frozen=True)
class ModelShape:
    """Llama-3-8B: 32 layers, hidden 4096, 8 KV heads of 128, vocabulary 128256, bf16."""

    layers: int = 32
    hidden: int = 4096
    kv_heads: int = 8
    head_dim: int = 128
    vocab: int = 128256
    parameters: float = 8.03e9
    dtype_bytes: int = 2

    @property
    def kv_bytes_per_token(self) -> int:
        return self.layers * self.kv_heads * self.head_dim * 2 * self.dtype_bytes

    @property
    def weight_bytes(self) -> float:
        return self.parameters * self.dtype_bytes

    @property
    def attention_flop_per_pair(self) -> int:
        # QK^T and PV: 2 matmuls x 2 FLOP per multiply-add x hidden, per layer
        return 4 * self.layers * self.hidden

    @property
    def lm_head_flop_per_seq(self) -> int:
        return 2 * self.hidden * self.vocab

    @property
    def lm_head_bytes(self) -> int:
        return self.hidden * self.vocab * self.dtype_bytes


@dataclass(frozen=True)
class Hardware:
    """A100-80GB SXM: 80 GiB HBM2e at ~2 TB/s, 312 TFLOP/s dense bf16."""

    memory_bytes: float = 80 * GIB
    hbm_bytes_per_s: float = 2.0e12
    attention_flop_per_s: float = 156e12
    """Half of the 312 TFLOP/s bf16 peak: FlashAttention's typical utilisation."""
    memory_utilization: float = 0.9
    """vLLM's default ``gpu_memory_utilization``."""
    activation_reserve_bytes: float = 2.0 * GIB
    """Peak activations of a 2048-token profiling pass, logits included, and CUDA graphs."""


@dataclass(frozen=True)
class Shape:
    """One engine iteration: what :meth:`Profile.step_s` takes, plus a label."""

    kind: str
    label: str
    prefill_tokens: int
    attention_pairs: float
    decoders: int
    decode_context: int
    sequences: int

    @property
    def batch_tokens(self) -> int:
        return self.prefill_tokens + self.decoders


class Reference:
    """Vidur's measured linear layers plus the physics of attention and the LM head."""

    def __init__(self, model: ModelShape, hardware: Hardware) -> None:
        self.model = model
        self.hardware = hardware
        tokens, seconds = _vidur_linear_layers(model.layers)
        self.tokens = tokens
        self.linear_seconds = seconds
        self.a2 = model.attention_flop_per_pair / hardware.attention_flop_per_s
        self.a4 = model.kv_bytes_per_token / hardware.hbm_bytes_per_s
        self.a5 = model.lm_head_flop_per_seq / hardware.attention_flop_per_s
        self.lm_head_read_s = model.lm_head_bytes / hardware.hbm_bytes_per_s

    def linear_s(self, batch_tokens: float) -> float:
        return float(np.interp(batch_tokens, self.tokens, self.linear_seconds))

    def step_s(self, shape: Shape) -> float:
        return self.linear_s(shape.batch_tokens) + self.fixed_s(shape)

    def fixed_s(self, shape: Shape) -> float:
        """The terms the fit keeps at their physical values."""
        return (
            self.lm_head_read_s
            + self.a2 * shape.attention_pairs
            + self.a4 * shape.decode_context
            + self.a5 * shape.sequences
        )

    def kv_capacity_tokens(self, block_tokens: int = 16) -> int:
        hw = self.hardware
        free = hw.memory_bytes * hw.memory_utilization - self.model.weight_bytes
        tokens = int((free - hw.activation_reserve_bytes) // self.model.kv_bytes_per_token)
        return tokens - tokens % block_tokens


def _vidur_linear_layers(layers: int) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """(tokens in the batch, seconds of all non-attention layers), mean over repeated rows."""
    path = resources.files("jitserve.sim") / "profiles" / "vidur" / VIDUR_TABLE
    sums: dict[int, list[float]] = {}
    with path.open() as handle:
        for row in csv.DictReader(handle):
            per_layer = sum(float(row[f"time_stats.{op}.median"]) for op in LAYER_OPS)
            ms = layers * per_layer + float(row["time_stats.emb.median"])
            sums.setdefault(int(row["num_tokens"]), []).append(ms / 1e3)
    tokens = np.array(sorted(sums), dtype=np.float64)
    return tokens, np.array([float(np.mean(sums[int(t)])) for t in tokens])


def iteration_shapes(
    budgets: Sequence[int] = (512, 2048, 8192), max_seqs: int = 256
) -> list[Shape]:
    """The grid the fit is judged on: every iteration shape the engine forms, at
    short (256), typical (1024) and long (4096) contexts."""
    contexts = (256, 1024, 4096)
    shapes = [
        Shape("decode-only", f"D={d} ctx={c}", 0, 0.0, d, d * c, d)
        for d in (1, 2, 4, 8, 16, 32, 64, 96, 128, 160, 192, 224, max_seqs)
        for c in contexts
    ]
    for p in (16, 32, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048, 4096, 8192):
        for cached in (0, 2048):
            if p + cached <= 8192:
                pairs = p * (cached + p / 2)
                shapes.append(Shape("prefill-only", f"P={p} cached={cached}", p, pairs, 0, 0, 1))
    for budget in budgets:
        for d in (16, 64, 128, max_seqs):
            if d < budget:
                p = budget - d
                for c in contexts:
                    label = f"budget={budget} D={d} P={p} ctx={c}"
                    shapes.append(Shape("mixed", label, p, p * p / 2, d, d * c, d + 1))
    return shapes


@dataclass(frozen=True)
class Fit:
    a0_s: float
    a3_s_per_token: float
    a6_s_compute_intercept: float
    a1_s_per_token: float
    split_tokens: int


def fit_linear_layers(reference: Reference, shapes: list[Shape]) -> Fit:
    """Two straight branches, memory-bound below a split and compute-bound above it."""
    batch = np.array([s.batch_tokens for s in shapes], dtype=np.float64)
    target = np.array([reference.step_s(s) for s in shapes])
    fixed = np.array([reference.fixed_s(s) for s in shapes])
    weight = 1 / target  # least squares on relative error
    best: tuple[float, Fit] | None = None
    for split in reference.tokens[(reference.tokens >= 64) & (reference.tokens <= 1024)]:
        low = batch <= split
        if low.sum() < 2 or (~low).sum() < 2:
            continue
        branches = []
        for mask in (low, ~low):
            design = np.c_[np.ones(int(mask.sum())), batch[mask]] * weight[mask, None]
            rhs = (target[mask] - fixed[mask]) * weight[mask]
            branches.append(np.linalg.lstsq(design, rhs, rcond=None)[0])
        (m0, m1), (c0, c1) = branches
        candidate = Fit(
            float(m0) + reference.lm_head_read_s,
            float(m1),
            max(float(c0), 0.0) + reference.lm_head_read_s,
            float(c1),
            int(split),
        )
        worst = float(
            np.max(np.abs(relative_errors(profile_of(candidate, reference), reference, shapes)))
        )
        if best is None or worst < best[0]:
            best = (worst, candidate)
    if best is None:
        raise ValueError("too few shapes to fit two branches")
    return best[1]


def profile_of(fit: Fit, reference: Reference, **limits: int) -> Profile:
    """The engine profile for a fit (the LM head's weight read is in both intercepts,
    so the fit and the reference agree on what a lone token costs)."""
    fields: dict[str, object] = dict(
        name="a100-llama3-8b",
        a0_s=fit.a0_s,
        a1_s_per_prefill_token=fit.a1_s_per_token,
        a2_s_per_attention_pair=reference.a2,
        a3_s_per_decode_seq=fit.a3_s_per_token,
        a4_s_per_context_token=reference.a4,
        a5_s_per_seq=reference.a5,
        a6_s_compute_intercept=fit.a6_s_compute_intercept,
        kv_capacity_tokens=reference.kv_capacity_tokens(),
    )
    return Profile.model_validate({**fields, **limits})


def relative_errors(
    profile: Profile, reference: Reference, shapes: list[Shape]
) -> npt.NDArray[np.float64]:
    simulated = np.array(
        [
            profile.step_s(
                s.prefill_tokens, s.attention_pairs, s.decoders, s.decode_context, s.sequences
            )
            for s in shapes
        ]
    )
    errors: npt.NDArray[np.float64] = (
        simulated / np.array([reference.step_s(s) for s in shapes]) - 1
    )
    return errors


def error_summary(
    profile: Profile, reference: Reference, shapes: list[Shape]
) -> dict[str, dict[str, Any]]:
    """Per iteration kind: shapes, max and mean |relative error|, and the worst shape."""
    errors = relative_errors(profile, reference, shapes)
    summary: dict[str, dict[str, Any]] = {}
    for kind in SHAPE_KINDS:
        picked = [
            (abs(float(e)), s.label) for e, s in zip(errors, shapes, strict=True) if s.kind == kind
        ]
        worst = max(picked)
        summary[kind] = {
            "shapes": len(picked),
            "max_abs_error": round(worst[0], 4),
            "mean_abs_error": round(math.fsum(e for e, _ in picked) / len(picked), 4),
            "worst_shape": worst[1],
        }
    return summary


VLLM_V1_A100_LIMITS = {
    "max_running": 256,
    "chunk_token_budget": 2048,
    "prefill_first_token_budget": 8192,
}


def calibrated_document(
    model: ModelShape | None = None, hardware: Hardware | None = None
) -> dict[str, Any]:
    """The profile JSON: coefficients, limits, where each came from, and the fit error."""
    model, hardware = model or ModelShape(), hardware or Hardware()
    reference = Reference(model, hardware)
    shapes = iteration_shapes()
    fit = fit_linear_layers(reference, shapes)
    profile = profile_of(fit, reference, **VLLM_V1_A100_LIMITS)
    kv_gb = reference.kv_capacity_tokens() * model.kv_bytes_per_token / 1e9
    sources = {
        "a0_s": "Fitted: memory-bound branch of Vidur's measured A100 linear layers (x32 layers + "
        "embedding) plus the LM head's weight read (1.05 GB at 2 TB/s).",
        "a3_s_per_decode_seq": "Fitted: slope of that branch per token in the batch.",
        "a1_s_per_prefill_token": "Fitted: compute-bound branch of the same measurements, "
        "per token.",
        "a6_s_compute_intercept": "Fitted: intercept of the compute-bound branch, LM head read "
        "included.",
        "split_tokens": f"Shapes with <= {fit.split_tokens} tokens fitted the first branch, the "
        "rest the second; the engine uses the larger of the two.",
        "a2_s_per_attention_pair": "Prefill attention, physics: 4 x 32 layers x 4096 = 524k FLOP "
        "per query-key pair at 156 TFLOP/s (half the bf16 peak).",
        "a4_s_per_context_token": "Decode attention, physics: 128 KiB of K and V per context "
        "token read at 2 TB/s.",
        "a5_s_per_seq": "LM head, physics: 2 x 4096 x 128256 FLOP per sampling sequence at "
        "156 TFLOP/s.",
        "kv_capacity_tokens": f"vLLM accounting: 0.9 x 80 GiB - {model.weight_bytes / 1e9:.2f} GB "
        f"weights - 2 GiB activations = {kv_gb:.1f} GB of KV at 128 KiB per token.",
        "limits": "vLLM v1 defaults for the OpenAI server on an A100 (vllm/engine/arg_utils.py): "
        "max_num_batched_tokens 2048, max_num_seqs 256; prefill-first (no chunking) batches up "
        "to max(max_model_len 8192, 2048) tokens.",
    }
    coefficients = profile.model_dump(exclude={"name", "description"})
    return {
        "name": profile.name,
        "description": "Llama-3-8B (32 layers, 8 KV heads x 128, bf16) on one A100-80GB, vLLM v1 "
        "defaults; fitted by `python -m jitserve.sim.calibrate` to Vidur's profiling.",
        "sources": sources,
        "fit_error": error_summary(profile, reference, shapes),
        **coefficients,
    }


def format_table(document: dict[str, Any]) -> str:
    lines = [
        "| iteration shape | shapes | max abs error | mean abs error | worst shape |",
        "|---|---|---|---|---|",
    ]
    for kind, row in document["fit_error"].items():
        lines.append(
            f"| {kind} | {row['shapes']} | {row['max_abs_error']:.1%} | "
            f"{row['mean_abs_error']:.1%} | {row['worst_shape']} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m jitserve.sim.calibrate",
        description="Fit the a100-llama3-8b engine profile to Vidur's A100 profiling and print "
        "the fit error per iteration shape.",
    )
    parser.add_argument("--write", metavar="PATH", help="write the profile JSON here")
    args = parser.parse_args(argv)
    document = calibrated_document()
    keys = (
        "a0_s",
        "a1_s_per_prefill_token",
        "a2_s_per_attention_pair",
        "a3_s_per_decode_seq",
        "a4_s_per_context_token",
        "a5_s_per_seq",
        "a6_s_compute_intercept",
        "kv_capacity_tokens",
    )
    for key in keys:
        print(f"{key:<26} {document[key]:.6g}")
    print()
    print(format_table(document))
    if args.write:
        with open(args.write, "w") as handle:
            handle.write(json.dumps(document, indent=2) + "\n")
        print(f"\nwrote {args.write}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
