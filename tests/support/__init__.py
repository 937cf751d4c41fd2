"""What the tests share, one module per collaborator (imported as ``tests.support.x``):

- ``waiting``: the one ``wait_until``;
- ``http``: small blocking and streaming clients, Prometheus text parsing;
- ``vllm``: the one tiny real vLLM launcher (the session fixture lives in tests/conftest.py);
- ``sidecar``: the one ``jitserve sidecar serve`` process;
- ``stall``: a TCP relay that freezes the bytes between two real parts on demand;
- ``fake_vllm``: the one FAKE vLLM, for what the real one cannot show on demand;
- ``ledgers``, ``requests``: in-memory recorders and builders for the unit tests;
- ``k8s``, ``kube_fake``, ``operator``: the real control plane, an in-memory API server,
  and the operator session;
- ``analyzer``: a real analyzer gRPC server in-process;
- ``picker``, ``gaie``: the endpoint picker over real gRPC with Envoy's generated protos,
  and the InferencePool CRD on the test API server.
"""
