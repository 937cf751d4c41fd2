"""``jitserve up``: the whole serving stack on one machine (owner: sidecar).

Starts, as child processes in their own process groups:

1. vLLM (CPU build, its own venv from ``scripts/setup-vllm.sh``) serving a tiny
   LlamaForCausalLM made locally (``--load-format dummy``), unless ``--backend URL``
   points at an existing vLLM (e.g. a GPU one);
2. the analyzer, when the analyzer component is installed (``jitserve analyzer serve``);
   the sidecar falls back to its local length estimator otherwise;
3. the scheduler sidecar (``jitserve sidecar serve``) on ``--port``;

or, with ``--replicas N`` (N > 1), N vLLMs with a sidecar each and ``jitserve gateway``
on ``--port`` in front of them (:mod:`~jitserve.devstack.fleet`).

Waits until the sidecar's ``/ready`` answers, prints the endpoint and a curl line, and
stops everything (sidecar, analyzer, vLLM, in that order) on Ctrl-C or SIGTERM, or when a
child dies (its log tail is printed). Logs go to ``--log-dir`` (default: the cache dir).
"""

from __future__ import annotations

import argparse
import importlib.util
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import IO, Any

from jitserve.devstack import vllm as vl
from jitserve.devstack.fleet import (
    ADMIN_OFFSET,
    add_fleet_arguments,
    check_fleet_arguments,
    start_fleet,
)
from jitserve.devstack.preflight import UP_DISK_NEEDED, check_disk, check_ports, planned_ports
from jitserve.errors import CLIError
from jitserve.policy import (
    MAX_NUM_SEQS,
    ArgsError,
    BatchShape,
    BudgetRule,
    PolicyError,
    SLOPolicySpec,
    dump_policy_yaml,
    load_policy_file,
)
from jitserve.sidecar.cli import serve_command

UP_MAX_NUM_SEQS = 16  # the tiny CPU model's batch; a GPU backend wants its own B


def _cli_error(message: str) -> Exception:
    return CLIError(message)


class _Stop(Exception):
    pass


