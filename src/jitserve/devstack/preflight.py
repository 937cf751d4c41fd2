"""``jitserve up``'s preflight: every port it will bind and the disk it writes, checked
before anything starts (owner: devstack).

vLLM takes a minute or more to start; a port taken by another process or a full disk must
fail the command at once, naming the flag or the path to change, not after vLLM is up.
"""

from __future__ import annotations

import argparse
import shutil
import socket
from pathlib import Path

from jitserve.devstack.fleet import ADMIN_OFFSET, replica_ports
from jitserve.errors import CLIError


def planned_ports(args: argparse.Namespace) -> list[tuple[str, int, str]]:
    """(host, port, the flag that moves it) for every port ``jitserve up`` binds."""
    ports = [(args.host, args.port, "--port")]
    starts_vllm = args.backend is None
    if starts_vllm:
        ports += [("127.0.0.1", args.vllm_port + i, "--vllm-port")
                  for i in range(args.replicas)]
    if not args.no_analyzer:
        ports.append(("127.0.0.1", args.analyzer_port, "--analyzer-port"))
    if args.replicas > 1:
        ports.append((args.host, args.port + ADMIN_OFFSET, "--port"))
        for api, admin in replica_ports(args):
            ports += [("127.0.0.1", api, "--replica-port"), ("127.0.0.1", admin, "--replica-port")]
    return ports


def check_ports(ports: list[tuple[str, int, str]]) -> None:
    """CLIError naming the first port that is taken (or planned twice) and its flag."""
    seen: dict[int, str] = {}
    for host, port, flag in ports:
        if port in seen:
            raise CLIError(f"port {port} is planned twice ({seen[port]} and {flag}): "
                           f"move one with {flag} PORT")
        seen[port] = flag
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((host, port))
            except OSError as err:
                raise CLIError(f"port {port} on {host} is not free ({err.strerror}): "
                               f"another process listens there; pass {flag} PORT") from None


UP_DISK_NEEDED = 1 << 30
"""What ``jitserve up`` writes beside the vLLM environment: the tiny model, vLLM's compile
cache (~300 MB on first start), the logs of a long run."""


def check_disk(path: Path, needed: int, what: str) -> None:
    """CLIError when the file system holding ``path`` has less than ``needed`` bytes free."""
    probe = path
    while not probe.exists():
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if free < needed:
        raise CLIError(f"{what}: {free / 2**30:.1f} GiB free on the disk of {path}, "
                       f"{needed / 2**30:.1f} GiB needed; free some space or set "
                       f"JITSERVE_CACHE to a larger disk")
