"""Drawn crowds for the scheduling lessons (03, 04): your policy beside the reference's, step by step.

A drawn crowd: 0 to 6 requests, each a prompt of 2 to 12 tokens (ending on block boundaries, one short and one
past them by the draw), a reply cap of 1 to 5 and a reply the stand-in model ends with EOS after 0 to 6 tokens
(so some end before their cap, some at once: an empty reply), arriving at steps 0 to 4 (several in one step; ids
that do not sort in queue order); 1 to 4 seats; KV blocks of 1, 2 or 4 tokens in a pool from exactly what the
largest request needs alone up to 8 blocks more (tight: admissions stop on memory, running requests are
preempted), or the contiguous layout (memory never binds).

Your scheduler runs the crowd in the real engine, with the lesson's referee judging each decision in the lesson's
words; beside it, on the very same state, the reference decides too, and the two must agree at every step.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from hypothesis import reject
from hypothesis import strategies as st

from lessons.fairness import StandIn
from minillm.config import ModelConfig
from minillm.engine.request import Request
from minillm.engine.scheduler import Plan
from minillm.model.tokenizer import BOS, EOS
from tests.lessons.differential import near, plural
from tests.lessons.harness import Guarded, Referee, serve

NAMES = [f"r{i}" for i in (0, 1, 2, 3, 4, 5, 10, 11, 12)]  # as text, "r10" sorts before "r2"


class Countdown(StandIn):
    """A stand-in model (no computation) that replies on cue: after byte n it says n - 1, after 0 (or a special
    token) EOS. A prompt ending in byte n gets n - 1, ..., 1, 0 and then EOS: n tokens, so under a larger cap the
    reply ends on EOS, and a prompt ending in 0 gets none at all (its first reply token is EOS)."""

    def forward(self, tokens, *args, logits_at=None, **kwargs):
        last = tokens.flatten()[logits_at]  # (R,): the token each sampling row ends on
        says = torch.where((last > 0) & (last < 256), last - 1, EOS)
        return torch.nn.functional.one_hot(says, self.cfg.vocab_size).float()  # (R, V)


@functools.cache
def countdown_model() -> Countdown:
    return Countdown(ModelConfig(dim=32, n_layers=1, n_heads=2, n_kv_heads=1, ffn_dim=64, max_seq_len=256)).eval()


@dataclass(frozen=True)
class Crowd:
    shape: tuple[tuple[str, int, int, int, int], ...]  # (id, prompt tokens, reply before EOS, cap, arrival step)
    slots: int
    kv: str
    block_size: int
    num_blocks: int | None

    def requests(self) -> list[Request]:
        return [
            Request(rid, [BOS] + [65] * (n - 2) + [says], cap, arrival_step=at) for rid, n, says, cap, at in self.shape
        ]

    def pool(self) -> str:
        if self.kv == "contiguous":
            return "the contiguous layout (memory never binds)"
        return f"a pool of {plural(self.num_blocks, 'block')} of {plural(self.block_size, 'token')}"

    def describe(self) -> str:
        crowd = {0: "with no requests", 1: "with this request"}.get(
            len(self.shape), f"with these {len(self.shape)} requests"
        )
        return f"{crowd} on {plural(self.slots, 'seat')} and {self.pool()}"

    def listing(self) -> list[str]:
        lines = []
        for rid, n, says, cap, at in self.shape:
            reply = (
                "an empty reply (EOS at once)" if says == 0 and cap > 0
                else f"a reply of {plural(says, 'token')} then EOS" if says < cap
                else "a reply cut by its cap"
            )  # fmt: skip
            blocks = -(-n // self.block_size)
            cost = f" ({plural(blocks, 'block')})" if self.kv == "paged" else ""
            lines.append(f"  {rid}: arrives at step {at}, a prompt of {n} tokens{cost}, {reply} (max_new_tokens {cap})")
        return lines


@st.composite
def crowds(draw, pressure: bool = False) -> Crowd:
    """A crowd (see the module's docstring); pressure=True: half the crowds are drawn to make the running requests
    outgrow the pool (at least two, arriving together, long replies, a pool that holds their prompts and a little)."""
    squeeze = pressure and draw(st.booleans())
    block_size = draw(st.sampled_from([1, 2] if squeeze else [1, 2, 4]))
    count = draw(st.sampled_from([2, 3, 4, 5] if squeeze else [0, 1, 2, 3, 4, 5, 6]))
    names = draw(st.permutations(NAMES))[:count]
    shape = []
    for rid in names:
        n = draw(near([block_size, 2 * block_size, 3 * block_size], 2, 12))
        cap = draw(st.sampled_from([3, 4, 5, 6] if squeeze else [1, 2, 3, 4, 5, 6]))
        says = draw(st.one_of(st.just(cap + 1), st.just(0), st.integers(0, cap)))  # cut by its cap, EOS at once, ...
        shape.append((rid, n, cap + 1 if squeeze else says, cap, draw(near([0], 0, 1 if squeeze else 4))))
    shape.sort(key=lambda s: s[4])  # submitted in arrival order; same-step arrivals in the drawn order
    kv = "paged" if squeeze else draw(st.sampled_from(["paged", "paged", "paged", "contiguous"]))
    alone = max((-(-(n + cap - 1) // block_size) for _, n, _, cap, _ in shape), default=1)
    prompts = sum(-(-n // block_size) for _, n, _, _, _ in shape)  # every prompt's blocks at once
    if squeeze:
        num_blocks = max(alone, prompts + draw(near([0, 1], 0, 3)))  # all board together, then not all can grow
    else:
        num_blocks = alone + draw(near([0, 1], 0, 8)) if kv == "paged" else None
    slots = draw(st.sampled_from([count, count - 1] if squeeze else [1, 2, 3, 4]))
    return Crowd(tuple(shape), slots, kv, block_size, num_blocks)


def ids(requests) -> list[str]:
    return [r.id for r in requests]


class Shadow:
    """Your scheduler (judged by the lesson's referee) with the reference deciding beside it on the same state: the
    two must admit the same requests in the same order and preempt the same ones. `reject_if_reference_preempts`:
    a crowd where the reference has to preempt is not one this lesson's policy is asked about (static batching may
    leave preemption out): it is drawn again."""

    def __init__(self, yours, reference, judge, reject_if_reference_preempts=False):
        self.referee = Referee(Guarded(yours), judge)
        self.reference, self.skip_preempting = reference, reject_if_reference_preempts
        self.name, self.holds_finished_seats = yours.name, yours.holds_finished_seats

    def __getattr__(self, name):
        return getattr(self.referee, name)

    def schedule(self, waiting, seats, kv) -> Plan:
        want = self.reference.schedule(list(waiting), list(seats), kv)
        if self.skip_preempting and want.preempt:
            reject()
        got = self.referee.schedule(waiting, seats, kv)  # the referee's own words first, when it objects
        if ids(got.admit) != ids(want.admit) or sorted(ids(got.preempt)) != sorted(ids(want.preempt)):
            d = self.referee.decisions[-1]
            raise AssertionError(
                f"{d.where()}: you admitted {ids(got.admit)} and preempted {ids(got.preempt)}; the reference admits "
                f"{ids(want.admit)} and preempts {sorted(ids(want.preempt))}"
            )
        return got


def compare(scheduler_cls, reference_cls, judge, reject_if_reference_preempts=False):
    def run(crowd: Crowd):
        requests = crowd.requests()
        shadow = Shadow(scheduler_cls(), reference_cls(), judge, reject_if_reference_preempts)
        cfg = dict(slots=crowd.slots, kv=crowd.kv, block_size=crowd.block_size, num_blocks=crowd.num_blocks)
        try:
            engine = serve(countdown_model(), shadow, requests, max_steps=200, **cfg)
            stuck = [r.id for r in requests if not r.is_finished]
            assert not stuck, f"after {engine.step_no} steps these requests never finished: {stuck}"
            assert engine.cache.free_blocks == engine.cache.num_blocks, "KV blocks are still held after the run"
        except AssertionError as error:
            raise AssertionError("\n".join([f"{crowd.describe()}, {error}", *crowd.listing()])) from error

    return run
