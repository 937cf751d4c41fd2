"""The shared timeline of decode-step end times the engine delivers tokens on."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt


class Timeline:
    """End times of decode steps, indexed by global step number; trimmed from the left."""

    def __init__(self) -> None:
        self._data = np.empty(4096)
        self._base = 0  # global index of _data[0]
        self._len = 0

    @property
    def steps(self) -> int:
        return self._base + self._len

    def extend(self, times: npt.NDArray[np.float64]) -> None:
        need = self._len + times.size
        if need > self._data.size:
            grown = np.empty(max(need, 2 * self._data.size))
            grown[: self._len] = self._data[: self._len]
            self._data = grown
        self._data[self._len : need] = times
        self._len = need

    def window(self, start: int, stop: int) -> npt.NDArray[np.float64]:
        return self._data[start - self._base : stop - self._base]

    def trim(self, keep_from: int) -> None:
        drop = min(keep_from, self.steps) - self._base
        if drop > self._len // 2 and drop > 1024:
            self._data[: self._len - drop] = self._data[drop : self._len]
            self._len -= drop
            self._base += drop
