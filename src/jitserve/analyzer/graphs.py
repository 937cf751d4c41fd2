"""Pattern graphs of compound programs (JITServe paper section 4.1, Figure 6).

Who owns what: the engine (simulator or sidecar) reports a finished program — its
stages of LLM calls, the tool run after each stage and how long each stage took.
This module turns that into a :class:`StageSummary` list and a small ``networkx``
``DiGraph`` (the stored form of a history entry); :mod:`jitserve.analyzer.matcher` owns the
history and the matching.

A graph has one LLM node per (stage, model) — the paper's "super-node": the calls of a
stage that use the same model are folded into one node with the call count, their total
input tokens and their longest output — and one tool node per tool call, weighted by
its execution time. Edges are dependencies: stage ``s``'s LLM nodes -> its tool node
-> stage ``s+1``'s LLM nodes (directly to them when there is no tool), weighted by the
input tokens of the node they enter. Only lengths, counts and times are kept, never
text, and at most :data:`MAX_STAGES` stages (:func:`fold_stages`), so a stored graph
stays under 1 KB.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import networkx as nx

from jitserve.analyzer.wire import NO_TOOL
from jitserve.requests import Program

MAX_STAGES = 16


@dataclass(frozen=True, slots=True)
class StageSummary:
    """One stage of a program, as the analyzer sees it."""

    models: tuple[str, ...]
    """Distinct models of the stage's calls, sorted."""
    calls: int
    input_tokens: int
    """Total prompt tokens of the stage's calls."""
    output_tokens: int
    """Longest output of the stage's calls (the stage waits for it); 0 when unknown."""
    tool: str = NO_TOOL
    tool_s: float = 0.0
    stage_s: float = 0.0
    """Observed wall time of the stage including its tool call; 0 when unknown."""

    def __post_init__(self) -> None:
        if self.calls < 1:
            raise ValueError(f"a stage needs >= 1 call, got {self.calls}")
        if not self.models:
            raise ValueError("a stage needs at least one model")
        for name, value in (("input_tokens", self.input_tokens),
                            ("output_tokens", self.output_tokens)):
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        for name, seconds in (("tool_s", self.tool_s), ("stage_s", self.stage_s)):
            if not math.isfinite(seconds) or seconds < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {seconds}")


def summarize_program(program: Program, stage_seconds: Sequence[float] | None = None,
                      known_outputs: int | None = None) -> list[StageSummary]:
    """Stage summaries of ``program``. Outputs (and tools) of stages at index >=
    ``known_outputs`` are hidden (set to 0 / none) — what a scheduler knows mid-flight."""
    out = []
    for i, stage in enumerate(program.stages):
        visible = known_outputs is None or i < known_outputs
        out.append(StageSummary(
            models=tuple(sorted({c.model for c in stage.calls})),
            calls=len(stage.calls),
            input_tokens=sum(c.prompt_tokens for c in stage.calls),
            output_tokens=max(c.output_tokens for c in stage.calls) if visible else 0,
            tool=stage.tool if visible else NO_TOOL,
            tool_s=stage.tool_s if visible else 0.0,
            stage_s=float(stage_seconds[i]) if stage_seconds is not None else 0.0,
        ))
    return out


def fold_stages(stages: Sequence[StageSummary]) -> list[StageSummary]:
    """At most :data:`MAX_STAGES` stages: the tail of a longer program is folded into
    the last kept stage (its time is the tail's total, so shares stay exact)."""
    if len(stages) <= MAX_STAGES:
        return list(stages)
    head, tail = list(stages[: MAX_STAGES - 1]), stages[MAX_STAGES - 1:]
    last = tail[-1]
    head.append(StageSummary(
        models=tuple(sorted({m for s in tail for m in s.models})),
        calls=max(s.calls for s in tail), input_tokens=max(s.input_tokens for s in tail),
        output_tokens=max(s.output_tokens for s in tail), tool=last.tool, tool_s=last.tool_s,
        stage_s=sum(s.stage_s for s in tail),
    ))
    return head


def to_graph(stages: Sequence[StageSummary], app: str = "", program_id: str = "") -> nx.DiGraph:
    """The pattern graph of a program (first :data:`MAX_STAGES` stages)."""
    graph = nx.DiGraph(app=app, program_id=program_id, stages=min(len(stages), MAX_STAGES))
    previous: list[str] = []
    for s, stage in enumerate(stages[:MAX_STAGES]):
        current = []
        for model in stage.models:
            node = f"{s}/llm/{model}"
            graph.add_node(node, kind="llm", stage=s, model=model, calls=stage.calls,
                           input=stage.input_tokens, output=stage.output_tokens,
                           stage_s=stage.stage_s)
            for parent in previous:
                graph.add_edge(parent, node, input=stage.input_tokens)
            current.append(node)
        if stage.tool != NO_TOOL or stage.tool_s > 0:
            tool = f"{s}/tool"
            graph.add_node(tool, kind="tool", stage=s, tool=stage.tool, seconds=stage.tool_s)
            for node in current:
                graph.add_edge(node, tool, input=stage.output_tokens)
            current = [tool]
        previous = current
    return graph


def _num(value: object) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    raise ValueError(f"expected a number in the graph, got {value!r}")


def from_graph(graph: nx.DiGraph) -> list[StageSummary]:
    """Stage summaries back from a pattern graph (inverse of :func:`to_graph`)."""
    by_stage: dict[int, list[dict[str, object]]] = {}
    tools: dict[int, dict[str, object]] = {}
    for _, data in graph.nodes(data=True):
        stage = int(data["stage"])
        if data["kind"] == "tool":
            tools[stage] = data
        else:
            by_stage.setdefault(stage, []).append(data)
    out = []
    for s in range(int(graph.graph.get("stages", len(by_stage)))):
        nodes = by_stage[s]
        first = nodes[0]
        tool = tools.get(s)
        out.append(StageSummary(
            models=tuple(sorted(str(n["model"]) for n in nodes)),
            calls=int(_num(first["calls"])), input_tokens=int(_num(first["input"])),
            output_tokens=int(_num(first["output"])),
            tool=str(tool["tool"]) if tool else NO_TOOL,
            tool_s=_num(tool["seconds"]) if tool else 0.0,
            stage_s=_num(first["stage_s"]),
        ))
    return out
