"""Where the KV memory goes, step by step: the vLLM paper's Fig. 2 measured on minillm's own books.

Every slot of the card's KV pool is, at each step, one of the paper's four kinds (§3.1):
    token states   a token's keys and values are there (the books' count of computed tokens)
    reservation    held for a token the request will still produce ("reserved slots for future tokens")
    internal       held for a token it will never produce ("over-provisioning for potential maximum lengths")
    external       held by nobody: the buddy allocator's rounding up to a power of 2, and the free rest ("external
                   fragmentation & others": a chunk's tail past its reservation serves nobody either)
A paged request holds whole blocks: its last block's empty slots are reservation while it will still fill them,
internal past its final length. Averaged over time (each step weighs its simulated seconds) over the steady part of the
trace: from the arrival of its first quarter's last request (before it, the empty card fills up: negligible in the
paper's hour-long traces, not in a sample of a few hundred requests) to its last arrival (after it, the drain).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

KINDS = ("token states", "reservation", "internal", "external")


@dataclass
class KVUsage:
    """An engine observer (engine.observers): the pool's slots by kind, and the batch, over the steps."""

    pool_tokens: int
    from_s: float  # steps that begin earlier are the warm-up
    until_s: float  # the last arrival: steps that begin later are the drain
    reserved_of: Callable  # (engine, request) -> the slots it holds: its chunk's reservation, or its blocks
    seconds: float = 0.0
    slot_s: dict = field(default_factory=lambda: dict.fromkeys(KINDS, 0.0))  # slot-seconds of each kind
    steps: int = 0
    rows: int = 0  # requests in the batch, summed over the steps

    def __call__(self, engine, step) -> None:
        if not self.from_s <= step.begin <= self.until_s:
            return
        dt = engine.clock.now() - step.begin
        held = [r for r in engine.seats if r is not None and (not r.is_finished or r in step.finished)]
        counts = dict.fromkeys(KINDS, 0)
        for r in held:
            final = len(r.prompt_ids) + r.max_new_tokens - 1  # the KV it holds at the end (its last token is not fed)
            reserved = self.reserved_of(engine, r)
            counts["token states"] += r.num_computed
            counts["reservation"] += min(reserved, final) - r.num_computed
            counts["internal"] += max(0, reserved - final)
        counts["external"] = self.pool_tokens - sum(counts.values())
        for kind, n in counts.items():
            self.slot_s[kind] += n * dt
        self.seconds += dt
        self.steps += 1
        self.rows += len(held)

    def shares(self) -> dict[str, float]:
        """Each kind's percent of the pool, averaged over time."""
        total = self.pool_tokens * self.seconds
        return {kind: 100 * s / total if total else 0.0 for kind, s in self.slot_s.items()}

    @property
    def batched(self) -> float:
        """Requests in the batch, averaged over the steps (the paper's Fig. 13)."""
        return self.rows / self.steps if self.steps else 0.0
