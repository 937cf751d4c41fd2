"""The scheduler sidecar: an OpenAI-compatible proxy that holds the request queue and
drives a stock vLLM with the scheduling core's policy objects (GMAX or a baseline).

Owner: the sidecar engineer. Modules:

- :mod:`~jitserve.sidecar.api`: request bodies and per-request SLOs;
- :mod:`~jitserve.sidecar.backend`: aiohttp client toward vLLM (token ids, priority, abort);
- :mod:`~jitserve.sidecar.dispatcher`: frame loop, preemption as continuation, outcomes;
- :mod:`~jitserve.sidecar.admission`: who may enter now (draining, backend down, queue
  and program caps) and ``Retry-After``;
- :mod:`~jitserve.sidecar.server`: aiohttp routes, streaming, errors, probes, metrics;
- :mod:`~jitserve.sidecar.completions`: the scheduled chat and text completion routes;
- :mod:`~jitserve.sidecar.config`: settings, hot-reloaded policy file, tenant keys;
- :mod:`~jitserve.sidecar.metrics`: Prometheus families;
- :mod:`~jitserve.sidecar.cli`: ``jitserve sidecar serve``.

The request lifecycle the dispatcher drives is :mod:`jitserve.serving` (the simulator
drives the same one). Nothing below this layer imports it; the local dev stack
(``jitserve.devstack``) and the load tools (``jitserve.bench``) sit above it.
"""
