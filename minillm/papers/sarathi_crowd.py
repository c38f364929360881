"""Sarathi-Serve's crowd: prompt and output lengths drawn from a trace's quantiles, Poisson arrivals at any rate.

The lengths are drawn once per seed, and so are the gaps between arrivals at a rate of 1 per second: a run at rate
r divides the gaps by r, so every rate the capacity search tries serves the same requests in the same order, only
closer together (a bisection over rate then compares like with like).
"""

from __future__ import annotations

import bisect
import random
import statistics
from dataclasses import dataclass

import numpy as np

from minillm.papers.sarathi_setup import QUANTILES, Trace


@dataclass(frozen=True)
class Crowd:
    prompts: tuple[int, ...]
    outputs: tuple[int, ...]
    unit_gaps: tuple[float, ...]  # seconds between arrivals at 1 request per second

    def arrivals(self, rate: float) -> list[float]:
        clock, times = 0.0, []
        for gap in self.unit_gaps:
            clock += gap / rate
            times.append(clock)
        return times

    def __len__(self) -> int:
        return len(self.prompts)


def from_quantiles(table: tuple[int, ...], u: float) -> int:
    """The length at quantile u in [0, 1): linear between the table's percentiles (QUANTILES)."""
    at = u * 100
    i = min(bisect.bisect_right(QUANTILES, at), len(QUANTILES) - 1)
    lo, hi = QUANTILES[i - 1], QUANTILES[i]
    return max(1, round(table[i - 1] + (table[i] - table[i - 1]) * (at - lo) / (hi - lo)))


def draw_crowd(trace: Trace, requests: int, seed: int = 0) -> Crowd:
    """`requests` requests: prompt and output drawn apart (they barely correlate in the trace: sarathi_setup.py),
    redrawn while prompt + output exceeds the trace's filter, as the paper drops those."""
    rng, prompts, outputs = random.Random(seed), [], []
    while len(prompts) < requests:
        prompt, output = from_quantiles(trace.prompt_quantiles, rng.random()), from_quantiles(
            trace.output_quantiles, rng.random())  # fmt: skip
        if prompt + output <= trace.max_total:
            prompts.append(prompt)
            outputs.append(output)
    gaps = tuple(rng.expovariate(1.0) for _ in range(requests))
    return Crowd(tuple(prompts), tuple(outputs), gaps)


def median(values) -> float:
    return float(statistics.median(values)) if len(values) else 0.0


def percentile(values, q: float) -> float:
    """numpy's (linear) percentile; 0 of nothing."""
    return float(np.percentile(values, q)) if len(values) else 0.0
