"""The bundled engine profile is the calibration's output: its steps are Vidur's measured
table (the staircase kept, within the fine-grid bound), its two branches are under that
table everywhere (so the goodput upper bound priced with them stays a bound)."""

from __future__ import annotations

import json
from importlib import resources

import pytest

from jitserve.sim import calibrate
from jitserve.sim import reference as ref
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


def test_the_fine_grid_is_within_its_bound_and_the_staircase_stays() -> None:
    reference = ref.Reference(ref.ModelShape(), ref.Hardware())
    profile = load_profile()
    verdict = calibrate.fine_grid_verdict(profile, reference)
    assert verdict["max"] <= calibrate.FINE_GRID_BOUND["max"]
    assert verdict["p95"] <= calibrate.FINE_GRID_BOUND["p95"]
    shapes = ref.fine_grid_shapes()
    assert {s.kind for s in shapes} == set(ref.SHAPE_KINDS)
    assert {s.batch_tokens for s in shapes} >= set(range(8, 2049, 8))
    # Vidur's A100: +7.0 ms from 256 to 264 tokens, +12.1 ms from 768 to 776
    assert profile.linear_s(264) - profile.linear_s(256) == pytest.approx(0.0070, abs=0.0005)
    assert profile.linear_s(776) - profile.linear_s(768) == pytest.approx(0.0121, abs=0.0005)


def test_the_branches_are_under_the_table_everywhere() -> None:
    profile = load_profile()
    assert profile.linear_table is not None
    for tokens in [*range(1, 8193), 10_000, 16_384, 32_768]:
        assert profile.envelope_s(tokens) <= profile.linear_s(tokens) + 1e-12, tokens


def test_a_slower_engine_scales_its_table_too() -> None:
    profile = load_profile()
    half = profile.scaled(0.5)
    for tokens in (1, 264, 2048, 9000):
        assert half.linear_s(tokens) == pytest.approx(2 * profile.linear_s(tokens))
    assert half.a2_s_per_attention_pair == pytest.approx(2 * profile.a2_s_per_attention_pair)


def test_calibrate_fails_when_the_fine_grid_misses_its_bound(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(calibrate, "FINE_GRID_BOUND", {"max": -1.0, "p95": -1.0})
    assert calibrate.main([]) == 1
    assert "MISSED max, p95" in capsys.readouterr().out


def test_physical_coefficients_have_the_right_units() -> None:
    profile = load_profile()
    # 4 x 32 layers x 4096 FLOP per pair at 156 TFLOP/s; 128 KiB per context token at 2 TB/s
    assert profile.a2_s_per_attention_pair == pytest.approx(3.36e-9, rel=0.01)
    assert profile.a4_s_per_context_token == pytest.approx(128 * 1024 / 2e12, rel=1e-9)
    assert ref.ModelShape().kv_bytes_per_token == 128 * 1024
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
    for kind in ref.SHAPE_KINDS:
        assert f"| {kind} |" in printed
    assert "Fine grid" in printed and ": within" in printed


def test_the_tables_resolution_finds_a_step_between_its_points() -> None:
    """A point left out of a straight table is predicted exactly; a step is not."""
    from jitserve.sim.calibrate import table_resolution
    from jitserve.sim.latency import LinearTable

    straight = LinearTable(tokens=(8, 16, 24, 32), seconds=(1.0, 2.0, 3.0, 4.0))
    assert table_resolution(straight)["max"] == 0.0
    stepped = LinearTable(tokens=(8, 16, 24, 32), seconds=(1.0, 1.0, 2.0, 2.0))
    found = table_resolution(stepped)
    assert found["max"] == 0.5 and found["max_at_tokens"] == 16
