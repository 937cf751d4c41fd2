"""The endpoint picker's gRPC server: ext_proc and the health services (owner: gateway).

One ``grpc.aio`` server on one port carries ``envoy.service.ext_proc.v3.ExternalProcessor``
(:class:`~jitserve.gateway.picker.EndpointPicker`) and the standard
``grpc.health.v1.Health`` with the services the endpoint-picker protocol names:

- ``liveness``: SERVING while the process answers;
- ``readiness`` and ``envoy.service.ext_proc.v3.ExternalProcessor``: SERVING once the
  picker takes requests (its replica reports are being read), NOT_SERVING before and
  while it drains on SIGTERM, so the gateway stops sending it streams first;
- ``""`` (the server as a whole): as liveness.

There is no leader election: every picker replica places from the same reports, as the
gateway's replicas do, so each is ready on its own.
"""

from __future__ import annotations

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ep_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from jitserve.gateway.picker import EndpointPicker

EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
LIVENESS = "liveness"
READINESS = "readiness"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class PickerServer:
    def __init__(self, picker: EndpointPicker, address: str = "0.0.0.0:9002",
                 max_message_bytes: int = 4 << 20) -> None:
        self.picker = picker
        self.address = address
        self.health = HealthServicer()
        self.server = grpc.aio.server(options=[
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
        ])
        ep_grpc.add_ExternalProcessorServicer_to_server(picker, self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self.port = 0

    async def start(self) -> int:
        """Listen (NOT_SERVING until :meth:`ready`); returns the bound port."""
        self.port = self.server.add_insecure_port(self.address)
        if not self.port:
            raise OSError(f"cannot listen on {self.address}")
        await self.health.set("", SERVING)
        await self.health.set(LIVENESS, SERVING)
        await self.ready(False)
        await self.server.start()
        return self.port

    async def ready(self, ready: bool) -> None:
        status = SERVING if ready else NOT_SERVING
        for service in (READINESS, EXT_PROC_SERVICE):
            await self.health.set(service, status)

    async def stop(self, grace_s: float) -> None:
        """Refuse new streams, let open ones finish within ``grace_s``."""
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace_s)
