"""Lesson 04: the continuous (iteration-level) batching policy. Run: pytest -m lesson04

Your scheduler runs inside the real engine. A referee looks at every decision it makes: when the
running requests cannot all grow, the newest are preempted (and only as many as needed); then free
seats go to the head of the queue, in order, while the prompts fit; no seat idles while the head fits.

WRONG (below) lists the mistakes a room makes, each caught (blocks that suffice exactly, for a prompt and
for growth, included); ContinuousNewestFirst, a policy written differently that must pass.
"""

from __future__ import annotations

import importlib
import sys

import pytest

from minillm.engine.request import Request
from minillm.engine.scheduler import ContinuousScheduler, KVSpace, Plan
from minillm.runs.workload import SEED_STORY, SEED_STORY_SLOTS
from tests.lessons.harness import (
    CHECKS,
    Decision,
    Referee,
    assert_admitted_at,
    assert_admitted_the_head_of_the_queue,
    assert_served_everyone,
    assert_writes_its_own_policy,
    blocks,
    crowd,
    exact_crowd,
    implementations,
    run_seed_story,
    serve,
    small_model,
    student_module,
)

lesson = pytest.mark.lesson04  # your code's checks: pytest -m lesson04


@pytest.fixture(params=implementations(lesson))
def scheduler_cls(request):
    if request.param == "reference":
        return ContinuousScheduler
    module = student_module("lesson04_continuous")
    assert_writes_its_own_policy(module, "MyContinuousScheduler")
    return module.MyContinuousScheduler


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
            why = f"the running requests need {blocks(need)} to grow and {d.free_blocks} are free: preempt nobody"
        else:
            why = (
                f"the running requests need {blocks(need)} to grow but only {d.free_blocks} are free: preempt "
                f"the most recently admitted first, and only until the rest fit; expected {victims}"
            )
        raise AssertionError(f"{d.where()}: you preempted {d.preempt}; {why}")
    free -= sum(d.grow[r] for r in keep)
    assert_admitted_the_head_of_the_queue(d, d.free_seats + len(victims), free, victims)


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
    engine = serve(small_model("gqa"), referee, requests, slots=4, kv="paged", block_size=4, num_blocks=14)
    assert_served_everyone(engine, requests)
    assert sum(r.preemptions for r in requests) > 0, (
        "a pool of 14 blocks is too small for this crowd without preemption"
    )


def two_victims() -> list[Request]:
    """Three requests holding 3, 2 and 1 blocks of 4 tokens fill a pool of 6; at step 1 each needs a new
    block. Preempting the newest (1 block) leaves 1 free for 2 needs: the next newest must go too."""
    shape = [(12, 6), (8, 5), (4, 7)]  # (prompt tokens, reply tokens)
    return [
        Request(f"v{i}", [257] + [(5 * i + j) % 256 for j in range(n - 1)], reply, ignore_eos=True)
        for i, (n, reply) in enumerate(shape)
    ]


def check_two_victims(scheduler_cls) -> Referee:
    requests = two_victims()
    referee = Referee(scheduler_cls(), judge_continuous)
    engine = serve(small_model("gqa"), referee, requests, slots=3, kv="paged", block_size=4, num_blocks=6)
    assert_served_everyone(engine, requests)
    return referee


def exact_growth() -> list[Request]:
    """A pool of 4 blocks of 4: g0 and g1 (one full block each) board at step 0; at step 1 each needs a second
    block to grow, and exactly 2 are free: nobody is preempted. Later they need more than the pool: g1 goes."""
    return [Request(f"g{i}", [257] + [(9 * i + j) % 256 for j in range(3)], 6, ignore_eos=True) for i in range(2)]


def check_exact_fits(scheduler_cls) -> None:
    """Blocks that suffice exactly are enough: for a newcomer's prompt, and for the running requests' growth."""
    for requests, pool in ((exact_crowd(), 10), (exact_growth(), 4)):
        referee = Referee(scheduler_cls(), judge_continuous)
        engine = serve(small_model("gqa"), referee, requests, slots=4, kv="paged", block_size=4, num_blocks=pool)
        assert_served_everyone(engine, requests)


