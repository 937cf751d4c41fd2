"""Sizing the serving pool: jitserve's SLO planner and the rules users run today, as pure
functions of what the pool reports each period (the simulator and the operator both feed
them :class:`~jitserve.scaling.signals.PoolSignals`)."""
