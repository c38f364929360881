"""Lesson 09: prefix caching in the block allocator. Run: pytest -m lesson09

Your allocator keys full blocks by a hash chain, finds the longest cached run of full blocks that leaves
the prompt's last token to compute, takes a cached free block off the free list when a newcomer shares it,
hands out the least recently freed block first and makes it forget its key. Checked on small pools by hand
(keys that must differ: swapped blocks, ids that read alike when joined, ids past a byte, 100,000 random blocks),
under random admissions, growths and frees, then inside the real engine, token for token.

WRONG (below) lists the mistakes a room makes, each caught and named; RIGHT, versions written differently
(Python's hash, nested or flat tuples, text keys, a walk trimmed afterwards, keys kept up per sequence) that must pass.

Then the differential check (tests/lessons/drawn/lesson09.py): your allocator beside the reference on 120 drawn
histories (seeded: the same every run; MINILLM_CHECK_EXAMPLES=N draws N), operation by operation, the smallest that
differs shown first. Its strategies: pools of 2, 3, 4, 6 or 12 blocks of 1, 2 or 4 tokens; up to 14 admissions
(prompts that start like one of three runs of the ids 0, 1 and BOS, 1 token to six blocks long, whole blocks and one
past on purpose), growths by 1 to 6 tokens, each keyed up to the tokens computed (all, or all but a token or a
block's worth: a chunk in flight), and frees on sequences 0 to 3 (free cached blocks hit and evicted). Where a key
has several copies the reference takes the copy you took; then tables, lengths, reference counts, the free list in
its order, the keyed blocks and which share a key must be the reference's, every hit count too. DRAWN_ONLY names the
wrong allocators only the drawn histories catch.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import random
import zlib
from array import array
from pathlib import Path

import pytest

from minillm.config import EngineConfig
from minillm.engine.blocks import BlockAllocator, BlockPoolExhausted, block_key
from minillm.engine.engine import Engine
from minillm.engine.request import Request
from minillm.engine.scheduler import ContinuousScheduler
from minillm.layers import LayeredEngine
from tests.lessons.drawn.lesson09 import check_drawn
from tests.lessons.harness import CHECKS, expected_reply, first_difference, implementations, small_model, student_module

lesson = pytest.mark.lesson09  # your code's checks: pytest -m lesson09

YOURS = ("key", "cached_prefix", "cache_full_blocks", "take_cached", "_take_free", "share_prefix")


class ReferencePrefixAllocator(BlockAllocator):
    """minillm/engine/blocks.py's allocator with prefix caching on, built the way the exercise's is."""

    def __init__(self, num_blocks: int, block_size: int):
        super().__init__(num_blocks, block_size, prefix_caching=True)

    def key(self, previous, token_ids):
        return block_key(previous, token_ids)


def assert_writes_its_own_caching(module) -> None:
    """The exercise's methods are yours: not the parent's (super().cached_prefix(...)) nor minillm's block_key."""
    path = Path(module.__file__)
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module == "minillm.engine.blocks":
            taken = [a.name for a in node.names if a.name not in ("BlockAllocator", "BlockPoolExhausted")]
            assert not taken, (
                f"{path.name}, line {node.lineno}: you import {taken} from minillm.engine.blocks; write it yourself"
            )
        if isinstance(node, ast.Attribute) and node.attr in YOURS + ("block_key",):
            owner = node.value
            borrowed = (isinstance(owner, ast.Call) and getattr(owner.func, "id", "") == "super") or (
                isinstance(owner, ast.Name) and owner.id in ("BlockAllocator", "blocks")
            )
            assert not borrowed, (
                f"{path.name}, line {node.lineno}: {ast.unparse(node)} is the reference's {node.attr}; "
                "write it yourself"
            )


@pytest.fixture(params=implementations(lesson))
def Allocator(request):
    if request.param == "reference":
        return ReferencePrefixAllocator
    module = student_module("lesson09_prefix")
    assert_writes_its_own_caching(module)
    return module.MyPrefixAllocator


