"""``jitserve bench`` across replicas: placements side by side, heterogeneous speeds,
and clear errors (exit 2) for bad fleet flags."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jitserve.cli import main


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--replicas", "3", "--replica-speeds", "1,1"], "2 speed(s) for --replicas 3"),
        (["--replicas", "2", "--replica-speeds", "1,0"], "speeds must be > 0"),
        (["--replicas", "2", "--replica-speeds", "1,-0.5"], "speeds must be > 0"),
        (["--replicas", "2", "--replica-speeds", "1,fast"], "--replica-speeds: expected"),
        (["--replicas", "2", "--placement", "nope"], "unknown placement 'nope'"),
        (["--replicas", "2", "--placement", "power-of-k:0"], "K in 'power-of-k:0'"),
        (["--replicas", "2", "--placement", "power-of-k-late:x"], "K in 'power-of-k-late:x'"),
        (["--replicas", "2", "--placement", "round-robin:2"], "unknown placement"),
        (["--replicas", "2", "--report-period", "0"], "--report-period must be > 0"),
        (["--replicas", "0"], "--replicas must be >= 1"),
    ],
)
def test_bad_fleet_flags_exit_2_with_a_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    code = main(["bench", "--duration", "10", "--jobs", "1", "--out", str(tmp_path), *args])
    assert code == 2
    assert message in capsys.readouterr().err


def test_placements_side_by_side_on_heterogeneous_replicas(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "fleet"
    code = main([
        "bench", "--duration", "20", "--load", "1.0", "--policies", "gmax", "--seeds", "1",
        "--jobs", "1", "--replicas", "3", "--replica-speeds", "1,1,0.5",
        "--placement", "power-of-k,round-robin,power-of-k:2,power-of-k-late", "--out", str(out),
    ])  # fmt: skip
    assert code == 0
    printed = capsys.readouterr().out
    assert "placement / best other" in printed and "3 replicas, speeds 1,1,0.5" in printed
    assert "| power-of-k-late |" in printed
    results = json.loads((out / "results.json").read_text())
    runs = {r["policy"]: r for r in results["runs"]}
    assert set(runs) == {"power-of-k", "round-robin", "power-of-k:2", "power-of-k-late"}
    for run in runs.values():
        assert run["scheduler"] == "gmax" and run["replica_speeds"] == [1.0, 1.0, 0.5]
        assert len(run["placed"]) == 3 and run["refused"] == 0
    # the same arrivals for every placement, each scored once
    assert len({sum(r["placed"]) for p, r in runs.items() if p != "power-of-k-late"}) == 1
    assert len({r["requests"] for r in runs.values()}) == 1
    assert runs["power-of-k-late"]["withdrawn"] > 0
    rr = runs["round-robin"]["placed"]
    assert max(rr) - min(rr) <= 1
    assert results["meta"]["replica_speeds"] == [1.0, 1.0, 0.5]
