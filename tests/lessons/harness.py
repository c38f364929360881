"""Shared helpers for the lesson checks: which code is under test, small models, a crowd, a referee.

Every lesson test takes the implementation under test as an argument (ARENA style), so the same
check runs on the reference (the code in minillm/) and on yours (lessons/exercises/).

MINILLM_EXERCISES=<module prefix> points "student" at another package with the same file names,
e.g. `PYTHONPATH=/tmp/sol MINILLM_EXERCISES=solutions pytest -m lesson03` checks /tmp/sol/solutions/.
The default is `lessons.exercises`.
"""

from __future__ import annotations

import functools
import importlib
import os
from dataclasses import dataclass

import torch

from minillm.blocks import BlockPoolExhausted
from minillm.config import EngineConfig, ModelConfig
from minillm.engine import Engine, EngineError
from minillm.generate import generate
from minillm.model import Transformer
from minillm.request import Request
from minillm.scheduler import Plan

EXERCISES = os.environ.get("MINILLM_EXERCISES", "lessons.exercises")
IMPLS = ["reference", "student"]  # the ids every lesson test is parametrized with


def student_module(name: str):
    """Your exercise module, e.g. student_module("lesson01_generate")."""
    return importlib.import_module(f"{EXERCISES}.{name}")


def stub(*args, **kwargs):
    """What an exercise looks like before you write it."""
    raise NotImplementedError("stub")


# --- models ----------------------------------------------------------------------------------
@functools.cache
def small_model(name: str) -> Transformer:
    """A small random model from tests/conftest.py (mha, gqa or mqa), built once per session."""
    from tests.conftest import random_model

    return random_model(name)


@functools.cache
def shipped_model() -> Transformer:
    from minillm.checkpoint import load_model

    return load_model(device="cpu")


@functools.cache
def long_tiny_model() -> Transformer:
    """A random one-layer model with a 1024-token context: the seed story's 500-token replies fit."""
    torch.manual_seed(0)
    cfg = ModelConfig(dim=32, n_layers=1, n_heads=2, n_kv_heads=1, ffn_dim=64, max_seq_len=1024)
    return Transformer(cfg).eval()


# --- a crowd served by the real engine ---------------------------------------------------------
def crowd(n: int = 10, seed: int = 0) -> list[Request]:
    """Requests with mixed prompt and reply lengths, arriving over the first ten steps."""
    return [
        Request(
            id=f"r{i}",
            prompt_ids=[257] + [(seed * 31 + i * 7 + j) % 256 for j in range(2 + (i * 5) % 13)],
            max_new_tokens=3 + (i * 11) % 29,
            arrival_step=(i * 3) % 10,
            ignore_eos=True,
        )
        for i in range(n)
    ]


@functools.cache
def expected_reply(model: Transformer, prompt_ids: tuple[int, ...], max_new_tokens: int, ignore_eos: bool) -> list[int]:
    """The plain no-cache loop's reply: what any batching must reproduce token for token (memoized)."""
    return generate(model, list(prompt_ids), max_new_tokens, use_cache=False, ignore_eos=ignore_eos).tokens


def serve(model, scheduler, requests, max_steps: int = 2000, **cfg) -> Engine:
    """Run the real engine with `scheduler` until every request is done (or max_steps)."""
    engine = Engine(model, scheduler, EngineConfig(max_len=model.cfg.max_seq_len, **cfg))
    for r in requests:
        engine.submit(r)
    try:
        engine.run(max_steps=max_steps)
    except EngineError as e:
        raise AssertionError(f"step {engine.step_no}: the engine refused your plan: {e}") from None
    except BlockPoolExhausted as e:
        raise AssertionError(
            f"step {engine.step_no}: the KV cache ran out of blocks: you admitted more than fits, "
            f"or did not preempt when the running requests could not grow ({e})"
        ) from None
    return engine


def assert_served_everyone(engine: Engine, requests: list[Request]) -> None:
    """Nothing lost: every request finished with its full reply, token-exact, and all KV memory is free."""
    stuck = [r.id for r in requests if r.finish_reason != "length"]
    assert not stuck, (
        f"after {engine.step_no} steps these requests never finished: {stuck} "
        f"(still waiting: {[r.id for r in engine.waiting]}); does your policy admit whenever it may?"
    )
    for r in requests:
        expected = expected_reply(engine.model, tuple(r.prompt_ids), r.max_new_tokens, r.ignore_eos)
        assert r.output_ids == expected, f"{r.id}: its reply differs from the plain no-cache loop's"
    assert engine.cache.free_blocks == engine.cache.num_blocks, "KV blocks are still held after the run"
    assert engine.cache.stored_tokens == 0, "the KV cache still stores tokens after the run"


# --- a referee: checks each scheduling decision at the moment it is made -----------------------
@dataclass
class Decision:
    """The state a scheduler saw at one step, and the plan it returned (ids only: requests keep changing)."""

    step: int
    waiting: list[str]
    seated: list[str | None]  # per seat: the request's id, or None
    running: list[str]  # seated and unfinished, oldest admission first
    free_seats: int  # None seats, plus finished ones when the policy holds finished seats
    free_blocks: int
    cost: dict[str, int]  # waiting id -> blocks its prefill needs
    grow: dict[str, int]  # running id -> blocks it needs to decode one more token
    held: dict[str, int]  # running id -> blocks it holds now
    admit: list[str]
    preempt: list[str]

    def where(self) -> str:
        return (
            f"step {self.step}: queue {self.waiting}, running (oldest admission first) {self.running}, "
            f"{self.free_seats} free seat(s), {self.free_blocks} free KV block(s)"
        )


