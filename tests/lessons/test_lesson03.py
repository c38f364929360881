"""Lesson 03: the static batching policy. Run: pytest -m lesson03

Your scheduler runs inside the real engine. A referee looks at every decision it makes:
while any member of the batch still runs, nobody joins; once all have finished, the next batch
is the head of the queue, in order, as many as fit.

WRONG (below) lists the mistakes a room makes, each caught (a prompt that fills the free blocks exactly
included); StaticBySums, a policy written differently that must pass.
"""

from __future__ import annotations

import pytest

from minillm.engine.request import Request
from minillm.engine.scheduler import KVSpace, Plan, StaticScheduler
from minillm.runs.workload import SEED_STORY, SEED_STORY_SLOTS
from tests.lessons.harness import (
    CHECKS,
    Decision,
    Referee,
    assert_admitted_at,
    assert_admitted_the_head_of_the_queue,
    assert_served_everyone,
    assert_writes_its_own_policy,
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
    engine = serve(small_model("gqa"), Referee(scheduler_cls(), judge_static), requests, slots=3, kv=kv, block_size=4)
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
    referee = Referee(scheduler_cls(), judge_static)
    engine = serve(small_model("gqa"), referee, requests, slots=4, kv="paged", block_size=4, num_blocks=12)
    assert_served_everyone(engine, requests)


def check_exact_fit(scheduler_cls) -> None:
    """A prompt that needs exactly the blocks still free fits: it boards."""
    requests = exact_crowd()
    referee = Referee(scheduler_cls(), judge_static)
    engine = serve(small_model("gqa"), referee, requests, slots=4, kv="paged", block_size=4, num_blocks=10)
    assert_served_everyone(engine, requests)


def check_seed_story(scheduler_cls) -> None:
    story = run_seed_story(scheduler_cls(), judge_static)
    batch = SEED_STORY[:SEED_STORY_SLOTS]  # the story's first users fill the seats; the rest board together
    longest, steps = max(((rid, n) for rid, _, n in batch), key=lambda x: x[1])
    first = f"the first batch: {len(batch)} users, {SEED_STORY_SLOTS} free seats"
    late = (
        f"{longest}, the longest of the first batch, finished at step {steps - 1}; only then may the next batch start"
    )
    expected = {rid: 0 if i < SEED_STORY_SLOTS else steps for i, (rid, _, _) in enumerate(SEED_STORY)}
    assert_admitted_at(story, expected, {rid: first if step == 0 else late for rid, step in expected.items()})


def check_all(scheduler_cls) -> None:
    check_crowd(scheduler_cls, "contiguous")
    check_crowd(scheduler_cls, "paged")
    check_memory(scheduler_cls)
    check_exact_fit(scheduler_cls)
    check_seed_story(scheduler_cls)


@pytest.mark.parametrize("kv", ["contiguous", "paged"])
def test_a_crowd_is_served_exactly_and_nobody_joins_a_running_batch(scheduler_cls, kv):
    check_crowd(scheduler_cls, kv)


def test_when_memory_is_short_the_head_of_the_queue_boards_first(scheduler_cls):
    check_memory(scheduler_cls)


def test_a_prompt_that_fills_the_free_blocks_exactly_boards(scheduler_cls):
    check_exact_fit(scheduler_cls)


def test_the_seed_story_makes_everyone_wait_for_B(scheduler_cls):
    check_seed_story(scheduler_cls)


# --- the checks catch plausible mistakes --------------------------------------------------------
class Static:
    """A static scheduler written out, with switches for the mistakes below."""

    name = "static-variant"
    holds_finished_seats = True

    def __init__(
        self, joins=False, batch_size=None, shortest_first=False, needs_empty_seats=False, kv="counted",
        empty_seats_only=False,
    ):  # fmt: skip
        self.joins, self.batch_size, self.shortest_first = joins, batch_size, shortest_first
        self.needs_empty_seats, self.kv, self.empty_seats_only = needs_empty_seats, kv, empty_seats_only

    def schedule(self, waiting: list[Request], seats: list[Request | None], kv: KVSpace) -> Plan:
        busy = [r for r in seats if r is not None and (self.needs_empty_seats or not r.is_finished)]
        if busy and not self.joins:
            return Plan()
        queue = sorted(waiting, key=lambda r: r.max_new_tokens) if self.shortest_first else waiting
        admit, free = [], kv.free_blocks
        seats_free = seats.count(None) if self.empty_seats_only else len(seats) - len(busy)  # held seats too
        for r in queue:
            if len(admit) == (self.batch_size or seats_free):
                break
            cost = kv.blocks_to_admit(r.tokens_in_cache_after_prefill)
            if self.kv == "strict" and cost >= free:  # a prompt that fills the free blocks exactly waits (wrong)
                break
            if cost > free and self.kv != "ignored":
                if self.kv == "skips-the-head":
                    continue  # a smaller request behind it boards first (wrong)
                break
            admit.append(r)
            if self.kv != "never-subtracted":
                free -= cost
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


@CHECKS
@pytest.mark.parametrize("right", [Static, StaticBySums], ids=["written-out", "by-sums"])
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
def test_the_stub_is_rejected():
    class Stub:
        name, holds_finished_seats = "stub", True

        def schedule(self, waiting, seats, kv):
            raise NotImplementedError

    with pytest.raises(NotImplementedError):
        check_all(Stub)
