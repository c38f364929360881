"""The re-implemented Orca's KV memory, as the vLLM paper describes it (§6.1): each request reserves one contiguous
chunk for its prompt and its output ahead, placed by a buddy allocator, so a chunk is a power of 2 and a request is
admitted only when a free chunk of its size can be had. How much output it reserves is the variant: Max (up to the
model's 2048 tokens), Pow2 (the true output rounded up to a power of 2), Oracle (the true output).

The engine keeps its paged books as ever (they hold the tokens); this policy only admits, on the engine's policy seam
(engine/scheduler.py), as papers/quota.py does for TGI: a request that holds a chunk never outgrows it, so the books,
sized to the same pool, never run short.
"""

from __future__ import annotations

import math

from minillm.engine.request import Request
from minillm.engine.scheduler import KVSpace, Plan, keep_running
from minillm.papers.vllm_setup import MAX_SEQUENCE


def pow2(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(n)))


def reservation(prompt: int, output: int, rule: str) -> int:
    """Tokens a request reserves: its prompt and the output its variant expects, at most the model's 2048."""
    expected = {"max": MAX_SEQUENCE, "pow2": prompt + pow2(output), "oracle": prompt + output}[rule]
    return min(MAX_SEQUENCE, expected)


class BuddyAllocator:
    """Chunks of 2^k units out of `units`, split in halves and merged back with their buddy, none above `largest`. A
    pool is a row of chunks of the largest size, then the rest in powers of 2 (OPT-13B on an A100 40GB: 961 blocks of
    16 tokens = 7 x 128 + 64 + 1)."""

    def __init__(self, units: int, largest: int):
        self.largest, self.free_at = largest, {}  # size -> set of free offsets (each a multiple of its size)
        offset, size = 0, largest
        while size >= 1:  # as many of the largest as fit, then the rest in halves: every chunk aligned to its size
            while units - offset >= size:
                self.free_at.setdefault(size, set()).add(offset)
                offset += size
            size //= 2

    def alloc(self, size: int) -> int | None:
        """The offset of a free chunk of `size` (a power of 2), split from a bigger one if need be; None: none."""
        have = min((s for s, offsets in self.free_at.items() if s >= size and offsets), default=None)
        if have is None:
            return None
        offset = min(self.free_at[have])  # the lowest: chunks pack from the start
        self.free_at[have].discard(offset)
        while have > size:  # keep the lower half, free the upper
            have //= 2
            self.free_at.setdefault(have, set()).add(offset + have)
        return offset

    def free(self, offset: int, size: int) -> None:
        while size < self.largest and (offset ^ size) in self.free_at.get(size, ()):  # its buddy is free: merge
            self.free_at[size].discard(offset ^ size)
            offset, size = min(offset, offset ^ size), size * 2
        self.free_at.setdefault(size, set()).add(offset)


class OrcaScheduler:
    """Iteration-level scheduling, first come first served, with Orca's reservations: a request joins only when the
    buddy allocator finds its chunk; the chunk is freed when it leaves. Tokens per step: the engine's budget rule."""

    name = "continuous"
    holds_finished_seats = False

    def __init__(self, rule: str, pool_tokens: int, block: int, token_budget: int | None):
        self.rule, self.block, self.budget = rule, block, token_budget
        self.buddy = BuddyAllocator(pool_tokens // block, MAX_SEQUENCE // block)  # in blocks: the smallest unit
        self.chunks: dict[str, tuple[int, int, int]] = {}  # request id -> (offset, size in blocks, reserved tokens)

    def chunk_blocks(self, request: Request) -> tuple[int, int]:
        reserved = reservation(len(request.prompt_ids), request.max_new_tokens, self.rule)
        return pow2(-(-reserved // self.block)), reserved

    def schedule(self, waiting: list[Request], seats: list, kv: KVSpace) -> Plan:
        running = [r for r in seats if r is not None and not r.is_finished]
        live = {r.id for r in running}
        for rid in [rid for rid in self.chunks if rid not in live]:  # finished since the last step: chunk freed
            offset, size, _ = self.chunks.pop(rid)
            self.buddy.free(offset, size)
        _, tokens, _ = keep_running(running, kv, self.budget)  # (never short: each stays within its chunk)
        left = math.inf if self.budget is None else self.budget - sum(tokens.values())
        admit = []
        for request in waiting[: seats.count(None)]:
            size, reserved = self.chunk_blocks(request)
            if left <= 0 or (offset := self.buddy.alloc(size)) is None:
                break  # first come, first served: nobody jumps the queue
            self.chunks[request.id] = (offset, size, reserved)
            tokens[request.id] = int(min(request.num_tokens, left))
            left -= tokens[request.id]
            admit.append(request)
        return Plan(admit=admit, tokens=tokens)
