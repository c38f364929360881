"""Scheduling policies: who gets a seat this step, who gives theirs up, how many tokens each runs.

A scheduler only decides; the engine does. Each step the engine asks
    plan = scheduler.schedule(waiting, seats, kv)
with the arrived requests in queue order, the seats (a running request, a finished one holding
its seat, or None), and the KV cache to ask about memory. The plan names requests to admit (in
order, into free seats), running requests to preempt, and the tokens each seated request runs.

A seated request has tokens whose keys and values are not in the cache yet (`r.num_pending`):
its whole prompt when it is admitted, one token while it decodes. With no token budget every
request runs all of them, so a newcomer's whole prompt rides in the step it is admitted, and
every running user waits for it. A *token budget* caps the tokens of one step (vLLM's
max_num_batched_tokens; Sarathi-Serve's chunked prefill): decode rows go first, then prompts in
queue order, and a prompt longer than what is left is cut into chunks over several steps. A
request's first token comes in the step its prompt's last chunk runs.

Both policies below run on the same engine, model and KV cache; only this file differs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

from minillm.engine.request import Request
from minillm.errors import ConfigError

# Tokens per step. At least the most seats the app offers (256, vLLM's max_num_seqs), so decode
# rows never wait for the budget; small enough that one long prompt costs a step a few decode
# steps' time on a CPU, not a hundred (lesson 08 measures the trade-off: TTFT against TPOT).
DEFAULT_TOKEN_BUDGET = 256


class KVSpace(Protocol):
    """What a policy may ask the KV cache, in blocks."""

    @property
    def free_blocks(self) -> int: ...

    def blocks_to_admit(self, num_tokens: int, token_ids=None, leaving=()) -> int: ...

    def blocks_to_grow(self, seat: int, num_new: int = 1) -> int: ...

    def blocks_held(self, seat: int) -> int: ...

    def cached_prefix(self, token_ids: list[int]) -> int: ...


@dataclass
class Plan:
    admit: list[Request] = field(default_factory=list)  # into free seats, in this order
    preempt: list[Request] = field(default_factory=list)  # running ones sent back to the queue
    tokens: dict[str, int] | None = None  # id -> tokens it runs this step; None: all pending


class PlanError(RuntimeError):
    """A plan the engine cannot carry out: a bug in the policy, caught before it does harm."""


class Scheduler(Protocol):
    name: str
    holds_finished_seats: bool  # True: a finished request keeps its seat (idle) until replaced

    def schedule(self, waiting: list[Request], seats: list, kv: KVSpace) -> Plan: ...


def check_plan(plan: Plan, waiting, seats: list[Request | None], holds_finished_seats: bool):
    """The engine carries out only a plan that makes sense: admit the waiting, preempt the
    running, fill free seats."""
    if not plan.admit and not plan.preempt:  # (most steps: nothing to check)
        return
    waiting_ids = {r.id for r in waiting}
    running = [r for r in seats if r is not None and not r.is_finished]
    if any(r.id not in waiting_ids for r in plan.admit):
        raise PlanError("the scheduler admitted a request that is not waiting")
    if len({r.id for r in plan.admit}) < len(plan.admit):
        raise PlanError("the scheduler admitted the same request twice")
    if any(r not in running for r in plan.preempt):
        raise PlanError("the scheduler preempted a request that is not running")
    free = sum(s is None or (s.is_finished and holds_finished_seats) for s in seats)
    if len(plan.admit) > free + len(plan.preempt):
        raise PlanError(f"the scheduler admitted {len(plan.admit)} requests into {free} free seats")


def check_plan_tokens(tokens: dict[str, int], running: list[Request]) -> None:  # 0..pending
    pending = {r.id: r.num_pending for r in running}
    for rid, n in tokens.items():
        if rid not in pending:
            raise PlanError(f"the plan gives tokens to {rid!r}, which is not running")
        if not isinstance(n, int) or not 0 <= n <= pending[rid]:
            raise PlanError(f"the plan gives {rid!r} {n!r} tokens; it has {pending[rid]} to run")


def check_budget(token_budget: int | None) -> int | None:  # None (0 too: no budget) or n > 0
    if token_budget is None or token_budget == 0:
        return None
    if not isinstance(token_budget, int) or token_budget < 0:
        what = "a whole number of tokens >= 0 (0: no budget)"
        raise ConfigError(f"token_budget must be {what}, got {token_budget!r}")
    return token_budget


def share_budget(demands: list[tuple[Request, int]], budget: int | None) -> dict[str, int]:
    """Each request gets the tokens it asks for, in order, while the budget lasts (None: none)."""
    left, tokens = math.inf if budget is None else budget, {}
    for request, wanted in demands:
        tokens[request.id] = int(min(wanted, left))
        left -= tokens[request.id]
    return tokens


def decode_first(running: list[Request]) -> list[Request]:
    """Decode rows first (oldest admission first), then prompts being prefilled (oldest first)."""
    by_age = sorted(running, key=lambda r: r.admit_order)
    return [r for r in by_age if r.is_decoding] + [r for r in by_age if not r.is_decoding]


def keep_running(running, kv: KVSpace, budget: int | None, last_kept=lambda r: r.admit_order):
    """Plan this step's tokens for the running requests; preempt the last in `last_kept` order (the
    newest) until the KV blocks their new tokens need are free. Returns (victims, tokens, free)."""
    keep = sorted(running, key=last_kept)  # (the oldest first)
    victims: list[Request] = []
    free = kv.free_blocks
    while True:
        tokens = share_budget([(r, r.num_pending) for r in decode_first(keep)], budget)
        needed = sum(kv.blocks_to_grow(r.seat, tokens[r.id]) for r in keep if tokens[r.id])
        if needed <= free or not keep:
            return victims, tokens, free - needed
        victim = keep.pop()  # the newest loses its seat: it has the least work to redo
        victims.append(victim)
        free += kv.blocks_held(victim.seat)


def computed_before(request: Request, kv: KVSpace) -> int:
    """A newcomer's tokens it need not run: those in the prefix cache, or whose KV it brought."""
    return max(kv.cached_prefix(request.tokens), request.num_computed)


