"""``jitserve calibrate --engine URL``: an engine profile measured on a running vLLM
(owner: bench).

What a user runs on a GPU node (or on ``jitserve up``'s CPU vLLM) to simulate *that*
engine: it drives two families of batch shapes through vLLM's OpenAI API and reads each
shape's time from vLLM's own per-request histograms (the engine core's timestamps, no
HTTP in them), then :mod:`jitserve.sim.measured` fits the profile the simulator loads
with ``jitserve bench --profile PATH``:

- a prefill alone: one fresh prompt of T tokens, one output token; its
  ``vllm:request_prefill_time_seconds`` (scheduled to first token) is one step of T tokens;
- a prefill of new tokens after a prefix the cache holds (the prefix sent once first):
  its extra time over a fresh prompt of as many tokens is prefill attention;
- a decode alone: D prompts together, each decoding ``--decode-tokens`` tokens with
  ``ignore_eos``; their ``vllm:request_time_per_output_token_seconds`` is a step of D
  decoders, at a short and a longer context.

Prompts are random token ids, so no shape reads another's prefix cache. Each shape runs
``--repeats`` times; its median is kept. vLLM does not report its batch limits over the
API: pass the engine's ``--max-num-seqs`` and ``--max-num-batched-tokens`` here.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from jitserve.errors import CLIError
from jitserve.sim.measured import (
    CachedPrefill,
    DecodeShape,
    Measurements,
    measured_profile,
    profile_document,
)

PREFILL = "vllm:request_prefill_time_seconds"
QUEUE = "vllm:request_queue_time_seconds"
TTFT = "vllm:time_to_first_token_seconds"
PER_TOKEN = "vllm:request_time_per_output_token_seconds"
CACHE_INFO = "vllm:cache_config_info"
CACHE_HITS = "vllm:prefix_cache_hits_total"
CACHED_NEW_TOKENS = 256
CACHED_PREFIXES = (512, 1024)
SHORT_CONTEXT = 16
LONG_CONTEXT = 512
TOKEN_IDS = (10, 1000)
"""Prompt token ids are drawn from this range: inside any vocabulary of 1,000 or more."""


def moved(before: dict[str, float], after: dict[str, float], name: str) -> float:
    """Observations histogram ``name`` recorded between two :meth:`EngineClient.totals`."""
    return after.get(name + "_count", 0.0) - before.get(name + "_count", 0.0)


def mean_between(before: dict[str, float], after: dict[str, float], name: str) -> float | None:
    """The mean of what histogram ``name`` recorded between two :meth:`EngineClient.totals`
    (None if it recorded nothing)."""
    n = moved(before, after, name)
    total = after.get(name + "_sum", 0.0) - before.get(name + "_sum", 0.0)
    return total / n if n > 0 else None


def front_end_s(before: dict[str, float], after: dict[str, float]) -> float | None:
    """Mean seconds a request spent outside vLLM's engine core before its first token,
    between two :meth:`EngineClient.totals`: vLLM's time to first token (from its API
    server's arrival) less the engine core's queue and prefill time. None if no request
    was recorded in between."""
    ttft, queue, prefill = (mean_between(before, after, name) for name in (TTFT, QUEUE, PREFILL))
    if ttft is None or queue is None or prefill is None:
        return None
    return ttft - queue - prefill


class EngineClient:
    """A running vLLM's OpenAI API and metrics."""

    def __init__(self, url: str, timeout_s: float = 300.0) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.model, self.max_model_len = self._model()

    def _get(self, path: str) -> bytes:
        try:
            with urllib.request.urlopen(self.url + path, timeout=self.timeout_s) as resp:
                body: bytes = resp.read()
                return body
        except (urllib.error.URLError, OSError) as err:
            raise CLIError(f"--engine {self.url}: GET {path} failed ({err})") from None

    def _model(self) -> tuple[str, int]:
        models = json.loads(self._get("/v1/models"))["data"]
        if not models:
            raise CLIError(f"--engine {self.url}: /v1/models lists no model")
        return str(models[0]["id"]), int(models[0].get("max_model_len") or 2048)

    def metrics(self) -> Any:
        from prometheus_client.parser import text_string_to_metric_families

        return text_string_to_metric_families(self._get("/metrics").decode())

    def totals(self) -> dict[str, float]:
        """Every sample's value summed over its label sets, by sample name."""
        out: dict[str, float] = {}
        for family in self.metrics():
            for sample in family.samples:
                out[sample.name] = out.get(sample.name, 0.0) + sample.value
        return out

    def kv_capacity_tokens(self) -> int:
        for family in self.metrics():
            for sample in family.samples:
                if sample.name == CACHE_INFO:
                    labels = sample.labels
                    return int(labels["num_gpu_blocks"]) * int(labels["block_size"])
        raise CLIError(f"--engine {self.url}: no {CACHE_INFO} in /metrics (is it vLLM v1?)")

    def complete(self, prompt: list[int], max_tokens: int) -> None:
        body = json.dumps({"model": self.model, "prompt": prompt, "max_tokens": max_tokens,
                           "ignore_eos": True, "temperature": 0.0}).encode()
        request = urllib.request.Request(self.url + "/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as resp:
                resp.read()
        except urllib.error.HTTPError as err:
            raise CLIError(f"--engine {self.url}: a {len(prompt)}-token prompt was refused "
                           f"({err.code}: {err.read()[:200]!r})") from None

    def timed(self, name: str, prompts: list[list[int]], max_tokens: int) -> float:
        """The mean of histogram ``name`` over these requests, run together."""
        before = self.totals()
        with ThreadPoolExecutor(len(prompts)) as pool:
            list(pool.map(lambda p: self.complete(p, max_tokens), prompts))
        deadline = time.monotonic() + 30
        while True:  # vLLM records a request's stats as it processes its last output
            after = self.totals()
            if moved(before, after, name) >= len(prompts) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        mean = mean_between(before, after, name)
        if mean is None:
            raise CLIError(f"--engine {self.url}: {name} did not move (metrics disabled?)")
        return mean

    def cache_hits(self) -> float:
        return self.totals().get(CACHE_HITS, 0.0)


def shape_grid(budget: int, max_model_len: int, max_running: int,
               tokens: Sequence[int] | None = None) -> tuple[list[int], list[int]]:
    """The prompt lengths of the prefill shapes and the sequence counts of the decodes."""
    most = min(budget, max_model_len - 2)
    prefill = sorted({t for t in (tokens or _doubling(1, most, halves=True)) if 1 <= t <= most})
    decoders = _doubling(1, max_running, halves=False)
    return prefill, decoders


def _doubling(low: int, high: int, *, halves: bool) -> list[int]:
    out, n = [], low
    while n <= high:
        out.append(n)
        if halves and n >= 4 and n + n // 2 <= high:
            out.append(n + n // 2)
        n *= 2
    if out[-1] != high:
        out.append(high)
    return out


def measure(engine: EngineClient, *, max_running: int, budget: int, decode_tokens: int,
            repeats: int, tokens: Sequence[int] | None = None, seed: int | None = None,
            progress: Callable[[str], None] = lambda line: None) -> Measurements:
    rng = np.random.default_rng(seed)

    def prompt(n: int) -> list[int]:
        return [int(x) for x in rng.integers(*TOKEN_IDS, size=n)]

    prefill_tokens, decoders = shape_grid(budget, engine.max_model_len, max_running, tokens)
    prefill: dict[int, float] = {}
    for t in prefill_tokens:
        prefill[t] = statistics.median(engine.timed(PREFILL, [prompt(t)], 1)
                                       for _ in range(repeats))
        progress(f"prefill {t:>5} tokens: {prefill[t] * 1e3:8.2f} ms")
    cached = cached_prefills(engine, prompt, budget, repeats)
    for c in cached:
        progress(f"prefill {c.new:>5} tokens over {c.cached} cached: {c.seconds * 1e3:8.2f} ms")
    if not cached:
        progress("no prefix cache hits (prefix caching off?): prefill attention stays in L")
    decodes = []
    for d in decoders:
        longer = min(LONG_CONTEXT, max(SHORT_CONTEXT * 2, budget // d),
                     engine.max_model_len - decode_tokens - 1)
        for context in sorted({SHORT_CONTEXT, longer}):
            seconds = statistics.median(
                engine.timed(PER_TOKEN, [prompt(context) for _ in range(d)], decode_tokens)
                for _ in range(repeats))
            decodes.append(DecodeShape(d, context + decode_tokens / 2, seconds))
            progress(f"decode {d:>4} sequences at context {context:>4}: "
                     f"{seconds * 1e3:8.2f} ms per step")
    return Measurements(prefill, decodes, max_running, budget, engine.max_model_len,
                        engine.kv_capacity_tokens(), cached)


def cached_prefills(engine: EngineClient, prompt: Callable[[int], list[int]], budget: int,
                    repeats: int) -> list[CachedPrefill]:
    """New tokens after a prefix the cache holds (its prompt sent once first): the attention
    of new over cached tokens. None when the engine does not cache prefixes."""
    new = min(CACHED_NEW_TOKENS, budget)
    out = []
    for cached in CACHED_PREFIXES:
        if cached + new + 2 > engine.max_model_len:
            continue
        samples = []
        for _ in range(repeats):
            prefix = prompt(cached)
            engine.complete(prefix, 1)
            hits = engine.cache_hits()
            samples.append(engine.timed(PREFILL, [prefix + prompt(new)], 1))
            if engine.cache_hits() - hits < cached / 2:
                return []
        out.append(CachedPrefill(new, cached, statistics.median(samples)))
    return out


def register(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "calibrate",
        help="measure a running vLLM's step times and write an engine profile for the simulator",
        description="Drive prefills of many lengths and decodes of many batch sizes through "
        "a running vLLM, read each one's time from vLLM's own histograms, and fit the engine "
        "profile (linear layers as a table, attention and per-sequence terms) that "
        "jitserve bench --profile PATH simulates.",
    )
    p.add_argument("--engine", required=True, metavar="URL",
                   help="the vLLM to measure (its OpenAI API and /metrics), e.g. "
                   "http://127.0.0.1:8000; nothing else should be sending it requests")
    p.add_argument("--out", default="engine-profile.json", metavar="PATH",
                   help="where to write the profile (jitserve bench --profile PATH)")
    p.add_argument("--name", default="measured", help="the profile's name")
    p.add_argument("--max-num-seqs", type=int, default=256,
                   help="the engine's --max-num-seqs (vLLM v1 on an A100-class GPU: 256)")
    p.add_argument("--max-num-batched-tokens", type=int, default=2048,
                   help="the engine's token budget per step (its --max-num-batched-tokens)")
    p.add_argument("--tokens", help="comma-separated prompt lengths of the prefill shapes "
                   "(default: 1, 2, 4, 6, 8, 12, ... up to the budget); e.g. every 8 tokens "
                   "to find the steps of a GPU's kernels")
    p.add_argument("--decode-tokens", type=int, default=48,
                   help="tokens each decode shape generates")
    p.add_argument("--repeats", type=int, default=3, help="runs of each shape (the median)")
    p.add_argument("--seed", type=int, default=None,
                   help="of the random prompts (default: a new one each run, so that no run "
                   "reads the prefix cache an earlier one filled)")
    p.set_defaults(handler=main)
    return p


def _checked_tokens(args: argparse.Namespace) -> list[int] | None:
    for flag in ("max_num_seqs", "max_num_batched_tokens", "decode_tokens", "repeats"):
        if getattr(args, flag) < 1:
            raise CLIError(f"--{flag.replace('_', '-')} must be at least 1")
    if not args.tokens:
        return None
    try:
        tokens = [int(t) for t in args.tokens.split(",") if t.strip()]
    except ValueError:
        raise CLIError(f"--tokens {args.tokens!r}: comma-separated integers") from None
    if len(tokens) < 2 or min(tokens) < 1:
        raise CLIError(f"--tokens {args.tokens!r}: two or more positive token counts")
    return tokens


def main(args: argparse.Namespace) -> int:
    tokens = _checked_tokens(args)
    engine = EngineClient(args.engine)
    started = time.monotonic()
    print(f"measuring {engine.model} at {engine.url} (max_model_len {engine.max_model_len})",
          file=sys.stderr)
    m = measure(engine, max_running=args.max_num_seqs, budget=args.max_num_batched_tokens,
                decode_tokens=args.decode_tokens, repeats=args.repeats, tokens=tokens,
                seed=args.seed, progress=lambda line: print(line, file=sys.stderr))
    document = profile_document(m, args.name, f"{engine.model} at {engine.url}")
    Path(args.out).write_text(json.dumps(document, indent=2) + "\n")
    profile, terms = measured_profile(m, args.name)
    worst = max((abs(r) for r in terms.relative_residuals), default=0.0)
    print(f"L(1) {profile.linear_s(1) * 1e3:.2f} ms, L({m.chunk_token_budget}) "
          f"{profile.linear_s(m.chunk_token_budget) * 1e3:.2f} ms; a2 {terms.a2:.3g} s per "
          f"prefill pair, a4 {terms.a4:.3g} s per context token, a5 {terms.a5:.3g} s per "
          f"sequence, a7 {terms.a7 * 1e3:.2f} ms per prefill step; the decode shapes fit "
          f"within {worst:.1%}")
    print(f"wrote {args.out} in {time.monotonic() - started:.0f} s; simulate it with "
          f"jitserve bench --profile {args.out}")
    return 0
