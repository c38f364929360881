"""Lesson 03: the static batching policy. Run: pytest -m lesson03

Your scheduler runs inside the real engine. A referee looks at every decision it makes:
while any member of the batch still runs, nobody joins; once all have finished, the next batch
is the head of the queue, in order, as many as fit.

The edges are checked too: prompts that fill the free blocks exactly on a block boundary (and one token past
one), batch members that end on EOS before their caps (one on its very first token: an empty reply), same-step
arrivals whose ids do not sort in queue order, steps when nobody waits; and schedule() must leave the lists it is
given as they were. Each edge failure names its case first.

WRONG (below) lists the mistakes a room makes, each caught (a prompt that fills the free blocks exactly
included); CORRECT, policies written differently that must pass.

Then the differential check: your policy beside the reference (StaticScheduler) on 40 drawn crowds
(tests/lessons/drawn/crowds.py; seeded, the same every run; MINILLM_CHECK_EXAMPLES=N draws N), each decision judged
by the referee above and compared with the reference's on the same state, the smallest crowd that differs shown
first. Its strategies: 0 to 6 requests (ids that do not sort in queue order), prompts of 2 to 12 tokens drawn at,
one short of and one past block boundaries, replies the stand-in model ends with EOS after 0 to 6 tokens under caps
of 1 to 5 (before the cap, at it, at once), arrivals at steps 0 to 4 (several in a step, gaps with nobody waiting);
1 to 4 seats; blocks of 1, 2 or 4 tokens in a pool of exactly what the largest request needs alone up to 8 more
(admissions stop on memory, a prompt that fills what is free exactly), or the contiguous layout. A crowd where the
reference would preempt is drawn again. DRAWN_ONLY names the wrong policies only the drawn crowds catch.
"""

from __future__ import annotations

import itertools

import pytest

from minillm.engine.request import Request
from minillm.engine.scheduler import KVSpace, Plan, StaticScheduler
from minillm.runs.workload import SEED_STORY, SEED_STORY_SLOTS
from tests.lessons.differential import against_reference
from tests.lessons.drawn.crowds import compare, countdown_model, crowds
from tests.lessons.harness import (
    CHECKS,
    Decision,
    Guarded,
    Referee,
    assert_admitted_at,
    assert_admitted_the_head_of_the_queue,
    assert_served_everyone,
    assert_writes_its_own_policy,
    case,
    crowd,
    exact_crowd,
    implementations,
    run_seed_story,
    serve,
    small_model,
    student_module,
)

lesson = pytest.mark.lesson03  # your code's checks: pytest -m lesson03


@pytest.fixture(params=implementations(lesson))
def scheduler_cls(request):
    if request.param == "reference":
        return StaticScheduler
    module = student_module("lesson03_static")
    assert_writes_its_own_policy(module, "MyStaticScheduler")
    return module.MyStaticScheduler


# --- the checks --------------------------------------------------------------------------------
def judge_static(d: Decision) -> None:
    """The static policy's rule, applied to one step's decision."""
    if d.running:
        if d.admit:
            raise AssertionError(
                f"{d.where()}: you admitted {d.admit} while {d.running} still run; static batching lets "
                "nobody join until every member of the batch has finished"
            )
        return
    assert_admitted_the_head_of_the_queue(d, d.free_seats, d.free_blocks)


def check_crowd(scheduler_cls, kv: str) -> None:
    """Ten requests arriving over time, three seats: every step obeys the rule, everyone is served exactly."""
    requests = crowd()
    referee = Referee(Guarded(scheduler_cls()), judge_static)
    engine = serve(small_model("gqa"), referee, requests, slots=3, kv=kv, block_size=4)
    assert_served_everyone(engine, requests)


