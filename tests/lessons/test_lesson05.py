"""Lesson 05: paging the KV cache. Run: pytest -m lesson05

Your block allocator keeps its books straight under any sequence of appends and frees; your slot
mapping and paged gather agree with the reference; and all three together serve a crowd through
the real engine, token for token.
"""

from __future__ import annotations

import copy
import random
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minillm import kv_cache
from minillm.attention import paged_gather
from minillm.blocks import BlockAllocator, BlockPoolExhausted
from minillm.kv_cache import slot_mapping as tensor_slot_mapping
from minillm.scheduler import ContinuousScheduler
from tests.lessons.harness import IMPLS, assert_served_everyone, crowd, serve, small_model, stub, student_module

pytestmark = pytest.mark.lesson05


def reference_slot_mapping(block_table: list[int], positions: list[int], block_size: int) -> list[int]:
    return tensor_slot_mapping(torch.tensor([block_table]), torch.tensor([positions]), block_size).tolist()


REFERENCE = SimpleNamespace(Allocator=BlockAllocator, slot_mapping=reference_slot_mapping, paged_gather=paged_gather)


@pytest.fixture(params=IMPLS)
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
        raise AssertionError(f"{why}: expected BlockPoolExhausted (from minillm.blocks), got {e!r}") from e
    else:
        raise AssertionError(f"{why}: append({seq}, {n}) must raise BlockPoolExhausted")
    assert snapshot(alloc) == before, (
        f"{why}: a failed append({seq}, {n}) must change nothing (tables, lengths, num_free)"
    )


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
    alloc.append(0, 2)  # 12 tokens: still 3 blocks
    alloc.append(0, 1)  # the 13th token takes the last block
    check_books(alloc, {0: 13}, "filling the pool exactly")


operation = st.tuples(st.sampled_from(["append", "free"]), st.integers(0, 4), st.integers(1, 20))  # (op, seq, n)


def check_random_operations(Allocator) -> None:
    """Random appends and frees (hypothesis): the books stay right, and exhaustion changes nothing."""

    @settings(max_examples=60, deadline=None, database=None, derandomize=True, report_multiple_bugs=False)
    @given(num_blocks=st.integers(1, 16), block_size=st.integers(1, 6), ops=st.lists(operation, max_size=40))
    def run(num_blocks, block_size, ops):
        alloc, lengths, done = Allocator(num_blocks, block_size), {}, []
        for op, seq, n in ops:
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
            alloc.append(seq, n)
            lengths[seq] = old + n
            check_books(alloc, lengths, after)

    run()


