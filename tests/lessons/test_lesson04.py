"""Lesson 04: the continuous (iteration-level) batching policy. Run: pytest -m lesson04

Your scheduler runs inside the real engine. A referee looks at every decision it makes: when the
running requests cannot all grow, the newest are preempted (and only as many as needed); then free
seats go to the head of the queue, in order, while the prompts fit; no seat idles while the head fits.

Edges too: prompts that fill the pool exactly on a block boundary, same-step arrivals whose ids do not sort in
queue order, steps when nobody waits; and schedule() must leave the lists it is given as they were.

WRONG (below) lists the mistakes a room makes, each caught (blocks that suffice exactly, for a prompt and
for growth, included); CORRECT, policies written differently that must pass.

Then the differential check: your policy beside the reference (ContinuousScheduler) on 30 drawn crowds
(tests/lessons/drawn/crowds.py; seeded, the same every run; MINILLM_CHECK_EXAMPLES=N draws N), each decision judged
by the referee above and compared with the reference's on the same state, the smallest crowd that differs shown
first. Its strategies: half the crowds as in lesson 03's (0 to 6 requests whose ids do not sort in queue order;
prompts of 2 to 12 tokens at, one short of and one past block boundaries; replies ending on EOS at once, before
their caps of 1 to 6, or cut by them; arrivals at steps 0 to 4; 1 to 4 seats; blocks of 1, 2 or 4 tokens in a pool
of what the largest request needs alone up to 8 more, or the contiguous layout), half squeezed: 2 to 5 requests
arriving together on as many seats (or one fewer), replies of 3 to 6 tokens, blocks of 1 or 2 tokens in a pool that
holds their prompts and 0 to 3 blocks more, so the running requests outgrow it (one victim, several in a step,
victims re-admitted, growth that fits exactly). DRAWN_ONLY names the wrong policies only the drawn crowds catch.
"""

from __future__ import annotations

import heapq
import importlib
import sys

import pytest

from minillm.engine.request import Request
from minillm.engine.scheduler import ContinuousScheduler, KVSpace, Plan
from minillm.runs.workload import SEED_STORY, SEED_STORY_SLOTS
from tests.lessons.differential import against_reference
from tests.lessons.drawn.crowds import compare, crowds
from tests.lessons.harness import (
    CHECKS,
    Decision,
    Guarded,
    Referee,
    assert_admitted_at,
    assert_admitted_the_head_of_the_queue,
    assert_served_everyone,
    assert_writes_its_own_policy,
    blocks,
    case,
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
        small_model("gqa"), Referee(Guarded(scheduler_cls()), judge_continuous), requests, slots=3, kv=kv, block_size=4
    )
    assert_served_everyone(engine, requests)


def check_preemption(scheduler_cls) -> None:
    """A paged pool too small for everyone: requests must be preempted, and still come out token-exact."""
    requests = crowd(12, seed=1)
    referee = Referee(Guarded(scheduler_cls()), judge_continuous)
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
    referee = Referee(Guarded(scheduler_cls()), judge_continuous)
    engine = serve(small_model("gqa"), referee, requests, slots=3, kv="paged", block_size=4, num_blocks=6)
    assert_served_everyone(engine, requests)
    return referee


def exact_growth() -> list[Request]:
    """A pool of 4 blocks of 4: g0 and g1 (one full block each) board at step 0; at step 1 each needs a second
    block to grow, and exactly 2 are free: nobody is preempted. Later they need more than the pool: g1 goes."""
    return [Request(f"g{i}", [257] + [(9 * i + j) % 256 for j in range(3)], 6, ignore_eos=True) for i in range(2)]


def on_a_boundary() -> list[Request]:
    """A pool of 10 blocks of 4: prompts that end exactly on a block boundary, b0 (16 tokens, 4 blocks) and b1 (24,
    6 blocks), fill it at step 0; b2, one token past a boundary (17 tokens, 5 blocks), waits until both have gone."""
    return [
        Request(f"b{i}", [257] + [(5 * i + j) % 256 for j in range(n - 1)], 1, ignore_eos=True)
        for i, n in enumerate([16, 24, 17])
    ]


