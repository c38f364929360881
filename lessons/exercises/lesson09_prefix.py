"""Lesson 09 exercise: prefix caching in the block allocator. Check your work: pytest -m lesson09"""

from __future__ import annotations

from minillm.engine.blocks import BlockAllocator  # lesson 05's allocator: append, free, ref counts, tables (given)


class MyPrefixAllocator(BlockAllocator):
    """The block allocator with prefix caching: full blocks get a key, and a newcomer whose prompt starts
    with the same tokens takes the cached blocks instead of computing them again.

    What you inherit (minillm/engine/blocks.py, lesson 05), and may use:
      self.block_size, self.tables[seq] (its blocks, in token order), self.ref_counts[block] (how many
      tables hold it), self.append(seq, n) (which calls your _take_free for every new block), self.free(seq)
      (a block nobody holds any more goes to the END of self.free_blocks, a sequence's last block first).
      self.free_blocks is an OrderedDict {block: None}, least recently freed first.
    What you keep up to date (the inherited check() reads them):
      self.block_of: {key: {block: None, ...}}   the blocks holding the tokens a key stands for: usually one;
                                                 two when two sequences computed the same block side by side;
      self.key_of:   {block: key}                the key of every block that has one.
    Write the five methods below; share_prefix (given, at the end) uses take_cached.
    """

    def __init__(self, num_blocks: int, block_size: int):
        super().__init__(num_blocks, block_size, prefix_caching=True)

    def key(self, previous, token_ids: list[int]):
        """1. The key of a full block holding `token_ids`, whose predecessor's key is `previous` (b"" for a
        sequence's first block). Equal keys must mean equal tokens from the sequence's start up to here.
        Any hashable value works (hashlib.sha256(...).digest(), or Python's hash of a tuple)."""
        raise NotImplementedError("lesson 09: a block's key from its predecessor's key and its own tokens")

    def cached_prefix(self, token_ids: list[int]) -> list[int]:
        """2. The blocks holding the longest run of cached full blocks that starts `token_ids`, in order.
        Walk the prompt block by block, chaining the keys, and stop at the first block that is not cached.
        Where a key has several blocks, any of them will do (next(iter(...)) takes the first).
        Leave at least the prompt's last token out: the model must run it to produce the next token. Leave
        token_ids as it is (the caller uses it next)."""
        raise NotImplementedError("lesson 09: the longest cached run of full blocks, leaving the last token")

    def cache_full_blocks(self, seq: int, token_ids: list[int]) -> None:
        """3. `seq`'s first len(token_ids) tokens now have their keys and values in its blocks: give a key to
        each of its blocks that these tokens fill (a partly filled block gets none: its owner still writes into
        it). The sequence may already hold more tokens than these (appended for a chunk still being computed):
        count the full blocks by len(token_ids), not by what it holds.
        If another block already holds the same key, this block is a second copy: add it to the key's blocks
        too, so the tokens stay cached while either copy does. (Recomputing the chain from the first block
        each time is fine.)"""
        raise NotImplementedError("lesson 09: key every full block of the sequence")

    def take_cached(self, block: int) -> None:
        """4. A newcomer takes this cached block into its table: one more holder. If nobody held it, it was
        on the free list (cached, reusable): it must leave it, or the next append would hand it out."""
        raise NotImplementedError("lesson 09: one more holder for a cached block")

    def _take_free(self) -> int:
        """5. Hand out a free block (append calls this once per new block it needs): the least recently freed
        one, at the front of self.free_blocks. Whatever it held is about to be overwritten, so it loses its
        key: out of self.key_of, and out of its key's blocks in self.block_of (the key goes too if that was its
        last block; another copy keeps it). Return the block."""
        raise NotImplementedError("lesson 09: evict the least recently freed block and forget its key")

    # --- given ---------------------------------------------------------------------------------------
    def share_prefix(self, seq: int, blocks: list[int]) -> int:
        """`seq` takes the cached blocks `cached_prefix` found: a newcomer all of them, a prompt being prefilled
        (its computed tokens end on a block boundary) those past the blocks it holds. Returns the tokens they hold."""
        table = self.tables.setdefault(seq, [])
        for block in blocks:
            self.extra_holds += self.ref_counts[block] > 0  # (the books count a shared block's tokens once)
            self.take_cached(block)
        table += blocks
        self.lengths[seq] = len(table) * self.block_size
        return len(blocks) * self.block_size
