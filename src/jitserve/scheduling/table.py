"""The waiting queue as a table: one row per waiting request, its scheduling features in
columns (numpy arrays), its sort key in one more column.

A waiting request's state does not change while it waits (tokens, prefill, bounds and
its program's stage move only while it runs or between stages, when none of its calls
waits), so its features are read once, when it is pushed, and a frame scores the whole
queue with array operations instead of a Python loop per request. Rows are kept dense
(removal moves the last row into the hole): O(1) push and remove, O(n) vectorised peek.
Ties between equal keys go to the request pushed first, as in a heap with a sequence
number.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from jitserve.requests import LiveRequest
from jitserve.slo import LatencySLO

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.int64]

FLOAT_COLUMNS = (
    "arrival", "prompt", "generated", "remaining", "typical", "prefill_left", "deadline",
    "whole_deadline", "due0", "tbt", "sunk", "key", "priority", "queued",
)  # fmt: skip
BOOL_COLUMNS = ("is_latency", "first_token", "started", "demoted")
INT_COLUMNS = ("program", "tenant", "waited", "seq")


@dataclass(slots=True)
class Features:
    """Scheduling features of a set of requests, one entry per request (see
    :func:`features_of` for what each column holds)."""

    arrival: FloatArray
    prompt: FloatArray
    generated: FloatArray
    remaining: FloatArray
    typical: FloatArray
    prefill_left: FloatArray
    deadline: FloatArray
    whole_deadline: FloatArray
    due0: FloatArray
    tbt: FloatArray
    sunk: FloatArray
    is_latency: BoolArray
    first_token: BoolArray
    started: BoolArray
    demoted: BoolArray
    program: IntArray
    tenant: IntArray
    waited: IntArray

    def __len__(self) -> int:
        return int(self.arrival.size)

    def token_due(self, token: FloatArray) -> FloatArray:
        """When each latency row's output token ``token`` is due (``due0`` is arrival +
        TTFT: :meth:`~jitserve.slo.LatencySLO.due_s` over columns)."""
        return self.due0 + token * self.tbt

    @staticmethod
    def concat(parts: Sequence[Features]) -> Features:
        return Features(
            *(np.concatenate([getattr(p, name) for p in parts]) for name in Features.__slots__)
        )


def one_row(features: Features, row: int) -> Features:
    """The features of one row (copies)."""
    return Features(*(getattr(features, name)[row : row + 1].copy() for name in Features.__slots__))


class TenantCodes:
    """Small integers for tenant names, so that a column can hold them."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self._code: dict[str, int] = {}

    def code(self, tenant: str) -> int:
        c = self._code.get(tenant)
        if c is None:
            c = self._code[tenant] = len(self.names)
            self.names.append(tenant)
        return c


def feature_row(
    r: LiveRequest, tenants: TenantCodes
) -> tuple[tuple[float, ...], tuple[bool, ...], tuple[int, ...]]:
    """(float, bool, int) features of ``r``, in :data:`FLOAT_COLUMNS`, ... order, up to
    ``sunk`` / ``demoted`` (False) / ``waited`` (0).

    ``remaining``: output tokens left under the bound (its q-quantile); ``typical``:
    under the expected length; ``deadline``: the one a scheduler plans toward (compound:
    the stage sub-deadline; latency: infinite, its timeline is ``due0 + i * tbt``);
    ``whole_deadline``: the one the request is judged by (compound: the program's);
    ``sunk``: for a compound call, 1 / (1 - phi(s-1)), what finishing the program
    multiplies the rest of its engine time by; ``program``: its program's identity (-1:
    none)."""
    req = r.req
    g = r.generated
    slo = req.slo
    lp = r.program
    latency = isinstance(slo, LatencySLO) and lp is None
    if latency:
        assert isinstance(slo, LatencySLO)
        deadline = whole = math.inf
        due0, tbt = slo.due_s(req.arrival_s, 0), slo.tbt_s
    elif lp is not None:
        deadline, whole, due0, tbt = lp.stage_deadline_abs_s, lp.deadline_abs_s, 0.0, 0.0
    else:
        deadline = whole = req.arrival_s + slo.deadline_s  # type: ignore[union-attr]
        due0, tbt = 0.0, 0.0
    sunk = 1.0 / max(1.0 - lp.prev_stage_share, 0.05) if lp is not None else 1.0
    floats = (
        req.arrival_s, float(req.prompt_tokens), float(g), float(max(r.bound - g, 1)),
        float(max((r.expected or r.bound) - g, 1)), float(r.prefill_target - r.prefilled),
        deadline, whole, due0, tbt, sunk,
    )  # fmt: skip
    flags = (latency, r.first_token_s is not None, r.started_s is not None, False)
    return floats, flags, (id(lp) if lp is not None else -1, tenants.code(req.tenant), 0)


