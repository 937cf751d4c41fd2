"""Pattern-graph history and incremental matching of programs in flight.

Who owns what:
- the engine reports finished programs (``observe_program`` / the ``RecordProgram``
  RPC); :class:`PatternHistory` stores each as a pattern graph (:mod:`.graphs`) plus a
  row of per-stage features in preallocated arrays (the matching index);
- while a program runs, the scheduler asks for ``phi(s)`` at the start of each stage
  (``stage_share`` / ``MatchProgram``); :meth:`PatternHistory.match` answers from the
  stages that are done (models, tools, input and output lengths, tool times) and the
  current stage's calls (models, inputs);
- the history's upkeep (decay, eviction, k-medoids clustering) happens on insert.

Matching (paper section 4.1): history entries whose prefix *structure* diverges — a
different app, fewer stages than the program already has, another model at a stage
or another tool after a finished stage — are pruned; the rest are scored with Gaussian
kernels over node attributes (longest output, call count: log scale), edge attributes
(input tokens: log scale) and tool times, i.e. ``exp(-d/2)`` with ``d`` the sum of
squared, bandwidth-scaled differences. The answer blends the ``blend`` best candidates'
accumulated share ``phi(s) = t_<=s / t_total`` by kernel weight, and their expected
remaining stages. With no structurally matching entry it relaxes to same-app
entries, then to an equal split over the app's typical stage count.

Upkeep: every entry has a reuse weight that decays x0.9 per hour without use; entries
used in a match gain weight. When the history is over capacity the lowest-weight
entries go, except the medoids of a k-medoids clustering (FasterPAM, ``kmedoids``) of
the app's graphs, so rare patterns keep a representative. Beyond ``cluster_threshold``
candidates, matching first scores the medoids and only searches the closest clusters.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import kmedoids
import networkx as nx
import numpy as np
import numpy.typing as npt

from jitserve.analyzer.graphs import (
    MAX_STAGES,
    StageSummary,
    fold_stages,
    summarize_program,
    to_graph,
)
from jitserve.requests import Program
from jitserve.scheduling.estimators import StageShareEstimator

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

DECAY_PER_HOUR = 0.9
SIGMA_OUTPUT = 0.5
SIGMA_INPUT = 0.5
SIGMA_CALLS = 0.5
SIGMA_TOOL = 0.5


@dataclass(frozen=True, slots=True)
class MatchResult:
    share: float
    """phi(s): share of the program's time used up by the end of the current stage."""
    expected_remaining_stages: float
    candidates: int
    """Structurally matching history entries (0: a relaxed or default answer)."""
    best_distance: float
    method: str
    """``structure``, ``app`` (relaxed) or ``default`` (no usable history)."""


@dataclass(slots=True)
class HistoryEntry:
    graph: nx.DiGraph
    app: str
    stages: tuple[StageSummary, ...]
    weight: float
    last_used_s: float


def _log(x: float) -> float:
    return math.log1p(max(0.0, x))


