"""The fleet's front door (owner: gateway): ``jitserve gateway``, the OpenAI API in front
of N sidecars, placing each request from the sidecars' reports with
:mod:`jitserve.placement`; and ``jitserve picker``, the same placement as a Gateway API
Inference Extension endpoint picker (Envoy ext_proc over gRPC)."""
