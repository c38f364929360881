"""Lesson 05: paging the KV cache. Run: pytest -m lesson05

Your block allocator keeps its books straight under any sequence of appends and frees (a full pool
included); your slot mapping (an empty chunk too) and paged gather agree with the reference and leave
their arguments as they were, the gather with one indexing op whatever the batch; and all three
together serve a crowd through the real engine, token for token.

WRONG (below) lists the mistakes a room makes, each caught; RIGHT, parts written differently that must pass.

Then the differential checks (tests/lessons/drawn/lesson05.py), each part against the reference on 60 drawn inputs
(seeded: the same every run; MINILLM_CHECK_EXAMPLES=N draws N), the smallest that differs shown first. Strategies:
- the allocator: pools of 1 to 12 blocks of 1 to 5 tokens; 1 to 10 appends (of a block's size, one less, one more,
  two blocks, three and a token, or anything up to that) and frees on sequences 0 to 3, so that appends end on a
  boundary, one short and one past it, fill the pool exactly and overflow it; the outcome of each operation and
  the books after it (check_books) compared;
- slot_mapping: 0 to 5 distinct blocks of 8 in any order, blocks of 1 to 8 tokens, positions a whole prefill, a
  chunk, one decode position (a block's last slot, the next block's first) or none;
- paged_gather: pools of 1 to 6 blocks of 1 to 4 tokens, 1 to 3 kv heads, head_dim 1 to 3, in float32, float16,
  bfloat16 and float64; 1 to 3 rows of 1 to 4 block ids with repeats; value, shape and dtype compared.
DRAWN_ONLY names the wrong parts only the drawn inputs catch.
"""

from __future__ import annotations

import copy
import math
import random
from types import SimpleNamespace

import pytest
import torch
from torch.overrides import TorchFunctionMode

from minillm.engine.blocks import BlockAllocator, BlockPoolExhausted
from minillm.engine.kv_cache import slot_mapping as tensor_slot_mapping
from minillm.model.attention import attend, paged_gather, visible_mask
from tests.lessons.drawn.lesson05 import check_drawn
from tests.lessons.harness import (
    CHECKS,
    crowd,
    expected_reply,
    first_difference,
    implementations,
    small_model,
    stub,
    student_module,
)

lesson = pytest.mark.lesson05  # your code's checks: pytest -m lesson05


def reference_slot_mapping(block_table: list[int], positions: list[int], block_size: int) -> list[int]:
    return tensor_slot_mapping(torch.tensor([block_table]), torch.tensor([positions]), block_size).tolist()


REFERENCE = SimpleNamespace(Allocator=BlockAllocator, slot_mapping=reference_slot_mapping, paged_gather=paged_gather)


@pytest.fixture(params=implementations(lesson))
def paging(request):
    if request.param == "reference":
        return REFERENCE
    module = student_module("lesson05_paged")
    return SimpleNamespace(
        Allocator=module.MyBlockAllocator, slot_mapping=module.slot_mapping, paged_gather=module.paged_gather
    )


# --- the checks: the allocator -----------------------------------------------------------------
def snapshot(alloc) -> tuple:
    return copy.deepcopy(alloc.tables), dict(alloc.lengths), alloc.num_free


