"""Each simulated run as ``vllm bench serve --save-result`` writes a run (owner: bench).

Users already parse vLLM's result files; ``jitserve bench`` writes one per simulated run
(scenario x policy x load x seed) under ``OUT/runs/``, with vLLM's key names where the
simulator measures the same thing (``request_goodput``, ``output_throughput``,
``total_token_throughput``, ``median_/p99_ttft_ms``, ``_itl_ms`` (time between tokens),
``_e2el_ms``, ``duration``, ``num_prompts``), and the rest under ``jitserve`` (token
goodput, attainment by kind, preemptions, retirements). What a run has no value for (the
upper bound's latencies) is null.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


def _ms(seconds: float) -> float | None:
    return None if math.isnan(seconds) else round(seconds * 1e3, 3)


def _clean(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    return value


def vllm_shaped(row: dict[str, Any], meta: dict[str, Any], date: str) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "date": date,
        "backend": "jitserve-simulator",
        "model_id": meta.get("profile"),
        "num_prompts": row.get("requests"),
        "duration": row.get("sim_end_s"),
        "request_goodput": row["request_goodput"],
        "output_throughput": row.get("output_tokens_per_s"),
        "total_token_throughput": row.get("throughput_tokens_per_s"),
    }
    for ours, theirs in (("ttft_s", "ttft"), ("tbt_s", "itl"), ("e2el_s", "e2el")):
        doc[f"median_{theirs}_ms"] = _ms(row[ours]["p50"])
        doc[f"p99_{theirs}_ms"] = _ms(row[ours]["p99"])
    doc["jitserve"] = _clean({
        "scenario": row.get("scenario", ""), "policy": row["policy"], "load": row["load"],
        "seed": row.get("seed"), "token_goodput": row["token_goodput"],
        "attainment": row["attainment"], "preemptions": row.get("preemptions"),
        "retired": row.get("retired"),
    })
    return {k: _clean(v) for k, v in doc.items()}


def write_runs(out: Path, rows: list[dict[str, Any]], meta: dict[str, Any]) -> Path:
    """One JSON file per run in ``out/runs``; returns that folder."""
    folder = out / "runs"
    folder.mkdir(parents=True, exist_ok=True)
    date = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    for row in rows:
        scenario = f"{row['scenario']}-" if row.get("scenario") else ""
        name = f"{scenario}{row['policy']}-{row['load']:g}x-seed{row.get('seed', 0)}.json"
        (folder / name.replace("/", "_")).write_text(json.dumps(vllm_shaped(row, meta, date),
                                                                indent=2))
    return folder
