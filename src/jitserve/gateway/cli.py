"""``jitserve gateway``: the OpenAI API in front of N sidecars (owner: gateway).

Started from a script as::

    jitserve gateway --port 8000 --admin-port 9000 \\
        --replica http://127.0.0.1:8101,http://127.0.0.1:9101 \\
        --replica http://127.0.0.1:8102,http://127.0.0.1:9102

or, in Kubernetes, ``--discover sidecars.ns.svc.cluster.local:8080:9090`` (a headless
Service). SIGINT/SIGTERM: refuse new requests, let open ones finish (``--drain-seconds``).
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from jitserve.errors import CLIError


def gateway_command(replicas: list[tuple[str, str]], port: int, admin_port: int, *,
                    host: str = "127.0.0.1", extra: list[str] | None = None) -> list[str]:
    """The command line that runs ``jitserve gateway`` in a child process with this
    interpreter (``jitserve up --replicas N``, the benchmarks, the tests); ``replicas``:
    (API URL, admin URL) of each sidecar."""
    named = [arg for api, admin in replicas for arg in ("--replica", f"{api},{admin}")]
    return [sys.executable, "-m", "jitserve.cli", "gateway", "--host", host,
            "--port", str(port), "--admin-port", str(admin_port), *named, *(extra or [])]


def _serve(args: argparse.Namespace) -> int:
    from jitserve.gateway.fleet import fleet_from_args
    from jitserve.gateway.server import serve
    from jitserve.gateway.settings import settings_from_args
    from jitserve.policy import PolicyError
    from jitserve.sidecar.cli import serve_until_signalled

    settings = settings_from_args(args)
    fleet = fleet_from_args(args)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    try:
        serve_until_signalled(lambda stop: serve(settings, fleet, stop,
                                                 drain_s=args.drain_seconds))
    except PolicyError as err:
        raise CLIError(f"--config: {err}") from err
    except OSError as err:
        raise CLIError(str(err)) from err
    return 0


def register(subparsers: Any) -> Any:
    from jitserve.gateway.settings import add_gateway_arguments

    parser = subparsers.add_parser(
        "gateway", help="the OpenAI API in front of N sidecars, placing each request from "
        "their reports")
    add_gateway_arguments(parser)
    parser.set_defaults(handler=_serve)
    return parser
