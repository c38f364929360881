"""Scheduling policies: who gets a seat this step, and who must give theirs up.

A scheduler only decides; the engine does. Each step the engine asks
    plan = scheduler.schedule(waiting, seats, kv)
with the arrived requests in queue order, the seats (a running request, a finished one
still holding its seat, or None), and the KV cache to ask about memory. The plan names
requests to admit (in order, into free seats) and running requests to preempt.

Both policies below run on the same engine, model and KV cache; only this file differs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from minillm.request import Request


class KVSpace(Protocol):
    """What a policy may ask the KV cache (both layouts answer; contiguous always says 'free')."""

    @property
    def free_blocks(self) -> int: ...

    def blocks_to_admit(self, num_tokens: int) -> int: ...

    def blocks_to_grow(self, seat: int, num_new: int = 1) -> int: ...

    def blocks_held(self, seat: int) -> int: ...


@dataclass
class Plan:
    admit: list[Request] = field(default_factory=list)  # into free seats, in this order
    preempt: list[Request] = field(default_factory=list)  # running ones to send back to the queue


class Scheduler(Protocol):
    name: str
    holds_finished_seats: bool  # True: a finished request keeps its seat (idle) until the engine is told otherwise

    def schedule(self, waiting: list[Request], seats: list[Request | None], kv: KVSpace) -> Plan: ...


def preempt_for_decode(running: list[Request], kv: KVSpace) -> tuple[list[Request], int]:
    """Preempt the most recently admitted running requests until the rest can each grow by one token.

    Returns (victims, blocks left free after this step's decode).
    """
    keep = sorted(running, key=lambda r: r.admit_order)  # oldest first
    victims: list[Request] = []
    free = kv.free_blocks
    while keep and sum(kv.blocks_to_grow(r.seat) for r in keep) > free:
        victim = keep.pop()  # the newest loses its seat: it has the least work to redo
        victims.append(victim)
        free += kv.blocks_held(victim.seat)
    return victims, free - sum(kv.blocks_to_grow(r.seat) for r in keep)


def admit_in_order(waiting: list[Request], free_seats: int, free_blocks: int, kv: KVSpace) -> list[Request]:
    """First come, first served: admit from the head of the queue while seats and blocks last."""
    admitted = []
    for request in waiting:
        cost = kv.blocks_to_admit(request.tokens_in_cache_after_prefill)
        if len(admitted) == free_seats or cost > free_blocks:
            break  # nobody jumps the queue: a later, smaller request waits behind the head
        admitted.append(request)
        free_blocks -= cost
    return admitted


class StaticScheduler:
    """A batch runs until its longest member finishes; only then is the next batch formed."""

    name = "static"
    holds_finished_seats = True

    def schedule(self, waiting: list[Request], seats: list[Request | None], kv: KVSpace) -> Plan:
        running = [r for r in seats if r is not None and not r.is_finished]
        if running:  # the batch is still going: nobody joins, finished members keep their seats
            victims, _ = preempt_for_decode(running, kv)
            return Plan(preempt=victims)
        return Plan(admit=admit_in_order(waiting, len(seats), kv.free_blocks, kv))


class ContinuousScheduler:
    """Iteration-level: every step, finished requests have left and the queue fills the free seats."""

    name = "continuous"
    holds_finished_seats = False

    def schedule(self, waiting: list[Request], seats: list[Request | None], kv: KVSpace) -> Plan:
        running = [r for r in seats if r is not None]
        victims, free_blocks = preempt_for_decode(running, kv)
        free_seats = seats.count(None) + len(victims)
        return Plan(admit=admit_in_order(waiting, free_seats, free_blocks, kv), preempt=victims)


SCHEDULERS = {"static": StaticScheduler, "continuous": ContinuousScheduler}
