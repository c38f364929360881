"""The block allocator behind the paged KV cache: a free list, block tables, reference counts, prefix caching.

KV memory is cut into `num_blocks` blocks of `block_size` token slots each. A sequence
owns a *block table*: the list of physical blocks that hold its tokens, in order. Token
number p of a sequence lives in block table[p // block_size], at offset p % block_size.
Blocks are handed out one at a time as a sequence grows, so at most one block per
sequence is partly empty; nothing is reserved for tokens that may never come.

Prefix caching (off unless asked for): once a block is full and its keys and values are
computed, it gets a *key*: a hash of its token ids and of the key of the block before it,
so equal keys mean equal tokens all the way from the start of the sequence. A newcomer
whose prompt starts with the same tokens takes those blocks into its own table (their
reference count goes up) instead of computing them again. A block that nobody holds any
more keeps its key and its contents on the free list, reusable until the free list needs
it for someone else: the least recently freed block is handed out first, and loses its key.
Only full blocks are shared; a partly filled block is always private (its owner writes to it).
Two requests that compute the same block side by side make two copies; a key names every copy
(as vLLM's does), so the tokens stay cached while either copy is.

Invariants (checked by `check`; every step in the engine's debug mode): free + used == total, every
block's reference count equals the number of block tables that hold it, the key table and the blocks'
keys agree, and no token was written into a shared or keyed block (`events`, which counts hits too).
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict

from minillm.errors import MinillmError


class BlockPoolExhausted(MinillmError):
    """Asked for more KV blocks than are free. Nothing was allocated or overwritten."""


def block_key(previous: bytes, token_ids: list[int]) -> bytes:
    """The key of a full block: a hash of everything before it (its predecessor's key) and its own tokens.
    (sha256, as vLLM does, so two different prefixes never share a key in practice.)"""
    return hashlib.sha256(previous + array("q", token_ids).tobytes()).digest()


class BlockAllocator:
    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = False):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks and block_size must be >= 1, got {num_blocks} and {block_size}")
        self.num_blocks, self.block_size, self.prefix_caching = num_blocks, block_size, prefix_caching
        self.free_blocks: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))  # oldest free first
        self.ref_counts = [0] * num_blocks
        self.tables: dict[int, list[int]] = {}  # sequence id -> physical block ids, in token order
        self.lengths: dict[int, int] = {}  # sequence id -> tokens stored
        # prefix caching
        self.key_of: dict[int, bytes] = {}  # block -> its key (full, computed blocks only)
        self.block_of: dict[bytes, dict[int, None]] = {}  # key -> the blocks holding those tokens (one, or copies)
        self.hashed: dict[int, tuple[int, bytes]] = {}  # sequence id -> (leading blocks hashed, last one's key)
        self.events = {"hit_blocks": 0, "evicted_keyed": 0, "shared_writes": 0}  # read-only counts for tests, trace
        self.extra_holds = 0  # sum over blocks of (holders - 1): shared blocks counted once in stored tokens

    # --- questions ---------------------------------------------------------------------------
    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)  # ceil division

    @property
    def num_free(self) -> int:
        return len(self.free_blocks)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self.free_blocks)

    @property
    def num_cached_free(self) -> int:
        """Free blocks that still hold a keyed prefix (reusable until someone needs the memory)."""
        return sum(1 for b in self.free_blocks if b in self.key_of)

    @property
    def stored_tokens(self) -> int:
        """Token slots holding a token, a shared block counted once."""
        return sum(self.lengths.values()) - self.extra_holds * self.block_size

    def new_blocks_needed(self, seq: int, num_new: int) -> int:
        """How many blocks `seq` must be given to store `num_new` more tokens."""
        length = self.lengths.get(seq, 0)
        return self.blocks_for(length + num_new) - self.blocks_for(length)

    def can_allocate(self, num_tokens: int) -> bool:
        """Would a new sequence of `num_tokens` tokens fit in the free blocks right now?"""
        return self.blocks_for(num_tokens) <= self.num_free

    def blocks_freed_by(self, seq: int) -> int:
        """Blocks that would return to the free list if `seq` let go: those nobody else holds."""
        return sum(1 for b in self.tables.get(seq, []) if self.ref_counts[b] == 1)

    def cached_prefix(self, token_ids: list[int]) -> list[int]:
        """The blocks holding the longest cached run of full blocks that starts `token_ids`.

        Never the whole sequence: at least its last token is left to compute, because the model
        must run it to produce the next token (and a partly filled block is never shared)."""
        if not self.prefix_caching:
            return []
        blocks, key = [], b""
        for start in range(0, len(token_ids) - 1 - self.block_size + 1, self.block_size):
            key = block_key(key, token_ids[start : start + self.block_size])
            block = next(iter(self.block_of.get(key, ())), None)  # any copy will do
            if block is None:
                break
            blocks.append(block)
        return blocks

    # --- changes -----------------------------------------------------------------------------
    def _take_free(self) -> int:
        block, _ = self.free_blocks.popitem(last=False)  # the least recently freed
        key = self.key_of.pop(block, None)
        if key is not None:  # its cached contents are about to be overwritten (another copy may keep them)
            self.events["evicted_keyed"] += 1
            del self.block_of[key][block]
            if not self.block_of[key]:
                del self.block_of[key]
        return block

    def append(self, seq: int, num_new: int = 1) -> list[int]:
        """Grow `seq` (new or existing) by `num_new` tokens; returns the blocks it was given."""
        needed = self.new_blocks_needed(seq, num_new)
        if needed > self.num_free:
            raise BlockPoolExhausted(
                f"KV cache is full: sequence {seq} needs {needed} more block(s) of {self.block_size} tokens "
                f"but only {self.num_free} of {self.num_blocks} are free; free a sequence first "
                "(the scheduler preempts one), or give the cache more blocks"
            )
        last = self.tables[seq][-1] if self.lengths.get(seq, 0) % self.block_size else None  # written into
        self.events["shared_writes"] += last is not None and (self.ref_counts[last] > 1 or last in self.key_of)
        given = [self._take_free() for _ in range(needed)]
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

    def share_prefix(self, seq: int, blocks: list[int]) -> int:
        """`seq` (new, or holding only full computed blocks) goes on with cached blocks (from `cached_prefix`,
        those past the ones it holds); returns the tokens they hold."""
        table = self.tables.setdefault(seq, [])
        if self.lengths.setdefault(seq, 0) != len(table) * self.block_size:
            raise ValueError(f"sequence {seq} has a partly filled block: it cannot go on with cached blocks")
        for block in blocks:
            if self.ref_counts[block] == 0:
                del self.free_blocks[block]  # a hit on a free cached block takes it off the free list
            else:
                self.extra_holds += 1
            self.ref_counts[block] += 1
        table += blocks
        self.lengths[seq] = len(table) * self.block_size
        self.events["hit_blocks"] += len(blocks)
        if blocks:
            self.hashed[seq] = (len(table), self.key_of[blocks[-1]])
        return len(blocks) * self.block_size

    def cache_full_blocks(self, seq: int, token_ids: list[int]) -> None:
        """Give keys to `seq`'s blocks that are now full and computed. token_ids: its tokens with computed KV."""
        if not self.prefix_caching:
            return
        table, (done, key) = self.tables[seq], self.hashed.get(seq, (0, b""))
        for i in range(done, len(token_ids) // self.block_size):
            key = block_key(key, token_ids[i * self.block_size : (i + 1) * self.block_size])
            self.block_of.setdefault(key, {})[table[i]] = None  # (a copy, if another block holds these tokens too)
            self.key_of[table[i]] = key
            done = i + 1
        self.hashed[seq] = (done, key)

    def free(self, seq: int) -> None:
        """Drop `seq`'s claim on its blocks; a block returns to the free list when nobody holds it.

        The sequence's last blocks go on the free list first, so that its first blocks (the
        prefix others are most likely to share) are the last to be handed out again."""
        self._let_go(self.tables.pop(seq, []))
        self.lengths.pop(seq, None)
        self.hashed.pop(seq, None)

    def _let_go(self, blocks: list[int]) -> None:
        for block in reversed(blocks):
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                self.free_blocks[block] = None
            else:
                self.extra_holds -= 1

    def truncate(self, seq: int, num_tokens: int) -> None:
        """Keep `seq`'s first `num_tokens` tokens and forget the rest (a draft's rejected guesses: speculate.py).
        Blocks past the kept tokens return to the free list at once, last first. Only tokens past every keyed
        block may go (a keyed block's tokens are someone's cached prefix): rejected guesses always are, since
        blocks get keys only once their tokens are accepted."""
        table, length = self.tables[seq], self.lengths[seq]
        keyed = self.hashed.get(seq, (0, b""))[0] * self.block_size
        if not keyed <= num_tokens <= length:
            raise ValueError(f"sequence {seq} holds {length} tokens ({keyed} keyed): cannot keep {num_tokens}")
        keep = self.blocks_for(num_tokens)
        self._let_go(table[keep:])
        del table[keep:]
        self.lengths[seq] = num_tokens

    # --- checks ------------------------------------------------------------------------------
    def check(self) -> None:
        """Raise AssertionError if any invariant is broken (used by the tests and the engine's debug mode)."""
        owners = [0] * self.num_blocks
        for table in self.tables.values():
            for block in table:
                owners[block] += 1
        assert owners == self.ref_counts, "a block's ref count differs from the number of tables holding it"
        assert all((self.ref_counts[b] == 0) == (b in self.free_blocks) for b in range(self.num_blocks)), (
            "free list is wrong"
        )
        assert self.num_free + self.num_used == self.num_blocks
        for seq, table in self.tables.items():
            assert len(table) == self.blocks_for(self.lengths[seq]), f"sequence {seq} has the wrong number of blocks"
            full = self.lengths[seq] // self.block_size
            assert all(b not in self.key_of for b in table[full:]), f"sequence {seq}: a partly filled block has a key"
        assert self.extra_holds == sum(max(0, n - 1) for n in self.ref_counts), "extra_holds is off"
        assert len(self.key_of) == sum(map(len, self.block_of.values())), "the key table and the blocks' keys disagree"
        copies = ((k, b) for k, blocks in self.block_of.items() for b in blocks or [None])  # (no key without a block)
        assert all(self.key_of.get(b) == k for k, b in copies), "the key table and the blocks disagree"
        assert self.prefix_caching or not self.key_of, "keys without prefix caching"
        assert self.events["shared_writes"] == 0, "tokens were written into a block that is shared or keyed"
