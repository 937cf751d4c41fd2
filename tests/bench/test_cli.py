from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from jitserve.cli import main


def test_bench_writes_table_json_and_plots(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bench"
    code = main(
        [
            "bench",
            "--duration",
            "30",
            "--load",
            "1.0,1.5",
            "--policies",
            "gmax,fcfs",
            "--seeds",
            "1",
            "--jobs",
            "1",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "capacity:" in printed and "tok_gp/s" in printed and "gmax" in printed
    assert "tok_gp/s: token goodput, tokens/s" in printed  # the columns' legend and units
    assert "report.md" in printed
    saved = sorted((out / "runs").glob("*.json"))
    assert len(saved) == 4  # one per run, as vllm bench serve --save-result writes
    first = json.loads(saved[0].read_text())
    assert first["backend"] == "jitserve-simulator" and first["median_ttft_ms"] >= 0
    assert {"request_goodput", "output_throughput", "p99_itl_ms", "jitserve"} <= set(first)
    assert first["jitserve"]["policy"] in ("gmax", "fcfs")
    results = json.loads((out / "results.json").read_text())
    assert {(r["policy"], r["load"]) for r in results["runs"]} == {
        ("gmax", 1.0),
        ("gmax", 1.5),
        ("fcfs", 1.0),
        ("fcfs", 1.5),
    }
    run = results["runs"][0]
    for key in (
        "token_goodput",
        "request_goodput",
        "throughput_tokens_per_s",
        "preemptions",
        "sched_ms_p99",
    ):
        assert isinstance(run[key], float | int)
    assert set(run["attainment"]) >= {"latency", "deadline", "compound", "overall"}
    assert results["meta"]["capacity_items_per_s"] > 0
    assert (out / "goodput_vs_load.png").stat().st_size > 1000
    assert (out / "attainment_by_kind.png").stat().st_size > 1000


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--load", "abc"], "--load"),
        (["--load", "-1"], "--load"),
        (["--policies", "gmax,nope"], "unknown policy 'nope'"),
        (["--mix", "1:x:1"], "--mix"),
        (["--rate", "0"], "--rate"),
    ],
)
def test_bench_rejects_bad_input_with_a_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    code = main(["bench", "--duration", "10", "--jobs", "1", "--out", str(tmp_path), *args])
    assert code == 2
    assert message in capsys.readouterr().err


def test_bench_config_errors_name_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "policy.yaml"
    config.write_text("scheduler:\n  cutoff:\n    value: 3\n")
    assert main(["bench", "--config", str(config), "--out", str(tmp_path)]) == 2
    assert "scheduler.cutoff.value" in capsys.readouterr().err


def test_console_script_help_explains_load() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "jitserve.cli", "bench", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "capacity" in result.stdout and "--policies" in result.stdout
