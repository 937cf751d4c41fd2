"""A profile fitted to measured step times: an engine whose profile is known is
recovered from the shapes ``jitserve calibrate --engine`` measures."""

from __future__ import annotations

import json
from importlib import resources

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jitserve.sim.latency import LinearTable, Profile, load_profile
from jitserve.sim.measured import (
    CachedPrefill,
    DecodeShape,
    Measurements,
    measured_profile,
    measurements_from_document,
    profile_document,
)


def _known() -> Profile:
    table = LinearTable(tokens=(1, 8, 64, 256, 264, 1024, 2048),
                        seconds=(0.010, 0.0102, 0.011, 0.020, 0.027, 0.070, 0.140))
    return load_profile().model_copy(update={
        "linear_table": table, "a2_s_per_attention_pair": 4e-9,
        "a4_s_per_context_token": 7e-8, "a5_s_per_seq": 6e-6, "a7_s_per_prefill_step": 2e-3})


def _measured_on(engine: Profile, tokens: list[int]) -> Measurements:
    prefill = {t: engine.step_s(t, t * t / 2, 0, 0, 1) for t in tokens}
    decodes = [DecodeShape(d, c, engine.step_s(0, 0.0, d, int(d * c), d))
               for d in (1, 2, 4, 8, 16, 32, 64, 128, 256) for c in (40.0, 536.0)]
    cached = [CachedPrefill(256, k, engine.step_s(256, 256 * (k + 128), 0, 0, 1))
              for k in (512, 1024)]
    return Measurements(prefill, decodes, 256, 2048, 8192, 450_000, cached)


def test_a_known_engine_is_recovered_from_its_shapes() -> None:
    engine = _known()
    tokens = [1, 2, 4, 8, 16, 32, 64, 128, 256, 264, 512, 1024, 2048]
    profile, terms = measured_profile(_measured_on(engine, tokens), "recovered")
    assert terms.a2 == pytest.approx(4e-9, rel=1e-3)
    assert terms.a4 == pytest.approx(7e-8, rel=1e-3)
    assert terms.a5 == pytest.approx(6e-6, rel=1e-3)
    assert terms.a7 == pytest.approx(2e-3, rel=1e-3)
    assert max(abs(r) for r in terms.relative_residuals) < 1e-6
    for t in tokens:  # the table, staircase included
        assert profile.linear_s(t) == pytest.approx(engine.linear_s(t), rel=1e-4)
    assert profile.linear_s(264) - profile.linear_s(256) > 0.006
    # and so every shape of the engine, mixed ones included
    for shape in ((512, 512 * 1024.0, 16, 16 * 900, 17), (100, 5000.0, 64, 64 * 300, 65)):
        assert profile.step_s(*shape) == pytest.approx(engine.step_s(*shape), rel=1e-3)


def test_the_envelope_stays_under_the_measured_table() -> None:
    tokens = [1, 2, 4, 8, 16, 32, 64, 128, 256, 264, 512, 1024, 2048]
    profile, _ = measured_profile(_measured_on(_known(), tokens), "recovered")
    assert profile.linear_table is not None
    for t, s in zip(profile.linear_table.tokens, profile.linear_table.seconds, strict=True):
        assert profile.envelope_s(t) <= s * (1 + 1e-9)


def test_the_document_loads_as_a_profile_and_keeps_what_was_measured() -> None:
    m = _measured_on(_known(), [1, 8, 64, 256, 1024])
    document = profile_document(m, "cpu-tiny", "tiny at http://x")
    loaded = Profile.model_validate(document)
    assert loaded.name == "cpu-tiny" and loaded.max_running == 256
    assert loaded.prefill_first_token_budget == 8192 and loaded.kv_capacity_tokens == 450_000
    assert document["measured"]["prefill_s"]["64"] == pytest.approx(m.prefill_s[64], abs=1e-6)
    assert len(document["measured"]["decodes"]) == len(m.decodes)
    again = measurements_from_document(document)  # refitted without the engine
    assert measured_profile(again, "x")[1].a2 == pytest.approx(measured_profile(m, "x")[1].a2,
                                                                rel=1e-3)


def test_without_prefix_caching_prefill_attention_stays_in_the_table() -> None:
    m = _measured_on(_known(), [1, 8, 64, 256, 1024])
    fresh_only = Measurements(m.prefill_s, m.decodes, 256, 2048, 8192, 450_000)
    profile, terms = measured_profile(fresh_only, "x")
    assert terms.a2 == 0.0
    assert profile.step_s(1024, 1024 * 512, 0, 0, 1) == pytest.approx(m.prefill_s[1024], rel=1e-3)


def test_too_few_shapes_is_an_error() -> None:
    with pytest.raises(ValueError, match="two token counts"):
        measured_profile(Measurements({8: 0.01}, [DecodeShape(1, 16, 0.01)], 8, 64, 128, 1000),
                         "x")


@settings(max_examples=200, deadline=None)
@given(prefills=st.lists(st.floats(1e-4, 0.1), min_size=4, max_size=4),
       decodes=st.lists(st.floats(1e-4, 0.1), min_size=6, max_size=6),
       cached=st.lists(st.floats(1e-4, 0.1), min_size=2, max_size=2))
def test_any_noisy_measurement_gives_a_profile_with_positive_steps(
        prefills: list[float], decodes: list[float], cached: list[float]) -> None:
    """A real engine's times are noisy: the table may fall, a cached prefill may come out
    faster than a fresh one; the profile must still be valid, never negative, and its
    envelope under its table (a provable bound)."""
    m = Measurements(dict(zip((1, 16, 64, 256), prefills, strict=True)),
                     [DecodeShape(d, c, s) for (d, c), s in
                      zip([(d, c) for d in (1, 2, 4) for c in (20.0, 200.0)], decodes,
                          strict=True)],
                     4, 256, 4096, 100_000,
                     [CachedPrefill(256, k, s) for k, s in zip((512, 1024), cached, strict=True)])
    profile, _ = measured_profile(m, "noisy")
    assert profile.linear_table is not None
    for tokens in (1, 7, 16, 100, 256, 1000, profile.prefill_first_token_budget):
        assert profile.linear_s(tokens) > 0
        assert profile.envelope_s(tokens) <= profile.linear_s(tokens) * (1 + 1e-9)
        assert profile.step_s(tokens, tokens * tokens / 2, 4, 400, 5) > 0


def test_the_bundled_measured_profile_is_the_fit_of_its_measurements() -> None:
    bundled = load_profile("cpu-tiny-llama")
    document = json.loads((resources.files("jitserve.sim") / "profiles" /
                           "cpu-tiny-llama.json").read_text())
    refit, _ = measured_profile(measurements_from_document(document), bundled.name)
    assert refit.model_dump(exclude={"description"}) == bundled.model_dump(
        exclude={"description"})
