"""The paged KV cache's books: block tables and the answers a scheduler needs, without tensors.

PagedKVCache (kv_cache.py) adds the key and value tensors on top; a simulated card
(card/simulate.py) keeps the books alone, since a real model's pool would be gigabytes.
"""

from __future__ import annotations

from minillm.engine.blocks import BlockAllocator, BlockPoolExhausted


def row_counts(seats: list[int], num_new: int | list[int]) -> list[int]:
    counts = [num_new] * len(seats) if isinstance(num_new, int) else list(num_new)
    if len(counts) != len(seats) or any(n < 1 for n in counts):
        raise ValueError(f"need one token count >= 1 per seat, got {counts} for seats {seats}")
    return counts


class PagedKVBooks:
    def __init__(self, num_blocks: int, block_size: int = 16, prefix_caching: bool = False):
        self.num_blocks, self.block_size = num_blocks, block_size
        self.prefix_caching = prefix_caching
        self.allocator = BlockAllocator(num_blocks, block_size, prefix_caching)

    def prepare(self, seats: list[int], num_new: int | list[int], padding_rows=0) -> list[int]:
        """Give each seat blocks for its new tokens; returns where each row starts."""
        alloc, counts = self.allocator, row_counts(seats, num_new)
        needed = sum(alloc.new_blocks_needed(s, n) for s, n in zip(seats, counts))
        if needed > alloc.num_free:  # the whole batch checked first: a failure changes nothing
            raise BlockPoolExhausted(
                f"KV cache is full: this step needs {needed} new block(s) but only "
                f"{alloc.num_free} of {alloc.num_blocks} are free; preempt a sequence first, "
                "or give the cache more blocks"
            )
        starts = [alloc.lengths.get(s, 0) for s in seats]
        for s, n in zip(seats, counts):
            alloc.append(s, n)
        return starts

    def free(self, seat: int) -> None:
        self.allocator.free(seat)

    def truncate(self, seat: int, num_tokens: int) -> None:  # blocks past them: free at once
        self.allocator.truncate(seat, num_tokens)

    # --- what a scheduler asks (KVSpace) ---------------------------------------------------
    def blocks_to_admit(self, num_tokens: int, token_ids=None, leaving=()) -> int:
        """Free blocks a new sequence takes: none for blocks it shares from the prefix cache, unless
        they sit on the free list or only seats `leaving` this step hold them (counted freed)."""
        blocks = self.allocator.blocks_for(num_tokens)
        if token_ids is None or not self.prefix_caching:
            return blocks
        alloc = self.allocator
        held_by_leavers = lambda b: sum(b in alloc.tables.get(seat, ()) for seat in leaving)
        hits = alloc.cached_prefix(token_ids)
        return blocks - sum(1 for b in hits if alloc.ref_counts[b] > held_by_leavers(b))

    def blocks_to_grow(self, seat: int, num_new: int = 1) -> int:
        return self.allocator.new_blocks_needed(seat, num_new)

    def blocks_held(self, seat: int) -> int:  # freed with the seat's sequence (not shared ones)
        return self.allocator.blocks_freed_by(seat)

    def cached_prefix(self, token_ids: list[int]) -> int:  # tokens already in the prefix cache
        return len(self.allocator.cached_prefix(token_ids)) * self.block_size

    def can_ever_hold(self, num_tokens: int) -> bool:
        return self.allocator.blocks_for(num_tokens) <= self.num_blocks

    @property
    def free_blocks(self) -> int:
        return self.allocator.num_free

    # --- what the engine asks under prefix caching -----------------------------------------
    def claim_prefix(self, seat: int, token_ids: list[int]) -> int:
        """A newcomer takes its cached prefix blocks; a prompt being prefilled, at a block boundary,
        those another request computed meanwhile. Returns the tokens it need not compute."""
        alloc = self.allocator
        if alloc.lengths.get(seat, 0) % self.block_size:
            return 0
        held = len(alloc.tables.get(seat, ()))
        return alloc.share_prefix(seat, alloc.cached_prefix(token_ids)[held:])

    def commit(self, seat: int, token_ids: list[int]) -> None:  # these are computed: key them
        self.allocator.cache_full_blocks(seat, token_ids)

    # --- what the trace asks ---------------------------------------------------------------
    def blocks_in_use(self, seats: list[int]) -> int:
        return self.allocator.num_used

    def seat_tokens(self, seat: int) -> int:
        return self.allocator.lengths.get(seat, 0)

    @property
    def lengths(self) -> dict[int, int]:
        return self.allocator.lengths

    @property
    def reserved_tokens(self) -> int:  # slots in blocks some sequence holds (free: anyone's)
        return self.allocator.num_used * self.block_size

    @property
    def stored_tokens(self) -> int:  # tokens held in blocks, a shared block counted once
        return self.allocator.stored_tokens
