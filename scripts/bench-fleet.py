#!/usr/bin/env python3
"""The fleet live: jitserve's gateway against vllm-router, over the same engines.

Given a running fleet (``jitserve up --replicas 2`` prints its gateway, sidecars and
vLLMs), this starts ``vllm-router`` (the vLLM project's router, ``pip install
vllm-router``) once per ``--policies`` policy in front of the sidecars and once in front of
the bare vLLMs, then runs vLLM's own serving benchmark (``scripts/bench-vllm-serve.py``,
with the interpreter that has vLLM) against every front, alternated, ``--rounds`` rounds
at each ``--loads`` multiple of the pair's capacity (measured first through the
round-robin router over the bare vLLMs, all prompts at once). It ends with the two
comparisons of issue 18: request goodput of the gateway over the best router setup, and
throughput of the gateway over the best router in front of the bare vLLMs:

    .venv/bin/jitserve up --replicas 2 &
    python3 scripts/bench-fleet.py --gateway http://127.0.0.1:8080 \\
        --sidecar http://127.0.0.1:8081 --sidecar http://127.0.0.1:8082 \\
        --engine http://127.0.0.1:8001 --engine http://127.0.0.1:8002 \\
        --loads 0.7,1.5 --rounds 2 --duration 30 --out bench-out/fleet -- --slo-headers

Arguments after ``--`` go to ``bench-vllm-serve.py``. Standard library only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

HERE = Path(__file__).resolve().parent
CACHE = Path(os.environ.get("JITSERVE_CACHE") or Path.home() / ".cache" / "jitserve")


def fail(message: str) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/v1/models", timeout=5) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def find_router(given: str | None) -> str:
    for candidate in (given, shutil.which("vllm-router"),
                      str(CACHE / "router-venv" / "bin" / "vllm-router")):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    fail("vllm-router not found: pip install vllm-router (or --router PATH); e.g. "
         f"python3 -m venv {CACHE / 'router-venv'} && "
         f"{CACHE / 'router-venv' / 'bin' / 'pip'} install vllm-router")


def find_vllm_python(given: str | None) -> str:
    path = Path(given or os.environ.get("JITSERVE_VLLM_PYTHON")
                or CACHE / "vllm-venv" / "bin" / "python")
    if not path.is_file():
        fail(f"no vLLM interpreter at {path}: run scripts/setup-vllm.sh (or --vllm-python)")
    return str(path)


@contextlib.contextmanager
def routers(binary: str, fronts: dict[str, list[str]], policies: list[str],
            log_dir: Path) -> Iterator[dict[str, str]]:
    """One vllm-router per (policy, set of workers); yields name -> URL."""
    procs: list[subprocess.Popen[bytes]] = []
    urls: dict[str, str] = {}
    try:
        for policy in policies:
            for label, workers in fronts.items():
                name = f"router-{policy.replace('_', '-')}-{label}"
                port = free_port()
                log = (log_dir / f"{name}.log").open("wb")
                procs.append(subprocess.Popen(
                    [binary, "--host", "127.0.0.1", "--port", str(port), "--policy", policy,
                     "--prometheus-port", str(free_port()),
                     "--worker-urls", *workers, "--log-level", "warning"],
                    stdout=log, stderr=subprocess.STDOUT))
                urls[name] = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        for (name, url), proc in zip(urls.items(), procs, strict=True):
            while not answers(url):
                if proc.poll() is not None:
                    fail(f"{name} exited ({proc.returncode}); see {log_dir / name}.log")
                if time.monotonic() > deadline:
                    fail(f"{name} did not answer in 120 s; see {log_dir / name}.log")
                time.sleep(0.5)
        yield urls
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "inf"


def verdict(results: dict[str, Any]) -> str:
    """The issue's two comparisons per rate, from bench-vllm-serve's results.json."""
    runs = results["runs"]
    lines = ["| rate (req/s) | gateway goodput / best router setup (which) "
             "| gateway throughput / best router over bare vLLMs (which) |", "|---|---|---|"]
    for rate in sorted({r["rate"] for r in runs}):
        means: dict[str, dict[str, float]] = {}
        for target in sorted({r["target"] for r in runs if r["rate"] == rate}):
            mine = [r for r in runs if r["rate"] == rate and r["target"] == target]
            means[target] = {k: sum(r[k] or 0.0 for r in mine) / len(mine)
                             for k in ("request_goodput", "request_throughput")}
        gateway = means.get("jitserve")
        router_names = [t for t in means if t.startswith("router-")]
        if gateway is None or not router_names:
            continue
        best = max(router_names, key=lambda t: means[t]["request_goodput"])
        bare = [t for t in router_names if t.endswith("-bare")]
        best_bare = max(bare, key=lambda t: means[t]["request_throughput"]) if bare else None

        goodput = ratio(gateway["request_goodput"], means[best]["request_goodput"])
        bare_cell = "-"
        if best_bare:
            through = ratio(gateway["request_throughput"], means[best_bare]["request_throughput"])
            bare_cell = f"{through} ({best_bare})"
        lines.append(f"| {rate:g} | {goodput} ({best}) | {bare_cell} |")
    return "\n".join(lines)


def main() -> int:
    argv = sys.argv[1:]
    extra: list[str] = []
    if "--" in argv:
        extra = argv[argv.index("--") + 1:]
        argv = argv[:argv.index("--")]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--gateway", required=True, help="jitserve's gateway (the endpoint)")
    p.add_argument("--sidecar", action="append", default=[], required=True,
                   help="a sidecar's API URL (repeat)")
    p.add_argument("--engine", action="append", default=[], required=True,
                   help="a bare vLLM's URL (repeat)")
    p.add_argument("--policies", default="power_of_two,round_robin",
                   help="vllm-router policies to compare")
    p.add_argument("--loads", default="0.7,1.5", help="multiples of the pair's capacity")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--duration", type=float, default=30.0, help="seconds of arrivals per run")
    p.add_argument("--router", help="the vllm-router executable (default: found on PATH)")
    p.add_argument("--vllm-python", help="the interpreter that has vLLM")
    p.add_argument("--out", type=Path, default=Path("bench-out/fleet"))
    args = p.parse_args(argv)
    if len(args.sidecar) != len(args.engine):
        fail("give as many --sidecar as --engine (each sidecar fronts one vLLM)")
    router = find_router(args.router)
    python = find_vllm_python(args.vllm_python)
    for url in [args.gateway, *args.sidecar, *args.engine]:
        if not answers(url.rstrip("/")):
            fail(f"{url} does not answer GET /v1/models")
    args.out.mkdir(parents=True, exist_ok=True)
    fronts = {"sidecars": [u.rstrip("/") for u in args.sidecar],
              "bare": [u.rstrip("/") for u in args.engine]}
    policies = [x.strip() for x in args.policies.split(",") if x.strip()]
    with routers(router, fronts, policies, args.out) as urls:
        targets = [f"jitserve={args.gateway.rstrip('/')}"]
        targets += [f"{name}={url}" for name, url in urls.items()]
        capacity_front = next((n for n in urls if n.endswith("-bare")), next(iter(urls)))
        cmd = [python, str(HERE / "bench-vllm-serve.py"), "--capacity",
               "--capacity-target", capacity_front, "--loads", args.loads,
               "--rounds", str(args.rounds), "--duration", str(args.duration),
               "--out", str(args.out), *extra]
        for target in targets:
            cmd += ["--target", target]
        for engine in fronts["bare"]:
            cmd += ["--engine", engine]
        print("running:", " ".join(cmd), flush=True)
        code = subprocess.call(cmd)
        if code:
            return code
    results = json.loads((args.out / "results.json").read_text())
    table = verdict(results)
    (args.out / "verdict.md").write_text(table + "\n")
    print()
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
