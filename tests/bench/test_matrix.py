"""The scenario matrix, tenant demand, engine-limit flags and the ratio report."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import pytest

from jitserve.bench import matrix, report
from jitserve.cli import main
from jitserve.policy import SLOPolicySpec
from jitserve.sim.workload import WorkloadSpec, generate, parse_tenant_mix


def test_tenant_mix_skews_demand() -> None:
    tenants, demand = parse_tenant_mix("a=3,b=1,c=1")
    assert tenants == ("a", "b", "c") and demand == pytest.approx((0.6, 0.2, 0.2))
    spec = WorkloadSpec(duration_s=600, seed=2, tenants=tenants, tenant_demand=demand)
    counts = Counter(item.tenant for item in generate(spec))
    total = sum(counts.values())
    assert counts["a"] / total == pytest.approx(0.6, abs=0.05)
    assert counts["b"] / total == pytest.approx(0.2, abs=0.05)


@pytest.mark.parametrize("text", ["a=3,b", "a=x", "a=1,a=2", "a=0,b=0", "=1"])
def test_bad_tenant_mix_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="--tenant-mix"):
        parse_tenant_mix(text)


def test_ratios_use_the_best_baseline_per_metric_and_the_bound() -> None:
    def entry(policy: str, tokens: float, requests: float) -> dict[str, object]:
        return {
            "scenario": "s",
            "load": 1.0,
            "policy": policy,
            "token_goodput": tokens,
            "request_goodput": requests,
        }

    summary = [
        entry("gmax", 90.0, 3.0),
        entry("edf-ac", 100.0, 2.0),
        entry("sjf-ac", 60.0, 2.5),
        entry("edf", 200.0, 9.0),  # raw baselines do not count once -ac ones exist
        entry("upper-bound", 120.0, 4.0),
    ]
    (row,) = report.ratios(summary)
    assert row["baselines"] == "best -ac baseline"
    assert row["token_goodput_vs_baseline"] == pytest.approx(0.9)
    assert row["token_goodput_best_baseline"] == "edf-ac"
    assert row["request_goodput_vs_baseline"] == pytest.approx(1.2)
    assert row["request_goodput_best_baseline"] == "sjf-ac"
    assert row["token_goodput_vs_bound"] == pytest.approx(0.75)
    assert "| s | 1.00 | 0.900 (edf-ac) | 1.200 (sjf-ac) | 0.750 | 0.750 |" in (
        report.ratios_markdown(summary)
    )


def test_bench_reports_the_bound_and_honours_engine_limits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bench"
    argv = [
        "bench",
        "--duration",
        "30",
        "--load",
        "1.5",
        "--policies",
        "gmax,sarathi,upper-bound",
        "--seeds",
        "1",
        "--jobs",
        "1",
        "--budget",
        "512",
        "--max-num-seqs",
        "64",
        "--tenant-mix",
        "a=3,b=1,c=1",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "budget 512, 64 sequences" in printed and "GMAX / upper-bound" in printed
    results = json.loads((out / "results.json").read_text())
    assert results["meta"]["chunk_token_budget"] == 512
    rows = {r["policy"]: r for r in results["runs"]}
    assert rows["upper-bound"]["token_goodput"] >= rows["gmax"]["token_goodput"]
    assert rows["upper-bound"]["request_goodput"] >= rows["gmax"]["request_goodput"]
    assert math.isnan(rows["upper-bound"]["tbt_s"]["p99"])
    assert set(rows["gmax"]["goodput_tokens_by_tenant"]) <= {"a", "b", "c"}


def test_bench_rejects_bad_engine_limits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "--budget", "0", "--jobs", "1", "--out", str(tmp_path)]) == 2
    assert "--budget" in capsys.readouterr().err


def test_matrix_writes_table_json_and_heatmap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(matrix, "LOADS", (1.0,))
    monkeypatch.setattr(matrix, "DURATION_S", 20.0)
    monkeypatch.setattr(matrix, "SEEDS", (1,))
    monkeypatch.setattr(
        matrix,
        "scenarios",
        lambda: [
            matrix.Scenario("azure-conv", "1:1:1", 2048),
            matrix.Scenario("azure-conv", "1:1:1", 512, "a=3,b=1,c=1"),
        ],
    )
    monkeypatch.setattr(matrix, "matrix_policies", lambda: ["gmax", "edf", "upper-bound"])
    assert matrix.main(SLOPolicySpec(), tmp_path, 1, "a100-llama3-8b") == 0
    document = json.loads((tmp_path / "matrix.json").read_text())
    assert {r["scenario"] for r in document["ratios"]} == {
        "azure-conv 1:1:1 B2048",
        "azure-conv 1:1:1 B512 tenants a=3,b=1,c=1",
    }
    assert all(r["token_goodput_vs_bound"] <= 1.0 for r in document["ratios"])
    shares = document["tenant_shares"]
    assert {s["tenant"] for s in shares} == {"a", "b", "c"}
    assert {s["policy"] for s in shares} <= {"gmax", "edf"} and "gmax" in {
        s["policy"] for s in shares
    }
    assert all(s["entitlement"] == pytest.approx(1 / 3) for s in shares)
    text = (tmp_path / "matrix.md").read_text()
    assert "GMAX / best baseline" in text and "goodput share" in text
    assert (tmp_path / "matrix_heatmap.png").stat().st_size > 1000
