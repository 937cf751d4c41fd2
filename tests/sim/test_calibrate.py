"""The bundled engine profile is the calibration's output and stays within 10% of the
Vidur-based reference on every iteration shape."""

from __future__ import annotations

import json
from importlib import resources

import pytest

from jitserve.sim import calibrate
from jitserve.sim.latency import load_profile


@pytest.fixture(scope="module")
def document() -> dict[str, object]:
    return calibrate.calibrated_document()


def test_bundled_profile_is_the_calibration_output(document: dict[str, object]) -> None:
    bundled = json.loads(
        (resources.files("jitserve.sim") / "profiles" / "a100-llama3-8b.json").read_text()
    )
    assert bundled.keys() == document.keys()
    for key, value in document.items():
        if isinstance(value, float):
            assert bundled[key] == pytest.approx(value, rel=1e-9), key
        else:
            assert bundled[key] == value, key


def test_every_iteration_shape_is_within_ten_percent_of_the_reference() -> None:
    reference = calibrate.Reference(calibrate.ModelShape(), calibrate.Hardware())
    shapes = calibrate.iteration_shapes()
    errors = calibrate.relative_errors(load_profile(), reference, shapes)
    kinds = {s.kind for s in shapes}
    assert kinds == set(calibrate.SHAPE_KINDS)
    worst = {
        k: max(abs(e) for e, s in zip(errors, shapes, strict=True) if s.kind == k) for k in kinds
    }
    assert all(w < 0.10 for w in worst.values()), worst


def test_physical_coefficients_have_the_right_units() -> None:
    profile = load_profile()
    # 4 x 32 layers x 4096 FLOP per pair at 156 TFLOP/s; 128 KiB per context token at 2 TB/s
    assert profile.a2_s_per_attention_pair == pytest.approx(3.36e-9, rel=0.01)
    assert profile.a4_s_per_context_token == pytest.approx(128 * 1024 / 2e12, rel=1e-9)
    assert calibrate.ModelShape().kv_bytes_per_token == 128 * 1024
    # ~59 GB of KV cache at 128 KiB per token: ~450k tokens
    assert 430_000 < profile.kv_capacity_tokens < 470_000
    assert profile.kv_capacity_tokens % profile.kv_block_tokens == 0
    # vLLM v1 on an A100, OpenAI server
    assert (profile.chunk_token_budget, profile.max_running) == (2048, 256)


def test_decode_batches_follow_the_engines_closed_form() -> None:
    profile = load_profile()
    for decoders in (1, 17, 128, profile.max_running, 400, 1024):  # both linear branches
        context = decoders * 1500
        closed_form = (
            profile.linear_s(decoders)
            + profile.a5_s_per_seq * decoders
            + profile.a4_s_per_context_token * context
        )
        assert profile.step_s(0, 0.0, decoders, context, decoders) == pytest.approx(closed_form)


def test_a_512_token_chunk_costs_what_vidur_measured() -> None:
    # DESIGN.md: ~36 ms for a 512-token chunk from Vidur's linear layers
    profile = load_profile()
    assert profile.step_s(512, 512 * 256, 0, 0, 1) == pytest.approx(0.036, rel=0.1)


def test_calibrate_prints_the_error_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert calibrate.main([]) == 0
    printed = capsys.readouterr().out
    for kind in calibrate.SHAPE_KINDS:
        assert f"| {kind} |" in printed
