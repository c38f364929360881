"""The block allocator behind the paged KV cache: free list, block tables, reference counts,
prefix caching.

KV memory is cut into `num_blocks` blocks of `block_size` token slots. A sequence owns a *block
table*: its physical blocks, in order; token p lives in block table[p // block_size], at offset
p % block_size. Blocks are handed out as a sequence grows, so at most one block per sequence is
partly empty: nothing is reserved for tokens that may never come.

Prefix caching (off unless asked for): a full, computed block gets a *key*, a hash of its tokens
and of the previous block's key, so equal keys mean equal tokens all the way from the start. A
newcomer whose prompt starts alike takes those blocks into its table (their reference count goes
up) instead of computing them. A block nobody holds keeps its key and contents on the free list
until it is handed out again (least recently freed first). Only full blocks are shared; two
requests computing the same block side by side make two copies, both under the key (as vLLM's).
A fork shares a sequence's blocks the same way, by reference count (n replies to one prompt).
`check` asserts the books' invariants (tests; every step in debug mode).
"""

from __future__ import annotations

import hashlib
from array import array
from collections import Counter, OrderedDict

from minillm.errors import MinillmError


class BlockPoolExhausted(MinillmError):
    """Asked for more KV blocks than are free. Nothing was allocated or overwritten."""


def block_key(previous: bytes, token_ids: list[int]) -> bytes:
    """The key of a full block: a hash of everything before it (its predecessor's key) and its
    own tokens (sha256, as vLLM's: two different prefixes never share a key in practice)."""
    return hashlib.sha256(previous + array("q", token_ids).tobytes()).digest()