def memory_crowd() -> list[Request]:
    """Four seats, but a pool of 12 blocks of 4 tokens: memory, not seats, decides who boards.

    The first batch: q0 and q1 (4 blocks each) fit; q2 (5 blocks) does not fit in the 4 left, so it and
    everyone behind it waits, although q3 (2 blocks) would fit. The second batch: q2, q3, q4 (10 blocks).
    Replies are short enough that every batch first come, first served forms can finish without
    running out of blocks (no preemption needed)."""
    shape = [(14, 3), (14, 3), (18, 3), (6, 6), (10, 2), (9, 4), (30, 2), (5, 5)]  # (prompt tokens, reply)
    return [
        Request(f"q{i}", [257] + [(7 * i + j) % 256 for j in range(n - 1)], reply, ignore_eos=True)
        for i, (n, reply) in enumerate(shape)
    ]


def check_memory(scheduler_cls) -> None:
    """Admission limited by KV blocks: first come, first served, counting each admission's blocks."""
    requests = memory_crowd()
    referee = Referee(Guarded(scheduler_cls()), judge_static)
    engine = serve(small_model("gqa"), referee, requests, slots=4, kv="paged", block_size=4, num_blocks=12)
    assert_served_everyone(engine, requests)


def check_exact_fit(scheduler_cls) -> None:
    """A prompt that needs exactly the blocks still free fits: it boards."""
    requests = exact_crowd()
    referee = Referee(Guarded(scheduler_cls()), judge_static)
    engine = serve(small_model("gqa"), referee, requests, slots=4, kv="paged", block_size=4, num_blocks=10)
    assert_served_everyone(engine, requests)


def check_seed_story(scheduler_cls) -> None:
    story = run_seed_story(Guarded(scheduler_cls()), judge_static)
    batch = SEED_STORY[:SEED_STORY_SLOTS]  # the story's first users fill the seats; the rest board together
    longest, steps = max(((rid, n) for rid, _, n in batch), key=lambda x: x[1])
    first = f"the first batch: {len(batch)} users, {SEED_STORY_SLOTS} free seats"
    late = (
        f"{longest}, the longest of the first batch, finished at step {steps - 1}; only then may the next batch start"
    )
    expected = {rid: 0 if i < SEED_STORY_SLOTS else steps for i, (rid, _, _) in enumerate(SEED_STORY)}
    assert_admitted_at(story, expected, {rid: first if step == 0 else late for rid, step in expected.items()})


def boundary_crowd() -> list[Request]:
    """(Pool of 10 blocks of 4.) Prompts that end exactly on a block boundary fill the pool exactly: b0 (16 tokens,
    4 blocks) and b1 (24, 6 blocks); then one token past a boundary: b2 (17 tokens, 5 blocks) and b3 (20, 5 blocks)
    fill it again, and b4 (4 tokens, 1 block) must wait for the next batch. One-token replies never need a new block."""
    return [
        Request(f"b{i}", [257] + [(5 * i + j) % 256 for j in range(n - 1)], 1, ignore_eos=True)
        for i, n in enumerate([16, 24, 17, 20, 4])
    ]


def check_block_boundaries(scheduler_cls) -> None:
    requests = boundary_crowd()
    label = "prompts that end exactly on a block boundary (16 and 24 tokens in blocks of 4), then one token past one"
    with case(label):
        referee = Referee(Guarded(scheduler_cls()), judge_static)
        engine = serve(small_model("gqa"), referee, requests, slots=4, kv="paged", block_size=4, num_blocks=10)
        assert_served_everyone(engine, requests)


def served_by_countdown(scheduler_cls, requests: list[Request], label: str, slots: int) -> None:
    """Every request finished with its countdown reply (cut by its cap), every decision right, all blocks free."""
    with case(label):
        referee = Referee(Guarded(scheduler_cls()), judge_static)
        engine = serve(countdown_model(), referee, requests, max_steps=100, slots=slots, kv="paged", block_size=4)
        stuck = [r.id for r in requests if not r.is_finished]
        assert not stuck, (
            f"after {engine.step_no} steps these requests never finished: {stuck} (still waiting: "
            f"{[r.id for r in engine.waiting]})"
        )
        for r in requests:
            expected = list(range(r.prompt_ids[-1] - 1, -1, -1))[: r.max_new_tokens]
            assert r.output_ids == expected, f"{r.id}: expected the reply {expected}, got {r.output_ids}"
        assert engine.cache.free_blocks == engine.cache.num_blocks, "KV blocks are still held after the run"


