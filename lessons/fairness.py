"""Lesson 06's policy exercise: the crowd a scheduler is judged on, and the judgement itself.

The notebook and `pytest -m lesson06` both use this file, so what you see in the lesson is what the check
measures.

The crowd: four seats and plenty of KV memory. Users arrive at random, about one every four steps: faster
than four seats can serve them, so a queue builds. Most want a short reply (4 to 12 tokens); one in twelve
wants a long one (90 to 130). Every reply is exactly as long as asked (`max_new_tokens`, EOS ignored), so a
policy may use it. Four such crowds (seeds 0 to 3) are served one after the other; their users' times to
first token are pooled.

The judgement, against first come, first served (FCFS) on the same crowds:
  - TTFT p90 (nearest rank, in steps) at least 15% lower than FCFS's;
  - nobody starves: no user waits longer for a first token than the longest wait under FCFS.
"""

from __future__ import annotations

import functools
import math
import random
from dataclasses import dataclass

import torch

from minillm.config import EngineConfig, ModelConfig
from minillm.engine.request import Request
from minillm.layers import LayeredEngine
from minillm.model.transformer import Transformer

SEATS = 4
SEEDS = (0, 1, 2, 3)
GAIN = 0.15  # the p90 must drop by at least this share


def mixed_crowd(seed: int, users: int = 48, rate: float = 0.25) -> list[Request]:
    """`users` requests, Poisson arrivals at `rate` per step; one in twelve asks for a long reply."""
    rng = random.Random(seed)
    long_ones = set(rng.sample(range(users), users // 12))
    clock, crowd = 0.0, []
    for i in range(users):
        reply = rng.randint(90, 130) if i in long_ones else rng.randint(4, 12)
        prompt = [257] + [rng.randrange(256) for _ in range(rng.randint(3, 12))]
        crowd.append(Request(f"s{seed}-u{i}", prompt, reply, int(clock), ignore_eos=True))
        clock += rng.expovariate(rate)
    return crowd


class StandIn(Transformer):
    """A model that skips the computation: logits of zeros, in the shapes the engine asks for. Every reply
    here has a fixed length (EOS is never picked), so who runs when does not depend on what the model says,
    and the schedule is the one a real model would get, at a fraction of the time."""

    def forward(self, tokens: torch.Tensor, *args, last_only: bool = False, logits_at=None, **kwargs):
        B, T = tokens.shape
        if logits_at is not None:
            return torch.zeros(len(logits_at), self.cfg.vocab_size)  # (R, V): the rows that pick a token
        return torch.zeros(B, 1 if last_only else T, self.cfg.vocab_size)  # (B, T, V)


@functools.cache
def stand_in_model(context: int = 256) -> StandIn:
    cfg = ModelConfig(dim=32, n_layers=1, n_heads=2, n_kv_heads=1, ffn_dim=64, max_seq_len=context)
    return StandIn(cfg).eval()


def nearest_rank(values: list[float], q: float) -> float:
    """The q-th percentile by nearest rank: the value at rank ceil(q/100 * n) in sorted order (1-based).
    Always a value somebody really had; with 8 users, p50 is the 4th smallest and p90 the largest."""
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q / 100 * len(ordered))) - 1]


def ttfts(make_scheduler, seeds=SEEDS) -> dict[str, int]:
    """Each user's time to first token, in steps, over the crowds of `seeds` (a fresh scheduler for each)."""
    out = {}
    for seed in seeds:
        cfg = EngineConfig(slots=SEATS, kv="contiguous", max_len=256)
        engine = LayeredEngine(stand_in_model(), make_scheduler(), cfg)
        for r in mixed_crowd(seed):
            engine.submit(r)
        for r in engine.run().requests:
            out[r.id] = r.first_token_step - r.arrival_step + 1
    return out


@dataclass
class Verdict:
    p90: float
    worst: int
    worst_user: str
    fcfs_p90: float
    fcfs_worst: int

    @property
    def faster(self) -> bool:
        return self.p90 <= (1 - GAIN) * self.fcfs_p90

    @property
    def fair(self) -> bool:
        return self.worst <= self.fcfs_worst

    def describe(self) -> str:
        target = (1 - GAIN) * self.fcfs_p90
        return (
            f"TTFT p90 {self.p90:.0f} steps (FCFS {self.fcfs_p90:.0f}; at most {target:.1f} needed: "
            f"{'met' if self.faster else 'not met'}); longest wait {self.worst} steps, {self.worst_user} "
            f"(FCFS {self.fcfs_worst}: {'nobody starves' if self.fair else 'somebody starves'})"
        )


def judge(make_scheduler, fcfs: dict[str, int]) -> Verdict:
    """Serve the crowds with `make_scheduler()` and compare with FCFS's times to first token `fcfs`."""
    mine = ttfts(make_scheduler)
    worst_user = max(mine, key=mine.get)
    return Verdict(
        nearest_rank(list(mine.values()), 90),
        mine[worst_user],
        worst_user,
        nearest_rank(list(fcfs.values()), 90),
        max(fcfs.values()),
    )
