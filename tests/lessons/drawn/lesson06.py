"""Lesson 06's differential check: your ttft_tpot against the reference on traces of drawn runs.

A drawn run: 0 to 5 requests on 1 to 3 seats, served by the real engine (continuous batching) with the lesson 03
countdown stand-in (replies of 0 to 9 tokens that end on EOS, or on their cap of 1 to 8; a cap of 0: rejected),
arriving at steps 0 to 4, their prompts sharing the first tokens (a countdown 9, 8, ..., 0), and every engine mode
the course covers, each drawn on or off: chunked prefill (a token budget of 1 to 6), a tight paged pool
(preemption), prefix caching (prefix hits), speculation (1 to 3 guesses by prompt lookup: several tokens in a step),
a client hanging up (an abort at a drawn step), and a run cut short (requests still running at the end).

Part 2 has no reference to compare with (many policies are right), so its drawn check is of what EVERY valid fair
scheduler does, on drawn crowds of the kind lessons/fairness.py builds: 1 to 12 users on 1 to 4 seats, replies short
(1 to 12 tokens, 1 on purpose) or long (13 to 24; one user in four), each exactly max_new_tokens long (EOS ignored)
or, one in four, ending on EOS sooner (at once included); prompts of 1 to 12 tokens (1, and at block boundaries, on
purpose); everybody arriving in one step (0 to 4) or spread out (0 to 6 steps apart: equal arrivals too); KV memory
plentiful, as the exercise promises, from exactly enough to roomy: the contiguous layout, or a paged pool of blocks
of 1, 2 or 4 tokens holding what the largest requests that fit the seats hold at their longest, plus 0 to 8 blocks
(with none spare, seats full of the largest requests use every block). Your scheduler, fresh for each crowd, serves
it in the real engine (the countdown stand-in; the KV books checked after every step), and:
  - the engine carries out every plan (no PlanError: requests from the queue, at most one per free seat);
  - no seat stays empty while somebody waits (the exercise text: fill every free seat; everybody fits);
  - every request finishes within three times the crowd's tokens after its last arrival (a policy that keeps the
    seats busy needs at most its replies' tokens);
  - every reply is, token for token, the plain one-user loop's (greedy, no cache);
  - every KV block is free at the end.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st

from minillm.config import EngineConfig
from minillm.engine.request import Request
from minillm.engine.scheduler import ContinuousScheduler, Plan
from minillm.layers import LayeredEngine
from minillm.layers.trace import Trace
from minillm.model.tokenizer import BOS
from tests.lessons.differential import ENV, against_reference, near, plural, request_line
from tests.lessons.differential import examples as draws
from tests.lessons.drawn.crowds import countdown_model
from tests.lessons.harness import Decision, Referee, expected_reply, first_difference, raised_in_your_code, serve

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


# --- part 2: what every fair scheduler does, on drawn crowds ----------------------------------------------------------
@dataclass(frozen=True)
class Crowd:
    shape: tuple[tuple[str, int, int, int, int], ...]  # (id, prompt tokens, reply before EOS, cap, arrival step)
    slots: int
    block_size: int | None  # None: the contiguous layout
    spare: int  # paged: blocks beyond what memory ever needs

    def requests(self) -> list[Request]:
        """says >= cap: a reply of exactly cap tokens, EOS ignored (lessons/fairness.py's kind); says < cap: the
        countdown stand-in says EOS after `says` tokens (a prompt of 1 token, only BOS: at once)."""
        return [
            Request(rid, [BOS] + [65] * (n - 2) + [says] * (n > 1), cap, arrival_step=at, ignore_eos=says >= cap)
            for rid, n, says, cap, at in self.shape
        ]

    @property
    def need(self) -> int:
        """Blocks the largest requests that fit the seats hold at their longest: no seating ever needs more."""
        size = self.block_size or 1
        most = sorted((-(-(n + cap - 1) // size) for _, n, _, cap, _ in self.shape), reverse=True)
        return sum(most[: self.slots])

    @property
    def num_blocks(self) -> int | None:
        return None if self.block_size is None else self.need + self.spare

    @property
    def bound(self) -> int:
        """The steps every request must finish within: three times the crowd's tokens after its last arrival."""
        return max(at for *_, at in self.shape) + 3 * sum(n + cap for _, n, _, cap, _ in self.shape)

    def describe(self) -> str:
        if self.block_size is None:
            pool = "the contiguous layout (memory never binds)"
        else:
            enough = "exactly enough for" if not self.spare else f"{plural(self.spare, 'block')} more than"
            pool = (
                f"a pool of {plural(self.num_blocks, 'block')} of {plural(self.block_size, 'token')} ({enough} the "
                f"largest requests that fit the seats at their longest: memory never runs short)"
            )
        crowd = f"these {len(self.shape)} users" if len(self.shape) > 1 else "this user"
        return f"with {crowd} on {plural(self.slots, 'seat')} and {pool}"

    def listing(self) -> list[str]:
        return [request_line(rid, n, says, cap, at) for rid, n, says, cap, at in self.shape]


@st.composite
def crowds(draw) -> Crowd:
    slots, block_size = draw(st.integers(1, 4)), draw(st.sampled_from([None, 1, 2, 4]))
    count = draw(st.one_of(st.just(1), st.integers(1, 12), st.just(12)))
    together, at = draw(st.booleans()), draw(near([0], 0, 4))
    shape = []
    for i in range(count):
        long = draw(st.integers(0, 3)) == 3  # one in four (shrinking: short)
        cap = draw(st.integers(13, 24)) if long else draw(near([1], 1, 12))
        n = draw(near([1, *(k * (block_size or 1) for k in (1, 2, 3))], 1, 12))
        early = draw(st.integers(0, 3)) == 3  # one in four ends on EOS before its cap (shrinking: exact)
        says = cap if not early else 0 if n == 1 else draw(st.one_of(st.just(0), st.integers(0, cap - 1)))
        at += 0 if together or not i else draw(st.integers(0, 6))
        shape.append((f"u{i}", n, says, cap, at))
    spare = draw(near([0], 0, 8)) if block_size else 0
    return Crowd(tuple(shape), slots, block_size, spare)


def fills_every_free_seat(d: Decision) -> None:
    """No seat stays empty while somebody waits: memory is plentiful, so everybody who waits fits. (A plan the engine
    refuses is left to the engine, which says why.)"""
    seats = d.free_seats + len(d.preempt)  # a victim's seat is free for a newcomer too
    refused = len(set(d.admit)) < len(d.admit) or any(rid not in d.waiting for rid in d.admit) or len(d.admit) > seats
    if refused or len(d.admit) >= min(seats, len(d.waiting)):
        return
    left = [rid for rid in d.waiting if rid not in d.admit]
    empty = min(seats, len(d.waiting)) - len(d.admit)
    raise AssertionError(
        f"{d.where()}: you admitted {d.admit}, so {plural(empty, 'seat')} stayed empty while {left} waited, and "
        "everybody fits (memory is plentiful). Fill every free seat while anybody waits: your policy decides who "
        "boards first, never whether a seat stays empty"
    )


class Named:
    """Your scheduler, its crash named: the step and the queue it saw, and your line. (It may reorder or change the
    lists it is given: the engine hands it copies.)"""

    def __init__(self, scheduler):
        self.inner, self.calls = scheduler, 0
        self.name, self.holds_finished_seats = scheduler.name, scheduler.holds_finished_seats

    def __getattr__(self, name):  # anything else the engine asks is your scheduler's
        return getattr(self.inner, name)

    def schedule(self, waiting, seats, kv) -> Plan:
        step, self.calls = self.calls, self.calls + 1
        queue = [r.id for r in waiting]
        try:
            return self.inner.schedule(waiting, seats, kv)
        except (NotImplementedError, AssertionError):
            raise
        except Exception as e:
            raise AssertionError(
                f"step {step}: queue {queue}: your schedule() raised {type(e).__name__}: {e}{raised_in_your_code(e)}"
            ) from e


def serve_crowd(make_scheduler):
    def run(crowd: Crowd):
        requests, model = crowd.requests(), countdown_model()
        kv = dict(kv="contiguous") if crowd.block_size is None else dict(kv="paged", block_size=crowd.block_size)
        scheduler = Referee(Named(make_scheduler()), fills_every_free_seat)
        try:
            engine = serve(model, scheduler, requests, crowd.bound, slots=crowd.slots, num_blocks=crowd.num_blocks,
                           debug=True, **kv)  # fmt: skip
            stuck = [r.id for r in requests if not r.is_finished]
            assert not stuck, (
                f"after {engine.step_no} steps (three times the crowd's tokens after its last arrival) these requests "
                f"never finished: {stuck} (still waiting: {[r.id for r in engine.waiting]}, seated: "
                f"{[r.id for r in engine.running()]}): somebody starves"
            )
            for r in requests:
                want = expected_reply(model, tuple(r.prompt_ids), r.max_new_tokens, r.ignore_eos)
                assert r.output_ids == want, (
                    f"{r.id}: its reply differs from the plain one-user loop's: {first_difference(want, r.output_ids)}"
                )
            held = engine.cache.num_blocks - engine.cache.free_blocks
            assert not held, f"{plural(held, 'KV block is', 'KV blocks are')} still held after the run"
        except AssertionError as error:
            raise AssertionError("\n".join([f"{crowd.describe()}, {error}", *crowd.listing()])) from error

    return run


def check_drawn_policy(make_scheduler, default: int = 60) -> None:
    """make_scheduler(): a fresh scheduler for each drawn crowd. There is no reference to compare with: the last line
    of a failure says what the check did instead."""
    try:
        against_reference("your policy", crowds(), serve_crowd(make_scheduler), default)
    except AssertionError as error:
        message = str(error).rpartition("\n  (your policy compared with the reference")[0] or str(error)
        raise AssertionError(
            f"{message}\n  (your policy served {draws(default)} drawn crowds: this is the smallest it fails; the "
            f"draws are the same every run, {ENV}=N draws N)"
        ) from error
