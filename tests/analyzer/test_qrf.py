from __future__ import annotations

import dataclasses
import itertools
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jitserve.analyzer import features as F
from jitserve.analyzer.corpus import LengthRecord, length_corpus
from jitserve.analyzer.qrf import QRFEstimator
from jitserve.analyzer.qrf_model import LEVELS, LengthModel, LengthQuery, conditional_bound
from jitserve.analyzer.qrf_train import _training_rows, train_model
from jitserve.requests import Request
from jitserve.slo import DeadlineSLO, LatencySLO
from tests.support.analyzer import SMALL_FOREST


def _request(i: int, prompt: int, app: str = "chat", text: str | None = None,
             max_tokens: int | None = None) -> Request:
    return Request(f"r{i}", "t", DeadlineSLO(20.0), prompt, 0.0, app=app, prompt_text=text,
                   max_tokens=max_tokens)


def test_fast_path_equals_quantile_forest_predict(small_model: LengthModel) -> None:
    records = length_corpus(50, 99)
    space = small_model.meta.space
    rows = F.meta_matrix(space, [r.prompt_tokens for r in records], [r.app for r in records],
                         [r.model for r in records], [r.slo_kind for r in records])
    ours = small_model.meta.curves(rows)
    reference = small_model.meta.forest.predict(rows, quantiles=[float(q) for q in LEVELS])
    assert np.allclose(ours, np.maximum.accumulate(reference, axis=1))


def test_held_out_coverage_and_refinement(small_model: LengthModel) -> None:
    test = length_corpus(1500, 4242)
    truth = np.array([r.output_tokens for r in test])
    for text in (True, False):
        queries = [LengthQuery(r.prompt_tokens, r.app, r.model, r.slo_kind,
                               r.prompt_text if text else None) for r in test]
        bounds = np.array(small_model.bounds(queries, 0.95))
        assert 0.91 <= np.mean(truth <= bounds) <= 0.99
        ratios = []
        for g in (0, 50, 100, 200):
            alive = np.flatnonzero(truth > g)
            refined = np.array(small_model.bounds([queries[i] for i in alive], 0.95,
                                                  [g] * len(alive)))
            assert np.all(refined > g)
            ratios.append(float(np.median(refined / truth[alive])))
        assert all(b < a for a, b in itertools.pairwise(ratios)), ratios
    # the quantile is honoured: a lower quantile covers less
    queries = [LengthQuery(r.prompt_tokens, r.app, r.model, r.slo_kind) for r in test]
    assert np.mean(truth <= np.array(small_model.bounds(queries, 0.5))) < 0.65


def test_text_sharpens_the_bound(small_model: LengthModel) -> None:
    test = length_corpus(1500, 777)
    truth = np.array([r.output_tokens for r in test])
    meta = np.array(small_model.bounds(
        [LengthQuery(r.prompt_tokens, r.app, r.model, r.slo_kind) for r in test], 0.95))
    text = np.array(small_model.bounds(
        [LengthQuery(r.prompt_tokens, r.app, r.model, r.slo_kind, r.prompt_text) for r in test],
        0.95))
    assert np.median(text / truth) < np.median(meta / truth)


@settings(max_examples=200, deadline=None)
@given(
    values=st.lists(st.floats(1, 5000), min_size=len(LEVELS), max_size=len(LEVELS)),
    quantile=st.floats(0.01, 0.99),
    generated=st.integers(0, 20000),
)
def test_conditional_bound_is_above_generated(values: list[float], quantile: float,
                                              generated: int) -> None:
    curve = np.sort(np.array(values))
    bound = conditional_bound(curve, LEVELS, quantile, generated)
    assert bound > generated
    assert bound >= conditional_bound(curve, LEVELS, quantile / 2, generated)


def test_conditional_bound_is_the_truncated_quantile() -> None:
    curve = np.linspace(10, 240, len(LEVELS))  # arbitrary increasing curve
    at_arrival = conditional_bound(curve, LEVELS, 0.5, 0)
    assert at_arrival == int(np.ceil(np.interp(0.5, LEVELS, curve)))
    # given > curve at level 0.5, the median of the rest is the 0.75 level
    g = int(np.floor(np.interp(0.5, LEVELS, curve)))
    refined = conditional_bound(curve, LEVELS, 0.5, g)
    assert abs(refined - np.interp(0.75, LEVELS, curve)) <= 2
    # beyond the curve a Pareto tail keeps the bound growing with what was generated
    assert conditional_bound(curve, LEVELS, 0.95, 1000) > 1100
    assert conditional_bound(curve, LEVELS, 0.95, 4000) > conditional_bound(curve, LEVELS, 0.95,
                                                                            1000)


