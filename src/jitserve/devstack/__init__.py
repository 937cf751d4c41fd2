"""``jitserve up``: the whole data plane as local processes (the top layer).

- :mod:`~jitserve.devstack.tinymodel`: the tiny dummy-weight model vLLM serves on CPU;
- :mod:`~jitserve.devstack.vllm`: finding and starting the CPU vLLM (tests, ``jitserve up``);
- :mod:`~jitserve.devstack.up`: vLLM + analyzer + sidecar, stopped together.
"""