class Referee:
    """Wraps a scheduler for the engine; `judge(decision)` raises AssertionError on a wrong decision."""

    def __init__(self, scheduler, judge):
        self.inner, self.judge = scheduler, judge
        self.name, self.holds_finished_seats = scheduler.name, scheduler.holds_finished_seats
        self.decisions: list[Decision] = []

    def schedule(self, waiting, seats, kv) -> Plan:
        running = sorted((r for r in seats if r is not None and not r.is_finished), key=lambda r: r.admit_order)
        held_seats = sum(1 for r in seats if r is not None and r.is_finished) if self.holds_finished_seats else 0
        before = dict(
            step=len(self.decisions),
            waiting=[r.id for r in waiting],
            seated=[None if r is None else r.id for r in seats],
            running=[r.id for r in running],
            free_seats=seats.count(None) + held_seats,
            free_blocks=kv.free_blocks,
            cost={r.id: kv.blocks_to_admit(r.tokens_in_cache_after_prefill) for r in waiting},
            grow={r.id: kv.blocks_to_grow(r.seat) for r in running},
            held={r.id: kv.blocks_held(r.seat) for r in running},
        )
        plan = self.inner.schedule(waiting, seats, kv)
        assert isinstance(plan, Plan), f"schedule() must return a Plan, got {type(plan).__name__}"
        decision = Decision(**before, admit=[r.id for r in plan.admit], preempt=[r.id for r in plan.preempt])
        self.decisions.append(decision)
        self.judge(decision)
        return plan


def fcfs(decision: Decision, free_seats: int, free_blocks: int) -> list[str]:
    """Who first-come-first-served admits: the head of the queue, in order, while seats and blocks last."""
    admitted = []
    for rid in decision.waiting:
        if len(admitted) == free_seats or decision.cost[rid] > free_blocks:
            break
        admitted.append(rid)
        free_blocks -= decision.cost[rid]
    return admitted


def assert_admitted_the_head_of_the_queue(d: Decision, free_seats: int, free_blocks: int) -> None:
    """Shared by both policies: admit from the head, in order, while seats and blocks last; nobody jumps ahead."""
    expected = fcfs(d, free_seats, free_blocks)
    if d.admit == expected:
        return
    assert d.admit == d.waiting[: len(d.admit)], (
        f"{d.where()}: you admitted {d.admit}, but admission is first come, first served: "
        f"take requests from the head of the queue, in order (nobody jumps the queue)"
    )
    after = " (after this step's preemptions and the running requests' growth)" if d.running else ""
    if len(d.admit) > len(expected):
        extra = d.admit[len(expected)]
        seats_left, left = free_seats - len(expected), free_blocks - sum(d.cost[r] for r in expected)
        why = "no seat is left" if seats_left == 0 else f"its prefill needs {d.cost[extra]} block(s), {left} are left"
        raise AssertionError(
            f"{d.where()}: you admitted {d.admit}, but {extra} does not fit: {why}{after}; expected {expected}"
        )
    missed = expected[len(d.admit)]
    raise AssertionError(
        f"{d.where()}: you admitted {d.admit}, but {missed} was next in the queue and fits: "
        f"{free_seats} seat(s) and {free_blocks} KV block(s) were free for newcomers{after}; expected {expected}. "
        "No seat may idle while the head of the queue fits"
    )


def first_difference(expected: list, got: list) -> str:
    """'at step 3: expected 52, got 10' for the first position where two token lists differ."""
    for i, (e, g) in enumerate(zip(expected, got)):
        if e != g:
            return f"first difference at step {i}: expected token {e}, got {g}"
    if len(expected) != len(got):
        return f"expected {len(expected)} tokens, got {len(got)} (the first {min(len(expected), len(got))} agree)"
    return "no difference"


def run_seed_story(scheduler, judge, steps: int = 500) -> dict[str, Request]:
    """The lessons' eight users on four seats (fixed reply lengths), for `steps` steps: enough to see H join."""
    from minillm.workload import SEED_STORY_SLOTS, seed_story

    model = long_tiny_model()  # any model works: ignore_eos fixes every reply's length
    requests = seed_story()
    engine = Engine(model, Referee(scheduler, judge), EngineConfig(slots=SEED_STORY_SLOTS, max_len=1024))
    for r in requests:
        engine.submit(r)
    try:
        while engine.has_work() and engine.step_no < steps:
            engine.step()
    except EngineError as e:
        raise AssertionError(f"seed story, step {engine.step_no}: the engine refused your plan: {e}") from None
    return {r.id: r for r in requests}


def assert_admitted_at(story: dict[str, Request], expected: dict[str, int], why: dict[str, str]) -> None:
    for rid, step in expected.items():
        got = story[rid].admit_step
        assert got == step, (
            f"seed story: {rid} should be admitted at step {step} ({why[rid]}), but was admitted at {got}"
        )
