"""Lesson 07: the roofline and the KV ceiling, on plain numbers. Run: pytest -m lesson07

Your kv_bytes_per_token, decode_step_time and max_users must give the answer's numbers on every shipped model
(minillm/card/models/) and every card of minillm/card/hardware.py, as their datasheets print them (three of them
headline a "with sparsity" figure), at batches from 1 to 2048, contexts from 16 to 128k tokens, bf16, fp8
and int4 weights, bf16 and fp8 KV, two memory utilizations and two activation reserves. When yours differ, the
check's first line names the mistake that gives your number (KNOWN_MISTAKES: what a room gets wrong), then the
first case that differs and the answer's own arithmetic for it; a mistake is named only when it gives every one of
your numbers, else the first line is plain: the case, your number and the answer's. Correct solutions written another
way (units converted first, loops, numpy numbers, integer division at the end: WRITTEN_DIFFERENTLY) pass.

The answer is the ideal roofline, the lesson's formula; the full suite also holds it against minillm.card.roofline,
which adds the small terms (activations, attention FLOPs, lm_head's logits, whole KV blocks, a reserve it counts).

Then the differential checks (tests/lessons/drawn/lesson07.py): each function against the answer on 100 drawn cases
(seeded: the same every run; MINILLM_CHECK_EXAMPLES=N draws N), through the same referee (a likely mistake named
first), the smallest case that differs shown. Strategies: models of 1 to 128 layers, 1 to 16 kv heads serving 1 to
8 query heads each, head_dim 1 to 256, tied tables or not; cards of 1 to 200 GiB, 50 to 8,000 GB/s, 10 to 2,000
TFLOP/s, dense or with sparsity; weights of 32, 16, 8, 4.125, 4 bits; KV of 32, 16, 8, 4 bits (not whole bytes);
batches 1 to 4,096; contexts 0, 1, 16, 4,096, 200,000 (step time) and 1 to 200,000 (users); utilization 0.05 to 1,
reserves 0 to 4 GiB; for max_users half the cards sized to hold exactly 0, 1, 2 or 7 users to the byte, or a byte
less. DRAWN_ONLY names the mistakes only the drawn cases catch.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pytest

from minillm.card import roofline
from minillm.card.hardware import DEVICES
from minillm.card.modelspec import ModelSpec, load_spec, shipped_models
from tests.lessons.drawn.lesson07 import check_drawn
from tests.lessons.harness import CHECKS, implementations, stub, student_module

lesson = pytest.mark.lesson07  # your code's checks: pytest -m lesson07

GiB, GB, TERA = 2**30, 1e9, 1e12


# --- the answer, and the same answer with one plausible mistake --------------------------------------
@dataclass(frozen=True)
class Model:
    params: int
    embedding_params: int
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


# What a room of students gets wrong, each with the hint the check prints first when your numbers match it.
KNOWN_MISTAKES = {
    # kv_bytes_per_token
    "no-gqa": "the cache keeps one key and one value per KEY/VALUE head (model.kv_heads), not per query head "
    "(model.heads): that is what grouped-query attention saves",
    "no-2": "each token stores a key AND a value: 2 x layers x kv_heads x head_dim numbers",
    "kv-bits": "kv_bits are bits: a cached number takes kv_bits / 8 bytes",
    "kv-floor-bits": "4 // 8 is 0: a cached number of kv_bits bits takes kv_bits / 8 bytes (/, not //: KV need not be "
    "whole bytes)",
    # decode_step_time
    "sparse": "the card's figure is printed with sparsity (card.with_sparsity): a dense model gets half of it",
    "always-halved": "halve the printed figure only when card.with_sparsity says it counts sparsity; this card "
    "prints the dense figure",
    "weight-bits": "weight_bits are bits: a weight takes weight_bits / 8 bytes",
    "floor-bits": "4.125 // 8 is 0.0: divide bits by 8 with /, not //",
    "embedding-streamed": "the embedding table is looked up, one row per user, not streamed or multiplied through: "
    "a step reads model.params - model.embedding_params weights",
    "embedding-flops": "the embedding table is looked up, not multiplied through: 2 FLOPs per user for every weight "
    "but the table's (model.params - model.embedding_params)",
    "weights-per-user": "the weights are read once per step, whatever the batch; only the KV is read per user",
    "kv-once": "every user reads their own KV cache: batch x context x bytes per token",
    "kv-new-token": "read the `context` tokens each user has cached; the new token's key and value are written, "
    "not read: count nothing for them",
    "sum": "the card streams and multiplies at the same time: a step takes the larger of the two times, not their sum",
    "ridge-from-weights": "a step takes the larger of its memory and compute times; telling the regime from the "
    "weights' FLOPs per byte alone leaves out the KV every user reads (a long context keeps a big batch memory-bound)",
    "one-flop": "each weight costs 2 FLOPs per user (a multiply and an add), not 1",
    "bandwidth-gib": "bandwidth_gb_s is in GB/s: 10**9 bytes per second (GiB are for memory sizes)",
    "tera": "tensor_tflops is in TFLOP/s: 10**12 FLOP per second",
    "milliseconds": "decode_step_time returns seconds, not milliseconds",
    # max_users
    "no-weights": "the weights are loaded first: the KV cache gets only what they leave",
    "embedding-not-in-memory": "the embedding table is not streamed, but it sits in memory: subtract all "
    "model.params weights from the memory",
    "memory-gb": "memory_gib is in GiB: 2**30 bytes each, not 10**9",
    "no-utilization": "only utilization x memory is usable (the rest: the CUDA context, the allocator's slack)",
    "utilization-after": "utilization caps the whole card: usable = utilization x memory, then subtract the weights "
    "(not utilization x what the weights leave)",
    "no-reserve": "keep reserve_gib GiB free for a step's activations: the KV cache gets what the weights and the "
    "reserve leave",
    "reserve-gb": "reserve_gib is in GiB, like the memory: 2**30 bytes each, not 10**9",
    "rounds": "a user fits whole or not at all: round down, not to the nearest",
    "ceil": "a user fits whole or not at all: round down, not up",
    "negative": "when the weights (and the reserve) leave no room, nobody fits: return 0, not a negative count",
}


def answer(mistake: str | None = None) -> SimpleNamespace:
    """The reference implementation; with `mistake` (a KNOWN_MISTAKES key), the same with that one mistake."""

    def to_bytes(bits, kv=False):
        return bits // 8 if mistake == "floor-bits" or (kv and mistake == "kv-floor-bits") else bits / 8

    def kv_bytes_per_token(model, kv_bits=16):
        heads = model.heads if mistake == "no-gqa" else model.kv_heads
        k_and_v = 1 if mistake == "no-2" else 2
        return (
            k_and_v
            * model.layers
            * heads
            * model.head_dim
            * (kv_bits if mistake == "kv-bits" else to_bytes(kv_bits, True))
        )

    def weight_bytes(params, weight_bits):
        return params * (weight_bits if mistake == "weight-bits" else to_bytes(weight_bits))

    def decode_step_time(model, card, batch, context, weight_bits=16, kv_bits=16):
        streamed = model.params - (0 if mistake == "embedding-streamed" else model.embedding_params)
        multiplied = model.params if mistake in ("embedding-streamed", "embedding-flops") else streamed
        weights = weight_bytes(streamed, weight_bits) * (batch if mistake == "weights-per-user" else 1)
        cached = context + (mistake == "kv-new-token")
        moved = weights + (1 if mistake == "kv-once" else batch) * cached * kv_bytes_per_token(model, kv_bits)
        flops = (1 if mistake == "one-flop" else 2) * multiplied * batch
        halve = mistake == "always-halved" or (card.with_sparsity and mistake != "sparse")
        dense = card.tensor_tflops * (1e9 if mistake == "tera" else TERA) / (2 if halve else 1)
        memory_s = moved / (card.bandwidth_gb_s * (GiB if mistake == "bandwidth-gib" else GB))
        compute_s = flops / dense
        seconds = memory_s + compute_s if mistake == "sum" else max(memory_s, compute_s)
        if mistake == "ridge-from-weights":  # compute-bound when the weights alone reach the card's FLOPs per byte
            ridge = dense / (card.bandwidth_gb_s * GB)
            seconds = compute_s if flops / weight_bytes(streamed, weight_bits) >= ridge else memory_s
        return seconds * (1e3 if mistake == "milliseconds" else 1)

    def max_users(model, card, context, weight_bits=16, kv_bits=16, utilization=0.9, reserve_gib=0.5):
        memory = card.memory_gib * (GB if mistake == "memory-gb" else GiB)
        in_memory = model.params - (model.embedding_params if mistake == "embedding-not-in-memory" else 0)
        weights = 0 if mistake == "no-weights" else weight_bytes(in_memory, weight_bits)
        reserve = 0 if mistake == "no-reserve" else reserve_gib * (GB if mistake == "reserve-gb" else GiB)
        if mistake == "no-utilization":
            utilization = 1
        if mistake == "utilization-after":
            free = (memory - weights - reserve) * utilization
        else:
            free = memory * utilization - weights - reserve
        users = free / (context * kv_bytes_per_token(model, kv_bits))
        rounded = {"rounds": round, "ceil": math.ceil}.get(mistake, math.floor)(users)
        return rounded if mistake == "negative" else max(0, rounded)

    return SimpleNamespace(Model=Model, Card=Card, kv_bytes_per_token=kv_bytes_per_token,
                           decode_step_time=decode_step_time, max_users=max_users)  # fmt: skip


def written_differently() -> dict[str, SimpleNamespace]:
    """Correct solutions as students write them, each its own way: the check must accept every one."""

    def kv_units(model, kv_bits=16):
        per_layer = model.kv_heads * model.head_dim * 2  # K and V
        return per_layer * model.layers * (kv_bits / 8)

    def step_units(model, card, batch, context, weight_bits=16, kv_bits=16):  # everything in GB and TFLOP first
        weights_gb = (model.params - model.embedding_params) * weight_bits / 8 / 1e9
        kv_gb = kv_units(model, kv_bits) * context * batch / 1e9
        tflops = card.tensor_tflops / 2 if card.with_sparsity else card.tensor_tflops
        tflop = 2 * (model.params - model.embedding_params) * batch / 1e12
        return max((weights_gb + kv_gb) / card.bandwidth_gb_s, tflop / tflops)

    def users_units(model, card, context, weight_bits=16, kv_bits=16, utilization=0.9, reserve_gib=0.5):
        free_gib = card.memory_gib * utilization - model.params * weight_bits / 8 / 2**30 - reserve_gib
        per_user_gib = context * kv_units(model, kv_bits) / 2**30
        return int(free_gib // per_user_gib) if free_gib > 0 else 0

    def kv_loop(model, kv_bits=16):
        total = 0
        for _layer in range(model.layers):
            for _head in range(model.kv_heads):
                total += 2 * model.head_dim * kv_bits / 8
        return total

    def step_loop(model, card, batch, context, weight_bits=16, kv_bits=16):  # one user at a time
        weights = (model.params - model.embedding_params) * weight_bits / 8
        moved, flops = weights, 0.0
        for _user in range(batch):
            moved += context * kv_units(model, kv_bits)
            flops += 2 * (model.params - model.embedding_params)
        peak = card.tensor_tflops * 1e12 * (0.5 if card.with_sparsity else 1.0)
        return max(moved / (card.bandwidth_gb_s * 1e9), flops / peak)

    def users_numpy(model, card, context, weight_bits=16, kv_bits=16, utilization=0.9, reserve_gib=0.5):
        left = (
            np.float64(card.memory_gib) * 2**30 * utilization - model.params * (weight_bits / 8) - reserve_gib * 2**30
        )
        return np.int64(max(np.floor(left / (context * kv_loop(model, kv_bits))), 0))  # a numpy integer

    def step_numpy(model, card, batch, context, weight_bits=16, kv_bits=16):
        moved = np.float64(model.params - model.embedding_params) * weight_bits / 8 + batch * context * kv_loop(
            model, kv_bits
        )
        times = np.array([moved / (card.bandwidth_gb_s * 1e9),
                          2.0 * (model.params - model.embedding_params) * batch
                          / (card.tensor_tflops * 1e12 / (1 + card.with_sparsity))])  # fmt: skip
        return times.max()  # a numpy float

    return {
        "units first": SimpleNamespace(Model=Model, Card=Card, kv_bytes_per_token=kv_units,
                                       decode_step_time=step_units, max_users=users_units),
        "loops and numpy": SimpleNamespace(Model=Model, Card=Card, kv_bytes_per_token=kv_loop,
                                           decode_step_time=step_numpy, max_users=users_numpy),
        "one user at a time": SimpleNamespace(Model=Model, Card=Card, kv_bytes_per_token=kv_loop,
                                              decode_step_time=step_loop, max_users=users_units),
    }  # fmt: skip


def unlisted_mistakes() -> dict[str, SimpleNamespace]:
    """Wrong answers no known mistake explains (each differs from every one somewhere): the check must name none
    of them, and print the plain line: the case, your number and the answer's."""
    key = answer()

    def users_left(free, model, context, kv_bits):
        return max(0, math.floor(free / (context * key.kv_bytes_per_token(model, kv_bits))))

    def reserve_in_utilization(model, card, context, weight_bits=16, kv_bits=16, utilization=0.9, reserve_gib=0.5):
        free = (card.memory_gib * GiB - reserve_gib * GiB) * utilization - model.params * weight_bits / 8
        return users_left(free, model, context, kv_bits)

    def reserve_scaled_too(model, card, context, weight_bits=16, kv_bits=16, utilization=0.9, reserve_gib=0.5):
        free = utilization * card.memory_gib * GiB - model.params * weight_bits / 8 - utilization * reserve_gib * GiB
        return users_left(free, model, context, kv_bits)

    def int4_as_4_bits(model, card, batch, context, weight_bits=16, kv_bits=16):
        return key.decode_step_time(model, card, batch, context, int(weight_bits), kv_bits)  # the scales left out

    def ridge_from_the_printed_figure(model, card, batch, context, weight_bits=16, kv_bits=16):
        weights = (model.params - model.embedding_params) * weight_bits / 8
        flops = 2 * (model.params - model.embedding_params) * batch
        memory_s = (weights + batch * context * key.kv_bytes_per_token(model, kv_bits)) / (card.bandwidth_gb_s * GB)
        ridge = card.tensor_tflops * TERA / (card.bandwidth_gb_s * GB)  # sparse or not, and weights alone
        return flops / (card.tensor_tflops * TERA / (1 + card.with_sparsity)) if flops / weights >= ridge else memory_s

    def with_(**parts):
        return SimpleNamespace(**{**vars(answer()), **parts})

    return {
        "the reserve taken inside utilization": with_(max_users=reserve_in_utilization),
        "utilization applied to the reserve too": with_(max_users=reserve_scaled_too),
        "int4 as 4 bits": with_(decode_step_time=int4_as_4_bits),
        "the regime from the weights and the printed figure": with_(decode_step_time=ridge_from_the_printed_figure),
    }


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
    looked_up = 0 if spec.tied_embeddings else spec.embedding_params  # a tied table is lm_head too: multiplied through
    return cls(params=spec.num_parameters, embedding_params=looked_up, layers=spec.layers, heads=spec.heads,
               kv_heads=spec.kv_heads, head_dim=spec.head_dim)  # fmt: skip


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
        (f"{name} on {card_name}, {context} tokens each, {wb}-bit weights, {kb}-bit KV, utilization {u}, "
         f"reserve {r} GiB", (m, card, context, wb, kb, u, r))
        for name, m in models.items()
        for card_name, card in cards.items()
        for context in (4096, 256, 32768, 131072)
        for wb, kb in PRECISIONS
        for u in (0.9, 0.75)
        for r in (0.5, 2.0)
    ]  # fmt: skip


