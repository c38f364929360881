"""Lesson 02: a KV cache. Run: pytest -m lesson02

Your append_kv and cached_attention, plugged into the real model through SimpleKVCache, must give
the same logits and tokens as the model without a cache.

Both must also leave their arguments as they were (a query scaled in place gives the right attention, and a
wrong q to whoever reads it next), and append_kv must take every new token of a chunk, not just one.

WRONG and KNOWN_MISTAKES (below) list the mistakes a room makes, each caught; CORRECT, attention written
differently (expand, a -1e9 fill, a mask aligned to the cache's end, torch's sdpa, a loop over heads) and
CORRECT_APPEND, appends, that must pass.

Then the differential checks (tests/lessons/drawn/lesson02.py), against the reference on drawn inputs (seeded: the
same every run; MINILLM_CHECK_EXAMPLES=N draws N), the smallest that differs shown first. Strategies:
- cached_attention (80 draws): 1 to 3 kv heads times groups of 1 to 3 query heads (MHA, GQA, MQA); head_dim 1, 2,
  3, 4, 8; S = 1 to 7 keys, T = 1 (decode), S (prefill) or between (a chunk), the queries at S - T .. S - 1;
  usual numbers (float32) or large scores (float64, hundreds: exp() overflows);
- append_kv (40 draws): nothing cached or 1 to 5 tokens, 1 to 4 new, 1 to 3 kv heads, head_dim 1 to 4, float32 or
  float64; your arguments left as they were.
DRAWN_ONLY names the wrong versions only the drawn inputs catch.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from minillm.model.attention import attend, reference_attention, visible_mask
from tests.lessons.drawn.lesson02 import check_drawn
from tests.lessons.harness import CHECKS, case, implementations, small_model, stub, student_module

lesson = pytest.mark.lesson02  # your code's checks: pytest -m lesson02


def reference_append(cached, new):
    return new if cached is None else torch.cat([cached, new], dim=1)


def reference_cached_attention(q, k, v, q_positions):
    return attend(q, k, v, visible_mask(q_positions, k.shape[1]))


@pytest.fixture(params=implementations(lesson))
def kv(request):
    if request.param == "reference":
        return SimpleNamespace(append=reference_append, attention=reference_cached_attention)
    module = student_module("lesson02_kv_cache")
    return SimpleNamespace(append=module.append_kv, attention=module.cached_attention)


# --- plausible mistakes (the checks must catch each one) -----------------------------------------
def make_attention(
    mask="positions", scale=True, gqa="repeat_interleave", softmax_dim=-1, fill=float("-inf"), softmax="torch"
):
    """Attention written out by hand, optionally with one mistake (or written differently, see CORRECT)."""

    def attention(q, k, v, q_positions):
        T, H, D = q.shape[1:]
        S, Hkv = k.shape[1], k.shape[2]
        group = H // Hkv
        if scale == "q-in-place":  # right scores, but the caller's q is divided too (wrong)
            q /= math.sqrt(D)
        elif scale == "k-in-place":  # the same on the keys: in the model, the CACHED keys shrink every step (wrong)
            k /= math.sqrt(D)
        if gqa == "repeat_interleave":  # kv head j serves query heads j*group .. (j+1)*group - 1
            k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
        elif gqa == "expand":  # the same, without a copy: (1, S, Hkv, group, D) viewed as (1, S, H, D)
            k, v = (x[:, :, :, None].expand(-1, -1, -1, group, -1).reshape(1, S, H, D) for x in (k, v))
        else:  # tiles the kv heads: query head i reads kv head i % Hkv (wrong)
            k, v = k.repeat(1, 1, group, 1), v.repeat(1, 1, group, 1)
        scores = torch.einsum("bthd,bshd->bhts", q, k)  # (1, H, T, S)
        if scale == "head_dim":  # by d, not by its square root (wrong)
            scores = scores / D
        elif scale is True:
            scores = scores / math.sqrt(D)
        keys, pos = torch.arange(S), q_positions[0][:, None]  # (S,), (T, 1)
        visible = {
            "positions": keys <= pos,
            "strict": keys < pos,
            "top-left": torch.ones(T, S, dtype=torch.bool).tril(),  # as if the queries started at position 0
            "bottom-right": torch.ones(T, S, dtype=torch.bool).tril(S - T),  # the new tokens are the cache's last
            "none": torch.ones(T, S, dtype=torch.bool),
        }[mask]
        probs = scores.masked_fill(~visible, fill).softmax(dim=softmax_dim)
        if softmax == "by-hand":  # exp(x) / sum exp(x), the formula as written: exp overflows past 88 (wrong)
            weights = scores.masked_fill(~visible, fill).exp()
            probs = weights / weights.sum(dim=softmax_dim, keepdim=True)
        return torch.einsum("bhts,bshd->bthd", probs, v)

    return attention


def prepend(cached, new):
    return new if cached is None else torch.cat([new, cached], dim=1)


def on_the_heads(cached, new):  # concatenates along the kv heads, not the tokens (wrong)
    return new if cached is None else torch.cat([cached, new], dim=2)


def forgets_the_cache(cached, new):  # keeps only this step's keys (wrong)
    return new


def appends_the_last_new_token(cached, new):  # as if a forward always brought one token: a chunk loses its head (wrong)
    return new if cached is None else torch.cat([cached, new[:, -1:]], dim=1)


def into_a_new_tensor(cached, new):
    """Right, written differently: an empty tensor of the final size, filled in two slices."""
    if cached is None:
        return new.clone()
    S, T = cached.shape[1], new.shape[1]
    out = cached.new_empty(1, S + T, *new.shape[2:])  # (1, S + T, Hkv, D)
    out[:, :S], out[:, S:] = cached, new
    return out


def concat_from_the_end(cached, new):
    """Right, written differently: the tokens named as dim -3, counted from the end, and a tuple to torch.concat."""
    return new if cached is None else torch.concat((cached, new), dim=-3)


def head_by_head(q, k, v, q_positions):
    """Right, written differently: a loop over query heads with matmul, kv head h // group for query head h, and
    the mask cut from a full causal one at the queries' first position (the new tokens are contiguous)."""
    T, H, D = q.shape[1:]
    S, group = k.shape[1], q.shape[2] // k.shape[2]
    start = int(q_positions[0, 0])
    causal = torch.ones(S, S, dtype=torch.bool).tril()[start : start + T]  # (T, S): rows of the queries' positions
    heads = []
    for h in range(H):
        qh, kh, vh = q[0, :, h], k[0, :, h // group], v[0, :, h // group]  # (T, D), (S, D), (S, D)
        scores = (qh @ kh.T) * D**-0.5  # (T, S)
        heads.append(scores.masked_fill(~causal, float("-inf")).softmax(-1) @ vh)  # (T, D)
    return torch.stack(heads, dim=1)[None]  # (1, T, H, D)


def no_repeat(q, k, v, q_positions):  # the kv heads never repeated: right for MHA, a crash where n_kv_heads < n_heads
    scores = torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(q.shape[-1])  # (1, H, T, S)
    visible = torch.arange(k.shape[1]) <= q_positions[0][:, None]  # (T, S)
    return torch.einsum("bhts,bshd->bthd", scores.masked_fill(~visible, float("-inf")).softmax(-1), v)


def sdpa_attention(q, k, v, q_positions):
    """Right, with torch's own attention and a boolean mask (True: may attend)."""
    group = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
    visible = torch.arange(k.shape[1]) <= q_positions[0][:, None]  # (T, S)
    out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=visible
    )  # (1, H, T, D)
    return out.transpose(1, 2)


