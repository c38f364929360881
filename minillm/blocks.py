"""The block allocator behind the paged KV cache: a free list, block tables and reference counts.

KV memory is cut into `num_blocks` blocks of `block_size` token slots each. A sequence
owns a *block table*: the list of physical blocks that hold its tokens, in order. Token
number p of a sequence lives in block table[p // block_size], at offset p % block_size.
Blocks are handed out one at a time as a sequence grows, so at most one block per
sequence is partly empty; nothing is reserved for tokens that may never come.

Invariants (checked by `check`): free + used == total, and every block's reference
count equals the number of block tables that hold it.
"""

from __future__ import annotations

from collections import deque

from minillm.errors import MinillmError


class BlockPoolExhausted(MinillmError):
    """Asked for more KV blocks than are free. Nothing was allocated or overwritten."""


class BlockAllocator:
    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks and block_size must be >= 1, got {num_blocks} and {block_size}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.free_blocks: deque[int] = deque(range(num_blocks))
        self.ref_counts = [0] * num_blocks
        self.tables: dict[int, list[int]] = {}  # sequence id -> physical block ids, in token order
        self.lengths: dict[int, int] = {}  # sequence id -> tokens stored

    # --- questions ---------------------------------------------------------------------------
    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)  # ceil division

    @property
    def num_free(self) -> int:
        return len(self.free_blocks)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self.free_blocks)

    def new_blocks_needed(self, seq: int, num_new: int) -> int:
        """How many blocks `seq` must be given to store `num_new` more tokens."""
        length = self.lengths.get(seq, 0)
        return self.blocks_for(length + num_new) - self.blocks_for(length)

    def can_allocate(self, num_tokens: int) -> bool:
        """Would a new sequence of `num_tokens` tokens fit in the free blocks right now?"""
        return self.blocks_for(num_tokens) <= self.num_free

    def can_append(self, seq: int, num_new: int = 1) -> bool:
        return self.new_blocks_needed(seq, num_new) <= self.num_free

    # --- changes -----------------------------------------------------------------------------
    def append(self, seq: int, num_new: int = 1) -> list[int]:
        """Grow `seq` (new or existing) by `num_new` tokens; returns the blocks it was given."""
        needed = self.new_blocks_needed(seq, num_new)
        if needed > self.num_free:
            raise BlockPoolExhausted(
                f"KV cache is full: sequence {seq} needs {needed} more block(s) of {self.block_size} tokens "
                f"but only {self.num_free} of {self.num_blocks} are free; free a sequence first "
                "(the scheduler preempts one), or give the cache more blocks"
            )
        given = [self.free_blocks.popleft() for _ in range(needed)]
        for block in given:
            self.ref_counts[block] += 1
        self.tables.setdefault(seq, []).extend(given)
        self.lengths[seq] = self.lengths.get(seq, 0) + num_new
        return given

    def allocate(self, seq: int, num_tokens: int) -> list[int]:
        """A new sequence with `num_tokens` tokens (a prompt): its whole block table."""
        if seq in self.tables:
            raise ValueError(f"sequence {seq} already has blocks; free it first")
        return self.append(seq, num_tokens)

    def free(self, seq: int) -> None:
        """Drop `seq`'s claim on its blocks; a block returns to the free list when nobody holds it."""
        for block in self.tables.pop(seq, []):
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                self.free_blocks.append(block)
        self.lengths.pop(seq, None)

    # --- checks ------------------------------------------------------------------------------
    def check(self) -> None:
        """Raise AssertionError if any invariant is broken (used by the tests and the engine's debug mode)."""
        owners = [0] * self.num_blocks
        for table in self.tables.values():
            for block in table:
                owners[block] += 1
        assert owners == self.ref_counts, "a block's ref count differs from the number of tables holding it"
        free = set(self.free_blocks)
        assert len(free) == len(self.free_blocks), "a block is on the free list twice"
        assert all((self.ref_counts[b] == 0) == (b in free) for b in range(self.num_blocks)), "free list is wrong"
        assert self.num_free + self.num_used == self.num_blocks
        for seq, table in self.tables.items():
            assert len(table) == self.blocks_for(self.lengths[seq]), f"sequence {seq} has the wrong number of blocks"
