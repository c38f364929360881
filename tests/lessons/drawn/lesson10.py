"""Lesson 10's differential check: your abort beside the reference's, in two engines serving the same drawn run.

A drawn run: 1 to 5 requests (prompts of 3 to 13 tokens; the countdown stand-in: replies that end on EOS, at once
or later, or on their caps; a cap of 0: rejected when submitted), arriving at steps 0 to 3, on 1 to 3 seats,
continuous or static batching (a finished request holding its seat); paged KV in a tight pool (2 to 4 long replies
arriving together in a pool that holds their prompts and 0 to 2 blocks more: preemption, requests back in the queue
with output), a roomy one, or the contiguous layout; chunked prefill (a budget of 2, 3 or 6 tokens: requests seated
mid-prompt), prefix caching, speculation (1 or 2 guesses a step by prompt lookup), each drawn on or off. Then 1 to 4
aborts at steps 0 to 6, each drawn by where its request is then (queued back from a preemption, seated mid-prompt or
mid-reply, queued, not arrived yet, finished or rejected, finished holding a static seat: one of those there, any
when none is) or an id nobody has; the default reason or one given.

Both engines take the same steps; at each abort the two must return the same, and leave the same engine: the
seats, the queue, the requests not arrived yet, the free KV blocks, every request's state, finish reason and step
(and the aborted one's finish time on its own engine's clock); at the end, every reply the same.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st

from minillm.config import EngineConfig
from minillm.engine.request import Request
from minillm.engine.scheduler import ContinuousScheduler, StaticScheduler
from minillm.layers import LayeredEngine
from minillm.model.tokenizer import BOS
from tests.lessons.differential import against_reference, plural, request_line
from tests.lessons.drawn.crowds import countdown_model
from tests.lessons.harness import case

RAMP = [9, 8, 7, 6, 5, 4, 3, 2, 1, 0]


@dataclass(frozen=True)
class Run:
    shape: tuple[tuple[str, int, int, int, int], ...]  # (id, reply before EOS, cap, arrival step, ramp tokens)
    slots: int
    static: bool
    pool: int | None  # paged blocks of 2 tokens; None: contiguous
    budget: int | None
    prefix_caching: bool
    speculate: int
    aborts: tuple[tuple[int, str, int, str | None], ...]  # (step, a place, which one there, reason or None: default)

    def engine(self):
        kv = dict(kv="paged", block_size=2, num_blocks=self.pool) if self.pool else dict(kv="contiguous")
        cfg = EngineConfig(slots=self.slots, prefix_caching=self.prefix_caching, speculate=self.speculate,
                           drafter="ngram", max_len=64, **kv)  # fmt: skip
        policy = (StaticScheduler if self.static else ContinuousScheduler)(token_budget=self.budget)
        engine = LayeredEngine(countdown_model(), policy, cfg)
        for rid, says, cap, at, ramp in self.shape:
            engine.submit(Request(rid, [BOS, *RAMP[10 - ramp :], 65, says], cap, arrival_step=at))
        return engine

    def describe(self) -> str:
        modes = ["static batching"] * self.static
        modes += [f"a paged pool of {plural(self.pool, 'block')} of 2 tokens"] if self.pool else ["contiguous KV"]
        modes += [f"chunked prefill (a budget of {self.budget})"] if self.budget else []
        modes += ["prefix caching"] * self.prefix_caching
        modes += [f"speculation ({plural(self.speculate, 'guess', 'guesses')})"] if self.speculate else []
        crowd = f"these {len(self.shape)} requests" if len(self.shape) > 1 else "this request"
        return f"with {crowd} on {plural(self.slots, 'seat')}, " + ", ".join(modes)

    def listing(self, performed=()) -> list[str]:
        lines = [request_line(rid, ramp + 3, says, cap, at) for rid, says, cap, at, ramp in self.shape]
        return lines + [
            f"  at step {s}: abort({rid!r}{'' if why is None else f', {why!r}'})" for s, rid, why in performed
        ]


@st.composite
def runs(draw) -> Run:
    paged = draw(st.sampled_from(["tight", "roomy", "contiguous"]))
    squeeze = paged == "tight"  # long replies arriving together in a pool that holds their prompts: preemption
    count = draw(st.sampled_from([2, 3, 4] if squeeze else [1, 2, 3, 4, 5]))
    shape = []
    for i in range(count):
        says, cap = draw(st.sampled_from([9, 9, 0, 3])), draw(st.sampled_from([6, 6, 3, 1, 0]))
        at, ramp = draw(st.integers(0, 3)), draw(st.integers(0, 10))
        shape.append((f"r{i}", 9, 6, 0, draw(st.integers(0, 4))) if squeeze else (f"r{i}", says, cap, at, ramp))
    shape.sort(key=lambda s: s[3])
    aborts = tuple(
        sorted(
            ((draw(st.integers(0, 6)), draw(st.sampled_from(list(PLACES))), draw(st.integers(0, 4)),
              draw(st.sampled_from([None, "client hung up"]))) for _ in range(draw(st.sampled_from([1, 2, 3, 4])))),
            key=lambda a: a[0],
        )
    )  # fmt: skip
    prompts = sum(-(-(ramp + 3) // 2) for *_, ramp in shape)  # blocks of 2 tokens
    return Run(
        tuple(shape),
        slots=count if squeeze else draw(st.sampled_from([2, 3, 1])),
        static=draw(st.booleans()),
        pool={"tight": prompts + draw(st.integers(0, 2)), "roomy": 60, "contiguous": None}[paged],
        budget=draw(st.sampled_from([None, None, 2, 3, 6])),
        prefix_caching=paged != "contiguous" and draw(st.booleans()),
        speculate=draw(st.sampled_from([0, 0, 1, 2])),
        aborts=aborts,
    )


def seated(e, r) -> bool:
    return not r.is_finished and r.seat is not None and e.seats[r.seat] is r


PLACES = {  # where the request an abort targets is, then: one of them (drawn), or any request when none is there
    "queued back from a preemption": lambda e, r: r in e.waiting and bool(r.output_ids),
    "seated mid-prompt": lambda e, r: seated(e, r) and not r.output_ids,
    "seated mid-reply": lambda e, r: seated(e, r) and bool(r.output_ids),
    "queued": lambda e, r: r in e.waiting,
    "not arrived yet": lambda e, r: r in e.pending,
    "finished": lambda e, r: r.is_finished,
    "finished, holding a static seat": lambda e, r: r.is_finished and r.seat is not None and e.seats[r.seat] is r,
    "an id nobody has": lambda e, r: False,
}


def target(engine, where: str, pick: int) -> str:
    if where == "an id nobody has":
        return "nobody"
    there = [r.id for r in engine.requests if PLACES[where](engine, r)] or [r.id for r in engine.requests]
    return there[pick % len(there)]


def place(engine, rid: str) -> str:
    """Where request `rid` (its latest) is, in the lesson's words."""
    r = next((q for q in reversed(engine.requests) if q.id == rid), None)
    if r is None:
        return "nobody has that id"
    if r.is_finished:
        held = r.seat is not None and engine.seats[r.seat] is r
        return f"finished ({r.finish_reason})" + (", still holding its seat (static batching)" if held else "")
    if r in engine.pending:
        return "not arrived yet (engine.pending)"
    if r in engine.waiting:
        return "queued" + (f", back from a preemption with {len(r.output_ids)} tokens out" if r.output_ids else "")
    return f"seated in seat {r.seat}, " + ("mid-reply" if r.output_ids else "mid-prompt")