# --- the referee -------------------------------------------------------------------------------------
def same(function: str, got, expected, args=()) -> bool:
    if function == "max_users":  # whole users; a float that lands on a whole number may round either way
        if not args:  # against a known mistake's whole number: that number (its own float is not at hand)
            return got == expected
        exact = users_exactly(*args)
        return got in {expected, max(0, math.floor(exact * (1 - 1e-9))), max(0, math.floor(exact * (1 + 1e-9)))}
    return got == expected or math.isclose(got, expected, rel_tol=1e-6, abs_tol=1e-12)


def users_exactly(model, card, context, weight_bits=16, kv_bits=16, utilization=0.9, reserve_gib=0.5) -> float:
    free = card.memory_gib * GiB * utilization - model.params * weight_bits / 8 - reserve_gib * GiB
    return free / (context * answer().kv_bytes_per_token(model, kv_bits))


def likely_mistakes(function: str, got, args, cases, yours) -> list[str]:
    """The known mistakes that give every one of your numbers, on every case: a mistake that gives your number on
    this case alone is a coincidence (whole users often are), and naming it would send you after the wrong bug.
    None when no known mistake explains all your numbers: then the check prints the plain line."""
    expected = getattr(answer(), function)(*args)
    here = [
        m
        for m in KNOWN_MISTAKES
        if not same(function, v := getattr(answer(m), function)(*args), expected, args) and same(function, got, v)
    ]
    if not here:
        return []
    mine = [yours(*a) for _, a in cases]
    return [
        m for m in here if all(same(function, g, getattr(answer(m), function)(*a)) for g, (_, a) in zip(mine, cases))
    ]