def check_eos_before_the_cap(scheduler_cls) -> list[Request]:
    """Three seats. c0 says 2 tokens and EOS under a cap of 9; c1 says EOS at once (an empty reply) under a cap of 12;
    c2 is cut by its cap of 5. The batch is over after step 4, long before the caps of 9 and 12 would end it: the next
    batch (c3, c4, c5) boards at step 5."""
    shape = [(2, 9), (0, 12), (7, 5), (3, 3), (1, 4), (4, 8)]  # (the prompt's last byte = its reply's length, cap)
    requests = [Request(f"c{i}", [257, 65, n], cap) for i, (n, cap) in enumerate(shape)]
    label = "batch members that end on EOS before their caps (c1 on its very first token)"
    served_by_countdown(scheduler_cls, requests, label, slots=3)
    return requests


def arrival_crowd() -> list[Request]:
    """(Three seats.) u10 and u2 arrive at step 0; nobody is waiting at steps 3 to 5; u1, u11 and u0 arrive at step 6,
    in that order: the queue's order, which is not the order of their ids (as text or as numbers)."""
    arrivals = [("u10", 0), ("u2", 0), ("u1", 6), ("u11", 6), ("u0", 6)]
    return [Request(rid, [257, 66, 3], 3, arrival_step=step) for rid, step in arrivals]


def check_arrival_order(scheduler_cls) -> None:
    requests = arrival_crowd()
    label = (
        "u10 and u2 arrive at step 0, u1, u11 and u0 at step 6 (same-step arrivals whose ids do not sort in submit "
        "order, and an empty queue between)"
    )
    served_by_countdown(scheduler_cls, requests, label, slots=3)


def check_drawn_crowds(scheduler_cls) -> None:
    """Your policy beside the reference on drawn crowds (tests/lessons/drawn/crowds.py); a crowd where the reference
    would have to preempt is drawn again (you may leave preemption out)."""
    reference = lambda: StaticScheduler(token_budget=None)  # noqa: E731
    against_reference("your policy", crowds(), compare(scheduler_cls, reference, judge_static, True), 40)


def check_all(scheduler_cls) -> None:
    check_cases(scheduler_cls)
    check_drawn_crowds(scheduler_cls)


def check_cases(scheduler_cls) -> None:
    check_crowd(scheduler_cls, "contiguous")
    check_crowd(scheduler_cls, "paged")
    check_memory(scheduler_cls)
    check_exact_fit(scheduler_cls)
    check_seed_story(scheduler_cls)
    check_block_boundaries(scheduler_cls)
    check_eos_before_the_cap(scheduler_cls)
    check_arrival_order(scheduler_cls)


@pytest.mark.parametrize("kv", ["contiguous", "paged"])
def test_a_crowd_is_served_exactly_and_nobody_joins_a_running_batch(scheduler_cls, kv):
    check_crowd(scheduler_cls, kv)


def test_when_memory_is_short_the_head_of_the_queue_boards_first(scheduler_cls):
    check_memory(scheduler_cls)


def test_a_prompt_that_fills_the_free_blocks_exactly_boards(scheduler_cls):
    check_exact_fit(scheduler_cls)


def test_the_seed_story_makes_everyone_wait_for_B(scheduler_cls):
    check_seed_story(scheduler_cls)


def test_prompts_on_a_block_boundary_fill_the_pool_exactly(scheduler_cls):
    check_block_boundaries(scheduler_cls)


def test_a_batch_whose_members_end_on_eos_before_their_caps_is_over(scheduler_cls):
    check_eos_before_the_cap(scheduler_cls)


def test_your_policy_decides_as_the_reference_on_drawn_crowds(scheduler_cls):
    check_drawn_crowds(scheduler_cls)


