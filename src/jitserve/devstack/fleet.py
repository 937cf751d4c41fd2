"""``jitserve up --replicas N`` (N > 1): a fleet on one machine (owner: gateway).

N tiny CPU vLLMs (``--vllm-port`` + i; or the one ``--backend``), each with its own
sidecar (API on ``--replica-port`` + i, default ``--port`` + 1 + i; admin port that + 1000,
where it serves its replica report), one analyzer they share, and ``jitserve gateway`` on
``--port`` in front (its admin port: ``--port`` + 1000). With the defaults: gateway 8080
(admin 9080), sidecars 8081, 8082 (admin 9081, 9082), vLLMs 8000, 8001; every URL is
printed. :func:`start_fleet` starts them in that order on
``jitserve up``'s :class:`~jitserve.devstack.up.Stack`, which stops them in reverse on
Ctrl-C; it returns the gateway's endpoint once every replica is in its picks.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any, Protocol

from jitserve.devstack import vllm as vl
from jitserve.errors import CLIError
from jitserve.gateway.cli import gateway_command
from jitserve.policy import BatchShape
from jitserve.sidecar.cli import serve_command

ADMIN_OFFSET = 1000


class Children(Protocol):
    log_dir: Path

    def start(self, name: str, cmd: list[str], env: dict[str, str] | None = None,
              engine_nice: int | None = None) -> Any: ...


WaitReady = Any  # (stack, url, proc, timeout_s) -> None: up._wait_ready


def add_fleet_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--replicas", type=int, default=1, metavar="N",
                   help="N > 1: N vLLMs, each with its sidecar, and the gateway on --port in "
                   "front of them")
    p.add_argument("--replica-port", type=int, default=None, metavar="PORT",
                   help="with --replicas N: sidecar i's API port is PORT + i, its admin port "
                   f"PORT + {ADMIN_OFFSET} + i (default: --port + 1)")
    p.add_argument("--placement", default=None, metavar="NAME",
                   help="with --replicas N: the gateway's --placement (default: the "
                   "gateway's)")
    p.add_argument("--engine-cores", default=None, metavar="LIST",
                   help="with --replicas N: the CPU cores the local vLLMs get (e.g. 2-7 or "
                   "1,3), an N-th each, or all of them shared with fewer cores than vLLMs "
                   "(default: this process's cores); everything else keeps the cores it "
                   "was started on (taskset -c 0 jitserve up ... --engine-cores 1: the "
                   "engines on core 1, the control plane on core 0)")


def check_fleet_arguments(args: argparse.Namespace) -> None:
    if args.replicas < 1 or args.replicas > 64:
        raise CLIError(f"--replicas: must be 1..64, got {args.replicas}")
    if args.engine_cores is not None:
        args.engine_cores = parse_cores(args.engine_cores)


def parse_cores(text: str) -> list[int]:
    """``0-3,6`` -> [0, 1, 2, 3, 6]: cores this machine has (CLIError otherwise)."""
    cores: set[int] = set()
    try:
        for part in text.split(","):
            low, dash, high = part.strip().partition("-")
            cores.update(range(int(low), int(high if dash else low) + 1))
    except ValueError:
        raise CLIError(f"--engine-cores: {text!r} is not a core list like 0-3,6") from None
    missing = sorted(cores - set(range(os.cpu_count() or 1)))
    if not cores or missing:
        raise CLIError(f"--engine-cores: no such core(s) {missing or text!r} on this machine "
                       f"(0-{(os.cpu_count() or 1) - 1})")
    return sorted(cores)


def start_engines(args: argparse.Namespace, stack: Children,
                  wait_ready: WaitReady, shape: BatchShape) -> list[str]:
    """The N vLLMs' URLs: started here, or ``--backend`` N times (a GPU vLLM, or the
    tests' shared one: N sidecars in front of one engine)."""
    if args.backend is not None:
        print(f"  {args.replicas} sidecars in front of the one --backend {args.backend}",
              flush=True)
        return [args.backend] * args.replicas
    python = vl.vllm_python()
    if python is None:
        raise CLIError("vLLM is not installed: run scripts/setup-vllm.sh (or set "
                       "JITSERVE_VLLM_PYTHON)")
    model = args.model or vl.ensure_tiny_model(python=python)
    engines = []
    for i in range(args.replicas):
        port = args.vllm_port + i
        proc = stack.start(f"vllm-{i}", vl.vllm_command(
            python, model, port, dummy=not args.real_weights or args.model is None,
            max_num_seqs=shape.max_num_seqs, extra=[*vl.tool_flags(args.tool_call_parser),
                                                    *vl.reasoning_flags(args.reasoning_parser)],
            engine_rule=args.budget_rule),
            env=vl.engine_scheduler_env(args.budget_rule), engine_nice=args.vllm_nice)
        cores = engine_cores(i, args.replicas, args.engine_cores)
        if cores:  # at once: it is still importing, before its engine process and threads
            os.sched_setaffinity(proc.pid, cores)
            print(f"  vllm-{i} on cores {sorted(cores)}", flush=True)
        engines.append((f"http://127.0.0.1:{port}", proc))
    print(f"  waiting for {args.replicas} vLLMs (first start compiles; minutes)", flush=True)
    for url, proc in engines:
        wait_ready(stack, f"{url}/health", proc, args.timeout)
    return [url for url, _ in engines]


