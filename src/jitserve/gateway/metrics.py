"""The gateway's Prometheus families (owner: gateway), on its admin port's ``/metrics``.

- ``jitserve_gateway_requests_total{replica, outcome}``: every request the gateway
  answered, by the replica that served it (``none`` when refused before placement) and
  how it ended: ``ok``, ``client_error`` (a replica's 4xx passed through),
  ``server_error`` (a replica's 5xx passed through), ``failed_midstream`` (an error
  event after the first byte), ``shed`` (429 from the gateway), ``no_replica`` (503),
  ``bad_request`` (refused at the door), ``cancelled`` (the client left);
- ``jitserve_gateway_failovers_total{replica}``: attempts that failed before their first
  byte on ``replica`` and went on to the next;
- ``jitserve_gateway_placement_seconds``: time to decide where a request goes;
- ``jitserve_gateway_replicas{state}``: the fleet (``known``, ``ready``: in the picks);
- ``jitserve_gateway_in_flight``: requests open now.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

OUTCOMES = ("ok", "client_error", "server_error", "failed_midstream", "shed", "no_replica",
            "bad_request", "cancelled")


class GatewayMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter("jitserve_gateway_requests", "Requests answered, by replica "
                                "and outcome.", ["replica", "outcome"], registry=r)
        self.failovers = Counter("jitserve_gateway_failovers", "Attempts that failed before "
                                 "their first byte and were placed again.", ["replica"],
                                 registry=r)
        self.placement = Histogram(
            "jitserve_gateway_placement_seconds", "Time to place one request.", registry=r,
            buckets=(1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2))
        self.replicas = Gauge("jitserve_gateway_replicas", "Replicas known, and ready (in "
                              "the picks).", ["state"], registry=r)
        self.in_flight = Gauge("jitserve_gateway_in_flight", "Requests open now.", registry=r)

    def answered(self, replica: str | None, outcome: str) -> None:
        self.requests.labels(replica or "none", outcome).inc()

    def render(self, known: int, ready: int) -> bytes:
        self.replicas.labels("known").set(known)
        self.replicas.labels("ready").set(ready)
        return generate_latest(self.registry)
