"""Which replica gets a request: three policies over the router's view of its replicas (router.py keeps the view).

    round robin    each replica in turn, whatever it holds
    least loaded   the replica with the least work in hand: over its requests in flight (queued or seated), the
                   prompt tokens of those without a first token yet plus the output tokens each may still make
    cache aware    the replica whose prefix cache holds the longest run of the prompt's leading blocks, unless
                   the run is short (under MIN_MATCH_BLOCKS blocks: a shared chat template's first block saves
                   little, and would send everyone to one replica) or that replica is overloaded (its load over
                   OVERLOAD_FACTOR x the least loaded's + the request's own tokens): then least loaded

A prompt's blocks are named as the allocator names them (engine.blocks.block_key: a full block's key chains its
predecessor's), so a prompt's leading keys found in a replica's key set are blocks that replica can share with it.
Ties go to the less loaded replica, then the lower index, so the same view always gives the same choice.
The policies are pure: a view in, a Choice out; the tests hand-make views.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass, field

from minillm.engine.blocks import block_key

MIN_MATCH_BLOCKS = 2  # a cached run shorter than this (32 tokens at block size 16) does not steer a request
OVERLOAD_FACTOR = 1.5  # cache aware leaves a replica whose load is over 1.5 x the least loaded's + one request


@dataclass
class ReplicaView:
    """What the router knows of one replica in rotation."""

    index: int
    load: int = 0  # tokens of work in hand (see the module's notes)
    keys: Container[bytes] = field(default_factory=frozenset)  # the block keys its prefix cache is known to hold


@dataclass
class Choice:
    replica: int
    reason: str  # "round_robin" | "least_loaded" | "prefix_hit" | "short_match" | "overloaded"
    matched_blocks: int = 0  # cache aware: the chosen replica's cached run (a fallback: the best replica's)


def prompt_keys(token_ids: list[int], block_size: int) -> list[bytes]:
    """The keys of the full blocks of `token_ids`, chained as the allocator chains them."""
    keys, key = [], b""
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        key = block_key(key, token_ids[start : start + block_size])
        keys.append(key)
    return keys


def shareable(keys: list[bytes], prompt_len: int, block_size: int) -> list[bytes]:
    """The keys a cache hit can cover: the allocator always leaves the prompt's last token to compute
    (BlockAllocator.cached_prefix), so only blocks that end before it."""
    return keys[: (prompt_len - 1) // block_size]


def matched_blocks(keys: list[bytes], held: Container[bytes]) -> int:
    """How many of the leading keys `held` holds, in a row (a block is only shareable after its predecessors)."""
    for n, key in enumerate(keys):
        if key not in held:
            return n
    return len(keys)


def least_loaded(replicas: list[ReplicaView]) -> ReplicaView:
    return min(replicas, key=lambda r: (r.load, r.index))


class RoundRobin:
    def __init__(self):
        self.last = -1  # the index chosen last; a replica that left the rotation is skipped, the order kept

    def choose(self, keys: list[bytes], cost: int, replicas: list[ReplicaView]) -> Choice:
        after = [r for r in replicas if r.index > self.last]
        self.last = min(after or replicas, key=lambda r: r.index).index
        return Choice(self.last, "round_robin")


class LeastLoaded:
    def choose(self, keys: list[bytes], cost: int, replicas: list[ReplicaView]) -> Choice:
        return Choice(least_loaded(replicas).index, "least_loaded")


class CacheAware:
    def __init__(self, min_match_blocks: int = MIN_MATCH_BLOCKS, overload_factor: float = OVERLOAD_FACTOR):
        self.min_match_blocks, self.overload_factor = min_match_blocks, overload_factor

    def choose(self, keys: list[bytes], cost: int, replicas: list[ReplicaView]) -> Choice:
        """keys: the prompt's shareable block keys; cost: its own tokens (prompt + output budget)."""
        matched = {r.index: matched_blocks(keys, r.keys) for r in replicas}
        best = min(replicas, key=lambda r: (-matched[r.index], r.load, r.index))
        least = least_loaded(replicas)
        if matched[best.index] < self.min_match_blocks:
            return Choice(least.index, "short_match", matched[best.index])
        if best.load > self.overload_factor * least.load + cost:
            return Choice(least.index, "overloaded", matched[best.index])
        return Choice(best.index, "prefix_hit", matched[best.index])


ROUTES = {"round-robin": RoundRobin, "least-loaded": LeastLoaded, "cache-aware": CacheAware}