def check_seed_story(scheduler_cls) -> None:
    """Worked out on paper from the story's reply lengths: the head of the queue takes a seat the step after
    its user's reply ends (every reply here takes one step per token, its EOS included)."""
    story = run_seed_story(scheduler_cls(), judge_continuous)
    free_at, leaving, expected, why = [0] * SEED_STORY_SLOTS, [None] * SEED_STORY_SLOTS, {}, {}
    for rid, _, steps in SEED_STORY:
        seat = min(range(SEED_STORY_SLOTS), key=lambda s: free_at[s])
        expected[rid] = free_at[seat]
        why[rid] = "a free seat at step 0" if leaving[seat] is None else (
            f"{leaving[seat]} finished at step {free_at[seat] - 1}: its seat is free at {free_at[seat]}")  # fmt: skip
        free_at[seat], leaving[seat] = free_at[seat] + steps, rid
    assert_admitted_at(story, expected, why)


def check_all(scheduler_cls) -> None:
    check_crowd(scheduler_cls, "contiguous")
    check_crowd(scheduler_cls, "paged")
    check_preemption(scheduler_cls)
    check_two_victims(scheduler_cls)
    check_exact_fits(scheduler_cls)
    check_seed_story(scheduler_cls)


@pytest.mark.parametrize("kv", ["contiguous", "paged"])
def test_a_crowd_is_served_exactly_and_no_seat_idles(scheduler_cls, kv):
    check_crowd(scheduler_cls, kv)


def test_a_tiny_pool_preempts_the_newest_and_stays_exact(scheduler_cls):
    check_preemption(scheduler_cls)


def test_one_step_can_need_two_victims(scheduler_cls):
    check_two_victims(scheduler_cls)


def test_blocks_that_suffice_exactly_are_enough(scheduler_cls):
    check_exact_fits(scheduler_cls)


def test_the_seed_story_fills_each_seat_the_step_after_it_frees(scheduler_cls):
    check_seed_story(scheduler_cls)


# --- the checks catch plausible mistakes --------------------------------------------------------
class Continuous:
    """A continuous scheduler written out, with switches for the mistakes below."""

    name = "continuous-variant"
    holds_finished_seats = False

    def __init__(
        self, victim=-1, preempts=True, counts_growth=True, jumps_queue=False, per_step=None, waits=False, victims=None,
        order="admission", strict=(), frees=True, victims_grow=False,
    ):  # fmt: skip
        self.victim, self.preempts, self.counts_growth = victim, preempts, counts_growth
        self.jumps_queue, self.per_step, self.waits, self.max_victims = jumps_queue, per_step, waits, victims
        self.order, self.strict, self.frees, self.victims_grow = order, strict, frees, victims_grow

    def schedule(self, waiting: list[Request], seats: list[Request | None], kv: KVSpace) -> Plan:
        by = (lambda r: r.seat) if self.order == "seat" else (lambda r: r.admit_order)  # seat: wrong
        keep, victims, free = sorted((r for r in seats if r), key=by), [], kv.free_blocks
        running = list(keep)
        short = (lambda need, free: need >= free) if "growth" in self.strict else (lambda need, free: need > free)
        while self.preempts and keep and short(sum(kv.blocks_to_grow(r.seat) for r in keep), free):
            if self.max_victims is not None and len(victims) == self.max_victims:
                break  # one victim per step, as if the next step could fix the rest (wrong)
            victims.append(keep.pop(self.victim))  # -1: the newest; 0: the oldest (wrong)
            if self.frees:  # (wrong without: the victim's blocks never count as free)
                free += kv.blocks_held(victims[-1].seat)
        if self.counts_growth:  # victims_grow: as if the victims still grew this step (wrong)
            free -= sum(kv.blocks_to_grow(r.seat) for r in (running if self.victims_grow else keep))
        if self.waits and keep:  # static in disguise
            return Plan(preempt=victims)
        admit, seats_left = [], seats.count(None) + len(victims)
        for r in waiting:
            cost = kv.blocks_to_admit(r.tokens_in_cache_after_prefill)
            if len(admit) == min(seats_left, self.per_step or seats_left):
                break
            if "admission" in self.strict and cost >= free:
                break  # a prompt that fills the free blocks exactly waits (wrong)
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
    "at-most-one-victim-per-step": dict(victims=1),
    "picks-the-victim-by-seat-not-admission": dict(order="seat"),
    "refuses-a-prompt-that-fits-exactly": dict(strict=("admission",)),
    "preempts-when-growth-fits-exactly": dict(strict=("growth",)),
    "forgets-the-victims-blocks": dict(frees=False),
    "still-counts-the-victims-growth": dict(victims_grow=True),
}


