"""Prefill pacing never blocks the queue: when the pacer holds the head's prompt back,
the next waiting request whose prompt fits what it allows starts instead."""

from __future__ import annotations

import numpy as np

from jitserve.scheduling.gmax import GMAX
from jitserve.slo import DeadlineSLO, LatencySLO
from tests.support.requests import live


def test_a_prompt_that_fits_the_pacer_starts_while_the_head_waits() -> None:
    gmax = GMAX()
    pacer = gmax.pacer
    assert pacer is not None
    running = live("running", slo=DeadlineSLO(60.0))
    gmax.enqueue(running, 0.0)
    assert gmax.pop_next(0.0, 0) is running  # now something runs: the pacer may pace
    head = live("head", prompt=4000, slo=LatencySLO(2.0, 0.1))
    small = live("small", prompt=100, slo=DeadlineSLO(60.0))
    gmax.enqueue(head, 0.0)
    gmax.enqueue(small, 0.0)
    # a step slower than the running request's need stops admissions, then one fast
    # enough lets prompts in at 1 / tau = 20 tokens/s
    pacer.on_frame(0.0, np.array([0.05]), 0.2)
    pacer.on_frame(1.0, np.array([0.05]), 0.04)
    assert 0 < pacer.rate < 100
    assert gmax.queue.peek() is head  # first in start order
    assert gmax.pop_next(1.0, 1) is None  # nothing fits yet
    # 12 s later ~140 tokens may start (the first start drew 100 ahead): not the head's
    # 4,000, but the small prompt
    assert gmax.pop_next(13.0, 1) is small
    assert gmax.waiting() == 1 and gmax.queue.peek() is head
