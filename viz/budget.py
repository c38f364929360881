"""Where one step's tokens went, against the token budget: decode rows, prefill chunks, padding rows.

A step is one forward over its rows. Under a token budget (scheduler.py) the decode rows go first,
one token each, and prompt chunks fill what is left, so a long prompt is cut into pieces over several
steps and the running users never wait for it. Static batching also computes a padding row for each
seat held by a finished request (a fixed-shape batch): work that produces nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from minillm.engine.trace import StepRecord, Trace
from viz.colors import DECODE, PREFILL
from viz.seats import SeatTable, seat_table


@dataclass(frozen=True)
class TokenSplit:
    decode: int  # decode rows (1 token each)
    prefill: int  # prompt tokens (whole prompts, or chunks of them)
    padding: int  # rows computed for nothing (held seats)

    @property
    def total(self) -> int:
        return self.decode + self.prefill + self.padding


def token_split(record: StepRecord) -> TokenSplit:
    decode = sum(ran for _, _, state, ran, _ in record.seats if state == "decode")
    prefill = sum(ran for _, _, state, ran, _ in record.seats if state == "prefill")
    return TokenSplit(decode, prefill, record.padding_rows)


def token_splits(trace: Trace, table: SeatTable | None = None) -> np.ndarray:
    """(steps, 3) int array: decode, prefill and padding tokens of every step, in one pass."""
    table = table or seat_table(trace)
    decode = table.per_step(table.tokens, table.state == DECODE)
    prefill = table.per_step(table.tokens, table.state == PREFILL)
    padding = np.array([s.padding_rows for s in trace.steps])
    return np.stack([decode, prefill, padding], axis=1).astype(np.int64)


def token_budget(trace: Trace) -> int | None:
    """The run's tokens per step (None: no budget; a version 1 trace or a student's policy may not say)."""
    return trace.config.get("token_budget") or None


def bar_scale(trace: Trace, splits: np.ndarray) -> int:
    """Tokens the bar's full width stands for: the budget, or without one the run's biggest step
    (so every step of a run is drawn on the same scale)."""
    budget = token_budget(trace)
    biggest = int(splits.sum(axis=1).max()) if len(splits) else 1
    return max(budget or 0, biggest, 1)
