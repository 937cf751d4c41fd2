"""jitserve picks its own scheduler (issue 31): a twin of the engine replays the traffic
it just saw (:mod:`jitserve.serving.traffic`, the past only) through every candidate
policy, and the one that would have earned the most takes over (:mod:`.tuner`)."""
