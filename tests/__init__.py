"""jitserve's test suite: one folder per package of ``src/jitserve``, helpers in ``support``."""