# --- helpers: a pool whose blocks remember the tokens written into them ------------------------------
class Pool:
    """An allocator plus what each block holds (what the KV pool would hold), to tell a right hit from a wrong one."""

    def __init__(self, Allocator, num_blocks: int, block_size: int):
        self.alloc, self.bs = Allocator(num_blocks, block_size), block_size
        self.tokens: dict[int, list[int]] = {}  # seq -> its tokens
        self.contents: dict[int, list] = {}  # block -> (position, token) of what was written into each slot

    def admit(self, seq: int, ids: list[int]) -> list[int]:
        """A newcomer: take its cached prefix, store the rest, key its full blocks. Returns the hits."""
        hits = self.alloc.cached_prefix(list(ids))
        self.check_hits(ids, hits, f"admitting sequence {seq}")
        self.alloc.share_prefix(seq, list(hits))
        self.tokens[seq] = list(ids)
        self.alloc.append(seq, len(ids) - len(hits) * self.bs)
        self.write(seq, len(hits) * self.bs)
        self.alloc.cache_full_blocks(seq, list(ids))
        return list(hits)

    def grow(self, seq: int, ids: list[int]) -> None:
        start = len(self.tokens[seq])
        self.alloc.append(seq, len(ids))
        self.tokens[seq] += ids
        self.write(seq, start)
        self.alloc.cache_full_blocks(seq, list(self.tokens[seq]))

    def free(self, seq: int) -> None:
        self.alloc.free(seq)
        self.tokens.pop(seq, None)

    def write(self, seq: int, start: int) -> None:
        for p in range(start, len(self.tokens[seq])):
            block = self.alloc.tables[seq][p // self.bs]
            self.contents.setdefault(block, [None] * self.bs)[p % self.bs] = (p, self.tokens[seq][p])

    def check_hits(self, ids: list[int], hits: list[int], where: str) -> None:
        bs = self.bs
        assert len(hits) * bs < len(ids), (
            f"{where}: a prompt of {len(ids)} tokens got {len(hits)} cached blocks of {bs} = all of it. Leave at "
            "least its last token to compute: the model must run it to produce the first reply token"
        )
        for i, block in enumerate(hits):
            wanted, held = [(p, ids[p]) for p in range(i * bs, (i + 1) * bs)], self.contents.get(block)
            assert held == wanted, (
                f"{where}: the prompt's block {i} is tokens {ids[i * bs : (i + 1) * bs]} at positions "
                f"{i * bs}..{(i + 1) * bs - 1}, but the cached block you matched (block {block}) holds "
                f"{describe(held)}. "
                f"{why_wrong_hit(self.alloc, held, wanted)}"
            )

    def check(self, where: str) -> None:
        try:
            self.alloc.check()
        except (AssertionError, TypeError) as e:  # (TypeError: self.block_of holds something else than dicts)
            raise AssertionError(
                f"{where}: the allocator's books are broken: {e}. {why_broken(self, str(e))}"
            ) from None


def describe(held) -> str:
    if not held or None in held:
        return f"{held} (not a full block)"
    return f"tokens {[t for _, t in held]} at positions {held[0][0]}..{held[-1][0]}"


def why_wrong_hit(alloc, held, wanted) -> str:
    if held and None not in held and [t for _, t in held] == [t for _, t in wanted]:
        return (
            "The same tokens, but computed after different tokens: a token's keys and values depend on every "
            "token before it, so a block's key must chain its predecessor's key"
        )
    if held and None not in held and alloc.key(b"", [t for _, t in held]) == alloc.key(b"", [t for _, t in wanted]):
        return (
            "Your key gives those two different blocks the same key (after the same predecessor), so one answers "
            "for the other: see the checks of key()"
        )
    return (
        "That block was handed to someone else and overwritten, yet still answers for its old key: a block the "
        "free list hands out must lose its key"
    )


def why_broken(pool: Pool, error: str) -> str:
    alloc = pool.alloc
    if any(not isinstance(blocks, dict) for blocks in alloc.block_of.values()):
        return (
            "self.block_of maps a key to the blocks holding its tokens, {block: None, ...}: a dict, even when there "
            "is one block"
        )
    if "partly filled" in error:
        return "Only full blocks get a key: a partly filled block's owner still writes into it"
    if "free list" in error:
        return "A hit on a free cached block must take it off the free list (take_cached), or it is handed out twice"
    stale = sorted(b for k, blocks in alloc.block_of.items() for b in blocks if alloc.key_of.get(b) != k)
    if stale:
        return (
            f"self.block_of still lists block(s) {stale} under an old key, but they now hold other tokens: a block the "
            "free list hands out must lose its key, in self.block_of and in self.key_of"
        )
    unlisted = sorted(b for b, k in alloc.key_of.items() if b not in alloc.block_of.get(k, {}))
    if unlisted:
        return (
            f"block(s) {unlisted} have a key in self.key_of that self.block_of does not list them under: a block "
            "handed out takes only its own place out of its key's blocks (another copy keeps the key)"
        )
    if not all(alloc.block_of.values()):
        return "a key whose last block was handed out must leave self.block_of too"
    return "see check() in minillm/engine/blocks.py"


def seq_tokens(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(256) for _ in range(n)]


# --- the checks ---------------------------------------------------------------------------------------
def check_key(Allocator) -> None:
    """key(previous, tokens): the same inputs, the same key; different tokens or a different predecessor, another."""
    alloc = Allocator(4, 4)
    a, b = [1, 2, 3, 4], [1, 2, 3, 5]
    first = alloc.key(b"", a)
    try:
        hash(first)
    except TypeError:
        raise AssertionError(f"key() returned {type(first).__name__}, which cannot be a dict key") from None
    assert alloc.key(b"", list(a)) == first, "key() gave two different keys for the same predecessor and tokens"
    assert alloc.key(b"", b) != first, f"key() gave {a} and {b} the same key: different tokens need different keys"
    after_a, after_b = alloc.key(first, a), alloc.key(alloc.key(b"", b), a)
    assert after_a != first and after_a != after_b, (
        f"key() gave the tokens {a} the same key whatever came before them: a token's keys and values depend on "
        "every token before it, so a block's key must chain its predecessor's key"
    )


def chain_key(alloc, blocks: tuple, situation: str, why: str):
    """The key of the last of `blocks`, chained from b"" the way cached_prefix chains a prompt's blocks."""
    key = b""
    for ids in blocks:
        try:
            key = alloc.key(key, list(ids))
        except NotImplementedError:
            raise
        except Exception as e:  # e.g. bytes(token_ids) meets BOS (257)
            raise AssertionError(f"{situation}: key(..., {list(ids)}) raised {e!r}. {why}") from None
    return key


def chained(blocks: tuple) -> str:
    return " then ".join(map(str, blocks))


KEY_PAIRS = {  # situation: (two chains of blocks that hold different tokens, why a key would confuse them)
    "two blocks in swapped order": (
        ([1, 2, 3, 4], [5, 6, 7, 8]),
        ([5, 6, 7, 8], [1, 2, 3, 4]),
        "A symmetric combination of the predecessor's key and the block's (a + b, a ^ b) cannot tell A then B from "
        "B then A: hash the two together, in order (sha256(previous + the tokens' bytes), hash((previous, tokens)))",
    ),
    "token ids joined without a separator": (
        ([1, 23, 4, 5],),
        ([12, 3, 4, 5],),
        "Written side by side, 1 and 23 read as 12 and 3: put a separator between the ids, or hash their bytes "
        "(array('q', ids).tobytes()) or a tuple of them",
    ),
    "blocks joined without a separator": (
        ([1, 2, 3, 4], [56, 7, 8, 9]),
        ([1, 2, 3, 45], [6, 7, 8, 9]),
        "The predecessor's key and the block's ids run together (4 + 56 reads as 45 + 6): keep them apart, with a "
        "separator, a tuple (previous, tuple(ids)), or a fixed-size digest as the predecessor",
    ),
    "token ids of 256 and above": (
        ([257, 2, 3, 4],),
        ([1, 2, 3, 4],),
        "Token ids go past a byte (PAD 256, BOS 257, EOS 258, SEP 259): bytes(t % 256 ...) or uint8 wraps BOS into 1, "
        "bytes(ids) refuses it. Hash 8 bytes per id (array('q', ids).tobytes()) or a tuple of the ids",
    ),
}


def check_keys_tell_blocks_apart(Allocator) -> None:
    """Different tokens from the start must give different keys, however a key is written out."""
    alloc = Allocator(4, 4)
    for situation, (first, second, why) in KEY_PAIRS.items():
        a, b = chain_key(alloc, first, situation, why), chain_key(alloc, second, situation, why)
        assert a != b, f"{situation}: {chained(first)} and {chained(second)} got the same key {a!r}. {why}"


# A 32-bit key repeats among this many random blocks 2 times in 3; one that is an int, bytes or digits of 32 bits
# is caught always (fits_in_32_bits).
RANDOM_BLOCKS = 100_000
WEAK = (
    "A 32-bit key (zlib.crc32, hash(...) & 0xFFFFFFFF, 4 bytes of a digest) repeats after about 77,000 blocks, which "
    "a server meets in minutes, and a repeated key hands one prompt another's keys and values: use the whole sha256 "
    "digest, or Python's hash of a tuple (64 bits)"
)


def fits_in_32_bits(key) -> bool:
    """A key with at most 2**32 values: an int of 32 bits, 4 bytes, or a string of 8 hex digits or of a 32-bit int."""
    if isinstance(key, int):
        return -(2**31) <= key < 2**32
    if isinstance(key, (bytes, bytearray)):
        return len(key) <= 4
    if isinstance(key, str):
        digits = key.strip().lstrip("-")
        hexadecimal = len(digits) <= 8 and all(c in "0123456789abcdefABCDEF" for c in digits)
        return hexadecimal or (digits.isdigit() and int(digits) < 2**32)
    return False


@functools.cache
def random_bytes() -> bytes:
    return random.Random(9).randbytes(RANDOM_BLOCKS * 8)  # blocks of 8 tokens


def check_key_strength(Allocator) -> None:
    """A key collision is a false hit, another prompt's keys and values: many random blocks, no two keys equal."""
    alloc, data, seen = Allocator(4, 8), random_bytes(), {}
    for start in range(0, len(data), 8):
        first = seen.setdefault(alloc.key(b"", list(data[start : start + 8])), start)
        assert first == start or data[first : first + 8] == data[start : start + 8], (
            f"a weak key: among {start // 8 + 1} random blocks of 8 tokens, {list(data[first : first + 8])} and "
            f"{list(data[start : start + 8])} got the same key. {WEAK}"
        )
        if start == 8 * 999:  # (1000 keys of 64 bits all fit in 32 once in 2**32000)
            assert not all(map(fits_in_32_bits, seen)), (
                f"a weak key: your keys fit in 32 bits (for 1000 random blocks, e.g. {next(iter(seen))!r}). {WEAK}"
            )


def check_chain(Allocator) -> None:
    """The same tokens after a different beginning are a different block."""
    pool = Pool(Allocator, 16, 4)
    first = seq_tokens(17, 1)  # 4 full blocks and a token
    pool.admit(0, first)
    pool.check("after admitting a 17-token sequence")
    same_start = first[:8] + seq_tokens(5, 2)
    hits = pool.alloc.cached_prefix(same_start)
    pool.check_hits(same_start, hits, "a prompt sharing the first 8 tokens")
    assert hits == pool.alloc.tables[0][:2], (
        f"a prompt whose first 8 tokens (2 blocks of 4) are sequence 0's should get sequence 0's first 2 blocks "
        f"{pool.alloc.tables[0][:2]}, got {hits}"
    )
    shifted = first[4:12] + seq_tokens(3, 3)  # starts with sequence 0's second block's tokens
    hits = pool.alloc.cached_prefix(shifted)
    pool.check_hits(shifted, hits, "a prompt starting with the tokens of sequence 0's block 1")
    assert hits == [], f"a prompt starting with tokens 4..11 of sequence 0 must get no hit, got {hits}"


def check_full_blocks_only(Allocator) -> None:
    pool = Pool(Allocator, 16, 4)
    ids = seq_tokens(10, 4)
    pool.admit(0, ids)
    pool.check("after admitting a 10-token sequence (2 full blocks of 4, one with 2 tokens)")
    table = pool.alloc.tables[0]
    keyed = [b for b in table if b in pool.alloc.key_of]
    assert keyed == table[:2], (
        f"after admitting 10 tokens in blocks of 4, its full blocks {table[:2]} should have keys and the partly "
        f"filled {table[2]} none; keyed: {keyed}"
    )
    longer = ids + seq_tokens(3, 5)
    hits = pool.alloc.cached_prefix(longer)
    pool.check_hits(longer, hits, "a prompt extending that sequence")
    assert hits == table[:2], f"only the 2 full blocks {table[:2]} may be shared, got {hits}"
    pool.grow(0, seq_tokens(2, 6))
    pool.check("after the sequence grew to 12 tokens")
    assert all(b in pool.alloc.key_of for b in table[:3]), (
        f"at 12 tokens the sequence's third block {table[2]} is full: cache_full_blocks must key it now"
    )


def computed_side_by_side(pool: Pool, ids: list[int], seqs=(1, 2)) -> None:
    """Two sequences compute the same tokens in the same step: neither found them cached."""
    for seq in seqs:
        pool.alloc.append(seq, len(ids))
        pool.tokens[seq] = list(ids)
        pool.write(seq, 0)
    for seq in seqs:
        pool.alloc.cache_full_blocks(seq, list(ids))


def check_second_copy(Allocator) -> None:
    """The same full blocks computed twice side by side: both copies keyed, and the tokens stay cached after
    one copy is handed out for other tokens."""
    pool = Pool(Allocator, 7, 4)
    both = seq_tokens(9, 7)
    computed_side_by_side(pool, both)
    pool.check("after two sequences computed the same 9 tokens side by side")
    first, second = pool.alloc.tables[1][:2], pool.alloc.tables[2][:2]
    unkeyed = [b for b in first + second if b not in pool.alloc.key_of]
    assert not unkeyed, (
        f"sequences 1 and 2 computed the same 2 full blocks side by side ({first} and {second}); {unkeyed} got no "
        "key: key them too, a second copy under the same key, so the tokens stay cached while either copy does"
    )
    again = both[:8] + [5]
    before = pool.alloc.cached_prefix(again)
    assert len(before) == 2, (
        f"the 8 tokens of 2 full cached blocks plus one more: both blocks can be shared (a token follows them), "
        f"but the cache found {before}"
    )
    pool.free(1)
    pool.admit(3, seq_tokens(16, 17))  # 4 blocks: the one never used and sequence 1's three
    pool.check("after sequence 1's blocks were handed out for other tokens")
    hits = pool.alloc.cached_prefix(again)
    pool.check_hits(again, hits, "the same 8 tokens again, after one copy was overwritten")
    assert hits == second, (
        f"sequence 2 still holds a copy of those 2 blocks ({second}), yet the cache found {hits}: a block handed "
        "out takes only its own place out of its key's blocks (another copy keeps the key)"
    )


def check_last_token(Allocator) -> None:
    pool = Pool(Allocator, 16, 4)
    ids = seq_tokens(12, 8)
    pool.admit(0, ids)
    hits = pool.alloc.cached_prefix(ids)
    pool.check_hits(ids, hits, "the same 12-token prompt again (3 full cached blocks)")
    assert len(hits) == 2, f"the same 12-token prompt again: 2 cached blocks, the last block computed; got {hits}"
    hits = pool.alloc.cached_prefix(ids + [7])
    assert len(hits) == 3, f"those 12 tokens plus one more: all 3 blocks can be shared, got {hits}"


def check_miss_in_a_whole_block_prompt(Allocator) -> None:
    """A run of hits that stops on a miss has left the last token to compute already: nothing more to take off."""
    pool = Pool(Allocator, 16, 4)
    ids = seq_tokens(12, 18)
    pool.admit(0, ids)
    prompt = ids[:8] + seq_tokens(4, 19)  # 3 whole blocks: the first 2 cached, the third not
    hits = pool.alloc.cached_prefix(list(prompt))
    pool.check_hits(prompt, hits, "a 12-token prompt whose first 2 blocks are cached")
    expected = pool.alloc.tables[0][:2]
    assert hits == expected, (
        f"a run that stops on a miss, in a prompt of whole blocks: a 12-token prompt (3 blocks of 4) whose first 2 "
        f"blocks are cached and whose third is not should get those 2 blocks {expected}, got {hits}. The last token "
        "is left to compute already when the run stops on a miss: leave a block out only when every block of the "
        "prompt is cached"
    )


def check_reused_sequence_id(Allocator) -> None:
    """The engine's sequence ids are its seats: one is freed and given to the next request all the time."""
    pool = Pool(Allocator, 16, 4)
    first, second = seq_tokens(12, 20), seq_tokens(12, 21)
    pool.admit(0, first)
    pool.free(0)
    pool.admit(0, second)
    pool.check("after sequence 0 was freed and its id given to another prompt")
    table = pool.alloc.tables[0]
    keyed = [b for b in table if b in pool.alloc.key_of]
    hits = pool.alloc.cached_prefix(second + [5])
    pool.check_hits(second + [5], hits, "the second prompt again, plus a token")
    assert keyed == table and hits == table, (
        f"a sequence id used again: sequence 0 (12 tokens) was freed and its id given to another 12-token prompt, "
        f"whose 3 full blocks {table} should have keys and be found again; keyed {keyed}, found {hits}. What you "
        "remember per sequence id (how far its blocks are keyed, the last key) must not outlive the sequence: "
        "free(seq) ends it"
    )


def check_arguments_left_alone(Allocator) -> None:
    """The engine's scheduler hands the same list of a request's tokens to one call after another."""
    pool = Pool(Allocator, 16, 4)
    ids = seq_tokens(13, 22)
    pool.admit(0, ids)
    alloc = pool.alloc
    calls = {
        "key(b'', tokens)": (lambda tokens: alloc.key(b"", tokens), ids[:4]),
        "cached_prefix(tokens)": (alloc.cached_prefix, ids + [3]),
        "cache_full_blocks(0, tokens)": (lambda tokens: alloc.cache_full_blocks(0, tokens), ids),
    }
    for name, (method, tokens) in calls.items():
        given = list(tokens)
        method(given)
        assert given == tokens, (
            f"a side effect: {name} changed the list of token ids it was given, from {tokens} to {given}. The "
            "scheduler passes the same list to the next call, and a request's tokens are not yours to cut: work on "
            "a slice (token_ids[:-1]) or a count, not on the list"
        )


def check_hit_on_a_free_block(Allocator) -> None:
    pool = Pool(Allocator, 6, 4)
    ids = seq_tokens(9, 9)
    pool.admit(0, ids)
    pool.free(0)
    pool.check("after sequence 0 (9 tokens) was freed")
    hits = pool.admit(1, ids[:8] + [3])
    assert len(hits) == 2, f"sequence 0's 2 full blocks stay cached after it is freed: expected 2 hits, got {hits}"
    on_list = [b for b in hits if b in pool.alloc.free_blocks]
    assert not on_list, (
        f"sequence 1 took the cached blocks {hits}, but {on_list} stayed on the free list: a hit on a free cached "
        "block must take it off the free list (take_cached), or the next append hands it to someone else"
    )
    assert all(pool.alloc.ref_counts[b] == 1 for b in hits), (
        f"each shared block now has one holder: ref counts {[pool.alloc.ref_counts[b] for b in hits]}"
    )
    pool.check("after sequence 1 took the cached blocks")
    pool.admit(2, seq_tokens(12, 10))  # the 3 blocks left
    twice = set(pool.alloc.tables[1]) & set(pool.alloc.tables[2])
    assert not twice, f"blocks {sorted(twice)} are in two sequences' tables: handed out while held"


def check_least_recently_freed(Allocator) -> None:
    pool = Pool(Allocator, 8, 4)
    a, b = seq_tokens(9, 11), seq_tokens(9, 12)
    pool.admit("A", a)
    pool.admit("B", b)
    pool.free("A")
    pool.free("B")  # B is the more recently freed: its prefix is the one to keep
    order = list(pool.alloc.free_blocks)
    pool.admit("C", seq_tokens(16, 13))
    given, expected = pool.alloc.tables["C"], order[:4]
    assert given == expected, (
        f"the free list, least recently freed first, was {order} (A was freed before B); a 16-token sequence "
        f"takes 4 blocks from its front: {expected}. You handed out {given}: evict the least recently freed first"
    )
    pool.check("after the 16-token sequence took its blocks")
    hits = pool.alloc.cached_prefix(b[:8] + [1])
    assert len(hits) == 2, f"B was freed last, so its 2 cached blocks must still be there; found {hits}"


def check_reuse_forgets_the_key(Allocator) -> None:
    pool = Pool(Allocator, 4, 4)
    a = seq_tokens(9, 14)
    pool.admit("A", a)
    pool.free("A")
    pool.admit("B", seq_tokens(15, 15))  # takes every block, A's too
    hits = pool.alloc.cached_prefix(a[:8] + [2])
    pool.check_hits(a[:8] + [2], hits, "A's prompt again, after B took every block")
    pool.check("after B reused A's blocks")


def check_random_operations(Allocator) -> None:
    """200 short seeded runs of admissions, growths and frees on small pools: after every operation the books
    hold, every hit holds exactly the tokens asked for, and a full pool raises and changes nothing."""
    rng = random.Random(0)
    for run in range(200):
        num_blocks, bs = rng.randint(3, 14), rng.choice([1, 2, 4])
        pool, done = Pool(Allocator, num_blocks, bs), []
        starts = [[rng.randrange(3) for _ in range(24)] for _ in range(3)]  # few distinct starts: many hits
        for _ in range(rng.randint(1, 14)):
            op, seq, n = rng.choice(["admit", "admit", "grow", "free"]), rng.randint(0, 3), rng.randint(1, 12)
            where = f"run {run} ({num_blocks} blocks of {bs}), after {', '.join(done + [f'{op} {seq} ({n})'])}"
            try:
                if op == "admit" and seq not in pool.alloc.tables:
                    pool.admit(seq, starts[seq % 3][: n + 1])
                elif op == "grow" and seq in pool.alloc.tables:
                    pool.grow(seq, [rng.randrange(3) for _ in range(n)])
                elif op == "free":
                    pool.free(seq)
            except BlockPoolExhausted:
                if op == "admit" and seq in pool.alloc.tables:
                    pool.free(seq)  # (a newcomer that did not fit gives back what it shared)
            except AssertionError as e:
                raise AssertionError(f"{where}: {e}") from None
            done.append(f"{op} {seq} ({n})")
            pool.check(where)


def shared_prefix_crowd(n: int = 14, seed: int = 3) -> list[Request]:
    """Two long shared beginnings (31 and 46 tokens), short different endings, arriving over 40 steps; and the
    same 32-token prompt (8 full blocks of 4) twice, the second time when all of it is cached."""
    rng = random.Random(seed)
    starts = [[257] + [rng.randrange(256) for _ in range(k)] for k in (30, 45)]
    crowd = [
        Request(f"r{i}", starts[i % 2] + [rng.randrange(256) for _ in range(rng.randint(1, 9))],
                rng.randint(2, 12), arrival_step=rng.randint(0, 40), ignore_eos=True)
        for i in range(n)
    ]  # fmt: skip
    again = starts[0] + [7]
    return crowd + [Request(f"same{i}", again, 3, arrival_step=step, ignore_eos=True) for i, step in enumerate((2, 9))]


ENGINE_RUNS = {"chunked, tight pool": dict(budget=7, num_blocks=30), "whole prompts": dict(budget=0, num_blocks=None)}


def check_engine(Allocator, budget: int, num_blocks: int | None) -> Engine:
    """A crowd sharing two system prompts, through the real engine with your allocator in the paged cache:
    token-exact replies, books intact after every step, the cache actually used."""
    model, requests = small_model("gqa"), shared_prefix_crowd()
    cfg = EngineConfig(slots=4, kv="paged", block_size=4, num_blocks=num_blocks, prefix_caching=True,
                       max_len=model.cfg.max_seq_len)  # fmt: skip
    engine = LayeredEngine(model, ContinuousScheduler(token_budget=budget), cfg)
    engine.cache.allocator = Allocator(engine.cache.num_blocks, 4)
    for r in requests:
        engine.submit(r)
    while engine.has_work() and engine.step_no < 1000:
        engine.step()
        try:
            engine.cache.allocator.check()
        except AssertionError as e:
            raise AssertionError(f"engine step {engine.step_no - 1}: the allocator's books are broken: {e}") from None
    stuck = [f"{r.id} ({r.num_pending} tokens to run)" for r in requests if not r.is_finished]
    assert not stuck, (
        f"after {engine.step_no} steps these never finished: {', '.join(stuck)}; a request whose whole prompt came "
        "from the cache has no token left to run, so it never produces one"
    )
    for r in requests:
        expected = expected_reply(model, tuple(r.prompt_ids), r.max_new_tokens, r.ignore_eos)
        assert r.output_ids == expected, (
            f"{r.id} (served {r.prompt_tokens_from_cache} prompt tokens from the cache): its reply differs from the "
            f"plain loop's, {first_difference(expected, r.output_ids)}: a hit gave it keys and values of other tokens"
        )
    assert sum(r.prompt_tokens_from_cache for r in requests) > 0, "no prompt token was ever served from the cache"
    assert engine.cache.free_blocks == engine.cache.num_blocks, "KV blocks are still held after the run"
    return engine


def check_drawn_histories(Allocator) -> None:
    check_drawn(Allocator, ReferencePrefixAllocator)


def check_cases(Allocator, key_strength=check_key_strength) -> None:
    for check in CHECKS_IN_ORDER.values():
        (key_strength if check is check_key_strength else check)(Allocator)
    for run in ENGINE_RUNS.values():
        check_engine(Allocator, **run)


def check_all(Allocator, key_strength=check_key_strength) -> None:
    check_cases(Allocator, key_strength)
    check_drawn_histories(Allocator)


CHECKS_IN_ORDER = {
    "a block's key": check_key,
    "keys tell blocks apart": check_keys_tell_blocks_apart,
    "no two of many random blocks share a key": check_key_strength,
    "the token lists passed in are left alone": check_arguments_left_alone,
    "no false hit after a different beginning": check_chain,
    "only full blocks get a key": check_full_blocks_only,
    "a second copy keeps the tokens cached": check_second_copy,
    "the last token is left to compute": check_last_token,
    "a run that stops on a miss keeps its hits": check_miss_in_a_whole_block_prompt,
    "a sequence id used again": check_reused_sequence_id,
    "a hit on a free cached block takes it off the free list": check_hit_on_a_free_block,
    "the least recently freed block goes first": check_least_recently_freed,
    "a reused block forgets its key": check_reuse_forgets_the_key,
    "random admissions, growths and frees": check_random_operations,
}


@pytest.mark.parametrize("name", CHECKS_IN_ORDER)
def test_the_allocator(Allocator, name):
    CHECKS_IN_ORDER[name](Allocator)


@pytest.mark.parametrize("run", ENGINE_RUNS)
def test_the_real_engine_serves_shared_prompts_token_exact(Allocator, run):
    check_engine(Allocator, **ENGINE_RUNS[run])


def test_the_allocator_keeps_the_references_books_on_drawn_histories(Allocator):
    check_drawn_histories(Allocator)


# --- the checks catch plausible mistakes ------------------------------------------------------------
class Written(BlockAllocator):
    """The exercise written out, with switches for the mistakes below."""

    def __init__(self, num_blocks, block_size, chain=True, partial=False, whole=False, off_list=True, newest=False,
                 forget=True, first_only=False, every_copy=False, keys="sha256", last_block=False, holders="add",
                 forget_one_book=False, trim=None, pops=False, progress=None, full_by="computed"):  # fmt: skip
        super().__init__(num_blocks, block_size, prefix_caching=True)
        self.chain, self.partial, self.whole, self.off_list = chain, partial, whole, off_list
        self.newest, self.forget, self.first_only, self.every_copy = newest, forget, first_only, every_copy
        self.keys, self.last_block, self.holders, self.forget_one_book = keys, last_block, holders, forget_one_book
        self.trim, self.pops, self.progress, self.full_by = trim, pops, progress, full_by
        self.keyed_so_far = {}  # (progress) seq -> (its leading blocks keyed, the last one's key)

    def key(self, previous, token_ids):
        head = previous if self.chain else b""  # without its predecessor (wrong)
        if self.keys == "hash":  # Python's hash of a tuple: right too
            return hash((head, tuple(token_ids)))
        if self.keys == "tuple":  # the chain itself as nested tuples: right too
            return (head, tuple(token_ids))
        if self.keys == "flat":  # every token from the start, in one tuple: right too
            return (*head, *token_ids)
        if self.keys == "text":  # the chain as text, a separator between ids and between blocks: right too
            return f"{head}|{','.join(map(str, token_ids))}"
        if self.keys == "xor":  # a symmetric combination (wrong)
            return hash(head) ^ hash(tuple(token_ids))
        if self.keys == "digits":  # the ids' digits run together: [1, 23] reads as [12, 3] (wrong)
            return hashlib.sha256(head + "".join(map(str, token_ids)).encode()).digest()
        if self.keys == "joined":  # the chain as text, no separator between blocks (wrong)
            return (head or "") + ",".join(map(str, token_ids))
        if self.keys == "wrapped":  # ids wrapped into bytes: BOS (257) reads as 1 (wrong)
            return hashlib.sha256(head + bytes(t % 256 for t in token_ids)).digest()
        if self.keys == "crc32":  # a 32-bit key, chained through crc32's running value (wrong)
            return zlib.crc32(array("q", token_ids).tobytes(), head or 0)
        if self.keys == "crc32-pairs":  # nested tuples kept small with a 32-bit checksum of each block (wrong)
            return (head, zlib.crc32(array("q", token_ids).tobytes()))
        return hashlib.sha256(head + array("q", token_ids).tobytes()).digest()

    def cached_prefix(self, token_ids):
        bs = self.block_size
        if self.pops:  # leaves the last token out by cutting the caller's list (wrong)
            token_ids.pop()
        usable = len(token_ids) if self.whole or self.pops or self.trim else len(token_ids) - 1  # whole: wrong
        count = -(-usable // bs) if self.partial else usable // bs  # a partly filled tail block too (wrong)
        if self.last_block:  # always leaves the last full block to compute, even when a token follows it (wrong)
            count = max(0, len(token_ids) // bs - 1)
        blocks, key = [], b""
        for i in range(count):
            key = self.key(key, token_ids[i * bs : (i + 1) * bs])
            if key not in self.block_of:
                break
            blocks.append(next(iter(self.block_of[key])))
        if self.trim == "matched-all" and len(blocks) * bs == len(token_ids):  # right too
            blocks.pop()
        if self.trim == "whole-blocks" and blocks and len(token_ids) % bs == 0:  # even after a miss (wrong)
            blocks.pop()
        return blocks

    def cache_full_blocks(self, seq, token_ids):
        bs, table, key = self.block_size, self.tables[seq], b""
        count = -(-len(token_ids) // bs) if self.partial else len(token_ids) // bs
        if self.full_by == "length":  # the blocks its stored tokens fill, computed or not (wrong: a chunk in flight)
            count = self.lengths[seq] // bs
        done, key = self.keyed_so_far.get(seq, (0, b"")) if self.progress else (0, b"")  # (go on where it stopped)
        for i in range(done, count):
            key = self.key(key, token_ids[i * bs : (i + 1) * bs])
            if key in self.block_of and self.first_only:  # leaves a second copy unkeyed (wrong)
                continue
            self.block_of.setdefault(key, {})[table[i]] = None
            self.key_of[table[i]] = key
        self.keyed_so_far[seq] = (max(done, count), key)

    def free(self, seq):
        if self.progress == "forgotten-on-free":  # right; "kept" remembers a freed sequence's progress (wrong)
            self.keyed_so_far.pop(seq, None)
        super().free(seq)

    def take_cached(self, block):
        if self.ref_counts[block] == 0 and self.off_list:
            del self.free_blocks[block]
        self.ref_counts[block] = 1 if self.holders == "one" else self.ref_counts[block] + 1  # one: wrong

    def _take_free(self):
        block, _ = self.free_blocks.popitem(last=self.newest)  # last=True: the most recently freed (wrong)
        key = self.key_of.pop(block, None)
        if key is not None and self.forget and self.every_copy:
            del self.block_of[key]  # every copy of the key forgotten, not only this block (wrong)
        elif key is not None and self.forget and self.forget_one_book:
            pass  # out of key_of, still listed in block_of (wrong)
        elif key is not None and self.forget:
            del self.block_of[key][block]
            if not self.block_of[key]:
                del self.block_of[key]
        elif key is not None:
            self.key_of[block] = key  # keeps its old key (wrong)
        return block

    def share_prefix(self, seq, blocks):
        table = self.tables.setdefault(seq, [])
        for block in blocks:
            self.extra_holds += self.ref_counts[block] > 0
            self.take_cached(block)
        table += blocks
        self.lengths[seq] = len(table) * self.block_size
        return len(blocks) * self.block_size


def written(**mistake):
    return lambda num_blocks, block_size: Written(num_blocks, block_size, **mistake)


@functools.cache
def written_keys_are_strong(keys: str, chain: bool) -> None:
    check_key_strength(written(keys=keys, chain=chain))


def check_written(**switches) -> None:
    """check_all on a version below; its key function's 100,000 random blocks are tried once per session (a weak
    one fails every time: a raise is not cached)."""
    once = lambda _: written_keys_are_strong(switches.get("keys", "sha256"), switches.get("chain", True))
    check_all(written(**switches), key_strength=once)


WRONG = {
    "key-without-the-predecessor": (dict(chain=False), "must chain its predecessor"),
    "keys-and-matches-a-partly-filled-block": (dict(partial=True), "a partly filled block's owner still writes"),
    "matches-the-whole-prompt": (dict(whole=True), "Leave at least its last token"),
    "hit-on-a-free-block-stays-on-the-free-list": (dict(off_list=False), "must take it off the free list"),
    "evicts-the-most-recently-freed": (dict(newest=True), "evict the least recently freed first"),
    "reused-block-keeps-its-old-key": (dict(forget=False), "must lose its key"),
    "leaves-a-second-copy-unkeyed": (dict(first_only=True), "key them too"),
    "forgets-every-copy-when-one-is-handed-out": (dict(every_copy=True), "takes only its own place out"),
    "always-leaves-the-last-full-block": (dict(last_block=True), "can be shared"),
    "a-shared-block-has-one-holder": (dict(holders="one"), "ref count"),
    "a-reused-block-leaves-key_of-but-not-block_of": (dict(forget_one_book=True), "still lists block"),
    # caught by a check that names the situation in its first line (SITUATION_FIRST)
    "xor-of-the-two-hashes": (dict(keys="xor"), "two blocks in swapped order"),
    "ids-joined-without-a-separator": (dict(keys="digits"), "token ids joined without a separator"),
    "the-chain-as-text-without-a-separator": (dict(keys="joined"), "blocks joined without a separator"),
    "ids-wrapped-into-bytes": (dict(keys="wrapped"), "token ids of 256 and above"),
    "a-32-bit-crc32-key": (dict(keys="crc32"), "a weak key"),
    "nested-tuples-of-32-bit-checksums": (dict(keys="crc32-pairs"), "a weak key"),
    "drops-a-hit-from-every-whole-block-prompt": (dict(trim="whole-blocks"), "a run that stops on a miss"),
    "remembers-a-freed-sequences-progress": (dict(progress="kept"), "a sequence id used again"),
    "cuts-the-last-token-off-the-callers-list": (dict(pops=True), "a side effect: cached_prefix"),
    # right on every hand-built check and engine run (each keys a sequence's blocks once all its stored tokens are
    # computed); the drawn histories catch it, keying a block whose tokens are stored but not computed yet
    "keys-the-blocks-its-length-fills": (dict(full_by="length"), "with a pool of"),  # (its situation first)
}
DRAWN_ONLY = ["keys-the-blocks-its-length-fills"]  # only the drawn histories catch these
RIGHT = {
    "sha256-keys": dict(),
    "python-hash-keys": dict(keys="hash"),
    "nested-tuple-keys": dict(keys="tuple"),
    "flat-tuple-of-every-token-keys": dict(keys="flat"),
    "text-keys-with-separators": dict(keys="text"),
    "walks-every-full-block-then-leaves-one-if-all-matched": dict(trim="matched-all"),
    "keys-where-it-stopped-and-forgets-on-free": dict(progress="forgotten-on-free"),
    "python-hash-keys-walked-then-trimmed": dict(keys="hash", trim="matched-all", progress="forgotten-on-free"),
}


@CHECKS
@pytest.mark.parametrize("right", RIGHT.values(), ids=RIGHT.keys())
def test_a_correct_version_passes(right):
    check_written(**right)


SITUATION_FIRST = list(WRONG)[list(WRONG).index("xor-of-the-two-hashes") :]


@CHECKS
@pytest.mark.parametrize("name", WRONG)
def test_the_checks_catch_a_wrong_allocator_and_name_the_mistake(name):
    mistake, hint = WRONG[name]
    with pytest.raises(AssertionError, match=hint) as caught:
        check_written(**mistake)
    if name in SITUATION_FIRST:  # a student sees the first lines: the situation comes first
        assert str(caught.value).startswith(hint), str(caught.value)


@CHECKS
@pytest.mark.parametrize("name", DRAWN_ONLY)
def test_the_drawn_histories_catch_what_the_cases_miss(name):
    mistake, hint = WRONG[name]
    once = lambda _: written_keys_are_strong(mistake.get("keys", "sha256"), mistake.get("chain", True))  # noqa: E731
    check_cases(written(**mistake), key_strength=once)  # every hand-built check and engine run passes it
    with pytest.raises(AssertionError, match=hint):
        check_drawn_histories(written(**mistake))


@CHECKS
def test_the_stub_is_rejected():
    from lessons.exercises import lesson09_prefix

    with pytest.raises(NotImplementedError):
        check_all(lesson09_prefix.MyPrefixAllocator)


@CHECKS
@pytest.mark.parametrize(
    "source",
    [
        "from minillm.engine.blocks import BlockAllocator, block_key\n",
        "from minillm.engine.blocks import BlockAllocator\nclass A(BlockAllocator):\n"
        "    def cached_prefix(self, ids):\n        return super().cached_prefix(ids)\n",
        "from minillm.engine.blocks import BlockAllocator\nclass A(BlockAllocator):\n"
        "    def _take_free(self):\n        return BlockAllocator._take_free(self)\n",
    ],
)
def test_the_reference_methods_are_refused(source, tmp_path):
    path = tmp_path / "borrowed.py"
    path.write_text(source)
    module = type("Module", (), {"__file__": str(path)})
    with pytest.raises(AssertionError, match="write it yourself"):
        assert_writes_its_own_caching(module)


@CHECKS
def test_your_own_file_passes_the_borrowing_check():
    from lessons.exercises import lesson09_prefix

    assert_writes_its_own_caching(lesson09_prefix)


# Wrong versions that also give wrong replies or broken books in the engine run, not only in the checks above.
CAUGHT_IN_THE_ENGINE = [
    "keys-and-matches-a-partly-filled-block",
    "matches-the-whole-prompt",
    "hit-on-a-free-block-stays-on-the-free-list",
    "reused-block-keeps-its-old-key",
]


@CHECKS
def test_the_tight_engine_run_evicts_cached_blocks():
    engine = check_engine(ReferencePrefixAllocator, **ENGINE_RUNS["chunked, tight pool"])
    events = engine.cache.allocator.events  # (the reference allocator counts what happens to its cache)
    assert events["evicted_keyed"] > 0 and events["hit_blocks"] > 0 and events["shared_writes"] == 0


@CHECKS
@pytest.mark.parametrize("name", CAUGHT_IN_THE_ENGINE)
def test_the_engine_run_alone_catches_a_wrong_allocator(name):
    with pytest.raises(AssertionError):
        check_engine(written(**WRONG[name][0]), **ENGINE_RUNS["chunked, tight pool"])
