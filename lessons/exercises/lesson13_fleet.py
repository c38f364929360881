"""Lesson 13 exercise: a router that knows the caches, and the KV a hand-over sends. Check: pytest -m lesson13

Part 1 is the cache-aware routing decision a fleet's router makes for each arrival (minillm/serving/routing.py makes
it for `serve --replicas N`); part 2 prices the KV a prefill card hands to a decode card (minillm/card/kv_transfer.py).
"""

from __future__ import annotations

from minillm.engine.blocks import block_key  # noqa: F401 (given: block_key(previous key, a full block's ids) -> bytes)


# --- part 1: route by the prefix cache -----------------------------------------------------------------------------
def prompt_keys(token_ids: list[int], block_size: int) -> list[bytes]:
    """1. The keys of the prompt's full blocks, as the replicas' allocators key them (lesson 09): block i's key is
    block_key(key of block i - 1, its block_size tokens), and block 0's predecessor is b"". A last block that is not
    full has no key (its owner still writes into it: nobody can share it). Token ids are any ids (the special ones,
    256 and up, included); a prompt may be empty or shorter than a block ([]). Leave token_ids as it is."""
    raise NotImplementedError("lesson 13: the keys of a prompt's full blocks, chained")


def matched_blocks(keys: list[bytes], held: set[bytes]) -> int:
    """2. How many of the prompt's blocks a replica holding the keys `held` can give it: its leading blocks whose keys
    it holds, in a run from the first (a block is only useful after all of its predecessors)."""
    raise NotImplementedError("lesson 13: the run of leading keys a replica holds")


def route(keys: list[bytes], loads: list[int], caches: list[set[bytes]], cost: int, min_match: int = 2,
          overload_factor: float = 1.5) -> int:  # fmt: skip
    """3. The replica (an index into loads and caches) an arrival goes to.

    keys: the prompt's block keys; loads[i]: replica i's work in hand (tokens its requests still have to run);
    caches[i]: the keys replica i's prefix cache holds; cost: the arrival's own tokens.
    - The best replica holds the longest run of the keys; among equally long runs, the less loaded; then the lower
      index (so the same view always gives the same answer).
    - Least loaded (ties: the lower index, whatever the tied replicas hold) instead when the best run is shorter
      than min_match blocks (a shared template's first block saves little, and would send everyone to one
      replica), or when the best replica is overloaded: its load is over (>, not >=) overload_factor x the least
      loaded replica's load + cost.
    A run counts only leading blocks (matched_blocks). min_match may be 0 or 1; loads may tie. Leave the lists and
    sets as they are.
    """
    raise NotImplementedError("lesson 13: the cache-aware routing decision")


# --- part 2: the hand-over's bytes and time -------------------------------------------------------------------------
def kv_bytes(layers: int, heads: int, kv_heads: int, head_dim: int, tokens: int, kv_bits: float = 16, tp: int = 1
             ) -> float:  # fmt: skip
    """4. Bytes of KV that ONE card of a prefill engine split over tp cards sends for a prompt of `tokens` tokens:
    a key and a value for every layer and every key/value head (heads are the query heads: GQA models have fewer kv
    heads), head_dim numbers of kv_bits bits each; each of the tp cards holds and sends its kv_heads / tp heads (tp
    divides kv_heads). kv_bits need not be whole bytes (4: int4); tokens may be 0."""
    raise NotImplementedError("lesson 13: the bytes of a prompt's KV, per card")


def transfer_s(nbytes: float, link_gbit_per_s: float, latency_s: float) -> float:
    """5. Seconds to send nbytes over a network link of link_gbit_per_s gigabits (10**9 bits) per second each way
    (InfiniBand NDR: 400), starting with a fixed latency_s."""
    raise NotImplementedError("lesson 13: a transfer's time over a link")