def shown(function: str, value, digits: int = 5) -> str:
    if function == "decode_step_time":
        return f"{value * 1e3:,.{digits}g} ms"
    return f"{value:,.{digits + 1}g}" + (" bytes" if function == "kv_bytes_per_token" else "")


def ratio(got, expected) -> str:
    if not expected:
        return "the answer is 0"
    r = got / expected
    return f"{r:.5f}x" if abs(r - 1) < 0.01 else f"{r:.4g}x"


def check(function: str, yours, cases, explain) -> None:
    """Your function against the answer on every case. The first difference fails: its likely mistake first,
    then the case, your number and the answer's, and the answer's arithmetic."""
    key = getattr(answer(), function)
    for where, args in cases:
        got, expected = yours(*args), key(*args)
        assert isinstance(got, numbers.Real) and not isinstance(got, bool), (
            f"{function} returned {got!r}; it should return a number ({where})"
        )
        if function == "max_users" and got != int(got):
            raise AssertionError(f"max_users returned {got}; users are counted whole: return an int ({where})")
        if same(function, got, expected, args):
            continue
        hints = likely_mistakes(function, got, args, cases, yours)
        lines = [f"likely mistake: {KNOWN_MISTAKES[m]}" for m in hints[:2]]
        digits = 9 if expected and abs(got / expected - 1) < 1e-3 else 5  # enough digits to see them differ
        lines.append(f"{where}: your {function} gives {shown(function, got, digits)}, the answer is "
                     f"{shown(function, expected, digits)} ({ratio(got, expected)}).")  # fmt: skip
        raise AssertionError("\n".join([*lines, explain(*args)]))


