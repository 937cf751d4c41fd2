from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

from jitserve.analyzer.corpus import program_corpus, true_shares
from jitserve.analyzer.graphs import (
    MAX_STAGES,
    StageSummary,
    from_graph,
    summarize_program,
    to_graph,
)
from jitserve.analyzer.matcher import PatternHistory, PatternMatcher
from jitserve.analyzer.state import graph_size_bytes
from jitserve.requests import LLMCall, Program, Stage
from jitserve.slo import CompoundSLO


def _program(pid: str, stages: list[Stage], app: str = "research") -> Program:
    return Program(pid, "t", 0.0, CompoundSLO(100.0), tuple(stages), app=app)


def _stage(out: int, width: int = 1, model: str = "m", tool: str = "search",
           tool_s: float = 1.0) -> Stage:
    return Stage(tuple(LLMCall(500, out, model) for _ in range(width)), tool_s, tool)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def test_graph_round_trip_and_shape() -> None:
    program = _program("p", [_stage(100), _stage(200, width=4, tool="none", tool_s=0.0),
                             _stage(300)])
    stages = summarize_program(program, [1.0, 2.0, 3.0])
    graph = to_graph(stages, "research", "p")
    assert from_graph(graph) == stages
    kinds = [d["kind"] for _, d in graph.nodes(data=True)]
    assert kinds.count("llm") == 3 and kinds.count("tool") == 2
    # the fan-out stage is one super-node with its call count
    assert graph.nodes["1/llm/m"]["calls"] == 4
    assert graph.has_edge("0/tool", "1/llm/m") and graph.has_edge("1/llm/m", "2/llm/m")


def test_stored_graph_stays_under_one_kilobyte() -> None:
    big = StageSummary(models=("llama-3.1-70b-instruct", "qwen2.5-14b-instruct"), calls=512,
                       input_tokens=10**7, output_tokens=10**6, tool="web-search-tool",
                       tool_s=3600.0, stage_s=7200.0)
    assert graph_size_bytes([big] * 40, "deep-research-app") < 1024  # truncated to 16 stages
    typical = [graph_size_bytes(summarize_program(p, s), p.app) for p, s in program_corpus(50, 1)]
    assert max(typical) < 400


def test_an_identical_program_in_history_gives_its_exact_shares() -> None:
    matcher = PatternMatcher(PatternHistory(blend=1))
    programs = program_corpus(40, 3)
    for program, seconds in programs:
        matcher.observe_program(program, seconds)
    program, seconds = programs[7]
    for s, share in enumerate(true_shares(seconds)):
        result = matcher.match(program, s)
        assert result.method == "structure" and result.candidates >= 1
        assert result.share == pytest.approx(share, abs=1e-9)
        assert result.expected_remaining_stages == len(program.stages) - s - 1


def test_only_what_is_known_when_the_stage_starts_is_used() -> None:
    matcher = PatternMatcher.pretrained(programs=200, seed=0)
    a = _program("a", [_stage(300), _stage(250, 5), _stage(1200, tool="none", tool_s=0.0)])
    b = _program("b", [_stage(300), _stage(250, 5), _stage(90), _stage(90), _stage(90)])
    assert matcher.history.match("research", summarize_program(a, known_outputs=1)[:1],
                                 summarize_program(a, known_outputs=1)[1], touch=False) == \
        matcher.history.match("research", summarize_program(b, known_outputs=1)[:1],
                              summarize_program(b, known_outputs=1)[1], touch=False)
    # later outputs and the program's length do not leak into earlier answers
    assert matcher.stage_share(a, 1) == matcher.stage_share(b, 1)


def test_diverging_structure_is_pruned() -> None:
    history = PatternHistory(blend=1)
    slow_tool = summarize_program(_program("x", [_stage(100, tool="exec"), _stage(100)]),
                                  [9.0, 1.0])
    fast_tool = summarize_program(_program("y", [_stage(100, tool="search"), _stage(100)]),
                                  [1.0, 9.0])
    history.add(slow_tool, "research")
    history.add(fast_tool, "research")
    query = summarize_program(_program("q", [_stage(100, tool="search"), _stage(100)]),
                              known_outputs=1)
    result = history.match("research", query[:1], query[1])
    assert result.method == "structure" and result.candidates == 1
    assert result.share == pytest.approx(1.0)
    at_start = history.match("research", [], query[0])
    assert at_start.share == pytest.approx(0.5, abs=0.4)
    other_model = dataclasses.replace(query[1], models=("other-model",))
    relaxed = history.match("research", query[:1], other_model)
    assert relaxed.method == "app" and relaxed.candidates == 0


