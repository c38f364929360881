"""Lesson 08 exercise: the step planner under a token budget. Check your work: pytest -m lesson08"""

from __future__ import annotations

from minillm.engine.request import Request
from minillm.engine.scheduler import KVSpace, Plan  # only these two: the plan is yours to write


def plan_step(
    running: list[Request], waiting: list[Request], free_seats: int, budget: int | None
) -> tuple[list[Request], dict[str, int]]:
    """Who runs how many tokens this step. Returns (admitted, tokens):
      admitted: requests from `waiting` that take a free seat this step, in queue order;
      tokens:   {request id: tokens it runs this step} for the running and the admitted requests
                (a request that runs nothing may be left out, or given 0).

    running:    the seated requests, in seat order (not age order). r.admit_order: smaller = admitted earlier.
                r.is_decoding: its prompt is in the KV cache, it runs the 1 token it produced last step.
                Otherwise it is still prefilling: r.num_pending tokens are not in the cache yet (of its prompt,
                and of its old reply if it came back from a preemption): a prefilling row may have output, or
                only one token left; only r.is_decoding makes it a decode row.
    waiting:    the queue, the head first. A newcomer runs r.num_pending tokens in all (its prompt, plus any
                reply it had produced before it was preempted: all of it is recomputed).
    free_seats: how many newcomers may board this step.
    budget:     the most tokens the whole step may run, every row together: an int >= 1, or None (no limit: the
                same rules, every row runs all it has; newcomers still board only into free seats).

    The rules, in this order, while the budget lasts:
    1. Decode rows first, oldest admission first: each runs exactly 1 token.
    2. Then the running requests still prefilling, oldest admission first: each runs as many of its
       pending tokens as the budget has left (all of them, or a chunk; the rest waits for later steps).
    3. Then newcomers from the head of the queue, in order, while a seat is free and budget is left: each
       boards and runs as many of its pending tokens as fit (a first chunk). Nobody jumps the queue: a
       newcomer whose prompt is longer than what is left boards with a chunk; nobody behind it goes first.
    (Memory is plentiful in this lesson's runs: nobody is preempted, every prompt fits in the KV cache.)
    Read the lists and the requests; change none of them (the engine moves requests and keeps their books).
    """
    raise NotImplementedError("lesson 08: share the step's token budget: decode rows, then prompts, then newcomers")


class MyChunkedScheduler:
    """Given (nothing to write here): continuous batching that asks your plan_step every step."""

    name = "my-chunked"
    holds_finished_seats = False

    def __init__(self, token_budget: int | None = 256):
        self.token_budget = token_budget or None  # 0 or None: no budget

    def schedule(self, waiting: list[Request], seats: list[Request | None], kv: KVSpace) -> Plan:
        running = [r for r in seats if r is not None]
        admitted, tokens = plan_step(running, list(waiting), seats.count(None), self.token_budget)
        return Plan(admit=admitted, tokens=tokens)
