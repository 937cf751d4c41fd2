"""The scenario matrix, tenant demand, engine-limit flags and the ratio report."""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from jitserve.bench import matrix, report
from jitserve.cli import main
from jitserve.policy import SLOPolicySpec
from jitserve.sim.workload import WorkloadSpec, generate, parse_tenant_mix, window_offset


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


@pytest.mark.parametrize("flag", ["--budget", "--engine-queue"])
def test_bench_rejects_bad_engine_limits(
    flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = "0" if flag == "--budget" else "-1"
    assert main(["bench", flag, bad, "--jobs", "1", "--out", str(tmp_path)]) == 2
    assert flag in capsys.readouterr().err


def test_matrix_writes_table_json_and_heatmap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(
        matrix,
        "scenarios",
        lambda split: [
            matrix.Scenario("azure-conv", "1:1:1", 2048),
            matrix.Scenario("azure-conv", "1:1:1", 512, "a=3,b=1,c=1"),
        ],
    )
    monkeypatch.setattr(
        matrix, "matrix_policies", lambda bound=True: ["gmax", "edf-ac", "upper-bound"]
    )
    size = matrix.MatrixSize(duration_s=20.0, loads=(1.0,), seeds=(1,))
    assert matrix.main(SLOPolicySpec(), tmp_path, 1, "a100-llama3-8b", size) == 0
    document = json.loads((tmp_path / "matrix.json").read_text())
    for objective in ("tokens", "requests"):
        assert {r["scenario"] for r in document["ratios"][objective]} == {
            "azure-conv 1:1:1 B2048",
            "azure-conv 1:1:1 B512 tenants a=3,b=1,c=1",
        }
    assert {r["objective"] for r in document["runs"]} == {"tokens", "requests"}
    assert all(r["token_goodput_vs_bound"] <= 1.0 for r in document["ratios"]["tokens"])
    gaps = document["attainment_vs_edf_ac"]
    kinds = {"latency", "deadline", "compound"}
    assert len(gaps) == 2 and all(set(g["gaps"]) <= kinds for g in gaps)
    assert document["acceptance"]["overload_cells"] == 2
    shares = document["tenant_shares"]
    assert {s["tenant"] for s in shares} == {"a", "b", "c"}
    assert {s["policy"] for s in shares} <= {"gmax", "edf-ac"} and "gmax" in {
        s["policy"] for s in shares
    }
    assert all(s["entitlement"] == pytest.approx(1 / 3) for s in shares)
    text = (tmp_path / "matrix.md").read_text()
    assert "GMAX / best -ac" in text and "goodput share" in text and "worst kind" in text
    assert (tmp_path / "matrix_heatmap.png").stat().st_size > 1000


def test_matrix_splits_keep_validation_apart_and_sample_three_windows() -> None:
    report_size, validation = matrix.MatrixSize(), matrix.MatrixSize(split="validation")
    assert len(report_size.windows) >= 3 and len(validation.windows) >= 3
    assert not set(report_size.windows) & set(validation.windows)
    spec = SLOPolicySpec()
    offsets = {
        window_offset(replace(matrix.scenarios()[0].workload(spec), seed=seed))
        for seed in report_size.windows
    }
    assert len(offsets) == len(report_size.windows)
    assert matrix.scenarios("validation") and matrix.scenarios("report")
