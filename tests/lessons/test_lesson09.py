"""Lesson 09: prefix caching in the block allocator. Run: pytest -m lesson09

Your allocator keys full blocks by a hash chain, finds the longest cached run of full blocks that leaves
the prompt's last token to compute, takes a cached free block off the free list when a newcomer shares it,
hands out the least recently freed block first and makes it forget its key. Checked on small pools by hand,
under random admissions, growths and frees, then inside the real engine, token for token.

WRONG (below) lists the mistakes a room makes, each caught and named; RIGHT, keys written differently
(Python's hash, nested tuples) that must pass.
"""

from __future__ import annotations

import ast
import hashlib
import random
from array import array
from pathlib import Path

import pytest

from minillm.config import EngineConfig
from minillm.engine.blocks import BlockAllocator, BlockPoolExhausted, block_key
from minillm.engine.engine import Engine
from minillm.engine.request import Request
from minillm.engine.scheduler import ContinuousScheduler
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
                f"{why_wrong_hit(held, wanted)}"
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


def why_wrong_hit(held, wanted) -> str:
    if held and None not in held and [t for _, t in held] == [t for _, t in wanted]:
        return (
            "The same tokens, but computed after different tokens: a token's keys and values depend on every "
            "token before it, so a block's key must chain its predecessor's key"
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
    engine = Engine(model, ContinuousScheduler(token_budget=budget), cfg)
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


def check_all(Allocator) -> None:
    for check in CHECKS_IN_ORDER.values():
        check(Allocator)
    for run in ENGINE_RUNS.values():
        check_engine(Allocator, **run)


CHECKS_IN_ORDER = {
    "a block's key": check_key,
    "no false hit after a different beginning": check_chain,
    "only full blocks get a key": check_full_blocks_only,
    "a second copy keeps the tokens cached": check_second_copy,
    "the last token is left to compute": check_last_token,
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


# --- the checks catch plausible mistakes ------------------------------------------------------------
class Written(BlockAllocator):
    """The exercise written out, with switches for the mistakes below."""

    def __init__(self, num_blocks, block_size, chain=True, partial=False, whole=False, off_list=True, newest=False,
                 forget=True, first_only=False, every_copy=False, keys="sha256", last_block=False, holders="add",
                 forget_one_book=False):  # fmt: skip
        super().__init__(num_blocks, block_size, prefix_caching=True)
        self.chain, self.partial, self.whole, self.off_list = chain, partial, whole, off_list
        self.newest, self.forget, self.first_only, self.every_copy = newest, forget, first_only, every_copy
        self.keys, self.last_block, self.holders, self.forget_one_book = keys, last_block, holders, forget_one_book

    def key(self, previous, token_ids):
        head = previous if self.chain else b""  # without its predecessor (wrong)
        if self.keys == "hash":  # Python's hash of a tuple: right too
            return hash((head, tuple(token_ids)))
        if self.keys == "tuple":  # the chain itself as nested tuples: right too
            return (head, tuple(token_ids))
        return hashlib.sha256(head + array("q", token_ids).tobytes()).digest()

    def cached_prefix(self, token_ids):
        bs = self.block_size
        usable = len(token_ids) if self.whole else len(token_ids) - 1  # the whole prompt (wrong)
        count = -(-usable // bs) if self.partial else usable // bs  # a partly filled tail block too (wrong)
        if self.last_block:  # always leaves the last full block to compute, even when a token follows it (wrong)
            count = max(0, len(token_ids) // bs - 1)
        blocks, key = [], b""
        for i in range(count):
            key = self.key(key, token_ids[i * bs : (i + 1) * bs])
            if key not in self.block_of:
                break
            blocks.append(next(iter(self.block_of[key])))
        return blocks

    def cache_full_blocks(self, seq, token_ids):
        bs, table, key = self.block_size, self.tables[seq], b""
        count = -(-len(token_ids) // bs) if self.partial else len(token_ids) // bs
        for i in range(count):
            key = self.key(key, token_ids[i * bs : (i + 1) * bs])
            if key in self.block_of and self.first_only:  # leaves a second copy unkeyed (wrong)
                continue
            self.block_of.setdefault(key, {})[table[i]] = None
            self.key_of[table[i]] = key

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
}
RIGHT = {"sha256-keys": dict(), "python-hash-keys": dict(keys="hash"), "nested-tuple-keys": dict(keys="tuple")}


@CHECKS
@pytest.mark.parametrize("right", RIGHT.values(), ids=RIGHT.keys())
def test_a_correct_version_passes(right):
    check_all(written(**right))


@CHECKS
@pytest.mark.parametrize("name", WRONG)
def test_the_checks_catch_a_wrong_allocator_and_name_the_mistake(name):
    mistake, hint = WRONG[name]
    with pytest.raises(AssertionError, match=hint):
        check_all(written(**mistake))


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