class ContinuousNewestFirst:
    """Right, written differently: victims walked from the newest in a for loop, free seats counted afresh."""

    name, holds_finished_seats = "continuous-newest-first", False

    def schedule(self, waiting, seats, kv):
        running = sorted((r for r in seats if r is not None), key=lambda r: -r.admit_order)  # newest first
        need, free, victims = sum(kv.blocks_to_grow(r.seat) for r in running), kv.free_blocks, []
        for r in running:
            if need <= free:
                break
            victims.append(r)
            need, free = need - kv.blocks_to_grow(r.seat), free + kv.blocks_held(r.seat)
        free -= need
        admit = []
        for r in waiting:
            if len(admit) == seats.count(None) + len(victims):
                break
            cost = kv.blocks_to_admit(r.tokens_in_cache_after_prefill)
            if cost > free:
                break
            admit.append(r)
            free -= cost
        return Plan(admit=admit, preempt=victims)


@CHECKS
@pytest.mark.parametrize("right", [Continuous, ContinuousNewestFirst], ids=["written-out", "newest-first-loop"])
def test_a_correct_version_passes(right):
    check_all(right)


@CHECKS
def test_the_exact_growth_crowd_needs_every_free_block_at_step_1():
    referee = Referee(ContinuousScheduler(), judge_continuous)
    serve(small_model("gqa"), referee, exact_growth(), slots=4, kv="paged", block_size=4, num_blocks=4)
    step1 = referee.decisions[1]
    assert sum(step1.grow.values()) == step1.free_blocks == 2 and not step1.preempt
    assert any(d.preempt for d in referee.decisions), "later the two need more than the pool"


@CHECKS
@pytest.mark.parametrize("mistake", WRONG.values(), ids=WRONG.keys())
def test_the_checks_catch_a_wrong_continuous_policy(mistake):
    with pytest.raises(AssertionError):
        check_all(lambda: Continuous(**mistake))


@CHECKS
def test_the_stub_is_rejected():
    class Stub:
        name, holds_finished_seats = "stub", False

        def schedule(self, waiting, seats, kv):
            raise NotImplementedError

    with pytest.raises(NotImplementedError):
        check_all(Stub)


@CHECKS
def test_the_two_victims_crowd_needs_two_victims_in_one_step():
    referee = check_two_victims(ContinuousScheduler)
    assert any(len(d.preempt) == 2 for d in referee.decisions)


@CHECKS
@pytest.mark.parametrize(
    "source",
    [
        "from minillm.engine.scheduler import ContinuousScheduler as MyContinuousScheduler\n",
        "from minillm.engine.scheduler import Plan, admit_in_order\nclass MyContinuousScheduler: pass\n",
        "import minillm.engine.scheduler as s\nclass MyContinuousScheduler(s.ContinuousScheduler): pass\n",
        "from minillm.engine import scheduler\nclass MyContinuousScheduler(scheduler.ContinuousScheduler): pass\n",
        "from minillm.engine import SCHEDULERS, Plan\nclass MyContinuousScheduler: pass\n",
        "from minillm.engine import ContinuousScheduler\nclass MyContinuousScheduler(ContinuousScheduler): pass\n",
    ],
)
def test_a_policy_borrowed_from_the_reference_is_refused(source, tmp_path, monkeypatch):
    (tmp_path / "borrowed.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    borrowed = importlib.import_module("borrowed")
    try:
        with pytest.raises(AssertionError, match="write the policy yourself"):
            assert_writes_its_own_policy(borrowed, "MyContinuousScheduler")
    finally:
        sys.modules.pop("borrowed", None)


@CHECKS
def test_your_own_file_may_import_plan_and_kvspace():
    from lessons.exercises import lesson04_continuous

    assert_writes_its_own_policy(lesson04_continuous, "MyContinuousScheduler")
