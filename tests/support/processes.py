"""Is a process (or a process group) still there?"""

from __future__ import annotations

import os


def alive(pid: int, *, group: bool = False) -> bool:
    try:
        (os.killpg if group else os.kill)(pid, 0)
    except ProcessLookupError:
        return False
    return True