def explain_kv(model, kv_bits) -> str:
    return f"The answer: 2 x {model.layers} layers x {model.kv_heads} kv heads x {model.head_dim} x {kv_bits} bits / 8."


def explain_step(model, card, batch, context, weight_bits, kv_bits) -> str:
    kv = answer().kv_bytes_per_token(model, kv_bits)
    multiplied = model.params - model.embedding_params
    moved = multiplied * weight_bits / 8 + batch * context * kv
    dense = card.tensor_tflops / (2 if card.with_sparsity else 1)
    memory_ms, compute_ms = 1e3 * moved / (card.bandwidth_gb_s * GB), 1e3 * 2 * multiplied * batch / (dense * TERA)
    printed = f"{card.tensor_tflops:g} TFLOP/s printed{' with sparsity' if card.with_sparsity else ''}"
    return (
        f"The answer: {multiplied:,} weights (all but the embedding table) x {weight_bits} bits / 8 + {batch} x "
        f"{context} tokens x {kv:,.0f} bytes of KV = {moved / GB:,.4g} GB / {card.bandwidth_gb_s:g} GB/s = "
        f"{memory_ms:.4g} ms; 2 x {multiplied:,} x {batch} FLOPs / {dense:g} dense TFLOP/s ({printed}) = "
        f"{compute_ms:.4g} ms; the step is the larger."
    )