def test_same_step_arrivals_board_in_queue_order_and_an_empty_queue_is_fine(scheduler_cls):
    check_arrival_order(scheduler_cls)


# --- the checks catch plausible mistakes --------------------------------------------------------
class Static:
    """A static scheduler written out, with switches for the mistakes below."""

    name = "static-variant"
    holds_finished_seats = True

    def __init__(
        self, joins=False, batch_size=None, shortest_first=False, needs_empty_seats=False, kv="counted",
        empty_seats_only=False, over="finished", first_token_block=False, queue="as-given", pops=False, peeks=False,
        reserves_the_reply=False,
    ):  # fmt: skip
        self.joins, self.batch_size, self.shortest_first = joins, batch_size, shortest_first
        self.needs_empty_seats, self.kv, self.empty_seats_only = needs_empty_seats, kv, empty_seats_only
        self.over, self.first_token_block, self.queue = over, first_token_block, queue
        self.pops, self.peeks, self.reserves_the_reply = pops, peeks, reserves_the_reply
        self.steps_left = 0  # over="timer": steps the batch still runs, counted down from its longest cap

    def still_running(self, r: Request) -> bool:
        if self.over == "under-the-cap":  # a member that ended on EOS before its cap looks busy forever (wrong)
            return len(r.output_ids) < r.max_new_tokens
        return self.needs_empty_seats or not r.is_finished

    def cost(self, r: Request, kv: KVSpace) -> int:
        tokens = r.tokens_in_cache_after_prefill + self.first_token_block  # +1: "room for the reply's first" (wrong)
        if self.reserves_the_reply:  # room for the whole reply up front, so nobody runs out mid-batch (wrong)
            tokens = r.max_cached_tokens
        return kv.blocks_to_admit(tokens)

    def schedule(self, waiting: list[Request], seats: list[Request | None], kv: KVSpace) -> Plan:
        busy = [r for r in seats if r is not None and self.still_running(r)]
        if self.over == "timer" and self.steps_left > 0:  # as if every reply ran to its cap (wrong: EOS ends it)
            self.steps_left -= 1
            return Plan()
        if busy and not self.joins:
            return Plan()
        if self.peeks and self.cost(waiting[0], kv) > kv.free_blocks:  # the head, read before asking if there is one
            return Plan()
        queue = sorted(waiting, key=lambda r: r.max_new_tokens) if self.shortest_first else waiting
        if self.queue == "arrival-then-id":  # "oldest first, ties by id": the queue is in order already (wrong)
            queue = sorted(waiting, key=lambda r: (r.arrival_step, r.id))
        admit, free = [], kv.free_blocks
        seats_free = seats.count(None) if self.empty_seats_only else len(seats) - len(busy)  # held seats too
        for r in list(queue):
            if len(admit) == (self.batch_size or seats_free):
                break
            cost = self.cost(r, kv)
            if self.kv == "strict" and cost >= free:  # a prompt that fills the free blocks exactly waits (wrong)
                break
            if cost > free and self.kv != "ignored":
                if self.kv == "skips-the-head":
                    continue  # a smaller request behind it boards first (wrong)
                break
            admit.append(r)
            if self.pops:  # off the caller's list, as if the queue were the policy's own (wrong)
                waiting.remove(r)
            if self.kv != "never-subtracted":
                free -= cost
        if self.over == "timer" and admit:
            self.steps_left = max(r.max_new_tokens for r in admit) - 1
        return Plan(admit=admit)


