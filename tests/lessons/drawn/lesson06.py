"""Lesson 06's differential check: your ttft_tpot against the reference on traces of drawn runs.

A drawn run: 0 to 5 requests on 1 to 3 seats, served by the real engine (continuous batching) with the lesson 03
countdown stand-in (replies of 0 to 9 tokens that end on EOS, or on their cap of 1 to 8; a cap of 0: rejected),
arriving at steps 0 to 4, their prompts sharing the first tokens (a countdown 9, 8, ..., 0), and every engine mode
the course covers, each drawn on or off: chunked prefill (a token budget of 1 to 6), a tight paged pool
(preemption), prefix caching (prefix hits), speculation (1 to 3 guesses by prompt lookup: several tokens in a step),
a client hanging up (an abort at a drawn step), and a run cut short (requests still running at the end).
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st

from minillm.config import EngineConfig
from minillm.engine.request import Request
from minillm.engine.scheduler import ContinuousScheduler
from minillm.layers import LayeredEngine
from minillm.layers.trace import Trace
from minillm.model.tokenizer import BOS
from tests.lessons.differential import against_reference, plural, request_line
from tests.lessons.drawn.crowds import countdown_model

RAMP = [9, 8, 7, 6, 5, 4, 3, 2, 1, 0]  # a shared start (prefix hits) that prompt lookup can guess from


@dataclass(frozen=True)
class Run:
    shape: tuple[tuple[str, int, int, int, int], ...]  # (id, shared start, reply before EOS, cap, arrival step)
    slots: int
    budget: int | None
    pool: int | None  # paged blocks of 2 tokens; None: the contiguous layout
    prefix_caching: bool
    speculate: int
    abort: tuple[str, int] | None  # (request id, step)
    steps: int  # the most steps it runs

    def requests(self) -> list[Request]:
        return [Request(rid, [BOS, *RAMP[:k], 65, says], cap, arrival_step=at) for rid, k, says, cap, at in self.shape]

    def __post_init__(self):  # speculating: every prompt holds the whole countdown, so prompt lookup guesses right
        if self.speculate:
            object.__setattr__(self, "shape", tuple((rid, len(RAMP), *rest) for rid, _, *rest in self.shape))

    def trace(self) -> Trace:
        kv = dict(kv="paged", block_size=2, num_blocks=self.pool) if self.pool else dict(kv="contiguous")
        cfg = EngineConfig(slots=self.slots, prefix_caching=self.prefix_caching, speculate=self.speculate,
                           drafter="ngram", max_len=64, **kv)  # fmt: skip
        engine = LayeredEngine(countdown_model(), ContinuousScheduler(token_budget=self.budget), cfg)
        for r in self.requests():
            engine.submit(r)
        while engine.has_work() and engine.step_no < self.steps:
            if self.abort and self.abort[1] == engine.step_no:
                engine.abort(self.abort[0])
            engine.step()
        return engine.trace()

    def describe(self) -> str:
        modes = [f"chunked prefill (a budget of {plural(self.budget, 'token')})"] if self.budget else []
        modes += [f"a paged pool of {plural(self.pool, 'block')} of 2 tokens"] if self.pool else []
        modes += ["prefix caching"] * self.prefix_caching
        modes += [f"speculation ({plural(self.speculate, 'guess', 'guesses')} a step)"] if self.speculate else []
        modes += [f"{self.abort[0]} aborted at step {self.abort[1]}"] if self.abort else []
        modes += [f"cut after {self.steps} steps"] if self.steps < 60 else []
        crowd = f"these {len(self.shape)} requests" if len(self.shape) != 1 else "this request"
        return f"a trace of {crowd} on {plural(self.slots, 'seat')}" + "".join(f", {m}" for m in modes)

    def listing(self) -> list[str]:
        return [request_line(rid, k + 3, says, cap, at) for rid, k, says, cap, at in self.shape]


@st.composite
def runs(draw) -> Run:
    shape = []
    for i in range(draw(st.integers(0, 5))):
        cap = draw(st.sampled_from([1, 2, 3, 5, 8, 0]))  # 0: rejected
        says = draw(st.one_of(st.just(0), st.just(1), st.integers(0, 9)))  # EOS at once, one token, ...
        shape.append((f"r{i}", draw(st.integers(0, len(RAMP))), says, cap, draw(st.integers(0, 4))))
    shape.sort(key=lambda s: s[4])
    modes = draw(st.sets(st.sampled_from(["chunked", "tight", "prefix", "speculate", "abort", "cut"])))
    ids = [s[0] for s in shape]
    return Run(
        tuple(shape),
        slots=draw(st.integers(1, 3)),
        budget=draw(st.integers(1, 6)) if "chunked" in modes else None,
        pool=draw(st.integers(8, 14)) if "tight" in modes else (40 if "prefix" in modes else None),
        prefix_caching="prefix" in modes,
        speculate=draw(st.integers(1, 3)) if "speculate" in modes else 0,
        abort=(draw(st.sampled_from(ids)), draw(st.integers(0, 8))) if "abort" in modes and ids else None,
        steps=draw(st.integers(1, 12)) if "cut" in modes else 60,
    )


def compare(ttft_tpot, check_one_trace):
    def run(drawn: Run):
        trace = drawn.trace()
        try:
            check_one_trace(ttft_tpot, trace, f"{drawn.describe()}: ")
        except AssertionError as error:
            raise AssertionError("\n".join([str(error), *drawn.listing()])) from error

    return run


def check_drawn(ttft_tpot, check_one_trace, examples: int = 60) -> None:
    """check_one_trace: the lesson's own comparison of one trace (tests/lessons/test_lesson06.py)."""
    against_reference("ttft_tpot", runs(), compare(ttft_tpot, check_one_trace), examples)