def test_no_history_falls_back_to_an_even_split_and_shares_never_decrease() -> None:
    matcher = PatternMatcher()
    program = _program("p", [_stage(100)] * 6, app="unknown")
    shares = [matcher.stage_share(program, s) for s in range(6)]
    assert shares[0] == pytest.approx(0.25)
    assert shares == sorted(shares) and shares[-1] == 1.0
    assert matcher.match(program, 0).method == "default"


def test_share_error_falls_as_stages_become_known() -> None:
    matcher = PatternMatcher.pretrained(programs=300, seed=0)
    errors: dict[int, list[float]] = {}
    for program, seconds in program_corpus(120, 77):
        truth = true_shares(seconds)
        for s in range(len(program.stages)):
            result = matcher.match(program, s)
            errors.setdefault(s, []).append(abs(result.share - truth[s]) / truth[s])
    curve = [float(np.mean(errors[s])) for s in range(4)]
    assert all(b < a for a, b in itertools.pairwise(curve)), curve


def test_weights_decay_per_hour_and_stale_entries_are_evicted() -> None:
    clock = Clock()
    history = PatternHistory(capacity=10, clock=clock, min_weight=0.5)
    stages = summarize_program(_program("p", [_stage(100), _stage(100)]), [1.0, 1.0])
    history.add(stages, "research")
    clock.now += 3600
    assert history.effective_weights()[0] == pytest.approx(0.9)
    history.match("research", stages[:1], stages[1])  # use it: weight grows, clock resets
    assert history.effective_weights()[0] == pytest.approx(1.9)
    clock.now += 3600 * 8  # 1.9 * 0.9**8 = 0.82: still kept
    history.add(stages, "research")
    assert len(history) == 2
    clock.now += 3600 * 8  # first ~0.35, second ~0.43: both below 0.5
    history.add(stages, "research")
    assert len(history) == 1


def test_over_capacity_keeps_medoids_and_drops_the_least_used() -> None:
    clock = Clock()
    history = PatternHistory(capacity=30, clusters_per_app=4, clock=clock)
    programs = program_corpus(45, 5)
    for i, (program, seconds) in enumerate(programs):
        history.add(summarize_program(program, seconds), program.app, program.program_id,
                    weight=1.0 + i / 100)
    assert len(history) == 30
    kept = {e.graph.graph["program_id"] for e in history.entries}
    assert "syn-5-44" in kept  # the heaviest survive
    medoids = np.flatnonzero(history._medoid[: len(history)])
    assert len(medoids) >= 3


def test_clustered_matching_agrees_with_exhaustive() -> None:
    exhaustive = PatternHistory(capacity=600)
    clustered = PatternHistory(capacity=600, cluster_threshold=50)
    for program, seconds in program_corpus(500, 9):
        for history in (exhaustive, clustered):
            history.add(summarize_program(program, seconds), program.app)
    diffs = []
    for program, _ in program_corpus(40, 10):
        for s in range(len(program.stages)):
            visible = summarize_program(program, known_outputs=s)
            a = exhaustive.match(program.app, visible[:s], visible[s], touch=False)
            b = clustered.match(program.app, visible[:s], visible[s], touch=False)
            diffs.append(abs(a.share - b.share))
    assert np.mean(diffs) < 0.05


def test_invalid_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="stage times"):
        PatternMatcher().observe_program(_program("p", [_stage(1)]), [1.0, 2.0])
    with pytest.raises(ValueError, match="no stage"):
        PatternMatcher().match(_program("p", [_stage(1)]), 3)
    with pytest.raises(ValueError, match="finite"):
        StageSummary(("m",), 1, 1, 1, stage_s=float("nan"))
    assert MAX_STAGES == 16


def test_long_programs_are_folded_keeping_their_total_time() -> None:
    history = PatternHistory(blend=1)
    stages = [StageSummary(("m",), 1, 100, 10, "search", 0.1, 1.0)] * 30
    history.add(stages, "research")
    entry = history.entries[0]
    assert len(entry.stages) == MAX_STAGES
    assert sum(s.stage_s for s in entry.stages) == pytest.approx(30.0)
    result = history.match("research", stages[:3], stages[3])
    assert result.share == pytest.approx(4 / 30)