WRONG = {
    "joins-a-running-batch": dict(joins=True),
    "one-at-a-time": dict(batch_size=1),
    "shortest-first": dict(shortest_first=True),
    "treats-finished-seats-as-busy": dict(needs_empty_seats=True),
    "ignores-kv-blocks": dict(kv="ignored"),
    "smaller-jumps-a-head-that-does-not-fit": dict(kv="skips-the-head"),
    "never-subtracts-earlier-admissions": dict(kv="never-subtracted"),
    "refuses-a-prompt-that-fits-exactly": dict(kv="strict"),
    "counts-only-empty-seats-so-held-ones-never-free-up": dict(empty_seats_only=True),
    # caught only by the edge cases and the arguments' check
    "counts-a-member-under-its-cap-as-running": dict(over="under-the-cap"),
    "waits-out-the-longest-cap": dict(over="timer"),
    "reserves-a-block-for-the-first-reply-token": dict(first_token_block=True),
    "sorts-same-step-arrivals-by-id": dict(queue="arrival-then-id"),
    "reads-the-head-of-an-empty-queue": dict(peeks=True),
    "pops-admitted-requests-off-the-queue": dict(pops=True),
    # right on every hand-built crowd (their replies stay in their prompts' blocks, or memory is plentiful)
    "reserves-blocks-for-the-whole-reply": dict(reserves_the_reply=True),
}
DRAWN_ONLY = ["reserves-blocks-for-the-whole-reply"]  # only the drawn crowds catch these
# the words that open each edge mistake's failure: the case, or the step where the arguments changed
NAMED_BY = {
    "counts-a-member-under-its-cap-as-running": "batch members that end on EOS before their caps",
    "waits-out-the-longest-cap": "batch members that end on EOS before their caps",
    "reserves-a-block-for-the-first-reply-token": "prompts that end exactly on a block boundary",
    "sorts-same-step-arrivals-by-id": "u10 and u2 arrive at step 0, u1, u11 and u0 at step 6",
    "reads-the-head-of-an-empty-queue": "u10 and u2 arrive at step 0, u1, u11 and u0 at step 6",
    "pops-admitted-requests-off-the-queue": "step 0: your schedule() changed the `waiting` list it was given",
}


class StaticBySums:
    """Right, written differently: the batch is the longest head of the queue whose blocks add up to what is free."""

    name, holds_finished_seats = "static-by-sums", True

    def schedule(self, waiting, seats, kv):
        if any(r is not None and not r.is_finished for r in seats):
            return Plan()
        batch = []
        for r in waiting[: len(seats)]:
            if sum(kv.blocks_to_admit(x.tokens_in_cache_after_prefill) for x in [*batch, r]) > kv.free_blocks:
                break
            batch.append(r)
        return Plan(admit=batch)


class StaticByRunningTotals:
    """Right, written differently: "the batch is over" is all() over the seats, and the batch is cut where the
    running total of the queue's blocks (itertools.accumulate) passes what is free."""

    name, holds_finished_seats = "static-running-totals", True

    def schedule(self, waiting, seats, kv):
        if not all(r is None or r.is_finished for r in seats):
            return Plan()
        totals = itertools.accumulate(kv.blocks_to_admit(r.tokens_in_cache_after_prefill) for r in waiting)
        fits = sum(1 for _ in itertools.takewhile(lambda total: total <= kv.free_blocks, totals))
        return Plan(admit=waiting[: min(fits, len(seats))])


class StaticRemembersItsBatch:
    """Right, written differently: it keeps the batch it formed and waits until every member has finished (state
    carried from one call to the next, kept right: it asks the requests, not a clock)."""

    name, holds_finished_seats = "static-remembers-its-batch", True

    def __init__(self):
        self.batch: list[Request] = []

    def schedule(self, waiting, seats, kv):
        if any(not r.is_finished for r in self.batch):
            return Plan()
        self.batch, free = [], kv.free_blocks
        for r in waiting:
            cost = kv.blocks_to_admit(r.tokens_in_cache_after_prefill)
            if len(self.batch) == len(seats) or cost > free:
                break
            self.batch.append(r)
            free -= cost
        return Plan(admit=list(self.batch))


CORRECT = {
    "written-out": Static,
    "by-sums": StaticBySums,
    "by-running-totals": StaticByRunningTotals,
    "remembers-its-batch": StaticRemembersItsBatch,
}


@CHECKS
@pytest.mark.parametrize("right", CORRECT.values(), ids=CORRECT.keys())
def test_a_correct_version_passes(right):
    check_all(right)


