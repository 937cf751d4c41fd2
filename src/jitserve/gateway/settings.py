"""``jitserve gateway``'s settings and flags (owner: gateway).

The door's limits are the sidecar's own (:class:`~jitserve.sidecar.config.SidecarSettings`
fields, same defaults, checked by the same :mod:`jitserve.sidecar.intake` code):
:meth:`GatewaySettings.door` hands them to it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from jitserve.errors import flag_error
from jitserve.gateway.fleet import add_fleet_flags
from jitserve.placement.registry import PLACERS
from jitserve.sidecar.config import SidecarSettings


def default_placement() -> str:
    """power-of-K (the paper's placement) where it is registered, else least-loaded."""
    return "power-of-k" if "power-of-k" in PLACERS else "least-loaded"


class GatewaySettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    host: str = "0.0.0.0"
    port: int = Field(default=8000, ge=0, le=65535)
    admin_port: int | None = Field(default=9000, ge=0, le=65535)
    config_path: Path | None = None
    placement: str = Field(default_factory=default_placement)
    seed: int = 0
    max_in_flight: int = Field(default=1024, ge=1, le=1_000_000)
    connect_timeout_s: float = Field(default=2.0, gt=0, le=60)
    max_body_bytes: int = Field(default=1 << 20, ge=1024, le=1 << 30)
    header_timeout_s: float = Field(default=10.0, gt=0, le=600)
    body_timeout_s: float = Field(default=30.0, gt=0, le=600)
    max_json_depth: int = Field(default=32, ge=4, le=512)
    reload_interval_s: float = Field(default=1.0, gt=0, le=300)

    def door(self) -> SidecarSettings:
        """The limits :mod:`jitserve.sidecar.intake` checks, as a sidecar would."""
        return SidecarSettings(max_body_bytes=self.max_body_bytes,
                               header_timeout_s=self.header_timeout_s,
                               body_timeout_s=self.body_timeout_s,
                               max_json_depth=self.max_json_depth)


FLAGS = {"host": "--host", "port": "--port", "admin_port": "--admin-port",
         "config_path": "--config", "placement": "--placement", "seed": "--seed",
         "max_in_flight": "--max-in-flight", "connect_timeout_s": "--connect-timeout",
         "max_body_bytes": "--max-body-bytes", "header_timeout_s": "--header-timeout",
         "body_timeout_s": "--body-timeout", "max_json_depth": "--max-json-depth",
         "reload_interval_s": "--reload-interval"}


def add_gateway_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="0.0.0.0", help="address the API binds")
    p.add_argument("--port", type=int, default=8000, help="the OpenAI API's port (0: any)")
    p.add_argument("--admin-port", type=int, default=9000,
                   help="/health, /ready and /metrics (Prometheus) on this port (0: any)")
    p.add_argument("--config", type=Path, metavar="FILE",
                   help="the SLOPolicy spec file the sidecars serve (SLO classes, defaults "
                   "and limits, to build each request's placement ask); default: the "
                   "built-in policy")
    p.add_argument("--placement", default=default_placement(), metavar="NAME",
                   help=f"placement policy: {', '.join(sorted(PLACERS))}")
    p.add_argument("--seed", type=int, default=0, help="seed of randomized placements")
    p.add_argument("--max-in-flight", type=int, default=1024, metavar="N",
                   help="requests open at once; beyond, 429 + Retry-After (bounded memory)")
    p.add_argument("--connect-timeout", type=float, default=2.0, metavar="SECONDS",
                   help="connecting to a replica; past it the next replica is tried")
    p.add_argument("--max-body-bytes", type=int, default=1 << 20, metavar="BYTES",
                   help="largest request body (413 beyond)")
    p.add_argument("--header-timeout", type=float, default=10.0, metavar="SECONDS",
                   help="a connection must send a request's headers within this")
    p.add_argument("--body-timeout", type=float, default=30.0, metavar="SECONDS",
                   help="a request body must arrive within this (408)")
    p.add_argument("--max-json-depth", type=int, default=32, metavar="LEVELS",
                   help="deepest nesting of arrays/objects in a body (400)")
    p.add_argument("--reload-interval", type=float, default=1.0, metavar="SECONDS",
                   help="how often --config is re-read")
    p.add_argument("--drain-seconds", type=float, default=20.0, metavar="SECONDS",
                   help="on SIGTERM, how long open requests get to finish")
    p.add_argument("--log-level", default="INFO",
                   choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="log level")
    add_fleet_flags(p)


def settings_from_args(args: argparse.Namespace) -> GatewaySettings:
    from jitserve.errors import CLIError

    if args.placement not in PLACERS:
        raise CLIError(f"--placement: unknown placement {args.placement!r}; choose from "
                       f"{', '.join(sorted(PLACERS))}")
    try:
        return GatewaySettings(
            host=args.host, port=args.port, admin_port=args.admin_port,
            config_path=args.config, placement=args.placement, seed=args.seed,
            max_in_flight=args.max_in_flight, connect_timeout_s=args.connect_timeout,
            max_body_bytes=args.max_body_bytes, header_timeout_s=args.header_timeout,
            body_timeout_s=args.body_timeout, max_json_depth=args.max_json_depth,
            reload_interval_s=args.reload_interval)
    except ValidationError as err:
        raise flag_error(err.errors(), FLAGS) from err
