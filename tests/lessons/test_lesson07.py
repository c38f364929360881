"""Lesson 07: the roofline and the KV ceiling, on plain numbers. Run: pytest -m lesson07

Your kv_bytes_per_token, decode_step_time and max_users must give the answer's numbers on every shipped model
(minillm/card/models/) and every card of minillm/card/hardware.py, as their datasheets print them (three of them
headline a "with sparsity" figure), at batches from 1 to 2048, contexts from 16 to 128k tokens, bf16, fp8
and int4 weights, bf16 and fp8 KV. When yours differ, the check names the first case, the answer's own
arithmetic for it, and the mistake that gives your number when it knows one (KNOWN_MISTAKES).

The answer is the ideal roofline, the lesson's formula; the full suite also holds it against minillm.card.roofline,
which adds the small terms (activations, attention FLOPs, the activation reserve, whole KV blocks).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from minillm.card import roofline
from minillm.card.hardware import DEVICES
from minillm.card.modelspec import ModelSpec, load_spec, shipped_models
from tests.lessons.harness import CHECKS, implementations, stub, student_module

lesson = pytest.mark.lesson07  # your code's checks: pytest -m lesson07

GiB, GB, TERA = 2**30, 1e9, 1e12


# --- the answer, and the same answer with one plausible mistake --------------------------------------
@dataclass(frozen=True)
class Model:
    params: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int


@dataclass(frozen=True)
class Card:
    memory_gib: float
    bandwidth_gb_s: float
    tensor_tflops: float
    with_sparsity: bool


KNOWN_MISTAKES = {
    "sparse": "the card's figure is printed with sparsity (card.with_sparsity): a dense model gets half of it",
    "no-gqa": "the cache keeps one key and one value per KEY/VALUE head (model.kv_heads), not per query head "
    "(model.heads): that is what grouped-query attention saves",
    "no-2": "each token stores a key AND a value: 2 x layers x kv_heads x head_dim numbers",
    "kv-bits": "kv_bits are bits: a cached number takes kv_bits / 8 bytes",
    "weight-bits": "weight_bits are bits: a weight takes weight_bits / 8 bytes",
    "weights-per-user": "the weights are read once per step, whatever the batch; only the KV is read per user",
    "sum": "the card streams and multiplies at the same time: a step takes the larger of the two times, not their sum",
    "one-flop": "each weight costs 2 FLOPs per user (a multiply and an add), not 1",
    "bandwidth-gib": "bandwidth_gb_s is in GB/s: 10**9 bytes per second (GiB are for memory sizes)",
    "no-weights": "the weights are loaded first: the KV cache gets only what they leave",
    "memory-gb": "memory_gib is in GiB: 2**30 bytes each, not 10**9",
    "no-utilization": "only utilization x memory is usable (the rest: the CUDA context, the allocator's slack)",
    "rounds": "a user fits whole or not at all: round down",
}


def answer(mistake: str | None = None) -> SimpleNamespace:
    """The reference implementation; with `mistake` (a KNOWN_MISTAKES key), the same with that one mistake."""

    def kv_bytes_per_token(model, kv_bits=16):
        heads = model.heads if mistake == "no-gqa" else model.kv_heads
        k_and_v = 1 if mistake == "no-2" else 2
        return k_and_v * model.layers * heads * model.head_dim * kv_bits / (1 if mistake == "kv-bits" else 8)

    def weight_bytes(model, weight_bits):
        return model.params * weight_bits / (1 if mistake == "weight-bits" else 8)

    def decode_step_time(model, card, batch, context, weight_bits=16, kv_bits=16):
        weights = weight_bytes(model, weight_bits) * (batch if mistake == "weights-per-user" else 1)
        moved = weights + batch * context * kv_bytes_per_token(model, kv_bits)
        flops = (1 if mistake == "one-flop" else 2) * model.params * batch
        dense = card.tensor_tflops * TERA / (2 if card.with_sparsity and mistake != "sparse" else 1)
        memory_s = moved / (card.bandwidth_gb_s * (GiB if mistake == "bandwidth-gib" else GB))
        compute_s = flops / dense
        return memory_s + compute_s if mistake == "sum" else max(memory_s, compute_s)

    def max_users(model, card, context, weight_bits=16, kv_bits=16, utilization=0.9):
        usable = card.memory_gib * (GB if mistake == "memory-gb" else GiB)
        usable *= 1 if mistake == "no-utilization" else utilization
        free = usable - (0 if mistake == "no-weights" else weight_bytes(model, weight_bits))
        users = free / (context * kv_bytes_per_token(model, kv_bits))
        return max(0, round(users) if mistake == "rounds" else math.floor(users))

    return SimpleNamespace(Model=Model, Card=Card, kv_bytes_per_token=kv_bytes_per_token,
                           decode_step_time=decode_step_time, max_users=max_users)  # fmt: skip


@pytest.fixture(params=implementations(lesson))
def impl(request):
    if request.param == "reference":
        return answer()
    return student_module("lesson07_roofline")


# --- the cases: shipped models, the cards as printed -------------------------------------------------
# Datasheets that headline the bf16 tensor figure "with sparsity" (hardware.py names each source): L4, H100
# SXM, H200. The GeForce whitepapers and the A100 datasheet print the dense figure first.
PRINTED_WITH_SPARSITY = {"l4", "h100-sxm", "h200"}
MODELS = ["llama-3.1-8b", *(name for name in shipped_models() if name != "llama-3.1-8b")]  # the lesson's first
CARDS = ["rtx-4090", *(name for name in DEVICES if name != "rtx-4090")]
PRECISIONS = [(16, 16), (16, 8), (8, 8), (4.125, 16), (4.125, 8)]  # (weight bits, kv bits); int4 carries scales


def as_model(cls, spec: ModelSpec):
    return cls(params=spec.num_parameters, layers=spec.layers, heads=spec.heads, kv_heads=spec.kv_heads,
               head_dim=spec.head_dim)  # fmt: skip


def as_card(cls, name: str):
    device, sparse = DEVICES[name], name in PRINTED_WITH_SPARSITY
    dense = device.peak_flops("bf16") / TERA
    return cls(memory_gib=device.memory_bytes / GiB, bandwidth_gb_s=device.bandwidth / GB,
               tensor_tflops=2 * dense if sparse else dense, with_sparsity=sparse)  # fmt: skip


def objects(impl):
    """The models and cards, built with your Model and Card classes (so any property you add is there)."""
    return ({name: as_model(impl.Model, load_spec(name)) for name in MODELS},
            {name: as_card(impl.Card, name) for name in CARDS})  # fmt: skip


def kv_cases(models):
    return [(f"{name}, {kv_bits}-bit KV", (m, kv_bits)) for name, m in models.items() for kv_bits in (16, 8)]


def step_cases(models, cards):
    return [
        (f"{name} on {card_name}, {batch} user(s) x {context} tokens, {wb}-bit weights, {kb}-bit KV",
         (m, card, batch, context, wb, kb))
        for name, m in models.items()
        for card_name, card in cards.items()
        for batch in (1, 8, 64, 512, 2048)
        for context in (4096, 32768, 16)
        for wb, kb in PRECISIONS
    ]  # fmt: skip


def users_cases(models, cards):
    return [
        (f"{name} on {card_name}, {context} tokens each, {wb}-bit weights, {kb}-bit KV, utilization {u}",
         (m, card, context, wb, kb, u))
        for name, m in models.items()
        for card_name, card in cards.items()
        for context in (4096, 256, 32768, 131072)
        for wb, kb in PRECISIONS
        for u in (0.9, 0.75)
    ]  # fmt: skip


# --- the referee -------------------------------------------------------------------------------------
def same(a, b) -> bool:
    return a == b or (isinstance(a, int | float) and math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-12))


def likely_mistakes(function: str, got, args, cases, yours) -> list[str]:
    """The known mistakes that give your number here; the ones that give all your numbers come first."""
    expected = getattr(answer(), function)(*args)
    here = [m for m in KNOWN_MISTAKES if not same(v := getattr(answer(m), function)(*args), expected) and same(got, v)]
    everywhere = [m for m in here if all(same(yours(*a), getattr(answer(m), function)(*a)) for _, a in cases)]
    return everywhere or here


def shown(function: str, value) -> str:
    if function == "decode_step_time":
        return f"{value * 1e3:,.5g} ms"
    return f"{value:,.6g}" + (" bytes" if function == "kv_bytes_per_token" else "")


def ratio(got, expected) -> str:
    if not expected:
        return "the answer is 0"
    r = got / expected
    return f"{r:.5f}x" if abs(r - 1) < 0.01 else f"{r:.4g}x"


def check(function: str, yours, cases, explain) -> None:
    """Your function against the answer on every case; the first difference fails, with its likely mistake."""
    key = getattr(answer(), function)
    for where, args in cases:
        got, expected = yours(*args), key(*args)
        assert isinstance(got, int | float) and not isinstance(got, bool), (
            f"{where}: {function} returned {got!r}; it should return a number"
        )
        if function == "max_users" and got != int(got):
            raise AssertionError(f"{where}: max_users returned {got}; users are counted whole: return an int")
        if same(got, expected):
            continue
        hints = likely_mistakes(function, got, args, cases, yours)
        raise AssertionError(
            f"{where}: your {function} gives {shown(function, got)}, the answer is {shown(function, expected)} "
            f"({ratio(got, expected)}). {explain(*args)}"
            + "".join(f"\n  likely mistake: {KNOWN_MISTAKES[m]}" for m in hints[:2])
        )


def explain_kv(model, kv_bits) -> str:
    return f"The answer: 2 x {model.layers} layers x {model.kv_heads} kv heads x {model.head_dim} x {kv_bits} bits / 8."


def explain_step(model, card, batch, context, weight_bits, kv_bits) -> str:
    kv = answer().kv_bytes_per_token(model, kv_bits)
    moved = model.params * weight_bits / 8 + batch * context * kv
    dense = card.tensor_tflops / (2 if card.with_sparsity else 1)
    memory_ms, compute_ms = 1e3 * moved / (card.bandwidth_gb_s * GB), 1e3 * 2 * model.params * batch / (dense * TERA)
    printed = f"{card.tensor_tflops:g} TFLOP/s printed{' with sparsity' if card.with_sparsity else ''}"
    return (
        f"The answer: memory {moved / GB:,.4g} GB / {card.bandwidth_gb_s:g} GB/s = {memory_ms:.4g} ms, compute "
        f"2 x {model.params:,} x {batch} FLOPs / {dense:g} dense TFLOP/s ({printed}) = {compute_ms:.4g} ms; "
        f"the step is the larger."
    )


def explain_users(model, card, context, weight_bits, kv_bits, utilization) -> str:
    weights = model.params * weight_bits / 8
    per_user = context * answer().kv_bytes_per_token(model, kv_bits)
    return (
        f"The answer: {card.memory_gib:g} GiB x {utilization} - {weights / GiB:,.4g} GiB of weights leaves "
        f"{(card.memory_gib * GiB * utilization - weights) / GiB:,.4g} GiB; each user's KV takes "
        f"{per_user / GiB:,.4g} GiB; round down (0 when nothing is left)."
    )


def check_kv(impl) -> None:
    models, _ = objects(impl)
    check("kv_bytes_per_token", impl.kv_bytes_per_token, kv_cases(models), explain_kv)


def check_step(impl) -> None:
    models, cards = objects(impl)
    check("decode_step_time", impl.decode_step_time, step_cases(models, cards), explain_step)


def check_users(impl) -> None:
    models, cards = objects(impl)
    check("max_users", impl.max_users, users_cases(models, cards), explain_users)


def check_all(impl) -> None:
    check_kv(impl)
    check_step(impl)
    check_users(impl)


# --- your code ----------------------------------------------------------------------------------------
def test_kv_bytes_per_token(impl):
    check_kv(impl)


def test_decode_step_time(impl):
    check_step(impl)


def test_max_users(impl):
    check_users(impl)


# --- the answer itself ----------------------------------------------------------------------------------
@CHECKS
def test_the_answer_by_hand():
    """Llama-3.1-8B (32 layers, 8 kv heads of 128) on an RTX 4090 (24 GiB, 1008 GB/s, 165.2 dense TFLOP/s)."""
    key, llama = answer(), as_model(Model, load_spec("llama-3.1-8b"))
    card = Card(memory_gib=24, bandwidth_gb_s=1008, tensor_tflops=165.2, with_sparsity=False)
    assert key.kv_bytes_per_token(llama) == 2 * 32 * 8 * 128 * 2 == 131072
    assert key.decode_step_time(llama, card, 1, 0) == pytest.approx(8_030_261_248 * 2 / 1008e9)  # the weights
    # 64 users x 1024 tokens: 16.06 GB of weights + 8 GiB of KV = 24.65 GB, 24.45 ms; compute 6.2 ms
    assert key.decode_step_time(llama, card, 64, 1024) == pytest.approx((16.0605e9 + 2**33) / 1008e9, rel=1e-4)
    # 1024 users x 16 tokens: compute-bound, 2 x 8.03e9 x 1024 / 165.2e12 = 99.6 ms
    assert key.decode_step_time(llama, card, 1024, 16) == pytest.approx(2 * 8_030_261_248 * 1024 / 165.2e12)
    sparse = dataclasses.replace(card, tensor_tflops=330.4, with_sparsity=True)  # the same card, printed sparse
    assert key.decode_step_time(llama, sparse, 1024, 16) == key.decode_step_time(llama, card, 1024, 16)
    # 24 GiB x 0.9 = 21.6 GiB; minus 16.06e9 bytes (14.96 GiB) = 6.64 GiB = 13.3 users of 0.5 GiB at 4096 tokens
    assert key.max_users(llama, card, 4096) == 13
    assert key.max_users(llama, card, 4096, utilization=0.6) == 0  # 14.4 GiB: the weights alone do not fit


@CHECKS
def test_the_answer_agrees_with_minillm_roofline():
    """minillm.card.roofline at 100% of the datasheet and no launch cost, minus its small terms: KV per token exactly;
    the step time of the 7-8B and 70B models within 15% (the embedding table is looked up, not streamed;
    activations; attention FLOPs); users within 10% (the activation reserve, whole blocks of 16 tokens)."""
    key = answer()
    for name in ("llama-3.1-8b", "mistral-7b", "qwen2.5-7b", "llama-3.1-70b"):
        spec = load_spec(name)
        m = as_model(Model, spec)
        for kv_dtype, bits in (("bf16", 16), ("fp8", 8)):
            assert key.kv_bytes_per_token(m, bits) == roofline.kv_bytes_per_token(spec, kv_dtype)
        for card_name in DEVICES:
            ideal = dataclasses.replace(DEVICES[card_name], efficiency=1.0, launch_s=0.0)
            card = as_card(Card, card_name)
            for batch in (1, 64, 2048):
                for context in (16, 4096):
                    ours = key.decode_step_time(m, card, batch, context)
                    theirs = roofline.decode_cost(spec, ideal, batch, context).time_s
                    assert ours == pytest.approx(theirs, rel=0.15), (name, card_name, batch, context)
            for context in (1024, 4096, 32768):
                ours, theirs = key.max_users(m, card, context), roofline.max_users(spec, ideal, context)
                assert abs(ours - theirs) <= max(1, 0.1 * theirs), (name, card_name, context, ours, theirs)


# --- the checks catch plausible mistakes ----------------------------------------------------------------
@CHECKS
@pytest.mark.parametrize("mistake", KNOWN_MISTAKES)
def test_the_checks_catch_a_mistake_and_name_it(mistake):
    with pytest.raises(AssertionError) as caught:
        check_all(answer(mistake))
    assert f"likely mistake: {KNOWN_MISTAKES[mistake]}" in str(caught.value), str(caught.value)


@CHECKS
def test_the_checks_catch_two_mistakes_at_once():
    """No hint fits every number then; the first difference still fails, with the answer's arithmetic."""
    both = answer("no-gqa")
    both.decode_step_time = answer("sparse").decode_step_time
    with pytest.raises(AssertionError, match="The answer: 2 x 32 layers x 8 kv heads"):
        check_all(both)


@CHECKS
def test_the_stub_is_rejected():
    stubs = SimpleNamespace(Model=Model, Card=Card, kv_bytes_per_token=stub, decode_step_time=stub, max_users=stub)
    for part in (check_kv, check_step, check_users):
        with pytest.raises(NotImplementedError):
            part(stubs)
