"""``jitserve sidecar ...`` subcommands (owner: sidecar).

- ``jitserve sidecar serve --backend URL [--config FILE] [--port 8080]``: the sidecar.

The tools around it (``bench-live``, ``proxy-overhead``, ``tiny-model``) live in the
layers above (``jitserve.bench``, ``jitserve.devstack``) and add themselves to the
``jitserve sidecar`` command through :data:`jitserve.cli.EXTENSIONS`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from jitserve.envflags import from_environment
from jitserve.errors import CLIError, flag_error

ENV_PREFIX = "JITSERVE_SIDECAR_"
"""Each flag of ``jitserve sidecar serve`` is also this prefix + its name (envflags)."""

FLAGS = {
    "backend_url": "--backend", "host": "--host", "port": "--port", "config_path": "--config",
    "policy_name": "--policy-name", "reasoning_parser": "--reasoning-parser",
    "max_running": "--max-running",
    "engine_queue": "--engine-queue", "engine_queue_unstarted": "--engine-queue-unstarted",
    "max_body_bytes": "--max-body-bytes",
    "default_max_tokens": "--default-max-tokens", "reload_interval_s": "--reload-interval",
    "api_keys": "--api-key", "api_keys_file": "--api-keys-file", "keys_dir": "--keys-dir",
    "analyzer": "--analyzer", "admin_port": "--admin-port", "admin_keys": "--admin-key",
    "stall_timeout_s": "--stall-timeout", "header_timeout_s": "--header-timeout",
    "body_timeout_s": "--body-timeout", "max_json_depth": "--max-json-depth",
    "max_buffered_tokens": "--max-buffered-tokens", "access_log": "--access-log",
    "engine_profile": "--engine-profile",
}
"""SidecarSettings field -> the flag that sets it (errors name the flag)."""


def _cli_error(message: str) -> Exception:
    return CLIError(message)


def serve_command(backend_url: str, port: int, config: Path | str, max_running: int, *,
                  host: str = "127.0.0.1", extra: list[str] | None = None) -> list[str]:
    """The command line that runs ``jitserve sidecar serve`` in a child process with this
    interpreter (``jitserve up``, the proxy-overhead bench, the tests); ``extra``: more
    of :func:`add_serve_arguments`' flags."""
    return [sys.executable, "-m", "jitserve.cli", "sidecar", "serve", "--backend", backend_url,
            "--host", host, "--port", str(port), "--config", str(config),
            "--max-running", str(max_running), *(extra or [])]


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", default="http://127.0.0.1:8000", metavar="URL",
                   help="vLLM OpenAI server URL")
    p.add_argument("--host", default="0.0.0.0", help="address the API binds")
    p.add_argument("--port", type=int, default=8080, help="the API's TCP port (0: any free)")
    p.add_argument("--config", type=Path, metavar="FILE",
                   help="SLOPolicy spec file, hot-reloaded (none: the policy's defaults)")
    p.add_argument("--policy-name", default="", metavar="NAME",
                   help="the SLOPolicy this sidecar serves: the policy label of "
                   "jitserve_build_info")
    p.add_argument("--max-running", type=int, default=16, metavar="B",
                   help="B, vLLM's batch slots (requests); must equal vLLM's --max-num-seqs "
                   "(jitserve up and the operator set both from one setting)")
    p.add_argument("--engine-queue", type=int, default=None, metavar="N",
                   help="requests kept queued inside vLLM beyond its B slots, in the policy's "
                   "order, so a freed slot never waits for the sidecar (default: B/2, >= 2)")
    p.add_argument("--engine-queue-unstarted", action="store_true",
                   help="bound by --engine-queue the dispatched requests that have no token "
                   "yet (waiting in vLLM or in their prefill) instead of those beyond B; an "
                   "experiment, off by default")
    p.add_argument("--reasoning-parser", default=None, metavar="NAME",
                   help="the --reasoning-parser vLLM runs with: chat requests then go to "
                   "vLLM's chat endpoint, which returns the reasoning apart from the content "
                   "(they are scheduled but not preempted)")
    p.add_argument("--max-body-bytes", type=int, default=1 << 20, metavar="BYTES",
                   help="largest request body (413 beyond)")
    p.add_argument("--default-max-tokens", type=int, default=None, metavar="TOKENS",
                   help="max_tokens of a request that gives none (default: as vLLM, the rest "
                   "of the context)")
    p.add_argument("--reload-interval", type=float, default=1.0, metavar="SECONDS",
                   help="seconds between checks of the policy file and the keys")
    p.add_argument("--api-key", action="append", default=[], metavar="TENANT=KEY",
                   help="an API key of a tenant (repeatable); keys on = x-tenant is not trusted")
    p.add_argument("--api-keys-file", type=Path, metavar="FILE",
                   help="YAML/JSON {tenant: key or [keys]}")
    p.add_argument("--keys-dir", type=Path, metavar="DIR",
                   help="mounted Secrets: KEYS_DIR/<apiKeySecret>/api-key per policy tenant")
    p.add_argument("--analyzer", metavar="HOST:PORT",
                   help="analyzer gRPC address (length bounds; none: the local estimator)")
    p.add_argument("--admin-port", type=int, metavar="PORT",
                   help="serve /metrics and /debug/scheduler on this port only (keep it out of "
                   "the Service and the Ingress)")
    p.add_argument("--admin-key", action="append", default=[], metavar="KEY",
                   help="with keys on and no --admin-port: the key /metrics and "
                   "/debug/scheduler need on the API port (repeatable)")
    p.add_argument("--drain-seconds", type=float, default=20.0, metavar="SECONDS",
                   help="on SIGTERM: refuse new requests, let queued and running ones finish, "
                   "end the rest with an error event and exit, all within this long")
    p.add_argument("--stall-timeout", type=float, default=30.0, metavar="SECONDS",
                   help="seconds a running vLLM stream may stay silent before its request "
                   "fails (0: never)")
    p.add_argument("--header-timeout", type=float, default=10.0, metavar="SECONDS",
                   help="seconds a connection has to send a request's headers (also the idle "
                   "keep-alive timeout)")
    p.add_argument("--body-timeout", type=float, default=30.0, metavar="SECONDS",
                   help="seconds a request body has to arrive, and a streaming client to take "
                   "each piece")
    p.add_argument("--max-json-depth", type=int, default=32, metavar="LEVELS",
                   help="deepest nesting of a request body's arrays and objects (400 beyond)")
    p.add_argument("--max-buffered-tokens", type=int, default=4096, metavar="TOKENS",
                   help="tokens a stream may hold for a slow reader before it is aborted")
    p.add_argument("--access-log", action="store_true",
                   help="write a JSON line per answered request to stdout (request id, "
                   "tenant, SLO kind and class, outcome, tokens, status, seconds)")
    p.add_argument("--engine-profile", default="a100-llama3-8b", metavar="NAME_OR_FILE",
                   help="the engine model scheduler.policy auto replays the recent traffic "
                   "on, unless the policy's scheduler.auto.profile names one: a bundled "
                   "profile (a100-llama3-8b, cpu-tiny-llama) or a file from jitserve "
                   "calibrate")
    p.add_argument("--log-level", default="INFO",
                   help="DEBUG, INFO, WARNING or ERROR")


