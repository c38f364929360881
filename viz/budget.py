"""Where one step's tokens went, against the token budget: decode rows, prefill chunks, padding rows.

A step is one forward over its rows. Under a token budget (scheduler.py) the decode rows go first,
one token each, and prompt chunks fill what is left, so a long prompt is cut into pieces over several
steps and the running users never wait for it. Static batching also computes a padding row for each
seat held by a finished request (a fixed-shape batch): work that produces nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from minillm.layers.trace import StepRecord, Trace
from viz.table import TraceTable, table_of


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


def token_splits(source: Trace | TraceTable) -> np.ndarray:
    """(steps, 3) int array: decode, prefill and padding tokens of every step (the table's column)."""
    return table_of(source).splits


def token_budget(source: Trace | TraceTable) -> int | None:
    """The run's tokens per step (None: no budget; a version 1 trace or a student's policy may not say)."""
    return source.config.get("token_budget") or None


def bar_scale(table: TraceTable) -> int:
    """Tokens the bar's full width stands for: the budget, or without one the run's biggest step
    (so every step of a run is drawn on the same scale)."""
    biggest = int(table.splits.sum(axis=1).max()) if len(table.splits) else 1
    return max(table.budget or 0, biggest, 1)