@CHECKS
def test_the_exact_crowd_fills_the_pool_exactly():
    referee = Referee(StaticScheduler(), judge_static)
    serve(small_model("gqa"), referee, exact_crowd(), slots=4, kv="paged", block_size=4, num_blocks=10)
    first, second = [d for d in referee.decisions if d.admit][:2]
    assert first.admit == ["e0", "e1"] and first.cost["e0"] + first.cost["e1"] == first.free_blocks == 10
    assert second.admit == ["e2"] and second.cost["e2"] == second.free_blocks == 10


@CHECKS
def test_the_memory_crowd_is_limited_by_memory():
    """The scenario does what its docstring says: seats are free while the head waits for blocks, and the
    reference never needs to preempt."""
    referee = Referee(StaticScheduler(), judge_static)
    engine = serve(small_model("gqa"), referee, memory_crowd(), slots=4, kv="paged", block_size=4, num_blocks=12)
    first = referee.decisions[0]
    assert first.admit == ["q0", "q1"]
    left = first.free_blocks - first.cost["q0"] - first.cost["q1"]
    assert first.cost["q2"] > left >= first.cost["q3"], "q2 must not fit after q0 and q1, and q3 must"
    assert not any(d.preempt for d in referee.decisions)
    assert all(r.preemptions == 0 for r in engine.requests)


@CHECKS
@pytest.mark.parametrize("mistake", WRONG.values(), ids=WRONG.keys())
def test_the_checks_catch_a_wrong_static_policy(mistake):
    with pytest.raises(AssertionError):
        check_all(lambda: Static(**mistake))


@CHECKS
@pytest.mark.parametrize("name", NAMED_BY)
def test_an_edge_mistake_is_named_by_its_case(name):
    with pytest.raises(AssertionError) as failure:
        check_all(lambda: Static(**WRONG[name]))
    assert str(failure.value).startswith(NAMED_BY[name]), str(failure.value)


@CHECKS
def test_the_edge_crowds_are_what_their_names_say():
    """On the reference: the boundary prompts fill the pool exactly, then one token past a boundary costs a block
    more; the EOS crowd's first batch ends by EOS before its caps, one member on its first token, and the next batch
    boards at step 5; the arrival crowd has steps with nobody waiting."""
    referee = Referee(StaticScheduler(), judge_static)
    serve(small_model("gqa"), referee, boundary_crowd(), slots=4, kv="paged", block_size=4, num_blocks=10)
    first, second, third = [d for d in referee.decisions if d.admit][:3]
    assert first.admit == ["b0", "b1"] and first.cost == {"b0": 4, "b1": 6, "b2": 5, "b3": 5, "b4": 1}
    assert second.admit == ["b2", "b3"] and third.admit == ["b4"]
    requests = check_eos_before_the_cap(StaticScheduler)
    assert [r.finish_reason for r in requests[:3]] == ["eos", "eos", "length"] and requests[1].output_ids == []
    assert requests[3].admit_step == 5
    referee = Referee(StaticScheduler(), judge_static)
    serve(countdown_model(), referee, arrival_crowd(), slots=3)
    assert [d.waiting for d in referee.decisions[3:6]] == [[], [], []]
    assert referee.decisions[6].admit == ["u1", "u11", "u0"]


@CHECKS
@pytest.mark.parametrize("name", DRAWN_ONLY)
def test_the_drawn_crowds_catch_what_the_cases_miss(name):
    check_cases(lambda: Static(**WRONG[name]))  # every hand-built crowd passes it
    with pytest.raises(AssertionError, match="but r[0-9]+ was next in the queue and fits"):
        check_drawn_crowds(lambda: Static(**WRONG[name]))


@CHECKS
def test_the_stub_is_rejected():
    class Stub:
        name, holds_finished_seats = "stub", True

        def schedule(self, waiting, seats, kv):
            raise NotImplementedError

    with pytest.raises(NotImplementedError):
        check_all(Stub)