def features_of(
    rs: Sequence[LiveRequest],
    demoted: AbstractSet[LiveRequest] = frozenset(),
    waited: dict[LiveRequest, int] | None = None,
    tenants: TenantCodes | None = None,
) -> Features:
    """The features of ``rs`` (a Python loop: for the running few, or tests)."""
    n = len(rs)
    codes = tenants or TenantCodes()
    rows = [feature_row(r, codes) for r in rs]
    floats = np.array([row[0] for row in rows], dtype=np.float64).reshape(n, 11)
    flags = np.array([row[1] for row in rows], dtype=bool).reshape(n, 4)
    ints = np.array([row[2] for row in rows], dtype=np.int64).reshape(n, 3)
    if demoted:
        flags[:, 3] = [r in demoted for r in rs]
    if waited:
        ints[:, 2] = [waited.get(r, 0) for r in rs]
    return Features(*floats.T.copy(), *flags.T.copy(), *ints.T.copy())


class WaitingTable:
    """A waiting queue ordered by a key (lower first), with the requests' features in
    columns. ``rows[i]`` is the request in row ``i``; column arrays are valid up to
    ``len(self)``."""

    def __init__(self, capacity: int = 64) -> None:
        self.tenants = TenantCodes()
        self.rows: list[LiveRequest] = []
        self._row: dict[LiveRequest, int] = {}
        self._seq = itertools.count()
        self._cap = capacity
        self._f = np.zeros((len(FLOAT_COLUMNS), capacity))
        self._b = np.zeros((len(BOOL_COLUMNS), capacity), dtype=bool)
        self._i = np.zeros((len(INT_COLUMNS), capacity), dtype=np.int64)

    # ---- columns ------------------------------------------------------------------------
    def floats(self, name: str) -> FloatArray:
        return self._f[FLOAT_COLUMNS.index(name), : len(self.rows)]

    def flags(self, name: str) -> BoolArray:
        return self._b[BOOL_COLUMNS.index(name), : len(self.rows)]

    def ints(self, name: str) -> IntArray:
        return self._i[INT_COLUMNS.index(name), : len(self.rows)]

    def features(self) -> Features:
        """The features of every row (views: valid until the table changes)."""
        n = len(self.rows)
        f, b, i = self._f[:, :n], self._b[:, :n], self._i[:, :n]
        return Features(
            f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7], f[8], f[9], f[10],
            b[0], b[1], b[2], b[3], i[0], i[1], i[2],
        )  # fmt: skip

    def row_of(self, r: LiveRequest) -> int | None:
        return self._row.get(r)

    # ---- the queue ----------------------------------------------------------------------
    def push(self, r: LiveRequest, key: float, now_s: float | None = None) -> None:
        """Add ``r``; if it is in already, read its features again (its bounds were
        refined while it waited) and give it ``key``, keeping what the policy wrote
        (frames waited, demotion, priority). ``queued``: since when ``r`` waits, its
        arrival or, for a request that ran before (preempted), ``now_s``."""
        i = self._row.get(r)
        if i is not None:
            floats, flags, ints = feature_row(r, self.tenants)
            self._f[:11, i] = floats
            self._f[11, i] = key
            self._b[:3, i] = flags[:3]
            self._i[:2, i] = ints[:2]
            return
        i = len(self.rows)
        if i == self._cap:
            self._grow()
        floats, flags, ints = feature_row(r, self.tenants)
        self._f[:11, i] = floats
        self._f[11, i] = key
        self._f[12, i] = 0.0
        preempted = r.started_s is not None and now_s is not None
        self._f[13, i] = now_s if preempted and now_s is not None else r.req.arrival_s
        self._b[:, i] = flags
        self._i[:3, i] = ints
        self._i[3, i] = next(self._seq)
        self.rows.append(r)
        self._row[r] = i

    def _grow(self) -> None:
        self._cap *= 2
        for name in ("_f", "_b", "_i"):
            old = getattr(self, name)
            new = np.zeros((old.shape[0], self._cap), dtype=old.dtype)
            new[:, : old.shape[1]] = old
            setattr(self, name, new)

    def remove(self, r: LiveRequest) -> None:
        i = self._row.pop(r, None)
        if i is None:
            return
        last = len(self.rows) - 1
        if i != last:
            moved = self.rows[last]
            self.rows[i] = moved
            self._row[moved] = i
            self._f[:, i] = self._f[:, last]
            self._b[:, i] = self._b[:, last]
            self._i[:, i] = self._i[:, last]
        self.rows.pop()

    def best_row(self, mask: BoolArray | None = None) -> int | None:
        """The row with the lowest key (among ``mask``), ties to the earliest push."""
        n = len(self.rows)
        if n == 0:
            return None
        keys = self._f[11, :n]
        if mask is not None:
            if not mask.any():
                return None
            keys = np.where(mask, keys, np.inf)
        low = keys.min()
        if mask is not None and low == np.inf:
            candidates = np.flatnonzero(mask)
        else:
            candidates = np.flatnonzero(keys == low)
        if candidates.size == 1:
            return int(candidates[0])
        seqs = self._i[3, candidates]
        return int(candidates[int(np.argmin(seqs))])

    def ahead_of(self, r: LiveRequest) -> int:
        """How many rows come before ``r`` in queue order (all of them if it is not in)."""
        n = len(self.rows)
        i = self._row.get(r)
        if i is None:
            return n
        keys, seqs = self._f[11, :n], self._i[3, :n]
        before = (keys < keys[i]) | ((keys == keys[i]) & (seqs < seqs[i]))
        return int(np.count_nonzero(before))

    def peek(self) -> LiveRequest | None:
        i = self.best_row()
        return None if i is None else self.rows[i]

    def peek_key(self) -> float | None:
        i = self.best_row()
        return None if i is None else float(self._f[11, i])

    def pop(self) -> LiveRequest | None:
        r = self.peek()
        if r is not None:
            self.remove(r)
        return r

    def in_arrival_order(self) -> list[LiveRequest]:
        """Every waiting request in the order it was (first) pushed."""
        order = np.argsort(self._i[3, : len(self.rows)], kind="stable")
        return [self.rows[i] for i in order.tolist()]

    def head(self, n: int) -> list[LiveRequest]:
        """The first ``n`` requests in queue order."""
        count = len(self.rows)
        if n <= 0 or count == 0:
            return []
        order = np.lexsort((self._i[3, :count], self._f[11, :count]))[:n]
        return [self.rows[i] for i in order]

    def set_keys(self, keys: FloatArray | Sequence[float]) -> None:
        """New keys for every row, in row order."""
        self._f[11, : len(self.rows)] = keys

    def __len__(self) -> int:
        return len(self.rows)

    def __contains__(self, r: LiveRequest) -> bool:
        return r in self._row


def out_of_reach_rows(
    features: Features, now_s: float, prefill_s: float, decode_s: float
) -> BoolArray:
    """:func:`jitserve.scheduling.slack.out_of_reach` over requests given by their
    features, as arrays (tests/core/test_waiting_table.py holds the two to the same
    answers)."""
    fastest = features.prefill_left * prefill_s + decode_s
    due = features.token_due(features.generated)
    latency_lost = ~features.first_token & (now_s + fastest > due)
    return np.where(features.is_latency, latency_lost, now_s + fastest > features.whole_deadline)


def late_to_start_rows(
    features: Features, now_s: float, prefill_s: float, decode_s: float
) -> BoolArray:
    """:func:`jitserve.scheduling.slack.late_to_start` over requests given by their
    features, as arrays (tests/scheduling/test_waiting_table.py holds the two to the same
    answers)."""
    latency_start = features.token_due(features.generated) - (features.prefill_left + 1) * prefill_s
    other_start = features.whole_deadline - (
        features.prefill_left * prefill_s + features.typical * decode_s
    )
    return now_s > np.where(features.is_latency, latency_start, other_start)
