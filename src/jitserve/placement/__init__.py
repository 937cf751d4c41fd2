"""Placement: which replica serves a request (owner: placement; pure, no I/O).

One package for the simulator (:mod:`jitserve.sim.cluster`), the gateway
(``jitserve gateway``) and the Gateway API endpoint picker (``jitserve picker``): each
turns what it knows of a request into an :class:`~jitserve.placement.base.Ask`, what it
knows of the replicas into :class:`~jitserve.placement.base.ReplicaReport` s, and asks a
:class:`~jitserve.placement.base.Placer` for a :class:`~jitserve.placement.base.Pick`
or a :class:`~jitserve.placement.base.Refusal`.
"""
