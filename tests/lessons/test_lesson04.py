"""Lesson 04: the continuous (iteration-level) batching policy. Run: pytest -m lesson04

Your scheduler runs inside the real engine. A referee looks at every decision it makes: when the
running requests cannot all grow, the newest are preempted (and only as many as needed); then free
seats go to the head of the queue, in order, while the prompts fit; no seat idles while the head fits.
"""

from __future__ import annotations

import pytest

from minillm.request import Request
from minillm.scheduler import ContinuousScheduler, KVSpace, Plan
from tests.lessons.harness import (
    IMPLS,
    Decision,
    Referee,
    assert_admitted_at,
    assert_admitted_the_head_of_the_queue,
    assert_served_everyone,
    crowd,
    run_seed_story,
    serve,
    small_model,
    student_module,
)

pytestmark = pytest.mark.lesson04


@pytest.fixture(params=IMPLS)
def scheduler_cls(request):
    if request.param == "reference":
        return ContinuousScheduler
    return student_module("lesson04_continuous").MyContinuousScheduler


# --- the checks --------------------------------------------------------------------------------
def judge_continuous(d: Decision) -> None:
    """The continuous policy's rules, applied to one step's decision."""
    keep, victims, free = list(d.running), [], d.free_blocks  # running: oldest admission first
    while keep and sum(d.grow[r] for r in keep) > free:
        victims.append(keep.pop())  # the newest goes first
        free += d.held[victims[-1]]
    need = sum(d.grow[r] for r in d.running)
    if sorted(d.preempt) != sorted(victims):
        if not victims:
            why = f"the running requests need {need} new block(s) to grow and {d.free_blocks} are free: preempt nobody"
        else:
            why = (
                f"the running requests need {need} new block(s) to grow but only {d.free_blocks} are free: preempt "
                f"the most recently admitted first, and only until the rest fit; expected {victims}"
            )
        raise AssertionError(f"{d.where()}: you preempted {d.preempt}; {why}")
    free -= sum(d.grow[r] for r in keep)
    assert_admitted_the_head_of_the_queue(d, d.free_seats + len(victims), free)


def check_crowd(scheduler_cls, kv: str) -> None:
    """Ten requests arriving over time, three seats, memory to spare: every step obeys the rules."""
    requests = crowd()
    engine = serve(
        small_model("gqa"), Referee(scheduler_cls(), judge_continuous), requests, slots=3, kv=kv, block_size=4
    )
    assert_served_everyone(engine, requests)


def check_preemption(scheduler_cls) -> None:
    """A paged pool too small for everyone: requests must be preempted, and still come out token-exact."""
    requests = crowd(12, seed=1)
    referee = Referee(scheduler_cls(), judge_continuous)
    engine = serve(small_model("mqa"), referee, requests, slots=4, kv="paged", block_size=4, num_blocks=14)
    assert_served_everyone(engine, requests)
    assert sum(r.preemptions for r in requests) > 0, (
        "a pool of 14 blocks is too small for this crowd without preemption"
    )
    engine.cache.allocator.check()


def check_seed_story(scheduler_cls) -> None:
    story = run_seed_story(scheduler_cls(), judge_continuous)
    why = dict.fromkeys("ABCD", "four users, four free seats")
    why |= dict(E="A finished at step 11: its seat is free at 12", H="B finished at step 498")
    why |= dict.fromkeys("FG", "C and D finished at step 41")
    assert_admitted_at(story, dict(A=0, B=0, C=0, D=0, E=12, F=42, G=42, H=499), why)


def check_all(scheduler_cls) -> None:
    check_crowd(scheduler_cls, "contiguous")
    check_crowd(scheduler_cls, "paged")
    check_preemption(scheduler_cls)
    check_seed_story(scheduler_cls)


@pytest.mark.parametrize("kv", ["contiguous", "paged"])
def test_a_crowd_is_served_exactly_and_no_seat_idles(scheduler_cls, kv):
    check_crowd(scheduler_cls, kv)


def test_a_tiny_pool_preempts_the_newest_and_stays_exact(scheduler_cls):
    check_preemption(scheduler_cls)


def test_the_seed_story_fills_each_seat_the_step_after_it_frees(scheduler_cls):
    check_seed_story(scheduler_cls)


# --- the checks catch plausible mistakes --------------------------------------------------------
class Continuous:
    """A continuous scheduler written out, with switches for the mistakes below."""

    name = "continuous-variant"
    holds_finished_seats = False

    def __init__(self, victim=-1, preempts=True, counts_growth=True, jumps_queue=False, per_step=None, waits=False):
        self.victim, self.preempts, self.counts_growth = victim, preempts, counts_growth
        self.jumps_queue, self.per_step, self.waits = jumps_queue, per_step, waits

    def schedule(self, waiting: list[Request], seats: list[Request | None], kv: KVSpace) -> Plan:
        keep, victims, free = sorted((r for r in seats if r), key=lambda r: r.admit_order), [], kv.free_blocks
        while self.preempts and keep and sum(kv.blocks_to_grow(r.seat) for r in keep) > free:
            victims.append(keep.pop(self.victim))  # -1: the newest; 0: the oldest (wrong)
            free += kv.blocks_held(victims[-1].seat)
        if self.counts_growth:
            free -= sum(kv.blocks_to_grow(r.seat) for r in keep)
        if self.waits and keep:  # static in disguise
            return Plan(preempt=victims)
        admit, seats_left = [], seats.count(None) + len(victims)
        for r in waiting:
            cost = kv.blocks_to_admit(r.tokens_in_cache_after_prefill)
            if len(admit) == min(seats_left, self.per_step or seats_left):
                break
            if cost > free:
                if self.jumps_queue:
                    continue  # let a smaller one behind it go first (wrong)
                break
            admit.append(r)
            free -= cost
        return Plan(admit=admit, preempt=victims)


WRONG = {
    "preempts-the-oldest": dict(victim=0),
    "never-preempts": dict(preempts=False),
    "forgets-decode-growth": dict(counts_growth=False),
    "smaller-jumps-the-queue": dict(jumps_queue=True),
    "one-admission-per-step": dict(per_step=1),
    "waits-for-the-batch": dict(waits=True),
}


def test_a_correct_version_passes():
    check_all(Continuous)


@pytest.mark.parametrize("mistake", WRONG.values(), ids=WRONG.keys())
def test_the_checks_catch_a_wrong_continuous_policy(mistake):
    with pytest.raises(AssertionError):
        check_all(lambda: Continuous(**mistake))


def test_the_stub_is_rejected():
    class Stub:
        name, holds_finished_seats = "stub", False

        def schedule(self, waiting, seats, kv):
            raise NotImplementedError

    with pytest.raises(NotImplementedError):
        check_all(Stub)
