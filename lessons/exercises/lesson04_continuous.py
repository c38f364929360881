"""Lesson 04 exercise: the continuous (iteration-level) batching policy. Check your work: pytest -m lesson04"""

from __future__ import annotations

from minillm.engine.request import Request
from minillm.engine.scheduler import KVSpace, Plan  # only these two: the policy is yours to write


class MyContinuousScheduler:
    """Continuous batching: every step, free seats go to the head of the queue.

    The engine calls schedule() once per step (see lesson03_static.py for the arguments).
    Finished requests have already left their seats (seats[i] is None).

    Rules:
    1. Room to grow: every running request (r.seat is its seat) will add one token this step,
       which may need a new block: kv.blocks_to_grow(r.seat). While the total exceeds the free
       blocks, preempt the most recently admitted running request (largest r.admit_order): it frees
       kv.blocks_held(r.seat) blocks and no longer needs to grow. One step may need several victims.
    2. Admit: first come, first served, from the head of the queue, while there is a free seat
       (a None seat, or one you just preempted) and the request's prompt fits in the blocks
       left after step 1: kv.blocks_to_admit(r.tokens_in_cache_after_prefill). Stop at the
       first request that does not fit: nobody jumps the queue.
    Return Plan(admit=[...], preempt=[...]): the admissions in queue order, the victims in any order.
    """

    name = "my-continuous"
    holds_finished_seats = False

    def schedule(self, waiting: list[Request], seats: list[Request | None], kv: KVSpace) -> Plan:
        raise NotImplementedError("lesson 04: fill every free seat from the head of the queue, every step")
