"""The scheduler sidecar: an OpenAI-compatible proxy that holds the request queue and
drives a stock vLLM with the scheduling core's policy objects (GMAX or a baseline).

Owner: the sidecar engineer. Modules:

- :mod:`~jitserve.sidecar.api`: request bodies and per-request SLOs;
- :mod:`~jitserve.sidecar.backend`: aiohttp client toward vLLM (token ids, priority, abort);
- :mod:`~jitserve.sidecar.dispatcher`: frame loop, preemption as continuation, outcomes;
- :mod:`~jitserve.sidecar.server`: aiohttp routes, streaming, errors, probes, metrics;
- :mod:`~jitserve.sidecar.config`: settings, hot-reloaded policy file, tenant keys;
- :mod:`~jitserve.sidecar.metrics`: Prometheus families;
- :mod:`~jitserve.sidecar.vllm`: finding and starting the CPU vLLM (tests, ``jitserve up``);
- :mod:`~jitserve.sidecar.tinymodel`: the tiny local model vLLM serves on CPU;
- :mod:`~jitserve.sidecar.loadgen`: live benchmark and proxy-overhead measurement;
- :mod:`~jitserve.sidecar.cli` and :mod:`~jitserve.sidecar.up`: ``jitserve sidecar`` and
  ``jitserve up``.

The scheduling core (``jitserve.scheduling``, ``jitserve.goodput``) imports nothing
from here.
"""
