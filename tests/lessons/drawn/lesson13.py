"""Lesson 13's differential checks: your five functions against the reference on drawn prompts, fleets and numbers.

- prompt_keys: 0 to 40 token ids (bytes, 0 and 255, the special ids 256 to 259), blocks of 1 to 8 tokens (prompts
  that end on a block boundary, one short and one past);
- matched_blocks: a drawn prompt's keys, and a replica holding a drawn run of them from the first, with holes (an
  evicted block) and keys of other prompts;
- route: the keys of a 6-block prompt, 1 to 4 replicas whose caches hold runs of 0 to 6 of its blocks (holes
  included), loads from 0, 5, 10, 20, 35, 40, 100 (ties of load, ties of run, loads exactly at the overload limit:
  35 = 1.5 x 10 + 20), a cost of 0, 10 or 20, min_match 0 to 3, overload_factor 1, 1.5 or 3;
- kv_bytes: 1 to 128 layers, 1 to 16 kv heads each read by 1 to 8 query heads, head_dim 1 to 256, 0 to 10**6
  tokens, 32, 16, 8 or 4-bit KV, tp any divisor of the kv heads;
- transfer_s: 0 to 10**11 bytes over 1 to 800 Gb/s, 0 to 100 us of latency.
"""

from __future__ import annotations

import random

from hypothesis import strategies as st

from minillm.serving.routing import prompt_keys
from tests.lessons.differential import against_reference, near

SPECIALS = [0, 255, 256, 257, 258, 259]


def tokens_of(n: int, seed: int, specials: bool) -> list[int]:
    """n token ids from a seed (cheaper to draw than id by id): bytes, with the range's ends and the special ids
    256 to 259 among them when `specials`."""
    rng = random.Random(seed)
    return [rng.choice(SPECIALS) if specials and rng.random() < 0.3 else rng.randrange(256) for _ in range(n)]


@st.composite
def key_cases(draw):
    block_size = draw(st.integers(1, 8))
    n = draw(near([block_size, 2 * block_size, 3 * block_size], 0, 40))
    return tokens_of(n, draw(st.integers(0, 999)), draw(st.booleans())), block_size


OTHER = prompt_keys(tokens_of(12, 7, True), 4)  # another prompt's blocks, held by some replicas


@st.composite
def held_by(draw, keys: list[bytes]) -> set[bytes]:
    """A replica's cache: a run of the keys from the first, maybe a hole, maybe keys of another prompt."""
    held = set(keys[: draw(st.integers(0, len(keys)))])
    if keys and draw(st.booleans()):
        held.discard(keys[draw(st.integers(0, len(keys) - 1))])  # an evicted block
    return held | (set(OTHER) if draw(st.booleans()) else set())


@st.composite
def match_cases(draw):
    tokens, block_size = draw(key_cases())
    keys = prompt_keys(tokens, block_size)
    return keys, draw(held_by(keys))


PROMPT = prompt_keys(tokens_of(24, 3, True), 4)  # six blocks


@st.composite
def route_cases(draw):
    n = draw(st.integers(1, 4))
    loads = [draw(st.sampled_from([0, 10, 20, 35, 5, 40, 100])) for _ in range(n)]
    caches = [draw(held_by(PROMPT)) for _ in range(n)]
    cost, min_match = draw(st.sampled_from([0, 10, 20])), draw(st.integers(0, 3))
    return PROMPT, loads, caches, cost, min_match, draw(st.sampled_from([1.5, 1.0, 3.0]))


def describe_fleet(keys, loads, caches, cost, min_match, factor) -> str:
    held = []
    for cache in caches:
        blocks = [i for i, k in enumerate(keys) if k in cache]
        held.append(f"blocks {blocks}" if blocks else "none of its blocks")
    replicas = "; ".join(f"replica {i}: load {load}, holds {h}" for i, (load, h) in enumerate(zip(loads, held)))
    return (
        f"route, a prompt of {len(keys)} blocks, {replicas}; cost {cost}, min_match {min_match}, "
        f"overload_factor {factor}"
    )


@st.composite
def kv_cases(draw):
    kv_heads = draw(st.integers(1, 16))
    heads, layers = kv_heads * draw(st.integers(1, 8)), draw(st.integers(1, 128))
    head_dim, tokens = draw(st.one_of(st.sampled_from([128, 1]), st.integers(1, 256))), draw(
        st.sampled_from([0, 1, draw(st.integers(0, 10**6))]))  # fmt: skip
    bits = draw(st.sampled_from([16, 8, 4, 32]))
    tp = draw(st.sampled_from([d for d in range(1, kv_heads + 1) if kv_heads % d == 0]))
    where = (
        f"{layers} layers, {heads} query heads over {kv_heads} kv heads of {head_dim}, a {tokens:,}-token prompt, "
        f"{bits}-bit KV, on {tp} card(s)"
    )
    return where, (layers, heads, kv_heads, head_dim, tokens, bits, tp)


@st.composite
def transfer_cases(draw):
    nbytes = draw(st.sampled_from([0, 1, draw(st.integers(0, 10**11))]))
    gbit, latency = (
        draw(st.sampled_from([400, 1, draw(st.integers(1, 800))])),
        draw(st.sampled_from([0.0, 10e-6, 1e-4])),
    )
    return f"{nbytes:,} bytes over {gbit} Gb/s, {latency * 1e6:g} us latency", (nbytes, gbit, latency)


def check_drawn(impl, lesson, examples: int = 80) -> None:
    """`lesson`: the test module (its reference functions, diagnoses and check_numbers), used on each drawn case."""

    def keys(drawn):
        tokens, block_size = drawn
        lesson.check_keys_case(impl, tokens, block_size, f"prompt_keys, a {len(tokens)}-token prompt {tokens}")

    def matched(drawn):
        keys, held = drawn
        shown = [i for i, k in enumerate(keys) if k in held]
        label = f"of a prompt of {len(keys)} blocks, holds blocks {shown}" + (" and others" if len(held) > len(shown)
                                                                             else "")  # fmt: skip
        lesson.check_matched_case(impl, keys, held, label)

    def route(drawn):
        keys, loads, caches, cost, min_match, factor = drawn
        answer = lesson.route(keys, loads, caches, cost, min_match, factor)
        where = describe_fleet(keys, loads, caches, cost, min_match, factor)
        lesson.check_route_case(impl, keys, loads, caches, cost, min_match, factor, answer, {}, where)

    against_reference("prompt_keys", key_cases(), keys, examples)
    against_reference("matched_blocks", match_cases(), matched, examples)
    against_reference("route", route_cases(), route, examples * 2)
    kv = lambda case: lesson.check_numbers("kv_bytes", impl.kv_bytes, [case])  # noqa: E731
    against_reference("kv_bytes", kv_cases(), kv, examples)
    transfer = lambda case: lesson.check_numbers("transfer_s", impl.transfer_s, [case])  # noqa: E731
    against_reference("transfer_s", transfer_cases(), transfer, examples)