class PatternHistory:
    """Bounded, decaying store of pattern graphs with vectorised matching."""

    def __init__(self, capacity: int = 2000, blend: int = 10, clusters_per_app: int = 16,
                 cluster_threshold: int = 1000, clock: Callable[[], float] = time.time,
                 min_weight: float = 0.01) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.blend = max(1, blend)
        self.clusters_per_app = clusters_per_app
        self.cluster_threshold = cluster_threshold
        self.clock = clock
        self.min_weight = min_weight
        self.entries: list[HistoryEntry] = []
        self._ids: dict[str, int] = {}
        n, s = capacity + 1, MAX_STAGES
        self._app = np.full(n, -1, dtype=np.int64)
        self._n_stages = np.zeros(n, dtype=np.int64)
        self._models = np.full((n, s), -1, dtype=np.int64)
        self._tools = np.full((n, s), -1, dtype=np.int64)
        self._out = np.zeros((n, s))
        self._inp = np.zeros((n, s))
        self._calls = np.zeros((n, s))
        self._tool_t = np.zeros((n, s))
        self._share = np.ones((n, s))
        self._weight = np.zeros(n)
        self._last_used = np.zeros(n)
        self._cluster = np.full(n, -1, dtype=np.int64)
        self._medoid = np.zeros(n, dtype=bool)
        self._dirty_clusters = 0
        self.lock = threading.RLock()

    # -- interning and rows -------------------------------------------------------------

    def _id(self, name: str) -> int:
        found = self._ids.get(name)
        if found is None:
            found = len(self._ids)
            self._ids[name] = found
        return found

    def _known_id(self, name: str) -> int:
        return self._ids.get(name, -2)

    def _model_sig(self, models: Sequence[str], known: bool = False) -> int:
        key = "+".join(models)
        return self._known_id(key) if known else self._id(key)

    def _write_row(self, i: int, entry: HistoryEntry) -> None:
        stages = entry.stages
        total = sum(s.stage_s for s in entry.stages)
        self._app[i] = self._id(f"app:{entry.app}")
        self._n_stages[i] = len(entry.stages)
        self._models[i] = -1
        self._tools[i] = -1
        self._out[i] = 0
        self._inp[i] = 0
        self._calls[i] = 0
        self._tool_t[i] = 0
        acc = 0.0
        for s, st in enumerate(stages):
            self._models[i, s] = self._model_sig(st.models)
            self._tools[i, s] = self._id(f"tool:{st.tool}")
            self._out[i, s] = _log(st.output_tokens)
            self._inp[i, s] = _log(st.input_tokens)
            self._calls[i, s] = math.log(st.calls)
            self._tool_t[i, s] = _log(st.tool_s)
            acc += st.stage_s
            self._share[i, s] = acc / total if total > 0 else (s + 1) / len(entry.stages)
        self._weight[i] = entry.weight
        self._last_used[i] = entry.last_used_s
        self._cluster[i] = -1
        self._medoid[i] = False

    def _copy_row(self, dst: int, src: int) -> None:
        for arr in (self._app, self._n_stages, self._models, self._tools, self._out, self._inp,
                    self._calls, self._tool_t, self._share, self._weight, self._last_used,
                    self._cluster, self._medoid):
            arr[dst] = arr[src]

    # -- upkeep -------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.entries)

    def effective_weights(self, now: float | None = None) -> FloatArray:
        n = len(self.entries)
        now = self.clock() if now is None else now
        hours = np.maximum(0.0, now - self._last_used[:n]) / 3600.0
        result: FloatArray = self._weight[:n] * DECAY_PER_HOUR ** hours
        return result

    def add(self, stages: Sequence[StageSummary], app: str, program_id: str = "",
            weight: float = 1.0, last_used_s: float | None = None) -> None:
        """Store a finished program (its stage summaries must carry ``stage_s``)."""
        if not stages:
            raise ValueError("a program needs at least one stage")
        stages = fold_stages(stages)
        with self.lock:
            entry = HistoryEntry(to_graph(stages, app, program_id), app, tuple(stages), weight,
                                 self.clock() if last_used_s is None else last_used_s)
            i = len(self.entries)
            self.entries.append(entry)
            self._write_row(i, entry)
            self._dirty_clusters += 1
            self._evict()

    def _remove(self, i: int) -> None:
        last = len(self.entries) - 1
        if i != last:
            self.entries[i] = self.entries[last]
            self._copy_row(i, last)
        self.entries.pop()
        self._app[last] = -1

    def _evict(self) -> None:
        weights = self.effective_weights()
        stale = [i for i in np.argsort(weights) if weights[i] < self.min_weight]
        for i in sorted(stale, reverse=True):
            if len(self.entries) > 1:
                self._remove(int(i))
        if len(self.entries) <= self.capacity:
            return
        self.recluster()
        weights = self.effective_weights()
        order = [int(i) for i in np.argsort(weights, kind="stable") if not self._medoid[i]]
        excess = len(self.entries) - self.capacity
        for i in sorted(order[:excess], reverse=True):
            self._remove(i)
        self._dirty_clusters += excess

    def _embedding(self, idx: IntArray) -> FloatArray:
        depth = min(MAX_STAGES, 8)
        parts = [
            np.log(self._n_stages[idx, None].astype(np.float64)),
            self._out[idx, :depth] / SIGMA_OUTPUT, self._inp[idx, :depth] / SIGMA_INPUT,
            self._calls[idx, :depth] / SIGMA_CALLS, self._tool_t[idx, :depth] / SIGMA_TOOL,
            (self._models[idx, :depth] >= 0) * 1.0,
        ]
        return np.concatenate(parts, axis=1)

    def recluster(self) -> None:
        """k-medoids (FasterPAM) over each app's graphs; resets the dirty counter."""
        with self.lock:
            n = len(self.entries)
            self._cluster[:n] = -1
            self._medoid[:n] = False
            next_label = 0
            for app in np.unique(self._app[:n]):
                idx = np.flatnonzero(self._app[:n] == app)
                k = min(self.clusters_per_app, max(1, int(math.sqrt(len(idx)))))
                if len(idx) <= k:
                    self._cluster[idx] = next_label + np.arange(len(idx))
                    self._medoid[idx] = True
                    next_label += len(idx)
                    continue
                emb = self._embedding(idx)
                diss = np.sqrt(((emb[:, None, :] - emb[None, :, :]) ** 2).sum(-1))
                result = kmedoids.fasterpam(diss, k, random_state=0, n_cpu=1)
                labels = np.asarray(result.labels, dtype=np.int64)
                self._cluster[idx] = next_label + labels
                self._medoid[idx[np.asarray(result.medoids, dtype=np.int64)]] = True
                next_label += k
            self._dirty_clusters = 0

    # -- matching -----------------------------------------------------------------------

    def _distance(self, idx: IntArray, known: Sequence[StageSummary], current: StageSummary,
                  ) -> FloatArray:
        s = len(known)
        d = np.zeros(len(idx))
        if s:
            q_out = np.array([_log(k.output_tokens) for k in known])
            q_inp = np.array([_log(k.input_tokens) for k in known])
            q_calls = np.array([math.log(k.calls) for k in known])
            q_tool = np.array([_log(k.tool_s) for k in known])
            d += (((self._out[idx, :s] - q_out) / SIGMA_OUTPUT) ** 2).sum(axis=1)
            d += (((self._inp[idx, :s] - q_inp) / SIGMA_INPUT) ** 2).sum(axis=1)
            d += (((self._calls[idx, :s] - q_calls) / SIGMA_CALLS) ** 2).sum(axis=1)
            d += (((self._tool_t[idx, :s] - q_tool) / SIGMA_TOOL) ** 2).sum(axis=1)
        if s < MAX_STAGES:
            d += ((self._inp[idx, s] - _log(current.input_tokens)) / SIGMA_INPUT) ** 2
            d += ((self._calls[idx, s] - math.log(current.calls)) / SIGMA_CALLS) ** 2
        return d

    def match(self, app: str, known: Sequence[StageSummary], current: StageSummary,
              touch: bool = True) -> MatchResult:
        """phi at the end of the current stage, given the finished stages ``known``."""
        s = len(known)
        with self.lock:
            n = len(self.entries)
            app_id = self._known_id(f"app:{app}")
            same_app = (self._app[:n] == app_id) & (self._n_stages[:n] > s)
            if s >= MAX_STAGES or not same_app.any():
                return self._default(app_id, s)
            mask = same_app.copy()
            for i, st in enumerate(known):
                mask &= self._models[:n, i] == self._model_sig(st.models, known=True)
                mask &= self._tools[:n, i] == self._known_id(f"tool:{st.tool}")
            mask &= self._models[:n, s] == self._model_sig(current.models, known=True)
            method = "structure"
            if not mask.any():
                mask, method = same_app, "app"
            idx = np.flatnonzero(mask)
            if len(idx) > self.cluster_threshold:
                idx = self._probe_clusters(idx, known, current)
            d = self._distance(idx, known, current)
            top = np.argsort(d, kind="stable")[: self.blend]
            w = np.exp(-(d[top] - d[top[0]]) / 2.0)
            w /= w.sum()
            rows = idx[top]
            share = float(np.dot(w, self._share[rows, s]))
            remaining = float(np.dot(w, self._n_stages[rows] - s - 1))
            if touch:
                now = self.clock()
                self._weight[rows] = self.effective_weights(now)[rows] + w
                self._last_used[rows] = now
                for r in rows:
                    entry = self.entries[int(r)]
                    entry.weight = float(self._weight[r])
                    entry.last_used_s = now
            return MatchResult(min(1.0, max(1e-6, share)), max(0.0, remaining),
                               len(idx) if method == "structure" else 0, float(d[top[0]]), method)

    def _probe_clusters(self, idx: IntArray, known: Sequence[StageSummary],
                        current: StageSummary, probes: int = 3) -> IntArray:
        if self._dirty_clusters > max(16, len(self.entries) // 10):
            self.recluster()
        labels = self._cluster[idx]
        medoids = np.flatnonzero(self._medoid[: len(self.entries)])
        medoids = medoids[np.isin(self._cluster[medoids], labels)]
        if len(medoids) == 0:
            return idx
        d = self._distance(medoids, known, current)
        chosen = self._cluster[medoids[np.argsort(d)[:probes]]]
        narrowed = idx[np.isin(labels, chosen) | (labels < 0)]
        return narrowed if len(narrowed) else idx

    def _default(self, app_id: int, s: int) -> MatchResult:
        n = len(self.entries)
        same = self._n_stages[:n][self._app[:n] == app_id]
        typical = float(np.median(same)) if len(same) else 4.0
        expected = max(typical, s + 1.0)
        return MatchResult(min(1.0, (s + 1) / expected), expected - s - 1, 0, math.inf, "default")


class PatternMatcher(StageShareEstimator):
    """The analyzer's stage-share estimator in-process (simulator, sidecar fallback).

    ``stage_share(program, s)`` reads only what is known when stage ``s`` starts: the
    finished stages 0..s-1 and the calls (models, prompt lengths) of stage ``s`` — never
    later stages or the program's stage count. Per program the answer never decreases
    from one stage to the next."""

    name = "pattern"

    def __init__(self, history: PatternHistory | None = None, remember: int = 65_536) -> None:
        self.history = history if history is not None else PatternHistory()
        self._last: OrderedDict[str, float] = OrderedDict()
        self._remember = remember

    @classmethod
    def pretrained(cls, programs: int = 500, seed: int = 0, capacity: int = 2000) -> PatternMatcher:
        """Seeded with ``programs`` synthetic programs (:func:`corpus.program_corpus`)."""
        from jitserve.analyzer.corpus import program_corpus

        matcher = cls(PatternHistory(capacity=capacity))
        for program, seconds in program_corpus(programs, seed):
            matcher.observe_program(program, seconds)
        return matcher

    def match(self, program: Program, stage: int) -> MatchResult:
        stages = summarize_program(program, known_outputs=stage)
        if stage >= len(stages):
            raise ValueError(f"program {program.program_id} has no stage {stage}")
        return self.history.match(program.app, stages[:stage], stages[stage])

    def stage_share(self, program: Program, stage: int) -> float:
        share = self.match(program, stage).share
        key = program.program_id
        previous = self._last.pop(key, 0.0) if stage > 0 else 0.0
        share = max(share, previous)
        self._last[key] = share
        if len(self._last) > self._remember:
            self._last.popitem(last=False)
        return share

    def observe_program(self, program: Program, stage_seconds: list[float]) -> None:
        if len(stage_seconds) != len(program.stages):
            raise ValueError(f"program {program.program_id}: {len(stage_seconds)} stage times "
                             f"for {len(program.stages)} stages")
        self._last.pop(program.program_id, None)
        self.history.add(summarize_program(program, stage_seconds), program.app,
                         program.program_id)
