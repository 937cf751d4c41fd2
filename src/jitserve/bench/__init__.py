"""``jitserve bench``: the evidence (the top layer, beside ``jitserve.devstack``).

- :mod:`~jitserve.bench.cli`: simulated runs (policy x load x seed) and the report;
- :mod:`~jitserve.bench.variants`: each compared policy with its estimators;
- :mod:`~jitserve.bench.capacity`: the engine's capacity for a workload (load 1.0);
- :mod:`~jitserve.bench.report`: tables, JSON and plots;
- :mod:`~jitserve.bench.micro`: one GMAX decision over thousands of live requests;
- :mod:`~jitserve.bench.live`: the same workloads replayed against a live endpoint;
- :mod:`~jitserve.bench.compare`: that replay against the sidecar and its bare vLLM, A/B;
- :mod:`~jitserve.bench.stream`: the streaming client that times every token;
- :mod:`~jitserve.bench.overhead`: the latency the sidecar adds per streamed token.

Simulated runs need only the core dependencies; the live tools need the sidecar extra.
"""