def check_books(alloc, expected_lengths: dict[int, int], after: str) -> None:
    """Every invariant of the allocator's books, given the lengths each sequence should have."""
    assert dict(alloc.lengths) == expected_lengths, (
        f"after {after}: lengths are {alloc.lengths}, expected {expected_lengths}"
    )
    assert set(alloc.tables) == set(expected_lengths), f"after {after}: tables exist for {sorted(alloc.tables)}"
    held = [b for table in alloc.tables.values() for b in table]
    assert len(held) == len(set(held)), f"after {after}: a block is in two tables (or twice in one): {alloc.tables}"
    assert all(0 <= b < alloc.num_blocks for b in held), f"after {after}: a table holds an invalid block id"
    both = set(held) & set(alloc.free_blocks)
    assert not both, f"after {after}: blocks {sorted(both)} are both held by a sequence and on the free list"
    assert alloc.num_free == alloc.num_blocks - len(held), (
        f"after {after}: {len(held)} blocks are held, so {alloc.num_blocks - len(held)} should be free, "
        f"but num_free is {alloc.num_free}"
    )
    for seq, table in alloc.tables.items():
        need = -(-alloc.lengths[seq] // alloc.block_size)
        assert len(table) == need, (
            f"after {after}: sequence {seq} stores {alloc.lengths[seq]} tokens in blocks of {alloc.block_size}, "
            f"so it needs {need} block(s), but its table has {len(table)}"
        )


def assert_exhausted(alloc, seq: int, n: int, why: str) -> None:
    """append(seq, n) must raise BlockPoolExhausted and leave the books exactly as they were."""
    before = snapshot(alloc)
    try:
        alloc.append(seq, n)
    except BlockPoolExhausted:
        pass
    except NotImplementedError:
        raise
    except Exception as e:
        raise AssertionError(f"{why}: expected BlockPoolExhausted (from minillm.engine.blocks), got {e!r}") from e
    else:
        raise AssertionError(f"{why}: append({seq}, {n}) must raise BlockPoolExhausted")
    assert snapshot(alloc) == before, (
        f"{why}: a failed append({seq}, {n}) must change nothing (tables, lengths, num_free)"
    )


EXACT_FIT = "blocks that suffice exactly are enough (compare needed > free, not >=)"


def append_that_fits(alloc, seq: int, n: int, why: str, hint: str = EXACT_FIT):
    """append(seq, n) when the blocks it needs are free (perhaps exactly): it must not raise."""
    free = alloc.num_free
    try:
        return alloc.append(seq, n)
    except BlockPoolExhausted as e:
        raise AssertionError(
            f"{why}: append({seq}, {n}) raised BlockPoolExhausted ({e}) with {free} free block(s), enough for it: "
            + hint
        ) from None


def check_boundaries(Allocator) -> None:
    alloc, lengths = Allocator(10, 4), {}
    for n, new_blocks, why in (
        (4, 1, "4 tokens fill exactly one block of 4"),
        (1, 1, "the 5th token opens a second block"),
        (3, 0, "tokens 6..8 fit in the second block"),
        (1, 1, "the 9th token opens a third block"),
    ):
        table = list(alloc.tables.get(7, []))
        given = alloc.append(7, n)
        lengths[7] = lengths.get(7, 0) + n
        assert len(given) == new_blocks, f"append(7, {n}) returned {given}: expected {new_blocks} new block(s) ({why})"
        assert list(alloc.tables[7]) == table + list(given), "append must return the blocks it added to the table"
        check_books(alloc, lengths, f"append(7, {n})")
    alloc.free(7)
    check_books(alloc, {}, "free(7)")
    assert alloc.num_free == 10, f"after freeing the only sequence, 10 blocks must be free, not {alloc.num_free}"


def check_exhaustion(Allocator) -> None:
    alloc = Allocator(4, 4)
    alloc.append(0, 10)  # 3 blocks, 1 free
    assert_exhausted(alloc, 1, 5, "a new sequence of 5 tokens needs 2 blocks of 4, and 1 is free")
    assert_exhausted(alloc, 0, 7, "growing sequence 0 from 10 to 17 tokens needs 2 more blocks, and 1 is free")
    append_that_fits(alloc, 0, 2, "12 tokens still fit in sequence 0's 3 blocks")
    append_that_fits(alloc, 0, 1, "the 13th token takes the last free block")
    check_books(alloc, {0: 13}, "filling the pool exactly")
    append_that_fits(  # the free list is empty, yet nothing is needed: the last block has room
        alloc, 0, 3, "a full pool, tokens 14..16 into sequence 0's last block (it has 3 free slots)",
        hint="they need no new block (the sequence's last block has room): compare the blocks needed with "
        "the free ones, not the free list with empty",
    )  # fmt: skip
    check_books(alloc, {0: 16}, "a full pool, 3 tokens into the last block's free slots")
    assert_exhausted(alloc, 0, 1, "a full pool, the 17th token: it needs a new block, and none is free")


def check_random_operations(Allocator) -> None:
    """300 short random runs of appends and frees (seeded, so every run is the same): after every operation
    the books must be right, and an append that does not fit must raise and change nothing. Runs are short
    so that the first one to fail is easy to replay by hand."""
    rng = random.Random(0)
    for _ in range(300):
        num_blocks, block_size = rng.randint(1, 16), rng.randint(1, 6)
        alloc, lengths, done = Allocator(num_blocks, block_size), {}, []
        for _ in range(rng.randint(1, 12)):
            op, seq, n = rng.choice(["append", "append", "free"]), rng.randint(0, 3), rng.randint(1, 20)
            done.append(f"{op}({seq}, {n})" if op == "append" else f"free({seq})")
            after = f"{', '.join(done)} on {num_blocks} blocks of {block_size}"
            if op == "free":
                if seq in lengths:
                    alloc.free(seq)
                    del lengths[seq]
                check_books(alloc, lengths, after)
                continue
            old = lengths.get(seq, 0)
            need = -(-(old + n) // block_size) - -(-old // block_size)
            if need > alloc.num_free:
                assert_exhausted(alloc, seq, n, f"{after}: {need} block(s) needed, {alloc.num_free} free")
                continue
            append_that_fits(alloc, seq, n, f"{after}: {need} block(s) needed, {alloc.num_free} free")
            lengths[seq] = old + n
            check_books(alloc, lengths, after)


# --- the checks: slot mapping and gather --------------------------------------------------------
def check_slot_mapping(slot_mapping) -> None:
    for block_size in (1, 16, 7):
        rng = random.Random(block_size)
        table = rng.sample(range(12), 5)  # 5 blocks scattered in a pool of 12
        size = 5 * block_size - rng.randrange(block_size)  # tokens the sequence holds
        cases = {"prefill": list(range(size)), "decode": [size - 1], "a chunk": list(range(size // 2, size))}
        for name, positions in cases.items():
            expected = reference_slot_mapping(table, positions, block_size)
            given_table, given_positions = list(table), list(positions)
            got = [int(s) for s in slot_mapping(given_table, given_positions, block_size)]
            for arg, mine, theirs in (("block_table", given_table, table), ("positions", given_positions, positions)):
                assert mine == theirs, (
                    f"block_size {block_size}, {name}: your slot_mapping changed the {arg} list it was given "
                    f"({theirs[:6]}... became {list(mine)[:6]}...): the caller goes on using it (the engine builds "
                    "the step's positions from it); build a new list of slots"
                )
            for p, e, g in zip(positions, expected, got):
                assert e == g, (
                    f"block_size {block_size}, block table {table}, {name}: position {p} is offset "
                    f"{p % block_size} of the sequence's block {p // block_size}, physical block "
                    f"{table[p // block_size]}, so slot {table[p // block_size]} * {block_size} + {p % block_size}"
                    f" = {e}; you gave {g}"
                )
            assert len(got) == len(expected), f"{name}: expected {len(expected)} slots, got {len(got)}"
    for table, name in (([3, 0, 5], "no positions (a row with nothing to write this step)"),
                        ([], "no positions and an empty block table (a sequence with no blocks yet)")):  # fmt: skip
        try:
            got = list(slot_mapping(table, [], 4))
        except NotImplementedError:
            raise
        except Exception as e:
            raise AssertionError(
                f"{name}: expected no slots, [], but your slot_mapping raised {e!r} (torch.tensor([]) and "
                "np.array([]) hold floats, which cannot index: give them dtype=torch.long or int)"
            ) from e
        assert got == [], f"{name}: expected no slots, [], got {got}"


def loop_gather(pool: torch.Tensor, block_tables: torch.Tensor) -> torch.Tensor:
    """The gather spelled out: position p of row b is block block_tables[b, p // block_size], offset p % block_size."""
    B, max_blocks = block_tables.shape
    block_size = pool.shape[1]
    out = torch.empty(B, max_blocks * block_size, *pool.shape[2:], dtype=pool.dtype)
    for b in range(B):
        for p in range(max_blocks * block_size):
            out[b, p] = pool[block_tables[b, p // block_size], p % block_size]
    return out


def check_gather(gather) -> None:
    for block_size in (4, 1, 7):
        pool = torch.arange(10 * block_size * 2 * 3, dtype=torch.float32).reshape(10, block_size, 2, 3)
        block_tables = torch.tensor([[3, 7, 1, 0], [9, 2, 2, 2], [5, 4, 8, 6]])  # row 1 padded with repeats
        given_pool, given_tables = pool.clone(), block_tables.clone()
        expected, got = loop_gather(pool, block_tables), gather(given_pool, given_tables)
        for arg, mine, theirs in (("block_tables", given_tables, block_tables), ("pool", given_pool, pool)):
            assert torch.equal(mine, theirs), (
                f"block_size {block_size}: your paged_gather changed the {arg} tensor it was given (an in-place "
                f"operation: `x *= n` on a tensor writes into it): {arg} {theirs.flatten()[:8].tolist()}... became "
                f"{mine.flatten()[:8].tolist()}...; the caller gathers the values with the same tables next"
            )
        shapes = f"expected shape {tuple(expected.shape)}, got {tuple(got.shape)}"
        assert got.shape == expected.shape, f"block_size {block_size}: {shapes}"
        bad = (got != expected).flatten(2).any(-1).nonzero()  # (n, 2): rows and positions that differ
        if len(bad):
            b, p = bad[0].tolist()
            block = block_tables[b, p // block_size].item()
            raise AssertionError(
                f"block_size {block_size}, block tables {block_tables.tolist()}: row {b}, position {p} should be "
                f"pool[{block}, {p % block_size}] (block_tables[{b}, {p} // {block_size}], offset {p} % {block_size})"
            )
    calls = {rows: torch_calls(gather, rows, blocks) for rows, blocks in ((1, 1), (6, 5))}
    assert calls[1] == calls[6], (
        f"one row of 1 block vs six rows of 5 blocks: your paged_gather makes {calls[1]} torch calls for the one and "
        f"{calls[6]} for the six: it loops over rows or blocks. Gather every row's blocks with one indexing op "
        "(pool[block_tables], then one reshape): a loop costs a call per row, in every layer, at every step"
    )


class CountCalls(TorchFunctionMode):
    """Counts the torch functions and tensor methods called inside it."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls += 1
        return func(*args, **(kwargs or {}))


def torch_calls(gather, rows: int, blocks: int) -> int:
    pool, tables = torch.zeros(8, 4, 2, 3), torch.arange(rows * blocks).reshape(rows, blocks) % 8
    with CountCalls() as counter:
        gather(pool, tables)
    return counter.calls


# --- the checks: all three inside the real model --------------------------------------------------
class PagedCacheFromParts:
    """A paged KV cache for the real model, built from an allocator, a slot mapping and a gather: yours, the
    reference's, or a mix. Keys and values live in one pool (num_blocks, block_size, n_kv_heads, head_dim) per
    layer; each step writes the new tokens' keys into the slots your slot mapping names and reads every
    sequence back through your gather."""

    def __init__(self, cfg, num_blocks: int, block_size: int, parts):
        self.parts, self.block_size = parts, block_size
        self.alloc = parts.Allocator(num_blocks, block_size)
        shape = (cfg.n_layers, num_blocks, block_size, cfg.n_kv_heads, cfg.head_dim)
        self.k, self.v = torch.zeros(shape), torch.zeros(shape)

    def prepare(self, seqs: list[int], num_new: int) -> torch.Tensor:
        positions, slots = [], []
        for seq in seqs:
            start = self.alloc.lengths.get(seq, 0)
            self.alloc.append(seq, num_new)
            positions.append(list(range(start, start + num_new)))
            slots += self.parts.slot_mapping(list(self.alloc.tables[seq]), positions[-1], self.block_size)
        tables = [list(self.alloc.tables[seq]) for seq in seqs]
        width = max(len(t) for t in tables)
        self.tables = torch.tensor([t + t[:1] * (width - len(t)) for t in tables])  # (B, width), padded
        self.slots, self.positions = torch.tensor([int(s) for s in slots]), torch.tensor(positions)  # (B*T,), (B, T)
        return self.positions

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        for pool, new in ((self.k[layer], k), (self.v[layer], v)):
            pool.view(-1, *pool.shape[2:])[self.slots] = new.flatten(0, 1)  # scatter into the flat slots
        keys = self.parts.paged_gather(self.k[layer], self.tables)  # (B, S, Hkv, D)
        values = self.parts.paged_gather(self.v[layer], self.tables)
        return attend(q, keys, values, visible_mask(self.positions, keys.shape[1]))

    def free(self, seq: int) -> None:
        self.alloc.free(seq)


def serve_with_parts(parts) -> None:
    """Five sequences through one pool of 13 blocks of 4 tokens: three start together and decode as a batch;
    when one finishes, its blocks go back and a newcomer reuses them. Every reply must equal the plain loop's."""
    model = small_model("mqa")
    cache = PagedCacheFromParts(model.cfg, num_blocks=13, block_size=4, parts=parts)
    todo = crowd(5, seed=2)  # prompts of 3 to 14 tokens, replies of 3 to 26 tokens
    for r in todo:
        r.max_new_tokens = min(r.max_new_tokens, 9)
    running, queue, replies = {}, list(enumerate(todo)), {}
    with torch.no_grad():
        while queue or running:
            while queue and len(running) < 3:  # prefill newcomers, one at a time
                seq, r = queue.pop(0)
                logits = model(torch.tensor([r.prompt_ids]), cache.prepare([seq], len(r.prompt_ids)), cache)
                running[seq], replies[seq] = r, [logits[0, -1].argmax().item()]
            seqs = list(running)
            last = torch.tensor([[replies[seq][-1]] for seq in seqs])  # (B, 1)
            logits = model(last, cache.prepare(seqs, 1), cache)  # one batched decode step
            for i, seq in enumerate(seqs):
                replies[seq].append(logits[i, -1].argmax().item())
                if len(replies[seq]) == running[seq].max_new_tokens:
                    cache.free(seq)
                    del running[seq]
    for seq, r in enumerate(todo):
        expected = expected_reply(model, tuple(r.prompt_ids), r.max_new_tokens, False)
        assert replies[seq] == expected, (
            f"sequence {seq} (a {len(r.prompt_ids)}-token prompt): {first_difference(expected, replies[seq])}"
        )


PARTS = {"allocator": "Allocator", "slot mapping": "slot_mapping", "gather": "paged_gather"}


def try_serving(parts) -> str | None:
    """None when every reply is right, else what went wrong."""
    try:
        serve_with_parts(parts)
    except NotImplementedError:
        raise  # not attempted yet
    except AssertionError as e:
        return f"a wrong reply: {e}"
    except (BlockPoolExhausted, IndexError, KeyError, RuntimeError, TypeError, ValueError) as e:
        return f"a crash: {e!r}"
    return None


def check_in_the_model(paging) -> None:
    """All three of yours together; when that fails, each of yours alone with the reference's other two, to
    say which one is wrong."""
    problem = try_serving(paging)
    if problem is None:
        return
    alone = {}
    for part, attr in PARTS.items():
        mixed = SimpleNamespace(**{**vars(REFERENCE), attr: getattr(paging, attr)})
        alone[part] = try_serving(mixed)
    guilty = [part for part, result in alone.items() if result]
    verdicts = "; ".join(f"your {part} alone: {'wrong' if result else 'right'}" for part, result in alone.items())
    blame = (
        f"so your {' and your '.join(guilty)} {'is' if len(guilty) == 1 else 'are'} what is wrong"
        if guilty
        else "each part works alone, so they disagree with each other"
    )
    raise AssertionError(
        f"serving five sequences through the real model with your allocator, slot mapping and gather gave "
        f"{problem}\n  with the reference's other two parts: {verdicts}: {blame} (the test of that part says how)"
    )


def check_drawn_inputs(paging) -> None:
    check_drawn(paging, check_books)


def check_all(paging) -> None:
    check_cases(paging)
    check_drawn_inputs(paging)


def check_cases(paging) -> None:
    check_boundaries(paging.Allocator)
    check_exhaustion(paging.Allocator)
    check_random_operations(paging.Allocator)
    check_slot_mapping(paging.slot_mapping)
    check_gather(paging.paged_gather)
    check_in_the_model(paging)


def test_blocks_are_given_as_tokens_cross_block_boundaries(paging):
    check_boundaries(paging.Allocator)


def test_exhaustion_raises_and_changes_nothing(paging):
    check_exhaustion(paging.Allocator)


def test_random_appends_and_frees_keep_the_books_straight(paging):
    check_random_operations(paging.Allocator)


def test_slot_mapping(paging):
    check_slot_mapping(paging.slot_mapping)


def test_paged_gather_equals_a_loop(paging):
    check_gather(paging.paged_gather)


def test_all_three_serve_sequences_through_the_model_token_exact(paging):
    check_in_the_model(paging)


def test_all_three_equal_the_reference_on_drawn_inputs(paging):
    check_drawn_inputs(paging)


# --- the checks catch plausible mistakes --------------------------------------------------------
class Allocator:
    """An allocator written out, with switches for the mistakes below."""

    def __init__(
        self, num_blocks, block_size, floor=False, partial=False, free_keeps_length=False, strict=False, leaks=False,
        take="front", empty_refuses=False,
    ):  # fmt: skip
        self.num_blocks, self.block_size = num_blocks, block_size
        self.floor, self.partial, self.free_keeps_length = floor, partial, free_keeps_length
        self.strict, self.leaks, self.take, self.empty_refuses = strict, leaks, take, empty_refuses
        self.free_blocks, self.tables, self.lengths = list(range(num_blocks)), {}, {}

    @property
    def num_free(self):
        return len(self.free_blocks)

    def append(self, seq, num_new=1):
        if self.empty_refuses and not self.free_blocks:  # even tokens that fit in the last block's room (wrong)
            raise BlockPoolExhausted("no free blocks")
        old = self.lengths.get(seq, 0)
        if self.floor:  # a new block only when a boundary is passed, not when a token lands in a new block
            needed = (old + num_new) // self.block_size - old // self.block_size
        else:
            needed = -(-(old + num_new) // self.block_size) - -(-old // self.block_size)
        if (needed >= self.num_free if self.strict else needed > self.num_free) and not self.partial:
            raise BlockPoolExhausted(f"need {needed}, {self.num_free} free")  # strict: refuses an exact fit (wrong)
        given = []
        for _ in range(needed):
            if not self.free_blocks:
                raise BlockPoolExhausted("ran dry halfway")  # the blocks taken so far stay taken (wrong)
            given.append(self.free_blocks.pop(0 if self.take == "front" else -1))  # either end is right
            self.tables.setdefault(seq, []).append(given[-1])
        self.tables.setdefault(seq, [])
        self.lengths[seq] = old + num_new
        return given

    def free(self, seq):
        blocks = self.tables.pop(seq, [])
        if not self.leaks:  # (wrong without: the blocks never come back)
            self.free_blocks += blocks
        if not self.free_keeps_length:
            self.lengths.pop(seq, None)


def correct_slot_mapping(block_table, positions, block_size):
    return [block_table[p // block_size] * block_size + p % block_size for p in positions]


def correct_gather(pool, block_tables):
    B, max_blocks = block_tables.shape
    return pool[block_tables].reshape(B, max_blocks * pool.shape[1], *pool.shape[2:])


CORRECT = SimpleNamespace(Allocator=Allocator, slot_mapping=correct_slot_mapping, paged_gather=correct_gather)


def variant(**changes) -> SimpleNamespace:
    return SimpleNamespace(**{**vars(CORRECT), **changes})


def allocator(**mistake):
    return lambda num_blocks, block_size: Allocator(num_blocks, block_size, **mistake)


WRONG = {
    "allocator-floor-division": variant(Allocator=allocator(floor=True)),
    "allocator-keeps-blocks-on-exhaustion": variant(Allocator=allocator(partial=True)),
    "allocator-free-keeps-the-length": variant(Allocator=allocator(free_keeps_length=True)),
    "slot-mapping-ignores-the-table": variant(slot_mapping=lambda table, positions, size: list(positions)),
    "slot-mapping-swaps-block-and-offset": variant(
        slot_mapping=lambda table, positions, size: [table[p % size] * size + p // size for p in positions]
    ),
    "slot-mapping-forgets-block-size": variant(
        slot_mapping=lambda table, positions, size: [table[p // size] + p % size for p in positions]
    ),
    "gather-offset-major": variant(
        paged_gather=lambda pool, tables: pool[tables].transpose(1, 2).reshape(len(tables), -1, *pool.shape[2:])
    ),
    "gather-flat-pool": variant(paged_gather=lambda pool, tables: pool.flatten(0, 1)[tables]),
    "allocator-refuses-an-exact-fit": variant(Allocator=allocator(strict=True)),
    "allocator-free-leaks-the-blocks": variant(Allocator=allocator(leaks=True)),
    "slot-mapping-counts-from-the-chunk-start": variant(  # i, the place in this call's list, not the position p
        slot_mapping=lambda table, positions, size: [table[i // size] * size + i % size for i in range(len(positions))]
    ),
    "gather-keeps-the-blocks-apart": variant(paged_gather=lambda pool, tables: pool[tables]),  # (B, blocks, size, ...)
}


# Mistakes an edge case names first (each right on the other cases of its check; before those cases two of them
# passed everything, and three failed only later, named for something else), with the check and its first line.
def torch_slot_mapping(block_table, positions, block_size):  # wrong on an empty chunk: torch.tensor([]) is float
    table, p = torch.tensor(block_table), torch.tensor(positions)
    return (table[p // block_size] * block_size + p % block_size).tolist()


def slot_mapping_in_place(block_table, positions, block_size):  # the right slots, written over the caller's list
    for i, p in enumerate(positions):
        positions[i] = block_table[p // block_size] * block_size + p % block_size
    return positions


def gather_scaling_the_tables(pool, block_tables):  # the right rows, but `*=` writes into the caller's tables
    block_tables *= pool.shape[1]  # each block's first slot
    slots = block_tables[..., None] + torch.arange(pool.shape[1])  # (B, max_blocks, block_size)
    return pool.flatten(0, 1)[slots.flatten(1)]


def gather_row_by_row(pool, block_tables):  # the right rows, one indexing op per row
    return torch.stack([pool[table].flatten(0, 1) for table in block_tables])


def gather_into_zeros(pool, block_tables):  # the right numbers, in a float32 tensor whatever the pool holds
    B, max_blocks = block_tables.shape
    out = torch.zeros(B, max_blocks * pool.shape[1], *pool.shape[2:])  # (no dtype: float32)
    out[:] = pool[block_tables].flatten(1, 2)
    return out


EDGE_WRONG = {
    "allocator-refuses-when-the-free-list-is-empty": (
        variant(Allocator=allocator(empty_refuses=True)), check_exhaustion, "a full pool, tokens 14..16"),
    "slot-mapping-in-torch-crashes-on-an-empty-chunk": (
        variant(slot_mapping=torch_slot_mapping), check_slot_mapping, "no positions (a row with nothing"),
    "slot-mapping-writes-into-the-positions": (
        variant(slot_mapping=slot_mapping_in_place), check_slot_mapping, "changed the positions list"),
    "gather-scales-the-tables-in-place": (
        variant(paged_gather=gather_scaling_the_tables), check_gather, "changed the block_tables tensor"),
    "gather-loops-over-rows": (variant(paged_gather=gather_row_by_row), check_gather, "one row of 1 block vs six"),
}  # fmt: skip
WRONG |= {name: wrong for name, (wrong, *_) in EDGE_WRONG.items()}
# right on every hand-built case (their pools are float32, as the model's); the drawn pools of other dtypes catch it
DRAWN_ONLY = {"gather-into-a-float32-tensor": (variant(paged_gather=gather_into_zeros), "your gather returns")}
WRONG |= {name: wrong for name, (wrong, _) in DRAWN_ONLY.items()}


def divmod_slot_mapping(block_table, positions, block_size):
    slots = []
    for p in positions:
        block, offset = divmod(p, block_size)
        slots.append(block_table[block] * block_size + offset)
    return slots


def index_select_gather(pool, block_tables):
    B = block_tables.shape[0]
    return pool.index_select(0, block_tables.flatten()).view(B, -1, *pool.shape[2:])


class TokenByTokenAllocator:
    """Right, written differently: counts the blocks a token at a time, then takes them all or none."""

    def __init__(self, num_blocks, block_size):
        self.num_blocks, self.block_size = num_blocks, block_size
        self.free_blocks, self.tables, self.lengths = list(range(num_blocks)), {}, {}

    @property
    def num_free(self):
        return len(self.free_blocks)

    def append(self, seq, num_new=1):
        start = self.lengths.get(seq, 0)
        needed = sum(1 for p in range(start, start + num_new) if p % self.block_size == 0)  # tokens opening a block
        if needed > len(self.free_blocks):
            raise BlockPoolExhausted(f"{needed} needed, {len(self.free_blocks)} free")
        given, self.free_blocks = self.free_blocks[:needed], self.free_blocks[needed:]
        self.tables[seq] = self.tables.get(seq, []) + given
        self.lengths[seq] = start + num_new
        return given

    def free(self, seq):
        self.free_blocks.extend(self.tables.pop(seq))
        del self.lengths[seq]


class RoomInTheLastBlockAllocator(TokenByTokenAllocator):
    """Right, written differently: what the last block has room for first, then whole blocks; a set as free list."""

    def __init__(self, num_blocks, block_size):
        super().__init__(num_blocks, block_size)
        self.free_blocks = set(range(num_blocks))

    def append(self, seq, num_new=1):
        length = self.lengths.get(seq, 0)
        room = -length % self.block_size  # free slots in its last block
        needed = max(0, math.ceil((num_new - room) / self.block_size))
        if needed > len(self.free_blocks):
            raise BlockPoolExhausted(f"{needed} needed, {len(self.free_blocks)} free")
        given = [self.free_blocks.pop() for _ in range(needed)]
        self.tables.setdefault(seq, []).extend(given)
        self.lengths[seq] = length + num_new
        return given

    def free(self, seq):
        self.free_blocks |= set(self.tables.pop(seq))
        del self.lengths[seq]


def long_torch_slot_mapping(block_table, positions, block_size):
    table, p = torch.tensor(block_table, dtype=torch.long), torch.tensor(positions, dtype=torch.long)
    return (table[p // block_size] * block_size + p % block_size).tolist()


def flat_slots_gather(pool, block_tables):
    block_size = pool.shape[1]
    slots = block_tables[..., None] * block_size + torch.arange(block_size)  # (B, max_blocks, block_size): new tensor
    return pool.flatten(0, 1)[slots.flatten(1)]


RIGHT = {  # right, written differently: the checks must pass them
    "written-out": CORRECT,
    "blocks-from-the-end-of-the-free-list": variant(Allocator=allocator(take="back")),
    "token-by-token-allocator": variant(Allocator=TokenByTokenAllocator),
    "room-in-the-last-block-allocator-on-a-set": variant(Allocator=RoomInTheLastBlockAllocator),
    "divmod-slot-mapping": variant(slot_mapping=divmod_slot_mapping),
    "torch-slot-mapping-with-long-tensors": variant(slot_mapping=long_torch_slot_mapping),
    "index-select-gather": variant(paged_gather=index_select_gather),
    "flat-slots-gather": variant(paged_gather=flat_slots_gather),
    "flatten-gather": variant(paged_gather=lambda pool, tables: pool[tables].flatten(1, 2)),
}


@CHECKS
@pytest.mark.parametrize("right", RIGHT.values(), ids=RIGHT.keys())
def test_a_correct_version_passes(right):
    check_all(right)


@CHECKS
@pytest.mark.parametrize("wrong", WRONG.values(), ids=WRONG.keys())
def test_the_checks_catch_a_wrong_paging(wrong):
    with pytest.raises(AssertionError):
        check_all(wrong)


@CHECKS
@pytest.mark.parametrize("name", EDGE_WRONG)
def test_an_edge_case_catches_its_mistake_and_names_the_situation_first(name):
    wrong, check, situation = EDGE_WRONG[name]
    part = {check_exhaustion: "Allocator", check_slot_mapping: "slot_mapping", check_gather: "paged_gather"}[check]
    with pytest.raises(AssertionError) as caught:
        check(getattr(wrong, part))
    assert situation in str(caught.value).splitlines()[0], str(caught.value)


@CHECKS
@pytest.mark.parametrize("name", DRAWN_ONLY)
def test_the_drawn_inputs_catch_what_the_cases_miss(name):
    wrong, begins = DRAWN_ONLY[name]
    check_cases(wrong)  # every hand-built case passes it
    with pytest.raises(AssertionError) as failure:
        check_drawn_inputs(wrong)
    assert begins in str(failure.value).splitlines()[0], str(failure.value)


@CHECKS
def test_the_stub_is_rejected():
    class Stub:  # as lessons/exercises/lesson05_paged.py starts
        def __init__(self, num_blocks, block_size):
            self.num_blocks, self.block_size = num_blocks, block_size
            self.free_blocks, self.tables, self.lengths = list(range(num_blocks)), {}, {}

        append = free = stub

    with pytest.raises(NotImplementedError):
        check_all(SimpleNamespace(Allocator=Stub, slot_mapping=stub, paged_gather=stub))


# Which part the end-to-end check must blame for each wrong version (the unit checks run first in check_all,
# so this calls the end-to-end check alone).
BLAME = {
    "allocator-floor-division": "your allocator is what is wrong",
    "slot-mapping-ignores-the-table": "your slot mapping is what is wrong",
    "slot-mapping-swaps-block-and-offset": "your slot mapping is what is wrong",
    "slot-mapping-forgets-block-size": "your slot mapping is what is wrong",
    "gather-offset-major": "your gather is what is wrong",
    "gather-flat-pool": "your gather is what is wrong",
}


@CHECKS
def test_the_end_to_end_run_reuses_freed_blocks():
    """The pool is tight enough that newcomers get blocks that finished sequences gave back."""

    class Recording(BlockAllocator):
        freed: set[int] = set()
        reused = False

        def free(self, seq):
            Recording.freed |= set(self.tables[seq])
            super().free(seq)

        def append(self, seq, num_new=1):
            given = super().append(seq, num_new)
            Recording.reused |= bool(Recording.freed & set(given))
            return given

    serve_with_parts(SimpleNamespace(**{**vars(REFERENCE), "Allocator": Recording}))
    assert Recording.reused


@CHECKS
@pytest.mark.parametrize("name", BLAME.keys())
def test_the_end_to_end_check_blames_the_wrong_part(name):
    with pytest.raises(AssertionError, match=BLAME[name]):
        check_in_the_model(WRONG[name])
