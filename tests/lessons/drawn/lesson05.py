"""Lesson 05's differential checks: your allocator, slot mapping and gather against the reference on drawn inputs.

- the allocator: a pool of 1 to 12 blocks of 1 to 5 tokens, then 1 to 10 operations on sequences 0 to 3: appends
  of 1 token up to three blocks' worth (a block's size, one less and one more on purpose, so appends end exactly
  on a boundary, one short of it and one past it, fill the pool exactly and overflow it by one) and frees of a
  sequence that exists; after each, the same outcome as the reference (raised or not, as many new blocks) and the
  same books (lengths, table sizes, free count, no block twice);
- slot_mapping: a table of 0 to 5 distinct blocks out of 8 (any order), blocks of 1 to 8 tokens, and a run of
  positions the table holds: a whole prefill, a chunk, one decode token (the last slot of a block, the first of the
  next), or none;
- paged_gather: a pool of 1 to 6 blocks of 1 to 4 tokens, 1 to 3 kv heads, head_dim 1 to 3, float32, float16,
  bfloat16 or float64; 1 to 3 rows of 1 to 4 block ids (repeats: padding), compared in value, shape and dtype.
"""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from minillm.engine.blocks import BlockAllocator, BlockPoolExhausted
from minillm.model.attention import paged_gather
from tests.lessons.differential import against_reference, near, plural
from tests.lessons.harness import case


@st.composite
def operations(draw):
    num_blocks, block_size = draw(st.integers(1, 12)), draw(st.integers(1, 5))
    ops, alive = [], set()
    sizes = sorted({max(1, block_size + d) for d in (-1, 0, 1)} | {2 * block_size, 3 * block_size + 1})
    for _ in range(draw(st.integers(1, 10))):
        if alive and draw(st.integers(0, 3)) == 0:
            seq = draw(st.sampled_from(sorted(alive)))
            ops.append(("free", seq, 0))
            alive.discard(seq)
        else:
            seq = draw(st.integers(0, 3))
            ops.append(("append", seq, draw(st.one_of(st.sampled_from(sizes), st.integers(1, 3 * block_size + 1)))))
            alive.add(seq)  # (a failed append of a new sequence leaves nothing to free: free skips it below)
    return num_blocks, block_size, ops


def shown(ops) -> list[str]:
    return [f"free({s})" if op == "free" else f"append({s}, {n})" for op, s, n in ops]


def run_ops(Allocator, num_blocks, block_size, ops, name: str, check_books=None):
    """[(what happened, lengths, table sizes, free)] after each operation."""
    alloc, seen, lengths = Allocator(num_blocks, block_size), [], {}
    pool = f"a pool of {plural(num_blocks, 'block')} of {plural(block_size, 'token')}"
    for i, (op, seq, n) in enumerate(ops):
        if op == "free":
            if seq not in lengths:
                continue
            with case(f"{name}: free({seq})"):
                alloc.free(seq)
            del lengths[seq]
            outcome = "freed"
        else:
            with case(f"{name}: append({seq}, {n})"):
                try:
                    given = alloc.append(seq, n)
                except BlockPoolExhausted:
                    given = None
            if given is None:
                outcome = "raised BlockPoolExhausted"
            else:
                lengths[seq] = lengths.get(seq, 0) + n
                outcome = f"gave {plural(len(list(given)), 'new block')}"
        if check_books is not None:
            check_books(alloc, lengths, f"{', '.join(shown(ops[: i + 1]))} on {pool}")
        sizes = {s: len(t) for s, t in sorted(alloc.tables.items())}
        seen.append((outcome, dict(sorted(alloc.lengths.items())), sizes, alloc.num_free))
    return seen


def compare_allocator(Allocator, check_books):
    def run(drawn):
        num_blocks, block_size, ops = drawn
        pool = f"a pool of {plural(num_blocks, 'block')} of {plural(block_size, 'token')}"
        want = run_ops(BlockAllocator, num_blocks, block_size, ops, "the reference")
        got = run_ops(Allocator, num_blocks, block_size, ops, f"with {pool}", check_books)
        for i, (mine, theirs) in enumerate(zip(got, want)):
            if mine == theirs:
                continue
            done, k = ", ".join(shown(ops)[: i + 1]), next(j for j in range(4) if mine[j] != theirs[j])
            what = ["", "lengths are", "blocks per sequence are", "free blocks are"][k]
            differ = f"your allocator {mine[0]}; the reference {theirs[0]}" if k == 0 else (
                f"your allocator's {what} {mine[k]}; the reference's {theirs[k]}")  # fmt: skip
            raise AssertionError(
                f"with {pool}, after {done}: {differ}\n"
                f"  yours:         {mine[0]}, lengths {mine[1]}, blocks {mine[2]}, {mine[3]} free\n"
                f"  the reference: {theirs[0]}, lengths {theirs[1]}, blocks {theirs[2]}, {theirs[3]} free"
            )

    return run