def test_estimator_caps_at_max_tokens_and_stays_above_generated(small_model: LengthModel) -> None:
    est = QRFEstimator(small_model, 0.95)
    capped = _request(1, 500, "reasoning", max_tokens=64)
    assert est.bound(capped, 0) == 64
    assert est.bound(capped, 80) == 81
    free = _request(2, 500, "reasoning")
    assert est.bound(free, 0) > 64
    latency = Request("r3", "t", LatencySLO(2.0, 0.1), 100, 0.0, app="chat")
    assert est.bound(latency, 10) > 10
    assert est.bounds([capped, free], [0, 0]) == [64, est.bound(free, 0)]


def test_meta_predictions_are_cached_by_bucket(small_model: LengthModel) -> None:
    est = QRFEstimator(small_model, 0.95)
    first = est.bound(_request(1, 1000, "summarize"), 0)
    cached = len(small_model._cache)
    assert est.bound(_request(2, 1010, "summarize"), 0) == first  # same prompt bucket
    assert len(small_model._cache) == cached


def test_estimator_with_prompt_text_uses_the_text_view(small_model: LengthModel) -> None:
    est = QRFEstimator(small_model, 0.95)
    short = _request(1, 40, "chat", text="in one sentence, what is kubernetes autoscaling?")
    long = _request(2, 40, "chat", text="write a detailed guide to kubernetes autoscaling")
    assert est.bound(short, 0) < est.bound(long, 0)


def test_observed_completions_replace_the_corpus_for_an_app() -> None:
    corpus = length_corpus(1500, 5)
    model = train_model(corpus, config=SMALL_FOREST, seed=0)
    est = QRFEstimator(model, 0.95, corpus=corpus, retrain_every=400, seed=0)
    rng = np.random.default_rng(0)
    reqs = [_request(i, int(rng.integers(100, 2000)), "batch") for i in range(400)]
    before = est.bound(reqs[0], 0)
    for r in reqs:
        est.observe(r, int(rng.integers(900, 1100)))
    assert est.retrains == 1 and est.model.version == 2
    assert "batch" in est.model.meta.space.apps
    after = [est.bound(r, 0) for r in reqs[:50]]
    assert all(1000 <= b <= 1300 for b in after), after
    assert before not in range(1000, 1301)


def test_buffer_is_bounded(small_model: LengthModel) -> None:
    est = QRFEstimator(small_model, 0.95, buffer_size=10)
    for i in range(25):
        est.observe(_request(i, 100), 50)
    assert len(est.buffer) == 10 and est.buffer.total == 25


def test_model_pickles_without_its_cache(small_model: LengthModel) -> None:
    queries = [LengthQuery(300, "code"), LengthQuery(300, "chat", prompt_text="tl;dr of jazz?")]
    expected = small_model.bounds(queries, 0.9, [0, 20])
    clone = pickle.loads(pickle.dumps(small_model))
    assert clone._cache == {}
    assert clone.bounds(queries, 0.9, [0, 20]) == expected


def test_training_needs_data() -> None:
    with pytest.raises(ValueError, match="at least 20"):
        train_model([LengthRecord(None, 10, 10, "chat", "m", "")] * 5)
    with pytest.raises(ValueError, match="quantile"):
        QRFEstimator(train_model(length_corpus(200, 1), config=SMALL_FOREST), 1.5)


def test_training_rows_are_capped_newest_observations_first() -> None:
    corpus = length_corpus(600, 6)
    observed = [LengthRecord(None, 100, 10 + i, "batch", "m", "") for i in range(500)]
    config = dataclasses.replace(SMALL_FOREST, max_rows=400, other_fraction=0.0)
    model = train_model(corpus, observed, config=config)
    assert model.rows == 400 and model.observed_rows == 500
    rows = _training_rows(corpus, observed, config, np.random.default_rng(0))
    assert [r.output_tokens for r in rows] == [10 + i for i in range(100, 500)]
