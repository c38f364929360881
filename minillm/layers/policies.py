"""Who goes first: the priority and deadline policies, and the rule that picks whom to preempt.

Seam: policy. Each is the continuous policy (engine/scheduler.py) with the queue in another order and another
victim, on the same engine, model and KV cache. A request's priority and targets are its Service (service.py),
which the LayeredEngine hands the policy (`attach`).

  priority   the queue by priority (lower first, vLLM's rule), ties first come first served. A waiting request
             takes the seat and blocks of a running one of lower priority when there are none free.
  deadline   earliest deadline first. A request is due at arrival + its TTFT target until its first token comes,
             then at arrival + its deadline (a chat user already reading keeps its seat: due long ago). One with
             no target is due `aging_s` after it arrives: as the clock passes that, every newcomer is due later,
             so nobody waits forever (aging). A waiting request displaces a running one due later than itself.

Whom to preempt (`victim`), when the KV cache runs short or a newcomer displaces someone:
  newest           the last admitted: it has the least work to redo (the core's rule, and vLLM's FCFS one)
  least-computed   the fewest tokens in the cache: the least to recompute
  lowest-priority  the highest priority number, then the newest (vLLM's priority preemption)
  latest-due       the one due last (the deadline policy's own)
The plan says why each victim went (`ReasonedPlan.why`), and the trace keeps it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from minillm.engine.request import Request
from minillm.engine.scheduler import (
    DEFAULT_TOKEN_BUDGET,
    SCHEDULERS,
    KVSpace,
    Plan,
    admit_in_order,
    check_budget,
    computed_before,
    keep_running,
)
from minillm.errors import ConfigError
from minillm.layers.service import DEFAULT, Service
from minillm.layers.trace import KV_FULL

VICTIMS = ("newest", "least-computed", "lowest-priority", "latest-due")
AGING_S = 30.0  # a request with no target is due this long after it arrives


@dataclass
class ReasonedPlan(Plan):
    why: dict[str, str] = field(default_factory=dict)  # victim id -> why it was chosen


class RankedPolicy:
    """Continuous batching with the queue ordered by `rank` (lower first) and victims picked by `victim`."""

    name, default_victim = "ranked", "newest"
    holds_finished_seats = False

    def __init__(self, token_budget: int | None = DEFAULT_TOKEN_BUDGET, victim: str | None = None):
        self.token_budget = check_budget(token_budget)
        self.victim = victim or self.default_victim
        if self.victim not in VICTIMS:
            raise ConfigError(f"unknown victim rule {self.victim!r}; choose one of {', '.join(VICTIMS)}")
        self.services: dict[str, Service] = {}
        self.clock = None
        self.seen_s: dict[str, float] = {}  # request id -> its arrival, in seconds on the engine's clock

    def attach(self, engine) -> None:
        """The engine's service book and clock: what the ranks are computed from."""
        self.services, self.clock = engine.services, engine.clock

    def service(self, r: Request) -> Service:
        return self.services.get(r.id, DEFAULT)

    def arrived_s(self, r: Request) -> float:  # (arrivals by step: the clock when the policy first saw it)
        if r.arrival_s is not None:
            return r.arrival_s
        return self.seen_s.setdefault(r.id, self.clock.now() if self.clock else 0.0)

    def rank(self, r: Request) -> tuple:
        raise NotImplementedError

    def last_kept(self, r: Request) -> tuple:
        """Sort key of the running: the last is preempted first."""
        if self.victim == "least-computed":
            return (-r.num_computed, r.admit_order)
        if self.victim == "lowest-priority":
            return (self.service(r).priority, r.admit_order)
        if self.victim == "latest-due":
            return (due(self, r), r.admit_order)
        return (r.admit_order,)

    def schedule(self, waiting: list[Request], seats: list[Request | None], kv: KVSpace) -> ReasonedPlan:
        running = [r for r in seats if r is not None and not r.is_finished]
        queue = sorted(waiting, key=self.rank)  # (stable: ties keep the queue's order)
        victims, tokens, free_blocks = keep_running(running, kv, self.token_budget, self.last_kept)
        why = {v.id: KV_FULL.replace("newest", self.victim) for v in victims}
        kept = sorted((r for r in running if r not in victims), key=self.last_kept)
        free_seats = seats.count(None) + len(victims)
        budget_left = math.inf if self.token_budget is None else self.token_budget - sum(tokens.values())
        for head in queue:  # a newcomer that outranks someone seated takes their place when nothing is free
            if budget_left <= 0:
                break
            cost = kv.blocks_to_admit(head.num_tokens, head.tokens, [v.seat for v in victims])
            took = []
            while not free_seats or cost > free_blocks:
                outranked = [r for r in kept if self.rank(r) > self.rank(head)]
                if not outranked:
                    break
                took.append(victim := outranked[-1])
                kept.remove(victim)
                free_seats, free_blocks = free_seats + 1, free_blocks + kv.blocks_held(victim.seat)
                free_blocks += kv.blocks_to_grow(victim.seat, tokens.pop(victim.id, 0))
            if not free_seats or cost > free_blocks:
                kept = sorted(kept + took, key=self.last_kept)  # it cannot sit even so: nobody makes way for it
                break
            victims += took
            why |= {v.id: f"{head.id} outranks it ({self.describe(head)}): {self.victim}" for v in took}
            free_seats, free_blocks = free_seats - 1, free_blocks - cost
            budget_left -= min(head.num_tokens - computed_before(head, kv), budget_left)
        budget_left = math.inf if self.token_budget is None else self.token_budget - sum(tokens.values())
        free_seats = seats.count(None) + len(victims)
        free_blocks = kv.free_blocks + sum(kv.blocks_held(v.seat) for v in victims)
        free_blocks -= sum(kv.blocks_to_grow(r.seat, tokens[r.id]) for r in kept if tokens.get(r.id))
        admitted, first = admit_in_order(queue, free_seats, free_blocks, budget_left, kv, victims)
        return ReasonedPlan(admit=admitted, preempt=victims, tokens=tokens | first, why=why)

    def describe(self, r: Request) -> str:
        return ""


