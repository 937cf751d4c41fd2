"""StallWatch: one lazily re-armed timer bounds each await a task arms it for.

The event loop runs on a virtual clock here (its ``time`` replaced): time moves only when
a test moves it, so no assertion depends on how busy the machine is."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from jitserve.sidecar.watch import StallWatch


class Stalled(Exception):
    pass


def on_virtual_clock(body: Callable[[list[float]], Coroutine[Any, Any, None]]) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        now = [loop.time()]
        loop.time = lambda: now[0]  # type: ignore[method-assign]
        await body(now)

    asyncio.run(main())


async def turn() -> None:
    """Turns of the loop: timers due on the virtual clock run, and what they do (a
    cancel) reaches this task."""
    for _ in range(3):
        await asyncio.sleep(0)


def test_awaits_shorter_than_the_limit_outlive_it_and_a_longer_one_stalls() -> None:
    async def body(now: list[float]) -> None:
        watch = StallWatch(1.0)
        for _ in range(10):  # 5 s of awaits of 0.5 s each against a 1 s limit
            watch.arm()
            now[0] += 0.5
            await turn()
        watch.arm()
        now[0] += 1.5  # then one await longer than the limit
        with pytest.raises(asyncio.CancelledError):
            await turn()
        assert watch.expired()  # the watch's cancel, taken back: the task raises its own
        watch.close()

    on_virtual_clock(body)


def test_time_spent_disarmed_does_not_count() -> None:
    async def body(now: list[float]) -> None:
        watch = StallWatch(1.0)
        watch.arm()
        watch.disarm()
        now[0] += 10.0  # e.g. the consumer busy between two reads
        await turn()
        await turn()
        watch.arm()  # bounded again from now
        now[0] += 0.9
        await turn()
        watch.close()

    on_virtual_clock(body)


def test_a_cancel_from_elsewhere_stays_a_cancel() -> None:
    async def body(now: list[float]) -> None:
        async def reader() -> None:
            watch = StallWatch(10.0)
            watch.arm()
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                if watch.expired():
                    raise Stalled from None
                raise
            finally:
                watch.close()

        task = asyncio.create_task(reader())
        await turn()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    on_virtual_clock(body)


def test_no_limit_never_fires() -> None:
    async def body(now: list[float]) -> None:
        watch = StallWatch(None)
        watch.arm()
        now[0] += 1e6
        await turn()
        assert not watch.expired()
        watch.close()

    on_virtual_clock(body)
