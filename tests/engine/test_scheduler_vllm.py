"""jitserve's in-engine scheduler inside the real (CPU) vLLM: it loads with
``--scheduler-cls`` and changes what vLLM schedules — with a decode whose TBT it protects,
vLLM cuts a long prompt's chunks to the budget the rule set, below its own maximum (the
step log the scheduler writes: budget and scheduled tokens per step)."""

from __future__ import annotations

import json
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jitserve.scheduling.budget import DUE_ARG, TBT_ARG
from tests.support.vllm import tiny_vllm

MAX_TOKENS = 1024  # vLLM's --max-num-batched-tokens: the rule's maximum


@pytest.fixture(scope="module")
def greedy_vllm() -> Iterator[tuple[str, Path, Path]]:
    """A private vLLM with the in-engine scheduler on the greedy rule and its step log."""
    steps = Path(tempfile.mkdtemp(prefix="jitserve-engine-sched-")) / "steps.jsonl"
    with tiny_vllm(max_num_seqs=8, extra=["--max-num-batched-tokens", str(MAX_TOKENS)],
                   engine_rule="greedy", step_log=steps) as engine:
        yield engine.url, steps, engine.log_path


def complete(url: str, prompt: list[int], max_tokens: int, xargs: dict[str, float]) -> Any:
    body = {"model": "tiny-llama", "prompt": prompt, "max_tokens": max_tokens,
            "ignore_eos": True, "temperature": 0, "vllm_xargs": xargs}
    req = urllib.request.Request(f"{url}/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as resp:
        return json.load(resp)


def records(steps: Path) -> list[dict[str, Any]]:
    if not steps.exists():
        return []
    return [json.loads(line) for line in steps.read_text().splitlines() if line.strip()]


def test_the_rule_cuts_vllms_prompt_chunks_to_protect_a_decode(
        greedy_vllm: tuple[str, Path, Path]) -> None:
    url, steps, log_path = greedy_vllm
    assert "jitserve engine scheduler SlidingScheduler: budget rule greedy" in \
        log_path.read_text(errors="replace")
    # warm-up: enough steps for the online step-time model, nothing tight
    relaxed = {DUE_ARG: time.time() + 600, TBT_ARG: 10.0}
    complete(url, list(range(10, 300)), 40, relaxed)
    warm = records(steps)
    assert len(warm) >= 16 and all(r["budget"] == MAX_TOKENS for r in warm)
    assert warm[-1]["model"] is not None
    # a decode already behind its schedule: each step is held to half its TBT, chosen from
    # the step-time model vLLM fitted so that ~200 prompt tokens fit beside the decodes
    c0, c1, c2, c3 = warm[-1]["model"]
    half_tbt = c0 + c1 * 202 + c2 * 202**2 + c3 * 2
    tight = {DUE_ARG: time.time() - 5, TBT_ARG: 2 * half_tbt}
    decode = threading.Thread(target=complete, args=(url, list(range(5, 21)), 120, tight))
    decode.start()
    deadline = time.monotonic() + 300  # against a hang
    while not any(r["decoders"] for r in records(steps)[len(warm):]):
        assert time.monotonic() < deadline, "the tight request never decoded"
        time.sleep(0.05)
    prompt = complete(url, [7 + i % 500 for i in range(3000)], 1, relaxed)
    decode.join(120)
    assert prompt["usage"]["prompt_tokens"] == 3000
    cut = [r for r in records(steps)[len(warm):]
           if r["decoders"] and r["budget"] < MAX_TOKENS and r["scheduled"] > r["decoders"]]
    # vLLM scheduled exactly the cut budget while 3000 prompt tokens waited: without
    # the rule each of these steps would have carried ~1023 prompt tokens
    assert cut and all(r["scheduled"] <= r["budget"] for r in cut)
    assert any(r["scheduled"] == r["budget"] for r in cut)
