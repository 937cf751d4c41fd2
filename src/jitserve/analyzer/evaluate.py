"""``jitserve analyzer eval``: the analyzer's acceptance figures, measured.

Who owns what: this module only measures. It trains a length model on one draw of the
synthetic corpus and evaluates it on a held-out draw (another seed), times predictions
through a real gRPC server on loopback, and builds a pattern-graph history to time
matching and trace the stage-share error as more stages become known. It writes
``DIR/analyzer.json`` (and ``DIR/analyzer.png``).
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from jitserve.analyzer.corpus import APPS, LengthRecord, length_corpus, program_corpus, true_shares
from jitserve.analyzer.graphs import summarize_program
from jitserve.analyzer.matcher import PatternHistory
from jitserve.analyzer.qrf_model import LengthModel, LengthQuery
from jitserve.analyzer.qrf_train import train_model
from jitserve.requests import Program
from jitserve.scheduling.estimators import UniformStageShare

GENERATED_POINTS = (0, 50, 100, 200, 400)


def _queries(records: Sequence[LengthRecord], text: bool) -> list[LengthQuery]:
    return [LengthQuery(r.prompt_tokens, r.app, r.model, r.slo_kind,
                        r.prompt_text if text else None) for r in records]


def _percentiles(samples_s: Sequence[float]) -> dict[str, float]:
    ms = np.asarray(samples_s) * 1000.0
    return {"p50": round(float(np.percentile(ms, 50)), 3),
            "p99": round(float(np.percentile(ms, 99)), 3),
            "mean": round(float(ms.mean()), 3), "n": len(ms)}


def length_accuracy(model: LengthModel, test: Sequence[LengthRecord], quantile: float,
                    text: bool) -> dict[str, Any]:
    queries = _queries(test, text)
    truth = np.array([r.output_tokens for r in test])
    arrival = np.array(model.bounds(queries, quantile))
    ratio_by_generated: dict[str, float] = {}
    coverage_by_generated: dict[str, float] = {}
    for g in GENERATED_POINTS:
        alive = np.flatnonzero(truth > g)
        bounds = np.array(model.bounds([queries[i] for i in alive], quantile, [g] * len(alive)))
        ratio_by_generated[str(g)] = round(float(np.median(bounds / truth[alive])), 4)
        coverage_by_generated[str(g)] = round(float(np.mean(truth[alive] <= bounds)), 4)
    apps = np.array([r.app for r in test])
    per_app = {app: round(float(np.mean(truth[apps == app] <= arrival[apps == app])), 4)
               for app in APPS if np.any(apps == app)}
    levels = {}
    for q in (0.5, 0.8, 0.9, 0.95, 0.99):
        b = np.array(model.bounds(queries, q))
        levels[str(q)] = round(float(np.mean(truth <= b)), 4)
    return {
        "coverage": round(float(np.mean(truth <= arrival)), 4),
        "ratio_by_generated": ratio_by_generated,
        "coverage_by_generated": coverage_by_generated,
        "coverage_by_app": per_app,
        "coverage_at_quantile": levels,
        "mean_overestimation": round(float(np.mean(arrival / truth)), 3),
        "n": len(test),
    }


class ServerProcess:
    """``jitserve analyzer serve`` in a child process on a free loopback port.
    ``startup_s``: how long it may take to say where it listens (a restart restores the
    length model and the pattern graphs first; on two busy cores a restart's first log
    line once came after the earlier 60 s, and a ci-fresh failed on it)."""

    def __init__(self, state_dir: Path, *extra: str, startup_s: float = 180.0) -> None:
        import subprocess
        import sys

        env = dict(os.environ)
        src = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "jitserve.cli", "analyzer", "serve", "--host", "127.0.0.1",
             "--port", "0", "--metrics-port", "-1", "--state-dir", str(state_dir), *extra],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        )
        self.output: list[str] = []
        """Every line the process wrote; whole once :meth:`stop` returned."""
        self.port = 0
        self._reader: threading.Thread | None = None
        deadline = time.monotonic() + startup_s
        assert self.process.stdout is not None
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if not line:
                break
            self.output.append(line)
            # stdout and stderr share the pipe: a log line can land inside this one
            found = re.search(r"analyzer listening on [^\s:]+:(\d+)", line)
            if found:
                self.port = int(found.group(1))
                break
        if not self.port:
            self.stop()
            raise RuntimeError("analyzer did not start:\n" + "".join(self.output))
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()

    def _drain(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.output.append(line)

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def wait_serving(self, timeout_s: float = 60.0) -> None:
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        deadline = time.monotonic() + timeout_s
        with grpc.insecure_channel(self.target) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while time.monotonic() < deadline:
                try:
                    status = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1.0)
                    if status.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.RpcError:
                    pass
                time.sleep(0.1)
        raise TimeoutError("analyzer did not become SERVING:\n" + "".join(self.output))

    def stop(self, timeout_s: float = 30.0) -> int:
        import signal

        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout_s)
        except Exception:
            self.process.kill()
            code = self.process.wait()
        # the last lines (the shutdown's "checkpointed") may still be in the pipe: the
        # reader ends at its EOF
        if self._reader is not None:
            self._reader.join(timeout_s)
        return code


def grpc_latency(model: LengthModel, test: Sequence[LengthRecord], quantile: float,
                 batch1_calls: int, batch64_calls: int) -> dict[str, Any]:
    """Wall time of PredictBound through a real server process on loopback, seen by
    the client (``model`` is handed over as the server's checkpoint)."""
    import tempfile

    import grpc

    from jitserve.analyzer.client import make_stub, query_pb
    from jitserve.analyzer.proto import analyzer_pb2 as pb
    from jitserve.analyzer.state import save_model
    from jitserve.requests import Request
    from jitserve.slo import DeadlineSLO

    tmp = tempfile.TemporaryDirectory(prefix="jitserve-analyzer-eval-")
    save_model(Path(tmp.name), model)
    server = ServerProcess(Path(tmp.name), "--quantile", str(quantile))
    server.wait_serving()
    channel = grpc.insecure_channel(server.target)
    stub = make_stub(channel)
    slo = DeadlineSLO(20.0)
    msgs = [query_pb(Request(f"eval-{i}", "eval", slo, r.prompt_tokens, 0.0, app=r.app,
                             model=r.model, prompt_text=r.prompt_text)) for i, r in enumerate(test)]

    def timed(batch: int, calls: int, text: bool) -> list[float]:
        """Each query gets a fresh request id, so no server-side cache can answer it."""
        out = []
        for c in range(calls):
            start = (c * batch) % max(1, len(msgs) - batch)
            queries = []
            for j, q in enumerate(msgs[start:start + batch]):
                fresh = pb.LengthQuery()
                fresh.CopyFrom(q)
                fresh.request_id = f"lat-{batch}-{text}-{c}-{j}"
                if not text:
                    fresh.prompt_text = ""
                queries.append(fresh)
            request = pb.PredictRequest(queries=queries)
            t0 = time.perf_counter()
            stub.PredictBound(request, timeout=30.0)
            out.append(time.perf_counter() - t0)
        return out

    try:
        timed(1, 50, True)
        timed(64, 5, True)
        result = {
            "batch1": _percentiles(timed(1, batch1_calls, True)),
            "batch64": _percentiles(timed(64, batch64_calls, True)),
            "batch1_no_text": _percentiles(timed(1, batch1_calls // 2, False)),
        }
    finally:
        channel.close()
        server.stop()
        tmp.cleanup()
    return result


def _match_all(history: PatternHistory, programs: Sequence[tuple[Program, list[float]]],
               timer: Callable[[], float] = time.perf_counter,
               ) -> tuple[dict[int, list[float]], dict[int, list[float]], list[float]]:
    abs_err: dict[int, list[float]] = {}
    rel_err: dict[int, list[float]] = {}
    times: list[float] = []
    for program, seconds in programs:
        truth = true_shares(seconds)
        for s in range(len(program.stages)):
            visible = summarize_program(program, known_outputs=s)
            t0 = timer()
            result = history.match(program.app, visible[:s], visible[s], touch=False)
            times.append(timer() - t0)
            abs_err.setdefault(s, []).append(abs(result.share - truth[s]))
            rel_err.setdefault(s, []).append(abs(result.share - truth[s]) / truth[s])
    return abs_err, rel_err, times


def matching(history_size: int, test_programs: int, seed: int) -> dict[str, Any]:
    history_programs = program_corpus(history_size, seed)
    test = program_corpus(test_programs, seed + 1000)

    def build(n: int) -> PatternHistory:
        history = PatternHistory(capacity=max(n, 1))
        for program, seconds in history_programs[:n]:
            history.add(summarize_program(program, seconds), program.app, program.program_id)
        return history

    full = build(history_size)
    abs_err, rel_err, times = _match_all(full, test)
    uniform = UniformStageShare()
    uni_abs: dict[int, list[float]] = {}
    for program, seconds in test:
        truth = true_shares(seconds)
        for s in range(len(program.stages)):
            uni_abs.setdefault(s, []).append(abs(uniform.stage_share(program, s) - truth[s]))
    by_size = {}
    for n in sorted({50, 100, 200, history_size}):
        if n <= history_size:
            _, rel, _ = _match_all(build(n), test)
            by_size[str(n)] = round(float(np.mean([e for errs in rel.values() for e in errs])), 4)
    from jitserve.analyzer.state import graph_size_bytes

    sizes = [graph_size_bytes(entry.stages, entry.app) for entry in full.entries]
    return {
        "history_size": len(full),
        "match_p99_ms": _percentiles(times)["p99"],
        "match_ms": _percentiles(times),
        "share_error_by_known_stages": {
            str(s): {"mean_abs": round(float(np.mean(abs_err[s])), 4),
                     "mean_rel": round(float(np.mean(rel_err[s])), 4),
                     "uniform_mean_abs": round(float(np.mean(uni_abs[s])), 4),
                     "n": len(abs_err[s])}
            for s in sorted(abs_err)
        },
        "mean_rel_error_by_history_size": by_size,
        "stored_graph_bytes": {"max": max(sizes), "mean": round(float(np.mean(sizes)), 1)},
    }


def _plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for view in ("text", "meta"):
        ratios = result["length"][view]["ratio_by_generated"]
        left.plot([int(g) for g in ratios], list(ratios.values()), marker="o", label=f"{view} view")
    left.axhline(1.0, color="red", linewidth=1)
    left.set_xlabel("generated tokens")
    left.set_ylabel("median bound / true length")
    left.set_title(f"QRF bound refinement (q={result['quantile']})")
    left.legend()
    curve = result["matching"]["share_error_by_known_stages"]
    stages = [int(s) for s in curve]
    right.plot(stages, [v["mean_rel"] for v in curve.values()], marker="o",
               label="pattern match (rel)")
    right.plot(stages, [v["mean_abs"] for v in curve.values()], marker="s",
               label="pattern match (abs)")
    right.plot(stages, [v["uniform_mean_abs"] for v in curve.values()], marker="x",
               linestyle="--", label="uniform split (abs)")
    right.set_xlabel("stages already finished")
    right.set_ylabel("error of phi(s)")
    right.set_title(f"stage share, {result['matching']['history_size']} graphs")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def evaluate(out_dir: Path, *, quantile: float = 0.95, seed: int = 0, train_size: int = 12_000,
             test_size: int = 4000, batch1_calls: int = 1000, batch64_calls: int = 200,
             history_size: int = 500, test_programs: int = 300,
             log: Callable[[str], None] = print) -> dict[str, Any]:
    out_dir.mkdir(parents=True, exist_ok=True)
    log(f"training on {train_size} synthetic prompts (seed {seed})")
    t0 = time.perf_counter()
    model = train_model(length_corpus(train_size, seed), seed=seed)
    train_s = time.perf_counter() - t0
    test = length_corpus(test_size, seed + 1000)
    log(f"evaluating on {test_size} held-out prompts (seed {seed + 1000})")
    length = {"text": length_accuracy(model, test, quantile, True),
              "meta": length_accuracy(model, test, quantile, False)}
    log("timing PredictBound over loopback gRPC")
    load_before = os.getloadavg()[0]
    latency = grpc_latency(model, test, quantile, batch1_calls, batch64_calls)
    log(f"matching against {history_size} pattern graphs")
    match = matching(history_size, test_programs, seed)
    result: dict[str, Any] = {
        "synthetic_corpus": True,
        "machine": {"cpus": os.cpu_count(),
                    "load_average_1m_before_latency": round(load_before, 2),
                    "load_average_1m_after_latency": round(os.getloadavg()[0], 2)},
        "quantile": quantile,
        "train_rows": train_size,
        "train_seconds": round(train_s, 2),
        "coverage": length["text"]["coverage"],
        "coverage_meta_only": length["meta"]["coverage"],
        "ratio_by_generated": length["text"]["ratio_by_generated"],
        "ratio_by_generated_meta_only": length["meta"]["ratio_by_generated"],
        "predict_p99_ms": {"batch1": latency["batch1"]["p99"],
                           "batch64": latency["batch64"]["p99"]},
        "match_p99_ms": match["match_p99_ms"],
        "share_error_curve": {s: v["mean_rel"]
                              for s, v in match["share_error_by_known_stages"].items()},
        "length": length,
        "latency": latency,
        "matching": match,
    }
    (out_dir / "analyzer.json").write_text(json.dumps(result, indent=2) + "\n")
    _plot(result, out_dir / "analyzer.png")
    return result


def summary(result: dict[str, Any]) -> str:
    lines = [
        f"coverage at q={result['quantile']}: {result['coverage']} "
        f"(prompt length/app/model only: {result['coverage_meta_only']})",
        "median bound/true by generated tokens: "
        + ", ".join(f"{g}: {r}" for g, r in result["ratio_by_generated"].items()),
        f"PredictBound p99 over loopback gRPC: batch 1 {result['predict_p99_ms']['batch1']} ms, "
        f"batch 64 {result['predict_p99_ms']['batch64']} ms "
        f"(load average {result['machine']['load_average_1m_before_latency']} on "
        f"{result['machine']['cpus']} CPUs)",
        f"matching p99 with {result['matching']['history_size']} graphs: "
        f"{result['match_p99_ms']} ms",
        "stage-share relative error by finished stages: "
        + ", ".join(f"{s}: {e}" for s, e in result["share_error_curve"].items()),
    ]
    return "\n".join(lines)
