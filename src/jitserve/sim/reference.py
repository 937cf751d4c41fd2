"""The reference an engine profile is judged against (owner: sim): Vidur's measured A100
Llama-3-8B linear layers plus the stated physics of attention and the LM head, and the
iteration shapes the judgement runs on.

- non-attention layers: Vidur's measured per-layer operator medians (embedding once; per
  layer: two norms, QKV and output projections, RoPE, MLP up/act/down, two residual adds)
  x 32 layers, linearly interpolated in the number of tokens in the batch
  (``profiles/vidur/a100-llama3-8b-mlp.csv``, MIT, see the README there). Interpolating
  each operator and summing equals interpolating the sum: the operators share their
  token counts;
- LM head (not in Vidur's table): its weights read once per iteration (1.05 GB over HBM)
  plus 2 x hidden x vocab FLOP per sequence that samples;
- prefill attention (Vidur's attention profiles are not used): 4 x layers x hidden FLOP
  per query-key pair at half of the A100's 312 TFLOP/s bf16 peak;
- decode attention: every context token's K and V (128 KiB for this model) read from HBM
  at ~2 TB/s.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources

import numpy as np
import numpy.typing as npt

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


def fine_grid_shapes(max_seqs: int = 256) -> list[Shape]:
    """Every 8 tokens in the batch to 2,048, then every 64 to 8,192: where Vidur's
    measurements step (+7 ms from 256 to 264 tokens), each kind of iteration that can have
    that many tokens: a prefill alone, a chunk beside 16 decoders, decoders alone."""
    counts = [*range(8, 2049, 8), *range(2112, 8193, 64)]
    shapes = []
    for t in counts:
        shapes.append(Shape("prefill-only", f"P={t} cached=0", t, t * t / 2, 0, 0, 1))
        if t > 16:
            p = t - 16
            shapes.append(Shape("mixed", f"D=16 P={p} ctx=1024", p, p * p / 2, 16, 16 * 1024,
                                17))
        if t <= max_seqs:
            shapes.append(Shape("decode-only", f"D={t} ctx=1024", 0, 0.0, t, t * 1024, t))
    return shapes