def engine_cores(i: int, n: int, pool: list[int] | None = None) -> set[int]:
    """The cores of vLLM ``i`` of ``n``: an ``n``-th of ``pool`` (default: this
    process's cores) each, as each replica has its own GPU on a GPU host (vLLM binds its
    CPU engine's threads itself only with several workers per engine); with fewer cores
    than engines, all of them shared (empty: leave it be, without a pool)."""
    cores = sorted(pool) if pool is not None else sorted(os.sched_getaffinity(0))
    if len(cores) < n:
        return set(cores) if pool is not None else set()
    share = len(cores) // n
    return set(cores[i * share:(i + 1) * share])


def replica_ports(args: argparse.Namespace) -> list[tuple[int, int]]:
    """(API port, admin port) of each sidecar of the fleet."""
    first = args.port + 1 if args.replica_port is None else args.replica_port
    return [(first + i, first + ADMIN_OFFSET + i) for i in range(args.replicas)]


def start_fleet(args: argparse.Namespace, stack: Children, wait_ready: WaitReady,
                config: Path, shape: BatchShape, analyzer: str | None) -> str:
    """Start the N vLLMs, their sidecars and the gateway; the gateway's endpoint."""
    replicas = []
    engines = start_engines(args, stack, wait_ready, shape)
    for i, (url, (api_port, admin_port)) in enumerate(zip(engines, replica_ports(args),
                                                         strict=True)):
        extra = ["--engine-queue", str(shape.engine_queue), "--admin-port", str(admin_port),
                 "--engine-profile", args.engine_profile]
        if analyzer:
            extra += ["--analyzer", analyzer]
        if args.reasoning_parser:
            extra += ["--reasoning-parser", args.reasoning_parser]
        proc = stack.start(f"sidecar-{i}", serve_command(
            url, api_port, config, shape.max_num_seqs, host="127.0.0.1", extra=extra))
        wait_ready(stack, f"http://127.0.0.1:{api_port}/ready", proc, args.timeout)
        replicas.append((f"http://127.0.0.1:{api_port}", f"http://127.0.0.1:{admin_port}"))
    extra = ["--config", str(config)]
    if args.placement:
        extra += ["--placement", args.placement]
    gateway = stack.start("gateway", gateway_command(
        replicas, args.port, args.port + ADMIN_OFFSET, host=args.host, extra=extra))
    admin = f"http://127.0.0.1:{args.port + ADMIN_OFFSET}"
    wait_ready(stack, f"{admin}/ready", gateway, args.timeout)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not _all_in(admin, len(replicas)):
        time.sleep(0.2)
    for i, ((api, admin_url), engine) in enumerate(zip(replicas, engines, strict=True)):
        print(f"  replica {i}: sidecar {api} (admin {admin_url}) -> vLLM {engine}", flush=True)
    print(f"  gateway: http://{args.host}:{args.port} (admin {admin})", flush=True)
    return f"http://{args.host}:{args.port}"


def _all_in(admin: str, n: int) -> bool:
    import json
    import urllib.request

    try:
        with urllib.request.urlopen(admin + "/ready", timeout=5) as resp:
            return len(json.loads(resp.read()).get("replicas", [])) >= n
    except (OSError, ValueError):
        return False
