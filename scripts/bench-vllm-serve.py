#!/usr/bin/env python3
"""vLLM's own serving benchmark against the sidecar and against the bare vLLM, alternately.

Runs the load generator vLLM users compare servers with (``vllm.benchmarks.serve``, the
code behind ``vllm bench serve``) in this process, once per run, alternating the sidecar
(A) and the vLLM behind it (B) for ``--rounds`` rounds at each ``--rates`` arrival rate
(A then B in odd rounds, B then A in even ones), and collects its JSON results into one
table (Markdown + JSON): request throughput,
output throughput, vLLM's request goodput (``--goodput ttft:MS tpot:MS``), TTFT/TPOT
percentiles, refusals by status (429/503) and the client's own warnings. It must run
with the interpreter that has vLLM (the CPU build's venv); it needs nothing from
jitserve:

    ~/.cache/jitserve/vllm-venv/bin/python scripts/bench-vllm-serve.py \\
        --sidecar http://127.0.0.1:8080 --bare http://127.0.0.1:8000 \\
        --rates 14,30,40 --rounds 2 --duration 30 --slo-headers --out bench-out/vllm-serve

``--capacity`` first measures the bare engine's capacity (all prompts at once, completed
requests per second) and, with ``--loads 0.7,1.5,2``, takes the rates from it.

Fleets (several engines behind a front): ``--target NAME=URL`` names each front to
compare (the jitserve gateway, vllm-router with each policy, in front of the sidecars or
of the bare engines), ``--engine URL`` each engine behind them (waited idle on between
runs), ``--baseline NAME`` the front the ratios are against, ``--capacity-target NAME``
the front capacity is measured through; with ``--target`` the bare vLLM is no target of
its own (``scripts/bench-fleet.py`` starts such a fleet and runs this).

Every run gets its own ``--seed`` (base + run index): the random dataset's prompts repeat
for a given seed, and vLLM's prefix cache would serve a repeated prompt without prefill,
favouring whichever target runs second. Between runs the script waits until neither the
sidecar nor vLLM holds a request. The ``vllm`` console script does not work with the CPU
wheel (no distribution metadata), hence the in-process call.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import re
import statistics
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, NoReturn

DEFAULT_TOKENIZER = Path.home() / ".cache" / "jitserve" / "models" / "tiny-llama"


def fail(message: str) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def get(url: str, timeout: float = 10.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode(errors="replace")
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace")
    except (urllib.error.URLError, OSError) as err:
        return 0, str(err)


def gauge(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name):len(name) + 1] in ("{", " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def busy(sidecar: str | None, engines: list[str]) -> bool:
    for engine in engines:
        status, text = get(engine + "/metrics")
        if status != 200:
            return True
        if gauge(text, "vllm:num_requests_running") + gauge(text, "vllm:num_requests_waiting"):
            return True
    if sidecar:
        status, text = get(sidecar + "/debug/scheduler")
        if status == 404:  # served on the sidecar's admin port: vLLM's view counts
            return False
        if status != 200:
            return True
        state = json.loads(text)
        return bool(state.get("running") or state.get("waiting"))
    return False


def wait_idle(sidecar: str | None, engines: list[str], timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while busy(sidecar, engines):
        if time.monotonic() > deadline:
            fail(f"the sidecar or vLLM still holds requests after {timeout_s:.0f} s")
        time.sleep(0.5)


def scheduler_state(sidecar: str) -> dict[str, Any]:
    status, text = get(sidecar + "/debug/scheduler")
    doc: dict[str, Any] = json.loads(text) if status == 200 else {}
    return doc


def run_client(argv: list[str], log_path: Path) -> tuple[dict[str, Any], list[str]]:
    """One run of vLLM's serving benchmark; its output goes to ``log_path``. Returns its
    result document and the warning lines it printed."""
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    args = parser.parse_args(argv)
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
        result: dict[str, Any] = main(args)
    text = buffer.getvalue()
    log_path.write_text(" ".join(argv) + "\n\n" + text)
    warnings = sorted({line.strip() for line in text.splitlines()
                       if re.search(r"\bWARNING\b|\bwarn", line, re.IGNORECASE)})
    return result, warnings


def client_argv(base_url: str, args: argparse.Namespace, rate: float, num_prompts: int,
                seed: int, headers: list[str]) -> list[str]:
    # --model: the served name, so that the client's /tokenize calls name a served model
    # (unset, it sends the model's root path, which vLLM answers with 404)
    argv = [
        "--backend", "openai-chat", "--base-url", base_url, "--model", args.model,
        "--endpoint", "/v1/chat/completions", "--tokenizer", str(args.tokenizer),
        "--dataset-name", "random", "--random-input-len", str(args.input_len),
        "--random-output-len", str(args.output_len), "--num-prompts", str(num_prompts),
        "--request-rate", "inf" if math.isinf(rate) else f"{rate:g}",
        "--goodput", *args.goodput.split(), "--percentile-metrics", "ttft,tpot,itl,e2el",
        "--metric-percentiles", "50,90,99", "--temperature", "0", "--seed", str(seed),
        "--save-detailed", "--disable-tqdm", "--ready-check-timeout-sec", "60",
    ]
    if headers:
        argv += ["--header", *headers]  # nargs="*": one flag, or only the last one counts
    return argv


def summarize_run(result: dict[str, Any]) -> dict[str, Any]:
    errors = [e for e in result.get("errors") or [] if e]
    by_reason: dict[str, int] = {}
    for error in errors:
        reason = error.strip().splitlines()[-1][:80] if error.strip() else "?"
        by_reason[reason] = by_reason.get(reason, 0) + 1
    keys = ("duration", "completed", "failed", "request_throughput", "request_goodput",
            "output_throughput", "total_token_throughput", "median_ttft_ms", "p90_ttft_ms",
            "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms", "median_itl_ms", "p99_itl_ms",
            "median_e2el_ms", "p99_e2el_ms", "max_concurrent_requests")
    out = {k: result.get(k) for k in keys}
    out["refused_429"] = by_reason.get("Too Many Requests", 0)
    out["refused_503"] = by_reason.get("Service Unavailable", 0)
    out["errors_by_reason"] = by_reason
    return out


def measure_capacity(args: argparse.Namespace, url: str, out: Path) -> float:
    wait_idle(None, args.engine)
    num = args.capacity_prompts
    print(f"capacity: {num} prompts at once through {url} ...", flush=True)
    result, _ = run_client(client_argv(url, args, math.inf, num, args.seed + 999, []),
                           out / "capacity.log")
    run = summarize_run(result)
    capacity = float(run["request_throughput"])
    print(f"capacity: {capacity:.2f} req/s ({run['completed']} completed in "
          f"{run['duration']:.1f} s, {run['output_throughput']:.0f} output tok/s, load "
          f"{os.getloadavg()[0]:.1f})", flush=True)
    (out / "capacity.json").write_text(json.dumps({"capacity_req_per_s": capacity, **run},
                                                  indent=2))
    return capacity


def fmt(value: Any, spec: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, spec)


def markdown(rows: list[dict[str, Any]], fronts: list[str], baseline: str) -> str:
    head = ("| rate (req/s) | run | target | SLO headers | throughput (req/s) | output (tok/s) "
            "| goodput (req/s) | TTFT p50 / p99 (ms) | TPOT p50 / p99 (ms) | completed / failed "
            "| 429 / 503 | dispatch gap p50 / p99 (ms) | load avg |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        gap = r.get("dispatch_gap_ms") or {}
        lines.append(
            f"| {r['rate']:g} | {r['round']} | {r['target']} | {'yes' if r['headers'] else 'no'} "
            f"| {fmt(r['request_throughput'], '.2f')} | {fmt(r['output_throughput'], '.0f')} "
            f"| {fmt(r['request_goodput'], '.2f')} "
            f"| {fmt(r['median_ttft_ms'], '.0f')} / {fmt(r['p99_ttft_ms'], '.0f')} "
            f"| {fmt(r['median_tpot_ms'], '.0f')} / {fmt(r['p99_tpot_ms'], '.0f')} "
            f"| {r['completed']} / {r['failed']} | {r['refused_429']} / {r['refused_503']} "
            f"| {fmt(gap.get('p50'), '.1f')} / {fmt(gap.get('p99'), '.1f')} "
            f"| {r['load_start']:.1f}-{r['load_end']:.1f} |")
    lines.append("")
    for rate in sorted({r["rate"] for r in rows}):
        group = [r for r in rows if r["rate"] == rate]
        means = {}
        for target in [*fronts, baseline]:
            mine = [r for r in group if r["target"] == target]
            if mine:
                means[target] = {k: statistics.median(r[k] or 0.0 for r in mine)
                                 for k in ("request_throughput", "output_throughput",
                                           "request_goodput")}
        for name in fronts:
            if name not in means or baseline not in means:
                continue
            base = means[baseline]
            ratio = {k: means[name][k] / base[k] if base[k] else math.inf for k in base}
            lines.append(
                f"- {rate:g} req/s, medians of the rounds: {name} / {baseline} throughput "
                f"{ratio['request_throughput']:.2f}x (output tokens "
                f"{ratio['output_throughput']:.2f}x), request goodput "
                f"{ratio['request_goodput']:.2f}x")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--sidecar", action="append", metavar="[NAME=]URL",
                   help="the jitserve endpoint (default http://127.0.0.1:8080); repeat with "
                   "NAME=URL to compare several sidecars (e.g. settings) with the same vLLM")
    p.add_argument("--bare", default="http://127.0.0.1:8000", help="the vLLM behind it")
    p.add_argument("--target", action="append", default=[], metavar="NAME=URL",
                   help="a front to compare (repeat); with it the bare vLLM is no target")
    p.add_argument("--engine", action="append", default=[], metavar="URL",
                   help="an engine behind the fronts, waited idle on (repeat; default --bare)")
    p.add_argument("--baseline", help="the target ratios are against (default: the bare "
                   "vLLM, or the last --target)")
    p.add_argument("--capacity-target", metavar="NAME",
                   help="measure capacity through this target (default: the bare vLLM)")
    p.add_argument("--rates", help="comma-separated arrival rates (req/s)")
    p.add_argument("--loads", help="comma-separated loads x measured capacity (with --capacity)")
    p.add_argument("--capacity", action="store_true",
                   help="first measure the bare engine's capacity (all prompts at once)")
    p.add_argument("--capacity-prompts", type=int, default=400)
    p.add_argument("--rounds", type=int, default=2, help="A/B rounds per rate")
    p.add_argument("--duration", type=float, default=30.0,
                   help="seconds of arrivals per run (num prompts = rate x duration)")
    p.add_argument("--input-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--goodput", default="ttft:2000 tpot:100")
    p.add_argument("--slo-headers", action="store_true",
                   help="send x-slo-ttft-ms / x-slo-tpot-ms from --goodput (to both targets: "
                   "vLLM ignores unknown headers)")
    p.add_argument("--tokenizer", type=Path, default=DEFAULT_TOKENIZER)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", type=Path, default=Path("bench-out/vllm-serve"))
    args = p.parse_args()
    try:
        import vllm.benchmarks.serve  # noqa: F401
    except ImportError as err:
        fail(f"run this with the interpreter that has vLLM (e.g. "
             f"~/.cache/jitserve/vllm-venv/bin/python): {err}")
    sidecars: list[tuple[str, str]] = []
    for item in args.sidecar or ([] if args.target else ["http://127.0.0.1:8080"]):
        name, sep, url = item.partition("=")
        sidecars.append((name, url.rstrip("/")) if sep else ("jitserve", item.rstrip("/")))
    fronts: list[tuple[str, str]] = []
    for item in args.target:
        name, sep, url = item.partition("=")
        if not sep or not name or not url:
            fail(f"--target {item!r}: give it as NAME=URL")
        fronts.append((name, url.rstrip("/")))
    names = [name for name, _ in [*sidecars, *fronts]]
    if len(set(names)) < len(names) or "vllm" in names:
        fail("--sidecar/--target: give each its own NAME (not 'vllm'): NAME=URL")
    args.bare = args.bare.rstrip("/")
    args.engine = [u.rstrip("/") for u in args.engine] or [args.bare]
    targets = [*sidecars, *fronts] + ([] if fronts else [("vllm", args.bare)])
    baseline = args.baseline or targets[-1][0]
    if baseline not in dict(targets):
        fail(f"--baseline {baseline!r} is not a target ({', '.join(dict(targets))})")
    capacity_url = args.bare
    if args.capacity_target:
        if args.capacity_target not in dict(targets):
            fail(f"--capacity-target {args.capacity_target!r} is not a target")
        capacity_url = dict(targets)[args.capacity_target]
    checks = [(f"--sidecar {n}", u) for n, u in sidecars]
    checks += [(f"--target {n}", u) for n, u in fronts]
    checks += [("--engine", u) for u in args.engine]
    for name, url in checks + ([] if fronts else [("--bare", args.bare)]):
        status, text = get(url + "/v1/models")
        if status != 200:
            fail(f"{name} {url} does not answer GET /v1/models ({status}: {text[:200]})")
        try:
            args.model = str(json.loads(text)["data"][0]["id"])
        except (ValueError, KeyError, IndexError, TypeError):
            fail(f"{name} {url}: /v1/models lists no model ({text[:200]})")
    if not args.tokenizer.exists():
        fail(f"--tokenizer {args.tokenizer}: no such folder (jitserve up makes the tiny model)")
    args.out.mkdir(parents=True, exist_ok=True)
    rates: list[float] = []
    capacity = measure_capacity(args, capacity_url, args.out) if args.capacity else None
    if args.rates:
        rates += [float(x) for x in args.rates.split(",") if x.strip()]
    if args.loads:
        if capacity is None:
            fail("--loads needs --capacity")
        rates += [round(float(x) * capacity, 1) for x in args.loads.split(",") if x.strip()]
    if not rates:
        return 0
    headers: list[str] = []
    if args.slo_headers:
        goals = dict(item.split(":") for item in args.goodput.split())
        if "ttft" in goals:
            headers.append(f"x-slo-ttft-ms={goals['ttft']}")
        if "tpot" in goals:
            headers.append(f"x-slo-tpot-ms={goals['tpot']}")
    rows: list[dict[str, Any]] = []
    for rate in rates:
        num = max(1, round(rate * args.duration))
        for round_ in range(1, args.rounds + 1):
            order = targets
            # the order flips every round: whatever drifts during a round hits both ends
            for target, url in order if round_ % 2 else order[::-1]:
                wait_idle(None, args.engine)
                for _, sidecar_url in sidecars:
                    wait_idle(sidecar_url, args.engine)
                time.sleep(2.0)
                seed = args.seed + len(rows)
                load_start = os.getloadavg()[0]
                print(f"rate {rate:g}, round {round_}: {target} {url} ({num} prompts, seed "
                      f"{seed}, load {load_start:.1f}) ...", flush=True)
                stem = f"run-{len(rows):02d}-{target}-{rate:g}"
                result, warnings = run_client(client_argv(url, args, rate, num, seed, headers),
                                              args.out / f"{stem}.log")
                detail = {k: result.get(k) for k in ("start_times", "ttfts", "latencies",
                                                     "output_lens", "errors")}
                (args.out / f"{stem}.json").write_text(json.dumps(detail))
                row = {"rate": rate, "round": round_, "target": target, "url": url,
                       "headers": bool(headers), "seed": seed, "num_prompts": num,
                       "load_start": load_start, "load_end": os.getloadavg()[0],
                       "client_warnings": warnings, **summarize_run(result)}
                if target in dict(sidecars):
                    state = scheduler_state(url)
                    for key in ("dispatch_gap_ms", "ttft_breakdown", "door"):
                        row[key] = state.get(key)
                rows.append(row)
                print(f"  {row['request_throughput']:.2f} req/s, goodput "
                      f"{fmt(row['request_goodput'], '.2f')} req/s, {row['completed']} done, "
                      f"429/503 {row['refused_429']}/{row['refused_503']}"
                      + (f"; client warnings: {warnings}" if warnings else ""), flush=True)
                (args.out / "results.json").write_text(json.dumps(
                    {"capacity_req_per_s": capacity, "runs": rows}, indent=2))
    table = markdown(rows, [name for name, _ in targets if name != baseline], baseline)
    (args.out / "results.md").write_text(table + "\n")
    print()
    print(table)
    print(f"\nwrote {args.out / 'results.json'} and {args.out / 'results.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