def admit_in_order(waiting, free_seats: int, free_blocks: int, budget_left, kv, victims=()):
    """First come, first served: admit from the head of the queue while seats, blocks and budget
    last. A newcomer must fit its whole prompt in the free blocks (less what the prefix cache
    holds), even if it runs only a first chunk now. Returns (admitted, tokens each runs now)."""
    admitted, tokens, leaving = [], {}, [v.seat for v in victims]
    for request in waiting:
        if len(admitted) == free_seats or budget_left <= 0:
            break
        cost = kv.blocks_to_admit(request.num_tokens, request.tokens, leaving)
        if cost > free_blocks:
            break  # nobody jumps the queue: a later, smaller request waits behind the head
        admitted.append(request)
        todo = request.num_tokens - computed_before(request, kv)
        tokens[request.id] = int(min(todo, budget_left))
        free_blocks -= cost
        budget_left -= tokens[request.id]
    return admitted, tokens


class StaticScheduler:
    """A batch runs until its longest member finishes; only then is the next batch formed."""

    name = "static"
    holds_finished_seats = True

    def __init__(self, token_budget: int | None = DEFAULT_TOKEN_BUDGET):
        self.token_budget = check_budget(token_budget)

    def schedule(self, waiting: list[Request], seats: list[Request | None], kv: KVSpace) -> Plan:
        running = [r for r in seats if r is not None and not r.is_finished]
        if running:  # the batch is still going: nobody joins, finished members keep their seats
            victims, tokens, _ = keep_running(running, kv, self.token_budget)
            return Plan(preempt=victims, tokens=tokens)
        batch, _ = admit_in_order(waiting, len(seats), kv.free_blocks, math.inf, kv)  # all at once
        demands = [(r, r.num_tokens - computed_before(r, kv)) for r in batch]
        return Plan(admit=batch, tokens=share_budget(demands, self.token_budget))  # one budget


class ContinuousScheduler:
    """Iteration-level: every step, finished requests have left and the queue fills free seats."""

    name = "continuous"
    holds_finished_seats = False

    def __init__(self, token_budget: int | None = DEFAULT_TOKEN_BUDGET):
        self.token_budget = check_budget(token_budget)

    def schedule(self, waiting: list[Request], seats: list[Request | None], kv: KVSpace) -> Plan:
        running = [r for r in seats if r is not None and not r.is_finished]
        victims, tokens, free_blocks = keep_running(running, kv, self.token_budget)
        budget_left = math.inf if self.token_budget is None else self.token_budget
        budget_left -= sum(tokens.values())
        free_seats = seats.count(None) + len(victims)
        admitted, first = admit_in_order(waiting, free_seats, free_blocks, budget_left, kv, victims)
        return Plan(admit=admitted, preempt=victims, tokens=tokens | first)


SCHEDULERS = {"static": StaticScheduler, "continuous": ContinuousScheduler}