def check_exact_fits(scheduler_cls) -> None:
    """Blocks that suffice exactly are enough: for a newcomer's prompt (one short of a block boundary, and on one),
    and for the running requests' growth."""
    crowds = [
        ("prompts that fill the free blocks exactly, one token short of a block boundary", exact_crowd(), 10),
        ("prompts that end exactly on a block boundary (16 and 24 tokens in blocks of 4)", on_a_boundary(), 10),
        ("two requests whose growth needs exactly the 2 free blocks at step 1", exact_growth(), 4),
    ]
    for label, requests, pool in crowds:
        with case(label):
            referee = Referee(Guarded(scheduler_cls()), judge_continuous)
            engine = serve(small_model("gqa"), referee, requests, slots=4, kv="paged", block_size=4, num_blocks=pool)
            assert_served_everyone(engine, requests)


def arrival_crowd() -> list[Request]:
    """(Two seats.) u10, u2 and u1 arrive at step 0, u11 and u0 at step 1: the queue's order, not their ids' (as text
    or as numbers), decides who takes each seat as it frees; then nobody waits until u9 arrives at step 12."""
    arrivals = [("u10", 0), ("u2", 0), ("u1", 0), ("u11", 1), ("u0", 1), ("u9", 12)]
    return [Request(rid, [257, 7, 7, 7], 3, arrival_step=step, ignore_eos=True) for rid, step in arrivals]


def check_arrival_order(scheduler_cls) -> None:
    requests = arrival_crowd()
    label = "same-step arrivals whose ids do not sort in submit order (u10, u2, u1 at step 0; u11, u0 at step 1)"
    with case(label):
        referee = Referee(Guarded(scheduler_cls()), judge_continuous)
        engine = serve(small_model("gqa"), referee, requests, slots=2, kv="paged", block_size=4)
        assert_served_everyone(engine, requests)


def check_seed_story(scheduler_cls) -> None:
    """Worked out on paper from the story's reply lengths: the head of the queue takes a seat the step after
    its user's reply ends (every reply here takes one step per token, its EOS included)."""
    story = run_seed_story(Guarded(scheduler_cls()), judge_continuous)
    free_at, leaving, expected, why = [0] * SEED_STORY_SLOTS, [None] * SEED_STORY_SLOTS, {}, {}
    for rid, _, steps in SEED_STORY:
        seat = min(range(SEED_STORY_SLOTS), key=lambda s: free_at[s])
        expected[rid] = free_at[seat]
        why[rid] = "a free seat at step 0" if leaving[seat] is None else (
            f"{leaving[seat]} finished at step {free_at[seat] - 1}: its seat is free at {free_at[seat]}")  # fmt: skip
        free_at[seat], leaving[seat] = free_at[seat] + steps, rid
    assert_admitted_at(story, expected, why)


def check_drawn_crowds(scheduler_cls) -> None:
    """Your policy beside the reference on drawn crowds (tests/lessons/drawn/crowds.py), half of them squeezed so
    that the running requests outgrow the pool."""
    reference = lambda: ContinuousScheduler(token_budget=None)  # noqa: E731
    against_reference("your policy", crowds(pressure=True), compare(scheduler_cls, reference, judge_continuous), 30)


def check_all(scheduler_cls) -> None:
    check_cases(scheduler_cls)
    check_drawn_crowds(scheduler_cls)


def check_cases(scheduler_cls) -> None:
    check_crowd(scheduler_cls, "contiguous")
    check_crowd(scheduler_cls, "paged")
    check_preemption(scheduler_cls)
    check_two_victims(scheduler_cls)
    check_exact_fits(scheduler_cls)
    check_arrival_order(scheduler_cls)
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


def test_same_step_arrivals_board_in_queue_order(scheduler_cls):
    check_arrival_order(scheduler_cls)


def test_the_seed_story_fills_each_seat_the_step_after_it_frees(scheduler_cls):
    check_seed_story(scheduler_cls)


def test_your_policy_decides_as_the_reference_on_drawn_crowds(scheduler_cls):
    check_drawn_crowds(scheduler_cls)


