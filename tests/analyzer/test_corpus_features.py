from __future__ import annotations

import itertools
import math

import numpy as np

from jitserve.analyzer import features as F
from jitserve.analyzer.corpus import APPS, length_corpus, program_corpus, true_shares


def test_corpus_is_deterministic_under_a_seed() -> None:
    assert length_corpus(200, 7) == length_corpus(200, 7)
    assert length_corpus(200, 7) != length_corpus(200, 8)


def test_families_have_distinct_heavy_tailed_lengths() -> None:
    records = length_corpus(6000, 1)
    by_app = {app: np.array([r.output_tokens for r in records if r.app == app]) for app in APPS}
    assert set(by_app) == set(APPS) and all(len(v) > 200 for v in by_app.values())
    median = {app: float(np.median(v)) for app, v in by_app.items()}
    # Azure 2023 code trace: tiny completions; reasoning: the longest answers.
    assert median["code"] < 60 < median["chat"] < median["reasoning"]
    assert median["extract"] < 40
    # Table 2 (chatbot): P50 225 / P95 1024 -> a heavy tail (P95 several times P50).
    chat = by_app["chat"]
    assert 120 < median["chat"] < 320
    assert np.percentile(chat, 95) > 3 * median["chat"]
    # Deep research single requests: P50 ~410, P95 ~1544.
    assert 300 < median["research"] < 550
    assert 1100 < np.percentile(by_app["research"], 95) < 2200


def test_translation_length_follows_source_length() -> None:
    records = [r for r in length_corpus(4000, 2) if r.app == "translate"]
    x = np.log([r.prompt_tokens for r in records])
    y = np.log([r.output_tokens for r in records])
    assert np.corrcoef(x, y)[0, 1] > 0.8


def test_identical_instructions_get_different_lengths() -> None:
    records = length_corpus(4000, 3)
    groups: dict[str, list[int]] = {}
    for r in records:
        assert r.prompt_text is not None
        groups.setdefault(r.prompt_text.split("\n")[0], []).append(r.output_tokens)
    spreads = [np.std(np.log(v)) for v in groups.values() if len(v) >= 10]
    assert spreads and min(spreads) > 0.1


def test_programs_have_variable_shapes_and_shares_end_at_one() -> None:
    programs = program_corpus(60, 4)
    assert len({len(p.stages) for p, _ in programs}) >= 3
    assert {p.app for p, _ in programs} == {"research", "agents", "math"}
    for program, seconds in programs:
        shares = true_shares(seconds)
        assert len(shares) == len(program.stages)
        assert all(b > a for a, b in itertools.pairwise(shares))
        assert math.isclose(shares[-1], 1.0)


def test_meta_row_maps_unknown_tags_to_other() -> None:
    space = F.FeatureSpace.build(["chat", "code"], ["m1"])
    assert space.apps == ("chat", "code", F.OTHER_APP)
    row = F.meta_row(space, 1024, "never-seen", "m2", "deadline")
    assert row[0] == 10.0
    assert row[1] == -1.0
    assert row[2 + space.apps.index(F.OTHER_APP)] == 1.0
    assert row[2 + len(space.apps) + F.SLO_KINDS.index("deadline")] == 1.0
    assert F.meta_row(space, 1024, "chat", "m1", "")[1] == 0.0


def test_text_features_read_the_instruction_not_the_document() -> None:
    filler = " ".join(["data"] * 500)
    a = F.text_part("summarize in one sentence\n" + filler + " middle words here " + filler)
    b = F.text_part("summarize in one sentence\n" + filler + " other stuff there " + filler)
    c = F.text_part("write a detailed report\n" + filler + " middle words here " + filler)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)
    assert a[0] > math.log2(1000)  # the word count still sees the whole prompt


def test_text_features_pick_up_numbers_and_questions() -> None:
    part = F.text_part("give me 12 tips? and 3 more?")
    assert part[1] == 2
    assert math.isclose(part[2], math.log1p(12), rel_tol=1e-6)
    assert F.hashed_ngrams(["a", "b"]) == F.hashed_ngrams(["a", "b"])
    assert F.word_hash("chat") == F.word_hash("chat") != F.word_hash("code")