class BlockAllocator:
    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = False):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks and block_size must be >= 1: {num_blocks}, {block_size}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.prefix_caching = prefix_caching
        self.free_blocks = OrderedDict.fromkeys(range(num_blocks))  # oldest free first
        self.ref_counts = [0] * num_blocks
        self.tables: dict[int, list[int]] = {}  # sequence -> its physical blocks, in token order
        self.lengths: dict[int, int] = {}  # sequence -> tokens stored
        # prefix caching
        self.key_of: dict[int, bytes] = {}  # block -> its key (full, computed blocks only)
        self.block_of: dict[bytes, dict[int, None]] = {}  # key -> the blocks holding its tokens
        self.hashed: dict[int, tuple[int, bytes]] = {}  # sequence -> (blocks keyed, last key)
        self.events = {"hit_blocks": 0, "evicted_keyed": 0, "shared_writes": 0}  # for the trace
        self.extra_holds = 0  # sum over blocks of (holders - 1): a shared block counts once

    # --- questions -------------------------------------------------------------------------
    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)  # ceil division

    @property
    def num_free(self) -> int:
        return len(self.free_blocks)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self.free_blocks)

    @property
    def stored_tokens(self) -> int:  # token slots holding a token, a shared block counted once
        return sum(self.lengths.values()) - self.extra_holds * self.block_size

    def new_blocks_needed(self, seq: int, num_new: int) -> int:  # to store num_new more tokens
        length = self.lengths.get(seq, 0)
        return self.blocks_for(length + num_new) - self.blocks_for(length)

    def can_allocate(self, num_tokens: int) -> bool:  # would a new sequence fit right now?
        return self.blocks_for(num_tokens) <= self.num_free

    def blocks_freed_by(self, seq: int) -> int:  # if `seq` let go: the blocks only it holds
        return sum(1 for b in self.tables.get(seq, []) if self.ref_counts[b] == 1)

    def cached_prefix(self, token_ids: list[int]) -> list[int]:
        """The blocks holding the longest cached run of full blocks that starts `token_ids`; never
        its last token, which the model must run to produce the next one."""
        if not self.prefix_caching:
            return []
        blocks, key, size = [], b"", self.block_size
        for start in range(0, len(token_ids) - size, size):
            key = block_key(key, token_ids[start : start + size])
            block = next(iter(self.block_of.get(key, ())), None)  # any copy will do
            if block is None:
                break
            blocks.append(block)
        return blocks

    # --- changes ---------------------------------------------------------------------------
    def _take_free(self) -> int:
        block, _ = self.free_blocks.popitem(last=False)  # the least recently freed
        key = self.key_of.pop(block, None)
        if key is not None:  # its cached contents are about to go (another copy may keep them)
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
                f"KV cache is full: sequence {seq} needs {needed} more block(s) of "
                f"{self.block_size} tokens but only {self.num_free} of {self.num_blocks} are free; "
                "free a sequence first (the scheduler preempts one), or give the cache more blocks"
            )
        length = self.lengths.get(seq, 0)
        last = self.tables[seq][-1] if length % self.block_size else None  # written into
        shared = last is not None and (self.ref_counts[last] > 1 or last in self.key_of)
        self.events["shared_writes"] += shared
        given = [self._take_free() for _ in range(needed)]
        for block in given:
            self.ref_counts[block] += 1
        self.tables.setdefault(seq, []).extend(given)
        self.lengths[seq] = length + num_new
        return given

    def allocate(self, seq: int, num_tokens: int) -> list[int]:  # a new sequence's whole table
        if seq in self.tables:
            raise ValueError(f"sequence {seq} already has blocks; free it first")
        return self.append(seq, num_tokens)

    def share_prefix(self, seq: int, blocks: list[int]) -> int:
        """`seq` (new, or holding only full computed blocks) goes on with cached blocks (from
        `cached_prefix`, past those it holds); returns the tokens they hold."""
        table = self.tables.setdefault(seq, [])
        if self.lengths.setdefault(seq, 0) != len(table) * self.block_size:
            raise ValueError(f"sequence {seq} has a partly filled block: it cannot share blocks")
        for block in blocks:
            if self.ref_counts[block] == 0:
                del self.free_blocks[block]  # a hit on a free cached block takes it off the list
            else:
                self.extra_holds += 1
            self.ref_counts[block] += 1
        table += blocks
        self.lengths[seq] = len(table) * self.block_size
        self.events["hit_blocks"] += len(blocks)
        if blocks:
            self.hashed[seq] = (len(table), self.key_of[blocks[-1]])
        return len(blocks) * self.block_size

    def fork(self, seq: int, parent: int, num_tokens: int) -> int | None:
        """`seq` goes on from `parent`'s first `num_tokens` tokens (n replies to one prompt): full
        blocks shared past those it holds; a partly filled last block copied now, as each reply's
        next token lands in it. Returns the block the cache must copy into the new one, or None."""
        table, full = self.tables.setdefault(seq, []), num_tokens // self.block_size
        shared = self.tables[parent][len(table) : full]
        for block in shared:
            self.ref_counts[block] += 1
        table += shared
        self.extra_holds, self.lengths[seq] = self.extra_holds + len(shared), full * self.block_size
        if num_tokens % self.block_size == 0:
            return None
        self.append(seq, num_tokens % self.block_size)
        return self.tables[parent][full]

    def cache_full_blocks(self, seq: int, token_ids: list[int]) -> None:
        """Give keys to `seq`'s blocks that are now full and computed (token_ids: its tokens
        whose keys and values are computed)."""
        if not self.prefix_caching:
            return
        table, (done, key), size = self.tables[seq], self.hashed.get(seq, (0, b"")), self.block_size
        for i in range(done, len(token_ids) // size):
            key = block_key(key, token_ids[i * size : (i + 1) * size])
            self.block_of.setdefault(key, {})[table[i]] = None  # (one more copy, maybe)
            self.key_of[table[i]] = key
            done = i + 1
        self.hashed[seq] = (done, key)

    def free(self, seq: int) -> None:
        """Drop `seq`'s blocks (each freed when nobody holds it), last first: its first blocks, the
        prefix others most likely share, are the last to be handed out again."""
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
        """Keep `seq`'s first `num_tokens` tokens (a lookahead not kept goes); blocks past them are
        free at once. Only tokens past every keyed block (someone's cached prefix) may go."""
        table, length = self.tables[seq], self.lengths[seq]
        keyed = self.hashed.get(seq, (0, b""))[0] * self.block_size
        if not keyed <= num_tokens <= length:
            held = f"sequence {seq} holds {length} tokens ({keyed} keyed)"
            raise ValueError(f"{held}: cannot keep {num_tokens}")
        keep = self.blocks_for(num_tokens)
        self._let_go(table[keep:])
        del table[keep:]
        self.lengths[seq] = num_tokens

    # --- checks ----------------------------------------------------------------------------
    def check(self) -> None:
        """Raise AssertionError if an invariant is broken (tests; the engine's debug mode)."""
        owners = Counter(block for table in self.tables.values() for block in table)
        counts_ok = [owners[b] for b in range(self.num_blocks)] == self.ref_counts
        assert counts_ok, "a block's ref count differs from the number of tables holding it"
        free_ok = all((n == 0) == (b in self.free_blocks) for b, n in enumerate(self.ref_counts))
        assert free_ok, "free list is wrong"
        assert self.num_free + self.num_used == self.num_blocks
        for seq, table in self.tables.items():
            count_ok = len(table) == self.blocks_for(self.lengths[seq])
            assert count_ok, f"sequence {seq} has the wrong number of blocks"
            keyed = any(b in self.key_of for b in table[self.lengths[seq] // self.block_size :])
            assert not keyed, f"sequence {seq}: a partly filled block has a key"
        assert self.extra_holds == sum(max(0, n - 1) for n in self.ref_counts), "extra_holds is off"
        copies = sum(map(len, self.block_of.values()))
        assert len(self.key_of) == copies, "the key table and the blocks' keys disagree"
        pairs = ((k, b) for k, blocks in self.block_of.items() for b in blocks or [None])
        agree = all(self.key_of.get(b) == k for k, b in pairs)
        assert agree, "the key table and the blocks disagree"
        assert self.prefix_caching or not self.key_of, "keys without prefix caching"
        written = self.events["shared_writes"] == 0
        assert written, "tokens were written into a block that is shared or keyed"
