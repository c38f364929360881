"""BlockAllocator: invariants under random use, and a clear error on exhaustion."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minillm.engine.blocks import BlockAllocator, BlockPoolExhausted

operations = st.lists(
    st.tuples(st.sampled_from(["allocate", "append", "free", "truncate"]), st.integers(0, 5), st.integers(1, 40)),
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
            elif op == "truncate" and seq in alloc.tables:  # (speculative decoding's rollback)
                alloc.truncate(seq, n % (alloc.lengths[seq] + 1))
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


def computed(alloc: BlockAllocator, seq: int, ids: list[int]) -> list[int]:
    """A newcomer as the engine serves it: its cached prefix, then the rest stored and its full blocks keyed."""
    hits = alloc.cached_prefix(ids)
    alloc.share_prefix(seq, hits)
    alloc.append(seq, len(ids) - len(hits) * alloc.block_size)
    alloc.cache_full_blocks(seq, ids)
    return hits


def test_a_block_computed_twice_is_still_found_when_one_copy_is_evicted():
    alloc = BlockAllocator(num_blocks=7, block_size=4, prefix_caching=True)
    prompt = list(range(9))  # 2 full blocks and a token
    for seq in (1, 2):  # side by side: both computed before either was keyed
        alloc.append(seq, len(prompt))
    alloc.cache_full_blocks(1, prompt)
    alloc.cache_full_blocks(2, prompt)
    first, second = alloc.tables[1][:2], alloc.tables[2][:2]
    assert [list(alloc.block_of[alloc.key_of[b]]) for b in first] == [[a, b] for a, b in zip(first, second)]
    assert alloc.cached_prefix(prompt + [9]) == first, "a key names both copies; a lookup takes the first"
    alloc.free(1)  # its blocks go to the free list after the one block never used: the next to be handed out
    alloc.allocate(3, 16)  # takes all four for other tokens
    assert set(first) <= set(alloc.tables[3]) and alloc.events["evicted_keyed"] == 2
    assert alloc.cached_prefix(prompt + [9]) == second, "the other copy answers for the tokens now"
    alloc.free(3)
    assert computed(alloc, 4, prompt + [9]) == second and alloc.events["hit_blocks"] == 2
    alloc.check()
    for seq in (2, 4):
        alloc.free(seq)
    alloc.check()
    assert alloc.num_free == 7


def test_a_sequence_at_a_block_boundary_goes_on_with_blocks_cached_since():
    alloc = BlockAllocator(num_blocks=8, block_size=4, prefix_caching=True)
    prompt = list(range(13))
    computed(alloc, 1, prompt)  # 3 full blocks keyed
    alloc.share_prefix(2, alloc.cached_prefix(prompt)[:1])  # a sequence that took only the first block...
    more = alloc.cached_prefix(prompt)[1:]
    assert alloc.share_prefix(2, more) == 8 and alloc.tables[2] == alloc.tables[1][:3]  # ...takes the next two
    alloc.append(2, 1)  # the last token, into a block of its own
    with pytest.raises(ValueError, match="partly filled block"):
        alloc.share_prefix(2, [])
    alloc.check()


def test_a_write_into_a_shared_block_is_counted_and_fails_the_check():
    alloc = BlockAllocator(num_blocks=4, block_size=4, prefix_caching=True)
    alloc.append(1, 3)  # one block, 3 of 4 slots filled
    block = alloc.tables[1][0]
    alloc.tables[2], alloc.lengths[2] = [block], 3  # a bug sharing a partly filled block
    alloc.ref_counts[block] += 1
    alloc.extra_holds += 1
    alloc.check()  # the books still add up...
    alloc.append(1, 1)  # ...but this token lands in a block sequence 2 reads
    assert alloc.events["shared_writes"] == 1
    with pytest.raises(AssertionError, match="written into a block that is shared or keyed"):
        alloc.check()
