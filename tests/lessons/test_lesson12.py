"""Lesson 12: a layer split over tp cards, and what each card holds and sends. Run: pytest -m lesson12

Your shard_qkv and shard_down must take the rows and columns minillm/parallel/shard.py takes, on fused weights of
several shapes (heads, kv heads, head size, tp from 1 to 4, every rank); your tp_mlp must give the whole MLP's output
with ONE all-reduce, of the row-parallel layer's partial sums; card_memory_gib and allreduce_bytes must give the
answer's numbers for Llama-3.1-8B and -70B and two toy models at several tp and precisions. The weights and inputs
you are given must come back unchanged. A failing check's first line names the situation (which weight, which card,
what you took): WRONG (below) lists the mistakes a room makes, each caught and named; RIGHT, correct versions
written differently that must pass.

Then the differential checks (tests/lessons/drawn/lesson12.py): each function against the reference on 60 drawn
cases (seeded: the same every run; MINILLM_CHECK_EXAMPLES=N draws N), through the same checks and diagnoses, the
smallest case that differs shown first. Strategies: shard_qkv with 1, 2, 3, 4 or 6 kv heads read by 1 to 3 query
heads each, head_dim 1 to 5, dim 1 to 12, tp any divisor of the kv heads (several kv heads a card, one, or all),
every rank; shard_down on (1 to 8, tp x 1 to 4) weights, tp 1 to 4; tp_mlp on 1 to 3 tokens of width 1 to 8, ffn tp
x 1 to 4, tp 1 to 4; card_memory_gib on 1 to 10**11 weights, 0 to 10**6 KV bytes a token and tokens, tp 1 to 8,
32/16/8/4.125/4-bit weights; allreduce_bytes on hidden 1 to 16,384, 1 to 128 layers, 1 to 4,096 tokens, tp 1 to 8,
32/16/8/4-bit activations. DRAWN_ONLY names the wrong versions only the drawn cases catch.
"""

from __future__ import annotations

import math
import sys
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from minillm.card import roofline
from minillm.card.hardware import DEVICES
from minillm.card.modelspec import load_spec
from minillm.card.tensor_parallel import rank_spec, tp_step
from minillm.parallel.shard import rows_of
from tests.lessons.drawn.lesson12 import check_drawn
from tests.lessons.harness import CHECKS, case, failure_of, implementations, raised_in_your_code, stub
from tests.lessons.harness import check_numbers as harness_check_numbers
from tests.lessons.harness import student_module as student

lesson = pytest.mark.lesson12  # your code's checks: pytest -m lesson12

GiB = 2**30


# --- the reference: minillm's own split ----------------------------------------------------------------------
def shard_qkv(qkv, n_heads, n_kv_heads, head_dim, rank, tp):
    q, k, v = qkv.split([n_heads * head_dim, n_kv_heads * head_dim, n_kv_heads * head_dim])
    return torch.cat([rows_of(w, rank, tp) for w in (q, k, v)])


def shard_down(down, rank, tp):
    return rows_of(down.T, rank, tp).T


def tp_mlp(x, gate_up, down, tp, all_reduce):
    gate, up = gate_up.chunk(2)
    partials = []
    for rank in range(tp):
        h = F.silu(x @ rows_of(gate, rank, tp).T) * (x @ rows_of(up, rank, tp).T)  # (tokens, ffn / tp)
        partials.append(h @ shard_down(down, rank, tp).T)  # (tokens, dim): a partial sum
    return all_reduce(partials)[0]


def card_memory_gib(params, kv_bytes_per_token, tokens, tp, weight_bits=16):
    return (params * weight_bits / 8 + kv_bytes_per_token * tokens) / tp / GiB


def allreduce_bytes(hidden, layers, tokens, tp, act_bits=16):
    return 2 * layers * 2 * (tp - 1) / tp * tokens * hidden * act_bits / 8


REFERENCE = SimpleNamespace(shard_qkv=shard_qkv, shard_down=shard_down, tp_mlp=tp_mlp,
                            card_memory_gib=card_memory_gib, allreduce_bytes=allreduce_bytes)  # fmt: skip


