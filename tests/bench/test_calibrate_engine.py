"""``jitserve calibrate --engine URL`` on the session's real (CPU) vLLM: a profile the
simulator runs, from the engine's own histograms; bad input is a CLI error."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from jitserve.bench.calibrate_engine import shape_grid
from jitserve.sim.latency import Profile


def _jitserve(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "jitserve.cli", *args], capture_output=True,
                          text=True, timeout=timeout)


def test_a_real_vllm_is_measured_and_its_profile_simulated(vllm_url: str,
                                                           tmp_path: Path) -> None:
    out = tmp_path / "cpu-tiny.json"
    run = _jitserve("calibrate", "--engine", vllm_url, "--out", str(out), "--name", "cpu-tiny",
                    "--max-num-seqs", "4", "--max-num-batched-tokens", "256",
                    "--tokens", "1,16,64,256", "--decode-tokens", "8", "--repeats", "1")
    assert run.returncode == 0, run.stderr
    assert run.stderr.count(" tokens:") == 4 and run.stderr.count("cached:") == 2  # progress
    assert run.stderr.count("decode") == 6
    document = json.loads(out.read_text())
    profile = Profile.model_validate(document)
    assert profile.name == "cpu-tiny" and profile.max_running == 4
    assert profile.linear_table is not None and profile.linear_table.tokens == (1, 16, 64, 256)
    assert profile.kv_capacity_tokens > 0  # vLLM's cache_config_info: blocks x block size
    measured = document["measured"]
    times = [*measured["prefill_s"].values(), *(d["seconds"] for d in measured["decodes"])]
    times += [c["seconds"] for c in measured["cached_prefills"]]  # prefix caching is on
    assert len(times) == 12 and all(0 < s < 60 for s in times)
    sim = _jitserve("bench", "--profile", str(out), "--duration", "20", "--load", "1.0",
                    "--policies", "gmax,fcfs", "--seeds", "1", "--out", str(tmp_path / "sim"))
    assert sim.returncode == 0, sim.stderr
    assert "cpu-tiny" in sim.stdout + sim.stderr


def test_bad_input_is_a_cli_error_not_a_traceback() -> None:
    for args, says in ((["--engine", "http://127.0.0.1:9"], "GET /v1/models failed"),
                       (["--engine", "http://x", "--tokens", "8,a"], "comma-separated integers"),
                       (["--engine", "http://x", "--repeats", "0"], "--repeats must be")):
        run = _jitserve("calibrate", *args, timeout=60)
        assert run.returncode == 2 and says in run.stderr and "Traceback" not in run.stderr


def test_the_grid_stays_inside_the_engines_limits() -> None:
    prefill, decoders = shape_grid(budget=2048, max_model_len=1024, max_running=48)
    assert prefill[0] == 1 and prefill[-1] == 1022 and 1024 not in prefill
    assert decoders == [1, 2, 4, 8, 16, 32, 48]
    assert shape_grid(512, 4096, 8, [8, 600, 16])[0] == [8, 16]


def test_front_end_time_is_ttft_less_queue_and_prefill_between_two_reads() -> None:
    from jitserve.bench.calibrate_engine import PREFILL, QUEUE, TTFT, front_end_s

    before = {TTFT + "_sum": 1.0, TTFT + "_count": 10, QUEUE + "_sum": 0.2,
              QUEUE + "_count": 10, PREFILL + "_sum": 0.5, PREFILL + "_count": 10}
    # 4 requests in between: 30 ms to first token each, 5 ms queued, 15 ms in prefill
    after = {TTFT + "_sum": 1.12, TTFT + "_count": 14, QUEUE + "_sum": 0.22,
             QUEUE + "_count": 14, PREFILL + "_sum": 0.56, PREFILL + "_count": 14}
    assert front_end_s(before, after) == pytest.approx(0.010)
    assert front_end_s(after, after) is None  # nothing recorded in between
    assert front_end_s({}, {TTFT + "_sum": 1.0, TTFT + "_count": 1}) is None