# --- the checks: slot mapping and gather --------------------------------------------------------
def check_slot_mapping(slot_mapping) -> None:
    for block_size in (1, 16, 7):
        rng = random.Random(block_size)
        table = rng.sample(range(12), 5)  # 5 blocks scattered in a pool of 12
        size = 5 * block_size - rng.randrange(block_size)  # tokens the sequence holds
        cases = {"prefill": list(range(size)), "decode": [size - 1], "a chunk": list(range(size // 2, size))}
        for name, positions in cases.items():
            expected = reference_slot_mapping(table, positions, block_size)
            got = [int(s) for s in slot_mapping(list(table), list(positions), block_size)]
            for p, e, g in zip(positions, expected, got):
                assert e == g, (
                    f"block_size {block_size}, block table {table}, {name}: position {p} is offset "
                    f"{p % block_size} of the sequence's block {p // block_size}, physical block "
                    f"{table[p // block_size]}, so slot {table[p // block_size]} * {block_size} + {p % block_size}"
                    f" = {e}; you gave {g}"
                )
            assert len(got) == len(expected), f"{name}: expected {len(expected)} slots, got {len(got)}"


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
        expected, got = loop_gather(pool, block_tables), gather(pool, block_tables)
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


# --- the checks: all three inside the real engine -------------------------------------------------
class AllocatorForTheCache:
    """What PagedKVCache asks of an allocator beyond the exercise, computed from your tables and lengths."""

    def __init__(self, inner):
        self.inner, self.num_blocks, self.block_size = inner, inner.num_blocks, inner.block_size
        self.append, self.free = inner.append, inner.free

    tables = property(lambda self: self.inner.tables)
    lengths = property(lambda self: self.inner.lengths)
    num_free = property(lambda self: self.inner.num_free)
    num_used = property(lambda self: self.num_blocks - self.inner.num_free)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def new_blocks_needed(self, seq: int, num_new: int) -> int:
        length = self.lengths.get(seq, 0)
        return self.blocks_for(length + num_new) - self.blocks_for(length)


def check_in_the_engine(paging) -> None:
    def slots(block_tables, positions, block_size):  # the engine's tensor signature -> yours
        rows = zip(block_tables.tolist(), positions.tolist())
        return torch.tensor([s for table, pos in rows for s in paging.slot_mapping(table, pos, block_size)])

    requests, model = crowd(12, seed=1), small_model("mqa")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(kv_cache, "slot_mapping", slots)
        mp.setattr(kv_cache, "paged_gather", paging.paged_gather)
        mp.setattr(kv_cache, "BlockAllocator", lambda n, size: AllocatorForTheCache(paging.Allocator(n, size)))
        try:
            engine = serve(model, ContinuousScheduler(), requests, slots=4, kv="paged", block_size=4, num_blocks=14)
        except NotImplementedError:
            raise  # not attempted yet
        except (IndexError, KeyError, RuntimeError, TypeError, ValueError) as e:
            raise AssertionError(
                f"serving a crowd with your allocator, slot mapping and gather crashed: {e!r}; "
                "the other lesson 05 tests point at the cause"
            ) from e
    assert_served_everyone(engine, requests)


def check_all(paging) -> None:
    check_boundaries(paging.Allocator)
    check_exhaustion(paging.Allocator)
    check_random_operations(paging.Allocator)
    check_slot_mapping(paging.slot_mapping)
    check_gather(paging.paged_gather)
    check_in_the_engine(paging)


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


def test_all_three_serve_a_crowd_through_the_engine_token_exact(paging):
    check_in_the_engine(paging)


# --- the checks catch plausible mistakes --------------------------------------------------------
class Allocator:
    """An allocator written out, with switches for the mistakes below."""

    def __init__(self, num_blocks, block_size, floor=False, partial=False, free_keeps_length=False):
        self.num_blocks, self.block_size = num_blocks, block_size
        self.floor, self.partial, self.free_keeps_length = floor, partial, free_keeps_length
        self.free_blocks, self.tables, self.lengths = list(range(num_blocks)), {}, {}

    @property
    def num_free(self):
        return len(self.free_blocks)

    def append(self, seq, num_new=1):
        old = self.lengths.get(seq, 0)
        if self.floor:  # a new block only when a boundary is passed, not when a token lands in a new block
            needed = (old + num_new) // self.block_size - old // self.block_size
        else:
            needed = -(-(old + num_new) // self.block_size) - -(-old // self.block_size)
        if needed > self.num_free and not self.partial:
            raise BlockPoolExhausted(f"need {needed}, {self.num_free} free")
        given = []
        for _ in range(needed):
            if not self.free_blocks:
                raise BlockPoolExhausted("ran dry halfway")  # the blocks taken so far stay taken (wrong)
            given.append(self.free_blocks.pop(0))
            self.tables.setdefault(seq, []).append(given[-1])
        self.tables.setdefault(seq, [])
        self.lengths[seq] = old + num_new
        return given

    def free(self, seq):
        self.free_blocks += self.tables.pop(seq, [])
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
}


def test_a_correct_version_passes():
    check_all(CORRECT)


@pytest.mark.parametrize("wrong", WRONG.values(), ids=WRONG.keys())
def test_the_checks_catch_a_wrong_paging(wrong):
    with pytest.raises(AssertionError):
        check_all(wrong)


def test_the_stub_is_rejected():
    class Stub:  # as lessons/exercises/lesson05_paged.py starts
        def __init__(self, num_blocks, block_size):
            self.num_blocks, self.block_size = num_blocks, block_size
            self.free_blocks, self.tables, self.lengths = list(range(num_blocks)), {}, {}

        append = free = stub

    with pytest.raises(NotImplementedError):
        check_all(SimpleNamespace(Allocator=Stub, slot_mapping=stub, paged_gather=stub))