@pytest.fixture(params=implementations(lesson))
def impl(request):
    return REFERENCE if request.param == "reference" else student("lesson12_shard")


# --- the cases ----------------------------------------------------------------------------------------------
# (n_heads, n_kv_heads, head_dim, dim, tp): grouped-query, multi-head, one kv head per card, tp 1
QKV_SHAPES = [(8, 2, 4, 16, 2), (4, 4, 3, 10, 4), (16, 4, 2, 24, 4), (8, 2, 4, 16, 1), (6, 2, 5, 12, 2)]
MLP_SHAPES = [(3, 8, 12, 2), (1, 6, 8, 4), (2, 10, 20, 1), (4, 12, 24, 3)]  # (tokens, dim, ffn, tp)


def numbered(rows: int, cols: int) -> torch.Tensor:
    """A weight whose every entry says where it sits: entry (r, c) is r * cols + c."""
    return torch.arange(rows * cols, dtype=torch.float64).view(rows, cols)


def runs(indices: list[int]) -> str:
    """[0, 1, 2, 5, 6] -> '0-2, 5-6'."""
    out, start = [], None
    for i, n in enumerate(indices):
        if start is None:
            start = n
        if i + 1 == len(indices) or indices[i + 1] != n + 1:
            out.append(f"{start}" if start == n else f"{start}-{n}")
            start = None
    return ", ".join(out) or "none"


