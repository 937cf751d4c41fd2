"""The real ``jitserve analyzer serve`` process: restart keeps the model and the history.
Also the CLI's ``eval`` and the stubs' freshness."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import grpc
import pytest

from jitserve.analyzer.client import make_stub, match_pb, record_pb
from jitserve.analyzer.corpus import length_corpus, program_corpus
from jitserve.analyzer.evaluate import ServerProcess
from jitserve.analyzer.proto import analyzer_pb2 as pb
from jitserve.cli import main

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 10.0
FAST = ("--corpus-size", "1500", "--retrain-min-new", "60", "--retrain-interval", "0",
        "--checkpoint-interval", "0.2")


def _snapshot(stub: Any) -> tuple[Any, list[int], float]:
    records = length_corpus(12, 31)
    queries = [pb.LengthQuery(request_id=f"s{i}", prompt_tokens=r.prompt_tokens, app=r.app,
                              model=r.model, prompt_text=r.prompt_text if i % 2 else "")
               for i, r in enumerate(records)]
    bounds = [b.bound for b in stub.PredictBound(pb.PredictRequest(queries=queries),
                                                 timeout=TIMEOUT).bounds]
    program, _ = program_corpus(1, 32)[0]
    share = stub.MatchProgram(match_pb(program, 1), timeout=TIMEOUT).share
    return stub.Stats(pb.StatsRequest(), timeout=TIMEOUT), bounds, share


def test_restart_keeps_history_and_model(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path, *FAST)
    try:
        server.wait_serving()
        with grpc.insecure_channel(server.target) as channel:
            stub = make_stub(channel)
            for program, seconds in program_corpus(25, 33):
                stub.RecordProgram(record_pb(program, seconds), timeout=TIMEOUT)
            completions = [pb.Completion(query=pb.LengthQuery(request_id=f"o{i}",
                                                              prompt_tokens=100 + i, app="batch"),
                                         output_tokens=900 + i) for i in range(80)]
            stub.ObserveCompletion(pb.ObserveRequest(completions=completions), timeout=TIMEOUT)
            deadline = time.monotonic() + 60
            while stub.Stats(pb.StatsRequest(), timeout=TIMEOUT).retrains < 1:
                assert time.monotonic() < deadline, "".join(server.output)
                time.sleep(0.1)
            before, bounds, share = _snapshot(stub)
    finally:
        assert server.stop() == 0, "".join(server.output)
    assert before.model_version == 2 and before.history_size == 25 and before.buffered == 80
    assert "checkpointed" in "".join(server.output)

    again = ServerProcess(tmp_path, *FAST)
    try:
        again.wait_serving()
        with grpc.insecure_channel(again.target) as channel:
            after, bounds_after, share_after = _snapshot(make_stub(channel))
    finally:
        assert again.stop() == 0
    log = "".join(again.output)
    assert "restored length model v2" in log and "restored 25 pattern graphs" in log
    assert (after.model_version, after.history_size, after.buffered, after.observed_total) == \
        (before.model_version, before.history_size, before.buffered, before.observed_total)
    assert bounds_after == bounds
    assert share_after == pytest.approx(share, abs=1e-3)  # stage times are stored in ms


class TrailingReader(ServerProcess):
    """Its output reader runs a second after the process exited: a thread a busy machine
    did not schedule (the injected fault, not a wait for anything)."""

    def _drain(self) -> None:
        self.process.wait()
        time.sleep(1.0)
        super()._drain()


def test_stop_returns_with_every_line_the_process_wrote(tmp_path: Path) -> None:
    """stop() waits for the reader: the shutdown's last line is in the output (before, it
    returned at the exit, and a restart test found no "checkpointed" line)."""
    server = TrailingReader(tmp_path, *FAST)
    assert server.stop() == 0, "".join(server.output)
    assert "analyzer stopped; state checkpointed" in "".join(server.output)


def test_eval_writes_the_acceptance_figures(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            ) -> None:
    out = tmp_path / "eval"
    assert main(["analyzer", "eval", "--out", str(out), "--train-size", "1500",
                 "--test-size", "400", "--batch1-calls", "30", "--batch64-calls", "5",
                 "--history-size", "60"]) == 0
    result = json.loads((out / "analyzer.json").read_text())
    assert 0.85 < result["coverage"] <= 1.0
    assert set(result["ratio_by_generated"]) >= {"0", "50", "100", "200"}
    assert set(result["predict_p99_ms"]) == {"batch1", "batch64"}
    assert result["predict_p99_ms"]["batch1"] > 0 and result["match_p99_ms"] > 0
    assert result["share_error_curve"]["0"] > result["share_error_curve"]["2"]
    assert result["synthetic_corpus"] is True
    assert (out / "analyzer.png").stat().st_size > 1000
    assert "coverage at q=0.95" in capsys.readouterr().out


def test_cli_errors_are_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["analyzer", "eval", "--out", str(tmp_path), "--quantile", "1.5"]) == 2
    assert "--quantile must be in (0, 1)" in capsys.readouterr().err
    assert main(["analyzer", "serve", "--port", "70000"]) == 2
    assert "--port" in capsys.readouterr().err


def _normalise(text: str) -> str:
    text = re.sub(r"Protobuf Python Version: \S+", "", text)
    text = re.sub(r"ValidateProtobufRuntimeVersion\([^)]*\)", "", text, flags=re.S)
    return re.sub(r"GRPC_GENERATED_VERSION = '[^']*'", "", text)


def test_generated_stubs_are_current(tmp_path: Path) -> None:
    subprocess.run(["bash", str(ROOT / "scripts" / "gen-proto.sh"), str(tmp_path)], check=True,
                   capture_output=True, timeout=120)
    proto = "jitserve/analyzer/proto"
    for name in ("analyzer_pb2.py", "analyzer_pb2.pyi", "analyzer_pb2_grpc.py"):
        fresh = (tmp_path / proto / name).read_text()
        checked_in = (ROOT / "src" / proto / name).read_text()
        assert _normalise(fresh) == _normalise(checked_in), (
            f"{name} is stale: run scripts/gen-proto.sh")
