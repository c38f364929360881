"""BlockAllocator: invariants under random use, and a clear error on exhaustion."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minillm.engine.blocks import BlockAllocator, BlockPoolExhausted

operations = st.lists(
    st.tuples(st.sampled_from(["allocate", "append", "free"]), st.integers(0, 5), st.integers(1, 40)),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 24), st.integers(1, 8), operations)
def test_random_operations_keep_every_invariant(num_blocks, block_size, ops):
    alloc = BlockAllocator(num_blocks, block_size)
    for op, seq, n in ops:
        before = (alloc.num_free, {s: list(t) for s, t in alloc.tables.items()})
        try:
            if op == "allocate" and seq not in alloc.tables:
                alloc.allocate(seq, n)
            elif op == "append":
                alloc.append(seq, n)
            elif op == "free":
                alloc.free(seq)
        except BlockPoolExhausted:
            after = (alloc.num_free, {s: list(t) for s, t in alloc.tables.items()})
            assert after == before, "a failed allocation must change nothing"
        alloc.check()
        for s, table in alloc.tables.items():
            assert len(table) * block_size >= alloc.lengths[s] > (len(table) - 1) * block_size
    for seq in list(alloc.tables):
        alloc.free(seq)
    alloc.check()
    assert alloc.num_free == num_blocks and sorted(alloc.free_blocks) == list(range(num_blocks))


def test_exhaustion_raises_a_specific_clear_error():
    alloc = BlockAllocator(num_blocks=4, block_size=16)
    alloc.allocate(0, 48)  # 3 blocks
    assert alloc.can_allocate(16) and not alloc.can_allocate(17)
    with pytest.raises(BlockPoolExhausted, match="needs 2 more block"):
        alloc.allocate(1, 20)
    assert 1 not in alloc.tables and alloc.num_free == 1


def test_blocks_are_given_one_at_a_time_as_a_sequence_grows():
    alloc = BlockAllocator(num_blocks=10, block_size=4)
    assert alloc.allocate(7, 4) == [0]  # exactly one full block
    assert alloc.append(7) == [1]  # the fifth token opens a second block
    assert alloc.append(7, 3) == []  # ...which has room for three more
    assert alloc.append(7) == [2]
    alloc.free(7)
    assert alloc.num_free == 10
