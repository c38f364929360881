"""The vLLM paper's ShareGPT trace, as far as its sources state it: input and output lengths with Fig. 11's means,
pruned as vLLM's benchmark prunes, and Poisson arrivals (vllm_setup.py says what is read and what is assumed).

One draw serves every rate: the gaps between arrivals are drawn once at rate 1 and divided by the rate, so a sweep
over rates sees the same requests in the same order, only closer together (common random numbers: the latency
curves are smooth in the rate, and comparing two systems compares their policies, not two draws).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from minillm.papers import vllm_setup as setup


@dataclass(frozen=True)
class Trace:
    lengths: tuple[tuple[int, int], ...]  # (prompt tokens, output tokens) per request
    gaps: tuple[float, ...]  # seconds between arrivals at 1 req/s

    def arrivals(self, rate: float) -> list[float]:
        """Arrival times at `rate` requests per second (the first at 0)."""
        clock, times = 0.0, []
        for gap in self.gaps:
            times.append(clock)
            clock += gap / rate
        return times

    def means(self) -> tuple[float, float]:
        n = len(self.lengths)
        return sum(p for p, _ in self.lengths) / n, sum(o for _, o in self.lengths) / n


def kept(prompt: int, output: int) -> bool:
    """vLLM's benchmark keeps a pair unless either is under 4 tokens, the prompt over 1024, or both over 2048."""
    short = prompt < setup.MIN_TOKENS or output < setup.MIN_TOKENS
    return not short and prompt <= setup.MAX_PROMPT and prompt + output <= setup.MAX_SEQUENCE


def sharegpt_like(requests: int, seed: int = 0) -> Trace:
    """`requests` (prompt, output) pairs drawn from exponentials with ShareGPT's means (an assumption: the data set
    is not here), pruned as the benchmark prunes; and their Poisson gaps."""
    rng, lengths = random.Random(seed), []
    while len(lengths) < requests:
        prompt = round(rng.expovariate(1 / setup.MEAN_PROMPT))
        output = round(rng.expovariate(1 / setup.MEAN_OUTPUT))
        if kept(prompt, output):
            lengths.append((prompt, output))
    gaps = random.Random(seed + 1)
    return Trace(tuple(lengths), tuple(gaps.expovariate(1.0) for _ in range(requests)))
