"""jitserve: SLO-aware LLM serving control plane (JITServe's GMAX scheduler on Kubernetes).

Data flow and ownership:
- ``slo`` / ``requests``: what a request asks for (pure data, validated on construction).
- ``goodput``: what a finished request earned (pure accounting).
- ``policy``: the ``SLOPolicy`` settings model, single source of truth for the CRD and
  the sidecar config.
- ``scheduling``: policies (GMAX and baselines) that rank and group live requests.
- ``sim``: a discrete-event vLLM-like engine that drives those same policy objects.
"""

__version__ = "0.1.0"