# --- the checks catch plausible mistakes --------------------------------------------------------
class Continuous:
    """A continuous scheduler written out, with switches for the mistakes below."""

    name = "continuous-variant"
    holds_finished_seats = False

    def __init__(
        self, victim=-1, preempts=True, counts_growth=True, jumps_queue=False, per_step=None, waits=False, victims=None,
        order="admission", strict=(), frees=True, victims_grow=False, pops=False, marks_seats=False,
        first_token_block=False, queue="as-given", peeks=False,
    ):  # fmt: skip
        self.victim, self.preempts, self.counts_growth = victim, preempts, counts_growth
        self.jumps_queue, self.per_step, self.waits, self.max_victims = jumps_queue, per_step, waits, victims
        self.order, self.strict, self.frees, self.victims_grow = order, strict, frees, victims_grow
        self.pops, self.marks_seats = pops, marks_seats
        self.first_token_block, self.queue, self.peeks = first_token_block, queue, peeks

    def schedule(self, waiting: list[Request], seats: list[Request | None], kv: KVSpace) -> Plan:
        if self.peeks:  # the head, read before asking if there is one (wrong)
            kv.blocks_to_admit(waiting[0].tokens_in_cache_after_prefill)
        by = (lambda r: r.seat) if self.order == "seat" else (lambda r: r.admit_order)  # seat: wrong
        keep, victims, free = sorted((r for r in seats if r), key=by), [], kv.free_blocks
        running = list(keep)
        short = (lambda need, free: need >= free) if "growth" in self.strict else (lambda need, free: need > free)
        while self.preempts and keep and short(sum(kv.blocks_to_grow(r.seat) for r in keep), free):
            if self.max_victims is not None and len(victims) == self.max_victims:
                break  # one victim per step, as if the next step could fix the rest (wrong)
            victims.append(keep.pop(self.victim))  # -1: the newest; 0: the oldest (wrong)
            if self.frees == "the-last-victims":  # `=`, not `+=`: only the last victim's blocks count (wrong)
                free = kv.free_blocks + kv.blocks_held(victims[-1].seat)
            elif self.frees:  # (wrong without: the victim's blocks never count as free)
                free += kv.blocks_held(victims[-1].seat)
        if self.counts_growth:  # victims_grow: as if the victims still grew this step (wrong)
            free -= sum(kv.blocks_to_grow(r.seat) for r in (running if self.victims_grow else keep))
        if self.waits and keep:  # static in disguise
            return Plan(preempt=victims)
        if self.marks_seats:  # the victims' seats marked free in the caller's list, to count them (wrong)
            for r in victims:
                seats[seats.index(r)] = None
        admit, seats_left = [], seats.count(None) + (0 if self.marks_seats else len(victims))
        queue = sorted(waiting, key=lambda r: (r.arrival_step, r.id)) if self.queue == "arrival-then-id" else waiting
        for r in list(queue):  # arrival-then-id: "oldest first, ties by id", but the queue is in order already (wrong)
            cost = kv.blocks_to_admit(r.tokens_in_cache_after_prefill + self.first_token_block)  # +1: wrong
            if len(admit) == min(seats_left, self.per_step or seats_left):
                break
            if "admission" in self.strict and cost >= free:
                break  # a prompt that fills the free blocks exactly waits (wrong)
            if cost > free:
                if self.jumps_queue:
                    continue  # let a smaller one behind it go first (wrong)
                break
            admit.append(r)
            if self.pops:  # off the caller's list, as if the queue were the policy's own (wrong)
                waiting.remove(r)
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
    # caught only by the arguments' check: the engine hands each policy copies, another caller may not
    "pops-admitted-requests-off-the-queue": dict(pops=True),
    "marks-the-victims-seats-free-in-the-seats-list": dict(marks_seats=True),
    # caught by the tiny pool too (a preempted request re-admitted on a block boundary, or queued ahead of older
    # arrivals), and named by a case of their own
    "reserves-a-block-for-the-first-reply-token": dict(first_token_block=True),
    "sorts-same-step-arrivals-by-id": dict(queue="arrival-then-id"),
    "reads-the-head-of-an-empty-queue": dict(peeks=True),
    # right on every hand-built crowd (two victims in a step at most, with nobody waiting); the drawn crowds catch it
    "counts-only-the-last-victims-blocks": dict(frees="the-last-victims"),
}
DRAWN_ONLY = ["counts-only-the-last-victims-blocks"]  # only the drawn crowds catch these
NAMED_BY = {
    "pops-admitted-requests-off-the-queue": "your schedule() changed the `waiting` list it was given",
    "marks-the-victims-seats-free-in-the-seats-list": "your schedule() changed the `seats` list it was given",
}
ARRIVALS = "same-step arrivals whose ids do not sort in submit order"
OWN_CASE = {  # mistake: the check whose case catches it, and how its failure begins
    "reserves-a-block-for-the-first-reply-token": (check_exact_fits, "prompts that end exactly on a block boundary"),
    "sorts-same-step-arrivals-by-id": (check_arrival_order, ARRIVALS),
    "reads-the-head-of-an-empty-queue": (check_arrival_order, ARRIVALS),
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


class ContinuousWithAHeap:
    """Right, written differently: the running requests in a heap, newest on top (heapq, by -admit_order); victims
    popped while the growth of those left exceeds what is free; admissions in a while loop over an index."""

    name, holds_finished_seats = "continuous-heap", False

    def schedule(self, waiting, seats, kv):
        heap = [(-r.admit_order, r.seat, r) for r in seats if r is not None]
        heapq.heapify(heap)
        free, victims = kv.free_blocks, []
        while heap and sum(kv.blocks_to_grow(seat) for _, seat, _ in heap) > free:
            _, seat, newest = heapq.heappop(heap)
            victims.append(newest)
            free += kv.blocks_held(seat)
        free -= sum(kv.blocks_to_grow(seat) for _, seat, _ in heap)
        cost = lambda r: kv.blocks_to_admit(r.tokens_in_cache_after_prefill)
        seats_left, i = sum(r is None for r in seats) + len(victims), 0
        while i < min(seats_left, len(waiting)) and cost(waiting[i]) <= free:
            free -= cost(waiting[i])
            i += 1
        return Plan(admit=waiting[:i], preempt=victims)


def newest_victims(running, kv) -> tuple[list, int]:
    """The fewest newest running requests whose blocks leave room for the rest to grow, and the blocks then left."""
    by_age, free = sorted(running, key=lambda r: r.admit_order), kv.free_blocks
    for cut in range(len(by_age), -1, -1):  # keep the oldest `cut`
        kept, gone = by_age[:cut], by_age[cut:]
        left = free + sum(kv.blocks_held(r.seat) for r in gone) - sum(kv.blocks_to_grow(r.seat) for r in kept)
        if left >= 0:
            return gone[::-1], left
    return by_age[::-1], free


class ContinuousByCuts:
    """Right, written differently: a helper function tries keeping the oldest n for n = all, all - 1, ..., and the
    first n whose growth fits decides the victims (no loop state); admissions by a list comprehension's running sum."""

    name, holds_finished_seats = "continuous-by-cuts", False

    def schedule(self, waiting, seats, kv):
        victims, free = newest_victims([r for r in seats if r is not None], kv)
        costs = [kv.blocks_to_admit(r.tokens_in_cache_after_prefill) for r in waiting]
        fits = [sum(costs[: i + 1]) <= free for i in range(len(costs))] + [False]
        count = min(fits.index(False), seats.count(None) + len(victims))
        return Plan(admit=waiting[:count], preempt=victims)


CORRECT = {
    "written-out": Continuous,
    "newest-first-loop": ContinuousNewestFirst,
    "a-heap": ContinuousWithAHeap,
    "by-cuts": ContinuousByCuts,
}


@CHECKS
@pytest.mark.parametrize("right", CORRECT.values(), ids=CORRECT.keys())
def test_a_correct_version_passes(right):
    check_all(right)


@CHECKS
@pytest.mark.parametrize("name", NAMED_BY)
def test_an_argument_changed_is_named_first(name):
    with pytest.raises(AssertionError) as failure:
        check_all(lambda: Continuous(**WRONG[name]))
    first = str(failure.value).splitlines()[0]
    assert first.startswith("step ") and NAMED_BY[name] in first, first


@CHECKS
@pytest.mark.parametrize("name", OWN_CASE)
def test_an_edge_mistake_is_named_by_its_own_case(name):
    check, begins = OWN_CASE[name]
    with pytest.raises(AssertionError) as failure:
        check(lambda: Continuous(**WRONG[name]))
    assert str(failure.value).startswith(begins), str(failure.value)


@CHECKS
def test_the_boundary_and_arrival_crowds_are_what_their_names_say():
    referee = Referee(ContinuousScheduler(), judge_continuous)
    serve(small_model("gqa"), referee, on_a_boundary(), slots=4, kv="paged", block_size=4, num_blocks=10)
    first = referee.decisions[0]
    assert first.admit == ["b0", "b1"] and first.cost == {"b0": 4, "b1": 6, "b2": 5} and first.free_blocks == 10
    referee = Referee(ContinuousScheduler(), judge_continuous)
    requests = arrival_crowd()
    serve(small_model("gqa"), referee, requests, slots=2, kv="paged", block_size=4)
    assert [r.admit_step for r in requests] == [0, 0, 3, 3, 6, 12]
    assert any(not d.waiting and not d.running for d in referee.decisions), "a step with nobody waiting or running"


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
@pytest.mark.parametrize("name", DRAWN_ONLY)
def test_the_drawn_crowds_catch_what_the_cases_miss(name):
    check_cases(lambda: Continuous(**WRONG[name]))  # every hand-built crowd passes it
    with pytest.raises(AssertionError, match="you preempted"):
        check_drawn_crowds(lambda: Continuous(**WRONG[name]))


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