KNOWN_MISTAKES = {
    "there is no causal mask: a query sees keys after its own position": make_attention(mask="none"),
    "the scores are not divided by sqrt(head_dim)": make_attention(scale=False),
    "the scores are divided by head_dim: divide by its square root": make_attention(scale="head_dim"),
    "the softmax runs over the queries (dim -2): each query's weights over the keys must sum to 1, dim=-1": (
        make_attention(softmax_dim=-2)
    ),
    "a query may not see its own key: use <=, not <": make_attention(mask="strict"),
    "the mask ignores q_positions (it assumes the queries start at position 0)": make_attention(mask="top-left"),
    "query head i reads kv head i % n_kv_heads: use repeat_interleave, not repeat": make_attention(gqa="repeat"),
}


# --- the checks --------------------------------------------------------------------------------
def check_unchanged(what: str, given: dict[str, torch.Tensor], passed: dict[str, torch.Tensor]) -> None:
    """Your function must leave its arguments as they were (`passed`, compared with copies taken before the call):
    its caller (the model, the cache) still reads them."""
    for name, before in given.items():
        now = passed[name]
        assert now.shape == before.shape and torch.equal(now, before), (
            f"{what}: the {name} it was given has changed (an in-place op on an argument: /=, +=, a method ending "
            "in _): compute on new tensors (x = x / d, not x /= d); the caller still reads it"
        )