def _raise_stop(signum: int, frame: FrameType | None) -> None:
    raise _Stop(signal.Signals(signum).name)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("up", help="run vLLM (tiny CPU model) + analyzer + sidecar locally")
    p.add_argument("--port", type=int, default=8080,
                   help="the endpoint's port: the sidecar's (with --replicas N: the gateway's)")
    p.add_argument("--host", default="127.0.0.1", help="the endpoint's bind address")
    p.add_argument("--backend", default=None,
                   help="front an existing vLLM at this URL instead of starting one")
    p.add_argument("--vllm-port", type=int, default=8000, help="vLLM's TCP port")
    p.add_argument("--engine-profile", default="cpu-tiny-llama", metavar="NAME_OR_FILE",
                   help="the engine model scheduler.policy auto replays traffic on (the "
                   "sidecar's --engine-profile): the tiny CPU model's measured profile; with "
                   "--backend, your engine's (a jitserve calibrate file)")
    p.add_argument("--vllm-nice", type=int, default=vl.ENGINE_NICE,
                   help="the CPU vLLM's nice (default: %(default)s): on one machine its engine "
                   "keeps every core busy, and the sidecar in front of it must still get a CPU "
                   "at once; 0: the same priority")
    p.add_argument("--model", type=Path, default=None,
                   help="model folder for vLLM (default: the tiny model, made if missing)")
    p.add_argument("--real-weights", action="store_true",
                   help="load --model's weights instead of dummy ones")
    p.add_argument("--config", type=Path, default=None,
                   help="SLOPolicy spec file (hot-reloaded); default: written with defaults")
    p.add_argument("--tool-call-parser", default="pythonic",
                   help="vLLM's tool-call parser (tools, tool_choice; a named tool_choice "
                   "needs one); 'none': start vLLM without tool calling")
    p.add_argument("--reasoning-parser", default=None, metavar="NAME",
                   help="start vLLM with this --reasoning-parser and tell the sidecar, which "
                   "then sends chat to vLLM's chat endpoint (reasoning apart from content)")
    p.add_argument("--max-num-seqs", "--max-running", dest="max_num_seqs", type=int,
                   default=None,
                   help="B: vLLM's batch slots (its --max-num-seqs) and the sidecar's batch size: "
                   "one setting, so they cannot disagree (default: a --max-num-seqs in the "
                   f"policy's model.args, else {UP_MAX_NUM_SEQS})")
    p.add_argument("--engine-queue", type=int, default=None,
                   help="requests the sidecar keeps queued inside vLLM beyond its B slots "
                   "(default: the policy's sidecar.engineQueue, else B/2, at least 2)")
    p.add_argument("--engine-queue-unstarted", action="store_true",
                   help="the sidecar's engine queue bounds the dispatched requests with no "
                   "token yet instead of those beyond B (an experiment, off by default)")
    p.add_argument("--budget-rule", "--engine-scheduler", dest="budget_rule",
                   choices=vl.ENGINE_RULES, default=None,
                   help="vLLM's per-step token budget: fixed (vLLM's own) or greedy/sliding "
                   "(jitserve's in-engine scheduler, from the decodes' TBT slack); default: "
                   "the policy's scheduler.budgetRule, as the operator reads it")
    p.add_argument("--no-analyzer", action="store_true", help="do not start the analyzer")
    p.add_argument("--analyzer-port", type=int, default=50051, help="the analyzer's gRPC port")
    p.add_argument("--log-dir", type=Path, default=None, metavar="DIR",
                   help="where the children's logs go (default: a new temporary folder)")
    p.add_argument("--timeout", type=float, default=600.0, metavar="SECONDS",
                   help="seconds to wait for readiness")
    add_fleet_arguments(p)
    p.set_defaults(handler=main)


