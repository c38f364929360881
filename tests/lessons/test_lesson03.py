"""Lesson 03: the static batching policy. Run: pytest -m lesson03

Your scheduler runs inside the real engine. A referee looks at every decision it makes:
while any member of the batch still runs, nobody joins; once all have finished, the next batch
is the head of the queue, in order, as many as fit.
"""

from __future__ import annotations

import pytest

from minillm.request import Request
from minillm.scheduler import KVSpace, Plan, StaticScheduler
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

pytestmark = pytest.mark.lesson03


@pytest.fixture(params=IMPLS)
def scheduler_cls(request):
    if request.param == "reference":
        return StaticScheduler
    return student_module("lesson03_static").MyStaticScheduler


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


def check_seed_story(scheduler_cls) -> None:
    story = run_seed_story(scheduler_cls(), judge_static)
    first = "the first batch: four users, four free seats"
    late = "B, the longest of the first batch, finished at step 498; only then may the next batch start"
    expected = dict(A=0, B=0, C=0, D=0, E=499, F=499, G=499, H=499)
    assert_admitted_at(story, expected, {rid: first if step == 0 else late for rid, step in expected.items()})


def check_all(scheduler_cls) -> None:
    check_crowd(scheduler_cls, "contiguous")
    check_crowd(scheduler_cls, "paged")
    check_seed_story(scheduler_cls)


@pytest.mark.parametrize("kv", ["contiguous", "paged"])
def test_a_crowd_is_served_exactly_and_nobody_joins_a_running_batch(scheduler_cls, kv):
    check_crowd(scheduler_cls, kv)


def test_the_seed_story_makes_everyone_wait_for_B(scheduler_cls):
    check_seed_story(scheduler_cls)


# --- the checks catch plausible mistakes --------------------------------------------------------
class Static:
    """A static scheduler written out, with switches for the mistakes below."""

    name = "static-variant"
    holds_finished_seats = True

    def __init__(self, joins_running_batch=False, batch_size=None, shortest_first=False, needs_empty_seats=False):
        self.joins, self.batch_size = joins_running_batch, batch_size
        self.shortest_first, self.needs_empty_seats = shortest_first, needs_empty_seats

    def schedule(self, waiting: list[Request], seats: list[Request | None], kv: KVSpace) -> Plan:
        busy = [r for r in seats if r is not None and (self.needs_empty_seats or not r.is_finished)]
        if busy and not self.joins:
            return Plan()
        queue = sorted(waiting, key=lambda r: r.max_new_tokens) if self.shortest_first else waiting
        admit, free = [], kv.free_blocks
        for r in queue[: self.batch_size or len(seats) - len(busy)]:
            if kv.blocks_to_admit(r.tokens_in_cache_after_prefill) > free:
                break
            admit.append(r)
            free -= kv.blocks_to_admit(r.tokens_in_cache_after_prefill)
        return Plan(admit=admit)


WRONG = {
    "joins-a-running-batch": dict(joins_running_batch=True),
    "one-at-a-time": dict(batch_size=1),
    "shortest-first": dict(shortest_first=True),
    "treats-finished-seats-as-busy": dict(needs_empty_seats=True),
}


def test_a_correct_version_passes():
    check_all(Static)


@pytest.mark.parametrize("mistake", WRONG.values(), ids=WRONG.keys())
def test_the_checks_catch_a_wrong_static_policy(mistake):
    with pytest.raises(AssertionError):
        check_all(lambda: Static(**mistake))


def test_the_stub_is_rejected():
    class Stub:
        name, holds_finished_seats = "stub", True

        def schedule(self, waiting, seats, kv):
            raise NotImplementedError

    with pytest.raises(NotImplementedError):
        check_all(Stub)
