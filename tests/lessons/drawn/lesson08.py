"""Lesson 08's differential check: your plan_step against the reference on drawn steps.

A drawn step: 0 to 4 seated requests, each decoding (1 to 4 tokens out), prefilling its prompt (0 up to all but
one of its 1 to 12 tokens in the cache: one token left on purpose) or back from a preemption and recomputing (its
prompt and old reply partly back: exactly its prompt on purpose), seated in any order, admitted in any order,
arrived in any order; 0 to 4 in the queue, new or back from a preemption (they recompute their old reply too; one
back at the head arrived after the next); 0 to 3 free seats; no budget, or a budget drawn at the edges: exactly
the decode rows, one less, the decode rows and the seated prompts, one more, that and the head of the queue's
prompt, or anything from 1 to 40.
"""

from __future__ import annotations

from hypothesis import strategies as st

from minillm.engine.request import Request, State
from tests.lessons.differential import against_reference, near


def prompt(n: int, seed: int) -> list[int]:
    return [257] + [(seed * 41 + 7 * j) % 256 for j in range(n - 1)]


@st.composite
def seated(draw, rid: str, order: int) -> Request:
    kind = draw(st.sampled_from(["decoding", "prefilling", "returning"]))
    n = draw(st.integers(1, 12))
    r = Request(rid, prompt(n, order), 50, ignore_eos=True, state=State.RUNNING, admit_order=order)
    if kind == "decoding":
        r.output_ids = list(range(65, 65 + draw(st.integers(1, 4))))
        r.num_computed = r.num_tokens - 1
    elif kind == "prefilling":
        r.num_computed = draw(near([n - 1], 0, n - 1))  # one token left on purpose
    else:
        r.output_ids = list(range(65, 65 + draw(st.integers(1, 4))))
        r.num_computed = draw(near([n - 1, n], 0, r.num_tokens - 2))  # its prompt back, not all its old reply
    r.arrival_step = draw(st.integers(0, 9))
    return r


@st.composite
def queued(draw, rid: str) -> Request:
    r = Request(rid, prompt(draw(st.integers(1, 12)), len(rid) + 7), 50, ignore_eos=True)
    if draw(st.booleans()):  # back from a preemption: it recomputes its old reply too
        r.output_ids = list(range(65, 65 + draw(st.integers(1, 4))))
    r.arrival_step = draw(st.integers(0, 9))
    return r


@st.composite
def steps(draw) -> dict:
    k = draw(st.integers(0, 4))
    orders = draw(st.permutations(range(k)))
    running = [draw(seated(f"s{order}", order)) for order in orders]  # seat i holds running[i]
    for i, r in enumerate(running):
        r.seat = i
    waiting = [draw(queued(f"q{i}")) for i in range(draw(st.integers(0, 4)))]
    decode = sum(1 for r in running if r.is_decoding)
    seated_total = sum(r.num_pending for r in running)
    head = seated_total + (waiting[0].num_pending if waiting else 0)
    budget = draw(st.one_of(st.none(), near([decode, seated_total, head], 1, 40)))
    return dict(running=running, waiting=waiting, free_seats=draw(st.integers(0, 3)), budget=budget)


def check_drawn(plan_step, check_plan, examples: int = 100) -> None:
    """check_plan: the lesson's own comparison of one step with the reference (tests/lessons/test_lesson08.py)."""
    against_reference("plan_step", steps(), lambda step: check_plan(plan_step, step, "a drawn step"), examples)