class PriorityPolicy(RankedPolicy):
    name, default_victim = "priority", "lowest-priority"

    def rank(self, r: Request) -> tuple:
        return (self.service(r).priority,)

    def describe(self, r: Request) -> str:
        return f"priority {self.service(r).priority}"


class DeadlinePolicy(RankedPolicy):
    name, default_victim = "deadline", "latest-due"

    def __init__(self, token_budget: int | None = DEFAULT_TOKEN_BUDGET, victim: str | None = None,
                 aging_s: float = AGING_S):  # fmt: skip
        super().__init__(token_budget, victim)
        if not 0 < aging_s < math.inf:
            raise ConfigError(f"aging_s must be a positive number of seconds, got {aging_s!r}")
        self.aging_s = aging_s

    def rank(self, r: Request) -> tuple:
        return (due(self, r),)

    def describe(self, r: Request) -> str:
        return f"due at {due(self, r):.2f} s"


def due(policy: RankedPolicy, r: Request) -> float:
    """When the request is due, in seconds on the engine's clock (see the top of this file)."""
    service, arrived = policy.service(r), policy.arrived_s(r)
    if service.ttft_s is not None and (r.first_token_step is None or service.deadline_s is None):
        return arrived + service.ttft_s
    if service.deadline_s is not None:
        return arrived + service.deadline_s
    return arrived + getattr(policy, "aging_s", AGING_S)


POLICIES = {**SCHEDULERS, "priority": PriorityPolicy, "deadline": DeadlinePolicy}


def make_policy(name: str, token_budget: int | None = DEFAULT_TOKEN_BUDGET, victim: str | None = None):
    """A policy by name; `victim` names the preemption rule (priority and deadline only: the core's two preempt
    the newest)."""
    if name not in POLICIES:
        raise ConfigError(f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}")
    if name in SCHEDULERS:
        if victim not in (None, "newest"):
            rule = "a victim rule goes with the priority or deadline policy"
            raise ConfigError(f"the {name} policy preempts the newest; {rule}")
        return SCHEDULERS[name](token_budget=token_budget)
    return POLICIES[name](token_budget=token_budget, victim=victim)
