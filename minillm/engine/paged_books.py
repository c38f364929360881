"""The paged KV cache's books: block tables and the answers a scheduler needs, without any tensors.

PagedKVCache (kv_cache.py) adds the key and value tensors on top; a simulated card (card/simulate.py)
uses the books alone, since a real model's pool would be gigabytes.
"""

from __future__ import annotations

from minillm.engine.blocks import BlockAllocator, BlockPoolExhausted


def row_counts(seats: list[int], num_new: int | list[int]) -> list[int]:
    counts = [num_new] * len(seats) if isinstance(num_new, int) else list(num_new)
    if len(counts) != len(seats) or any(n < 1 for n in counts):
        raise ValueError(f"need one token count >= 1 per seat, got {counts} for seats {seats}")
    return counts


class PagedKVBooks:
    """The paged cache's bookkeeping without the tensors: block tables, and the answers a scheduler needs."""

    def __init__(self, num_blocks: int, block_size: int = 16, prefix_caching: bool = False):
        self.num_blocks, self.block_size, self.prefix_caching = num_blocks, block_size, prefix_caching
        # (two arguments unless asked for more: lesson 05 serves a crowd with a student's allocator in its place)
        args = (num_blocks, block_size) + ((True,) if prefix_caching else ())
        self.allocator = BlockAllocator(*args)

    def prepare(self, seats: list[int], num_new: int | list[int], padding_rows: int = 0) -> list[int]:
        """Give each seat blocks for its new tokens. Returns where each row starts (tokens it had before)."""
        alloc, counts = self.allocator, row_counts(seats, num_new)
        needed = sum(alloc.new_blocks_needed(s, n) for s, n in zip(seats, counts))
        if needed > alloc.num_free:  # check the whole batch first, so a failure changes nothing
            raise BlockPoolExhausted(
                f"KV cache is full: this step needs {needed} new block(s) but only {alloc.num_free} of "
                f"{alloc.num_blocks} are free; preempt a sequence first, or give the cache more blocks"
            )
        starts = [alloc.lengths.get(s, 0) for s in seats]
        for s, n in zip(seats, counts):
            alloc.append(s, n)
        return starts

    def free(self, seat: int) -> None:
        self.allocator.free(seat)

    def truncate(self, seat: int, num_tokens: int) -> None:
        """Keep the seat's first `num_tokens` tokens (rejected draft tokens go); blocks past them are free at once."""
        self.allocator.truncate(seat, num_tokens)

    # --- what a scheduler asks -----------------------------------------------------------------
    def blocks_to_admit(self, num_tokens: int, token_ids: list[int] | None = None, leaving: list[int] = ()) -> int:
        """Free blocks a new sequence of `num_tokens` takes. Given its tokens, blocks it shares from the
        prefix cache cost nothing, unless they sit on the free list (they leave it) or only sequences
        `leaving` this step (seats being preempted) hold them (they were counted as freed)."""
        blocks = self.allocator.blocks_for(num_tokens)
        if token_ids is None or not self.prefix_caching:
            return blocks
        tables = self.allocator.tables
        held_by_leavers = lambda b: sum(b in tables.get(seat, ()) for seat in leaving)
        hits = self.allocator.cached_prefix(token_ids)
        return blocks - sum(1 for b in hits if self.allocator.ref_counts[b] > held_by_leavers(b))

    def blocks_to_grow(self, seat: int, num_new: int = 1) -> int:
        return self.allocator.new_blocks_needed(seat, num_new)

    def blocks_held(self, seat: int) -> int:
        """Blocks that return to the free list if this seat's sequence is freed (shared ones stay held)."""
        if self.prefix_caching:
            return self.allocator.blocks_freed_by(seat)
        return len(self.allocator.tables.get(seat, []))

    def cached_prefix(self, token_ids: list[int]) -> int:
        """How many of these tokens are already in the prefix cache (0 without prefix caching)."""
        return len(self.allocator.cached_prefix(token_ids)) * self.block_size if self.prefix_caching else 0

    def can_ever_hold(self, num_tokens: int) -> bool:
        return self.allocator.blocks_for(num_tokens) <= self.num_blocks

    @property
    def free_blocks(self) -> int:
        return self.allocator.num_free

    # --- what the engine asks ------------------------------------------------------------------
    def claim_prefix(self, seat: int, token_ids: list[int]) -> int:
        """A newcomer takes its cached prefix blocks, a prompt being prefilled at a block boundary those cached
        since (another request computed them meanwhile). Returns the tokens it need not compute."""
        alloc = self.allocator
        if not self.prefix_caching or alloc.lengths.get(seat, 0) % self.block_size:
            return 0
        return alloc.share_prefix(seat, alloc.cached_prefix(token_ids)[len(alloc.tables.get(seat, ())) :])

    def commit(self, seat: int, token_ids: list[int]) -> None:
        """After a forward: `token_ids` of this seat have their keys and values stored; key its full blocks."""
        if self.prefix_caching:
            self.allocator.cache_full_blocks(seat, token_ids)

    def block_map(self, seats: list[int]) -> dict[int, list[int]]:
        return {s: list(self.allocator.tables.get(s, [])) for s in seats}

    def blocks_in_use(self, seats: list[int]) -> int:
        return self.allocator.num_used

    def seat_tokens(self, seat: int) -> int:
        return self.allocator.lengths.get(seat, 0)

    @property
    def cached_free_blocks(self) -> int:
        return self.allocator.num_cached_free if self.prefix_caching else 0

    def cached_free_block_ids(self) -> list[int]:
        """Free blocks that still hold a keyed prefix, least recently freed first (the next to be reused)."""
        key_of = self.allocator.key_of
        return [b for b in self.allocator.free_blocks if b in key_of] if self.prefix_caching else []

    @property
    def lengths(self) -> dict[int, int]:
        return self.allocator.lengths

    # --- memory accounting -------------------------------------------------------------------
    @property
    def reserved_tokens(self) -> int:
        """Token slots in blocks that some sequence holds (free blocks are anyone's)."""
        return self.allocator.num_used * self.block_size

    @property
    def stored_tokens(self) -> int:
        """Tokens held in blocks, a block shared by several sequences counted once."""
        if self.prefix_caching:
            return self.allocator.stored_tokens
        return sum(self.allocator.lengths.values())