def settings_from_args(args: argparse.Namespace) -> Any:
    from pydantic import ValidationError

    from jitserve.sidecar.config import SidecarSettings

    keys: dict[str, str] = {}
    for item in args.api_key:
        tenant, sep, key = item.partition("=")
        if not sep or not tenant or not key:
            raise _cli_error(f"--api-key expects TENANT=KEY, got {item!r}")
        keys[key] = tenant
    try:
        return SidecarSettings(
            backend_url=args.backend, host=args.host, port=args.port, config_path=args.config,
            max_running=args.max_running, engine_queue=args.engine_queue,
            engine_queue_unstarted=args.engine_queue_unstarted,
            max_body_bytes=args.max_body_bytes,
            default_max_tokens=args.default_max_tokens, reload_interval_s=args.reload_interval,
            api_keys=keys, api_keys_file=args.api_keys_file, keys_dir=args.keys_dir,
            analyzer=args.analyzer, admin_port=args.admin_port, admin_keys=args.admin_key,
            policy_name=args.policy_name, reasoning_parser=args.reasoning_parser,
            stall_timeout_s=args.stall_timeout,
            header_timeout_s=args.header_timeout,
            body_timeout_s=args.body_timeout, max_json_depth=args.max_json_depth,
            max_buffered_tokens=args.max_buffered_tokens, access_log=args.access_log,
            engine_profile=args.engine_profile)
    except ValidationError as err:
        raise flag_error(err.errors(), FLAGS) from err


def serve_until_signalled(serve: Callable[[asyncio.Event], Awaitable[None]], *,
                          hard_exit: bool = True, fast_loop: bool = True) -> None:
    """Run ``serve(stop)``, with ``fast_loop`` on uvloop when it is installed (it halves
    the event loop's per-token cost; grpc's asyncio does not run on it); SIGINT and
    SIGTERM set ``stop``. With ``hard_exit``, exit the
    process as soon as it returns: everything is closed by then (streams ended, sockets,
    clients), and the interpreter's own teardown took up to 2 s on a loaded machine, past
    the drain bound a pod's grace period counts on. The sidecar, gateway and picker
    commands all run this way."""

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, stop.set)
        await serve(stop)

    try:
        import uvloop
    except ImportError:
        fast_loop = False
    if fast_loop:
        uvloop.run(main())
    else:
        asyncio.run(main())
    if hard_exit:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def _serve(args: argparse.Namespace) -> int:
    from jitserve.policy import PolicyError
    from jitserve.sidecar.server import serve

    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = settings_from_args(args)

    try:
        serve_until_signalled(lambda stop: serve(settings, stop, drain_s=args.drain_seconds))
    except PolicyError as err:
        raise _cli_error(f"policy file: {err}") from err
    except OSError as err:
        raise _cli_error(str(err)) from err
    return 0


def register(subparsers: Any) -> Any:
    parser = subparsers.add_parser("sidecar", help="the scheduler sidecar in front of vLLM")
    sub = parser.add_subparsers(dest="sidecar_command", metavar="SUBCOMMAND", required=True)
    serve = sub.add_parser("serve", help="run the sidecar (OpenAI-compatible API on --port)")
    add_serve_arguments(serve)
    from_environment(serve, ENV_PREFIX)
    serve.set_defaults(handler=_serve)
    return sub
