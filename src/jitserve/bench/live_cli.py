"""``jitserve bench``'s live tools: ``--live URL`` (the workload against a running
endpoint, optionally against the bare vLLM too) and the deprecated ``--proxy-overhead``
(owner: bench). Their flags are registered here; the tools themselves need the sidecar
extra (aiohttp) and are imported only when run."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from jitserve.errors import CLIError

LIVE_POLICIES = "gmax,fcfs,sarathi,edf,lsf,sjf,plas"


def add_live_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--live",
        metavar="URL",
        help="replay the workload against a live endpoint (e.g. jitserve up) instead of the "
        "simulator; uses --duration, --rate (default 2/s), --mix, --trace and the first seed",
    )
    parser.add_argument(
        "--live-bare",
        metavar="BACKEND_URL",
        help="with --live: also replay the workload directly against this vLLM (the sidecar's "
        "backend), alternating sidecar / bare runs, and write one comparison table",
    )
    parser.add_argument("--live-rounds", type=int, default=2, help="with --live-bare: A/B rounds")
    parser.add_argument(
        "--live-slo",
        choices=("body", "headers", "none"),
        default="body",
        help="with --live: send each request's SLO as the body's slo object, as x-llm-d-slo-* "
        "headers, or not at all (it is scored the same either way; the bare vLLM never gets it)",
    )
    parser.add_argument(
        "--live-workload",
        choices=("mixed", "uniform"),
        default="mixed",
        help="with --live-bare: the mixed SLO workload (--mix, --trace), or equal requests "
        "with a latency SLO (TTFT 2 s, TBT 100 ms) like vLLM's random dataset",
    )
    parser.add_argument("--live-prompt", type=int, metavar="TOKENS",
                        help="with --live: prompt tokens (cap for mixed; default: 128 without "
                        "--live-bare)")
    parser.add_argument("--live-output", type=int, metavar="TOKENS",
                        help="with --live: output tokens (cap for mixed; default: 96 without "
                        "--live-bare)")
    parser.add_argument(
        "--live-policy-file",
        type=Path,
        help="with --live and --policies: the sidecar's hot-reloaded policy file, rewritten to "
        "switch policy between runs",
    )
    parser.add_argument(
        "--proxy-overhead",
        action="store_true",
        help="deprecated alias of 'jitserve sidecar proxy-overhead' (its defaults: 100 streams "
        "x 100 tokens against a fast local token source)",
    )


def run_live_tools(args: argparse.Namespace) -> int:
    """``--live`` and ``--proxy-overhead`` are the sidecar's load tools (aiohttp)."""
    try:
        from jitserve.bench import live, overhead
    except ImportError as err:
        raise CLIError(
            f"--live needs the sidecar extra: pip install 'jitserve[sidecar]' ({err})"
        ) from err
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.proxy_overhead:
        print("note: 'jitserve bench --proxy-overhead' is deprecated: use 'jitserve sidecar "
              "proxy-overhead' (--streams, --tokens, --interval-ms, --emit)", file=sys.stderr)
        return overhead.proxy_overhead_main(
            argparse.Namespace(
                streams=100,
                tokens=100,
                interval_ms=30.0,
                policy="gmax",
                emit="step",
                gateway=False,
                rounds=1,
                sidecar_cpus=None,
                source_cpus=None,
                sweep=None,
                sweep_seconds=3.0,
                out=out / "proxy_overhead.json",
            )
        )
    if args.live_bare:
        from jitserve.bench.compare import compare_main

        return compare_main(
            args.live, args.live_bare, workload=args.live_workload, duration_s=args.duration,
            rate=args.rate or 2.0, rounds=args.live_rounds, carrier=args.live_slo,
            seed=int(args.seeds.split(",")[0]), mix=args.mix, trace=args.trace,
            prompt_tokens=args.live_prompt, output_tokens=args.live_output, out_dir=out)
    live_policies = (args.policies or LIVE_POLICIES) if args.live_policy_file else None
    return live.bench_live_main(
        argparse.Namespace(
            url=args.live,
            duration=args.duration,
            rate=args.rate or 2.0,
            mix=args.mix,
            trace=args.trace,
            seed=int(args.seeds.split(",")[0]),
            max_prompt=args.live_prompt or 128,
            max_output=args.live_output or 96,
            model=None,
            slo_via=args.live_slo,
            policies=live_policies,
            policy_file=args.live_policy_file,
            out=out / "live.json",
            markdown=True,
        )
    )
