"""Lesson 12's differential checks: your five functions against the reference on drawn shapes and numbers.

- shard_qkv: 1, 2, 3, 4 or 6 kv heads, each read by 1 to 3 query heads, head_dim 1 to 5, dim 1 to 12, tp any divisor
  of the kv heads (so a card may hold several kv heads, one, or all), every rank;
- shard_down: a (1 to 8, tp x 1 to 4) weight, tp 1 to 4, every rank;
- tp_mlp: 1 to 3 tokens of width 1 to 8, ffn tp x 1 to 4, tp 1 to 4 (a width of 1, one token, tp = ffn on purpose);
- card_memory_gib: 1 to 10**11 weights, KV of 0 to 10**6 bytes a token, 0 to 10**6 tokens, tp 1 to 8, 32, 16, 8,
  4.125 or 4-bit weights;
- allreduce_bytes: hidden 1 to 16,384, 1 to 128 layers, 1 to 4,096 tokens, tp 1 to 8, 32, 16, 8 or 4-bit activations.
"""

from __future__ import annotations

from hypothesis import strategies as st

from tests.lessons.differential import against_reference


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@st.composite
def qkv_shapes(draw):
    kv_heads = draw(st.sampled_from([1, 2, 3, 4, 6]))
    heads, head_dim, dim = kv_heads * draw(st.integers(1, 3)), draw(st.integers(1, 5)), draw(st.integers(1, 12))
    tp = draw(st.sampled_from(divisors(kv_heads)))
    return heads, kv_heads, head_dim, dim, tp, draw(st.integers(0, tp - 1))


@st.composite
def down_shapes(draw):
    tp = draw(st.integers(1, 4))
    return draw(st.integers(1, 8)), tp * draw(st.integers(1, 4)), tp, draw(st.integers(0, tp - 1))


@st.composite
def mlp_shapes(draw):
    tp = draw(st.integers(1, 4))
    return draw(st.integers(1, 3)), draw(st.integers(1, 8)), tp * draw(st.integers(1, 4)), tp, draw(st.integers(0, 99))


@st.composite
def memory_cases(draw):
    params, per_token = (
        draw(st.integers(1, 10**11)),
        draw(st.sampled_from([0, 96, 131072, draw(st.integers(1, 10**6))])),
    )
    tokens, tp = draw(st.sampled_from([0, 1, draw(st.integers(0, 10**6))])), draw(st.integers(1, 8))
    bits = draw(st.sampled_from([16, 8, 4.125, 4, 32]))
    where = f"{params:,} weights of {bits} bits, {per_token:,} bytes of KV a token, {tokens:,} tokens, on {tp} card(s)"
    return where, (params, per_token, tokens, tp, bits)


@st.composite
def allreduce_cases(draw):
    hidden, layers = draw(st.sampled_from([1, 8, 8192, draw(st.integers(1, 16384))])), draw(st.integers(1, 128))
    tokens, tp, bits = draw(st.sampled_from([1, draw(st.integers(1, 4096))])), draw(st.integers(1, 8)), draw(
        st.sampled_from([16, 8, 4, 32]))  # fmt: skip
    where = f"hidden {hidden}, {layers} layers, {tokens} token(s) a step on {tp} card(s), {bits}-bit activations"
    return where, (hidden, layers, tokens, tp, bits)


def check_drawn(impl, lesson, examples: int = 60) -> None:
    """`lesson`: the test module's own checks (its referee, diagnoses and numbering), used on each drawn case."""

    def qkv(shape):
        heads, kv_heads, head_dim, dim, tp, rank = shape
        lesson.check_qkv_case(impl, heads, kv_heads, head_dim, dim, tp, rank)

    def down(shape):
        dim, ffn, tp, rank = shape
        lesson.check_down_case(impl, dim, ffn, tp, rank)

    def mlp(shape):
        tokens, dim, ffn, tp, seed = shape
        lesson.check_mlp_case(impl, tokens, dim, ffn, tp, seed)

    against_reference("shard_qkv", qkv_shapes(), qkv, examples)
    against_reference("shard_down", down_shapes(), down, examples)
    against_reference("tp_mlp", mlp_shapes(), mlp, examples)
    memory = lambda case: lesson.check_numbers("card_memory_gib", impl.card_memory_gib, [case])  # noqa: E731
    against_reference("card_memory_gib", memory_cases(), memory, examples)
    allreduce = lambda case: lesson.check_numbers("allreduce_bytes", impl.allreduce_bytes, [case])  # noqa: E731
    against_reference("allreduce_bytes", allreduce_cases(), allreduce, examples)