def check_append(append) -> None:
    torch.manual_seed(0)
    first, second, chunk = torch.randn(1, 3, 2, 4), torch.randn(1, 1, 2, 4), torch.randn(1, 2, 2, 4)  # (1, T, Hkv, D)
    with case("append_kv(None, new)"):
        cached = append(None, first.clone())
    assert torch.equal(cached, first), "append_kv(None, new) must return the new keys (nothing was cached)"
    for what, new in (("1 new token after 3 cached", second), ("2 new tokens at once after 3 cached", chunk)):
        given = {"cached": cached.clone(), "new": new.clone()}
        args = {name: x.clone() for name, x in given.items()}
        try:
            both = append(args["cached"], args["new"])
        except RuntimeError as e:  # e.g. torch.cat along another dim than the tokens'
            raise AssertionError(
                f"append_kv, {what}: cached (1, 3, 2, 4), new {tuple(new.shape)} raised {e}: the tokens are dim 1, "
                "(1, tokens, kv heads, head_dim)"
            ) from None
        check_unchanged(f"append_kv, {what}", given, args)
        S = 3 + new.shape[1]
        assert both.shape == (1, S, 2, 4), (
            f"append_kv, {what}: expected shape (1, {S}, 2, 4), got {tuple(both.shape)}"
            + (": every new token goes into the cache, not just the last" if both.shape == (1, 4, 2, 4) else "")
        )
        assert torch.equal(both, torch.cat([first, new], dim=1)), (
            f"append_kv, {what}: the new keys must come after the cached ones, in their order"
        )


def check_attention(attention) -> None:
    torch.manual_seed(0)
    S, D = 6, 8
    for H, Hkv in ((4, 4), (4, 2), (4, 1)):
        q_all, k, v = torch.randn(1, S, H, D), torch.randn(1, S, Hkv, D), torch.randn(1, S, Hkv, D)
        for name, first in (("prefill (all 6 tokens)", 0), ("decode (the 6th token)", S - 1), ("2 new tokens", 4)):
            q, positions = q_all[:, first:], torch.arange(first, S)[None]  # (1, T, H, D), (1, T)
            expected = reference_attention(q, k, v, visible_mask(positions, S))
            where = f"{H} query heads, {Hkv} kv heads, {name}"
            given = {"q": q, "k": k, "v": v, "q_positions": positions}
            args = {name: x.clone() for name, x in given.items()}  # yours to use; `given` stays as it was
            with case(where):
                got = attention(args["q"], args["k"], args["v"], args["q_positions"])
            check_unchanged(f"{where}: cached_attention", given, args)
            assert got.shape == expected.shape, (
                f"{where}: expected shape {tuple(expected.shape)}, got {tuple(got.shape)}"
            )
            if torch.allclose(got, expected, rtol=1e-4, atol=1e-5):
                continue
            hints = [
                why
                for why, mistake in KNOWN_MISTAKES.items()
                if mistake(q.clone(), k, v, positions).allclose(got, equal_nan=True)
            ]
            raise AssertionError(
                f"{where}: your attention differs from softmax(q k^T / sqrt(d)) v by up to "
                f"{(got - expected).abs().max():.3g}" + "".join(f"\n  hint: {h}" for h in hints[:1])
            )


