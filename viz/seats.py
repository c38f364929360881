"""A trace's seat entries as numpy columns: one pass over the trace, then every picture is array arithmetic.

A step records only its occupied seats, each as [seat, request id, state, tokens run, tokens produced].
A simulated run on a big card has tens of thousands of steps and up to 256 seats, so anything that
loops over steps x seats in Python each frame is too slow to replay; these columns are built once per
trace, as part of its TraceTable (table.py), which every picture reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from operator import itemgetter

import numpy as np

from viz.colors import DECODE, PREFILL, STATE_CODES


@dataclass(frozen=True)
class SeatTable:
    num_steps: int
    num_seats: int
    step: np.ndarray  # (E,) the step of each entry
    seat: np.ndarray  # (E,)
    state: np.ndarray  # (E,) colors.STATE_CODES
    request: np.ndarray  # (E,) index into trace.requests
    tokens: np.ndarray  # (E,) tokens it ran this step (a prefill chunk's length, 1 for decode, 0 held/stalled)
    produced: np.ndarray  # (E,) tokens it produced this step (0 or 1; more when it checked draft tokens)

    def per_step(self, values: np.ndarray, where: np.ndarray | None = None) -> np.ndarray:
        """(steps,) sum of `values` over each step's entries (only those `where` is True)."""
        weights = values if where is None else values * where
        return np.bincount(self.step, weights=weights, minlength=self.num_steps)

    @property
    def working(self) -> np.ndarray:
        """(E,) True where the seat ran tokens (prefill or decode): what utilization counts."""
        return (self.state == PREFILL) | (self.state == DECODE)


def seat_table_of(seats: list[list[list]], index: dict[str, int], slots: int) -> SeatTable:
    """The columns of each step's seat entries (`seats`: one list per step), a column at a time (a simulated run can
    hold millions of entries; building one big tuple per column instead would wake the garbage collector over and
    over). index: request id -> its place in the trace's requests."""
    entries = list(chain.from_iterable(seats))

    def column(i: int, dtype, translate=None) -> np.ndarray:
        values = map(itemgetter(i), entries)
        return np.fromiter(map(translate, values) if translate else values, dtype=dtype, count=len(entries))

    per_step = [len(step) for step in seats]
    return SeatTable(
        num_steps=len(seats),
        num_seats=slots,
        step=np.repeat(np.arange(len(per_step), dtype=np.int32), per_step),
        seat=column(0, np.int32),
        request=column(1, np.int32, index.__getitem__),
        state=column(2, np.int8, STATE_CODES.__getitem__),
        tokens=column(3, np.int32),
        produced=column(4, np.int32),
    )


def seat_grids(table: SeatTable) -> tuple[np.ndarray, np.ndarray]:
    """(seats, steps) state codes (0: empty) and request indices (-1: empty)."""
    shape = (table.num_seats, table.num_steps)
    states, requests = np.zeros(shape, dtype=np.int8), np.full(shape, -1, dtype=np.int32)
    states[table.seat, table.step] = table.state
    requests[table.seat, table.step] = table.request
    return states, requests
