"""``jitserve picker``: the endpoint picker as a process (owner: gateway).

Wires the :class:`~jitserve.gateway.fleet.Fleet` (the sidecars' reports, named by
``--replica`` or ``--discover``), the placement (``--placement``,
:func:`~jitserve.placement.registry.make_placer`), the SLO policy the sidecars serve
(``--config``, hot-reloaded: its classes and defaults resolve each request's SLO) and the
gRPC server (:mod:`.picker_server`) to one port; SIGTERM makes it unready, lets open
streams finish within ``--drain-seconds`` and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
from pathlib import Path
from typing import Any

from jitserve.errors import CLIError
from jitserve.gateway.fleet import add_fleet_flags, fleet_from_args
from jitserve.gateway.picker import EndpointPicker
from jitserve.gateway.picker_ask import AskBuilder
from jitserve.gateway.picker_server import PickerServer
from jitserve.gateway.settings import default_placement
from jitserve.placement.registry import PLACERS, make_placer, use_policy
from jitserve.policy import PolicyError
from jitserve.sidecar.cli import serve_until_signalled
from jitserve.sidecar.config import ConfigWatcher

log = logging.getLogger("jitserve.picker")

DEFAULT_PORT = 9002
"""The Inference Extension's endpoint pickers listen here (an InferencePool's
``endpointPickerRef.port`` defaults to it)."""


def add_picker_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="0.0.0.0", help="address the gRPC server binds")
    p.add_argument("--port", type=int, default=DEFAULT_PORT,
                   help="ext_proc and gRPC health port (0: any free)")
    p.add_argument("--placement", default=default_placement(), metavar="NAME",
                   help=f"placement policy: {', '.join(sorted(PLACERS))}")
    p.add_argument("--seed", type=int, default=0, help="seed of a placement that samples")
    p.add_argument("--config", type=Path, metavar="FILE",
                   help="the SLOPolicy spec the sidecars serve (its SLO classes and defaults "
                   "resolve each request's SLO), hot-reloaded (none: the policy's defaults)")
    p.add_argument("--reload-interval", type=float, default=1.0, metavar="SECONDS",
                   help="seconds between checks of the policy file")
    p.add_argument("--max-body-bytes", type=int, default=1 << 20, metavar="BYTES",
                   help="largest request body read (413 beyond)")
    p.add_argument("--max-json-depth", type=int, default=32, metavar="LEVELS",
                   help="a body nested deeper is placed as best effort (the sidecar answers "
                   "it 400)")
    p.add_argument("--drain-seconds", type=float, default=20.0, metavar="SECONDS",
                   help="on SIGTERM: unready at once, open streams (which carry the "
                   "responses) may finish within this long")
    p.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR")
    add_fleet_flags(p)


def _check(args: argparse.Namespace) -> None:
    if not 0 <= args.port <= 65535:
        raise CLIError(f"--port: must be 0..65535 (got {args.port})")
    if not args.reload_interval > 0:
        raise CLIError(f"--reload-interval: must be > 0 (got {args.reload_interval})")
    if not args.drain_seconds >= 0:
        raise CLIError(f"--drain-seconds: must be >= 0 (got {args.drain_seconds})")
    for flag, value, least in (("--max-body-bytes", args.max_body_bytes, 1024),
                               ("--max-json-depth", args.max_json_depth, 2)):
        if value < least:
            raise CLIError(f"{flag}: must be at least {least} (got {value})")


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def run_picker(args: argparse.Namespace, stop: asyncio.Event) -> None:
    _check(args)
    fleet = fleet_from_args(args)
    placer = make_placer(args.placement, args.seed)
    asks = AskBuilder(max_body_bytes=args.max_body_bytes, max_json_depth=args.max_json_depth)

    def use(spec: Any) -> None:
        asks.spec = spec
        use_policy(placer, spec)

    try:
        watcher = ConfigWatcher(args.config, use, lambda result: None, args.reload_interval)
    except PolicyError as err:
        raise CLIError(f"--config: {err}") from err
    use(watcher.spec)
    picker = EndpointPicker(fleet, placer, asks)
    server = PickerServer(picker, _address(args.host, args.port),
                          max_message_bytes=max(4 << 20, 2 * args.max_body_bytes))
    try:
        port = await server.start()
    except (OSError, RuntimeError) as err:
        raise CLIError(f"--port: cannot listen on {_address(args.host, args.port)}: {err}") \
            from err
    await fleet.start()
    await server.ready(True)
    log.info("endpoint picker on port %d: placement %s, %d replicas named, %d discovered",
             port, placer.name, len(args.replica), len(args.discover))

    async def reload() -> None:
        while True:
            await asyncio.sleep(args.reload_interval)
            watcher.poll()

    reloader = asyncio.create_task(reload(), name="picker-reload")
    try:
        await stop.wait()
        log.info("stopping: unready, open streams have %g s", args.drain_seconds)
        await server.ready(False)
        await server.stop(args.drain_seconds)
    finally:
        reloader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reloader
        await fleet.stop()


def _serve(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    serve_until_signalled(lambda stop: run_picker(args, stop), hard_exit=False,
                          fast_loop=False)
    return 0


def register(subparsers: Any) -> Any:
    parser = subparsers.add_parser(
        "picker", help="the Gateway API Inference Extension endpoint picker (Envoy ext_proc "
        "over gRPC), placing on the sidecars' reports")
    add_picker_arguments(parser)
    parser.set_defaults(handler=_serve)
    return None