class OneSequenceCache:
    """The exercise file's SimpleKVCache, copied here so that checking the reference never imports your file."""

    def __init__(self, n_layers: int, append, attention):
        self.k, self.v, self.length = [None] * n_layers, [None] * n_layers, 0
        self.append, self.attention = append, attention

    def prepare(self, seats: list[int], num_new: int) -> torch.Tensor:
        self.positions = torch.arange(self.length, self.length + num_new)[None]  # (1, T)
        self.length += num_new
        return self.positions

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self.k[layer] = self.append(self.k[layer], k)
        self.v[layer] = self.append(self.v[layer], v)
        return self.attention(q, self.k[layer], self.v[layer], self.positions.to(q.device))


def check_in_the_model(append, attention, steps: int = 5) -> None:
    """Prefill a prompt, extend it by two given tokens, then decode token by token through the cache;
    at every step compare the logits with the model's without a cache."""
    for name in ("mha", "gqa", "mqa"):
        model = small_model(name)
        cache = OneSequenceCache(model.cfg.n_layers, append=append, attention=attention)
        sequence = torch.tensor([[257, 5, 6, 7, 8, 9, 10]])  # (1, T)
        feeds = [("prefill of 7 tokens", sequence), ("2 more tokens at once", torch.tensor([[11, 12]]))]
        feeds += [(f"decode step {i + 1}", None) for i in range(steps)]  # None: the greedy token
        cached = None  # the last logits
        with torch.no_grad():
            for what, new in feeds:
                if new is None:
                    new = cached[:, -1].argmax(-1, keepdim=True)  # (1, 1)
                    sequence = torch.cat([sequence, new], dim=1)
                elif new is not sequence:
                    sequence = torch.cat([sequence, new], dim=1)
                T = new.shape[1]
                with case(f"{name} model, {what}"):
                    cached = model(new, cache.prepare([0], T), cache)  # (1, T, V)
                full = model(sequence)[:, -T:]  # the same positions, no cache
                same = torch.allclose(cached, full, rtol=1e-4, atol=1e-5)
                assert same, (
                    f"{name} model, {what}: logits with your cache differ from the model's without one by up to "
                    f"{(cached - full).abs().max():.3g}"
                )


def check_drawn_inputs(kv) -> None:
    check_drawn(kv.append, kv.attention, check_unchanged)


def check_cases(kv) -> None:
    check_append(kv.append)
    check_attention(kv.attention)
    check_in_the_model(kv.append, kv.attention)


def check_all(kv) -> None:
    check_cases(kv)
    check_drawn_inputs(kv)


def test_append_kv(kv):
    check_append(kv.append)


def test_cached_attention_equals_the_formula(kv):
    check_attention(kv.attention)


def test_the_model_with_your_cache_equals_the_model_without(kv):
    check_in_the_model(kv.append, kv.attention)


def test_append_and_attention_equal_the_reference_on_drawn_shapes(kv):
    check_drawn_inputs(kv)


# --- the checks catch plausible mistakes --------------------------------------------------------
CORRECT = {  # right, written differently: the checks must pass them
    "einsum": make_attention(),
    "expand-not-repeat_interleave": make_attention(gqa="expand"),
    "a-large-negative-fill": make_attention(fill=-1e9),
    "mask-aligned-to-the-cache-end": make_attention(mask="bottom-right"),
    "torch-sdpa": sdpa_attention,
    "head-by-head-matmul": head_by_head,
}
CORRECT_APPEND = {
    "torch-cat": reference_append,
    "into-a-new-tensor": into_a_new_tensor,
    "concat-dim-3": concat_from_the_end,
}


