"""Lesson 09's differential check: your prefix allocator beside the reference, operation by operation.

A drawn history: a pool of 2 to 12 blocks of 1, 2 or 4 tokens; 1 to 14 operations on sequences 0 to 3: admissions
of a prompt that starts like one of three token runs (ids 0, 1 and BOS, so that prompts share beginnings and hit the
cache often) and is 1 token to six blocks long (whole blocks on purpose: a prompt all cached must still leave its
last token), growths by 1 to 6 tokens, each followed by cache_full_blocks on the tokens computed so far (all, or
all but the last token or block's worth: a chunk still in flight), and frees (so cached blocks wait on the free
list, are hit there, and are evicted least recently freed first; pools of 2, 3, 4, 6 or 12 blocks).

Both allocators take the same steps; where a key has several copies, any is right, so the reference takes the copy
you took (when it holds the same tokens). After every operation the two must agree on everything but the keys'
values: the tables, the lengths, the reference counts, the free list in its order, which blocks have a key, which
blocks share one, and every hit's count.
"""

from __future__ import annotations

from hypothesis import strategies as st

from minillm.engine.blocks import BlockPoolExhausted
from tests.lessons.differential import against_reference, plural
from tests.lessons.harness import case

ALPHABET = [0, 1, 257]


@st.composite
def histories(draw):
    num_blocks, bs = draw(st.sampled_from([2, 3, 4, 6, 12])), draw(st.sampled_from([1, 2, 4]))
    starts = [draw(st.lists(st.sampled_from(ALPHABET), min_size=6 * bs, max_size=6 * bs)) for _ in range(3)]
    ops = []
    for _ in range(draw(st.integers(1, 14))):
        op, seq = draw(st.sampled_from(["admit", "admit", "grow", "free", "free"])), draw(st.integers(0, 3))
        lag = draw(st.sampled_from([0, 0, 0, 1, bs]))  # tokens stored but not computed yet (a chunk in flight)
        if op == "admit":
            n = draw(st.one_of(st.sampled_from([bs, 2 * bs, bs + 1, 1]), st.integers(1, 6 * bs)))
            ops.append(("admit", seq, starts[draw(st.integers(0, 2))][:n], lag))
        elif op == "grow":
            ops.append(("grow", seq, draw(st.lists(st.sampled_from(ALPHABET), min_size=1, max_size=6)), lag))
        else:
            ops.append(("free", seq, [], 0))
    return num_blocks, bs, ops


def books(alloc) -> dict:
    """Everything the two allocators must agree on (the keys' own values may differ: any hashable will do)."""
    return {
        "tables": {s: list(t) for s, t in sorted(alloc.tables.items())},
        "lengths": dict(sorted(alloc.lengths.items())),
        "reference counts": list(alloc.ref_counts),
        "free list (least recently freed first)": list(alloc.free_blocks),
        "blocks with a key": sorted(alloc.key_of),
        "blocks sharing a key": sorted(sorted(blocks) for blocks in alloc.block_of.values() if blocks),
    }


def shown(op: str, seq: int, ids: list[int], lag: int) -> str:
    computed = f" (all but the last {plural(lag, 'token')} computed)" if lag else ""
    return f"free {seq}" if op == "free" else f"{op} {seq} {ids}{computed}"


def compare(Allocator, Reference):
    def run(drawn):
        num_blocks, bs, ops = drawn
        pool = f"a pool of {plural(num_blocks, 'block')} of {plural(bs, 'token')}"
        yours, ref, tokens, done = Allocator(num_blocks, bs), Reference(num_blocks, bs), {}, []
        computed: dict[int, int] = {}  # seq -> its tokens with keys and values computed (a prefix of its tokens)
        for op, seq, ids, lag in ops:
            done.append(shown(op, seq, ids, lag))
            where = f"with {pool}, after {', '.join(done)}"
            if op == "admit" and seq not in tokens:
                given = list(ids)
                with case(f"{where}: cached_prefix"):
                    mine = list(yours.cached_prefix(given))
                assert given == ids, f"{where}: your cached_prefix changed the token list it was given"
                theirs = ref.cached_prefix(list(ids))
                same = len(mine) == len(theirs) and all(
                    ref.key_of.get(m) is not None and ref.key_of.get(m) == ref.key_of.get(t)
                    for m, t in zip(mine, theirs)
                )
                assert same, (
                    f"{where}: your cached_prefix found {plural(len(mine), 'block')} {mine}; the reference finds "
                    f"{plural(len(theirs), 'block')} {theirs} (the longest run of cached full blocks from the start, "
                    "leaving the prompt's last token)"
                )
                with case(f"{where}: share_prefix"):
                    yours.share_prefix(seq, list(mine))
                ref.share_prefix(seq, list(mine))  # the copies you took: any copy is right
                tokens[seq], computed[seq] = list(ids), len(mine) * bs
                upto = max(computed[seq], len(ids) - lag)
                if grow(yours, ref, seq, len(ids) - len(mine) * bs, tokens[seq][:upto], where):
                    computed[seq] = upto
                else:  # a newcomer that did not fit gives back what it shared
                    del tokens[seq]
                    free(yours, ref, seq, where)
            elif op == "grow" and seq in tokens:
                upto = max(computed[seq], len(tokens[seq]) + len(ids) - lag)
                if grow(yours, ref, seq, len(ids), (tokens[seq] + list(ids))[:upto], where):
                    tokens[seq], computed[seq] = tokens[seq] + list(ids), upto
            elif op == "free" and seq in tokens:
                del tokens[seq]
                free(yours, ref, seq, where)
            mine, theirs = books(yours), books(ref)
            for what in theirs:
                assert mine[what] == theirs[what], (
                    f"{where}: your allocator's {what}: {mine[what]}; the reference's: {theirs[what]}"
                )

    return run


def grow(yours, ref, seq: int, n: int, ids: list[int], where: str) -> bool:
    """Append n tokens to seq on both, then key the full blocks of its computed tokens `ids`; False when the pool is
    full (on both)."""
    try:
        ref.append(seq, n)
    except BlockPoolExhausted:
        fits = False
    else:
        fits = True
        ref.cache_full_blocks(seq, list(ids))
    with case(f"{where}: append({seq}, {n})"):
        try:
            yours.append(seq, n)
        except BlockPoolExhausted:
            assert not fits, f"{where}: append({seq}, {n}) raised BlockPoolExhausted; the reference's fits"
            return False
    assert fits, f"{where}: append({seq}, {n}) fits in yours; the reference's pool is full (it raises)"
    given = list(ids)
    with case(f"{where}: cache_full_blocks"):
        yours.cache_full_blocks(seq, given)
    assert given == ids, f"{where}: your cache_full_blocks changed the token list it was given"
    return True


def free(yours, ref, seq: int, where: str) -> None:
    with case(f"{where}: free({seq})"):
        yours.free(seq)
    ref.free(seq)


def check_drawn(Allocator, Reference, examples: int = 120) -> None:
    against_reference("your allocator", histories(), compare(Allocator, Reference), examples)
