"""Lesson 05 exercise: paging the KV cache. Check your work: pytest -m lesson05"""

from __future__ import annotations

import torch


class MyBlockAllocator:
    """A pool of `num_blocks` blocks of `block_size` token slots, handed out as sequences grow.

    tables[seq] is the sequence's block table (physical block ids, in token order) and
    lengths[seq] its token count. Token p of a sequence lives in block tables[seq][p // block_size].
    """

    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks, self.block_size = num_blocks, block_size
        self.free_blocks: list[int] = list(range(num_blocks))
        self.tables: dict[int, list[int]] = {}
        self.lengths: dict[int, int] = {}

    @property
    def num_free(self) -> int:
        return len(self.free_blocks)

    def append(self, seq: int, num_new: int = 1) -> list[int]:
        """Grow `seq` (new or existing) by num_new >= 1 tokens, taking new blocks from the free list only
        when the tokens cross into a block the sequence does not have yet. Returns the new blocks (a list, in
        the order they join the table; [] when none is needed). Which free blocks you take is yours to choose.
        If not enough blocks are free, raise BlockPoolExhausted (from minillm.engine.blocks) and change nothing
        (blocks that suffice exactly are enough; tokens that fit in the last block's room need none, even
        when the free list is empty)."""
        raise NotImplementedError("lesson 05: give a sequence blocks as its tokens cross block boundaries")

    def free(self, seq: int) -> None:
        """Return all of `seq`'s blocks to the free list and forget it (its table and its length). `seq` is a
        sequence you hold."""
        raise NotImplementedError("lesson 05: return a sequence's blocks to the free list")


def slot_mapping(block_table: list[int], positions: list[int], block_size: int) -> list[int]:
    """Where in the flat pool (num_blocks * block_size slots) each token position is written:
    block_table[p // block_size] * block_size + p % block_size. Returns a new list of ints, one per position.

    positions: consecutive positions the table's blocks hold (a prefill, a chunk, one decode position), or
    none at all ([] gives [], even with an empty table). Leave both lists as they are."""
    raise NotImplementedError("lesson 05: turn token positions into flat slots through the block table")


def paged_gather(pool: torch.Tensor, block_tables: torch.Tensor) -> torch.Tensor:
    """Read each sequence's blocks out of the pool, in logical order, with one indexing op (no loop).

    pool: (num_blocks, block_size, n_kv_heads, head_dim), any float dtype; block_tables: (B, max_blocks) long,
    B >= 1, a row padded with any valid block id (repeats). Every size may be 1.
    Returns (B, max_blocks * block_size, n_kv_heads, head_dim), the pool's numbers in the pool's dtype. Leave
    both tensors as they are.
    """
    raise NotImplementedError("lesson 05: gather the blocks of every row with one indexing op")
