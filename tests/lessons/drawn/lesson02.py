"""Lesson 02's differential checks: your append_kv and cached_attention against the reference on drawn shapes.

A drawn attention case: 1 to 3 kv heads, each serving 1 to 3 query heads (MHA, GQA and MQA, groups of 3 too);
head_dim 1, 2, 3, 4 or 8 (1: where the scale is 1); a cache of S = 1 to 7 keys, T = 1 to S of them new (the
queries at positions S - T .. S - 1: a decode step, a chunk, a whole prefill); numbers either of the usual size
(float32, like the model's) or large (float64, scores in the hundreds, where exp() overflows: a softmax must
subtract its row's max). A drawn append: nothing or 1 to 5 cached tokens, 1 to 4 new, 1 to 3 kv heads, head_dim
1 to 4, float32 or float64.
"""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from minillm.model.attention import reference_attention, visible_mask
from tests.lessons.differential import against_reference, plural
from tests.lessons.harness import case

SIZES = {"usual": (torch.float32, 1.0), "large": (torch.float64, 30.0)}  # dtype, scale of q and k


@st.composite
def attention_cases(draw):
    kv_heads, group = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    head_dim, S = draw(st.sampled_from([1, 2, 3, 4, 8])), draw(st.integers(1, 7))
    T = draw(st.one_of(st.just(1), st.just(S), st.integers(1, S)))
    return kv_heads * group, kv_heads, head_dim, S, T, draw(st.sampled_from(list(SIZES))), draw(st.integers(0, 999))


def attention_inputs(drawn):
    H, Hkv, D, S, T, size, seed = drawn
    dtype, scale = SIZES[size]
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, T, H, D, generator=g, dtype=dtype) * scale
    k = torch.randn(1, S, Hkv, D, generator=g, dtype=dtype) * scale
    v = torch.randn(1, S, Hkv, D, generator=g, dtype=dtype)
    return q, k, v, torch.arange(S - T, S)[None]  # (1, T, H, D), (1, S, Hkv, D) x2, (1, T)


def describe_attention(drawn) -> str:
    H, Hkv, D, S, T, size, _ = drawn
    at = f"position {S - 1}" if T == 1 else f"positions {S - T}..{S - 1}"
    where = "a decode step" if T == 1 else "a whole prefill" if T == S else "a chunk"
    numbers = "numbers of the usual size (float32)" if size == "usual" else "large scores (float64, in the hundreds)"
    return (
        f"with {plural(H, 'query head')} over {plural(Hkv, 'kv head')}, head_dim {D}, a cache of {plural(S, 'key')} "
        f"and {plural(T, 'new query', 'new queries')} at {at} ({where}; {numbers})"
    )


def compare_attention(attention, unchanged):
    def run(drawn):
        q, k, v, positions = attention_inputs(drawn)
        given = {"q": q, "k": k, "v": v, "q_positions": positions}
        args = {name: x.clone() for name, x in given.items()}
        setting = describe_attention(drawn)
        with case(setting):
            got = attention(args["q"], args["k"], args["v"], args["q_positions"])
        unchanged(f"{setting}: cached_attention", given, args)
        want = reference_attention(q, k, v, visible_mask(positions, k.shape[1]))
        assert isinstance(got, torch.Tensor) and got.shape == want.shape, (
            f"{setting}: expected a tensor of shape {tuple(want.shape)}, got {getattr(got, 'shape', type(got))}"
        )
        if torch.allclose(got.to(want.dtype), want, rtol=1e-4, atol=1e-5):
            return
        error = (got.to(want.dtype) - want).abs().nan_to_num(float("inf"))  # (1, T, H, D)
        t, h = divmod(int(error.amax(-1).flatten().argmax()), q.shape[2])
        nan = (
            " (yours holds NaN: an exp() that overflowed? softmax(x) = softmax(x - max x))" if got.isnan().any() else ""
        )
        raise AssertionError(
            f"{setting}, your attention differs from softmax(q k^T / sqrt(head_dim)) v by up to "
            f"{float(error.max()):.3g}, first at the query at position {int(positions[0, t])}, head {h}{nan}\n"
            f"  yours there:     {got[0, t, h].tolist()}\n  the reference's: {want[0, t, h].tolist()}"
        )

    return run


@st.composite
def append_cases(draw):
    cached = draw(st.one_of(st.none(), st.integers(1, 5)))
    new, kv_heads, head_dim = draw(st.integers(1, 4)), draw(st.integers(1, 3)), draw(st.integers(1, 4))
    return cached, new, kv_heads, head_dim, draw(st.sampled_from(list(SIZES))), draw(st.integers(0, 999))


def compare_append(append, unchanged):
    def run(drawn):
        S, T, Hkv, D, size, seed = drawn
        g = torch.Generator().manual_seed(seed)
        dtype = SIZES[size][0]
        cached = None if S is None else torch.randn(1, S, Hkv, D, generator=g, dtype=dtype)
        new = torch.randn(1, T, Hkv, D, generator=g, dtype=dtype)
        given = {"new": new} if cached is None else {"cached": cached, "new": new}
        args = {name: x.clone() for name, x in given.items()}
        before = "nothing cached" if S is None else f"{plural(S, 'cached token')}"
        setting = f"with {before}, {plural(T, 'new token')}, {plural(Hkv, 'kv head')}, head_dim {D} ({dtype})"
        with case(setting):
            got = append(args.get("cached"), args["new"])
        unchanged(f"{setting}: append_kv", given, args)
        want = new if cached is None else torch.cat([cached, new], dim=1)
        assert isinstance(got, torch.Tensor) and got.shape == want.shape, (
            f"{setting}, append_kv returned shape {tuple(getattr(got, 'shape', ()))}; expected {tuple(want.shape)}: "
            "(1, cached + new tokens, kv heads, head_dim)"
        )
        assert torch.equal(got, want), f"{setting}, append_kv's tokens are not the cached ones then the new, in order"

    return run


def check_drawn(append, attention, unchanged, examples: int = 80) -> None:
    against_reference("append_kv", append_cases(), compare_append(append, unchanged), examples // 2)
    against_reference("cached_attention", attention_cases(), compare_attention(attention, unchanged), examples)