def explain_users(model, card, context, weight_bits, kv_bits, utilization, reserve_gib) -> str:
    weights = model.params * weight_bits / 8
    per_user = context * answer().kv_bytes_per_token(model, kv_bits)
    left = card.memory_gib * GiB * utilization - weights - reserve_gib * GiB
    return (
        f"The answer: {card.memory_gib:g} GiB x {utilization} - {weights / GiB:,.4g} GiB of weights (all "
        f"{model.params:,}) - {reserve_gib} GiB reserve leaves {left / GiB:,.4g} GiB; each user's KV takes "
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


EXPLAIN = {"kv_bytes_per_token": explain_kv, "decode_step_time": explain_step, "max_users": explain_users}


def check_drawn_inputs(impl) -> None:
    check_drawn(impl, check, EXPLAIN, answer().kv_bytes_per_token)


def check_cases(impl) -> None:
    check_kv(impl)
    check_step(impl)
    check_users(impl)


def check_all(impl) -> None:
    check_cases(impl)
    check_drawn_inputs(impl)


# --- your code ----------------------------------------------------------------------------------------
def test_kv_bytes_per_token(impl):
    check_kv(impl)


def test_decode_step_time(impl):
    check_step(impl)


def test_max_users(impl):
    check_users(impl)


def test_all_three_equal_the_answer_on_drawn_models_cards_and_loads(impl):
    check_drawn_inputs(impl)


# --- the answer itself ----------------------------------------------------------------------------------
@CHECKS
def test_the_answer_by_hand():
    """Llama-3.1-8B (32 layers, 8 kv heads of 128; 8.03 B weights, 0.53 B of them the 128,256 x 4,096 embedding
    table) on an RTX 4090 (24 GiB, 1008 GB/s, 165.2 dense TFLOP/s)."""
    key, llama = answer(), as_model(Model, load_spec("llama-3.1-8b"))
    card = Card(memory_gib=24, bandwidth_gb_s=1008, tensor_tflops=165.2, with_sparsity=False)
    assert key.kv_bytes_per_token(llama) == 2 * 32 * 8 * 128 * 2 == 131072
    streamed = (8_030_261_248 - 128256 * 4096) * 2  # 15.01 GB: the weights a step multiplies through
    assert key.decode_step_time(llama, card, 1, 0) == pytest.approx(streamed / 1008e9)  # 14.9 ms: 67 tokens/s at most
    # 64 users x 1024 tokens: 15.01 GB of weights + 8 GiB of KV = 23.6 GB, 23.4 ms; compute 5.8 ms
    assert key.decode_step_time(llama, card, 64, 1024) == pytest.approx((15.0098e9 + 2**33) / 1008e9, rel=1e-4)
    # 1024 users x 16 tokens: compute-bound, 2 x 7.50e9 x 1024 / 165.2e12 = 93.1 ms
    assert key.decode_step_time(llama, card, 1024, 16) == pytest.approx(2 * streamed / 2 * 1024 / 165.2e12)
    sparse = dataclasses.replace(card, tensor_tflops=330.4, with_sparsity=True)  # the same card, printed sparse
    assert key.decode_step_time(llama, sparse, 1024, 16) == key.decode_step_time(llama, card, 1024, 16)
    # 24 GiB x 0.9 = 21.6 GiB; minus all 16.06e9 bytes of weights (14.96 GiB) and 0.5 GiB: 6.14 GiB = 12.3 users of
    # 0.5 GiB at 4096 tokens (roofline.max_users says 12 too)
    assert key.max_users(llama, card, 4096) == 12
    assert key.max_users(llama, card, 4096, reserve_gib=0) == 13
    assert key.max_users(llama, card, 4096, utilization=0.6) == 0  # 14.4 GiB: the weights alone do not fit


@CHECKS
def test_the_answer_agrees_with_minillm_roofline():
    """minillm.card.roofline at 100% of the datasheet and no launch cost, minus its small terms: KV per token exactly;
    the step time of the 7-8B and 70B models within 3% where it is memory-bound (activations, lm_head's logits,
    the embedding rows looked up) and 12% where it is compute-bound (attention's FLOPs over 4096 tokens); users
    within 10% (whole blocks of 16 tokens), given roofline's own activation reserve."""
    key = answer()
    for name in ("llama-3.1-8b", "mistral-7b", "qwen2.5-7b", "llama-3.1-70b"):
        spec = load_spec(name)
        m = as_model(Model, spec)
        for kv_dtype, bits in (("bf16", 16), ("fp8", 8)):
            assert key.kv_bytes_per_token(m, bits) == roofline.kv_bytes_per_token(spec, kv_dtype)
        assert m.params - m.embedding_params == roofline.streamed_weight_bytes(spec) / 2  # the same weights streamed
        for card_name in DEVICES:
            ideal = dataclasses.replace(DEVICES[card_name], efficiency=1.0, launch_s=0.0)
            card = as_card(Card, card_name)
            for batch in (1, 64, 2048):
                for context in (16, 4096):
                    ours = key.decode_step_time(m, card, batch, context)
                    theirs = roofline.decode_cost(spec, ideal, batch, context)
                    close = 0.03 if theirs.bound == "memory" else 0.12  # attention's FLOPs grow with the context
                    assert ours == pytest.approx(theirs.time_s, rel=close), (name, card_name, batch, context)
            reserve = roofline.activation_reserve_bytes(spec) / GiB
            for context in (1024, 4096, 32768):
                ours, theirs = (
                    key.max_users(m, card, context, reserve_gib=reserve),
                    roofline.max_users(spec, ideal, context),
                )
                assert abs(ours - theirs) <= max(1, 0.1 * theirs), (name, card_name, context, ours, theirs)


# --- the checks catch plausible mistakes, and accept correct solutions written differently ------------------
@CHECKS
@pytest.mark.parametrize("mistake", KNOWN_MISTAKES)
def test_the_checks_catch_a_mistake_and_name_it_first(mistake):
    with pytest.raises(AssertionError) as caught:
        check_all(answer(mistake))
    message = str(caught.value)
    assert message.startswith(f"likely mistake: {KNOWN_MISTAKES[mistake]}\n"), message


DRAWN_ONLY = ["kv-floor-bits"]  # right on every hand-built case (their KV is 16 or 8 bits): the drawn cases catch it


@CHECKS
@pytest.mark.parametrize("mistake", DRAWN_ONLY)
def test_the_drawn_cases_catch_what_the_cases_miss(mistake):
    check_cases(answer(mistake))  # every hand-built case passes it
    with pytest.raises(AssertionError) as caught:
        check_drawn_inputs(answer(mistake))
    assert str(caught.value).startswith(f"likely mistake: {KNOWN_MISTAKES[mistake]}\n"), str(caught.value)


@CHECKS
@pytest.mark.parametrize("way", list(written_differently()))
def test_the_checks_accept_correct_solutions_written_differently(way):
    check_all(written_differently()[way])


@CHECKS
@pytest.mark.parametrize("name", list(unlisted_mistakes()))
def test_a_mistake_no_hint_explains_gets_the_plain_line(name):
    """The first line names the case and the two numbers, and no known mistake: a hint is given only when that
    mistake gives every one of the student's numbers."""
    with pytest.raises(AssertionError) as caught:
        check_all(unlisted_mistakes()[name])
    first = str(caught.value).splitlines()[0]
    assert not first.startswith("likely mistake") and ": your " in first and ", the answer is " in first, first


@CHECKS
def test_a_coincidence_on_one_case_names_no_mistake():
    """Whole users coincide often: taking the reserve inside utilization gives, on the first case it gets wrong,
    the very number of rounding up ("ceil"), which explains none of its other numbers."""
    wrong = unlisted_mistakes()["the reserve taken inside utilization"]
    models, cards = objects(wrong)
    cases = users_cases(models, cards)
    args = next(a for _, a in cases if wrong.max_users(*a) != answer().max_users(*a))
    got = wrong.max_users(*args)
    assert got == answer("ceil").max_users(*args) != answer().max_users(*args)  # the coincidence
    assert likely_mistakes("max_users", got, args, cases, wrong.max_users) == []


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
