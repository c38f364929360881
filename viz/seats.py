"""A trace's seat entries as numpy columns: one pass over the trace, then every picture is array arithmetic.

A step records only its occupied seats, each as [seat, request id, state, tokens run, tokens produced].
A simulated run on a big card has tens of thousands of steps and up to 256 seats, so anything that
loops over steps x seats in Python each frame is too slow to replay; this table is built once per
trace, and the occupancy chart, the token-budget bars and the replies read its columns.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from operator import itemgetter

import numpy as np

from minillm.engine.trace import Trace
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


def seat_table(trace: Trace) -> SeatTable:
    """One pass over the trace, a column at a time (a simulated run can hold millions of entries; building
    one big tuple per column instead would wake the garbage collector over and over)."""
    entries = list(chain.from_iterable(record.seats for record in trace.steps))
    index = {r.id: i for i, r in enumerate(trace.requests)}

    def column(i: int, dtype, translate=None) -> np.ndarray:
        values = map(itemgetter(i), entries)
        return np.fromiter(map(translate, values) if translate else values, dtype=dtype, count=len(entries))

    per_step = [len(record.seats) for record in trace.steps]
    return SeatTable(
        num_steps=len(trace.steps),
        num_seats=trace.config["slots"],
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