def state(engine) -> dict:
    return {
        "seats": [None if r is None else r.id for r in engine.seats],
        "queue": [r.id for r in engine.waiting],
        "requests not arrived yet": [r.id for r in engine.pending],
        "free KV blocks": engine.cache.free_blocks,
        "requests (state, finish reason, finish step)": [
            (r.id, str(r.state), r.finish_reason, r.finish_step) for r in engine.requests
        ],  # fmt: skip
    }


def compare(abort, reference_abort):
    def run(drawn: Run):
        yours, theirs, todo, performed = drawn.engine(), drawn.engine(), list(drawn.aborts), []
        intro = drawn.describe()
        try:
            while (yours.has_work() or todo) and yours.step_no < 60:
                while todo and (todo[0][0] <= yours.step_no or not yours.has_work()):  # (idle: abort now)
                    _, there, pick, why = todo.pop(0)
                    rid = target(yours, there, pick)
                    performed.append((yours.step_no, rid, why))
                    args = (rid,) if why is None else (rid, why)
                    where = f"aborting {rid!r} at step {yours.step_no} ({place(yours, rid)})"
                    before = yours.clock.now()
                    with case(where):
                        got = abort(yours, *args)
                    after, want = yours.clock.now(), reference_abort(theirs, *args)
                    assert got is want, f"{where}: your abort returned {got!r}; the reference's {want!r}"
                    mine, ref = state(yours), state(theirs)
                    for what in ref:
                        differ = f"your engine's {what}: {mine[what]}; the reference's: {ref[what]}"
                        assert mine[what] == ref[what], f"{where}, then {differ}"
                    if want:
                        r = next(q for q in reversed(yours.requests) if q.id == rid)
                        assert isinstance(r.finish_s, int | float) and before <= r.finish_s <= after, (
                            f"{where}: its finish_s is {r.finish_s!r}; it should be the engine's clock then, "
                            f"engine.clock.now() (between {before:.4f} and {after:.4f})"
                        )
                if yours.has_work():
                    try:
                        yours.step()
                    except Exception as e:  # the engine met what your abort left behind
                        crash = f"the engine crashed at step {yours.step_no}, after your abort: {e!r}"
                        raise AssertionError(crash) from e
                    theirs.step()
            final = [(r.id, r.output_ids, r.finish_reason) for r in yours.requests]
            assert final == [(r.id, r.output_ids, r.finish_reason) for r in theirs.requests], (
                f"after the run: replies and finish reasons {final}; the reference's "
                f"{[(r.id, r.output_ids, r.finish_reason) for r in theirs.requests]}"
            )
        except AssertionError as error:
            raise AssertionError("\n".join([f"{intro}: {error}", *drawn.listing(performed)])) from error

    return run


def check_drawn(abort, reference_abort, examples: int = 50) -> None:
    against_reference("abort", runs(), compare(abort, reference_abort), examples)