@st.composite
def slot_cases(draw):
    block_size = draw(st.integers(1, 8))
    table = draw(st.permutations(range(8)))[: draw(st.integers(0, 5))]
    length = len(table) * block_size - (draw(st.integers(0, block_size - 1)) if table else 0)  # tokens it holds
    kind = draw(st.sampled_from(["prefill", "chunk", "decode", "none"] if length else ["none"]))
    if kind == "prefill":
        positions = list(range(length))
    elif kind == "chunk":
        start = draw(st.integers(0, length - 1))
        positions = list(range(start, draw(st.integers(start + 1, length))))
    elif kind == "decode":
        positions = [draw(near([length - 1, block_size - 1, block_size], 0, length - 1))]  # a block's last, first
    else:
        positions = []
    return list(table), positions, block_size


def compare_slot_mapping(slot_mapping):
    def run(drawn):
        table, positions, block_size = drawn
        given_table, given_positions = list(table), list(positions)
        setting = f"with block table {table}, blocks of {plural(block_size, 'token')} and positions {positions}"
        with case(setting):
            got = [int(s) for s in slot_mapping(given_table, given_positions, block_size)]
        assert (given_table, given_positions) == (table, positions), (
            f"{setting}: your slot_mapping changed the lists it was given: build a new list of slots"
        )
        want = [table[p // block_size] * block_size + p % block_size for p in positions]
        assert got == want, f"{setting}, your slots are {got}; the reference's are {want}"

    return run


DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]


@st.composite
def gather_cases(draw):
    num_blocks, block_size = draw(st.integers(1, 6)), draw(st.integers(1, 4))
    heads, head_dim, dtype = draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.sampled_from(DTYPES))
    rows, width = draw(st.integers(1, 3)), draw(st.integers(1, 4))
    ids = draw(st.lists(st.integers(0, num_blocks - 1), min_size=rows * width, max_size=rows * width))
    return (num_blocks, block_size, heads, head_dim), dtype, [ids[r * width : (r + 1) * width] for r in range(rows)]


def compare_gather(gather):
    def run(drawn):
        shape, dtype, tables = drawn
        pool = torch.arange(1, 1 + shape[0] * shape[1] * shape[2] * shape[3]).reshape(shape).to(dtype)
        block_tables = torch.tensor(tables)  # (B, max_blocks)
        given_pool, given_tables = pool.clone(), block_tables.clone()
        setting = f"with a {dtype} pool of shape {tuple(pool.shape)} and block tables {tables}"
        with case(setting):
            got = gather(given_pool, given_tables)
        assert torch.equal(given_pool, pool) and torch.equal(given_tables, block_tables), (
            f"{setting}: your paged_gather changed the tensors it was given (an in-place operation)"
        )
        want = paged_gather(pool, block_tables)
        assert isinstance(got, torch.Tensor) and got.shape == want.shape, (
            f"{setting}, your gather's shape is {tuple(getattr(got, 'shape', ()))}; the reference's is "
            f"{tuple(want.shape)}: (rows, max_blocks * block_size, kv heads, head_dim)"
        )
        assert got.dtype == want.dtype, (
            f"{setting}, your gather returns {got.dtype}; the pool holds {want.dtype}: read the pool's numbers as "
            "they are (a tensor made with torch.zeros or torch.empty is float32 unless you give it the pool's dtype)"
        )
        assert torch.equal(got, want), f"{setting}, your gather's numbers differ from the reference's"

    return run


def check_drawn(paging, check_books, examples: int = 60) -> None:
    against_reference("your allocator", operations(), compare_allocator(paging.Allocator, check_books), examples)
    against_reference("slot_mapping", slot_cases(), compare_slot_mapping(paging.slot_mapping), examples)
    against_reference("paged_gather", gather_cases(), compare_gather(paging.paged_gather), examples)
