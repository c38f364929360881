"""Lesson 07's differential checks: your three functions against the answer on drawn models, cards and loads.

A drawn model: 1 to 128 layers, 1 to 16 kv heads each serving 1 to 8 query heads, head_dim 1 to 256 (64, 128 and
256 on purpose), its embedding table tied (0) or not, and its weights at least the table's. A drawn card: 1 to 200
GiB, 50 to 8,000 GB/s, 10 to 2,000 TFLOP/s printed dense or with sparsity. Weights of 32, 16, 8, 4.125 or 4 bits;
KV of 32, 16, 8 or 4 bits (bits that are not whole bytes on purpose); batches of 1 to 4,096, contexts of 0 (step
time) or 1 to 200,000 tokens; utilization from 0.05 to 1, reserves from 0 to 4 GiB. For max_users, half the cards
are sized so that exactly 0, 1 or a few users fit, to the byte (a whole number of users, and none: the weights
fill the memory exactly), or a byte short of it.
"""

from __future__ import annotations

from hypothesis import strategies as st

from tests.lessons.differential import against_reference, plural

GiB = 2**30
WEIGHT_BITS, KV_BITS = [16, 8, 4.125, 4, 32], [16, 8, 4, 32]


@st.composite
def models(draw):
    layers, kv_heads = draw(st.integers(1, 128)), draw(st.integers(1, 16))
    heads, head_dim = kv_heads * draw(st.integers(1, 8)), draw(st.one_of(st.sampled_from([64, 128, 256]),
                                                                        st.integers(1, 256)))  # fmt: skip
    embedding = draw(st.sampled_from([0, draw(st.integers(1, 10**9))]))
    params = embedding + draw(st.integers(1, 10**11))
    return dict(params=params, embedding_params=embedding, layers=layers, heads=heads, kv_heads=kv_heads,
                head_dim=head_dim)  # fmt: skip


@st.composite
def cards(draw):
    return dict(memory_gib=draw(st.floats(1, 200)), bandwidth_gb_s=draw(st.floats(50, 8000)),
                tensor_tflops=draw(st.floats(10, 2000)), with_sparsity=draw(st.booleans()))  # fmt: skip


def describe_model(m: dict) -> str:
    table = "tied" if not m["embedding_params"] else f"{m['embedding_params']:,} of them the embedding table"
    return (
        f"a model of {plural(m['layers'], 'layer')}, {plural(m['heads'], 'query head')} over "
        f"{plural(m['kv_heads'], 'kv head')} of {m['head_dim']} ({plural(m['params'], 'weight')}, {table})"
    )


def describe_card(c: dict) -> str:
    printed = " printed with sparsity" if c["with_sparsity"] else " dense"
    return f"a card of {c['memory_gib']:g} GiB, {c['bandwidth_gb_s']:g} GB/s, {c['tensor_tflops']:g} TFLOP/s{printed}"


@st.composite
def kv_cases(draw):
    m, kv_bits = draw(models()), draw(st.sampled_from(KV_BITS))
    return f"with {describe_model(m)}, {kv_bits}-bit KV", ("model", m), (kv_bits,)


@st.composite
def step_cases(draw):
    m, c = draw(models()), draw(cards())
    batch, context = draw(st.one_of(st.just(1), st.integers(1, 4096))), draw(st.sampled_from([0, 1, 16, 4096, 200_000]))
    wb, kb = draw(st.sampled_from(WEIGHT_BITS)), draw(st.sampled_from(KV_BITS))
    where = f"with {describe_model(m)} on {describe_card(c)}, {batch} user(s) x {context} tokens, {wb}-bit weights, {kb}-bit KV"  # noqa: E501
    return where, ("model", m), ("card", c), (batch, context, wb, kb)


@st.composite
def users_cases(draw, kv_bytes_per_token):
    m, c = draw(models()), draw(cards())
    context = draw(st.one_of(st.sampled_from([1, 4096]), st.integers(1, 200_000)))
    wb, kb = draw(st.sampled_from(WEIGHT_BITS)), draw(st.sampled_from(KV_BITS))
    utilization, reserve = draw(st.sampled_from([0.9, 0.5, 1.0, 0.05])), draw(st.sampled_from([0.5, 0, 2.0, 4.0]))
    if draw(st.booleans()):  # a card whose usable memory holds exactly `users` users, or one byte less
        users, short = draw(st.sampled_from([0, 1, 2, 7])), draw(st.sampled_from([0, 1]))
        per_user = context * kv_bytes_per_token(m, kb)
        need = m["params"] * wb / 8 + reserve * GiB + users * per_user - short
        c["memory_gib"] = need / utilization / GiB
    where = (
        f"with {describe_model(m)} on {describe_card(c)}, {context} tokens each, {wb}-bit weights, {kb}-bit KV, "
        f"utilization {utilization}, reserve {reserve} GiB"
    )
    return where, ("model", m), ("card", c), (context, wb, kb, utilization, reserve)


def compare(function: str, impl, check, explain):
    """One drawn case, through the lesson's own `check` (the likely mistake named first, the answer's arithmetic)."""

    def run(drawn):
        where, *parts = drawn
        args = []
        for part in parts:
            if part[0] == "model":
                args.append(impl.Model(**part[1]))
            elif part[0] == "card":
                args.append(impl.Card(**part[1]))
            else:
                args += list(part)
        check(function, getattr(impl, function), [(where, tuple(args))], explain[function])

    return run


def check_drawn(impl, check, explain, kv_bytes_per_token, examples: int = 100) -> None:
    """`check`, `explain`: the lesson's referee and the answer's arithmetic per function (test_lesson07.py)."""
    raw = lambda m, kv_bits: kv_bytes_per_token(SimpleModel(**m), kv_bits)  # noqa: E731
    for function, strategy in (("kv_bytes_per_token", kv_cases()), ("decode_step_time", step_cases()),
                               ("max_users", users_cases(raw))):  # fmt: skip
        against_reference(function, strategy, compare(function, impl, check, explain), examples)


class SimpleModel:
    def __init__(self, **fields):
        self.__dict__.update(fields)
