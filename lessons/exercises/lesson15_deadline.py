"""Lesson 15 exercise: earliest deadline first, with aging. Check your work: pytest -m lesson15"""

from __future__ import annotations

from minillm.engine.request import Request
from minillm.engine.scheduler import DEFAULT_TOKEN_BUDGET
from minillm.layers.policies import AGING_S, RankedPolicy  # the seating machinery; the order is yours to write


class MyDeadlinePolicy(RankedPolicy):
    """Earliest deadline first: the queue in order of when each request is due, and the one due last makes way.

    RankedPolicy (minillm/layers/policies.py) seats the crowd each step with your two methods:
      - the queue sorted by rank(r), lower first (a stable sort: equal ranks keep the queue's order);
      - the running requests in last_kept(r) order: when the KV cache cannot hold their next tokens, the last in
        that order is preempted first (then the next, until the rest fit);
      - a waiting request with no free seat (or blocks) takes the place of the last, in last_kept order, of the
        running requests whose rank is greater than its own; then the queue is admitted in rank order while seats,
        blocks and the token budget last.

    When r is due, in seconds on the engine's clock (the one self.clock.now() reads; arrival is self.arrived_s(r),
    its service self.service(r), with .ttft_s and .deadline_s, each seconds or None: no such target):
      - it has a TTFT target and no first token yet (r.first_token_step is None):  arrival + ttft_s
      - it has a deadline and (a first token, or no TTFT target):                  arrival + deadline_s
      - it has a TTFT target, a first token and no deadline:   arrival + ttft_s still (a chat user already reading:
        due long ago, it keeps its seat)
      - it has no target at all:   arrival + self.aging_s (aging: once the clock passes that, every newcomer is due
        later than it, so nobody waits forever)
    A first token stays counted when a request is preempted. tpot_s and the priority play no part here.

    1. rank(r): a tuple, lower goes first, that orders requests by when they are due, earliest first. Requests due
       at the same moment must rank equal, waiting or running: the queue then keeps its order among them (first come,
       first served; a preempted request is back at the head of the queue), and a waiting request never takes the
       seat of a running one due when it is. Add nothing after the due time that tells them apart (not the id, not
       the arrival, not the admit_order).
    2. last_kept(r): a tuple ordering the running requests by when they are due, so that the one due latest comes
       last (it makes way first, then the next latest); among those due at the same moment, the newest (largest
       r.admit_order) comes last.
    Free: the tuples' length; seconds as they are, or counted from now (the slack, due - self.clock.now(): the same
    order, since now is the same for everyone); helper methods of your own. Leave __init__ and schedule as they are.
    """

    name, default_victim = "my-deadline", "latest-due"

    def __init__(self, token_budget: int | None = DEFAULT_TOKEN_BUDGET, aging_s: float = AGING_S):
        super().__init__(token_budget)
        self.aging_s = aging_s

    def rank(self, r: Request) -> tuple:
        raise NotImplementedError("lesson 15: rank the queue by when each request is due")

    def last_kept(self, r: Request) -> tuple:
        raise NotImplementedError("lesson 15: order the running so that the one due latest makes way first")

    def describe(self, r: Request) -> str:  # (the trace's reason for a displacement says this of the newcomer)
        rank = self.rank(r)
        return f"ranked {rank[0] if isinstance(rank, tuple) else rank:.2f}"