@CHECKS
@pytest.mark.parametrize("attention", CORRECT.values(), ids=CORRECT.keys())
def test_a_correct_version_passes(attention):
    check_all(SimpleNamespace(append=reference_append, attention=attention))


@CHECKS
@pytest.mark.parametrize("append", CORRECT_APPEND.values(), ids=CORRECT_APPEND.keys())
def test_a_correct_append_passes(append):
    check_all(SimpleNamespace(append=append, attention=head_by_head))


WRONG = {
    "prepends": SimpleNamespace(append=prepend, attention=make_attention()),
    "appends-on-the-heads-dim": SimpleNamespace(append=on_the_heads, attention=make_attention()),
    "forgets-the-cache": SimpleNamespace(append=forgets_the_cache, attention=make_attention()),
    "appends-only-the-last-new-token": SimpleNamespace(append=appends_the_last_new_token, attention=make_attention()),
    "forgets-to-repeat-the-kv-heads": SimpleNamespace(append=reference_append, attention=no_repeat),
    **{
        name: SimpleNamespace(append=reference_append, attention=make_attention(**kwargs))
        for name, kwargs in {
            "no-causal-mask": dict(mask="none"),
            "no-scale": dict(scale=False),
            "strict-mask": dict(mask="strict"),
            "ignores-positions": dict(mask="top-left"),
            "gqa-repeat": dict(gqa="repeat"),
            "divides-by-head-dim": dict(scale="head_dim"),
            "softmax-over-the-queries": dict(softmax_dim=-2),
            "scales-the-query-in-place": dict(scale="q-in-place"),
            "scales-the-keys-in-place": dict(scale="k-in-place"),
            # right on every hand-built case (their scores are small); the drawn large scores catch it
            "a-softmax-by-hand-without-its-max": dict(softmax="by-hand"),
        }.items()
    },
}
IN_PLACE = {"scales-the-query-in-place": "the q it was given", "scales-the-keys-in-place": "the k it was given"}
DRAWN_ONLY = {"a-softmax-by-hand-without-its-max": "an exp() that overflowed"}  # only drawn inputs catch these


@CHECKS
@pytest.mark.parametrize("wrong", WRONG.values(), ids=WRONG.keys())
def test_the_checks_catch_a_wrong_cache(wrong):
    with pytest.raises(AssertionError):
        check_all(wrong)


@CHECKS
@pytest.mark.parametrize("name", [n for n in WRONG if n != "scales-the-query-in-place" and n not in DRAWN_ONLY])
def test_a_wrong_cache_changes_what_the_model_says(name):
    """Not just the unit checks: each mistake also shows in the real model's logits (GQA included), or crashes it;
    all but the query scaled in place, which only its caller would see (the model makes a new q every layer)."""
    with pytest.raises((AssertionError, RuntimeError)):
        check_in_the_model(WRONG[name].append, WRONG[name].attention)


@CHECKS
@pytest.mark.parametrize("name", IN_PLACE)
def test_an_argument_changed_in_place_is_named_first(name):
    with pytest.raises(AssertionError) as failure:
        check_all(WRONG[name])
    first = str(failure.value).splitlines()[0]
    assert (
        first.startswith("4 query heads, 4 kv heads, prefill (all 6 tokens): cached_attention: ")
        and IN_PLACE[name] in first
    ), first


@CHECKS
def test_a_crash_names_its_case():
    with pytest.raises(AssertionError, match=r"^4 query heads, 2 kv heads, prefill \(all 6 tokens\): your code raised"):
        check_attention(no_repeat)


@CHECKS
@pytest.mark.parametrize("name", DRAWN_ONLY)
def test_the_drawn_inputs_catch_what_the_cases_miss(name):
    check_cases(WRONG[name])  # every hand-built case passes it
    with pytest.raises(AssertionError) as failure:
        check_drawn_inputs(WRONG[name])
    assert DRAWN_ONLY[name] in str(failure.value).splitlines()[0]


@CHECKS
def test_the_stub_is_rejected():
    with pytest.raises(NotImplementedError):
        check_all(SimpleNamespace(append=stub, attention=stub))