class Stack:
    """The child processes of ``jitserve up``, stopped in reverse start order."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.children: list[tuple[str, subprocess.Popen[bytes], Path]] = []
        self._logs: list[IO[bytes]] = []

    def start(self, name: str, cmd: list[str], env: dict[str, str] | None = None,
              engine_nice: int | None = None) -> subprocess.Popen[bytes]:
        """Start a child; ``engine_nice``: it is vLLM, started at that priority (``env``:
        added to vLLM's environment)."""
        log_path = self.log_dir / f"{name}.log"
        handle = log_path.open("ab")
        self._logs.append(handle)
        proc = (vl.start_process(cmd, handle, env) if engine_nice is None
                else vl.start_engine(cmd, handle, engine_nice, env))
        self.children.append((name, proc, log_path))
        print(f"  {name}: pid {proc.pid}, log {log_path}", flush=True)
        return proc

    def dead(self) -> tuple[str, subprocess.Popen[bytes], Path] | None:
        for child in self.children:
            if child[1].poll() is not None:
                return child
        return None

    def stop(self) -> None:
        for name, proc, _ in reversed(self.children):
            if proc.poll() is None:
                print(f"  stopping {name} (pid {proc.pid})", flush=True)
            vl.stop_process(proc)
        for handle in self._logs:
            handle.close()


def _wait_ready(stack: Stack, url: str, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        dead = stack.dead()
        if dead is not None:
            name, child, log_path = dead
            raise _cli_error(f"{name} exited with code {child.returncode} during start-up; "
                             f"last lines of {log_path}:\n{vl.tail(log_path)}")
        if vl.wait_http_ok(url, 1.0, proc, interval_s=0.25):
            return
    raise _cli_error(f"{url} not ready after {timeout_s:.0f} s; logs in {stack.log_dir}")


def _wait_tcp(host: str, port: int, timeout_s: float, proc: subprocess.Popen[bytes],
              clock: Callable[[], float] = time.monotonic) -> bool:
    deadline = clock() + timeout_s
    while clock() < deadline and proc.poll() is None:
        with socket.socket() as sock:
            sock.settimeout(1.0)
            if sock.connect_ex((host, port)) == 0:
                return True
        time.sleep(0.25)
    return False


def start_analyzer(stack: Stack, args: argparse.Namespace,
                   clock: Callable[[], float] = time.monotonic,
                   command: list[str] | None = None) -> str | None:
    """The analyzer's address once it listens. It may take as long as vLLM or the sidecar
    (``--timeout``: a busy machine starts a Python process slowly); only when it exits or
    does not listen by then does the sidecar use its local estimator instead."""
    proc = stack.start("analyzer", command or [
        sys.executable, "-m", "jitserve.cli", "analyzer", "serve", "--host", "127.0.0.1",
        "--port", str(args.analyzer_port), "--metrics-port", "-1"])
    if _wait_tcp("127.0.0.1", args.analyzer_port, args.timeout, proc, clock):
        return f"127.0.0.1:{args.analyzer_port}"
    print("  analyzer did not start; the sidecar uses its local estimator", flush=True)
    vl.stop_process(proc)
    stack.children = [c for c in stack.children if c[1] is not proc]
    return None


def up_batch_shape(config: Path, max_num_seqs: int | None,
                   engine_queue: int | None) -> BatchShape:
    """B and the engine queue as the operator derives them from the same policy
    (``ModelSpec.batch_shape``), the flags winning, the tiny CPU model's default B."""
    try:
        spec = load_policy_file(config)
        model = spec.model
        if max_num_seqs is not None:
            model = model.model_copy(update={"args": [MAX_NUM_SEQS, str(max_num_seqs)]})
        queue = spec.sidecar.engine_queue if engine_queue is None else engine_queue
        return model.batch_shape(queue, default_max_num_seqs=UP_MAX_NUM_SEQS)
    except (PolicyError, ArgsError) as err:
        raise _cli_error(f"{config}: {err}") from err


def up_budget_rule(config: Path, flag: str | None) -> BudgetRule:
    """The budget rule vLLM runs with: the flag, else the policy's (one default: the
    SLOPolicy's, which the operator reads too)."""
    if flag is not None:
        return BudgetRule(flag)
    try:
        return load_policy_file(config).scheduler.budget_rule
    except PolicyError as err:
        raise _cli_error(f"{config}: {err}") from err


def main(args: argparse.Namespace) -> int:
    if importlib.util.find_spec("aiohttp") is None:
        raise _cli_error("jitserve up needs the sidecar extra: pip install 'jitserve[sidecar]'")
    log_dir = args.log_dir or vl.cache_dir() / "up-logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    config = args.config
    if config is None:
        config = vl.cache_dir() / "up-policy.yaml"
        if not config.exists():
            config.write_text(dump_policy_yaml(SLOPolicySpec()))
    elif not config.exists():
        raise _cli_error(f"--config {config}: no such file")
    check_fleet_arguments(args)
    check_ports(planned_ports(args))  # before vLLM's minute of start-up, not after
    check_disk(vl.cache_dir(), UP_DISK_NEEDED, "jitserve up")
    shape = up_batch_shape(config, args.max_num_seqs, args.engine_queue)
    args.budget_rule = up_budget_rule(config, args.budget_rule)
    stack = Stack(log_dir)
    previous = {sig: signal.signal(sig, _raise_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    print(f"jitserve up: logs in {log_dir}", flush=True)
    try:
        backend = args.backend
        if backend is None and args.replicas == 1:
            python = vl.vllm_python()
            if python is None:
                raise _cli_error("vLLM is not installed: run scripts/setup-vllm.sh (or set "
                                 "JITSERVE_VLLM_PYTHON), or pass --backend URL")
            model = args.model or vl.ensure_tiny_model(python=python)
            backend = f"http://127.0.0.1:{args.vllm_port}"
            vllm_proc = stack.start("vllm", vl.vllm_command(
                python, model, args.vllm_port, dummy=not args.real_weights or args.model is None,
                max_num_seqs=shape.max_num_seqs, extra=[*vl.tool_flags(args.tool_call_parser),
                                                        *vl.reasoning_flags(args.reasoning_parser)],
                engine_rule=args.budget_rule),
                env=vl.engine_scheduler_env(args.budget_rule), engine_nice=args.vllm_nice)
            print(f"  waiting for vLLM on {backend} (first start compiles; a minute or two)",
                  flush=True)
            _wait_ready(stack, f"{backend}/health", vllm_proc, args.timeout)
        analyzer = None
        if not args.no_analyzer and importlib.util.find_spec("jitserve.analyzer.cli") is not None:
            analyzer = start_analyzer(stack, args)
        if args.replicas > 1:
            endpoint = start_fleet(args, stack, _wait_ready, config, shape, analyzer)
            admin = f"http://127.0.0.1:{args.port + ADMIN_OFFSET}"
            what = f", the gateway in front of {args.replicas} replicas"
        else:
            assert backend is not None
            endpoint = _start_sidecar(args, stack, backend, config, shape, analyzer)
            admin, what = endpoint, ""
        print(f"\njitserve is up: {endpoint}{what}  (policy file {config}, hot-reloaded)\n"
              f"  curl -N {endpoint}/v1/chat/completions -H 'content-type: application/json' "
              "-d '{\"messages\": [{\"role\": \"user\", \"content\": \"hello\"}], "
              "\"max_tokens\": 32, \"stream\": true, "
              "\"slo\": {\"kind\": \"latency\", \"ttft_ms\": 500, \"tbt_ms\": 50}}'\n"
              f"  metrics: {admin}/metrics   ready: {admin}/ready\n"
              "Ctrl-C stops everything.", flush=True)
        while True:
            dead = stack.dead()
            if dead is not None:
                name, child, log_path = dead
                print(f"{name} exited with code {child.returncode}; last lines of {log_path}:\n"
                      f"{vl.tail(log_path)}", file=sys.stderr, flush=True)
                return 1
            time.sleep(0.5)
    except _Stop as stop:
        print(f"\n{stop}: stopping", flush=True)
        return 0
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
        stack.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def sidecar_command(args: argparse.Namespace, backend: str, config: Path, shape: BatchShape,
                    analyzer: str | None) -> list[str]:
    """The sidecar ``jitserve up`` runs (pure: its flags from ``up``'s)."""
    cmd = serve_command(backend, args.port, config, shape.max_num_seqs, host=args.host,
                        extra=["--engine-queue", str(shape.engine_queue),
                               "--engine-profile", args.engine_profile])
    if args.engine_queue_unstarted:
        cmd.append("--engine-queue-unstarted")
    if analyzer:
        cmd += ["--analyzer", analyzer]
    if args.reasoning_parser:
        cmd += ["--reasoning-parser", args.reasoning_parser]
    return cmd


def _start_sidecar(args: argparse.Namespace, stack: Stack, backend: str, config: Path,
                   shape: BatchShape, analyzer: str | None) -> str:
    sidecar = stack.start("sidecar", sidecar_command(args, backend, config, shape, analyzer))
    endpoint = f"http://{args.host}:{args.port}"
    _wait_ready(stack, f"{endpoint}/ready", sidecar, args.timeout)
    return endpoint


def _tiny_model(args: argparse.Namespace) -> int:
    print(vl.ensure_tiny_model(args.dir))
    return 0


def register_under_sidecar(sidecar_commands: Any) -> None:
    """``jitserve sidecar tiny-model DIR``."""
    tiny = sidecar_commands.add_parser("tiny-model", help="write the tiny CPU model folder")
    tiny.add_argument("dir", type=Path)
    tiny.set_defaults(handler=_tiny_model)