def rows_taken(got: torch.Tensor, cols: int) -> list[int]:
    return [int(r) // cols for r in got[:, 0].tolist()]


def unchanged(name: str, given: torch.Tensor, before: torch.Tensor, where: str) -> None:
    assert torch.equal(given, before), (
        f"{where}: a side effect: your code changed the {name} it was given. The caller's tensors are not yours to "
        "change (every card reads the same weights): build new ones"
    )


# --- shard_qkv ------------------------------------------------------------------------------------------------
def diagnose_qkv(got, qkv, heads, kv_heads, head_dim, rank, tp) -> str:
    want = shard_qkv(qkv, heads, kv_heads, head_dim, rank, tp)
    dim = qkv.shape[1]
    if got.shape == (qkv.shape[0], dim // tp) or got.shape == (qkv.shape[0], math.ceil(dim / tp)):
        return (
            "rows vs columns swapped: a column-parallel layer splits its OUTPUT features, which are the rows "
            "of an nn.Linear weight (out, in); take rows and keep every column (every card holds all of x)"
        )
    if got.shape == want.shape and torch.equal(got, rows_of(qkv, rank, tp)):
        return (
            "kv heads split unevenly: the fused weight is q's rows, then k's, then v's, so cutting it into tp "
            "equal runs gives card 0 query heads only and the last card value heads only; split q, k and v "
            "first, then take each one's r-th run of heads"
        )
    q_rows = heads * head_dim // tp
    if got.shape[0] == q_rows + 2 * kv_heads * head_dim and torch.equal(got[:q_rows], want[:q_rows]):
        return (
            f"each card keeps only its own key/value heads: {kv_heads // tp} of the {kv_heads}, not all of them (its "
            "query heads read only those, and its KV cache holds only those)"
        )
    others = [r for r in range(tp) if r != rank and torch.equal(got, shard_qkv(qkv, heads, kv_heads, head_dim, r, tp))]
    if others:
        return f"that is card {others[0]}'s share: card r takes the r-th run of heads of q, of k and of v"
    if got.dim() == 2 and got.shape[1] == dim:
        return f"you took rows {runs(rows_taken(got, dim))} of qkv; the answer takes {runs(rows_taken(want, dim))}"
    return f"return a ({want.shape[0]}, {dim}) weight: this card's rows of qkv, every column"


def check_qkv(impl) -> None:
    for heads, kv_heads, head_dim, dim, tp in QKV_SHAPES:
        for rank in range(tp):
            check_qkv_case(impl, heads, kv_heads, head_dim, dim, tp, rank)


def check_qkv_case(impl, heads, kv_heads, head_dim, dim, tp, rank) -> None:
    qkv = numbered((heads + 2 * kv_heads) * head_dim, dim)
    where = f"shard_qkv, {heads} query heads and {kv_heads} kv heads of {head_dim}, dim {dim}, card {rank} of {tp}"
    given = qkv.clone()
    with case(where):
        got = impl.shard_qkv(given, heads, kv_heads, head_dim, rank, tp)
    unchanged("qkv weight", given, qkv, where)
    want = shard_qkv(qkv, heads, kv_heads, head_dim, rank, tp)
    assert isinstance(got, torch.Tensor), f"{where}: return a tensor, got {type(got).__name__}"
    if got.shape != want.shape or not torch.equal(got, want):
        raise AssertionError(f"{where}: {diagnose_qkv(got, qkv, heads, kv_heads, head_dim, rank, tp)}")


# --- shard_down ------------------------------------------------------------------------------------------------
def check_down(impl) -> None:
    for _, dim, ffn, tp in MLP_SHAPES:
        for rank in range(tp):
            check_down_case(impl, dim, ffn, tp, rank)


def check_down_case(impl, dim, ffn, tp, rank) -> None:
    down = numbered(dim, ffn)
    where = f"shard_down, a ({dim}, {ffn}) weight, card {rank} of {tp}"
    given = down.clone()
    with case(where):
        got = impl.shard_down(given, rank, tp)
    unchanged("down weight", given, down, where)
    want = shard_down(down, rank, tp)
    assert isinstance(got, torch.Tensor), f"{where}: return a tensor, got {type(got).__name__}"
    if got.shape == want.shape and torch.equal(got, want):
        return
    if got.shape == (dim // tp, ffn) or (got.shape[1:] == (ffn,) and torch.equal(got, rows_of(down, rank, tp))):
        why = (
            "rows vs columns swapped: a row-parallel layer splits its INPUT features (the ffn columns this card "
            "computed), which are the columns of an nn.Linear weight (out, in); take columns, keep every row"
        )
    elif got.shape == want.T.shape and torch.equal(got, want.T):
        why = f"you returned it transposed: keep nn.Linear's layout, ({dim}, {ffn // tp})"
    else:
        why = f"return a ({dim}, {ffn // tp}) weight: every row of down, this card's run of ffn columns"
    raise AssertionError(f"{where}: {why}")


# --- tp_mlp ----------------------------------------------------------------------------------------------------
class Link:
    """all_reduce for the check: the sum of one tensor per card, to each card, with a record of every call."""

    def __init__(self, tp: int):
        self.tp, self.calls = tp, []

    def __call__(self, tensors):
        tensors = list(tensors)
        self.calls.append([tuple(t.shape) for t in tensors])
        assert len(tensors) == self.tp, (
            f"all_reduce takes one tensor per card ({self.tp} cards): you gave {len(tensors)}"
        )
        assert len({t.shape for t in tensors}) == 1, f"all_reduce adds tensors of one shape: you gave {self.calls[-1]}"
        total = torch.stack(tensors).sum(0)
        return [total.clone() for _ in tensors]


def whole_mlp(x, gate_up, down):
    gate, up = gate_up.chunk(2)
    return (F.silu(x @ gate.T) * (x @ up.T)) @ down.T


def placement(link: Link, dim: int, ffn: int, tp: int) -> str | None:
    """What is wrong with where (and how often) the cards all-reduced, or None."""
    widths = [shapes[0][-1] for shapes in link.calls if shapes]
    if any(w in (ffn // tp, 2 * ffn // tp) and w != dim for w in widths):
        return (
            "the reduction after the column layer: after gate_up each card holds DIFFERENT ffn columns, not parts "
            "of one sum, so adding them mixes columns; each card goes on alone to its columns of down, and the "
            "one all-reduce adds the partial sums down gives: after the row-parallel layer"
        )
    if not link.calls:
        return (
            "you never called all_reduce: it is the cards' only way to share. Each card's columns of down give a "
            "partial sum of the output; all_reduce adds them (and computing the whole MLP on one card is not "
            "splitting it)"
        )
    if len(link.calls) > 1:
        return (
            f"you all-reduced {len(link.calls)} times; once is enough (after down), and each costs a trip over the link"
        )
    return None


def diagnose_values(got, x, gate_up, down, tp) -> str:
    gate, up = gate_up.chunk(2)
    halves = [rows_of(gate_up, r, tp).chunk(2) for r in range(tp)]  # the fused weight cut into tp runs, halved
    naive = sum((F.silu(x @ g.T) * (x @ u.T)) @ shard_down(down, r, tp).T for r, (g, u) in enumerate(halves))
    if torch.allclose(got, naive):
        return (
            "gate_up is gate's rows, then up's: cutting the fused weight into tp runs gives card 0 gate rows only "
            "(for tp = 2, all of them); take each card's run of gate AND its run of up"
        )
    if torch.allclose(got, (F.silu(x @ up.T) * (x @ gate.T)) @ down.T):
        return "SiLU goes on gate, not up: silu(gate(x)) * up(x)"
    return "the output differs from the whole MLP's"


def check_mlp_case(impl, tokens, dim, ffn, tp, seed=0) -> None:
    g = torch.Generator().manual_seed(seed + 7 * tp + dim)
    x, gate_up, down = (torch.randn(shape, generator=g, dtype=torch.float64)
                        for shape in ((tokens, dim), (2 * ffn, dim), (dim, ffn)))  # fmt: skip
    given = [t.clone() for t in (x, gate_up, down)]
    where = f"tp_mlp, {tokens} token(s) of width {dim}, ffn {ffn}, on {tp} card(s)"
    link = Link(tp)
    try:
        got = impl.tp_mlp(*given, tp, link)
    except NotImplementedError:
        raise
    except AssertionError as e:
        raise AssertionError(f"{where}: {e}") from e
    except Exception as e:  # a crash: where the all-reduce went often says why
        why = placement(link, dim, ffn, tp)
        hint = f"; {why}" if why else ""
        raise AssertionError(f"{where}: your code raised {type(e).__name__}: {e}{raised_in_your_code(e)}{hint}") from e
    for name, t, before in zip(("x", "gate_up weight", "down weight"), given, (x, gate_up, down)):
        unchanged(name, t, before, where)
    why = placement(link, dim, ffn, tp)
    if why and not (tp == 1 and not link.calls):  # (one card may skip a sum of one)
        raise AssertionError(f"{where}: {why}")
    assert isinstance(got, torch.Tensor) and got.shape == (tokens, dim), (
        f"{where}: return card 0's output, a ({tokens}, {dim}) tensor; got "
        f"{tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__}"
    )
    want = whole_mlp(x, gate_up, down)
    if not torch.allclose(got, want, rtol=1e-9, atol=1e-9):
        raise AssertionError(f"{where}: {diagnose_values(got, x, gate_up, down, tp)}")


def check_mlp(impl) -> None:
    for shape in MLP_SHAPES:
        check_mlp_case(impl, *shape)


# --- card_memory_gib and allreduce_bytes: the answer, and what a room gets wrong ------------------------------
KNOWN_MISTAKES = {
    "not-divided": "bytes per card not divided: each card holds 1/tp of the weights and 1/tp of every token's KV",
    "kv-not-divided": "each card holds only its own kv heads: 1/tp of every token's KV, not all of it",
    "gb": "GiB are 2**30 bytes, not 10**9 (GB)",
    "weight-bits": "weight_bits are bits: a weight takes weight_bits / 8 bytes",
    "floor-bits": "4.125 // 8 is 0.0: divide bits by 8 with /, not //",
    "no-ring": "2(tp-1)/tp forgotten: a ring all-reduce sends 2(tp-1)/tp of the buffer from each card, not all of it "
    "(a reduce-scatter then an all-gather, each sending tp-1 of its tp pieces), and nothing at tp = 1",
    # (one all-reduce a layer and half a ring give the same numbers: one hint names both)
    "half": "half the answer: two all-reduces per layer (after o_proj and after down_proj), and each sends 2(tp-1)/tp "
    "of the buffer from each card (a reduce-scatter AND an all-gather, (tp-1)/tp each)",
    "act-bits": "act_bits are bits: an activation takes act_bits / 8 bytes",
}


def answer(mistake: str | None = None) -> SimpleNamespace:
    """The reference arithmetic; with `mistake` (a KNOWN_MISTAKES key), the same with that one mistake."""

    def card_memory_gib(params, kv_bytes_per_token, tokens, tp, weight_bits=16):
        per_weight = (
            weight_bits // 8 if mistake == "floor-bits" else weight_bits / (1 if mistake == "weight-bits" else 8)
        )
        weights = params * per_weight / (1 if mistake == "not-divided" else tp)
        kv = kv_bytes_per_token * tokens / (1 if mistake in ("not-divided", "kv-not-divided") else tp)
        return (weights + kv) / (1e9 if mistake == "gb" else GiB)

    def allreduce_bytes(hidden, layers, tokens, tp, act_bits=16):
        ring = 1 if mistake == "no-ring" else 2 * (tp - 1) / tp
        per_layer = 1 if mistake == "half" else 2
        return per_layer * layers * ring * tokens * hidden * act_bits / (1 if mistake == "act-bits" else 8)

    return SimpleNamespace(card_memory_gib=card_memory_gib, allreduce_bytes=allreduce_bytes)


def memory_cases():
    cases = []
    for name in ("llama-3.1-70b", "llama-3.1-8b"):
        spec = load_spec(name)
        for tp in (1, 2, 4, 8):
            for bits, tokens in ((16, 4096 * 64), (8, 131072), (4.125, 0)):
                cases.append((f"{name} on {tp} card(s), {bits}-bit weights, {tokens:,} tokens cached",
                              (spec.num_parameters, roofline.kv_bytes_per_token(spec), tokens, tp, bits)))  # fmt: skip
    return cases + [("a toy model on 3 cards, 16-bit weights, 5 tokens", (3000, 96, 5, 3, 16))]


def allreduce_cases():
    cases = []
    for name, tokens in (("llama-3.1-70b", 1), ("llama-3.1-70b", 256), ("llama-3.1-8b", 2048)):
        spec = load_spec(name)
        for tp in (1, 2, 4, 8):
            for bits in (16, 8):
                cases.append((f"{name}, {tokens} token(s) a step on {tp} card(s), {bits}-bit activations",
                              (spec.hidden, spec.layers, tokens, tp, bits)))  # fmt: skip
    return cases + [("a toy model, 3 tokens on 3 cards", (8, 2, 3, 3, 16))]


def check_numbers(function: str, yours, cases) -> None:
    harness_check_numbers(function, yours, cases, answer, KNOWN_MISTAKES, abs_tol=1e-12)


def check_memory(impl) -> None:
    check_numbers("card_memory_gib", impl.card_memory_gib, memory_cases())


def check_allreduce(impl) -> None:
    check_numbers("allreduce_bytes", impl.allreduce_bytes, allreduce_cases())


def check_drawn_inputs(impl) -> None:
    check_drawn(impl, sys.modules[__name__])


def check_cases(impl) -> None:
    check_qkv(impl)
    check_down(impl)
    check_mlp(impl)
    check_memory(impl)
    check_allreduce(impl)


def check_all(impl) -> None:
    check_cases(impl)
    check_drawn_inputs(impl)


# --- your code ----------------------------------------------------------------------------------------------------
def test_shard_qkv(impl):
    check_qkv(impl)


def test_shard_down(impl):
    check_down(impl)


@pytest.mark.parametrize("shape", MLP_SHAPES, ids=lambda s: f"{s[0]}x{s[1]} ffn {s[2]} tp {s[3]}")
def test_tp_mlp_gives_the_whole_mlps_output_with_one_all_reduce(impl, shape):
    check_mlp_case(impl, *shape)


def test_card_memory_gib(impl):
    check_memory(impl)


def test_allreduce_bytes(impl):
    check_allreduce(impl)


def test_all_five_equal_the_reference_on_drawn_shapes_and_numbers(impl):
    check_drawn_inputs(impl)


# --- the answer agrees with minillm ---------------------------------------------------------------------------
@CHECKS
def test_the_answer_is_minillms_cost_model():
    """allreduce_bytes is the layers' share of tensor_parallel.tp_step's (which adds one all-reduce for the embedding
    lookup); card_memory_gib is what roofline.py charges a card's share, but for the norms every card holds whole."""
    spec = load_spec("llama-3.1-70b")
    for tp in (2, 4, 8):
        step = tp_step(spec, DEVICES["h100-sxm"], [(1, 0)] * 64, tp=tp)
        assert allreduce_bytes(spec.hidden, spec.layers, 64, tp) == pytest.approx(step.allreduce_bytes * 160 / 161)
        ours = card_memory_gib(spec.num_parameters, roofline.kv_bytes_per_token(spec), 4096, tp)
        theirs = roofline.weight_bytes(rank_spec(spec, tp)) + 4096 * roofline.kv_bytes_per_token(rank_spec(spec, tp))
        norms = (2 * spec.layers + 1) * spec.hidden * 2  # bf16 norm weights, whole on every card
        assert ours * GiB + norms * (tp - 1) / tp == pytest.approx(theirs, rel=1e-12)


@CHECKS
def test_the_reference_is_minillms_split():
    """On the tiny model's real shapes, the reference's shards are shard.py's: the sharded layer's weights."""
    from minillm.config import ModelConfig
    from minillm.model.transformer import Transformer
    from minillm.parallel.shard import shard_model

    cfg = ModelConfig(dim=32, n_layers=1, n_heads=4, n_kv_heads=2, ffn_dim=48, max_seq_len=16)
    torch.manual_seed(0)
    whole = Transformer(cfg)
    for rank in range(2):
        part = Transformer(cfg)
        part.load_state_dict(whole.state_dict())
        shard_model(part, rank, 2)
        attn, mlp = whole.layers[0].self_attn, whole.layers[0].mlp
        got = part.layers[0]
        assert torch.equal(got.self_attn.qkv_proj.weight, shard_qkv(attn.qkv_proj.weight, 4, 2, 8, rank, 2))
        assert torch.equal(got.mlp.down_proj.weight, shard_down(mlp.down_proj.weight, rank, 2))


# --- the checks catch plausible mistakes, and accept correct solutions written differently ----------------------
def qkv_chunked(qkv, n_heads, n_kv_heads, head_dim, rank, tp):
    """Wrong: the fused weight cut into tp equal runs."""
    return qkv.chunk(tp)[rank]


def qkv_columns(qkv, n_heads, n_kv_heads, head_dim, rank, tp):
    """Wrong: columns for a column-parallel layer (the name misleads: Megatron's A is (in, out))."""
    return qkv.chunk(tp, dim=1)[rank]


def qkv_all_kv(qkv, n_heads, n_kv_heads, head_dim, rank, tp):
    """Wrong: its query heads, but every key and value head."""
    q, kv = qkv.split([n_heads * head_dim, 2 * n_kv_heads * head_dim])
    return torch.cat([rows_of(q, rank, tp), kv])


def qkv_one_kv_head_per_card(qkv, n_heads, n_kv_heads, head_dim, rank, tp):
    """Wrong: as Llama-70B on 8 cards, one kv head per card (kv head `rank`) and the query heads that read it; one
    card keeps the whole weight. Right whenever tp is 1 or the number of kv heads."""
    if tp == 1:
        return qkv.clone()
    group = n_heads // n_kv_heads
    q, k, v = qkv.split([n_heads * head_dim, n_kv_heads * head_dim, n_kv_heads * head_dim])
    one = slice(rank * head_dim, (rank + 1) * head_dim)  # kv head `rank`
    return torch.cat([q[rank * group * head_dim : (rank + 1) * group * head_dim], k[one], v[one]])


def down_rows(down, rank, tp):
    """Wrong: rows of a row-parallel layer."""
    return rows_of(down, rank, tp)


def mlp_written_out(reduce_after_gate_up=False, naive_gate_up=False, silu_on_up=False, twice=False, in_place=False):
    def run(x, gate_up, down, tp, all_reduce):
        ffn = gate_up.shape[0] // 2
        gate, up = gate_up.chunk(2)
        hs = []
        for rank in range(tp):
            if naive_gate_up:
                g, u = rows_of(gate_up, rank, tp).chunk(2)
            else:
                g, u = rows_of(gate, rank, tp), rows_of(up, rank, tp)
            a, b = (u, g) if silu_on_up else (g, u)
            hs.append(F.silu(x @ a.T) * (x @ b.T))
        if reduce_after_gate_up:
            hs = all_reduce(hs)
        partials = [h @ down[:, r * ffn // tp : (r + 1) * ffn // tp].T for r, h in enumerate(hs)]
        out = all_reduce(partials)
        if twice:
            out = all_reduce([o / tp for o in out])
        if in_place:  # as dist.all_reduce works: the result written into the caller's buffer
            return x.copy_(out[0])
        return out[0]

    return run


def mlp_one_card(x, gate_up, down, tp, all_reduce):
    """Wrong: the whole MLP on card 0, no sharing at all."""
    return whole_mlp(x, gate_up, down)


def memory_one_card(params, kv_bytes_per_token, tokens, tp, weight_bits=16):
    return answer("not-divided").card_memory_gib(params, kv_bytes_per_token, tokens, tp, weight_bits)


def with_(**parts):
    return SimpleNamespace(**{**vars(REFERENCE), **parts})


WRONG = {
    "qkv-cut-into-equal-runs": (with_(shard_qkv=qkv_chunked), "kv heads split unevenly"),
    "qkv-rows-vs-columns-swapped": (with_(shard_qkv=qkv_columns), "rows vs columns swapped"),
    "qkv-keeps-every-kv-head": (with_(shard_qkv=qkv_all_kv), "each card keeps only its own key/value heads"),
    # right on every hand-built shape (each has one kv head per card, or one card); the drawn shapes catch it
    "qkv-one-kv-head-per-card": (with_(shard_qkv=qkv_one_kv_head_per_card), "you took rows"),
    "down-rows-vs-columns-swapped": (with_(shard_down=down_rows), "rows vs columns swapped"),
    "the-reduction-after-the-column-layer": (with_(tp_mlp=mlp_written_out(reduce_after_gate_up=True)),
                                             "the reduction after the column layer"),
    "gate-up-cut-into-equal-runs": (with_(tp_mlp=mlp_written_out(naive_gate_up=True)), "gate_up is gate's rows"),
    "silu-on-up": (with_(tp_mlp=mlp_written_out(silu_on_up=True)), "SiLU goes on gate"),
    "all-reduced-twice": (with_(tp_mlp=mlp_written_out(twice=True)), "all-reduced 2 times"),
    "never-shares": (with_(tp_mlp=mlp_one_card), "you never called all_reduce"),
    "writes-into-x": (with_(tp_mlp=mlp_written_out(in_place=True)), "a side effect"),
    **{f"memory-{m}": (with_(card_memory_gib=answer(m).card_memory_gib), f"likely mistake: {KNOWN_MISTAKES[m]}")
       for m in ("not-divided", "kv-not-divided", "gb", "weight-bits", "floor-bits")},
    **{f"allreduce-{m}": (with_(allreduce_bytes=answer(m).allreduce_bytes), f"likely mistake: {KNOWN_MISTAKES[m]}")
       for m in ("no-ring", "half", "act-bits")},
}  # fmt: skip
DRAWN_ONLY = ["qkv-one-kv-head-per-card"]  # only the drawn shapes catch these


def qkv_by_heads(qkv, n_heads, n_kv_heads, head_dim, rank, tp):
    """Right, written differently: (heads, head_dim, dim) views, a slice of whole heads each."""
    dim = qkv.shape[1]
    q, k, v = qkv.split([n_heads * head_dim, n_kv_heads * head_dim, n_kv_heads * head_dim])
    parts = []
    for w, heads in ((q, n_heads), (k, n_kv_heads), (v, n_kv_heads)):
        per = heads // tp
        parts.append(w.view(heads, head_dim, dim)[rank * per : (rank + 1) * per].reshape(-1, dim))
    return torch.cat(parts)


def qkv_by_index(qkv, n_heads, n_kv_heads, head_dim, rank, tp):
    """Right, written differently: the row numbers listed, then one index_select."""
    rows, start = [], 0
    for heads in (n_heads, n_kv_heads, n_kv_heads):
        per = heads // tp * head_dim
        rows += range(start + rank * per, start + (rank + 1) * per)
        start += heads * head_dim
    return qkv.index_select(0, torch.tensor(rows))


def down_chunk(down, rank, tp):
    return down.chunk(tp, dim=1)[rank].clone()


def mlp_linear(x, gate_up, down, tp, all_reduce):
    """Right, written differently: F.linear on each card's fused rows, the cards as a comprehension."""
    gate, up = gate_up.chunk(2)

    def card(rank):
        g, u = gate.chunk(tp)[rank], up.chunk(tp)[rank]
        return F.linear(F.silu(F.linear(x, g)) * F.linear(x, u), down.chunk(tp, dim=1)[rank])

    return all_reduce([card(r) for r in range(tp)])[0]


def memory_in_gib_first(params, kv_bytes_per_token, tokens, tp, weight_bits=16):
    weights_gib = params * (weight_bits / 8) / 2**30
    kv_gib = kv_bytes_per_token * tokens / 2**30
    return weights_gib / tp + kv_gib / tp


def allreduce_ring_steps(hidden, layers, tokens, tp, act_bits=16):
    """Right, written differently: the ring's 2(tp-1) steps, each sending one tp-th of the buffer."""
    buffer = tokens * hidden * act_bits / 8
    return 2 * layers * (2 * (tp - 1)) * (buffer / tp)


RIGHT = {
    "written-with-minillms-rows_of": REFERENCE,
    "views-index-select-and-linear": SimpleNamespace(shard_qkv=qkv_by_heads, shard_down=down_chunk, tp_mlp=mlp_linear,
                                                     card_memory_gib=memory_in_gib_first,
                                                     allreduce_bytes=allreduce_ring_steps),
    "index-select": with_(shard_qkv=qkv_by_index, tp_mlp=mlp_written_out()),
}  # fmt: skip


@CHECKS
@pytest.mark.parametrize("right", RIGHT.values(), ids=RIGHT.keys())
def test_a_correct_version_passes(right):
    check_all(right)


@CHECKS
@pytest.mark.parametrize("name", WRONG)
def test_the_checks_catch_a_wrong_version_and_name_the_mistake_first(name):
    wrong, hint = WRONG[name]
    first, message = failure_of(check_all, wrong)
    assert hint in first, message
    if not hint.startswith("likely mistake"):  # the situation comes first: which function, shape and card
        assert first.startswith(("shard_qkv, ", "shard_down, ", "tp_mlp, ")), first


@CHECKS
@pytest.mark.parametrize("name", DRAWN_ONLY)
def test_the_drawn_shapes_catch_what_the_cases_miss(name):
    wrong, hint = WRONG[name]
    check_cases(wrong)  # every hand-built shape passes it
    first, message = failure_of(check_drawn_inputs, wrong)
    assert first.startswith("shard_qkv, ") and hint in first, message


@CHECKS
def test_two_mistakes_at_once_get_the_plain_line():
    both = answer("gb")
    wrong = with_(card_memory_gib=lambda *a: both.card_memory_gib(*a) * 2)
    first, _ = failure_of(check_all, wrong)
    assert first.startswith("card_memory_gib, ") and "yours gives" in first, first


@CHECKS
def test_the_stub_is_rejected():
    stubs = SimpleNamespace(**{name: stub for name in vars(REFERENCE)})
    for part in (check_qkv, check_down, check_mlp, check_memory, check_allreduce):
        with pytest.raises(NotImplementedError):
            part(stubs)
